// Scalar reference kernels for the i-quants: the spec the SIMD levels are tested against.
//
// Formats: IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_XS IQ1_S IQ1_M (weights against Q8_K
// activations) and IQ4_NL (against Q8_0). Per format:
//   dequant_<fmt>        one row of n weights to float32, bit-identical to ggml's
//                        dequantize_row_<fmt> (same float operations in the same order);
//   dot_<fmt>_<act>      one weight row times one activation row, in ggml's arithmetic
//                        order (ggml-cpu/quants.c, ggml_vec_dot_<fmt>_<act>_generic):
//                        exact integer sums per sub-block, weighted by the integer
//                        sub-block scales, then one float multiply-add per block (IQ4_XS
//                        and IQ4_NL: per 32 weights), accumulated in float in block order,
//                        with ggml's final constant (0.125f for IQ2_*, 0.25f for IQ3_XXS).
//
// Integer ranges (worst case |q8| <= 128, all codes and scales maximal) stay far inside
// int32: the largest is IQ3_XXS, 8 sub-blocks * 31 * 32 * 62 * 128 < 2^26 per block.
//
// Blocks are read through the structs of formats.h; grids are packed one row per
// integer, element j in byte j (iq_tables.h). Lane j of a group of 8 is negated when bit j
// of its sign byte is set. Built without ISA flags; no intrinsics here.
#include <cstring>

#include "../formats.h"
#include "iq_tables.h"
#include "ref.h"

namespace lowbit::ref {
namespace {

// Byte j of a packed grid row, as the unsigned magnitude it stores.
inline int grid_u8(uint64_t row, int j) { return (int)((row >> (8 * j)) & 0xff); }
// Byte j of an iq1s_grid row, as the int8 -1 / 0 / +1 it stores.
inline int grid_s8(uint64_t row, int j) { return (int)(int8_t)(uint8_t)(row >> (8 * j)); }

// Two 4-lane iq3 grid rows as one 8-lane row: lanes 0..3 from lo, 4..7 from hi.
inline uint64_t join_grid4(uint32_t lo, uint32_t hi) { return (uint64_t)lo | ((uint64_t)hi << 32); }

inline uint32_t load_u32(const void *p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint16_t load_u16(const void *p) { uint16_t v; std::memcpy(&v, p, 2); return v; }

// sum_j sign_j * grid[j] * q8[j] over 8 lanes; sign_j = -1 where bit j of signs is set.
inline int32_t signed_grid_dot8(uint64_t grid, uint8_t signs, const int8_t *q8) {
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) {
        const int32_t p = grid_u8(grid, j) * (int32_t)q8[j];
        s += (signs >> j) & 1 ? -p : p;
    }
    return s;
}

// y[j] = sign_j * (db * grid[j]) for 8 lanes: ggml's db * grid[j] * (+-1.f), where the
// multiply by +-1 is an exact negation.
inline void put_signed_grid8(float db, uint64_t grid, uint8_t signs, float *y) {
    for (int j = 0; j < 8; ++j) {
        const float v = db * (float)grid_u8(grid, j);
        y[j] = (signs >> j) & 1 ? -v : v;
    }
}

// ---- IQ2_XXS: 2.06 bpw ---------------------------------------------------------------------
// Per 32 weights, 8 bytes: bytes 0..3 index iq2xxs_grid (one row = 8 weights), then a
// uint32 whose bits 7l..7l+6 select ksigns for group l and bits 28..31 are the 4-bit
// scale s. Weight = d * (0.5 + s) * 0.25 * grid * sign, i.e. d * (2s+1) / 8 * grid * sign.

void dequant_iq2_xxs(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq2_xxs *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d);
        const uint8_t *q = reinterpret_cast<const uint8_t *>(x[i].qs);
        for (int ib = 0; ib < QK_K / 32; ++ib, q += 8) {
            const uint32_t aux = load_u32(q + 4);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l, y += 8)
                put_signed_grid8(db, iq::iq2xxs_grid[q[l]], iq::ksigns_iq2xs[(aux >> 7 * l) & 127], y);
        }
    }
}

