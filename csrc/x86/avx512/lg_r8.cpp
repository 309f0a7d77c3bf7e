// Q4_0, Q8_0 x Q8_0 and Q4_1 x Q8_1 row kernels on their R8 layouts (csrc/repack.h: 8 rows x
// pairs of blocks, interleaved by code dword), at the avx512 level (AVX512-VNNI, 512-bit vectors).
// The contract is csrc/kernels.h's on the repacked bytes: out[t * out_stride + r] for r in
// [r0, r1), t < nt, any range (a group of 8 rows cut by the range is computed whole and only
// its rows in it stored).
//
// Lanes are (ROW, BLOCK OF THE PAIR): lane l = 2j + h of every vector belongs to row 8g + j's
// block 2p + h. One 64-byte load is code dword k of the pair for the 8 rows; it goes into one
// vpdpbusd against the token's activation dwords k of blocks 2p and 2p + 1, broadcast as one
// qword to every lane pair. After 8 of them (Q4: the low nibbles against dwords 0..3, the high
// ones against 4..7) each lane holds its (row, block)'s integer sum: no horizontal sums, no
// per-row shuffles of codes or scales, and each decoded code vector serves every token of the
// pass (4 tokens a pass; clang 3 for Q4_1). The row-major kernels (csrc/x86/legacy.inl)
// broadcast each code dword over token lanes (a vpshufd per dword and unit) and gather the
// blocks' fp16 scales per row; here the scales of 16 (row, block) lanes are one vcvtph2ps.
//
// Arithmetic, per (row, token): csrc/x86/legacy.inl's header, exactly. Per block b:
//   isum = sum of the 32 q_w * q_a, exact int32: here sum(u * q_a) + corr, u = q_w + off the
//          unsigned code (Q4_0: off 8; Q8_0: off 128, u = q_w ^ 0x80; Q4_1: off 0), corr =
//          -off * sum(q_a) per (token, block), |sum| < 2^21
//   acc_c = fma((float)isum, d_w * d_a, acc_c)   then, Q4_1 only: acc_c = fma(m_w, s_a, acc_c)
// for the block's class c = b mod 8, in block order, and the result ((acc_0 + acc_1) + (acc_2 +
// acc_3)) + ((acc_4 + acc_5) + (acc_6 + acc_7)). Class c = 2 (p mod 4) + h: accumulator q = p mod 4
// of a token holds classes 2q (even lanes) and 2q + 1 (odd lanes) of its 8 rows. The same
// operations on the same values as the format's own entry (windows, wide window, GEMM), so every
// (row, token) result is bitwise theirs (I2, I3, I8; tests/test_repack.py).
//
// Per call the activations are re-laid out once per thread (prepare: O(nt * n), a thread-local
// buffer), per token and pair p a record of 80 bytes:
//   [0, 64)  for dword k = 0..7: [q_a dword k of block 2p | of block 2p + 1] (a qword each)
//   [64, 72) d_a of blocks 2p, 2p + 1 (float)
//   [72, 80) Q4_1: s_a of both (float); Q4_0, Q8_0: corr of both (int32)
// (GCC 12's avx512 intrinsics trip -Wmaybe-uninitialized in every caller, as in kquants.inl)
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
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
namespace avx512 {
namespace {

#include "../lg_r8.inl"

// The activations' qwords (and float pairs) broadcast to the 8 lane pairs where they are used:
//   dpq(acc, u, p)       acc + per int32 lane the 4 products u8 (u) * s8 (the qword at p)
//   dpq_from(c, u, p)    the same from acc = the int32 pair at c
//   mulq(x, p)           x * the float pair at p;   fmaq(acc, x, p)  fma(x, the pair at p, acc)
// Under clang each is one inline asm of the broadcast and its use: as intrinsics, clang's
// scheduler loads the broadcasts of a whole pair (or of the next ones) ahead of their use and
// spills them (I7). GCC schedules the intrinsics well (its code ran 2-4% faster than the asm's).
#if defined(__clang__)
LB_LR_INLINE __m512i dpq(__m512i acc, __m512i u, const uint8_t *p) {
    __m512i t;
    __asm__("vpbroadcastq %[m], %[t]\n\tvpdpbusd %[t], %[u], %[acc]"
            : [acc] "+v"(acc), [t] "=&v"(t)
            : [u] "v"(u), [m] "m"(*(const long long *)p));
    return acc;
}
LB_LR_INLINE __m512i dpq_from(const uint8_t *c, __m512i u, const uint8_t *p) {
    __m512i acc, t;
    __asm__("vpbroadcastq %[c], %[acc]\n\tvpbroadcastq %[m], %[t]\n\tvpdpbusd %[t], %[u], %[acc]"
            : [acc] "=&v"(acc), [t] "=&v"(t)
            : [u] "v"(u), [m] "m"(*(const long long *)p), [c] "m"(*(const long long *)c));
    return acc;
}
LB_LR_INLINE __m512 mulq(__m512 x, const uint8_t *p) {
    __m512 t;
    __asm__("vbroadcastsd %[m], %[t]\n\tvmulps %[t], %[x], %[t]" : [t] "=&v"(t) : [x] "v"(x), [m] "m"(*(const double *)p));
    return t;
}
LB_LR_INLINE __m512 fmaq(__m512 acc, __m512 x, const uint8_t *p) {
    __m512 t;
    __asm__("vbroadcastsd %[m], %[t]\n\tvfmadd231ps %[t], %[x], %[acc]"
            : [acc] "+v"(acc), [t] "=&v"(t)
            : [x] "v"(x), [m] "m"(*(const double *)p));
    return acc;
}
#else
LB_LR_INLINE __m512i bq(const uint8_t *p) {
    long long v;
    std::memcpy(&v, p, 8);
    return _mm512_set1_epi64(v);
}
LB_LR_INLINE __m512 bqf(const uint8_t *p) { return _mm512_castsi512_ps(bq(p)); }
LB_LR_INLINE __m512i dpq(__m512i acc, __m512i u, const uint8_t *p) { return _mm512_dpbusd_epi32(acc, u, bq(p)); }
LB_LR_INLINE __m512i dpq_from(const uint8_t *c, __m512i u, const uint8_t *p) { return dpq(bq(c), u, p); }
LB_LR_INLINE __m512 mulq(__m512 x, const uint8_t *p) { return _mm512_mul_ps(x, bqf(p)); }
LB_LR_INLINE __m512 fmaq(__m512 acc, __m512 x, const uint8_t *p) { return _mm512_fmadd_ps(x, bqf(p), acc); }
#endif

// The call's activations as records (header), token t's pair p at + (t * np + p) * kRec; built
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
    // per pair: the two blocks' 32-byte codes as dwords 0..7 | 8..15 of one vector, dword 8h + k
    // to record dword 2k + h (one vpermd); sum(q_a) of each block by vpdpbusd against ones
    const __m512i ilv = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    const __m512i ones = _mm512_set1_epi8(1);
    for (int t = 0; t < nt; ++t) {
        const uint8_t *y = a.act + (size_t)t * a.act_stride;
        for (int64_t p = 0; p < np; ++p) {
            uint8_t *r = base + ((size_t)t * (size_t)np + (size_t)p) * kRec;
            const uint8_t *b0 = y + (size_t)(2 * p) * F::kAct, *b1 = b0 + F::kAct;
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + F::kAqs))),
                                                 _mm256_loadu_si256((const __m256i *)(b1 + F::kAqs)), 1);
            _mm512_storeu_si512((void *)r, _mm512_permutexvar_epi32(ilv, q));
            record_tail<F>(r, b0, b1, [&](int32_t &s0, int32_t &s1) {
                const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q);  // exact: |sum| <= 4096
                s0 = _mm512_mask_reduce_add_epi32(0x00FF, s), s1 = _mm512_mask_reduce_add_epi32(0xFF00, s);
            });
        }
    }
    return base;
}

