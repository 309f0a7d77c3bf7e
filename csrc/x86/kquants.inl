// k-quant rows (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) against Q8_K activations. Shared body of
// csrc/x86/{avx2,avx2vnni,avx512}/kquants.cpp; the including file defines LOWBIT_ISA
// (ISA_AVX2, ISA_AVX2VNNI or ISA_AVX512) and LOWBIT_NS (the level's namespace) and is built
// with that level's flags only. Layouts: csrc/formats.h and csrc/ref/kquants.cpp (the spec).
//
// Contract (csrc/kernels.h, DESIGN.md): out[t * out_stride + r] = dot(W[r], act[t]) for r in
// [r0, r1), t < nt; W[r] is n / 256 raw super-blocks, act[t] is n / 256 block_q8_K
// (float d, int8 qs[256], int16 bsums[16]); n is a multiple of 256.
//
// Integer part, per super-block b and token (exact int32, I1; any grouping of the additions
// gives the same value, so the way it is formed may change with nt):
//   I = sum over sub-blocks s of sc[s] * (sum over s of q_w * q_a)       (q_w the signed code)
//   M = sum over the 16 bsums j of bsums[j] * mn[sub-block of j]        (Q2_K, Q4_K, Q5_K)
// Codes are decoded to UNSIGNED bytes u (Q3_K: u = q + 4, Q6_K: u = q + 32, the others are
// unsigned already); maddubs(u, q_a) gives int16 pairs (u <= 63, |q_a| <= 128:
// |pair| <= 2 * 63 * 128 = 16128 < 32767, never saturates); madd with the sub-block's scale
// broadcast to int16 widens to int32 (dpwssd with VNNI: the same madd fused with the add).
// The code offset c comes back through the bsums:
//   sum sc * (u - c) * q_a = sum sc * u * q_a - sum_j (c * sc[j]) * bsums[j]   (c = 4 or 32)
// (madd of the bsums with c * sc as int16: |c * sc| <= 4096). Largest partial: Q6_K's
// sum sc * u * q_a <= 256 * 63 * 128 * 128 < 2^29. Q2_K with VNNI and 2+ tokens decodes
// w = code * sc (<= 45, one byte) and takes one dpbusd per chunk and token (DecQ2K).
//
// Float part, the same for every nt and every row split (I2, I3); dI = fp16(d) * d_a and
// dM = fp16(dmin) * d_a are one rounding each:
//   every level (GROUPS): per token one float acc = 0; per super-block
//       acc = fma(dI, (float)I, acc);  acc = fnmadd(dM, (float)M, acc)    (= acc - dM * M)
//     result = acc. The int32 lanes of I and M are summed to scalars by hadd trees over 4
//     tokens at once (avx512 first folds its 16 lanes to 8, exactly); acc is lane t (= token
//     t) of one vector per window. One token: two super-blocks share one hadd tree.
//   (Q3_K, Q6_K: no M term.) The scalar reference rounds dI * I - dmin * d_a * M per block
//   instead; the difference is float rounding only (I5).
// Why one scheme at every level: a k-quant's result is then bitwise the same at avx2,
// avx2vnni and avx512, and the GEMM tier (csrc/x86/gemm.inl), whose microkernel
// holds tokens in lanes, reproduces it exactly (I8): per (row, token, super-block) one exact
// I and M, then the same two float steps in super-block order. (avx512 had kept 8-16 float
// lanes per token instead, one convert + fma per super-block; with the paired hadd tree for
// one token GROUPS measured the same speed within noise on Zen 4: BENCHMARKS.md, issue 18.)
//
// Work per super-block: scales, mins and codes are decoded once per window (chunk j: 32 codes
// in a ymm, 64 in a zmm, decoded right before the tokens use them); each token then costs one
// maddubs + one madd/dpwssd (+ add) per chunk against its own q_a, one madd for its bsums
// term and its share of the float part. Per-token int32 accumulators are named registers
// i0..i7 (I7). Large windows use every register, so their constants and multiply-used
// weight bytes are loaded at each use (OPQ) instead of being held across the chunks, and
// GCC's loop-invariant motion is off for them (rows_hi).
// GCC 12's avx512 intrinsics (broadcasts, 256-to-512 casts) build their results from an
// uninitialized vector and trip -Wmaybe-uninitialized in every caller: silenced for this
// file only (push here, pop at its end).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "../kernels.h"
#include "prefetch.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including kquants.inl"
#endif


