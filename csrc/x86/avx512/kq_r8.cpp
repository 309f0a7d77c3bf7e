// Q4_K, Q5_K and IQ4_XS x Q8_K row kernels on their R8 layouts (csrc/repack.h: 8 rows' super-blocks
// interleaved by code dword), at the avx512 level (256-bit vectors: AVX512-VNNI with VL). The
// contract is csrc/kernels.h's on the repacked bytes: out[t * out_stride + r] for r in [r0, r1),
// t < nt, any range (a group of 8 rows cut by the range is computed whole and only its rows in it
// stored).
//
// Lanes are ROWS: lane j of every vector belongs to row 8g + j of the group. One 32-byte load is
// code dword k of chunk c for the 8 rows; its low nibbles (sub-block 2c) and high nibbles
// (sub-block 2c + 1) each go into one vpdpbusd against that token's activation dword k of the
// sub-block, broadcast from memory to every lane. So a row's sub-block sum is complete in its
// lane after 8 of them: no horizontal sums, no per-row shuffles of codes or scales, and every
// code vector serves every token of the pass. (The row-major kernels, csrc/x86/kquants.inl,
// spend per row and super-block the codes' shuffles, a madd with the scale per chunk and a
// horizontal reduction; on Zen 4 one token here runs ~1.9x their speed for Q4_K, ~1.7x for
// Q5_K, BENCHMARKS.md.) Q5_K: the 32-byte load of qh dword k (the same for every chunk) gives
// each code byte its fifth bit: bit 2c (low nibble) or 2c + 1 (high) of the byte, tested into a
// byte mask (vptestmb) that adds 16 to those codes (masked vpaddb).
//
// Arithmetic, per (row, token, super-block): the exact integers of csrc/x86/kquants.inl's
// header, I = sum_s sc[s] * isum[s] (isum: the sub-block's sum of u * q_a, u = 0..15 (Q5_K:
// 0..31); int32 products sc * isum <= 63 * 125984) and M = sum_s mn[s] * (bsums[2s] +
// bsums[2s+1]) (int16 pairs: |bsums pair| <= 4064, dpwssd exact), then its two float steps in
// super-block order,
//   acc = fma(d_a * d, (float)I, acc);  acc = fnmadd(d_a * dmin, (float)M, acc)
// lane-wise: the same operations on the same values as the format's own entry's kernels and
// GEMM, so each (row, token) result is bitwise theirs (I2, I3, I8; tests/test_repack.py).
//
// Tokens go 4 at a time for Q4_K (4 accumulators, 4 sums, 8 sub-block sums in flight), 3 for
// Q5_K (its fifth bits take registers); a longer window runs further passes of the group while
// its rows are still in L1.
//
// IQ4_XS (group_rows_iq4, below): the same scheme on its R8 layout, one 32-byte load per code
// dword k of sub-block s (both nibbles belong to s), the nibbles turned into kvalues_iq4nl + 128
// by vpshufb, its +128 taken back through the Q8_K bsums, and its i-quant float step (a multiply
// then an add). 4 tokens a pass. Zen 4, 2 MB of rows (`lowbit bench kernels --formats
// IQ4_XS,IQ4_XS_R8 --n 4096 --mb 2 --cpu 1 --clock cpu --stat min`): 2.3x IQ4_XS's row-major
// windows at 1, 2 and 4 tokens, 1.9x at 8.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../../kernels.h"
#include "../../ref/iq_tables.h"
#include "../../repack.h"
#include "../prefetch.h"
#include "../tokens.h"

