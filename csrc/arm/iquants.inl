// IQ4_XS x Q8_K at the aarch64 levels (IQ4_NL, a 32-weight format, is in legacy.inl). Shared
// body of csrc/arm/<level>/iquants.cpp. Layout: csrc/ref/iquants.cpp.
//
// Decoded super-block: 16 int8x16 of kvalues_iq4nl[code] (vector 2ib: weights 32ib + 0..15 from
// the low nibbles of qs[16ib ..], 2ib + 1: weights 32ib + 16..31 from the high nibbles), and the
// 8 sub-block scales ls - 32. The reference adds one float term per 32 weights:
//   acc += ((d_w * d_a) * (float)ls) * (float)isum_ib        ib = 0..7, in order
// The other i-quants (IQ2_*, IQ3_*, IQ1_*) run the scalar reference on aarch64 (not ported).
#include "simd.h"
#include "../ref/iq_tables.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

struct XsDec { int8x16_t c[16]; float ls[8]; float d; };

struct FIQ4_XS {
    static constexpr int kQK = QK_K, kWB = 136, kAB = 292;
    using Dec = XsDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        const int8x16_t lut = vld1q_s8(iq::kvalues_iq4nl);
        const uint8_t *qs = b + 8;
        for (int ib = 0; ib < 8; ++ib) {
            const uint8x16_t x = vld1q_u8(qs + 16 * ib);
            d.c[2 * ib] = vqtbl1q_s8(lut, vandq_u8(x, vdupq_n_u8(0x0F)));
            d.c[2 * ib + 1] = vqtbl1q_s8(lut, vshrq_n_u8(x, 4));
        }
        const uint16_t sh = ld16(b + 2);
        for (int ib = 0; ib < 8; ++ib) {
            const int lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF, hi = (sh >> (2 * ib)) & 3;
            d.ls[ib] = (float)((lo | (hi << 4)) - 32);
        }
        d.d = f16(b);
    }
    template <int C>
    static LB_ARM_INLINE float32x4_t step(const Dec &d, const uint8_t *ab, size_t stride, float32x4_t acc) {
        const float32x4_t dd = vmulq_n_f32(f32_lanes<C>(ab, stride, 0), d.d);  // d_w * d_a per token
        for (int ib = 0; ib < 8; ++ib) {
            const int32x4_t isum = per_token<C>(ab, stride, [&](const uint8_t *at) {
                const int8_t *q = (const int8_t *)(at + 4 + 32 * ib);
                return dot16(dot16(vdupq_n_s32(0), d.c[2 * ib], vld1q_s8(q)), d.c[2 * ib + 1], vld1q_s8(q + 16));
            });
            acc = vaddq_f32(acc, vmulq_f32(vmulq_n_f32(dd, d.ls[ib]), vcvtq_f32_s32(isum)));
        }
        return acc;
    }
};

}  // namespace

void register_iquants(KernelTable &t) {
    set_rows<FIQ4_XS>(t, T_IQ4_XS, "rows_iq4_xs_q8_k_" LB_ARM_SUFFIX);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