namespace lowbit {
namespace LOWBIT_NS {
namespace {

#define LB_KQ_INLINE inline __attribute__((always_inline))
#define LB_KQ_INLINE_LAMBDA __attribute__((always_inline))

// LOWBIT_ISA is an enum (invisible to the preprocessor): the width follows the flags, and the
// static_asserts tie the two together.
#if defined(__AVX512F__)
#define LB_KQ_512 1
static_assert(LOWBIT_ISA == ISA_AVX512, "512-bit body built for a 256-bit level");
#else
#define LB_KQ_512 0
static_assert(LOWBIT_ISA == ISA_AVX2 || LOWBIT_ISA == ISA_AVX2VNNI, "256-bit body built for avx512");
#endif
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define LB_KQ_VNNI 1
#else
#define LB_KQ_VNNI 0
#endif

constexpr int QBLK = 292;   // bytes of one block_q8_K: float d, int8 qs[256], int16 bsums[16]
constexpr int QOFF_QS = 4;
constexpr int QOFF_BS = 260;
static_assert(sizeof(block_q8_K) == QBLK, "q8_K layout");

// ---- level primitives -----------------------------------------------------------------------
#if LB_KQ_512
using vi = __m512i;
constexpr int W = 64;  // code bytes per chunk
LB_KQ_INLINE vi vzero() { return _mm512_setzero_si512(); }
LB_KQ_INLINE vi vload(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
LB_KQ_INLINE vi vand(vi a, vi b) { return _mm512_and_si512(a, b); }
LB_KQ_INLINE vi vor(vi a, vi b) { return _mm512_or_si512(a, b); }
LB_KQ_INLINE vi vsrl16(vi a, int k) { return _mm512_srli_epi16(a, (unsigned)k); }
// 32 bytes at p in both 256-bit halves (a pure load, no shuffle uop)
LB_KQ_INLINE vi vbcast32(const uint8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }
// per 256-bit half: shift the 64-bit lanes of the low half by a, of the high half by b
LB_KQ_INLINE vi vsrl64_halves(vi x, int a, int b) {
    return _mm512_srlv_epi64(x, _mm512_setr_epi64(a, a, a, a, b, b, b, b));
}
LB_KQ_INLINE vi vsll64_halves(vi x, int a, int b) {
    return _mm512_sllv_epi64(x, _mm512_setr_epi64(a, a, a, a, b, b, b, b));
}
#else
using vi = __m256i;
constexpr int W = 32;
LB_KQ_INLINE vi vzero() { return _mm256_setzero_si256(); }
LB_KQ_INLINE vi vload(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
LB_KQ_INLINE vi vand(vi a, vi b) { return _mm256_and_si256(a, b); }
LB_KQ_INLINE vi vor(vi a, vi b) { return _mm256_or_si256(a, b); }
LB_KQ_INLINE vi vsrl16(vi a, int k) { return _mm256_srli_epi16(a, k); }
#endif
constexpr int NJ = QK_K / W;  // chunks per super-block
#if LB_KQ_512
LB_KQ_INLINE vi vsplat8(int v) { return _mm512_set1_epi8((char)v); }
#else
LB_KQ_INLINE vi vsplat8(int v) { return _mm256_set1_epi8((char)v); }
#endif

// A pointer GCC cannot see through: a load from it is a real load, done where it is written
// (no CSE with an earlier load, no hoisting, no constant folding).
LB_KQ_INLINE const uint8_t *opaque(const uint8_t *p) {
    __asm__ volatile("" : "+r"(p));  // (volatile: two identical asms are not merged)
    return p;
}
// opaque() under clang only, for constants GCC already reads in place (a memory operand of
// their user) and clang hoists into registers (I7); through opaque() GCC would give up the
// folded load (Q3_K, Q6_K measured 3-6% slower).
LB_KQ_INLINE const uint8_t *clang_opaque(const uint8_t *p) {
#if defined(__clang__)
    return opaque(p);
#else
    return p;
#endif
}
// Byte B in every lane, as a load from .rodata (usually the memory operand of its user).
// Left to GCC, such constants are built in registers (movabs + vpbroadcastq) and held there
// across the chunk loop, where the per-token accumulators need every register (I7).
template <int B>
struct RepBytes {
    alignas(64) uint8_t v[64];
    constexpr RepBytes() : v{} {
        for (int i = 0; i < 64; ++i) v[i] = (uint8_t)B;
    }
};
template <int B>
inline constexpr RepBytes<B> kRep{};
// Q2_K's product-table multiplier 0x03020100 in every dword, from .rodata (see kRep)
struct RepMul {
    alignas(64) uint8_t v[64];
    constexpr RepMul() : v{} {
        for (int i = 0; i < 64; ++i) v[i] = (uint8_t)(i % 4);
    }
};
inline constexpr RepMul kMul0123{};
// The byte masks of the decoders. OPQ (large windows, where registers are short: 5+ tokens,
// fewer for the heavier decoders, see each): each use is a load through an opaque pointer
// (usually the memory operand of its user); otherwise built once per call, before the row
// loop, and kept in registers.
template <bool OPQ_>
struct Masks {
    static constexpr bool OPQ = OPQ_;
    vi k03, k04, k0F, k10, k20, k30;
    LB_KQ_INLINE Masks() {
        if constexpr (!OPQ) {
            k03 = vsplat8(3), k04 = vsplat8(4), k0F = vsplat8(0x0F), k10 = vsplat8(0x10), k20 = vsplat8(0x20);
            k30 = vsplat8(0x30);
        }
    }
    // (the 128-bit uses, in the once-per-block scale decoders, always load: the registers
    // are better spent on the per-chunk masks and shuffle indices)
    template <int B>
    LB_KQ_INLINE __m128i get128() const { return _mm_loadu_si128((const __m128i *)opaque(kRep<B>.v)); }
    template <int B>
    LB_KQ_INLINE vi get() const {
        if constexpr (OPQ) return vload(opaque(kRep<B>.v));
        else if constexpr (B == 3) return k03;
        else if constexpr (B == 4) return k04;
        else if constexpr (B == 0x0F) return k0F;
        else if constexpr (B == 0x10) return k10;
        else if constexpr (B == 0x20) return k20;
        else { static_assert(B == 0x30, "mask"); return k30; }
    }
};
// A weight vector the codes of several chunks use: under OPQ reloaded for each (a load is
// cheaper than the register it would hold across the chunks), otherwise loaded once.
template <bool OPQ>
LB_KQ_INLINE vi reload(const uint8_t *p) { return vload(OPQ ? opaque(p) : p); }

// acc + sum over int16 pairs of (u * y pair sums) * s: exact in int32 (header). With VNNI,
// dpwssd fuses the madd and the add (5-cycle latency: with few tokens in flight, a token's
// chunks alternate between NACC accumulators, summed at the end of the super-block; exact,
// so the split changes no result). Without VNNI: madd, then add.
// (avx2vnni with 2 or 3 tokens: no registers for split accumulators; madd + add.)
template <int NT, bool PRE>
constexpr int nacc() {
#if LB_KQ_512
    return NT >= 4 ? 1 : 2;
#elif LB_KQ_VNNI
    return NT >= 4 ? 1 : NT == 1 ? 4 : PRE ? 2 : 1;
#else
    return 1;
#endif
}
// acc + sum of w * y in groups of 4 (u8 w, s8 y: exact), for PRESCALED codes
LB_KQ_INLINE vi dot_pre(vi acc, vi w, vi y) {
#if LB_KQ_512
    return _mm512_dpbusd_epi32(acc, w, y);
#elif LB_KQ_VNNI
    return _mm256_dpbusd_avx_epi32(acc, w, y);
#else
    (void)w, (void)y;
    return acc;  // (never used: PRESCALED needs VNNI)
#endif
}
template <int NT>
LB_KQ_INLINE vi dot_acc(vi acc, vi u, vi y, vi s) {
#if LB_KQ_512
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, y), s);
#else
#if LB_KQ_VNNI
    if constexpr (NT == 1 || NT >= 4) return _mm256_dpwssd_avx_epi32(acc, _mm256_maddubs_epi16(u, y), s);
#endif
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), s));
#endif
}
LB_KQ_INLINE vi vadd32(vi a, vi b) {
#if LB_KQ_512
    return _mm512_add_epi32(a, b);
#else
    return _mm256_add_epi32(a, b);
#endif
}

LB_KQ_INLINE uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// [d, dmin, 0, 0] from two adjacent fp16 (one vcvtph2ps; exact), or [d, 0, 0, 0]
LB_KQ_INLINE __m128 f16x2(const uint8_t *p) { return _mm_cvtph_ps(_mm_cvtsi32_si128((int)rd32(p))); }
LB_KQ_INLINE __m128 f16x1(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(h));
}

// Constant patterns, built from literals so that GCC emits them as .rodata constants (built
// from intrinsics, they are computed once and kept on the stack).
constexpr long long rep8(int byte) { return (long long)(0x0101010101010101ull * (unsigned)byte); }
// int16 value w in every word of a 64-bit lane (vpermw indices)
constexpr long long rep8w(int w) { return (long long)(0x0001000100010001ull * (unsigned)w); }
// pshufb index selecting int16 word w in every word of a 64-bit lane
constexpr long long rep16(int w) { return (long long)(0x0001000100010001ull * (unsigned)((2 * w) | ((2 * w + 1) << 8))); }
#if LB_KQ_512
// bit a set in every byte of the low 256 bits, bit b in the high 256 bits
LB_KQ_INLINE __m512i bit_halves(int a, int b) {
    const long long x = rep8(1 << a), y = rep8(1 << b);
    return _mm512_setr_epi64(x, x, x, x, y, y, y, y);
}
#endif

