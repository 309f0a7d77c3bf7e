// K-quant row kernels at the aarch64 levels: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K x Q8_K. Shared body
// of csrc/arm/<level>/kquants.cpp (LOWBIT_ISA, LOWBIT_NS set). Bit layouts: csrc/ref/kquants.cpp.
//
// Decoded super-block: the 256 codes as 16 int8x16 c[v], v = weights 16v .. 16v+15 (signed
// values: Q3_K's -4..3 and Q6_K's -32..31 come out of the decode with their offsets applied),
// the sub-block scales as ints, and for the formats with mins the mins spread over the 16 bsums
// as two int16x8 (mins[j] = the min of bsum j's sub-block).
// Per token: isum = sum_s sc[s] * dot(codes of s, q_a of s), msum = sum_j bsums[j] * mins[j],
// both exact in int32 (csrc/ref/kquants.cpp: the largest, Q6_K, stays below 2^28). Float step:
//   acc += (d_w * d_a) * (float)isum - (dmin_w * d_a) * (float)msum     (Q2_K, Q4_K, Q5_K)
//   acc += (d_w * d_a) * (float)isum                                    (Q3_K, Q6_K)
#include "simd.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

constexpr int kQ8K_D = 0, kQ8K_QS = 4, kQ8K_BSUMS = 4 + QK_K;  // block_q8_K offsets

// 16 codes per sub-block (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K), 16 or 8 scales.
template <int SUB>
struct KDec {
    int8x16_t c[16];
    int32_t sc[QK_K / SUB];
    int16x8_t mins0, mins1;
    float d, dmin;
};

// sum_s sc[s] * dot(codes of s, q_a of s): lanes of the result add up to isum.
template <int SUB>
LB_ARM_INLINE int32x4_t k_isum(const KDec<SUB> &d, const uint8_t *at) {
    const int8_t *q = (const int8_t *)(at + kQ8K_QS);
    int32x4_t acc = vdupq_n_s32(0);
    for (int s = 0; s < QK_K / SUB; ++s) {
        int32x4_t p = dot16(vdupq_n_s32(0), d.c[SUB / 16 * s], vld1q_s8(q + SUB * s));
        if (SUB == 32) p = dot16(p, d.c[2 * s + 1], vld1q_s8(q + 32 * s + 16));
        acc = vmlaq_n_s32(acc, p, d.sc[s]);
    }
    return acc;
}
template <int SUB>
LB_ARM_INLINE int32x4_t k_msum(const KDec<SUB> &d, const uint8_t *at) {
    const int16x8_t b0 = vld1q_s16((const int16_t *)(at + kQ8K_BSUMS));
    const int16x8_t b1 = vld1q_s16((const int16_t *)(at + kQ8K_BSUMS + 16));
    int32x4_t m = vmull_s16(vget_low_s16(b0), vget_low_s16(d.mins0));
    m = vmlal_high_s16(m, b0, d.mins0);
    m = vmlal_s16(m, vget_low_s16(b1), vget_low_s16(d.mins1));
    return vmlal_high_s16(m, b1, d.mins1);
}

template <class F>
struct KQuant : F {
    template <int C>
    static LB_ARM_INLINE float32x4_t step(const typename F::Dec &d, const uint8_t *ab, size_t stride, float32x4_t acc) {
        const int32x4_t isum = per_token<C>(ab, stride, [&](const uint8_t *at) { return k_isum(d, at); });
        const float32x4_t da = f32_lanes<C>(ab, stride, kQ8K_D);
        const float32x4_t t = vmulq_f32(vmulq_n_f32(da, d.d), vcvtq_f32_s32(isum));
        if constexpr (F::kMins) {
            const int32x4_t msum = per_token<C>(ab, stride, [&](const uint8_t *at) { return k_msum(d, at); });
            return vaddq_f32(acc, vsubq_f32(t, vmulq_f32(vmulq_n_f32(da, d.dmin), vcvtq_f32_s32(msum))));
        } else {
            return vaddq_f32(acc, t);
        }
    }
};

// Q2_K: byte qs[32h + l] holds weights 128h + 32k + l in bits 2k+1:2k: vector 8h + 2k + (l >= 16).
LB_ARM_INLINE void two_bit_codes(const uint8_t *qs, int8x16_t c[16]) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 2; ++j) {
            const uint8x16_t x = vld1q_u8(qs + 32 * h + 16 * j);
            c[8 * h + 0 + j] = vreinterpretq_s8_u8(vandq_u8(x, m3));
            c[8 * h + 2 + j] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 2), m3));
            c[8 * h + 4 + j] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 4), m3));
            c[8 * h + 6 + j] = vreinterpretq_s8_u8(vshrq_n_u8(x, 6));
        }
}

struct FQ2_K {
    static constexpr int kQK = QK_K, kWB = 84, kAB = 292;
    static constexpr bool kMins = true;
    using Dec = KDec<16>;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        two_bit_codes(b + 16, d.c);
        const uint8x16_t s = vld1q_u8(b);
        const uint8x16_t mn = vshrq_n_u8(s, 4);
        d.mins0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
        d.mins1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
        for (int i = 0; i < 16; ++i) d.sc[i] = b[i] & 0x0F;
        d.d = f16(b + 80);
        d.dmin = f16(b + 82);
    }
};

