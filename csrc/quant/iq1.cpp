// IQ1_S and IQ1_M: ternary grid i-quants, as ggml_quantize_chunk makes them (ggml-quants.c:
// quantize_row_iq1_s_impl, quantize_row_iq1_m_impl).
//
// Each value is one of three levels v = (-1, 0, +1) + delta with delta = +-1/8 per block
// (IQ1_S, blocks of 32) or per half block (IQ1_M, blocks of 16, the two halves' deltas
// chosen independently), and each group of 8 levels is a point of the 2048-point IQ1 grid.
// The best split of a block's values into the three levels is found exhaustively: the values
// are sorted (by libc's qsort, as ggml sorts them: the order of equal values is then the same
// as ggml's), prefix sums of weight*x and weight give every split's least-squares fit, the
// best fit over both deltas wins. A group whose levels are not a grid point takes its nearest
// neighbour in the weighted distance and the block's scale is refitted. IQ1_S stores a 3-bit
// scale per block under an fp16 super-scale (times 1.125); IQ1_M 3-bit scales with the fp16
// super-scale spread over the scales' top nibbles, refitted over the whole super-block.
// Weights: imatrix qw * sqrt(sigma2 + x^2) with sigma2 = 2 * mean x^2 (IQ1_S needs one), or
// x^2 (IQ1_M without one).
#include <cfloat>
#include <cstdlib>
#include <algorithm>
#include <cstring>

#include "../formats.h"
#include "../ref/iq_tables.h"
#include "iq_grid_search.h"

namespace lowbit::quant {

namespace {

constexpr float kEpsIq1s = 1e-12f;  // GROUP_MAX_EPS_IQ1_S
constexpr float kEpsIq1m = 1e-7f;   // GROUP_MAX_EPS_IQ1_M

// A value and its position, sorted by value: the layout ggml sorts (a float, then an int).
struct Pair {
    float x;
    int i;
};
static_assert(sizeof(Pair) == 2 * sizeof(float), "ggml sorts pairs of 2 floats");

int by_value(const void *a, const void *b) {
    const float l = static_cast<const Pair *>(a)->x, r = static_cast<const Pair *>(b)->x;
    return l < r ? -1 : l > r ? 1 : 0;
}

// order[bs]: the block's values sorted ascending, by libc's qsort as ggml does.
void sort_values(const float *xb, int bs, Pair *order) {
    for (int j = 0; j < bs; ++j) order[j] = Pair{xb[j], j};
    std::qsort(order, (size_t)bs, sizeof(Pair), by_value);
}

// The grid point nearest to scale * xx[level] ~ x[8] in sum(w * diff^2) among the neighbours
// of an off-grid key (ggml's iq1_find_best_neighbour2); its levels go to L. Where no distance
// is below FLT_MAX ggml scans the whole grid reading past its 8 values (undefined behaviour):
// only non-finite or overflowing inputs get there, and lowbit refuses them.
int nearest_iq1_point(const GridIndex &g, uint32_t key, const float *x, const float *w, float scale,
                      const float *xx, int8_t *L) {
    const uint16_t *nb = g.near(key);
    const int count = nb[0];
    float best_d2 = FLT_MAX;
    int best = -1;
    int j = 1;
    // four neighbours' distances side by side (independent chains, each in ggml's order)
    for (; j + 3 <= count; j += 4) {
        const int8_t *p0 = g.point(nb[j]), *p1 = g.point(nb[j + 1]), *p2 = g.point(nb[j + 2]), *p3 = g.point(nb[j + 3]);
        float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        for (int i = 0; i < 8; ++i) {
            const float e0 = scale * xx[p0[i]] - x[i], e1 = scale * xx[p1[i]] - x[i];
            const float e2 = scale * xx[p2[i]] - x[i], e3 = scale * xx[p3[i]] - x[i];
            d0 += w[i] * e0 * e0;
            d1 += w[i] * e1 * e1;
            d2 += w[i] * e2 * e2;
            d3 += w[i] * e3 * e3;
        }
        const float d[4] = {d0, d1, d2, d3};
        for (int t = 0; t < 4; ++t) {
            if (d[t] < best_d2) {
                best_d2 = d[t];
                best = nb[j + t];
            }
        }
    }
    for (; j <= count; ++j) {
        const int8_t *pl = g.point(nb[j]);
        float d2 = 0;
        for (int i = 0; i < 8; ++i) {
            const float diff = scale * xx[pl[i]] - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) {
            best_d2 = d2;
            best = nb[j];
        }
    }
    if (best < 0) throw std::domain_error("no grid point at a finite distance (values too large or not finite)");
    std::memcpy(L, g.point(best), 8);
    return best;
}

inline uint32_t key_of(const int8_t *L) {
    uint32_t key = 0;
    for (int j = 0; j < 8; ++j) key |= (uint32_t)L[j] << 2 * j;
    return key;
}

void iq1_weights(int bs, const float *xb, const float *qw, float sigma2, float *weight) {
    if (qw) {
        for (int i = 0; i < bs; ++i) weight[i] = qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]);
    } else {
        for (int i = 0; i < bs; ++i) weight[i] = xb[i] * xb[i];
    }
}

