// The attention over a quantized KV cache at the avx512 level. The one-row kernel (attn_q_fn) is
// csrc/x86/attn_q.inl's, built here with VNNI; the shared-rows kernel (attn_q_rows_fn: a GQA
// group's heads, a prompt block's tokens) is this file's, on zmm with KEYS IN LANES:
//   Scores: 16 keys' blocks are decoded once for all the rows (decode16): block b's codes as
//     8 zmm, dword lane i of u[b][dw] = key i's codes 4dw .. 4dw + 3, each as an unsigned byte
//     (K Q8_0: code + 128; K Q4_0: the nibble 0..15), and the 16 keys' block scales as floats.
//     One vpdpbusd then takes 4 codes of 16 keys against one broadcast dword of a row's q, so a
//     block's 8 vpdpbusd leave each key's block sum in its own lane: no horizontal sums. The
//     offset comes back per (row, block), independent of the key: dot(u - off, q) =
//     dot(u, q) - off * sum(q) (off 128 or 8), the accumulator's start. Exact int32
//     (|sum| <= 32 * 255 * 128), so the block sums are attn_q.inl's; every float step after
//     them is its kterm and its add, lane for lane, in block order (no FMA: -ffp-contract=off).
//   Softmax: attn_q.inl's softmax_row per row (the reference's striped sums and exp).
//   Values: the KB keys' value rows widened to float once per block (exact: the same values
//     as vload16), then up to 8 rows x 32 dims of accumulators (16 zmm) per pass, each lane
//     acc + v * p over the keys in order, as attn_q.inl's pv_rows.
// So every row's output is bitwise attn_q.inl's, hence the scalar reference's (kernels.h
// attn_q_rows_fn; tests/test_kv_quant.py). Measured on Qwen3.6's group of 8 at 32K positions,
// head_dim 256, Q8_0 K and V: BENCHMARKS.md, round of 2026-12-05 (7).
#define LOWBIT_ISA ISA_AVX512
#define LOWBIT_NS avx512
#define LB_AQ_ZMM_ROWS
#include "../attn_q.inl"
#include "../prefetch.h"

// (GCC 12's avx512 intrinsics trip -Wmaybe-uninitialized in every caller, as in kquants.inl)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace lowbit {
namespace avx512 {
namespace {

// 16 keys' blocks, decoded (lane i = key i of the 16); keys past the call's last are zero codes
// of scale 0, their lanes computed and never stored.
struct Keys16 {
    alignas(64) uint32_t u[512 / QK][8][16];  // [block][dword][key]: 4 unsigned codes
    alignas(64) float dk[512 / QK][16];      // [block][key]: the block's scale
};

// Keys k, k + ks, ..., the first n of 16 (n >= 1), into d. Per block: z[i] = [key i | key i + 8]
// (8 dwords each), then an 8 x 8 dword transpose in both 256-bit halves at once: dword lane l of
// u[dw] = key l's dword dw (lanes 0-7 keys 0-7, lanes 8-15 keys 8-15).
template <int KT>
inline void decode16(const uint8_t *k, size_t ks, int n, int nb, Keys16 &d) {
    const __m512i lo_idx = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);  // [a.L0, b.L0, a.L2, b.L2]
    const __m512i hi_idx = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);  // [a.L1, b.L1, a.L3, b.L3]
    for (int b = 0; b < nb; ++b) {
        const size_t o = (size_t)b * kbytes<KT>();
        alignas(32) uint16_t dh[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        __m512i z[8];
        #pragma GCC unroll 16
        for (int i = 0; i < 8; ++i) {
            __m256i a = _mm256_setzero_si256(), c = a;
            if (i < n) a = ucodes<KT>(k + (size_t)i * ks + o), std::memcpy(dh + i, k + (size_t)i * ks + o, 2);
            if (i + 8 < n) c = ucodes<KT>(k + (size_t)(i + 8) * ks + o), std::memcpy(dh + i + 8, k + (size_t)(i + 8) * ks + o, 2);
            z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
        }
        // rows r0..r7 of dwords (per half): unpack 32, unpack 64, then the 128-bit lanes
        __m512i t[8], s[8];
        #pragma GCC unroll 16
        for (int p = 0; p < 4; ++p) {
            t[2 * p] = _mm512_unpacklo_epi32(z[2 * p], z[2 * p + 1]);
            t[2 * p + 1] = _mm512_unpackhi_epi32(z[2 * p], z[2 * p + 1]);
        }
        #pragma GCC unroll 16
        for (int p = 0; p < 2; ++p) {  // s[4p + 0..3]: dwords (0,4), (1,5), (2,6), (3,7) of rows 4p..4p+3
            s[4 * p + 0] = _mm512_unpacklo_epi64(t[4 * p], t[4 * p + 2]);
            s[4 * p + 1] = _mm512_unpackhi_epi64(t[4 * p], t[4 * p + 2]);
            s[4 * p + 2] = _mm512_unpacklo_epi64(t[4 * p + 1], t[4 * p + 3]);
            s[4 * p + 3] = _mm512_unpackhi_epi64(t[4 * p + 1], t[4 * p + 3]);
        }
        #pragma GCC unroll 16
        for (int c = 0; c < 4; ++c) {
            _mm512_store_si512(d.u[b][c], _mm512_permutex2var_epi64(s[c], lo_idx, s[4 + c]));
            _mm512_store_si512(d.u[b][c + 4], _mm512_permutex2var_epi64(s[c], hi_idx, s[4 + c]));
        }
        _mm512_store_ps(d.dk[b], _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(dh))));
    }
}

