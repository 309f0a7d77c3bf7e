// Legacy-format row kernels: Q4_0, Q5_0, Q8_0 (and IQ4_NL, csrc/x86/iq4nl.inl, and MXFP4,
// csrc/x86/mxfp4.inl) x Q8_0 and
// Q4_1, Q5_1 x Q8_1. Shared body of csrc/x86/{avx2,avx2vnni,avx512}/legacy.cpp; the including
// file defines LOWBIT_ISA (ISA_AVX2, ISA_AVX2VNNI or ISA_AVX512) and LOWBIT_NS (the level's
// namespace) and is built with that level's flags only.
//
// Contract (csrc/kernels.h, DESIGN.md): out[t * out_stride + r] = dot(W[r], act[t]) for r in
// [r0, r1), t < nt. Block layouts and the meaning of the codes are csrc/ref/legacy.cpp's.
//
// ---- Arithmetic (what a token's result is, for every nt and every level) --------------------
// Per block b of a row and token t:
//   isum[t][b] = sum over the 32 weights of q_w * q_a            exact int32 (I1, bounds below)
//   S[t][b]    = d_w[b] * d_a[t][b]                               one float multiply
// and the row's blocks are dealt into 8 classes c = b mod 8, each a float accumulator:
//   acc_c = fma((float)isum, S, acc_c)          then, Q4_1/Q5_1 only: acc_c = fma(m_w, s_a, acc_c)
// in block order; the result is ((acc_0 + acc_1) + (acc_2 + acc_3)) + ((acc_4 + acc_5) + (acc_6 +
// acc_7)). An exact integer does not depend on how its terms were grouped, and S, the fmas and
// the final tree are the same operations on the same values whichever strategy below ran, so
// a token's result is bitwise independent of nt (I2) and of the row split (I3). It is not the
// scalar reference's order (that is one serial sum); it is within float rounding of it (I5).
//
// ---- Two strategies, one arithmetic ---------------------------------------------------------
// Blocks go in pairs (b, b+1): the 16-byte halves of both blocks' 32 codes sit in one ymm,
//   lo = [codes 0..15 of b | codes 0..15 of b+1],  hi = [codes 16..31 of b | of b+1],
// decoded once per pair per row (never per token). Codes are unsigned bytes u = q_w + off
// (off = 8 Q4_0, 16 Q5_0, 0 Q4_1/Q5_1, 12 MXFP4, 128 Q8_0/IQ4_NL on vnni) so dpbusd /
// maddubs take them as their unsigned operand; the offset comes back out exactly as the integer
// -off * sum(q_a), computed once per call per (token, block). (avx2 Q8_0 / IQ4_NL keep signed
// codes and use the sign trick: 255 * 127 pairs would saturate maddubs.) MXFP4's scale is
// an e8m0 byte, not an fp16 d: group_scales turns it into d_w (mxfp4.inl); the rest is the same.
//   TT, token-transposed (4 tokens per 128-bit lane): the activations are re-laid out once per
//     call so that dword lane (h, i) of vector k holds dword k of token i's activations for the
//     unit's block h; each dword of codes is broadcast over its lane (pshufd, shared by both
//     token chunks) and one dpbusd per k covers 4 tokens x W blocks. After 8 k's the lane IS
//     isum[t][b]: no reduction, and one cvt + mul + fma serves 4 W (token, block) pairs. The
//     unit is a pair (W = 2, ymm) or, on avx512, a quad (W = 4, zmm: lo / hi hold 4 blocks'
//     halves). Accumulators acc[chunk][unit u of the group]: lane (h, i) = class u W + h, token i.
//     avx2's MXFP4 (and IQ4_NL / Q8_0 at nt 3, 4) reach the same lanes by the hadd transpose
//     instead (tt_hadd, hadd_tt): the unit's codes are the maddubs operand of each token's own
//     activations (BT's record layout per token) and three hadds per chunk put the 4 tokens'
//     sums in lane (h, i): no per-k broadcast; the same integers, the same float step.
//   BT, block-transposed (1 token per ymm): per token, dpbusd over the pair gives lanes
//     [b: 4 partial sums | b+1: 4]; three hadds per group of 8 blocks leave the 8 block sums in
//     lanes in class order L = [0 2 4 6 | 1 3 5 7], then one cvt + fma for 8 blocks.
//   Direct (avx2 Q8_0, one token, direct()): BT's lanes and float step, but each block's 32
//     code bytes are one load against its activations laid out per block (no halves, no
//     inserts); 6 hadds + a lane swap per group of 8 blocks give the class order L.
// TT costs the same for 1..4 tokens, BT grows per token: plan() picks per nt and level (whole
// chunks of 4 by TT, the remaining tokens by BT). Both give bitwise the same per-token result,
// and so do all three levels (same integers, same float operations).
//
// ---- Per-call preparation -------------------------------------------------------------------
// Activations are read-only and shared by every row, so each call first converts their fp16
// scales, sums their codes and re-lays them out (prepare(): O(nt * n), a thread-local buffer;
// layout at Lay), grouped by 8 blocks so a row streams through it in order. The weights are
// read in place; their fp16 scales are read 8 blocks at a time by general-register loads
// (group_halves_gpr: Zen 3 to Zen 5 run vpgatherdd as many vector uops).
//
// ---- Integer bounds (I1) ---------------------------------------------------------------------
// dpbusd: int32 lanes, |sum| <= 32 * 255 * 127 + 128 * 32 * 127 < 2^21: exact, and exact as float.
// maddubs (avx2): int16 lane = 2 products; K16 of them are summed in int16 before madd widens:
//   Q4_*: u <= 15: 8 * 2 * 15 * 127 = 30480;  Q5_*: u <= 31: 4 * 2 * 31 * 127 = 31496;
//   MXFP4: u <= 24: 4 * 2 * 24 * 127 = 24384 (the hadd transpose's int16 sums: 8 products too);
//   sign trick: |w| <= 128: 1 * 2 * 128 * 127 = 32512  (all < 32767: never saturates).
// Activation codes are ggml's Q8_0/Q8_1 codes, in [-127, 127].
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "../kernels.h"
#include "../ref/iq_tables.h"
#include "prefetch.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including legacy.inl"
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {

// The level as a preprocessor number (LOWBIT_ISA is an enum, invisible to #if), from the
// flags this translation unit is built with.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LB_LG_LEVEL 3
#elif defined(__AVXVNNI__)
#define LB_LG_LEVEL 2
#else
#define LB_LG_LEVEL 1
#endif
static_assert(LB_LG_LEVEL == LOWBIT_ISA, "LOWBIT_ISA does not match this level's compiler flags");

#define LB_LG_INLINE inline __attribute__((always_inline))
#define LB_LG_STR2(x) #x
#define LB_LG_STR(x) LB_LG_STR2(x)

constexpr bool kVnni = LOWBIT_ISA >= ISA_AVX2VNNI;

LB_LG_INLINE __m256 ldf(const uint8_t *p) { return _mm256_load_ps((const float *)p); }  // prep: 32-aligned
LB_LG_INLINE __m256i lda(const uint8_t *p) { return _mm256_load_si256((const __m256i *)p); }
LB_LG_INLINE uint32_t ld32(const uint8_t *p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
LB_LG_INLINE uint16_t ld16(const uint8_t *p) { uint16_t v; std::memcpy(&v, p, 2); return v; }

// ---- vector constants ---------------------------------------------------------------------------
// With 16 ymm, GCC hoists every constant out of the row loop into a register and then spills
// accumulators (I7) rather than re-reading the constant. K() hides the constant's address from
// the optimiser, so each use reads it from .rodata (a load folded into its instruction, which
// costs a load port, not a vector port). With 32 registers (avx512) constants stay hoisted.
struct alignas(32) C32 { uint8_t b[32]; };
constexpr C32 splat8(uint8_t v) { C32 c{}; for (int i = 0; i < 32; ++i) c.b[i] = v; return c; }
constexpr C32 rep16(const uint8_t (&x)[16]) { C32 c{}; for (int i = 0; i < 32; ++i) c.b[i] = x[i % 16]; return c; }
constexpr C32 rep8(uint64_t v) { C32 c{}; for (int i = 0; i < 32; ++i) c.b[i] = (uint8_t)(v >> (8 * (i % 8))); return c; }
constexpr C32 kM4 = splat8(0x0F), kB16 = splat8(0x10), kX80 = splat8(0x80), kFF = splat8(0xFF);
constexpr C32 kOnes16 = rep8(0x0001000100010001ull);
// Q5: qh bytes 0, 1 spread over each half; all bits but a byte's own set
constexpr C32 kSpread = rep16({0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1});
constexpr C32 kOthers = rep8(0x7fbfdfeff7fbfdfeull);

LB_LG_INLINE __m256i K(const C32 &c) {
    const C32 *p = &c;
#if LB_LG_LEVEL != 3
    __asm__ volatile("" : "+r"(p));
#endif
    return _mm256_load_si256((const __m256i *)p->b);
}

// Keeps a running sum a sequential chain on avx2: GCC would re-balance it into a tree, whose
// extra partial sums do not fit in 16 ymm next to 8 accumulators.
#if LB_LG_LEVEL == 1
#define LB_LG_SEQ(v) __asm__("" : "+x"(v))
#else
#define LB_LG_SEQ(v) (void)0
#endif

// acc + per int32 lane the sum of 4 products u8 * s8 (exact: see the bounds above).
LB_LG_INLINE __m256i dp(__m256i acc, __m256i u, __m256i s) {
#if LB_LG_LEVEL == 3
    return _mm256_dpbusd_epi32(acc, u, s);
#elif LB_LG_LEVEL == 2
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), K(kOnes16)));
#endif
}
LB_LG_INLINE __m256i widen16(__m256i s16) { return _mm256_madd_epi16(s16, K(kOnes16)); }

