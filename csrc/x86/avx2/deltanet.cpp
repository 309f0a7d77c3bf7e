// The gated delta rule on AVX2+FMA (contract: delta_fn in kernels.h; spec csrc/ref/deltanet.cpp).
// Registered at the avx2 level; avx2vnni inherits it, avx512 has its own (one pass, the row in
// registers: csrc/x86/avx512/deltanet.cpp).
//
// Per row j: one pass scales the row by the decay and accumulates row . k, the second adds
// k * d and accumulates row . q. Each dot runs in two 8-lane FMA accumulators a0 (elements
// 16m .. 16m+7) and a1 (16m+8 .. 16m+15), reduced ((a0 + a1) lanes, then the fixed tree of
// reduce8 below). The order depends only on S, never on the token's window or thread: a token's
// state and output are bitwise the same however its prompt was chunked (I8). What differs from
// the reference, in the last bits: FMA (one rounding per multiply-add) and the lane grouping.
// S not a multiple of 16: the reference.
#include <immintrin.h>

#include "../../kernels.h"
#include "../../ref/ref.h"
#include "reduce.h"

namespace lowbit {
namespace avx2 {
namespace {

void delta_avx2(float *M, const float *k, const float *q, const float *v, float decay, float beta, float scale,
                float *o, int S) {
    if (S % 16) {
        ref::delta_rule(M, k, q, v, decay, beta, scale, o, S);
        return;
    }
    const __m256 dc = _mm256_set1_ps(decay);
    for (int j = 0; j < S; ++j) {
        float *row = M + (size_t)j * S;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            const __m256 r0 = _mm256_mul_ps(_mm256_loadu_ps(row + i), dc);
            const __m256 r1 = _mm256_mul_ps(_mm256_loadu_ps(row + i + 8), dc);
            _mm256_storeu_ps(row + i, r0);
            _mm256_storeu_ps(row + i + 8, r1);
            a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(k + i), a0);
            a1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(k + i + 8), a1);
        }
        const __m256 d = _mm256_set1_ps((v[j] - reduce8(_mm256_add_ps(a0, a1))) * beta);
        a0 = _mm256_setzero_ps();
        a1 = _mm256_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            const __m256 r0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), d, _mm256_loadu_ps(row + i));
            const __m256 r1 = _mm256_fmadd_ps(_mm256_loadu_ps(k + i + 8), d, _mm256_loadu_ps(row + i + 8));
            _mm256_storeu_ps(row + i, r0);
            _mm256_storeu_ps(row + i + 8, r1);
            a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(q + i), a0);
            a1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(q + i + 8), a1);
        }
        o[j] = reduce8(_mm256_add_ps(a0, a1)) * scale;
    }
}

}  // namespace

void register_delta(KernelTable &t) { t.delta = DeltaKernel{delta_avx2, "delta_avx2", ISA_AVX2}; }

}  // namespace avx2
}  // namespace lowbit
