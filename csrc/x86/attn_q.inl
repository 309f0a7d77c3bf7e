// The engine's attention over a quantized KV cache (--kv q8_0 | q4_0) on x86: the body of
// csrc/x86/<level>/attn_q.cpp, compiled with LOWBIT_ISA / LOWBIT_NS set. Contract: attn_q_fn in
// kernels.h; the spec is ref::attend_q (csrc/ref/attn.cpp), and every output is bitwise the
// reference's: the block dots are exact int32 (their order does not matter), every float step
// is the reference's IEEE mul or add in the reference's order (8 keys in 8 lanes, no FMA:
// -ffp-contract=off), the exp is ref::attn_exp lane for lane, and the sum of the exps is the
// reference's 8 striped partial sums joined in its tree.
//
// The cache is read where it lies (no dequantized copy): a key's score runs on its int8 /
// nibble codes (maddubs, or avx512's VNNI dpbusd), a value row is widened 8 values at a time
// into registers next to the 8 output accumulators of a 64-dim chunk.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../formats.h"
#include "../kernels.h"
#include "hsum.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including attn_q.inl"
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {

// VNNI's vpdpbusd on ymm: AVX512-VNNI (avx512) or AVX-VNNI (avx2vnni, the VEX form)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LB_AQ_VNNI 1
#define LB_DPBUSD256 _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#define LB_AQ_VNNI 1
#define LB_DPBUSD256 _mm256_dpbusd_avx_epi32
#else
#define LB_AQ_VNNI 0
#endif

inline float h2f(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);  // exact
}

// sum_i u_i * y_i over 32 pairs of an unsigned u and a signed y, as 8 int32 partial sums (exact
// while each pair u_2i y_2i + u_2i+1 y_2i+1 fits int16, as maddubs needs: |u| <= 128, |y| <= 127)
inline __m256i dotu32(__m256i u, __m256i y) {
#if LB_AQ_VNNI
    return LB_DPBUSD256(_mm256_setzero_si256(), u, y);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1));
#endif
}

// sum_i x_i * y_i over 32 int8 pairs, as 8 int32 partial sums (exact; |x| * sign(y, x) keeps
// the unsigned x operand of maddubs / dpbusd non-negative; pairs <= 2 * 128 * 127 fit int16)
inline __m256i dot32(__m256i x, __m256i y) { return dotu32(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

// lane k = the sum of a_k's 8 lanes (integers: any order is exact)
inline __m256i hsum8_i(__m256i a0, __m256i a1, __m256i a2, __m256i a3, __m256i a4, __m256i a5, __m256i a6,
                       __m256i a7) {
    const __m256i t0 = _mm256_hadd_epi32(a0, a1), t1 = _mm256_hadd_epi32(a2, a3);
    const __m256i t2 = _mm256_hadd_epi32(a4, a5), t3 = _mm256_hadd_epi32(a6, a7);
    const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}


template <int KT> constexpr size_t kbytes() { return KT == T_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0); }

// Block b of a K row as 32 UNSIGNED codes in value order, for the kernels with keys in lanes
// (vpdpbusd's unsigned operand): Q8_0's code + 128 (the sign bit flipped), Q4_0's nibbles
// (values 0..15: the low nibbles of bytes 0..15, 16..31 their high nibbles). The offset (128 or
// 8) comes back per query row and block: dot(u - off, q) = dot(u, q) - off * sum(q), exact.
template <int KT> constexpr int32_t uoff() { return KT == T_Q8_0 ? 128 : 8; }
template <int KT>
inline __m256i ucodes(const uint8_t *blk) {
    if (KT == T_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 2)), _mm256_set1_epi8(-128));
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2)), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

// block b of a K row as 32 int8 codes in value order (Q4_0: nibble - 8; low nibbles are values 0..15)
template <int KT>
inline __m256i kcodes(const uint8_t *blk) {
    if (KT == T_Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 2));
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2)), m = _mm_set1_epi8(0x0F);
    const __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
    return _mm256_sub_epi8(c, _mm256_set1_epi8(8));
}