// Dword k of a pair's codes broadcast over its 4 token lanes: [b dword k x4 | b+1 dword k x4].
template <int K>
LB_LG_INLINE __m256i code_dword(__m256i lo, __m256i hi) {
    return _mm256_shuffle_epi32(K < 4 ? lo : hi, (K & 3) * 0x55);
}

// ---- decoding helpers: one pair of blocks into lo / hi (layout in the header) ---------------
// [16 bytes at b + OFF | 16 bytes at b + BYTES + OFF]; `two` false: block b is the row's last
// and the upper half is zero (nothing past the row is read).
template <int OFF, int BYTES>
LB_LG_INLINE __m256i load_halves(const uint8_t *b, bool two) {
    const __m128i x0 = _mm_loadu_si128((const __m128i *)(b + OFF));
    const __m128i x1 = two ? _mm_loadu_si128((const __m128i *)(b + BYTES + OFF)) : _mm_setzero_si128();
    return _mm256_inserti128_si256(_mm256_castsi128_si256(x0), x1, 1);
}

// 4-bit codes: qs[j] low nibble = weight j, high nibble = weight j + 16.
template <int QS, int BYTES>
LB_LG_INLINE void nibbles(const uint8_t *b, bool two, __m256i &lo, __m256i &hi) {
    const __m256i x = load_halves<QS, BYTES>(b, two);
    lo = _mm256_and_si256(x, K(kM4));
    hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), K(kM4));
}

// Q5: bit j of the little-endian qh word is weight j's 5th bit (value 16).
LB_LG_INLINE void fifth_bits(uint32_t h0, uint32_t h1, __m256i &lo, __m256i &hi) {
#if LB_LG_LEVEL == 3
    const __m256i b16 = K(kB16);
    const __mmask32 klo = (h0 & 0xFFFFu) | (h1 << 16), khi = (h0 >> 16) | (h1 & 0xFFFF0000u);
    lo = _mm256_mask_add_epi8(lo, klo, lo, b16);
    hi = _mm256_mask_add_epi8(hi, khi, hi, b16);
#else
    // byte j of each half gets the qh byte holding its bit; OR-ing every other bit to 1 leaves
    // all ones exactly where its own bit is set
    const __m256i q = _mm256_blend_epi32(_mm256_set1_epi32((int)h0), _mm256_set1_epi32((int)h1), 0xF0);
    const __m256i flo = _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_shuffle_epi8(q, K(kSpread)), K(kOthers)), K(kFF));
    const __m256i fhi = _mm256_cmpeq_epi8(
        _mm256_or_si256(_mm256_shuffle_epi8(_mm256_srli_epi32(q, 16), K(kSpread)), K(kOthers)), K(kFF));
    lo = _mm256_or_si256(lo, _mm256_and_si256(flo, K(kB16)));
    hi = _mm256_or_si256(hi, _mm256_and_si256(fhi, K(kB16)));
#endif
}

// ---- the formats -------------------------------------------------------------------------------
// kBytes block size; kQs offset of the 16 (4/5-bit) or 32 (8-bit) code bytes; kQh offset of the
// Q5 high bits (-1: none); kBits 4, 5 or 8; kLut codes are looked up (IQ4_NL, iq4nl.inl);
// kQ8_1 pairs with Q8_1 (d, s, qs) instead of Q8_0 (d, qs); kOff the code offset (0 = codes are
// the values); kSign signed codes + sign trick (avx2 only); kK16 how many maddubs results may be
// summed in int16 (bounds in the header); kM the block has an fp16 m right after d (w = d q + m).
struct FQ4_0 {
    static constexpr int kBytes = 18, kQs = 2, kQh = -1, kBits = 4, kOff = 8, kK16 = 8;
    static constexpr bool kLut = false, kQ8_1 = false, kSign = false, kM = false;
};
struct FQ4_1 {
    static constexpr int kBytes = 20, kQs = 4, kQh = -1, kBits = 4, kOff = 0, kK16 = 8;
    static constexpr bool kLut = false, kQ8_1 = true, kSign = false, kM = true;
};
struct FQ5_0 {
    static constexpr int kBytes = 22, kQs = 6, kQh = 2, kBits = 5, kOff = 16, kK16 = 4;
    static constexpr bool kLut = false, kQ8_1 = false, kSign = false, kM = false;
};
struct FQ5_1 {
    static constexpr int kBytes = 24, kQs = 8, kQh = 4, kBits = 5, kOff = 0, kK16 = 4;
    static constexpr bool kLut = false, kQ8_1 = true, kSign = false, kM = true;
};
struct FQ8_0 {  // vnni: u = q + 128; avx2: signed q, sign trick
    static constexpr int kBytes = 34, kQs = 2, kQh = -1, kBits = 8, kOff = kVnni ? 128 : 0, kK16 = 1;
    static constexpr bool kLut = false, kQ8_1 = false, kSign = !kVnni, kM = false;
};
#include "iq4nl.inl"
#include "mxfp4.inl"

// One pair of blocks (b, b+1) into lo / hi (layout in the header); `two` false: block b is the
// row's last, block b+1's lanes are zero and nothing past the row is read.
template <class F>
LB_LG_INLINE void decode_pair(const uint8_t *b, bool two, __m256i &lo, __m256i &hi) {
    if constexpr (F::kBits == 8) {
        lo = load_halves<F::kQs, F::kBytes>(b, two);
        hi = load_halves<F::kQs + 16, F::kBytes>(b, two);
        if constexpr (kVnni) {
            lo = _mm256_xor_si256(lo, K(kX80));
            hi = _mm256_xor_si256(hi, K(kX80));
        }
    } else {
        nibbles<F::kQs, F::kBytes>(b, two, lo, hi);
        if constexpr (F::kBits == 5)
            fifth_bits(ld32(b + F::kQh), two ? ld32(b + F::kBytes + F::kQh) : 0u, lo, hi);
        if constexpr (F::kLut) {
            lo = _mm256_shuffle_epi8(code_lut<F>(), lo);
            hi = _mm256_shuffle_epi8(code_lut<F>(), hi);
        }
    }
}

#if LB_LG_LEVEL == 3
// avx512: a quad of blocks (4 of them from b, n present) into zmm LO / HI, 128-bit lane i =
// block b+i's 16-byte half (codes 0..15 in LO, 16..31 in HI); missing blocks are zero.
template <int OFF, int BYTES>
LB_LG_INLINE __m512i load_quarters(const uint8_t *b, int n) {
    const __m128i z = _mm_setzero_si128();
    __m512i x = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)(b + OFF)));
    x = _mm512_inserti32x4(x, n > 1 ? _mm_loadu_si128((const __m128i *)(b + BYTES + OFF)) : z, 1);
    x = _mm512_inserti32x4(x, n > 2 ? _mm_loadu_si128((const __m128i *)(b + 2 * BYTES + OFF)) : z, 2);
    x = _mm512_inserti32x4(x, n > 3 ? _mm_loadu_si128((const __m128i *)(b + 3 * BYTES + OFF)) : z, 3);
    return x;
}
template <class F>
LB_LG_INLINE void decode_quad(const uint8_t *b, int n, __m512i &lo, __m512i &hi) {
    if constexpr (F::kBits == 8) {
        const __m512i x80 = _mm512_set1_epi8((char)0x80);
        lo = _mm512_xor_si512(load_quarters<F::kQs, F::kBytes>(b, n), x80);
        hi = _mm512_xor_si512(load_quarters<F::kQs + 16, F::kBytes>(b, n), x80);
    } else {
        const __m512i x = load_quarters<F::kQs, F::kBytes>(b, n), m4 = _mm512_set1_epi8(0x0F);
        lo = _mm512_and_si512(x, m4);
        hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        if constexpr (F::kBits == 5) {  // 16 bits per block and half, as byte masks
            uint64_t klo = 0, khi = 0;
            for (int i = 0; i < 4; ++i) {
                if (i >= n) break;
                klo |= (uint64_t)ld16(b + i * F::kBytes + F::kQh) << (16 * i);
                khi |= (uint64_t)ld16(b + i * F::kBytes + F::kQh + 2) << (16 * i);
            }
            const __m512i b16 = _mm512_set1_epi8(0x10);
            lo = _mm512_mask_add_epi8(lo, klo, lo, b16);
            hi = _mm512_mask_add_epi8(hi, khi, hi, b16);
        }
        if constexpr (F::kLut) {
            const __m512i lut = _mm512_maskz_broadcast_i32x4((__mmask16)0xFFFF, _mm256_castsi256_si128(code_lut<F>()));
            lo = _mm512_shuffle_epi8(lut, lo);
            hi = _mm512_shuffle_epi8(lut, hi);
        }
    }
}
#endif