namespace lowbit {
namespace avx512 {
namespace {

#include "../kq_r8.inl"

// pshufb control: byte B of each dword zero-extended to int32 (a sub-block's scale)
constexpr Ctl byte_ctl(int B) {
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (i % 4 == 0) ? (uint8_t)((i % 16) + B) : 0x80;
    return c;
}
constexpr Ctl kByte[4] = {byte_ctl(0), byte_ctl(1), byte_ctl(2), byte_ctl(3)};
// A constant read where it is used (its address hidden from the optimiser), for Q5_K's kernels:
// hoisted out of the loops, clang kept these in a stack slot (I7), the registers being taken by
// the fifth bits' vectors.
LB_R8_INLINE __m256i opaque(const Ctl &c) {
    const Ctl *p = &c;
    __asm__("" : "+r"(p));
    return _mm256_load_si256((const __m256i *)p->b);
}


// Rows 8g .. 8g+7 against tokens y[0..NT): res[t] lane j = the result of row 8g + j.
// Q5: Q5_K's groups (their fifth bits at kR8Qh, codes at kR8QsQ5), else Q4_K's.
template <bool Q5, int NT>
LB_R8_INLINE void group_rows(const RowArgs &a, int64_t g, int t0, __m256 (&res)[NT]) {
    constexpr size_t kGroup = Q5 ? kR8GroupQ5 : kR8Group, kQs = Q5 ? kR8QsQ5 : 128;
    const int64_t nb = a.n / QK_K;
    const uint8_t *y[NT];  // the tokens' activation rows
    LB_TOKENS(NT, y[t] = a.act + (size_t)(t0 + t) * a.act_stride);
    const uint8_t *base = a.w + (size_t)g * kR8Rows * a.w_stride;
    const __m256i m0F = _mm256_set1_epi8(0x0F);
    __m256 acc[NT];
    LB_TOKENS(NT, acc[t] = _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *o = base + (size_t)b * kGroup;
        prefetch_group<kGroup>(o, nb, t0);
        // scale / min bytes of the 8 rows: sc 0..3, mn 0..3 (6 bits), then sc 4..7, mn 4..7
        // (low 4 bits in bytes 8..11, high 2 bits in the top of bytes 0..7): lane j, byte s
        const __m256i m3F = Q5 ? opaque(k3F) : _mm256_set1_epi8(0x3F), m30 = Q5 ? opaque(k30) : _mm256_set1_epi8(0x30);
        __m256i sclo, schi;
        // held across the chunks, but for Q5_K's passes of 3 (its fifth bits leave no registers)
        constexpr bool kHold = !Q5 || NT <= 2;
        if constexpr (kHold) {
            const __m256i s0 = _mm256_loadu_si256((const __m256i *)(o + 32)), s2 = _mm256_loadu_si256((const __m256i *)(o + 96));
            sclo = _mm256_and_si256(s0, m3F);
            schi = _mm256_or_si256(_mm256_and_si256(s2, m0F), _mm256_and_si256(_mm256_srli_epi16(s0, 2), m30));
        }
        __m256i I[NT];
        LB_TOKENS(NT, I[t] = _mm256_setzero_si256());
        for (int c = 0; c < 4; ++c) {
            __m256i e[NT], od[NT];  // sub-blocks 2c, 2c + 1
            LB_TOKENS(NT, e[t] = _mm256_setzero_si256(); od[t] = _mm256_setzero_si256());
            const size_t qa = (size_t)b * QBLK + QOFF_QS + 64 * (size_t)c;
            const uint8_t *q = o + kQs + 256 * (size_t)c;
            // Q5: qh bits 2c / 2c + 1 of each byte are the fifth bits of its low / high nibble
            const __m256i blo = _mm256_set1_epi8((char)(1 << (2 * c))), bhi = _mm256_set1_epi8((char)(2 << (2 * c)));
            // (the same qh vectors serve every chunk: their address hidden per chunk, or GCC
            // would hold all 8 across the chunks and spill the sums instead: I7)
            const uint8_t *qh = o + kR8Qh;
            if constexpr (Q5) __asm__("" : "+r"(qh));
            for (int k = 0; k < 8; ++k) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * k));
                __m256i lo = _mm256_and_si256(x, m0F), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m0F);
                if constexpr (Q5) {
                    const __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 32 * k)), b16 = _mm256_set1_epi8(16);
                    lo = _mm256_mask_add_epi8(lo, _mm256_test_epi8_mask(h, blo), lo, b16);
                    hi = _mm256_mask_add_epi8(hi, _mm256_test_epi8_mask(h, bhi), hi, b16);
                }
                LB_TOKENS(NT, e[t] = _mm256_dpbusd_epi32(e[t], lo, _mm256_set1_epi32(ld32(y[t] + qa + 4 * k)));
                                 od[t] = _mm256_dpbusd_epi32(od[t], hi, _mm256_set1_epi32(ld32(y[t] + qa + 32 + 4 * k))));
            }
            __m256i sv;
            if constexpr (!kHold) {  // read again per chunk (an address hidden from the optimiser: I7)
                const uint8_t *os = o;
                __asm__("" : "+r"(os));
                const __m256i s0 = _mm256_loadu_si256((const __m256i *)(os + 32));
                sv = c < 2 ? _mm256_and_si256(s0, m3F)
                           : _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(os + 96)), m0F),
                                             _mm256_and_si256(_mm256_srli_epi16(s0, 2), m30));
            } else {
                sv = c < 2 ? sclo : schi;
            }
            const __m256i se = _mm256_shuffle_epi8(sv, ctl(kByte[(2 * c) % 4])), so = _mm256_shuffle_epi8(sv, ctl(kByte[(2 * c + 1) % 4]));
            LB_TOKENS(NT, I[t] = _mm256_add_epi32(I[t], _mm256_add_epi32(_mm256_mullo_epi32(se, e[t]), _mm256_mullo_epi32(so, od[t]))));
        }
        // M: mins as int16 pairs (mn 2p, 2p + 1) against the token's bsums pairs
        const __m256i s1 = _mm256_loadu_si256((const __m256i *)(o + 64)), s2 = _mm256_loadu_si256((const __m256i *)(o + 96));
        const __m256i mnlo = _mm256_and_si256(s1, m3F);
        const __m256i mnhi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(s2, 4), m0F), _mm256_and_si256(_mm256_srli_epi16(s1, 2), m30));
        const __m256i A0 = _mm256_shuffle_epi8(mnlo, ctl(kPair[0])), A1 = _mm256_shuffle_epi8(mnlo, ctl(kPair[1]));
        const __m256i A2 = _mm256_shuffle_epi8(mnhi, ctl(kPair[0])), A3 = _mm256_shuffle_epi8(mnhi, ctl(kPair[1]));
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16)));
        LB_TOKENS(NT, {
            const uint8_t *yb = y[t] + (size_t)b * QBLK;
            // bsums pairs: int16 bs[s] = bsums[2s] + bsums[2s + 1], dword p = (bs[2p], bs[2p + 1])
            // (vpmaddwd + vpackssdw, not vphaddw: VEX-only, it cannot reach xmm16..31, and GCC
            // moved its operand there through the stack: I7; |pair| <= 4064, so the pack is exact)
            const __m128i one = _mm_set1_epi16(1);
            const __m128i bs = _mm_packs_epi32(_mm_madd_epi16(_mm_loadu_si128((const __m128i *)(yb + QOFF_BS)), one),
                                               _mm_madd_epi16(_mm_loadu_si128((const __m128i *)(yb + QOFF_BS + 16)), one));
            __m256i M = _mm256_dpwssd_epi32(_mm256_setzero_si256(), A0, _mm256_broadcastd_epi32(bs));
            M = _mm256_dpwssd_epi32(M, A1, _mm256_broadcastd_epi32(_mm_srli_si128(bs, 4)));
            M = _mm256_dpwssd_epi32(M, A2, _mm256_broadcastd_epi32(_mm_srli_si128(bs, 8)));
            M = _mm256_dpwssd_epi32(M, A3, _mm256_broadcastd_epi32(_mm_srli_si128(bs, 12)));
            const __m256 vda = _mm256_broadcast_ss((const float *)yb);
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(vda, d), _mm256_cvtepi32_ps(I[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(vda, dm), _mm256_cvtepi32_ps(M), acc[t]);
        });
    }
    LB_TOKENS(NT, res[t] = acc[t]);
}


