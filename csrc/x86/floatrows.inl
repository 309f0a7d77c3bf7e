// Float weight rows (F32, F16, BF16) against float32 activations: the MoE router, and any
// F16/BF16 tensor of a model. Shared body of csrc/x86/{avx2,avx2vnni,avx512}/floatrows.cpp;
// the including file defines LOWBIT_ISA (ISA_AVX2, ISA_AVX2VNNI or ISA_AVX512) and
// LOWBIT_NS (the level's namespace), and is built with that level's flags only.
//
// Contract (csrc/kernels.h, DESIGN.md): out[t * out_stride + r] = W[r] . x[t] for r in
// [r0, r1), t < nt. W[r] is n values (F32 / IEEE half / bfloat16, little endian, no
// alignment assumed), x[t] is n raw float32 values (act_stride in bytes). n is any n >= 1.
//
// Arithmetic of one (row, token) dot, the same for every nt and every row grouping (I2, I3):
//   V = 16 float lanes (avx512) or 8 (avx2, avx2vnni); one accumulator vector acc = 0;
//   for each full vector i = 0, V, 2V, ..:   acc = fma(w[i..i+V), x[i..i+V), acc)
//   s = hsum(acc), a fixed tree: (lanes 0..7 + 8..15), then 0..3 + 4..7, then
//       (0,1,2,3) + (2,3,.,.), then lane 0 + lane 1;
//   for the n % V tail, i in index order:     s = fma(w[i], x[i], s)   (scalar)
//   result = s.
// Lane j therefore sums the products of indices = j (mod V) in index order; the float32
// rounding of these n / V-long chains stays orders of magnitude below I5's 1e-5 (tested
// against float64 up to n = 16384 in tests/test_floatrows_simd.py).
// Decoding (bf16: the 16 bits become the high half of a float; f16: vcvtph2ps, exact) is
// done once per weight vector per window; each token then costs one activation load and
// one fma per vector.
//
// Speed: every (row, token) pair is one dependency chain (4-cycle fma latency, 2 fma per
// cycle), so a tile runs R rows x NT tokens at once, with R chosen per NT so that R * NT
// >= 8 chains are in flight (NT = 1 walks 8 rows side by side and loads each activation
// vector once for all 8). R may depend on NT freely: rows never share arithmetic.
// Accumulators are named registers c<row><token>, never an array (I7). Rows whose window
// of activations overflows L1 run in column chunks (see "Column blocking" below), which
// changes the order of the work but not one fma of any lane.

// GCC 12's AVX-512 intrinsics (_mm512_cvtph_ps, _mm512_zextsi256_si512) fill an unused
// operand from a self-initialised "undefined" vector and then warn about it where they are
// inlined; the diagnostic follows the header's lines, so it is silenced around the include.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "../kernels.h"
#include "prefetch.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including floatrows.inl"
#endif

