// Scalar reference kernels for the float weight formats: F32, F16, BF16.
//
// Rows are plain arrays of n values (little-endian float32, IEEE half, bfloat16). Their
// activation format is F32: the token row itself, n raw float32 values, unrounded.
//
// The dot's arithmetic (fixed, independent of nt and of the row split):
//   every product w[i] * x[i] is formed in double, where it is exact (24 + 24 significant
//   bits fit in 53), the products are summed in double in index order 0..n-1, and the sum
//   is rounded to float once at the end.
// The double sum's own error (at most about n * 2^-53 of the sum of |products|) is far
// below float rounding, so the result is the exact dot rounded once to float, give or take
// one ulp: the float64 oracle agrees to float rounding, and a SIMD kernel that accumulates
// in float lanes has to stay within I5's 1e-5 of it.
// (ggml pairs F16/BF16 weights with F16/BF16 activations; lowbit keeps activations in
// float32 for these formats, so it is compared against float64, not ggml's vec_dot.)
//
// Dequantization is exact: every half and bfloat16 is a float.
#include "ref.h"

namespace lowbit::ref {
namespace {

// Reads element i of a row without assuming the row is aligned to its element size.
float load_f32(const uint8_t *p, int64_t i) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
}

uint16_t load_u16(const uint8_t *p, int64_t i) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    return v;
}

// ---- dequantization --------------------------------------------------------------------

void dequant_f32(const uint8_t *src, float *dst, int64_t n, float) {
    std::memcpy(dst, src, (size_t)n * sizeof(float));
}

void dequant_f16(const uint8_t *src, float *dst, int64_t n, float) {
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16(src, i));
}

void dequant_bf16(const uint8_t *src, float *dst, int64_t n, float) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src, i));
}

// ---- the activation format F32: the float row itself ----------------------------------------

void quant_act_f32(const float *x, uint8_t *dst, int64_t n) {
    std::memcpy(dst, x, (size_t)n * sizeof(float));
}

// ---- dots against float32 activations ----------------------------------------------------

float dot_f32_f32(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += (double)load_f32(w, i) * (double)load_f32(act, i);
    return (float)acc;
}

float dot_f16_f32(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += (double)fp16_to_f32(load_u16(w, i)) * (double)load_f32(act, i);
    return (float)acc;
}

float dot_bf16_f32(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; ++i) acc += (double)bf16_to_f32(load_u16(w, i)) * (double)load_f32(act, i);
    return (float)acc;
}

}  // namespace

void register_float(KernelTable &t) {
    t.at(T_F32).dequant = dequant_f32;
    t.at(T_F16).dequant = dequant_f16;
    t.at(T_BF16).dequant = dequant_bf16;
    t.set_quant_act(T_F32, quant_act_f32, "quant_act_f32_scalar", ISA_SCALAR);
    t.set_rows_all(T_F32, rows<dot_f32_f32>, "rows_f32_f32_scalar", ISA_SCALAR);
    t.set_rows_all(T_F16, rows<dot_f16_f32>, "rows_f16_f32_scalar", ISA_SCALAR);
    t.set_rows_all(T_BF16, rows<dot_bf16_f32>, "rows_bf16_f32_scalar", ISA_SCALAR);
}

}  // namespace lowbit::ref
