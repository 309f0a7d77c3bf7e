// Q4_0 x Q8_0 and Q4_1 x Q8_1 row kernels on their R8 layouts (csrc/repack.h: 8 rows x pairs of
// blocks, interleaved by code dword), at the avx2 level (no VNNI: vpmaddubsw + vpmaddwd). The
// contract is csrc/kernels.h's on the repacked bytes: out[t * out_stride + r] for r in [r0, r1),
// t < nt, any range (a group of 8 rows cut by the range is computed whole and only its rows in it
// stored). (Q8_0's layout stays avx512's: its codes need vdot's full signed byte, and the sign
// trick's int16 pairs cannot be summed across dwords.)
//
// Lanes are (ROW, BLOCK OF THE PAIR) as at avx512 (csrc/x86/avx512/lg_r8.cpp): lane l = 2j + h of a
// group's 64-byte line belongs to row j's block 2p + h, so the line's first 32 bytes are rows 0..3
// (HALF 0) and its last 32 rows 4..7 (half 1): one ymm of a half is code dword k of the pair for 4
// rows. Its low nibbles (codes 4k .. 4k + 3 of each lane's block) and high nibbles (codes 16 + 4k ..)
// each go into one vpmaddubsw (u = 0..15 unsigned) against the token's activation dwords k (and
// 4 + k) of blocks 2p and 2p + 1, broadcast as one qword to every lane pair (signed). Each int16
// lane is a pair of products, |u0 q0 + u1 q1| <= 2 * 15 * 128 = 3840, and the pair's 8 of them per
// lane are summed in int16 (8 * 3840 = 30720 <= 32767: exact, never saturating), then one vpmaddwd
// against ones: the lane's block isum, complete, with no horizontal sums, and every code vector
// serves every token of the pass.
//
// Arithmetic, per (row, token): csrc/x86/legacy.inl's header, exactly. Per block b:
//   isum = sum of the 32 q_w * q_a, exact int32: sum(u * q_a) + corr, u = q_w + off (Q4_0: off 8,
//          corr = -8 * sum(q_a) per (token, block); Q4_1: off 0, no corr)
//   acc_c = fma((float)isum, d_w * d_a, acc_c)   then, Q4_1 only: acc_c = fma(m_w, s_a, acc_c)
// for the block's class c = b mod 8, in block order; the result ((acc_0 + acc_1) + (acc_2 + acc_3))
// + ((acc_4 + acc_5) + (acc_6 + acc_7)). Class c = 2 (p mod 4) + h: accumulator q = p mod 4 of a
// token and half holds classes 2q (even lanes) and 2q + 1 (odd lanes) of its 4 rows. The same
// operations on the same values as the format's own entry (windows, GEMM) and the avx512 R8
// kernels, so every (row, token) result is bitwise theirs (I2, I3, I8; tests/test_repack.py).
//
// Registers (16 ymm): per token of a chunk (3 tokens) two int16 sums, one per half; a code dword's
// two halves give four nibble vectors, and each activation broadcast serves both halves. The
// float accumulators (4 classes x 2 halves per token) live in a per-thread buffer in L1: one load
// and store per (pair, half, token), on the load and store ports, not the vector ALUs the
// products need. A longer window takes further chunks of the same pair while its lines are in L1.
// Zen 3, 8 MB of rows at n = 1536, one thread: 1.5x the row-major kernels at one token, 1.2x at
// 4, 1.05x at 8 (both spend one vpmaddubsw per 32 products); the default model's decode
// 1.41x (BENCHMARKS.md, round (17)).
//
// Per call the activations are re-laid out once per thread (prepare: O(nt * n), a thread-local
// buffer), per pair p and token a record of 80 bytes (avx512's record, pair-major here):
//   [0, 64)  for dword k = 0..7: [q_a dword k of block 2p | of block 2p + 1] (a qword each)
//   [64, 72) d_a of blocks 2p, 2p + 1 (float)
//   [72, 80) Q4_1: s_a of both (float); Q4_0: corr of both (int32)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../fp16.h"
#include "../../kernels.h"
#include "../../repack.h"
#include "../prefetch.h"
#include "../tokens.h"