// ---- IQ4_XS (repack.h: 8 rows' super-blocks, code dword k of sub-block s at 64 + 32 (4s + k)) ----
// Codes go through vpshufb into kvalues_iq4nl + 128 (1..241: vpdpbusd's unsigned operand), so a
// sub-block's lane sum is isum_u[s] = sum_k (kv_k + 128) q_k = isum[s] + 128 B[s], B[s] =
// bsums[2s] + bsums[2s + 1] (the Q8_K bsums: exact sums of 16 quants). Per (row, token,
// super-block) the exact integer of csrc/x86/iquants.inl, X = sum_s sc[s] isum[s] =
// sum_s sc[s] isum_u[s] - 128 sum_s sc[s] B[s] (int32, wrapping arithmetic: the final X is
// exact, |X| < 2^27; the second sum by vpdpwssd of the int16 scale pairs against the bsums
// pairs, as Q4_K's mins), then its float step, in super-block order and without fma,
//   acc = acc + (d * d_a) * (float)X
// lane-wise: IQ4_XS's own kernels' operations on the same values (kFinal 1: no final multiply).
struct alignas(32) Ctl16 { uint16_t w[16]; };
constexpr Ctl iq4_tab() {  // kvalues_iq4nl + 128 as bytes, in both 128-bit lanes
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (uint8_t)(iq::kvalues_iq4nl[i % 16] + 128);
    return c;
}
constexpr Ctl kIq4Tab = iq4_tab();
// byte P of each dword (a row's scales_l[P]) into both of its int16 words
constexpr Ctl lpair_ctl(int P) {
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (i % 2 == 0) ? (uint8_t)((i % 16) / 4 * 4 + P) : 0x80;
    return c;
}
constexpr Ctl kLPair[4] = {lpair_ctl(0), lpair_ctl(1), lpair_ctl(2), lpair_ctl(3)};
// int16 word W of each dword into both of its words
constexpr Ctl dupw_ctl(int W) {
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (uint8_t)((i % 16) / 4 * 4 + 2 * W + i % 2);
    return c;
}
constexpr Ctl kDupW[2] = {dupw_ctl(0), dupw_ctl(1)};
constexpr Ctl16 wpair(uint16_t a, uint16_t b) {
    Ctl16 c{};
    for (int i = 0; i < 16; ++i) c.w[i] = i % 2 ? b : a;
    return c;
}
// word shifts: scales_l byte P's nibbles (0, 4); scales_h's 2-bit fields 2P (word 0), 2P + 1 (word 1)
constexpr Ctl16 kNib = wpair(0, 4);
constexpr Ctl16 kHSh[4] = {wpair(0, 2), wpair(4, 6), wpair(8, 10), wpair(12, 14)};
constexpr Ctl16 kW0F = wpair(0x0F, 0x0F), kW30 = wpair(0x30, 0x30), kW20 = wpair(32, 32);
LB_R8_INLINE __m256i opaque_w(const Ctl16 &c) {
    const Ctl16 *p = &c;
    __asm__("" : "+r"(p));
    return _mm256_load_si256((const __m256i *)p->w);
}

