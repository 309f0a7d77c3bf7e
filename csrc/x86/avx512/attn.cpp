// The shared-rows attention over a half KV cache (mla_f16_fn: a GQA group's heads, a prompt
// block's tokens) at the avx512 level, bitwise avx2's: the kernel is csrc/x86/attn_f16.inl's
// mla_f16_simd, and this file gives it inner loops on zmm whose every lane is computed by the
// same operations as Ymm's (csrc/x86/avx2/attn.cpp). The one-row kernel stays avx2's.
//   Scores: a zmm holds TWO keys' 8-lane accumulators, [key 2p | key 2p + 1], against the
//     row's 8 dims broadcast to both halves: lane (key, i) is the same FMA chain over d as
//     avx2's ymm of that key. The keys are widened pair-interleaved (kp below) and 4 rows x 8
//     keys take 16 accumulators (8 loads per 16 FMAs). The reduction (reduce_pairs) forms each
//     key's ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)), reduce1's tree, by the same adds.
//   Values: 4 rows x 64 dims or 8 rows x 32 dims of accumulators per pass (16 zmm), each lane
//     fma(p_j, v_j, acc) over j in increasing order, as avx2's mla_pv; a row's last dims by 16,
//     then by 8 (ymm).
// (GCC 12's avx512 intrinsics trip -Wmaybe-uninitialized in every caller, as in kquants.inl)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../../kernels.h"
#include "../prefetch.h"

namespace lowbit {
namespace avx512 {
namespace {

#include "../attn_exp8.inl"
#include "../attn_f16.inl"

// _mm256_hadd_ps's sums in each 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3].
inline __m512 hadd16(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

// p[k] = [key 2k's 8 lanes | key 2k + 1's] -> the 8 keys' scores in key order, each key's lanes
// summed in reduce1's tree. After three hadd16: 128-bit lane 0 holds (x0+x1)+(x2+x3) of keys
// 0, 2, 4, 6, lane 1 their (x4+x5)+(x6+x7), lanes 2 and 3 the same of keys 1, 3, 5, 7.
inline __m256 reduce_pairs(__m512 p0, __m512 p1, __m512 p2, __m512 p3) {
    const __m512 u = hadd16(hadd16(p0, p1), hadd16(p2, p3));
    const __m512 v = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0xB1));  // lane 0 + 1, lane 2 + 3
    const __m128 e = _mm512_castps512_ps128(v), o = _mm512_extractf32x4_ps(v, 2);
    return _mm256_set_m128(_mm_unpackhi_ps(e, o), _mm_unpacklo_ps(e, o));
}

// HB rows q[h] against 8 keys: pair(p, c) gives the zmm [key 2p | key 2p + 1] of dims 8c..8c+7
// as floats; dst[h][0..7] = score * scale.
template <int HB, class Pair>
inline void scores_rows8_by(const float *const *q, int nc, float *const *dst, __m256 vscale, const Pair &pair) {
    __m512 acc[HB][4];
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
        #pragma GCC unroll 16
        for (int p = 0; p < 4; ++p) acc[h][p] = _mm512_setzero_ps();
    for (int c = 0; c < nc; ++c) {
        __m512 kv[4];
        #pragma GCC unroll 16
        for (int p = 0; p < 4; ++p) kv[p] = pair(p, c);
        #pragma GCC unroll 16
        for (int h = 0; h < HB; ++h) {
            const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[h] + 8 * c));
            #pragma GCC unroll 16
            for (int p = 0; p < 4; ++p) acc[h][p] = _mm512_fmadd_ps(qv, kv[p], acc[h][p]);
        }
    }
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
        _mm256_storeu_ps(dst[h], _mm256_mul_ps(reduce_pairs(acc[h][0], acc[h][1], acc[h][2], acc[h][3]), vscale));
}

// The keys already widened pair-interleaved into kp (pair p, dims 8c..8c+7 at kp + (p * nc + c) * 16).
template <int HB>
inline void scores_rows8(const float *const *q, const float *kp, int nc, float *const *dst, __m256 vscale) {
    scores_rows8_by<HB>(q, nc, dst, vscale, [&](int p, int c) { return _mm512_loadu_ps(kp + ((size_t)p * nc + c) * 16); });
}

// The same for up to 4 rows (a decode step's GQA group), the 8 keys at C, C + kd, .. C + 7 kd
// widened in registers as each dims chunk c is needed (kp's pairs, the same exact values), not
// stored to kp and loaded back once per row: the same FMAs on the same operands, in the same
// order. (With one group of rows the store and the reloads were most of the widening's cost:
// BENCHMARKS.md, round (8).)
template <int HB>
inline void scores_rows8_direct(const float *const *q, const uint16_t *C, size_t kd, int nc, float *const *dst,
                                __m256 vscale) {
    scores_rows8_by<HB>(q, nc, dst, vscale, [&](int p, int c) {
        const uint16_t *k0 = C + (size_t)(2 * p) * kd + 8 * c, *k1 = k0 + kd;
        return _mm512_cvtph_ps(_mm256_set_m128i(_mm_loadu_si128((const __m128i *)k1), _mm_loadu_si128((const __m128i *)k0)));
    });
}