// ---- the window plan ---------------------------------------------------------------------------
struct Plan { int tt, bt; };  // TT chunks of 4 tokens, then BT tokens
// Measured (bench: in-cache rows, this file's kernels per nt): TT's cost is flat in its 4 token
// lanes, BT's grows per token, so 3 and 4 tokens go by one TT chunk and 6..8 by two (phantom
// lanes are cheaper than BT tokens there), 5 by a chunk + one BT token. With 16 ymm a BT token
// besides a TT chunk is all that fits without spills; avx512 keeps 3 tokens on BT. (A hadd_tt
// chunk is not flat: it skips the maddubs of absent tokens; the plan is kept, not re-measured.)
constexpr Plan plan(int nt) {
#if LB_LG_LEVEL == 3
    return nt <= 3 ? Plan{0, nt} : nt == 4 ? Plan{1, 0} : nt == 5 ? Plan{1, 1} : nt <= 8 ? Plan{2, 0} : Plan{4, 0};
#else
    return nt <= 2 ? Plan{0, nt} : nt <= 4 ? Plan{1, 0} : nt == 5 ? Plan{1, 1} : Plan{2, 0};
#endif
}
// Blocks per TT unit: a pair (ymm) or, on avx512, a quad (zmm: 4 blocks x 4 tokens).
constexpr int unit_width(int nt) { return (LB_LG_LEVEL == 3 && plan(nt).tt > 0) ? 4 : 2; }
// TT chunks share each broadcast code dword (share_u) where the registers allow: 8 accumulators
// + codes + 2 running sums fit 16 ymm with dpbusd, except next to Q5_1's decode and 2 scale
// vectors; with avx2's sign trick (int32 sums), not with its int16 partials. (32 registers:
// always.) Checked by tools/check_spills.py (I7).
template <class F>
constexpr bool share_u() { return LB_LG_LEVEL == 3 || (LB_LG_LEVEL == 2 && !(F::kM && F::kBits == 5)) || (LB_LG_LEVEL == 1 && F::kSign); }
// avx2 TT chunks by the hadd transpose (tt_hadd) rather than by broadcast codes (tt_int): the
// decoded pair is itself the maddubs operand of each token's activations (no per-k pshufd), and
// three hadds per unit and chunk put the tokens' sums into TT's lanes. Per unit and chunk:
//   unsigned codes (MXFP4): 8 maddubs + 4 add16 + 2 hadd16 + 2 madd + 1 hadd32, against tt_int's
//     8 pshufd + 8 maddubs + 6 add16 + 2 madd + 2 add32 (int16 bound: tt_hadd);
//   sign trick (IQ4_NL, Q8_0): 8 psignb + 8 maddubs + 8 madd + 4 add32 + 3 hadd32 (+ 2 psignb of
//     the codes, per unit), against 8 pshufd + 8 psignb + 8 maddubs + 8 madd + 8 add32 (+ 8
//     psignb of the codes). Their |codes| and signs make 4 code vectors live, so only one chunk
//     and no BT token fit 16 ymm: nt 3, 4 (tools/check_spills.py; at nt 5..8 GCC spills).
template <class F, int NT>
constexpr bool hadd_tt() {
    return LB_LG_LEVEL == 1 && (std::is_same_v<F, FMXFP4> || (F::kSign && plan(NT).tt == 1 && plan(NT).bt == 0));
}

// Where even that is one register short (the Q5 formats' decode, two TT chunks, codes not
// shared, 16 ymm), the group's scale vector is not held across its 4 units: each unit reads
// its 2 blocks' fp16 d (and m) itself (unit_scales). The same values, so the same result;
// clang otherwise spills the vector (I7), GCC happened to fit it. So too for the sign-trick
// formats' hadd transpose (4 code vectors live).
template <class F, int NT>
constexpr bool per_unit_scales() {
    return (LB_LG_LEVEL != 3 && F::kBits == 5 && !share_u<F>() && plan(NT).tt == 2 && plan(NT).bt == 0) ||
           (hadd_tt<F, NT>() && F::kSign);
}

// avx2 Q8_0 at one token goes by the direct path (group_direct): a block's 32 code bytes are
// contiguous, so each block is one 32-byte load against its activations laid out the same way,
// rather than pairs of blocks cut into 16-byte halves and joined by inserts (decode_pair).
template <class F, int NT>
constexpr bool direct() { return LB_LG_LEVEL == 1 && F::kBits == 8 && F::kSign && NT == 1; }

// ---- the per-call activation records ----------------------------------------------------------
// Per group of 8 blocks: tt * (8 / W) TT records, then bt BT records (W = unit_width).
// TT record (chunk c, unit u of W blocks): A[k], k = 0..7, of W * 16 bytes, lane (h, i) = dword k
//   of token 4c+i's activations for block u*W + h; then d_a, -off * sum(q_a) (if off), s_a (if
//   Q8_1), W * 16 bytes each, lane (h, i) as float / int32. With hadd_tt the same 8 * V = 256
//   bytes of A hold, per token i, [q_a[0:16] of u*W | of u*W+1] at 32 i and [q_a[16:32] ...] at
//   128 + 32 i (a BT record's layout, cut to the unit's pair and the chunk's 4 tokens).
// BT record (token, group): q_a[0:16] of blocks 0..7 (128 B), q_a[16:32] of blocks 0..7 (128 B),
//   then d_a, -off * sum(q_a), s_a: 8 lanes in class order L (32 B each), padded to 64 B.
//   On the direct path the 256 code bytes are q_a[0:32] of blocks 0..7 instead.
template <class F, int NT>
struct Lay {
    static constexpr Plan P = plan(NT);
    static constexpr int W = unit_width(NT), U = 8 / W, V = 16 * W;  // V: bytes per vector
    static constexpr int kA = 0, kDA = 8 * V, kCORR = kDA + V, kSA = kCORR + (F::kOff ? V : 0);
    static constexpr int kRecT = kSA + (F::kM ? V : 0);
    static constexpr int kBDA = 256, kBCORR = kBDA + 32, kBSA = kBCORR + (F::kOff ? 32 : 0);
    static constexpr int kRecB = (kBSA + (F::kM ? 32 : 0) + 63) / 64 * 64;
    static constexpr size_t kGroup = (size_t)P.tt * U * kRecT + (size_t)P.bt * kRecB;
    static constexpr size_t tt_rec(int c, int u) { return (size_t)(c * U + u) * kRecT; }
    static constexpr size_t bt_rec(int j) { return (size_t)P.tt * U * kRecT + (size_t)j * kRecB; }
};

struct alignas(64) Line { uint8_t b[64]; };

LB_LG_INLINE uint8_t *scratch(size_t bytes) {
    static thread_local std::vector<Line> buf;
    const size_t lines = (bytes + 63) / 64;
    if (buf.size() < lines) buf.resize(lines);
    return reinterpret_cast<uint8_t *>(buf.data());
}
// What the thread's scratch holds (every layout shares it, so the key names the layout too)
LB_LG_INLINE ActKey &scratch_key() {
    static thread_local ActKey key;
    return key;
}

template <class F, int NT>
__attribute__((noinline)) const uint8_t *prepare(const RowArgs &a, int64_t nb) {
    using Y = Lay<F, NT>;
    constexpr int ABYTES = F::kQ8_1 ? 36 : 34, AQS = F::kQ8_1 ? 4 : 2;
    const int64_t G = (nb + 7) / 8;
    uint8_t *base = scratch((size_t)G * Y::kGroup);
    // The scratch (shared by every layout) already holds this call's activations in this layout
    // (kernels.h act_holds; layout: this instance): a dispatch's parts and a GLU's gate and up
    // tiles re-lay them out once per thread.
    if (act_holds(scratch_key(), a, NT, reinterpret_cast<const void *>(&prepare<F, NT>))) return base;
    std::memset(base, 0, (size_t)G * Y::kGroup);  // phantom blocks / tokens: codes, scales, sums 0
    for (int t = 0; t < NT; ++t) {
        const uint8_t *at = a.act + (size_t)t * a.act_stride;
        const int c = t / 4, i = t % 4, j = t - 4 * Y::P.tt;  // TT chunk and lane, or BT token
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *ab = at + b * ABYTES, *q = ab + AQS;
            const float da = _cvtsh_ss(ld16(ab));
            const float sa = F::kQ8_1 ? _cvtsh_ss(ld16(ab + 2)) : 0.0f;
            int32_t suma = 0;
            for (int k = 0; k < QK; ++k) suma += (int8_t)q[k];
            const int32_t corr = -F::kOff * suma;
            const int bi = (int)(b % 8);
            uint8_t *rg = base + (size_t)(b / 8) * Y::kGroup, *rec;
            size_t lane, da_off, corr_off, sa_off;
            if (j < 0) {
                rec = rg + Y::tt_rec(c, bi / Y::W);
                lane = (size_t)((bi % Y::W) * 4 + i);
                if constexpr (hadd_tt<F, NT>()) {
                    static_assert(Y::W == 2, "");
                    std::memcpy(rec + 32 * i + 16 * (bi % 2), q, 16);
                    std::memcpy(rec + 128 + 32 * i + 16 * (bi % 2), q + 16, 16);
                } else {
                    for (int k = 0; k < 8; ++k) std::memcpy(rec + Y::V * k + 4 * lane, q + 4 * k, 4);
                }
                da_off = Y::kDA, corr_off = Y::kCORR, sa_off = Y::kSA;
            } else {
                rec = rg + Y::bt_rec(j);
                lane = (size_t)((bi % 2) * 4 + bi / 2);  // class order L
                if constexpr (direct<F, NT>()) {
                    std::memcpy(rec + 32 * bi, q, 32);
                } else {
                    std::memcpy(rec + 16 * bi, q, 16);
                    std::memcpy(rec + 128 + 16 * bi, q + 16, 16);
                }
                da_off = Y::kBDA, corr_off = Y::kBCORR, sa_off = Y::kBSA;
            }
            reinterpret_cast<float *>(rec + da_off)[lane] = da;
            if constexpr (F::kOff != 0) reinterpret_cast<int32_t *>(rec + corr_off)[lane] = corr;
            if constexpr (F::kM) reinterpret_cast<float *>(rec + sa_off)[lane] = sa;
        }
    }
    return base;
}

