// K-quant row kernels at the aarch64 levels: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K x Q8_K. Shared body
// of csrc/arm/<level>/kquants.cpp (LOWBIT_ISA, LOWBIT_NS set). Bit layouts: csrc/ref/kquants.cpp.
//
// Decode, once per row and super-block, one int8x16 of codes at a time: the 16 codes of weights
// 16v .. 16v+15 (signed values: Q3_K's -4..3 and Q6_K's -32..31 come out with their offsets
// applied) and the scale of their sub-block; while that vector is live every token of the
// window adds sc * dot(codes, q_a[16v .. 16v+15]) to its own int32x4 (Acc8: named registers).
// The mins, for the formats with them, are spread over the 16 bsums as two int16x8 (mins[j] =
// the min of bsum j's sub-block): msum = sum_j bsums[j] * mins[j] per token.
// Both sums are exact in int32 whatever the grouping (csrc/ref/kquants.cpp: the largest, Q6_K,
// stays below 2^28), so they equal the reference's isum / msum. Float step:
//   acc += (d_w * d_a) * (float)isum - (dmin_w * d_a) * (float)msum     (Q2_K, Q4_K, Q5_K)
//   acc += (d_w * d_a) * (float)isum                                    (Q3_K, Q6_K)
#include "simd.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

constexpr int kQ8K_D = 0, kQ8K_QS = 4, kQ8K_BSUMS = 4 + QK_K;  // block_q8_K offsets

// msum of one token: lanes add up to sum_j bsums[j] * mins[j].
LB_ARM_INLINE int32x4_t k_msum(int16x8_t mins0, int16x8_t mins1, const uint8_t *at) {
    const int16x8_t b0 = vld1q_s16((const int16_t *)(at + kQ8K_BSUMS));
    const int16x8_t b1 = vld1q_s16((const int16_t *)(at + kQ8K_BSUMS + 16));
    int32x4_t m = vmull_s16(vget_low_s16(b0), vget_low_s16(mins0));
    m = vmlal_high_s16(m, b0, mins0);
    m = vmlal_s16(m, vget_low_s16(b1), vget_low_s16(mins1));
    return vmlal_high_s16(m, b1, mins1);
}

// F provides codes(block, fn): fn(int8x16 codes, int32 scale, int v) for the 16 vectors v, and
// for kMins formats mins(block, mins0, mins1); kD / kDmin are the offsets of its fp16 d, dmin.
template <class F>
struct KQuant : F {
    template <int NT>
    static LB_ARM_INLINE void block(const uint8_t *wb, const uint8_t *ab, size_t st, float32x4_t &acc0,
                                    float32x4_t &acc1) {
        Acc8 is;
        F::codes(wb, [&](int8x16_t c, int32_t sc, int v) LB_ARM_LAMBDA {
            for_tokens<NT>(is, ab, st, [&](int32x4_t acc, const uint8_t *at) LB_ARM_LAMBDA {
                const int8x16_t q = vld1q_s8((const int8_t *)(at + kQ8K_QS + 16 * v));
                return vmlaq_n_s32(acc, dot16(vdupq_n_s32(0), c, q), sc);
            });
        });
        const int32x4_t i_lo = is.lo(), i_hi = is.hi();  // the 8 token registers are free again
        Acc8 ms;
        if constexpr (F::kMins) {
            int16x8_t m0, m1;
            F::mins(wb, m0, m1);
            for_tokens<NT>(ms, ab, st, [&](int32x4_t, const uint8_t *at) LB_ARM_LAMBDA { return k_msum(m0, m1, at); });
        }
        const float d = f16(wb + F::kD);
        acc0 = step<(NT < 4 ? NT : 4)>(d, wb, ab, st, i_lo, ms.lo(), acc0);
        if constexpr (NT > 4) acc1 = step<NT - 4>(d, wb, ab + 4 * st, st, i_hi, ms.hi(), acc1);
    }
    template <int C>
    static LB_ARM_INLINE float32x4_t step(float d, const uint8_t *wb, const uint8_t *ab, size_t st, int32x4_t isum,
                                          int32x4_t msum, float32x4_t acc) {
        const float32x4_t da = f32_lanes<C>(ab, st, kQ8K_D);
        const float32x4_t t = vmulq_f32(vmulq_n_f32(da, d), vcvtq_f32_s32(isum));
        if constexpr (F::kMins) {
            const float dmin = f16(wb + F::kDmin);
            return vaddq_f32(acc, vsubq_f32(t, vmulq_f32(vmulq_n_f32(da, dmin), vcvtq_f32_s32(msum))));
        } else {
            return vaddq_f32(acc, t);
        }
    }
};