// out[h][d0 .. d0 + 16 DC) += sum_j p_hj V_j[..] for keys j0..j1-1 (mla_pv's lanes on zmm).
template <int HB, int DC, bool PF>
inline void mla_pv16(const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, int d0, float *out, int dv) {
    __m512 acc[HB][DC];
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
        #pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) acc[h][c] = _mm512_loadu_ps(out + (size_t)h * dv + d0 + 16 * c);
    for (int j = j0; j < j1; ++j) {
        const uint16_t *v = C + (size_t)j * kd + d0;
        if constexpr (PF)
            #pragma GCC unroll 16
            for (int c = 0; c < DC; c += 2) _mm_prefetch((const char *)(v + (size_t)KB * kd + 16 * c), _MM_HINT_T0);
        __m512 vv[DC];
        #pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) vv[c] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * c)));
        #pragma GCC unroll 16
        for (int h = 0; h < HB; ++h) {
            const __m512 p = _mm512_set1_ps(sc[(size_t)h * ld + j]);
            #pragma GCC unroll 16
            for (int c = 0; c < DC; ++c) acc[h][c] = _mm512_fmadd_ps(p, vv[c], acc[h][c]);
        }
    }
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
        #pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) _mm512_storeu_ps(out + (size_t)h * dv + d0 + 16 * c, acc[h][c]);
}

// mla_f16_simd's inner loops on zmm.
struct Zmm {
    // The live rows' scores against keys C, C + kd, .. C + 7 kd: the keys widened
    // pair-interleaved into kp (the rows `ahead` keys on asked for meanwhile), rows by 4, then
    // the last 1-3; sc[r * ld + 0..7] = score * scale.
    static void scores8(const float *qr, int dk, const int32_t *live, size_t nlive, const uint16_t *C, size_t kd,
                        int ahead, float *kp, float *sc, size_t ld, __m256 vscale) {
        const int nc = dk / 8;
        const float *q[4];
        float *dst[4];
        if (nlive <= 4) {  // one group of rows: the keys widened in registers (scores_rows8_direct)
            if constexpr (kPrefetchAhead > 0)
                for (int k = 0; k < 8; ++k)
                    for (int b = 0; b < 2 * dk; b += 64) _mm_prefetch((const char *)(C + (size_t)(ahead + k) * kd) + b, _MM_HINT_T0);
            const int n = (int)nlive;
            for (int h = 0; h < n; ++h) q[h] = qr + (size_t)live[h] * dk, dst[h] = sc + (size_t)live[h] * ld;
            if (n == 4) scores_rows8_direct<4>(q, C, kd, nc, dst, vscale);
            else if (n == 3) scores_rows8_direct<3>(q, C, kd, nc, dst, vscale);
            else if (n == 2) scores_rows8_direct<2>(q, C, kd, nc, dst, vscale);
            else scores_rows8_direct<1>(q, C, kd, nc, dst, vscale);
            return;
        }
        for (int p = 0; p < 4; ++p) {
            const uint16_t *k0 = C + (size_t)(2 * p) * kd, *k1 = k0 + kd;
            if constexpr (kPrefetchAhead > 0)
                for (int b = 0; b < 2 * dk; b += 64) {
                    _mm_prefetch((const char *)(k0 + (size_t)ahead * kd) + b, _MM_HINT_T0);
                    _mm_prefetch((const char *)(k1 + (size_t)ahead * kd) + b, _MM_HINT_T0);
                }
            for (int c = 0; c < nc; ++c) {
                const __m256i h = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)(k1 + 8 * c)),
                                                   _mm_loadu_si128((const __m128i *)(k0 + 8 * c)));
                _mm512_storeu_ps(kp + ((size_t)p * nc + c) * 16, _mm512_cvtph_ps(h));
            }
        }
        size_t i = 0;
        for (; i < nlive; i += 4) {
            const int n = (int)std::min<size_t>(4, nlive - i);
            for (int h = 0; h < n; ++h) q[h] = qr + (size_t)live[i + h] * dk, dst[h] = sc + (size_t)live[i + h] * ld;
            if (n == 4) scores_rows8<4>(q, kp, nc, dst, vscale);
            else if (n == 3) scores_rows8<3>(q, kp, nc, dst, vscale);
            else if (n == 2) scores_rows8<2>(q, kp, nc, dst, vscale);
            else scores_rows8<1>(q, kp, nc, dst, vscale);
        }
    }
    // Rows per values pass: 8 (a GQA group of 8, Qwen3.6's, widens each value row once for all
    // its heads); up to 4 rows take 64 dims a pass, more rows 32 (16 accumulators either way).
    static constexpr int kPvRows = 8;
    template <int HB, bool PF>
    static void pv_rows(const float *sc, size_t ld, const uint16_t *C, size_t kd, int j0, int j1, float *out, int dv) {
        constexpr int DC = HB <= 4 ? 4 : 2;
        int d0 = 0;
        for (; d0 + 16 * DC <= dv; d0 += 16 * DC) mla_pv16<HB, DC, PF>(sc, ld, C, kd, j0, j1, d0, out, dv);
        for (; d0 + 16 <= dv; d0 += 16) mla_pv16<HB, 1, PF>(sc, ld, C, kd, j0, j1, d0, out, dv);
        for (; d0 < dv; d0 += 8) mla_pv<HB, 1, PF>(sc, ld, C, kd, j0, j1, d0, out, dv);
    }
};

void mla_f16_avx512(const float *q, int nq, const int32_t *lens, const uint16_t *C, const uint16_t *V, int dk, int dv,
                    size_t kd, float scale, const float *sinks, float softcap, float *sc, float *out) {
    mla_f16_simd<Zmm>(q, nq, lens, C, V, dk, dv, kd, scale, sinks, softcap, sc, out);
}

}  // namespace

void register_attn(KernelTable &t) { t.mla = MlaKernel{mla_f16_avx512, "mla_f16_avx512", ISA_AVX512}; }

}  // namespace avx512
}  // namespace lowbit

#pragma GCC diagnostic pop
