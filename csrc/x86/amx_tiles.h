// The AMX tile operations the amx level's GEMM uses (csrc/x86/gemm.inl, LOWBIT_AMX), behind one
// small API with two implementations:
//   - the hardware's (csrc/x86/amx/*.cpp, built with -mamx-tile -mamx-int8 -mamx-bf16): the intrinsics;
//   - an emulator (LOWBIT_AMX_EMULATE: csrc/x86/avx2/gemm_amx.cpp, built at the avx2 level), so the
//     amx level's microkernel, tile shapes and strides are tested on every x86 CPU
//     (LOWBIT_AMX=emulate, tests/test_amx.py). It follows the Intel SDM's definitions and checks
//     what the hardware faults on (#UD): an operation on a tile the configuration leaves empty, a
//     TDPB*D whose shapes disagree (C rows == A rows, C colsb == B colsb, B rows * 4 == A colsb),
//     K > 16 dwords, a palette other than 1. A violation throws std::logic_error naming it.
//
// Tiles (palette 1): 8 registers tmm0..7 of up to 16 rows x 64 bytes, shaped by a 64-byte
// configuration (TileConfig). TDPBUSD c, a, b (UW: a unsigned, b signed) and TDPBSUD (a signed, b
// unsigned): for m < rows(c), n < colsb(c) / 4, k < colsb(a) / 4
//   c[m][n] (int32) += sum_{i < 4} a[m][4k + i] * b[k][4n + i]
// exactly, modulo 2^32 (no saturation): b is in "VNNI" layout, row k holding, for every column n,
// the 4 bytes of k-group k. So a tokens-in-lanes panel row (csrc/x86/gemm.inl ActSBT::q[dw]: dword
// lane l = token l's 4 bytes of dword dw) is a B row as it stands.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#if defined(LOWBIT_AMX_EMULATE)
#include <stdexcept>
#include <string>
#else
#include <immintrin.h>
#endif

namespace lowbit {

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};  // bytes per row of tile i (0: unused)
    uint8_t rows[16] = {};
    void set(int t, int r, int cb) { rows[t] = (uint8_t)r, colsb[t] = (uint16_t)cb; }
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG's 64-byte operand");