float dot_iq2_xxs_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq2_xxs *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d) * y[i].d;
        const uint8_t *q = reinterpret_cast<const uint8_t *>(x[i].qs);
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib, q += 8) {
            const uint32_t aux = load_u32(q + 4);
            const int32_t ls = 2 * (int32_t)(aux >> 28) + 1;
            int32_t sumi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8)
                sumi += signed_grid_dot8(iq::iq2xxs_grid[q[l]], iq::ksigns_iq2xs[(aux >> 7 * l) & 127], q8);
            bsum += sumi * ls;
        }
        sumf += d * (float)bsum;
    }
    return 0.125f * sumf;
}

// ---- IQ2_XS: 2.31 bpw ----------------------------------------------------------------------
// qs[k] (uint16, one per 8 weights): bits 0..8 index iq2xs_grid, bits 9..15 select ksigns.
// scales[ib]: low nibble for the first 16 weights of the 32, high nibble for the second.

void dequant_iq2_xs(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq2_xs *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const float db_lo = d * (0.5f + (float)(x[i].scales[ib] & 0xf)) * 0.25f;
            const float db_hi = d * (0.5f + (float)(x[i].scales[ib] >> 4)) * 0.25f;
            for (int l = 0; l < 4; ++l, y += 8) {
                const uint16_t code = load_u16(&x[i].qs[4 * ib + l]);
                put_signed_grid8(l < 2 ? db_lo : db_hi, iq::iq2xs_grid[code & 511], iq::ksigns_iq2xs[code >> 9], y);
            }
        }
    }
}

float dot_iq2_xs_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq2_xs *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const int32_t ls_lo = 2 * (x[i].scales[ib] & 0xf) + 1;
            const int32_t ls_hi = 2 * (x[i].scales[ib] >> 4) + 1;
            int32_t sum_lo = 0, sum_hi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const uint16_t code = load_u16(&x[i].qs[4 * ib + l]);
                const int32_t s = signed_grid_dot8(iq::iq2xs_grid[code & 511], iq::ksigns_iq2xs[code >> 9], q8);
                if (l < 2) sum_lo += s; else sum_hi += s;
            }
            bsum += sum_lo * ls_lo + sum_hi * ls_hi;
        }
        sumf += d * (float)bsum;
    }
    return 0.125f * sumf;
}

// ---- IQ2_S: 2.56 bpw -----------------------------------------------------------------------
// qs[0..31]: low 8 bits of the iq2s_grid index per 8 weights; qs[32..63]: the 8 sign bits
// per 8 weights (explicit, no parity). qh[ib]: bits 2l..2l+1 are index bits 8..9 of group l.
// scales[ib] as in IQ2_XS.

void dequant_iq2_s(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq2_s *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d);
        const uint8_t *idx = x[i].qs;
        const uint8_t *signs = x[i].qs + QK_K / 8;
        for (int ib = 0; ib < QK_K / 32; ++ib, idx += 4, signs += 4) {
            const float db_lo = d * (0.5f + (float)(x[i].scales[ib] & 0xf)) * 0.25f;
            const float db_hi = d * (0.5f + (float)(x[i].scales[ib] >> 4)) * 0.25f;
            for (int l = 0; l < 4; ++l, y += 8) {
                const int g = idx[l] | (((x[i].qh[ib] >> (2 * l)) & 3) << 8);
                put_signed_grid8(l < 2 ? db_lo : db_hi, iq::iq2s_grid[g], signs[l], y);
            }
        }
    }
}