// ---- scale vectors --------------------------------------------------------------------------

// One scale per 32 codes (Q4_K, Q5_K): 8 scales 0..63. Chunk j's vector holds sub-block j's
// scale in every int16 (avx2); on avx512 chunk c = sub-blocks 2c (low 256 bits), 2c + 1 (high).
struct Scales32 {
#if LB_KQ_512
    __m512i s;  // int16 sc[0..7] in every 128-bit lane
    LB_KQ_INLINE void set(__m128i sc16) { s = _mm512_broadcast_i32x4(sc16); }
    template <int C, class KM>
    LB_KQ_INLINE vi get(const KM &) const {
        constexpr long long lo = rep16(2 * C), hi = rep16(2 * C + 1);
        return _mm512_shuffle_epi8(s, _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi));
    }
#else
    __m256i s;  // int16 sc[0..7] in both 128-bit lanes
    LB_KQ_INLINE void set(__m128i sc16) { s = _mm256_broadcastsi128_si256(sc16); }
    template <int J, class KM>
    LB_KQ_INLINE vi get(const KM &) const {
        constexpr long long w = rep16(J);
        return _mm256_shuffle_epi8(s, _mm256_setr_epi64x(w, w, w, w));
    }
#endif
};

// Q3_K's 16 scales (6 bits, minus 32) from its 12 bytes b:
//   low  = b[s] & 15 (s < 8), b[s - 8] >> 4 (s >= 8);  high = b[8 + s % 4] >> 2 * (s / 4) & 3
template <class KM>
LB_KQ_INLINE __m128i scales_q3k(const uint8_t *q, const KM &km) {
    __m128i b = _mm_loadl_epi64((const __m128i *)q);
    b = _mm_insert_epi32(b, (int)rd32(q + 8), 2);  // (no 16-byte load: the block ends 2 bytes later)
    const __m128i low = _mm_and_si128(_mm_unpacklo_epi64(b, _mm_srli_epi16(b, 4)), km.template get128<0x0F>());
    alignas(16) static constexpr int32_t kShifts[4] = {0, 2, 4, 6};  // (clang: a load, see clang_opaque)
    const __m128i hi4 = _mm_srlv_epi32(_mm_shuffle_epi32(b, 0xAA),
                                       _mm_load_si128((const __m128i *)clang_opaque((const uint8_t *)kShifts)));
    const __m128i high = _mm_slli_epi16(_mm_and_si128(hi4, km.template get128<3>()), 4);
    return _mm_sub_epi8(_mm_or_si128(low, high), km.template get128<0x20>());
}

// One scale per 16 codes (Q2_K, Q3_K, Q6_K): 16 int8 scales. A 32-code chunk j spans
// sub-blocks 2j (low 128 bits) and 2j + 1 (high); a 64-code chunk c spans 4c .. 4c + 3, one
// per 128-bit lane. The scale bytes come from memory as they are (SRC_MEM, Q6_K), from memory
// masked to their low nibble (SRC_NIB, Q2_K) or decoded from Q3_K's 12 bytes (SRC_Q3K).
// Nothing but the source pointer stays live across chunks (the avx2 vector is rebuilt at
// j = 0, 4; for Q3_K the second decode is CSE'd away unless KM::OPQ hides it).
enum { SRC_MEM, SRC_NIB, SRC_Q3K };
#if !LB_KQ_512
// avx2 pshufb indices of Scales16::get<J>: int16 word 2J % 8 in the low 128 bits, 2J + 1 in the high
struct Scale16Idx {
    alignas(32) uint8_t v[4][32];
    constexpr Scale16Idx() : v{} {
        for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 32; ++i) v[j][i] = (uint8_t)(2 * ((2 * j + i / 16) % 8) + i % 2);
    }
};
inline constexpr Scale16Idx kScale16Idx{};
#endif
template <int SRC, class KM>
struct Scales16 {
    const uint8_t *p;  // the 16 scale bytes (SRC_Q3K: the 12)
    LB_KQ_INLINE void set(const uint8_t *sc) { p = sc; }
#if LB_KQ_512
    __m256i s16;  // int16 sc[0..15], built at chunk 0
    template <int C>
    LB_KQ_INLINE vi get(const KM &km) {
        if constexpr (C == 0) {
            __m128i b;
            if constexpr (SRC == SRC_Q3K) b = scales_q3k(p, km);
            else b = _mm_loadu_si128((const __m128i *)p);
            if constexpr (SRC == SRC_NIB) b = _mm_and_si128(b, km.template get128<0x0F>());
            s16 = _mm256_cvtepi8_epi16(b);
        }
        // vpermw: 128-bit lane L of the result = sc[4C + L] in every int16
        const __m512i idx = _mm512_setr_epi64(rep8w(4 * C), rep8w(4 * C), rep8w(4 * C + 1), rep8w(4 * C + 1),
                                              rep8w(4 * C + 2), rep8w(4 * C + 2), rep8w(4 * C + 3), rep8w(4 * C + 3));
        return _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(s16));
    }
#else
    __m256i cur;  // int16 sc[8h .. 8h + 7] in both lanes, h = J / 4 (rebuilt at J = 0, 4)
    template <int J>
    LB_KQ_INLINE vi get(const KM &km) {
        if constexpr (J % 4 == 0) {
            __m128i b;  // scale bytes 8h .. 8h + 7, twice (movddup from memory is a pure load)
            if constexpr (SRC == SRC_Q3K) {
                const __m128i r = scales_q3k(KM::OPQ ? opaque(p) : p, km);
                b = J ? _mm_unpackhi_epi64(r, r) : _mm_unpacklo_epi64(r, r);
            }
            else b = _mm_castpd_si128(_mm_loaddup_pd((const double *)(p + 2 * J)));
            if constexpr (SRC == SRC_NIB) b = _mm_and_si128(b, km.template get128<0x0F>());
            cur = _mm256_cvtepi8_epi16(b);
        }
        // (under OPQ the index is read in place: clang holds the ones chunks J and J + 4 share)
        if constexpr (KM::OPQ)
            return _mm256_shuffle_epi8(cur, vload(clang_opaque(kScale16Idx.v[J % 4])));
        constexpr long long a = rep16((2 * J) % 8), b = rep16((2 * J + 1) % 8);
        return _mm256_shuffle_epi8(cur, _mm256_setr_epi64x(a, a, b, b));
    }
#endif
};

// ---- decoders: one super-block -> per chunk (unsigned codes, int16 scales) ------------------
// Each, for a window of NT tokens, has: BYTES; MINS (an M sum with dmin) or OFF (the code
// offset c, folded into I); OPQ and NO_LICM_FROM (register pressure, see Masks and rows_nt);
// PRESCALED (codes carry the scales, Q2_K); static dpair(x) = [d, dmin] and corr(x) = the
// int16 vector madd'ed with the token's bsums (the mins, or c * sc), read at the end of the
// super-block so that they hold no register while the chunks run; codes<J>() (unsigned
// bytes) and scales<J>() (int16, for madd/dpwssd) of chunk J < NJ.

