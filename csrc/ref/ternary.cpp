// Scalar reference kernels for the ternary formats: the spec the SIMD levels are tested
// against.
//
//   TQ1_0, TQ2_0   ggml's ternary types, against Q8_K. dequant is bit-identical to ggml's
//                  dequantize_row_tq*; the dot is ggml_vec_dot_tq*_q8_K_generic's
//                  arithmetic: one exact integer sum per 256 weights, then
//                  sumf += (float)sum * (d_w * d_act), in block order.
//   I2_S           bitnet.cpp's ternary type, against I8_S (lowbit's activation format,
//                  formats.h). One float scale per tensor (RowArgs::w_scale). The dot is
//                      S = sum_k code_k * q_k        (codes 0/1/2, exact integer)
//                      result = (float)(S - act_sum) / act_scale * w_scale
//                  evaluated in exactly that order; S - act_sum = sum (code_k - 1) * q_k.
//   I8_S           activation quantizer and its dequant (q / scale).
//   I2_S quantizer absmean ternarisation (BitNet b1.58) of a whole float tensor.
//
// Built without ISA flags; no intrinsics here.
#include <cmath>
#include <cstring>

#include "../formats.h"
#include "ref.h"

namespace lowbit::ref {
namespace {

// ---- TQ1_0: 1.69 bpw -----------------------------------------------------------------------
// A byte stores up to 5 trits as a fixed-point fraction of 3^5: trit k (0 = most
// significant) is the integer part of 3 * frac(byte * 3^k / 256), computed as
// ((uint8)(byte * 3^k) * 3) >> 8. Weight order inside the 256-weight block:
//   qs[m],      m <  32: trit k -> weight      32k + m   (weights   0..159)
//   qs[32 + m], m <  16: trit k -> weight 160 + 16k + m   (weights 160..239)
//   qh[m],      m <   4: trit k -> weight 240 +  4k + m   (k < 4, weights 240..255)
// Value = (trit - 1) * d.

inline int tq1_trit(uint8_t byte, int k) {
    static constexpr uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t q = (uint8_t)(byte * pow3[k]);
    return ((uint16_t)q * 3) >> 8;
}

// The 256 weights of one block as -1 / 0 / +1, in weight order.
void tq1_0_values(const block_tq1_0 &b, int8_t v[QK_K]) {
    for (int k = 0; k < 5; ++k)
        for (int m = 0; m < 32; ++m) v[32 * k + m] = (int8_t)(tq1_trit(b.qs[m], k) - 1);
    for (int k = 0; k < 5; ++k)
        for (int m = 0; m < 16; ++m) v[160 + 16 * k + m] = (int8_t)(tq1_trit(b.qs[32 + m], k) - 1);
    for (int k = 0; k < 4; ++k)
        for (int m = 0; m < 4; ++m) v[240 + 4 * k + m] = (int8_t)(tq1_trit(b.qh[m], k) - 1);
}

void dequant_tq1_0(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_tq1_0 *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_f32(x[i].d);
        int8_t v[QK_K];
        tq1_0_values(x[i], v);
        for (int k = 0; k < QK_K; ++k) y[k] = (float)v[k] * d;
    }
}

float dot_tq1_0_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_tq1_0 *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t v[QK_K];
        tq1_0_values(x[i], v);
        int32_t sum = 0;
        for (int k = 0; k < QK_K; ++k) sum += (int32_t)v[k] * y[i].qs[k];
        sumf += (float)sum * (fp16_to_f32(x[i].d) * y[i].d);
    }
    return sumf;
}

// ---- TQ2_0: 2.06 bpw -----------------------------------------------------------------------
// 2-bit codes 0..2 (3 does not occur in valid data and decodes as +2, as in ggml), value
// (code - 1) * d. qs[32h + m] bits 2l..2l+1 hold weight 128h + 32l + m (h < 2, l < 4).

inline int tq2_code(const block_tq2_0 &b, int k) {
    const int h = k / 128, l = (k % 128) / 32, m = k % 32;
    return (b.qs[32 * h + m] >> (2 * l)) & 3;
}

