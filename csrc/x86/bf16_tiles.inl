// BF16 weight rows against float32 activations on AMX-BF16 tiles (TDPBF16PS): the amx level's
// windows (nt 1..8) and GEMM (nt > 8) of BF16, one function. Included by csrc/x86/amx/bf16.cpp (the
// hardware's tiles) and csrc/x86/avx2/bf16_amx.cpp (the emulator's, LOWBIT_AMX_EMULATE: the same code
// tested on any x86 CPU with avx2). The including file defines LOWBIT_NS.
//
// Contract at the amx level (the row-kernel contract of csrc/kernels.h; this arithmetic replaces
// floatrows.inl's for BF16 there): out[t * out_stride + r] = W[r] . x[t] for r in [r0, r1), t < nt,
//   - x[t] rounded to bfloat16 (to nearest even, NaN kept NaN: ggml's fp32 -> bf16, which its BF16
//     matmuls apply to their activations too), both W[r] and x[t] zero-padded to S = ceil(n / 32)
//     slices of 32 values;
//   - C = 0; for s = 0 .. S - 1 in order: C = TDPBF16PS(C, W[r] slice s, x[t] slice s), C being the
//     (row, token) element of a 16 x 16 float tile;
//   - result = C.
// A tiles are 16 weight rows x 32 bf16; B tiles 16 k-pairs x W tokens ("VNNI" pairs) and C tiles 16
// rows x W tokens, W = nt for a window (1..8) and 16 for the GEMM; a row or token the call lacks is a
// zero row of A or column of B. So a (row, token) result is one fixed sequence of tile products on
// its own row of A and column of B: the same in a window of 1 token or 8, in the GEMM of a 512-token
// chunk, and in any row split (I2, I3, I8), given that an element of TDPBF16PS's result depends on
// nothing but its row of A, its column of B and its C, whatever the tiles' widths: what
// tests/test_amx_bf16.py checks on the hardware (each token alone, W = 1, against every window and
// the GEMM, bitwise). These are not the avx512 level's BF16 results, which keep x in float32
// (floatrows.inl): the levels differ by x's rounding, <= 2^-9 of each |w x| (tested against float64).
//
// Speed: the activations are laid out once per thread and call (act_id: the panel, by AVX-512 for the
// GEMM). A window streams one 16-row group at a time with its rows read in place (tile loads of 16
// rows at w_stride) and its B tiles W columns wide (a token's slice: 4 bytes, in L1). The GEMM packs
// a block of 256 rows, 8 slices at a time, into tile order and runs 2 x 2 tile blocks (two groups x
// two blocks of 16 tokens: 4 tile loads, 4 products a slice), carrying the C tiles from chunk to
// chunk. BENCHMARKS.md round 27 has what bounds it (the tile loads) and what was tried.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "../fp16.h"
#include "../kernels.h"
#include "amx_tiles.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

constexpr int kSliceBf16 = 32;  // values of K per tile product
constexpr int kTileBytes = 64;  // bytes of an A tile row (32 bf16)

// LOWBIT_BF16_PANEL=scalar: the GEMM's activation panel by the scalar loop (tests: both builds agree)
inline bool scalar_panel() {
    static const bool v = [] {
        const char *e = std::getenv("LOWBIT_BF16_PANEL");
        return e && std::strcmp(e, "scalar") == 0;
    }();
    return v;
}

// Tokens per B tile (its columns): the window's nt for windows (a token's B column costs 4 bytes a
// slice, so one token's tiles stay in L1: 16 columns of which 15 were zeros made a window of one
// token read 15-18 GB/s on one thread against the float windows' 25), 16 for the GEMM.
inline int block_width(int nt) { return nt <= MAX_NT ? nt : 16; }

// The activation panel: per block b of W tokens and slice s, one B tile of 16 rows (k-pairs) x W
// tokens x 2 bf16 at panel + (s * blocks + b) * 32 W (slice-major: the GEMM's chunk of slices is one
// run of memory rather than 16 blocks S KB apart; a loop of its steps ran alike both ways on a quiet
// host, 528-537 GMAC/s, one thread): row kp, token j holds x[W b + j][32 s + 2 kp + i]
// at 2 W kp + 2 j + i. Tokens and values past nt and n are zeros.
void build_panel_scalar(const RowArgs &a, int nt, int W, int64_t S, uint16_t *panel) {
    const int64_t blocks = (nt + W - 1) / W, tile = 32 * (int64_t)W;
    std::memset(panel, 0, (size_t)(blocks * S * tile) * 2);
    for (int t = 0; t < nt; ++t) {
        const float *x = (const float *)(a.act + (size_t)t * a.act_stride);
        uint16_t *col = panel + (size_t)(t / W) * (size_t)tile + 2 * (t % W);
        for (int64_t k = 0; k < a.n; k += 2) {
            const int64_t s = k / kSliceBf16, kp = (k % kSliceBf16) / 2;
            uint16_t *d = col + (size_t)(s * blocks * tile + 2 * W * kp);
            d[0] = f32_to_bf16(x[k]);
            d[1] = k + 1 < a.n ? f32_to_bf16(x[k + 1]) : 0;
        }
    }
}