// Q4_K / Q5_K mins (scale_min_k4), each twice: mn[j / 2] against bsums[j]
LB_KQ_INLINE __m256i mins_k4(const uint8_t *q) {
    const uint32_t u1 = rd32(q + 4), u2 = rd32(q + 8);
    const uint32_t mn_lo = u1 & 0x3f3f3f3fu;
    const uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
    const __m128i m8 = _mm_cvtsi64_si128((long long)(mn_lo | ((uint64_t)mn_hi << 32)));
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
}
// Q4_K / Q5_K scales (scale_min_k4) as int16 sc[0..7]
LB_KQ_INLINE __m128i scales_k4(const uint8_t *q) {
    const uint32_t u0 = rd32(q), u2 = rd32(q + 8);
    const uint32_t sc_lo = u0 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
    return _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)(sc_lo | ((uint64_t)sc_hi << 32))));
}

template <int NT>
struct DecQ4K {
    static constexpr int NO_LICM_FROM = 5;  // (rows_nt)
    static constexpr bool OPQ = NT >= 5;
    static constexpr int BYTES = 144;
    static constexpr bool MINS = true;
    static constexpr bool PRESCALED = false;
    static LB_KQ_INLINE __m128 dpair(const uint8_t *x) { return f16x2(x); }
    static LB_KQ_INLINE __m256i corr(const uint8_t *x, const Masks<OPQ> &) { return mins_k4(x + 4); }
    const Masks<OPQ> &km;
    const uint8_t *qs;
    Scales32 sc;
    LB_KQ_INLINE DecQ4K(const uint8_t *x, const Masks<OPQ> &m) : km(m), qs(x + 16) { sc.set(scales_k4(x + 4)); }
    // byte qs[32c + l]: weight 64c + l (low nibble), 64c + 32 + l (high nibble)
    template <int J>
    LB_KQ_INLINE vi codes() {
#if LB_KQ_512
        return vand(vsrl64_halves(vbcast32(qs + 32 * J), 0, 4), km.template get<0x0F>());
#else
        const vi x = vload(qs + 32 * (J / 2));
        return vand(J % 2 ? vsrl16(x, 4) : x, km.template get<0x0F>());
#endif
    }
    template <int J>
    LB_KQ_INLINE vi scales() { return sc.template get<J>(km); }
};

template <int NT>
struct DecQ5K {
    static constexpr int NO_LICM_FROM = 5;  // (rows_nt)
    static constexpr bool OPQ = NT >= 5;
    static constexpr int BYTES = 176;
    static constexpr bool MINS = true;
    static constexpr bool PRESCALED = false;
    static LB_KQ_INLINE __m128 dpair(const uint8_t *x) { return f16x2(x); }
    static LB_KQ_INLINE __m256i corr(const uint8_t *x, const Masks<OPQ> &) { return mins_k4(x + 4); }
    const Masks<OPQ> &km;
    const uint8_t *qh, *qs;
    Scales32 sc;
    LB_KQ_INLINE DecQ5K(const uint8_t *x, const Masks<OPQ> &m) : km(m), qh(x + 16), qs(x + 48) { sc.set(scales_k4(x + 4)); }
    // the low 4 bits as Q4_K; bit 4 of weight 32s + l is bit s of qh[l]
    template <int J>
    LB_KQ_INLINE vi codes() {
#if LB_KQ_512
        const vi lo = vand(vsrl64_halves(vbcast32(qs + 32 * J), 0, 4), km.template get<0x0F>());
        const __mmask64 k = _mm512_test_epi8_mask(vbcast32(qh), bit_halves(2 * J, 2 * J + 1));
        return _mm512_mask_add_epi8(lo, k, lo, km.template get<0x10>());
#else
        const vi x = vload(qs + 32 * (J / 2));
        const vi lo = vand(J % 2 ? vsrl16(x, 4) : x, km.template get<0x0F>());
        const vi h = reload<OPQ>(qh);
        const vi hb = J <= 4 ? _mm256_slli_epi16(h, 4 - J) : _mm256_srli_epi16(h, J - 4);
        return vor(lo, vand(hb, km.template get<0x10>()));
#endif
    }
    template <int J>
    LB_KQ_INLINE vi scales() { return sc.template get<J>(km); }
};

template <int NT>
struct DecQ6K {
    static constexpr int NO_LICM_FROM = 5;  // (rows_nt)
    static constexpr bool OPQ = NT >= 5;
    static constexpr int BYTES = 210;
    static constexpr bool MINS = false;
    static constexpr bool PRESCALED = false;
    static constexpr int OFF = 32;
    static LB_KQ_INLINE __m128 dpair(const uint8_t *x) { return f16x1(x + 208); }
    // int16 sc[j] * 32 against bsums[j]
    static LB_KQ_INLINE __m256i corr(const uint8_t *x, const Masks<OPQ> &) {
        return _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 192))), 5);
    }
    const Masks<OPQ> &km;
    const uint8_t *ql, *qh;
    Scales16<SRC_MEM, Masks<OPQ>> sc;
    LB_KQ_INLINE DecQ6K(const uint8_t *x, const Masks<OPQ> &m) : km(m), ql(x), qh(x + 128) { sc.set(x + 192); }
    // half h = J / 4 (128 weights; ql + 64h, qh + 32h), l = 0..31:
    //   chunk 4h+0: ql[l] & 15 | (qh[l] & 3) << 4        chunk 4h+1: ql[32+l] & 15 | (qh[l] >> 2 & 3) << 4
    //   chunk 4h+2: ql[l] >> 4 | (qh[l] >> 4 & 3) << 4   chunk 4h+3: ql[32+l] >> 4 | (qh[l] >> 6) << 4
    template <int J>
    LB_KQ_INLINE vi codes() {
#if LB_KQ_512
        // chunk c = (4h + 2p, 4h + 2p + 1): ql[64h .. 64h + 63] nibble p, qh bits in both halves
        constexpr int h = J / 2, p = J % 2;
        const vi l = vload(ql + 64 * h);
        const vi lo = vand(p ? vsrl16(l, 4) : l, km.template get<0x0F>());
        const vi hq = vbcast32(qh + 32 * h);
        const vi hb = p ? vsrl64_halves(hq, 0, 2) : vsll64_halves(hq, 4, 2);
        return vor(lo, vand(hb, km.template get<0x30>()));
#else
        constexpr int h = J / 4, k = J % 4;
        // (a load per chunk, through an opaque pointer: chunks k and k + 2 read the same ql
        // bytes, and clang otherwise keeps the first load for the later chunk and spills it)
        const vi l = vload(opaque(ql + 64 * h + 32 * (k % 2)));
        const vi lo = vand(k >= 2 ? vsrl16(l, 4) : l, km.template get<0x0F>());
        const vi hq = reload<OPQ>(qh + 32 * h);
        const vi hb = k == 0 ? _mm256_slli_epi16(hq, 4) : k == 1 ? _mm256_slli_epi16(hq, 2)
                    : k == 2 ? hq : _mm256_srli_epi16(hq, 2);
        return vor(lo, vand(hb, km.template get<0x30>()));
#endif
    }
    template <int J>
    LB_KQ_INLINE vi scales() { return sc.template get<J>(km); }
};

