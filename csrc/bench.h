#pragma once
#include <cstdint>

#include "kernels.h"

namespace lowbit {
double bench_rows(const KernelEntry &e, const RowArgs &a, int64_t rows, int nt, int threads, int reps);
double bench_matmul(const Format &f, const KernelEntry &e, int isa, const uint8_t *w, size_t w_stride,
                    const uint8_t *act, size_t act_stride, int64_t nt, float *out, int64_t n, float w_scale,
                    int64_t rows, int threads, int reps);
double bench_vec_dot(uintptr_t fn_addr, const uint8_t *w, size_t w_stride, const uint8_t *act,
                     size_t act_stride, float *out, int64_t rows, int64_t n, int nt, int threads, int reps);
double membw(const uint8_t *buf, size_t bytes, int threads, int reps, uint64_t *sink);
}  // namespace lowbit