#if defined(__AVX512F__)
// The GEMM's panel (W = 16) by vectors: per block and slice, each token's 32 values (masked past n:
// zeros; zero vectors past nt) become 16 dwords of bf16 pairs (f32_to_bf16's rounding, lane by lane),
// and the 16 x 16 dwords are transposed into the tile's rows. Bytes identical to the scalar build's
// (the emulator's, and the windows'): tests/test_amx_bf16.py's rounding test runs both ways.
// (1.3 ns a value the scalar way: a 256-token chunk of 4096-wide rows spent 1.3 ms on each thread's
// panel, as long as the tile products of 330 rows.)
inline __m512i bf16_rne(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(64));
}
// 16 dwords of token j's bf16 pairs of slice s (values k0 .. k0 + 31 of x, those >= n zero)
inline __m512i token_pairs(const float *x, int64_t k0, int64_t n) {
    const int64_t left = n - k0;
    const __mmask16 m0 = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    const __mmask16 m1 = left >= 32 ? (__mmask16)0xffff : left <= 16 ? (__mmask16)0 : (__mmask16)((1u << (left - 16)) - 1);
    const __m512i lo = bf16_rne(_mm512_maskz_loadu_ps(m0, x + k0)), hi = bf16_rne(_mm512_maskz_loadu_ps(m1, x + k0 + 16));
    // dword i = value 2i (low half) | value 2i + 1 (high half): words of lo then hi, each the low
    // word of a dword -> vpermt2w picking words 0, 2, 4, .. of lo, then of hi
    const __m512i idx = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,
                                         30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_epi16(lo, idx, hi);
}
// r[i] (16 dwords, row i) -> r[i] = column i
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // r[4q + p]: within each 128-bit lane L, dwords of rows 4L'.. : rows (4 * (lane) ..) mixed
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);        // lanes 0, 2 of r[i], then of r[i + 4]
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);    // lanes 1, 3
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}
#endif

// (out of line: not part of the row kernel, whose loops must keep their vectors in registers, I7;
// the transpose holds 32 vectors)
__attribute__((noinline)) void build_panel(const RowArgs &a, int nt, int W, int64_t S, uint16_t *panel) {
#if defined(__AVX512F__)
    if (W == 16 && !scalar_panel()) {
        const int64_t blocks = (nt + 15) / 16;
        for (int64_t b = 0; b < blocks; ++b) {
            const float *x[16];
            for (int j = 0; j < 16; ++j)
                x[j] = 16 * b + j < nt ? (const float *)(a.act + (size_t)(16 * b + j) * a.act_stride) : nullptr;
            for (int64_t s = 0; s < S; ++s) {
                __m512i r[16];
                for (int j = 0; j < 16; ++j) r[j] = x[j] ? token_pairs(x[j], 32 * s, a.n) : _mm512_setzero_si512();
                transpose16(r);
                uint16_t *d = panel + (size_t)((s * blocks + b) * 512);
                for (int kp = 0; kp < 16; ++kp) _mm512_storeu_si512(d + 32 * kp, r[kp]);
            }
        }
        return;
    }
#endif
    build_panel_scalar(a, nt, W, S, panel);
}

// Where a 16-row group's A tiles come from: slice s at p + s * step (rows `stride` bytes apart),
// except the last slice at `last` (16 x 64 bytes) when set (rows whose length is no multiple of 32).
struct ASrc {
    const uint8_t *p;
    size_t stride, step;
    const uint8_t *last;
};

// A tiles (tmm0, 1) 16 x 64 bytes; B (tmm2, 3) 16 x 4 W; C (tmm4 .. 7) 16 x 4 W.
inline void configure(int W) {
    static const auto cfgs = [] {
        struct { TileConfig c[17]; } t;
        for (int w = 1; w <= 16; ++w) {
            t.c[w].set(0, 16, kTileBytes), t.c[w].set(1, 16, kTileBytes);
            for (int i = 2; i < 8; ++i) t.c[w].set(i, 16, 4 * w);
        }
        return t;
    }();
    tile_loadconfig(cfgs.c[W]);
}

