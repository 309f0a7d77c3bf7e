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
// Every tile has the same shape whatever nt and the rows (A: 16 weight rows x 32 bf16; B: 16 k-pairs x
// 16 tokens, "VNNI" pairs; C: 16 rows x 16 tokens); a row or token the call lacks is a zero row of A
// or column of B. So a (row, token) result is one fixed sequence of tile products on its own row of
// A and column of B: the same in a window of 1 token or 8, in the GEMM of a 512-token chunk, and in
// any row split (I2, I3, I8), given that an element of TDPBF16PS's result depends on nothing but its
// row of A, its column of B and its C (what tests/test_amx_bf16.py checks on the hardware).
// These are not the avx512 level's BF16 results, which keep x in float32 (floatrows.inl): the levels
// differ by x's rounding, <= 2^-9 of each |w x| (tests/test_amx_bf16.py holds both to float64).
//
// Speed: the activations are laid out once per thread and call (act_id; a panel of nt x n bf16),
// the weight rows are read in place (a tile load of 16 rows at w_stride); a step of the loop over
// slices loads two A tiles (32 rows) and one or two B tiles (16 or 32 tokens) and issues 2 or 4
// products into 2 or 4 C tiles.
#include <cstdint>
#include <cstring>
#include <vector>

#include "../kernels.h"
#include "amx_tiles.h"

