// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: the grid i-quants, as ggml_quantize_chunk makes
// them (ggml-quants.c: quantize_row_iq2_xxs_impl, _iq2_xs_impl, _iq2_s_impl, _iq3_xxs_impl,
// quantize_row_iq3_s_impl).
//
// A super-block of 256 values is cut into blocks of bs (16 or 32). In a block the signs are
// split off (xval = |x|: IQ2_XXS, IQ2_XS and IQ3_XXS store 7 sign bits per 8 values, the 8th
// making the count of negatives even, so where it is odd the value cheapest to flip, smallest
// weight * x^2, is flipped), and xval ~ scale * (2*level + 1) with each group of g values
// (8 for IQ2, 4 for IQ3) one point of the format's grid (iq_grid.h). The scale is searched over
// a fan of candidates (kmax*2-1 + is*step) / max: for each, the levels are rounded, a group
// that is not a grid point takes its nearest grid point (weighted by sqrt(weight)), and the
// candidate with the best weighted least-squares fit sum(w x q)^2 / sum(w q^2) wins. Groups
// left off the grid are then re-rounded with the winning scale and the scale is refitted.
// The block scales are stored as 4-bit multiples of one fp16 super-scale (max scale / 31,
// times a per-format fudge factor ggml applies).
//
// Weights: imatrix qw * sqrt(sigma2 + x^2) (sigma2 = 2 * mean x^2 over the super-block, or
// 1 * mean for IQ2_XXS / IQ2_XS, which need an imatrix); without one x^2 (IQ3) or
// sigma2/4 + x^2 (IQ2_S). Every float expression follows ggml's order (common.h).
#include <algorithm>
#include <cstring>

#include "../formats.h"
#include "iq_grid_search.h"

