// The blocks of Gemma's on-device models around the layers (llama.cpp's gemma3n and gemma4 graphs):
// per-layer embeddings (Gemma 3n, Gemma 4 E2B / E4B), and Gemma 3n's AltUp residual streams and
// LAuReL. Shapes: T tokens, dim, P = ple_dim, A = altup streams (Gemma 3n: 4), L = n_layer.
//
//   ple_inputs   ple_[T][L][P] = (RMSNorm(per_layer_model_proj . x / sqrt(dim)) +
//                per_layer_token_embd[token] * sqrt(P)) / sqrt(2), x the scaled embeddings
//   ple_out      out[T][dim] = RMSNorm(proj . (gelu(inp_gate . in) * ple_[t][l]))   (gelu * input:
//                GeGLU's epilogue, the same bits as ggml_gelu then ggml_mul)
//   altup_init   streams_[T][A][dim]: stream 0 the embeddings x; stream i >= 1 altup_proj[i-1] . x
//                rescaled to x's L2 norm per token ((s * |x|) / |s|, ggml's mul then div)
//   altup_predict  modalities m = tanh(router . (RMSNorm(stream[act]) / dim)) [A]; coefficients
//                C = predict_coef . m [A][A] (row j, column k); preds_[j] = sum_k C[j][k] stream[k]
//                + stream[j]; the layer runs on x_ = preds_[act]
//   laurel       lau_ = h + RMSNorm(laurel_r . laurel_l . h), h the layer's attn_norm output; after
//                the attention: x_ = (x_ + lau_) / sqrt(2)
//   altup_correct  m from the layer's output y = x_; c = correct_coef . m + 1 [A]; streams_[j] =
//                (y - preds_[act]) c[j] + preds_[j]; then streams 1.. += ple_out(l, streams_[act] *
//                correct_scale) (stream 0 takes none: llama.cpp's slice view)
//   altup_merge  x_ = (stream 0 + sum_{i >= 1} u_i) / A, u_i = altup_unembd_proj[i-1] . stream i
//                rescaled to |stream act|, summed in stream order
// Every per-token step is computed token by token in a fixed order (no dependence on T or the
// threads), so a prompt's chunking leaves each token's bits unchanged (I8).
#include <cmath>
#include <cstring>

#include "engine.h"
#include "kernels.h"

namespace lowbit {

// sqrt(sum of squares) of n floats, as ggml's sqrt(sum_rows(sqr(x))): each square in float, the
// sum in double, rounded to float, then sqrtf
static float magnitude(const float *x, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += (double)(x[i] * x[i]);
    return std::sqrt((float)s);
}

void Engine::ple_inputs(const int32_t *tokens, int T) {
    const int P = c_.ple_dim, dim = c_.dim;
    const size_t W = (size_t)P * c_.n_layer, n = (size_t)T * W;
    ple_.resize(n);
    ple_tmp_.resize(n);
    matmul(ple_model_proj_, x_.data(), T, ple_.data());  // x_: the scaled embeddings
    const float proj_scale = 1.0f / std::sqrt((float)dim), tok_scale = std::sqrt((float)P);
    for (size_t i = 0; i < n; ++i) ple_[i] *= proj_scale;
    rmsnorm(ple_.data(), ple_proj_norm_, ple_.data(), (int)(n / P), P);  // per layer's P values
    const dequant_fn deq = kernel_entry(ple_embd_.type).dequant;
    for (int t = 0; t < T; ++t) deq(ple_embd_.w + (size_t)tokens[t] * ple_embd_.stride, ple_tmp_.data() + t * W, (int64_t)W, ple_embd_.scale);
    const float input_scale = 1.0f / std::sqrt(2.0f);
    for (size_t i = 0; i < n; ++i) ple_[i] = (ple_[i] + ple_tmp_[i] * tok_scale) * input_scale;
}

void Engine::ple_out(int layer, const float *in, int T, float *out) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int P = c_.ple_dim;
    ple_tmp_.resize((size_t)T * P);
    matmul(L.ple_gate, in, T, ple_tmp_.data());
    const glu_fn glu = kernel_table().glu.fn;  // ggml_gelu then ggml_mul: GeGLU's epilogue, the same bits
    for (int t = 0; t < T; ++t) {
        float *g = ple_tmp_.data() + (size_t)t * P;
        glu(g, ple_.data() + ((size_t)t * c_.n_layer + layer) * P, g, P, GLU_GEGLU);
    }
    matmul(L.ple_proj, ple_tmp_.data(), T, out);
    rmsnorm(out, L.ple_post_norm, out, T, c_.dim);
}

