// Activation quantizers at the avx level: Q8_0, Q8_1, Q8_K, I8_S, byte-identical to the scalar
// reference (csrc/ref/act.cpp, csrc/ref/ternary.cpp) for every input (I4). The semantics and
// their reasons are csrc/x86/act.inl's (the avx2 levels); here floats are 256-bit and integers
// 128-bit halves:
//   Q8_0 / Q8_1  the maxps tree of ggml's AVX2 quantize_row_q8_0 in its operand order
//                (_mm256_max_ps IS maxps: the second operand on NaN), roundps by immediate,
//                cvtps2dq (INT32_MIN for NaN / out of range), packssdw + packsswb per half;
//                Q8_1's sum is the wrapping int32 sum before saturation.
//   Q8_K         max |x| with the new value as FIRST operand of maxps (a NaN |x| returns the
//                accumulator: NaN never enters), the first x of that |x| by a scan, then
//                nearest_int's 1.5 * 2^23 bit trick lane-wise, min 127, the low byte.
//   I8_S         amax over the finite |x|, q = clamp(nearest_int(x * scale)), NaN -> 0, +-inf -> +-127.
// The fp16 scales go through the reference's own software conversion (no F16C here).
#include <cmath>

#include "avx.h"

namespace lowbit {
namespace avx {
namespace {

LB_AVX_INLINE __m256 abs8(const float *x) {
    return _mm256_and_ps(_mm256_loadu_ps(x), _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

// ggml's fp32 -> fp16 of the Q8_0 / Q8_1 scales: RNE, NaN -> sign | 0x7e00 (csrc/ref/act.cpp).
LB_AVX_INLINE uint16_t ggml_fp16(float f) {
    if (std::isnan(f)) return (uint16_t)(((f32_to_bits(f) >> 16) & 0x8000u) | 0x7e00u);
    return f32_to_fp16(f);
}

LB_AVX_INLINE float block_amax(const float *x) {
    __m256 m = abs8(x);
    m = _mm256_max_ps(m, abs8(x + 8));
    m = _mm256_max_ps(m, abs8(x + 16));
    m = _mm256_max_ps(m, abs8(x + 24));
    __m128 h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// 32 values * id -> 32 saturated int8 at q; returns the wrapping int32 sum before saturation.
LB_AVX_INLINE int32_t q8_block(const float *x, float id, uint8_t *q) {
    const __m256 mul = _mm256_set1_ps(id);
    __m128i sum = _mm_setzero_si128();
    for (int j = 0; j < 32; j += 16) {
        const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), mul), _MM_ROUND_NEAREST));
        const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), mul), _MM_ROUND_NEAREST));
        const __m128i a = _mm256_castsi256_si128(i0), b = _mm256_extractf128_si256(i0, 1);
        const __m128i c = _mm256_castsi256_si128(i1), d = _mm256_extractf128_si256(i1, 1);
        sum = _mm_add_epi32(sum, _mm_add_epi32(_mm_add_epi32(a, b), _mm_add_epi32(c, d)));
        _mm_storeu_si128((__m128i *)(q + j), _mm_packs_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
    }
    sum = _mm_hadd_epi32(sum, sum);
    sum = _mm_hadd_epi32(sum, sum);
    return _mm_cvtsi128_si32(sum);
}

void quant_act_q8_0(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK; ++b) {
        const float *xb = x + b * QK;
        uint8_t *y = dst + b * sizeof(block_q8_0);
        const float amax = block_amax(xb);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const uint16_t dh = ggml_fp16(d);
        std::memcpy(y, &dh, 2);
        q8_block(xb, id, y + 2);
    }
}

void quant_act_q8_1(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK; ++b) {
        const float *xb = x + b * QK;
        uint8_t *y = dst + b * sizeof(block_q8_1);
        const float amax = block_amax(xb);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const int32_t sum = q8_block(xb, id, y + 4);
        const uint16_t dh = ggml_fp16(d), sh = ggml_fp16(d * (float)sum);
        std::memcpy(y, &dh, 2);
        std::memcpy(y + 2, &sh, 2);
    }
}