float dot_iq2_s_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq2_s *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d) * y[i].d;
        const uint8_t *idx = x[i].qs;
        const uint8_t *signs = x[i].qs + QK_K / 8;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib, idx += 4, signs += 4) {
            const int32_t ls_lo = 2 * (x[i].scales[ib] & 0xf) + 1;
            const int32_t ls_hi = 2 * (x[i].scales[ib] >> 4) + 1;
            int32_t sum_lo = 0, sum_hi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const int g = idx[l] | (((x[i].qh[ib] >> (2 * l)) & 3) << 8);
                const int32_t s = signed_grid_dot8(iq::iq2s_grid[g], signs[l], q8);
                if (l < 2) sum_lo += s; else sum_hi += s;
            }
            bsum += sum_lo * ls_lo + sum_hi * ls_hi;
        }
        sumf += d * (float)bsum;
    }
    return 0.125f * sumf;
}

// ---- IQ3_XXS: 3.06 bpw ---------------------------------------------------------------------
// qs[0..63]: one iq3xxs_grid index (4 weights) per byte, 8 per 32 weights; qs[64..95]:
// per 32 weights a uint32, bits 7l..7l+6 select ksigns for group l (8 weights), bits
// 28..31 the scale s. Weight = d * (0.5 + s) * 0.5 * grid * sign, i.e. d * (2s+1) / 4.

void dequant_iq3_xxs(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq3_xxs *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d);
        const uint8_t *idx = x[i].qs;
        const uint8_t *scale_signs = x[i].qs + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ++ib, idx += 8) {
            const uint32_t aux = load_u32(scale_signs + 4 * ib);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; ++l, y += 8) {
                const uint64_t grid = join_grid4(iq::iq3xxs_grid[idx[2 * l]], iq::iq3xxs_grid[idx[2 * l + 1]]);
                put_signed_grid8(db, grid, iq::ksigns_iq2xs[(aux >> 7 * l) & 127], y);
            }
        }
    }
}

float dot_iq3_xxs_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq3_xxs *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d) * y[i].d;
        const uint8_t *idx = x[i].qs;
        const uint8_t *scale_signs = x[i].qs + QK_K / 4;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib, idx += 8) {
            const uint32_t aux = load_u32(scale_signs + 4 * ib);
            const int32_t ls = 2 * (int32_t)(aux >> 28) + 1;
            int32_t sumi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const uint64_t grid = join_grid4(iq::iq3xxs_grid[idx[2 * l]], iq::iq3xxs_grid[idx[2 * l + 1]]);
                sumi += signed_grid_dot8(grid, iq::ksigns_iq2xs[(aux >> 7 * l) & 127], q8);
            }
            bsum += sumi * ls;
        }
        sumf += d * (float)bsum;
    }
    return 0.25f * sumf;
}

// ---- IQ3_S: 3.44 bpw -----------------------------------------------------------------------
// qs[0..63]: low 8 bits of an iq3s_grid index (4 weights) per byte, 8 per 32 weights;
// qh[ib]: bit k is index bit 8 of qs[8*ib + k]; signs[4*ib + l]: the 8 sign bits of group l;
// scales[ib/2]: low nibble for even ib, high nibble for odd ib. Weight = d * (2s+1) * grid.

void dequant_iq3_s(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq3_s *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const int s = ib % 2 == 0 ? x[i].scales[ib / 2] & 0xf : x[i].scales[ib / 2] >> 4;
            const float db = d * (float)(1 + 2 * s);
            const uint8_t *idx = x[i].qs + 8 * ib;
            const int qh = x[i].qh[ib];
            for (int l = 0; l < 4; ++l, y += 8) {
                const int g1 = idx[2 * l] | (((qh >> (2 * l)) & 1) << 8);
                const int g2 = idx[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
                put_signed_grid8(db, join_grid4(iq::iq3s_grid[g1], iq::iq3s_grid[g2]), x[i].signs[4 * ib + l], y);
            }
        }
    }
}