// 2-bit fields: byte qs[32h + 16j + i] holds, in bits 2k+1:2k, weight 128h + 32k + 16j + i,
// i.e. lane i of vector 8h + 2k + j. fn(codes 0..3, v).
template <class Fn>
LB_ARM_INLINE void two_bit_fields(const uint8_t *qs, Fn fn) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 2; ++j) {
            const uint8x16_t x = vld1q_u8(qs + 32 * h + 16 * j);
            fn(vandq_u8(x, m3), 8 * h + 0 + j);
            fn(vandq_u8(vshrq_n_u8(x, 2), m3), 8 * h + 2 + j);
            fn(vandq_u8(vshrq_n_u8(x, 4), m3), 8 * h + 4 + j);
            fn(vshrq_n_u8(x, 6), 8 * h + 6 + j);
        }
}

struct FQ2_K {  // scales[16] (sc low nibble, min high), qs[64], d, dmin
    static constexpr int kQK = QK_K, kWB = 84, kAB = 292, kD = 80, kDmin = 82;
    static constexpr bool kMins = true;
    template <class Fn>
    static LB_ARM_INLINE void codes(const uint8_t *b, Fn fn) {
        two_bit_fields(b + 16, [&](uint8x16_t c, int v) LB_ARM_LAMBDA { fn(vreinterpretq_s8_u8(c), b[v] & 0x0F, v); });
    }
    static LB_ARM_INLINE void mins(const uint8_t *b, int16x8_t &m0, int16x8_t &m1) {
        const uint8x16_t mn = vshrq_n_u8(vld1q_u8(b), 4);
        m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
        m1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
    }
};

struct FQ3_K {  // hmask[32], qs[64], scales[12], d
    static constexpr int kQK = QK_K, kWB = 110, kAB = 292, kD = 108, kDmin = 0;
    static constexpr bool kMins = false;
    template <class Fn>
    static LB_ARM_INLINE void codes(const uint8_t *b, Fn fn) {
        // the 3rd bit of weight 32g + l is bit g of hmask[l]; clear means -4
        const int8x16_t four = vdupq_n_s8(4);
        const uint8_t *sc = b + 96;
        two_bit_fields(b + 32, [&](uint8x16_t c, int v) LB_ARM_LAMBDA {
            const uint8x16_t set = vtstq_u8(vld1q_u8(b + 16 * (v % 2)), splat_u8_here((uint8_t)(1u << (v / 2))));
            const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(c), vbicq_s8(four, vreinterpretq_s8_u8(set)));
            const int low = v < 8 ? (sc[v] & 0x0F) : (sc[v - 8] >> 4);
            const int high = (sc[8 + v % 4] >> (2 * (v / 4))) & 3;
            fn(q, (low | (high << 4)) - 32, v);
        });
    }
    static LB_ARM_INLINE void mins(const uint8_t *, int16x8_t &, int16x8_t &) {}
};

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (csrc/ref/kquants.cpp's scale_min_k4).
LB_ARM_INLINE int k4_scale(const uint8_t *sc, int s) {
    return s < 4 ? (sc[s] & 63) : ((sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4));
}
LB_ARM_INLINE int16_t k4_min(const uint8_t *sc, int s) {
    return (int16_t)(s < 4 ? (sc[s + 4] & 63) : ((sc[s + 4] >> 4) | ((sc[s] >> 6) << 4)));
}
LB_ARM_INLINE void k4_mins(const uint8_t *sc, int16x8_t &m0, int16x8_t &m1) {
    int16_t mn[16];
    for (int s = 0; s < 8; ++s) mn[2 * s] = mn[2 * s + 1] = k4_min(sc, s);  // bsums 2s, 2s+1: sub-block s
    m0 = vld1q_s16(mn);
    m1 = vld1q_s16(mn + 8);
}
// nibbles: qs[32k + 16j + i] low nibble = weight 64k + 16j + i (vector 4k + j), high nibble =
// weight 64k + 32 + 16j + i (vector 4k + 2 + j). fn(codes 0..15, v).
template <class Fn>
LB_ARM_INLINE void nibble_fields(const uint8_t *qs, Fn fn) {
    for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 2; ++j) {
            const uint8x16_t x = vld1q_u8(qs + 32 * k + 16 * j);
            fn(vandq_u8(x, vdupq_n_u8(0x0F)), 4 * k + j);
            fn(vshrq_n_u8(x, 4), 4 * k + 2 + j);
        }
}