// ---- vectors of a TT unit ----
// (avx512: the maskz forms with all lanes set: GCC 12's plain ones warn on their undefined source)--------------------------------------------------------------------
template <int W> struct TV;
template <> struct TV<2> {
    using I = __m256i;
    using V = __m256;
    static I ld(const uint8_t *p) { return _mm256_load_si256((const __m256i *)p); }
    static V ldf(const uint8_t *p) { return _mm256_load_ps((const float *)p); }
    static I zero() { return _mm256_setzero_si256(); }
    static V zerof() { return _mm256_setzero_ps(); }
    template <int K> static I code(I lo, I hi) { return code_dword<K>(lo, hi); }
    static I dpb(I acc, I u, I s) { return dp(acc, u, s); }
    static V cvt(I x) { return _mm256_cvtepi32_ps(x); }
    static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    // [d[u*2] x4 | d[u*2+1] x4] from the group's 8 values in class order L
    template <int Ux> static V unit_scale(__m256 v) { return _mm256_permute_ps(v, Ux * 0x55); }
};
#if LB_LG_LEVEL == 3
template <> struct TV<4> {
    using I = __m512i;
    using V = __m512;
    static I ld(const uint8_t *p) { return _mm512_load_si512((const void *)p); }
    static V ldf(const uint8_t *p) { return _mm512_load_ps((const void *)p); }
    static I zero() { return _mm512_setzero_si512(); }
    static V zerof() { return _mm512_setzero_ps(); }
    template <int K> static I code(I lo, I hi) {
        return _mm512_maskz_shuffle_epi32((__mmask16)0xFFFF, K < 4 ? lo : hi, (_MM_PERM_ENUM)((K & 3) * 0x55));
    }
    static I dpb(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
    static V cvt(I x) { return _mm512_maskz_cvtepi32_ps((__mmask16)0xFFFF, x); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    // lane group i = d of block 4u+i, from class order L (block c at (c % 2) * 4 + c / 2)
    template <int Ux> static V unit_scale(__m256 v) {
        const __m512i idx = Ux == 0 ? _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5)
                                    : _mm512_setr_epi32(2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7);
        return _mm512_maskz_permutexvar_ps((__mmask16)0xFFFF, idx, _mm512_insertf32x8(_mm512_setzero_ps(), v, 0));
    }
};
#endif

// ---- accumulators (named registers: I7) -------------------------------------------------------
template <int W>
struct Acc {
    using V = typename TV<W>::V;
    V t00, t01, t02, t03, t10, t11, t12, t13;  // TT: chunk c, unit u -> t<c><u>
    V t20, t21, t30, t31;                      // chunks 2, 3 (the wide window: avx512, W = 4)
    __m256 b0, b1, b2;                         // BT tokens
    Acc() {
        t00 = t01 = t02 = t03 = t10 = t11 = t12 = t13 = t20 = t21 = t30 = t31 = TV<W>::zerof();
        b0 = b1 = b2 = _mm256_setzero_ps();
    }
};
template <int C, int U, class A>
LB_LG_INLINE auto &tacc(A &a) {
    static_assert(C < 4 && U < 4 && (C < 2 || U < 2), "");
    if constexpr (C == 0) {
        if constexpr (U == 0) return a.t00; else if constexpr (U == 1) return a.t01;
        else if constexpr (U == 2) return a.t02; else return a.t03;
    } else if constexpr (C == 1) {
        if constexpr (U == 0) return a.t10; else if constexpr (U == 1) return a.t11;
        else if constexpr (U == 2) return a.t12; else return a.t13;
    } else if constexpr (C == 2) {
        if constexpr (U == 0) return a.t20; else return a.t21;
    } else {
        if constexpr (U == 0) return a.t30; else return a.t31;
    }
}
template <int J, class A>
LB_LG_INLINE __m256 &bacc(A &a) {
    static_assert(J < 3, "");
    if constexpr (J == 0) return a.b0; else if constexpr (J == 1) return a.b1; else return a.b2;
}
// BT integer state of a group: per token, the pending even pair's lanes and the running hadd.
struct Bst { __m256i v0, v1, v2, h0, h1, h2; };
template <int J> LB_LG_INLINE __m256i &bv(Bst &B) { if constexpr (J == 0) return B.v0; else if constexpr (J == 1) return B.v1; else return B.v2; }
template <int J> LB_LG_INLINE __m256i &bh(Bst &B) { if constexpr (J == 0) return B.h0; else if constexpr (J == 1) return B.h1; else return B.h2; }

// ---- integer cores -------------------------------------------------------------------------------
// TT: for NC chunks (records r0, r1) the lanes isum[token][block] (+ the offset term).
template <class F, int W, int K, int NC>
LB_LG_INLINE void tt_step(typename TV<W>::I lo, typename TV<W>::I hi, const uint8_t *r0, const uint8_t *r1,
                          typename TV<W>::I &i0, typename TV<W>::I &i1, __m256i &s0, __m256i &s1) {
    using T = TV<W>;
    constexpr int V = 16 * W;
    const typename T::I u = T::template code<K>(lo, hi);
    if constexpr (kVnni) {
        i0 = T::dpb(i0, u, T::ld(r0 + V * K));
        if constexpr (NC > 1) i1 = T::dpb(i1, u, T::ld(r1 + V * K));
    } else if constexpr (F::kSign) {  // |w| x (a with w's sign), widened at once (kK16 = 1)
        const __m256i au = _mm256_sign_epi8(u, u);
        i0 = _mm256_add_epi32(i0, widen16(_mm256_maddubs_epi16(au, _mm256_sign_epi8(T::ld(r0 + V * K), u))));
        LB_LG_SEQ(i0);
        if constexpr (NC > 1) {
            i1 = _mm256_add_epi32(i1, widen16(_mm256_maddubs_epi16(au, _mm256_sign_epi8(T::ld(r1 + V * K), u))));
            LB_LG_SEQ(i1);
        }
    } else {  // int16 partials for kK16 steps, then widened
        const __m256i p0 = _mm256_maddubs_epi16(u, T::ld(r0 + V * K));
        s0 = (K % F::kK16 == 0) ? p0 : _mm256_add_epi16(s0, p0);
        LB_LG_SEQ(s0);
        if constexpr (K % F::kK16 == F::kK16 - 1) i0 = _mm256_add_epi32(i0, widen16(s0));
        if constexpr (NC > 1) {
            const __m256i p1 = _mm256_maddubs_epi16(u, T::ld(r1 + V * K));
            s1 = (K % F::kK16 == 0) ? p1 : _mm256_add_epi16(s1, p1);
            LB_LG_SEQ(s1);
            if constexpr (K % F::kK16 == F::kK16 - 1) i1 = _mm256_add_epi32(i1, widen16(s1));
        }
    }
}
template <class F, int W, int NC>
LB_LG_INLINE void tt_int(typename TV<W>::I lo, typename TV<W>::I hi, const uint8_t *r0, const uint8_t *r1,
                         typename TV<W>::I &i0, typename TV<W>::I &i1, int corr_off) {
    using T = TV<W>;
    i0 = F::kOff ? T::ld(r0 + corr_off) : T::zero();
    i1 = (NC > 1 && F::kOff) ? T::ld(r1 + corr_off) : T::zero();
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    tt_step<F, W, 0, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
    tt_step<F, W, 1, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
    tt_step<F, W, 2, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
    tt_step<F, W, 3, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
    tt_step<F, W, 4, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
    tt_step<F, W, 5, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
    tt_step<F, W, 6, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
    tt_step<F, W, 7, NC>(lo, hi, r0, r1, i0, i1, s0, s1);
}

// The wide window's four TT chunks (records r[0..3]; VNNI, so one dpbusd per chunk and k):
// each broadcast code dword u serves 4 chunks x 4 tokens. The same integers as tt_int's.
template <int W, int K>
LB_LG_INLINE void tt_step4(typename TV<W>::I lo, typename TV<W>::I hi, const uint8_t *const *r,
                           typename TV<W>::I &i0, typename TV<W>::I &i1, typename TV<W>::I &i2,
                           typename TV<W>::I &i3) {
    using T = TV<W>;
    constexpr int V = 16 * W;
    const typename T::I u = T::template code<K>(lo, hi);
    i0 = T::dpb(i0, u, T::ld(r[0] + V * K));
    i1 = T::dpb(i1, u, T::ld(r[1] + V * K));
    i2 = T::dpb(i2, u, T::ld(r[2] + V * K));
    i3 = T::dpb(i3, u, T::ld(r[3] + V * K));
}
template <class F, int W>
LB_LG_INLINE void tt_int4(typename TV<W>::I lo, typename TV<W>::I hi, const uint8_t *const *r, typename TV<W>::I &i0,
                          typename TV<W>::I &i1, typename TV<W>::I &i2, typename TV<W>::I &i3, int corr_off) {
    static_assert(kVnni && W > 0, "the wide window is a VNNI level's");
    using T = TV<W>;
    i0 = F::kOff ? T::ld(r[0] + corr_off) : T::zero();
    i1 = F::kOff ? T::ld(r[1] + corr_off) : T::zero();
    i2 = F::kOff ? T::ld(r[2] + corr_off) : T::zero();
    i3 = F::kOff ? T::ld(r[3] + corr_off) : T::zero();
    tt_step4<W, 0>(lo, hi, r, i0, i1, i2, i3);
    tt_step4<W, 1>(lo, hi, r, i0, i1, i2, i3);
    tt_step4<W, 2>(lo, hi, r, i0, i1, i2, i3);
    tt_step4<W, 3>(lo, hi, r, i0, i1, i2, i3);
    tt_step4<W, 4>(lo, hi, r, i0, i1, i2, i3);
    tt_step4<W, 5>(lo, hi, r, i0, i1, i2, i3);
    tt_step4<W, 6>(lo, hi, r, i0, i1, i2, i3);
    tt_step4<W, 7>(lo, hi, r, i0, i1, i2, i3);
}

// Unsigned codes (kK16 >= 2), one token, one pair (Alo at ra, Ahi at ra + 128): int16 lanes
// [b: 8 partial sums of 4 products | b+1: 8].
LB_LG_INLINE __m256i pair16(__m256i lo, __m256i hi, const uint8_t *ra) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, lda(ra)), _mm256_maddubs_epi16(hi, lda(ra + 128)));
}

