// Legacy formats (32 weights per block), as ggml_quantize_chunk makes them.
//
// Without importance weights: the reference rules (Q4_0/Q5_0: the value of largest
// magnitude maps to code 0; Q4_1/Q5_1: [min, max] over the codes; Q8_0: max |x| -> 127).
// With importance weights qw (one per value of the row): a weighted least-squares scale
// (make_qx_quants, Q4_0/Q5_0) or scale and min (make_qkx3_quants, Q4_1/Q5_1), the weights
// qw * sqrt(sigma2 + x^2) with sigma2 the row's mean square. Q8_0 ignores qw (as ggml).
#include <algorithm>

#include "../formats.h"
#include "common.h"

namespace lowbit::quant {

namespace {

// The value of largest magnitude (the first one on a tie), with its sign.
inline float signed_absmax(const float *x, int n) {
    float amax = 0, max = 0;
    for (int j = 0; j < n; ++j) {
        if (amax < std::fabs(x[j])) { amax = std::fabs(x[j]); max = x[j]; }
    }
    return max;
}

inline void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = 3.402823466e+38f, hi = -3.402823466e+38f;
    for (int j = 0; j < n; ++j) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *mn = lo; *mx = hi;
}

// The row's mean square and the per-value weights of one block.
inline float row_sigma2(const float *x, int64_t n) {
    float s = 0;
    for (int64_t j = 0; j < n; ++j) s += x[j] * x[j];
    return s / (float)n;
}
inline void block_weights(const float *xb, const float *qw, float sigma2, float *w) {
    for (int j = 0; j < QK; ++j) w[j] = qw[j] * std::sqrt(sigma2 + xb[j] * xb[j]);
}

// 5-bit codes: low nibbles in qs (j | j+16 << 4), the 5th bits in qh (bit j for value j).
inline void pack5(const uint8_t *L, uint8_t *qs, uint8_t *qh4) {
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; ++j) {
        const uint8_t a = L[j], b = L[j + QK / 2];
        qs[j] = (uint8_t)((a & 0x0F) | ((b & 0x0F) << 4));
        qh |= ((a & 0x10u) >> 4) << j;
        qh |= ((b & 0x10u) >> 4) << (j + QK / 2);
    }
    std::memcpy(qh4, &qh, 4);
}

}  // namespace

void row_q4_0(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q4_0 *>(y8);
    const float sigma2 = qw ? row_sigma2(x, n) : 0.f;
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        if (qw) {
            float w[QK];
            int8_t L[QK];
            block_weights(x, qw + ib * QK, sigma2, w);
            y[ib].d = to_half(make_qx_quants(QK, 8, x, L, 1, w));
            for (int j = 0; j < QK / 2; ++j) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + QK / 2] << 4));
            continue;
        }
        const float d = signed_absmax(x, QK) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[ib].d = to_half(d);
        for (int j = 0; j < QK / 2; ++j) {
            const int a = std::min<int>(15, trunc_i8(x[j] * id + 8.5f));
            const int b = std::min<int>(15, trunc_i8(x[j + QK / 2] * id + 8.5f));
            y[ib].qs[j] = (uint8_t)((uint8_t)a | ((uint8_t)b << 4));
        }
    }
}

void row_q4_1(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q4_1 *>(y8);
    const float sigma2 = qw ? row_sigma2(x, n) : 0.f;
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        if (qw) {
            float w[QK], mn;
            uint8_t L[QK], Laux[QK];
            block_weights(x, qw + ib * QK, sigma2, w);
            const float d = make_qkx3_quants(QK, 15, x, w, L, &mn, Laux, -0.9f, 0.05f, 36, false);
            y[ib].d = to_half(d);
            y[ib].m = to_half(-mn);
            for (int j = 0; j < QK / 2; ++j) y[ib].qs[j] = (uint8_t)(L[j] | (L[j + QK / 2] << 4));
            continue;
        }
        float mn, mx;
        min_max(x, QK, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[ib].d = to_half(d);
        y[ib].m = to_half(mn);
        for (int j = 0; j < QK / 2; ++j) {
            const int a = std::min<int>(15, trunc_i8((x[j] - mn) * id + 0.5f));
            const int b = std::min<int>(15, trunc_i8((x[j + QK / 2] - mn) * id + 0.5f));
            y[ib].qs[j] = (uint8_t)((uint8_t)a | ((uint8_t)b << 4));
        }
    }
}

void row_q5_0(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q5_0 *>(y8);
    const float sigma2 = qw ? row_sigma2(x, n) : 0.f;
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        uint8_t L[QK];
        if (qw) {
            float w[QK];
            block_weights(x, qw + ib * QK, sigma2, w);
            y[ib].d = to_half(make_qx_quants(QK, 16, x, reinterpret_cast<int8_t *>(L), 1, w));
        } else {
            const float d = signed_absmax(x, QK) / -16;
            const float id = d ? 1.0f / d : 0.0f;
            y[ib].d = to_half(d);
            for (int j = 0; j < QK; ++j) L[j] = (uint8_t)std::min<int>(31, trunc_i8(x[j] * id + 16.5f));
        }
        pack5(L, y[ib].qs, y[ib].qh);
    }
}

void row_q5_1(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q5_1 *>(y8);
    const float sigma2 = qw ? row_sigma2(x, n) : 0.f;
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        uint8_t L[QK];
        if (qw) {
            float w[QK], mn;
            uint8_t Laux[QK];
            block_weights(x, qw + ib * QK, sigma2, w);
            const float d = make_qkx3_quants(QK, 31, x, w, L, &mn, Laux, -0.9f, 0.05f, 36, false);
            y[ib].d = to_half(d);
            y[ib].m = to_half(-mn);
        } else {
            float mn, mx;
            min_max(x, QK, &mn, &mx);
            const float d = (mx - mn) / 31;
            const float id = d ? 1.0f / d : 0.0f;
            y[ib].d = to_half(d);
            y[ib].m = to_half(mn);
            for (int j = 0; j < QK; ++j) L[j] = trunc_u8((x[j] - mn) * id + 0.5f);
        }
        pack5(L, y[ib].qs, y[ib].qh);
    }
}

void row_q8_0(const float *x, uint8_t *y8, int64_t n, const float *) {
    auto *y = reinterpret_cast<block_q8_0 *>(y8);
    for (int64_t ib = 0; ib < n / QK; ++ib, x += QK) {
        float amax = 0;
        for (int j = 0; j < QK; ++j) amax = cmax(amax, std::fabs(x[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[ib].d = to_half(d);
        for (int j = 0; j < QK; ++j) y[ib].qs[j] = (int8_t)round_away(x[j] * id);
    }
}

}  // namespace lowbit::quant
