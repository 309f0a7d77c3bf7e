// Software prefetch of the weight stream, for the SIMD row kernels of every level.
//
// A row kernel reads its weights once, front to back, row after row: a stream the hardware
// prefetchers follow only up to each 4 KB page boundary, where the stream restarts cold. Each
// kernel therefore asks, per block (or group of blocks) it decodes, for the cache lines
// kPrefetchAhead bytes further on. Measured on the Sapphire Rapids of BENCHMARKS.md ("Weight
// prefetch"): 1 GB of Q4_1 rows over 2 threads went from 15.7 to 25.9 GB/s, Q8_0 from 18.4
// to 26.3 GB/s; rows resident in L3 (16 MB, one thread) gained 10-20% at nt = 1 and nothing
// was lost at nt = 8. A prefetch never faults, so reading past the matrix's end is harmless.
// Build with -DLOWBIT_PREFETCH_AHEAD=0 (CMake option of the same name) to turn it off.
#pragma once
#include <immintrin.h>

#include <cstddef>

#ifndef LOWBIT_PREFETCH_AHEAD
#define LOWBIT_PREFETCH_AHEAD 4096
#endif

namespace lowbit {

constexpr size_t kPrefetchAhead = LOWBIT_PREFETCH_AHEAD;  // bytes

// Lines of [p + kPrefetchAhead, p + kPrefetchAhead + bytes) towards L1 (bytes: the span
// about to be decoded; consecutive calls cover the stream).
inline __attribute__((always_inline)) void prefetch_ahead(const void *p, size_t bytes) {
    if constexpr (kPrefetchAhead > 0)
        for (size_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)p + kPrefetchAhead + l, _MM_HINT_T0);
}

}  // namespace lowbit
