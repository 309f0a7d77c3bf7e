// Scalar reference kernels for the legacy formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//
// 32 weights per block, one fp16 scale d (and, for the _1 formats, one fp16 offset m):
//   Q4_0  w = d * (nibble - 8)        Q4_1  w = d * nibble + m
//   Q5_0  w = d * (5-bit code - 16)   Q5_1  w = d * (5-bit code) + m
//   Q8_0  w = d * int8
// Lane order inside a block (all 4- and 5-bit formats): the low nibble of qs[j] is weight
// j, the high nibble is weight j + 16; for Q5_*, bit j of the little-endian 32-bit qh is the
// 5th bit of weight j.
//
// Dots pair the _0 formats with Q8_0 activations and the _1 formats with Q8_1 (whose s is
// d_a * sum(q_a), so the offset term is m_w * s_a with no per-weight work), as ggml does.
// The arithmetic, per block in block order:
//   sumi  = sum over the 32 weights of q_w * q_a                 (int32, exact)
//   acc  += (d_w * d_a) * (float)sumi                            (_0 formats)
//   acc  += (d_w * d_a) * (float)sumi + m_w * s_a                (_1 formats)
// all in float, left to right, without contraction (the build passes -ffp-contract=off).
// This is ggml_vec_dot_*_generic's order; it differs from ggml's AVX2 kernels only in
// float rounding (I5 bounds that at 1e-5 of the largest output).
//
// Dequantization is d * q (+ m) in float, the operations gguf-py performs, so it is exact
// against gguf.quants.dequantize.
#include "ref.h"

namespace lowbit::ref {
namespace {

// ---- unpacking: one block into its integer codes, in weight order -------------------------

// Q4_0: codes -8..7.
void codes_q4_0(const block_q4_0 &b, int8_t q[QK]) {
    for (int j = 0; j < QK / 2; ++j) {
        q[j] = (int8_t)((b.qs[j] & 0x0F) - 8);
        q[j + QK / 2] = (int8_t)((b.qs[j] >> 4) - 8);
    }
}

// Q4_1: codes 0..15.
void codes_q4_1(const block_q4_1 &b, int8_t q[QK]) {
    for (int j = 0; j < QK / 2; ++j) {
        q[j] = (int8_t)(b.qs[j] & 0x0F);
        q[j + QK / 2] = (int8_t)(b.qs[j] >> 4);
    }
}

// The 5th bits of a Q5 block: bit j of the little-endian word is weight j's.
uint32_t high_bits(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
}

// Q5_0: codes -16..15.
void codes_q5_0(const block_q5_0 &b, int8_t q[QK]) {
    const uint32_t qh = high_bits(b.qh);
    for (int j = 0; j < QK / 2; ++j) {
        const int lo = (b.qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
        const int hi = (b.qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        q[j] = (int8_t)(lo - 16);
        q[j + QK / 2] = (int8_t)(hi - 16);
    }
}

// Q5_1: codes 0..31.
void codes_q5_1(const block_q5_1 &b, int8_t q[QK]) {
    const uint32_t qh = high_bits(b.qh);
    for (int j = 0; j < QK / 2; ++j) {
        q[j] = (int8_t)((b.qs[j] & 0x0F) | (int)(((qh >> j) & 1u) << 4));
        q[j + QK / 2] = (int8_t)((b.qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4));
    }
}

int32_t block_dot(const int8_t qw[QK], const int8_t qa[QK]) {
    int32_t sumi = 0;
    for (int j = 0; j < QK; ++j) sumi += (int32_t)qw[j] * (int32_t)qa[j];
    return sumi;
}

// ---- dequantization --------------------------------------------------------------------

void dequant_q4_0(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q4_0 *x = reinterpret_cast<const block_q4_0 *>(src);
    int8_t q[QK];
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q4_0(x[b], q);
        const float d = fp16_to_f32(x[b].d);
        for (int j = 0; j < QK; ++j) dst[b * QK + j] = d * (float)q[j];
    }
}

void dequant_q4_1(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q4_1 *x = reinterpret_cast<const block_q4_1 *>(src);
    int8_t q[QK];
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q4_1(x[b], q);
        const float d = fp16_to_f32(x[b].d), m = fp16_to_f32(x[b].m);
        for (int j = 0; j < QK; ++j) dst[b * QK + j] = d * (float)q[j] + m;
    }
}

void dequant_q5_0(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q5_0 *x = reinterpret_cast<const block_q5_0 *>(src);
    int8_t q[QK];
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q5_0(x[b], q);
        const float d = fp16_to_f32(x[b].d);
        for (int j = 0; j < QK; ++j) dst[b * QK + j] = d * (float)q[j];
    }
}

void dequant_q5_1(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q5_1 *x = reinterpret_cast<const block_q5_1 *>(src);
    int8_t q[QK];
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q5_1(x[b], q);
        const float d = fp16_to_f32(x[b].d), m = fp16_to_f32(x[b].m);
        for (int j = 0; j < QK; ++j) dst[b * QK + j] = d * (float)q[j] + m;
    }
}

