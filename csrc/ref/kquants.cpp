// Scalar reference kernels for the k-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
//
// 256 weights per super-block, split into sub-blocks that carry small integer scales
// (and, for Q2_K / Q4_K / Q5_K, integer mins) under one or two fp16 super-scales:
//   Q2_K  16 x 16 weights  w = d * sc * q - dmin * mn     q 0..3,  sc, mn 4-bit
//   Q3_K  16 x 16 weights  w = d * (sc - 32) * q          q -4..3, sc 6-bit
//   Q4_K   8 x 32 weights  w = d * sc * q - dmin * mn     q 0..15, sc, mn 6-bit
//   Q5_K   8 x 32 weights  w = d * sc * q - dmin * mn     q 0..31, sc, mn 6-bit
//   Q6_K  16 x 16 weights  w = d * sc * q                 q -32..31, sc int8
// The bit layouts are spelled out in each unpack_* function below (weight order in, codes
// out), written once and shared by the dequantizer and the dot.
//
// Dots are against Q8_K activations (float d_a, int8 q_a, bsums = sums of 16 q_a). Per
// super-block, in super-block order:
//   isum  = sum over sub-blocks s of sc[s] * (sum over s's weights of q_w * q_a)   (int32)
//   msum  = sum over the 16 bsums j of bsums[j] * mn[sub-block of j]               (int32)
//   acc  += (d_w * d_a) * (float)isum - (dmin_w * d_a) * (float)msum
// (no msum term for Q3_K and Q6_K), float, left to right, no contraction. Both integer
// sums are exact in int32 for any bytes (the largest, Q6_K, is below 2^28). ggml's generic
// kernels group the same integers into 8 float lanes; the difference is float rounding
// only (I5). The mins use the activation's bsums, as every ggml kernel does.
//
// Dequantization is (d * sc) * q - (dmin * mn) in float, the operations (and order) of
// gguf-py and ggml's dequantize_row_*, so it is exact against gguf.quants.dequantize.
#include "ref.h"

namespace lowbit::ref {
namespace {

int32_t sub_dot(const int8_t *qw, const int8_t *qa, int len) {
    int32_t s = 0;
    for (int j = 0; j < len; ++j) s += (int32_t)qw[j] * (int32_t)qa[j];
    return s;
}

// ---- unpacking: one super-block into codes (weight order) and sub-block scales ------------

// Q2_K: byte qs[32*h + l] holds weights 128*h + 32*k + l in bits 2k+1:2k (k = 0..3).
// scales[s] holds sub-block s's scale (low nibble) and min (high nibble).
void unpack_q2_K(const block_q2_K &b, int8_t q[QK_K], uint8_t sc[16], uint8_t mn[16]) {
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 32; ++l)
                q[128 * h + 32 * k + l] = (int8_t)((b.qs[32 * h + l] >> (2 * k)) & 3);
    for (int s = 0; s < 16; ++s) {
        sc[s] = b.scales[s] & 0x0F;
        mn[s] = b.scales[s] >> 4;
    }
}

// Q3_K: the low 2 bits as in Q2_K; the 3rd bit of weight 32*k + l (k = 0..7) is bit k of
// hmask[l], and a CLEAR bit means minus 4. The 16 scales are 6 bits: the low 4 from
// scales[s] (s < 8, low nibble) or scales[s - 8] (high nibble), the high 2 from
// scales[8 + s % 4] bits 2*(s/4)+1 : 2*(s/4); the scale is that value minus 32.
void unpack_q3_K(const block_q3_K &b, int8_t q[QK_K], int8_t sc[16]) {
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 32; ++l) {
                const int i = 128 * h + 32 * k + l;
                const int low = (b.qs[32 * h + l] >> (2 * k)) & 3;
                const int high = (b.hmask[l] >> (i / 32)) & 1;
                q[i] = (int8_t)(low - (high ? 0 : 4));
            }
    for (int s = 0; s < 16; ++s) {
        const int low = s < 8 ? (b.scales[s] & 0x0F) : (b.scales[s - 8] >> 4);
        const int high = (b.scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        sc[s] = (int8_t)((low | (high << 4)) - 32);
    }
}

// The 6-bit scale and min of sub-block s (0..7) of Q4_K / Q5_K: s < 4 in the low 6 bits of
// scales[s] and scales[s + 4]; s >= 4 in the nibbles of scales[s + 4] with the top 2 bits
// taken from the spare bits 7:6 of scales[s - 4] (scale) and scales[s] (min).
void scale_min_k4(const uint8_t scales[12], int s, uint8_t *sc, uint8_t *mn) {
    if (s < 4) {
        *sc = scales[s] & 63;
        *mn = scales[s + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[s + 4] & 0x0F) | ((scales[s - 4] >> 6) << 4));
        *mn = (uint8_t)((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
    }
}

// Q4_K: byte qs[32*c + l] holds weight 64*c + l (low nibble) and 64*c + 32 + l (high).
void unpack_q4_K(const block_q4_K &b, int8_t q[QK_K], uint8_t sc[8], uint8_t mn[8]) {
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            q[64 * c + l] = (int8_t)(b.qs[32 * c + l] & 0x0F);
            q[64 * c + 32 + l] = (int8_t)(b.qs[32 * c + l] >> 4);
        }
    for (int s = 0; s < 8; ++s) scale_min_k4(b.scales, s, &sc[s], &mn[s]);
}

// Q5_K: the low 4 bits as in Q4_K; the 5th bit of weight 32*s + l is bit s of qh[l].
void unpack_q5_K(const block_q5_K &b, int8_t q[QK_K], uint8_t sc[8], uint8_t mn[8]) {
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            q[64 * c + l] = (int8_t)(b.qs[32 * c + l] & 0x0F);
            q[64 * c + 32 + l] = (int8_t)(b.qs[32 * c + l] >> 4);
        }
    for (int i = 0; i < QK_K; ++i) q[i] = (int8_t)(q[i] | (((b.qh[i % 32] >> (i / 32)) & 1) << 4));
    for (int s = 0; s < 8; ++s) scale_min_k4(b.scales, s, &sc[s], &mn[s]);
}

