// The Mamba-2 state update on AVX2 (contract: scan_fn in kernels.h; spec csrc/ref/ssm_scan.cpp).
// Registered at the avx2 level; avx2vnni and avx512 inherit it (the head's state, P x N floats,
// streams through once per token: bound by the cache, not by the vector width).
//
// Lane l of the 8-wide accumulator sums the elements j = 8m + l in order, products rounded
// before the add (mul, then add: no FMA), reduced in the reference's tree: bitwise the
// reference. Four rows at a time, each with its own accumulator, so the add chains overlap.
// N not a multiple of 8: the reference.
#include <immintrin.h>

#include "../../kernels.h"
#include "../../ref/ref.h"
#include "reduce.h"

namespace lowbit {
namespace avx2 {
namespace {

// rows i0 .. i0 + R - 1
template <int R>
inline void scan_rows(float *s, const float *B, const float *C, const float *x, float dt, __m256 da, float *y,
                      int i0, int N) {
    __m256 acc[R], xdt[R];
    for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_setzero_ps();
        xdt[r] = _mm256_set1_ps(x[i0 + r] * dt);
    }
    for (int j = 0; j < N; j += 8) {
        const __m256 b = _mm256_loadu_ps(B + j), c = _mm256_loadu_ps(C + j);
        for (int r = 0; r < R; ++r) {
            float *row = s + (size_t)(i0 + r) * N + j;
            const __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(row), da), _mm256_mul_ps(b, xdt[r]));
            _mm256_storeu_ps(row, v);
            acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(v, c));
        }
    }
    for (int r = 0; r < R; ++r) y[i0 + r] = reduce8(acc[r]);
}

void scan_avx2(float *s, const float *B, const float *C, const float *x, float dt, float dA, float *y, int P, int N) {
    if (N % 8) {
        ref::ssm_scan(s, B, C, x, dt, dA, y, P, N);
        return;
    }
    const __m256 da = _mm256_set1_ps(dA);
    int i = 0;
    for (; i + 4 <= P; i += 4) scan_rows<4>(s, B, C, x, dt, da, y, i, N);
    for (; i < P; ++i) scan_rows<1>(s, B, C, x, dt, da, y, i, N);
}

}  // namespace

void register_scan(KernelTable &t) { t.scan = ScanKernel{scan_avx2, "scan_avx2", ISA_AVX2}; }

}  // namespace avx2
}  // namespace lowbit