// Rows rows[0..HB) of q (nb blocks each) against the 16 decoded keys: their scores times scale
// to sc[r * ld + j ..], the first n. qoff[r * nb + b]: off * the sum of row r's block-b codes.
template <int KT, int HB>
inline void score16(const Keys16 &d, const block_q8_0 *q, const int32_t *qoff, int nb, const int32_t *rows, float *sc,
                    size_t ld, int j, int n, __m512 vscale) {
    __m512 s[HB];
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h) s[h] = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m512i acc[HB];
        #pragma GCC unroll 16
        for (int h = 0; h < HB; ++h) acc[h] = _mm512_set1_epi32(-qoff[(size_t)rows[h] * nb + b]);
        #pragma GCC unroll 16
        for (int dw = 0; dw < 8; ++dw) {
            const __m512i u = _mm512_load_si512(d.u[b][dw]);
            #pragma GCC unroll 16
            for (int h = 0; h < HB; ++h) {
                int32_t y;
                std::memcpy(&y, q[(size_t)rows[h] * nb + b].qs + 4 * dw, 4);
                acc[h] = _mm512_dpbusd_epi32(acc[h], u, _mm512_set1_epi32(y));
            }
        }
        const __m512 dk = _mm512_load_ps(d.dk[b]);
        #pragma GCC unroll 16
        for (int h = 0; h < HB; ++h) {  // kterm: (float)isum * (dk * dq) (Q8_0), ((float)isum * dk) * dq (Q4_0)
            const __m512 f = _mm512_cvtepi32_ps(acc[h]), dq = _mm512_set1_ps(_cvtsh_ss(q[(size_t)rows[h] * nb + b].d));
            const __m512 term = KT == T_Q8_0 ? _mm512_mul_ps(f, _mm512_mul_ps(dk, dq)) : _mm512_mul_ps(_mm512_mul_ps(f, dk), dq);
            s[h] = _mm512_add_ps(s[h], term);
        }
    }
    const __mmask16 m = (__mmask16)((1u << n) - 1);
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h) _mm512_mask_storeu_ps(sc + (size_t)rows[h] * ld + j, m, _mm512_mul_ps(s[h], vscale));
}

// block b of a V row (values 32b .. 32b + 31) widened to float into dst, exactly (vload16's
// values: the code times the block's scale, one rounding)
template <int VT>
inline void vwiden32(const uint8_t *row, int b, float *dst) {
    __m512 v0, v1;
    if (VT == T_F16) {
        const auto *h = reinterpret_cast<const __m256i *>(row + (size_t)b * 2 * QK);
        v0 = _mm512_cvtph_ps(_mm256_loadu_si256(h)), v1 = _mm512_cvtph_ps(_mm256_loadu_si256(h + 1));
    } else {
        const uint8_t *blk = row + (size_t)b * (VT == T_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0));
        __m128i c0, c1;
        if (VT == T_Q8_0) {
            c0 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
            c1 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 18));
        } else {  // values 0..15: the low nibbles of bytes 0..15, values 16..31 their high nibbles
            const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2)), m = _mm_set1_epi8(0x0F);
            c0 = _mm_sub_epi8(_mm_and_si128(x, m), _mm_set1_epi8(8));
            c1 = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_set1_epi8(8));
        }
        const __m512 dv = _mm512_set1_ps(h2f(blk));
        v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c0)), dv);
        v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c1)), dv);
    }
    _mm512_storeu_ps(dst, v0);
    _mm512_storeu_ps(dst + 16, v1);
}

