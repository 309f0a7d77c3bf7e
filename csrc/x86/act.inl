// Activation quantizers Q8_0, Q8_1, Q8_K and I8_S. Shared body of
// csrc/x86/{avx2,avx2vnni,avx512}/act.cpp; the including file defines LOWBIT_ISA and LOWBIT_NS
// and is built with that level's flags only.
//
// Contract (csrc/kernels.h quant_act_fn, invariant I4): for every float32 input, NaN, ±inf,
// denormals, exact ties and values near FLT_MAX included, the bytes written equal those of the
// scalar reference (csrc/ref/act.cpp for Q8_0 / Q8_1 / Q8_K, csrc/ref/ternary.cpp for I8_S),
// which are ggml's bytes for the Q8 formats. Every level runs the same 256-bit code: the avx512
// build only changes the encoding, never an operation or an operand order.
//
// ---- Q8_0 / Q8_1: the operations of ggml's AVX2 quantize_row_q8_0 / _1, in its order --------
// A 32-value block is four ymm, v_k = x[8k .. 8k+7]. amax is a maxps tree whose NaN handling
// depends on operand order (maxps(a, b) returns b when either is NaN), so the order below IS
// the contract, lane for lane the one block_amax_avx2 in the reference spells out:
//   m = |v0|; m = maxps(m, |v1|); m = maxps(m, |v2|); m = maxps(m, |v3|)     (|.|: sign cleared)
//   h = maxps(m[4..7], m[0..3]);  g = maxps(h[0,1], h[2,3]);  amax = maxss(g[0], g[1])
// d = amax / 127, id = amax != 0 ? 127 / amax : 0 (IEEE divisions, one block's in scalar or
// eight blocks' in one vector: the same values), q = sat8(cvt(roundps(v * id)))
// with roundps in nearest-even mode by immediate (MXCSR's rounding mode plays no part: cvt then
// sees only integers, or NaN / out-of-range, which become INT32_MIN). Q8_1's s = d * (float)sum
// with sum the wrapping int32 sum of the cvt results (before saturation; order-free).
// The fp16 scales: F16C's vcvtps2ph rounds to nearest even exactly as ggml's software
// conversion does; the two differ only on NaN, which ggml makes sign | 0x7e00 (fp16_ggml).
//
// ---- Q8_K: quantize_row_q8_K_ref's semantics -----------------------------------------------
// amax: maxps(|x|, acc) over the block. With the new value as FIRST operand a NaN |x| returns
// acc, so NaN never enters, as in the reference's `ax > amax`; among non-NaN values max is
// order-free. max (signed): the reference keeps the FIRST x whose |x| is strictly larger than
// everything before it, i.e. the first x with |x| == amax: a second pass finds it by compare +
// movemask + count-trailing-zeros, vector by vector in index order. amax == 0 (all zeros and
// NaNs): d = 0, qs = 0, bsums = 0 (the reference's documented deviation from ggml). Otherwise
// iscale = -127 / max, d = 1 / iscale (scalar), and q = min(127, nearest_int(iscale * x)) with
// nearest_int the 1.5 * 2^23 bit trick done lane-wise (addps, and, psubd): the same IEEE add
// on every input, so NaN payloads and ±inf give the reference's values too. The stored byte is
// q's low byte (q may be as low as -2^22): masked to 0..255, then the unsigned packs are exact.
// bsums[j] = sum of the signed bytes qs[16j .. 16j+15] (|sum| <= 2048, int16): psadbw on
// qs ^ 0x80 gives sums of 8 biased bytes; two of them minus 16 * 128 make one group's sum.
//
// ---- I8_S: quant_act_i8_s's contract (csrc/ref/ternary.cpp) ------------------------------------
// amax = max |x| over the finite x (non-finite lanes masked to 0 before the max: order-free);
// scale = 127 / amax, or 1 when amax is 0 or 127 / amax is not finite (scalar, as the reference).
// q = clamp(round_even(x * scale), -127, 127), NaN -> 0, ±inf -> ±127, computed as
// round_even(clamp(x * scale)) (rounding is monotone and the bounds are integers, so clamping
// first is the same; it also sends ±inf to ±127) masked to 0 where x is NaN; x * scale is
// < 2^22 in magnitude for every finite x, where the reference's nearest_int is round-even.
// sum = the int32 sum of q. n is any positive length: chunks of 32 values in SIMD, then the
// last n mod 32 values by the reference's scalar formula.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../kernels.h"
#include "hsum.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including act.inl"
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {

#define LB_ACT_STR2(x) #x
#define LB_ACT_STR(x) LB_ACT_STR2(x)

inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// ggml's fp32 -> fp16: round to nearest even (F16C, by immediate), NaN -> its sign | 0x7e00.
inline uint16_t fp16_ggml(float f) {
    uint16_t h = (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    if (f != f) h = (uint16_t)((h & 0x8000u) | 0x7e00u);
    return h;
}

// Four int32 vectors (values 0..31 of a chunk: a = 0..7, b = 8..15, c = 16..23, e = 24..31)
// to 32 int8 in value order, each clamped to [-128, 127] (packssdw then packsswb saturate).
// The packs interleave 128-bit lanes: dword k of the result holds values of source dword
// [0 4 1 5 2 6 3 7][k], hence the permute.
inline __m256i pack_sat8(__m256i a, __m256i b, __m256i c, __m256i e) {
    const __m256i ab = _mm256_packs_epi32(a, b), ce = _mm256_packs_epi32(c, e);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, ce), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 8 float -> int32: round half to even by immediate, then cvt (exact on integers; NaN,
// ±inf and |v| >= 2^31 give INT32_MIN).
inline __m256i round_cvt(__m256 v) {
    return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// ---- Q8_0 / Q8_1 ----------------------------------------------------------------------------

// amax of one 32-value block in ggml's AVX2 reduction order (file comment), in lane 0.
inline __m128 block_amax(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m256 m = abs8(v0);
    m = _mm256_max_ps(m, abs8(v1));
    m = _mm256_max_ps(m, abs8(v2));
    m = _mm256_max_ps(m, abs8(v3));
    __m128 h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_max_ss(h, _mm_movehdup_ps(h));
}

inline __m128 block_amax(const float *x) {
    return block_amax(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24));
}

// fp16_ggml on 8 lanes: vcvtps2ph (nearest even), then NaN lanes -> their sign | 0x7e00.
inline __m128i fp16x8_ggml(__m256 f) {
    const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    const __m128i m16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    const __m128i fixed = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)), _mm_set1_epi16(0x7e00));
    return _mm_blendv_epi8(h, fixed, m16);
}

