// Q4_K x Q8_K row kernels on its R8 layout (csrc/repack.h: 8 rows' super-blocks interleaved by
// code dword), at the avx2 level (no VNNI: vpmaddubsw + vpmaddwd). The contract is csrc/kernels.h's
// on the repacked bytes: out[t * out_stride + r] for r in [r0, r1), t < nt, any range (a group of
// 8 rows cut by the range is computed whole and only its rows in it stored).
//
// Lanes are ROWS, as at avx512 (csrc/x86/avx512/kq_r8.cpp): lane j of every vector belongs to row
// 8g + j of the group. One 32-byte load is code dword k of chunk c for the 8 rows; its low nibbles
// (sub-block 2c) and high nibbles (sub-block 2c + 1) each go into one vpmaddubsw (codes u = 0..15,
// vpmaddubsw's unsigned operand) against that token's activation dword k of the sub-block,
// broadcast from memory to every lane (signed). Each int16 lane is a pair of products, |u0 q0 +
// u1 q1| <= 2 * 15 * 128 = 3840, and a sub-block's 8 dwords are summed in int16 first (vpaddw:
// 8 * 3840 = 30720 <= 32767, exact, never saturating), then ONE vpmaddwd against the sub-block's
// scale in both int16 words of the row's lane (sc <= 63): the row's int32 sc * isum, exact. So a
// row's sub-block sum is complete in its lane: no horizontal sums, no per-row shuffles, and every
// code vector serves every token of the pass. (The row-major kernels, csrc/x86/kquants.inl, spend
// per row and super-block the codes' shuffles, a madd per chunk and a horizontal reduction.)
//
// Arithmetic, per (row, token, super-block): the exact integers of csrc/x86/kquants.inl's header,
// I = sum_s sc[s] * isum[s] and M = sum_s mn[s] * (bsums[2s] + bsums[2s + 1]) (int16 pairs by
// vpmaddwd: |bsums pair| <= 4064, exact), then its two float steps in super-block order,
//   acc = fma(d_a * d, (float)I, acc);  acc = fnmadd(d_a * dmin, (float)M, acc)
// lane-wise: the same operations on the same values as the format's own kernels and GEMM at every
// level, so each (row, token) result is bitwise theirs (I2, I3, I8; tests/test_repack.py).
//
// Registers (16 ymm): per token of a pass one int16 sub-block sum and its super-block sum I (the
// float accumulators live in the output rows, L1: one load and store per super-block). A chunk's
// low nibbles are taken for every token of the pass, then its high nibbles (the code dwords loaded
// twice, from L1), so only one int16 sum per token is live; passes of 1 or 2 tokens take both in
// one sweep (chunk2). Tokens go 4 at a time (clang: 3); a longer window runs further passes of the
// group while its rows are in L1. Zen 3, 16 MB of rows, one thread: 1.75x the row-major kernel at
// one token, 1.4-1.5x at 4 and 8 (BENCHMARKS.md, round (16)). At DRAM scale one token gains little
// on a VM whose ~28 GB/s the row-major kernels already reach on 2 threads.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../../kernels.h"
#include "../../repack.h"
#include "../prefetch.h"
#include "../tokens.h"