template <int T>
inline void load_a(const ASrc &a, int64_t s, int64_t S) {
    if (a.last && s == S - 1) tile_load<T>(a.last, kTileBytes);
    else tile_load<T>(a.p + (size_t)s * a.step, a.stride);
}

// The GEMM's step: two 16-row groups (a0, a1) x one or two blocks of 16 tokens (b0, b1 when TWO) over
// the slices [s0, s1); C tiles from and to c (group i, block j at c + (2 i + j) * 256, 16 rows x 16
// tokens, row-major), starting from zero when !carry. (Storing a C tile and loading it back is
// exact: a result's tile products are the same sequence however the slices are chunked.)
template <bool TWO>
void mk(const ASrc &r0, const ASrc &r1, const uint16_t *b0, const uint16_t *b1, int64_t blocks, int64_t s0, int64_t s1,
        int64_t S, bool carry, float *c) {
    const ASrc a0 = r0, a1 = r1;  // (copies in registers: the tile loads' compiler barriers would reload the buffers')
    const size_t bt = 32 * 16 * (size_t)blocks;  // (the panel's slice stride)
    constexpr size_t cb = 64;
    if (carry) {
        tile_load<4>(c, cb), tile_load<6>(c + 2 * 256, cb);
        if constexpr (TWO) tile_load<5>(c + 256, cb), tile_load<7>(c + 3 * 256, cb);
    } else {
        tile_zero<4>(), tile_zero<6>();
        if constexpr (TWO) tile_zero<5>(), tile_zero<7>();
    }
    for (int64_t s = s0; s < s1; ++s) {
        load_a<0>(a0, s, S);
        load_a<1>(a1, s, S);
        tile_load<2>(b0 + (size_t)s * bt, cb);
        if constexpr (TWO) tile_load<3>(b1 + (size_t)s * bt, cb);
        tile_dpbf16<4, 0, 2>();
        tile_dpbf16<6, 1, 2>();
        if constexpr (TWO) tile_dpbf16<5, 0, 3>(), tile_dpbf16<7, 1, 3>();
    }
    tile_store<4>(c, cb);
    tile_store<6>(c + 2 * 256, cb);
    if constexpr (TWO) tile_store<5>(c + 256, cb), tile_store<7>(c + 3 * 256, cb);
}

// A window's step: one 16-row group x one block of W tokens; C (tmm4) to c (16 rows x W). The slices'
// A tiles alternate between tmm0 and tmm1, so a slice's load need not wait for the previous product
// to have read its tile (one group at a time: 16 rows streamed, not 32; one token read 17.9 GB/s on
// one thread against two groups' 13-15). The products into C are in slice order, as mk's.
void mk1(const ASrc &r0, const uint16_t *b0, int64_t S, int W, float *c) {
    const ASrc a0 = r0;  // (as mk's)
    const size_t bt = 32 * (size_t)W, cb = 4 * (size_t)W;
    tile_zero<4>();
    int64_t s = 0;
    for (; s + 1 < S; s += 2) {
        load_a<0>(a0, s, S);
        tile_load<2>(b0 + (size_t)s * bt, cb);
        tile_dpbf16<4, 0, 2>();
        load_a<1>(a0, s + 1, S);
        tile_load<3>(b0 + (size_t)(s + 1) * bt, cb);
        tile_dpbf16<4, 1, 3>();
    }
    if (s < S) {
        load_a<0>(a0, s, S);
        tile_load<2>(b0 + (size_t)s * bt, cb);
        tile_dpbf16<4, 0, 2>();
    }
    tile_store<4>(c, cb);
}

// Per-thread buffers: the activation panel (kept across calls naming the same activations), a
// padded copy of a short group's rows, the padded last slices of a row block's groups, the C tiles.
struct Buffers {
    std::vector<uint16_t> panel;
    std::vector<uint8_t> group;  // a short group's rows, packed (pack_a)
    ActKey key;
    std::vector<uint8_t> last;  // the windows: 16 x 64 bytes; the GEMM: a row block's packed chunk
    std::vector<float> c;       // the GEMM's C tiles of a row block (4 KB per 32 rows x 32 tokens)
    ASrc src[2];                // the A sources of the step in hand
};
Buffers &buffers() {
    static thread_local Buffers b;
    return b;
}
alignas(64) const uint8_t kZeros[16 * kTileBytes] = {};

