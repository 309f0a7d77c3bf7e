// The forward pass of a dense decoder-only transformer (llama / qwen2 / qwen3 families),
// one native call per step: Python sets the weights once (views into the GGUF mmap, no
// copies) and then calls forward(tokens, pos) for a prompt chunk, a decode step or a
// speculative verify window.
//
// Families differ by config fields only (rope style, q/k norm, biases). Every token's
// arithmetic is the same whether it runs alone or in a window (the row kernels keep I2;
// attention computes each query row on its own), so greedy speculative decoding is exact.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels.h"
#include "prefetch_mode.h"
#include <unordered_map>

namespace lowbit {

// n elements of T, all zero, in memory the kernel commits page by page as it is first written
// (an anonymous mapping): the KV cache of n_slots x n_ctx positions costs resident memory only for
// the slots a server really runs (Engine::use_slot, commit_pages), not for every slot it may run.
// Neither copied nor moved; size 0 maps nothing.
template <class T>
class ZeroArray {
public:
    ZeroArray() = default;
    ZeroArray(const ZeroArray &) = delete;
    ZeroArray &operator=(const ZeroArray &) = delete;
    ~ZeroArray() { release(); }
    // n zeros (engine.cpp); throws std::bad_alloc when it cannot be mapped. huge: on 2 MB pages
    // where the kernel has transparent huge pages (madvise mode included)
    void reset(size_t n, bool huge = false);
    T *data() { return p_; }
    const T *data() const { return p_; }
    size_t size() const { return n_; }
    bool empty() const { return n_ == 0; }

private:
    void release();
    T *p_ = nullptr;
    size_t n_ = 0;
    void *map_ = nullptr;  // the mapping (p_ rounded up to 2 MB within it when huge)
    size_t map_bytes_ = 0;
};

struct ActOut;  // csrc/matmul.h

// ggml's scalar silu and softplus (ggml_silu_f32, ggml_compute_softplus_f32), as the blocks'
// elementwise steps use them (csrc/deltanet.cpp, csrc/mamba2.cpp, the ungated FFN).
inline float silu_f32(float x) { return x / (1.0f + std::exp(-x)); }
inline float softplus_f32(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

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
    // The kernels of the layout w is in: nullptr, the format's own (kernel_entry(type)); else a
    // repacked layout's (Engine::set_mat repacks Q4_K matrices at load: csrc/repack.h)
    const KernelEntry *k = nullptr;
    const uint8_t *src = nullptr;  // the bytes as bound, when w is a repacked copy (names the matrix: record_act)
    bool present() const { return type >= 0; }
};
inline const KernelEntry &entry_of(const Mat &m) { return m.k ? *m.k : kernel_entry(m.type); }

// Bytes of a weight matrix's rows (what one pass over it streams).
inline double mat_bytes(const Mat &m) { return m.present() ? (double)m.rows * (double)m.stride : 0.0; }
using Clock = std::chrono::steady_clock;
inline Clock::time_point now() { return Clock::now(); }
inline double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Channels per block of the recurrent layers' conv1d (Engine::conv_runs; LayerWeights::conv_wT).
constexpr int kConvBlock = 64;

struct LayerWeights {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;  // [dim]
    const float *attn_norm_b = nullptr, *ffn_norm_b = nullptr;  // [dim] a LayerNorm's bias (starcoder2, phi2)
    const float *ffn_up_b = nullptr, *ffn_down_b = nullptr;    // an ungated FFN's biases [ffn], [dim] (starcoder2, phi2)
    const float *q_norm = nullptr, *k_norm = nullptr;       // [head_dim] (qwen3)
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr; // [n_head*hd], [n_kv*hd] (qwen2)
    // BitNet sub-norms (EngineConfig::sub_norm): RMSNorm of the attention output before wo
    // [n_head*hd], and of the FFN activation before ffn_down [ffn].
    const float *attn_sub_norm = nullptr, *ffn_sub_norm = nullptr;
    Mat wq, wk, wv, wo, wgate, wup, wdown;
    // Mixture of experts (n_expert > 0): the router and the experts' 3-D GGUF tensors seen
    // as one matrix each, expert e's rows at e * rows_per_expert (csrc/moe.cpp).
    Mat router;                           // ffn_gate_inp  [n_expert, dim]
    Mat gate_exps, up_exps, down_exps;    // [n_expert * expert_ffn, dim], [n_expert * dim, expert_ffn]
    Mat sh_gate, sh_up, sh_down;          // qwen2moe's shared expert [shexp_ffn, dim], [dim, shexp_ffn]
    Mat sh_gate_inp;                      // its sigmoid gate [1, dim]
    // Attention variants (gpt-oss; Gemma 3 and GLM reuse them):
    int window = 0;                       // sliding window: a query at p sees keys p-window+1..p (0: all)
    bool rope = true;                     // false: q / k not rotated (SmolLM3's every 4th layer, NoPE)
    const float *attn_sinks = nullptr;    // [n_head] a learned logit per head in the softmax (no value)
    const float *bo = nullptr;            // attn_output bias [dim]
    // Biases of the router and the experts (gpt-oss), expert e's at e * rows_per_expert:
    const float *router_b = nullptr;      // [n_expert], added to the router logits
    const float *gate_exps_b = nullptr, *up_exps_b = nullptr;  // [n_expert * expert_ffn]
    const float *down_exps_b = nullptr;   // [n_expert * dim], added before the routing weight
    // Gemma 3: RMSNorms of the attention output (after wo) and of the FFN output, each before its
    // residual add (llama.cpp's attn_post_norm "post_attention_norm", ffn_post_norm "post_ffw_norm").
    const float *attn_post_norm = nullptr, *ffn_post_norm = nullptr;  // [dim]
    // GLM-4.5 / DeepSeek-V3 routing: the expert selection bias (exp_probs_b), added to the
    // sigmoid (or softmax) probabilities for choosing the top-K only (the weights stay unbiased).
    const float *exp_probs_b = nullptr;   // [n_expert]
    // Gated delta-net linear attention (EngineConfig::recurrent layers; csrc/deltanet.cpp), with
    // S = ssm_state, H_k = ssm_groups, H_v = ssm_heads, conv_dim = 2 * H_k * S + H_v * S:
    Mat wqkv;                             // attn_qkv  [conv_dim, dim]: q [H_k][S], k [H_k][S], v [H_v][S]
    Mat wqkv_gate;                        // attn_gate [H_v * S, dim]: z, the output gate (silu)
    Mat ssm_alpha, ssm_beta;              // [H_v, dim] each (qwen35 / qwen35moe)
    Mat ssm_ba;                           // [2 H_v, dim] (qwen3next): per q/k head g, [beta (r), alpha (r)], r = H_v / H_k
    Mat ssm_out;                          // [dim, H_v * S]
    const float *ssm_conv1d = nullptr;    // [conv_dim][K]: channel c's causal kernel, oldest tap first
    std::vector<float> conv_wT;           // the same taps per block of kConvBlock channels, transposed:
                                          // [conv_dim / kConvBlock, rounded up][K][kConvBlock] (conv_runs)
    const float *ssm_dt = nullptr;        // [H_v] bias of alpha
    const float *ssm_a = nullptr;         // [H_v] -exp(A_log) as the converter stores it
    const float *ssm_norm = nullptr;      // [S] RMSNorm weight of each head's output
    // LFM2's short-conv block (EngineConfig::shortconv; csrc/shortconv.cpp), its conv taps in ssm_conv1d [dim][K]:
    Mat sc_in;                            // shortconv.in_proj  [3 dim, dim]: b, c, x
    Mat sc_out;                           // shortconv.out_proj [dim, dim]
    // Mamba-2 (EngineConfig::mamba2; csrc/mamba2.cpp), with N = ssm_state, G = ssm_groups, H = ssm_heads,
    // d_inner = ssm_inner (P = d_inner / H channels per head), conv_dim = d_inner + 2 G N; its conv taps
    // in ssm_conv1d [conv_dim][K], the step bias in ssm_dt [H], A in ssm_a [H], ssm_norm [d_inner]
    // (G groups of d_inner / G), ssm_out [dim, d_inner]:
    Mat ssm_in;                           // ssm_in [2 d_inner + 2 G N + H, dim]: z, x|B|C (the conv's input), dt
    const float *ssm_conv1d_b = nullptr;  // [conv_dim] added after the conv, before its silu (null: none)
    const float *ssm_d = nullptr;         // [H] the skip: y += x * D per head
    const float *ssm_dt_norm = nullptr, *ssm_b_norm = nullptr, *ssm_c_norm = nullptr;  // Jamba's Mamba-1: [R], [N], [N]
    // Mamba-1 (EngineConfig::mamba1; csrc/mamba1.cpp), with d_inner = ssm_inner, N = ssm_state, R =
    // ssm_dt_rank: ssm_in [2 d_inner, dim] (x, z), ssm_conv1d [d_inner][K] and its bias, ssm_x
    // [R + 2 N, d_inner] (dt, B, C), ssm_dtw [d_inner, R] (dt_proj) and its bias in ssm_dt [d_inner],
    // A in ssm_a [d_inner][N], ssm_d [d_inner], ssm_out [dim, d_inner]:
    Mat ssm_x, ssm_dtw;
    bool recurrent = false;               // a delta-net, short-conv, Mamba-2 or Mamba-1 layer (else attention; falcon-h1: both)
    // The layer's two blocks (EngineConfig::layer_parts): its mixer (attention or recurrent, after
    // attn_norm) and its FFN (after ffn_norm). Nemotron-H's layers have one of them each.
    bool has_mixer = true, has_ffn = true;
    // DeepSeek multi-head latent attention (EngineConfig::mla_rank > 0; csrc/mla.cpp), R = mla_rank,
    // hd = head_dim = nope + rope (rope = rope_dims), vd = mla_v_dim, Rq = q_lora_rank:
    Mat wq_a, wq_b;                       // attn_q_a [Rq, dim], attn_q_b [n_head * hd, Rq] (or wq, Rq = 0)
    Mat wkv_a;                            // attn_kv_a_mqa [R + rope, dim]: the latent c_kv, then k_pe
    Mat wk_b;                             // attn_k_b [n_head * R, nope]: head h's rows at h * R
    Mat wv_b;                             // attn_v_b [n_head * vd, R]: head h's rows at h * vd
    const float *q_a_norm = nullptr;      // [Rq]
    const float *kv_a_norm = nullptr;     // [R]
    const float *out_scale = nullptr;     // gemma4's layer_output_scale [1]: the residual stream times it after the layer
    // Gemma 4's MoE layer (EngineConfig::moe_mlp; Engine::moe_beside_mlp): the norms of its dense MLP's
    // output (post_ffw_norm_1), of the experts' input (pre_ffw_norm_2) and output (post_ffw_norm_2),
    // the router input's per-channel scale (ffn_gate_inp.scale) [dim], and per expert a scale of
    // its down projection's output (ffn_down_exps.scale, optional) [n_expert]
    const float *ffn_post_norm_1 = nullptr, *ffn_pre_norm_2 = nullptr, *ffn_post_norm_2 = nullptr;
    const float *router_in_scale = nullptr, *down_exps_s = nullptr;
    // Gemma 4 E2B / E4B's per-layer embedding block (EngineConfig::ple_dim = P): inp_gate [P, dim],
    // proj [dim, P], post_norm [dim]
    Mat ple_gate, ple_proj;
    const float *ple_post_norm = nullptr;
    // Gemma 3n (EngineConfig::altup = A): the router [A][dim] and its norm [dim], the prediction
    // coefficients [A * A][A], the correction coefficients [A][A] and scale [dim]; LAuReL's
    // low-rank pair laurel_l [rank, dim], laurel_r [dim, rank] and its post-norm [dim]
    const float *altup_router = nullptr, *altup_router_norm = nullptr, *altup_predict = nullptr;
    const float *altup_correct = nullptr, *altup_correct_scale = nullptr;
    Mat laurel_l, laurel_r;
    const float *laurel_post_norm = nullptr;
};

// One item of the MoE expert pool's work list (moe.cpp): rows [r0, r1) of expert e's matrix.
struct MoeItem { int e, r0, r1; };

// Per-layer counters of the forward passes since the last reset (lowbit run --stats).
struct LayerStats {
    int64_t calls = 0, tokens = 0;
    int64_t distinct_experts = 0;  // summed over calls: experts used by at least one token of the window
    double weight_bytes = 0;       // weight bytes the row kernels streamed (each matrix row once per call)
    double t_attn = 0, t_router = 0, t_experts = 0, t_ffn = 0;  // seconds (t_ffn: dense FFN / shared expert)
    double t_attn_core = 0;        // seconds in the attention kernel itself (part of t_attn)
};

struct EngineConfig {
    int n_layer = 0, dim = 0, n_head = 0, n_kv = 0, head_dim = 0, ffn = 0, vocab = 0, n_ctx = 0;
    float eps = 1e-5f;
    float rope_base = 10000.0f;
    float rope_scale = 1.0f;     // linear scaling: positions are multiplied by this (1/factor)
    int rope_dims = 0;           // rotated dims per head (<= head_dim)
    bool rope_neox = false;      // false: adjacent pairs (x[2i], x[2i+1]); true: (x[i], x[i+d/2])
    bool kv_f16 = true;          // KV cache in IEEE half (as llama.cpp's default), else float32
    // With kv_f16: the K and V caches' formats, each T_F16 (as llama.cpp's default), T_Q8_0 or
    // T_Q4_0 (ggml's blocks of 32 along head_dim, quantized as llama.cpp writes its cache; a
    // quantized cache runs kernel_table().attnq / kernel_table().attnq_rows, llama.cpp's flash-attention
    // arithmetic). A quantized V needs a quantized K (the kernel's pairs); either quantized needs
    // head_dim % 32 == 0.
    int kv_k = T_F16, kv_v = T_F16;
    // BitNet families (bitnet, bitnet-b1.58): attn_sub_norm / ffn_sub_norm are required.
    bool sub_norm = false;
    // FFN gate activation: FFN_SILU: silu(gate) * up (llama, qwen, llama.cpp's bitnet);
    // FFN_RELU2: relu(gate)^2 * up (bitnet.cpp's bitnet-b1.58, BitNet b1.58 2B-4T). A layer without
    // ffn_gate (nemotron_h's MLP) runs down(act(up . x)) with act relu^2 (FFN_RELU2) or silu.
    int ffn_act = 0;
    int n_slots = 1;             // KV slots (sequences), each n_ctx positions, allocated up front
    bool qk_norm_full = false;   // q/k RMSNorm over the whole q / k vector (olmoe), not per head
    // Mixture of experts: n_expert == 0 for a dense model.
    int n_expert = 0, n_expert_used = 0, expert_ffn = 0;
    int shexp_ffn = 0;           // qwen2moe's shared expert width (0: none)
    bool expert_norm = false;    // renormalise the top-K probabilities to sum 1 (qwen3moe, mixtral)
    float expert_scale = 1.0f;   // the routing weights' scale (GGUF expert_weights_scale; 1: none)
    // How the routing weights come from the router logits (llama.cpp's gating functions):
    // EXPERT_SOFTMAX: softmax over all E, then top-K (qwen*moe, mixtral, olmoe);
    // EXPERT_SOFTMAX_TOPK: top-K of the logits, then a softmax over those K (gpt-oss's
    // SOFTMAX_WEIGHT).
    int expert_gating = 0;
    // YaRN rope (llama.cpp's rope_yarn, with rope_scale as its freq_scale): yarn_ext_factor 0
    // is off; else pair i's angle mixes interpolation (pos * freq_scale * theta_i) and
    // extrapolation (pos * theta_i) by a ramp over the correction dims of yarn_orig_ctx,
    // yarn_beta_fast / _slow, and cos / sin are scaled by yarn_attn_factor * (1 + 0.1 ln(1 /
    // freq_scale)). yarn_attn_factor is llama.cpp's cparams value (it cancels that factor's
    // rounding for files without a log multiplier: near 1 / (1 + 0.1 ln factor) * mscale).
    // Without YaRN, cos / sin are scaled by yarn_attn_factor alone (rope.scaling.attn_factor:
    // phi3's LongRoPE; 1 for every other file), as ggml's rope_yarn does with ext_factor 0.
    float yarn_ext_factor = 0.0f, yarn_attn_factor = 1.0f, yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
    int yarn_orig_ctx = 0;
    // Gemma 3 (as llama.cpp's gemma3 graph):
    float embd_scale = 0.0f;     // token embeddings times this (gemma: sqrtf(dim)); 0: none
    float attn_scale = 0.0f;     // q times this after rope, then softmax(q.k) unscaled; 0: 1/sqrt(head_dim)
    float rope_base_swa = 0.0f;  // sliding-window layers' own rope base (freq scale 1); 0: as the others
    float logit_softcap = 0.0f;  // final logits: cap * tanh(logit / cap); 0: none
    float attn_softcap = 0.0f;   // Gemma 2: every attention score cap * tanh(score / cap) (softcap_scores); 0: none
    // Mistral 3 (llama.cpp's llama-4 attention temperature, llm_graph_input_attn_temp): after rope,
    // q of the token at position p times log(floor(p / attn_temp_floor) + 1) * attn_temp_scale + 1
    // (in double, stored as float, as llama.cpp's input); 0: none.
    float attn_temp_scale = 0.0f;
    int attn_temp_floor = 0;
    // Granite (llama.cpp's granite graph): attention and FFN outputs times residual_scale before
    // their residual adds (0: none); the logits times 1 / logit_scale (0: none).
    float residual_scale = 0.0f;
    float logit_scale = 0.0f;
    // Command-R / Cohere2 (llama.cpp's command-r, cohere2 graphs): every norm is a LayerNorm
    // (ggml_norm: x - mean over the row, times 1 / sqrt(variance + eps), then times the weight; no
    // bias); attention and the FFN both read attn_norm's output and the layer adds x + FFN +
    // attention; the logits times logit_mult (0: none). Command R+'s per-head q / k norms are
    // LayerNorms with one weight row per head (set_vec: n_head * head_dim values).
    // StarCoder2 / Phi-2's LayerNorms have biases (set_vec attn_norm.bias, ffn_norm.bias,
    // output_norm.bias), their ungated FFNs (ffn_ungated, ffn_act FFN_GELU) biases on up and down.
    bool layer_norm = false;
    bool parallel_ffn = false;
    float logit_mult = 0.0f;
    bool post_norms = false;     // attn_post_norm and ffn_post_norm are required
    bool pre_norms = true;       // false: no attn_norm / ffn_norm, a block reads the residual as it is (olmo2)
    // GLM-4.5 (glm4moe) in an MoE model: its first n_dense_lead layers run a dense FFN of width
    // ffn (ffn_gate / ffn_up / ffn_down) instead of the experts; shexp_gated false: the shared
    // expert is added as it is (qwen2moe's is times sigmoid(ffn_gate_inp_shexp . x)).
    int n_dense_lead = 0;
    // Jamba: per layer 1 where the FFN is the experts, 0 where it is dense (empty: every layer from
    // n_dense_lead on)
    std::vector<uint8_t> moe_layers;
    bool shexp_gated = true;
    // Hybrid models (qwen35, qwen35moe, qwen3next): layers marked in `recurrent` are gated
    // delta-net linear attention (csrc/deltanet.cpp), the others gated full attention. A slot
    // then holds, besides the KV of the attention layers, per recurrent layer a conv state
    // ([conv_dim][K-1] past inputs) and a recurrent state ([H_v][S][S] floats).
    std::vector<uint8_t> recurrent;   // [n_layer] 1: delta-net layer (empty: no such layer)
    int ssm_conv = 0;                 // K: the causal conv1d kernel width (ssm.conv_kernel)
    int ssm_state = 0;                // S: the q / k / v head width (ssm.state_size)
    int ssm_groups = 0;               // H_k: q / k heads (ssm.group_count)
    int ssm_heads = 0;                // H_v: value heads (ssm.time_step_rank); ssm.inner_size = H_v * S
    // Which q / k head value head h reads: h % H_k (qwen35: ggml's broadcast), or h / (H_v / H_k)
    // (qwen3next: llama.cpp repeats q / k interleaved).
    bool ssm_kv_interleave = false;
    // LFM2 (lfm2, lfm2moe): the recurrent layers are short-conv blocks (csrc/shortconv.cpp), not
    // delta-net: the conv runs over dim channels with kernel width ssm_conv (shortconv.l_cache), and
    // there is no recurrent matrix state (ssm_state / ssm_groups / ssm_heads unused).
    bool shortconv = false;
    // Mamba-2 (granitehybrid, nemotron_h, nemotron_h_moe): the recurrent layers are Mamba-2 mixers
    // (csrc/mamba2.cpp): ssm_state = N (d_state), ssm_groups = G (B / C groups), ssm_heads = H,
    // ssm_inner = d_inner (H heads of d_inner / H channels), conv kernel ssm_conv over d_inner + 2 G N
    // channels; the recurrent state per head is [d_inner / H][N] floats.
    bool mamba2 = false;
    int ssm_inner = 0;
    // Falcon-H1 (falcon-h1): every layer runs attention and a Mamba-2 mixer side by side on the same
    // attn_norm output and adds their outputs (attn + ssm) before the one residual add; `recurrent`
    // lists every layer, and each also holds KV rows. The Mamba-2 mixer's ssm_norm is optional.
    bool ssm_parallel = false;
    // Mamba-1 (mamba: Mamba, Falcon-Mamba): the recurrent layers are Mamba-1 mixers (csrc/mamba1.cpp):
    // d_inner = ssm_inner channels, each its own state [N = ssm_state] with its own decay per state
    // element; dt from a rank-ssm_dt_rank projection; ssm_dt_b_c_rms: dt, B and C RMS-normed without
    // weights first (Falcon-Mamba). The conv runs over d_inner channels.
    bool mamba1 = false;
    int ssm_dt_rank = 0;
    bool ssm_dt_b_c_rms = false;
    // Per layer which blocks it has (nemotron_h: each layer is a Mamba-2 mixer, attention or an FFN
    // alone, each after its one norm, attn_norm, then the residual add): bit 0 the mixer, bit 1 the
    // FFN; empty: both in every layer. A layer without a mixer holds no KV and no recurrent state.
    std::vector<uint8_t> layer_parts;
    bool ffn_ungated = false;    // nemotron_h: FFNs, experts and shared expert are down(act(up . x)), no gate
    // Gated attention (qwen35 / qwen3next): attn_q yields [q_h (head_dim), gate_h (head_dim)] per
    // head; the attention output is multiplied by sigmoid(gate) before attn_output.
    bool attn_gate = false;
    // Interleaved multi-section rope (llama.cpp's IMROPE for qwen35): rotated pair i is in sector
    // i % sum(sections); text positions are (p, p, p, 0) per section, so the pairs the 4th
    // section owns rotate by angle 0. All zero: plain rope.
    int rope_sections[4] = {0, 0, 0, 0};
    // A pipeline stage (src/lowbit/distributed/): this engine holds layers [layer_begin, layer_end)
    // only (their weights, KV rows and recurrent states), the token embedding only if layer_begin
    // is 0, the output norm and head only if layer_end is n_layer. layer_end 0: all layers.
    int layer_begin = 0, layer_end = 0;
    // DeepSeek V2/V3 multi-head latent attention (llama.cpp's deepseek2 with MLA, csrc/mla.cpp):
    // mla_rank (kv_lora_rank) > 0 makes every attention layer MLA. head_dim is the query / key
    // head width nope + rope (rope = rope_dims, the trailing dims of a q head; the k rope part is
    // one vector shared by all heads); n_kv must be 1. A slot's cache holds per layer and position
    // only [RMSNorm(c_kv) (mla_rank), roped k_pe (rope_dims)], in half (kv_f16) or float32: the
    // compressed cache. q_nope is absorbed into the latent space per head (attn_k_b), the scores
    // are q_abs . c_kv + q_pe . k_pe (one 576-wide dot for V2's sizes, MQA over the latent rows),
    // the output is the weighted sum of c_kv, then attn_v_b per head (width mla_v_dim) and wo.
    int mla_rank = 0;
    int mla_v_dim = 0;
    int q_lora_rank = 0;         // 0: a plain attn_q; else attn_q_a, attn_q_a_norm, attn_q_b
    float mla_kq_scale = 0.0f;   // the softmax scale (llama.cpp's kq_scale: mscale^2 / sqrt(head_dim))
    // Group-limited routing (DeepSeek V3, llama.cpp's n_expert_groups / n_group_used): the experts
    // split into expert_groups groups of consecutive ids; a group's score is the sum of its two best
    // selection scores; top-K is taken within the expert_groups_used best groups. 0: off.
    int expert_groups = 0, expert_groups_used = 0;
    // Per-layer attention geometry (gemma4: a sliding layer has more, narrower KV heads than a full
    // one): layer l has layer_kv[l] KV heads of layer_hd[l] dims and n_head query heads of the same
    // width; empty: n_kv and head_dim everywhere (else they are the largest of the lists). The
    // q / k / v widths, the layer's KV cache rows, its q / k norms and its rope follow.
    std::vector<int> layer_kv, layer_hd;
    int rope_dims_swa = 0;   // rotated dims of a sliding layer's head (its rope_base_swa rope); 0: rope_dims
    // Gemma 4's values: v RMS-normed per head without a weight (ggml_rms_norm) before it is cached,
    // and a layer without attn_v takes v = k's projection (before k's norm and rope).
    bool v_norm = false;
    // Gemma 4's MoE layers: the routed experts beside a dense GeGLU MLP of width ffn (ffn_gate /
    // ffn_up / ffn_down), each with its own norms (Engine::moe_beside_mlp), the router reading the
    // residual stream RMS-normed without weight, times 1 / sqrt(dim) and router_in_scale.
    bool moe_mlp = false;
    // Gemma 4 E2B / E4B. ple_dim > 0: per-layer embeddings (Engine::ple_inputs / ple_block): each
    // token gets per layer a ple_dim-vector from per_layer_token_embd and the projected embedding,
    // which gates a small block after each layer. kv_source[l] >= 0: layer l keeps no KV of its own
    // and attends over that earlier layer's cache (its q alone is computed); empty: every layer its
    // own. layer_ffn: per-layer FFN widths (empty: ffn everywhere, else ffn is the largest).
    int ple_dim = 0;
    std::vector<int> kv_source, layer_ffn;
    // Gemma 3n (llama.cpp's gemma3n graph; Engine::altup_*): altup > 0 residual streams per token
    // ([T][altup][dim], stream altup_act the one the layers read). Before each layer the streams
    // predict each other (altup_predict_coef of the router's modalities); the layer runs on the
    // active prediction with LAuReL beside its attention (x = (x + attn + laurel) / sqrt 2); after
    // it the streams are corrected by the layer's innovation and streams 1.. take the per-layer
    // embedding block (ple_dim). The first sparse_layers layers' FFN gates keep only values above
    // mean + sparse_std_mul * std of their row (gaussian top-k).
    int altup = 0, altup_act = 0;
    int sparse_layers = 0;
    float sparse_std_mul = 0.0f;
};
// FFN gate activation: FFN_SWIGLU_OAI is gpt-oss's clamped SwiGLU (GLU_SWIGLU_OAI in kernels.h).
// FFN_GELU is gemma's GeGLU (GLU_GEGLU).
enum FfnAct : int { FFN_SILU = 0, FFN_RELU2 = 1, FFN_SWIGLU_OAI = 2, FFN_GELU = 3 };
// EXPERT_SIGMOID (glm4moe): p = sigmoid(logit) per expert, top-K of p + exp_probs_b, weights p.
enum ExpertGating : int { EXPERT_SOFTMAX = 0, EXPERT_SOFTMAX_TOPK = 1, EXPERT_SIGMOID = 2 };
int glu_kind(int ffn_act);  // the GluKind (kernels.h) of an FfnAct
// x[n] (n % 32 == 0 unless T_F16) as one KV cache row of type T_F16 / T_Q8_0 / T_Q4_0 into dst
// (row bytes of n values), as llama.cpp's ggml_set_rows writes its cache (engine.cpp).
void kv_store_row(int type, const float *x, int64_t n, uint8_t *dst);

class Engine {
public:
    explicit Engine(const EngineConfig &c);
    // Binds a weight matrix. Q4_K matrices go to the selected level's repacked layout when it
    // has one (kernels.h repacked_entry; csrc/repack.h): a copy the engine owns, the source's
    // bytes no longer read (repacked_sources lists them; LOWBIT_NO_REPACK=1: none).
    void set_mat(const std::string &name, int layer, const Mat &m);
    // Whether set_mat repacks at all (default on; lowbit.model turns it off where the copies would
    // not fit in memory beside the file, or the weights are a hugepage copy)
    void set_repack(bool on) { repack_on_ = on; }
    // (address, bytes) of every source matrix set_mat repacked: its caller may drop their pages
    const std::vector<std::pair<const uint8_t *, size_t>> &repacked_sources() const { return repacked_src_; }
    void set_vec(const std::string &name, int layer, const float *v, int64_t len);
    // Sliding-window attention for one layer: its queries see the last `window` positions (0: all).
    void set_window(int layer, int window);
    // Rotary embedding on or off for one layer's q / k (default on).
    void set_rope(int layer, bool on);
    void set_threads(int t) { threads_ = t; }
    // The row kernels' weight prefetch for this model's forwards (PrefetchMode, csrc/prefetch_mode.h),
    // or kPrefetchMeasure: the one-token forwards (forward_layers), after the first kMeasureSkip, alternate
    // off and l1 and time themselves until each mode has kMeasureEach; then the mode whose median
    // time was lower stays (a tie: l1). Which way a model streamed from DRAM runs faster depends
    // on the CPU (BENCHMARKS.md rounds 25, 26): measured where it runs, on its own forwards.
    // Results never depend on the mode (tests/test_batch.py).
    void set_prefetch(int mode);
    int prefetch() const { return prefetch_; }  // the mode in force (while measuring: the last one run)
    bool prefetch_measuring() const { return measure_left_ > 0; }
    // the measured forwards: (mode, seconds), in the order they ran
    const std::vector<std::pair<int, double>> &prefetch_trials() const { return trials_; }
    // (off, l1): the medians of the measured forwards' seconds the choice compares ({0, 0} before
    // both modes have a trial)
    std::pair<double, double> prefetch_medians() const;
    static constexpr int kMeasureSkip = 2, kMeasureEach = 6;
    // Run tokens[0..T) at positions pos..pos+T-1 (the KV cache holds positions < pos).
    // logits: [T][vocab] if all_logits, else [1][vocab] for the last token.
    // The slot-0 case of forward_batch.
    void forward(const int32_t *tokens, int T, int pos, float *logits, bool all_logits);
    // Several sequences in one pass: token t sits in KV slot slots[t] at position pos[t] (that
    // slot's cache holds its positions < pos[t], or they come earlier in this batch). Every
    // matmul runs once over all T tokens (each weight row decoded once per window of 8);
    // attention runs per token against its own slot. (slot, pos) pairs must be distinct.
    // logits: [n_out][vocab], row i for token out_rows[i]. A token's logits are bitwise the
    // same whatever else is in the batch (I2 and per-token norms, rope and attention).
    void forward_batch(const int32_t *tokens, const int32_t *slots, const int32_t *pos, int T,
                       const int32_t *out_rows, int n_out, float *logits);
    // forward_batch over this engine's layers [layer_begin, layer_end) only (a pipeline stage),
    // the same code: the first stage embeds tokens (x_in null), a later one starts from x_in, the
    // residual stream [T][dim] float32 after layer layer_begin - 1; the last stage writes the
    // logits of out_rows, an earlier one the residual stream after its last layer to x_out
    // [T][dim] (out_rows / logits unused). Stages chained so give bitwise forward_batch's logits.
    // (set_prefetch(kPrefetchMeasure) times its one-token calls: a stage measures its own layers)
    void forward_layers(const int32_t *tokens, const int32_t *slots, const int32_t *pos, int T, const float *x_in,
                        float *x_out, const int32_t *out_rows, int n_out, float *logits);
    // The hidden state an MTP (nextn) block reads (llama.cpp's t_h_nextn): the residual stream
    // after the last layer, RMS-normed with the output norm (the LM head's input), of rows
    // rows[0..n) of the last forward call, into out[n][dim]. It reads what that call left in the
    // scratch x_ (every token's row, logits asked or not), so a model without MTP pays nothing.
    // Only the last stage of a pipeline has it; a call that replays tokens (Model.rewind of a
    // hybrid model) is a forward call too.
    void hidden(const int32_t *rows, int n, float *out) const;
    int layer_begin() const { return c_.layer_begin; }
    int layer_end() const { return c_.layer_end; }
    const EngineConfig &config() const { return c_; }
    // The server's prefix cache (src/lowbit/server/prefix.py): KV positions [p0, p0 + n) of a
    // slot, every layer, copied out to buf (save) or back in from it (load), laid out as the cache
    // is, [layer][K: kv heads][V: kv heads][n][head row] (MLA: [layer][n][mla_rank + rope_dims], the
    // latent rows), a head row in the cache's element type (half or float32; a quantized cache: its
    // head_dim / 32 blocks); the buffer holds kv_bytes(n) bytes. Bytes are copied as they are, so a restored prefix gives the same
    // logits, bit for bit, as computing it again. Hybrid models: the attention layers' KV only;
    // a load leaves the recurrent state unknown until rstate_copy loads it (the prefix cache
    // keeps both).
    size_t kv_bytes(int n) const;
    // Commit the KV cache of slots [0, n) now (each at most once; a forward's first use of a slot
    // commits it otherwise). Safe beside forwards on another thread: a server calls it on a thread
    // of its own after load, so its first burst of requests does not wait for fresh memory (on a
    // VM that backs guest memory at first touch: ~100 MB/s here, BENCHMARKS.md round 26).
    // Throws as a forward would where a slot's cache does not fit in the memory available.
    void commit_slots(int n);
    int slots_committed() const;  // slots whose KV cache is committed
    void kv_copy(int slot, int p0, int n, uint8_t *buf, bool save);
    // Hybrid models: the recurrent part of a slot (conv and delta-net states of every recurrent
    // layer, and the position they have reached), copied out to buf (save) or back in (load):
    // rstate_bytes() bytes, [int64 position][conv states][recurrent states], float32. A forward
    // call on a hybrid model needs a slot's tokens to continue at that position (or to start at
    // 0, which clears the state): anything else is refused, never silently wrong.
    bool hybrid() const { return n_rec_layers_ > 0; }
    size_t rstate_bytes() const;
    void rstate_copy(int slot, uint8_t *buf, bool save);
    int rstate_pos(int slot) const { return rpos_.at((size_t)slot); }
    // The replay log (speculative rewinds without a forward pass): a forward call that gives a
    // slot 2..kReplayMax tokens keeps, per recurrent layer and token, what the state update
    // consumed (the conv's input row, the decay and beta per value head). After loading a state
    // saved at the call's first position (rstate_copy), rstate_replay(slot, n) folds that call's
    // first n tokens into it: the conv, the norms and the delta rule only, no matmul, no KV
    // write, bitwise the state the forward left after those tokens (the same code on the same
    // values). rstate_log(slot): (first position, tokens) the log still holds for the slot's
    // current tokens (a later call writing at a logged position cuts it there, and so does a
    // kv_copy load); (0, 0): none.
    static constexpr int kReplayMax = 8;
    std::pair<int, int> rstate_log(int slot) const { return {tlog_p0_.at((size_t)slot), tlog_n_.at((size_t)slot)}; }
    void rstate_replay(int slot, int n);
    // Check every required weight is set and shaped right; returns "" or the problem.
    std::string validate() const;
    // Per-layer stats (n_layer entries); collected only while enabled.
    void set_stats(bool on) { stats_on_ = on; }
    const std::vector<LayerStats> &stats() const { return stats_; }
    void reset_stats() { stats_.assign((size_t)c_.n_layer, LayerStats{}); }
    // Router lookahead (csrc/moe.cpp): at layer l, layer l+1's router is applied to layer l's
    // FFN input, and the predicted experts' pages of layer l+1 are read ahead (madvise
    // WILLNEED) while layer l computes. Counters: experts routed (distinct per window and
    // layer, layers >= 1), of them predicted, and experts predicted.
    void set_lookahead(bool on) { lookahead_ = on; }
    // Importance matrices (lowbit imatrix, llama.cpp's collector): while on, each matmul adds the
    // squares of its float input per column to its weight matrix's sums, per expert for the MoE
    // expert tensors, and counts the tokens. Keyed by the matrix's first byte (Mat::w). As
    // llama.cpp: a dense matmul of fewer than 16 tokens is skipped, routed experts never are.
    struct ActSums { int64_t n = 0; std::vector<double> sums; std::vector<int64_t> counts; };  // sums[n_mat][n]
    void collect_acts(bool on) { collect_ = on; }
    std::unordered_map<const uint8_t *, ActSums> &act_sums() { return acts_; }
    // rows t of x[.][m.n] (tok: the row indices, else 0..T-1) into matrix `mat` of n_mat
    void record_act(const Mat &m, const float *x, int T, int mat = 0, int n_mat = 1, const int32_t *tok = nullptr);
    struct LookaheadStats { int64_t routed = 0, hits = 0, predicted = 0; };
    const LookaheadStats &lookahead_stats() const { return la_; }
    void reset_lookahead_stats() { la_ = LookaheadStats{}; }
    // The experts each token of the last forward call chose at layer l: [T][n_expert_used],
    // in rank order (tests check routing is not degenerate).
    const std::vector<int32_t> &last_routes(int l) const { return routes_[(size_t)l]; }
    // Per token of the last forward call at layer l: the K-th chosen expert's probability
    // minus the best unchosen one's (a near-zero margin is a near-tie that float noise flips).
    const std::vector<float> &last_route_margins(int l) const { return rgap_[(size_t)l]; }

private:
    // reuse_act: x is the same input as the previous matmul's (q/k/v, gate/up): its
    // quantized copy is reused when the activation format is the same.
    void matmul(const Mat &m, const float *x, int T, float *out, bool reuse_act = false);
    // Several matrices on the same input x[T][n] (q / k / v; the delta-net's input projections):
    // out_i = x . W_i^T for each present W_i (absent ones skipped), the matrices that pair with
    // one activation format in ONE pool dispatch (run_rows_multi), x quantized once per format.
    // Bitwise the matmul calls one by one (I3): decode pays one barrier instead of one per matrix.
    struct MatOut { const Mat *m; float *out; };
    void matmuls(std::initializer_list<MatOut> mats, const float *x, int T);
    const uint8_t *quantize_input(const Mat &m, const float *x, int T, bool reuse_act, size_t *arb);
    void rmsnorm(const float *x, const float *w, float *out, int T, int len) const;
    // out = ggml_norm(x) * w (+ b) per token (a LayerNorm: Command-R's has no bias, StarCoder2's has)
    void layernorm(const float *x, const float *w, const float *b, float *out, int T, int len) const;
    // the model's norm (EngineConfig::layer_norm: layernorm with bias b, else rmsnorm)
    void norm(const float *x, const float *w, const float *b, float *out, int T, int len) const {
        if (c_.layer_norm) layernorm(x, w, b, out, T, len);
        else rmsnorm(x, w, out, T, len);
    }
    std::vector<float> qtemp_;  // per token of the forward: the attention temperature (attn_temp_scale)
    void pre_norm(const float *w, const float *b, int64_t T);  // h_ = norm(x_) (or x_: no pre-norms)
    void residual(const float *out, int64_t T);  // x_ += out (granite: times residual_scale)
    void rope_angles(int T, const int32_t *pos);  // fills rot_
    void rope(float *v, int T, int heads, int hd, int dims, const std::vector<std::pair<float, float>> &rot) const;
    int rope_dims_swa() const { return c_.rope_dims_swa > 0 ? c_.rope_dims_swa : c_.rope_dims; }
    // qo (optional): out also quantized by the threads that compute it (ActOut, csrc/matmul.h;
    // the caller checks hd % qo->block == 0), for the o projection
    void attention(int layer, const float *q, int T, const int32_t *slots, const int32_t *pos, float *out,
                   const ActOut *qo = nullptr);
    // A layer is a mixer block and an FFN block, each read from the residual x_ through its
    // pre-norm (h_) and added back to it (engine.cpp forward_layers):
    void mixer_block(int layer, int T, const int32_t *slots, const int32_t *pos);      // h_ -> h_
    void attention_block(int layer, int T, const int32_t *slots, const int32_t *pos);  // h_ -> h_
    void ffn_block(int layer, const float *x, int T, float *out);                      // x -> out
    // The half / float cache is head-major, [slot][layer][kv head][pos][head_dim] (MLA: one head of
    // kv_row_ elements): one (slot, layer, kv head)'s keys, and its values, are each one contiguous
    // stream of rows head_dim apart. Decode reads them from DRAM past a few thousand positions,
    // and rows interleaved with the other heads' (n_kv * head_dim apart) streamed at half the
    // rate (the avx2 kernel, 3000 positions: 210 us a call against 100 us, BENCHMARKS.md).
    // The quantized cache has the same order (kq_ / vq_: head rows of kvl_ krow / vrow bytes).
    // Per attention layer (kv_index_) where its rows lie in a slot's cache and how wide they are: a head
    // row is krow / vrow elements of the half / float cache (MLA: one head of kv_row_, V none) or
    // krow / vrow bytes of a quantized one (its head_dim / 32 blocks).
    struct KvLayer { int heads = 0, hd = 0; size_t k0 = 0, v0 = 0, krow = 0, vrow = 0; };
    std::vector<KvLayer> kvl_;
    size_t kslot_ = 0, vslot_ = 0;  // one slot's K (V) cache, elements or bytes
    const KvLayer &kvl(int layer) const { return kvl_[(size_t)kv_index_[(size_t)layer]]; }
    // Bytes per unit of kv_k_at's offsets (1: a quantized cache's offsets are bytes), and the K
    // (v false) or V cache as bytes, whichever of kq_ / k16_ / k32_ (vq_ ...) holds it.
    size_t kv_el() const { return kv_quant() ? 1 : c_.kv_f16 ? sizeof(uint16_t) : sizeof(float); }
    uint8_t *kv_base(bool v) {
        if (kv_quant()) return v ? vq_.data() : kq_.data();
        if (c_.kv_f16) return reinterpret_cast<uint8_t *>(v ? v16_.data() : k16_.data());
        return reinterpret_cast<uint8_t *>(v ? v32_.data() : k32_.data());
    }
    void prefetch_kv_rows(int l, int T, const int32_t *slots, const int32_t *pos);
    // (slot, layer, kv head, pos)'s K and V head rows: offsets into k16_ / k32_ / kq_ (and v...)
    size_t kv_k_at(int slot, int layer, int pos, int kvh = 0) const {
        const KvLayer &g = kvl(layer);
        return (size_t)slot * kslot_ + g.k0 + ((size_t)kvh * c_.n_ctx + pos) * g.krow;
    }
    size_t kv_v_at(int slot, int layer, int pos, int kvh = 0) const {
        const KvLayer &g = kvl(layer);
        return (size_t)slot * vslot_ + g.v0 + ((size_t)kvh * c_.n_ctx + pos) * g.vrow;
    }
    size_t kv_row_ = 0;    // MLA: elements of a cached position, mla_rank + rope_dims
    // layer l's KV heads and head width (EngineConfig::layer_kv / layer_hd)
    int kv_of(int l) const { return c_.layer_kv.empty() ? c_.n_kv : c_.layer_kv[(size_t)l]; }
    int hd_of(int l) const { return c_.layer_hd.empty() ? c_.head_dim : c_.layer_hd[(size_t)l]; }
    size_t qd_max_ = 0, kd_max_ = 0;  // the widest layer's q and k / v rows
    bool mla() const { return c_.mla_rank > 0; }
    // The MLA attention block (csrc/mla.cpp): out[T][dim] = wo(attention) from the normed x[T][dim].
    void mla_attention(int layer, const float *x, int T, const int32_t *slots, const int32_t *pos, float *out);
    std::vector<float> mq_, mkv_, mqa_, mqn_, mlat_, mo_h_;  // MLA scratch
    // The gated delta-net layer (csrc/deltanet.cpp): out[T][dim] from the normed input x[T][dim];
    // each slot's tokens in order continue its conv and recurrent state.
    void deltanet(int layer, const float *x, int T, const int32_t *slots, float *out);
    // LFM2's short-conv block (csrc/shortconv.cpp): out[T][dim] from the normed input x[T][dim],
    // each slot's tokens in order continuing its conv state.
    void shortconv(int layer, const float *x, int T, const int32_t *slots, float *out);
    // The Mamba-2 mixer (csrc/mamba2.cpp): out[T][dim] from the normed input x[T][dim], each slot's
    // tokens in order continuing its conv and SSM state.
    void mamba2(int layer, const float *x, int T, const int32_t *slots, float *out);
    // A forward call's tokens grouped by slot, in order: slot[i]'s tokens are tok[off[i] .. off[i + 1]).
    struct SlotRuns { std::vector<int> slot, tok, off{0}; };
    static SlotRuns slot_runs(const int32_t *slots, int T, int n_slots);
    // The causal depthwise conv of a recurrent layer, in place on buf[T][conv_dim()] (per channel
    // c: the K-1 inputs in the slot's conv state, oldest first, then this token's; the sum in tap
    // order; the state shifts by one input), plus the layer's conv bias if any (Mamba-2), then silu
    // if `silu_out` (delta-net, Mamba-2) or as it is (LFM2).
    void set_conv_taps(LayerWeights &l, const float *v, int64_t len);  // ssm_conv1d and its conv_wT
    void conv_runs(int layer, float *buf, bool silu_out, const SlotRuns &r);
    // The replay log rows (engine.h rstate_replay) of the runs of 2..kReplayMax tokens: row(t, dst)
    // writes token t's tlog_row() floats.
    void tlog_write(int layer, const SlotRuns &r, const std::function<void(size_t, float *)> &row);
    // The delta-net's state update (steps 2, 3, 5) on dq_ (conv inputs, in place), dg_ and db_
    // (gates) of each run's tokens, in order; o into dout_.
    void deltanet_state(int layer, int T, const SlotRuns &runs);
    // Mamba-2's state update (the conv with bias and silu, the scan per head) on dq_ (conv inputs, in
    // place) and dg_, db_ (each head's softplus'd step and decay) of each run's tokens, in order; y
    // into dout_[T][d_inner].
    void mamba2_state(int layer, int T, const SlotRuns &runs);
    void mamba1(int layer, const float *x, int T, const int32_t *slots, float *out);
    void mamba1_state(int layer, int T, const SlotRuns &runs);  // the conv and the scan from dq_, dg_, db_
    void mamba1_scan(int layer, int T, const SlotRuns &runs);   // the scan: dq_ (conv out), dg_ (dt), db_ (B|C) -> dout_
    void rstate_clear(int slot);
    int conv_dim() const;               // channels of the conv state: delta-net 2 H_k S + H_v S, LFM2 dim,
                                        // Mamba-2 d_inner + 2 G N
    size_t conv_state_floats() const;   // per recurrent layer and slot
    size_t ssm_state_floats() const;
    // The MoE feed-forward (csrc/moe.cpp): out[T][dim] = sum over each token's top-K experts
    // (in rank order) of weight * expert(x), plus the shared expert if any.
    // router_x: the router's input [T][dim] when it is not x (gemma4)
    void moe_ffn(int layer, const float *x, int T, float *out, const float *router_x = nullptr);
    // Gemma 4's MoE FFN (EngineConfig::moe_mlp) of the residual x_ (h_: its ffn_norm): out[T][dim] =
    // post_norm_1(MLP(h_)) + post_norm_2(experts(pre_norm_2(x_))), the router on
    // rms(x_) / sqrt(dim) * router_in_scale (llama.cpp's gemma4 graph); h_ is overwritten
    void moe_beside_mlp(int layer, int T, float *out);
    std::vector<float> mlp_, rin_;  // its MLP output and router input
    // Gemma 4 E2B / E4B's per-layer inputs of this call's tokens, ple_ [T][n_layer][ple_dim] (llama.cpp's
    // project_per_layer_inputs): (RMSNorm(proj . x / sqrt(dim)) + per_layer_token_embd[token] sqrt(P)) / sqrt(2)
    void ple_inputs(const int32_t *tokens, int T);
    // after layer l: x_ += ple_out(l, x_) (gemma4; csrc/altup.cpp)
    void ple_block(int layer, int T);
    // out[T][dim] = RMSNorm(proj . (gelu(inp_gate . in) * ple_[t][l])) (out may alias in)
    void ple_out(int layer, const float *in, int T, float *out);
    Mat ple_embd_, ple_model_proj_;
    const float *ple_proj_norm_ = nullptr;
    std::vector<float> ple_, ple_tmp_;
    // Gemma 3n's streams (EngineConfig::altup): altup_init (from the scaled embeddings in x_),
    // altup_predict (streams_ -> preds_, x_ = the active prediction), altup_correct (the layer's
    // output in x_ -> streams_, with the per-layer embedding block), altup_merge (streams_ -> x_)
    void altup_init(int T);
    void altup_predict(int layer, int T);
    void altup_correct(int layer, int T);
    void altup_merge(int T);
    void altup_modalities(int layer, const float *x, int T, float *mod);  // tanh(router . rms(x) / dim) [T][A]
    void laurel(int layer, int T);  // lau_ = h_ + RMSNorm(laurel_r . laurel_l . h_)
    Mat altup_proj_, altup_unembd_;  // [(A-1) dim, dim]: streams 1.. from the embedding, and back
    std::vector<float> streams_, preds_, lau_, amod_, atmp_;
    bool kv_shared(int l) const { return !c_.kv_source.empty() && c_.kv_source[(size_t)l] >= 0; }
    int ffn_of(int l) const { return c_.layer_ffn.empty() ? c_.ffn : c_.layer_ffn[(size_t)l]; }
    void biased_topk(int layer, int T, bool sigmoid);
    void group_mask(float *score) const;  // group-limited routing (moe.cpp)  // sigmoid / softmax + exp_probs_b routing (moe.cpp)
    void dense_ffn(const Mat &gate, const Mat &up, const Mat &down, const float *x, int T, float *out,
                   const float *sub_norm = nullptr,   // sub_norm: bitnet's ffn_sub_norm [gate.rows]
                   const float *up_b = nullptr, const float *down_b = nullptr,  // an ungated FFN's biases
                   bool sparse = false);  // gemma3n: the gate's gaussian top-k (EngineConfig::sparse_layers)

