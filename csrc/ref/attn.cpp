// The engine's attention over a half KV cache: the scalar reference (contract in kernels.h).
//
// Numbers as llama.cpp computes them with its default half cache: q is rounded to half
// before q.K (its K.q product takes half operands), the softmax runs in float, and each
// probability is rounded to half before it weights V. Dots accumulate in float in index order.
// An attention sink (sink > -inf) joins the max and adds its exp to the sum after the keys'.
// softcap > 0: the scores are capped (softcap_scores below, kernels.h's contract) before the max.
#include <cmath>
#include <vector>

#include "ref.h"

namespace lowbit::ref {

// Every half as float, built once: the baseline build reads the cache through it (no F16C).
static const float *half_table() {
    static const std::vector<float> t = [] {
        std::vector<float> v(65536);
        for (uint32_t i = 0; i < 65536; ++i) v[i] = fp16_to_f32((uint16_t)i);
        return v;
    }();
    return t.data();
}

// One query row over len cache rows: q rounded to half into qr (dk floats), scores over the
// first dk halves of K's rows, values from the first dv halves of V's rows (row stride kd),
// the sink (-inf: none) in the max and the denominator, softcap > 0 applied to the scores.
static void attend_row(const float *q, float *qr, const uint16_t *K, const uint16_t *V, int len, int dk, int dv,
                       size_t kd, float scale, float sink, float softcap, float *sc, float *out) {
    const float *ht = half_table();
    for (int d = 0; d < dk; ++d) qr[d] = ht[f32_to_fp16(q[d])];
    float mx = -INFINITY;
    for (int j = 0; j < len; ++j) {
        const uint16_t *k = K + (size_t)j * kd;
        float s = 0.0f;
        for (int d = 0; d < dk; ++d) s += qr[d] * ht[k[d]];
        sc[j] = s * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    if (softcap > 0.0f) mx = softcap_scores(sc, len, softcap);
    mx = sink > mx ? sink : mx;
    float sum = 0.0f;
    for (int j = 0; j < len; ++j) { sc[j] = std::exp(sc[j] - mx); sum += sc[j]; }
    if (sink > -INFINITY) sum += std::exp(sink - mx);  // the sink's share of the denominator
    const float inv = 1.0f / sum;
    for (int d = 0; d < dv; ++d) out[d] = 0.0f;
    for (int j = 0; j < len; ++j) {
        const uint16_t *v = V + (size_t)j * kd;
        const float p = ht[f32_to_fp16(sc[j] * inv)];
        for (int d = 0; d < dv; ++d) out[d] += p * ht[v[d]];
    }
}

void attend_f16(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd, float scale,
                float sink, float softcap, float *sc, float *out) {
    float qr[512];  // head_dim <= 512 (the engine checks)
    attend_row(q, qr, K, V, len, hd, hd, kd, scale, sink, softcap, sc, out);
}

// Rows sharing the cache (MLA, a GQA group): per query row the arithmetic of attend_f16 with
// dk-wide scores and dv-wide values, over its own lens[r] rows, with its own sink.
void mla_f16(const float *q, int nq, const int32_t *lens, const uint16_t *K, const uint16_t *V, int dk, int dv,
             size_t kd, float scale, const float *sinks, float softcap, float *sc, float *out) {
    std::vector<float> qr((size_t)dk);
    for (int h = 0; h < nq; ++h)
        attend_row(q + (size_t)h * dk, qr.data(), K, V, lens[h], dk, dv, kd, scale, sinks ? sinks[h] : -INFINITY, softcap, sc,
                   out + (size_t)h * dv);
}

}  // namespace lowbit::ref

// ---- the quantized cache (--kv q8_0 | q4_0): contract attn_q_fn in kernels.h ----
#include <cstring>

#include "../formats.h"

namespace lowbit::ref {

// e^x for the softmax's x = score - max <= 0, in plain IEEE mul / add (no FMA, so the SIMD
// levels compute the very same bits): x = n ln2 + r (ln2 split in two; n ln2's first part is
// exact), e^r by its degree-6 Taylor polynomial (Horner), times 2^n set in the exponent
// field (n >= -126). Below -87.3: 0 (no weight in a softmax). NaN stays NaN.
float attn_exp(float x) {
    const float n = std::nearbyint(x * 1.44269504088896341f);  // round to nearest even (default mode)
    float r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    float p = 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    if (x < -87.3f) return 0.0f;
    const float nc = n > -126.0f ? n : -126.0f;  // (NaN: -126, as max_ps(NaN, -126))
    const uint32_t bits = (uint32_t)((int32_t)nc + 127) << 23;
    float two_n;
    std::memcpy(&two_n, &bits, 4);
    return p * two_n;
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = e^(-2|x|) in (0, 1]: no overflow; for |x| > 43.6 e is 0
// and the result +-1 exactly; near 0 the subtraction costs at most 1.2e-7 absolute (half an ulp of
// 1), which the scores' cap multiplies (a cap of 50: 6e-6, below a float ulp of a score of 50).
float attn_tanh(float x) {
    const float e = attn_exp(-2.0f * std::fabs(x));
    return std::copysign((1.0f - e) / (1.0f + e), x);
}

float softcap_scores(float *s, int n, float cap) {
    const float inv = 1.0f / cap;
    float mx = -INFINITY;
    for (int j = 0; j < n; ++j) {
        s[j] = cap * attn_tanh(s[j] * inv);
        mx = s[j] > mx ? s[j] : mx;
    }
    return mx;
}

namespace {

// value i (< 32) of a block, exactly: Q8_0 code * d, Q4_0 (nibble - 8) * d, or the half
inline float v_at(int type, const uint8_t *row, int i) {
    if (type == T_Q8_0) {
        const auto *b = reinterpret_cast<const block_q8_0 *>(row) + i / QK;
        return (float)b->qs[i % QK] * fp16_to_f32(b->d);
    }
    if (type == T_Q4_0) {
        const auto *b = reinterpret_cast<const block_q4_0 *>(row) + i / QK;
        const int j = i % QK;
        const int code = j < QK / 2 ? (b->qs[j] & 0x0F) : (b->qs[j - QK / 2] >> 4);
        return (float)(code - 8) * fp16_to_f32(b->d);
    }
    uint16_t h;
    std::memcpy(&h, row + 2 * (size_t)i, 2);
    return fp16_to_f32(h);
}

inline float k_score(int type, const uint8_t *row, const block_q8_0 *q, int nb) {
    float s = 0.0f;
    for (int b = 0; b < nb; ++b) {
        const float dq = fp16_to_f32(q[b].d);
        int32_t isum = 0;
        if (type == T_Q8_0) {
            const auto *k = reinterpret_cast<const block_q8_0 *>(row) + b;
            for (int i = 0; i < QK; ++i) isum += (int32_t)k->qs[i] * q[b].qs[i];
            s = s + (float)isum * (fp16_to_f32(k->d) * dq);
        } else {
            const auto *k = reinterpret_cast<const block_q4_0 *>(row) + b;
            for (int i = 0; i < QK / 2; ++i)
                isum += ((k->qs[i] & 0x0F) - 8) * q[b].qs[i] + ((k->qs[i] >> 4) - 8) * q[b].qs[i + QK / 2];
            s = s + ((float)isum * fp16_to_f32(k->d)) * dq;
        }
    }
    return s;
}

}  // namespace

void attend_q(const uint8_t *qq, int k_type, const uint8_t *K, size_t ks, int v_type, const uint8_t *V, size_t vs,
              int len, int hd, float scale, float sink, float softcap, float *sc, float *out) {
    const auto *q = reinterpret_cast<const block_q8_0 *>(qq);
    const int nb = hd / QK;
    float mx = -INFINITY;
    for (int j = 0; j < len; ++j) {
        sc[j] = k_score(k_type, K + (size_t)j * ks, q, nb) * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    if (softcap > 0.0f) mx = softcap_scores(sc, len, softcap);
    mx = sink > mx ? sink : mx;
    const int full = len & ~7;
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < len; ++j) {
        sc[j] = attn_exp(sc[j] - mx);
        if (j < full) part[j & 7] = part[j & 7] + sc[j];
    }
    float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (int j = full; j < len; ++j) sum = sum + sc[j];
    if (sink > -INFINITY) sum = sum + attn_exp(sink - mx);
    for (int d = 0; d < hd; ++d) out[d] = 0.0f;
    for (int j = 0; j < len; ++j) {
        const uint8_t *v = V + (size_t)j * vs;
        for (int d = 0; d < hd; ++d) out[d] = out[d] + v_at(v_type, v, d) * sc[j];
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < hd; ++d) out[d] = out[d] * inv;
}

}  // namespace lowbit::ref