namespace lowbit {
namespace avx2 {
namespace {

#include "../lg_r8.inl"

LB_LR_INLINE int64_t ld64(const uint8_t *p) {
    long long v;
    std::memcpy(&v, p, 8);
    return v;
}
// the qword at p in every lane pair (the two blocks' activation dwords, or d_a / s_a / corr)
LB_LR_INLINE __m256i bq(const uint8_t *p) { return _mm256_set1_epi64x(ld64(p)); }
LB_LR_INLINE __m256 bqf(const uint8_t *p) { return _mm256_castsi256_ps(bq(p)); }

// 32 bytes of a constant, read where it is used (its address hidden from the optimiser: hoisted out
// of the loops, GCC held the constants in registers and spilled the tokens' sums for them, I7)
struct alignas(32) Cst { uint8_t b[32]; };
constexpr Cst splat8(uint8_t v) {
    Cst c{};
    for (int i = 0; i < 32; ++i) c.b[i] = v;
    return c;
}
constexpr Cst ones16() {  // int16 1 in every word
    Cst c{};
    for (int i = 0; i < 32; ++i) c.b[i] = i % 2 == 0;
    return c;
}
constexpr Cst k0F = splat8(0x0F), kOnes16 = ones16();
LB_LR_INLINE __m256i opaque(const Cst &c) {
    const Cst *p = &c;
    __asm__ volatile("" : "+r"(p));
    return _mm256_load_si256((const __m256i *)p->b);
}

// The call's activations as records (header), token t's pair p at + (p * nt + t) * kRec (a pair's
// tokens side by side: one pointer reaches them all, with constant offsets); built
// once per thread and call (act_holds: a dispatch's parts and a GLU's two matrices share it).
template <class F>
__attribute__((noinline)) const uint8_t *prepare(const RowArgs &a, int nt) {
    static thread_local std::vector<Line> buf;
    static thread_local ActKey key;
    const int64_t np = a.n / 64;
    const size_t bytes = (size_t)nt * (size_t)np * kRec;
    if (buf.size() * 64 < bytes) buf.resize((bytes + 63) / 64);
    uint8_t *base = reinterpret_cast<uint8_t *>(buf.data());
    if (act_holds(key, a, nt, reinterpret_cast<const void *>(&prepare<F>))) return base;
    const __m256i ones8 = _mm256_set1_epi8(1), ones16v = _mm256_set1_epi16(1);
    for (int t = 0; t < nt; ++t) {
        const uint8_t *y = a.act + (size_t)t * a.act_stride;
        for (int64_t p = 0; p < np; ++p) {
            uint8_t *r = base + ((size_t)p * (size_t)nt + (size_t)t) * kRec;
            const uint8_t *b0 = y + (size_t)(2 * p) * F::kAct, *b1 = b0 + F::kAct;
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(b0 + F::kAqs));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(b1 + F::kAqs));
            // dwords interleaved: [q0 d0, q1 d0, q0 d1, q1 d1 | d4, d5], [d2, d3 | d6, d7], then the
            // 128-bit halves into order (record dword 2k + h = block h's dword k)
            const __m256i lo = _mm256_unpacklo_epi32(q0, q1), hi = _mm256_unpackhi_epi32(q0, q1);
            _mm256_storeu_si256((__m256i *)r, _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(r + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
            // the blocks' code sums, exact (|sum| <= 4096): bytes into int16 pairs, then int32
            record_tail<F>(r, b0, b1, [&](int32_t &s0, int32_t &s1) {
                const auto sum = [&](__m256i q) {
                    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16v);
                    __m128i v = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4E));
                    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xB1));
                    return _mm_cvtsi128_si32(v);
                };
                s0 = sum(q0), s1 = sum(q1);
            });
        }
    }
    return base;
}

