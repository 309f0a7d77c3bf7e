// Ternary row kernels at the aarch64 levels: TQ1_0, TQ2_0 x Q8_K and I2_S x I8_S. Shared body
// of csrc/arm/<level>/ternary.cpp (LOWBIT_ISA, LOWBIT_NS set). Layouts: csrc/ref/ternary.cpp.
//
// TQ1_0 / TQ2_0: the block's 256 values -1 / 0 / +1 (TQ2_0's unused code 3 is +2, as in the
// reference) as 16 int8x16 in weight order; per token isum = dot(values, q_a), exact; float
// step as the reference: acc += (float)isum * (d_w * d_a).
// I2_S: codes 0 / 1 / 2 as unsigned bytes; per (row, token) S = sum code * q_a over the whole
// row in int32 lanes (exact for n <= 2^22, as the reference notes), then the reference's
// (float)(S - act_sum) / act_scale * w_scale.
#include "simd.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

struct TDec { int8x16_t c[16]; float d; };

template <class F>
struct Ternary : F {
    template <int C>
    static LB_ARM_INLINE float32x4_t step(const TDec &d, const uint8_t *ab, size_t stride, float32x4_t acc) {
        const int32x4_t isum = per_token<C>(ab, stride, [&](const uint8_t *at) {
            const int8_t *q = (const int8_t *)(at + 4);
            int32x4_t p0 = vdupq_n_s32(0), p1 = vdupq_n_s32(0);  // two chains: 8 SDOTs each
            for (int v = 0; v < 16; v += 2) {
                p0 = dot16(p0, d.c[v], vld1q_s8(q + 16 * v));
                p1 = dot16(p1, d.c[v + 1], vld1q_s8(q + 16 * v + 16));
            }
            return vaddq_s32(p0, p1);
        });
        const float32x4_t da = f32_lanes<C>(ab, stride, 0);
        return vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(isum), vmulq_n_f32(da, d.d)));
    }
};

// TQ2_0: qs[32h + m] bits 2l+1:2l hold weight 128h + 32l + m: vector 8h + 2l + (m >= 16).
struct FTQ2_0 {
    static constexpr int kQK = QK_K, kWB = 66, kAB = 292;
    using Dec = TDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        const uint8x16_t m3 = vdupq_n_u8(3);
        const int8x16_t one = vdupq_n_s8(1);
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 2; ++j) {
                const uint8x16_t x = vld1q_u8(b + 32 * h + 16 * j);
                d.c[8 * h + 0 + j] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, m3)), one);
                d.c[8 * h + 2 + j] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 2), m3)), one);
                d.c[8 * h + 4 + j] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 4), m3)), one);
                d.c[8 * h + 6 + j] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(x, 6)), one);
            }
        d.d = f16(b + 64);
    }
};

// TQ1_0: trit k of a byte is ((uint8)(byte * 3^k) * 3) >> 8 (csrc/ref/ternary.cpp);
//   qs[m],      m < 32: trit k -> weight 32k + m         vectors 2k, 2k + 1
//   qs[32 + m], m < 16: trit k -> weight 160 + 16k + m   vector 10 + k
//   qh[m],      m < 4:  trit k -> weight 240 + 4k + m    vector 15 (lane 4k + m)
LB_ARM_INLINE int8x16_t trits(uint8x16_t x, uint8x16_t pow3) {
    const uint8x16_t q = vmulq_u8(x, pow3);  // mod 256
    const uint8x16_t t = vcombine_u8(vshrn_n_u16(vmull_u8(vget_low_u8(q), vdup_n_u8(3)), 8),
                                     vshrn_n_u16(vmull_high_u8(q, vdupq_n_u8(3)), 8));
    return vsubq_s8(vreinterpretq_s8_u8(t), vdupq_n_s8(1));
}
struct FTQ1_0 {
    static constexpr int kQK = QK_K, kWB = 54, kAB = 292;
    using Dec = TDec;
    static LB_ARM_INLINE void decode(const uint8_t *b, Dec &d) {
        static const uint8_t kPow3[5] = {1, 3, 9, 27, 81};
        static const uint8_t kQhPow[16] = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
        const uint8x16_t x0 = vld1q_u8(b), x1 = vld1q_u8(b + 16), x2 = vld1q_u8(b + 32);
        for (int k = 0; k < 5; ++k) {
            const uint8x16_t p = vdupq_n_u8(kPow3[k]);
            d.c[2 * k] = trits(x0, p);
            d.c[2 * k + 1] = trits(x1, p);
            d.c[10 + k] = trits(x2, p);
        }
        const uint8x16_t qh = vreinterpretq_u8_u32(vdupq_n_u32(ld32(b + 48)));  // qh[0..3] x4
        d.c[15] = trits(qh, vld1q_u8(kQhPow));
        d.d = f16(b + 52);
    }
};