// Rows 8g .. 8g+7 against tokens y[0..NT): res[t] lane j = the result of row 8g + j.
template <int NT>
LB_R8_INLINE void group_rows_iq4(const RowArgs &a, int64_t g, int t0, __m256 (&res)[NT]) {
    constexpr size_t kGroup = kR8GroupIq4xs, kQs = kR8QsIq4xs;
    const int64_t nb = a.n / QK_K;
    const uint8_t *y[NT];  // the tokens' activation rows
    LB_TOKENS(NT, y[t] = a.act + (size_t)(t0 + t) * a.act_stride);
    const uint8_t *base = a.w + (size_t)g * kR8Rows * a.w_stride;
    const __m256i m0F = _mm256_set1_epi8(0x0F), tab = ctl(kIq4Tab);
    __m256 acc[NT];
    LB_TOKENS(NT, acc[t] = _mm256_setzero_ps());
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *o = base + (size_t)b * kGroup;
        prefetch_group<kGroup>(o, nb, t0);
        __m256i I[NT];
        LB_TOKENS(NT, I[t] = _mm256_setzero_si256());
        for (int p = 0; p < 4; ++p) {  // sub-blocks 2p, 2p + 1
            // The scales, per pair: their bytes and constants read where they are used (addresses
            // hidden from the optimiser: hoisted out of the loops, they took the registers of the
            // tokens' sums, which GCC then spilled: I7).
            const uint8_t *os = o;
            __asm__("" : "+r"(os));
            // lane j: row j's scales_l dword; its scales_h in both int16 words
            const __m256i L = _mm256_loadu_si256((const __m256i *)(os + 32));
            const __m256i H = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(os + 16)));
            const __m256i HH = _mm256_or_si256(H, _mm256_slli_epi32(H, 16));
            // P: int16 pairs (sc[2p], sc[2p + 1]) of each row, sc = the 6-bit scale - 32
            const __m256i lo = _mm256_srlv_epi16(_mm256_shuffle_epi8(L, opaque(kLPair[p])), opaque_w(kNib));
            const __m256i hi = _mm256_srlv_epi16(HH, opaque_w(kHSh[p]));
            const __m256i P = _mm256_sub_epi16(_mm256_or_si256(_mm256_and_si256(lo, opaque_w(kW0F)),
                                                               _mm256_and_si256(_mm256_slli_epi16(hi, 4), opaque_w(kW30))),
                                               opaque_w(kW20));
            {
                // less 128 sc[s] B[s]: -128 sc[2p] (Pe) and -128 sc[2p + 1] (Po) in both int16 words
                // of each lane against the pairs bsums[4p, 4p + 1] and bsums[4p + 2, 4p + 3]
                // (|128 sc| <= 4096, |bsums| <= 2032: vpdpwssd exact)
                const __m256i Pm = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), P), 7);
                const __m256i Pe = _mm256_shuffle_epi8(Pm, opaque(kDupW[0])), Po = _mm256_shuffle_epi8(Pm, opaque(kDupW[1]));
                LB_TOKENS(NT, {
                    const uint8_t *yb = y[t] + (size_t)b * QBLK + QOFF_BS + 8 * (size_t)p;
                    I[t] = _mm256_dpwssd_epi32(I[t], Pe, _mm256_set1_epi32(ld32(yb)));
                    I[t] = _mm256_dpwssd_epi32(I[t], Po, _mm256_set1_epi32(ld32(yb + 4)));
                });
            }
            // sc[2p] (the low word, sign-extended), sc[2p + 1] (the high word) as int32
            const __m256i se = _mm256_srai_epi32(_mm256_slli_epi32(P, 16), 16), so = _mm256_srai_epi32(P, 16);
            for (int h = 0; h < 2; ++h) {
                const int s = 2 * p + h;
                __m256i e[NT], od[NT];  // low / high nibbles
                LB_TOKENS(NT, e[t] = _mm256_setzero_si256(); od[t] = _mm256_setzero_si256());
                const size_t qa = (size_t)b * QBLK + QOFF_QS + 32 * (size_t)s;
                const uint8_t *q = o + kQs + 128 * (size_t)s;
                for (int k = 0; k < 4; ++k) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * k));
                    const __m256i ul = _mm256_shuffle_epi8(tab, _mm256_and_si256(x, m0F));
                    const __m256i uh = _mm256_shuffle_epi8(tab, _mm256_and_si256(_mm256_srli_epi16(x, 4), m0F));
                    LB_TOKENS(NT, e[t] = _mm256_dpbusd_epi32(e[t], ul, _mm256_set1_epi32(ld32(y[t] + qa + 4 * k)));
                                     od[t] = _mm256_dpbusd_epi32(od[t], uh, _mm256_set1_epi32(ld32(y[t] + qa + 16 + 4 * k))));
                }
                const __m256i sc = h ? so : se;
                LB_TOKENS(NT, I[t] = _mm256_add_epi32(I[t], _mm256_mullo_epi32(sc, _mm256_add_epi32(e[t], od[t]))));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
        LB_TOKENS(NT, {
            const __m256 vda = _mm256_broadcast_ss((const float *)(y[t] + (size_t)b * QBLK));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(d, vda), _mm256_cvtepi32_ps(I[t])));
        });
    }
    LB_TOKENS(NT, res[t] = acc[t]);
}