// Pair p (class Q = p mod 4) of group line o, both halves, for tokens T0 .. T0 + NT - 1 of the
// window (token t's record of pair p at y + t * kRec), into the float accumulators acc + ((t * 2 +
// H) * 4 + Q) * 8 of half H. Each activation broadcast serves both halves.
template <class F, int NT, int T0, int Q>
LB_LR_INLINE void pair_tokens(const uint8_t *o, const uint8_t *y, float *acc) {
    const uint8_t *c = o + F::kQs;
    __m256i s0[NT], s1[NT];
    LB_TOKENS(NT, s0[t] = _mm256_setzero_si256(); s1[t] = _mm256_setzero_si256());
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
        const __m256i m0F = opaque(k0F);
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(c + 64 * k));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(c + 64 * k + 32));
        const __m256i ul0 = _mm256_and_si256(x0, m0F), uh0 = _mm256_and_si256(_mm256_srli_epi16(x0, 4), m0F);
        const __m256i ul1 = _mm256_and_si256(x1, m0F), uh1 = _mm256_and_si256(_mm256_srli_epi16(x1, 4), m0F);
        LB_TOKENS(NT, {
            const __m256i bl = bq(y + (T0 + t) * kRec + 8 * k), bh = bq(y + (T0 + t) * kRec + 32 + 8 * k);
            s0[t] = _mm256_add_epi16(s0[t], _mm256_maddubs_epi16(ul0, bl));
            s1[t] = _mm256_add_epi16(s1[t], _mm256_maddubs_epi16(ul1, bl));
            s0[t] = _mm256_add_epi16(s0[t], _mm256_maddubs_epi16(uh0, bh));
            s1[t] = _mm256_add_epi16(s1[t], _mm256_maddubs_epi16(uh1, bh));
            // (the empty asm fences the chains: GCC would otherwise reassociate them into trees,
            // forming all the products first, and spill them: I7)
            __asm__("" : "+x"(s0[t]), "+x"(s1[t]));
        });
    }
    // d_w and m_w of the pair's 16 lanes, read after the sums (held across them they took the
    // registers of the tokens' sums: I7), once for the chunk's tokens; each token's d_a and its
    // s_a (Q4_1) or offset terms (Q4_0) once for both halves
    const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)o));
    const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 16)));
    const __m256 mw0 = F::kM ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 32))) : _mm256_setzero_ps();
    const __m256 mw1 = F::kM ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(o + 48))) : _mm256_setzero_ps();
    LB_TOKENS(NT, {
        const uint8_t *r = y + (T0 + t) * kRec;
        const __m256 da = bqf(r + 64);
        const __m256i tail = bq(r + 72);  // s_a of both blocks (float), or their offset terms (int32)
        const auto fold = [&](__m256i sum, __m256 dw, __m256 mw, int h) __attribute__((always_inline)) {
            __m256i isum = _mm256_madd_epi16(sum, opaque(kOnes16));
            if constexpr (F::kOff) isum = _mm256_add_epi32(isum, tail);
            float *ap = acc + (((T0 + t) * 2 + h) * 4 + Q) * 8;
            __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), _mm256_load_ps(ap));
            if constexpr (F::kM) v = _mm256_fmadd_ps(mw, _mm256_castsi256_ps(tail), v);
            _mm256_store_ps(ap, v);
        };
        fold(s0[t], dw0, mw0, 0);
        fold(s1[t], dw1, mw1, 1);
    });
    // the next chunk's loads not before these stores (its sums and these folds at once: I7)
    __asm__ volatile("" ::: "memory");
}

// Pair p for the window's tokens in chunks of kChunk (the code vectors decoded again per chunk,
// from L1: cheaper than a second pass over the group). 3: two int16 sums per token, the four
// nibble vectors and two broadcasts fill the 16 registers (chunks of 4 spilled under GCC 12: I7).
constexpr int kChunk = 3;
template <class F, int NW, int Q, int T0 = 0>
LB_LR_INLINE void pair(const uint8_t *o, const uint8_t *y, float *acc) {
    constexpr int n = NW - T0 < kChunk ? NW - T0 : kChunk;
    pair_tokens<F, n, T0, Q>(o, y, acc);
    if constexpr (T0 + n < NW) pair<F, NW, Q, T0 + n>(o, y, acc);
}

// Rows 8g .. 8g+7 against the window's NT tokens (records from rec): lane j of the
// 8 floats at dst + t * ds = the result of row 8g + j for token t. One sweep over the group.
template <class F, int NT>
__attribute__((noinline)) void group_rows(const RowArgs &a, int64_t g, const uint8_t *rec, float *dst, size_t ds) {
    const int64_t np = a.n / 64;
    const uint8_t *base = a.w + (size_t)g * kR8Rows * a.w_stride;
    // the float accumulators: per token, half and class 8 lanes (a per-thread buffer, its address
    // hidden so that they stay in memory: I7)
    alignas(32) static thread_local float accbuf[8 * 2 * 4 * 8];
    float *acc = accbuf;
    __asm__ volatile("" : "+r"(acc));
    // (vector stores, one per 8 floats: as a loop GCC made it a `rep stos`, whose start-up cost was
    // ~5% of a group at n = 576, the default model's rows)
    LB_TOKENS(NT, {
        const __m256 z = _mm256_setzero_ps();
        float *a0 = acc + t * 2 * 4 * 8;
        _mm256_store_ps(a0, z), _mm256_store_ps(a0 + 8, z), _mm256_store_ps(a0 + 16, z), _mm256_store_ps(a0 + 24, z);
        _mm256_store_ps(a0 + 32, z), _mm256_store_ps(a0 + 40, z), _mm256_store_ps(a0 + 48, z), _mm256_store_ps(a0 + 56, z);
    });
    const auto step = [&](int64_t p, auto qc) __attribute__((always_inline)) {
        const uint8_t *o = base + (size_t)p * F::kGroup;
        prefetch_ahead(o, F::kGroup);
        pair<F, NT, decltype(qc)::value>(o, rec + (size_t)p * NT * kRec, acc);
    };
    each_pair(np, step);
    // the tree: e_q = class 2q + class 2q + 1 (lanes 2j, 2j + 1), for both halves by one hadd (rows
    // 0 1 4 5 | 2 3 6 7), then (e0 + e1) + (e2 + e3), the qwords put into row order
    for (int t = 0; t < NT; ++t) {
        const float *c = acc + t * 2 * 4 * 8;
        const auto e = [&](int q) { return _mm256_hadd_ps(_mm256_load_ps(c + 8 * q), _mm256_load_ps(c + 32 + 8 * q)); };
        const __m256 r = _mm256_add_ps(_mm256_add_ps(e(0), e(1)), _mm256_add_ps(e(2), e(3)));
        _mm256_storeu_ps(dst + t * ds, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(r), 0xD8)));
    }
}

