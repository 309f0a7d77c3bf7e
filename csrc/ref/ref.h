// Scalar reference kernels: the spec every SIMD level is tested against.
//
// Each format provides one single-row, single-token dot in ggml's arithmetic order
// (integer sums per block, then the block's float scales), and the generic row kernel
// below runs it over rows x tokens. It never reorders a token's arithmetic, so it keeps
// I2 (width invariance) and I3 (split invariance) by construction.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../fp16.h"
#include "../kernels.h"

namespace lowbit::ref {

// dot(W row, activation row) for n weights; w_scale is the per-tensor scale (I2_S).
using dot_fn = float (*)(const uint8_t *w, const uint8_t *act, int64_t n, float w_scale);

template <dot_fn DOT>
void rows(const RowArgs &a, int64_t r0, int64_t r1, int nt) {
    for (int64_t r = r0; r < r1; ++r) {
        const uint8_t *w = a.w + (size_t)r * a.w_stride;
        for (int t = 0; t < nt; ++t)
            a.out[(size_t)t * a.out_stride + r] = DOT(w, a.act + (size_t)t * a.act_stride, a.n, a.w_scale);
    }
}

// ggml's nearest_int: round half to even through the 1.5*2^23 trick, valid for |x| < 2^22.
inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    std::memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

// DeepSeek MLA attention over a half latent cache (contract: mla_f16_fn in kernels.h).
void mla_f16(const float *q, int nq, const int32_t *lens, const uint16_t *K, const uint16_t *V, int dk, int dv,
             size_t kd, float scale, const float *sinks, float softcap, float *sc, float *out);
// The engine's attention over a half KV cache (contract: attn_f16_fn in kernels.h).
void attend_f16(const float *q, const uint16_t *K, const uint16_t *V, int len, int hd, size_t kd, float scale,
                float sink, float softcap, float *sc, float *out);

// The engine's attention over a quantized KV cache (contract: attn_q_fn in kernels.h) and its
// exp (every level computes the same function bit for bit).
void attend_q(const uint8_t *qq, int k_type, const uint8_t *K, size_t ks, int v_type, const uint8_t *V, size_t vs,
              int len, int hd, float scale, float sink, float softcap, float *sc, float *out);
float attn_exp(float x);
// The attention soft-cap (kernels.h, attn_f16_fn's softcap): tanh by attn_exp, and the scores
// s[0..n) capped in place, s[j] = cap * attn_tanh(s[j] * (1 / cap)); returns their max (-inf for n = 0).
float attn_tanh(float x);
float softcap_scores(float *s, int n, float cap);

// The GLU epilogue (contract: glu_fn in kernels.h) and its exp, exposed for the tests'
// understanding of the levels: every SIMD level must equal these bit for bit.
float glu_expf(float x);
void glu(const float *g, const float *u, float *out, int64_t n, int kind);
// GLU_GEGLU's table: [65536] floats, entry h = fp16(gelu(half h)) (ggml's ggml_table_gelu_f16)
const float *gelu_table();

// MXFP4's code book (e2m1 values doubled; mxfp4.cpp) and half its e8m0 scale, 2^(e - 128), as
// float bits: a normal float for e >= 2 (biased float exponent e - 1), the denormals 2^-128 and
// 2^-127 for e = 0, 1. e = 255 (e8m0's NaN) gives 2^127, as in ggml (which does not treat the NaN
// either). Inline: the SIMD levels' per-block scale too (integer code, no ISA).
extern const int8_t kvalues_mxfp4[16];
inline float e8m0_half(uint8_t e) { return bits_to_f32(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23); }

// Registration of each family into the table (scalar level).
void register_legacy(KernelTable &t);    // Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
void register_kquants(KernelTable &t);   // Q2_K .. Q6_K
void register_iquants(KernelTable &t);   // IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_NL IQ4_XS IQ1_S IQ1_M
void register_ternary(KernelTable &t);   // TQ1_0 TQ2_0 I2_S (+ I8_S activations, I2_S quantizer)
void register_mxfp4(KernelTable &t);     // MXFP4 x Q8_0 (+ its quantizer)
void register_float(KernelTable &t);     // F32 F16 BF16 rows against F32 activations
void register_act(KernelTable &t);       // Q8_0 Q8_1 Q8_K activation quantizers (+ their dequant)
// the gated delta rule of one token on one value head (contract: delta_fn in kernels.h)
void delta_rule(float *M, const float *k, const float *q, const float *v, float decay, float beta, float scale,
                float *o, int S);
// The Mamba-2 state update of one token on one head (contract: scan_fn in kernels.h).
void ssm_scan(float *s, const float *B, const float *C, const float *x, float dt, float dA, float *y, int P, int N);
void register_glu(KernelTable &t);       // the FFN's gate/up epilogue (SiLU, ReLU^2)

}  // namespace lowbit::ref