// Results of tokens t0 .. t0 + NT - 1 for group g into rows [lo, hi) of the output (a masked
// store where the range cuts the group)
template <int NT>
LB_R8_INLINE void store_group(const RowArgs &a, int64_t g, int t0, int64_t lo, int64_t hi, const __m256 (&res)[NT]) {
    const int64_t r = g * kR8Rows;
    const __mmask8 keep = (__mmask8)(((1u << (hi - r)) - 1) & ~((1u << (lo - r)) - 1));
    LB_TOKENS(NT, _mm256_mask_storeu_ps(a.out + (size_t)(t0 + t) * a.out_stride + r, keep, res[t]));
}

// One pass of NT (<= 4) tokens over group g, its results into rows [lo, hi) (its own function:
// two passes inlined into one body would hold both passes' vectors at once: I7)
// K: the format (kQ4K, kQ5K, kIq4xs)
enum R8Kind : int { kQ4K = 0, kQ5K = 1, kIq4xs = 2 };
template <int K, int NT>
__attribute__((noinline)) void rows_group(const RowArgs &a, int64_t g, int t0, int64_t lo, int64_t hi) {
    __m256 res[NT];
    if constexpr (K == kIq4xs) group_rows_iq4<NT>(a, g, t0, res);
    else group_rows<K == kQ5K, NT>(a, g, t0, res);
    store_group<NT>(a, g, t0, lo, hi, res);
}

