// The engine's attention over a half KV cache: the scalar reference (contract in kernels.h).
//
// Numbers as llama.cpp computes them with its default half cache: q is rounded to half
// before q.K (its K.q product takes half operands), the softmax runs in float, and each
// probability is rounded to half before it weights V. Dots accumulate in float in index order.
// An attention sink (sink > -inf) joins the max and adds its exp to the sum after the keys'.
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

void attend_f16(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd, float scale,
                float sink, float *sc, float *out) {
    const float *ht = half_table();
    float qr[512];  // head_dim <= 512 (the engine checks)
    for (int d = 0; d < hd; ++d) qr[d] = ht[f32_to_fp16(q[d])];
    float mx = -INFINITY;
    for (int j = 0; j < len; ++j) {
        const uint16_t *k = K + (size_t)j * kd;
        float s = 0.0f;
        for (int d = 0; d < hd; ++d) s += qr[d] * ht[k[d]];
        sc[j] = s * scale;
        mx = sc[j] > mx ? sc[j] : mx;
    }
    mx = sink > mx ? sink : mx;
    float sum = 0.0f;
    for (int j = 0; j < len; ++j) { sc[j] = std::exp(sc[j] - mx); sum += sc[j]; }
    if (sink > -INFINITY) sum += std::exp(sink - mx);  // the sink's share of the denominator
    const float inv = 1.0f / sum;
    for (int d = 0; d < hd; ++d) out[d] = 0.0f;
    for (int j = 0; j < len; ++j) {
        const uint16_t *v = V + (size_t)j * kd;
        const float p = ht[f32_to_fp16(sc[j] * inv)];
        for (int d = 0; d < hd; ++d) out[d] += p * ht[v[d]];
    }
}

// MLA: per query row the same arithmetic as attend_f16 with dk-wide scores and dv-wide values
// read from the first dv of the same cache rows (no sink), over its own lens[r] rows.
void mla_f16(const float *q, int nq, const int32_t *lens, const uint16_t *C, int dk, int dv, size_t kd, float scale,
             float *sc, float *out) {
    const float *ht = half_table();
    std::vector<float> qr((size_t)dk);
    for (int h = 0; h < nq; ++h) {
        const float *qh = q + (size_t)h * dk;
        const int len = lens[h];
        float *s = sc, *o = out + (size_t)h * dv;
        for (int d = 0; d < dk; ++d) qr[(size_t)d] = ht[f32_to_fp16(qh[d])];
        float mx = -INFINITY;
        for (int j = 0; j < len; ++j) {
            const uint16_t *k = C + (size_t)j * kd;
            float a = 0.0f;
            for (int d = 0; d < dk; ++d) a += qr[(size_t)d] * ht[k[d]];
            s[j] = a * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        float sum = 0.0f;
        for (int j = 0; j < len; ++j) { s[j] = std::exp(s[j] - mx); sum += s[j]; }
        const float inv = 1.0f / sum;
        for (int d = 0; d < dv; ++d) o[d] = 0.0f;
        for (int j = 0; j < len; ++j) {
            const uint16_t *v = C + (size_t)j * kd;
            const float p = ht[f32_to_fp16(s[j] * inv)];
            for (int d = 0; d < dv; ++d) o[d] += p * ht[v[d]];
        }
    }
}

}  // namespace lowbit::ref
