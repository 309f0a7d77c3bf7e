// bench peak's tile loops at the amx level (csrc/bench.cpp): int8 (TDPBUSD) and, where the CPU has
// AMX-BF16, bf16 (TDPBF16PS). (Its float peak is avx512's loop: bench.cpp.)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../amx_tiles.h"

namespace lowbit {
namespace amx {

// Per round 4 tile products (int8: TDPBUSD of 16 x 16 x 64, 16384 multiply-adds; bf16: TDPBF16PS of
// 16 x 16 x 32, 8192) into 4 independent accumulator tiles (tmm4..7) from two A tiles (tmm0, 1) and
// two B tiles (tmm2, 3): the ceiling of the amx GEMMs' and BF16 tile rows' products.
template <bool BF16>
uint64_t peak_tiles(int64_t iters, uint64_t *sink) {
    static const TileConfig cfg = [] {
        TileConfig c;
        for (int t = 0; t < 8; ++t) c.set(t, 16, 64);
        return c;
    }();
    alignas(64) uint8_t in[16 * 64];
    alignas(64) uint32_t out[16 * 16];
    for (int i = 0; i < 16 * 64; ++i) in[i] = BF16 ? (uint8_t)(i % 2 ? 0x3f : 0x80 + i % 7) : (uint8_t)(i * 7 + 1);
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
        if constexpr (BF16) {  // (bf16 values near 1: 0x3f8x)
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(5, 0, 3);
            _tile_dpbf16ps(6, 1, 2);
            _tile_dpbf16ps(7, 1, 3);
        } else {
            _tile_dpbusd(4, 0, 2);
            _tile_dpbusd(5, 0, 3);
            _tile_dpbusd(6, 1, 2);
            _tile_dpbusd(7, 1, 3);
        }
    }
    uint64_t s = 0;
    _tile_stored(4, out, 64);
    for (uint32_t v : out) s += v;
    _tile_stored(7, out, 64);
    for (uint32_t v : out) s += v;
    tile_release();
    *sink = s;
    return (uint64_t)iters * 4 * 16 * 16 * (BF16 ? 32 : 64);
}

uint64_t peak_int8(int64_t iters, uint64_t *sink) { return peak_tiles<false>(iters, sink); }
uint64_t peak_bf16(int64_t iters, uint64_t *sink) { return peak_tiles<true>(iters, sink); }

}  // namespace amx
}  // namespace lowbit