struct FQ3_K {
    static constexpr int kQK = QK_K, kWB = 110, kAB = 292;
    static constexpr bool kMins = false;
    using Dec = KDec<16>;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        two_bit_codes(b + 32, d.c);
        // the 3rd bit of weight 32k' + l (k' = 4h + k) is bit k' of hmask[l]; clear means -4
        const uint8x16_t hm0 = vld1q_u8(b), hm1 = vld1q_u8(b + 16);
        const int8x16_t four = vdupq_n_s8(4);
        for (int v = 0; v < 16; ++v) {
            const int kk = v / 2;  // 32-weight group
            const uint8x16_t set = vtstq_u8(v % 2 ? hm1 : hm0, vdupq_n_u8((uint8_t)(1u << kk)));
            d.c[v] = vsubq_s8(d.c[v], vbicq_s8(four, vreinterpretq_s8_u8(set)));
        }
        const uint8_t *sc = b + 96;
        for (int s = 0; s < 16; ++s) {
            const int low = s < 8 ? (sc[s] & 0x0F) : (sc[s - 8] >> 4);
            const int high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            d.sc[s] = (low | (high << 4)) - 32;
        }
        d.d = f16(b + 108);
    }
};

// Q4_K / Q5_K scales: csrc/ref/kquants.cpp's scale_min_k4.
LB_ARM_INLINE void scale_min_k4(const uint8_t *sc, int s, int &scale, int &mn) {
    if (s < 4) {
        scale = sc[s] & 63;
        mn = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4);
        mn = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
}
// Q4_K nibbles: qs[32c + l] low nibble = weight 64c + l, high = 64c + 32 + l.
LB_ARM_INLINE void nibble_codes(const uint8_t *qs, int8x16_t c[16]) {
    for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 2; ++j) {
            const uint8x16_t x = vld1q_u8(qs + 32 * k + 16 * j);
            c[4 * k + j] = vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0F)));
            c[4 * k + 2 + j] = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
        }
}
LB_ARM_INLINE void k4_scales(const uint8_t *scales, KDec<32> &d) {
    int16_t mn[16];
    for (int s = 0; s < 8; ++s) {
        int sc, m;
        scale_min_k4(scales, s, sc, m);
        d.sc[s] = sc;
        mn[2 * s] = mn[2 * s + 1] = (int16_t)m;  // bsums 2s, 2s+1 cover sub-block s
    }
    d.mins0 = vld1q_s16(mn);
    d.mins1 = vld1q_s16(mn + 8);
}

struct FQ4_K {
    static constexpr int kQK = QK_K, kWB = 144, kAB = 292;
    static constexpr bool kMins = true;
    using Dec = KDec<32>;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        nibble_codes(b + 16, d.c);
        k4_scales(b + 4, d);
        d.d = f16(b);
        d.dmin = f16(b + 2);
    }
};

struct FQ5_K {
    static constexpr int kQK = QK_K, kWB = 176, kAB = 292;
    static constexpr bool kMins = true;
    using Dec = KDec<32>;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        nibble_codes(b + 48, d.c);
        // the 5th bit of weight 32s + l is bit s of qh[l]
        const uint8x16_t qh0 = vld1q_u8(b + 16), qh1 = vld1q_u8(b + 32), b16 = vdupq_n_u8(0x10);
        for (int v = 0; v < 16; ++v) {
            const uint8x16_t set = vtstq_u8(v % 2 ? qh1 : qh0, vdupq_n_u8((uint8_t)(1u << (v / 2))));
            d.c[v] = vorrq_s8(d.c[v], vreinterpretq_s8_u8(vandq_u8(set, b16)));
        }
        k4_scales(b + 4, d);
        d.d = f16(b);
        d.dmin = f16(b + 2);
    }
};

struct FQ6_K {
    static constexpr int kQK = QK_K, kWB = 210, kAB = 292;
    static constexpr bool kMins = false;
    using Dec = KDec<16>;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
        const int8x16_t off = vdupq_n_s8(32);
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 2; ++j) {
                const uint8x16_t l0 = vld1q_u8(b + 64 * h + 16 * j), l1 = vld1q_u8(b + 64 * h + 32 + 16 * j);
                const uint8x16_t hb = vld1q_u8(b + 128 + 32 * h + 16 * j);
                const uint8x16_t g0 = vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(hb, m3), 4));
                const uint8x16_t g1 = vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 2), m3), 4));
                const uint8x16_t g2 = vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hb, 4), m3), 4));
                const uint8x16_t g3 = vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(hb, 6), 4));
                d.c[8 * h + 0 + j] = vsubq_s8(vreinterpretq_s8_u8(g0), off);
                d.c[8 * h + 2 + j] = vsubq_s8(vreinterpretq_s8_u8(g1), off);
                d.c[8 * h + 4 + j] = vsubq_s8(vreinterpretq_s8_u8(g2), off);
                d.c[8 * h + 6 + j] = vsubq_s8(vreinterpretq_s8_u8(g3), off);
            }
        for (int s = 0; s < 16; ++s) d.sc[s] = (int8_t)b[192 + s];
        d.d = f16(b + 208);
    }
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
