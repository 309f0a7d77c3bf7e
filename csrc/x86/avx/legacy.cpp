// Legacy-format row kernels at the avx level: Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 x Q8_0 and Q4_1,
// Q5_1 x Q8_1. Layouts: csrc/ref/legacy.cpp; design and arithmetic: avx.h (bitwise the reference).
//
// Decoded block: the 32 codes as two __m128i (lo = weights 0..15, hi = 16..31). The 4/5-bit
// codes stay unsigned (0..15 / 0..31) for maddubs, whose other operand is the signed activation;
// the _0 formats' offset comes back as off * sum(q_a), so per token
//   isum = sum u * q_a - off * sum q_a                     (Q4_0: off 8, Q5_0: 16; exact int32)
// Q8_0 and IQ4_NL codes span all of int8 and are widened to int16 instead (dot_s8s8).
// MXFP4 (csrc/ref/mxfp4.cpp: byte 0 the e8m0 exponent e, then IQ4_NL's 16 bytes of nibbles) looks
// its nibbles up (pshufb) in the e2m1 code book doubled and offset by 12 (values -12..12 as
// unsigned 0..24), so it takes the maddubs path with off 12; d_w = 2^(e - 128), bit for bit
// ref::e8m0_half, and the float step is the _0 formats'.
// Float step: _0: acc += (d_w * d_a) * (float)isum;  _1: acc += (d_w * d_a) * (float)isum + m_w * s_a.
#include "avx.h"
#include "../../ref/iq_tables.h"
#include "../../ref/ref.h"

namespace lowbit {
namespace avx {
namespace {

struct Dec { __m128i lo, hi; float d, m; };

LB_AVX_INLINE void nibbles(const uint8_t *p, __m128i &lo, __m128i &hi) {
    const __m128i x = ld128(p);
    lo = _mm_and_si128(x, K(kM4));
    hi = _mm_and_si128(_mm_srli_epi16(x, 4), K(kM4));
}
// Q5: bit j of the little-endian qh word is weight j's 5th bit: 0x10 where set. Byte j of each
// half takes the qh byte holding its bit (kSel: bytes 0, 1; kSel2: bytes 2, 3), kBits its bit.
constexpr C16 kBits = {{1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128}};
constexpr C16 kSel = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}};
constexpr C16 kSel2 = {{2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
LB_AVX_INLINE void fifth_bits(const uint8_t *qh, __m128i &lo, __m128i &hi) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    const __m128i bits = K(kBits), sel = K(kSel);
    const __m128i v = _mm_cvtsi32_si128((int)h);
    const __m128i blo = _mm_shuffle_epi8(v, sel), bhi = _mm_shuffle_epi8(v, K(kSel2));
    const __m128i b16 = K(kB16);
    lo = _mm_or_si128(lo, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(blo, bits), bits), b16));
    hi = _mm_or_si128(hi, _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(bhi, bits), bits), b16));
}

// kKind: 0 unsigned codes with offset kOff (maddubs), 1 signed int8 codes (widened).
struct FQ4_0 {
    static constexpr int kQK = QK, kWB = 18, kAB = 34, kOff = 8, kKind = 0;
    static constexpr bool kM = false;
    static LB_AVX_INLINE void decode(const uint8_t *b, Dec &d) { nibbles(b + 2, d.lo, d.hi); d.d = f16(b); }
};
struct FQ4_1 {
    static constexpr int kQK = QK, kWB = 20, kAB = 36, kOff = 0, kKind = 0;
    static constexpr bool kM = true;
    static LB_AVX_INLINE void decode(const uint8_t *b, Dec &d) {
        nibbles(b + 4, d.lo, d.hi);
        d.d = f16(b);
        d.m = f16(b + 2);
    }
};
struct FQ5_0 {
    static constexpr int kQK = QK, kWB = 22, kAB = 34, kOff = 16, kKind = 0;
    static constexpr bool kM = false;
    static LB_AVX_INLINE void decode(const uint8_t *b, Dec &d) {
        nibbles(b + 6, d.lo, d.hi);
        fifth_bits(b + 2, d.lo, d.hi);
        d.d = f16(b);
    }
};
struct FQ5_1 {
    static constexpr int kQK = QK, kWB = 24, kAB = 36, kOff = 0, kKind = 0;
    static constexpr bool kM = true;
    static LB_AVX_INLINE void decode(const uint8_t *b, Dec &d) {
        nibbles(b + 8, d.lo, d.hi);
        fifth_bits(b + 4, d.lo, d.hi);
        d.d = f16(b);
        d.m = f16(b + 2);
    }
};
struct FQ8_0 {
    static constexpr int kQK = QK, kWB = 34, kAB = 34, kOff = 0, kKind = 1;
    static constexpr bool kM = false;
    static LB_AVX_INLINE void decode(const uint8_t *b, Dec &d) {
        d.lo = ld128(b + 2);
        d.hi = ld128(b + 18);
        d.d = f16(b);
    }
};
constexpr C16 kLut = {{(uint8_t)iq::kvalues_iq4nl[0], (uint8_t)iq::kvalues_iq4nl[1], (uint8_t)iq::kvalues_iq4nl[2],
                       (uint8_t)iq::kvalues_iq4nl[3], (uint8_t)iq::kvalues_iq4nl[4], (uint8_t)iq::kvalues_iq4nl[5],
                       (uint8_t)iq::kvalues_iq4nl[6], (uint8_t)iq::kvalues_iq4nl[7], (uint8_t)iq::kvalues_iq4nl[8],
                       (uint8_t)iq::kvalues_iq4nl[9], (uint8_t)iq::kvalues_iq4nl[10], (uint8_t)iq::kvalues_iq4nl[11],
                       (uint8_t)iq::kvalues_iq4nl[12], (uint8_t)iq::kvalues_iq4nl[13], (uint8_t)iq::kvalues_iq4nl[14],
                       (uint8_t)iq::kvalues_iq4nl[15]}};