void Engine::ple_block(int layer, int T) {  // gemma4: x_ += ple_out(x_)
    ple_out(layer, x_.data(), T, h_.data());
    for (size_t i = 0; i < (size_t)T * c_.dim; ++i) x_[i] = x_[i] + h_[i];  // ggml_add(pe_in, cur)
}

void Engine::altup_modalities(int layer, const float *x, int T, float *mod) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int A = c_.altup, dim = c_.dim;
    atmp_.resize((size_t)dim);
    const float s = 1.0f / (float)dim;  // (ggml_scale by 1 / n_embd)
    for (int t = 0; t < T; ++t) {
        rmsnorm(x + (size_t)t * dim, L.altup_router_norm, atmp_.data(), 1, dim);
        for (int i = 0; i < dim; ++i) atmp_[(size_t)i] *= s;
        for (int a = 0; a < A; ++a) {
            const float *r = L.altup_router + (size_t)a * dim;
            float d = 0.0f;
            for (int i = 0; i < dim; ++i) d += r[i] * atmp_[(size_t)i];
            mod[(size_t)t * A + a] = std::tanh(d);
        }
    }
}

void Engine::altup_init(int T) {
    const int A = c_.altup, dim = c_.dim;
    const size_t S = (size_t)A * dim;  // one token's streams
    streams_.resize((size_t)T * S);
    preds_.resize((size_t)T * S);
    const size_t R = (size_t)(A - 1) * dim;
    atmp_.resize((size_t)T * R);
    matmul(altup_proj_, x_.data(), T, atmp_.data());  // [T][A-1][dim]: every projection of x at once
    for (int t = 0; t < T; ++t) {
        const float *x = x_.data() + (size_t)t * dim;
        float *st = streams_.data() + (size_t)t * S;
        std::memcpy(st, x, sizeof(float) * dim);
        const float target = magnitude(x, dim);
        for (int i = 1; i < A; ++i) {
            const float *p = atmp_.data() + (size_t)t * R + (size_t)(i - 1) * dim;
            const float now = magnitude(p, dim);
            for (int e = 0; e < dim; ++e) st[(size_t)i * dim + e] = p[e] * target / now;
        }
    }
}

void Engine::altup_predict(int layer, int T) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int A = c_.altup, act = c_.altup_act, dim = c_.dim;
    const size_t S = (size_t)A * dim;
    amod_.resize((size_t)T * A);
    x_.resize((size_t)T * dim);
    for (int t = 0; t < T; ++t)  // the router reads the active stream
        std::memcpy(x_.data() + (size_t)t * dim, streams_.data() + (size_t)t * S + (size_t)act * dim, sizeof(float) * dim);
    altup_modalities(layer, x_.data(), T, amod_.data());
    float C[64];  // [A][A] (A <= 8: the engine's check)
    for (int t = 0; t < T; ++t) {
        const float *m = amod_.data() + (size_t)t * A;
        for (int o = 0; o < A * A; ++o) {  // predict_coef row o (= j * A + k) . m
            float d = 0.0f;
            for (int a = 0; a < A; ++a) d += L.altup_predict[(size_t)o * A + a] * m[a];
            C[o] = d;
        }
        const float *st = streams_.data() + (size_t)t * S;
        float *pr = preds_.data() + (size_t)t * S;
        for (int j = 0; j < A; ++j)
            for (int e = 0; e < dim; ++e) {
                float d = 0.0f;
                for (int k = 0; k < A; ++k) d += st[(size_t)k * dim + e] * C[j * A + k];
                pr[(size_t)j * dim + e] = d + st[(size_t)j * dim + e];
            }
        std::memcpy(x_.data() + (size_t)t * dim, pr + (size_t)act * dim, sizeof(float) * dim);
    }
}