// Group g's results into rows [lo, hi) (a group the range cuts is computed into a per-thread buffer
// and its rows in the range copied out)
template <class F, int NT>
LB_LR_INLINE void rows_group(const RowArgs &a, int64_t g, const uint8_t *rec, int64_t lo, int64_t hi) {
    const int64_t r = g * kR8Rows;
    if (lo == r && hi == r + kR8Rows) return group_rows<F, NT>(a, g, rec, a.out + r, a.out_stride);
    alignas(32) static thread_local float cut[8 * kR8Rows];
    float *c = cut;  // (its address passed as any other: a clone of group_rows for this buffer
    __asm__("" : "+r"(c));  // looked it up between two tokens' stores and kept a result on the stack: I7)
    group_rows<F, NT>(a, g, rec, c, kR8Rows);
    for (int t = 0; t < NT; ++t)
        std::memcpy(a.out + (size_t)t * a.out_stride + lo, c + t * kR8Rows + (lo - r), (size_t)(hi - lo) * 4);
}

template <class F, int NT>
void rows_window(const RowArgs &a, int64_t r0, int64_t r1) {
    const uint8_t *rec = prepare<F>(a, NT);
    for (int64_t g = r0 / kR8Rows; g * kR8Rows < r1; ++g)
        rows_group<F, NT>(a, g, rec, std::max(r0, g * kR8Rows), std::min(r1, (g + 1) * kR8Rows));
}

template <class F>
void rows_r8(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    if (r1 <= r0) return;
    switch (nt) {
        case 1: return rows_window<F, 1>(a, r0, r1);
        case 2: return rows_window<F, 2>(a, r0, r1);
        case 3: return rows_window<F, 3>(a, r0, r1);
        case 4: return rows_window<F, 4>(a, r0, r1);
        case 5: return rows_window<F, 5>(a, r0, r1);
        case 6: return rows_window<F, 6>(a, r0, r1);
        case 7: return rows_window<F, 7>(a, r0, r1);
        case 8: return rows_window<F, 8>(a, r0, r1);
        default: return;
    }
}

}  // namespace

// The R8 entries' windows (no wide window: 16 tokens as one window ran 1.34x slower than two of 8,
// the records of 16 tokens crowding the group's lines out of L1: Zen 3, `bench kernels --formats
// Q4_1_R8 --nt 16 --n 1536 --mb 8 --cpu 1`, 0.0291 against 0.0217 us per row and token); their
// GEMM: register_gemm, csrc/x86/gemm.inl. Counted under kQ4_0R8Id, kQ4_1R8Id; their activations
// are the format's (Q8_0, Q8_1). The avx2vnni level runs these too; avx512 registers its own (and
// Q8_0's).
void register_lg_r8(KernelTable &t) {
    const auto set = [&](int id, rows_fn f, const char *name) {
        t.set_rows_all(id, f, name, ISA_AVX2);
        t.at(id).count_id = id;
    };
    set(kQ4_0R8Id, rows_r8<LQ4_0>, "rows_q4_0_r8_q8_0_avx2");
    set(kQ4_1R8Id, rows_r8<LQ4_1>, "rows_q4_1_r8_q8_1_avx2");
}

}  // namespace avx2
}  // namespace lowbit
