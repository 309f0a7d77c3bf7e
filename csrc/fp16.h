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
inline uint16_t f32_to_fp16(float f) {
    const uint32_t x = f32_to_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (ax < 0x38800000u) {  // result is subnormal (or zero) in half
        if (ax < 0x33000000u) return sign;  // < 2^-25: rounds to 0 (2^-25 ties to even 0)
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;  // 14 + (113 - e) - 1 ... value = m * 2^(e-150), half ulp 2^-24
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

}  // namespace lowbit
