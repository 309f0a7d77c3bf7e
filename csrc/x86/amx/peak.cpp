// bench peak's int8 loop at the amx level (csrc/bench.cpp): per round, TDPBUSD of 16 x 16 x 64
// (16384 multiply-adds each) into 4 independent accumulator tiles (tmm4..7) from two A tiles
// (tmm0, 1) and two B tiles (tmm2, 3): the ceiling of the amx GEMM's tile products. (Its float
// peak is avx512's loop: bench.cpp.)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../amx_tiles.h"

namespace lowbit {
namespace amx {

uint64_t peak_int8(int64_t iters, uint64_t *sink) {
    static const TileConfig cfg = [] {
        TileConfig c;
        for (int t = 0; t < 8; ++t) c.set(t, 16, 64);
        return c;
    }();
    alignas(64) uint8_t in[16 * 64];
    alignas(64) int32_t out[16 * 16];
    for (int i = 0; i < 16 * 64; ++i) in[i] = (uint8_t)(i * 7 + 1);
    tile_loadconfig(cfg);
    tile_load<0>(in, 64);
    tile_load<1>(in, 64);
    tile_load<2>(in, 64);
    tile_load<3>(in, 64);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t i = 0; i < iters; ++i) {
        _tile_dpbusd(4, 0, 2);
        _tile_dpbusd(5, 0, 3);
        _tile_dpbusd(6, 1, 2);
        _tile_dpbusd(7, 1, 3);
    }
    uint64_t s = 0;
    _tile_stored(4, out, 64);
    for (int32_t v : out) s += (uint32_t)v;
    _tile_stored(7, out, 64);
    for (int32_t v : out) s += (uint32_t)v;
    tile_release();
    *sink = s;
    return (uint64_t)iters * 4 * 16 * 16 * 64;
}

// bench peak's bf16 loop (the amx level where the CPU has AMX-BF16): TDPBF16PS of 16 x 16 x 32 (8192
// multiply-adds each) into 4 independent accumulator tiles, as peak_int8's: the ceiling of the BF16
// tile rows (csrc/x86/bf16_tiles.inl).
uint64_t peak_bf16(int64_t iters, uint64_t *sink) {
    static const TileConfig cfg = [] {
        TileConfig c;
        for (int t = 0; t < 8; ++t) c.set(t, 16, 64);
        return c;
    }();
    alignas(64) uint16_t in[16 * 32];
    alignas(64) float out[16 * 16];
    for (int i = 0; i < 16 * 32; ++i) in[i] = (uint16_t)(0x3f80 + (i % 7));  // bf16 values near 1
    tile_loadconfig(cfg);
    tile_load<0>(in, 64);
    tile_load<1>(in, 64);
    tile_load<2>(in, 64);
    tile_load<3>(in, 64);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t i = 0; i < iters; ++i) {
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(5, 0, 3);
        _tile_dpbf16ps(6, 1, 2);
        _tile_dpbf16ps(7, 1, 3);
    }
    uint64_t s = 0;
    _tile_stored(4, out, 64);
    for (float v : out) s += (uint64_t)(v != 0);
    tile_release();
    *sink = s;
    return (uint64_t)iters * 4 * 16 * 16 * 32;
}

}  // namespace amx
}  // namespace lowbit
