// K-quant row kernels at the avx level: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K x Q8_K. Layouts:
// csrc/ref/kquants.cpp; design and arithmetic: avx.h (bitwise the reference).
//
// Codes are decoded one __m128i of 16 at a time, as UNSIGNED values u = q + off (off: Q3_K 4,
// Q6_K 32, else 0; u <= 63, so maddubs never saturates), with the scale of their 16-weight
// sub-block v; while that vector is live every token of a chunk of 4 adds sc_v * sum(u * q_a) to
// its own int32 register (t0..t3, named). The offsets come back out
// exactly through the activation's bsums (the sums of its 16-value groups, = sub-block v's):
//   isum = sum_v sc_v * sum(u * q_a) - off * sum_v sc_v * bsums_v
//   msum = sum_v mins_v * bsums_v                                       (Q2_K, Q4_K, Q5_K)
// Float step, as the reference:  acc += (d_w * d_a) * (float)isum [- (dmin_w * d_a) * (float)msum]
#include "avx.h"

namespace lowbit {
namespace avx {
namespace {

constexpr int kQ8K_D = 0, kQ8K_QS = 4, kQ8K_BSUMS = 4 + QK_K;  // block_q8_K offsets

// sum_v w16[v] * bsums[v] for one token (w16: 16 int16 weights in two vectors): 4 partials.
LB_AVX_INLINE __m128i bsum_dot(__m128i w0, __m128i w1, const uint8_t *at) {
    return _mm_add_epi32(_mm_madd_epi16(ld128(at + kQ8K_BSUMS), w0), _mm_madd_epi16(ld128(at + kQ8K_BSUMS + 16), w1));
}

// F: codes(block, fn) calls fn(u, sc, v) for v = 0..15; scales16(block, s0, s1) the 16 scales as
// int16 (for the offset term); mins16 likewise (kMins); kOff, kD, kDmin.
template <class F>
struct KQuant {
    static constexpr int kQK = QK_K, kWB = F::kWB, kAB = 292;
    // Lane t: the isum of token t < C (C <= 4) of the chunk at ab. The token registers are named
    // (t0..t3); with 16 xmm, 8 of them next to the codes and constants would spill (I7), so a
    // window of 5..8 tokens decodes the codes once per chunk of 4 (the aarch64 levels, with 32
    // registers, decode once per window).
    template <int C>
    static LB_AVX_INLINE __m128i isums(const uint8_t *wb, const uint8_t *ab, size_t st) {
        __m128i t0 = _mm_setzero_si128(), t1 = t0, t2 = t0, t3 = t0;
        F::codes(wb, [&](__m128i u, int32_t sc, int v) LB_AVX_LAMBDA {
            // maddubs: int16 pairs u * q (|.| <= 2 * 63 * 128); madd by the scale widens them:
            // sc * (pair) summed in pairs, exact in int32
            const __m128i s = _mm_set1_epi16((int16_t)sc);
            auto add = [&](__m128i acc, const uint8_t *at) LB_AVX_LAMBDA {
                const __m128i p = _mm_maddubs_epi16(u, ld128(at + kQ8K_QS + 16 * v));
                return _mm_add_epi32(acc, _mm_madd_epi16(p, s));
            };
            t0 = add(t0, ab);
            if constexpr (C > 1) t1 = add(t1, ab + st);
            if constexpr (C > 2) t2 = add(t2, ab + 2 * st);
            if constexpr (C > 3) t3 = add(t3, ab + 3 * st);
        });
        __m128i isum = reduce4(t0, t1, t2, t3);
        if constexpr (F::kOff != 0) {  // - off * sum_v sc_v * bsums_v
            __m128i s0, s1;
            F::scales16(wb, s0, s1);
            const __m128i corr = per_token<C>(ab, st, [&](const uint8_t *at) LB_AVX_LAMBDA { return bsum_dot(s0, s1, at); });
            isum = _mm_sub_epi32(isum, _mm_mullo_epi32(corr, _mm_set1_epi32(F::kOff)));
        }
        return isum;
    }
    template <int C>
    static LB_AVX_INLINE __m128i msums(const uint8_t *wb, const uint8_t *ab, size_t st) {
        if constexpr (!F::kMins) return _mm_setzero_si128();
        __m128i m0, m1;
        F::mins16(wb, m0, m1);
        return per_token<C>(ab, st, [&](const uint8_t *at) LB_AVX_LAMBDA { return bsum_dot(m0, m1, at); });
    }
    template <int NT>
    static LB_AVX_INLINE void block(const uint8_t *wb, const uint8_t *ab, size_t st, __m128 &acc0, __m128 &acc1) {
        constexpr int C0 = NT < 4 ? NT : 4, C1 = NT > 4 ? NT - 4 : 1;
        const float d = f16(wb + F::kD);
        acc0 = step<C0>(d, wb, ab, st, isums<C0>(wb, ab, st), msums<C0>(wb, ab, st), acc0);
        if constexpr (NT > 4) {
            const uint8_t *ab1 = ab + 4 * st;
            acc1 = step<C1>(d, wb, ab1, st, isums<C1>(wb, ab1, st), msums<C1>(wb, ab1, st), acc1);
        }
    }
    template <int C>
    static LB_AVX_INLINE __m128 step(float d, const uint8_t *wb, const uint8_t *ab, size_t st, __m128i isum,
                                     __m128i msum, __m128 acc) {
        const __m128 da = f32_lanes<C>(ab, st, kQ8K_D);
        const __m128 t = _mm_mul_ps(_mm_mul_ps(da, _mm_set1_ps(d)), _mm_cvtepi32_ps(isum));
        if constexpr (F::kMins) {
            const __m128 dm = _mm_mul_ps(da, _mm_set1_ps(f16(wb + F::kDmin)));
            return _mm_add_ps(acc, _mm_sub_ps(t, _mm_mul_ps(dm, _mm_cvtepi32_ps(msum))));
        } else {
            return _mm_add_ps(acc, t);
        }
    }
};

LB_AVX_INLINE void bytes_to_16(const int16_t v[16], __m128i &a, __m128i &b) {
    a = _mm_loadu_si128((const __m128i *)v);
    b = _mm_loadu_si128((const __m128i *)(v + 8));
}

// 2-bit fields: byte qs[32h + 16j + i] bits 2k+1:2k = weight 128h + 32k + 16j + i (vector 8h + 2k + j).
template <class Fn>
LB_AVX_INLINE void two_bit_fields(const uint8_t *qs, Fn fn) {
    for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 2; ++j) {
            const __m128i x = ld128(qs + 32 * h + 16 * j);
            fn(_mm_and_si128(x, K(kM3)), 8 * h + 0 + j);
            fn(_mm_and_si128(_mm_srli_epi16(x, 2), K(kM3)), 8 * h + 2 + j);
            fn(_mm_and_si128(_mm_srli_epi16(x, 4), K(kM3)), 8 * h + 4 + j);
            fn(_mm_and_si128(_mm_srli_epi16(x, 6), K(kM3)), 8 * h + 6 + j);
        }
}

struct FQ2_K {  // scales[16] (sc low nibble, min high), qs[64], d, dmin
    static constexpr int kWB = 84, kD = 80, kDmin = 82, kOff = 0;
    static constexpr bool kMins = true;
    template <class Fn>
    static LB_AVX_INLINE void codes(const uint8_t *b, Fn fn) {
        two_bit_fields(b + 16, [&](__m128i u, int v) LB_AVX_LAMBDA { fn(u, b[v] & 0x0F, v); });
    }
    static LB_AVX_INLINE void scales16(const uint8_t *, __m128i &, __m128i &) {}
    static LB_AVX_INLINE void mins16(const uint8_t *b, __m128i &m0, __m128i &m1) {
        const __m128i mn = _mm_and_si128(_mm_srli_epi16(ld128(b), 4), K(kM4));
        m0 = _mm_cvtepu8_epi16(mn);
        m1 = _mm_cvtepu8_epi16(_mm_srli_si128(mn, 8));
    }
};

constexpr C16 kFour = c8(4);
LB_AVX_INLINE int q3_scale(const uint8_t *sc, int v) {
    const int low = v < 8 ? (sc[v] & 0x0F) : (sc[v - 8] >> 4);
    const int high = (sc[8 + v % 4] >> (2 * (v / 4))) & 3;
    return (low | (high << 4)) - 32;
}
struct FQ3_K {  // hmask[32], qs[64], scales[12], d; u = q + 4 = low 2 bits + 4 * (hmask bit)
    static constexpr int kWB = 110, kD = 108, kDmin = 0, kOff = 4;
    static constexpr bool kMins = false;
    template <class Fn>
    static LB_AVX_INLINE void codes(const uint8_t *b, Fn fn) {
        two_bit_fields(b + 32, [&](__m128i c, int v) LB_AVX_LAMBDA {
            // the 3rd bit of weight 32g + l is bit g of hmask[l] (g = v / 2, l = 16 (v % 2) + lane)
            const __m128i bit = _mm_set1_epi8((char)(1u << (v / 2)));
            const __m128i set = _mm_cmpeq_epi8(_mm_and_si128(ld128(b + 16 * (v % 2)), bit), bit);
            fn(_mm_or_si128(c, _mm_and_si128(set, K(kFour))), q3_scale(b + 96, v), v);
        });
    }
    static LB_AVX_INLINE void scales16(const uint8_t *b, __m128i &s0, __m128i &s1) {
        int16_t s[16];
        for (int v = 0; v < 16; ++v) s[v] = (int16_t)q3_scale(b + 96, v);
        bytes_to_16(s, s0, s1);
    }
    static LB_AVX_INLINE void mins16(const uint8_t *, __m128i &, __m128i &) {}
};

// Q4_K / Q5_K 6-bit scales and mins of sub-block s (csrc/ref/kquants.cpp's scale_min_k4).
LB_AVX_INLINE int k4_scale(const uint8_t *sc, int s) {
    return s < 4 ? (sc[s] & 63) : ((sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4));
}
LB_AVX_INLINE void k4_mins(const uint8_t *sc, __m128i &m0, __m128i &m1) {
    int16_t mn[16];
    for (int s = 0; s < 8; ++s)
        mn[2 * s] = mn[2 * s + 1] = (int16_t)(s < 4 ? (sc[s + 4] & 63) : ((sc[s + 4] >> 4) | ((sc[s] >> 6) << 4)));
    bytes_to_16(mn, m0, m1);
}
// nibbles: qs[32k + 16j + i] low = weight 64k + 16j + i (vector 4k + j), high = 64k + 32 + 16j + i (4k + 2 + j).
template <class Fn>
LB_AVX_INLINE void nibble_fields(const uint8_t *qs, Fn fn) {
    for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 2; ++j) {
            const __m128i x = ld128(qs + 32 * k + 16 * j);
            fn(_mm_and_si128(x, K(kM4)), 4 * k + j);
            fn(_mm_and_si128(_mm_srli_epi16(x, 4), K(kM4)), 4 * k + 2 + j);
        }
}
struct FQ4_K {  // d, dmin, scales[12], qs[128]
    static constexpr int kWB = 144, kD = 0, kDmin = 2, kOff = 0;
    static constexpr bool kMins = true;
    template <class Fn>
    static LB_AVX_INLINE void codes(const uint8_t *b, Fn fn) {
        nibble_fields(b + 16, [&](__m128i u, int v) LB_AVX_LAMBDA { fn(u, k4_scale(b + 4, v / 2), v); });
    }
    static LB_AVX_INLINE void scales16(const uint8_t *, __m128i &, __m128i &) {}
    static LB_AVX_INLINE void mins16(const uint8_t *b, __m128i &m0, __m128i &m1) { k4_mins(b + 4, m0, m1); }
};
struct FQ5_K {  // d, dmin, scales[12], qh[32], qs[128]; the 5th bit of weight 32s + l is bit s of qh[l]
    static constexpr int kWB = 176, kD = 0, kDmin = 2, kOff = 0;
    static constexpr bool kMins = true;
    template <class Fn>
    static LB_AVX_INLINE void codes(const uint8_t *b, Fn fn) {
        nibble_fields(b + 48, [&](__m128i c, int v) LB_AVX_LAMBDA {
            const __m128i bit = _mm_set1_epi8((char)(1u << (v / 2)));
            const __m128i set = _mm_cmpeq_epi8(_mm_and_si128(ld128(b + 16 + 16 * (v % 2)), bit), bit);
            fn(_mm_or_si128(c, _mm_and_si128(set, K(kB16))), k4_scale(b + 4, v / 2), v);
        });
    }
    static LB_AVX_INLINE void scales16(const uint8_t *, __m128i &, __m128i &) {}
    static LB_AVX_INLINE void mins16(const uint8_t *b, __m128i &m0, __m128i &m1) { k4_mins(b + 4, m0, m1); }
};
struct FQ6_K {  // ql[128], qh[64], scales[16] (int8), d; u = 6-bit code (q + 32)
    static constexpr int kWB = 210, kD = 208, kDmin = 0, kOff = 32;
    static constexpr bool kMins = false;
    // half h, part j: weights 128h + 32g + 16j + i (vector 8h + 2g + j), csrc/arm/kquants.inl's table
    template <class Fn>
    static LB_AVX_INLINE void codes(const uint8_t *b, Fn fn) {
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 2; ++j) {
                const __m128i l0 = ld128(b + 64 * h + 16 * j), l1 = ld128(b + 64 * h + 32 + 16 * j);
                const __m128i hb = ld128(b + 128 + 32 * h + 16 * j);
                auto hi2 = [&](int sh) LB_AVX_LAMBDA {  // bits sh+1:sh of hb, moved to 5:4
                    return _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hb, sh), K(kM3)), 4);
                };
                fn(_mm_or_si128(_mm_and_si128(l0, K(kM4)), hi2(0)), sc[8 * h + j], 8 * h + j);
                fn(_mm_or_si128(_mm_and_si128(l1, K(kM4)), hi2(2)), sc[8 * h + 2 + j], 8 * h + 2 + j);
                fn(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(l0, 4), K(kM4)), hi2(4)), sc[8 * h + 4 + j], 8 * h + 4 + j);
                fn(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(l1, 4), K(kM4)), hi2(6)), sc[8 * h + 6 + j], 8 * h + 6 + j);
            }
    }
    static LB_AVX_INLINE void scales16(const uint8_t *b, __m128i &s0, __m128i &s1) {
        const __m128i s = ld128(b + 192);
        s0 = _mm_cvtepi8_epi16(s);
        s1 = _mm_cvtepi8_epi16(_mm_srli_si128(s, 8));
    }
    static LB_AVX_INLINE void mins16(const uint8_t *, __m128i &, __m128i &) {}
};

}  // namespace

void register_kquants(KernelTable &t) {
    set_rows<KQuant<FQ2_K>>(t, T_Q2_K, "rows_q2_k_q8_k_avx");
    set_rows<KQuant<FQ3_K>>(t, T_Q3_K, "rows_q3_k_q8_k_avx");
    set_rows<KQuant<FQ4_K>>(t, T_Q4_K, "rows_q4_k_q8_k_avx");
    set_rows<KQuant<FQ5_K>>(t, T_Q5_K, "rows_q5_k_q8_k_avx");
    set_rows<KQuant<FQ6_K>>(t, T_Q6_K, "rows_q6_k_q8_k_avx");
}

}  // namespace avx
}  // namespace lowbit