float dot_iq3_s_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq3_s *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d) * y[i].d;
        const int8_t *q8 = y[i].qs;
        int32_t bsum = 0;
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const int s = ib % 2 == 0 ? x[i].scales[ib / 2] & 0xf : x[i].scales[ib / 2] >> 4;
            const int32_t ls = 2 * s + 1;
            const uint8_t *idx = x[i].qs + 8 * ib;
            const int qh = x[i].qh[ib];
            int32_t sumi = 0;
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const int g1 = idx[2 * l] | (((qh >> (2 * l)) & 1) << 8);
                const int g2 = idx[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
                sumi += signed_grid_dot8(join_grid4(iq::iq3s_grid[g1], iq::iq3s_grid[g2]), x[i].signs[4 * ib + l], q8);
            }
            bsum += sumi * ls;
        }
        sumf += d * (float)bsum;
    }
    return sumf;
}

// ---- IQ1_S: 1.56 bpw -----------------------------------------------------------------------
// Per 32 weights: qs[4*ib + l] is the low 8 bits of an iq1s_grid index (8 weights, values
// -1/0/+1) and qh[ib] (uint16) holds index bits 8..10 of group l in bits 3l..3l+2, the
// scale s in bits 12..14 and the sign of the shared offset in bit 15.
// Weight = d * (2s+1) * (grid + delta), delta = +-iq1s_delta.
// The dot splits this into sum(grid * q8) and delta * sum(q8), the latter from the Q8_K
// bsums (sums of 16 activations), exactly as ggml does.

void dequant_iq1_s(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq1_s *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const uint16_t qh = load_u16(&x[i].qh[ib]);
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -iq::iq1s_delta : iq::iq1s_delta;
            for (int l = 0; l < 4; ++l, y += 8) {
                const uint64_t grid = iq::iq1s_grid[x[i].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
                for (int j = 0; j < 8; ++j) y[j] = dl * ((float)grid_s8(grid, j) + delta);
            }
        }
    }
}

float dot_iq1_s_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq1_s *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const int8_t *q8 = y[i].qs;
        int32_t sum_grid = 0;   // sum over sub-blocks of ls * sum(grid * q8)
        int32_t sum_delta = 0;  // sum over sub-blocks of ls * (+-1) * sum(q8)
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const uint16_t qh = load_u16(&x[i].qh[ib]);
            const int32_t ls = 2 * ((qh >> 12) & 7) + 1;
            const int32_t delta_sign = qh & 0x8000 ? -1 : 1;
            int32_t lsum = 0;
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const uint64_t grid = iq::iq1s_grid[x[i].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
                for (int j = 0; j < 8; ++j) lsum += grid_s8(grid, j) * (int32_t)q8[j];
            }
            sum_grid += ls * lsum;
            sum_delta += ls * delta_sign * ((int32_t)y[i].bsums[2 * ib] + (int32_t)y[i].bsums[2 * ib + 1]);
        }
        const float scale = fp16_to_f32(x[i].d) * y[i].d;
        sumf += scale * ((float)sum_grid + iq::iq1s_delta * (float)sum_delta);
    }
    return sumf;
}

// ---- IQ1_M: 1.75 bpw -----------------------------------------------------------------------
// No separate d: the fp16 super-block scale is split over the top nibbles of the four
// uint16 scale words (word k's bits 12..15 are bits 4k..4k+3 of d). Per 32 weights (ib):
// scale word ib/2 holds two 3-bit scales at bits 6*(ib%2) (first 16 weights) and
// 6*(ib%2)+3 (second 16). qh[2*ib + l/2], nibble l%2, holds index bits 8..10 of group l in
// its bits 0..2 and the sign of group l's offset in bit 3. Weight = d*(2s+1)*(grid + delta).
// The dot sums q8 directly per 8 weights (not the bsums), as ggml does.

inline float iq1_m_superscale(const block_iq1_m &b) {
    uint16_t sc[4];
    std::memcpy(sc, b.scales, sizeof sc);
    const uint16_t bits = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    return fp16_to_f32(bits);
}

// 3-bit scale of half h (0: first 16 weights, 1: second 16) of sub-block ib, as 2s+1.
inline int32_t iq1_m_sub_scale(const block_iq1_m &b, int ib, int h) {
    const uint16_t word = load_u16(b.scales + 2 * (ib / 2));
    return 2 * ((word >> (6 * (ib % 2) + 3 * h)) & 7) + 1;
}