// The codes of one block (stored at qs) for the multiplier id; returns the int32 cvt results
// summed lane-wise over the block's four vectors (Q8_1's sum, before saturation).
inline __m256i block_codes(const float *x, __m256 id, uint8_t *qs) {
    const __m256i i0 = round_cvt(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    const __m256i i1 = round_cvt(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    const __m256i i2 = round_cvt(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    const __m256i i3 = round_cvt(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(qs), pack_sat8(i0, i1, i2, i3));
    return _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
}

// Two ways through a row, the same operations on every value (so the same bytes):
//   8 blocks at a time: the 8 amax trees, then d, id, the fp16 scales and Q8_1's d * sum
//     for the 8 blocks as one vector each (lane j = block j; divps / mulps / cvtdq2ps are
//     the scalar divss / mulss / cvtsi2ss lane-wise), then each block's codes with id_j;
//   the remaining n / 32 mod 8 blocks one at a time, with scalar d and id.
template <bool Q8_1>
void quant_q8_legacy(const float *x, uint8_t *dst, int64_t n) {
    constexpr size_t BB = Q8_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
    constexpr size_t QS = Q8_1 ? 4 : 2;  // byte offset of qs in the block
    const int64_t nb = n / QK;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const float *xb = x + b * QK;
        uint8_t *yb = dst + (size_t)b * BB;
        auto am = [&](int j) { return block_amax(xb + j * QK); };
        const __m128 a01 = _mm_unpacklo_ps(am(0), am(1)), a23 = _mm_unpacklo_ps(am(2), am(3));
        const __m128 a45 = _mm_unpacklo_ps(am(4), am(5)), a67 = _mm_unpacklo_ps(am(6), am(7));
        const __m256 amax = _mm256_set_m128(_mm_movelh_ps(a45, a67), _mm_movelh_ps(a01, a23));
        const __m256 d = _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
        // amax != 0 ? 127 / amax : 0 (a NaN amax compares unequal: its id is NaN)
        const __m256 nz = _mm256_cmp_ps(amax, _mm256_setzero_ps(), _CMP_NEQ_UQ);
        const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(127.0f), amax), nz);
        auto codes = [&](int j) {
            const __m256 idj = _mm256_permutevar8x32_ps(id, _mm256_set1_epi32(j));
            return block_codes(xb + j * QK, idj, yb + j * BB + QS);
        };
        alignas(16) uint16_t h[16];
        if constexpr (Q8_1) {
            // lane j of the result = block j's sum: two hadd levels leave [blocks 0..3 of the
            // low 128 bits | of the high], likewise for 4..7; the two halves are then added.
            const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(codes(0), codes(1)),
                                                    _mm256_hadd_epi32(codes(2), codes(3)));
            const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(codes(4), codes(5)),
                                                    _mm256_hadd_epi32(codes(6), codes(7)));
            const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                                                  _mm256_permute2x128_si256(h0123, h4567, 0x31));
            const __m128i dh = fp16x8_ggml(d);
            const __m128i sh = fp16x8_ggml(_mm256_mul_ps(d, _mm256_cvtepi32_ps(sums)));
            _mm_store_si128(reinterpret_cast<__m128i *>(h), _mm_unpacklo_epi16(dh, sh));      // d0 s0 .. d3 s3
            _mm_store_si128(reinterpret_cast<__m128i *>(h + 8), _mm_unpackhi_epi16(dh, sh));  // d4 s4 .. d7 s7
            for (int j = 0; j < 8; ++j) std::memcpy(yb + j * BB, h + 2 * j, 4);
        } else {
            for (int j = 0; j < 8; ++j) codes(j);
            _mm_store_si128(reinterpret_cast<__m128i *>(h), fp16x8_ggml(d));
            for (int j = 0; j < 8; ++j) std::memcpy(yb + j * BB, h + j, 2);
        }
    }
    for (; b < nb; ++b) {
        const float *xb = x + b * QK;
        uint8_t *yb = dst + (size_t)b * BB;
        const float amax = _mm_cvtss_f32(block_amax(xb));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const __m256i s = block_codes(xb, _mm256_set1_ps(id), yb + QS);
        const uint16_t dh = fp16_ggml(d);
        std::memcpy(yb, &dh, 2);
        if constexpr (Q8_1) {
            const uint16_t sh = fp16_ggml(d * (float)hsum8_i32(s));
            std::memcpy(yb + 2, &sh, 2);
        }
    }
}

