// k-quants (256-value super-blocks of 16- or 32-value sub-blocks), as ggml_quantize_chunk
// makes them. Each super-block: per sub-block a scale (and a min) from a search
// (common.h), the sub-block scales themselves quantized against one fp16 super-scale, then
// every value re-rounded with the stored (decoded) scales, so the codes match what a reader
// will decode. With importance weights qw the searches are weighted by
// qw * sqrt(sigma2 + x^2) and the sub-block scales by their sub-block's total weight.
#include <algorithm>

#include "../formats.h"
#include "common.h"

namespace lowbit::quant {

namespace {

inline int clamp_i(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

inline float sum_sq(const float *x, int n) {
    float s = 0;
    for (int j = 0; j < n; ++j) s += x[j] * x[j];
    return s;
}

// 2-bit codes L[256] into qs[64]: byte l of each 128-value half holds values l, l+32, l+64,
// l+96 in bits 0-1, 2-3, 4-5, 6-7 (Q2_K and Q3_K's low bits).
inline void pack2(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

// Q4_K / Q5_K's 6-bit scale ls and min lm of sub-block j into scales[12]: j < 4 directly in
// bytes j and j+4; j >= 4 as nibbles in byte j+4 with the top 2 bits in bytes j-4 and j.
inline void put_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t *s) {
    if (j < 4) {
        s[j] = ls;
        s[j + 4] = lm;
    } else {
        s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] |= (uint8_t)((ls >> 4) << 6);
        s[j] |= (uint8_t)((lm >> 4) << 6);
    }
}
inline void get_scale_min_k4(int j, const uint8_t *s, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *d = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// Q3_K's 6-bit signed sub-block scale l + 32 of sub-block j into scales[12] (low nibbles in
// bytes 0..7, the top 2 bits in bytes 8..11), and back.
inline void put_scale_q3k(int j, int l, uint8_t *s) {
    if (j < 8) s[j] = (uint8_t)(l & 0xF);
    else s[j - 8] |= (uint8_t)((l & 0xF) << 4);
    l >>= 4;
    s[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
}
inline int8_t get_scale_q3k(int j, const uint8_t *s) {
    int8_t sc = (int8_t)(j < 8 ? s[j] & 0xF : s[j - 8] >> 4);
    return (int8_t)((sc | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
}

// Codes of a min-scale super-block (Q4_K / Q5_K) re-rounded with the stored scales.
template <int kMax>
inline void requant_min_k4(const float *x, const uint8_t *scales, uint16_t d16, uint16_t dmin16, uint8_t *L) {
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, scales, &sc, &m);
        const float d = from_half(d16) * (float)sc;
        if (!d) continue;
        const float dm = from_half(dmin16) * (float)m;
        for (int ii = 0; ii < 32; ++ii) L[32 * j + ii] = (uint8_t)clamp_i(nearest_int((x[32 * j + ii] + dm) / d), 0, kMax);
    }
}

// Q3_K's codes re-rounded with the stored scales, then packed (high bits in hmask: value j's
// bit in byte j % 32, bit j / 32).
inline void finish_q3k(const float *x, block_q3_K *y, int8_t *L) {
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = from_half(y->d) * (float)get_scale_q3k(j, y->scales);
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = (int8_t)(clamp_i(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
    }
    std::memset(y->hmask, 0, sizeof y->hmask);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < QK_K; ++j) {
        if (L[j] > 3) {
            y->hmask[m] |= hm;
            L[j] -= 4;
        }
        if (++m == QK_K / 8) { m = 0; hm <<= 1; }
    }
    pack2(reinterpret_cast<const uint8_t *>(L), y->qs);
}

// Q5_K's codes: low nibbles in qs (as Q4_K), the 5th bits in qh (value n+j of 64-value
// group g: bit 2g of qh[j]; value n+j+32: bit 2g+1).
inline void pack_q5k(const uint8_t *L, block_q5_K *y) {
    std::memset(y->qh, 0, sizeof y->qh);
    uint8_t *ql = y->qs;
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) { l1 -= 16; y->qh[j] |= m1; }
            if (l2 > 15) { l2 -= 16; y->qh[j] |= m2; }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 <<= 2; m2 <<= 2;
        ql += 32;
    }
}

inline void pack_q4k(const uint8_t *L, block_q4_K *y) {
    uint8_t *q = y->qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

// The sub-block scales and mins of Q4_K / Q5_K without importance weights: quantized to 6
// bits against their maxima.
inline void put_scales_min_k4_ref(const float *scales, const float *mins, block_q4_K *y4, block_q5_K *y5) {
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t *s = y4 ? y4->scales : y5->scales;
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        ls = std::min<uint8_t>(63, ls);
        lm = std::min<uint8_t>(63, lm);
        put_scale_min_k4(j, ls, lm, s);
    }
    const uint16_t d = to_half(max_scale / 63.f), dmin = to_half(max_min / 63.f);
    if (y4) { y4->d = d; y4->dmin = dmin; } else { y5->d = d; y5->dmin = dmin; }
}

}  // namespace

// ---- Q2_K: 16 sub-blocks of 16, 2-bit codes, 4-bit scale and min per sub-block ----------
void row_q2_k(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q2_K *>(y8);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K], Laux[16];
        float mins[QK_K / 16], scales[QK_K / 16], w[16];
        if (!qw) {
            float max_scale = 0, max_min = 0;
            for (int j = 0; j < QK_K / 16; ++j) {
                for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
                scales[j] = make_qkx2_quants(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
                if (scales[j] > max_scale) max_scale = scales[j];
                if (mins[j] > max_min) max_min = mins[j];
            }
            if (max_scale > 0) {
                const float iscale = 15.f / max_scale;
                for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
                y[i].d = to_half(max_scale / 15.f);
            } else {
                std::memset(y[i].scales, 0, sizeof y[i].scales);
                y[i].d = to_half(0.f);
            }
            if (max_min > 0) {
                const float iscale = 15.f / max_min;
                for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
                y[i].dmin = to_half(max_min / 15.f);
            } else {
                y[i].dmin = to_half(0.f);
            }
        } else {
            float sw[QK_K / 16] = {0};
            uint8_t Ls[QK_K / 16], Lm[QK_K / 16];
            const float sigma2 = sum_sq(x, QK_K) / QK_K;
            for (int j = 0; j < QK_K / 16; ++j) {
                const float *q = qw + QK_K * i + 16 * j;
                for (int l = 0; l < 16; ++l) w[l] = q[l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
                for (int l = 0; l < QK_K / 16; ++l) sw[j] += w[l];
                scales[j] = make_qkx3_quants(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
            }
            const float dm = make_qp_quants(QK_K / 16, 15, scales, Ls, sw);
            const float mm = make_qp_quants(QK_K / 16, 15, mins, Lm, sw);
            y[i].d = to_half(dm);
            y[i].dmin = to_half(mm);
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
        }
        const float dd = from_half(y[i].d), dmin = from_half(y[i].dmin);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = dd * (float)(y[i].scales[j] & 0xF);
            if (!d) continue;
            const float m = dmin * (float)(y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = (uint8_t)clamp_i(nearest_int((x[16 * j + ii] + m) / d), 0, 3);
        }
        pack2(L, y[i].qs);
    }
}

// ---- Q3_K: 16 sub-blocks of 16, 3-bit codes, 6-bit signed scales --------------------------
void row_q3_k(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q3_K *>(y8);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        std::memset(y[i].scales, 0, 12);
        if (!qw) {
            float max_scale = 0, amax = 0;
            for (int j = 0; j < QK_K / 16; ++j) {
                scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
                const float a = std::fabs(scales[j]);
                if (a > amax) { amax = a; max_scale = scales[j]; }
            }
            if (max_scale) {
                const float iscale = -32.f / max_scale;
                for (int j = 0; j < QK_K / 16; ++j) {
                    int8_t l = (int8_t)nearest_int(iscale * scales[j]);
                    l = (int8_t)(clamp_i(l, -32, 31) + 32);
                    put_scale_q3k(j, l, y[i].scales);
                }
                y[i].d = to_half(1 / iscale);
            } else {
                y[i].d = to_half(0.f);
            }
        } else {
            float w[16], sw[QK_K / 16];
            int8_t Ls[QK_K / 16];
            const float sigma2 = 2 * sum_sq(x, QK_K) / QK_K;
            for (int j = 0; j < QK_K / 16; ++j) {
                const float *q = qw + QK_K * i + 16 * j;
                for (int l = 0; l < 16; ++l) w[l] = q[l] * std::sqrt(sigma2 + x[16 * j + l] * x[16 * j + l]);
                float sumw = 0;
                for (int l = 0; l < 16; ++l) sumw += w[l];
                sw[j] = sumw;
                scales[j] = make_qx_quants(16, 4, x + 16 * j, L + 16 * j, 1, w);
            }
            const float d_block = make_qx_quants(QK_K / 16, 32, scales, Ls, 1, sw);
            for (int j = 0; j < QK_K / 16; ++j) put_scale_q3k(j, Ls[j], y[i].scales);
            y[i].d = to_half(d_block);
        }
        finish_q3k(x, &y[i], L);
    }
}

// ---- Q4_K / Q5_K: 8 sub-blocks of 32, 4/5-bit codes, 6-bit scale and min ------------------
// Weights of sub-block j: qw * sqrt(sigma2 + x^2) with an imatrix, else av_x + |x|.
template <int kMax>
static void sub_block_search(const float *x, const float *qw, int64_t i, float *scales, float *mins, float *sw,
                             uint8_t *L) {
    uint8_t Laux[32];
    float w[32];
    const float sigma2 = 2 * sum_sq(x, QK_K) / QK_K;
    const float av_x = std::sqrt(sigma2);
    for (int j = 0; j < QK_K / 32; ++j) {
        if (qw) {
            const float *q = qw + QK_K * i + 32 * j;
            for (int l = 0; l < 32; ++l) w[l] = q[l] * std::sqrt(sigma2 + x[32 * j + l] * x[32 * j + l]);
        } else {
            for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
        }
        float sumw = 0;
        for (int l = 0; l < 32; ++l) sumw += w[l];
        sw[j] = sumw;
        scales[j] = make_qkx3_quants(32, kMax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, false);
    }
}

// The reference (no imatrix) search of Q4_K / Q5_K: per sub-block weights av_x + |x| with
// av_x the sub-block's rms.
static void sub_block_search_ref(const float *x, int nmax, float rmin, int nstep, float *scales, float *mins,
                                 uint8_t *L) {
    uint8_t Laux[32];
    float w[32];
    for (int j = 0; j < QK_K / 32; ++j) {
        const float av_x = std::sqrt(sum_sq(x + 32 * j, 32) / 32);
        for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    }
}

void row_q4_k(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q4_K *>(y8);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K];
        float scales[QK_K / 32], mins[QK_K / 32];
        if (!qw) {
            sub_block_search_ref(x, 15, -1.f, 20, scales, mins, L);
            put_scales_min_k4_ref(scales, mins, &y[i], nullptr);
        } else {
            float sw[QK_K / 32];
            uint8_t Ls[QK_K / 32], Lm[QK_K / 32];
            sub_block_search<15>(x, qw, i, scales, mins, sw, L);
            const float d_block = make_qp_quants(QK_K / 32, 63, scales, Ls, sw);
            const float m_block = make_qp_quants(QK_K / 32, 63, mins, Lm, sw);
            for (int j = 0; j < QK_K / 32; ++j) put_scale_min_k4(j, Ls[j], Lm[j], y[i].scales);
            y[i].d = to_half(d_block);
            y[i].dmin = to_half(m_block);
        }
        requant_min_k4<15>(x, y[i].scales, y[i].d, y[i].dmin, L);
        pack_q4k(L, &y[i]);
    }
}