// The rows [gr, gr + 16) of [.., r1), slices [s0, s1), as A tiles one after another (16 x 64 bytes
// each, at dst + (s - s0) * 1 KB), rows past r1 and values past n zeros: 16 rows a multiple of 4 KB
// apart (n = 2048, 4096) fall in one L1 set, so tile loads in place thrash it (a 256-token chunk of
// 4096-wide rows: 215 GMAC/s on one thread in place); each row is read as one stream.
__attribute__((noinline)) void pack_a(const RowArgs &a, int64_t gr, int64_t r1, int64_t s0, int64_t s1, uint8_t *dst) {
    const int64_t row_bytes = a.n * 2;
    for (int q = 0; q < 16; ++q) {
        const uint8_t *w = a.w + (size_t)(gr + q) * a.w_stride;
        for (int64_t s = s0; s < s1; ++s) {
            uint8_t *d = dst + (size_t)(s - s0) * 16 * kTileBytes + q * kTileBytes;
            const int64_t from = s * kTileBytes, len = gr + q >= r1 ? 0 : row_bytes - from < kTileBytes ? row_bytes - from : kTileBytes;
            if (len == kTileBytes) std::memcpy(d, w + from, kTileBytes);
            else {
                std::memset(d, 0, kTileBytes);
                if (len > 0) std::memcpy(d, w + from, (size_t)len);
            }
        }
    }
}

// Where the A tiles of the 16 rows from gr (of [.., r1)) come from: the rows in place, their last slice
// packed (zero-padded) into `last` (16 x 64 bytes) when n is no multiple of 32; a short group (the
// call's last) packed whole into B.group; no rows (gr >= r1): zeros.
// (The helpers around the tile loops are out of line, and the A sources live in the thread's buffers:
// struct copies and epilogue loops on the stack would be vector moves in the row kernel, I7.)
__attribute__((noinline)) void group_src(const RowArgs &a, int64_t gr, int64_t r1, int64_t S, uint8_t *last, Buffers &B,
                                          ASrc *out) {
    const int64_t rows = gr >= r1 ? 0 : r1 - gr < 16 ? r1 - gr : 16;
    if (rows == 0) return void(*out = ASrc{kZeros, kTileBytes, 0, nullptr});
    if (rows < 16) {
        B.group.resize((size_t)S * 16 * kTileBytes);
        pack_a(a, gr, r1, 0, S, B.group.data());
        return void(*out = ASrc{B.group.data(), kTileBytes, 16 * kTileBytes, nullptr});
    }
    const uint8_t *w = a.w + (size_t)gr * a.w_stride;
    if (a.n % kSliceBf16 == 0) return void(*out = ASrc{w, a.w_stride, kTileBytes, nullptr});
    pack_a(a, gr, r1, S - 1, S, last);
    *out = ASrc{w, a.w_stride, kTileBytes, last};
}

// out[t0 + t][gr + q] = c[q * W + t] for the rows and tokens the call has
__attribute__((noinline)) void scatter(const RowArgs &a, const float *c, int W, int64_t gr, int64_t r1, int64_t t0, int nt) {
    const int64_t rows = gr >= r1 ? 0 : r1 - gr < 16 ? r1 - gr : 16, toks = nt - t0 < W ? nt - t0 : W;
    for (int64_t t = 0; t < toks; ++t) {
        float *o = a.out + (size_t)(t0 + t) * a.out_stride + (size_t)gr;
        for (int64_t q = 0; q < rows; ++q) o[q] = c[q * W + t];
    }
}

// Windows: each 16-row group against the window's one block of W = nt tokens.
void windows(const RowArgs &a, int64_t r0, int64_t r1, int nt, int64_t S, Buffers &B) {
    B.last.resize(16 * kTileBytes);
    B.c.resize(16 * MAX_NT);  // (the C tile's floats off the stack: no vector moves to it, I7)
    float *const c = B.c.data();
    for (int64_t g = r0; g < r1; g += 16) {
        group_src(a, g, r1, S, B.last.data(), B, &B.src[0]);
        mk1(B.src[0], B.panel.data(), S, nt, c);
        scatter(a, c, nt, g, r1, 0, nt);
    }
}

