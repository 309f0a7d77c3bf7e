#pragma once
#include <cstdint>

#include "kernels.h"

namespace lowbit {
// The clock every bench_* function times with: false (default) wall time; true the calling
// thread's CPU time (CLOCK_THREAD_CPUTIME_ID), for one-thread runs on a machine shared with
// other jobs: time the thread spent preempted is not counted (its caches may still be cold).
void set_bench_thread_clock(bool on);
double bench_rows(const KernelEntry &e, const RowArgs &a, int64_t rows, int nt, int threads, int reps);
double bench_matmul(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
                    const uint8_t *act, size_t act_stride, int64_t nt, float *out, int64_t n, float w_scale,
                    int64_t rows, int threads, int reps);
double bench_vec_dot(uintptr_t fn_addr, const uint8_t *w, size_t w_stride, const uint8_t *act,
                     size_t act_stride, float *out, int64_t rows, int64_t n, int nt, int threads, int reps);
// One thread: quantize rows x n float32 activations (row stride n floats, output row stride
// row_bytes) with lowbit's quantizer / with ggml's from_float (a function pointer from libggml-cpu).
double bench_quant_act(quant_act_fn fn, const float *x, uint8_t *dst, int64_t rows, int64_t n, size_t row_bytes,
                       int reps);
double bench_from_float(uintptr_t fn_addr, const float *x, uint8_t *dst, int64_t rows, int64_t n, size_t row_bytes,
                        int reps);
// prefetch: each line also prefetches the one kPrefetchAhead bytes on, as the kernels do
double membw(const uint8_t *buf, size_t bytes, int threads, int reps, bool prefetch, uint64_t *sink);
// bench peak: `iters` rounds of 12 independent multiply-add chains on each of `threads`
// threads at level isa (csrc/x86/peak.inl); kind 0 int8 (u8 x s8 into int32), 1 f32, 2 int8 into
// int16 sums (avx2 only: vpmaddubsw + vpaddw, its GEMMs' inner loop for narrow codes). Returns
// the wall seconds (median of reps); *macs the multiply-adds of one run. Throws for a level
// without the loops (scalar, avx, aarch64).
double bench_peak(int isa, int kind, int64_t iters, int threads, int reps, uint64_t *macs);
}  // namespace lowbit
