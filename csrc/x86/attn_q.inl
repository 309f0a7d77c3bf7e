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

#include <cmath>
#include <cstring>

#include "../formats.h"
#include "../kernels.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including attn_q.inl"
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define LB_AQ_VNNI 1
#else
#define LB_AQ_VNNI 0
#endif

inline float h2f(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);  // exact
}

// sum_i x_i * y_i over 32 int8 pairs, as 8 int32 partial sums (exact; |x| * sign(y, x) keeps
// the unsigned x operand of maddubs / dpbusd non-negative; pairs <= 2 * 128 * 127 fit int16)
inline __m256i dot32(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
#if LB_AQ_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
#endif
}

// lane k = the sum of a_k's 8 lanes (integers: any order is exact)
inline __m256i hsum8_i(__m256i a0, __m256i a1, __m256i a2, __m256i a3, __m256i a4, __m256i a5, __m256i a6,
                       __m256i a7) {
    const __m256i t0 = _mm256_hadd_epi32(a0, a1), t1 = _mm256_hadd_epi32(a2, a3);
    const __m256i t2 = _mm256_hadd_epi32(a4, a5), t3 = _mm256_hadd_epi32(a6, a7);
    const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

inline int32_t hsum1_i(__m256i a) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
}

template <int KT> constexpr size_t kbytes() { return KT == T_Q8_0 ? sizeof(block_q8_0) : sizeof(block_q4_0); }

// block b of a K row as 32 int8 codes in value order (Q4_0: nibble - 8; low nibbles are values 0..15)
template <int KT>
inline __m256i kcodes(const uint8_t *blk) {
    if (KT == T_Q8_0) return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(blk + 2));
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(blk + 2)), m = _mm_set1_epi8(0x0F);
    const __m256i c = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
    return _mm256_sub_epi8(c, _mm256_set1_epi8(8));
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
        s = s + kterm1<KT>(hsum1_i(dot32(kcodes<KT>(blk), y)), h2f(blk), _cvtsh_ss(q[b].d));
    }
    return s;
}

// ref::attn_exp lane for lane (same constants, same mul / add steps)
inline __m256 exp8(__m256 x) {
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

template <int KT, int VT>
void attend(const uint8_t *qq, const uint8_t *K, size_t ks, const uint8_t *V, size_t vs, int len, int hd, float scale,
            float sink, float *sc, float *out) {
    const auto *q = reinterpret_cast<const block_q8_0 *>(qq);
    const int nb = hd / QK;
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    const int full = len & ~7;
    for (int j = 0; j < full; j += 8) {
        const __m256 s = _mm256_mul_ps(score8<KT>(K + (size_t)j * ks, ks, q, nb), vscale);
        _mm256_storeu_ps(sc + j, s);
        vmax = _mm256_max_ps(vmax, s);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    float mx = -INFINITY;
    for (int l = 0; l < 8; ++l) mx = lanes[l] > mx ? lanes[l] : mx;
    for (int j = full; j < len; ++j) {
        sc[j] = score1<KT>(K + (size_t)j * ks, q, nb) * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    mx = sink > mx ? sink : mx;

    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int j = 0; j < full; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), vmx));
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
        _mm256_store_ps(tail, exp8(_mm256_load_ps(tail)));
        for (int j = full; j < len; ++j) { sc[j] = tail[j - full]; sum = sum + sc[j]; }
        if (sink > -INFINITY) sum = sum + tail[7];
    }
    const float inv = 1.0f / sum;
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) pv_chunk<VT, 8>(sc, V, vs, len, d0, inv, out);
    for (; d0 < hd; d0 += 32) pv_chunk<VT, 4>(sc, V, vs, len, d0, inv, out);
}

template <int KT>
void attend_k(const uint8_t *qq, int v_type, const uint8_t *K, size_t ks, const uint8_t *V, size_t vs, int len,
              int hd, float scale, float sink, float *sc, float *out) {
    if (v_type == T_Q8_0) attend<KT, T_Q8_0>(qq, K, ks, V, vs, len, hd, scale, sink, sc, out);
    else if (v_type == T_Q4_0) attend<KT, T_Q4_0>(qq, K, ks, V, vs, len, hd, scale, sink, sc, out);
    else attend<KT, T_F16>(qq, K, ks, V, vs, len, hd, scale, sink, sc, out);
}

// k_type T_Q8_0 / T_Q4_0, v_type T_F16 / T_Q8_0 / T_Q4_0 (the engine checks), hd a multiple of 32
void attend_q_simd(const uint8_t *qq, int k_type, const uint8_t *K, size_t ks, int v_type, const uint8_t *V,
                   size_t vs, int len, int hd, float scale, float sink, float *sc, float *out) {
    if (k_type == T_Q8_0) attend_k<T_Q8_0>(qq, v_type, K, ks, V, vs, len, hd, scale, sink, sc, out);
    else attend_k<T_Q4_0>(qq, v_type, K, ks, V, vs, len, hd, scale, sink, sc, out);
}

}  // namespace

void register_attn_q(KernelTable &t) {
#if LB_AQ_VNNI
    t.attnq = AttnQKernel{attend_q_simd, "attn_q_avx512", ISA_AVX512};
#else
    t.attnq = AttnQKernel{attend_q_simd, "attn_q_avx2", LOWBIT_ISA};
#endif
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