// Tokens in a pass of N1 (<= 4), then one of N2 (0..4) on each group while its rows are in L1.
// Tokens T0 .. NT - 1 of group g in passes of kPass<Q5> (the last one shorter). Q4_K: 4 a pass;
// Q5_K: 3 (its fifth bits' vectors and masks beside 4 tokens' sums spill: I7).
// (clang: 2 for Q5_K; its passes of 3 kept a token's float accumulator in memory: I7)
// IQ4_XS: 4.
#if defined(__clang__)
template <int K>
constexpr int kPass = K == kQ5K ? 2 : 4;
#else
template <int K>
constexpr int kPass = K == kQ5K ? 3 : 4;
#endif
template <int K, int NT, int T0 = 0>
LB_R8_INLINE void group_passes(const RowArgs &a, int64_t g, int64_t lo, int64_t hi) {
    // (Q5_K: 4 tokens left go as 2 + 2, not 3 + 1: a pass of one token re-reads the group for
    // little work; BENCHMARKS.md, round (13))
    constexpr int left = NT - T0, n = K == kQ5K && left == 4 ? 2 : left < kPass<K> ? left : kPass<K>;
    rows_group<K, n>(a, g, T0, lo, hi);
    if constexpr (T0 + n < NT) group_passes<K, NT, T0 + n>(a, g, lo, hi);
}

// Every pass on each group in turn, while its rows are in L1.
template <int K, int NT>
void rows_window(const RowArgs &a, int64_t r0, int64_t r1) {
    for (int64_t g = r0 / kR8Rows; g * kR8Rows < r1; ++g)
        group_passes<K, NT>(a, g, std::max(r0, g * kR8Rows), std::min(r1, (g + 1) * kR8Rows));
}

template <int K>
void rows_r8(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    if (r1 <= r0) return;
    switch (nt) {
        case 1: return rows_window<K, 1>(a, r0, r1);
        case 2: return rows_window<K, 2>(a, r0, r1);
        case 3: return rows_window<K, 3>(a, r0, r1);
        case 4: return rows_window<K, 4>(a, r0, r1);
        case 5: return rows_window<K, 5>(a, r0, r1);
        case 6: return rows_window<K, 6>(a, r0, r1);
        case 7: return rows_window<K, 7>(a, r0, r1);
        case 8: return rows_window<K, 8>(a, r0, r1);
        default: return;
    }
}

}  // namespace

// The R8 entries' windows (their GEMMs: register_gemm, csrc/x86/gemm.inl), counted under their
// ids (kQ4kR8Id, kQ5kR8Id, kIq4xsR8Id); their activations are Q8_K as their formats'.
void register_kq_r8(KernelTable &t) {
    t.set_rows_all(kQ4kR8Id, rows_r8<kQ4K>, "rows_q4_k_r8_q8_k_avx512", ISA_AVX512);
    t.at(kQ4kR8Id).count_id = kQ4kR8Id;
    t.set_rows_all(kQ5kR8Id, rows_r8<kQ5K>, "rows_q5_k_r8_q8_k_avx512", ISA_AVX512);
    t.at(kQ5kR8Id).count_id = kQ5kR8Id;
    t.set_rows_all(kIq4xsR8Id, rows_r8<kIq4xs>, "rows_iq4_xs_r8_q8_k_avx512", ISA_AVX512);
    t.at(kIq4xsR8Id).count_id = kIq4xsR8Id;
}

}  // namespace avx512
}  // namespace lowbit