// f(KT, VT) as std::integral_constant's for the call's cache types (k_type T_Q8_0 / T_Q4_0,
// v_type T_F16 / T_Q8_0 / T_Q4_0: the engine checks): one place maps the types to the templates.
template <class F>
inline void by_kv_types(int k_type, int v_type, const F &f) {
    auto with_v = [&](auto kt) {
        if (v_type == T_Q8_0) f(kt, std::integral_constant<int, T_Q8_0>{});
        else if (v_type == T_Q4_0) f(kt, std::integral_constant<int, T_Q4_0>{});
        else f(kt, std::integral_constant<int, T_F16>{});
    };
    if (k_type == T_Q8_0) with_v(std::integral_constant<int, T_Q8_0>{});
    else with_v(std::integral_constant<int, T_Q4_0>{});
}

// the block's float term: (float)isum * (dk * dq) (Q8_0) or ((float)isum * dk) * dq (Q4_0)
template <int KT>
inline __m256 kterm(__m256i isum, __m256 dk, __m256 dq) {
    const __m256 f = _mm256_cvtepi32_ps(isum);
    return KT == T_Q8_0 ? _mm256_mul_ps(f, _mm256_mul_ps(dk, dq)) : _mm256_mul_ps(_mm256_mul_ps(f, dk), dq);
}
template <int KT>
inline float kterm1(int32_t isum, float dk, float dq) {
    return KT == T_Q8_0 ? (float)isum * (dk * dq) : ((float)isum * dk) * dq;
}

// scores of keys j..j+7 (unscaled), lane k = key j + k
template <int KT>
inline __m256 score8(const uint8_t *k, size_t ks, const block_q8_0 *q, int nb) {
    __m256 s = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const size_t o = (size_t)b * kbytes<KT>();
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[b].qs));
        const __m256i isum = hsum8_i(dot32(kcodes<KT>(k + o), y), dot32(kcodes<KT>(k + ks + o), y),
                                     dot32(kcodes<KT>(k + 2 * ks + o), y), dot32(kcodes<KT>(k + 3 * ks + o), y),
                                     dot32(kcodes<KT>(k + 4 * ks + o), y), dot32(kcodes<KT>(k + 5 * ks + o), y),
                                     dot32(kcodes<KT>(k + 6 * ks + o), y), dot32(kcodes<KT>(k + 7 * ks + o), y));
        uint16_t dh[8];
        for (int i = 0; i < 8; ++i) std::memcpy(dh + i, k + (size_t)i * ks + o, 2);
        const __m256 dk = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(dh)));
        s = _mm256_add_ps(s, kterm<KT>(isum, dk, _mm256_set1_ps(_cvtsh_ss(q[b].d))));
    }
    return s;
}

template <int KT>
inline float score1(const uint8_t *k, const block_q8_0 *q, int nb) {
    float s = 0.0f;
    for (int b = 0; b < nb; ++b) {
        const uint8_t *blk = k + (size_t)b * kbytes<KT>();
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[b].qs));
        s = s + kterm1<KT>(hsum8_i32(dot32(kcodes<KT>(blk), y)), h2f(blk), _cvtsh_ss(q[b].d));
    }
    return s;
}

#include "attn_exp8.inl"  // attn_exp8, softcap_scores8: ref::attn_exp / ref::softcap_scores lane for lane

// values i..i+7 (i a multiple of 8) of a V row, exactly
template <int VT>
inline __m256 vload8(const uint8_t *row, int i) {
    if (VT == T_F16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(row + 2 * (size_t)i)));
    if (VT == T_Q8_0) {
        const uint8_t *b = row + (size_t)(i / QK) * sizeof(block_q8_0);
        const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(b + 2 + i % QK)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(h2f(b)));
    }
    const uint8_t *b = row + (size_t)(i / QK) * sizeof(block_q4_0);
    const int o = i % QK;
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(b + 2 + (o & 15))));
    if (o >= QK / 2) c = _mm256_srli_epi32(c, 4);
    c = _mm256_sub_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x0F)), _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(h2f(b)));
}

// out[d0 .. d0 + 8C) = (sum_j v_j * e_j) * inv, C accumulators in registers across all keys
template <int VT, int C>
inline void pv_chunk(const float *e, const uint8_t *V, size_t vs, int len, int d0, float inv, float *out) {
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int j = 0; j < len; ++j) {
        const __m256 ej = _mm256_broadcast_ss(e + j);
        const uint8_t *v = V + (size_t)j * vs;
        for (int c = 0; c < C; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(vload8<VT>(v, d0 + 8 * c), ej));
    }
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + d0 + 8 * c, _mm256_mul_ps(acc[c], vinv));
}

