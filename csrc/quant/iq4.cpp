// IQ4_NL (32-value blocks) and IQ4_XS (256-value super-blocks of 32): 4-bit indices into the
// non-linear table kvalues_iq4nl, as ggml_quantize_chunk makes them. Per 32-value block the
// scale is the best of 15 candidates (itry - 127 .. 7) / max by weighted least squares (weights
// x^2, or qw * sqrt(sigma2 + x^2) with an imatrix). IQ4_XS then stores each block's scale as
// a 6-bit multiple of one fp16 super-scale and re-picks the indices with the stored scale.
#include <algorithm>

#include "../formats.h"
#include "../ref/iq_tables.h"
#include "common.h"

namespace lowbit::quant {

namespace {

constexpr int kTries = 7;  // ggml_quantize_chunk's IQ4 searches try scales itry in [-7, 7]
const int8_t *const kValues = iq::kvalues_iq4nl;

// One super-block of sb values (32: IQ4_NL, 256: IQ4_XS) into d16, q4[sb/2] and, for
// IQ4_XS, the 6-bit block scales (scales_h: 2 high bits per block, scales_l: low nibbles).
void iq4_super_block(int sb, const float *x, const float *qw, uint16_t *d16, uint8_t *q4, uint16_t *scales_h,
                     uint8_t *scales_l) {
    constexpr int B = 32;
    float scales[QK_K / B], w[B];
    uint8_t L[QK_K];
    float sigma2 = 0;
    for (int j = 0; j < sb; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / (float)sb;
    std::memset(q4, 0, (size_t)sb / 2);
    *d16 = to_half(0.f);

    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < sb / B; ++ib) {
        const float *xb = x + ib * B;
        uint8_t *Lb = L + ib * B;
        if (qw) {
            for (int j = 0; j < B; ++j) w[j] = qw[ib * B + j] * std::sqrt(sigma2 + xb[j] * xb[j]);
        } else {
            for (int j = 0; j < B; ++j) w[j] = xb[j] * xb[j];
        }
        float amax = 0, max = 0;
        for (int j = 0; j < B; ++j) {
            const float ax = std::fabs(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        if (amax < kGroupMaxEps) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / (float)kValues[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < B; ++j) {
            const int l = best_index_int8(16, kValues, id * xb[j]);
            Lb[j] = (uint8_t)l;
            const float q = kValues[l];
            sumqx += w[j] * q * xb[j];
            sumq2 += w[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -kTries; itry <= kTries; ++itry) {
            id = (float)(itry + kValues[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < B; ++j) {
                const float q = kValues[best_index_int8(16, kValues, id * xb[j])];
                sumqx += w[j] * q * xb[j];
                sumq2 += w[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if (std::fabs(d) > amax_scale) { amax_scale = std::fabs(d); max_scale = d; }
    }

    if (sb / B > 1) {
        const int nb = sb / B;
        std::memset(scales_h, 0, ((nb + 7) / 8) * sizeof(uint16_t));
        const float d = -max_scale / 32;
        *d16 = to_half(d);
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < nb; ++ib) {
            int l = std::max(-32, std::min(31, nearest_int(id * scales[ib])));
            const float dl = d * (float)l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < B; ++j) L[ib * B + j] = (uint8_t)best_index_int8(16, kValues, idl * x[ib * B + j]);
            l += 32;
            const uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            scales_h[ib / 8] |= (uint16_t)(l_h << 2 * (ib % 8));
        }
    } else {
        *d16 = to_half(scales[0]);
        const float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < sb; ++j) L[j] = (uint8_t)best_index_int8(16, kValues, id * x[j]);
    }
    for (int i = 0; i < sb / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

}  // namespace

void row_iq4_nl(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_iq4_nl *>(y8);
    for (int64_t ib = 0; ib < n / QK; ++ib)
        iq4_super_block(QK, x + QK * ib, qw ? qw + QK * ib : nullptr, &y[ib].d, y[ib].qs, nullptr, nullptr);
}

void row_iq4_xs(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_iq4_xs *>(y8);
    for (int64_t ib = 0; ib < n / QK_K; ++ib)
        iq4_super_block(QK_K, x + QK_K * ib, qw ? qw + QK_K * ib : nullptr, &y[ib].d, y[ib].qs, &y[ib].scales_h,
                        y[ib].scales_l);
}

}  // namespace lowbit::quant
