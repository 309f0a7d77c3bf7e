// Matrix x window of tokens through the row kernels: the one call every caller uses
// (the kernel API's matmul, the engine, the benchmarks).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels.h"

namespace lowbit {

// out[t * out_stride + r] = dot(W[r], act[t]) for r in [r0, r1), t < nt, through entry e's
// row kernels in windows of <= 8 tokens, rows split over `threads` pool threads.
// isa: the level whose table `e` is (for the call counters).
void run_rows(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
              const uint8_t *act, size_t act_stride, int64_t nt, float *out, size_t out_stride,
              int64_t n, float w_scale, int64_t r0, int64_t r1, int threads);

}  // namespace lowbit