void quant_act_q8_0(const float *x, uint8_t *dst, int64_t n) { quant_q8_legacy<false>(x, dst, n); }
void quant_act_q8_1(const float *x, uint8_t *dst, int64_t n) { quant_q8_legacy<true>(x, dst, n); }

// ---- Q8_K -----------------------------------------------------------------------------------

// Horizontal max of 8 lanes that hold no NaN (any order gives the same value).
inline float hmax8(__m256 m) {
    __m128 h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// Low bytes of four int32 vectors (32 values in order a, b, c, e), i.e. (uint8_t)q.
inline __m256i pack_low8(__m256i a, __m256i b, __m256i c, __m256i e) {
    const __m256i lo = _mm256_set1_epi32(0xff);
    const __m256i ab = _mm256_packus_epi32(_mm256_and_si256(a, lo), _mm256_and_si256(b, lo));
    const __m256i ce = _mm256_packus_epi32(_mm256_and_si256(c, lo), _mm256_and_si256(e, lo));
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, ce), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// min(127, nearest_int(iscale * x)) for 8 lanes: the reference's bit trick on any input.
inline __m256i q8k_code(__m256 is, __m256 x) {
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(is, x), _mm256_set1_ps(12582912.0f));
    const __m256i i = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), _mm256_set1_epi32(0x007fffff)),
                                       _mm256_set1_epi32(0x00400000));
    return _mm256_min_epi32(i, _mm256_set1_epi32(127));
}

