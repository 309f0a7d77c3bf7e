// The float formats (F32 copy, F16, BF16: ggml's reference roundings) and llama.cpp's
// ternary TQ1_0 / TQ2_0 (per 256-value block: d = max |x|, codes round(x / d) in {-1, 0, 1}),
// as ggml_quantize_chunk makes them. None of them uses importance weights.
#include "../formats.h"
#include "common.h"

namespace lowbit::quant {

void row_f32(const float *x, uint8_t *y, int64_t n, const float *) { std::memcpy(y, x, (size_t)n * 4); }

void row_f16(const float *x, uint8_t *y8, int64_t n, const float *) {
    auto *y = reinterpret_cast<uint16_t *>(y8);
    for (int64_t i = 0; i < n; ++i) y[i] = to_half(x[i]);
}

void row_bf16(const float *x, uint8_t *y8, int64_t n, const float *) {
    auto *y = reinterpret_cast<uint16_t *>(y8);
    for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

namespace {
// The block's max |x| (NaN-propagating as C's MAX macro) and the fp16 scale.
inline float ternary_scale(const float *x, uint16_t *d16) {
    float amax = 0.0f;
    for (int j = 0; j < QK_K; ++j) amax = cmax(amax, std::fabs(x[j]));
    *d16 = to_half(amax);
    return amax ? 1.0f / amax : 0.0f;
}
inline int trit(float v, float id) { return (int)std::lround(v * id) + 1; }  // -1, 0, 1 -> 0, 1, 2
// Five (or four, then shifted to the top trit) base-3 digits as a byte: ceil(q * 256 / 243).
inline uint8_t trits_to_byte(uint8_t q) { return (uint8_t)(((uint16_t)q * 256 + (243 - 1)) / 243); }
}  // namespace

// TQ1_0: qs[0..32) hold values m + 32 t (t < 5) of the first 160, qs[32..48) values
// 160 + m + 16 t of the next 80, qh[0..4) values 240 + j + 4 t (t < 4).
void row_tq1_0(const float *x, uint8_t *y8, int64_t n, const float *) {
    auto *y = reinterpret_cast<block_tq1_0 *>(y8);
    constexpr size_t nqs = sizeof(y->qs), nqh = sizeof(y->qh);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float id = ternary_scale(x, &y[i].d);
        for (size_t j = 0; j < nqs - nqs % 32; j += 32, x += 5 * 32) {
            for (size_t m = 0; m < 32; ++m) {
                uint8_t q = 0;
                for (size_t t = 0; t < 5; ++t) q = (uint8_t)(q * 3 + trit(x[m + t * 32], id));
                y[i].qs[j + m] = trits_to_byte(q);
            }
        }
        for (size_t j = nqs - nqs % 32; j < nqs; j += 16, x += 5 * 16) {
            for (size_t m = 0; m < 16; ++m) {
                uint8_t q = 0;
                for (size_t t = 0; t < 5; ++t) q = (uint8_t)(q * 3 + trit(x[m + t * 16], id));
                y[i].qs[j + m] = trits_to_byte(q);
            }
        }
        for (size_t j = 0; j < nqh; ++j) {
            uint8_t q = 0;
            for (size_t t = 0; t < 4; ++t) q = (uint8_t)(q * 3 + trit(x[j + t * nqh], id));
            y[i].qh[j] = trits_to_byte((uint8_t)(q * 3));
        }
        x += 4 * nqh;
    }
}

// TQ2_0: byte m of each 32-byte group holds values m + 32 t in bits 2t..2t+1 (code = trit).
void row_tq2_0(const float *x, uint8_t *y8, int64_t n, const float *) {
    auto *y = reinterpret_cast<block_tq2_0 *>(y8);
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float id = ternary_scale(x, &y[i].d);
        for (size_t j = 0; j < sizeof(y->qs); j += 32, x += 4 * 32) {
            for (size_t m = 0; m < 32; ++m) {
                uint8_t q = 0;
                for (size_t t = 0; t < 4; ++t) q = (uint8_t)(q + ((trit(x[m + t * 32], id) & 3) << (2 * t)));
                y[i].qs[j + m] = q;
            }
        }
    }
}

}  // namespace lowbit::quant
