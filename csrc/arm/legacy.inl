// Legacy-format row kernels at the aarch64 levels: Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 x Q8_0 and
// Q4_1, Q5_1 x Q8_1. Shared body of csrc/arm/<level>/legacy.cpp (LOWBIT_ISA, LOWBIT_NS set).
// Block layouts and the meaning of the codes: csrc/ref/legacy.cpp (and iquants.cpp, IQ4_NL).
//
// Decoded block: the 32 codes as two int8x16, lo = weights 0..15, hi = 16..31 (the low and the
// high nibbles of qs for the 4/5-bit formats), as signed values q_w (the _0 formats' offsets
// are subtracted in the decode, so SDOT / SMULL take them directly; the _1 formats' codes
// 0..31 are their values).
// Per token t: isum = dot(lo, q_a[0:16]) + dot(hi, q_a[16:32]), exact int32 (|isum| <= 32 * 128 * 128).
// Float step, as csrc/ref:  _0: acc += (d_w * d_a) * (float)isum
//                           _1: acc += (d_w * d_a) * (float)isum + m_w * s_a
// IQ4_NL's reference computes d_a * d_w, and float multiplication commutes exactly.
// MXFP4 (csrc/ref/mxfp4.cpp) is IQ4_NL with another code book and another scale: byte 0 is the
// e8m0 exponent e, then the 16 bytes of nibbles; a nibble indexes the e2m1 values doubled
// (integers in [-12, 12], one vqtbl1q_s8 per 16 codes, signed as SDOT / SMULL take them), and
// d_w = 2^(e - 128) (ref::e8m0_half, bit for bit), so the float step is the _0 formats'.
#include "simd.h"
#include "../ref/iq_tables.h"
#include "../ref/ref.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

struct LegacyDec { int8x16_t lo, hi; float d, m; };

// The 4-bit codes of qs (16 bytes at p) as unsigned values 0..15.
LB_ARM_INLINE void nibbles(const uint8_t *p, uint8x16_t &lo, uint8x16_t &hi) {
    const uint8x16_t x = vld1q_u8(p);
    lo = vandq_u8(x, vdupq_n_u8(0x0F));
    hi = vshrq_n_u8(x, 4);
}

// Q5: bit j of the little-endian qh word is weight j's 5th bit: 0x10 where set.
LB_ARM_INLINE void fifth_bits(const uint8_t *qh, uint8x16_t &lo, uint8x16_t &hi) {
    static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const uint8_t kSel[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    const uint8x16_t h = vcombine_u8(vcreate_u8(ld32(qh)), vdup_n_u8(0));
    const uint8x16_t bit = vld1q_u8(kBit), sel = vld1q_u8(kSel), b16 = vdupq_n_u8(0x10);
    const uint8x16_t hlo = vqtbl1q_u8(h, sel);                               // qh bytes 0, 1
    const uint8x16_t hhi = vqtbl1q_u8(h, vaddq_u8(sel, vdupq_n_u8(2)));      // qh bytes 2, 3
    lo = vorrq_u8(lo, vandq_u8(vtstq_u8(hlo, bit), b16));
    hi = vorrq_u8(hi, vandq_u8(vtstq_u8(hhi, bit), b16));
}

// kWB bytes per weight block, kQs offset of its codes; kAB 34 (Q8_0) or 36 (Q8_1).
struct FQ4_0 {
    static constexpr int kQK = QK, kWB = 18, kAB = 34;
    static constexpr bool kM = false;
    using Dec = LegacyDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        uint8x16_t lo, hi;
        nibbles(b + 2, lo, hi);
        d.lo = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
        d.hi = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
        d.d = f16(b);
    }
};
struct FQ4_1 {
    static constexpr int kQK = QK, kWB = 20, kAB = 36;
    static constexpr bool kM = true;
    using Dec = LegacyDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        uint8x16_t lo, hi;
        nibbles(b + 4, lo, hi);
        d.lo = vreinterpretq_s8_u8(lo);
        d.hi = vreinterpretq_s8_u8(hi);
        d.d = f16(b);
        d.m = f16(b + 2);
    }
};
struct FQ5_0 {
    static constexpr int kQK = QK, kWB = 22, kAB = 34;
    static constexpr bool kM = false;
    using Dec = LegacyDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        uint8x16_t lo, hi;
        nibbles(b + 6, lo, hi);
        fifth_bits(b + 2, lo, hi);
        d.lo = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(16));
        d.hi = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(16));
        d.d = f16(b);
    }
};
struct FQ5_1 {
    static constexpr int kQK = QK, kWB = 24, kAB = 36;
    static constexpr bool kM = true;
    using Dec = LegacyDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        uint8x16_t lo, hi;
        nibbles(b + 8, lo, hi);
        fifth_bits(b + 4, lo, hi);
        d.lo = vreinterpretq_s8_u8(lo);
        d.hi = vreinterpretq_s8_u8(hi);
        d.d = f16(b);
        d.m = f16(b + 2);
    }
};
struct FQ8_0 {
    static constexpr int kQK = QK, kWB = 34, kAB = 34;
    static constexpr bool kM = false;
    using Dec = LegacyDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        d.lo = vld1q_s8((const int8_t *)(b + 2));
        d.hi = vld1q_s8((const int8_t *)(b + 18));
        d.d = f16(b);
    }
};
struct FIQ4_NL {
    static constexpr int kQK = QK, kWB = 18, kAB = 34;
    static constexpr bool kM = false;
    using Dec = LegacyDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        const int8x16_t lut = vld1q_s8(iq::kvalues_iq4nl);
        uint8x16_t lo, hi;
        nibbles(b + 2, lo, hi);
        d.lo = vqtbl1q_s8(lut, lo);
        d.hi = vqtbl1q_s8(lut, hi);
        d.d = f16(b);
    }
};

