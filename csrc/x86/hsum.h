// The exact horizontal sum of a ymm's 8 int32 lanes, shared by the integer kernels of every x86
// level from avx2 up (csrc/x86/*.inl). Internal linkage (an anonymous namespace): each level's
// translation unit keeps its own copy, built with that level's flags only, so no copy with a
// higher level's encodings can be linked into a lower level's code.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace lowbit {
namespace {

// lane sum, wrapping as paddd: integers, so the order of the adds does not matter
inline __attribute__((always_inline)) int32_t hsum8_i32(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 1));
    return _mm_cvtsi128_si32(x);
}

}  // namespace
}  // namespace lowbit
