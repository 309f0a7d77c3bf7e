// Software prefetch of the weight stream, for the SIMD row kernels of every level.
//
// A row kernel reads its weights once, front to back, row after row: a stream the hardware
// prefetchers follow only up to each 4 KB page boundary, where the stream restarts cold. Each
// kernel therefore asks, per block (or group of blocks) it decodes, for the cache lines ahead,
// in one of two ways (the mode, set per forward by the engine: csrc/prefetch_mode.h):
//   l1: kPrefetchAhead (4 KB) ahead, PREFETCHT0 (towards L1). Measured on the Sapphire Rapids of
//       BENCHMARKS.md ("Weight prefetch", 2026-11-30): 1 GB of Q4_1 rows over 2 threads went from
//       15.7 to 25.9 GB/s, Q8_0 from 18.4 to 26.3 GB/s; rows resident in L3 (16 MB, one thread)
//       gained 10-20% at nt = 1 and nothing was lost at nt = 8.
//   off: none (the hardware prefetchers alone). On the AMX host of BENCHMARKS.md round 25 the l1
//       way held decode from DRAM to ~9 GB/s a thread (each T0 prefetch keeps one of the core's L1
//       fill buffers for a whole DRAM latency); without it the decode of the Llama-3-8B-shaped
//       slice went from 11.5-12.3 to 14.7-16.2 tok/s, the 30B-A3B-shaped from 28-29 to 34-35,
//       while the default model (in L3) lost a quarter. (2 KB ahead with PREFETCHT1 was better
//       still, 15.5-16.9 and 38: it needs a second instruction form, which made kernels spill.)
// For a model whose weights exceed the L3 cache (its stream is from DRAM) the engine measures both
// on its first one-token forwards and keeps the faster (on the AVX-512 host of 2026-11-30 l1 took a
// stream from DRAM from 14.7 to 25.5 GB/s: hosts differ; BENCHMARKS.md round 26); l1 otherwise
// (lowbit.model's _prefetch_plan, Engine::set_prefetch); LOWBIT_PREFETCH=l1 / off / measure
// overrides that. avx512 and amx only: below, l1 always. A prefetch never faults, so reading past
// the matrix's end is harmless; it never changes a result.
// Build with -DLOWBIT_PREFETCH_AHEAD=0 (CMake option of the same name) to turn it off entirely.
// The GEMMs' tile decode keeps the l1 way (prefetch_tile_ahead: a tile is decoded once for a
// chunk of tokens; its next tile comes by NextTile).
#pragma once
#include <immintrin.h>

#include <cstddef>

#include "../prefetch_mode.h"

#ifndef LOWBIT_PREFETCH_AHEAD
#define LOWBIT_PREFETCH_AHEAD 4096
#endif

namespace lowbit {

constexpr size_t kPrefetchAhead = LOWBIT_PREFETCH_AHEAD;  // bytes (l1)

// Lines ahead of [p, p + bytes) (bytes: the span about to be decoded; consecutive calls cover the
// stream), the current mode's way. The mode only moves the distance (off: 0, the line itself,
// which the decode is about to load): a branch on it, or a second hint, made row kernels spill
// (I7) at several levels under GCC 12. At the levels below avx512 the mode is not read (l1).
inline __attribute__((always_inline)) void prefetch_ahead(const void *p, size_t bytes) {
    if constexpr (kPrefetchAhead > 0) {
#if defined(__AVX512F__)
        static constexpr size_t kAt[2] = {0, kPrefetchAhead};  // [mode]
        const char *q = (const char *)p + kAt[g_prefetch_mode];
#else
        const char *q = (const char *)p + kPrefetchAhead;
#endif
        for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(q + l, _MM_HINT_T0);
    }
}
// The same, always the l1 way (the GEMMs' tile decode)
inline __attribute__((always_inline)) void prefetch_tile_ahead(const void *p, size_t bytes) {
    if constexpr (kPrefetchAhead > 0)
        for (size_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)p + kPrefetchAhead + l, _MM_HINT_T0);
}

}  // namespace lowbit