// Q8_0 as a weight (also the dequantizer of Q8_0 activations: same bytes, same meaning).
void dequant_q8_0(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q8_0 *x = reinterpret_cast<const block_q8_0 *>(src);
    for (int64_t b = 0; b < n / QK; ++b) {
        const float d = fp16_to_f32(x[b].d);
        for (int j = 0; j < QK; ++j) dst[b * QK + j] = d * (float)x[b].qs[j];
    }
}

// ---- dots --------------------------------------------------------------------------------

float dot_q4_0_q8_0(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q4_0 *x = reinterpret_cast<const block_q4_0 *>(w);
    const block_q8_0 *y = reinterpret_cast<const block_q8_0 *>(act);
    int8_t q[QK];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q4_0(x[b], q);
        const int32_t sumi = block_dot(q, y[b].qs);
        acc += (fp16_to_f32(x[b].d) * fp16_to_f32(y[b].d)) * (float)sumi;
    }
    return acc;
}

float dot_q4_1_q8_1(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q4_1 *x = reinterpret_cast<const block_q4_1 *>(w);
    const block_q8_1 *y = reinterpret_cast<const block_q8_1 *>(act);
    int8_t q[QK];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q4_1(x[b], q);
        const int32_t sumi = block_dot(q, y[b].qs);
        acc += (fp16_to_f32(x[b].d) * fp16_to_f32(y[b].d)) * (float)sumi
             + fp16_to_f32(x[b].m) * fp16_to_f32(y[b].s);
    }
    return acc;
}

float dot_q5_0_q8_0(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q5_0 *x = reinterpret_cast<const block_q5_0 *>(w);
    const block_q8_0 *y = reinterpret_cast<const block_q8_0 *>(act);
    int8_t q[QK];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q5_0(x[b], q);
        const int32_t sumi = block_dot(q, y[b].qs);
        acc += (fp16_to_f32(x[b].d) * fp16_to_f32(y[b].d)) * (float)sumi;
    }
    return acc;
}

float dot_q5_1_q8_1(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q5_1 *x = reinterpret_cast<const block_q5_1 *>(w);
    const block_q8_1 *y = reinterpret_cast<const block_q8_1 *>(act);
    int8_t q[QK];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b) {
        codes_q5_1(x[b], q);
        const int32_t sumi = block_dot(q, y[b].qs);
        acc += (fp16_to_f32(x[b].d) * fp16_to_f32(y[b].d)) * (float)sumi
             + fp16_to_f32(x[b].m) * fp16_to_f32(y[b].s);
    }
    return acc;
}

float dot_q8_0_q8_0(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q8_0 *x = reinterpret_cast<const block_q8_0 *>(w);
    const block_q8_0 *y = reinterpret_cast<const block_q8_0 *>(act);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK; ++b) {
        const int32_t sumi = block_dot(x[b].qs, y[b].qs);
        acc += (fp16_to_f32(x[b].d) * fp16_to_f32(y[b].d)) * (float)sumi;
    }
    return acc;
}

}  // namespace

void register_legacy(KernelTable &t) {
    t.at(T_Q4_0).dequant = dequant_q4_0;
    t.at(T_Q4_1).dequant = dequant_q4_1;
    t.at(T_Q5_0).dequant = dequant_q5_0;
    t.at(T_Q5_1).dequant = dequant_q5_1;
    t.at(T_Q8_0).dequant = dequant_q8_0;
    t.set_rows_all(T_Q4_0, rows<dot_q4_0_q8_0>, "rows_q4_0_q8_0_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q4_1, rows<dot_q4_1_q8_1>, "rows_q4_1_q8_1_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q5_0, rows<dot_q5_0_q8_0>, "rows_q5_0_q8_0_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q5_1, rows<dot_q5_1_q8_1>, "rows_q5_1_q8_1_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q8_0, rows<dot_q8_0_q8_0>, "rows_q8_0_q8_0_scalar", ISA_SCALAR);
}

}  // namespace lowbit::ref
