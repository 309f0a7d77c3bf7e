// Half and bfloat16 conversions in plain C++ (no ISA flags).
// fp16_to_f32 is exact (a signalling half NaN stays signalling, as numpy keeps it; F16C
// would quiet it). f32_to_fp16 rounds to nearest even and equals F16C's vcvtps2ph(imm=0)
// for all 2^32 inputs, NaN payloads included.
#pragma once
#include <cstdint>
#include <cstring>

namespace lowbit {

inline float bits_to_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t f32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Exact: every half is a float.
inline float fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN (payload kept)
    if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return bits_to_f32(sign);
    // subnormal half: normalise
    int e = -1;
    do { mant <<= 1; ++e; } while ((mant & 0x400u) == 0);
    return bits_to_f32(sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13));
}

// Round to nearest even; NaN keeps its top payload bits and is quieted (as F16C does).
// Without branches, so a loop of it vectorises (f32_to_fp16_row: the attention cache's writes, a
// decode step of 8 tokens storing 8 x 2 x n_kv x head_dim halves per layer); the same halves as
// the branchy integer form it replaced, for all 2^32 inputs (checked exhaustively):
//   normal results: add the rounding bias (0xfff, plus the lowest kept mantissa bit: ties to
//     even) to the rebased float bits and drop 13 bits; a carry into the exponent is right,
//     up to inf at >= 65520;
//   subnormal results (|f| < 2^-14): f + 0.5f rounds f to a multiple of 2^-24 in the float
//     unit (nearest even: the default rounding mode, which lowbit never changes), leaving the
//     half's mantissa in the low bits of 0.5f's bits;
//   inf and NaN (|f| >= 2^16: the overflow is the normal path's carry above 2^16 too).
inline uint16_t f32_to_fp16(float f) {
    const uint32_t u = f32_to_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
    const uint32_t norm = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    const uint32_t sub = f32_to_bits(bits_to_f32(ax) + 0.5f) - 0x3f000000u;
    // (selects as masks: a conditional expression here is a branch to GCC's vectoriser)
    const uint32_t nan = 0u - (uint32_t)(ax > 0x7f800000u), over = 0u - (uint32_t)(ax >= 0x47800000u),
                   under = 0u - (uint32_t)(ax < 0x38800000u);
    const uint32_t big = 0x7c00u | (nan & (0x200u | ((ax >> 13) & 0x3ffu)));
    const uint32_t r = (over & big) | (~over & ((under & sub) | (~under & norm)));
    return (uint16_t)(sign | r);
}

inline void f32_to_fp16_row(const float *x, uint16_t *h, int64_t n) {
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(x[i]);
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }
// float -> bfloat16, ggml's reference rounding (ggml_compute_fp32_to_bf16: nearest even; NaN forced
// quiet, subnormals kept): the BF16 quantizer's, and the amx level's BF16 tiles' for activations.
inline uint16_t f32_to_bf16(float f) {
    const uint32_t u = f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

}  // namespace lowbit
