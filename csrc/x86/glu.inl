// The GLU epilogue (contract: glu_fn in kernels.h; the spec: csrc/ref/glu.cpp), shared body
// of the per-level files csrc/x86/<level>/glu.cpp, compiled with LOWBIT_ISA / LOWBIT_NS set.
//
// Lanes are independent: element i of out depends on g[i] and u[i] only, through the same
// float operations as the scalar reference in the same order (FMA where it uses std::fmaf),
// so every level equals the reference bit for bit. The tail (n % lanes) runs the same code
// on masked loads and stores (no scalar remainder loop that could differ).
//   avx512: 16 lanes; 2^n applied by vscalefps (ggml's own avx512 ggml_v_expf).
//   avx2:   8 lanes; 2^n applied as two exact power-of-two factors (= one rounding, as scalef).
// GeGLU (gemma3) is a table lookup: g to half by vcvtps2ph (round to nearest even, the
// reference's f32_to_fp16 on every input), the half's 16 bits widened to a lane index, a
// 32-bit gather from ref::gelu_table (256 KB of floats), times u; g <= -10 and g >= 10 blended
// in as the reference's branches (ordered compares: NaN takes the table, as there).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "../kernels.h"
#include "../ref/ref.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including glu.inl"
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {

// The level for #if (LOWBIT_ISA is an enum, invisible to the preprocessor): from the flags
// the level's files are built with.
#if defined(__AVX512F__)
#define LB_GLU_512 1
#else
#define LB_GLU_512 0
#endif

#if LB_GLU_512
using V = __m512;
constexpr int L = 16;
inline V set1(float x) { return _mm512_set1_ps(x); }
inline V zero() { return _mm512_setzero_ps(); }
inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V fnma(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b, one rounding
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V div(V a, V b) { return _mm512_div_ps(a, b); }

// exp(x) per lane, as glu_expf in csrc/ref/glu.cpp
inline V vexp(V x) {
    const V shift = set1(0x1.8p23f);
    const V z = fma(x, set1(0x1.715476p+0f), shift);
    const V n = sub(z, shift);
    V b = fnma(n, set1(0x1.62e4p-1f), x);
    b = fnma(n, set1(0x1.7f7d1cp-20f), b);
    const V u = mul(b, b);
    const V p45 = fma(set1(0x1.0e4020p-7f), b, set1(0x1.573e2ep-5f));
    const V p23 = fma(set1(0x1.555e66p-3f), b, set1(0x1.fffdb6p-2f));
    const V p01 = fma(set1(0x1.ffffecp-1f), b, set1(1.0f));
    const V p = fma(fma(p45, u, p23), u, p01);
    const V r = _mm512_maskz_scalef_ps((__mmask16)0xffff, p, n);  // p * 2^n, one rounding; NaN n: NaN
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_andnot_ps(set1(-0.0f), n), set1(192.0f), _CMP_GT_OQ);
    const __mmask16 pos = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_GT_OQ);
    // |n| > 192: +inf where n > 0, else 0
    return _mm512_mask_blend_ps(big, r, _mm512_maskz_mov_ps(pos, set1(INFINITY)));
}

inline __mmask16 tail_mask(int64_t k) { return (__mmask16)((1u << k) - 1u); }
inline V load(const float *p) { return _mm512_loadu_ps(p); }
inline V load_tail(const float *p, int64_t k) { return _mm512_maskz_loadu_ps(tail_mask(k), p); }
inline void store(float *p, V v) { _mm512_storeu_ps(p, v); }
inline void store_tail(float *p, V v, int64_t k) { _mm512_mask_storeu_ps(p, tail_mask(k), v); }
inline V relu(V g) {  // g > 0 ? g : 0 (NaN: 0)
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GT_OQ), g);
}
// gelu_table[fp16(g)] * u; g <= -10: +0; g >= 10: g * u
inline V geglu(V g, V u, const float *tab) {
    const __m512i idx = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    V r = mul(_mm512_i32gather_ps(idx, tab, 4), u);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(g, set1(10.0f), _CMP_GE_OQ), r, mul(g, u));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(g, set1(-10.0f), _CMP_NLE_UQ), r);  // g <= -10: 0
}
#else  // avx2 (+FMA)
using V = __m256;
constexpr int L = 8;
inline V set1(float x) { return _mm256_set1_ps(x); }
inline V zero() { return _mm256_setzero_ps(); }
inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V fnma(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V add(V a, V b) { return _mm256_add_ps(a, b); }
inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V div(V a, V b) { return _mm256_div_ps(a, b); }

#include "exp8.inl"  // exp8: ggml's expf method on 8 lanes
inline V vexp(V x) { return exp8(x); }

inline __m256i tail_mask(int64_t k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V load(const float *p) { return _mm256_loadu_ps(p); }
inline V load_tail(const float *p, int64_t k) { return _mm256_maskload_ps(p, tail_mask(k)); }
inline void store(float *p, V v) { _mm256_storeu_ps(p, v); }
inline void store_tail(float *p, V v, int64_t k) { _mm256_maskstore_ps(p, tail_mask(k), v); }
inline V relu(V g) { return _mm256_and_ps(_mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GT_OQ), g); }
// gelu_table[fp16(g)] * u; g <= -10: +0; g >= 10: g * u
inline V geglu(V g, V u, const float *tab) {
    const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    V r = mul(_mm256_i32gather_ps(tab, idx, 4), u);
    r = _mm256_blendv_ps(r, mul(g, u), _mm256_cmp_ps(g, set1(10.0f), _CMP_GE_OQ));
    return _mm256_and_ps(_mm256_cmp_ps(g, set1(-10.0f), _CMP_NLE_UQ), r);  // g <= -10: +0
}
#endif

inline V silu_mul(V g, V u) {  // g / (1 + exp(0 - g)) * u
    const V e = vexp(sub(zero(), g));
    return mul(div(g, add(set1(1.0f), e)), u);
}

template <int KIND>
inline V glu1(V g, V u) {
    if (KIND == GLU_RELU2) {
        const V r = relu(g);
        return mul(mul(r, r), u);
    }
    return silu_mul(g, u);
}

template <int KIND>
void glu_kind(const float *g, const float *u, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + L <= n; i += L) store(out + i, glu1<KIND>(load(g + i), load(u + i)));
    if (i < n) store_tail(out + i, glu1<KIND>(load_tail(g + i, n - i), load_tail(u + i, n - i)), n - i);
}

void geglu_all(const float *g, const float *u, float *out, int64_t n) {
    const float *tab = ref::gelu_table();
    int64_t i = 0;
    for (; i + L <= n; i += L) store(out + i, geglu(load(g + i), load(u + i), tab));
    if (i < n) store_tail(out + i, geglu(load_tail(g + i, n - i), load_tail(u + i, n - i), tab), n - i);
}

void glu_simd(const float *g, const float *u, float *out, int64_t n, int kind) {
    if (kind == GLU_GEGLU) geglu_all(g, u, out, n);
    else if (kind == GLU_RELU2) glu_kind<GLU_RELU2>(g, u, out, n);
    else glu_kind<GLU_SILU>(g, u, out, n);
}

}  // namespace

void register_glu(KernelTable &t) {
#if LB_GLU_512
    t.glu = GluKernel{glu_simd, "glu_avx512", ISA_AVX512};
#else
    t.glu = GluKernel{glu_simd, "glu_avx2", LOWBIT_ISA};
#endif
}

}  // namespace LOWBIT_NS
}  // namespace lowbit

#undef LB_GLU_512