// Token t's 4 class accumulators (q = p mod 4)
struct Acc {
    __m512 q0, q1, q2, q3;
};
template <int Q>
LB_LR_INLINE __m512 &cls(Acc &a) {
    if constexpr (Q == 0) return a.q0; else if constexpr (Q == 1) return a.q1; else if constexpr (Q == 2) return a.q2; else return a.q3;
}

// Pair p (class Q = p mod 4) of group o for the pass's tokens (records y[t] of pair p).
template <class F, int NT, int Q>
LB_LR_INLINE void pair(const uint8_t *o, const uint8_t *const (&y)[NT], Acc (&acc)[NT]) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)o));
    const __m512 mw = F::kM ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + 32))) : _mm512_setzero_ps();
    const uint8_t *c = o + F::kQs;
    const auto ld = [&](int k) __attribute__((always_inline)) { return _mm512_loadu_si512((const void *)(c + 64 * k)); };
    // the unsigned codes against activation dwords 0..7 (named, not an array: I7)
    __m512i x0, x1, x2, x3, x4, x5, x6, x7;
    if constexpr (F::kDwords == 4) {  // dword k's low nibbles are codes 4k.., its high ones 16 + 4k..
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i v0 = ld(0), v1 = ld(1), v2 = ld(2), v3 = ld(3);
        x0 = _mm512_and_si512(v0, m4), x4 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), m4);
        x1 = _mm512_and_si512(v1, m4), x5 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), m4);
        x2 = _mm512_and_si512(v2, m4), x6 = _mm512_and_si512(_mm512_srli_epi16(v2, 4), m4);
        x3 = _mm512_and_si512(v3, m4), x7 = _mm512_and_si512(_mm512_srli_epi16(v3, 4), m4);
    } else {
        const __m512i x80 = _mm512_set1_epi8((char)0x80);
        x0 = _mm512_xor_si512(ld(0), x80), x1 = _mm512_xor_si512(ld(1), x80), x2 = _mm512_xor_si512(ld(2), x80);
        x3 = _mm512_xor_si512(ld(3), x80), x4 = _mm512_xor_si512(ld(4), x80), x5 = _mm512_xor_si512(ld(5), x80);
        x6 = _mm512_xor_si512(ld(6), x80), x7 = _mm512_xor_si512(ld(7), x80);
    }
    LB_TOKENS(NT, {
        const uint8_t *r = y[t];
        // two chains (dwords 0..3, 4..7) for latency; exact integers, so their sum is the isum
        // (Q4_0, Q8_0: the s chain starts from the offset term corr)
        __m512i s = F::kOff ? dpq_from(r + 72, x0, r) : dpq(_mm512_setzero_si512(), x0, r), u = _mm512_setzero_si512();
        u = dpq(u, x4, r + 32);
        s = dpq(s, x1, r + 8);
        u = dpq(u, x5, r + 40);
        s = dpq(s, x2, r + 16);
        u = dpq(u, x6, r + 48);
        s = dpq(s, x3, r + 24);
        u = dpq(u, x7, r + 56);
        __m512 &a = cls<Q>(acc[t]);
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s, u)), mulq(dw, r + 64), a);
        if constexpr (F::kM) a = fmaq(a, mw, r + 72);
    });
}