// Two groups' sums from one 32-byte code vector, as psadbw lanes: 64-bit lane k holds
// sum(qs[8k .. 8k+7] + 128) of the vector.
inline __m256i sad_biased(__m256i q) {
    return _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
}

void quant_act_q8_K(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const float *xb = x + b * QK_K;
        uint8_t *yb = dst + (size_t)b * sizeof(block_q8_K);
        // pass 1: amax, NaN never entering (new value first: maxps returns acc on NaN)
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < QK_K; k += 32) {
            a0 = _mm256_max_ps(abs8(_mm256_loadu_ps(xb + k)), a0);
            a1 = _mm256_max_ps(abs8(_mm256_loadu_ps(xb + k + 8)), a1);
            a2 = _mm256_max_ps(abs8(_mm256_loadu_ps(xb + k + 16)), a2);
            a3 = _mm256_max_ps(abs8(_mm256_loadu_ps(xb + k + 24)), a3);
        }
        const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3)));
        if (amax == 0.0f) {
            std::memset(yb, 0, sizeof(block_q8_K));
            continue;
        }
        // pass 2: the first x with |x| == amax (exists: amax is one of the |x|)
        const __m256 am = _mm256_set1_ps(amax);
        int first = 0;
        for (int k = 0; k < QK_K; k += 8) {
            const int m = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(xb + k)), am, _CMP_EQ_OQ));
            if (m) {
                first = k + __builtin_ctz((unsigned)m);
                break;
            }
        }
        const float iscale = -127.0f / xb[first];
        const float d = 1.0f / iscale;
        std::memcpy(yb, &d, 4);
        // pass 3: codes, 32 per chunk c (groups 2c, 2c+1), and the bsums, 8 groups per half
        const __m256 is = _mm256_set1_ps(iscale);
        auto chunk = [&](int c) {
            const float *xc = xb + 32 * c;
            const __m256i q = pack_low8(q8k_code(is, _mm256_loadu_ps(xc)), q8k_code(is, _mm256_loadu_ps(xc + 8)),
                                        q8k_code(is, _mm256_loadu_ps(xc + 16)), q8k_code(is, _mm256_loadu_ps(xc + 24)));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(yb + 4 + 32 * c), q);
            return sad_biased(q);
        };
        // hadd of two psadbw vectors (their 64-bit lanes have zero high dwords) gives, per
        // 128-bit lane L, [s.L0, s.L1, t.L0, t.L1]; a second hadd sums the pairs: lane 0 holds
        // groups [0 2 4 6] of the half, lane 1 [1 3 5 7]; the permute restores group order.
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        const __m256i bias = _mm256_set1_epi32(16 * 128);
        for (int h = 0; h < 2; ++h) {  // groups 8h .. 8h+7, stored as int16 (|sum| <= 2048)
            const __m256i s01 = _mm256_hadd_epi32(chunk(4 * h), chunk(4 * h + 1));
            const __m256i s23 = _mm256_hadd_epi32(chunk(4 * h + 2), chunk(4 * h + 3));
            const __m256i g = _mm256_permutevar8x32_epi32(_mm256_sub_epi32(_mm256_hadd_epi32(s01, s23), bias), order);
            _mm_storeu_si128(reinterpret_cast<__m128i *>(yb + 4 + QK_K + 16 * h),
                             _mm_packs_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1)));
        }
    }
}

// ---- I8_S -----------------------------------------------------------------------------------