void row_q5_k(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q5_K *>(y8);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K];
        float scales[QK_K / 32], mins[QK_K / 32];
        if (!qw) {
            sub_block_search_ref(x, 31, -0.5f, 15, scales, mins, L);
            put_scales_min_k4_ref(scales, mins, nullptr, &y[i]);
        } else {
            float sw[QK_K / 32];
            uint8_t Ls[QK_K / 32], Lm[QK_K / 32];
            sub_block_search<31>(x, qw, i, scales, mins, sw, L);
            const float d_block = make_qp_quants(QK_K / 32, 63, scales, Ls, sw);
            const float m_block = make_qp_quants(QK_K / 32, 63, mins, Lm, sw);
            for (int j = 0; j < QK_K / 32; ++j)
                put_scale_min_k4(j, std::min<uint8_t>(63, Ls[j]), std::min<uint8_t>(63, Lm[j]), y[i].scales);
            y[i].d = to_half(d_block);
            y[i].dmin = to_half(m_block);
        }
        requant_min_k4<31>(x, y[i].scales, y[i].d, y[i].dmin, L);
        pack_q5k(L, &y[i]);
    }
}

// ---- Q6_K: 16 sub-blocks of 16, 6-bit codes, int8 scales ----------------------------------
void row_q6_k(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    auto *y = reinterpret_cast<block_q6_K *>(y8);
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            // with an imatrix the raw importance weights (not the sigma2-scaled ones) weigh the search
            const float *q = qw ? qw + QK_K * i + 16 * ib : nullptr;
            scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1, q);
            const float a = std::fabs(scales[ib]);
            if (a > max_abs_scale) { max_abs_scale = a; max_scale = scales[ib]; }
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y[i], 0, sizeof(block_q6_K));
            y[i].d = to_half(0.f);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = to_half(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib) y[i].scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = from_half(y[i].d) * (float)y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) L[16 * j + ii] = (int8_t)(clamp_i(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
                const uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

}  // namespace lowbit::quant