// Q6_K: per half h (128 weights), with ql = b.ql + 64*h, qh = b.qh + 32*h, l = 0..31:
//   weight 128*h +  0 + l: ql[l]      low nibble, qh[l] bits 1:0
//   weight 128*h + 32 + l: ql[l + 32] low nibble, qh[l] bits 3:2
//   weight 128*h + 64 + l: ql[l]      high nibble, qh[l] bits 5:4
//   weight 128*h + 96 + l: ql[l + 32] high nibble, qh[l] bits 7:6
// code = (nibble | 2 bits << 4) - 32; scales[s] (int8) for weights 16*s .. 16*s + 15.
void unpack_q6_K(const block_q6_K &b, int8_t q[QK_K]) {
    for (int h = 0; h < 2; ++h) {
        const uint8_t *ql = b.ql + 64 * h;
        const uint8_t *qh = b.qh + 32 * h;
        int8_t *o = q + 128 * h;
        for (int l = 0; l < 32; ++l) {
            o[l + 0] = (int8_t)(((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

// ---- dequantization --------------------------------------------------------------------

void dequant_q2_K(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q2_K *x = reinterpret_cast<const block_q2_K *>(src);
    int8_t q[QK_K];
    uint8_t sc[16], mn[16];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q2_K(x[b], q, sc, mn);
        const float d = fp16_to_f32(x[b].d), dmin = fp16_to_f32(x[b].dmin);
        float *y = dst + b * QK_K;
        for (int s = 0; s < 16; ++s) {
            const float dl = d * (float)sc[s], ml = dmin * (float)mn[s];
            for (int j = 16 * s; j < 16 * s + 16; ++j) y[j] = dl * (float)q[j] - ml;
        }
    }
}

void dequant_q3_K(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q3_K *x = reinterpret_cast<const block_q3_K *>(src);
    int8_t q[QK_K], sc[16];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q3_K(x[b], q, sc);
        const float d = fp16_to_f32(x[b].d);
        float *y = dst + b * QK_K;
        for (int s = 0; s < 16; ++s) {
            const float dl = d * (float)sc[s];
            for (int j = 16 * s; j < 16 * s + 16; ++j) y[j] = dl * (float)q[j];
        }
    }
}

void dequant_q4_K(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q4_K *x = reinterpret_cast<const block_q4_K *>(src);
    int8_t q[QK_K];
    uint8_t sc[8], mn[8];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q4_K(x[b], q, sc, mn);
        const float d = fp16_to_f32(x[b].d), dmin = fp16_to_f32(x[b].dmin);
        float *y = dst + b * QK_K;
        for (int s = 0; s < 8; ++s) {
            const float dl = d * (float)sc[s], ml = dmin * (float)mn[s];
            for (int j = 32 * s; j < 32 * s + 32; ++j) y[j] = dl * (float)q[j] - ml;
        }
    }
}

void dequant_q5_K(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q5_K *x = reinterpret_cast<const block_q5_K *>(src);
    int8_t q[QK_K];
    uint8_t sc[8], mn[8];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q5_K(x[b], q, sc, mn);
        const float d = fp16_to_f32(x[b].d), dmin = fp16_to_f32(x[b].dmin);
        float *y = dst + b * QK_K;
        for (int s = 0; s < 8; ++s) {
            const float dl = d * (float)sc[s], ml = dmin * (float)mn[s];
            for (int j = 32 * s; j < 32 * s + 32; ++j) y[j] = dl * (float)q[j] - ml;
        }
    }
}

void dequant_q6_K(const uint8_t *src, float *dst, int64_t n, float) {
    const block_q6_K *x = reinterpret_cast<const block_q6_K *>(src);
    int8_t q[QK_K];
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q6_K(x[b], q);
        const float d = fp16_to_f32(x[b].d);
        float *y = dst + b * QK_K;
        for (int s = 0; s < 16; ++s) {
            const float dl = d * (float)x[b].scales[s];
            for (int j = 16 * s; j < 16 * s + 16; ++j) y[j] = dl * (float)q[j];
        }
    }
}

// ---- dots against Q8_K -------------------------------------------------------------------

float dot_q2_K_q8_K(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q2_K *x = reinterpret_cast<const block_q2_K *>(w);
    const block_q8_K *y = reinterpret_cast<const block_q8_K *>(act);
    int8_t q[QK_K];
    uint8_t sc[16], mn[16];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q2_K(x[b], q, sc, mn);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 16; ++s) {
            isum += (int32_t)sc[s] * sub_dot(q + 16 * s, y[b].qs + 16 * s, 16);
            msum += (int32_t)y[b].bsums[s] * (int32_t)mn[s];
        }
        acc += (fp16_to_f32(x[b].d) * y[b].d) * (float)isum - (fp16_to_f32(x[b].dmin) * y[b].d) * (float)msum;
    }
    return acc;
}

