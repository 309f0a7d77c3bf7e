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

// F provides codes(block, fn): fn(int8x16 values -1..1 (2), v) for the 16 vectors v (weights
// 16v .. 16v+15), decoded once per row and block; kD the offset of its fp16 d.
template <class F>
struct Ternary : F {
    template <int NT>
    static LB_ARM_INLINE void block(const uint8_t *wb, const uint8_t *ab, size_t st, float32x4_t &acc0,
                                    float32x4_t &acc1) {
        Acc8 is;
        F::codes(wb, [&](int8x16_t c, int v) LB_ARM_LAMBDA {
            for_tokens<NT>(is, ab, st, [&](int32x4_t acc, const uint8_t *at) LB_ARM_LAMBDA {
                return dot16(acc, c, vld1q_s8((const int8_t *)(at + 4 + 16 * v)));
            });
        });
        const float d = f16(wb + F::kD);
        acc0 = step<(NT < 4 ? NT : 4)>(d, ab, st, is.lo(), acc0);
        if constexpr (NT > 4) acc1 = step<NT - 4>(d, ab + 4 * st, st, is.hi(), acc1);
    }
    template <int C>
    static LB_ARM_INLINE float32x4_t step(float d, const uint8_t *ab, size_t st, int32x4_t isum, float32x4_t acc) {
        const float32x4_t da = f32_lanes<C>(ab, st, 0);
        return vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(isum), vmulq_n_f32(da, d)));
    }
};

// TQ2_0: qs[32h + m] bits 2l+1:2l hold weight 128h + 32l + m: vector 8h + 2l + (m >= 16).
struct FTQ2_0 {
    static constexpr int kQK = QK_K, kWB = 66, kAB = 292, kD = 64;
    template <class Fn>
    static LB_ARM_INLINE void codes(const uint8_t *b, Fn fn) {
        const uint8x16_t m3 = vdupq_n_u8(3);
        const int8x16_t one = vdupq_n_s8(1);
        auto emit = [&](uint8x16_t c, int v) LB_ARM_LAMBDA { fn(vsubq_s8(vreinterpretq_s8_u8(c), one), v); };
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 2; ++j) {
                const uint8x16_t x = vld1q_u8(b + 32 * h + 16 * j);
                emit(vandq_u8(x, m3), 8 * h + 0 + j);
                emit(vandq_u8(vshrq_n_u8(x, 2), m3), 8 * h + 2 + j);
                emit(vandq_u8(vshrq_n_u8(x, 4), m3), 8 * h + 4 + j);
                emit(vshrq_n_u8(x, 6), 8 * h + 6 + j);
            }
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
    static constexpr int kQK = QK_K, kWB = 54, kAB = 292, kD = 52;
    template <class Fn>
    static LB_ARM_INLINE void codes(const uint8_t *b, Fn fn) {
        static const uint8_t kPow3[5] = {1, 3, 9, 27, 81};
        static const uint8_t kQhPow[16] = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};
        for (int k = 0; k < 5; ++k) {
            const uint8x16_t p = vdupq_n_u8(kPow3[k]);
            fn(trits(vld1q_u8(b), p), 2 * k);
            fn(trits(vld1q_u8(b + 16), p), 2 * k + 1);
            fn(trits(vld1q_u8(b + 32), p), 10 + k);
        }
        const uint8x16_t qh = vreinterpretq_u8_u32(vdupq_n_u32(ld32(b + 48)));  // qh[0..3] x4
        fn(trits(qh, vld1q_u8(kQhPow)), 15);
    }
};

// ---- I2_S: one integer sum per (row, token) over the whole row ----------------------------
// Block of 128 weights, 32 bytes: byte j holds weights j, 32+j, 64+j, 96+j in bits 7:6, 5:4,
// 3:2, 1:0, so group g (bits 7-2g : 6-2g) of bytes 0..15 / 16..31 is weights 32g + 0..15 / 16..31.
template <class Fn>
LB_ARM_INLINE void i2s_codes(const uint8_t *b, Fn fn) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int j = 0; j < 2; ++j) {
        const uint8x16_t x = vld1q_u8(b + 16 * j);
        fn(vreinterpretq_s8_u8(vshrq_n_u8(x, 6)), 0 + j);
        fn(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 4), m3)), 2 + j);
        fn(vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(x, 2), m3)), 4 + j);
        fn(vreinterpretq_s8_u8(vandq_u8(x, m3)), 6 + j);
    }
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
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        Acc8 s;  // S per token, over the whole row
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *q = q0 + QK_I2S * b;
            i2s_codes(w + 32 * b, [&](int8x16_t c, int v) LB_ARM_LAMBDA {
                for_tokens<NT>(s, q, a.act_stride, [&](int32x4_t acc, const uint8_t *qt) LB_ARM_LAMBDA {
                    return dot16(acc, c, vld1q_s8((const int8_t *)qt + 16 * v));
                });
            });
        }
        i2s_finish<C0>(a, r, 0, s.lo());
        if constexpr (NT > 4) i2s_finish<C1>(a, r, 4, s.hi());
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
