// Float-row kernels at the aarch64 levels: F32, F16, BF16 rows x F32 activations (the router
// and the unquantized tensors). Shared body of csrc/arm/<level>/floatrows.cpp.
//
// Arithmetic per (row, token), fixed whatever nt and the row split: weights widened exactly to
// float, then every product w[i] * x[i] formed in double (exact: 24 + 24 bits), summed in
// double in 4 lanes (lane i % 4 takes i's product, FMA = multiply + add here since the product
// is exact), the lanes added as (l0 + l1) + (l2 + l3), then the tail n % 4 in index order, and
// the sum rounded to float once. csrc/ref/float.cpp sums the same exact products in one lane:
// the two differ by double rounding only, far below float's (tests/arm: <= 1e-6 relative).
#include "simd.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

// Four weights from i, widened exactly to float.
struct WF32 {
    static constexpr int kBytes = 4;
    static LB_ARM_INLINE float32x4_t load4(const uint8_t *w, int64_t i) { return vld1q_f32((const float *)(w + 4 * i)); }
    static LB_ARM_INLINE float one(const uint8_t *w, int64_t i) { return ldf(w + 4 * i); }
};
struct WF16 {
    static constexpr int kBytes = 2;
    static LB_ARM_INLINE float32x4_t load4(const uint8_t *w, int64_t i) {
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(w + 2 * i))));
    }
    static LB_ARM_INLINE float one(const uint8_t *w, int64_t i) { return f16(w + 2 * i); }
};
struct WBF16 {
    static constexpr int kBytes = 2;
    static LB_ARM_INLINE float32x4_t load4(const uint8_t *w, int64_t i) {
        return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(w + 2 * i)), 16));
    }
    static LB_ARM_INLINE float one(const uint8_t *w, int64_t i) {
        const uint32_t u = (uint32_t)ld16(w + 2 * i) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

// acc (two double lanes each for lanes 0,1 and 2,3) += w * x over 4 values.
LB_ARM_INLINE void fma4(float64x2_t &lo, float64x2_t &hi, float32x4_t w, const float *x) {
    const float32x4_t xv = vld1q_f32(x);
    lo = vfmaq_f64(lo, vcvt_f64_f32(vget_low_f32(w)), vcvt_f64_f32(vget_low_f32(xv)));
    hi = vfmaq_f64(hi, vcvt_high_f64_f32(w), vcvt_high_f64_f32(xv));
}

template <class W>
LB_ARM_INLINE float finish(float64x2_t lo, float64x2_t hi, const uint8_t *w, const float *x, int64_t n4, int64_t n) {
    double s = (vgetq_lane_f64(lo, 0) + vgetq_lane_f64(lo, 1)) + (vgetq_lane_f64(hi, 0) + vgetq_lane_f64(hi, 1));
    for (int64_t i = n4; i < n; ++i) s += (double)W::one(w, i) * (double)x[i];
    return (float)s;
}

// Tokens t0 .. t0 + C - 1 (C <= 4) of one row: accumulators l0..l3 / h0..h3 per token.
template <class W, int C>
LB_ARM_INLINE void chunk(const RowArgs &a, int64_t r, int t0) {
    const uint8_t *w = a.w + (size_t)r * a.w_stride;
    const float *x0 = (const float *)(a.act + (size_t)t0 * a.act_stride);
    const size_t xs = a.act_stride / sizeof(float);
    const int64_t n = a.n, n4 = n & ~(int64_t)3;
    const float64x2_t z = vdupq_n_f64(0.0);
    float64x2_t l0 = z, h0 = z, l1 = z, h1 = z, l2 = z, h2 = z, l3 = z, h3 = z;
    for (int64_t i = 0; i < n4; i += 4) {
        const float32x4_t wv = W::load4(w, i);
        fma4(l0, h0, wv, x0 + i);
        if (C > 1) fma4(l1, h1, wv, x0 + xs + i);
        if (C > 2) fma4(l2, h2, wv, x0 + 2 * xs + i);
        if (C > 3) fma4(l3, h3, wv, x0 + 3 * xs + i);
    }
    float *o = a.out + (size_t)t0 * a.out_stride + r;
    o[0] = finish<W>(l0, h0, w, x0, n4, n);
    if (C > 1) o[a.out_stride] = finish<W>(l1, h1, w, x0 + xs, n4, n);
    if (C > 2) o[2 * a.out_stride] = finish<W>(l2, h2, w, x0 + 2 * xs, n4, n);
    if (C > 3) o[3 * a.out_stride] = finish<W>(l3, h3, w, x0 + 3 * xs, n4, n);
}

template <class W, int NT>
void rows_float(const RowArgs &a, int64_t r0, int64_t r1, int) {
    constexpr int C0 = NT < 4 ? NT : 4, C1 = NT > 4 ? NT - 4 : 1;
    for (int64_t r = r0; r < r1; ++r) {
        chunk<W, C0>(a, r, 0);
        if constexpr (NT > 4) chunk<W, C1>(a, r, 4);
    }
}

template <class W>
void set_float(KernelTable &t, int id, const char *name) {
    set_rows_each_nt(t.at(id), name, LOWBIT_ISA, [](auto nt) { return &rows_float<W, decltype(nt)::value>; });
}

}  // namespace

void register_float(KernelTable &t) {
    set_float<WF32>(t, T_F32, "rows_f32_f32_" LB_ARM_SUFFIX);
    set_float<WF16>(t, T_F16, "rows_f16_f32_" LB_ARM_SUFFIX);
    set_float<WBF16>(t, T_BF16, "rows_bf16_f32_" LB_ARM_SUFFIX);
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