struct FQ4_K {  // d, dmin, scales[12], qs[128]
    static constexpr int kQK = QK_K, kWB = 144, kAB = 292, kD = 0, kDmin = 2;
    static constexpr bool kMins = true;
    template <class Fn>
    static LB_ARM_INLINE void codes(const uint8_t *b, Fn fn) {
        nibble_fields(b + 16, [&](uint8x16_t c, int v) LB_ARM_LAMBDA { fn(vreinterpretq_s8_u8(c), k4_scale(b + 4, v / 2), v); });
    }
    static LB_ARM_INLINE void mins(const uint8_t *b, int16x8_t &m0, int16x8_t &m1) { k4_mins(b + 4, m0, m1); }
};

struct FQ5_K {  // d, dmin, scales[12], qh[32], qs[128]
    static constexpr int kQK = QK_K, kWB = 176, kAB = 292, kD = 0, kDmin = 2;
    static constexpr bool kMins = true;
    template <class Fn>
    static LB_ARM_INLINE void codes(const uint8_t *b, Fn fn) {
        // the 5th bit of weight 32s + l is bit s of qh[l]
        nibble_fields(b + 48, [&](uint8x16_t c, int v) LB_ARM_LAMBDA {
            const uint8x16_t set = vtstq_u8(vld1q_u8(b + 16 + 16 * (v % 2)), splat_u8_here((uint8_t)(1u << (v / 2))));
            const uint8x16_t q = vorrq_u8(c, vandq_u8(set, vdupq_n_u8(0x10)));
            fn(vreinterpretq_s8_u8(q), k4_scale(b + 4, v / 2), v);
        });
    }
    static LB_ARM_INLINE void mins(const uint8_t *b, int16x8_t &m0, int16x8_t &m1) { k4_mins(b + 4, m0, m1); }
};

struct FQ6_K {  // ql[128], qh[64], scales[16] (int8), d
    static constexpr int kQK = QK_K, kWB = 210, kAB = 292, kD = 208, kDmin = 0;
    static constexpr bool kMins = false;
    // per half h and 16-lane part j: weights 128h + 32g + 16j + i for g = 0..3 (vector 8h + 2g + j):
    //   g0: ql[64h + 16j + i] low nibble,  qh[32h + 16j + i] bits 1:0
    //   g1: ql[64h + 32 + 16j + i] low,    bits 3:2
    //   g2: ql[64h + 16j + i] high nibble, bits 5:4
    //   g3: ql[64h + 32 + 16j + i] high,   bits 7:6            code = 6 bits - 32
    template <class Fn>
    static LB_ARM_INLINE void codes(const uint8_t *b, Fn fn) {
        const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
        const int8x16_t off = vdupq_n_s8(32);
        const int8_t *sc = (const int8_t *)(b + 192);
        auto emit = [&](uint8x16_t c, int v) LB_ARM_LAMBDA { fn(vsubq_s8(vreinterpretq_s8_u8(c), off), sc[v], v); };
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 2; ++j) {
                const uint8x16_t l0 = vld1q_u8(b + 64 * h + 16 * j), l1 = vld1q_u8(b + 64 * h + 32 + 16 * j);
                const uint8x16_t hb = vld1q_u8(b + 128 + 32 * h + 16 * j);
                emit(vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(hb, m3), 4)), 8 * h + 0 + j);
                emit(vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4)), 8 * h + 2 + j);
                emit(vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4)), 8 * h + 4 + j);
                emit(vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4)), 8 * h + 6 + j);
            }
    }
    static LB_ARM_INLINE void mins(const uint8_t *, int16x8_t &, int16x8_t &) {}
};

}  // namespace

void register_kquants(KernelTable &t) {
    set_rows<KQuant<FQ2_K>>(t, T_Q2_K, "rows_q2_k_q8_k_" LB_ARM_SUFFIX);
    set_rows<KQuant<FQ3_K>>(t, T_Q3_K, "rows_q3_k_q8_k_" LB_ARM_SUFFIX);
    set_rows<KQuant<FQ4_K>>(t, T_Q4_K, "rows_q4_k_q8_k_" LB_ARM_SUFFIX);
    set_rows<KQuant<FQ5_K>>(t, T_Q5_K, "rows_q5_k_q8_k_" LB_ARM_SUFFIX);
    set_rows<KQuant<FQ6_K>>(t, T_Q6_K, "rows_q6_k_q8_k_" LB_ARM_SUFFIX);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