namespace lowbit {
namespace avx2 {
namespace {

#include "../kq_r8.inl"

// pshufb control: byte B of each dword zero-extended into both int16 words of the dword (a
// sub-block's scale against the int16 sums)
constexpr Ctl word2_ctl(int B) {
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = (i % 2 == 0) ? (uint8_t)((i % 16) / 4 * 4 + B) : 0x80;
    return c;
}
constexpr Ctl kWord2[4] = {word2_ctl(0), word2_ctl(1), word2_ctl(2), word2_ctl(3)};
constexpr Ctl k0F = splat(0x0F);
constexpr Ctl ones16() {  // int16 1 in every word
    Ctl c{};
    for (int i = 0; i < 32; ++i) c.b[i] = i % 2 == 0;
    return c;
}
constexpr Ctl kOnes16 = ones16();
// A constant read where it is used (its address hidden from the optimiser): hoisted out of the
// loops, GCC held the constants in registers and spilled the tokens' sums for them (I7)
LB_R8_INLINE __m256i opaque(const Ctl &c) {
    const Ctl *p = &c;
    __asm__ volatile("" : "+r"(p));
    return _mm256_load_si256((const __m256i *)p->b);
}

// The int16 sums of one sub-block (8 code dwords at q, 32 bytes apart; the low nibbles, or the
// high ones with HI) against each token's 8 activation dwords at y[t] + qa, then into I[t] as
// int32 by one vpmaddwd with the scale words sw.
template <bool HI, int NT, class SW>
LB_R8_INLINE void subblock(const uint8_t *q, const uint8_t *const (&y)[NT], size_t qa, const SW &sw_of, __m256i (&I)[NT]) {
    const __m256i m0F = opaque(k0F);
    __m256i s[NT];
    LB_TOKENS(NT, s[t] = _mm256_setzero_si256());
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * k));
        const __m256i u = HI ? _mm256_and_si256(_mm256_srli_epi16(x, 4), m0F) : _mm256_and_si256(x, m0F);
        LB_TOKENS(NT, {
            const __m256i p = _mm256_maddubs_epi16(u, _mm256_set1_epi32(ld32(y[t] + qa + 4 * k)));
            s[t] = _mm256_add_epi16(s[t], p);
            // (the empty asm fences the chain: GCC would otherwise reassociate it into a tree,
            // forming all 8 products first, and spill them: I7)
            __asm__("" : "+x"(s[t]));
        });
    }
    const __m256i sw = sw_of(HI ? 1 : 0);  // (formed here, after the sums: not live across them, I7)
    LB_TOKENS(NT, I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(s[t], sw)));
    // the next sub-block's loads not before this fold (clang formed both sub-blocks' sums first,
    // then spilled the tokens' I: I7)
    __asm__ volatile("" ::: "memory");
}

// Both sub-blocks of a chunk at once (NT <= 2: registers for two int16 sums per token): each code
// dword loaded once, its low nibbles into se[t] and high nibbles into so[t]
template <int NT, class SW>
LB_R8_INLINE void chunk2(const uint8_t *q, const uint8_t *const (&y)[NT], size_t qa, const SW &sw_of, __m256i (&I)[NT]) {
    const __m256i m0F = opaque(k0F);
    __m256i se[NT], so[NT];
    LB_TOKENS(NT, se[t] = _mm256_setzero_si256(); so[t] = _mm256_setzero_si256());
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(q + 32 * k));
        const __m256i ul = _mm256_and_si256(x, m0F), uh = _mm256_and_si256(_mm256_srli_epi16(x, 4), m0F);
        LB_TOKENS(NT, {
            const __m256i pl = _mm256_maddubs_epi16(ul, _mm256_set1_epi32(ld32(y[t] + qa + 4 * k)));
            const __m256i ph = _mm256_maddubs_epi16(uh, _mm256_set1_epi32(ld32(y[t] + qa + 32 + 4 * k)));
            se[t] = _mm256_add_epi16(se[t], pl);
            so[t] = _mm256_add_epi16(so[t], ph);
            __asm__("" : "+x"(se[t]), "+x"(so[t]));  // (as subblock's)
        });
    }
    const __m256i swe = sw_of(0);
    LB_TOKENS(NT, I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(se[t], swe)));
    const __m256i swo = sw_of(1);
    LB_TOKENS(NT, I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(so[t], swo)));
}

