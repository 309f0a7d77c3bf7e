// IQ4_XS x Q8_K at the aarch64 levels (IQ4_NL, a 32-weight format, is in legacy.inl). Shared
// body of csrc/arm/<level>/iquants.cpp. Layout: csrc/ref/iquants.cpp.
//
// Per 32-weight sub-block ib, decoded once per row: two int8x16 of kvalues_iq4nl[code] and its
// scale ls - 32; every token's exact isum_ib. The reference adds one float term per 32 weights:
//   acc += ((d_w * d_a) * (float)ls) * (float)isum_ib        ib = 0..7, in order
// The other i-quants (IQ2_*, IQ3_*, IQ1_*) run the scalar reference on aarch64 (not ported).
#include "simd.h"
#include "../ref/iq_tables.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

struct FIQ4_XS {  // d, scales_h, scales_l[4], qs[128]
    static constexpr int kQK = QK_K, kWB = 136, kAB = 292;
    // one 32-weight sub-block ib: its values (vector 0: weights 32ib + 0..15 from the low nibbles of
    // qs[16ib ..], vector 1: 32ib + 16..31 from the high nibbles), every token's isum, then each
    // token's float step; acc0 / acc1 as in rows_nt.
    template <int NT>
    static LB_ARM_INLINE void block(const uint8_t *b, const uint8_t *ab, size_t st, float32x4_t &acc0,
                                    float32x4_t &acc1) {
        constexpr int C0 = NT < 4 ? NT : 4, C1 = NT > 4 ? NT - 4 : 1;
        const int8x16_t lut = vld1q_s8(iq::kvalues_iq4nl);
        const float d = f16(b);
        const uint16_t sh = ld16(b + 2);
        const float32x4_t dd0 = vmulq_n_f32(f32_lanes<C0>(ab, st, 0), d);  // d_a * d_w per token
        const float32x4_t dd1 = NT > 4 ? vmulq_n_f32(f32_lanes<C1>(ab + 4 * st, st, 0), d) : dd0;
        for (int ib = 0; ib < 8; ++ib) {
            const uint8x16_t x = vld1q_u8(b + 8 + 16 * ib);
            const int8x16_t c0 = vqtbl1q_s8(lut, vandq_u8(x, vdupq_n_u8(0x0F))), c1 = vqtbl1q_s8(lut, vshrq_n_u8(x, 4));
            const int lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF, hi = (sh >> (2 * ib)) & 3;
            const float ls = (float)((lo | (hi << 4)) - 32);
            Acc8 is;
            for_tokens<NT>(is, ab, st, [&](int32x4_t acc, const uint8_t *at) LB_ARM_LAMBDA {
                const int8_t *q = (const int8_t *)(at + 4 + 32 * ib);
                return dot16(dot16(acc, c0, vld1q_s8(q)), c1, vld1q_s8(q + 16));
            });
            acc0 = vaddq_f32(acc0, vmulq_f32(vmulq_n_f32(dd0, ls), vcvtq_f32_s32(is.lo())));
            if constexpr (NT > 4) acc1 = vaddq_f32(acc1, vmulq_f32(vmulq_n_f32(dd1, ls), vcvtq_f32_s32(is.hi())));
        }
    }
};

}  // namespace

void register_iquants(KernelTable &t) {
    set_rows<FIQ4_XS>(t, T_IQ4_XS, "rows_iq4_xs_q8_k_" LB_ARM_SUFFIX);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
