// Shared NEON helpers of the aarch64 levels (csrc/arm/<level>/*.cpp include the family .inl
// files, which include this). The including file defines LOWBIT_ISA (ISA_NEON, ISA_DOTPROD or
// ISA_I8MM) and LOWBIT_NS, and is built with that level's flags only (CMakeLists.txt):
//   neon     -march=armv8-a                    (Advanced SIMD: part of every aarch64 CPU)
//   dotprod  -march=armv8.2-a+dotprod          (SDOT: 4 int8 products per int32 lane)
//   i8mm     -march=armv8.2-a+dotprod+i8mm     (SMMLA: a 2x8 by 8x2 int8 matrix product)
//
// ---- The arithmetic of every arm kernel (why they are bitwise the scalar reference) ----------
// The integer part of a block's dot (sum of q_w * q_a, the sub-block scales, the mins against
// bsums) is exact in int32 whatever the grouping, and each (row, token) then takes exactly the
// float steps of csrc/ref, in block order, with the same operands: a float32x4 holds one such
// accumulator per lane (4 tokens of a chunk), and vmulq / vaddq / vsubq / vdivq are the IEEE
// single operations the reference's plain C++ performs (-ffp-contract=off: no fused ops). So a
// quantized format's output is bitwise the reference's, for any window (I2) and row split (I3);
// tests/arm/check.cpp checks exactly that. (Float rows F16 / BF16 / F32 sum in double lanes:
// within float rounding of the reference, bitwise across windows and splits.)
#pragma once
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "../kernels.h"

#ifndef LOWBIT_ISA
#error "define LOWBIT_ISA and LOWBIT_NS before including an arm .inl"
#endif

// The level as a preprocessor number (LOWBIT_ISA is an enum, invisible to #if), from the flags
// this translation unit is built with; checked against LOWBIT_ISA below.
#if defined(__ARM_FEATURE_MATMUL_INT8)
#define LB_ARM_LEVEL 3
#elif defined(__ARM_FEATURE_DOTPROD)
#define LB_ARM_LEVEL 2
#else
#define LB_ARM_LEVEL 1
#endif

#define LB_ARM_INLINE inline __attribute__((always_inline))
// on a lambda, after its parameter list: GCC does not always inline large ones (their captures
// then live on the stack)
#define LB_ARM_LAMBDA __attribute__((always_inline))
#define LB_ARM_STR2(x) #x
#define LB_ARM_STR(x) LB_ARM_STR2(x)
// Kernel names end in the level: "rows_q4_0_q8_0_" "dotprod".
#if LB_ARM_LEVEL == 3
#define LB_ARM_SUFFIX "i8mm"
#elif LB_ARM_LEVEL == 2
#define LB_ARM_SUFFIX "dotprod"
#else
#define LB_ARM_SUFFIX "neon"
#endif

