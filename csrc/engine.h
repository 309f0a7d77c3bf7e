// The forward pass of a dense decoder-only transformer (llama / qwen2 / qwen3 families),
// one native call per step: Python sets the weights once (views into the GGUF mmap, no
// copies) and then calls forward(tokens, pos) for a prompt chunk, a decode step or a
// speculative verify window.
//
// Families differ by config fields only (rope style, q/k norm, biases). Every token's
// arithmetic is the same whether it runs alone or in a window (the row kernels keep I2;
// attention computes each query row on its own), so greedy speculative decoding is exact.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels.h"

namespace lowbit {

// One weight matrix as the row kernels see it: rows x n values, raw GGUF bytes.
struct Mat {
    int type = -1;               // format id; -1: absent
    const uint8_t *w = nullptr;  // row r at w + r * stride
    size_t stride = 0;
    int64_t rows = 0, n = 0;
    float scale = 1.0f;          // per-tensor scale (I2_S), applied inside the row kernel
    // Per-tensor output scale (llama.cpp's optional `blk.N.<matrix>.scale` tensors, bitnet
    // family): y = (W x) * out_scale, one float multiply per output as ggml_mul does.
    // set_mat keeps the value a previous set_vec("<matrix>.scale") gave it.
    float out_scale = 1.0f;
    bool present() const { return type >= 0; }
};

struct LayerWeights {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;  // [dim]
    const float *q_norm = nullptr, *k_norm = nullptr;       // [head_dim] (qwen3)
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr; // [n_head*hd], [n_kv*hd] (qwen2)
    // BitNet sub-norms (EngineConfig::sub_norm): RMSNorm of the attention output before wo
    // [n_head*hd], and of the FFN activation before ffn_down [ffn].
    const float *attn_sub_norm = nullptr, *ffn_sub_norm = nullptr;
    Mat wq, wk, wv, wo, wgate, wup, wdown;
};

struct EngineConfig {
    int n_layer = 0, dim = 0, n_head = 0, n_kv = 0, head_dim = 0, ffn = 0, vocab = 0, n_ctx = 0;
    float eps = 1e-5f;
    float rope_base = 10000.0f;
    float rope_scale = 1.0f;     // linear scaling: positions are multiplied by this (1/factor)
    int rope_dims = 0;           // rotated dims per head (<= head_dim)
    bool rope_neox = false;      // false: adjacent pairs (x[2i], x[2i+1]); true: (x[i], x[i+d/2])
    bool kv_f16 = true;          // KV cache in IEEE half (as llama.cpp's default), else float32
    // BitNet families (bitnet, bitnet-b1.58): attn_sub_norm / ffn_sub_norm are required.
    bool sub_norm = false;
    // FFN gate activation: FFN_SILU: silu(gate) * up (llama, qwen, llama.cpp's bitnet);
    // FFN_RELU2: relu(gate)^2 * up (bitnet.cpp's bitnet-b1.58, BitNet b1.58 2B-4T).
    int ffn_act = 0;
};
enum FfnAct : int { FFN_SILU = 0, FFN_RELU2 = 1 };

class Engine {
public:
    explicit Engine(const EngineConfig &c);
    void set_mat(const std::string &name, int layer, const Mat &m);
    void set_vec(const std::string &name, int layer, const float *v, int64_t len);
    void set_threads(int t) { threads_ = t; }
    // Run tokens[0..T) at positions pos..pos+T-1 (the KV cache holds positions < pos).
    // logits: [T][vocab] if all_logits, else [1][vocab] for the last token.
    void forward(const int32_t *tokens, int T, int pos, float *logits, bool all_logits);
    const EngineConfig &config() const { return c_; }
    // Check every required weight is set and shaped right; returns "" or the problem.
    std::string validate() const;

private:
    // reuse_act: x is the same input as the previous matmul's (q/k/v, gate/up): its
    // quantized copy is reused when the activation format is the same.
    void matmul(const Mat &m, const float *x, int T, float *out, bool reuse_act = false);
    void rmsnorm(const float *x, const float *w, float *out, int T, int len) const;
    void rope(float *v, int T, int pos, int heads) const;
    void attention(int layer, const float *q, int T, int pos, float *out);

    EngineConfig c_;
    std::vector<LayerWeights> layers_;
    Mat embd_, output_;
    const float *out_norm_ = nullptr;
    std::vector<float> inv_freq_;        // per rotated pair: base^(-2i/d) / factor_i
    // [layer][n_ctx][n_kv*head_dim], in half (kv_f16) or float32; one of each pair is empty
    std::vector<uint16_t> k16_, v16_;
    std::vector<float> k32_, v32_;
    std::vector<float> x_, h_, q_, k_, v_, att_, g_, u_;
    std::vector<uint8_t> act_;
    int act_type_ = -1;  // format of what act_ holds (-1: nothing reusable)
    int threads_ = 0;
};

}  // namespace lowbit