// Rows 8g .. 8g+7 against tokens y[0..NT): lane j of the 8 floats at dst + t * ds = the result of
// row 8g + j for token t0 + t. The float accumulators live there (L1: one load and store per
// super-block and token), not in registers: these take the tokens' integer sums (I7).
template <int NT>
__attribute__((noinline)) void group_rows(const RowArgs &a, int64_t g, int t0, float *dst, size_t ds) {
    constexpr size_t kGroup = kR8Group, kQs = 128;
    const int64_t nb = a.n / QK_K;
    const uint8_t *y[NT];  // the tokens' activation rows
    LB_TOKENS(NT, y[t] = a.act + (size_t)(t0 + t) * a.act_stride);
    const uint8_t *base = a.w + (size_t)g * kR8Rows * a.w_stride;
    LB_TOKENS(NT, _mm256_storeu_ps(dst + t * ds, _mm256_setzero_ps()));
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *o = base + (size_t)b * kGroup;
        prefetch_group<kGroup>(o, nb, t0);
        __m256i I[NT];
        LB_TOKENS(NT, I[t] = _mm256_setzero_si256());
        for (int c = 0; c < 4; ++c) {
            // the scale words of sub-block 2c + h (h = 0, 1) in both int16 words of each row's lane,
            // from the scale bytes of the 8 rows (lane j, byte s): sc 0..3 (6 bits), then sc 4..7
            // (low 4 bits in bytes 8..11, high 2 bits in the top of bytes 0..3); read where used
            // (an address hidden from the optimiser: held across the chunks they took the
            // registers of the tokens' sums, I7)
            const auto sw_of = [&](int h) {
                const uint8_t *os = o;
                __asm__ volatile("" : "+r"(os));
                const __m256i s0 = _mm256_loadu_si256((const __m256i *)(os + 32));
                const __m256i sv = c < 2 ? _mm256_and_si256(s0, opaque(k3F))
                                         : _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(os + 96)), opaque(k0F)),
                                                           _mm256_and_si256(_mm256_srli_epi16(s0, 2), opaque(k30)));
                return _mm256_shuffle_epi8(sv, ctl(kWord2[(2 * c + h) % 4]));
            };
            const size_t qa = (size_t)b * QBLK + QOFF_QS + 64 * (size_t)c;
            const uint8_t *q = o + kQs + 256 * (size_t)c;
            if constexpr (NT <= 2) {
                chunk2<NT>(q, y, qa, sw_of, I);
            } else {
                subblock<false, NT>(q, y, qa, sw_of, I);
                subblock<true, NT>(q, y, qa + 32, sw_of, I);
            }
        }
        // M: mins as int16 pairs (mn 2p, 2p + 1) against the token's bsums pairs; the mins, d and
        // dmin read again per token (from L1: held across the tokens, they were spilled, I7)
        LB_TOKENS(NT, {
            const uint8_t *om = o;
            __asm__ volatile("" : "+r"(om));
            const __m256i s1 = _mm256_loadu_si256((const __m256i *)(om + 64)), s2 = _mm256_loadu_si256((const __m256i *)(om + 96));
            const __m256i mnlo = _mm256_and_si256(s1, opaque(k3F));
            const __m256i mnhi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(s2, 4), opaque(k0F)),
                                                 _mm256_and_si256(_mm256_srli_epi16(s1, 2), opaque(k30)));
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)om));
            const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(om + 16)));
            const uint8_t *yb = y[t] + (size_t)b * QBLK;
            // bsums pairs: int16 bs[s] = bsums[2s] + bsums[2s + 1], dword p = (bs[2p], bs[2p + 1])
            // (|pair| <= 4064: the pack is exact)
            const __m128i one = _mm256_castsi256_si128(opaque(kOnes16));
            const __m128i bs = _mm_packs_epi32(_mm_madd_epi16(_mm_loadu_si128((const __m128i *)(yb + QOFF_BS)), one),
                                               _mm_madd_epi16(_mm_loadu_si128((const __m128i *)(yb + QOFF_BS + 16)), one));
            __m256i M = _mm256_madd_epi16(_mm256_shuffle_epi8(mnlo, ctl(kPair[0])), _mm256_broadcastd_epi32(bs));
            M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_shuffle_epi8(mnlo, ctl(kPair[1])),
                                                      _mm256_broadcastd_epi32(_mm_srli_si128(bs, 4))));
            M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_shuffle_epi8(mnhi, ctl(kPair[0])),
                                                      _mm256_broadcastd_epi32(_mm_srli_si128(bs, 8))));
            M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_shuffle_epi8(mnhi, ctl(kPair[1])),
                                                      _mm256_broadcastd_epi32(_mm_srli_si128(bs, 12))));
            const __m256 vda = _mm256_broadcast_ss((const float *)yb);
            __m256 acc = _mm256_loadu_ps(dst + t * ds);
            acc = _mm256_fmadd_ps(_mm256_mul_ps(vda, d), _mm256_cvtepi32_ps(I[t]), acc);
            acc = _mm256_fnmadd_ps(_mm256_mul_ps(vda, dm), _mm256_cvtepi32_ps(M), acc);
            _mm256_storeu_ps(dst + t * ds, acc);
        });
    }
}