namespace lowbit {
static_assert(LB_ARM_LEVEL + 4 == (int)LOWBIT_ISA, "the level's compiler flags do not match LOWBIT_ISA");
namespace LOWBIT_NS {
namespace {

// acc + per int32 lane a sum of 4 products a[i] * b[i] (the lanes' total is the 16-byte dot;
// which 4 products land in which lane differs between the two forms, the total does not).
LB_ARM_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if LB_ARM_LEVEL >= 2
    return vdotq_s32(acc, a, b);
#else
    // int16 products: |a * b| <= 128 * 128 = 16384, exact; pairs widen into int32.
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// Four per-token partial-sum vectors -> one vector whose lane t is token t's total.
LB_ARM_INLINE int32x4_t reduce4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

// Token lanes of a chunk of C (1..4) tokens: fn(token's block bytes) -> int32x4 partials;
// lanes >= C are zero (phantom tokens: nothing is read for them).
template <int C, class Fn>
LB_ARM_INLINE int32x4_t per_token(const uint8_t *ab, size_t stride, Fn fn) {
    const int32x4_t z = vdupq_n_s32(0);
    const int32x4_t p0 = fn(ab);
    const int32x4_t p1 = C > 1 ? fn(ab + stride) : z;
    const int32x4_t p2 = C > 2 ? fn(ab + 2 * stride) : z;
    const int32x4_t p3 = C > 3 ? fn(ab + 3 * stride) : z;
    return reduce4(p0, p1, p2, p3);
}

// A byte splat whose value the optimiser may not treat as a constant: built (one DUP from a
// general register) where it is used instead of being hoisted out of the row loop into a
// vector register of its own, which the 8 token accumulators need (I7).
LB_ARM_INLINE uint8x16_t splat_u8_here(uint8_t v) {
    __asm__("" : "+r"(v));
    return vdupq_n_u8(v);
}

LB_ARM_INLINE uint16_t ld16(const uint8_t *p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
LB_ARM_INLINE uint32_t ld32(const uint8_t *p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
LB_ARM_INLINE float ldf(const uint8_t *p) { float v; std::memcpy(&v, p, 4); return v; }

// Lane t = the fp16 (exactly widened) / float at byte `off` of token t's block; lanes >= C: 0.
template <int C>
LB_ARM_INLINE float32x4_t f16_lanes(const uint8_t *ab, size_t stride, int off) {
    uint16x4_t h = vdup_n_u16(0);
    h = vset_lane_u16(ld16(ab + off), h, 0);
    if (C > 1) h = vset_lane_u16(ld16(ab + stride + off), h, 1);
    if (C > 2) h = vset_lane_u16(ld16(ab + 2 * stride + off), h, 2);
    if (C > 3) h = vset_lane_u16(ld16(ab + 3 * stride + off), h, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}
template <int C>
LB_ARM_INLINE float32x4_t f32_lanes(const uint8_t *ab, size_t stride, int off) {
    float32x4_t v = vdupq_n_f32(0.f);
    v = vsetq_lane_f32(ldf(ab + off), v, 0);
    if (C > 1) v = vsetq_lane_f32(ldf(ab + stride + off), v, 1);
    if (C > 2) v = vsetq_lane_f32(ldf(ab + 2 * stride + off), v, 2);
    if (C > 3) v = vsetq_lane_f32(ldf(ab + 3 * stride + off), v, 3);
    return v;
}
// One fp16 scale of a weight block, widened exactly (the reference's fp16_to_f32).
LB_ARM_INLINE float f16(const uint8_t *p) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(ld16(p)))), 0);
}

// Store lanes t < C of a chunk's accumulator: out[(t0 + t) * out_stride + r].
template <int C>
LB_ARM_INLINE void store_lanes(const RowArgs &a, int64_t r, int t0, float32x4_t acc) {
    float *o = a.out + (size_t)t0 * a.out_stride + r;
    o[0] = vgetq_lane_f32(acc, 0);
    if (C > 1) o[a.out_stride] = vgetq_lane_f32(acc, 1);
    if (C > 2) o[2 * a.out_stride] = vgetq_lane_f32(acc, 2);
    if (C > 3) o[3 * a.out_stride] = vgetq_lane_f32(acc, 3);
}

// ---- per-token integer accumulators ---------------------------------------------------------
// Eight named int32x4 registers, one per token of the window (I7: never an array indexed by a
// runtime token count); for_tokens<NT> updates those of tokens < NT: t_k = fn(t_k, token k's
// activation block). Lanes of t_k add up to token k's integer sum.
struct Acc8 {
    int32x4_t t0, t1, t2, t3, t4, t5, t6, t7;
    LB_ARM_INLINE Acc8() : t0(vdupq_n_s32(0)), t1(t0), t2(t0), t3(t0), t4(t0), t5(t0), t6(t0), t7(t0) {}
    LB_ARM_INLINE int32x4_t lo() const { return reduce4(t0, t1, t2, t3); }  // lane t: token t's total
    LB_ARM_INLINE int32x4_t hi() const { return reduce4(t4, t5, t6, t7); }  // lane t: token 4 + t's
};
template <int NT, class Fn>
LB_ARM_INLINE void for_tokens(Acc8 &s, const uint8_t *ab, size_t st, Fn fn) {
    s.t0 = fn(s.t0, ab);
    if constexpr (NT > 1) s.t1 = fn(s.t1, ab + st);
    if constexpr (NT > 2) s.t2 = fn(s.t2, ab + 2 * st);
    if constexpr (NT > 3) s.t3 = fn(s.t3, ab + 3 * st);
    if constexpr (NT > 4) s.t4 = fn(s.t4, ab + 4 * st);
    if constexpr (NT > 5) s.t5 = fn(s.t5, ab + 5 * st);
    if constexpr (NT > 6) s.t6 = fn(s.t6, ab + 6 * st);
    if constexpr (NT > 7) s.t7 = fn(s.t7, ab + 7 * st);
}

// ---- the block-format row kernel -------------------------------------------------------------
// F (a format, in the family .inl) provides kQK weights per block, kWB bytes per weight block,
// kAB bytes per activation block, and
//   block<NT>(weight block, activation block of token 0, act stride, acc0, acc1):
//     lane t of acc0 (tokens 0..3) / acc1 (tokens 4..7) takes token t's float step(s) for the
//     block, the reference's operations in its order.
// The weight block is decoded once per row for the whole window (never per token); the float
// accumulators are two named registers (I7).
template <class F, int NT>
void rows_nt(const RowArgs &a, int64_t r0, int64_t r1, int) {
    constexpr int C0 = NT < 4 ? NT : 4, C1 = NT > 4 ? NT - 4 : 1;
    const int64_t nb = a.n / F::kQK;
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        float32x4_t acc0 = vdupq_n_f32(0.f), acc1 = vdupq_n_f32(0.f);
        for (int64_t b = 0; b < nb; ++b)
            F::template block<NT>(w + (size_t)b * F::kWB, a.act + (size_t)b * F::kAB, a.act_stride, acc0, acc1);
        store_lanes<C0>(a, r, 0, acc0);
        if constexpr (NT > 4) store_lanes<C1>(a, r, 4, acc1);
    }
}

template <class F>
void set_rows(KernelTable &t, int id, const char *name) {
    set_rows_each_nt(t.at(id), name, LOWBIT_ISA, [](auto nt) { return &rows_nt<F, decltype(nt)::value>; });
}

}  // namespace
}  // namespace LOWBIT_NS
}  // namespace lowbit
