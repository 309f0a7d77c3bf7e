// Horizontal sums of the avx2 level's float kernels (included by its .cpp files only: built with
// the level's flags).
#pragma once
#include <immintrin.h>

namespace lowbit {
namespace avx2 {

// The 8 lanes of a in the fixed tree ((x0+x4)+(x2+x6)) + ((x1+x5)+(x3+x7)), the scalar
// references' order (csrc/ref/deltanet.cpp, csrc/ref/ssm_scan.cpp).
inline float reduce8(__m256 a) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // x0+x4 .. x3+x7
    const __m128 p = _mm_add_ps(h, _mm_movehl_ps(h, h));                                 // (x0+x4)+(x2+x6), (x1+x5)+(x3+x7)
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

}  // namespace avx2
}  // namespace lowbit