// One pass of NT (<= kPass) tokens over group g, its results into rows [lo, hi) (its own function:
// two passes inlined into one body would hold both passes' vectors at once: I7). A group the
// range cuts is computed into a per-thread buffer and its rows in the range copied out.
template <int NT>
__attribute__((noinline)) void rows_group(const RowArgs &a, int64_t g, int t0, int64_t lo, int64_t hi) {
    const int64_t r = g * kR8Rows;
    if (lo == r && hi == r + kR8Rows) return group_rows<NT>(a, g, t0, a.out + (size_t)t0 * a.out_stride + r, a.out_stride);
    alignas(32) static thread_local float cut[4 * kR8Rows];
    group_rows<NT>(a, g, t0, cut, kR8Rows);
    for (int t = 0; t < NT; ++t)
        std::memcpy(a.out + (size_t)(t0 + t) * a.out_stride + lo, cut + t * kR8Rows + (lo - r), (size_t)(hi - lo) * 4);
}

// Tokens T0 .. NT - 1 of group g in passes of kPass (the last one shorter): 4, but 3 under clang
// (its passes of 4 kept two tokens' sums I in memory across the scales' decode: I7)
#if defined(__clang__)
constexpr int kPass = 3;
#else
constexpr int kPass = 4;
#endif
template <int NT, int T0 = 0>
LB_R8_INLINE void group_passes(const RowArgs &a, int64_t g, int64_t lo, int64_t hi) {
    constexpr int left = NT - T0, n = left < kPass ? left : kPass;
    rows_group<n>(a, g, T0, lo, hi);
    if constexpr (T0 + n < NT) group_passes<NT, T0 + n>(a, g, lo, hi);
}

// Every pass on each group in turn, while its rows are in L1.
template <int NT>
void rows_window(const RowArgs &a, int64_t r0, int64_t r1) {
    for (int64_t g = r0 / kR8Rows; g * kR8Rows < r1; ++g)
        group_passes<NT>(a, g, std::max(r0, g * kR8Rows), std::min(r1, (g + 1) * kR8Rows));
}

void rows_q4k_r8(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    if (r1 <= r0) return;
    switch (nt) {
        case 1: return rows_window<1>(a, r0, r1);
        case 2: return rows_window<2>(a, r0, r1);
        case 3: return rows_window<3>(a, r0, r1);
        case 4: return rows_window<4>(a, r0, r1);
        case 5: return rows_window<5>(a, r0, r1);
        case 6: return rows_window<6>(a, r0, r1);
        case 7: return rows_window<7>(a, r0, r1);
        case 8: return rows_window<8>(a, r0, r1);
        default: return;
    }
}

}  // namespace

// The R8 entry's windows (its GEMM: register_gemm, csrc/x86/gemm.inl), counted under its id
// (kQ4kR8Id); its activations are Q8_K as Q4_K's. The avx2vnni level runs these too (it adds no
// R8 kernels); avx512 registers its own.
void register_kq_r8(KernelTable &t) {
    t.set_rows_all(kQ4kR8Id, rows_q4k_r8, "rows_q4_k_r8_q8_k_avx2", ISA_AVX2);
    t.at(kQ4kR8Id).count_id = kQ4kR8Id;
}

}  // namespace avx2
}  // namespace lowbit