namespace lowbit {
namespace LOWBIT_NS {
namespace {

#define LB_FR_INLINE inline __attribute__((always_inline))

// LOWBIT_ISA is an enum (invisible to the preprocessor): the vector width follows the
// level's compiler flags, and the static_asserts tie the two together.
#if defined(__AVX512F__)
#define LB_FR_512 1
static_assert(LOWBIT_ISA == ISA_AVX512, "512-bit body built for a 256-bit level");
#else
#define LB_FR_512 0
static_assert(LOWBIT_ISA == ISA_AVX2 || LOWBIT_ISA == ISA_AVX2VNNI, "256-bit body built for avx512");
#endif

#if LB_FR_512
using vf = __m512;
constexpr int V = 16;
LB_FR_INLINE vf vzero() { return _mm512_setzero_ps(); }
LB_FR_INLINE vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
LB_FR_INLINE vf vloadx(const float *p) { return _mm512_loadu_ps(p); }
LB_FR_INLINE void vstore(float *p, vf v) { _mm512_store_ps(p, v); }
// Fixed reduction tree (see the header): 16 -> 8 -> 4 -> 2 -> 1.
LB_FR_INLINE float hsum(vf v) {
    // (__builtin_shufflevector, not the cast intrinsics: GCC 12's warn on their undefined
    // upper halves.)
    const __m256 h = _mm256_add_ps(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                                   __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
#else
using vf = __m256;
constexpr int V = 8;
LB_FR_INLINE vf vzero() { return _mm256_setzero_ps(); }
LB_FR_INLINE vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
LB_FR_INLINE vf vloadx(const float *p) { return _mm256_loadu_ps(p); }
LB_FR_INLINE void vstore(float *p, vf v) { _mm256_store_ps(p, v); }
// Fixed reduction tree (see the header): 8 -> 4 -> 2 -> 1.
LB_FR_INLINE float hsum(vf h) {
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
#endif

// ---- weight decoders: element i.. of a row (byte pointer) -> V floats ----------------------

struct DecF32 {
    static constexpr int esize = 4;
    static LB_FR_INLINE vf load(const uint8_t *row, int64_t i) { return vloadx((const float *)row + i); }
    static LB_FR_INLINE float scalar(const uint8_t *row, int64_t i) {
        float v;
        std::memcpy(&v, row + 4 * i, 4);
        return v;
    }
};

#if LB_FR_512
// F32 rows that are 32- but not 64-byte aligned (GGUF aligns tensors to 32 bytes): every
// 64-byte load would straddle two cache lines, which nearly halves the rate at small
// windows. Two 32-byte loads joined by vinsertf32x8 cost one shuffle uop instead (~1.3x
// faster at nt = 1 there; with less alignment both split, and plain loads are better).
// The values and lanes are the same, so the results are bitwise those of DecF32.
struct DecF32Halves : DecF32 {
    static LB_FR_INLINE vf load(const uint8_t *row, int64_t i) {
        const float *p = (const float *)row + i;
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(p)), _mm256_loadu_ps(p + 8), 1);
    }
};
#endif

struct DecF16 {
    static constexpr int esize = 2;
#if LB_FR_512
    static LB_FR_INLINE vf load(const uint8_t *row, int64_t i) {
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 2 * i)));
    }
#else
    static LB_FR_INLINE vf load(const uint8_t *row, int64_t i) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
    }
#endif
    static LB_FR_INLINE float scalar(const uint8_t *row, int64_t i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        return _cvtsh_ss(h);
    }
};

// bfloat16 -> float is a 16-bit left shift. One shuffle uop per vector: each 16-bit value
// lands in the high word of its 32-bit lane, the low word is zeroed.
struct DecBF16 {
    static constexpr int esize = 2;
#if LB_FR_512
    // vpermw with zero masking: odd words of the result take source word (j - 1) / 2.
    static LB_FR_INLINE __m512i idx() {
        return _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    }
    static LB_FR_INLINE vf widen(__m256i h) {
        return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, idx(), _mm512_zextsi256_si512(h)));
    }
    static LB_FR_INLINE vf load(const uint8_t *row, int64_t i) {
        return widen(_mm256_loadu_si256((const __m256i *)(row + 2 * i)));
    }
#else
    // The 8 values are broadcast to both 128-bit lanes (a pure load); vpshufb then moves
    // words 0..3 into lane 0's dwords and words 4..7 into lane 1's (index -1 = zero byte).
    static LB_FR_INLINE __m256i idx() {
        return _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    }
    static LB_FR_INLINE vf widen(__m128i h) {
        return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(h), idx()));
    }
    static LB_FR_INLINE vf load(const uint8_t *row, int64_t i) {
        return widen(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
    }
#endif
    static LB_FR_INLINE float scalar(const uint8_t *row, int64_t i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float v;
        std::memcpy(&v, &u, 4);
        return v;
    }
};

// ---- the tile: R rows x NT tokens ---------------------------------------------------------

// Rows per tile for a window of NT tokens: >= 8 independent fma chains (R * NT), the
// activation vector of a token loaded once for all R rows, and R * NT accumulators + R
// decoded weights + 1 activation within the register file (16 ymm / 32 zmm).
template <int NT>
constexpr int rows_per_tile() {
#if LB_FR_512
    constexpr int r[9] = {0, 8, 4, 3, 3, 3, 3, 3, 3};  // 8, 8, 9, 12, 15, 18, 21, 24 chains
#else
    constexpr int r[9] = {0, 8, 4, 3, 2, 2, 2, 1, 1};  // 8, 8, 9, 8, 10, 12, 7, 8 chains
#endif
    return r[NT];
}