// out[h][d0 .. d0 + 16 DC) += e[h][j] * vf_j[..] (mul, then add) for rows h < HB (e rows ld
// apart, out rows hd apart), keys j0..j1 in order; vf_j at vf + (j - j0) * hd
template <int HB, int DC>
inline void pv16(const float *e, size_t ld, const float *vf, int hd, int j0, int j1, int d0, float *out) {
    __m512 acc[HB][DC];
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
        #pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) acc[h][c] = _mm512_loadu_ps(out + (size_t)h * hd + d0 + 16 * c);
    for (int j = j0; j < j1; ++j) {
        const float *v = vf + (size_t)(j - j0) * hd + d0;
        __m512 vv[DC];
        #pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) vv[c] = _mm512_loadu_ps(v + 16 * c);
        #pragma GCC unroll 16
        for (int h = 0; h < HB; ++h) {
            const __m512 p = _mm512_set1_ps(e[(size_t)h * ld + j]);
            #pragma GCC unroll 16
            for (int c = 0; c < DC; ++c) acc[h][c] = _mm512_add_ps(acc[h][c], _mm512_mul_ps(vv[c], p));
        }
    }
    #pragma GCC unroll 16
    for (int h = 0; h < HB; ++h)
        #pragma GCC unroll 16
        for (int c = 0; c < DC; ++c) _mm512_storeu_ps(out + (size_t)h * hd + d0 + 16 * c, acc[h][c]);
}

// HB rows over every dim: 64 a pass for up to 4 rows, else 32 (16 accumulators either way)
template <int HB>
inline void pv_dims(const float *e, size_t ld, const float *vf, int hd, int j0, int j1, float *out) {
    constexpr int DC = HB <= 4 ? 4 : 2;
    int d0 = 0;
    for (; d0 + 16 * DC <= hd; d0 += 16 * DC) pv16<HB, DC>(e, ld, vf, hd, j0, j1, d0, out);
    for (; d0 < hd; d0 += 32) pv16<HB, 2>(e, ld, vf, hd, j0, j1, d0, out);  // (hd: a multiple of 32)
}

template <int HB>
inline void pv_rows_n(int hb, const float *e, size_t ld, const float *vf, int hd, int j0, int j1, float *out) {
    if constexpr (HB > 1)
        if (hb < HB) return pv_rows_n<HB - 1>(hb, e, ld, vf, hd, j0, j1, out);
    pv_dims<HB>(e, ld, vf, hd, j0, j1, out);
}

// score16 for the live rows, by 4, then the last 1-3
template <int KT>
inline void score_rows(const Keys16 &d, const block_q8_0 *q, const int32_t *qoff, int nb, const int32_t *live, int nlive,
                       float *sc, size_t ld, int j, int n, __m512 vscale) {
    int i = 0;
    for (; i + 4 <= nlive; i += 4) score16<KT, 4>(d, q, qoff, nb, live + i, sc, ld, j, n, vscale);
    if (nlive - i == 3) score16<KT, 3>(d, q, qoff, nb, live + i, sc, ld, j, n, vscale);
    else if (nlive - i == 2) score16<KT, 2>(d, q, qoff, nb, live + i, sc, ld, j, n, vscale);
    else if (nlive - i == 1) score16<KT, 1>(d, q, qoff, nb, live + i, sc, ld, j, n, vscale);
}

