// The attention over a half KV cache at the avx2 level (avx2vnni inherits it; avx512 keeps the
// one-row kernel and has its own shared-rows loops, csrc/x86/avx512/attn.cpp). The kernels are
// csrc/x86/attn_f16.inl; this file gives them the level's 8-lane inner loops (Ymm).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../../kernels.h"
#include "../prefetch.h"

namespace lowbit {
namespace avx2 {
namespace {

#include "../attn_exp8.inl"  // softcap_scores8: ref::softcap_scores lane for lane
#include "../attn_f16.inl"

// Scores of rows r0, r0+1 against keys k[0..3] (widened rows of dk floats): 8 accumulators,
// reduced at once; lane order (r0 k0..k3, r1 k0..k3).
inline __m256 scores_2x4(const float *q0, const float *q1, const float *k, int dk) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int d = 0; d < dk; d += 8) {
        const __m256 x = _mm256_loadu_ps(q0 + d), y = _mm256_loadu_ps(q1 + d);
        const __m256 k0 = _mm256_loadu_ps(k + d), k1 = _mm256_loadu_ps(k + dk + d);
        const __m256 k2 = _mm256_loadu_ps(k + 2 * dk + d), k3 = _mm256_loadu_ps(k + 3 * dk + d);
        a0 = _mm256_fmadd_ps(x, k0, a0); a1 = _mm256_fmadd_ps(x, k1, a1);
        a2 = _mm256_fmadd_ps(x, k2, a2); a3 = _mm256_fmadd_ps(x, k3, a3);
        b0 = _mm256_fmadd_ps(y, k0, b0); b1 = _mm256_fmadd_ps(y, k1, b1);
        b2 = _mm256_fmadd_ps(y, k2, b2); b3 = _mm256_fmadd_ps(y, k3, b3);
    }
    return reduce8(a0, a1, a2, a3, b0, b1, b2, b3);
}

// Scores of rows r0..r2 against keys k[0..3]: 12 accumulators (7 loads per 12 FMAs; 8 would
// leave the two FMA pipes' 4-cycle latency barely covered). ab: rows r0, r1 in scores_2x4's
// lane order; c: row r2's 4 keys.
inline void scores_3x4(const float *q0, const float *q1, const float *q2, const float *k, int dk, __m256 &ab, __m128 &c) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    for (int d = 0; d < dk; d += 8) {
        const __m256 x = _mm256_loadu_ps(q0 + d), y = _mm256_loadu_ps(q1 + d), z = _mm256_loadu_ps(q2 + d);
        __m256 kk = _mm256_loadu_ps(k + d);
        a0 = _mm256_fmadd_ps(x, kk, a0); b0 = _mm256_fmadd_ps(y, kk, b0); c0 = _mm256_fmadd_ps(z, kk, c0);
        kk = _mm256_loadu_ps(k + dk + d);
        a1 = _mm256_fmadd_ps(x, kk, a1); b1 = _mm256_fmadd_ps(y, kk, b1); c1 = _mm256_fmadd_ps(z, kk, c1);
        kk = _mm256_loadu_ps(k + 2 * dk + d);
        a2 = _mm256_fmadd_ps(x, kk, a2); b2 = _mm256_fmadd_ps(y, kk, b2); c2 = _mm256_fmadd_ps(z, kk, c2);
        kk = _mm256_loadu_ps(k + 3 * dk + d);
        a3 = _mm256_fmadd_ps(x, kk, a3); b3 = _mm256_fmadd_ps(y, kk, b3); c3 = _mm256_fmadd_ps(z, kk, c3);
    }
    ab = reduce8(a0, a1, a2, a3, b0, b1, b2, b3);
    c = reduce4(c0, c1, c2, c3);
}