namespace lowbit::quant {

namespace {

// How a format runs the shared block search.
struct Search {
    int id;          // format (its grid)
    int bs;          // values per block: 16 or 32
    int kmax;        // levels 0 .. kmax-1 (IQ2: 3, IQ3: 8)
    int half_range;  // candidate scales is = -half_range .. half_range
    float step;      // (2*kmax - 1 + is*step) / max
    bool even_signs; // 7 stored sign bits per 8 values (the count of negatives made even)
    // After the fan: which groups are re-rounded with the winning scale.
    //   kOffGrid: the winner's off-grid groups, if there are any (IQ2_XS, IQ2_S, IQ3_XXS);
    //   kAllIfOffGrid: all groups, if any is off the grid (IQ3_S, whose groups start "off");
    //   kAll: all groups whenever scale > 0 (IQ2_XXS, which does not track them).
    enum Refit { kOffGrid, kAllIfOffGrid, kAll } refit;
};

// xval[bs] = |x| (after the parity flip), weight[bs], waux = sqrt(weight). Finds the block's
// levels L[bs] (each group a grid point) and returns its scale (>= 0 after a sign flip of
// signs[bs/8], which the caller stores). scale0 / max: the fan's start and divisor.
// BS (= s.bs) and G (= grid.group) are template parameters: the loops over a block and a
// group unroll.
template <int BS, int G>
float search_block(const Search &s, const GridIndex &grid, const float *xval, const float *weight,
                   const float *waux, float scale0, float max, int8_t *L, uint8_t *signs) {
    constexpr int g = G, ng = BS / G, bits = G == 8 ? 2 : 3;  // (= grid.bits)
    int8_t Laux[BS];
    bool on_grid[8], on_grid_aux[8];
    float scale = scale0, best = 0;
    for (int k = 0; k < ng; ++k) on_grid[k] = s.refit != Search::kAllIfOffGrid;
    for (int is = -s.half_range; is <= s.half_range; ++is) {
        const float id = (2 * s.kmax - 1 + is * s.step) / max;
        const float this_scale = 1 / id;
        for (int k = 0; k < ng; ++k) {
            uint32_t key = 0;
            for (int i = 0; i < g; ++i) {
                const int l = nearest_int(0.5f * (id * xval[g * k + i] - 1));
                Laux[g * k + i] = (int8_t)std::max(0, std::min(s.kmax - 1, l));
                key |= (uint32_t)Laux[g * k + i] << (bits * i);
            }
            on_grid_aux[k] = grid.map[key] >= 0;
            if (!on_grid_aux[k])
                nearest_grid_point<G>(grid, key, xval + g * k, waux + g * k, this_scale, Laux + g * k);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < BS; ++i) {
            const float w = weight[i];
            const float q = (float)(2 * Laux[i] + 1);
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            std::memcpy(L, Laux, (size_t)BS);
            for (int k = 0; k < ng; ++k) on_grid[k] = on_grid_aux[k];
        }
    }
    int off = 0;
    for (int k = 0; k < ng; ++k) off += !on_grid[k];
    if ((s.refit == Search::kAll || off > 0) && scale > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < ng; ++k) {
            if (s.refit == Search::kOffGrid && on_grid[k]) continue;
            uint32_t key = 0;
            for (int i = 0; i < g; ++i) {
                const int l = std::max(0, std::min(s.kmax - 1, nearest_int(0.5f * (id * xval[g * k + i] - 1))));
                L[g * k + i] = (int8_t)l;
                key |= (uint32_t)l << (bits * i);
            }
            if (grid.map[key] < 0) nearest_grid_point<G>(grid, key, xval + g * k, waux + g * k, scale, L + g * k);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < BS; ++i) {
            const float w = weight[i];
            const float q = (float)(2 * L[i] + 1);
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {  // (ggml: "should never happen") the stored scale is unsigned: flip the signs
        scale = -scale;
        for (int k = 0; k < BS / 8; ++k) signs[k] = (uint8_t)(s.even_signs ? ~signs[k] & 127 : ~signs[k]);
    }
    return scale;
}

// Split off the signs of a block: xval = |x|, signs[bs/8] one bit per value (bit i: value
// 8k+i was negative). With even_signs, a group of 8 with an odd count of negatives gets its
// cheapest value (smallest weight * x^2, the first of equals) flipped back, and bit 7 dropped.
void split_signs(int bs, bool even_signs, const float *xb, const float *weight, float *xval, uint8_t *signs) {
    for (int k = 0; k < bs / 8; ++k) {
        int nflip = 0;
        uint8_t sk = 0;
        for (int i = 0; i < 8; ++i) {
            if (xb[8 * k + i] >= 0) {
                xval[8 * k + i] = xb[8 * k + i];
            } else {
                xval[8 * k + i] = -xb[8 * k + i];
                ++nflip;
                sk |= (uint8_t)(1 << i);
            }
        }
        if (even_signs && nflip % 2) {
            int imin = 0;
            float min = weight[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; ++i) {
                const float ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (ax < min) {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            sk ^= (uint8_t)(1 << imin);
        }
        signs[k] = even_signs ? (uint8_t)(sk & 127) : sk;
    }
}

// The grid index of a group's levels (on the grid by construction).
inline int grid_point_of(const GridIndex &grid, const int8_t *L) {
    uint32_t key = 0;
    for (int i = 0; i < grid.group; ++i) key |= (uint32_t)L[i] << (grid.bits * i);
    return grid.map[key];
}

inline float block_max(const float *xval, int bs) {
    float max = xval[0];
    for (int i = 1; i < bs; ++i) max = cmax(max, xval[i]);
    return max;
}

// The block weights (see the file comment).
enum class NoImatrix { kSquare, kSigmaPlusSquare };
void block_weights(int bs, const float *xb, const float *qw, float sigma2, NoImatrix no_im, float *weight,
                   float *waux) {
    if (qw) {
        for (int i = 0; i < bs; ++i) weight[i] = qw[i] * std::sqrt(sigma2 + xb[i] * xb[i]);
    } else if (no_im == NoImatrix::kSquare) {
        for (int i = 0; i < bs; ++i) weight[i] = xb[i] * xb[i];
    } else {
        for (int i = 0; i < bs; ++i) weight[i] = 0.25f * sigma2 + xb[i] * xb[i];
    }
    for (int i = 0; i < bs; ++i) waux[i] = std::sqrt(weight[i]);
}

inline float sum_squares(const float *x) {
    float s = 0;
    for (int i = 0; i < QK_K; ++i) s += x[i] * x[i];
    return s;
}

// The 4-bit block scale of a block of scale `scale` under super-scale d (id = 1/d).
inline int scale4(float id, float scale) {
    return std::max(0, std::min(15, nearest_int(0.5f * (id * scale - 1))));
}

constexpr Search kIq2xxs{T_IQ2_XXS, 32, 3, 6, 0.1f, true, Search::kAll};
constexpr Search kIq2xs{T_IQ2_XS, 16, 3, 9, 0.1f, true, Search::kOffGrid};
constexpr Search kIq2s{T_IQ2_S, 16, 3, 9, 0.1f, false, Search::kOffGrid};
constexpr Search kIq3xxs{T_IQ3_XXS, 32, 8, 15, 0.2f, true, Search::kOffGrid};
constexpr Search kIq3s{T_IQ3_S, 32, 8, 9, 0.2f, false, Search::kAllIfOffGrid};

constexpr float kEpsIq3xxs = 1e-8f;  // GROUP_MAX_EPS_IQ3_XXS
constexpr float kEpsIq2s = 1e-8f;    // GROUP_MAX_EPS_IQ2_S

}  // namespace

// IQ2_XXS: 8 blocks of 32; per block 4 grid bytes, then 4 x 7 sign bits and the 4-bit scale
// (as two uint32: grid indices | signs << 7k | scale << 28). The fan starts from make_qp_quants'
// scale of xval on levels 0..3 (its max 3 * scale) and spans is = -6..6.
void row_iq2_xxs(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    const Search &s = kIq2xxs;
    const GridIndex &grid = grid_index(s.id);
    auto *y = reinterpret_cast<block_iq2_xxs *>(y8);
    float scales[QK_K / 32], weight[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];
    uint32_t q2[2 * (QK_K / 32)];
    for (int64_t ibl = 0; ibl < n / QK_K; ++ibl) {
        const float *xbl = x + QK_K * ibl;
        y[ibl].d = to_half(0.f);
        std::memset(q2, 0, sizeof(q2));
        float max_scale = 0;
        const float sigma2 = sum_squares(xbl) / QK_K;
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const float *xb = xbl + 32 * ib;
            block_weights(32, xb, qw + QK_K * ibl + 32 * ib, sigma2, NoImatrix::kSquare, weight, waux);
            split_signs(32, true, xb, weight, xval, signs);
            const float max = block_max(xval, 32);
            if (max < kGroupMaxEps) {
                scales[ib] = 0;
                continue;
            }
            float scale = make_qp_quants(32, s.kmax + 1, xval, reinterpret_cast<uint8_t *>(L), weight);
            const float eff_max = scale * s.kmax;
            if (eff_max <= 0) {
                scales[ib] = 0;
                continue;
            }
            // (the fan's start is make_qp_quants' scale; its levels L are replaced by the fan's)
            scale = search_block<32, 8>(s, grid, xval, weight, waux, scale, eff_max, L, signs);
            for (int k = 0; k < 4; ++k) {
                q2[2 * ib + 0] |= (uint32_t)grid_point_of(grid, L + 8 * k) << 8 * k;
                q2[2 * ib + 1] |= (uint32_t)signs[k] << 7 * k;
            }
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if (!max_scale) {
            std::memset(y[ibl].qs, 0, sizeof(y[ibl].qs));
            continue;
        }
        const float d = max_scale / 31;
        y[ibl].d = to_half(d);
        const float id = 1 / d;
        for (int ib = 0; ib < QK_K / 32; ++ib) q2[2 * ib + 1] |= (uint32_t)scale4(id, scales[ib]) << 28;
        std::memcpy(y[ibl].qs, q2, sizeof(q2));
    }
}

// IQ2_XS: 16 blocks of 16; per group of 8 a uint16 (9-bit grid index | 7 sign bits << 9), and
// the 4-bit block scales two to a byte.
void row_iq2_xs(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    const Search &s = kIq2xs;
    const GridIndex &grid = grid_index(s.id);
    auto *y = reinterpret_cast<block_iq2_xs *>(y8);
    float scales[QK_K / 16], weight[16], waux[16], xval[16];
    int8_t L[16];
    uint8_t signs[2];
    uint16_t q2[2 * (QK_K / 16)];
    for (int64_t ibl = 0; ibl < n / QK_K; ++ibl) {
        const float *xbl = x + QK_K * ibl;
        y[ibl].d = to_half(0.f);
        std::memset(q2, 0, sizeof(q2));
        std::memset(y[ibl].scales, 0, sizeof(y[ibl].scales));
        float max_scale = 0;
        const float sigma2 = sum_squares(xbl) / QK_K;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const float *xb = xbl + 16 * ib;
            block_weights(16, xb, qw + QK_K * ibl + 16 * ib, sigma2, NoImatrix::kSquare, weight, waux);
            split_signs(16, true, xb, weight, xval, signs);
            const float max = block_max(xval, 16);
            std::memset(L, 0, sizeof(L));
            if (max < kGroupMaxEps) {
                scales[ib] = 0;
                continue;
            }
            const float scale = search_block<16, 8>(s, grid, xval, weight, waux, max / (2 * s.kmax - 1), max, L, signs);
            for (int k = 0; k < 2; ++k) q2[2 * ib + k] = (uint16_t)(grid_point_of(grid, L + 8 * k) | (signs[k] << 9));
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if (!max_scale) {
            std::memset(y[ibl].qs, 0, sizeof(y[ibl].qs));
            continue;
        }
        const float d = max_scale / 31;
        y[ibl].d = to_half(d);
        const float id = 1 / d;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const int l = scale4(id, scales[ib]);
            if (ib % 2 == 0) y[ibl].scales[ib / 2] = (uint8_t)l;
            else y[ibl].scales[ib / 2] |= (uint8_t)(l << 4);
        }
        std::memcpy(y[ibl].qs, q2, sizeof(q2));
    }
}

// IQ2_S: 16 blocks of 16 with free signs; qs[0..31] the low 8 bits of the 10-bit grid
// indices, qs[32..63] one sign byte per group, qh 2 high index bits per group, 4-bit scales.
void row_iq2_s(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    const Search &s = kIq2s;
    const GridIndex &grid = grid_index(s.id);
    auto *y = reinterpret_cast<block_iq2_s *>(y8);
    float scales[QK_K / 16], weight[16], waux[16], xval[16];
    int8_t L[16];
    uint8_t signs[2];
    for (int64_t ibl = 0; ibl < n / QK_K; ++ibl) {
        const float *xbl = x + QK_K * ibl;
        std::memset(&y[ibl], 0, sizeof(y[ibl]));
        y[ibl].d = to_half(0.f);
        float max_scale = 0;
        const float sigma2 = 2 * sum_squares(xbl) / QK_K;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const float *xb = xbl + 16 * ib;
            block_weights(16, xb, qw ? qw + QK_K * ibl + 16 * ib : nullptr, sigma2, NoImatrix::kSigmaPlusSquare,
                          weight, waux);
            split_signs(16, false, xb, weight, xval, signs);
            const float max = block_max(xval, 16);
            std::memset(L, 0, sizeof(L));
            if (max < kEpsIq2s) {
                scales[ib] = 0;
                continue;
            }
            const float scale = search_block<16, 8>(s, grid, xval, weight, waux, max / (2 * s.kmax - 1), max, L, signs);
            for (int k = 0; k < 2; ++k) {
                const int gi = grid_point_of(grid, L + 8 * k), i8 = 2 * ib + k;
                y[ibl].qs[i8] = (uint8_t)(gi & 255);
                y[ibl].qh[i8 / 4] |= (uint8_t)((gi >> 8) << 2 * (i8 % 4));
                y[ibl].qs[QK_K / 8 + i8] = signs[k];
            }
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if (!max_scale) continue;
        const float d = max_scale / 31;
        y[ibl].d = to_half(d * 0.9875f);
        const float id = 1 / d;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const int l = scale4(id, scales[ib]);
            if (ib % 2 == 0) y[ibl].scales[ib / 2] = (uint8_t)l;
            else y[ibl].scales[ib / 2] |= (uint8_t)(l << 4);
        }
    }
}

// IQ3_XXS: 8 blocks of 32; qs[0..63] one grid byte per group of 4, then per block a uint32 of
// 4 x 7 sign bits | 4-bit scale << 28.
void row_iq3_xxs(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    const Search &s = kIq3xxs;
    const GridIndex &grid = grid_index(s.id);
    auto *y = reinterpret_cast<block_iq3_xxs *>(y8);
    float scales[QK_K / 32], weight[32], waux[32], xval[32];
    int8_t L[32];
    uint8_t signs[4];
    uint8_t q3[QK_K / 4];             // grid indices
    uint32_t signs_scales[QK_K / 32];  // per block
    for (int64_t ibl = 0; ibl < n / QK_K; ++ibl) {
        const float *xbl = x + QK_K * ibl;
        y[ibl].d = to_half(0.f);
        std::memset(q3, 0, sizeof(q3));
        std::memset(signs_scales, 0, sizeof(signs_scales));
        float max_scale = 0;
        const float sigma2 = 2 * sum_squares(xbl) / QK_K;
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const float *xb = xbl + 32 * ib;
            block_weights(32, xb, qw ? qw + QK_K * ibl + 32 * ib : nullptr, sigma2, NoImatrix::kSquare, weight, waux);
            split_signs(32, true, xb, weight, xval, signs);
            const float max = block_max(xval, 32);
            std::memset(L, 0, sizeof(L));
            if (max < kEpsIq3xxs) {
                scales[ib] = 0;
                continue;
            }
            const float scale = search_block<32, 4>(s, grid, xval, weight, waux, max / (2 * s.kmax - 1), max, L, signs);
            for (int k = 0; k < 8; ++k) q3[8 * ib + k] = (uint8_t)grid_point_of(grid, L + 4 * k);
            signs_scales[ib] = (uint32_t)signs[0] | (uint32_t)signs[1] << 7 | (uint32_t)signs[2] << 14 |
                               (uint32_t)signs[3] << 21;
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if (!max_scale) {
            std::memset(y[ibl].qs, 0, sizeof(y[ibl].qs));
            continue;
        }
        const float d = max_scale / 31;
        y[ibl].d = to_half(d * 1.0125f);
        const float id = 1 / d;
        for (int ib = 0; ib < QK_K / 32; ++ib) signs_scales[ib] |= (uint32_t)scale4(id, scales[ib]) << 28;
        std::memcpy(y[ibl].qs, q3, sizeof(q3));
        std::memcpy(y[ibl].qs + sizeof(q3), signs_scales, sizeof(signs_scales));
    }
}

// IQ3_S: 8 blocks of 32 with free signs; qs the low 8 bits of the 9-bit grid indices, qh
// their 9th bits, one sign byte per 8 values, 4-bit scales two to a byte.
// As in ggml, a block whose values are all zero advances neither the qs nor the signs
// position: the following blocks' grid bytes and signs land 8 and 4 bytes earlier (their qh
// bits do not move). The bytes must match ggml's; the format's decoders read them as written.
void row_iq3_s(const float *x, uint8_t *y8, int64_t n, const float *qw) {
    const Search &s = kIq3s;
    const GridIndex &grid = grid_index(s.id);
    auto *y = reinterpret_cast<block_iq3_s *>(y8);
    constexpr int bs = 32;
    float scales[QK_K / bs], weight[bs], waux[bs], xval[bs];
    int8_t L[bs];
    uint8_t signs[bs / 8];
    for (int64_t ibl = 0; ibl < n / QK_K; ++ibl) {
        const float *xbl = x + QK_K * ibl;
        std::memset(&y[ibl], 0, sizeof(y[ibl]));
        y[ibl].d = to_half(0.f);
        uint8_t *qs = y[ibl].qs, *sg = y[ibl].signs;
        float max_scale = 0;
        const float sigma2 = 2 * sum_squares(xbl) / QK_K;
        for (int ib = 0; ib < QK_K / bs; ++ib) {
            const float *xb = xbl + bs * ib;
            block_weights(bs, xb, qw ? qw + QK_K * ibl + bs * ib : nullptr, sigma2, NoImatrix::kSquare, weight, waux);
            split_signs(bs, false, xb, weight, xval, signs);
            const float max = block_max(xval, bs);
            std::memset(L, 0, sizeof(L));
            if (!max) {
                scales[ib] = 0;
                continue;
            }
            const float scale = search_block<32, 4>(s, grid, xval, weight, waux, max / (2 * s.kmax - 1), max, L, signs);
            for (int k = 0; k < bs / 4; ++k) {
                const int gi = grid_point_of(grid, L + 4 * k), i4 = ib * (bs / 4) + k;
                qs[k] = (uint8_t)(gi & 255);
                y[ibl].qh[i4 / 8] |= (uint8_t)((gi >> 8) << (i4 % 8));
            }
            qs += bs / 4;
            for (int k = 0; k < bs / 8; ++k) sg[k] = signs[k];
            sg += bs / 8;
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if (!max_scale) continue;
        const float d = max_scale / 31;
        y[ibl].d = to_half(d * 1.033f);
        const float id = 1 / d;
        for (int ib = 0; ib < QK_K / bs; ib += 2)
            y[ibl].scales[ib / 2] = (uint8_t)(scale4(id, scales[ib]) | scale4(id, scales[ib + 1]) << 4);
    }
}

}  // namespace lowbit::quant