void dequant_iq1_m(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq1_m *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = iq1_m_superscale(x[i]);
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const float dl[2] = {d * (float)iq1_m_sub_scale(x[i], ib, 0), d * (float)iq1_m_sub_scale(x[i], ib, 1)};
            for (int l = 0; l < 4; ++l, y += 8) {
                const int nib = (x[i].qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0xf;
                const uint64_t grid = iq::iq1s_grid[x[i].qs[4 * ib + l] | ((nib & 7) << 8)];
                const float delta = nib & 8 ? -iq::iq1m_delta : iq::iq1m_delta;
                for (int j = 0; j < 8; ++j) y[j] = dl[l / 2] * ((float)grid_s8(grid, j) + delta);
            }
        }
    }
}

float dot_iq1_m_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq1_m *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const int8_t *q8 = y[i].qs;
        int32_t sum_grid = 0;   // sum over groups of 8 of ls * sum(grid * q8)
        int32_t sum_delta = 0;  // sum over groups of 8 of ls * (+-1) * sum(q8)
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            for (int l = 0; l < 4; ++l, q8 += 8) {
                const int nib = (x[i].qh[2 * ib + l / 2] >> (4 * (l % 2))) & 0xf;
                const uint64_t grid = iq::iq1s_grid[x[i].qs[4 * ib + l] | ((nib & 7) << 8)];
                const int32_t delta_sign = nib & 8 ? -1 : 1;
                int32_t gsum = 0, qsum = 0;
                for (int j = 0; j < 8; ++j) {
                    gsum += grid_s8(grid, j) * (int32_t)q8[j];
                    qsum += q8[j];
                }
                const int32_t ls = iq1_m_sub_scale(x[i], ib, l / 2);
                sum_grid += ls * gsum;
                sum_delta += ls * delta_sign * qsum;
            }
        }
        const float scale = iq1_m_superscale(x[i]) * y[i].d;
        sumf += scale * ((float)sum_grid + iq::iq1m_delta * (float)sum_delta);
    }
    return sumf;
}

// ---- IQ4_NL: 4.5 bpw, 32-weight blocks against Q8_0 ----------------------------------------
// qs[j]: low nibble codes weight j, high nibble weight j+16; weight = d * kvalues_iq4nl[code].