// One pass of NT (<= 4) tokens (records from rec0, token stride ts) over group g, its results
// into rows [lo, hi) of tokens t0 .. t0 + NT - 1; FIRST: t0 is 0 (the pass that streams the
// group from memory). (Its own function: I7. FIRST a template parameter: a branch on it in the
// loop made clang keep accumulators in memory across iterations, I7.)
template <class F, int NT, bool FIRST>
__attribute__((noinline)) void rows_group(const RowArgs &a, int64_t g, int t0, const uint8_t *rec0, size_t ts,
                                          int64_t lo, int64_t hi) {
    const int64_t np = a.n / 64;
    const uint8_t *base = a.w + (size_t)g * kR8Rows * a.w_stride;
    Acc acc[NT];
    LB_TOKENS(NT, acc[t].q0 = acc[t].q1 = acc[t].q2 = acc[t].q3 = _mm512_setzero_ps());
    const uint8_t *y[NT];
    LB_TOKENS(NT, y[t] = rec0 + (size_t)t * ts);
    const auto step = [&](int64_t p, auto qc) __attribute__((always_inline)) {
        const uint8_t *o = base + (size_t)p * F::kGroup;
        if constexpr (FIRST) {
            prefetch_ahead(o, F::kGroup);
        } else {  // a later pass reads the group from L1: meanwhile the next group's pair p
            // comes to L2, so the stream from DRAM does not stop while this pass computes
            const uint8_t *next = o + (size_t)np * F::kGroup;
            for (size_t l = 0; l < F::kGroup; l += 64) _mm_prefetch((const char *)next + l, _MM_HINT_T1);
        }
        const uint8_t *yp[NT];  // the tokens' records of pair p
        LB_TOKENS(NT, yp[t] = y[t] + (size_t)p * kRec);
        pair<F, NT, decltype(qc)::value>(o, yp, acc);
    };
    each_pair(np, step);
    // the tree: e_q = class 2q + class 2q + 1 (lanes 2j, 2j + 1), then (e0 + e1) + (e2 + e3); row j
    // at lane 2j, gathered to lanes 0..7
    const __m512i idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    const int64_t r = g * kR8Rows;
    const __mmask8 keep = (__mmask8)(((1u << (hi - r)) - 1) & ~((1u << (lo - r)) - 1));
    LB_TOKENS(NT, {
        const Acc &c = acc[t];
        const __m512 e0 = _mm512_add_ps(c.q0, _mm512_permute_ps(c.q0, 0xB1)), e1 = _mm512_add_ps(c.q1, _mm512_permute_ps(c.q1, 0xB1));
        const __m512 e2 = _mm512_add_ps(c.q2, _mm512_permute_ps(c.q2, 0xB1)), e3 = _mm512_add_ps(c.q3, _mm512_permute_ps(c.q3, 0xB1));
        const __m512 res = _mm512_permutexvar_ps(idx, _mm512_add_ps(_mm512_add_ps(e0, e1), _mm512_add_ps(e2, e3)));
        _mm256_mask_storeu_ps(a.out + (size_t)(t0 + t) * a.out_stride + r, keep, _mm512_castps512_ps256(res));
    });
}