// One row's softmax over its scaled scores sc[0..len), in place: sc[j] = e_j = attn_exp(sc[j] - m),
// m = max(max_j sc[j], sink); returns 1 / sum, the sum in the reference's order (8 striped
// partial sums over the keys below len & ~7, joined in its tree, the tail keys, the sink's share).
inline float softmax_row(float *sc, int len, float sink) {
    const int full = len & ~7;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < full; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sc + j));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float mx = -INFINITY;
    for (int l = 0; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    for (int j = full; j < len; ++j) mx = sc[j] > mx ? sc[j] : mx;
    mx = sink > mx ? sink : mx;

    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int j = 0; j < full; j += 8) {
        const __m256 e = attn_exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vmx));
        _mm256_storeu_ps(sc + j, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    // ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))
    const __m256 t = _mm256_hadd_ps(vsum, vsum), u = _mm256_hadd_ps(t, t);
    float sum = _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (full < len || sink > -INFINITY) {
        for (int j = full; j < len; ++j) tail[j - full] = sc[j] - mx;
        tail[7] = sink - mx;  // (len - full <= 7: lane 7 is free; -inf - mx: exp 0, unused)
        _mm256_store_ps(tail, attn_exp8(_mm256_load_ps(tail)));
        for (int j = full; j < len; ++j) { sc[j] = tail[j - full]; sum = sum + sc[j]; }
        if (sink > -INFINITY) sum = sum + tail[7];
    }
    return 1.0f / sum;
}

template <int KT, int VT>
void attend(const uint8_t *qq, const uint8_t *K, size_t ks, const uint8_t *V, size_t vs, int len, int hd, float scale,
            float sink, float softcap, float *sc, float *out) {
    const auto *q = reinterpret_cast<const block_q8_0 *>(qq);
    const int nb = hd / QK;
    const __m256 vscale = _mm256_set1_ps(scale);
    const int full = len & ~7;
    for (int j = 0; j < full; j += 8) _mm256_storeu_ps(sc + j, _mm256_mul_ps(score8<KT>(K + (size_t)j * ks, ks, q, nb), vscale));
    for (int j = full; j < len; ++j) sc[j] = score1<KT>(K + (size_t)j * ks, q, nb) * scale;
    if (softcap > 0.0f) softcap_scores8(sc, len, softcap);
    const float inv = softmax_row(sc, len, sink);
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) pv_chunk<VT, 8>(sc, V, vs, len, d0, inv, out);
    for (; d0 < hd; d0 += 32) pv_chunk<VT, 4>(sc, V, vs, len, d0, inv, out);
}

void attend_q_simd(const uint8_t *qq, int k_type, const uint8_t *K, size_t ks, int v_type, const uint8_t *V,
                   size_t vs, int len, int hd, float scale, float sink, float softcap, float *sc, float *out) {
    by_kv_types(k_type, v_type, [&](auto kt, auto vt) {
        attend<decltype(kt)::value, decltype(vt)::value>(qq, K, ks, V, vs, len, hd, scale, sink, softcap, sc, out);
    });
}

// ---- rows sharing one head's cache rows (attn_q_rows_fn: a GQA group's heads, a prompt block) ----
// Per row the arithmetic above, bit for bit: the same exact int32 block sums, the same float
// steps (kterm, * scale) per (row, key), softmax_row, and each output lane summed over the keys
// in order then times the row's 1 / sum. What is shared: a group of 8 keys' blocks are decoded
// once (their codes unpacked, their 8 scales widened) for every row that sees any of them, and a
// value row is widened once per 16 dims for up to 4 rows (mla_f16_avx2's scheme: keys in blocks
// of KB while the row groups and dim chunks read them, each row's 16 dims in registers).

// qoff[i] = off * the sum of block i's codes, for n Q8_0 blocks of the query rows (the offset
// of the unsigned key codes, ucodes / decode8: it comes back per row and block)
inline void block_code_sums(const block_q8_0 *q, size_t n, int32_t off, std::vector<int32_t> &qoff) {
    qoff.resize(n);
    for (size_t i = 0; i < n; ++i) {
        int32_t t = 0;
        for (int k = 0; k < QK; ++k) t += q[i].qs[k];
        qoff[i] = off * t;
    }
}

