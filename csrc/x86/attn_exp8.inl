// The attention's exp and soft-cap on 8 float lanes, bitwise their scalar specs ref::attn_exp and
// ref::softcap_scores (csrc/ref/attn.cpp): the same constants and the same IEEE mul / add / div
// steps in the same order, no FMA (-ffp-contract=off), so every x86 level and the reference give
// the same bits. Used by the quantized cache's attention (csrc/x86/attn_q.inl: its softmax and
// soft-cap) and the half cache's (csrc/x86/avx2/attn.cpp: its soft-cap; its softmax keeps its own
// FMA exp). Included inside an anonymous namespace of a file built with the level's flags, so each
// level keeps its own copy (no inline function shared across ISA flags).

// ref::attn_exp lane for lane: e^x for x <= 0, 0 below -87.3, NaN stays NaN
inline __m256 attn_exp8(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693145751953125f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(1.428606765330187045e-06f)));
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 120));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 24));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f / 6));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.5f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    const __m256 low = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    const __m256i nn = _mm256_cvtps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-126.0f)));
    const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(nn, _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(low, _mm256_mul_ps(p, two_n));
}

// ref::attn_tanh lane for lane: e = attn_exp(-2|x|), copysign((1 - e) / (1 + e), x)
inline __m256 attn_tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 e = attn_exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));  // >= +0 (or NaN)
    return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

// ref::softcap_scores: s[j] = cap * attn_tanh(s[j] * (1 / cap)) for j < n, 8 at a time (the last
// 1-7 through zero-padded lanes); returns their max (-inf for n = 0)
inline float softcap_scores8(float *s, int n, float cap) {
    const __m256 vinv = _mm256_set1_ps(1.0f / cap), vcap = _mm256_set1_ps(cap);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 v = _mm256_mul_ps(vcap, attn_tanh8(_mm256_mul_ps(_mm256_loadu_ps(s + j), vinv)));
        _mm256_storeu_ps(s + j, v);
        vmax = _mm256_max_ps(vmax, v);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float mx = -INFINITY;
    for (int l = 0; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    if (j < n) {
        for (int l = 0; l < 8; ++l) lanes[l] = j + l < n ? s[j + l] : 0.0f;
        _mm256_store_ps(lanes, _mm256_mul_ps(vcap, attn_tanh8(_mm256_mul_ps(_mm256_load_ps(lanes), vinv))));
        for (; j < n; ++j) {
            s[j] = lanes[j & 7];
            mx = s[j] > mx ? s[j] : mx;
        }
    }
    return mx;
}
