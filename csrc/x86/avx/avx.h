// Shared helpers of the avx level (x86 with AVX but without AVX2 / FMA / F16C: Sandy and Ivy
// Bridge). Every .cpp of csrc/x86/avx is built with -mavx only: 256-bit float vectors, 128-bit
// integer vectors (SSE2..SSE4.1, VEX-encoded), no fused multiply-add, no fp16 instructions.
//
// ---- The arithmetic of the avx kernels: the reference's, bit for bit ---------------------------
// As on the aarch64 levels (csrc/arm/simd.h): the integer part of a block's dot is exact in
// int32 whatever the grouping, and each (row, token) then takes exactly csrc/ref's float steps
// in block order, one token per lane of an __m128 (mulps / addps / subps are the IEEE single
// operations of the reference's C++, built with -ffp-contract=off). So the avx quantized row
// kernels are bitwise the scalar reference (not the avx2 levels, whose FMA accumulation order
// differs within I5's bound), for every window (I2) and row split (I3).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../../fp16.h"
#include "../../kernels.h"

#if !defined(__AVX__) || defined(__AVX2__) || defined(__FMA__) || defined(__F16C__)
#error "csrc/x86/avx is built with -mavx and nothing above it"
#endif

#define LB_AVX_INLINE inline __attribute__((always_inline))
#define LB_AVX_LAMBDA __attribute__((always_inline))

namespace lowbit {
namespace avx {
namespace {

// ---- vector constants ---------------------------------------------------------------------------
// With 16 xmm, GCC hoists every constant out of the row loop into a register and then spills
// (I7). K() hides the constant's address from the optimiser, so each use reads it from .rodata
// (a load folded into its instruction), as csrc/x86/legacy.inl does on avx2.
struct alignas(16) C16 { uint8_t b[16]; };
constexpr C16 c8(uint8_t v) { C16 c{}; for (int i = 0; i < 16; ++i) c.b[i] = v; return c; }
constexpr C16 c16(uint16_t v) { C16 c{}; for (int i = 0; i < 16; ++i) c.b[i] = (uint8_t)(v >> (8 * (i % 2))); return c; }
constexpr C16 c32(uint32_t v) { C16 c{}; for (int i = 0; i < 16; ++i) c.b[i] = (uint8_t)(v >> (8 * (i % 4))); return c; }
LB_AVX_INLINE __m128i K(const C16 &c) {
    const C16 *p = &c;
    __asm__ volatile("" : "+r"(p));
    return _mm_load_si128((const __m128i *)p->b);
}
LB_AVX_INLINE __m128 Kf(const C16 &c) { return _mm_castsi128_ps(K(c)); }
constexpr C16 kOnes16 = c16(1), kM4 = c8(0x0F), kM3 = c8(3), kB16 = c8(0x10);
constexpr C16 kH7fff = c32(0x7fff), kH8000 = c32(0x8000), kH7c00 = c32(0x7c00), kPow112 = c32(0x77800000);
constexpr C16 kExp255 = c32(0x7f800000), kMant = c32(0x007fe000);

LB_AVX_INLINE uint16_t ld16(const uint8_t *p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
LB_AVX_INLINE float ldf(const uint8_t *p) { float v; std::memcpy(&v, p, 4); return v; }
LB_AVX_INLINE __m128i ld128(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)p); }
// IEEE half -> float in 4 int32 lanes (the half in the low 16 bits), without F16C and without a
// call (a call would force every live xmm to the stack, I7). The magnitude bits << 13 read as a
// float and scaled by 2^112 rebias the exponent exactly (normal and subnormal halves alike);
// exponent 31 (inf / NaN) becomes 255 with the payload kept. Equals fp16_to_f32 on every half.
LB_AVX_INLINE __m128 half_to_float4(__m128i h) {
    const __m128i mag = _mm_slli_epi32(_mm_and_si128(h, K(kH7fff)), 13);
    const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, K(kH8000)), 16);
    const __m128 fin = _mm_mul_ps(_mm_castsi128_ps(mag), Kf(kPow112));  // * 2^112
    const __m128i special = _mm_cmpeq_epi32(_mm_and_si128(h, K(kH7c00)), K(kH7c00));
    const __m128i nonfin = _mm_or_si128(K(kExp255), _mm_and_si128(mag, K(kMant)));
    return _mm_castsi128_ps(_mm_or_si128(_mm_blendv_epi8(_mm_castps_si128(fin), nonfin, special), sign));
}
LB_AVX_INLINE float f16(const uint8_t *p) { return _mm_cvtss_f32(half_to_float4(_mm_cvtsi32_si128(ld16(p)))); }