// Each row's softmax over its own keys and sink, in place in sc (rows ld apart), inv[r] its
// 1 / sum; its weights past its keys up to maxlen 0 (0 * v adds nothing to a sum that is never
// -0, for finite v: a row's sums are those of its own keys)
inline void softmax_per_row(float *sc, size_t ld, int nq, const int32_t *lens, int maxlen, const float *sinks,
                         float softcap, float *inv) {
    for (int r = 0; r < nq; ++r) {
        float *e = sc + (size_t)r * ld;
        if (softcap > 0.0f) softcap_scores8(e, lens[r], softcap);
        inv[r] = softmax_row(e, lens[r], sinks ? sinks[r] : -INFINITY);
        for (int j = lens[r]; j < maxlen; ++j) e[j] = 0.0f;
    }
}

// 8 keys' blocks, decoded: u the unsigned operand of dotu32 (K Q8_0: |k|; K Q4_0: the nibbles
// 0..15, with dot(u - 8, q) = dot(u, q) - 8 sum(q) exact in int32, so no sign step per row),
// s (K Q8_0) the codes whose signs move onto q; dk the 8 keys' scales of each block (lane = key).
struct Keys8 {
    alignas(32) uint8_t u[512 / QK][8][32];
    alignas(32) int8_t s[512 / QK][8][32];
    alignas(32) float dk[512 / QK][8];
};

// keys 0..n-1 (n <= 8) of rows k, k + ks, ...; keys n..7 as zero codes of scale 0 (their lanes unused)
template <int KT>
inline void decode8(const uint8_t *k, size_t ks, int n, int nb, Keys8 &d) {
    const __m128i m = _mm_set1_epi8(0x0F);
    for (int b = 0; b < nb; ++b) {
        const size_t o = (size_t)b * kbytes<KT>();
        alignas(16) uint16_t dh[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int i = 0; i < 8; ++i) {
            __m256i u = _mm256_setzero_si256(), c = u;
            if (i < n) {
                const uint8_t *blk = k + (size_t)i * ks + o;
                std::memcpy(dh + i, blk, 2);
                if (KT == T_Q8_0) {
                    c = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 2));
                    u = _mm256_sign_epi8(c, c);
                } else {
                    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2));
                    u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
                }
            }
            _mm256_store_si256(reinterpret_cast<__m256i *>(d.u[b][i]), u);
            if (KT == T_Q8_0) _mm256_store_si256(reinterpret_cast<__m256i *>(d.s[b][i]), c);
        }
        _mm256_store_ps(d.dk[b], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(dh))));
    }
}

// one row's unscaled scores against the 8 decoded keys (lane = key), score8's float steps;
// qoff[b]: 8 * the sum of the row's block-b codes (K Q4_0: block_code_sums)
template <int KT>
inline __m256 score8_decoded(const Keys8 &d, const block_q8_0 *q, const int32_t *qoff, int nb) {
    __m256 s = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(q[b].qs));
        auto dot = [&](int i) {
            const __m256i u = _mm256_load_si256(reinterpret_cast<const __m256i *>(d.u[b][i]));
            if (KT == T_Q4_0) return dotu32(u, y);
            return dotu32(u, _mm256_sign_epi8(y, _mm256_load_si256(reinterpret_cast<const __m256i *>(d.s[b][i]))));
        };
        __m256i isum = hsum8_i(dot(0), dot(1), dot(2), dot(3), dot(4), dot(5), dot(6), dot(7));
        if (KT == T_Q4_0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(qoff[b]));
        s = _mm256_add_ps(s, kterm<KT>(isum, _mm256_load_ps(d.dk[b]), _mm256_set1_ps(_cvtsh_ss(q[b].d))));
    }
    return s;
}

#if LB_AQ_VNNI
// With VNNI (avx2vnni; avx512 has its own kernel on zmm, csrc/x86/avx512/attn_q.cpp): KEYS IN
// LANES. 8 keys' blocks decoded to unsigned codes (ucodes) and transposed once for all rows:
// dword lane i of u[b][dw] = key i's codes 4dw .. 4dw + 3. One vpdpbusd then takes 4 codes of 8
// keys against one broadcast dword of a row, so a block's 8 vpdpbusd leave each key's exact
// block sum in its lane (no horizontal sums, no vpsignb per row); the float steps are
// score8_decoded's, lane for lane.
struct Keys8T {
    alignas(32) uint32_t u[512 / QK][8][8];  // [block][dword][key]
    alignas(32) float dk[512 / QK][8];       // [block][key]
};