void dequant_iq4_nl(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq4_nl *>(src);
    for (int64_t i = 0; i < n / QK; ++i, y += QK) {
        const float d = fp16_to_f32(x[i].d);
        for (int j = 0; j < QK / 2; ++j) {
            y[j] = d * (float)iq::kvalues_iq4nl[x[i].qs[j] & 0xf];
            y[j + QK / 2] = d * (float)iq::kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

float dot_iq4_nl_q8_0(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq4_nl *>(w);
    const auto *y = reinterpret_cast<const block_q8_0 *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK; ++i) {
        const float d = fp16_to_f32(y[i].d) * fp16_to_f32(x[i].d);
        int32_t sumi = 0;
        for (int j = 0; j < QK / 2; ++j) {
            sumi += (int32_t)y[i].qs[j] * iq::kvalues_iq4nl[x[i].qs[j] & 0xf];
            sumi += (int32_t)y[i].qs[j + QK / 2] * iq::kvalues_iq4nl[x[i].qs[j] >> 4];
        }
        sumf += d * (float)sumi;
    }
    return sumf;
}

// ---- IQ4_XS: 4.25 bpw ----------------------------------------------------------------------
// Per 32 weights (ib): a 6-bit scale, low 4 bits in scales_l[ib/2] (nibble ib%2), high 2
// bits in scales_h bits 2ib..2ib+1; weight = d * (ls - 32) * kvalues_iq4nl[code]. The 16
// qs bytes of the sub-block hold weights j (low nibble) and j+16 (high nibble).
// The dot adds one float term per 32 weights (not per block), as ggml does.

inline int iq4_xs_scale(const block_iq4_xs &b, int ib) {
    const int lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
    const int hi = (load_u16(&b.scales_h) >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

void dequant_iq4_xs(const uint8_t *src, float *y, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq4_xs *>(src);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ++ib, y += 32) {
            const float dl = d * (float)iq4_xs_scale(x[i], ib);
            const uint8_t *qs = x[i].qs + 16 * ib;
            for (int j = 0; j < 16; ++j) {
                y[j] = dl * (float)iq::kvalues_iq4nl[qs[j] & 0xf];
                y[j + 16] = dl * (float)iq::kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

float dot_iq4_xs_q8_k(const uint8_t *w, const uint8_t *act, int64_t n, float) {
    const auto *x = reinterpret_cast<const block_iq4_xs *>(w);
    const auto *y = reinterpret_cast<const block_q8_K *>(act);
    float sumf = 0.f;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d = fp16_to_f32(x[i].d) * y[i].d;
        for (int ib = 0; ib < QK_K / 32; ++ib) {
            const uint8_t *qs = x[i].qs + 16 * ib;
            const int8_t *q8 = y[i].qs + 32 * ib;
            int32_t sumi = 0;
            for (int j = 0; j < 16; ++j) {
                sumi += (int32_t)q8[j] * iq::kvalues_iq4nl[qs[j] & 0xf];
                sumi += (int32_t)q8[j + 16] * iq::kvalues_iq4nl[qs[j] >> 4];
            }
            sumf += (d * (float)iq4_xs_scale(x[i], ib)) * (float)sumi;
        }
    }
    return sumf;
}

}  // namespace

void register_iquants(KernelTable &t) {
    t.at(T_IQ2_XXS).dequant = dequant_iq2_xxs;
    t.set_rows_all(T_IQ2_XXS, rows<dot_iq2_xxs_q8_k>, "rows_iq2_xxs_q8_k_scalar", ISA_SCALAR);
    t.at(T_IQ2_XS).dequant = dequant_iq2_xs;
    t.set_rows_all(T_IQ2_XS, rows<dot_iq2_xs_q8_k>, "rows_iq2_xs_q8_k_scalar", ISA_SCALAR);
    t.at(T_IQ2_S).dequant = dequant_iq2_s;
    t.set_rows_all(T_IQ2_S, rows<dot_iq2_s_q8_k>, "rows_iq2_s_q8_k_scalar", ISA_SCALAR);
    t.at(T_IQ3_XXS).dequant = dequant_iq3_xxs;
    t.set_rows_all(T_IQ3_XXS, rows<dot_iq3_xxs_q8_k>, "rows_iq3_xxs_q8_k_scalar", ISA_SCALAR);
    t.at(T_IQ3_S).dequant = dequant_iq3_s;
    t.set_rows_all(T_IQ3_S, rows<dot_iq3_s_q8_k>, "rows_iq3_s_q8_k_scalar", ISA_SCALAR);
    t.at(T_IQ1_S).dequant = dequant_iq1_s;
    t.set_rows_all(T_IQ1_S, rows<dot_iq1_s_q8_k>, "rows_iq1_s_q8_k_scalar", ISA_SCALAR);
    t.at(T_IQ1_M).dequant = dequant_iq1_m;
    t.set_rows_all(T_IQ1_M, rows<dot_iq1_m_q8_k>, "rows_iq1_m_q8_k_scalar", ISA_SCALAR);
    t.at(T_IQ4_NL).dequant = dequant_iq4_nl;
    t.set_rows_all(T_IQ4_NL, rows<dot_iq4_nl_q8_0>, "rows_iq4_nl_q8_0_scalar", ISA_SCALAR);
    t.at(T_IQ4_XS).dequant = dequant_iq4_xs;
    t.set_rows_all(T_IQ4_XS, rows<dot_iq4_xs_q8_k>, "rows_iq4_xs_q8_k_scalar", ISA_SCALAR);
}

}  // namespace lowbit::ref