    EngineConfig c_;
    std::vector<LayerWeights> layers_;
    Mat embd_, output_;
    const float *out_norm_ = nullptr, *out_norm_b_ = nullptr;  // the final norm [dim] (its bias: a LayerNorm's)
    const float *out_b_ = nullptr;  // output.bias [vocab], added to the logits (phi2)
    std::vector<float> ones_;       // 1.0f: an ungated GELU as GeGLU's epilogue times one (engine.cpp dense_ffn)
    std::vector<float> inv_freq_;        // per rotated pair: base^(-2i/d) / factor_i (YaRN: times its mix)
    float rope_pos_scale_ = 1.0f;        // positions times this (linear scaling; 1 under YaRN)
    float rope_mscale_ = 1.0f;           // cos / sin times this (YaRN's magnitude scale, an attn_factor; else 1)
    std::vector<uint8_t> rope_zero_;     // per rotated pair: 1 if it rotates by position 0 (IMROPE's 4th section)
    std::vector<std::pair<float, float>> rot_;  // [T][rope_dims/2] (cos, sin) of this call's positions
    std::vector<float> inv_freq_swa_;    // rope_base_swa > 0: the sliding layers' inverse frequencies
    std::vector<std::pair<float, float>> rot_swa_;  // and their rotations (as rot_)
    bool moe_layer(int l) const {
        return c_.n_expert > 0 && (c_.moe_layers.empty() ? l >= c_.n_dense_lead : c_.moe_layers[(size_t)l] != 0);
    }
    // head-major, [slot][layer][kv head][n_ctx][head_dim] (kv_k_at / kv_v_at), in half (kv_f16) or float32; one of each pair is empty
    // A quantized cache (kv_quant()): head-major as the half one, [slot][layer][kv head][n_ctx][head
    // bytes] (kv_k_at), one head's row its head_dim / 32 blocks (KvLayer krow / vrow bytes; V in
    // half if only K is quantized): a head's keys, and its values, are each one contiguous stream,
    // read once per GQA group by kernel_table().attnq_rows. k16_ ... empty.
    ZeroArray<uint8_t> kq_, vq_;
    // llama.cpp's attention rotation of a quantized cache (llama-kv-cache.cpp attn_rot_k / _v):
    // q and k times an orthonormal Walsh-Hadamard matrix of rot_k(hd) (the largest power of 2
    // dividing the layer's head width) before k is stored, v times the 64-point one before it is
    // stored and the attention output times it again after (H H = I). Exact arithmetic is
    // unchanged; the quantization error is spread over the block. 0: off (an f16 side, or a head
    // width not a multiple of 64).
    int rot_k(int hd) const {
        if (!kv_quant() || hd % 64) return 0;
        int r = 64;
        while (hd % (2 * r) == 0) r *= 2;
        return r;
    }
    int rot_v(int hd) const { return kv_quant() && hd % 64 == 0 && c_.kv_v != T_F16 ? 64 : 0; }
    bool kv_quant() const { return c_.kv_f16 && (c_.kv_k != T_F16 || c_.kv_v != T_F16); }
    ZeroArray<uint16_t> k16_, v16_;
    ZeroArray<float> k32_, v32_;
    // per slot: its KV committed (use_slot; set under slot_mu_, read without it: commit_slots
    // may run on another thread than the forwards)
    std::unique_ptr<std::atomic<uint8_t>[]> slot_used_;
    std::mutex slot_mu_;
    void use_slot(int slot);  // commit the slot's K and V cache at its first use
    std::vector<float> x_, h_, q_, k_, v_, att_, g_, u_;
    // repacked weight matrices (set_mat), and where their sources were
    // the repacked matrices, packed into arenas of >= 64 MB (alloc_repacked: huge pages; one
    // arena per matrix would round each up to 2 MB) (shared: read-only after load)
    std::vector<std::shared_ptr<uint8_t>> repacked_;
    size_t arena_left_ = 0;  // bytes free at the end of repacked_.back()
    uint8_t *arena_next_ = nullptr;
    uint8_t *repacked_bytes(size_t bytes);
    std::vector<std::pair<const uint8_t *, size_t>> repacked_src_;
    bool repack_on_ = true;
    void repack(Mat &m, int64_t block_rows);
    std::vector<float> qg_, agate_;      // gated attention: attn_q's output [T][n_head][2][hd], the gate [T][qd]
    // Hybrid models: attention layers' index into the KV cache, recurrent layers' into the states
    std::vector<int> kv_index_, rec_index_;
    int n_kv_layers_ = 0, n_rec_layers_ = 0;
    std::vector<float> conv_st_;         // [slot][rec layer][conv_dim][K-1], oldest input first
    std::vector<float> ssm_st_;          // [slot][rec layer][H_v][S (value j)][S (key i)] (Mamba-2: [H][P][N])
    std::vector<int32_t> rpos_;          // [slot] tokens folded into the slot's recurrent state
    std::vector<float> dq_, dz_, dab_, dg_, db_, dout_;  // delta-net scratch
    std::vector<float> par_;  // falcon-h1: the Mamba-2 mixer's output beside the attention's [T][dim]
    std::vector<float> fin_;  // command-r: the parallel FFN's input (attn_norm's output) and output [T][dim]
    // the replay log: [slot][rec layer][kReplayMax][conv_dim + 2 H_v] (conv input, decay, beta; LFM2: the conv input only),
    // allocated at the first call that logs; per slot its first position and token count
    std::vector<float> tlog_;
    std::vector<int32_t> tlog_p0_, tlog_n_;
    // positions >= pos are being written: the log keeps only what precedes them (pos < 0: all goes)
    void tlog_cut(int slot, int pos) {
        int32_t &p0 = tlog_p0_[(size_t)slot], &n = tlog_n_[(size_t)slot];
        n = pos < 0 ? 0 : std::max(0, std::min(n, pos - p0));
        if (n == 0) p0 = 0;
    }
    size_t tlog_row() const { return (size_t)conv_dim() + tlog_g() + tlog_b(); }
    // the replay log's floats after the conv input: dg_ (delta-net: decay per value head; Mamba-2: dt per
    // head; Mamba-1: dt per channel) and db_ (beta / dA per head; Mamba-1: B and C); LFM2: none
    size_t tlog_g() const { return c_.shortconv ? 0 : c_.mamba1 ? (size_t)c_.ssm_inner : (size_t)c_.ssm_heads; }
    size_t tlog_b() const { return c_.shortconv ? 0 : c_.mamba1 ? 2 * (size_t)c_.ssm_state : (size_t)c_.ssm_heads; }
    std::vector<uint8_t> act_;
    int act_type_ = -1;  // format of what act_ holds (-1: nothing reusable)
    // a matmul's input quantized by the dispatch that makes it (ActOut: the GLU's output, the
    // attention's), then swapped into act_ (act_out_begin / act_out_take, engine.cpp)
    std::vector<uint8_t> act_next_;
    ActOut act_out_begin(const Mat &m, int64_t unit, int T, bool ok);
    void act_out_take(const ActOut &q, const Mat &m, int T);
    int threads_ = 0;
    int prefetch_ = kPrefetchL1;
    int measure_left_ = 0;  // one-token forwards left to measuring (skipped ones included)
    void layers_pass(const int32_t *tokens, const int32_t *slots, const int32_t *pos, int T, const float *x_in,
                     float *x_out, const int32_t *out_rows, int n_out, float *logits);  // (forward_layers' work)
    std::vector<std::pair<int, double>> trials_;
    // MoE scratch (csrc/moe.cpp)
    std::vector<float> rlog_, rx_, wsel_, eg_, ed_, sh_, mo_;
    std::vector<int32_t> sel_, slot_of_, slot_tok_, ecount_, eoff_;
    std::vector<uint8_t> xq_, xs_, us_, ys_;
    // the expert pool's work list and, per expert, gate/up items left and "down may start"
    // (moe.cpp; atomics through __atomic builtins, in plain vectors reused across calls)
    std::vector<MoeItem> items_;
    std::vector<int32_t> eleft_, eready_;
    std::vector<std::vector<int32_t>> routes_;
    std::vector<std::vector<float>> rgap_;
    bool stats_on_ = false;
    bool lookahead_ = false;
    LookaheadStats la_;
    std::vector<std::vector<uint8_t>> predicted_;  // [layer][expert]: read ahead for this window
    void lookahead(int layer, const float *x, int T);
    std::vector<LayerStats> stats_;
    bool collect_ = false;
    std::unordered_map<const uint8_t *, ActSums> acts_;
};

}  // namespace lowbit