// keys 0..n-1 (n <= 8) of rows k, k + ks, ...; keys n..7 as zero codes of scale 0 (their lanes unused)
template <int KT>
inline void decode8t(const uint8_t *k, size_t ks, int n, int nb, Keys8T &d) {
    for (int b = 0; b < nb; ++b) {
        const size_t o = (size_t)b * kbytes<KT>();
        alignas(16) uint16_t dh[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        __m256i r[8];
        for (int i = 0; i < 8; ++i) {
            r[i] = _mm256_setzero_si256();
            if (i < n) r[i] = ucodes<KT>(k + (size_t)i * ks + o), std::memcpy(dh + i, k + (size_t)i * ks + o, 2);
        }
        // 8 x 8 dwords: unpack 32, unpack 64, then the 128-bit halves
        const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
        const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
        const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
        const __m256i s[8] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),   // dwords (0,4), (1,5)
                              _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3),   // (2,6), (3,7): keys 0-3
                              _mm256_unpacklo_epi64(t4, t6), _mm256_unpackhi_epi64(t4, t6),
                              _mm256_unpacklo_epi64(t5, t7), _mm256_unpackhi_epi64(t5, t7)};  // keys 4-7
        for (int c = 0; c < 4; ++c) {
            _mm256_store_si256(reinterpret_cast<__m256i *>(d.u[b][c]), _mm256_permute2x128_si256(s[c], s[4 + c], 0x20));
            _mm256_store_si256(reinterpret_cast<__m256i *>(d.u[b][c + 4]), _mm256_permute2x128_si256(s[c], s[4 + c], 0x31));
        }
        _mm256_store_ps(d.dk[b], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(dh))));
    }
}

// one row's unscaled scores against the 8 decoded keys (lane = key), score8_decoded's float
// steps; qoff[b]: uoff * the sum of the row's block-b codes
template <int KT>
inline __m256 score8t(const Keys8T &d, const block_q8_0 *q, const int32_t *qoff, int nb) {
    __m256 s = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        __m256i isum = _mm256_set1_epi32(-qoff[b]);
        #pragma GCC unroll 8
        for (int dw = 0; dw < 8; ++dw) {
            int32_t y;
            std::memcpy(&y, q[b].qs + 4 * dw, 4);
            isum = LB_DPBUSD256(isum, _mm256_load_si256(reinterpret_cast<const __m256i *>(d.u[b][dw])), _mm256_set1_epi32(y));
        }
        s = _mm256_add_ps(s, kterm<KT>(isum, _mm256_load_ps(d.dk[b]), _mm256_set1_ps(_cvtsh_ss(q[b].d))));
    }
    return s;
}
#endif

// values d0 .. d0 + 15 (d0 a multiple of 16) of a V row, exactly, as two vectors (VT_F32: a row
// already widened to float)
constexpr int VT_F32 = -1;
template <int VT>
inline void vload16(const uint8_t *row, int d0, __m256 &v0, __m256 &v1) {
    if (VT == VT_F32) {
        v0 = _mm256_loadu_ps(reinterpret_cast<const float *>(row) + d0);
        v1 = _mm256_loadu_ps(reinterpret_cast<const float *>(row) + d0 + 8);
        return;
    }
    if (VT == T_F16) { v0 = vload8<VT>(row, d0); v1 = vload8<VT>(row, d0 + 8); return; }
    const uint8_t *b = row + (size_t)(d0 / QK) * (VT == T_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0));
    __m128i c;
    if (VT == T_Q8_0) c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2 + d0 % QK));
    else {  // values 0..15: the low nibbles of bytes 0..15, values 16..31 their high nibbles
        c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2));
        if (d0 % QK) c = _mm_srli_epi16(c, 4);
        c = _mm_sub_epi8(_mm_and_si128(c, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
    }
    const __m256 dv = _mm256_set1_ps(h2f(b));
    v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), dv);
    v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8))), dv);
}