void dequant_tq2_0(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_tq2_0 *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i, y += QK_K) {
        const float d = fp16_to_f32(x[i].d);
        for (int k = 0; k < QK_K; ++k) y[k] = (float)(tq2_code(x[i], k) - 1) * d;
    }
}

float dot_tq2_0_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_tq2_0 *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int32_t sum = 0;
        for (int k = 0; k < QK_K; ++k) sum += (int32_t)y[i].qs[k] * (tq2_code(x[i], k) - 1);
        const float d = y[i].d * fp16_to_f32(x[i].d);
        sumf += (float)sum * d;
    }
    return sumf;
}

// ---- I2_S (bitnet.cpp, x86 layout) ---------------------------------------------------------
// Per 128 weights, 32 bytes: byte j holds weights j, 32+j, 64+j, 96+j in bits 7:6, 5:4,
// 3:2, 1:0. Codes 0/1/2 mean -1/0/+1 (3 does not occur in valid data; it would mean +2).

inline int i2s_code(const uint8_t *block, int k) {
    return (block[k % 32] >> (6 - 2 * (k / 32))) & 3;
}

void dequant_i2_s(const uint8_t *src, float *y, int64_t n, float w_scale) {
    for (int64_t b = 0; b < n / QK_I2S; ++b, src += sizeof(block_i2_s), y += QK_I2S)
        for (int k = 0; k < QK_I2S; ++k) y[k] = (float)(i2s_code(src, k) - 1) * w_scale;
}

// I8_S row: float act_scale, int32 act_sum, int8 q[n] (formats.h).
float dot_i2_s_i8_s(const uint8_t *w, const uint8_t *act, int64_t n, float w_scale) {
    float act_scale;
    int32_t act_sum;
    std::memcpy(&act_scale, act, 4);
    std::memcpy(&act_sum, act + 4, 4);
    const int8_t *q = reinterpret_cast<const int8_t *>(act + I8S_HEADER);
    // Exact in int64 for any n. (|S| <= 3 * 128 * n: SIMD levels may keep int32 sums,
    // which are exact for n <= 2^22.)
    int64_t sum = 0;
    for (int64_t b = 0; b < n / QK_I2S; ++b, w += sizeof(block_i2_s), q += QK_I2S)
        for (int k = 0; k < QK_I2S; ++k) sum += (int64_t)i2s_code(w, k) * q[k];
    return (float)(sum - act_sum) / act_scale * w_scale;
}

// ---- I8_S activations ----------------------------------------------------------------------
// Contract for one row of n floats (lowbit's own format, paired with I2_S):
//   amax  = max |x_k| over the FINITE x_k (NaN and +-inf do not count)
//   scale = 127 / amax (float); 1 when amax is 0 or 127 / amax overflows (amax below
//           ~3.7e-37: every finite x then rounds to q = 0, so the row reads as zero)
//   q_k   = clamp(nearest_int(x_k * scale), -127, 127)    x_k * scale in float, ties to even
//           NaN -> 0, +inf -> 127, -inf -> -127
//   sum   = sum_k q_k (int32; exact for n < 2^24)
// Symmetric [-127, 127] so that negating x negates q exactly.

void quant_act_i8_s(const float *x, uint8_t *dst, int64_t n) {
    float amax = 0.f;
    for (int64_t k = 0; k < n; ++k)
        if (std::isfinite(x[k])) amax = std::fmax(amax, std::fabs(x[k]));
    float scale = 1.f;
    if (amax > 0.f && std::isfinite(127.f / amax)) scale = 127.f / amax;

    int8_t *q = reinterpret_cast<int8_t *>(dst + I8S_HEADER);
    int32_t sum = 0;
    for (int64_t k = 0; k < n; ++k) {
        int v;
        if (std::isnan(x[k])) v = 0;
        else if (std::isinf(x[k])) v = x[k] > 0 ? 127 : -127;
        else v = nearest_int(x[k] * scale);  // |x * scale| <= 127 (plus rounding)
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        q[k] = (int8_t)v;
        sum += v;
    }
    std::memcpy(dst, &scale, 4);
    std::memcpy(dst + 4, &sum, 4);
}