template <int KT, int VT>
void attend_group_zmm(const uint8_t *qq, int nq, const int32_t *lens, const uint8_t *K, size_t ks, const uint8_t *V,
                      size_t vs, int hd, float scale, const float *sinks, float softcap, float *sc, float *out) {
    const auto *q = reinterpret_cast<const block_q8_0 *>(qq);
    const int nb = hd / QK;
    int maxlen = 0;
    for (int r = 0; r < nq; ++r) maxlen = lens[r] > maxlen ? lens[r] : maxlen;
    const size_t ld = (size_t)maxlen;  // sc's row stride
    thread_local std::vector<int32_t> qoff, live;
    thread_local std::vector<float> inv, vf;
    thread_local Keys16 d;
    inv.resize((size_t)nq);
    block_code_sums(q, (size_t)nq * nb, uoff<KT>(), qoff);
    // scores, 16 keys at a time for the rows that see any of them (a row's lanes past its own
    // length are computed and never read); the rows `ahead` keys on are asked for meanwhile
    const __m512 vscale = _mm512_set1_ps(scale);
    const size_t krow = (size_t)nb * kbytes<KT>();
    const int ahead = std::max<int>(16, (int)(kPrefetchAhead / krow) & ~15);
    int drop = 0;  // the shortest live row's length
    for (int j = 0; j < maxlen; j += 16) {
        if (j == 0 || j >= drop) {  // the rows that see keys j.. (anew only when one drops out)
            live.clear();
            drop = maxlen;
            for (int r = 0; r < nq; ++r)
                if (lens[r] > j) live.push_back(r), drop = std::min(drop, (int)lens[r]);
        }
        const int n = std::min(16, maxlen - j);
        const uint8_t *kj = K + (size_t)j * ks;
        if constexpr (kPrefetchAhead > 0)
            if (j + ahead < maxlen)
                for (int i = 0; i < 16; ++i)
                    for (size_t l = 0; l < krow; l += 64) _mm_prefetch((const char *)(kj + (size_t)(ahead + i) * ks + l), _MM_HINT_T0);
        decode16<KT>(kj, ks, n, nb, d);
        score_rows<KT>(d, q, qoff.data(), nb, live.data(), (int)live.size(), sc, ld, j, n, vscale);
    }
    softmax_per_row(sc, ld, nq, lens, maxlen, sinks, softcap, inv.data());
    // values: keys in blocks of KB widened once, rows by 8 (the rest together), each group up
    // to its longest row
    vf.resize((size_t)KB * hd);
    for (size_t i = 0; i < (size_t)nq * hd; ++i) out[i] = 0.0f;
    for (int j0 = 0; j0 < maxlen; j0 += KB) {
        const int j1 = std::min(maxlen, j0 + KB);
        for (int j = j0; j < j1; ++j) {
            const uint8_t *row = V + (size_t)j * vs;
            if constexpr (kPrefetchAhead > 0)
                if (j + KB < maxlen)
                    for (size_t l = 0; l < (VT == T_F16 ? 2 * (size_t)hd : (size_t)nb * kbytes<VT>()); l += 64)
                        _mm_prefetch((const char *)(row + (size_t)KB * vs + l), _MM_HINT_T0);
            for (int b = 0; b < nb; ++b) vwiden32<VT>(row, b, vf.data() + (size_t)(j - j0) * hd + (size_t)b * QK);
        }
        for (int r = 0; r < nq; r += 8) {
            const int hb = std::min(8, nq - r);
            const int m = *std::max_element(lens + r, lens + r + hb);
            if (m <= j0) continue;
            pv_rows_n<8>(hb, sc + (size_t)r * ld, ld, vf.data(), hd, j0, std::min(j1, m), out + (size_t)r * hd);
        }
    }
    for (int r = 0; r < nq; ++r) {
        const __m512 vinv = _mm512_set1_ps(inv[(size_t)r]);
        float *o = out + (size_t)r * hd;
        for (int d0 = 0; d0 < hd; d0 += 16) _mm512_storeu_ps(o + d0, _mm512_mul_ps(_mm512_loadu_ps(o + d0), vinv));
    }
}

void attend_q_group_zmm(const uint8_t *qq, int nq, const int32_t *lens, int k_type, const uint8_t *K, size_t ks,
                        int v_type, const uint8_t *V, size_t vs, int hd, float scale, const float *sinks,
                        float softcap, float *sc, float *out) {
    by_kv_types(k_type, v_type, [&](auto kt, auto vt) {
        attend_group_zmm<decltype(kt)::value, decltype(vt)::value>(qq, nq, lens, K, ks, V, vs, hd, scale, sinks, softcap, sc, out);
    });
}

}  // namespace

void register_attn_q(KernelTable &t) {
    t.attnq = AttnQKernel{attend_q_simd, "attn_q_avx512", ISA_AVX512};
    t.attnq_rows = AttnQRowsKernel{attend_q_group_zmm, "attn_q_rows_avx512", ISA_AVX512};
}

}  // namespace avx512
}  // namespace lowbit

#pragma GCC diagnostic pop