// Low 2 bits of Q2_K / Q3_K: byte qs[32h + l] holds weight 128h + 32k + l in bits 2k+1:2k.
// chunk J (avx2): h = J / 4, k = J % 4; chunk C (avx512) = 32-chunks 2C, 2C + 1.
template <int J, bool OPQ>
LB_KQ_INLINE vi low2(const uint8_t *qs, const Masks<OPQ> &km) {
#if LB_KQ_512
    constexpr int h = J / 2, k0 = 2 * (J % 2);
    return vand(vsrl64_halves(vbcast32(qs + 32 * h), 2 * k0, 2 * k0 + 2), km.template get<3>());
#else
    constexpr int h = J / 4, k = J % 4;
    const vi x = vload(qs + 32 * h);
    return vand(k ? vsrl16(x, 2 * k) : x, km.template get<3>());
#endif
}


template <int NT>
struct DecQ3K {
    static constexpr int NO_LICM_FROM = 3;  // (rows_nt; the heaviest decoder: OPQ from 3 tokens)
    static constexpr bool OPQ = NT >= 3;
    static constexpr int BYTES = 110;
    static constexpr bool MINS = false;
    static constexpr bool PRESCALED = false;
    static constexpr int OFF = 4;
    static LB_KQ_INLINE __m128 dpair(const uint8_t *x) { return f16x1(x + 108); }
    // int16 sc[j] * 4 against bsums[j]
    static LB_KQ_INLINE __m256i corr(const uint8_t *x, const Masks<OPQ> &km) {
        // (OPQ: decoded again, not kept from the chunk loop where registers are short)
        return _mm256_slli_epi16(_mm256_cvtepi8_epi16(scales_q3k(OPQ ? opaque(x + 96) : x + 96, km)), 2);
    }
    const Masks<OPQ> &km;
    const uint8_t *hm, *qs;
    Scales16<SRC_Q3K, Masks<OPQ>> sc;
    LB_KQ_INLINE DecQ3K(const uint8_t *x, const Masks<OPQ> &m) : km(m), hm(x), qs(x + 32) { sc.set(x + 96); }
    // u = low 2 bits | bit J of hmask[l] << 2  (u = q + 4)
    template <int J>
    LB_KQ_INLINE vi codes() {
        const vi lo = low2<J>(qs, km);
#if LB_KQ_512
        const __mmask64 k = _mm512_test_epi8_mask(vbcast32(hm), bit_halves(2 * J, 2 * J + 1));
        return _mm512_mask_add_epi8(lo, k, lo, km.template get<4>());
#else
        const vi h = reload<OPQ>(hm);
        const vi hb = J <= 2 ? _mm256_slli_epi16(h, 2 - J) : _mm256_srli_epi16(h, J - 2);
        return vor(lo, vand(hb, km.template get<4>()));
#endif
    }
    template <int J>
    LB_KQ_INLINE vi scales() { return sc.template get<J>(km); }
};

// Q2_K with VNNI (PRESCALED): code * scale <= 3 * 15 = 45 fits a byte, so the decoder hands
// out w = code * sc directly and each token needs one dpbusd per chunk (u8 w times s8 q_a,
// 4 products per int32 lane, exact) instead of maddubs + dpwssd. The product comes from a
// 16-byte vpshufb table per 128-bit lane (= one 16-weight sub-block): [0, sc, 2sc, 3sc].
template <int NT>
struct DecQ2K {
    static constexpr int NO_LICM_FROM = 5;  // (rows_nt)
    static constexpr bool PRESCALED = LB_KQ_VNNI && NT >= 2;  // (NT = 1: no gain)
    // (avx2vnni, 3 tokens: 2 accumulators each and the table leave no registers for masks)
    static constexpr bool OPQ = NT >= 5 || (PRESCALED && !LB_KQ_512 && NT >= 3);
    static constexpr int BYTES = 84;
    static constexpr bool MINS = true;
    static LB_KQ_INLINE __m128 dpair(const uint8_t *x) { return f16x2(x + 80); }
    // int16 mn[j] (high nibbles of scales[j]) against bsums[j]
    static LB_KQ_INLINE __m256i corr(const uint8_t *x, const Masks<OPQ> &km) {
        const __m128i b = _mm_loadu_si128((const __m128i *)x);
        return _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), km.template get128<0x0F>()));
    }
    const Masks<OPQ> &km;
    const uint8_t *qs, *sp;  // codes, the 16 scale bytes
    Scales16<SRC_NIB, Masks<OPQ>> sc;    // (not PRESCALED)
#if LB_KQ_512
    __m512i tab;  // PRESCALED: dword s = bytes [0, sc, 2sc, 3sc] of sub-block s
#else
    __m256i tab;  // the same for sub-blocks 8h .. 8h + 7, h = J / 4 (rebuilt at J = 0, 4)
#endif
    LB_KQ_INLINE DecQ2K(const uint8_t *x, const Masks<OPQ> &m) : km(m), qs(x + 16), sp(x) {
        if constexpr (!PRESCALED) sc.set(x);
    }
    template <int J>
    LB_KQ_INLINE vi codes() {
        const vi c = low2<J>(qs, km);
        if constexpr (!PRESCALED) {
            return c;
        } else {
#if LB_KQ_512
            if constexpr (J == 0) {
                const __m128i s8 = _mm_and_si128(_mm_loadu_si128((const __m128i *)sp), km.template get128<0x0F>());
                tab = _mm512_mullo_epi32(_mm512_cvtepu8_epi32(s8), vload(opaque(kMul0123.v)));
            }
            // 128-bit lane L: the table of sub-block 4J + L in its low dword
            const __m512i idx = _mm512_setr_epi32(4 * J, 0, 0, 0, 4 * J + 1, 0, 0, 0, 4 * J + 2, 0, 0, 0, 4 * J + 3, 0, 0, 0);
            return _mm512_shuffle_epi8(_mm512_permutexvar_epi32(idx, tab), c);
#else
            if constexpr (J % 4 == 0) {
                const __m128i s8 = _mm_and_si128(_mm_loadl_epi64((const __m128i *)(sp + 2 * J)), km.template get128<0x0F>());
                tab = _mm256_mullo_epi32(_mm256_cvtepu8_epi32(s8), vload(opaque(kMul0123.v)));
            }
            // lane 0: sub-block 2J, lane 1: 2J + 1 (within the 8 of tab)
            const __m256i idx = _mm256_setr_epi32((2 * J) % 8, 0, 0, 0, (2 * J + 1) % 8, 0, 0, 0);
            return _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(tab, idx), c);
#endif
        }
    }
    template <int J>
    LB_KQ_INLINE vi scales() {
        if constexpr (PRESCALED) return vzero();  // (unused: the codes carry the scales)
        else return sc.template get<J>(km);
    }
};