struct FIQ4_NL {
    static constexpr int kQK = QK, kWB = 18, kAB = 34, kOff = 0, kKind = 1;
    static constexpr bool kM = false;
    static LB_AVX_INLINE void decode(const uint8_t *b, Dec &d) {
        const __m128i lut = K(kLut);
        nibbles(b + 2, d.lo, d.hi);
        d.lo = _mm_shuffle_epi8(lut, d.lo);
        d.hi = _mm_shuffle_epi8(lut, d.hi);
        d.d = f16(b);
    }
};

// ref::kvalues_mxfp4 + 12 (e2m1 values doubled, offset to 0..24)
constexpr C16 kMxfp4Lut = {{12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0}};
struct FMXFP4 {
    static constexpr int kQK = QK, kWB = 17, kAB = 34, kOff = 12, kKind = 0;
    static constexpr bool kM = false;
    static LB_AVX_INLINE void decode(const uint8_t *b, Dec &d) {
        const __m128i lut = K(kMxfp4Lut);
        nibbles(b + 1, d.lo, d.hi);
        d.lo = _mm_shuffle_epi8(lut, d.lo);
        d.hi = _mm_shuffle_epi8(lut, d.hi);
        d.d = ref::e8m0_half(b[0]);
    }
};

template <class F>
struct Legacy {
    static constexpr int kQK = F::kQK, kWB = F::kWB, kAB = F::kAB;
    template <int C>
    static LB_AVX_INLINE __m128 step(const Dec &d, const uint8_t *ab, size_t st, __m128 acc) {
        constexpr int kQs = F::kAB - 32;  // Q8_0: d, qs; Q8_1: d, s, qs
        const __m128i isum = per_token<C>(ab, st, [&](const uint8_t *at) LB_AVX_LAMBDA {
            const __m128i a0 = ld128(at + kQs), a1 = ld128(at + kQs + 16);
            if constexpr (F::kKind == 1) return dot_s8s8(dot_s8s8(_mm_setzero_si128(), d.lo, a0), d.hi, a1);
            // int16 lanes: two maddubs pairs (u <= 31: |.| <= 2 * 2 * 31 * 128 = 15872), minus
            // off * the same pairs of q_a (|.| <= 2 * 2 * 16 * 128 = 8192): never saturates
            // (MXFP4: u <= 24, off 12: 12288 and 6144)
            __m128i p = _mm_add_epi16(_mm_maddubs_epi16(d.lo, a0), _mm_maddubs_epi16(d.hi, a1));
            if constexpr (F::kOff != 0) {  // - off * sum(q_a)
                static constexpr C16 kK = c8((uint8_t)F::kOff);
                p = _mm_sub_epi16(p, _mm_add_epi16(_mm_maddubs_epi16(K(kK), a0), _mm_maddubs_epi16(K(kK), a1)));
            }
            return _mm_madd_epi16(p, K(kOnes16));
        });
        const __m128 da = f16_lanes<C>(ab, st, 0);
        const __m128 t = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(d.d), da), _mm_cvtepi32_ps(isum));
        if constexpr (F::kM) {
            const __m128 sa = f16_lanes<C>(ab, st, 2);
            return _mm_add_ps(acc, _mm_add_ps(t, _mm_mul_ps(_mm_set1_ps(d.m), sa)));
        } else {
            return _mm_add_ps(acc, t);
        }
    }
    template <int NT>
    static LB_AVX_INLINE void block(const uint8_t *wb, const uint8_t *ab, size_t st, __m128 &acc0, __m128 &acc1) {
        Dec d;
        F::decode(wb, d);
        acc0 = step<(NT < 4 ? NT : 4)>(d, ab, st, acc0);
        if constexpr (NT > 4) acc1 = step<NT - 4>(d, ab + 4 * st, st, acc1);
    }
};

}  // namespace

void register_legacy(KernelTable &t) {
    set_rows<Legacy<FQ4_0>>(t, T_Q4_0, "rows_q4_0_q8_0_avx");
    set_rows<Legacy<FQ4_1>>(t, T_Q4_1, "rows_q4_1_q8_1_avx");
    set_rows<Legacy<FQ5_0>>(t, T_Q5_0, "rows_q5_0_q8_0_avx");
    set_rows<Legacy<FQ5_1>>(t, T_Q5_1, "rows_q5_1_q8_1_avx");
    set_rows<Legacy<FQ8_0>>(t, T_Q8_0, "rows_q8_0_q8_0_avx");
    set_rows<Legacy<FIQ4_NL>>(t, T_IQ4_NL, "rows_iq4_nl_q8_0_avx");
    set_rows<Legacy<FMXFP4>>(t, T_MXFP4, "rows_mxfp4_q8_0_avx");
}

}  // namespace avx
}  // namespace lowbit