void Engine::laurel(int layer, int T) {
    const LayerWeights &L = layers_[(size_t)layer];
    const size_t n = (size_t)T * c_.dim;
    lau_.resize(n);
    atmp_.resize((size_t)T * L.laurel_l.rows);
    matmul(L.laurel_l, h_.data(), T, atmp_.data());
    matmul(L.laurel_r, atmp_.data(), T, lau_.data());
    rmsnorm(lau_.data(), L.laurel_post_norm, lau_.data(), T, c_.dim);
    for (size_t i = 0; i < n; ++i) lau_[i] = lau_[i] + h_[i];
}

void Engine::altup_correct(int layer, int T) {
    const LayerWeights &L = layers_[(size_t)layer];
    const int A = c_.altup, act = c_.altup_act, dim = c_.dim;
    const size_t S = (size_t)A * dim;
    amod_.resize((size_t)T * A);
    altup_modalities(layer, x_.data(), T, amod_.data());
    for (int t = 0; t < T; ++t) {
        const float *m = amod_.data() + (size_t)t * A, *y = x_.data() + (size_t)t * dim;
        const float *pr = preds_.data() + (size_t)t * S;
        float *st = streams_.data() + (size_t)t * S;
        for (int j = 0; j < A; ++j) {
            float c = 0.0f;
            for (int a = 0; a < A; ++a) c += L.altup_correct[(size_t)j * A + a] * m[a];
            c = c + 1.0f;
            for (int e = 0; e < dim; ++e)
                st[(size_t)j * dim + e] = (y[e] - pr[(size_t)act * dim + e]) * c + pr[(size_t)j * dim + e];
        }
        float *fp = h_.data() + (size_t)t * dim;  // the per-layer block's input: the active stream times the scale
        for (int e = 0; e < dim; ++e) fp[e] = st[(size_t)act * dim + e] * L.altup_correct_scale[e];
    }
    ple_out(layer, h_.data(), T, h_.data());
    for (int t = 0; t < T; ++t)
        for (int j = 1; j < A; ++j)
            for (int e = 0; e < dim; ++e) streams_[(size_t)t * S + (size_t)j * dim + e] += h_[(size_t)t * dim + e];
}

void Engine::altup_merge(int T) {
    const int A = c_.altup, act = c_.altup_act, dim = c_.dim;
    const size_t S = (size_t)A * dim;
    atmp_.resize((size_t)T * dim);
    std::vector<float> &u = preds_;  // (free after the last layer's correction: [A-1][T][dim] of its [T][A][dim])
    for (int i = 1; i < A; ++i) {  // slice i - 1 of altup_unembd_proj on stream i
        for (int t = 0; t < T; ++t)
            std::memcpy(atmp_.data() + (size_t)t * dim, streams_.data() + (size_t)t * S + (size_t)i * dim, sizeof(float) * dim);
        Mat slice = altup_unembd_;
        slice.w += (size_t)(i - 1) * dim * slice.stride;
        slice.rows = dim;
        matmul(slice, atmp_.data(), T, u.data() + (size_t)(i - 1) * T * dim);
    }
    for (int t = 0; t < T; ++t) {
        const float *st = streams_.data() + (size_t)t * S;
        const float target = magnitude(st + (size_t)act * dim, dim);
        float *x = x_.data() + (size_t)t * dim;
        std::memcpy(x, st, sizeof(float) * dim);  // stream 0
        for (int i = 1; i < A; ++i) {
            const float *p = u.data() + ((size_t)(i - 1) * T + t) * dim;
            const float now = magnitude(p, dim);
            for (int e = 0; e < dim; ++e) x[e] = x[e] + p[e] * target / now;
        }
        const float inv = 1.0f / (float)A;
        for (int e = 0; e < dim; ++e) x[e] *= inv;
    }
}

}  // namespace lowbit