// Tokens T0 .. NT - 1 of group g in passes of kPass (the last one shorter), while its rows are in
// L1: 4 (16 accumulators beside 8 code vectors); under clang 3 for Q4_1 (its m vector beside 4
// tokens' cost 3 stack moves a pass: I7), 4 tokens left going as 2 + 2.
#if defined(__clang__)
template <class F>
constexpr int kPass = F::kM ? 3 : 4;
#else
template <class F>
constexpr int kPass = 4;
#endif
template <class F, int NT, int T0 = 0>
LB_LR_INLINE void group_passes(const RowArgs &a, int64_t g, const uint8_t *rec, size_t ts, int64_t lo, int64_t hi) {
    constexpr int left = NT - T0, n = left == 4 && kPass<F> < 4 ? 2 : left < kPass<F> ? left : kPass<F>;
    rows_group<F, n, T0 == 0>(a, g, T0, rec + (size_t)T0 * ts, ts, lo, hi);
    if constexpr (T0 + n < NT) group_passes<F, NT, T0 + n>(a, g, rec, ts, lo, hi);
}

template <class F, int NT>
void rows_window(const RowArgs &a, int64_t r0, int64_t r1) {
    const uint8_t *rec = prepare<F>(a, NT);
    const size_t ts = (size_t)(a.n / 64) * kRec;
    for (int64_t g = r0 / kR8Rows; g * kR8Rows < r1; ++g)
        group_passes<F, NT>(a, g, rec, ts, std::max(r0, g * kR8Rows), std::min(r1, (g + 1) * kR8Rows));
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
        case WIDE_NT: return rows_window<F, WIDE_NT>(a, r0, r1);
        default: return;
    }
}

}  // namespace

// The R8 entries' windows and wide window (16 tokens: 4 passes of 4 on each group); their GEMM:
// register_gemm, csrc/x86/gemm.inl. Counted under kQ4_0R8Id, kQ4_1R8Id, kQ8_0R8Id; their
// activations are the format's (Q8_0, Q8_1).
void register_lg_r8(KernelTable &t) {
    const auto set = [&](int id, rows_fn f, const char *name, const char *wide) {
        t.set_rows_all(id, f, name, ISA_AVX512);
        t.at(id).wide = RowKernel{f, wide, ISA_AVX512};
        t.at(id).count_id = id;
    };
    set(kQ4_0R8Id, rows_r8<LQ4_0>, "rows_q4_0_r8_q8_0_avx512", "rows16_q4_0_r8_q8_0_avx512");
    set(kQ4_1R8Id, rows_r8<LQ4_1>, "rows_q4_1_r8_q8_1_avx512", "rows16_q4_1_r8_q8_1_avx512");
    set(kQ8_0R8Id, rows_r8<LQ8_0>, "rows_q8_0_r8_q8_0_avx512", "rows16_q8_0_r8_q8_0_avx512");
}

}  // namespace avx512
}  // namespace lowbit

#pragma GCC diagnostic pop