float dot_q3_K_q8_K(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q3_K *x = reinterpret_cast<const block_q3_K *>(w);
    const block_q8_K *y = reinterpret_cast<const block_q8_K *>(act);
    int8_t q[QK_K], sc[16];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q3_K(x[b], q, sc);
        int32_t isum = 0;
        for (int s = 0; s < 16; ++s) isum += (int32_t)sc[s] * sub_dot(q + 16 * s, y[b].qs + 16 * s, 16);
        acc += (fp16_to_f32(x[b].d) * y[b].d) * (float)isum;
    }
    return acc;
}

float dot_q4_K_q8_K(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q4_K *x = reinterpret_cast<const block_q4_K *>(w);
    const block_q8_K *y = reinterpret_cast<const block_q8_K *>(act);
    int8_t q[QK_K];
    uint8_t sc[8], mn[8];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q4_K(x[b], q, sc, mn);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; ++s) isum += (int32_t)sc[s] * sub_dot(q + 32 * s, y[b].qs + 32 * s, 32);
        for (int j = 0; j < 16; ++j) msum += (int32_t)y[b].bsums[j] * (int32_t)mn[j / 2];
        acc += (fp16_to_f32(x[b].d) * y[b].d) * (float)isum - (fp16_to_f32(x[b].dmin) * y[b].d) * (float)msum;
    }
    return acc;
}

float dot_q5_K_q8_K(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q5_K *x = reinterpret_cast<const block_q5_K *>(w);
    const block_q8_K *y = reinterpret_cast<const block_q8_K *>(act);
    int8_t q[QK_K];
    uint8_t sc[8], mn[8];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q5_K(x[b], q, sc, mn);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; ++s) isum += (int32_t)sc[s] * sub_dot(q + 32 * s, y[b].qs + 32 * s, 32);
        for (int j = 0; j < 16; ++j) msum += (int32_t)y[b].bsums[j] * (int32_t)mn[j / 2];
        acc += (fp16_to_f32(x[b].d) * y[b].d) * (float)isum - (fp16_to_f32(x[b].dmin) * y[b].d) * (float)msum;
    }
    return acc;
}

float dot_q6_K_q8_K(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const block_q6_K *x = reinterpret_cast<const block_q6_K *>(w);
    const block_q8_K *y = reinterpret_cast<const block_q8_K *>(act);
    int8_t q[QK_K];
    float acc = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        unpack_q6_K(x[b], q);
        int32_t isum = 0;
        for (int s = 0; s < 16; ++s)
            isum += (int32_t)x[b].scales[s] * sub_dot(q + 16 * s, y[b].qs + 16 * s, 16);
        acc += (fp16_to_f32(x[b].d) * y[b].d) * (float)isum;
    }
    return acc;
}

}  // namespace

void register_kquants(KernelTable &t) {
    t.at(T_Q2_K).dequant = dequant_q2_K;
    t.at(T_Q3_K).dequant = dequant_q3_K;
    t.at(T_Q4_K).dequant = dequant_q4_K;
    t.at(T_Q5_K).dequant = dequant_q5_K;
    t.at(T_Q6_K).dequant = dequant_q6_K;
    t.set_rows_all(T_Q2_K, rows<dot_q2_K_q8_K>, "rows_q2_k_q8_k_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q3_K, rows<dot_q3_K_q8_K>, "rows_q3_k_q8_k_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q4_K, rows<dot_q4_K_q8_K>, "rows_q4_k_q8_k_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q5_K, rows<dot_q5_K_q8_K>, "rows_q5_k_q8_k_scalar", ISA_SCALAR);
    t.set_rows_all(T_Q6_K, rows<dot_q6_K_q8_K>, "rows_q6_k_q8_k_scalar", ISA_SCALAR);
}

}  // namespace lowbit::ref