// BT: one token, one pair (Alo at ra, Ahi at ra + 128): lanes [b: 4 partial sums | b+1: 4].
template <class F>
LB_LG_INLINE __m256i bt_int(__m256i lo, __m256i hi, const uint8_t *ra) {
    if constexpr (kVnni) {
        return dp(dp(_mm256_setzero_si256(), lo, lda(ra)), hi, lda(ra + 128));
    } else if constexpr (F::kSign) {
        const __m256i x = widen16(_mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(lda(ra), lo)));
        const __m256i y = widen16(_mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(lda(ra + 128), hi)));
        return _mm256_add_epi32(x, y);
    } else {
        static_assert(F::kK16 >= 2, "");
        return widen16(pair16(lo, hi, ra));
    }
}

// TT chunk by the hadd transpose (hadd_tt), token i's activations for the unit's pair at
// r + 32 i (layout at Lay). The result is [b: X0 X1 X2 X3 | b+1: the same], X_i = token 4c+i's
// isum, i.e. lane (h, i) = isum[4c + i][uW + h], TT's lane order: the offset term, the float
// step and the accumulators are TT's, so the result is bitwise tt_int's.
//   Unsigned codes: pair16 gives X_i as [b: 8 int16 partial sums | b+1: 8]; hadd16(X0, X1) =
//     [b: X0's 4 pairwise sums, X1's 4 | b+1: ...] (int16: 8 products, <= 8 * 24 * 127 = 24384
//     < 32767 for MXFP4), madd widens it to [b: X0 X0 X1 X1 | ...], one hadd32 with tokens 2,
//     3's finishes. Exact int32: |isum| <= 32 * 24 * 127 + 12 * 32 * 127 < 2^17.
//   Sign trick: bt_int gives X_i as [b: 4 int32 partial sums | b+1: 4] (its bounds); hadd32 of
//     tokens (0, 1) and (2, 3), then of those two.
// N tokens in the chunk; the lanes of tokens past them repeat the last one's sums (no zero
// register to hold; their d_a is 0 and they are never stored).
template <class F, int N>
LB_LG_INLINE __m256i tt_hadd(__m256i lo, __m256i hi, const uint8_t *r, int corr_off) {
    if constexpr (F::kSign) {  // int32 lanes per token (bt_int), three hadd32
        const __m256i p0 = bt_int<F>(lo, hi, r);
        const __m256i p1 = N > 1 ? bt_int<F>(lo, hi, r + 32) : p0;
        const __m256i x01 = _mm256_hadd_epi32(p0, p1);
        __m256i x23 = x01;
        if constexpr (N > 2) {
            const __m256i p2 = bt_int<F>(lo, hi, r + 64);
            const __m256i p3 = N > 3 ? bt_int<F>(lo, hi, r + 96) : p2;
            x23 = _mm256_hadd_epi32(p2, p3);
        }
        return _mm256_hadd_epi32(x01, x23);
    } else {
        static_assert(F::kOff != 0 && 8 * (F::kOff * 2) * 127 <= 32767, "hadd_tt: unsigned codes, int16 bound");
        const __m256i x0 = pair16(lo, hi, r);
        const __m256i x1 = N > 1 ? pair16(lo, hi, r + 32) : x0;
        const __m256i x01 = widen16(_mm256_hadd_epi16(x0, x1));
        __m256i x23 = x01;
        if constexpr (N > 2) {
            const __m256i x2 = pair16(lo, hi, r + 64);
            const __m256i x3 = N > 3 ? pair16(lo, hi, r + 96) : x2;
            x23 = widen16(_mm256_hadd_epi16(x2, x3));
        }
        return _mm256_add_epi32(_mm256_hadd_epi32(x01, x23), lda(r + corr_off));
    }
}

// ---- one group of 8 blocks --------------------------------------------------------------------
// 8 fp16 at stride B (the group's d, or its m at + 2) as floats in class order L, without a
// gather: two qwords of 4 halves packed in general registers, idle next to the vector pipes.
// Zen 3 runs vpgatherdd as microcode (it was a quarter of the direct path's time); on Zen 5
// (avx512) the gather's removal made the window kernels 1.14-1.33x faster at 1 token and
// 1.14-1.18x at 8 (Q4_0, Q4_1, Q8_0; BENCHMARKS.md). TAIL: the n < 8 blocks of a row's last
// group; the others read as 0 (a branch on n, the same for every row of a call).
template <int B, bool TAIL = false>
LB_LG_INLINE __m256 group_halves_gpr(const uint8_t *wg, int n = 8) {
    const auto h = [&](int i) { return (!TAIL || i < n) ? (uint64_t)ld16(wg + i * B) : (uint64_t)0; };
    const uint64_t even = h(0) | h(2) << 16 | h(4) << 32 | h(6) << 48, odd = h(1) | h(3) << 16 | h(5) << 32 | h(7) << 48;
    return _mm256_cvtph_ps(_mm_insert_epi64(_mm_cvtsi64_si128((long long)even), (long long)odd, 1));
}

// Tail group of n < 8 blocks at avx2 / avx2vnni, in class order L: kTailMask[n] all ones on the
// lanes of blocks 0..n-1, TailOffsets<B>::v[n] their byte offsets (0 elsewhere).
alignas(32) constexpr int32_t kTailMask[8][8] = {
    {0, 0, 0, 0, 0, 0, 0, 0},   {-1, 0, 0, 0, 0, 0, 0, 0},   {-1, 0, 0, 0, -1, 0, 0, 0},
    {-1, -1, 0, 0, -1, 0, 0, 0}, {-1, -1, 0, 0, -1, -1, 0, 0}, {-1, -1, -1, 0, -1, -1, 0, 0},
    {-1, -1, -1, 0, -1, -1, -1, 0}, {-1, -1, -1, -1, -1, -1, -1, 0}};
template <int B>
struct TailOffsets {  // byte offsets of the tail's blocks, in class order L
    struct T { alignas(32) int32_t v[8][8]; };
    static constexpr T make() {
        constexpr int L[8] = {0, 2, 4, 6, 1, 3, 5, 7};
        T t{};
        for (int n = 0; n < 8; ++n)
            for (int i = 0; i < 8; ++i) t.v[n][i] = L[i] < n ? L[i] * B : 0;
        return t;
    }
    static constexpr T t = make();
    static constexpr const int32_t (&v)[8][8] = t.v;
};
// group scales: dword (d, next half) -> d halves to qwords 0 / 2, the next halves to 1 / 3
constexpr C32 kPackCtl = rep16({0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15});

