// The gated delta rule on AVX-512 (contract: delta_fn in kernels.h; spec csrc/ref/deltanet.cpp).
// A head row of S <= 128 floats is NV = S / 16 named zmm registers: it is loaded once, scaled
// by the decay, dotted with k, updated with k * d, dotted with q, and stored once, so the
// state (64 KB per 128-wide head: more than L1) streams from L2 once per token instead of
// twice as in the two-pass avx2 kernel. Each dot: NV FMAs into one accumulator per 16-lane
// vector, summed in vector order, then hsum16 (a fixed tree). The order depends only on S (a
// token's state never depends on its window or thread: I8). S above 128: two passes over the
// row; S not a multiple of 16: the reference.
#include <immintrin.h>

#include "../../kernels.h"
#include "../../ref/ref.h"

namespace lowbit {
namespace avx512 {
namespace {

// the 16 lanes summed in a fixed tree: halves, quarters, then the 4-lane tree
inline float hsum16(__m512 a) {
    // (maskz extracts: GCC 12 warns about the undefined upper half of the plain ones)
    const __m256 h = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, a, 0), _mm512_maskz_extractf32x8_ps(0xFF, a, 1));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

template <int NV>
void delta_rows(float *M, const float *k, const float *q, const float *v, float decay, float beta, float scale,
                float *o, int S) {
    // k and q are read from L1 at each use (as memory operands of the FMAs): held in registers
    // across the rows they spilled (2 NV more live vectors than the row's NV)
    const __m512 dc = _mm512_set1_ps(decay);
    for (int j = 0; j < S; ++j) {
        float *row = M + (size_t)j * S;
        __m512 r[NV];
        for (int n = 0; n < NV; ++n) r[n] = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * n), dc);
        __m512 a = _mm512_mul_ps(r[0], _mm512_loadu_ps(k));
        for (int n = 1; n < NV; ++n) a = _mm512_fmadd_ps(r[n], _mm512_loadu_ps(k + 16 * n), a);
        const __m512 d = _mm512_set1_ps((v[j] - hsum16(a)) * beta);
        for (int n = 0; n < NV; ++n) r[n] = _mm512_fmadd_ps(_mm512_loadu_ps(k + 16 * n), d, r[n]);
        __m512 b = _mm512_mul_ps(r[0], _mm512_loadu_ps(q));
        for (int n = 1; n < NV; ++n) b = _mm512_fmadd_ps(r[n], _mm512_loadu_ps(q + 16 * n), b);
        for (int n = 0; n < NV; ++n) _mm512_storeu_ps(row + 16 * n, r[n]);
        o[j] = hsum16(b) * scale;
    }
}

// S > 128 (a multiple of 16): the row in two passes (scale and dot k; update and dot q).
void delta_two_pass(float *M, const float *k, const float *q, const float *v, float decay, float beta, float scale,
                    float *o, int S) {
    const __m512 dc = _mm512_set1_ps(decay);
    for (int j = 0; j < S; ++j) {
        float *row = M + (size_t)j * S;
        __m512 a = _mm512_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(row + i), dc);
            _mm512_storeu_ps(row + i, r);
            a = _mm512_fmadd_ps(r, _mm512_loadu_ps(k + i), a);
        }
        const __m512 d = _mm512_set1_ps((v[j] - hsum16(a)) * beta);
        __m512 b = _mm512_setzero_ps();
        for (int i = 0; i < S; i += 16) {
            const __m512 r = _mm512_fmadd_ps(_mm512_loadu_ps(k + i), d, _mm512_loadu_ps(row + i));
            _mm512_storeu_ps(row + i, r);
            b = _mm512_fmadd_ps(r, _mm512_loadu_ps(q + i), b);
        }
        o[j] = hsum16(b) * scale;
    }
}

void delta_avx512(float *M, const float *k, const float *q, const float *v, float decay, float beta, float scale,
                  float *o, int S) {
    switch (S) {
        case 16: return delta_rows<1>(M, k, q, v, decay, beta, scale, o, S);
        case 32: return delta_rows<2>(M, k, q, v, decay, beta, scale, o, S);
        case 48: return delta_rows<3>(M, k, q, v, decay, beta, scale, o, S);
        case 64: return delta_rows<4>(M, k, q, v, decay, beta, scale, o, S);
        case 80: return delta_rows<5>(M, k, q, v, decay, beta, scale, o, S);
        case 96: return delta_rows<6>(M, k, q, v, decay, beta, scale, o, S);
        case 112: return delta_rows<7>(M, k, q, v, decay, beta, scale, o, S);
        case 128: return delta_rows<8>(M, k, q, v, decay, beta, scale, o, S);
        default:
            if (S % 16) return ref::delta_rule(M, k, q, v, decay, beta, scale, o, S);
            return delta_two_pass(M, k, q, v, decay, beta, scale, o, S);
    }
}

}  // namespace

void register_delta(KernelTable &t) { t.delta = DeltaKernel{delta_avx512, "delta_avx512", ISA_AVX512}; }

}  // namespace avx512
}  // namespace lowbit