// ---- I2_S: one integer sum per (row, token) over the whole row ----------------------------
// Block of 128 weights, 32 bytes: byte j holds weights j, 32+j, 64+j, 96+j in bits 7:6, 5:4,
// 3:2, 1:0, so group g (bits 7-2g : 6-2g) of bytes 0..15 / 16..31 is weights 32g + 0..15 / 16..31.
LB_ARM_INLINE void i2s_codes(const uint8_t *b, int8x16_t c[8]) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int j = 0; j < 2; ++j) {
        const uint8x16_t x = vld1q_u8(b + 16 * j);
        c[0 + j] = vreinterpretq_s8_u8(vshrq_n_u8(x, 6));
        c[2 + j] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 4), m3));
        c[4 + j] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 2), m3));
        c[6 + j] = vreinterpretq_s8_u8(vandq_u8(x, m3));
    }
}
LB_ARM_INLINE int32x4_t i2s_block(int32x4_t acc, const int8x16_t c[8], const uint8_t *q) {
    for (int v = 0; v < 8; ++v) acc = dot16(acc, c[v], vld1q_s8((const int8_t *)q + 16 * v));
    return acc;
}

// Lanes t < C: (float)(S_t - act_sum_t) / act_scale_t * w_scale.
template <int C>
LB_ARM_INLINE void i2s_finish(const RowArgs &a, int64_t r, int t0, int32x4_t s) {
    const uint8_t *at = a.act + (size_t)t0 * a.act_stride;
    const size_t st = a.act_stride;
    int32x4_t sums = vdupq_n_s32(0);  // act_sum of each token (lanes >= C: 0, never stored)
    sums = vsetq_lane_s32((int32_t)ld32(at + 4), sums, 0);
    if (C > 1) sums = vsetq_lane_s32((int32_t)ld32(at + st + 4), sums, 1);
    if (C > 2) sums = vsetq_lane_s32((int32_t)ld32(at + 2 * st + 4), sums, 2);
    if (C > 3) sums = vsetq_lane_s32((int32_t)ld32(at + 3 * st + 4), sums, 3);
    const float32x4_t scale = f32_lanes<C>(at, st, 0);
    const float32x4_t v = vmulq_n_f32(vdivq_f32(vcvtq_f32_s32(vsubq_s32(s, sums)), scale), a.w_scale);
    store_lanes<C>(a, r, t0, v);
}

template <int NT>
void rows_i2_s(const RowArgs &a, int64_t r0, int64_t r1, int) {
    constexpr int C0 = NT < 4 ? NT : 4, C1 = NT > 4 ? NT - 4 : 1;
    const int64_t nb = a.n / QK_I2S;
    const uint8_t *q0 = a.act + I8S_HEADER;
    const size_t st = a.act_stride;
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        const int32x4_t z = vdupq_n_s32(0);
        int32x4_t s0 = z, s1 = z, s2 = z, s3 = z, s4 = z, s5 = z, s6 = z, s7 = z;
        for (int64_t b = 0; b < nb; ++b) {
            int8x16_t c[8];
            i2s_codes(w + 32 * b, c);
            const uint8_t *q = q0 + QK_I2S * b;
            s0 = i2s_block(s0, c, q);
            if (NT > 1) s1 = i2s_block(s1, c, q + st);
            if (NT > 2) s2 = i2s_block(s2, c, q + 2 * st);
            if (NT > 3) s3 = i2s_block(s3, c, q + 3 * st);
            if (NT > 4) s4 = i2s_block(s4, c, q + 4 * st);
            if (NT > 5) s5 = i2s_block(s5, c, q + 5 * st);
            if (NT > 6) s6 = i2s_block(s6, c, q + 6 * st);
            if (NT > 7) s7 = i2s_block(s7, c, q + 7 * st);
        }
        i2s_finish<C0>(a, r, 0, reduce4(s0, s1, s2, s3));
        if constexpr (NT > 4) i2s_finish<C1>(a, r, 4, reduce4(s4, s5, s6, s7));
    }
}

}  // namespace

void register_ternary(KernelTable &t) {
    set_rows<Ternary<FTQ1_0>>(t, T_TQ1_0, "rows_tq1_0_q8_k_" LB_ARM_SUFFIX);
    set_rows<Ternary<FTQ2_0>>(t, T_TQ2_0, "rows_tq2_0_q8_k_" LB_ARM_SUFFIX);
    const char *name = "rows_i2_s_i8_s_" LB_ARM_SUFFIX;
    KernelEntry &e = t.at(T_I2_S);
    e.rows[1] = RowKernel{rows_i2_s<1>, name, LOWBIT_ISA};
    e.rows[2] = RowKernel{rows_i2_s<2>, name, LOWBIT_ISA};
    e.rows[3] = RowKernel{rows_i2_s<3>, name, LOWBIT_ISA};
    e.rows[4] = RowKernel{rows_i2_s<4>, name, LOWBIT_ISA};
    e.rows[5] = RowKernel{rows_i2_s<5>, name, LOWBIT_ISA};
    e.rows[6] = RowKernel{rows_i2_s<6>, name, LOWBIT_ISA};
    e.rows[7] = RowKernel{rows_i2_s<7>, name, LOWBIT_ISA};
    e.rows[8] = RowKernel{rows_i2_s<8>, name, LOWBIT_ISA};
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