struct FMXFP4 {
    static constexpr int kQK = QK, kWB = 17, kAB = 34;
    static constexpr bool kM = false;
    using Dec = LegacyDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        const int8x16_t lut = vld1q_s8(ref::kvalues_mxfp4);
        uint8x16_t lo, hi;
        nibbles(b + 1, lo, hi);
        d.lo = vqtbl1q_s8(lut, lo);
        d.hi = vqtbl1q_s8(lut, hi);
        d.d = ref::e8m0_half(b[0]);
    }
};

// The float step of one block for a chunk of C tokens (F: one of the formats above).
template <class F>
struct Legacy : F {
    using Dec = LegacyDec;
    template <int NT>
    static LB_ARM_INLINE void block(const uint8_t *wb, const uint8_t *ab, size_t st, float32x4_t &acc0,
                                    float32x4_t &acc1) {
        Dec d;
        F::decode(wb, d);
        acc0 = step<(NT < 4 ? NT : 4)>(d, ab, st, acc0);
        if constexpr (NT > 4) acc1 = step<NT - 4>(d, ab + 4 * st, st, acc1);
    }
    template <int C>
    static LB_ARM_INLINE float32x4_t step(const Dec &d, const uint8_t *ab, size_t stride, float32x4_t acc) {
        constexpr int kQs = F::kAB - 32;  // Q8_0: d, qs; Q8_1: d, s, qs
        const int32x4_t isum = per_token<C>(ab, stride, [&](const uint8_t *at) LB_ARM_LAMBDA {
            const int8x16_t a0 = vld1q_s8((const int8_t *)(at + kQs)), a1 = vld1q_s8((const int8_t *)(at + kQs + 16));
            return dot16(dot16(vdupq_n_s32(0), d.lo, a0), d.hi, a1);
        });
        const float32x4_t da = f16_lanes<C>(ab, stride, 0);
        const float32x4_t t = vmulq_f32(vmulq_n_f32(da, d.d), vcvtq_f32_s32(isum));
        if constexpr (F::kM) {
            const float32x4_t sa = f16_lanes<C>(ab, stride, 2);
            return vaddq_f32(acc, vaddq_f32(t, vmulq_n_f32(sa, d.m)));
        } else {
            return vaddq_f32(acc, t);
        }
    }
};

}  // namespace

void register_legacy(KernelTable &t) {
    set_rows<Legacy<FQ4_0>>(t, T_Q4_0, "rows_q4_0_q8_0_" LB_ARM_SUFFIX);
    set_rows<Legacy<FQ4_1>>(t, T_Q4_1, "rows_q4_1_q8_1_" LB_ARM_SUFFIX);
    set_rows<Legacy<FQ5_0>>(t, T_Q5_0, "rows_q5_0_q8_0_" LB_ARM_SUFFIX);
    set_rows<Legacy<FQ5_1>>(t, T_Q5_1, "rows_q5_1_q8_1_" LB_ARM_SUFFIX);
    set_rows<Legacy<FQ8_0>>(t, T_Q8_0, "rows_q8_0_q8_0_" LB_ARM_SUFFIX);
    set_rows<Legacy<FIQ4_NL>>(t, T_IQ4_NL, "rows_iq4_nl_q8_0_" LB_ARM_SUFFIX);
    set_rows<Legacy<FMXFP4>>(t, T_MXFP4, "rows_mxfp4_q8_0_" LB_ARM_SUFFIX);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