void dequant_i8_s(const uint8_t *src, float *y, int64_t n, float) {
    float scale;
    std::memcpy(&scale, src, 4);
    const int8_t *q = reinterpret_cast<const int8_t *>(src + I8S_HEADER);
    for (int64_t k = 0; k < n; ++k) y[k] = (float)q[k] / scale;
}

// ---- I2_S weight quantizer -----------------------------------------------------------------
// Absmean ternarisation, as BitNet b1.58 trains its weights:
//   w_scale = max(mean |W|, 1e-5) over the WHOLE tensor (rows * n values; the mean is
//             accumulated in double, then rounded to float)
//   code    = clamp(nearest_int(W / w_scale), -1, 1) + 1     (ties to even, like torch.round)
// so W ~ (code - 1) * w_scale. A tensor that is already ternary (every finite nonzero |W|
// is one value a: bitnet.cpp's converter applies absmean in float before writing) takes
// w_scale = a instead, so it round-trips exactly (absmean would give a * (nonzero share)).
// Non-finite weights: NaN gives code 1 (zero), +-inf gives
// code 2 / 0; both add 0 to the mean's sum but count in its denominator.
// Output: rows * n / 4 code bytes in the x86 layout, the float w_scale at byte offset
// rows * n / 4, then zeros to the end of the 32-byte pad (I2S_TENSOR_PAD).

void quant_w_i2_s(const float *x, uint8_t *dst, int64_t rows, int64_t n) {
    const int64_t total = rows * n;
    double abs_sum = 0.0;
    for (int64_t k = 0; k < total; ++k)
        if (std::isfinite(x[k])) abs_sum += std::fabs((double)x[k]);
    float w_scale = total > 0 ? (float)(abs_sum / (double)total) : 0.f;
    float level = 0.f;  // the one nonzero |W| of a ternary tensor; -1: not ternary
    for (int64_t k = 0; k < total && level >= 0.f; ++k) {
        const float a = std::fabs(x[k]);
        if (!std::isfinite(a) || a == 0.f) continue;
        level = level == 0.f ? a : (a == level ? level : -1.f);
    }
    if (level > 0.f) w_scale = level;
    if (!(w_scale >= 1e-5f)) w_scale = 1e-5f;

    std::memset(dst, 0, (size_t)(total / 4) + I2S_TENSOR_PAD);
    for (int64_t b = 0; b < total / QK_I2S; ++b) {
        uint8_t *block = dst + b * (int64_t)sizeof(block_i2_s);
        const float *xb = x + b * QK_I2S;
        for (int k = 0; k < QK_I2S; ++k) {
            int t;
            if (std::isnan(xb[k])) t = 0;
            else {
                // Clamp before rounding: nearest_int is valid only for |v| < 2^22.
                const float v = std::fmax(-2.f, std::fmin(2.f, xb[k] / w_scale));
                t = nearest_int(v);
                t = t > 1 ? 1 : (t < -1 ? -1 : t);
            }
            block[k % 32] |= (uint8_t)((t + 1) << (6 - 2 * (k / 32)));
        }
    }
    std::memcpy(dst + total / 4, &w_scale, 4);
}

}  // namespace

void register_ternary(KernelTable &t) {
    t.at(T_TQ1_0).dequant = dequant_tq1_0;
    t.set_rows_all(T_TQ1_0, rows<dot_tq1_0_q8_k>, "rows_tq1_0_q8_k_scalar", ISA_SCALAR);
    t.at(T_TQ2_0).dequant = dequant_tq2_0;
    t.set_rows_all(T_TQ2_0, rows<dot_tq2_0_q8_k>, "rows_tq2_0_q8_k_scalar", ISA_SCALAR);
    t.at(T_I2_S).dequant = dequant_i2_s;
    t.at(T_I2_S).quant_w = quant_w_i2_s;
    t.set_rows_all(T_I2_S, rows<dot_i2_s_i8_s>, "rows_i2_s_i8_s_scalar", ISA_SCALAR);
    t.set_quant_act(T_I8_S, quant_act_i8_s, "quant_act_i8_s_scalar", ISA_SCALAR);
    t.at(T_I8_S).dequant = dequant_i8_s;
}

}  // namespace lowbit::ref