// The reference's per-value formula, for the last n mod 32 values.
inline int i8s_code_scalar(float x, float scale) {
    if (std::isnan(x)) return 0;
    if (std::isinf(x)) return x > 0 ? 127 : -127;
    const float f = x * scale + 12582912.0f;
    int32_t i;
    std::memcpy(&i, &f, 4);
    const int v = (i & 0x007fffff) - 0x00400000;
    return v > 127 ? 127 : (v < -127 ? -127 : v);
}

// 8 codes: round_even(clamp(x * scale, -127, 127)), 0 where x is NaN.
inline __m256i i8s_code(__m256 x, __m256 scale) {
    const __m256 v = _mm256_mul_ps(x, scale);
    const __m256 c = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    const __m256 ordered = _mm256_cmp_ps(x, x, _CMP_ORD_Q);
    return round_cvt(_mm256_and_ps(c, ordered));
}

void quant_act_i8_s(const float *x, uint8_t *dst, int64_t n) {
    const int64_t nv = n & ~(int64_t)31;
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < nv; k += 32) {
        __m256 t;
        t = abs8(_mm256_loadu_ps(x + k));
        a0 = _mm256_max_ps(a0, _mm256_and_ps(t, _mm256_cmp_ps(t, inf, _CMP_LT_OQ)));
        t = abs8(_mm256_loadu_ps(x + k + 8));
        a1 = _mm256_max_ps(a1, _mm256_and_ps(t, _mm256_cmp_ps(t, inf, _CMP_LT_OQ)));
        t = abs8(_mm256_loadu_ps(x + k + 16));
        a2 = _mm256_max_ps(a2, _mm256_and_ps(t, _mm256_cmp_ps(t, inf, _CMP_LT_OQ)));
        t = abs8(_mm256_loadu_ps(x + k + 24));
        a3 = _mm256_max_ps(a3, _mm256_and_ps(t, _mm256_cmp_ps(t, inf, _CMP_LT_OQ)));
    }
    float amax = hmax8(_mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3)));
    for (int64_t k = nv; k < n; ++k)
        if (std::isfinite(x[k])) amax = std::fmax(amax, std::fabs(x[k]));
    float scale = 1.f;
    if (amax > 0.f && std::isfinite(127.f / amax)) scale = 127.f / amax;

    uint8_t *q = dst + I8S_HEADER;
    const __m256 sc = _mm256_set1_ps(scale);
    __m256i acc = _mm256_setzero_si256();
    for (int64_t k = 0; k < nv; k += 32) {
        const __m256i i0 = i8s_code(_mm256_loadu_ps(x + k), sc);
        const __m256i i1 = i8s_code(_mm256_loadu_ps(x + k + 8), sc);
        const __m256i i2 = i8s_code(_mm256_loadu_ps(x + k + 16), sc);
        const __m256i i3 = i8s_code(_mm256_loadu_ps(x + k + 24), sc);
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(q + k), pack_sat8(i0, i1, i2, i3));
    }
    int32_t sum = hsum8_i32(acc);
    for (int64_t k = nv; k < n; ++k) {
        const int v = i8s_code_scalar(x[k], scale);
        q[k] = (uint8_t)(int8_t)v;
        sum += v;
    }
    std::memcpy(dst, &scale, 4);
    std::memcpy(dst + 4, &sum, 4);
}

}  // namespace

void register_act(KernelTable &t) {
#define LB_ACT_NAME(a) "quant_act_" a "_" LB_ACT_STR(LOWBIT_NS)
    t.set_quant_act(T_Q8_0, quant_act_q8_0, LB_ACT_NAME("q8_0"), LOWBIT_ISA);
    t.set_quant_act(T_Q8_1, quant_act_q8_1, LB_ACT_NAME("q8_1"), LOWBIT_ISA);
    t.set_quant_act(T_Q8_K, quant_act_q8_K, LB_ACT_NAME("q8_k"), LOWBIT_ISA);
    t.set_quant_act(T_I8_S, quant_act_i8_s, LB_ACT_NAME("i8_s"), LOWBIT_ISA);
#undef LB_ACT_NAME
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
