// MXFP4 (ggml type 39), the scalar spec: dequantize, the dot against Q8_0 activations, and
// the quantizer (byte-identical to ggml's quantize_row_mxfp4_ref, which ggml_quantize_chunk
// runs for MXFP4; the importance matrix is ignored there too).
//
// Block (csrc/formats.h, block_mxfp4): e (the e8m0 scale's biased exponent), then qs[16]:
// low nibble of qs[j] is code j, high nibble code j + 16. Code c means the e2m1 value
// kvalues_mxfp4[c] / 2; the table holds it doubled so that it is an integer, and the scale
// is halved to match: w = kvalues_mxfp4[c] * e8m0_half(e).
//
// Dot (ggml's order, ggml_vec_dot_mxfp4_q8_0_generic): per block an exact int32 sum of
// q_a * kvalues_mxfp4[c] (|sum| <= 32 * 127 * 12 < 2^16), one float d = d_a * e8m0_half(e),
// then sumf += d * (float)sum, serially in block order.
#include "ref.h"

namespace lowbit::ref {

// e2m1 values, doubled: 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and their negatives) times 2.
// (Public: the SIMD levels look the same table up, csrc/x86/mxfp4.inl.)
const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

namespace {

void dequant_mxfp4(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_mxfp4 *>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = e8m0_half(x[i].e);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = (float)kvalues_mxfp4[x[i].qs[j] & 0xf] * d;
            y[j + QK / 2] = (float)kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

float dot_mxfp4_q8_0(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_mxfp4 *>(w);
    const auto *y = reinterpret_cast<const block_q8_0 *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK; ++i) {
        const float d = fp16_to_f32(y[i].d) * e8m0_half(x[i].e);
        int32_t sumi = 0;
        for (int j = 0; j < QK / 2; ++j) {
            sumi += (int32_t)y[i].qs[j] * kvalues_mxfp4[x[i].qs[j] & 0xf];
            sumi += (int32_t)y[i].qs[j + QK / 2] * kvalues_mxfp4[x[i].qs[j] >> 4];
        }
        sumf += d * (float)sumi;
    }
    return sumf;
}

// ---- the quantizer ----------------------------------------------------------------------------
// Per block: amax = max |x| (NaN never wins the comparison); e = floor(log2(amax)) - 2 + 127
// (so amax / 2^(e-127) lies in [4, 8): the largest e2m1 value 6 covers it up to rounding), as
// an 8-bit value the way ggml's float -> uint8_t cast compiles on x86 (through a 32-bit int,
// keeping its low byte); e = 0 for an all-zero block. Each value takes the code whose value
// kvalues[c] * e8m0_half(e) is nearest, the first such code on ties (0 before 8: +0 wins).

int best_index(float x, float d) {
    int best = 0;
    float best_err = std::fabs((float)kvalues_mxfp4[0] * d - x);
    for (int i = 1; i < 16; ++i) {
        const float err = std::fabs((float)kvalues_mxfp4[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void quant_w_mxfp4(const float *x, uint8_t *dst, int64_t rows, int64_t n) {
    auto *y = reinterpret_cast<block_mxfp4 *>(dst);
    const int64_t nb = rows * n / QK;
    for (int64_t i = 0; i < nb; ++i, x += QK) {
        float amax = 0.f;
        for (int j = 0; j < QK; ++j)
            if (amax < std::fabs(x[j])) amax = std::fabs(x[j]);
        uint8_t e = 0;
        if (amax > 0.f) {
            const float v = std::floor(std::log2(amax)) - 2.f + 127.f;  // log2f: glibc's, as ggml's
            e = (uint8_t)(int32_t)v;  // amax = +inf: v = +inf, cvttss2si gives INT_MIN, low byte 0
        }
        const float d = e8m0_half(e);
        y[i].e = e;
        for (int j = 0; j < QK / 2; ++j)
            y[i].qs[j] = (uint8_t)(best_index(x[j], d) | (best_index(x[j + QK / 2], d) << 4));
    }
}

}  // namespace

void register_mxfp4(KernelTable &t) {
    t.at(T_MXFP4).dequant = dequant_mxfp4;
    t.at(T_MXFP4).quant_w = quant_w_mxfp4;
    t.set_rows_all(T_MXFP4, rows<dot_mxfp4_q8_0>, "rows_mxfp4_q8_0_scalar", ISA_SCALAR);
}

}  // namespace lowbit::ref
