// Primitives shared by lowbit's weight quantizers (csrc/quant/*.cpp).
//
// The quantizers are byte-identical to ggml's ggml_quantize_chunk. That makes the float
// operation order part of the contract: every expression below and in the quantizers is
// written in the order (and with the int -> float promotions) that ggml's C evaluates, and
// the build has -ffp-contract=off (ggml-base is built for generic x86-64, where the
// compiler has no FMA to contract into: checked by tests/test_quantizers.py, not assumed).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../fp16.h"

namespace lowbit::quant {

constexpr float kGroupMaxEps = 1e-15f;  // "all zero" threshold of a block's max |x|

// Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the low mantissa bits:
// exact for |v| <= 4194303; larger values wrap (ggml's behaviour, kept on purpose).
inline int nearest_int(float v) {
    const float t = v + 12582912.f;
    int32_t i;
    std::memcpy(&i, &t, 4);
    return (i & 0x007fffff) - 0x00400000;
}

// float -> half as ggml-base computes it (round to nearest even; NaN becomes the one quiet
// NaN 0x7e00 with the sign, its payload dropped: lowbit::f32_to_fp16 keeps the payload).
// Branch-free (the compiler vectorises a row of them): |f| is scaled so that the float adder
// rounds it at the half's precision (2^112 then 2^-110 brings overflow to inf and keeps
// subnormal halves exact), a bias of the input's own exponent aligns the mantissa, and the
// half's exponent and mantissa are read from the sum's bits. Equals lowbit::f32_to_fp16 on
// every non-NaN float (tests/test_quantizers.py checks F16 rows against ggml's bytes).
inline uint16_t to_half(float f) {
    const uint32_t u = f32_to_bits(f);
    const uint32_t twice = u + u;  // the sign shifted out
    const uint32_t sign = u & 0x80000000u;
    float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t bias = twice & 0xff000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;  // below the half's normal range: a fixed point
    base = bits_to_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_to_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    return (uint16_t)((sign >> 16) | (twice > 0xff000000u ? 0x7e00u : nonsign));
}
inline float from_half(uint16_t h) { return fp16_to_f32(h); }

// C's MAX/MIN macros (a NaN operand decides differently than std::max / std::min).
inline float cmax(float a, float b) { return a > b ? a : b; }
inline float cmin(float a, float b) { return a < b ? a : b; }

// C's conversions of an out-of-range or NaN float to a small integer type on x86 (cvttss2si
// to 32 bits, then the low byte): ggml's legacy quantizers rely on them at the edges.
inline int8_t trunc_i8(float v) { return (int8_t)(int32_t)v; }
// (int32_t)roundf(v) (half away from zero) without the libm call. In range, v - t is exact
// (v's fraction, |r| < 1); NaN, +-inf and |v| >= 2^31 convert to INT32_MIN as roundf's result
// would, and their r (NaN or |r| >= 1) adds nothing.
inline int32_t round_away(float v) {
    const int32_t t = (int32_t)v;
    const float r = v - (float)t;
    return t + ((r >= 0.5f) & (r < 1.0f)) - ((r <= -0.5f) & (r > -1.0f));
}
inline uint8_t trunc_u8(float v) { return (uint8_t)(int32_t)v; }

// Index of the value of the sorted table val[0..n) nearest to x; a tie goes to the upper one.
inline int best_index_int8(int n, const int8_t *val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < val[mid]) hi = mid; else lo = mid;
    }
    return x - val[hi - 1] < val[hi] - x ? hi - 1 : hi;
}

// ---- the scale searches (scales.cpp) ------------------------------------------------------
// Symmetric: codes L[i] in [0, 2*nmax) for x ~ scale * (L - nmax). rmse_type 0: max-based
// scale only; 1..4: weighted least squares with weights qw (or x^2, 1, |x|, sqrt|x| when qw is
// null) refined over 18 nearby scales; negative: one least-squares step, averaged.
float make_qx_quants(int n, int nmax, const float *x, int8_t *L, int rmse_type, const float *qw);
// Symmetric 3-bit-style search with x^2 weights and coordinate descent on the codes.
float make_q3_quants(int n, int nmax, const float *x, int8_t *L, bool do_rmse);
// Asymmetric: x ~ scale * L - min, L in [0, nmax]; weighted; returns scale, *the_min = min.
// qkx2 needs weights; qkx3 uses x^2 when weights is null and stops at max <= min.
float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                       uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad);
float make_qkx3_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                       uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad);
// Non-negative x (the sub-block scales of a super-block) to L in [0, nmax], weighted.
float make_qp_quants(int n, int nmax, const float *x, uint8_t *L, const float *quant_weights);

// ---- per-row quantizers (one row of n values; qw: the row's importance weights or null) ----
using row_fn = void (*)(const float *x, uint8_t *y, int64_t n, const float *qw);

void row_q4_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q4_1(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q5_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q5_1(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q8_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q2_k(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q3_k(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q4_k(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q5_k(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_q6_k(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq4_nl(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq4_xs(const float *x, uint8_t *y, int64_t n, const float *qw);
// the grid i-quants (iq2_iq3.cpp, iq1.cpp); they throw std::domain_error on a row ggml would
// abort on (no grid point at a finite distance: non-finite or overflowing values)
void row_iq2_xxs(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq2_xs(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq2_s(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq3_xxs(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq3_s(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq1_s(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_iq1_m(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_tq1_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_tq2_0(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_f16(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_bf16(const float *x, uint8_t *y, int64_t n, const float *qw);
void row_f32(const float *x, uint8_t *y, int64_t n, const float *qw);

}  // namespace lowbit::quant