// mla_f16_simd's inner loops on ymm.
struct Ymm {
    // Scores of the live rows against keys C, C + kd, .. C + 7 kd: the keys widened into
    // k8[8][dk] (the rows `ahead` keys on asked for meanwhile), then rows by 3, 2 and 1
    // (scores_3x4, scores_2x4, scores_1x8); sc[r * ld + 0..7] = score * scale.
    static void scores8(const float *qr, int dk, const int32_t *live, size_t nlive, const uint16_t *C, size_t kd,
                        int ahead, float *k8, float *sc, size_t ld, __m256 vscale) {
        for (int r = 0; r < 8; ++r) {
            if constexpr (kPrefetchAhead > 0)
                for (int b = 0; b < 2 * dk; b += 64) _mm_prefetch((const char *)(C + (size_t)(ahead + r) * kd) + b, _MM_HINT_T0);
            for (int d = 0; d < dk; d += 8) _mm256_storeu_ps(k8 + (size_t)r * dk + d, load8(C + (size_t)r * kd + d));
        }
        size_t i = 0;
        for (; i + 3 <= nlive; i += 3) {
            const int r0 = live[i], r1 = live[i + 1], r2 = live[i + 2];
            const float *q0 = qr + (size_t)r0 * dk, *q1 = qr + (size_t)r1 * dk, *q2 = qr + (size_t)r2 * dk;
            __m256 ab0, ab1;
            __m128 c0, c1;
            scores_3x4(q0, q1, q2, k8, dk, ab0, c0);
            scores_3x4(q0, q1, q2, k8 + 4 * (size_t)dk, dk, ab1, c1);
            // (lanes (r0 k0..3, r1 k0..3) of keys 0..3 and of keys 4..7 -> each row's 8 in order)
            _mm256_storeu_ps(sc + (size_t)r0 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(ab0, ab1, 0x20), vscale));
            _mm256_storeu_ps(sc + (size_t)r1 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(ab0, ab1, 0x31), vscale));
            _mm256_storeu_ps(sc + (size_t)r2 * ld, _mm256_mul_ps(_mm256_set_m128(c1, c0), vscale));
        }
        for (; i + 2 <= nlive; i += 2) {
            const int r0 = live[i], r1 = live[i + 1];
            const float *q0 = qr + (size_t)r0 * dk, *q1 = qr + (size_t)r1 * dk;
            const __m256 ab0 = scores_2x4(q0, q1, k8, dk), ab1 = scores_2x4(q0, q1, k8 + 4 * (size_t)dk, dk);
            _mm256_storeu_ps(sc + (size_t)r0 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(ab0, ab1, 0x20), vscale));
            _mm256_storeu_ps(sc + (size_t)r1 * ld, _mm256_mul_ps(_mm256_permute2f128_ps(ab0, ab1, 0x31), vscale));
        }
        for (; i < nlive; ++i) {
            const int r = live[i];
            _mm256_storeu_ps(sc + (size_t)r * ld, _mm256_mul_ps(scores_1x8(qr + (size_t)r * dk, k8, dk, (size_t)dk), vscale));
        }
    }
    static constexpr int kPvRows = 4;  // rows per values pass: 4 x 16 dims of accumulators
    template <int HB, bool PF>
    static void pv_rows(const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, float *out, int dv) {
        mla_pv_rows<HB, PF>(sc, ld, C, kd, j0, j1, out, dv);
    }
};

void mla_f16_avx2(const float *q, int nq, const int32_t *lens, const uint16_t *C, const uint16_t *V, int dk, int dv,
                  size_t kd, float scale, const float *sinks, float softcap, float *sc, float *out) {
    mla_f16_simd<Ymm>(q, nq, lens, C, V, dk, dv, kd, scale, sinks, softcap, sc, out);
}

}  // namespace

void register_attn(KernelTable &t) {
    t.attn = AttnKernel{attend_f16_simd, "attn_f16_avx2", ISA_AVX2};
    t.mla = MlaKernel{mla_f16_avx2, "mla_f16_avx2", ISA_AVX2};
}

}  // namespace avx2
}  // namespace lowbit