constexpr int KB = 32;  // keys per pass over the values (their rows stay in L1 for every row group)

// out[h][d] += e[h][j] * v_j[d] (the reference's mul then add) for rows h < HB (e rows ld apart,
// out rows hd apart), keys j0..j1 in order, all hd dims 16 at a time; v_j at V + (j - jv) * vs
template <int VT, int HB>
inline void pv_rows(const float *e, size_t ld, const uint8_t *V, size_t vs, int jv, int j0, int j1, int hd,
                    float *out) {
    for (int d0 = 0; d0 < hd; d0 += 16) {
        __m256 a0[HB], a1[HB];
        for (int h = 0; h < HB; ++h) {
            a0[h] = _mm256_loadu_ps(out + (size_t)h * hd + d0);
            a1[h] = _mm256_loadu_ps(out + (size_t)h * hd + d0 + 8);
        }
        for (int j = j0; j < j1; ++j) {
            __m256 v0, v1;
            vload16<VT>(V + (size_t)(j - jv) * vs, d0, v0, v1);
            for (int h = 0; h < HB; ++h) {
                const __m256 p = _mm256_broadcast_ss(e + (size_t)h * ld + j);
                a0[h] = _mm256_add_ps(a0[h], _mm256_mul_ps(v0, p));
                a1[h] = _mm256_add_ps(a1[h], _mm256_mul_ps(v1, p));
            }
        }
        for (int h = 0; h < HB; ++h) {
            _mm256_storeu_ps(out + (size_t)h * hd + d0, a0[h]);
            _mm256_storeu_ps(out + (size_t)h * hd + d0 + 8, a1[h]);
        }
    }
}

// pv_rows over keys j0..j1 for every row group (by 4, the last 1-3 together), each up to its
// longest row; v_j at V + (j - jv) * vs
template <int VT>
inline void pv_groups(const float *sc, size_t ld, const int32_t *lens, int nq, const uint8_t *V, size_t vs, int jv,
                      int j0, int j1, int hd, float *out) {
    for (int r = 0; r < nq; r += 4) {
        const int hb = std::min(4, nq - r);
        const int m = *std::max_element(lens + r, lens + r + hb);
        if (m <= j0) continue;
        const float *e = sc + (size_t)r * ld;
        float *o = out + (size_t)r * hd;
        const int je = std::min(j1, m);
        if (hb == 4) pv_rows<VT, 4>(e, ld, V, vs, jv, j0, je, hd, o);
        else if (hb == 3) pv_rows<VT, 3>(e, ld, V, vs, jv, j0, je, hd, o);
        else if (hb == 2) pv_rows<VT, 2>(e, ld, V, vs, jv, j0, je, hd, o);
        else pv_rows<VT, 1>(e, ld, V, vs, jv, j0, je, hd, o);
    }
}