// Accumulator c<row><token> and decoded weight w<row> are named registers (I7); the names a
// tile does not use are dead code. Steps run token-major (all rows of token 0, then all
// rows of token 1, ..): a token's activation vector is live for R fmas only, and row q's
// weight vector is decoded at its token-0 step and kept for the other tokens. The token's
// activation vector is loaded once into x for its R fmas. (The empty asms keep x and w in
// registers: GCC otherwise folds a load into every fma that uses it, R or NT loads of
// the same vector instead of one, each an unlaminated indexed-load uop pair.)
#define LB_FR_ROWS(M, t) M(0, t) M(1, t) M(2, t) M(3, t) M(4, t) M(5, t) M(6, t) M(7, t)
#define LB_FR_PAIRS(M)                                                                   \
    LB_FR_ROWS(M, 0) LB_FR_ROWS(M, 1) LB_FR_ROWS(M, 2) LB_FR_ROWS(M, 3)                  \
    LB_FR_ROWS(M, 4) LB_FR_ROWS(M, 5) LB_FR_ROWS(M, 6) LB_FR_ROWS(M, 7)
#define LB_FR_DECL(q, t) [[maybe_unused]] vf c##q##t = vzero();
#define LB_FR_STEP(q, t)                                                                 \
    if constexpr ((q) < R && (t) < NT) {                                                 \
        if constexpr ((t) == 0) {                                                        \
            w##q = LB_FR_W(q);                                                           \
            if constexpr (NT > 1) __asm__("" : "+v"(w##q));                              \
        }                                                                                \
        if constexpr ((q) == 0) {                                                        \
            x = LB_FR_X(t);                                                              \
            if constexpr (R > 1) __asm__("" : "+v"(x));                                  \
        }                                                                                \
        c##q##t = vfma(w##q, x, c##q##t);                                                \
    }
// One sum at a time: left alone, GCC hoists the first halving step of every sum of the
// tile above all of them (24 extra live vectors: spills). The empty volatile asms keep
// the sums in order and their inputs and results in registers; they emit nothing.
#define LB_FR_STORE(q, t)                                                                \
    if constexpr ((q) < R && (t) < NT) {                                                 \
        __asm__ volatile("" : "+v"(c##q##t));                                            \
        float s = hsum(c##q##t);                                                         \
        __asm__ volatile("" : "+v"(s));                                                  \
        a.out[(size_t)(t) * a.out_stride + (size_t)(r + (q))] = s;                       \
    }

// The last n % V values of a row: *o + w[i0] * x[i0] + .. one scalar fma at a time in
// index order, starting from the row's stored vector sum *o, and stored back to *o (cold:
// real rows are multiples of 64 long). (The sum goes through *o, not a float argument and
// result: clang otherwise keeps the tile's stored sums in registers across these calls and
// spills them.)
template <class D>
__attribute__((noinline)) void rows_tail(const uint8_t *w, const float *x, int64_t i0, int64_t n, float *o) {
    float s = *o;
    for (int64_t i = i0; i < n; ++i) s = std::fma(D::scalar(w, i), x[i], s);
    *o = s;
}

// Rows [r, r + R) x NT tokens over the columns [k0, k1) (multiples of V). The accumulators
// start at zero when k0 == 0, else from acc; after the columns they go back to acc, or,
// when `last`, are summed and stored (then the tail). acc holds R * NT vectors, row-major
// (row q, token t at (q * NT + t) * V); it is only touched when k0 > 0 or !last.
#define LB_FR_LOAD(q, t)                                                                 \
    if constexpr ((q) < R && (t) < NT) c##q##t = vloadx(acc + ((q) * NT + (t)) * V);
#define LB_FR_SAVE(q, t)                                                                 \
    if constexpr ((q) < R && (t) < NT) vstore(acc + ((q) * NT + (t)) * V, c##q##t);

template <class D, int NT, int R, bool PF>
__attribute__((noinline)) void rows_tile(const RowArgs &a, int64_t r, int64_t k0, int64_t k1, float *acc, bool last) {
    static_assert(R >= 1 && R <= 8 && NT >= 1 && NT <= 8, "tile shape");
    // Addressing with few general registers (11 row and token pointers + loop state would
    // not fit, and GCC then parks values in vector registers and spills those): wb / xb
    // point at column i of row r / token 0 and advance one vector per step; rows r + 4..7
    // and tokens 4..7 go from wb4 / xb4, four strides on; the rest is a stride register
    // times 1 or 2 or the precomputed 3 * stride in the address. The empty asm keeps the
    // 3 * stride values opaque, so GCC does not fold them into new induction pointers.
    const uintptr_t ws = a.w_stride, xs = a.act_stride;
    uintptr_t ws3 = 3 * ws, xs3 = 3 * xs;
    __asm__("" : "+r"(ws3), "+r"(xs3));
    uintptr_t wb = (uintptr_t)a.w + (uintptr_t)r * ws + (uintptr_t)k0 * D::esize, wb4 = wb + 4 * ws;
    uintptr_t xb = (uintptr_t)a.act + (uintptr_t)k0 * 4, xb4 = xb + 4 * xs;
#define LB_FR_OFF(j, s, s3) ((j) % 4 == 0 ? 0 : (j) % 4 == 1 ? (s) : (j) % 4 == 2 ? 2 * (s) : (s3))
    [[maybe_unused]] vf w0, w1, w2, w3, w4, w5, w6, w7, x;
    LB_FR_PAIRS(LB_FR_DECL)
    if (k0 > 0) { LB_FR_PAIRS(LB_FR_LOAD) }
    for (int64_t m = (k1 - k0) / V; m > 0; --m) {
#define LB_FR_X(t) vloadx((const float *)(((t) < 4 ? xb : xb4) + LB_FR_OFF(t, xs, xs3)))
#define LB_FR_W(q) D::load((const uint8_t *)(((q) < 4 ? wb : wb4) + LB_FR_OFF(q, ws, ws3)), 0)
        // PF (rows_nt; one row per tile): the line at the same column of the next row is asked
        // for, once per line (V * esize bytes a step: F16's 32 at avx512 ask every other step)
        if constexpr (PF) {
            static_assert(R == 1, "a prefetching call streams one row at a time");
            constexpr int64_t every = V * D::esize >= 64 ? 1 : 64 / (V * D::esize);
            if (every == 1 || m % every == 0) _mm_prefetch((const char *)(wb + ws), _MM_HINT_T0);
        }
        LB_FR_PAIRS(LB_FR_STEP)
#undef LB_FR_W
#undef LB_FR_X
        wb += V * D::esize, wb4 += V * D::esize, xb += V * 4, xb4 += V * 4;
    }
#undef LB_FR_OFF
    if (!last) {
        LB_FR_PAIRS(LB_FR_SAVE)
        return;
    }
    LB_FR_PAIRS(LB_FR_STORE)
    if (k1 < a.n)
        for (int q = 0; q < R; ++q)
            for (int t = 0; t < NT; ++t) {
                rows_tail<D>(a.w + (size_t)(r + q) * a.w_stride, (const float *)(a.act + (size_t)t * a.act_stride),
                             k1, a.n, a.out + (size_t)t * a.out_stride + (size_t)(r + q));
            }
}

#undef LB_FR_ROWS
#undef LB_FR_PAIRS
#undef LB_FR_DECL
#undef LB_FR_STEP
#undef LB_FR_STORE
#undef LB_FR_LOAD
#undef LB_FR_SAVE

// Rows [r, r1) over columns [k0, k1): whole tiles of R rows, then the leftover rows in
// tiles of R / 2, R / 4, .., 1. Row r's accumulators live at acc + (r - r_first) * NT * V.
template <class D, int NT, int R, bool PF>
LB_FR_INLINE void rows_from(const RowArgs &a, int64_t r, int64_t r1, int64_t k0, int64_t k1, float *acc,
                            bool last) {
    for (; r + R <= r1; r += R, acc += R * NT * V) rows_tile<D, NT, R, PF>(a, r, k0, k1, acc, last);
    if constexpr (R > 1) rows_from<D, NT, R / 2, PF>(a, r, r1, k0, k1, acc, last);
}

// Column blocking. A tile reads every activation vector of its NT tokens once per pass
// over the row; for NT * n * 4 bytes beyond L1 those reads come from L2, once per tile,
// and bound the speed (R = 1 tiles: one 32-byte L2 read per fma). So long rows go in
// column chunks of kChunk<NT> values (NT chunks of activations, ~20 KB, stay in L1) over
// blocks of kBlockRows rows (a multiple of every tile height, so blocks leave no short
// tiles); between chunks each tile's accumulators wait in a per-thread buffer of
// kBlockRows * NT vectors (at most 6 or 12 KB). Storing and reloading a vector is exact
// and the chunks are multiples of V, so every lane's fma sequence is the unblocked one:
// the blocking changes no bit of any result (I2, I3).
constexpr int64_t kActL1Bytes = 20 * 1024;
constexpr int64_t kBlockRows = 24;
template <int NT>
constexpr int64_t kChunk = kActL1Bytes / (4 * NT) / 64 * 64;  // 5120, 2560, .., 640 values
static_assert(kBlockRows % 8 == 0 && kBlockRows % 3 == 0, "tile heights are 8, 4, 3, 2, 1");

inline float *block_acc() {
    alignas(64) static thread_local float buf[kBlockRows * MAX_NT * V];
    return buf;
}

template <class D, int NT, bool PF>
void rows_blocked(const RowArgs &a, int64_t r0, int64_t r1) {
    // (a prefetching call streams one row at a time: R = 1 read F16 rows at one token and 2
    // threads at 45-48 GB/s against 38-42 with R = 2 and 36-40 with R = 8, Zen 5, 256 MB)
    constexpr int R = PF ? 1 : rows_per_tile<NT>();
    const int64_t nfull = a.n - a.n % V;
    // one pass when the activations (about) fit in L1
    const int64_t kc = nfull <= kChunk<NT> + kChunk<NT> / 2 ? nfull : kChunk<NT>;
    float *const acc = block_acc();
    for (int64_t b0 = r0; b0 < r1; b0 += kBlockRows) {
        const int64_t b1 = b0 + kBlockRows < r1 ? b0 + kBlockRows : r1;
        for (int64_t k0 = 0;; k0 += kc) {
            const int64_t k1 = k0 + kc < nfull ? k0 + kc : nfull;
            rows_from<D, NT, R, PF>(a, b0, b1, k0, k1, acc, k1 == nfull);
            if (k1 == nfull) break;
        }
    }
}

// Windows of 1 or 2 tokens over at least kPrefetchBytes of 2-byte rows in the call are
// memory-bound: they stream one row at a time (R = 1, not the 8 streams of an R = 8 tile,
// which the hardware prefetchers follow poorly) and prefetch the next row's line (rows_tile's
// PF). Zen 5, 256 MB of rows, n = 2560 (BENCHMARKS.md 2026-12-04 (5)): F16 and BF16 at one
// token 1.17-1.2x faster on one thread (36.5 GB/s), 1.15-1.25x on two (45-48 GB/s, ggml's
// vec_dot 0.86-1.10x of it); at two tokens 1.4-1.7x. F32 lost 7-18% at one token (it goes
// without); rows in L2 (192 rows) lost 20-40% with the prefetch (calls over fewer bytes go
// without).
constexpr int64_t kPrefetchBytes = (int64_t)2 << 20;

// The table entry for a window of NT tokens (nt == NT; the table dispatches per nt).
template <class D, int NT>
void rows_nt(const RowArgs &a, int64_t r0, int64_t r1, int) {
#if LB_FR_512
    if constexpr (std::is_same_v<D, DecF32>)
        if ((((uintptr_t)a.w | (uintptr_t)a.w_stride) & 63) == 32) return rows_blocked<DecF32Halves, NT, false>(a, r0, r1);
#endif
    // (2-byte rows only: F32 lost 7-18% with it at one token; no prefetching instances of wider windows)
    if constexpr (kPrefetchAhead > 0 && NT <= 2 && D::esize == 2)
        if ((r1 - r0) * (int64_t)a.w_stride >= kPrefetchBytes) return rows_blocked<D, NT, true>(a, r0, r1);
    rows_blocked<D, NT, false>(a, r0, r1);
}

#define LB_FR_STR2(x) #x
#define LB_FR_STR(x) LB_FR_STR2(x)

template <class D>
void set_rows(KernelTable &t, int id, const char *name) {
    set_rows_each_nt(t.at(id), name, LOWBIT_ISA, [](auto nt) { return &rows_nt<D, decltype(nt)::value>; });
}

}  // namespace

void register_float(KernelTable &t) {
    set_rows<DecF32>(t, T_F32, "rows_f32_f32_" LB_FR_STR(LOWBIT_NS));
    set_rows<DecF16>(t, T_F16, "rows_f16_f32_" LB_FR_STR(LOWBIT_NS));
    set_rows<DecBF16>(t, T_BF16, "rows_bf16_f32_" LB_FR_STR(LOWBIT_NS));
}

#undef LB_FR_STR
#undef LB_FR_STR2
#undef LB_FR_INLINE
#undef LB_FR_512

}  // namespace LOWBIT_NS
}  // namespace lowbit