// The two implementations live in different (inline) namespaces: the same names with different
// bodies in the hardware's and the emulator's translation units would otherwise be one symbol to
// the linker (an ODR clash: whichever copy it kept, every caller would get).
#if defined(LOWBIT_AMX_EMULATE)
inline namespace amx_tiles_emulated {
namespace amx_emulator {
struct Tiles {
    TileConfig cfg;
    bool configured = false;
    alignas(64) uint8_t t[8][16][64];
};
inline Tiles &tiles() {
    static thread_local Tiles s;
    return s;
}
[[noreturn]] inline void fault(const std::string &what) { throw std::logic_error("AMX emulator: " + what); }
inline void need(int t) {
    const Tiles &s = tiles();
    if (!s.configured) fault("tile operation with no tile configuration loaded");
    if (t < 0 || t > 7 || !s.cfg.rows[t] || !s.cfg.colsb[t]) fault("tmm" + std::to_string(t) + " is not configured");
}
// A tile product's shapes as the hardware checks them (#UD otherwise): C rows == A rows, C colsb ==
// B colsb, B rows * 4 == A colsb, colsb multiples of 4. M x N dwords of C, K dwords along A's rows.
inline void check_product(int C, int A, int B, const char *op, int *M, int *N, int *K) {
    need(C), need(A), need(B);
    const TileConfig &g = tiles().cfg;
    const std::string o = op;
    *M = g.rows[C], *N = g.colsb[C] / 4, *K = g.colsb[A] / 4;
    if (g.colsb[C] % 4 || g.colsb[A] % 4) fault(o + ": colsb not a multiple of 4");
    if (g.rows[A] != *M) fault(o + ": A has " + std::to_string(g.rows[A]) + " rows, C " + std::to_string(*M));
    if (g.colsb[B] != g.colsb[C]) fault(o + ": B's colsb differs from C's");
    if (g.rows[B] != *K) fault(o + ": B has " + std::to_string(g.rows[B]) + " rows, A's colsb / 4 is " + std::to_string(*K));
}
}  // namespace amx_emulator

inline void tile_loadconfig(const TileConfig &c) {
    if (c.palette != 1) amx_emulator::fault("palette " + std::to_string(c.palette) + " (only 1 exists)");
    for (int t = 0; t < 8; ++t)
        if (c.rows[t] > 16 || c.colsb[t] > 64 || (c.rows[t] == 0) != (c.colsb[t] == 0))
            amx_emulator::fault("tmm" + std::to_string(t) + ": " + std::to_string(c.rows[t]) + " rows x " +
                                std::to_string(c.colsb[t]) + " bytes");
    for (int t = 8; t < 16; ++t)
        if (c.rows[t] || c.colsb[t]) amx_emulator::fault("palette 1 has 8 tiles");
    amx_emulator::Tiles &s = amx_emulator::tiles();
    s.cfg = c, s.configured = true;
    std::memset(s.t, 0, sizeof s.t);  // LDTILECFG zeroes the tiles
}
inline void tile_release() { amx_emulator::tiles().configured = false; }
template <int T>
inline void tile_load(const void *p, size_t stride) {
    amx_emulator::need(T);
    amx_emulator::Tiles &s = amx_emulator::tiles();
    for (int r = 0; r < s.cfg.rows[T]; ++r) std::memcpy(s.t[T][r], (const uint8_t *)p + (size_t)r * stride, s.cfg.colsb[T]);
}
template <int T>
inline void tile_store(void *p, size_t stride) {
    amx_emulator::need(T);
    const amx_emulator::Tiles &s = amx_emulator::tiles();
    for (int r = 0; r < s.cfg.rows[T]; ++r) std::memcpy((uint8_t *)p + (size_t)r * stride, s.t[T][r], s.cfg.colsb[T]);
}
template <int T>
inline void tile_zero() {
    amx_emulator::need(T);
    std::memset(amx_emulator::tiles().t[T], 0, sizeof amx_emulator::tiles().t[T]);
}
// C += A . B: UW, A unsigned and B signed (TDPBUSD); else A signed and B unsigned (TDPBSUD)
template <int C, int A, int B, bool UW>
inline void tile_dp() {
    static_assert(C != A && C != B && A != B, "TDPB*D takes three distinct tiles");
    amx_emulator::Tiles &s = amx_emulator::tiles();
    int M, N, K;
    amx_emulator::check_product(C, A, B, "TDPB*D", &M, &N, &K);
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            uint32_t acc;
            std::memcpy(&acc, s.t[C][m] + 4 * n, 4);
            for (int k = 0; k < K; ++k)
                for (int i = 0; i < 4; ++i) {
                    const uint8_t a = s.t[A][m][4 * k + i], b = s.t[B][k][4 * n + i];
                    const int32_t p = UW ? (int32_t)a * (int32_t)(int8_t)b : (int32_t)(int8_t)a * (int32_t)b;
                    acc += (uint32_t)p;  // modulo 2^32, as the hardware
                }
            std::memcpy(s.t[C][m] + 4 * n, &acc, 4);
        }
}
// C += A . B in bfloat16 (TDPBF16PS): for m < rows(c), n < colsb(c) / 4, k < colsb(a) / 4
//   c[m][n] (float) += a[m][2k] * b[k][2n] + a[m][2k + 1] * b[k][2n + 1]
// with b in "VNNI" layout (row k: for every column n, the bf16 pair of k-pair k). The SDM defines
// the sum but not the hardware's intermediate rounding; this model adds the two products of each
// pair in turn, each sum rounded to float (round to nearest even), with bf16 inputs and float
// results that are subnormal flushed to zero (the SDM's DAZ / FTZ). It is NOT bitwise the
// hardware: on random tiles 29% of a Sapphire Rapids' results differ from it in the last bits (as
// from every other order tried). Tests hold the emulated level to bounds and to its own
// invariances (csrc/x86/bf16_tiles.inl's contract), the hardware to its own.
inline float bf16_daz(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float f32_ftz(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    std::memcpy(&f, &u, 4);
    return f;
}
// (out of line: its loops are the emulator's, not the caller's row kernel's, whose vectors stay in
// registers, I7)
template <int C, int A, int B>
__attribute__((noinline)) void tile_dpbf16() {
    static_assert(C != A && C != B && A != B, "TDPBF16PS takes three distinct tiles");
    amx_emulator::Tiles &s = amx_emulator::tiles();
    int M, N, K;
    amx_emulator::check_product(C, A, B, "TDPBF16PS", &M, &N, &K);
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float acc;
            std::memcpy(&acc, s.t[C][m] + 4 * n, 4);
            for (int k = 0; k < K; ++k)
                for (int i = 0; i < 2; ++i) {
                    uint16_t a, b;
                    std::memcpy(&a, s.t[A][m] + 4 * k + 2 * i, 2);
                    std::memcpy(&b, s.t[B][k] + 4 * n + 2 * i, 2);
                    acc = f32_ftz(acc + bf16_daz(a) * bf16_daz(b));  // (the product is exact in float)
                }
            std::memcpy(s.t[C][m] + 4 * n, &acc, 4);
        }
}
}  // namespace amx_tiles_emulated
#else
inline namespace amx_tiles_hw {
// (GCC's tile intrinsics paste their tile number into the instruction's text: literal numbers only,
// hence the chains of if constexpr)
#define LB_TILE_EACH(T, OP) \
    if constexpr (T == 0) OP(0); else if constexpr (T == 1) OP(1); else if constexpr (T == 2) OP(2); \
    else if constexpr (T == 3) OP(3); else if constexpr (T == 4) OP(4); else if constexpr (T == 5) OP(5); \
    else if constexpr (T == 6) OP(6); else OP(7)
// (GCC 12's tile loads and LDTILECFG tell the compiler they read no memory, or only 8 bytes of the
// configuration: the compiler barriers keep the stores of what they read before them.)
inline void tile_loadconfig(const TileConfig &c) {
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&c);
}
inline void tile_release() { _tile_release(); }
template <int T>
inline void tile_load(const void *p, size_t stride) {
    __asm__ volatile("" ::: "memory");
#define LB_TILE_OP(i) _tile_loadd(i, p, stride)
    LB_TILE_EACH(T, LB_TILE_OP);
#undef LB_TILE_OP
}
template <int T>
inline void tile_store(void *p, size_t stride) {
#define LB_TILE_OP(i) _tile_stored(i, p, stride)
    LB_TILE_EACH(T, LB_TILE_OP);
#undef LB_TILE_OP
}
template <int T>
inline void tile_zero() {
#define LB_TILE_OP(i) _tile_zero(i)
    LB_TILE_EACH(T, LB_TILE_OP);
#undef LB_TILE_OP
}
// the GEMM's products (csrc/x86/gemm.inl): C = tmm4 + i, A = tmm0, B = tmm1 + i (mk_amx, mk_amx_legacy,
// mk_amx_i2s); C = tmm4 + j + 2 w, A = tmm0 + j, B = tmm2 + w (mk_amx_scaled, UW)
template <int, int, int>
inline constexpr bool kNoSuchProduct = false;
template <int C, int A, int B, bool UW>
inline void tile_dp() {
#define LB_TILE_DP(c, a, b) \
    if constexpr (C == c && A == a && B == b) { \
        if constexpr (UW) _tile_dpbusd(c, a, b); \
        else _tile_dpbsud(c, a, b); \
    } else
    LB_TILE_DP(4, 0, 1) LB_TILE_DP(5, 0, 2) LB_TILE_DP(6, 0, 3)
    LB_TILE_DP(4, 0, 2) LB_TILE_DP(5, 1, 2) LB_TILE_DP(7, 1, 3)
    static_assert(kNoSuchProduct<C, A, B>, "tile_dp: the products the GEMMs issue");
#undef LB_TILE_DP
}
// the BF16 tiles' products (csrc/x86/bf16_tiles.inl): C = tmm4 + 2 i + j, A = tmm0 + i, B = tmm2 + j
template <int C, int A, int B>
inline void tile_dpbf16() {
#define LB_TILE_DP(c, a, b) \
    if constexpr (C == c && A == a && B == b) _tile_dpbf16ps(c, a, b); else
    LB_TILE_DP(4, 0, 2) LB_TILE_DP(5, 0, 3) LB_TILE_DP(6, 1, 2) LB_TILE_DP(7, 1, 3) LB_TILE_DP(4, 1, 3)
    static_assert(kNoSuchProduct<C, A, B>, "tile_dpbf16: the products the BF16 tiles issue");
#undef LB_TILE_DP
}
#undef LB_TILE_EACH
}  // namespace amx_tiles_hw
#endif

}  // namespace lowbit