LB_KQ_INLINE float lda(const uint8_t *p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
}
LB_KQ_INLINE __m256i ld256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

// Integer adds are associative, so GCC regroups a token's chain of chunk sums into a tree
// (all products of a super-block live at once: spills). The empty asm pins a value in a
// register at that point of the program; it emits nothing.
#define LB_KQ_KEEP(x) __asm__("" : "+v"(x));

// ---- float part (header): GROUPS at every level ------------------------------------------
#if LB_KQ_512
// The int32 lanes of a super-block's I folded to 8: lane l + lane l + 8 (exact); GROUPS then
// sums 8 lanes per token as on avx2
LB_KQ_INLINE __m256i fold8(__m512i x) { return _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1)); }
#define LB_KQ_Y(x) fold8(x)
#else
#define LB_KQ_Y(x) (x)
#endif

// ---- horizontal sums (GROUPS): int32 lanes -> one exact sum per token -----------------------

// hadd(c, d), where K <= 2 says both are zero: then the zero itself (clang does not fold a
// hadd of zeros; it hoists the result out of the row loop and spills it, I7)
template <int K>
LB_KQ_INLINE __m256i hadd_cd(__m256i c, __m256i d) {
    return K <= 2 ? _mm256_setzero_si256() : _mm256_hadd_epi32(c, d);
}
// [sum a, sum b, sum c, sum d]; K: how many of a..d are present (the others are zero)
template <int K>
LB_KQ_INLINE __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), hadd_cd<K>(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}
// [sum a0, sum a1, sum a2, sum a3 | sum b0, sum b1, sum b2, sum b3]
template <int K>
LB_KQ_INLINE __m256i hsum4x2(__m256i a0, __m256i a1, __m256i a2, __m256i a3,
                             __m256i b0, __m256i b1, __m256i b2, __m256i b3) {
    const __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), hadd_cd<K>(a2, a3));
    const __m256i y = _mm256_hadd_epi32(_mm256_hadd_epi32(b0, b1), hadd_cd<K>(b2, b3));
    return _mm256_add_epi32(_mm256_permute2x128_si256(x, y, 0x20), _mm256_permute2x128_si256(x, y, 0x31));
}
// [sum a, sum a, sum b, sum b]
LB_KQ_INLINE __m128i hsum1x2(__m256i a, __m256i b) {
    const __m256i x = _mm256_hadd_epi32(a, b);
    const __m128i y = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    return _mm_add_epi32(y, _mm_shuffle_epi32(y, 0xB1));
}
// sum a in lane 0
LB_KQ_INLINE __m128i hsum1(__m256i a) {
    __m128i y = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    y = _mm_add_epi32(y, _mm_shuffle_epi32(y, 0x4E));
    return _mm_add_epi32(y, _mm_shuffle_epi32(y, 0xB1));
}

template <int L>
LB_KQ_INLINE float lane(__m128 v) { return _mm_cvtss_f32(_mm_shuffle_ps(v, v, L)); }

// One token, GROUPS: super-block integer lanes i and the bsums term, before their horizontal
// sums: MINS [i01 i23 m01 m23 | i45 i67 m45 m67] (m: the mins term M's lanes); otherwise the
// lanes of I = i - correction.
template <class D>
LB_KQ_INLINE __m256i one_pre(__m256i i, const uint8_t *b, __m256i corr) {
    const __m256i m = _mm256_madd_epi16(ld256(b + QOFF_BS), corr);
    if constexpr (D::MINS) return _mm256_hadd_epi32(i, m);
    else return _mm256_sub_epi32(i, m);
}
// Two super-blocks a, b of one_pre -> MINS [Ia Ma Ib Mb]; otherwise [Ia Ia Ib Ib]
template <class D>
LB_KQ_INLINE __m128i one_pair(__m256i a, __m256i b) {
    const __m256i h = _mm256_hadd_epi32(a, b);  // MINS: [Ia Ma Ib Mb] partials; else [a01 a23 b01 b23] partials
    __m128i y = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    if constexpr (!D::MINS) y = _mm_add_epi32(y, _mm_shuffle_epi32(y, 0xB1));
    return y;
}

// The exact I (and M) sums of tokens 4g .. 4g + K - 1 (K = 1..4) of the GROUPS scheme:
//   MINS, K >= 2: [I0 I1 I2 I3 | M0 M1 M2 M3] (ymm);  MINS, K == 1: [I I M M] (xmm)
//   no mins:      [I0 I1 I2 I3] (xmm, K == 1: I in lane 0)
// i0..i3: the int32 lanes of I; b0..b3: the tokens' q8_K blocks; corr: the decoder's.
// Lanes of absent tokens are 0.
template <class D, int K>
LB_KQ_INLINE auto group_sums(__m256i i0, __m256i i1, __m256i i2, __m256i i3, const uint8_t *b0,
                             const uint8_t *b1, const uint8_t *b2, const uint8_t *b3, __m256i corr) {
    const __m256i z = _mm256_setzero_si256();
    if constexpr (D::MINS) {
#define LB_KQ_M(t) (K > t ? _mm256_madd_epi16(ld256(b##t + QOFF_BS), corr) : z)
        if constexpr (K == 1) return hsum1x2(i0, LB_KQ_M(0));
        else return hsum4x2<K>(i0, i1, i2, i3, LB_KQ_M(0), LB_KQ_M(1), LB_KQ_M(2), LB_KQ_M(3));
#undef LB_KQ_M
    } else {
#define LB_KQ_O(t) (K > t ? _mm256_sub_epi32(i##t, _mm256_madd_epi16(ld256(b##t + QOFF_BS), corr)) : z)
        if constexpr (K == 1) return hsum1(LB_KQ_O(0));
        else return hsum4<K>(LB_KQ_O(0), LB_KQ_O(1), LB_KQ_O(2), LB_KQ_O(3));
#undef LB_KQ_O
    }
}

// GROUPS: the window's float accumulator (lane t = token t)
template <int NT>
LB_KQ_INLINE auto acc_zero() {
    if constexpr (NT > 4) return _mm256_setzero_ps();
    else if constexpr (NT > 1) return _mm_setzero_ps();
    else return 0.0f;
}

// ---- the row kernel ---------------------------------------------------------------------------

template <class F, std::size_t... J>
LB_KQ_INLINE void for_chunks(F &&f, std::index_sequence<J...>) {
    (f(std::integral_constant<int, (int)J>{}), ...);
}