// group_scales of a tail group at avx2 / avx2vnni by a gather: missing blocks re-read block 0
// (inside the row), then are zeroed.
template <class F>
LB_LG_INLINE void group_scales_gather(const uint8_t *wg, int nrem, __m256 &dw, __m256 &mw) {
    constexpr int B = F::kBytes;
    const __m256i have = _mm256_load_si256((const __m256i *)kTailMask[nrem]);
    // (asm: GCC 12 leaves a dead stack store of a loaded gather index, which I7 counts)
    __m256i g, all, idx_t;
    __asm__("vmovdqa (%[tab]), %[i]\n\t"
            "vpcmpeqd %[m], %[m], %[m]\n\t"
            "vpgatherdd %[m], (%[base],%[i],1), %[g]"
            : [g] "=&x"(g), [m] "=&x"(all), [i] "=&x"(idx_t)
            : [base] "r"(wg), [tab] "r"(TailOffsets<B>::v[nrem]), "m"(*(const uint8_t(*)[8 * B])wg));
    g = _mm256_and_si256(g, have);
    if constexpr (kE8M0Scale<F>) {  // the dword's low byte is e (mxfp4.inl)
        dw = e8m0_half_ps(g);
        mw = _mm256_setzero_ps();
        return;
    }
    g = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(g, K(kPackCtl)), 0xD8);
    dw = _mm256_cvtph_ps(_mm256_castsi256_si128(g));
    if constexpr (F::kM) mw = _mm256_cvtph_ps(_mm256_extracti128_si256(g, 1));
    else mw = _mm256_setzero_ps();
}

// d_w (and m_w) of the group's blocks in class order L, as floats; missing blocks read 0.
template <class F, bool TAIL>
LB_LG_INLINE void group_scales(const uint8_t *wg, int nrem, __m256 &dw, __m256 &mw) {
    constexpr int B = F::kBytes;
    // general registers, not a gather (group_halves_gpr); a row's tail group too at avx512 (at
    // avx2 / avx2vnni the tail's extra general-register work made GCC spill a ymm of Q4_1's, Q5_1's
    // and MXFP4's kernels: I7)
    if constexpr (TAIL && LB_LG_LEVEL != 3) {
        group_scales_gather<F>(wg, nrem, dw, mw);
    } else if constexpr (kE8M0Scale<F>) {
        // (a missing block's e = 0 gives 2^-128, as the gather it replaced did: its codes and
        // activations are 0)
        dw = e8m0_half_ps(e8m0_group<B, TAIL>(wg, nrem));
        mw = _mm256_setzero_ps();
    } else {
        dw = group_halves_gpr<B, TAIL>(wg, nrem);
        mw = F::kM ? group_halves_gpr<B, TAIL>(wg + 2, nrem) : _mm256_setzero_ps();
    }
}
// per_unit_scales: [d_b x4 | d_b+1 x4] (and the same of m) for the pair of blocks at b, as
// TV<2>::unit_scale makes them from group_scales; `two` false: block b+1 is absent (0).
constexpr C32 halves_idx(int i) {  // vpermps index: dword i in lanes 0..3, dword i + 2 in 4..7
    C32 c{};
    for (int l = 0; l < 8; ++l) c.b[4 * l] = (uint8_t)(l < 4 ? i : i + 2);
    return c;
}
constexpr C32 kIdxD = halves_idx(0), kIdxM = halves_idx(1);
template <class F, bool TAIL>
LB_LG_INLINE void unit_scales(const uint8_t *b, bool two, __m256 &dw, __m256 &mw) {
    static_assert(!kE8M0Scale<F>, "per_unit_scales is for an fp16 d (and m)");
    // halves [d_b m_b d_b+1 m_b+1] -> floats, lanes 0..3
    uint32_t h1;
    if constexpr (TAIL) {
        // block b+1's dword without a branch (the row's last block b reads itself, zeroed);
        // k opaque, or clang turns it back into a branch or a mask hoisted out of the rows
        size_t k = two;
        __asm__ volatile("" : "+r"(k));
        h1 = ld32(b + F::kBytes * k) & (uint32_t)(0 - k);
    } else {
        h1 = ld32(b + F::kBytes);
    }
    const __m128i h = _mm_insert_epi32(_mm_cvtsi32_si128((int)ld32(b)), (int)h1, 1);
    const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(h));
    dw = _mm256_permutevar8x32_ps(f, K(kIdxD));
    if constexpr (F::kM) mw = _mm256_permutevar8x32_ps(f, K(kIdxM));
    else mw = _mm256_setzero_ps();
}

// BT tokens, one pair P (codes lo / hi; `have` false: the pair is past the row's end). Pairs
// (0, 1) and (2, 3) are summed pairwise by hadd32 of bt_int's int32 lanes; with the hadd
// transpose's formats (MXFP4, unsigned codes) and no TT chunk (nt 1, 2), by hadd16 of pair16's
// int16 lanes then one madd (two madds fewer per group and token; int16 bound at tt_hadd): the
// same lanes either way. (Next to a TT chunk, nt 5, clang spills the scales with it: I7.)
template <class F, int NT, int P, int J>
LB_LG_INLINE void bt_pair(__m256i lo, __m256i hi, const uint8_t *rg, bool have, Bst &B) {
    using Y = Lay<F, NT>;
    if constexpr (J < Y::P.bt) {
        constexpr bool i16 = hadd_tt<F, NT>() && !F::kSign && Y::P.tt == 0;
        const uint8_t *ra = rg + Y::bt_rec(J) + 32 * P;
        const __m256i v = !have ? _mm256_setzero_si256() : i16 ? pair16(lo, hi, ra) : bt_int<F>(lo, hi, ra);
        __m256i s;  // pairs P-1, P summed: [b: 2 | b+1: 2 ...] as after one hadd32
        if constexpr (P % 2 == 1) s = i16 ? widen16(_mm256_hadd_epi16(bv<J>(B), v)) : _mm256_hadd_epi32(bv<J>(B), v);
        if constexpr (P == 0 || P == 2) bv<J>(B) = v;
        else if constexpr (P == 1) bh<J>(B) = s;
        else bh<J>(B) = _mm256_hadd_epi32(bh<J>(B), s);  // lanes: class order L
        bt_pair<F, NT, P, J + 1>(lo, hi, rg, have, B);
    }
}

template <class T, int U, bool OWN>
LB_LG_INLINE auto unit_scale_of(__m256 v) {
    if constexpr (OWN) return v;
    else return T::template unit_scale<U>(v);
}
// TT: float step of chunk C for unit U (integer lanes i). dw / mw: the group's scales, or
// (OWN, per_unit_scales) the unit's own, already in its lane order.
template <class F, int NT, int C, int U, bool OWN, class A>
LB_LG_INLINE void tt_float(typename TV<unit_width(NT)>::I i, const uint8_t *rec, __m256 dw, __m256 mw, A &acc) {
    using Y = Lay<F, NT>;
    using T = TV<Y::W>;
    auto &a = tacc<C, U>(acc);
    a = T::fma(T::cvt(i), T::mul(unit_scale_of<T, U, OWN>(dw), T::ldf(rec + Y::kDA)), a);
    if constexpr (F::kM) a = T::fma(unit_scale_of<T, U, OWN>(mw), T::ldf(rec + Y::kSA), a);
}

template <class F, int NT, bool TAIL, int U, class A>
LB_LG_INLINE void unit(const uint8_t *wg, const uint8_t *rg, int nrem, __m256 dw, __m256 mw, A &acc, Bst &B) {
    using Y = Lay<F, NT>;
    constexpr int W = Y::W;
    using T = TV<W>;
    const int nu = TAIL ? (nrem - U * W < 0 ? 0 : nrem - U * W > W ? W : nrem - U * W) : W;  // blocks present
    typename T::I lo = T::zero(), hi = T::zero();
    if (nu > 0) {
        if constexpr (W == 2) decode_pair<F>(wg + U * W * F::kBytes, nu > 1, lo, hi);
#if LB_LG_LEVEL == 3
        else decode_quad<F>(wg + U * W * F::kBytes, nu, lo, hi);
#endif
    }
    if constexpr (Y::P.tt == 4) {  // the wide window: 4 chunks, the group's scales
        if (nu > 0) {
            const uint8_t *r[4] = {rg + Y::tt_rec(0, U), rg + Y::tt_rec(1, U), rg + Y::tt_rec(2, U), rg + Y::tt_rec(3, U)};
            typename T::I i0, i1, i2, i3;
            tt_int4<F, W>(lo, hi, r, i0, i1, i2, i3, Y::kCORR);
            tt_float<F, NT, 0, U, false>(i0, r[0], dw, mw, acc);
            tt_float<F, NT, 1, U, false>(i1, r[1], dw, mw, acc);
            tt_float<F, NT, 2, U, false>(i2, r[2], dw, mw, acc);
            tt_float<F, NT, 3, U, false>(i3, r[3], dw, mw, acc);
        }
    } else if constexpr (Y::P.tt > 0) {
        if (nu > 0) {
            const uint8_t *r0 = rg + Y::tt_rec(0, U), *r1 = rg + Y::tt_rec(Y::P.tt > 1 ? 1 : 0, U);
            typename T::I i0, i1;
            if constexpr (hadd_tt<F, NT>()) {
                constexpr int n0 = NT - Y::P.bt < 4 ? NT - Y::P.bt : 4, n1 = NT - Y::P.bt - n0;  // tokens per chunk
                i0 = tt_hadd<F, n0>(lo, hi, r0, Y::kCORR);
                if constexpr (Y::P.tt > 1) i1 = tt_hadd<F, n1>(lo, hi, r1, Y::kCORR);
            } else if constexpr (share_u<F>() || Y::P.tt == 1) {
                tt_int<F, W, Y::P.tt>(lo, hi, r0, r1, i0, i1, Y::kCORR);
            } else {
                typename T::I unused, lo1 = lo, hi1 = hi;
                tt_int<F, W, 1>(lo, hi, r0, r0, i0, unused, Y::kCORR);
                // keeps the compiler from sharing chunk 0's broadcast codes with chunk 1 (it
                // would hold all 8 live at once): they are recomputed, in registers
                __asm__("" : "+x"(lo1), "+x"(hi1));
                tt_int<F, W, 1>(lo1, hi1, r1, r1, i1, unused, Y::kCORR);
            }
            if constexpr (per_unit_scales<F, NT>()) {
                __m256 du, mu;
                unit_scales<F, TAIL>(wg + U * W * F::kBytes, nu > 1, du, mu);
                tt_float<F, NT, 0, U, true>(i0, r0, du, mu, acc);
                if constexpr (Y::P.tt > 1) tt_float<F, NT, 1, U, true>(i1, r1, du, mu, acc);
            } else {
                tt_float<F, NT, 0, U, false>(i0, r0, dw, mw, acc);
                if constexpr (Y::P.tt > 1) tt_float<F, NT, 1, U, false>(i1, r1, dw, mw, acc);
            }
        }
    }
    if constexpr (Y::P.bt > 0) {
        if constexpr (W == 2) {
            bt_pair<F, NT, U, 0>(lo, hi, rg, nu > 0, B);
        } else {
#if LB_LG_LEVEL == 3
            bt_pair<F, NT, 2 * U, 0>(_mm512_maskz_extracti64x4_epi64(0xF, lo, 0), _mm512_maskz_extracti64x4_epi64(0xF, hi, 0), rg,
                                     nu > 0, B);
            bt_pair<F, NT, 2 * U + 1, 0>(_mm512_maskz_extracti64x4_epi64(0xF, lo, 1), _mm512_maskz_extracti64x4_epi64(0xF, hi, 1), rg,
                                         nu > 2, B);
#endif
        }
    }
}

