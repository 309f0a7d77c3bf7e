// The engine's attention over a half KV cache on AVX2+F16C+FMA (contract: attn_f16_fn in
// kernels.h; the spec is csrc/ref/attn.cpp). Registered at the avx2 level; avx2vnni and
// avx512 inherit it (nothing in it gains from VNNI or 512-bit lanes at head_dim 64-128).
//
// Same rounding points as the reference (q and each probability rounded to half); the dots
// run 8 lanes wide with FMA and a fixed lane tree, so results differ from the scalar
// reference in the last bits but never depend on the window or the thread split.
#include <immintrin.h>

#include <cmath>

#include "../../kernels.h"

namespace lowbit {
namespace avx2 {
namespace {

inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline __m256 load_half8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}

inline float round_half(float x) { return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT)); }

// head_dim: a multiple of 8, at most 512 (the engine refuses other models).
void attend_f16_avx2(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd,
                     float scale, float *sc, float *out) {
    alignas(32) float qr[512];
    for (int d = 0; d < hd; d += 8)
        _mm256_store_ps(qr + d, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(q + d), _MM_FROUND_TO_NEAREST_INT)));
    float mx = -INFINITY;
    for (int j = 0; j < len; ++j) {
        const uint16_t *k = K + (size_t)j * kd;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int d = 0;
        for (; d + 16 <= hd; d += 16) {
            a0 = _mm256_fmadd_ps(_mm256_load_ps(qr + d), load_half8(k + d), a0);
            a1 = _mm256_fmadd_ps(_mm256_load_ps(qr + d + 8), load_half8(k + d + 8), a1);
        }
        if (d < hd) a0 = _mm256_fmadd_ps(_mm256_load_ps(qr + d), load_half8(k + d), a0);
        sc[j] = hsum8(_mm256_add_ps(a0, a1)) * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    float sum = 0.0f;
    for (int j = 0; j < len; ++j) { sc[j] = std::exp(sc[j] - mx); sum += sc[j]; }
    const float inv = 1.0f / sum;
    alignas(32) float acc[512];
    for (int d = 0; d < hd; d += 8) _mm256_store_ps(acc + d, _mm256_setzero_ps());
    for (int j = 0; j < len; ++j) {
        const uint16_t *v = V + (size_t)j * kd;
        const __m256 p = _mm256_set1_ps(round_half(sc[j] * inv));
        for (int d = 0; d < hd; d += 8)
            _mm256_store_ps(acc + d, _mm256_fmadd_ps(p, load_half8(v + d), _mm256_load_ps(acc + d)));
    }
    for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(out + d, _mm256_load_ps(acc + d));
}

}  // namespace

void register_attn(KernelTable &t) { t.attn = AttnKernel{attend_f16_avx2, "attn_f16_avx2", ISA_AVX2}; }

}  // namespace avx2
}  // namespace lowbit