// nearest_int's bit trick on 4 floats: low 23 bits of (v + 1.5 * 2^23) minus 2^22.
LB_AVX_INLINE __m128i nearest_int(__m128 v) {
    const __m128i bits = _mm_castps_si128(_mm_add_ps(v, _mm_set1_ps(12582912.f)));
    return _mm_sub_epi32(_mm_and_si128(bits, _mm_set1_epi32(0x007fffff)), _mm_set1_epi32(0x00400000));
}
// low bytes of 4 int32 into bytes 0..3
LB_AVX_INLINE __m128i low_bytes(__m128i v) {
    return _mm_shuffle_epi8(v, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
}

void quant_act_q8_K(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const float *xb = x + b * QK_K;
        uint8_t *yb = dst + b * sizeof(block_q8_K);
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) m = _mm256_max_ps(abs8(xb + j), m);  // NaN |x| returns m
        __m128 h = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (amax == 0.0f) {
            std::memset(yb, 0, sizeof(block_q8_K));
            continue;
        }
        int first = 0;
        while (!(std::fabs(xb[first]) == amax)) ++first;
        const float iscale = -127.0f / xb[first];
        const __m128 s = _mm_set1_ps(iscale);
        const __m128i cap = _mm_set1_epi32(127);
        for (int j = 0; j < QK_K; j += 16) {
            __m128i v[4];
            for (int k = 0; k < 4; ++k)  // q = min(127, nearest_int(iscale * x)), its low byte
                v[k] = _mm_and_si128(_mm_min_epi32(nearest_int(_mm_mul_ps(_mm_loadu_ps(xb + j + 4 * k), s)), cap),
                                     _mm_set1_epi32(0xFF));
            const __m128i q16 = _mm_packus_epi16(_mm_packus_epi32(v[0], v[1]), _mm_packus_epi32(v[2], v[3]));  // exact: 0..255
            _mm_storeu_si128((__m128i *)(yb + 4 + j), q16);
            const __m128i s32 = _mm_madd_epi16(_mm_maddubs_epi16(_mm_set1_epi8(1), q16), _mm_set1_epi16(1));
            const __m128i t = _mm_hadd_epi32(s32, s32);  // [s0 + s1, s2 + s3, ..]
            const int16_t bs = (int16_t)_mm_cvtsi128_si32(_mm_hadd_epi32(t, t));
            std::memcpy(yb + 4 + QK_K + 2 * (j / 16), &bs, 2);
        }
        const float d = 1.0f / iscale;
        std::memcpy(yb, &d, 4);
    }
}

void quant_act_i8_s(const float *x, uint8_t *dst, int64_t n) {
    const __m128 inf = _mm_set1_ps(INFINITY), absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    __m128 m = _mm_setzero_ps();
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        const __m128 ax = _mm_and_ps(_mm_loadu_ps(x + k), absmask);
        m = _mm_max_ps(m, _mm_and_ps(ax, _mm_cmplt_ps(ax, inf)));  // non-finite lanes -> 0
    }
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    float amax = _mm_cvtss_f32(m);
    for (; k < n; ++k)
        if (std::isfinite(x[k])) amax = std::fmax(amax, std::fabs(x[k]));
    float scale = 1.f;
    if (amax > 0.f && std::isfinite(127.f / amax)) scale = 127.f / amax;
    uint8_t *q = dst + I8S_HEADER;
    const __m128 sc = _mm_set1_ps(scale);
    const __m128i hi = _mm_set1_epi32(127), lo = _mm_set1_epi32(-127);
    __m128i sum = _mm_setzero_si128();
    for (k = 0; k + 4 <= n; k += 4) {
        const __m128 xv = _mm_loadu_ps(x + k);
        __m128i v = _mm_max_epi32(_mm_min_epi32(nearest_int(_mm_mul_ps(xv, sc)), hi), lo);
        const __m128 isinf = _mm_cmpeq_ps(_mm_and_ps(xv, absmask), inf);
        const __m128i infv = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(hi), _mm_castsi128_ps(lo), xv));  // sign
        v = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(v), _mm_castsi128_ps(infv), isinf));
        v = _mm_and_si128(v, _mm_castps_si128(_mm_cmpord_ps(xv, xv)));  // NaN -> 0
        sum = _mm_add_epi32(sum, v);
        const int32_t b4 = _mm_cvtsi128_si32(low_bytes(v));
        std::memcpy(q + k, &b4, 4);
    }
    sum = _mm_hadd_epi32(sum, sum);
    sum = _mm_hadd_epi32(sum, sum);
    int32_t total = _mm_cvtsi128_si32(sum);
    for (; k < n; ++k) {
        int v;
        if (std::isnan(x[k])) v = 0;
        else if (std::isinf(x[k])) v = x[k] > 0 ? 127 : -127;
        else {
            const float val = x[k] * scale + 12582912.f;
            int32_t i;
            std::memcpy(&i, &val, 4);
            v = (i & 0x007fffff) - 0x00400000;
        }
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        q[k] = (uint8_t)(int8_t)v;
        total += v;
    }
    std::memcpy(dst, &scale, 4);
    std::memcpy(dst + 4, &total, 4);
}

}  // namespace

void register_act(KernelTable &t) {
    t.set_quant_act(T_Q8_0, quant_act_q8_0, "quant_act_q8_0_avx", ISA_AVX);
    t.set_quant_act(T_Q8_1, quant_act_q8_1, "quant_act_q8_1_avx", ISA_AVX);
    t.set_quant_act(T_Q8_K, quant_act_q8_K, "quant_act_q8_k_avx", ISA_AVX);
    t.set_quant_act(T_I8_S, quant_act_i8_s, "quant_act_i8_s_avx", ISA_AVX);
}

}  // namespace avx
}  // namespace lowbit