template <int KT, int VT>
void attend_group(const uint8_t *qq, int nq, const int32_t *lens, const uint8_t *K, size_t ks, const uint8_t *V,
                 size_t vs, int hd, float scale, const float *sinks, float softcap, float *sc, float *out) {
    const auto *q = reinterpret_cast<const block_q8_0 *>(qq);
    const int nb = hd / QK;
    int maxlen = 0;
    for (int r = 0; r < nq; ++r) maxlen = lens[r] > maxlen ? lens[r] : maxlen;
    const size_t ld = (size_t)maxlen;  // sc's row stride
    thread_local std::vector<int32_t> qoff;
    thread_local std::vector<float> inv;
    inv.resize((size_t)nq);
    if (KT == T_Q4_0 || LB_AQ_VNNI) block_code_sums(q, (size_t)nq * nb, uoff<KT>(), qoff);  // (VNNI: both K types)
    // scores: 8 keys decoded at a time, then every row that sees any of them (a row's lanes past
    // its own length are computed and never read); the decoded keys per thread, off the stack
#if LB_AQ_VNNI
    thread_local Keys8T d;
#else
    thread_local Keys8 d;
#endif
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int j = 0; j < maxlen; j += 8) {
        const int n = std::min(8, maxlen - j);
#if LB_AQ_VNNI
        decode8t<KT>(K + (size_t)j * ks, ks, n, nb, d);
#else
        decode8<KT>(K + (size_t)j * ks, ks, n, nb, d);
#endif
        for (int r = 0; r < nq; ++r) {
            if (lens[r] <= j) continue;
#if LB_AQ_VNNI
            const __m256 s = _mm256_mul_ps(score8t<KT>(d, q + (size_t)r * nb, qoff.data() + (size_t)r * nb, nb), vscale);
#else
            const __m256 s = _mm256_mul_ps(score8_decoded<KT>(d, q + (size_t)r * nb, qoff.data() + (size_t)r * nb, nb), vscale);
#endif
            float *o = sc + (size_t)r * ld + j;
            if (n == 8) _mm256_storeu_ps(o, s);
            else {
                alignas(32) float lanes[8];
                _mm256_store_ps(lanes, s);
                for (int i = 0; i < n; ++i) o[i] = lanes[i];
            }
        }
    }
    softmax_per_row(sc, ld, nq, lens, maxlen, sinks, softcap, inv.data());
    // values: keys in blocks of KB, rows by 4 (the last 1-3 together), each group up to its longest
    // row; past one group of rows, the block's values are widened to float once (exactly: the
    // same values) for all the groups
    thread_local std::vector<float> vf;
    if (nq > 4) vf.resize((size_t)KB * hd);
    for (size_t i = 0; i < (size_t)nq * hd; ++i) out[i] = 0.0f;
    for (int j0 = 0; j0 < maxlen; j0 += KB) {
        const int j1 = std::min(maxlen, j0 + KB);
        if (nq > 4) {
            for (int j = j0; j < j1; ++j)
                for (int d0 = 0; d0 < hd; d0 += 16) {
                    __m256 v0, v1;
                    vload16<VT>(V + (size_t)j * vs, d0, v0, v1);
                    _mm256_storeu_ps(vf.data() + (size_t)(j - j0) * hd + d0, v0);
                    _mm256_storeu_ps(vf.data() + (size_t)(j - j0) * hd + d0 + 8, v1);
                }
            pv_groups<VT_F32>(sc, ld, lens, nq, reinterpret_cast<const uint8_t *>(vf.data()), (size_t)hd * sizeof(float),
                              j0, j0, j1, hd, out);
        } else {
            pv_groups<VT>(sc, ld, lens, nq, V, vs, 0, j0, j1, hd, out);
        }
    }
    for (int r = 0; r < nq; ++r) {
        const __m256 vinv = _mm256_set1_ps(inv[(size_t)r]);
        float *o = out + (size_t)r * hd;
        for (int d0 = 0; d0 < hd; d0 += 8) _mm256_storeu_ps(o + d0, _mm256_mul_ps(_mm256_loadu_ps(o + d0), vinv));
    }
}

#ifndef LB_AQ_ZMM_ROWS  // (avx512 has its own shared-rows kernel: csrc/x86/avx512/attn_q.cpp)
void attend_q_group_simd(const uint8_t *qq, int nq, const int32_t *lens, int k_type, const uint8_t *K, size_t ks,
                        int v_type, const uint8_t *V, size_t vs, int hd, float scale, const float *sinks,
                        float softcap, float *sc, float *out) {
    by_kv_types(k_type, v_type, [&](auto kt, auto vt) {
        attend_group<decltype(kt)::value, decltype(vt)::value>(qq, nq, lens, K, ks, V, vs, hd, scale, sinks, softcap, sc, out);
    });
}

#endif

}  // namespace

#ifndef LB_AQ_ZMM_ROWS
void register_attn_q(KernelTable &t) {
#if LB_AQ_VNNI  // (avx2vnni: avx512 registers its own, csrc/x86/avx512/attn_q.cpp)
    t.attnq = AttnQKernel{attend_q_simd, "attn_q_avx2vnni", LOWBIT_ISA};
    t.attnq_rows = AttnQRowsKernel{attend_q_group_simd, "attn_q_rows_avx2vnni", LOWBIT_ISA};
#else
    t.attnq = AttnQKernel{attend_q_simd, "attn_q_avx2", LOWBIT_ISA};
    t.attnq_rows = AttnQRowsKernel{attend_q_group_simd, "attn_q_rows_avx2", LOWBIT_ISA};
#endif
}

#endif

}  // namespace LOWBIT_NS
}  // namespace lowbit