// X(t) for every token t < NT (t a literal, so names can be pasted: i##t, p##t)
#define LB_KQ_TOK(X)                                                                        \
    X(0)                                                                                    \
    if constexpr (NT > 1) { X(1) }                                                          \
    if constexpr (NT > 2) { X(2) }                                                          \
    if constexpr (NT > 3) { X(3) }                                                          \
    if constexpr (NT > 4) { X(4) }                                                          \
    if constexpr (NT > 5) { X(5) }                                                          \
    if constexpr (NT > 6) { X(6) }                                                          \
    if constexpr (NT > 7) { X(7) }
#define LB_KQ_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

template <template <int> class DT, int NT>
LB_KQ_INLINE void rows_body(const RowArgs &a, int64_t r0, int64_t r1) {
    using D = DT<NT>;
    constexpr bool OPQ = D::OPQ;
    const Masks<OPQ> km;
    const int64_t nb = a.n / QK_K;
    // token t's activation row (named pointers, I7)
#define LB_KQ_PTR(t) [[maybe_unused]] const uint8_t *p##t = a.act + (t < NT ? (size_t)(t) * a.act_stride : 0);
    LB_KQ_ALL(LB_KQ_PTR)
#undef LB_KQ_PTR
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *wr = a.w + (size_t)r * a.w_stride;
        constexpr int K0 = NT < 4 ? NT : 4;       // tokens 0..3: group 0
        constexpr int K1 = NT > 4 ? NT - 4 : 0;   // tokens 4..7: group 1
        // lane t: token t (NT == 1: a float)
        auto acc = acc_zero<NT>();
        // The exact integer lanes i0..i7 of super-block x (activations at yo) for each token.
#define LB_KQ_DECL(t) [[maybe_unused]] vi i##t;
        LB_KQ_ALL(LB_KQ_DECL)
#undef LB_KQ_DECL
        auto block_ints = [&](const uint8_t *x, size_t yo) LB_KQ_INLINE_LAMBDA {
            prefetch_ahead(x, D::BYTES);
#define LB_KQ_ZERO(t) i##t = vzero();
            LB_KQ_ALL(LB_KQ_ZERO)
#undef LB_KQ_ZERO
            constexpr int NA = nacc<NT, D::PRESCALED>();  // accumulators per token (1, 2 or 4)
            [[maybe_unused]] vi i0b = vzero(), i1b = vzero(), i2b = vzero(), i0c = vzero(), i0d = vzero();
            {
                D dec(x, km);
                for_chunks([&](auto jc) LB_KQ_INLINE_LAMBDA {
                    constexpr int j = decltype(jc)::value;
                    const vi u = dec.template codes<j>();
                    const vi s = dec.template scales<j>();
#define LB_KQ_DOT2(acc, t)                                                                  \
    if constexpr (D::PRESCALED) acc = dot_pre(acc, u, vload(p##t + yo + QOFF_QS + W * j));   \
    else acc = dot_acc<NT>(acc, u, vload(p##t + yo + QOFF_QS + W * j), s);                   \
    LB_KQ_KEEP(acc)
#define LB_KQ_DOT(t)                                                                        \
    if constexpr (NA == 1 || j % NA == 0) { LB_KQ_DOT2(i##t, t) }                            \
    else if constexpr (NT == 1 && j % NA == 2) { LB_KQ_DOT2(i0c, 0) }                        \
    else if constexpr (NT == 1 && j % NA == 3) { LB_KQ_DOT2(i0d, 0) }                        \
    else if constexpr (t == 0) { LB_KQ_DOT2(i0b, 0) }                                        \
    else if constexpr (t == 1) { LB_KQ_DOT2(i1b, 1) }                                        \
    else if constexpr (t == 2) { LB_KQ_DOT2(i2b, 2) }
                    LB_KQ_TOK(LB_KQ_DOT)
#undef LB_KQ_DOT
#undef LB_KQ_DOT2
                }, std::make_index_sequence<NJ>{});
            }
            if constexpr (NA == 4) i0 = vadd32(vadd32(i0, i0b), vadd32(i0c, i0d));
            if constexpr (NA == 2) {
                i0 = vadd32(i0, i0b);
                if constexpr (NT > 1) i1 = vadd32(i1, i1b);
                if constexpr (NT > 2) i2 = vadd32(i2, i2b);
            }
        };
        int64_t b = 0;
        if constexpr (NT == 1 && (LB_KQ_512 || nacc<1, D::PRESCALED>() == 1)) {
            // One token (GROUPS): two super-blocks' integer lanes are reduced together (one
            // hadd tree instead of two), then each block takes its float steps in block order,
            // the same steps as below: the same result (I2). Measured on avx2 (quiet, 16 MB,
            // --cpu 1, vs the same kernel without it): Q3_K, Q4_K +4%, Q2_K, Q5_K, Q6_K +1-2%.
            // Not with VNNI's 4 split accumulators per token: the held vector spills (I7).
            for (; b + 2 <= nb; b += 2) {
                const uint8_t *xa = wr + b * D::BYTES, *xb = xa + D::BYTES;
                const size_t ya = (size_t)b * QBLK, yb = ya + QBLK;
                block_ints(xa, ya);
                const __m256i va = one_pre<D>(LB_KQ_Y(i0), p0 + ya, D::corr(xa, km));
                block_ints(xb, yb);
                const __m256i vb = one_pre<D>(LB_KQ_Y(i0), p0 + yb, D::corr(xb, km));
                const __m128 f = _mm_cvtepi32_ps(one_pair<D>(va, vb));  // [Ia Ma Ib Mb] / [Ia . Ib .]
                const float da = lda(p0 + ya), db = lda(p0 + yb);
                const __m128 dva = D::dpair(xa), dvb = D::dpair(xb);
                acc = std::fma(da * _mm_cvtss_f32(dva), _mm_cvtss_f32(f), acc);
                if constexpr (D::MINS) acc = std::fma(-(da * lane<1>(dva)), lane<1>(f), acc);
                acc = std::fma(db * _mm_cvtss_f32(dvb), lane<2>(f), acc);
                if constexpr (D::MINS) acc = std::fma(-(db * lane<1>(dvb)), lane<3>(f), acc);
                LB_KQ_KEEP(acc)
            }
        }
        for (; b < nb; ++b) {
            const uint8_t *x = wr + b * D::BYTES;
            const size_t yo = (size_t)b * QBLK;
            block_ints(x, yo);
            {
                const __m256i corr = D::corr(x, km);
                const auto s0 = group_sums<D, K0>(LB_KQ_Y(i0), LB_KQ_Y(i1), LB_KQ_Y(i2), LB_KQ_Y(i3), p0 + yo, p1 + yo, p2 + yo, p3 + yo, corr);
                const __m128 dv = D::dpair(x);  // [d, dmin]
                if constexpr (NT == 1) {
                    // s0 = [I I M M] or [I . . .]; acc is a scalar
                    const float da = lda(p0 + yo);
                    const __m128 f = _mm_cvtepi32_ps(s0);
                    acc = std::fma(da * _mm_cvtss_f32(dv), _mm_cvtss_f32(f), acc);
                    if constexpr (D::MINS)
                        acc = std::fma(-(da * lane<1>(dv)), lane<2>(f), acc);
                } else if constexpr (NT <= 4) {
                    const __m128 da = _mm_setr_ps(lda(p0 + yo), lda(p1 + yo), K0 > 2 ? lda(p2 + yo) : 0.0f,
                                                  K0 > 3 ? lda(p3 + yo) : 0.0f);
                    const __m128 dI = _mm_mul_ps(da, _mm_broadcastss_ps(dv));
                    if constexpr (D::MINS) {
                        const __m256 f = _mm256_cvtepi32_ps(s0);
                        acc = _mm_fmadd_ps(dI, _mm256_castps256_ps128(f), acc);
                        acc = _mm_fnmadd_ps(_mm_mul_ps(da, _mm_permute_ps(dv, 0x55)), _mm256_extractf128_ps(f, 1), acc);
                    } else {
                        acc = _mm_fmadd_ps(dI, _mm_cvtepi32_ps(s0), acc);
                    }
                } else {
                    const auto s1 = group_sums<D, K1>(LB_KQ_Y(i4), LB_KQ_Y(i5), LB_KQ_Y(i6), LB_KQ_Y(i7), p4 + yo, p5 + yo, p6 + yo, p7 + yo, corr);
                    const __m256 da = _mm256_setr_ps(lda(p0 + yo), lda(p1 + yo), lda(p2 + yo), lda(p3 + yo),
                                                     lda(p4 + yo), K1 > 1 ? lda(p5 + yo) : 0.0f,
                                                     K1 > 2 ? lda(p6 + yo) : 0.0f, K1 > 3 ? lda(p7 + yo) : 0.0f);
                    const __m256 dI = _mm256_mul_ps(da, _mm256_broadcastss_ps(dv));
                    if constexpr (D::MINS) {
                        // s0 = [I0..I3 | M0..M3], s1 = [I4.. | M4..] (K1 == 1: [I4 I4 M4 M4])
                        __m256i iv, mv;
                        if constexpr (K1 == 1) {
                            iv = _mm256_inserti128_si256(s0, s1, 1);  // lane 4 = I4
                            mv = _mm256_inserti128_si256(_mm256_permute2x128_si256(s0, s0, 0x11),
                                                         _mm_unpackhi_epi64(s1, s1), 1);
                        } else {
                            iv = _mm256_permute2x128_si256(s0, s1, 0x20);
                            mv = _mm256_permute2x128_si256(s0, s1, 0x31);
                        }
                        acc = _mm256_fmadd_ps(dI, _mm256_cvtepi32_ps(iv), acc);
                        acc = _mm256_fnmadd_ps(_mm256_mul_ps(da, _mm256_broadcastss_ps(_mm_movehdup_ps(dv))),
                                               _mm256_cvtepi32_ps(mv), acc);
                    } else {
                        acc = _mm256_fmadd_ps(dI, _mm256_cvtepi32_ps(_mm256_setr_m128i(s0, s1)), acc);
                    }
                }
                LB_KQ_KEEP(acc)
            }
        }
        float *o = a.out + (size_t)r;
        const size_t os = a.out_stride;
        __m128 v0, v1;
        if constexpr (NT > 4) {
            v0 = _mm256_castps256_ps128(acc);
            v1 = _mm256_extractf128_ps(acc, 1);
        } else if constexpr (NT > 1) {
            v0 = acc;
        } else {
            v0 = _mm_set_ss(acc);
        }
        o[0] = _mm_cvtss_f32(v0);
        if constexpr (K0 > 1) o[os] = lane<1>(v0);
        if constexpr (K0 > 2) o[2 * os] = lane<2>(v0);
        if constexpr (K0 > 3) o[3 * os] = lane<3>(v0);
        if constexpr (K1 > 0) o[4 * os] = _mm_cvtss_f32(v1);
        if constexpr (K1 > 1) o[5 * os] = lane<1>(v1);
        if constexpr (K1 > 2) o[6 * os] = lane<2>(v1);
        if constexpr (K1 > 3) o[7 * os] = lane<3>(v1);
    }
}

// Windows of 5+ tokens (Q3_K: 3+) use every register: there the kernels' constants (masks,
// shift counts, shuffle indices) are used from memory or rebuilt where needed; hoisted out of
// the row loop (RTL loop-invariant motion, GCSE) they crowd out the per-token accumulators
// and come back as stack spills (I7). Smaller windows have the registers to keep them.
// (GCC's optimize attribute; clang has none: its pre-RA scheduler is off instead, CMakeLists.)
#if defined(__clang__)
#define LB_KQ_NO_LICM
#else
#define LB_KQ_NO_LICM __attribute__((optimize("no-move-loop-invariants", "no-gcse")))
#endif
template <template <int> class DT, int NT>
LB_KQ_NO_LICM void rows_hi(const RowArgs &a, int64_t r0, int64_t r1, int) {
    rows_body<DT, NT>(a, r0, r1);
}
template <template <int> class DT, int NT>
void rows_lo(const RowArgs &a, int64_t r0, int64_t r1, int) {
    rows_body<DT, NT>(a, r0, r1);
}
template <template <int> class DT, int NT>
constexpr rows_fn rows_nt = NT >= DT<NT>::NO_LICM_FROM ? rows_hi<DT, NT> : rows_lo<DT, NT>;

#undef LB_KQ_TOK
#undef LB_KQ_ALL
#undef LB_KQ_KEEP

#define LB_KQ_STR2(x) #x
#define LB_KQ_STR(x) LB_KQ_STR2(x)

template <template <int> class D>
void set_rows(KernelTable &t, int id, const char *name) {
    set_rows_each_nt(t.at(id), name, LOWBIT_ISA, [](auto nt) { return rows_nt<D, decltype(nt)::value>; });
}

}  // namespace

void register_kquants(KernelTable &t) {
    set_rows<DecQ4K>(t, T_Q4_K, "rows_q4_k_q8_k_" LB_KQ_STR(LOWBIT_NS));
    set_rows<DecQ6K>(t, T_Q6_K, "rows_q6_k_q8_k_" LB_KQ_STR(LOWBIT_NS));
    set_rows<DecQ5K>(t, T_Q5_K, "rows_q5_k_q8_k_" LB_KQ_STR(LOWBIT_NS));
    set_rows<DecQ3K>(t, T_Q3_K, "rows_q3_k_q8_k_" LB_KQ_STR(LOWBIT_NS));
    set_rows<DecQ2K>(t, T_Q2_K, "rows_q2_k_q8_k_" LB_KQ_STR(LOWBIT_NS));
}

#undef LB_KQ_STR
#undef LB_KQ_STR2
#undef LB_KQ_Y
#undef LB_KQ_INLINE
#undef LB_KQ_INLINE_LAMBDA
#undef LB_KQ_512
#undef LB_KQ_VNNI

}  // namespace LOWBIT_NS
}  // namespace lowbit

#pragma GCC diagnostic pop