template <class F, int NT, int J, class A>
LB_LG_INLINE void bt_group_end(const uint8_t *rg, __m256 dw, __m256 mw, A &acc, Bst &B) {
    using Y = Lay<F, NT>;
    if constexpr (J < Y::P.bt) {
        const uint8_t *rb = rg + Y::bt_rec(J);
        __m256i isum = bh<J>(B);
        if constexpr (F::kOff != 0) isum = _mm256_add_epi32(isum, lda(rb + Y::kBCORR));
        __m256 &a = bacc<J>(acc);
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, ldf(rb + Y::kBDA)), a);
        if constexpr (F::kM) a = _mm256_fmadd_ps(mw, ldf(rb + Y::kBSA), a);
        bt_group_end<F, NT, J + 1>(rg, dw, mw, acc, B);
    }
}

// The direct path (direct()): one token, one block: lanes = 8 int32 partial sums of 4
// products (sign trick, its bound), the block's codes and activations each one 32-byte load.
template <class F>
LB_LG_INLINE __m256i direct_block(const uint8_t *b, const uint8_t *ra) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)(b + F::kQs));
    return widen16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(lda(ra), w)));
}
// A group on the direct path: blocks i of the group, partial sums v_i (0 for blocks past the
// row). Two hadd levels give e = [v0 v2 v4 v6 summed over their lanes 0..3 | over lanes 4..7]
// and o the same of v1 v3 v5 v7; [e.lo | o.hi] + [e.hi | o.lo] is the 8 blocks' isum in class
// order L, BT's lanes: the same integers into the same float step (bt_group_end's).
template <class F, bool TAIL>
LB_LG_INLINE void group_direct(const uint8_t *wg, const uint8_t *rg, int nrem, __m256 &acc) {
    using Y = Lay<F, 1>;
    const auto v = [&](int i) {
        return (!TAIL || i < nrem) ? direct_block<F>(wg + i * F::kBytes, rg + 32 * i) : _mm256_setzero_si256();
    };
    const __m256i e = _mm256_hadd_epi32(_mm256_hadd_epi32(v(0), v(2)), _mm256_hadd_epi32(v(4), v(6)));
    const __m256i o = _mm256_hadd_epi32(_mm256_hadd_epi32(v(1), v(3)), _mm256_hadd_epi32(v(5), v(7)));
    const __m256i isum = _mm256_add_epi32(_mm256_blend_epi32(e, o, 0xF0), _mm256_permute2x128_si256(e, o, 0x21));
    __m256 dw, mw;
    group_scales<F, TAIL>(wg, nrem, dw, mw);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, ldf(rg + Y::kBDA)), acc);
}

template <class F, int NT, bool TAIL, class A>
LB_LG_INLINE void group(const uint8_t *wg, const uint8_t *rg, int nrem, A &acc) {
    using Y = Lay<F, NT>;
    if constexpr (direct<F, NT>()) {
        group_direct<F, TAIL>(wg, rg, nrem, bacc<0>(acc));
        return;
    }
    // TT needs the scales at every unit, BT only at the group's end (shorter live range)
    constexpr bool early = Y::P.tt > 0 && !per_unit_scales<F, NT>();
    __m256 dw = _mm256_setzero_ps(), mw = _mm256_setzero_ps();
    if constexpr (early) group_scales<F, TAIL>(wg, nrem, dw, mw);
    Bst B;
    unit<F, NT, TAIL, 0>(wg, rg, nrem, dw, mw, acc, B);
    unit<F, NT, TAIL, 1>(wg, rg, nrem, dw, mw, acc, B);
    if constexpr (Y::U > 2) {
        unit<F, NT, TAIL, 2>(wg, rg, nrem, dw, mw, acc, B);
        unit<F, NT, TAIL, 3>(wg, rg, nrem, dw, mw, acc, B);
    }
    if constexpr (!early && Y::P.bt > 0) group_scales<F, TAIL>(wg, nrem, dw, mw);
    bt_group_end<F, NT, 0>(rg, dw, mw, acc, B);
}

// ---- the final tree --------------------------------------------------------------------------
LB_LG_INLINE void put(float *out, size_t i, __m128 v) { _mm_store_ss(out + i, v); }
LB_LG_INLINE __m128 fold(__m256 v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); }

// e[p] = class 2p + class 2p+1 for 4 tokens (lanes) of TT chunk C
template <int NT, int C, class A>
LB_LG_INLINE void finish_tt(A &acc, const RowArgs &a, int64_t r) {
    constexpr Plan PL = plan(NT);
    if constexpr (C < PL.tt) {
        __m128 e0, e1, e2, e3;
        if constexpr (unit_width(NT) == 2) {
            e0 = fold(tacc<C, 0>(acc)), e1 = fold(tacc<C, 1>(acc));
            e2 = fold(tacc<C, 2>(acc)), e3 = fold(tacc<C, 3>(acc));
        } else {
#if LB_LG_LEVEL == 3
            // (the template arguments in parentheses: clang's extract intrinsics are macros)
            e0 = fold(_mm512_maskz_extractf32x8_ps(0xFF, (tacc<C, 0>(acc)), 0)), e1 = fold(_mm512_maskz_extractf32x8_ps(0xFF, (tacc<C, 0>(acc)), 1));
            e2 = fold(_mm512_maskz_extractf32x8_ps(0xFF, (tacc<C, 1>(acc)), 0)), e3 = fold(_mm512_maskz_extractf32x8_ps(0xFF, (tacc<C, 1>(acc)), 1));
#endif
        }
        const __m128 res = _mm_add_ps(_mm_add_ps(e0, e1), _mm_add_ps(e2, e3));
        const size_t os = a.out_stride;
        if constexpr (4 * C + 0 < NT) put(a.out, (4 * C + 0) * os + r, res);
        if constexpr (4 * C + 1 < NT) put(a.out, (4 * C + 1) * os + r, _mm_movehdup_ps(res));
        if constexpr (4 * C + 2 < NT) put(a.out, (4 * C + 2) * os + r, _mm_movehl_ps(res, res));
        if constexpr (4 * C + 3 < NT) put(a.out, (4 * C + 3) * os + r, _mm_shuffle_ps(res, res, 3));
        finish_tt<NT, C + 1>(acc, a, r);
    }
}
template <int NT, int J, class A>
LB_LG_INLINE void finish_bt(A &acc, const RowArgs &a, int64_t r) {
    constexpr Plan PL = plan(NT);
    if constexpr (J < PL.bt) {
        const __m128 e = fold(bacc<J>(acc));                 // [c0+c1, c2+c3, c4+c5, c6+c7]
        const __m128 f = _mm_add_ps(e, _mm_movehdup_ps(e));  // [e0+e1, ., e2+e3, .]
        put(a.out, (size_t)(4 * PL.tt + J) * a.out_stride + r, _mm_add_ss(f, _mm_movehl_ps(f, f)));
        finish_bt<NT, J + 1>(acc, a, r);
    }
}