float abs_max(const float *xb, int bs) {
    float max = std::fabs(xb[0]);
    for (int i = 1; i < bs; ++i) max = cmax(max, std::fabs(xb[i]));
    return max;
}

float mean_sq2(const float *xbl) {
    float sumx2 = 0;
    for (int i = 0; i < QK_K; ++i) sumx2 += xbl[i] * xbl[i];
    return 2 * sumx2 / QK_K;
}

}  // namespace

// IQ1_S: 8 blocks of 32; qs the low 8 bits of the 11-bit grid indices, qh per block: the
// 4 x 3 high index bits | 3-bit scale << 12 | (delta negative) << 15.
void row_iq1_s(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    constexpr int bs = 32;
    const GridIndex &grid = grid_index(T_IQ1_S);
    auto *y = reinterpret_cast<block_iq1_s *>(y8);
    const float x_p[3] = {-1 + iq::iq1s_delta, iq::iq1s_delta, 1 + iq::iq1s_delta};
    const float x_m[3] = {-1 - iq::iq1s_delta, -iq::iq1s_delta, 1 - iq::iq1s_delta};
    float scales[QK_K / bs], weight[bs], sumx[bs + 1], sumw[bs + 1];
    int8_t L[bs], shifts[QK_K / bs];
    uint16_t index[bs / 8];
    Pair order[bs];
    for (int64_t ibl = 0; ibl < n / QK_K; ++ibl) {
        const float *xbl = x + QK_K * ibl;
        y[ibl].d = to_half(0.f);
        std::memset(y[ibl].qs, 0, sizeof(y[ibl].qs));
        std::memset(y[ibl].qh, 0, sizeof(y[ibl].qh));
        float max_scale = 0;
        const float sigma2 = mean_sq2(xbl);
        for (int ib = 0; ib < QK_K / bs; ++ib) {
            const float *xb = xbl + bs * ib;
            iq1_weights(bs, xb, qw + QK_K * ibl + bs * ib, sigma2, weight);
            const float max = abs_max(xb, bs);
            if (max < kEpsIq1s) {
                scales[ib] = 0;
                shifts[ib] = 1;
                continue;
            }
            sort_values(xb, bs, order);
            sumx[0] = sumw[0] = 0;
            for (int j = 0; j < bs; ++j) {
                const int i = order[j].i;
                sumx[j + 1] = sumx[j] + weight[i] * xb[i];
                sumw[j + 1] = sumw[j] + weight[i];
            }
            // values [0, i1) on level 0, [i1, i2) on 1, [i2, bs) on 2; delta +1/8 (shift 1) or -1/8
            float best_score = -FLT_MAX, scale = max;
            int besti1 = -1, besti2 = -1, best_shift = 0;
            for (int i1 = 0; i1 <= bs; ++i1) {
                for (int i2 = i1; i2 <= bs; ++i2) {
                    for (int shift : {1, -1}) {
                        const float *v = shift == 1 ? x_p : x_m;
                        const float sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] +
                                            (sumx[bs] - sumx[i2]) * v[2];
                        const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] + (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                            (sumw[bs] - sumw[i2]) * v[2] * v[2];
                        if (sumq2 > 0 && sumqx * sumqx > best_score * sumq2) {
                            scale = sumqx / sumq2;
                            best_score = scale * sumqx;
                            besti1 = i1;
                            besti2 = i2;
                            best_shift = shift;
                        }
                    }
                }
            }
            if (besti1 < 0 || besti2 < 0 || best_shift == 0) {
                scales[ib] = 0;
                shifts[ib] = 1;
                continue;
            }
            for (int j = 0; j < bs; ++j) L[order[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
            if (scale < 0) {
                for (int j = 0; j < bs; ++j) L[j] = (int8_t)(2 - L[j]);
                scale = -scale;
                best_shift = -best_shift;
            }
            const float *xx = best_shift == 1 ? x_p : x_m;
            bool all_on_grid = true;
            for (int k = 0; k < bs / 8; ++k) {
                const uint32_t key = key_of(L + 8 * k);
                int gi = grid.map[key];
                if (gi < 0) {
                    all_on_grid = false;
                    gi = nearest_iq1_point(grid, key, xb + 8 * k, weight + 8 * k, scale, xx, L + 8 * k);
                }
                index[k] = (uint16_t)gi;
            }
            if (!all_on_grid) {
                float sumqx = 0, sumq2 = 0;
                for (int k = 0; k < bs / 8; ++k) {
                    const int8_t *pl = grid.point(index[k]);
                    for (int j = 0; j < 8; ++j) {
                        const float w = weight[8 * k + j];
                        const float q = xx[pl[j]];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
            }
            uint16_t h = 0;
            for (int k = 0; k < bs / 8; ++k) {
                y[ibl].qs[(bs / 8) * ib + k] = (uint8_t)(index[k] & 255);
                h |= (uint16_t)((index[k] >> 8) << 3 * k);
            }
            y[ibl].qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = (int8_t)best_shift;
            max_scale = cmax(max_scale, scale);
        }
        if (!max_scale) continue;
        const float d = max_scale / 15;
        y[ibl].d = to_half(d * 1.125f);
        const float id = 1 / d;
        for (int ib = 0; ib < QK_K / bs; ++ib) {
            int l = std::max(0, std::min(7, nearest_int(0.5f * (id * scales[ib] - 1))));
            if (shifts[ib] == -1) l |= 8;
            y[ibl].qh[ib] |= (uint16_t)(l << 12);
        }
    }
}

// IQ1_M: 16 blocks of 16; qs the low 8 bits of the grid indices, qh per block: 3 high index
// bits of each half | its delta bit (0x08, 0x80); scales: 3 bits per block, the fp16
// super-scale in the top nibble of each of the 4 uint16.
void row_iq1_m(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    constexpr int bs = 16;
    const GridIndex &grid = grid_index(T_IQ1_M);
    auto *y = reinterpret_cast<block_iq1_m *>(y8);
    const float x_p[3] = {-1 + iq::iq1m_delta, iq::iq1m_delta, 1 + iq::iq1m_delta};
    const float x_m[3] = {-1 - iq::iq1m_delta, -iq::iq1m_delta, 1 - iq::iq1m_delta};
    const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    float scales[QK_K / bs], weight[bs];
    int8_t L[bs], shifts[QK_K / bs];
    uint16_t index[bs / 8];
    Pair order[bs];
    // the delta table of half k (0 or 1) of a block whose deltas are `k4`:
    // 0: +,+  1: +,-  2: -,+  3: -,- (first half, second half)
    auto deltas = [&](int k4, int k) -> const float * {
        return k == 0 ? (k4 < 2 ? x_p : x_m) : (k4 % 2 == 0 ? x_p : x_m);
    };
    for (int64_t ibl = 0; ibl < n / QK_K; ++ibl) {
        const float *xbl = x + QK_K * ibl;
        std::memset(y[ibl].qs, 0, sizeof(y[ibl].qs));
        std::memset(y[ibl].qh, 0, sizeof(y[ibl].qh));
        std::memset(y[ibl].scales, 0, sizeof(y[ibl].scales));
        float max_scale = 0;
        const float sigma2 = mean_sq2(xbl);
        for (int ib = 0; ib < QK_K / bs; ++ib) {
            const float *xb = xbl + bs * ib;
            iq1_weights(bs, xb, qw ? qw + QK_K * ibl + bs * ib : nullptr, sigma2, weight);
            const float max = abs_max(xb, bs);
            if (max < kEpsIq1m) {
                scales[ib] = 0;
                shifts[ib] = 0;
                continue;
            }
            sort_values(xb, bs, order);
            // prefix sums per half (each half has its own delta): px[h][j] = sum of weight*x over
            // the first j sorted values that lie in half h; pw likewise of the weights
            float px[2][bs + 1], pw[2][bs + 1];
            px[0][0] = px[1][0] = 0;
            pw[0][0] = pw[1][0] = 0;
            for (int j = 0; j < bs; ++j) {
                const int i = order[j].i;
                const int h = i < bs / 2 ? 0 : 1;
                px[h][j + 1] = px[h][j] + weight[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + weight[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            // levels step by -1 from v[2] down: a split's sum(w x v) = T v[2] - px[i1] - px[i2]
            const float txs[2] = {px[0][bs], px[1][bs]}, tws[2] = {pw[0][bs], pw[1][bs]};
            const float p2 = x_p[2], m2 = x_m[2];
            const float cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1], cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
            const float cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1], cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
            float best_score = -FLT_MAX, scale = max;
            int besti1 = -1, besti2 = -1, best_k = -1;
            for (int i1 = 0; i1 <= bs; ++i1) {
                for (int i2 = i1; i2 <= bs; ++i2) {
                    float qx_p[2], qx_m[2], q2_p[2], q2_m[2];
                    for (int h = 0; h < 2; ++h) {
                        const float sx = px[h][i1] + px[h][i2];
                        qx_p[h] = txs[h] * p2 - sx;
                        qx_m[h] = txs[h] * m2 - sx;
                        q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                        q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                    }
                    const float sumqx[4] = {qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1], qx_m[0] + qx_m[1]};
                    const float sumq2[4] = {q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1], q2_m[0] + q2_m[1]};
                    for (int k = 0; k < 4; ++k) {
                        if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best_score * sumq2[k]) {
                            scale = sumqx[k] / sumq2[k];
                            best_score = scale * sumqx[k];
                            besti1 = i1;
                            besti2 = i2;
                            best_k = k;
                        }
                    }
                }
            }
            if (besti1 < 0 || besti2 < 0 || best_k < 0) {
                scales[ib] = 0;
                shifts[ib] = 0;
                continue;
            }
            for (int j = 0; j < bs; ++j) L[order[j].i] = (int8_t)(j < besti1 ? 0 : j < besti2 ? 1 : 2);
            if (scale < 0) {
                for (int j = 0; j < bs; ++j) L[j] = (int8_t)(2 - L[j]);
                scale = -scale;
                best_k = 3 - best_k;  // both halves' deltas flip
            }
            bool all_on_grid = true;
            for (int k = 0; k < bs / 8; ++k) {
                const uint32_t key = key_of(L + 8 * k);
                int gi = grid.map[key];
                if (gi < 0) {
                    all_on_grid = false;
                    gi = nearest_iq1_point(grid, key, xb + 8 * k, weight + 8 * k, scale, deltas(best_k, k), L + 8 * k);
                }
                index[k] = (uint16_t)gi;
            }
            if (!all_on_grid) {
                float sumqx = 0, sumq2 = 0;
                for (int k = 0; k < bs / 8; ++k) {
                    const float *xx = deltas(best_k, k);
                    const int8_t *pl = grid.point(index[k]);
                    for (int j = 0; j < 8; ++j) {
                        const float w = weight[8 * k + j];
                        const float q = xx[pl[j]];
                        sumqx += w * q * xb[8 * k + j];
                        sumq2 += w * q * q;
                    }
                }
                if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
            }
            y[ibl].qs[2 * ib + 0] = (uint8_t)(index[0] & 255);
            y[ibl].qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
            y[ibl].qh[ib] = (uint8_t)((index[0] >> 8) | ((index[1] >> 8) << 4));
            scales[ib] = scale;
            shifts[ib] = (int8_t)best_k;
            max_scale = cmax(max_scale, scale);
        }
        if (!max_scale) continue;

        // the 3-bit block scales under d = max/15, then d refitted over the super-block
        uint16_t sc[4] = {0, 0, 0, 0};
        float d = max_scale / 15;
        const float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int ib = 0; ib < QK_K / bs; ++ib) {
            const int l = std::max(0, std::min(7, nearest_int(0.5f * (id * scales[ib] - 1))));
            sc[ib / 4] |= (uint16_t)(l << 3 * (ib % 4));
            y[ibl].qh[ib] |= masks[shifts[ib]];
            const float *xb = xbl + bs * ib;
            iq1_weights(bs, xb, qw ? qw + QK_K * ibl + bs * ib : nullptr, sigma2, weight);
            for (int k = 0; k < bs / 8; ++k) {
                const float *xx = deltas(shifts[ib], k);
                const int gi = y[ibl].qs[2 * ib + k] + ((y[ibl].qh[ib] << (8 - 4 * k)) & 0x700);
                const int8_t *pl = grid.point(gi);
                for (int j = 0; j < 8; ++j) {
                    const float w = weight[8 * k + j];
                    const float q = xx[pl[j]] * (float)(2 * l + 1);
                    sumqx += w * q * xb[8 * k + j];
                    sumq2 += w * q * q;
                }
            }
        }
        if (sumq2 > 0) d = sumqx / sumq2;
        const uint16_t h = to_half(d * 1.1125f);
        sc[0] |= (uint16_t)((h & 0x000f) << 12);
        sc[1] |= (uint16_t)((h & 0x00f0) << 8);
        sc[2] |= (uint16_t)((h & 0x0f00) << 4);
        sc[3] |= (uint16_t)(h & 0xf000);
        std::memcpy(y[ibl].scales, sc, sizeof(sc));
    }
}

}  // namespace lowbit::quant
