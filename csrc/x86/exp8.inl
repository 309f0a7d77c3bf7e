// e^x on 8 float lanes (AVX2 + FMA): the one SIMD exp of the 256-bit levels, used by the GLU
// epilogue (csrc/x86/glu.inl) and the attention softmax (csrc/x86/avx2/attn.cpp). The method
// is ggml's ggml_v_expf (what llama.cpp's SwiGLU and softmax run); csrc/ref/glu.cpp's
// glu_expf is the scalar spec, equal bit for bit:
//   n = round(x / ln2) via the 1.5 * 2^23 shifter; b = x - n ln2 (ln2 in two parts);
//   p(b) a degree-5 polynomial; result p * 2^n rounded once (two exact power-of-two
//   factors, as avx512's vscalefps); |n| > 192: +inf for n > 0, else 0; NaN stays NaN.
// Included inside an anonymous namespace of a file built with the level's flags, so each
// level keeps its own copy (no inline function shared across ISA flags).
inline __m256 exp8(__m256 x) {
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x);
    b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), b);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 p45 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 p23 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 p01 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f));
    const __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(p45, u, p23), u, p01);
    // p * 2^n with one rounding, n = n1 + n2 (n1 = floor(n / 2)): p * 2^n1 is exact. Lanes
    // with |n| > 192 or NaN n convert to garbage here and are replaced below (NaN: p is NaN).
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 inf_or_0 = _mm256_and_ps(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_GT_OQ), _mm256_set1_ps(INFINITY));
    return _mm256_blendv_ps(r, inf_or_0, big);
}
