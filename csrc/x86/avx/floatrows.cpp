// Float-row kernels at the avx level: F32, F16, BF16 rows x F32 activations (the MoE router's
// dot and every unquantized tensor). No F16C here: halves are widened with integer ops (avx.h's
// half_to_float4, exact). Arithmetic per (row, token), whatever nt and the row split: products formed
// in double (exact), summed in 4 double lanes (lane i % 4 takes i's product; add after an exact
// multiply is what FMA would give), lanes added as (l0 + l1) + (l2 + l3), then the n % 4 tail in
// index order, rounded to float once; csrc/arm/floatrows.inl does the same operations, and
// csrc/ref/float.cpp sums the same exact products in one lane (they differ by double rounding).
#include "avx.h"

namespace lowbit {
namespace avx {
namespace {

// four weights from i as float
struct WF32 {
    static LB_AVX_INLINE __m128 load4(const uint8_t *w, int64_t i) { return _mm_loadu_ps((const float *)(w + 4 * i)); }
    static LB_AVX_INLINE float one(const uint8_t *w, int64_t i) { return ldf(w + 4 * i); }
};
struct WBF16 {
    static LB_AVX_INLINE __m128 load4(const uint8_t *w, int64_t i) {
        const __m128i h = _mm_loadl_epi64((const __m128i *)(w + 2 * i));
        return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));  // bits << 16
    }
    static LB_AVX_INLINE float one(const uint8_t *w, int64_t i) { return bf16_to_f32(ld16(w + 2 * i)); }
};
struct WF16 {  // avx.h's half_to_float4 (exact)
    static LB_AVX_INLINE __m128 load4(const uint8_t *w, int64_t i) {
        return half_to_float4(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(w + 2 * i))));
    }
    static LB_AVX_INLINE float one(const uint8_t *w, int64_t i) { return f16(w + 2 * i); }
};

LB_AVX_INLINE void acc4(__m256d &acc, __m256d w, const float *x) {
    acc = _mm256_add_pd(acc, _mm256_mul_pd(w, _mm256_cvtps_pd(_mm_loadu_ps(x))));
}

template <class W>
LB_AVX_INLINE float finish(__m256d acc, const uint8_t *w, const float *x, int64_t n4, int64_t n) {
    alignas(32) double l[4];
    _mm256_store_pd(l, acc);
    double s = (l[0] + l[1]) + (l[2] + l[3]);
    for (int64_t i = n4; i < n; ++i) s += (double)W::one(w, i) * (double)x[i];
    return (float)s;
}

// Tokens t0 .. t0 + C - 1 (C <= 4) of one row; one 4-lane double accumulator per token (a0..a3).
template <class W, int C>
LB_AVX_INLINE void chunk(const RowArgs &a, int64_t r, int t0) {
    const uint8_t *w = a.w + (size_t)r * a.w_stride;
    const float *x0 = (const float *)(a.act + (size_t)t0 * a.act_stride);
    const size_t xs = a.act_stride / sizeof(float);
    const int64_t n = a.n, n4 = n & ~(int64_t)3;
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < n4; i += 4) {
        const __m256d wv = _mm256_cvtps_pd(W::load4(w, i));
        acc4(a0, wv, x0 + i);
        if (C > 1) acc4(a1, wv, x0 + xs + i);
        if (C > 2) acc4(a2, wv, x0 + 2 * xs + i);
        if (C > 3) acc4(a3, wv, x0 + 3 * xs + i);
    }
    float *o = a.out + (size_t)t0 * a.out_stride + r;
    o[0] = finish<W>(a0, w, x0, n4, n);
    if (C > 1) o[a.out_stride] = finish<W>(a1, w, x0 + xs, n4, n);
    if (C > 2) o[2 * a.out_stride] = finish<W>(a2, w, x0 + 2 * xs, n4, n);
    if (C > 3) o[3 * a.out_stride] = finish<W>(a3, w, x0 + 3 * xs, n4, n);
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
    set_rows_each_nt(t.at(id), name, ISA_AVX, [](auto nt) { return &rows_float<W, decltype(nt)::value>; });
}

}  // namespace

void register_float(KernelTable &t) {
    set_float<WF32>(t, T_F32, "rows_f32_f32_avx");
    set_float<WF16>(t, T_F16, "rows_f16_f32_avx");
    set_float<WBF16>(t, T_BF16, "rows_bf16_f32_avx");
}

}  // namespace avx
}  // namespace lowbit