// Four per-token partial-sum vectors -> lane t = token t's total.
LB_AVX_INLINE __m128i reduce4(__m128i p0, __m128i p1, __m128i p2, __m128i p3) {
    return _mm_hadd_epi32(_mm_hadd_epi32(p0, p1), _mm_hadd_epi32(p2, p3));
}

// acc + partial sums of u[i] * s[i], u unsigned bytes <= 63 (maddubs pairs stay below 2^14:
// never saturate), s any int8 (including -128).
LB_AVX_INLINE __m128i dot_u8s8(__m128i acc, __m128i u, __m128i s) {
    return _mm_add_epi32(acc, _mm_madd_epi16(_mm_maddubs_epi16(u, s), K(kOnes16)));
}
// acc + partial sums of a[i] * b[i], both any int8: widened to int16 first (exact).
LB_AVX_INLINE __m128i dot_s8s8(__m128i acc, __m128i a, __m128i b) {
    acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_cvtepi8_epi16(a), _mm_cvtepi8_epi16(b)));
    return _mm_add_epi32(acc, _mm_madd_epi16(_mm_cvtepi8_epi16(_mm_srli_si128(a, 8)),
                                             _mm_cvtepi8_epi16(_mm_srli_si128(b, 8))));
}

// Token lanes of a chunk of C (1..4) tokens; lanes >= C are zero and nothing is read for them.
template <int C, class Fn>
LB_AVX_INLINE __m128i per_token(const uint8_t *ab, size_t stride, Fn fn) {
    const __m128i z = _mm_setzero_si128();
    const __m128i p0 = fn(ab);
    const __m128i p1 = C > 1 ? fn(ab + stride) : z;
    const __m128i p2 = C > 2 ? fn(ab + 2 * stride) : z;
    const __m128i p3 = C > 3 ? fn(ab + 3 * stride) : z;
    return reduce4(p0, p1, p2, p3);
}
template <int C>
LB_AVX_INLINE __m128 f16_lanes(const uint8_t *ab, size_t st, int off) {
    return half_to_float4(_mm_setr_epi32(ld16(ab + off), C > 1 ? ld16(ab + st + off) : 0, C > 2 ? ld16(ab + 2 * st + off) : 0,
                                         C > 3 ? ld16(ab + 3 * st + off) : 0));
}
template <int C>
LB_AVX_INLINE __m128 f32_lanes(const uint8_t *ab, size_t st, int off) {
    return _mm_setr_ps(ldf(ab + off), C > 1 ? ldf(ab + st + off) : 0.f, C > 2 ? ldf(ab + 2 * st + off) : 0.f,
                       C > 3 ? ldf(ab + 3 * st + off) : 0.f);
}

template <int C>
LB_AVX_INLINE void store_lanes(const RowArgs &a, int64_t r, int t0, __m128 acc) {
    alignas(16) float v[4];
    _mm_store_ps(v, acc);
    float *o = a.out + (size_t)t0 * a.out_stride + r;
    o[0] = v[0];
    if (C > 1) o[a.out_stride] = v[1];
    if (C > 2) o[2 * a.out_stride] = v[2];
    if (C > 3) o[3 * a.out_stride] = v[3];
}

// The block-format row kernel (contract and F's interface: csrc/arm/simd.h's rows_nt, the same
// design): F::block<NT>(weight block, activation block of token 0, stride, acc0, acc1).
template <class F, int NT>
void rows_nt(const RowArgs &a, int64_t r0, int64_t r1, int) {
    constexpr int C0 = NT < 4 ? NT : 4, C1 = NT > 4 ? NT - 4 : 1;
    const int64_t nb = a.n / F::kQK;
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
        for (int64_t b = 0; b < nb; ++b)
            F::template block<NT>(w + (size_t)b * F::kWB, a.act + (size_t)b * F::kAB, a.act_stride, acc0, acc1);
        store_lanes<C0>(a, r, 0, acc0);
        if constexpr (NT > 4) store_lanes<C1>(a, r, 4, acc1);
    }
}

template <class F>
void set_rows(KernelTable &t, int id, const char *name) {
    set_rows_each_nt(t.at(id), name, ISA_AVX, [](auto nt) { return &rows_nt<F, decltype(nt)::value>; });
}

}  // namespace
}  // namespace avx
}  // namespace lowbit