// ---- long rows: slices of K -------------------------------------------------------------------
// A row streams through the window's activation records (Lay::kGroup bytes per group of 8
// blocks: 2560 at 8 tokens, 5120 at 16), which must stay in L1: past it every record load of
// every row comes from L2 (n = 14336 at 8 tokens: 143 KB of records; the windows ran at 0.45x of
// their per-MAC speed at n = 4096; BENCHMARKS.md, round (8)). So rows whose records pass 85% of
// L1D go in slices of that many groups: for a tile of kSliceTileRows rows (their weights stay in
// L2 across the slices), slice by slice, each row's accumulators saved between slices and loaded
// back. A row's blocks still go through the same steps in block order (the classes' fma chains
// continue across a slice's end; BT's pending sums end with each group), so every result is
// bitwise the unsliced one.
constexpr int64_t kSliceTileRows = 32;
// d = s for the accumulators window NT uses (a whole Acc would move unused vectors, and GCC
// routes that copy through the stack: I7)
template <int NT, int C = 0, int U = 0, class A>
LB_LG_INLINE void acc_copy(A &d, const A &s) {
    constexpr Plan P = plan(NT);
    constexpr int NU = 8 / unit_width(NT);
    if constexpr (C < P.tt && U < NU) {
        tacc<C, U>(d) = tacc<C, U>(s);
        acc_copy<NT, C, U + 1>(d, s);
    } else if constexpr (C < P.tt) {
        acc_copy<NT, C + 1, 0>(d, s);
    } else {
        if constexpr (P.bt > 0) d.b0 = s.b0;
        if constexpr (P.bt > 1) d.b1 = s.b1;
        if constexpr (P.bt > 2) d.b2 = s.b2;
    }
}
template <class F, int NT>
int64_t slice_groups() {
    static const int64_t g = [] {
        long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
        if (l1 <= 0) l1 = 32 * 1024;
        return std::max<int64_t>(1, (int64_t)(0.85 * (double)l1) / (int64_t)Lay<F, NT>::kGroup);
    }();
    return g;
}

// Rows [tb, te) of one slice, groups [g0, g1) (records from rg0): the accumulators from buf (zeros
// before the first slice); last: the row's tail group and its results, else the accumulators
// back to buf.
// (Its own function: the tile and slice loops' variables beside the group loop's would cost
// general registers the group's scale loads need; GCC then parks them in xmm: I7.)
template <class F, int NT>
__attribute__((noinline)) void slice_rows(const RowArgs &a, int64_t tb, int64_t te, const uint8_t *rg0, int64_t g0,
                                          int64_t g1, int nrem, bool last, Acc<Lay<F, NT>::W> *buf) {
    using Y = Lay<F, NT>;
    for (int64_t r = tb; r < te; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        Acc<Y::W> acc;
        acc_copy<NT>(acc, buf[r - tb]);
        const uint8_t *rg = rg0;
        for (int64_t g = g0; g < g1; ++g, rg += Y::kGroup) {
            prefetch_ahead(w + g * 8 * F::kBytes, 8 * F::kBytes);
            group<F, NT, false>(w + g * 8 * F::kBytes, rg, 8, acc);
        }
        if (!last) {
            acc_copy<NT>(buf[r - tb], acc);
            continue;
        }
        if (nrem) group<F, NT, true>(w + g1 * 8 * F::kBytes, rg, nrem, acc);
        finish_tt<NT, 0>(acc, a, r);
        finish_bt<NT, 0>(acc, a, r);
    }
}

template <class F, int NT>
void rows_sliced(const RowArgs &a, int64_t r0, int64_t r1, const uint8_t *prep, int64_t full, int nrem) {
    using Y = Lay<F, NT>;
    // (the accumulators start from zeros in buf, not from a branch in slice_rows: the compilers
    // otherwise merge the two starts through a stack slot or run out of general registers, I7)
    static thread_local Acc<Y::W> buf[kSliceTileRows], zero;
    const int64_t S = slice_groups<F, NT>();
    for (int64_t tb = r0; tb < r1; tb += kSliceTileRows) {
        const int64_t te = std::min(tb + kSliceTileRows, r1);
        for (int64_t i = 0; i < te - tb; ++i) acc_copy<NT>(buf[i], zero);
        for (int64_t g0 = 0; g0 < full; g0 += S) {
            const int64_t g1 = std::min(g0 + S, full);
            slice_rows<F, NT>(a, tb, te, prep + (size_t)g0 * Y::kGroup, g0, g1, nrem, g1 == full, buf);
        }
    }
}

template <class F, int NT>
__attribute__((noinline)) void rows_nt(const RowArgs &a, int64_t r0, int64_t r1) {
    using Y = Lay<F, NT>;
    const int64_t nb = a.n / QK, full = nb / 8;
    const int nrem = (int)(nb % 8);
    if (r1 <= r0) return;
    const uint8_t *prep = prepare<F, NT>(a, nb);
    if (full > slice_groups<F, NT>()) return rows_sliced<F, NT>(a, r0, r1, prep, full, nrem);
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        Acc<Y::W> acc;
        const uint8_t *rg = prep;
        for (int64_t g = 0; g < full; ++g, rg += Y::kGroup) {
            prefetch_ahead(w + g * 8 * F::kBytes, 8 * F::kBytes);
            group<F, NT, false>(w + g * 8 * F::kBytes, rg, 8, acc);
        }
        if (nrem) group<F, NT, true>(w + full * 8 * F::kBytes, rg, nrem, acc);
        finish_tt<NT, 0>(acc, a, r);
        finish_bt<NT, 0>(acc, a, r);
    }
}


// rows_nt<F, NT> as a rows_fn (nt is NT)
template <class F, int NT>
void rows_nt_any(const RowArgs &a, int64_t r0, int64_t r1, int) { rows_nt<F, NT>(a, r0, r1); }

template <class F>
void rows(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    switch (nt) {
        case 1: rows_nt<F, 1>(a, r0, r1); break;
        case 2: rows_nt<F, 2>(a, r0, r1); break;
        case 3: rows_nt<F, 3>(a, r0, r1); break;
        case 4: rows_nt<F, 4>(a, r0, r1); break;
        case 5: rows_nt<F, 5>(a, r0, r1); break;
        case 6: rows_nt<F, 6>(a, r0, r1); break;
        case 7: rows_nt<F, 7>(a, r0, r1); break;
        case 8: rows_nt<F, 8>(a, r0, r1); break;
        default: break;
    }
}

}  // namespace
}  // namespace LOWBIT_NS
}  // namespace lowbit

namespace lowbit {
namespace LOWBIT_NS {

void register_legacy(KernelTable &t) {
#define LB_LG_NAME(w, a) "rows_" w "_" a "_" LB_LG_STR(LOWBIT_NS)
    t.set_rows_all(T_Q4_0, rows<FQ4_0>, LB_LG_NAME("q4_0", "q8_0"), LOWBIT_ISA);
    t.set_rows_all(T_Q4_1, rows<FQ4_1>, LB_LG_NAME("q4_1", "q8_1"), LOWBIT_ISA);
    t.set_rows_all(T_Q5_0, rows<FQ5_0>, LB_LG_NAME("q5_0", "q8_0"), LOWBIT_ISA);
    t.set_rows_all(T_Q5_1, rows<FQ5_1>, LB_LG_NAME("q5_1", "q8_1"), LOWBIT_ISA);
    t.set_rows_all(T_Q8_0, rows<FQ8_0>, LB_LG_NAME("q8_0", "q8_0"), LOWBIT_ISA);
    t.set_rows_all(T_IQ4_NL, rows<FIQ4_NL>, LB_LG_NAME("iq4_nl", "q8_0"), LOWBIT_ISA);
    t.set_rows_all(T_MXFP4, rows<FMXFP4>, LB_LG_NAME("mxfp4", "q8_0"), LOWBIT_ISA);
#undef LB_LG_NAME
#if LB_LG_LEVEL == 3
// The wide window (KernelEntry::wide): rows_nt<F, 16>, four TT chunks sharing each broadcast code
// dword and each row's decode (rows of any length: rows_sliced). Against two 8-token windows
// (BENCHMARKS.md, round (8); Zen 5, one thread): 1.17-1.49x at n = 576 .. 2048 and 16 tokens,
// 1.11-1.48x at n = 2304 .. 14336 (both sliced there), every format.
#define LB_LG_WIDE(id, F, w, a) \
    t.at(id).wide = RowKernel{&rows_nt_any<F, 16>, "rows16_" w "_" a "_" LB_LG_STR(LOWBIT_NS), LOWBIT_ISA}
    LB_LG_WIDE(T_Q4_0, FQ4_0, "q4_0", "q8_0");
    LB_LG_WIDE(T_Q4_1, FQ4_1, "q4_1", "q8_1");
    LB_LG_WIDE(T_Q5_0, FQ5_0, "q5_0", "q8_0");
    LB_LG_WIDE(T_Q5_1, FQ5_1, "q5_1", "q8_1");
    LB_LG_WIDE(T_Q8_0, FQ8_0, "q8_0", "q8_0");
    LB_LG_WIDE(T_IQ4_NL, FIQ4_NL, "iq4_nl", "q8_0");
    LB_LG_WIDE(T_MXFP4, FMXFP4, "mxfp4", "q8_0");
#undef LB_LG_WIDE
#endif
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