namespace lowbit {
namespace LOWBIT_NS {
namespace {

constexpr int kSliceBf16 = 32;  // values of K per tile product
constexpr int kTileBytes = 64;  // bytes of an A tile row (32 bf16)

// float -> bfloat16, to nearest even; a NaN stays a (quiet) NaN (ggml_compute_fp32_to_bf16).
inline uint16_t to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Tokens per B tile (its columns): the window's nt for windows (a token's B column costs 4 bytes a
// slice, so one token's tiles stay in L1: 16 columns of which 15 were zeros made a window of one
// token read 15-18 GB/s on one thread against the float windows' 25), 16 for the GEMM.
inline int block_width(int nt) { return nt <= MAX_NT ? nt : 16; }

// The activation panel: per block b of W tokens and slice s, one B tile of 16 rows (k-pairs) x W
// tokens x 2 bf16 at panel + (b * S + s) * 32 W: row kp, token j holds x[W b + j][32 s + 2 kp + i]
// at 2 W kp + 2 j + i. Tokens and values past nt and n are zeros.
void build_panel(const RowArgs &a, int nt, int W, int64_t S, uint16_t *panel) {
    const int64_t blocks = (nt + W - 1) / W, tile = 32 * (int64_t)W;
    std::memset(panel, 0, (size_t)(blocks * S * tile) * 2);
    for (int t = 0; t < nt; ++t) {
        const float *x = (const float *)(a.act + (size_t)t * a.act_stride);
        uint16_t *col = panel + (size_t)(t / W) * (size_t)(S * tile) + 2 * (t % W);
        for (int64_t k = 0; k < a.n; k += 2) {
            const int64_t s = k / kSliceBf16, kp = (k % kSliceBf16) / 2;
            uint16_t *d = col + (size_t)(s * tile + 2 * W * kp);
            d[0] = to_bf16(x[k]);
            d[1] = k + 1 < a.n ? to_bf16(x[k + 1]) : 0;
        }
    }
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

// The GEMM's step: two 16-row groups (a0, a1) x one or two blocks of W tokens (b0, b1 when TWO) over
// all S slices; C tiles to c: group i, block j at c + (2 i + j) * 16 W (16 rows x W, row-major).
template <bool TWO>
void mk(const ASrc &a0, const ASrc &a1, const uint16_t *b0, const uint16_t *b1, int64_t S, int W, float *c) {
    const size_t bt = 32 * (size_t)W, cb = 4 * (size_t)W;
    tile_zero<4>(), tile_zero<6>();
    if constexpr (TWO) tile_zero<5>(), tile_zero<7>();
    for (int64_t s = 0; s < S; ++s) {
        load_a<0>(a0, s, S);
        load_a<1>(a1, s, S);
        tile_load<2>(b0 + (size_t)s * bt, cb);
        if constexpr (TWO) tile_load<3>(b1 + (size_t)s * bt, cb);
        tile_dpbf16<4, 0, 2>();
        tile_dpbf16<6, 1, 2>();
        if constexpr (TWO) tile_dpbf16<5, 0, 3>(), tile_dpbf16<7, 1, 3>();
    }
    tile_store<4>(c, cb);
    tile_store<6>(c + 2 * 16 * W, cb);
    if constexpr (TWO) tile_store<5>(c + 16 * W, cb), tile_store<7>(c + 3 * 16 * W, cb);
}

// A window's step: one 16-row group x one block of W tokens; C (tmm4) to c. The slices' A tiles
// alternate between tmm0 and tmm1, so a slice's load need not wait for the previous product to
// have read its tile (one group at a time: 16 rows streamed, not 32; one token read 17.9 GB/s on
// one thread against mk's 13-15). The products into C are in slice order, as mk's.
void mk1(const ASrc &a0, const uint16_t *b0, int64_t S, int W, float *c) {
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
// padded copy of a short group's rows, the padded last slices of two groups, the C tiles.
struct Buffers {
    std::vector<uint16_t> panel, group;
    ActKey key;
    alignas(64) uint8_t last[2][16 * kTileBytes];
    alignas(64) float c[4 * 256];
};
Buffers &buffers() {
    static thread_local Buffers b;
    return b;
}
alignas(64) const uint8_t kZeros[16 * kTileBytes] = {};

void rows_bf16_tiles(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    if (r0 >= r1 || nt <= 0) return;
    Buffers &B = buffers();
    const int W = block_width(nt);
    const int64_t n = a.n, S = (n + kSliceBf16 - 1) / kSliceBf16, blocks = (nt + W - 1) / W;
    const size_t bstride = (size_t)(S * 32 * W);  // panel values per block of W tokens
    if (!act_holds(B.key, a, nt)) {
        B.panel.resize((size_t)blocks * bstride);
        build_panel(a, nt, W, S, B.panel.data());
    }
    const size_t row_bytes = (size_t)n * 2, full = (size_t)(n / kSliceBf16) * kTileBytes;
    configure(W);
    for (int64_t g = r0; g < r1; g += 32) {
        ASrc src[2];
        for (int h = 0; h < 2; ++h) {
            const int64_t gr = g + 16 * h, rows = gr >= r1 ? 0 : r1 - gr < 16 ? r1 - gr : 16;
            const uint8_t *w = a.w + (size_t)gr * a.w_stride;
            if (rows == 16) {
                src[h] = ASrc{w, a.w_stride, kTileBytes, nullptr};
                if (full < row_bytes) {  // the last slice, zero-padded
                    std::memset(B.last[h], 0, sizeof B.last[h]);
                    for (int q = 0; q < 16; ++q)
                        std::memcpy(B.last[h] + q * kTileBytes, w + (size_t)q * a.w_stride + full, row_bytes - full);
                    src[h].last = B.last[h];
                }
            } else if (rows > 0) {  // a short group (the call's last): its rows padded, zero rows after
                const size_t gs = (size_t)S * kTileBytes;
                B.group.assign(16 * gs / 2, 0);
                uint8_t *d = (uint8_t *)B.group.data();
                for (int64_t q = 0; q < rows; ++q) std::memcpy(d + q * gs, w + (size_t)q * a.w_stride, row_bytes);
                src[h] = ASrc{d, gs, kTileBytes, nullptr};
            } else {
                src[h] = ASrc{kZeros, kTileBytes, 0, nullptr};
            }
        }
        for (int64_t b = 0; b < blocks; b += 2) {
            const uint16_t *p0 = B.panel.data() + (size_t)b * bstride;
            const bool two = b + 1 < blocks;
            if (two) mk<true>(src[0], src[1], p0, p0 + bstride, S, W, B.c);
            else if (nt > MAX_NT) mk<false>(src[0], src[1], p0, nullptr, S, W, B.c);
            else {
                mk1(src[0], p0, S, W, B.c);
                if (src[1].step) mk1(src[1], p0, S, W, B.c + 2 * 16 * W);
            }
            for (int h = 0; h < 2; ++h)
                for (int j = 0; j < (two ? 2 : 1); ++j) {
                    const float *c = B.c + (2 * h + j) * 16 * W;
                    const int64_t gr = g + 16 * h, t0 = W * (b + j);
                    const int64_t rows = gr >= r1 ? 0 : r1 - gr < 16 ? r1 - gr : 16;
                    const int64_t toks = nt - t0 < W ? nt - t0 : W;
                    for (int64_t t = 0; t < toks; ++t) {
                        float *o = a.out + (size_t)(t0 + t) * a.out_stride + (size_t)gr;
                        for (int64_t q = 0; q < rows; ++q) o[q] = c[q * W + t];
                    }
                }
        }
    }
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