// The GEMM (blocks of 16 tokens), blocked for the caches: per block of kGemmRows rows and chunk of
// kGemmSlices slices, the block's rows' chunk is packed as A tiles (pack_a; 128 KB, in L2 while every
// pair of token blocks reads it; a pair of blocks' chunk of the panel, 16 KB, in L1 while every pair
// of groups reads it), and each (pair of groups, pair of token blocks) carries its C tiles in B.c from
// chunk to chunk. The panel streams from memory once per row block (a pass over all rows per pair
// of token blocks read it once per 32 rows: a 256-token chunk of 4096-wide rows, one thread, 160
// GMAC/s so).
constexpr int64_t kGemmRows = 256, kGemmSlices = 8;
void gemm(const RowArgs &a, int64_t r0, int64_t r1, int nt, int64_t S, Buffers &B) {
    const int64_t blocks = (nt + 15) / 16, tpairs = (blocks + 1) / 2;
    const size_t gchunk = (size_t)kGemmSlices * 16 * kTileBytes;
    for (int64_t rb = r0; rb < r1; rb += kGemmRows) {
        const int64_t re = rb + kGemmRows < r1 ? rb + kGemmRows : r1, gpairs = (re - rb + 31) / 32;
        B.last.resize((size_t)(2 * gpairs) * gchunk);
        B.c.resize((size_t)(gpairs * tpairs) * 1024);
        for (int64_t s0 = 0; s0 < S; s0 += kGemmSlices) {
            const int64_t s1 = s0 + kGemmSlices < S ? s0 + kGemmSlices : S;
            for (int64_t g = 0; g < 2 * gpairs; ++g) pack_a(a, rb + 16 * g, r1, s0, s1, B.last.data() + (size_t)g * gchunk);
            for (int64_t tp = 0; tp < tpairs; ++tp) {
                const uint16_t *p0 = B.panel.data() + (size_t)(2 * tp) * 512;
                const bool two = 2 * tp + 1 < blocks;
                for (int64_t gp = 0; gp < gpairs; ++gp) {
                    float *c = B.c.data() + (size_t)(gp * tpairs + tp) * 1024;
                    // (slice s of the packed chunk at p + s * 1 KB: p is set back by s0 slices)
                    const uint8_t *g0 = B.last.data() + (size_t)(2 * gp) * gchunk - (size_t)s0 * 16 * kTileBytes;
                    ASrc &x0 = B.src[0], &x1 = B.src[1];
                    x0 = ASrc{g0, kTileBytes, 16 * kTileBytes, nullptr}, x1 = ASrc{g0 + gchunk, kTileBytes, 16 * kTileBytes, nullptr};
                    if (two) mk<true>(x0, x1, p0, p0 + 512, blocks, s0, s1, S, s0 > 0, c);
                    else mk<false>(x0, x1, p0, nullptr, blocks, s0, s1, S, s0 > 0, c);
                }
            }
        }
        for (int64_t gp = 0; gp < gpairs; ++gp)
            for (int64_t tp = 0; tp < tpairs; ++tp)
                for (int h = 0; h < 2; ++h)
                    for (int j = 0; j < 2 && 2 * tp + j < blocks; ++j)
                        scatter(a, B.c.data() + (size_t)(gp * tpairs + tp) * 1024 + (2 * h + j) * 256, 16,
                                rb + 32 * gp + 16 * h, r1, 16 * (2 * tp + j), nt);
    }
}

void rows_bf16_tiles(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    if (r0 >= r1 || nt <= 0) return;
    Buffers &B = buffers();
    const int W = block_width(nt);
    const int64_t S = (a.n + kSliceBf16 - 1) / kSliceBf16, blocks = (nt + W - 1) / W;
    if (!act_holds(B.key, a, nt)) {
        B.panel.resize((size_t)(blocks * S * 32 * W));
        build_panel(a, nt, W, S, B.panel.data());
    }
    configure(W);
    if (nt <= MAX_NT) windows(a, r0, r1, nt, S, B);
    else gemm(a, r0, r1, nt, S, B);
    tile_release();
}

}  // namespace

// The amx level's BF16 entry: windows of 1..8 tokens and the GEMM (chunks of more) are this one
// function under one name (one arithmetic: LOWBIT_NO_ROWS_BF16_BF16_AMX=1 turns both off, leaving
// the level below's float32 windows; LOWBIT_NO_GEMM=1 only the GEMM, the windows then take chunks).
void register_bf16(KernelTable &t) {
    KernelEntry &e = t.at(T_BF16);
    static const char *const name = "rows_bf16_bf16_amx";
    set_rows_each_nt(e, name, ISA_AMX, [](auto) { return &rows_bf16_tiles; });
    e.gemm = RowKernel{&rows_bf16_tiles, name, ISA_AMX};
    e.gemm_min_nt = MAX_NT + 1, e.gemm_lanes = 0, e.gemm_tail = 0, e.gemm_rows = 16;
}

}  // namespace LOWBIT_NS
}  // namespace lowbit
