"""Synthetic models: random-weight GGUF files that lowbit and llama.cpp both load, for tests and
benchmarks (`lowbit synth KIND OUT.gguf [shape and type options]`).

Every file carries the default model's vocabulary (SmolLM2's tokenizer.* keys), so it tokenizes
like a real model and llama.cpp accepts it. Weights are Gaussian with std 1/sqrt(fan-in) (norm
weights 1 + 0.1 N(0,1)), which keeps activations finite through any number of layers.

    synth_dense(path, arch="llama", layers=.., dim=.., ...)   llama / qwen2 / qwen3 / gemma3 / gemma2 / phi3 / smollm3
                                                              / mistral3 / granite
    synth_bitnet(path, arch="bitnet", wtype="TQ2_0", ...)     bitnet / bitnet-b1.58, ternary weights
    synth_moe(path, arch="qwen3moe", experts=.., top_k=.., ...) qwen3moe / qwen2moe / olmoe / mixtral / gpt-oss
                                                              / glm4moe
    synth_hybrid(path, arch="qwen35moe", ...)                 qwen35moe / qwen35 / qwen3next (delta-net + attention)
    synth_lfm2(path, arch="lfm2", ...)                        lfm2 / lfm2moe (short conv + attention)
    synth_granite_hybrid(path, ...)                           granitehybrid (Mamba-2 + attention)
    synth_nemotron_h(path, pattern="M-*M-", ...)              nemotron_h / nemotron_h_moe / mamba2
    synth_falcon_h1(path, ...)                                falcon-h1 (attention and Mamba-2 side by side)
    synth_mamba(path, ...)                                    mamba (Mamba-1 alone; Falcon-Mamba with dt_b_c_rms)
    synth_gemma4(path, ...)                                   gemma4 (per-layer head widths; MoE; E2B / E4B's PLE)
    one function per family; FAMILIES maps the CLI's KIND to (function, add-options)
"""
from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from .writer import VOCAB_PREFIX, Writer


@functools.lru_cache(maxsize=1)
def default_vocab() -> dict:
    """The tokenizer.* metadata of the default model (SmolLM2, 49152 tokens); read once per
    process (callers must not modify it)."""
    from . import gguf
    from .model import default_model_path
    with gguf.open(default_model_path()) as f:
        return {k: (v.tolist() if isinstance(v, np.ndarray) else v)
                for k, v in f.metadata.items() if k.startswith(VOCAB_PREFIX)}


def small_vocab(n: int = 512) -> dict:
    """The default vocabulary cut to its first n tokens (no merges): a small embedding and head
    for files that are only quantized or benchmarked, never tokenized with."""
    v = dict(default_vocab())
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        if k in v:
            v[k] = list(v[k])[:n]
    v["tokenizer.ggml.merges"] = []
    for k in list(v):
        if k.endswith("_token_id") and isinstance(v[k], int) and v[k] >= n:
            v[k] = 0
    return v


def vocab_size(vocab: dict) -> int:
    return len(vocab["tokenizer.ggml.tokens"])


def gauss(rng: np.random.Generator, *shape: int, scale: float | None = None) -> np.ndarray:
    """N(0, scale^2) float32, scale 1/sqrt(fan-in) (the last dim) unless given."""
    s = np.float32(scale if scale is not None else 1.0 / np.sqrt(shape[-1]))
    return rng.standard_normal(shape, dtype=np.float32) * s


def norm_weight(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def write_header(w: Writer, vocab: dict, *, layers: int, dim: int, ffn: int, heads: int, kv_heads: int | list,
                 head_dim: int, ctx: int, rope_base: float = 10000.0, eps: float = 1e-6,
                 rope_dims: int | None = None, value_length: int | None = None,
                 eps_key: str = "attention.layer_norm_rms_epsilon") -> None:
    """The llama-style hyperparameters every family shares, then the vocabulary (kv_heads: one count,
    or one per layer; eps_key: the norm epsilon's key, a LayerNorm family's attention.layer_norm_epsilon)."""
    a = w.arch
    for key, val in [("block_count", layers), ("context_length", ctx), ("embedding_length", dim),
                     ("feed_forward_length", ffn), ("attention.head_count", heads),
                     ("attention.head_count_kv", kv_heads), ("attention.key_length", head_dim),
                     ("attention.value_length", value_length or head_dim),
                     ("rope.dimension_count", rope_dims or head_dim)]:
        w.meta(f"{a}.{key}", [int(v) for v in val] if isinstance(val, (list, tuple)) else int(val))
    w.meta(f"{a}.rope.freq_base", float(rope_base))
    w.meta(f"{a}.{eps_key}", float(eps))
    # (not "phi3" in the name: llama.cpp's vocabulary then sets attributes on Phi-3's own special
    # tokens, "</s>" among them, and fails on this vocabulary, which has none)
    w.meta("general.name", f"lowbit synthetic {a}".replace("phi3", "phi 3"))
    w.meta("general.file_type", 0)  # mixed; lowbit reads each tensor's own type
    w.copy_metadata(vocab, prefix=VOCAB_PREFIX)


def add_ends(w: Writer, rng: np.random.Generator, nv: int, dim: int, *, embd_type: str, head_type: str | None,
             wtype: str, tied: bool, emb_std: float | None = None, head_std: float | None = None,
             norm: str = "output_norm") -> None:
    """token_embd [nv, dim] (std emb_std; None: 1/sqrt(dim)), output [nv, dim] unless tied (format head_type,
    default wtype; std head_std), then the final norm `norm`: in this order (the random draws depend on it)."""
    w.add("token_embd.weight", gauss(rng, nv, dim, scale=emb_std), embd_type)
    if not tied:
        w.add("output.weight", gauss(rng, nv, dim, scale=head_std), head_type or wtype)
    w.add(norm + ".weight", norm_weight(rng, dim))


def add_attention(w: Writer, rng: np.random.Generator, p: str, *, dim: int, heads: int, kv_heads: int,
                  head_dim: int, wtype: str, ffn_norm: str | None = "ffn_norm", fused: bool = False,
                  pre_norms: bool = True, qk_gain: float = 1.0) -> None:
    """A layer's two norms and its q/k/v/output matrices (in this order: the random draws, and so
    every seed's weights, depend on it). ffn_norm: the FFN norm's name (gpt-oss: post_attention_norm);
    fused: one attn_qkv of [q | k | v] rows (phi3) instead of the three; pre_norms False: no norms
    (olmo2); qk_gain: attn_q and attn_k times this (a file whose attention.scale is below 1/sqrt(head_dim)
    keeps its softmax as sharp)."""
    if pre_norms:
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        if ffn_norm:  # (None: command-r's one norm before attention and the FFN side by side)
            w.add(p + ffn_norm + ".weight", norm_weight(rng, dim))
    if fused:
        w.add(p + "attn_qkv.weight", gauss(rng, (heads + 2 * kv_heads) * head_dim, dim), wtype)
    else:
        w.add(p + "attn_q.weight", gauss(rng, heads * head_dim, dim) * np.float32(qk_gain), wtype)
        w.add(p + "attn_k.weight", gauss(rng, kv_heads * head_dim, dim) * np.float32(qk_gain), wtype)
        w.add(p + "attn_v.weight", gauss(rng, kv_heads * head_dim, dim), wtype)
    w.add(p + "attn_output.weight", gauss(rng, dim, heads * head_dim), wtype)


def add_glu(w: Writer, rng: np.random.Generator, p: str, *, width: int, dim: int, wtype: str,
            suffix: str = "") -> None:
    """A SwiGLU FFN's three matrices, ffn_gate / ffn_up / ffn_down + suffix ("_shexp": a shared
    expert), in this order (the random draws depend on it)."""
    w.add(p + f"ffn_gate{suffix}.weight", gauss(rng, width, dim), wtype)
    w.add(p + f"ffn_up{suffix}.weight", gauss(rng, width, dim), wtype)
    w.add(p + f"ffn_down{suffix}.weight", gauss(rng, dim, width), wtype)


DENSE_ARCHS = ("llama", "qwen2", "qwen2vl", "qwen3", "qwen3vl", "exaone", "glm4", "minicpm", "seed_oss", "gemma3", "gemma2", "phi3", "smollm3", "mistral3", "granite", "olmo2", "exaone4", "ernie4_5",
               "command-r", "cohere2", "starcoder2", "phi2")
# granite's multipliers as Granite-3.3-2B's config has them (embedding, residual, logits; its
# attention multiplier is 1 / head_dim, written per file)
GRANITE_SCALES = {"embedding_scale": 12.0, "residual_scale": 0.22, "logit_scale": 8.0}


def qwen3vl_keys(w: Writer, head_dim: int, sections=None) -> None:
    """Qwen3-VL's text-model keys: IMROPE sections (None: Qwen3-VL's proportions, 24 / 20 / 20 of 64
    pairs: head_dim / 2 in all, the 4th empty) and n_deepstack_layers 3 (llama.cpp then pads a text
    token's embedding with zeros for the deepstack adds)."""
    half = head_dim // 2
    s0 = half * 3 // 8
    sections = sections or (s0, (half - s0) // 2, half - s0 - (half - s0) // 2, 0)
    w.meta(f"{w.arch}.rope.dimension_sections", [int(v) for v in sections])
    w.meta(f"{w.arch}.n_deepstack_layers", 3)


def granite_scales(w: Writer, head_dim: int, dim: int) -> tuple[float, float]:
    """granite / granitemoe: GRANITE_SCALES and attention.scale = 1 / head_dim into the file; returns
    the token embeddings' and the head's std (1/12: the graph multiplies the embeddings by 12;
    8/sqrt(dim): logits of a real model's range after the graph's 1 / logit_scale)."""
    for k, v in GRANITE_SCALES.items():
        w.meta(f"{w.arch}.{k}", float(v))
    w.meta(f"{w.arch}.attention.scale", float(1.0 / head_dim))
    return 1.0 / GRANITE_SCALES["embedding_scale"], GRANITE_SCALES["logit_scale"] / np.sqrt(dim)


def synth_dense(path, *, arch: str = "llama", layers: int = 2, dim: int = 256, ffn: int = 512, heads: int = 4,
                kv_heads: int = 2, head_dim: int | None = None, ctx: int = 1024, wtype: str = "Q8_0",
                embd_type: str = "F32", head_type: str | None = None, tied: bool = False, seed: int = 0,
                vocab: dict | None = None, window: int = 512, swa_pattern: int | None = None,
                rope_base: float = 10000.0, rope_base_swa: float | None = None, softcap: float = 0.0,
                rope_linear: float = 0.0, orig_ctx: int = 0, rope_dims: int | None = None,
                yarn_factor: float = 0.0, temp_scale: float = 0.0, sections=None, nextn: int = 0,
                scale_keys: bool = True, attn_softcap: float = 50.0, progress: bool = False) -> str:
    """A dense llama / qwen2 (q/k/v biases) / qwen3 (q/k RMSNorm) / qwen3vl (qwen3's with qwen3vl_keys) /
    gemma3 / phi3 model with random weights.

    wtype: the format of the layer matrices; embd_type: token_embd; head_type: output.weight
    (None: same as wtype; ignored when tied, where token_embd is the head); vocab: tokenizer.*
    metadata (None: the default model's). rope_linear > 0: linear rope scaling by that factor
    (rope.scaling.type "linear", as Gemma 3 4B-27B's factor 8; llama.cpp applies it to gemma3's
    global layers only).

    gemma3 (llama.cpp's names and keys): always tied; per-head q/k norms; post_attention_norm and
    post_ffw_norm after attention and FFN; sliding windows of `window` positions (0: none) on the
    layers of the period swa_pattern (None: llama.cpp's default 6, five local then one global;
    written to the file when given); rope_base for the global layers (as gemma3's 1e6),
    rope_base_swa for the local ones (None: no key, llama.cpp's default 10000); softcap > 0
    writes final_logit_softcapping. Its token embeddings have std 1/sqrt(dim) (a real model's
    scale: the graph multiplies them by sqrt(dim)). Norm weights are stored as 1 + w, as
    convert_hf_to_gguf writes gemma3's.

    gemma2: gemma3's without q/k norms, with both soft-capping keys as convert_hf_to_gguf writes them:
    attn_logit_softcapping = attn_softcap (Gemma 2's 50) and final_logit_softcapping = softcap (0:
    Gemma 2's 30); sliding windows on every other layer (swa_pattern None: no key, llama.cpp's 2).

    phi3 (as convert_hf_to_gguf's Phi3MiniModel writes it): fused attn_qkv ([q | k | v] rows) and
    ffn_up ([gate | up], 2 x ffn rows), the sliding_window key (`window`, which llama.cpp ignores);
    rope over rope_dims of a head (None: all; Phi-4-mini: 3/4). orig_ctx > 0: LongRoPE for a context
    of ctx over an original one of orig_ctx: rope.scaling.original_context_length, the
    rope_factors_long / _short tensors (rope_dims / 2 factors each: long in [1, ctx / orig_ctx],
    short in [1, 1.5]) and rope.scaling.attn_factor sqrt(1 + ln(ctx / orig_ctx) / ln(orig_ctx)).

    smollm3: llama's tensors; llama.cpp leaves every 4th layer's q / k unrotated (no key).
    mistral3 (Ministral 3): llama's tensors; yarn_factor > 0: YaRN rope over an original context of
    orig_ctx (with the file's yarn_beta_fast 32 / yarn_beta_slow 1, as convert_hf_to_gguf writes
    them); temp_scale > 0: attention.temperature_scale (Llama 4's attention temperature, whose
    floor is orig_ctx).

    olmo2 (OLMo 2 / OLMo 3): no pre-norms, post_attention_norm and post_ffw_norm after attention
    and FFN, q / k norms over the whole q / k vectors; window > 0: OLMo 3's sliding window on the
    layers of the period swa_pattern (None: no key, llama.cpp's 4), rope_base_swa as gemma3's;
    yarn_factor > 0 (with orig_ctx): YaRN on the full-attention layers (OLMo 3's long context).

    ernie4_5 (ERNIE 4.5 dense): llama's tensors under its own arch name.

    exaone4 (EXAONE 4.0): olmo2's layout with per-head q / k norms; window > 0 writes the
    sliding_window key (llama.cpp honours it only in a 64-layer model: 3 sliding layers, then a
    global one without rope).

    qwen3vl (Qwen3-VL's text model): qwen3's tensors, qwen3vl_keys (sections: the IMROPE sections,
    None: Qwen3-VL's).

    glm4 (GLM-4-0414, GLM-Z1): fused attn_qkv with its bias attn_qkv.bias, fused ffn_up ([gate | up]),
    post_attention_norm and post_ffw_norm beside the pre-norms, adjacent-pair rope over rope_dims
    (None: half the head, GLM-4's partial_rotary_factor 0.5); nextn MTP blocks after the trunk
    (block_count = layers + nextn, nextn_predict_layers; llama.cpp loads and never runs them).

    qwen2vl (Qwen2-VL's text model): qwen2's tensors and M-RoPE sections in Qwen2-VL's proportions.
    exaone (EXAONE 3.5): llama's tensors.

    seed_oss (Seed-OSS): qwen2's tensors (q/k/v biases), its FFN norm named post_attention_norm.

    minicpm (MiniCPM): llama's tensors; scale_keys: embedding_scale 12, residual_scale 1.4 / sqrt(layers)
    and logit_scale dim / 256 as convert_hf_to_gguf writes MiniCPM-2B's (scale_emb, scale_depth,
    dim_model_base); False: none (an older export, llama.cpp's defaults). Token embeddings std 1/12.

    granite (Granite 3.x): llama's tensors with GRANITE_SCALES and attention.scale = 1 / head_dim;
    its token embeddings have std 1/12 (the graph multiplies them by 12), an untied head std
    8/sqrt(dim) (the graph divides the logits by 8).

    command-r (Command R / R+, Aya) and cohere2 (Command R7B, Command A): always tied; one
    attn_norm per layer (a LayerNorm without bias: attention and the FFN read its output side by
    side), attention.layer_norm_epsilon, logit_scale = 1 / sqrt(dim) (Command-R's 0.0625 at its
    4096 > 256: here it keeps random logits of a real model's range). command-r with 64 layers or
    more: per-head q / k LayerNorm weights ([heads][head_dim], Command R+'s). cohere2: sliding
    windows of `window` positions on three of every four layers (swa_pattern None: no key,
    llama.cpp's 4), the global layers unrotated.

    starcoder2 (StarCoder2) and phi2 (Phi-2): LayerNorms with biases (attn_norm, ffn_norm,
    output_norm), q / k / v and attn_output biases, an ungated GELU MLP (ffn_up, ffn_down) with
    biases, attention.layer_norm_epsilon. phi2: one attn_norm (attention and the MLP side by side),
    a fused attn_qkv with its bias, an untied head with output.bias; rope over rope_dims of a head
    (Phi-2: 32 of 80).
    """
    if arch not in DENSE_ARCHS:
        raise ValueError(f"synth dense: arch must be one of {', '.join(DENSE_ARCHS)}, not {arch!r}")
    hd = head_dim or dim // heads
    gemma, phi3, glm4 = arch in ("gemma3", "gemma2"), arch == "phi3", arch == "glm4"
    if arch == "gemma2" and not attn_softcap > 0:
        raise ValueError(f"synth dense: gemma2's attn_softcap must be > 0, not {attn_softcap}")
    if nextn and not glm4:
        raise ValueError("synth dense: nextn (MTP blocks) is glm4's")
    mistral3, olmo2, exaone4 = arch == "mistral3", arch == "olmo2", arch == "exaone4"
    cohere = arch in ("command-r", "cohere2")
    biased = arch in ("starcoder2", "phi2")  # LayerNorms and matrices with biases, an ungated GELU MLP
    bias = lambda n: (0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    if orig_ctx and not ((phi3 or mistral3 or olmo2) and 0 < orig_ctx < ctx):
        raise ValueError(f"synth dense: orig_ctx is phi3's (LongRoPE) or mistral3's / olmo2's (YaRN), and below ctx "
                         f"({ctx}), not {orig_ctx}")
    if (yarn_factor and not ((mistral3 or olmo2) and orig_ctx)) or (temp_scale and not (mistral3 and orig_ctx)):
        raise ValueError("synth dense: yarn_factor is mistral3's / olmo2's, temp_scale mistral3's; both need orig_ctx")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, arch, progress=progress, fit=True)
    write_header(w, vocab, layers=layers + nextn, dim=dim, ffn=ffn, heads=heads, kv_heads=kv_heads, head_dim=hd,
                 ctx=ctx, rope_base=rope_base, rope_dims=rope_dims or (hd // 2 if glm4 else None),
                 eps_key="attention.layer_norm_epsilon" if cohere or biased else "attention.layer_norm_rms_epsilon")
    if nextn:
        w.meta(f"{arch}.nextn_predict_layers", int(nextn))
    if phi3:
        w.meta(f"{arch}.attention.sliding_window", int(window))
    if arch == "qwen3vl":
        qwen3vl_keys(w, hd, sections)
    if arch == "qwen2vl":  # Qwen2-VL's M-RoPE sections 16 / 24 / 24 of 64 pairs, in proportion
        half = hd // 2
        s0 = half // 4
        w.meta(f"{arch}.rope.dimension_sections", [s0, (half - s0) // 2, half - s0 - (half - s0) // 2, 0])
    emb_std, head_std = granite_scales(w, hd, dim) if arch == "granite" else (1.0, None)
    if arch == "minicpm":
        emb_std = 1.0 / 12
        if scale_keys:
            w.meta(f"{arch}.embedding_scale", 12.0)
            w.meta(f"{arch}.residual_scale", float(1.4 / np.sqrt(layers)))
            w.meta(f"{arch}.logit_scale", float(dim / 256))
    if (mistral3 or olmo2) and orig_ctx:
        w.meta(f"{arch}.rope.scaling.original_context_length", int(orig_ctx))
        if yarn_factor:
            w.meta(f"{arch}.rope.scaling.type", "yarn")
            w.meta(f"{arch}.rope.scaling.factor", float(yarn_factor))
        if yarn_factor and mistral3:
            w.meta(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)
            w.meta(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)
        if temp_scale:
            w.meta(f"{arch}.attention.temperature_scale", float(temp_scale))
    elif orig_ctx:
        nr = (rope_dims or hd) // 2
        w.meta(f"{arch}.rope.scaling.original_context_length", int(orig_ctx))
        w.meta(f"{arch}.rope.scaling.attn_factor", float(np.sqrt(1 + np.log(ctx / orig_ctx) / np.log(orig_ctx))))
        w.add("rope_factors_long.weight", rng.uniform(1.0, ctx / orig_ctx, nr).astype(np.float32))
        w.add("rope_factors_short.weight", rng.uniform(1.0, 1.5, nr).astype(np.float32))
    if rope_linear:
        w.meta(f"{arch}.rope.scaling.type", "linear")
        w.meta(f"{arch}.rope.scaling.factor", float(rope_linear))
    if (olmo2 or exaone4) and window:
        w.meta(f"{arch}.attention.sliding_window", int(window))
        if swa_pattern is not None:
            w.meta(f"{arch}.attention.sliding_window_pattern", int(swa_pattern))
        if rope_base_swa is not None:
            w.meta(f"{arch}.rope.freq_base_swa", float(rope_base_swa))
    if cohere:
        tied = True
        w.meta(f"{arch}.logit_scale", float(1.0 / np.sqrt(dim)))
        if arch == "cohere2":
            w.meta(f"{arch}.attention.sliding_window", int(window))
            if swa_pattern is not None:
                w.meta(f"{arch}.attention.sliding_window_pattern", int(swa_pattern))
    if gemma:
        tied = True
        if window:
            w.meta(f"{arch}.attention.sliding_window", int(window))
        if swa_pattern is not None:
            w.meta(f"{arch}.attention.sliding_window_pattern", int(swa_pattern))
        if rope_base_swa is not None:
            w.meta(f"{arch}.rope.freq_base_swa", float(rope_base_swa))
        if softcap or arch == "gemma2":
            w.meta(f"{arch}.final_logit_softcapping", float(softcap or 30.0))
        if arch == "gemma2":
            w.meta(f"{arch}.attn_logit_softcapping", float(attn_softcap))
    if arch == "phi2":
        tied = False  # (llama.cpp's phi2 needs output.weight and output.bias)
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=head_type, wtype=wtype, tied=tied,
             emb_std=1.0 / np.sqrt(dim) if gemma else emb_std, head_std=head_std)
    if biased:
        w.add("output_norm.bias", bias(dim))
        if arch == "phi2":
            w.add("output.bias", bias(nv))
    for i in range(layers + nextn):
        p = f"blk.{i}."
        add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=hd, wtype=wtype,
                      fused=phi3 or glm4 or arch == "phi2", pre_norms=not (olmo2 or exaone4),
                      ffn_norm=None if cohere or arch == "phi2" else "post_attention_norm" if arch == "seed_oss"
                      else "ffn_norm")
        if biased:
            w.add(p + "attn_norm.bias", bias(dim))
            if arch == "starcoder2":
                w.add(p + "ffn_norm.bias", bias(dim))
                for nm, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                    w.add(p + f"attn_{nm}.bias", bias(rows))
            else:
                w.add(p + "attn_qkv.bias", bias((heads + 2 * kv_heads) * hd))
            w.add(p + "attn_output.bias", bias(dim))
        if arch == "command-r" and layers >= 64:  # Command R+: a LayerNorm weight row per head
            w.add(p + "attn_q_norm.weight", np.stack([norm_weight(rng, hd) for _ in range(heads)]))
            w.add(p + "attn_k_norm.weight", np.stack([norm_weight(rng, hd) for _ in range(kv_heads)]))
        if glm4:
            w.add(p + "attn_qkv.bias", 0.1 * rng.standard_normal((heads + 2 * kv_heads) * hd).astype(np.float32))
            w.add(p + "post_attention_norm.weight", norm_weight(rng, dim))
            w.add(p + "post_ffw_norm.weight", norm_weight(rng, dim))
        if i >= layers:  # an MTP block (glm4): its own inputs beside a layer's tensors
            w.add(p + "nextn.eh_proj.weight", gauss(rng, dim, 2 * dim), wtype)
            for nm in ("enorm", "hnorm", "shared_head_norm"):
                w.add(p + f"nextn.{nm}.weight", norm_weight(rng, dim))
        if phi3 or glm4:  # one ffn_up of [gate | up] rows
            w.add(p + "ffn_up.weight", gauss(rng, 2 * ffn, dim), wtype)
        elif biased:  # down(gelu(up . x + b) + b)
            w.add(p + "ffn_up.weight", gauss(rng, ffn, dim), wtype)
            w.add(p + "ffn_up.bias", bias(ffn))
            w.add(p + "ffn_down.bias", bias(dim))
        else:
            w.add(p + "ffn_gate.weight", gauss(rng, ffn, dim), wtype)
            w.add(p + "ffn_up.weight", gauss(rng, ffn, dim), wtype)
        w.add(p + "ffn_down.weight", gauss(rng, dim, ffn), wtype)
        if gemma:
            if arch == "gemma3":
                w.add(p + "attn_q_norm.weight", norm_weight(rng, hd))
                w.add(p + "attn_k_norm.weight", norm_weight(rng, hd))
            w.add(p + "post_attention_norm.weight", norm_weight(rng, dim))
            w.add(p + "post_ffw_norm.weight", norm_weight(rng, dim))
        if olmo2 or exaone4:  # (olmo2: over the whole q / k; exaone4: per head)
            w.add(p + "attn_q_norm.weight", norm_weight(rng, hd if exaone4 else heads * hd))
            w.add(p + "attn_k_norm.weight", norm_weight(rng, hd if exaone4 else kv_heads * hd))
            w.add(p + "post_attention_norm.weight", norm_weight(rng, dim))
            w.add(p + "post_ffw_norm.weight", norm_weight(rng, dim))
        if arch in ("qwen2", "qwen2vl", "seed_oss"):
            for nm, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                w.add(p + f"attn_{nm}.bias", 0.1 * rng.standard_normal(rows).astype(np.float32))
        if arch in ("qwen3", "qwen3vl"):
            w.add(p + "attn_q_norm.weight", norm_weight(rng, hd))
            w.add(p + "attn_k_norm.weight", norm_weight(rng, hd))
    w.close()
    return str(path)


def synth_gemma4(path, *, layers: int = 6, dim: int = 256, ffn: int = 512, heads: int = 4, kv_heads: int = 2,
                 kv_heads_full: int = 1, head_dim: int = 64, head_dim_full: int = 128, window: int = 64,
                 swa_pattern: int = 3, rope_base: float = 1e6, rope_base_swa: float = 10000.0,
                 rope_fraction_full: float = 0.25, rope_dims_swa: int | None = None, softcap: float = 30.0,
                 v_shared_full: bool = True, out_scale: bool = True, experts: int = 0, top_k: int = 2,
                 expert_ffn: int = 128, expert_type: str | None = None, router_type: str = "F32",
                 down_scale: bool = True, ple_dim: int = 0, shared_kv: int = 0, double_wide: bool = False,
                 ctx: int = 1024, wtype: str = "Q8_0",
                 embd_type: str = "F32", seed: int = 0, vocab: dict | None = None, progress: bool = False) -> str:
    """A Gemma 4 dense model (llama.cpp's gemma4, as convert_hf_to_gguf's Gemma4Model writes it) with
    random weights: gemma3's scaled embeddings, pre- and post-norms and GeGLU; the sliding layers
    (every layer but the last of each swa_pattern, a per-layer bool list in the file) have kv_heads
    KV heads of head_dim (key_length_swa) rotating rope_dims_swa dims (None: all) with base
    rope_base_swa; the full layers kv_heads_full heads of head_dim_full (key_length), rotating with
    rope_base and the "proportional" rope's rope_freqs tensor (factor 1 for the first
    rope_fraction_full of the pairs, 1e30 for the rest); head_count_kv one per layer. q / k norms
    per head (scaled by head_dim^-1/4 each: the graph's softmax is unscaled), v RMS-normed by the
    graph; v_shared_full: the full layers have no attn_v (Gemma 4's attention_k_eq_v, v = k's
    projection); out_scale: a layer_output_scale per layer; softcap: final_logit_softcapping (0:
    none). Always tied. Norm weights are stored as they are (Gemma 4's converter adds no 1).
    experts > 0: Gemma 4 26B-A4B's MoE layers: beside the dense GeGLU MLP of width ffn (its output
    normed by post_ffw_norm_1), `experts` GeGLU experts of expert_ffn (expert_type, default wtype),
    top_k of them routed by softmax and renormalised, their input pre_ffw_norm_2, their sum normed
    by post_ffw_norm_2; the router (router_type) reads the residual RMS-normed, times 1 / sqrt(dim)
    and ffn_gate_inp.scale (here sqrt(dim) x U(1.5, 2.5): logits of std ~2, few near-ties); down_scale: a
    per-expert ffn_down_exps.scale in U(0.5, 1.5).
    ple_dim > 0: E2B / E4B's per-layer embeddings (embedding_length_per_layer_input, per_layer_token_embd
    [vocab, ple_dim x layers] in embd_type, per_layer_model_proj, per_layer_proj_norm; per layer
    inp_gate, proj, post_norm). shared_kv: the last shared_kv layers have no attn_k / attn_v / k norm
    (attention.shared_kv_layers; the two layers before them must be a sliding and a full one);
    double_wide: those layers' FFNs twice as wide (feed_forward_length per layer, as the converter
    writes use_double_wide_mlp)."""
    swa = [(i % swa_pattern) < swa_pattern - 1 if swa_pattern else True for i in range(layers)]
    rope_dims_swa = rope_dims_swa or head_dim
    if rope_dims_swa > head_dim or rope_dims_swa % 2 or not 0 < rope_fraction_full <= 1:
        raise ValueError("synth gemma4: rope_dims_swa must be even and <= head_dim, rope_fraction_full in (0, 1]")
    if experts and not 1 <= top_k <= experts:
        raise ValueError(f"synth gemma4: top_k ({top_k}) must be in 1..experts ({experts})")
    start = layers - shared_kv
    if shared_kv and (start < 2 or not swa[start - 2] or swa[start - 1]):
        raise ValueError(f"synth gemma4: with shared_kv {shared_kv}, layers {start - 2} and {start - 1} must be a "
                         "sliding and a full layer (choose --layers / --swa-pattern)")
    ffns = [2 * ffn if double_wide and i >= start else ffn for i in range(layers)]
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, "gemma4", progress=progress, fit=True)
    a = "gemma4"
    write_header(w, vocab, layers=layers, dim=dim, ffn=ffns if double_wide and shared_kv else ffn, heads=heads,
                 kv_heads=[kv_heads if s else kv_heads_full for s in swa], head_dim=head_dim_full, ctx=ctx,
                 rope_base=rope_base, rope_dims=head_dim_full)
    w.meta(f"{a}.attention.key_length_swa", int(head_dim))
    w.meta(f"{a}.attention.value_length_swa", int(head_dim))
    w.meta(f"{a}.rope.dimension_count_swa", int(rope_dims_swa))
    w.meta(f"{a}.rope.freq_base_swa", float(rope_base_swa))
    w.meta(f"{a}.attention.sliding_window", int(window))
    w.meta(f"{a}.attention.sliding_window_pattern", [bool(s) for s in swa])
    w.meta(f"{a}.attention.shared_kv_layers", int(shared_kv))
    w.meta(f"{a}.embedding_length_per_layer_input", int(ple_dim))
    if softcap:
        w.meta(f"{a}.final_logit_softcapping", float(softcap))
    if experts:
        for k, v in (("expert_count", experts), ("expert_used_count", top_k), ("expert_feed_forward_length", expert_ffn)):
            w.meta(f"{a}.{k}", int(v))
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=None, wtype=wtype, tied=True,
             emb_std=1.0 / np.sqrt(dim))
    if ple_dim:
        w.add("per_layer_token_embd.weight", gauss(rng, nv, ple_dim * layers, scale=1.0 / np.sqrt(ple_dim)), embd_type)
        w.add("per_layer_model_proj.weight", gauss(rng, ple_dim * layers, dim), wtype)
        w.add("per_layer_proj_norm.weight", norm_weight(rng, ple_dim))
    n_rot = int(head_dim_full * rope_fraction_full / 2)
    w.add("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (head_dim_full // 2 - n_rot), np.float32))
    for i in range(layers):
        p, hd = f"blk.{i}.", head_dim if swa[i] else head_dim_full
        kvh = kv_heads if swa[i] else kv_heads_full
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        w.add(p + "ffn_norm.weight", norm_weight(rng, dim))
        own_kv = i < start
        w.add(p + "attn_q.weight", gauss(rng, heads * hd, dim), wtype)
        if own_kv:
            w.add(p + "attn_k.weight", gauss(rng, kvh * hd, dim), wtype)
        if own_kv and (swa[i] or not v_shared_full):
            w.add(p + "attn_v.weight", gauss(rng, kvh * hd, dim), wtype)
        w.add(p + "attn_output.weight", gauss(rng, dim, heads * hd), wtype)
        qk = np.float32(hd ** -0.25)
        w.add(p + "attn_q_norm.weight", norm_weight(rng, hd) * qk)
        if own_kv:
            w.add(p + "attn_k_norm.weight", norm_weight(rng, hd) * qk)
        w.add(p + "post_attention_norm.weight", norm_weight(rng, dim))
        w.add(p + "post_ffw_norm.weight", norm_weight(rng, dim))
        add_glu(w, rng, p, width=ffns[i], dim=dim, wtype=wtype)
        if ple_dim:
            w.add(p + "inp_gate.weight", gauss(rng, ple_dim, dim), wtype)
            w.add(p + "proj.weight", gauss(rng, dim, ple_dim), wtype)
            w.add(p + "post_norm.weight", norm_weight(rng, dim))
        if experts:
            w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
            w.add(p + "ffn_gate_inp.scale", (np.sqrt(dim) * rng.uniform(1.5, 2.5, dim)).astype(np.float32))
            for nm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                w.add(p + nm + ".weight", norm_weight(rng, dim))
            w.add(p + "ffn_gate_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type or wtype)
            w.add(p + "ffn_up_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type or wtype)
            w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, expert_ffn), expert_type or wtype)
            if down_scale:
                w.add(p + "ffn_down_exps.scale", rng.uniform(0.5, 1.5, experts).astype(np.float32))
        if out_scale:
            w.add(p + "layer_output_scale.weight", np.array([rng.uniform(0.5, 1.0)], np.float32))
    w.close()
    return str(path)


def synth_gemma3n(path, *, layers: int = 6, dim: int = 256, ffn: int = 512, heads: int = 4, kv_heads: int = 2,
                  head_dim: int = 64, window: int = 64, swa_pattern: int | None = None, rope_base: float = 1e6,
                  rope_base_swa: float | None = None, ple_dim: int = 256, laurel_rank: int = 64, altup: int = 4,
                  router_std: float | None = None, block_scale: float = 1.0, ctx: int = 1024, wtype: str = "Q8_0", embd_type: str = "F32", seed: int = 0,
                  vocab: dict | None = None, progress: bool = False) -> str:
    """A Gemma 3n model (llama.cpp's gemma3n, as convert_hf_to_gguf's Gemma3NModel writes it) with
    random weights: gemma3's scaled embeddings, pre- and post-norms, per-head q / k norms (scaled by
    head_dim^-1/4 each, as synth_gemma4's; v RMS-normed by the graph) and GeGLU; sliding windows of `window` positions on every layer but
    the last of each swa_pattern (None: no key, llama.cpp's 5), rope_base_swa for them (None: no
    key, llama.cpp's 10000); `altup` residual streams (altup_proj / altup_unembd_proj [altup - 1,
    dim, dim], per layer altup_router [altup, dim] and its norm, altup_predict_coef [altup^2,
    altup], altup_correct_coef [altup, altup] and altup_correct_scale); LAuReL (laurel_l [rank,
    dim], laurel_r [dim, rank], laurel_post_norm); per-layer embeddings of ple_dim (llama.cpp
    reads 256: its n_embd_altup); every layer writes its k / v (llama.cpp loads them, and from
    layer 20 on reads layer 18's or 19's cache instead). Always tied; no final_logit_softcapping
    key (llama.cpp caps at 30 regardless). llama.cpp fixes the rest: 4 streams, the first active,
    the first 10 layers' gates sparse. router_std (None: sqrt(dim)): the graph divides the router's
    input by dim, so sqrt(dim) gives modalities tanh(N(0, 1)) and streams mixed by ~0.2 each
    (a deep model mixed that much is chaotic: a smaller std keeps it tame); block_scale: the
    attention's and the FFN's post-norm weights times this (< 1: each layer adds less, a deep random
    model is less sensitive to rounding)."""
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    a = "gemma3n"
    w = Writer(path, a, progress=progress, fit=True)
    write_header(w, vocab, layers=layers, dim=dim, ffn=ffn, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                 ctx=ctx, rope_base=rope_base)
    w.meta(f"{a}.attention.sliding_window", int(window))
    if swa_pattern is not None:
        w.meta(f"{a}.attention.sliding_window_pattern", int(swa_pattern))
    if rope_base_swa is not None:
        w.meta(f"{a}.rope.freq_base_swa", float(rope_base_swa))
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=None, wtype=wtype, tied=True, emb_std=1.0 / np.sqrt(dim))
    w.add("altup_proj.weight", gauss(rng, altup - 1, dim, dim), wtype)
    w.add("altup_unembd_proj.weight", gauss(rng, altup - 1, dim, dim), wtype)
    w.add("per_layer_token_embd.weight", gauss(rng, nv, ple_dim * layers, scale=1.0 / np.sqrt(ple_dim)), embd_type)
    w.add("per_layer_model_proj.weight", gauss(rng, ple_dim * layers, dim), wtype)
    w.add("per_layer_proj_norm.weight", norm_weight(rng, ple_dim))
    for i in range(layers):
        p = f"blk.{i}."
        add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=head_dim, wtype=wtype)
        qk = np.float32(head_dim ** -0.25)  # (the graph's softmax is unscaled: as synth_gemma4)
        w.add(p + "attn_q_norm.weight", norm_weight(rng, head_dim) * qk)
        w.add(p + "attn_k_norm.weight", norm_weight(rng, head_dim) * qk)
        w.add(p + "post_attention_norm.weight", norm_weight(rng, dim) * np.float32(block_scale))
        w.add(p + "post_ffw_norm.weight", norm_weight(rng, dim) * np.float32(block_scale))
        add_glu(w, rng, p, width=ffn, dim=dim, wtype=wtype)
        w.add(p + "inp_gate.weight", gauss(rng, ple_dim, dim), wtype)
        w.add(p + "proj.weight", gauss(rng, dim, ple_dim), wtype)
        w.add(p + "post_norm.weight", norm_weight(rng, dim))
        w.add(p + "altup_router.weight", gauss(rng, altup, dim, scale=router_std or np.sqrt(dim)))
        w.add(p + "altup_router_norm.weight", norm_weight(rng, dim))
        w.add(p + "altup_predict_coef.weight", gauss(rng, altup * altup, altup, scale=0.2))
        w.add(p + "altup_correct_coef.weight", gauss(rng, altup, altup, scale=0.2))
        w.add(p + "altup_correct_scale.weight", norm_weight(rng, dim))
        w.add(p + "laurel_l.weight", gauss(rng, laurel_rank, dim), wtype)
        w.add(p + "laurel_r.weight", gauss(rng, dim, laurel_rank), wtype)
        w.add(p + "laurel_post_norm.weight", norm_weight(rng, dim))
    w.close()
    return str(path)


MOE_ARCHS = {"qwen3moe": "qwen3moe", "qwen2moe": "qwen2moe", "olmoe": "olmoe", "mixtral": "llama", "gpt-oss": "gpt-oss",
             "glm4moe": "glm4moe", "deepseek2": "deepseek2", "granitemoe": "granitemoe",
             "ernie4_5-moe": "ernie4_5-moe", "qwen3vlmoe": "qwen3vlmoe"}


def synth_deepseek2(path, *, layers: int = 3, dim: int = 256, heads: int = 4, q_lora_rank: int = 0,
                    kv_lora_rank: int = 64, qk_nope: int = 32, rope_dims: int = 16, v_head_dim: int = 32,
                    experts: int = 8, top_k: int = 2, expert_ffn: int = 256, dense_ffn: int = 512,
                    leading_dense: int = 1, shared_experts: int = 2, expert_scale: float = 1.0,
                    gating: str = "softmax", expert_norm: bool = False, probs_bias: bool | None = None,
                    expert_groups: int = 0, expert_groups_used: int = 0, yarn_factor: float = 40.0,
                    yarn_orig_ctx: int = 4096, yarn_log_mul: float = 0.0707, rope_base: float = 10000.0,
                    ctx: int = 1024, wtype: str = "Q8_0", mla_type: str | None = None, expert_type: str = "Q4_K",
                    down_type: str | None = None, router_type: str = "F32", embd_type: str = "F32",
                    head_type: str | None = None, seed: int = 0, vocab: dict | None = None,
                    nextn: int = 0, progress: bool = False) -> str:
    """A DeepSeek V2/V3 model (llama.cpp's deepseek2 with the MLA split, as convert_hf_to_gguf writes
    it) with random weights: multi-head latent attention (attn_q, or attn_q_a / attn_q_a_norm /
    attn_q_b when q_lora_rank > 0; attn_kv_a_mqa [kv_lora_rank + rope_dims, dim], attn_kv_a_norm,
    attn_k_b [heads, kv_lora_rank, qk_nope], attn_v_b [heads, v_head_dim, kv_lora_rank] in mla_type,
    default wtype), head_count_kv 1, key_length kv_lora_rank + rope, key_length_mla qk_nope + rope;
    the first leading_dense layers a dense SwiGLU FFN of dense_ffn, the others routed experts
    (softmax or sigmoid gating; probs_bias: an exp_probs_b selection bias, default with sigmoid as
    V3), shared_experts shared experts of expert_ffn each, expert_weights_scale / _norm, optional
    group-limited routing; YaRN rope (yarn_factor 0: none) with yarn_log_multiplier (0.1 *
    mscale_all_dim, as the converter writes it: V2-Lite's 0.0707). A matrix whose rows its format's
    blocks do not divide takes llama-quant's fallback (formats.fit_type: Q4_K -> Q5_0, ...). nextn: MTP blocks
    after the trunk (block_count = layers + nextn, nextn_predict_layers), each a routed-expert layer
    plus nextn.eh_proj [dim, 2 dim], nextn.enorm, nextn.hnorm, nextn.shared_head_norm (V3's layout)."""
    if not 0 <= leading_dense <= layers:
        raise ValueError(f"synth moe: leading_dense {leading_dense} must be in 0..layers ({layers})")
    if not 1 <= top_k <= experts:
        raise ValueError(f"synth moe: top_k {top_k} must be in 1..experts ({experts})")
    if rope_dims <= 0 or rope_dims % 8 or kv_lora_rank <= 0 or kv_lora_rank % 8 or qk_nope <= 0 or v_head_dim <= 0:
        raise ValueError("synth moe: deepseek2 needs kv_lora_rank and rope_dims positive multiples of 8, "
                         "qk_nope and v_head_dim positive")
    if gating not in ("softmax", "sigmoid"):
        raise ValueError(f"synth moe: gating must be softmax or sigmoid, not {gating!r}")
    if expert_groups > 1 and (experts % expert_groups or not 0 < expert_groups_used < expert_groups):
        raise ValueError("synth moe: expert_groups must divide experts, 0 < expert_groups_used < expert_groups")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    hd, R = qk_nope + rope_dims, kv_lora_rank
    mla_type = mla_type or wtype
    w = Writer(path, "deepseek2", progress=progress, fit=True)
    a = w.arch
    write_header(w, vocab, layers=layers + nextn, dim=dim, ffn=dense_ffn, heads=heads, kv_heads=1,
                 head_dim=R + rope_dims, ctx=ctx, rope_base=rope_base, rope_dims=rope_dims, value_length=R)
    if nextn:
        w.meta(f"{a}.nextn_predict_layers", int(nextn))
    for key, val in (("leading_dense_block_count", leading_dense), ("vocab_size", nv),
                     ("attention.q_lora_rank", q_lora_rank), ("attention.kv_lora_rank", R),
                     ("attention.key_length_mla", hd), ("attention.value_length_mla", v_head_dim),
                     ("expert_feed_forward_length", expert_ffn), ("expert_count", experts),
                     ("expert_used_count", top_k), ("expert_shared_count", shared_experts),
                     ("expert_gating_func", 1 if gating == "softmax" else 2)):
        w.meta(f"{a}.{key}", int(val))
    w.meta(f"{a}.expert_weights_scale", float(expert_scale))
    w.meta(f"{a}.expert_weights_norm", bool(expert_norm))
    if expert_groups > 1:
        w.meta(f"{a}.expert_group_count", int(expert_groups))
        w.meta(f"{a}.expert_group_used_count", int(expert_groups_used))
    if yarn_factor and yarn_factor != 1.0:
        w.meta(f"{a}.rope.scaling.type", "yarn")
        w.meta(f"{a}.rope.scaling.factor", float(yarn_factor))
        w.meta(f"{a}.rope.scaling.original_context_length", int(yarn_orig_ctx))
        w.meta(f"{a}.rope.scaling.yarn_log_multiplier", float(yarn_log_mul))
    bias = gating == "sigmoid" if probs_bias is None else probs_bias
    w.add("token_embd.weight", gauss(rng, nv, dim, scale=1.0), embd_type)
    w.add("output_norm.weight", norm_weight(rng, dim))
    w.add("output.weight", gauss(rng, nv, dim), head_type or wtype)
    for i in range(layers + nextn):
        p = f"blk.{i}."
        if i >= layers:  # an MTP block: its own inputs, then a layer as the others
            w.add(p + "nextn.eh_proj.weight", gauss(rng, dim, 2 * dim), wtype)
            for nm in ("enorm", "hnorm", "shared_head_norm"):
                w.add(p + f"nextn.{nm}.weight", norm_weight(rng, dim))
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        if q_lora_rank > 0:
            w.add(p + "attn_q_a.weight", gauss(rng, q_lora_rank, dim), wtype)
            w.add(p + "attn_q_a_norm.weight", norm_weight(rng, q_lora_rank))
            w.add(p + "attn_q_b.weight", gauss(rng, heads * hd, q_lora_rank), wtype)
        else:
            w.add(p + "attn_q.weight", gauss(rng, heads * hd, dim), wtype)
        w.add(p + "attn_kv_a_mqa.weight", gauss(rng, R + rope_dims, dim), wtype)
        w.add(p + "attn_kv_a_norm.weight", norm_weight(rng, R))
        # k_b: kv_b's key rows transposed per head ([R, nope]); v_b: its value rows ([vd, R])
        w.add(p + "attn_k_b.weight", gauss(rng, heads, R, qk_nope, scale=1.0 / np.sqrt(R)), mla_type)
        w.add(p + "attn_v_b.weight", gauss(rng, heads, v_head_dim, R), mla_type)
        w.add(p + "attn_output.weight", gauss(rng, dim, heads * v_head_dim), wtype)
        w.add(p + "ffn_norm.weight", norm_weight(rng, dim))
        if i < leading_dense:
            w.add(p + "ffn_gate.weight", gauss(rng, dense_ffn, dim), wtype)
            w.add(p + "ffn_up.weight", gauss(rng, dense_ffn, dim), wtype)
            w.add(p + "ffn_down.weight", gauss(rng, dim, dense_ffn), wtype)
            continue
        w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
        if bias:
            w.add(p + "exp_probs_b.bias", 0.1 * rng.standard_normal(experts).astype(np.float32))
        w.add(p + "ffn_gate_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
        w.add(p + "ffn_up_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
        w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, expert_ffn), down_type or expert_type)
        sh = shared_experts * expert_ffn
        w.add(p + "ffn_gate_shexp.weight", gauss(rng, sh, dim), wtype)
        w.add(p + "ffn_up_shexp.weight", gauss(rng, sh, dim), wtype)
        w.add(p + "ffn_down_shexp.weight", gauss(rng, dim, sh), wtype)
    w.close()
    return str(path)


def add_glm4moe_layer(w: Writer, rng: np.random.Generator, p: str, *, dense: bool, dim: int, heads: int,
                      kv_heads: int, head_dim: int, experts: int, expert_ffn: int, dense_ffn: int, shared: int,
                      qk_norm: bool, wtype: str, expert_type: str, down_type: str | None, router_type: str) -> None:
    """One glm4moe block as convert_hf_to_gguf lays it out: attention with q/k/v biases (and
    per-head q/k norms if qk_norm), the FFN norm post_attention_norm, then a dense SwiGLU FFN
    (the leading layers) or the router, its selection bias exp_probs_b, the experts and the
    shared expert (width shared * expert_ffn)."""
    add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=head_dim, wtype=wtype,
                  ffn_norm="post_attention_norm")
    for nm, rows in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
        w.add(p + f"attn_{nm}.bias", 0.1 * rng.standard_normal(rows).astype(np.float32))
    if qk_norm:
        w.add(p + "attn_q_norm.weight", norm_weight(rng, head_dim))
        w.add(p + "attn_k_norm.weight", norm_weight(rng, head_dim))
    if dense:
        w.add(p + "ffn_gate.weight", gauss(rng, dense_ffn, dim), wtype)
        w.add(p + "ffn_up.weight", gauss(rng, dense_ffn, dim), wtype)
        w.add(p + "ffn_down.weight", gauss(rng, dim, dense_ffn), wtype)
        return
    w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
    w.add(p + "exp_probs_b.bias", 0.1 * rng.standard_normal(experts).astype(np.float32))
    w.add(p + "ffn_gate_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
    w.add(p + "ffn_up_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
    w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, expert_ffn), down_type or expert_type)
    sh = shared * expert_ffn
    w.add(p + "ffn_gate_shexp.weight", gauss(rng, sh, dim), wtype)
    w.add(p + "ffn_up_shexp.weight", gauss(rng, sh, dim), wtype)
    w.add(p + "ffn_down_shexp.weight", gauss(rng, dim, sh), wtype)


def synth_moe(path, *, arch: str = "qwen3moe", layers: int = 2, dim: int = 256, heads: int = 4, kv_heads: int = 2,
              head_dim: int | None = None, experts: int = 8, top_k: int = 2, expert_ffn: int = 256,
              shared_ffn: int = 512, ctx: int = 1024, wtype: str = "Q8_0", expert_type: str = "Q4_K",
              down_type: str | None = None, router_type: str = "F32", embd_type: str = "F32",
              head_type: str | None = None, seed: int = 0, vocab: dict | None = None, window: int = 128,
              rope_base: float = 150000.0, yarn_factor: float = 32.0, yarn_orig_ctx: int = 4096,
              dense_ffn: int = 512, leading_dense: int = 1, shared_experts: int = 1, nextn: int = 1,
              rope_dims: int | None = None, qk_norm: bool = False, expert_scale: float = 2.5,
              gating: str = "sigmoid", progress: bool = False) -> str:
    """A Mixture-of-Experts model with random weights, as llama.cpp's converters lay them out.

    arch: qwen3moe (q/k norm; qwen3vlmoe: with qwen3vl_keys), qwen2moe (q/k/v biases, a shared expert of width shared_ffn with a
    sigmoid gate), olmoe (q/k norm over the whole q / k vector; kv_heads = heads), mixtral (GGUF
    arch "llama" with expert tensors). Experts are the 3-D tensors ffn_{gate,up,down}_exps
    [experts, rows, n] in expert_type (down in down_type, default the same), the router
    ffn_gate_inp [experts, dim] in router_type (F32/F16/BF16). wtype: attention (and the shared
    expert); head_type: output.weight (default wtype); vocab: tokenizer.* metadata (None: the
    default model's).

    gpt-oss (llama.cpp's names and keys): attention with q/k/v/o biases and a sink logit per head
    (blk.N.attn_sinks.weight), sliding windows of `window` positions on even layers, the FFN norm named
    post_attention_norm, router and expert biases, YaRN rope (rope_base, yarn_factor, yarn_orig_ctx, as
    gpt-oss's config: 150000, 32, 4096); its experts default to MXFP4 (expert_type).

    glm4moe (llama.cpp's names and keys, GLM-4.5's layout): `layers` blocks run, the first
    leading_dense of them with a dense SwiGLU FFN of width dense_ffn (feed_forward_length), the
    rest routed by sigmoid with an exp_probs_b selection bias, top-K weights renormalised and
    times expert_scale (gating "softmax": expert_gating_func 1, the softmax over all experts, still
    with the selection bias), plus shared_experts shared experts; q/k/v biases, q/k norms if qk_norm,
    rope over rope_dims of each head (None: half, as GLM-4.5's partial_rotary_factor 0.5); then
    `nextn` MTP blocks (block_count = layers + nextn) with their nextn.* tensors, which llama.cpp
    loads and does not run when generating.

    ernie4_5-moe (ERNIE 4.5 MoE): the first leading_dense layers with a dense FFN of width
    dense_ffn (feed_forward_length), then experts on every layer (interleave_moe_layer_step 1) with
    an exp_probs_b selection bias and an ungated shared expert of width shared_ffn (0: none).

    granitemoe (Granite 3 MoE): granite's multipliers (GRANITE_SCALES, attention.scale 1 / head_dim,
    embeddings and head scaled as synth_dense's granite), experts of width expert_ffn
    (feed_forward_length), and an ungated shared expert of width shared_ffn (0: none) with its
    expert_shared_feed_forward_length key (Granite MoE Shared).

    Routing is not degenerate: the router rows are N(0, 1/dim), so a token's router logits are
    about N(0, 1) and differ from token to token: every expert gets tokens, top-K sets vary.
    """
    if arch not in MOE_ARCHS:
        raise ValueError(f"synth moe: arch must be one of {', '.join(MOE_ARCHS)}, not {arch!r}")
    if not 1 <= top_k <= experts:
        raise ValueError(f"synth moe: top_k {top_k} must be in 1..experts ({experts})")
    if arch == "qwen2moe" and shared_ffn < 1:
        raise ValueError(f"synth moe: qwen2moe's shared expert needs a width (--shared-ffn) >= 1, not {shared_ffn}")
    hd = head_dim or dim // heads
    if arch == "olmoe" and (kv_heads != heads or heads * hd != dim):
        raise ValueError("synth moe: olmoe needs kv_heads == heads and heads * head_dim == dim")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    if arch == "glm4moe":
        return _synth_glm4moe(path, rng, vocab, layers=layers, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=hd,
                              experts=experts, top_k=top_k, expert_ffn=expert_ffn, dense_ffn=dense_ffn,
                              leading_dense=leading_dense, shared=shared_experts, nextn=nextn,
                              rope_dims=rope_dims or hd // 2, qk_norm=qk_norm, expert_scale=expert_scale,
                              gating_func={"softmax": 1, "sigmoid": 2}[gating], ctx=ctx,
                              wtype=wtype, expert_type=expert_type, down_type=down_type, router_type=router_type,
                              embd_type=embd_type, head_type=head_type, progress=progress)
    w = Writer(path, MOE_ARCHS[arch], progress=progress, fit=True)
    a = w.arch
    oss = arch == "gpt-oss"
    write_header(w, vocab, layers=layers, dim=dim, ffn=dense_ffn if arch == "ernie4_5-moe" else expert_ffn, heads=heads, kv_heads=kv_heads, head_dim=hd,
                 ctx=ctx, rope_base=rope_base if oss else 10000.0)
    w.meta(f"{a}.expert_count", int(experts))
    w.meta(f"{a}.expert_used_count", int(top_k))
    if arch in ("qwen3moe", "qwen2moe", "gpt-oss", "qwen3vlmoe"):
        w.meta(f"{a}.expert_feed_forward_length", int(expert_ffn))
    if arch == "qwen3vlmoe":
        qwen3vl_keys(w, hd)
    if oss:
        w.meta(f"{a}.attention.sliding_window", int(window))
        w.meta(f"{a}.rope.scaling.type", "yarn")
        w.meta(f"{a}.rope.scaling.factor", float(yarn_factor))
        w.meta(f"{a}.rope.scaling.original_context_length", int(yarn_orig_ctx))
    granite, ernie = arch == "granitemoe", arch == "ernie4_5-moe"
    if ernie:  # (feed_forward_length, in the header, is the leading dense layers' width)
        w.meta(f"{a}.expert_feed_forward_length", int(expert_ffn))
        w.meta(f"{a}.interleave_moe_layer_step", 1)
        w.meta(f"{a}.leading_dense_block_count", int(leading_dense))
    if arch == "qwen2moe" or ((granite or ernie) and shared_ffn):
        w.meta(f"{a}.expert_shared_feed_forward_length", int(shared_ffn))
    emb_std, head_std = granite_scales(w, hd, dim) if granite else (1.0, None)
    w.add("token_embd.weight", gauss(rng, nv, dim, scale=emb_std), embd_type)
    w.add("output.weight", gauss(rng, nv, dim, scale=head_std), head_type or wtype)
    w.add("output_norm.weight", norm_weight(rng, dim))
    for i in range(layers):
        p = f"blk.{i}."
        add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=hd, wtype=wtype,
                      ffn_norm="post_attention_norm" if oss else "ffn_norm")
        if oss:
            for nm, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd), ("output", dim)):
                w.add(p + f"attn_{nm}.bias", 0.1 * rng.standard_normal(rows).astype(np.float32))
            w.add(p + "attn_sinks.weight", rng.standard_normal(heads).astype(np.float32))
        if arch in ("qwen3moe", "qwen3vlmoe"):
            w.add(p + "attn_q_norm.weight", norm_weight(rng, hd))
            w.add(p + "attn_k_norm.weight", norm_weight(rng, hd))
        if arch == "olmoe":
            w.add(p + "attn_q_norm.weight", norm_weight(rng, heads * hd))
            w.add(p + "attn_k_norm.weight", norm_weight(rng, kv_heads * hd))
        if arch == "qwen2moe":
            for nm, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
                w.add(p + f"attn_{nm}.bias", 0.1 * rng.standard_normal(rows).astype(np.float32))
        if ernie and i < leading_dense:
            add_glu(w, rng, p, width=dense_ffn, dim=dim, wtype=wtype)
            continue
        w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
        if ernie:
            w.add(p + "exp_probs_b.bias", 0.1 * rng.standard_normal(experts).astype(np.float32))
        w.add(p + "ffn_gate_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
        w.add(p + "ffn_up_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
        w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, expert_ffn), down_type or expert_type)
        if oss:
            w.add(p + "ffn_gate_inp.bias", 0.5 * rng.standard_normal(experts).astype(np.float32))
            for nm, rows in (("gate", expert_ffn), ("up", expert_ffn), ("down", dim)):
                w.add(p + f"ffn_{nm}_exps.bias", 0.1 * rng.standard_normal((experts, rows)).astype(np.float32))
        if arch == "qwen2moe":  # (its sigmoid gate)
            w.add(p + "ffn_gate_inp_shexp.weight", gauss(rng, dim), "F32")
        if arch == "qwen2moe" or ((granite or ernie) and shared_ffn):
            add_glu(w, rng, p, width=shared_ffn, dim=dim, wtype=wtype, suffix="_shexp")
    w.close()
    return str(path)


def _synth_glm4moe(path, rng, vocab, *, layers, dim, heads, kv_heads, head_dim, experts, top_k, expert_ffn,
                   dense_ffn, leading_dense, shared, nextn, rope_dims, qk_norm, expert_scale, gating_func, ctx, wtype,
                   expert_type, down_type, router_type, embd_type, head_type, progress) -> str:
    """synth_moe(arch="glm4moe")'s file (see there)."""
    if not 0 <= leading_dense <= layers:
        raise ValueError(f"synth moe: leading_dense {leading_dense} must be in 0..layers ({layers})")
    if not (0 < rope_dims <= head_dim and rope_dims % 2 == 0):
        raise ValueError(f"synth moe: rope_dims {rope_dims} must be even and in 2..head_dim ({head_dim})")
    if shared < 1 or nextn < 0:
        raise ValueError("synth moe: glm4moe needs shared_experts >= 1 and nextn >= 0")
    w = Writer(path, "glm4moe", progress=progress, fit=True)
    a = w.arch
    write_header(w, vocab, layers=layers + nextn, dim=dim, ffn=dense_ffn, heads=heads, kv_heads=kv_heads,
                 head_dim=head_dim, ctx=ctx, rope_dims=rope_dims)
    for key, val in (("expert_count", experts), ("expert_used_count", top_k), ("expert_shared_count", shared),
                     ("expert_feed_forward_length", expert_ffn), ("leading_dense_block_count", leading_dense),
                     ("nextn_predict_layers", nextn), ("expert_gating_func", gating_func)):
        w.meta(f"{a}.{key}", int(val))
    w.meta(f"{a}.expert_weights_scale", float(expert_scale))
    w.meta(f"{a}.expert_weights_norm", True)
    nv = vocab_size(vocab)
    w.add("token_embd.weight", gauss(rng, nv, dim, scale=1.0), embd_type)
    w.add("output.weight", gauss(rng, nv, dim), head_type or wtype)
    w.add("output_norm.weight", norm_weight(rng, dim))
    for i in range(layers + nextn):
        p = f"blk.{i}."
        add_glm4moe_layer(w, rng, p, dense=i < leading_dense, dim=dim, heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, experts=experts, expert_ffn=expert_ffn, dense_ffn=dense_ffn,
                          shared=shared, qk_norm=qk_norm, wtype=wtype, expert_type=expert_type, down_type=down_type,
                          router_type=router_type)
        if i >= layers:  # the MTP block's own tensors
            w.add(p + "nextn.eh_proj.weight", gauss(rng, dim, 2 * dim), wtype)
            w.add(p + "nextn.enorm.weight", norm_weight(rng, dim))
            w.add(p + "nextn.hnorm.weight", norm_weight(rng, dim))
            w.add(p + "nextn.shared_head_norm.weight", norm_weight(rng, dim))
    w.close()
    return str(path)


HYBRID_ARCHS = ("qwen35moe", "qwen35", "qwen3next")


def synth_hybrid(path, *, arch: str = "qwen35moe", layers: int = 4, dim: int = 256, heads: int = 4,
                 kv_heads: int = 2, head_dim: int = 64, rope_dims: int = 32, sections=(3, 3, 2, 0),
                 full_attention_interval: int = 4, ssm_conv: int = 4, ssm_state: int = 32, ssm_groups: int = 2,
                 ssm_heads: int = 4, ffn: int = 512, experts: int = 8, top_k: int = 2, expert_ffn: int = 256,
                 shared_ffn: int = 256, ctx: int = 1024, rope_base: float = 10000000.0, wtype: str = "Q8_0",
                 expert_type: str = "Q4_K", ssm_type: str = "F32", router_type: str = "F32",
                 embd_type: str = "F32", head_type: str | None = None, seed: int = 0, vocab: dict | None = None,
                 mtp_layers: int = 0, progress: bool = False) -> str:
    """A hybrid Qwen model with random weights, as llama.cpp's converter lays it out: qwen35moe
    (Qwen3.5 / 3.6 MoE), qwen35 (its dense sibling), qwen3next (Qwen3-Next).

    Layer il is a gated delta-net layer unless (il + 1) % full_attention_interval == 0, then gated
    full attention: attn_q [2 heads head_dim, dim] ([q, gate] per head), attn_k / attn_v, q/k norms,
    rope over rope_dims of each head (qwen35*: IMROPE `sections`; qwen3next: neox). A delta-net
    layer: attn_qkv [(2 ssm_groups + ssm_heads) ssm_state, dim], attn_gate (z), ssm_conv1d
    [conv_dim, ssm_conv] (F32), ssm_dt.bias, ssm_a (= -exp(A_log) < 0), ssm_beta / ssm_alpha
    [ssm_heads, dim] (qwen3next: one ssm_ba [2 ssm_heads, dim]) in ssm_type, ssm_norm, ssm_out.
    FFN: routed experts (expert_type) plus a shared expert of width shared_ffn behind a sigmoid
    gate (qwen35moe, qwen3next), or a dense FFN of width ffn (qwen35). Norms: attn_norm and
    post_attention_norm (the FFN's input). mtp_layers: MTP (nextn) blocks appended after the trunk
    (block_count includes them, nextn_predict_layers counts them), each a gated full-attention block
    with the trunk's FFN plus nextn.eh_proj [dim, 2 dim], nextn.enorm, nextn.hnorm and
    nextn.shared_head_norm, as llama.cpp's loader wants them.

    Qwen3.6-35B-A3B (for benchmarks): layers 40, dim 2048, heads 16, kv_heads 2, head_dim 256,
    rope_dims 64, sections (11, 11, 10, 0), interval 4, ssm_conv 4, ssm_state 128, ssm_groups 16,
    ssm_heads 32, experts 256, top_k 8, expert_ffn 512, shared_ffn 512.
    """
    if arch not in HYBRID_ARCHS:
        raise ValueError(f"synth: hybrid arch must be one of {', '.join(HYBRID_ARCHS)}, not {arch!r}")
    if ssm_heads % ssm_groups:
        raise ValueError(f"synth: ssm_heads ({ssm_heads}) must be a multiple of ssm_groups ({ssm_groups})")
    if not 2 <= rope_dims <= head_dim or rope_dims % 2:
        raise ValueError(f"synth: rope_dims ({rope_dims}) must be even and in 2..head_dim ({head_dim})")
    moe = arch != "qwen35"
    if moe and not 1 <= top_k <= experts:
        raise ValueError(f"synth: top_k {top_k} must be in 1..experts ({experts})")
    if moe and shared_ffn < 1:
        raise ValueError(f"synth: {arch}'s shared expert needs a width (--shared-ffn) >= 1, not {shared_ffn}")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, arch, progress=progress, fit=True)
    a = w.arch
    write_header(w, vocab, layers=layers + mtp_layers, dim=dim, ffn=ffn if not moe else expert_ffn, heads=heads,
                 kv_heads=kv_heads, head_dim=head_dim, ctx=ctx, rope_base=rope_base, rope_dims=rope_dims)
    if arch != "qwen3next":
        w.meta(f"{a}.rope.dimension_sections", [int(v) for v in (list(sections) + [0, 0, 0, 0])[:4]])
    for k, v in (("ssm.conv_kernel", ssm_conv), ("ssm.state_size", ssm_state), ("ssm.group_count", ssm_groups),
                 ("ssm.time_step_rank", ssm_heads), ("ssm.inner_size", ssm_heads * ssm_state),
                 ("full_attention_interval", full_attention_interval)):
        w.meta(f"{a}.{k}", int(v))
    if moe:
        w.meta(f"{a}.expert_count", int(experts))
        w.meta(f"{a}.expert_used_count", int(top_k))
        w.meta(f"{a}.expert_feed_forward_length", int(expert_ffn))
        w.meta(f"{a}.expert_shared_feed_forward_length", int(shared_ffn))
    if mtp_layers:
        w.meta(f"{a}.nextn_predict_layers", int(mtp_layers))
    w.add("token_embd.weight", gauss(rng, nv, dim, scale=1.0), embd_type)
    w.add("output.weight", gauss(rng, nv, dim), head_type or wtype)
    w.add("output_norm.weight", norm_weight(rng, dim))
    S, Hk, Hv = ssm_state, ssm_groups, ssm_heads
    cd, vd = (2 * Hk + Hv) * S, Hv * S
    for i in range(layers + mtp_layers):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        w.add(p + "post_attention_norm.weight", norm_weight(rng, dim))
        if i >= layers:  # an MTP block: its own inputs, then a full-attention block below
            w.add(p + "nextn.eh_proj.weight", gauss(rng, dim, 2 * dim), wtype)
            for nm in ("enorm", "hnorm", "shared_head_norm"):
                w.add(p + f"nextn.{nm}.weight", norm_weight(rng, dim))
        if i < layers and (i + 1) % full_attention_interval != 0:  # gated delta-net
            w.add(p + "attn_qkv.weight", gauss(rng, cd, dim), wtype)
            w.add(p + "attn_gate.weight", gauss(rng, vd, dim), wtype)
            w.add(p + "ssm_conv1d.weight", gauss(rng, cd, ssm_conv, scale=0.5))
            # decays exp(g), g = softplus(alpha + dt) * ssm_a, spread over about (0.1, 0.95): the state
            # carries several tokens back
            w.add(p + "ssm_dt.bias", (-2.0 + 0.5 * rng.standard_normal(Hv)).astype(np.float32))
            w.add(p + "ssm_a", -rng.uniform(0.5, 4.0, Hv).astype(np.float32))
            if arch == "qwen3next":
                w.add(p + "ssm_ba.weight", gauss(rng, 2 * Hv, dim), ssm_type)
            else:
                w.add(p + "ssm_beta.weight", gauss(rng, Hv, dim), ssm_type)
                w.add(p + "ssm_alpha.weight", gauss(rng, Hv, dim), ssm_type)
            w.add(p + "ssm_norm.weight", norm_weight(rng, S))
            w.add(p + "ssm_out.weight", gauss(rng, dim, vd), wtype)
        else:  # gated full attention
            w.add(p + "attn_q.weight", gauss(rng, 2 * heads * head_dim, dim), wtype)
            w.add(p + "attn_k.weight", gauss(rng, kv_heads * head_dim, dim), wtype)
            w.add(p + "attn_v.weight", gauss(rng, kv_heads * head_dim, dim), wtype)
            w.add(p + "attn_output.weight", gauss(rng, dim, heads * head_dim), wtype)
            w.add(p + "attn_q_norm.weight", norm_weight(rng, head_dim))
            w.add(p + "attn_k_norm.weight", norm_weight(rng, head_dim))
        if moe:
            w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
            w.add(p + "ffn_gate_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
            w.add(p + "ffn_up_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
            w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, expert_ffn), expert_type)
            w.add(p + "ffn_gate_inp_shexp.weight", gauss(rng, dim), "F32")
            w.add(p + "ffn_gate_shexp.weight", gauss(rng, shared_ffn, dim), wtype)
            w.add(p + "ffn_up_shexp.weight", gauss(rng, shared_ffn, dim), wtype)
            w.add(p + "ffn_down_shexp.weight", gauss(rng, dim, shared_ffn), wtype)
        else:
            w.add(p + "ffn_gate.weight", gauss(rng, ffn, dim), wtype)
            w.add(p + "ffn_up.weight", gauss(rng, ffn, dim), wtype)
            w.add(p + "ffn_down.weight", gauss(rng, dim, ffn), wtype)
    w.close()
    return str(path)


LFM2_ARCHS = ("lfm2", "lfm2moe")


def _format_options(p: argparse.ArgumentParser, experts: str = "", tied: str = "") -> None:
    """The tensor-format options of a family's parser: --type, --expert-type and --router-type (their
    help prefixed by `experts`, e.g. "lfm2moe: "), --embd-type, --head-type, --tied (+ `tied`)."""
    p.add_argument("--type", dest="wtype", default="Q8_0", help="format of the layer matrices (default Q8_0)")
    p.add_argument("--expert-type", default="Q4_K", help=f"{experts}the experts' format (Q4_K)")
    p.add_argument("--router-type", default="F32", help=f"{experts}ffn_gate_inp's format: F32, F16 or BF16")
    p.add_argument("--embd-type", default="F32", help="format of token_embd (default F32)")
    p.add_argument("--head-type", default=None, help="format of output.weight (default: --type)")
    p.add_argument("--tied", action="store_true", help="no output.weight: token_embd is the head" + tied)


def _attn_layer_list(a: argparse.Namespace) -> list | None:
    """--attn-layers as a list (None: the family's default); with --shape and no --attn-layers, the
    shape's attention layers inside the slice's --layers."""
    try:
        attn = None if a.attn_layers is None else [int(v) for v in a.attn_layers.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--attn-layers {a.attn_layers!r} is not comma-separated integers") from None
    if a.shape and "attn_layers" not in getattr(a, "given", ()):  # a slice of a published shape: its first layers
        attn = [i for i in attn if i < a.layers]
    return attn


def synth_lfm2(path, *, arch: str = "lfm2", layers: int = 4, dim: int = 256, ffn: int = 512, heads: int = 4,
               kv_heads: int = 2, attn_layers=None, l_cache: int = 3, experts: int = 8, top_k: int = 2,
               expert_ffn: int = 256, leading_dense: int = 1, gating: str = "sigmoid", ctx: int = 1024,
               rope_base: float = 1000000.0, window: int = 0, wtype: str = "Q8_0", expert_type: str = "Q4_K",
               router_type: str = "F32", embd_type: str = "F32", head_type: str | None = None, tied: bool = False,
               seed: int = 0, vocab: dict | None = None, progress: bool = False) -> str:
    """An LFM2 model with random weights, as llama.cpp's converter lays it out: lfm2 (LFM2 dense) or
    lfm2moe (LFM2 MoE). Layers in attn_layers (default: every third, from layer 2) are attention
    (attn_q / attn_k / attn_v / attn_output, per-head attn_q_norm / attn_k_norm, neox rope), the
    others short-conv blocks: shortconv.in_proj [3 dim, dim] (b, c, x), shortconv.conv [dim, l_cache]
    (F32), shortconv.out_proj [dim, dim]; head_count_kv is one count per layer, 0 for a conv layer.
    Every layer has attn_norm (the operator norm) and ffn_norm, and a SwiGLU FFN of width ffn
    (lfm2; lfm2moe's first leading_dense layers), or experts (lfm2moe): ffn_gate_inp in router_type,
    the experts in expert_type, the exp_probs_b selection bias, gating sigmoid or softmax. The final
    norm is token_embd_norm (llama.cpp's name for LFM2's). window > 0: attention.sliding_window, which
    llama.cpp applies to every attention layer.

    LFM2-1.2B: layers 16, dim 2048, ffn 8192, heads 32, kv_heads 8, attention at 2, 5, 8, 10, 12, 14.
    LFM2-8B-A1B: layers 24, dim 2048, ffn 7168 (2 dense layers), 32 experts top-4 of 1792.
    """
    if arch not in LFM2_ARCHS:
        raise ValueError(f"synth: lfm2 arch must be one of {', '.join(LFM2_ARCHS)}, not {arch!r}")
    attn = tuple(range(2, layers, 3)) if attn_layers is None else tuple(int(i) for i in attn_layers)
    if any(not 0 <= i < layers for i in attn) or len(set(attn)) != len(attn):
        raise ValueError(f"synth: attention layers {list(attn)} must be distinct layers of 0..{layers - 1}")
    if l_cache < 2:
        raise ValueError(f"synth: the short conv's width (--conv) must be at least 2, not {l_cache}")
    moe = arch == "lfm2moe"
    if moe and not 1 <= top_k <= experts:
        raise ValueError(f"synth: top_k {top_k} must be in 1..experts ({experts})")
    if moe and not 0 <= leading_dense <= layers:
        raise ValueError(f"synth: leading dense layers {leading_dense} must be in 0..{layers}")
    if gating not in ("sigmoid", "softmax"):
        raise ValueError(f"synth: gating must be sigmoid or softmax, not {gating!r}")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    head_dim = dim // heads
    w = Writer(path, arch, progress=progress, fit=True)
    a = w.arch
    write_header(w, vocab, layers=layers, dim=dim, ffn=ffn, heads=heads,
                 kv_heads=[kv_heads if i in attn else 0 for i in range(layers)], head_dim=head_dim, ctx=ctx,
                 rope_base=rope_base, eps=1e-5)
    w.meta(f"{a}.shortconv.l_cache", int(l_cache))
    if window:
        w.meta(f"{a}.attention.sliding_window", int(window))
    if moe:
        w.meta(f"{a}.expert_count", int(experts))
        w.meta(f"{a}.expert_used_count", int(top_k))
        w.meta(f"{a}.expert_feed_forward_length", int(expert_ffn))
        w.meta(f"{a}.leading_dense_block_count", int(leading_dense))
        w.meta(f"{a}.expert_gating_func", 2 if gating == "sigmoid" else 1)
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=head_type, wtype=wtype, tied=tied, emb_std=1.0,
             norm="token_embd_norm")
    for i in range(layers):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        w.add(p + "ffn_norm.weight", norm_weight(rng, dim))
        if i in attn:
            add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=head_dim, wtype=wtype,
                          pre_norms=False)
            # (spread wider than the other norms: RMS-normed q / k differ visibly from raw ones)
            w.add(p + "attn_q_norm.weight", rng.uniform(0.5, 2.0, head_dim).astype(np.float32))
            w.add(p + "attn_k_norm.weight", rng.uniform(0.5, 2.0, head_dim).astype(np.float32))
        else:
            w.add(p + "shortconv.in_proj.weight", gauss(rng, 3 * dim, dim), wtype)
            w.add(p + "shortconv.conv.weight", gauss(rng, dim, l_cache, scale=0.5))
            w.add(p + "shortconv.out_proj.weight", gauss(rng, dim, dim), wtype)
        if moe and i >= leading_dense:
            w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
            w.add(p + "ffn_gate_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
            w.add(p + "ffn_up_exps.weight", gauss(rng, experts, expert_ffn, dim), expert_type)
            w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, expert_ffn), expert_type)
            w.add(p + "exp_probs_b.bias", (0.1 * rng.standard_normal(experts)).astype(np.float32))
        else:
            add_glu(w, rng, p, width=ffn, dim=dim, wtype=wtype)
    w.close()
    return str(path)


# Published LFM2 shapes (each model's config.json; `lowbit synth lfm2 OUT --shape NAME --layers 8`:
# a slice). The vocabulary stays SmolLM2's 49152 (LFM2's is 65536).
LFM2_SHAPES = {
    "lfm2-1.2b": dict(arch="lfm2", layers=16, dim=2048, ffn=8192, heads=32, kv_heads=8,
                      attn_layers="2,5,8,10,12,14", ctx=128000),
    "lfm2-2.6b": dict(arch="lfm2", layers=30, dim=2048, ffn=10752, heads=32, kv_heads=8,
                      attn_layers="2,6,10,14,18,22,26,29", ctx=128000),
    "lfm2-8b-a1b": dict(arch="lfm2moe", layers=24, dim=2048, ffn=7168, heads=32, kv_heads=8,
                        attn_layers="2,6,10,14,18,21", experts=32, top_k=4, expert_ffn=1792, leading_dense=2,
                        ctx=128000),
}


def _add_lfm2(ss) -> None:
    p = ss.add_parser("lfm2", help="an LFM2 model (lfm2, lfm2moe): short-conv and attention layers",
                      description="Write an LFM2 model (llama.cpp's lfm2 / lfm2moe) with random weights and "
                                  "SmolLM2's vocabulary.")
    _shape_options(p, layers=4, dim=256, ffn=512, heads=4, kv_heads=2)
    p.add_argument("--arch", default="lfm2", choices=list(LFM2_ARCHS))
    p.add_argument("--shape", default=None, choices=list(LFM2_SHAPES),
                   help="a published model's sizes (and arch) for every option not given "
                        "(e.g. --shape lfm2-8b-a1b --layers 8: an 8-layer slice)")
    p.add_argument("--attn-layers", default=None,
                   help="comma-separated attention layers (default: every third from layer 2); the rest short conv")
    p.add_argument("--conv", type=int, default=3, help="the short conv's kernel width, shortconv.l_cache (3)")
    p.add_argument("--rope-base", type=float, default=1000000.0, help="rope base (1e6)")
    p.add_argument("--window", type=int, default=0, help="attention.sliding_window of every attention layer (0: none)")
    p.add_argument("--experts", type=int, default=8, help="lfm2moe: experts per layer (8)")
    p.add_argument("--top-k", type=int, default=2, help="lfm2moe: experts used per token (2)")
    p.add_argument("--expert-ffn", type=int, default=256, help="lfm2moe: expert FFN width (256)")
    p.add_argument("--leading-dense", type=int, default=1, help="lfm2moe: leading dense layers (1)")
    p.add_argument("--gating", default="sigmoid", choices=["sigmoid", "softmax"], help="lfm2moe: routing (sigmoid)")
    _format_options(p, "lfm2moe: ", " (as LFM2's files)")

    def synth(a: argparse.Namespace) -> str:
        attn = _attn_layer_list(a)
        return synth_lfm2(a.out, arch=a.arch, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads,
                          kv_heads=a.kv_heads, attn_layers=attn, l_cache=a.conv, experts=a.experts, top_k=a.top_k,
                          expert_ffn=a.expert_ffn, leading_dense=a.leading_dense, gating=a.gating, ctx=a.ctx,
                          rope_base=a.rope_base, window=a.window, wtype=a.wtype, expert_type=a.expert_type,
                          router_type=a.router_type, embd_type=a.embd_type, head_type=a.head_type, tied=a.tied,
                          seed=a.seed, progress=_bar_on())
    p.set_defaults(synth=synth)
    _with_shapes(p, LFM2_SHAPES)


def add_mamba2(w: Writer, rng: np.random.Generator, p: str, *, dim: int, inner: int, groups: int, state: int,
               heads: int, conv: int, conv_bias: bool, wtype: str, norm: bool = True) -> None:
    """A Mamba-2 mixer's tensors as llama.cpp's converter writes them (the small vectors F32):
    ssm_in [2 inner + 2 G N + H, dim] (z, x, B, C, dt), ssm_conv1d [inner + 2 G N, conv] and its bias,
    ssm_dt.bias [H] (softplus of it in [1e-3, 1e-1], Mamba-2's initialisation), ssm_a [H, 1]
    (-exp(A_log), A_log = log U(1, 16)), ssm_d [H, 1], ssm_norm [G, inner / G] (norm), ssm_out [dim, inner]."""
    G, N, H = groups, state, heads
    cd = inner + 2 * G * N
    w.add(p + "ssm_in.weight", gauss(rng, 2 * inner + 2 * G * N + H, dim), wtype)
    w.add(p + "ssm_conv1d.weight", gauss(rng, cd, conv, scale=0.5))
    if conv_bias:
        w.add(p + "ssm_conv1d.bias", (0.5 * rng.standard_normal(cd)).astype(np.float32))
    w.add(p + "ssm_dt.bias", np.log(np.expm1(rng.uniform(1e-3, 1e-1, H))).astype(np.float32))
    w.add(p + "ssm_a", (-rng.uniform(1.0, 16.0, (H, 1))).astype(np.float32))
    w.add(p + "ssm_d", rng.uniform(0.5, 1.5, (H, 1)).astype(np.float32))
    if norm:  # (spread wider than the other norms: the grouped norm's weights are seen)
        w.add(p + "ssm_norm.weight", rng.uniform(0.5, 2.0, (G, inner // G)).astype(np.float32))
    w.add(p + "ssm_out.weight", gauss(rng, dim, inner), wtype)


def synth_granite_hybrid(path, *, layers: int = 4, dim: int = 256, ffn: int = 512, heads: int = 4,
                         kv_heads: int = 2, attn_layers=None, ssm_conv: int = 4, ssm_state: int = 32,
                         ssm_groups: int = 1, ssm_heads: int = 8, conv_bias: bool = True, rope: bool = False,
                         experts: int = 0, top_k: int = 2, shared_ffn: int = 0, ctx: int = 1024,
                         rope_base: float = 10000.0, wtype: str = "Q8_0", expert_type: str = "Q4_K",
                         router_type: str = "F32", embd_type: str = "F32", head_type: str | None = None,
                         tied: bool = False, seed: int = 0, vocab: dict | None = None, progress: bool = False) -> str:
    """A Granite 4.0-H model (llama.cpp's granitehybrid) with random weights, as llama.cpp's
    converter lays it out. Layers in attn_layers (default: layer 1, then every fourth) are attention
    (attn_q / attn_k / attn_v / attn_output; NoPE unless rope, as Granite 4.0-H: rope.scaling.finetuned
    false), the others Mamba-2 mixers with d_inner = 2 dim (llama.cpp's only expansion), H = ssm_heads
    heads of 2 dim / H channels, G = ssm_groups, N = ssm_state: ssm_in [2 d_inner + 2 G N + H, dim]
    (z, x, B, C, dt), ssm_conv1d [d_inner + 2 G N, ssm_conv] and its bias (conv_bias), ssm_dt.bias [H],
    ssm_a [H, 1] (-exp(A_log)), ssm_d [H, 1], ssm_norm [G, d_inner / G], ssm_out [dim, d_inner] (the small
    vectors F32); head_count_kv is one count per layer, 0 for a Mamba-2 layer. Every layer has attn_norm
    and ffn_norm and a SwiGLU FFN of width ffn, or (experts > 0) experts of width ffn routed by softmax,
    top-K renormalised, plus an ungated shared expert of shared_ffn (0: none). Granite's multipliers as
    synth_dense's granite (GRANITE_SCALES, attention.scale 1 / head_dim)."""
    attn = tuple(range(1, layers, 4)) if attn_layers is None else tuple(int(i) for i in attn_layers)
    if any(not 0 <= i < layers for i in attn) or len(set(attn)) != len(attn):
        raise ValueError(f"synth: attention layers {list(attn)} must be distinct layers of 0..{layers - 1}")
    inner = 2 * dim
    if ssm_heads < 1 or ssm_groups < 1 or inner % ssm_heads or ssm_heads % ssm_groups or ssm_state < 1 or ssm_conv < 1:
        raise ValueError(f"synth: d_inner (2 x dim = {inner}) must split into --ssm-heads ({ssm_heads}), a multiple of "
                         f"--ssm-groups ({ssm_groups}); --ssm-state and --ssm-conv must be positive")
    if experts and not 1 <= top_k <= experts:
        raise ValueError(f"synth: top_k {top_k} must be in 1..experts ({experts})")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    head_dim = dim // heads
    G, N, H = ssm_groups, ssm_state, ssm_heads
    w = Writer(path, "granitehybrid", progress=progress, fit=True)
    a = w.arch
    write_header(w, vocab, layers=layers, dim=dim, ffn=ffn, heads=heads,
                 kv_heads=[kv_heads if i in attn else 0 for i in range(layers)], head_dim=head_dim, ctx=ctx,
                 rope_base=rope_base, eps=1e-5)
    for k, v in (("conv_kernel", ssm_conv), ("state_size", N), ("group_count", G), ("inner_size", inner),
                 ("time_step_rank", H)):
        w.meta(f"{a}.ssm.{k}", int(v))
    w.meta(f"{a}.rope.scaling.finetuned", bool(rope))
    emb_std, head_std = granite_scales(w, head_dim, dim)
    if experts:
        w.meta(f"{a}.expert_count", int(experts))
        w.meta(f"{a}.expert_used_count", int(top_k))
        if shared_ffn:
            w.meta(f"{a}.expert_shared_feed_forward_length", int(shared_ffn))
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=head_type, wtype=wtype, tied=tied, emb_std=emb_std,
             head_std=head_std)
    for i in range(layers):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        w.add(p + "ffn_norm.weight", norm_weight(rng, dim))
        if i in attn:
            # (q and k times head_dim^(3/8): with granite's attention.scale 1 / head_dim the scores spread
            # a little wider than 1 / sqrt(head_dim) would spread them, so that rope and the attention are seen)
            add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=head_dim, wtype=wtype,
                          pre_norms=False, qk_gain=float(head_dim) ** 0.375)
        else:
            add_mamba2(w, rng, p, dim=dim, inner=inner, groups=G, state=N, heads=H, conv=ssm_conv,
                       conv_bias=conv_bias, wtype=wtype)
        if experts:
            w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
            w.add(p + "ffn_gate_exps.weight", gauss(rng, experts, ffn, dim), expert_type)
            w.add(p + "ffn_up_exps.weight", gauss(rng, experts, ffn, dim), expert_type)
            w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, ffn), expert_type)
            if shared_ffn:
                add_glu(w, rng, p, width=shared_ffn, dim=dim, wtype=wtype, suffix="_shexp")
        else:
            add_glu(w, rng, p, width=ffn, dim=dim, wtype=wtype)
    w.close()
    return str(path)


# Published Granite 4.0-H shapes (each model's config.json as recalled: the attention layer lists
# could not be checked offline; `lowbit synth granitehybrid OUT --shape NAME --layers 8`: a slice).
# The vocabulary stays SmolLM2's 49152 (Granite 4.0's is 100352).
GRANITE_HYBRID_SHAPES = {
    "granite-4.0-h-tiny": dict(layers=40, dim=1536, ffn=512, heads=12, kv_heads=4, attn_layers="5,15,25,35",
                               ssm_state=128, ssm_groups=1, ssm_heads=48, experts=64, top_k=6, shared_ffn=1024,
                               ctx=131072),
    "granite-4.0-h-small": dict(layers=40, dim=4096, ffn=768, heads=32, kv_heads=8, attn_layers="5,15,25,35",
                                ssm_state=128, ssm_groups=1, ssm_heads=128, experts=72, top_k=10, shared_ffn=8192,
                                ctx=131072),
}


def _add_granite_hybrid(ss) -> None:
    p = ss.add_parser("granitehybrid", help="a Granite 4.0-H model (granitehybrid): Mamba-2 and attention layers",
                      description="Write a Granite 4.0-H model (llama.cpp's granitehybrid) with random weights and "
                                  "SmolLM2's vocabulary.")
    _shape_options(p, layers=4, dim=256, ffn=512, heads=4, kv_heads=2)
    p.add_argument("--arch", default="granitehybrid", choices=["granitehybrid"])
    _shape_option(p, GRANITE_HYBRID_SHAPES, "granite-4.0-h-tiny")
    p.add_argument("--attn-layers", default=None,
                   help="comma-separated attention layers (default: layer 1, then every fourth); the rest Mamba-2")
    p.add_argument("--ssm-conv", type=int, default=4, help="the conv's kernel width (4)")
    p.add_argument("--ssm-state", type=int, default=32, help="the state size N per channel (32)")
    p.add_argument("--ssm-groups", type=int, default=1, help="B / C groups (1)")
    p.add_argument("--ssm-heads", type=int, default=8, help="SSM heads; d_inner = 2 x dim splits into them (8)")
    p.add_argument("--no-conv-bias", dest="conv_bias", action="store_false", help="no ssm_conv1d.bias")
    p.add_argument("--rope", action="store_true", help="rotate the attention layers (Granite 4.0-H's are NoPE)")
    p.add_argument("--experts", type=int, default=0, help="experts per layer (0: a dense SwiGLU FFN)")
    p.add_argument("--top-k", type=int, default=2, help="experts used per token (2)")
    p.add_argument("--shared-ffn", type=int, default=0, help="the shared expert's width (0: none)")
    _format_options(p)

    def synth(a: argparse.Namespace) -> str:
        attn = _attn_layer_list(a)
        return synth_granite_hybrid(a.out, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads,
                                    attn_layers=attn, ssm_conv=a.ssm_conv, ssm_state=a.ssm_state,
                                    ssm_groups=a.ssm_groups, ssm_heads=a.ssm_heads, conv_bias=a.conv_bias,
                                    rope=a.rope, experts=a.experts, top_k=a.top_k, shared_ffn=a.shared_ffn,
                                    ctx=a.ctx, wtype=a.wtype, expert_type=a.expert_type, router_type=a.router_type,
                                    embd_type=a.embd_type, head_type=a.head_type, tied=a.tied, seed=a.seed,
                                    progress=_bar_on())
    p.set_defaults(synth=synth)
    for shape in GRANITE_HYBRID_SHAPES.values():
        shape.setdefault("arch", "granitehybrid")
    _with_shapes(p, GRANITE_HYBRID_SHAPES)


def synth_nemotron_h(path, *, pattern: str = "M-*M-", dim: int = 256, ffn: int = 512, heads: int = 4,
                     kv_heads: int = 2, head_dim: int | None = None, ssm_conv: int = 4, ssm_state: int = 32,
                     ssm_groups: int = 2, ssm_heads: int = 8, ssm_head_dim: int | None = None, experts: int = 8,
                     top_k: int = 2, shared_ffn: int = 256, expert_norm: bool = True, expert_scale: float = 2.5,
                     ctx: int = 1024, wtype: str = "Q8_0", expert_type: str = "Q4_K", router_type: str = "F32",
                     embd_type: str = "F32", head_type: str | None = None, tied: bool = False,
                     seed: int = 0, vocab: dict | None = None, progress: bool = False, arch: str | None = None) -> str:
    """A Nemotron-H model (llama.cpp's nemotron_h) with random weights, as llama.cpp's converter lays it
    out. pattern (Nemotron-H's hybrid_override_pattern): one character per layer, "M" a Mamba-2 mixer
    (d_inner = ssm_heads x ssm_head_dim, default 2 dim / ssm_heads; add_mamba2), "*" attention (attn_q /
    attn_k / attn_v / attn_output, no rope), "-" an ungated MLP (ffn_up [ffn, dim], ffn_down, relu^2);
    every layer one block after its attn_norm. head_count_kv and feed_forward_length are one count per
    layer (0 where the layer is not attention / not an MLP). A pattern with "E" (a routed-experts layer)
    writes nemotron_h_moe (and no "-"): experts of width ffn (ffn_up_exps, ffn_down_exps: ungated
    relu^2) chosen by sigmoid with the exp_probs_b selection bias (top_k of experts), renormalised if
    expert_norm, times expert_scale, plus an ungated shared expert of shared_ffn. arch "mamba2" (a
    pattern of M only): llama.cpp's mamba2, Mamba-2 alone (attention.head_count and
    feed_forward_length 0, as its converter writes them)."""
    if arch == "mamba2" and set(pattern) != {"M"}:
        raise ValueError(f"synth: --arch mamba2 has Mamba-2 layers only (--pattern of M), not {pattern!r}")
    if not pattern or set(pattern) - set("M*-E") or ("E" in pattern and "-" in pattern):
        raise ValueError(f"synth: --pattern {pattern!r} must be a string of M (Mamba-2), * (attention), - (MLP) "
                         "or E (experts; not with -)")
    moe = "E" in pattern
    if moe and not 1 <= top_k <= experts:
        raise ValueError(f"synth: top_k {top_k} must be in 1..experts ({experts})")
    layers = len(pattern)
    head_dim = head_dim or dim // heads
    hd = ssm_head_dim or 2 * dim // ssm_heads
    inner = ssm_heads * hd
    if ssm_heads % ssm_groups or ssm_state < 1 or ssm_conv < 1 or hd < 1:
        raise ValueError(f"synth: --ssm-heads ({ssm_heads}) must be a multiple of --ssm-groups ({ssm_groups}); "
                         "--ssm-state, --ssm-conv and the head width must be positive")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, arch or ("nemotron_h_moe" if moe else "nemotron_h"), progress=progress, fit=True)
    a = w.arch
    if a == "mamba2":
        write_header(w, vocab, layers=layers, dim=dim, ffn=0, heads=0, kv_heads=0, head_dim=0, ctx=ctx, eps=1e-5)
    else:
        write_header(w, vocab, layers=layers, dim=dim, ffn=[ffn if c in "-E" else 0 for c in pattern], heads=heads,
                     kv_heads=[kv_heads if c == "*" else 0 for c in pattern], head_dim=head_dim, ctx=ctx, eps=1e-5)
    for k, v in (("conv_kernel", ssm_conv), ("state_size", ssm_state), ("group_count", ssm_groups),
                 ("inner_size", inner), ("time_step_rank", ssm_heads)):
        w.meta(f"{a}.ssm.{k}", int(v))
    w.meta(f"{a}.attention.layer_norm_epsilon", 1e-5)  # (llama.cpp requires it; the RMS one wins)
    if moe:
        for k, v in (("expert_count", experts), ("expert_used_count", top_k), ("expert_feed_forward_length", ffn),
                     ("expert_shared_feed_forward_length", shared_ffn)):
            w.meta(f"{a}.{k}", int(v))
        w.meta(f"{a}.expert_weights_norm", bool(expert_norm))
        w.meta(f"{a}.expert_weights_scale", float(expert_scale))
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=head_type, wtype=wtype, tied=tied, emb_std=1.0)
    for i, kind in enumerate(pattern):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        if kind == "M":
            add_mamba2(w, rng, p, dim=dim, inner=inner, groups=ssm_groups, state=ssm_state, heads=ssm_heads,
                       conv=ssm_conv, conv_bias=True, wtype=wtype)
        elif kind == "*":
            add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=head_dim, wtype=wtype,
                          pre_norms=False)
        elif kind == "E":
            w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim), router_type)
            w.add(p + "exp_probs_b.bias", (0.1 * rng.standard_normal(experts)).astype(np.float32))
            w.add(p + "ffn_up_exps.weight", gauss(rng, experts, ffn, dim), expert_type)
            w.add(p + "ffn_down_exps.weight", gauss(rng, experts, dim, ffn), expert_type)
            w.add(p + "ffn_up_shexp.weight", gauss(rng, shared_ffn, dim), wtype)
            w.add(p + "ffn_down_shexp.weight", gauss(rng, dim, shared_ffn), wtype)
        else:
            w.add(p + "ffn_up.weight", gauss(rng, ffn, dim), wtype)
            w.add(p + "ffn_down.weight", gauss(rng, dim, ffn), wtype)
    w.close()
    return str(path)


# Published Nemotron-H shapes (config.json as recalled, the layer pattern included: not checked
# offline; `lowbit synth nemotron_h OUT --shape NAME --layers 8`: the pattern's first 8 layers).
# The vocabulary stays SmolLM2's 49152 (Nemotron's is 131072).
NEMOTRON_H_SHAPES = {
    "nemotron-nano-9b-v2": dict(pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", dim=4480,
                                ffn=15680, heads=40, kv_heads=8, head_dim=128, ssm_state=128, ssm_groups=8,
                                ssm_heads=128, ssm_head_dim=80, ctx=131072),
    # Nemotron 3 Nano 30B-A3B (nemotron_h_moe): 23 Mamba-2, 23 MoE and 6 attention layers as published;
    # the order below is approximate
    "nemotron-3-nano-30b-a3b": dict(pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", dim=2688,
                                    ffn=1856, heads=32, kv_heads=2, head_dim=128, ssm_state=128, ssm_groups=8,
                                    ssm_heads=64, ssm_head_dim=64, experts=128, top_k=6, shared_ffn=3712,
                                    ctx=262144, arch="nemotron_h_moe"),
}


def _add_nemotron_h(ss) -> None:
    p = ss.add_parser("nemotron_h", help="a Nemotron-H model (nemotron_h, nemotron_h_moe): Mamba-2, attention and "
                                         "MLP or expert layers",
                      description="Write a Nemotron-H model (llama.cpp's nemotron_h) with random weights and "
                                  "SmolLM2's vocabulary.")
    p.add_argument("out", help="the GGUF file to write")
    p.add_argument("--arch", default=None, choices=["nemotron_h", "nemotron_h_moe", "mamba2"],
                   help="the pattern decides (E layers: nemotron_h_moe); given, it must agree; mamba2: Mamba-2 "
                        "alone (a pattern of M only)")
    p.add_argument("--shape", default=None, choices=list(NEMOTRON_H_SHAPES),
                   help="a published model's sizes for every option not given (e.g. --shape nemotron-nano-9b-v2 "
                        "--layers 8: the first 8 layers of its pattern)")
    p.add_argument("--pattern", default="M-*M-",
                   help="one character per layer: M Mamba-2, * attention, - MLP, E routed experts (M-*M-)")
    p.add_argument("--layers", type=int, default=None, help="the first N layers of --pattern (default: all)")
    p.add_argument("--dim", type=int, default=256, help="model width")
    p.add_argument("--ffn", type=int, default=512, help="the MLP layers' width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=None, help="attention head width (default dim / heads)")
    p.add_argument("--ssm-conv", type=int, default=4, help="the conv's kernel width (4)")
    p.add_argument("--ssm-state", type=int, default=32, help="the state size N per channel (32)")
    p.add_argument("--ssm-groups", type=int, default=2, help="B / C groups (2)")
    p.add_argument("--ssm-heads", type=int, default=8, help="SSM heads (8)")
    p.add_argument("--ssm-head-dim", type=int, default=None, help="channels per SSM head (default 2 dim / heads)")
    p.add_argument("--experts", type=int, default=8, help="E layers: experts per layer (8)")
    p.add_argument("--top-k", type=int, default=2, help="E layers: experts used per token (2)")
    p.add_argument("--shared-ffn", type=int, default=256, help="E layers: the shared expert's width (256)")
    p.add_argument("--no-expert-norm", dest="expert_norm", action="store_false",
                   help="E layers: the top-K weights not renormalised")
    p.add_argument("--expert-scale", type=float, default=2.5, help="E layers: expert_weights_scale (2.5)")
    p.add_argument("--ctx", type=int, default=1024, help="context length written to the file")
    p.add_argument("--seed", type=int, default=0)
    _format_options(p, "E layers: ")

    def synth(a: argparse.Namespace) -> str:
        pattern = a.pattern[:a.layers] if a.layers else a.pattern
        if a.arch in ("nemotron_h", "nemotron_h_moe") and (a.arch == "nemotron_h_moe") != ("E" in pattern):
            raise ValueError(f"--arch {a.arch} does not match --pattern {pattern!r} (E layers make nemotron_h_moe)")
        return synth_nemotron_h(a.out, pattern=pattern, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads,
                                head_dim=a.head_dim, ssm_conv=a.ssm_conv, ssm_state=a.ssm_state,
                                ssm_groups=a.ssm_groups, ssm_heads=a.ssm_heads, ssm_head_dim=a.ssm_head_dim,
                                experts=a.experts, top_k=a.top_k, shared_ffn=a.shared_ffn, expert_norm=a.expert_norm,
                                expert_scale=a.expert_scale, ctx=a.ctx, wtype=a.wtype, expert_type=a.expert_type,
                                router_type=a.router_type, embd_type=a.embd_type, head_type=a.head_type, tied=a.tied,
                                seed=a.seed, progress=_bar_on(), arch=a.arch)
    p.set_defaults(synth=synth)
    for shape in NEMOTRON_H_SHAPES.values():
        shape.setdefault("arch", "nemotron_h")
    _with_shapes(p, NEMOTRON_H_SHAPES)


def _shape_options(p: argparse.ArgumentParser, layers: int, dim: int, ffn: int, heads: int, kv_heads: int) -> None:
    p.add_argument("out", help="the GGUF file to write")
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--dim", type=int, default=dim, help="model width")
    p.add_argument("--ffn", type=int, default=ffn, help="FFN width")
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--kv-heads", type=int, default=kv_heads)
    p.add_argument("--ctx", type=int, default=1024, help="context length written to the file")
    p.add_argument("--seed", type=int, default=0)


def _add_dense(ss) -> None:
    p = ss.add_parser("dense", help="a dense llama / qwen2 / qwen3 / qwen3vl / glm4 / gemma3 / gemma2 / phi3 / smollm3 / mistral3 / granite / olmo2 / exaone4 / ernie4_5 / command-r / cohere2 / starcoder2 / phi2 model",
                      description="Write a dense model with random weights and SmolLM2's vocabulary.")
    _shape_options(p, layers=2, dim=256, ffn=512, heads=4, kv_heads=2)
    p.add_argument("--arch", default="llama", choices=list(DENSE_ARCHS) + ["qwen35"],
                   help="qwen35: hybrid gated delta-net / gated attention layers (see the --ssm-* options)")
    p.add_argument("--head-dim", type=int, default=None, help="per-head width (default: dim / heads)")
    p.add_argument("--window", type=int, default=512,
                   help="gemma3 / gemma2 / olmo2 / cohere2: sliding window of the local layers (0: none; olmo2 0: OLMo 2); "
                        "phi3: the key llama.cpp ignores")
    p.add_argument("--orig-ctx", type=int, default=0,
                   help="phi3: LongRoPE's original context (factors long / short, attn_factor; 0: none); "
                        "mistral3: YaRN's original context and the attention temperature's floor")
    p.add_argument("--yarn-factor", type=float, default=0.0, help="mistral3, olmo2: YaRN rope factor (0: none; needs --orig-ctx)")
    p.add_argument("--temp-scale", type=float, default=0.0,
                   help="mistral3: attention.temperature_scale (Ministral 3: 0.1; 0: none; needs --orig-ctx)")
    p.add_argument("--rope-dims", type=int, default=None,
                   help="rotated dims per attention head (default: all of it; hybrid: 32)")
    p.add_argument("--nextn", type=int, default=0, help="glm4: MTP blocks after the trunk (0; llama.cpp loads, never runs them)")
    p.add_argument("--swa-pattern", type=int, default=None,
                   help="gemma3: period of the local/global pattern (default: no key, llama.cpp's 6)")
    p.add_argument("--rope-base", type=float, default=10000.0, help="rope base (gemma3: of the global layers)")
    p.add_argument("--rope-base-swa", type=float, default=None,
                   help="gemma3: rope base of the local layers (default: no key, llama.cpp's 10000)")
    p.add_argument("--softcap", type=float, default=0.0,
                   help="gemma3: final_logit_softcapping (0: none); gemma2: the same (0: Gemma 2's 30)")
    p.add_argument("--attn-softcap", type=float, default=50.0,
                   help="gemma2: attn_logit_softcapping, every attention score capped (Gemma 2's 50)")
    p.add_argument("--rope-linear", type=float, default=0.0,
                   help="linear rope scaling factor (0: none; gemma3 4B-27B: 8, global layers only)")
    _hybrid_options(p, DENSE_SHAPES)
    p.add_argument("--type", dest="wtype", default="Q8_0", help="format of the layer matrices (default Q8_0)")
    p.add_argument("--embd-type", default="F32", help="format of token_embd (default F32)")
    p.add_argument("--head-type", default=None, help="format of output.weight (default: --type)")
    p.add_argument("--tied", action="store_true", help="no output.weight: token_embd is the head")
    p.set_defaults(synth=lambda a: _synth_hybrid_cli(a) if a.arch in HYBRID_ARCHS else synth_dense(
        a.out, arch=a.arch, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads,
        ctx=a.ctx, wtype=a.wtype, embd_type=a.embd_type, head_type=a.head_type, tied=a.tied, seed=a.seed,
        head_dim=a.head_dim, window=a.window, swa_pattern=a.swa_pattern, rope_base=a.rope_base,
        rope_base_swa=a.rope_base_swa, softcap=a.softcap, rope_linear=a.rope_linear, orig_ctx=a.orig_ctx,
        rope_dims=a.rope_dims, yarn_factor=a.yarn_factor, temp_scale=a.temp_scale, nextn=a.nextn,
        attn_softcap=a.attn_softcap, progress=_bar_on()))
    _with_shapes(p, DENSE_SHAPES)


BITNET_ARCHS = ("bitnet", "bitnet-b1.58")
TERNARY_DENSITY = 2.0 / 3.0  # fraction of nonzero codes (absmean ternarisation of Gaussians gives ~0.69)
BITNET_FILE_TYPE = {"I2_S": 40, "TQ1_0": 36, "TQ2_0": 37}  # bitnet.cpp's MOSTLY_I2_S; llama.cpp's MOSTLY_TQ*


def ternary(rng: np.random.Generator, rows: int, n: int) -> tuple[np.ndarray, float]:
    """Random ternary codes int8[rows, n] in {-1, 0, 1} and a per-tensor scale.

    The scale is ~1/sqrt(nonzeros per row) (unit-variance outputs for unit inputs), rounded to
    a value that fp16 and fp32 both hold exactly: TQ1_0/TQ2_0 store it as every block's fp16
    d (= max |W| of the block), I2_S as its fp32 tensor scale, so every ternary format holds
    exactly the matrix codes * scale.
    """
    p = TERNARY_DENSITY
    codes = rng.choice(np.array([-1, 0, 1], np.int8), size=(rows, n), p=[p / 2, 1 - p, p / 2])
    scale = float(np.float16(1.0 / np.sqrt(p * n)))
    return codes, scale


def add_ternary(w: Writer, name: str, codes: np.ndarray, scale: float, fmt: str) -> None:
    """Store codes * scale as format fmt through the writer's quantizer: exact for I2_S (an
    already ternary tensor keeps its codes and scale), TQ1_0 / TQ2_0 (scale fp16-exact) and F32."""
    w.add(name, codes.astype(np.float32) * np.float32(scale), fmt)


def synth_bitnet(path, *, arch: str = "bitnet-b1.58", layers: int = 30, dim: int = 2560, ffn: int = 6912,
                 heads: int = 20, kv_heads: int = 5, ctx: int = 4096, wtype: str = "I2_S", embd_type: str = "F16",
                 head_type: str | None = None, scale_tensors: bool = False, rope_base: float = 500000.0,
                 eps: float = 1e-5, seed: int = 0, progress: bool = False) -> str:
    """A BitNet b1.58 model with random ternary weights (shapes of BitNet b1.58 2B-4T by default).

    arch "bitnet" (llama.cpp's: SiLU gate) or "bitnet-b1.58" (bitnet.cpp's: squared-ReLU gate);
    both have attn_sub_norm / ffn_sub_norm and the head tied to token_embd. The metadata keys,
    tensor names and I2_S layout are those bitnet.cpp's converter writes (general.file_type 40
    for I2_S: LLAMA_FTYPE_MOSTLY_I2_S). wtype: the layer matrices (I2_S, TQ1_0, TQ2_0; any other
    format quantizes codes * scale); embd_type: token_embd (the head too unless head_type is
    given, which writes an untied output.weight: llama.cpp's bitnet cannot load that file).
    scale_tensors: store the ternary codes with scale 1 and the per-tensor scale as a separate
    F32 `blk.N.<matrix>.scale` tensor of one value (llama.cpp's optional bitnet scales).
    The vocabulary is the default model's (49152 tokens), not Llama 3's 128256.
    """
    if arch not in BITNET_ARCHS:
        raise ValueError(f"synth bitnet: arch must be one of {', '.join(BITNET_ARCHS)}, not {arch!r}")
    if dim % heads or heads % kv_heads:
        raise ValueError(f"synth bitnet: width {dim} / {heads} heads / {kv_heads} KV heads do not divide")
    hd = dim // heads
    rng = np.random.default_rng(seed)
    vocab = default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, arch, progress=progress, fit=True)
    a = arch
    # bitnet.cpp's keys: no attention.key_length / value_length (head_dim = width / heads)
    for key, val in [("vocab_size", nv), ("context_length", ctx), ("embedding_length", dim),
                     ("block_count", layers), ("feed_forward_length", ffn), ("rope.dimension_count", hd),
                     ("attention.head_count", heads), ("attention.head_count_kv", kv_heads)]:
        w.meta(f"{a}.{key}", [int(v) for v in val] if isinstance(val, (list, tuple)) else int(val))
    w.meta(f"{a}.rope.freq_base", float(rope_base))
    w.meta(f"{a}.attention.layer_norm_rms_epsilon", float(eps))
    w.meta("general.name", f"lowbit synthetic {a}")
    w.meta("general.file_type", BITNET_FILE_TYPE.get(wtype.upper(), 0))
    w.meta("general.quantization_version", 2)
    w.copy_metadata(vocab, prefix=VOCAB_PREFIX)

    # std 4/sqrt(width): the tied head's logits have std ~4 at any width (about a real model's),
    # so top-2 margins are often small and a parity test can see rounding
    w.add("token_embd.weight", gauss(rng, nv, dim, scale=4.0 / np.sqrt(dim)), embd_type)
    if head_type is not None:
        w.add("output.weight", gauss(rng, nv, dim, scale=4.0 / np.sqrt(dim)), head_type)
    for i in range(layers):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        for name, rows, n in (("attn_q", dim, dim), ("attn_k", kv_heads * hd, dim), ("attn_v", kv_heads * hd, dim),
                              ("attn_output", dim, dim)):
            codes, sc = ternary(rng, rows, n)
            add_ternary(w, p + name + ".weight", codes, 1.0 if scale_tensors else sc, wtype)
            if scale_tensors:
                w.add(p + name + ".scale", np.array([sc], np.float32))
        w.add(p + "attn_sub_norm.weight", norm_weight(rng, dim))
        w.add(p + "ffn_norm.weight", norm_weight(rng, dim))
        for name, rows, n in (("ffn_gate", ffn, dim), ("ffn_up", ffn, dim), ("ffn_down", dim, ffn)):
            codes, sc = ternary(rng, rows, n)
            add_ternary(w, p + name + ".weight", codes, 1.0 if scale_tensors else sc, wtype)
            if scale_tensors:
                w.add(p + name + ".scale", np.array([sc], np.float32))
        w.add(p + "ffn_sub_norm.weight", norm_weight(rng, ffn))
    w.add("output_norm.weight", norm_weight(rng, dim))
    w.close()
    return str(path)


def _add_bitnet(ss) -> None:
    p = ss.add_parser("bitnet", help="a BitNet b1.58 model (random ternary weights; 2B-4T shapes by default)",
                      description="Write a bitnet (llama.cpp) or bitnet-b1.58 (bitnet.cpp) model with random "
                                  "ternary weights, bitnet.cpp's metadata and tensor names, and SmolLM2's "
                                  "vocabulary. Defaults: the shapes of BitNet b1.58 2B-4T.")
    _shape_options(p, layers=30, dim=2560, ffn=6912, heads=20, kv_heads=5)
    p.set_defaults(ctx=4096)
    p.add_argument("--arch", default="bitnet-b1.58", choices=list(BITNET_ARCHS),
                   help="bitnet: llama.cpp's (SiLU gate); bitnet-b1.58: bitnet.cpp's (squared-ReLU gate)")
    p.add_argument("--type", dest="wtype", default="I2_S", help="layer matrices: I2_S (default), TQ1_0, TQ2_0")
    p.add_argument("--embd-type", default="F16", help="token_embd, also the head when tied (default F16)")
    p.add_argument("--head-type", default=None,
                   help="write an untied output.weight in this format (default: tied to token_embd)")
    p.add_argument("--scale-tensors", action="store_true",
                   help="per-matrix scales as separate blk.N.<matrix>.scale tensors (llama.cpp's bitnet)")
    p.set_defaults(synth=lambda a: synth_bitnet(
        a.out, arch=a.arch, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads, ctx=a.ctx,
        wtype=a.wtype, embd_type=a.embd_type, head_type=a.head_type, scale_tensors=a.scale_tensors, seed=a.seed,
        progress=_bar_on()))


def _add_moe(ss) -> None:
    p = ss.add_parser("moe", help="a Mixture-of-Experts qwen3moe / qwen2moe / olmoe / mixtral / gpt-oss / glm4moe model",
                      description="Write a Mixture-of-Experts model with random weights and SmolLM2's vocabulary.")
    _shape_options(p, layers=2, dim=256, ffn=256, heads=4, kv_heads=2)
    p.add_argument("--arch", default="qwen3moe", choices=list(MOE_ARCHS) + ["qwen35moe", "qwen3next"],
                   help="qwen35moe / qwen3next: hybrid gated delta-net / gated attention layers, routed experts "
                        "and a gated shared expert (see the --ssm-* options)")
    _hybrid_options(p)
    p.add_argument("--experts", type=int, default=8, help="experts per layer")
    p.add_argument("--top-k", type=int, default=2, help="experts used per token")
    p.add_argument("--shared-ffn", type=int, default=512,
                   help="qwen2moe, hybrid: the shared expert's width; granitemoe: 0 for none")
    p.add_argument("--type", dest="wtype", default="Q8_0", help="attention (and shared expert) format (default Q8_0)")
    p.add_argument("--expert-type", default=None, help="gate/up experts' format (default Q4_K; gpt-oss: MXFP4)")
    p.add_argument("--down-type", default=None, help="down experts' format (default: --expert-type)")
    p.add_argument("--router-type", default="F32", help="ffn_gate_inp's format: F32, F16 or BF16")
    p.add_argument("--embd-type", default="F32", help="format of token_embd (default F32)")
    p.add_argument("--head-type", default=None, help="format of output.weight (default: --type)")
    p.add_argument("--head-dim", type=int, default=None, help="per-head width (default: dim / heads)")
    p.add_argument("--window", type=int, default=128, help="gpt-oss: sliding window of the even layers (128)")
    p.add_argument("--rope-base", type=float, default=150000.0, help="gpt-oss: rope base (150000)")
    p.add_argument("--yarn-factor", type=float, default=32.0, help="gpt-oss: YaRN scaling factor (32)")
    p.add_argument("--yarn-orig-ctx", type=int, default=4096, help="gpt-oss: YaRN's original context (4096)")
    p.add_argument("--dense-ffn", type=int, default=512, help="glm4moe: the leading dense layers' FFN width")
    p.add_argument("--leading-dense", type=int, default=1, help="glm4moe: leading dense layers (1)")
    p.add_argument("--shared-experts", type=int, default=1, help="glm4moe: shared experts (1)")
    p.add_argument("--nextn", type=int, default=1, help="glm4moe: MTP layers after the others (1; not run)")
    if not any("--rope-dims" in x.option_strings for x in p._actions):  # (the hybrid options may have it)
        p.add_argument("--rope-dims", type=int, default=None, help="glm4moe: rotated dims per head (default: half)")
    p.add_argument("--qk-norm", action="store_true", help="glm4moe: per-head q/k norms (GLM-4.5 355B)")
    p.add_argument("--expert-scale", type=float, default=2.5, help="glm4moe: expert_weights_scale (2.5)")
    p.add_argument("--gating", default=None, choices=["sigmoid", "softmax"],
                   help="expert_gating_func (glm4moe default sigmoid: GLM-4.5's; deepseek2 default softmax: V2's)")
    g = p.add_argument_group("deepseek2 (MLA; --ffn is the expert width, --dense-ffn the leading dense layers')")
    g.add_argument("--kv-lora-rank", type=int, default=64, help="kv_lora_rank: the cached latent's width (64)")
    g.add_argument("--q-lora-rank", type=int, default=0, help="q_lora_rank (0: a plain attn_q, as V2-Lite)")
    g.add_argument("--qk-nope", type=int, default=32, help="qk_nope_head_dim (32)")
    g.add_argument("--v-head-dim", type=int, default=32, help="v_head_dim (32)")
    g.add_argument("--mla-type", default=None, help="format of attn_k_b / attn_v_b (default: --type)")
    g.add_argument("--expert-norm", action="store_true", help="expert_weights_norm (renormalise the top-K)")
    g.add_argument("--probs-bias", action="store_true", help="an exp_probs_b selection bias (default with sigmoid)")
    g.add_argument("--expert-groups", type=int, default=0, help="expert_group_count (0: no group-limited routing)")
    g.add_argument("--expert-groups-used", type=int, default=0, help="expert_group_used_count")
    g.add_argument("--yarn-log-mul", type=float, default=0.0707, help="rope.scaling.yarn_log_multiplier (0.0707)")
    p.set_defaults(synth=lambda a: _synth_hybrid_cli(a) if a.arch in HYBRID_ARCHS else _synth_deepseek2_cli(a)
                   if a.arch == "deepseek2" else synth_moe(
        a.out, arch=a.arch, layers=a.layers, dim=a.dim, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
        experts=a.experts, top_k=a.top_k, expert_ffn=a.ffn, shared_ffn=a.shared_ffn, ctx=a.ctx, wtype=a.wtype,
        expert_type=a.expert_type or ("MXFP4" if a.arch == "gpt-oss" else "Q4_K"), down_type=a.down_type,
        router_type=a.router_type, embd_type=a.embd_type, head_type=a.head_type, seed=a.seed, window=a.window,
        rope_base=a.rope_base, yarn_factor=a.yarn_factor, yarn_orig_ctx=a.yarn_orig_ctx, dense_ffn=a.dense_ffn,
        leading_dense=a.leading_dense, shared_experts=a.shared_experts, nextn=a.nextn, rope_dims=a.rope_dims,
        qk_norm=a.qk_norm, expert_scale=a.expert_scale, gating=a.gating or "sigmoid", progress=_bar_on()))
    _with_shapes(p)


def _synth_deepseek2_cli(a: argparse.Namespace) -> str:
    try:
        return synth_deepseek2(
            a.out, layers=a.layers, dim=a.dim, heads=a.heads, q_lora_rank=a.q_lora_rank,
            kv_lora_rank=a.kv_lora_rank, qk_nope=a.qk_nope, rope_dims=a.rope_dims or 16, v_head_dim=a.v_head_dim,
            experts=a.experts, top_k=a.top_k, expert_ffn=a.ffn, dense_ffn=a.dense_ffn, leading_dense=a.leading_dense,
            shared_experts=a.shared_experts, expert_scale=a.expert_scale, gating=a.gating or "softmax",
            expert_norm=a.expert_norm, probs_bias=True if a.probs_bias else None, expert_groups=a.expert_groups,
            expert_groups_used=a.expert_groups_used, yarn_factor=a.yarn_factor, yarn_orig_ctx=a.yarn_orig_ctx,
            yarn_log_mul=a.yarn_log_mul, ctx=a.ctx, wtype=a.wtype, mla_type=a.mla_type,
            expert_type=a.expert_type or "Q4_K", down_type=a.down_type, router_type=a.router_type,
            embd_type=a.embd_type, head_type=a.head_type, seed=a.seed, progress=_bar_on())
    except ValueError as e:  # a bad size: a usage error (exit 2, one line)
        from .cli import UsageError
        raise UsageError(str(e)) from None


# Published shapes of the hybrid Qwens (each model's config.json): `--shape NAME` sets every size
# below that the command line leaves at its default, so `--shape qwen3.6-35b-a3b --layers 8` is
# an 8-layer slice of the real model (6 delta-net + 2 attention layers). The vocabulary stays
# SmolLM2's 49152 (the real ones have ~150-250K: the head is a smaller share of a step here).
HYBRID_SHAPES = {
    # Qwen3.6-35B-A3B / Qwen3.5-35B-A3B: 40 layers (every 4th full attention), 256 experts top-8
    # of 512 + a shared expert of 512, attention 16 q / 2 kv heads of 256 (rope on 64 dims,
    # IMROPE 11/11/10), delta-net 16 q/k heads and 32 value heads of 128, conv 4, one MTP layer.
    "qwen3.6-35b-a3b": dict(arch="qwen35moe", layers=40, dim=2048, heads=16, kv_heads=2, head_dim=256,
                            rope_dims=64, sections="11,11,10,0", interval=4, ssm_conv=4, ssm_state=128,
                            ssm_groups=16, ssm_heads=32, experts=256, top_k=8, ffn=512, shared_ffn=512,
                            mtp_layers=1, ctx=262144),
    # Qwen3-Next-80B-A3B: 48 layers, 512 experts top-10 of 512 + shared 512, the same attention
    # and delta-net widths, plain neox rope on 64 dims.
    "qwen3-next-80b-a3b": dict(arch="qwen3next", layers=48, dim=2048, heads=16, kv_heads=2, head_dim=256,
                               rope_dims=64, interval=4, ssm_conv=4, ssm_state=128, ssm_groups=16,
                               ssm_heads=32, experts=512, top_k=10, ffn=512, shared_ffn=512, mtp_layers=1,
                               ctx=262144),
}


# Published Gemma 2 shapes (config.json: 1:1 sliding windows of 4096, soft-caps 50 / 30, head 256, the
# 27B's 128 with q scaled by 1/sqrt(4608 / 32)); `lowbit synth dense OUT --shape gemma-2-9b --layers 8`.
GEMMA2_SHAPES = {
    "gemma-2-2b": dict(arch="gemma2", layers=26, dim=2304, ffn=9216, heads=8, kv_heads=4, head_dim=256, window=4096,
                       ctx=8192),
    "gemma-2-9b": dict(arch="gemma2", layers=42, dim=3584, ffn=14336, heads=16, kv_heads=8, head_dim=256,
                       window=4096, ctx=8192),
    "gemma-2-27b": dict(arch="gemma2", layers=46, dim=4608, ffn=36864, heads=32, kv_heads=16, head_dim=128,
                        window=4096, ctx=8192),
}
DENSE_SHAPES = {**HYBRID_SHAPES, **GEMMA2_SHAPES}  # synth dense's --shape (the hybrid Qwens: synth moe's, named)


class _Given(argparse._StoreAction):
    """A size option that records being given (`given` in the namespace), so --shape fills only the rest."""
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", frozenset()) | {self.dest}


def _shape_option(p: argparse.ArgumentParser, shapes: dict, example: str) -> None:
    p.add_argument("--shape", default=None, choices=list(shapes),
                   help=f"a published model's sizes for every option not given "
                        f"(e.g. --shape {example} --layers 8: an 8-layer slice)")


def _with_shapes(p: argparse.ArgumentParser, shapes: dict | None = None) -> None:
    """Lets p's --shape fill the size options (and --arch) not given from `shapes` (default
    HYBRID_SHAPES): wraps p's `synth`."""
    shapes = HYBRID_SHAPES if shapes is None else shapes
    keys = {k for shape in shapes.values() for k in shape}
    for x in p._actions:
        if x.dest in keys and type(x) is argparse._StoreAction:
            x.__class__ = _Given
    archs = next(x.choices for x in p._actions if x.dest == "arch")
    kind, synth = p.prog.split()[-1], p.get_default("synth")

    def shaped(a: argparse.Namespace) -> str:
        if a.shape:
            from .cli import UsageError
            shape, given = shapes[a.shape], getattr(a, "given", ())
            if shape["arch"] not in archs:
                raise UsageError(f"--shape {a.shape} is a {shape['arch']} model: lowbit synth moe OUT "
                                 f"--shape {a.shape} (not synth {kind}{' --arch ' + a.arch if 'arch' in given else ''})")
            if "arch" in given and a.arch != shape["arch"]:
                raise UsageError(f"--shape {a.shape} is a {shape['arch']} model: lowbit synth {kind} OUT "
                                 f"--shape {a.shape} (not --arch {a.arch})")
            for k, v in shape.items():
                if k not in given:
                    setattr(a, k, v)
        return synth(a)
    p.set_defaults(synth=shaped)


def _hybrid_options(p: argparse.ArgumentParser, shapes: dict | None = None) -> None:
    g = p.add_argument_group("hybrid models (qwen35, qwen35moe, qwen3next)")
    g.add_argument("--shape", default=None, choices=list(shapes or HYBRID_SHAPES),
                   help="a published model's sizes (and arch) for every option not given "
                        "(e.g. --shape qwen3.6-35b-a3b --layers 8: an 8-layer slice)")
    if not any("--rope-dims" in x.option_strings for x in p._actions):  # (synth moe has it: glm4moe's)
        g.add_argument("--rope-dims", type=int, default=None,
                       help="rotated dims per attention head (hybrid: 32; glm4moe: half the head)")
    g.add_argument("--sections", default="3,3,2,0", help="IMROPE sections, 4 comma-separated ints (3,3,2,0)")
    g.add_argument("--interval", type=int, default=2,
                   help="full_attention_interval: every N-th layer is attention (2: the default 2 layers are one of each)")
    g.add_argument("--ssm-conv", type=int, default=4, help="delta-net conv1d kernel width (4)")
    g.add_argument("--ssm-state", type=int, default=32, help="delta-net head width S (32)")
    g.add_argument("--ssm-groups", type=int, default=2, help="delta-net q/k heads (2)")
    g.add_argument("--ssm-heads", type=int, default=4, help="delta-net value heads (4)")
    g.add_argument("--ssm-type", default="F32", help="format of ssm_alpha / ssm_beta (F32)")
    g.add_argument("--mtp-layers", type=int, default=0, help="MTP (nextn) blocks after the trunk (0)")


def _synth_hybrid_cli(a: argparse.Namespace) -> str:
    try:
        sections = tuple(int(v) for v in a.sections.split(","))
    except ValueError:
        raise SystemExit(f"lowbit synth: --sections {a.sections!r} is not comma-separated integers") from None
    moe = a.arch != "qwen35"
    kw = dict(experts=a.experts, top_k=a.top_k, expert_ffn=a.ffn, shared_ffn=a.shared_ffn,
              expert_type=a.expert_type or "Q4_K", router_type=a.router_type) if moe else dict(ffn=a.ffn)
    return synth_hybrid(a.out, arch=a.arch, layers=a.layers, dim=a.dim, heads=a.heads, kv_heads=a.kv_heads,
                        head_dim=a.head_dim or 64, rope_dims=a.rope_dims or 32, sections=sections,
                        full_attention_interval=a.interval, ssm_conv=a.ssm_conv, ssm_state=a.ssm_state,
                        ssm_groups=a.ssm_groups, ssm_heads=a.ssm_heads, ctx=a.ctx, wtype=a.wtype,
                        ssm_type=a.ssm_type, embd_type=a.embd_type, head_type=a.head_type, seed=a.seed,
                        mtp_layers=a.mtp_layers,
                        progress=_bar_on(), **kw)


def synth_falcon_h1(path, *, layers: int = 4, dim: int = 256, ffn: int = 512, heads: int = 4, kv_heads: int = 2,
                    head_dim: int | None = None, ssm_inner: int = 384, ssm_conv: int = 4, ssm_state: int = 32,
                    ssm_groups: int = 1, ssm_heads: int = 6, ssm_norm: bool = True, conv_bias: bool = True,
                    ctx: int = 1024, rope_base: float = 10000.0, wtype: str = "Q8_0", embd_type: str = "F32",
                    head_type: str | None = None, tied: bool = False, seed: int = 0, vocab: dict | None = None,
                    progress: bool = False) -> str:
    """A Falcon-H1 model (llama.cpp's falcon-h1) with random weights, as convert_hf_to_gguf lays it
    out (Falcon-H1's multipliers folded into the weights, so none is in the file). Every layer:
    attn_norm, then attention (attn_q / attn_k / attn_v / attn_output, neox rope) and a Mamba-2 mixer
    (add_mamba2: d_inner = ssm_inner in H = ssm_heads heads, G = ssm_groups, N = ssm_state; ssm_norm
    optional, as in the file) side by side on its output, summed; then "ffn_norm" (the tensor's name
    has no ".weight": the converter maps pre_ff_layernorm.weight whole) and a SwiGLU FFN of ffn."""
    hd = head_dim or dim // heads
    if ssm_heads < 1 or ssm_groups < 1 or ssm_inner % ssm_heads or ssm_heads % ssm_groups or ssm_state < 1 or \
            ssm_conv < 1:
        raise ValueError(f"synth: --ssm-inner ({ssm_inner}) must split into --ssm-heads ({ssm_heads}), a multiple of "
                         f"--ssm-groups ({ssm_groups}); --ssm-state and --ssm-conv must be positive")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, "falcon-h1", progress=progress, fit=True)
    a = w.arch
    write_header(w, vocab, layers=layers, dim=dim, ffn=ffn, heads=heads, kv_heads=kv_heads, head_dim=hd, ctx=ctx,
                 rope_base=rope_base, eps=1e-5)
    for k, v in (("conv_kernel", ssm_conv), ("state_size", ssm_state), ("group_count", ssm_groups),
                 ("inner_size", ssm_inner), ("time_step_rank", ssm_heads)):
        w.meta(f"{a}.ssm.{k}", int(v))
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=head_type, wtype=wtype, tied=tied)
    for i in range(layers):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        w.add(p + "ffn_norm", norm_weight(rng, dim))
        add_attention(w, rng, p, dim=dim, heads=heads, kv_heads=kv_heads, head_dim=hd, wtype=wtype, pre_norms=False)
        add_mamba2(w, rng, p, dim=dim, inner=ssm_inner, groups=ssm_groups, state=ssm_state, heads=ssm_heads,
                   conv=ssm_conv, conv_bias=conv_bias, wtype=wtype, norm=ssm_norm)
        add_glu(w, rng, p, width=ffn, dim=dim, wtype=wtype)
    w.close()
    return str(path)


# Published Falcon-H1 shapes (config.json as recalled, not checked offline; `lowbit synth falcon-h1 OUT
# --shape NAME --layers 8`: an 8-layer slice). The vocabulary stays SmolLM2's 49152 (Falcon-H1's: 32K-261K).
FALCON_H1_SHAPES = {
    "falcon-h1-0.5b": dict(layers=36, dim=1024, ffn=2048, heads=8, kv_heads=2, head_dim=64, ssm_inner=1536,
                           ssm_heads=24, ssm_state=128, ssm_groups=1, ctx=16384, arch="falcon-h1"),
    "falcon-h1-7b": dict(layers=44, dim=3072, ffn=12288, heads=12, kv_heads=2, head_dim=128, ssm_inner=3072,
                         ssm_heads=24, ssm_state=256, ssm_groups=1, ctx=262144, arch="falcon-h1"),
}


def _add_falcon_h1(ss) -> None:
    p = ss.add_parser("falcon-h1", help="a Falcon-H1 model: attention and a Mamba-2 mixer side by side in every layer",
                      description="Write a Falcon-H1 model (llama.cpp's falcon-h1) with random weights and SmolLM2's "
                                  "vocabulary.")
    _shape_options(p, layers=4, dim=256, ffn=512, heads=4, kv_heads=2)
    p.add_argument("--arch", default="falcon-h1", choices=["falcon-h1"], help=argparse.SUPPRESS)
    _shape_option(p, FALCON_H1_SHAPES, "falcon-h1-7b")
    p.add_argument("--head-dim", type=int, default=None, help="attention head width (default dim / heads)")
    p.add_argument("--ssm-inner", type=int, default=384, help="the Mamba-2 mixer's d_inner (384)")
    p.add_argument("--ssm-conv", type=int, default=4, help="the conv's kernel width (4)")
    p.add_argument("--ssm-state", type=int, default=32, help="the state size N per channel (32)")
    p.add_argument("--ssm-groups", type=int, default=1, help="B / C groups (1)")
    p.add_argument("--ssm-heads", type=int, default=6, help="SSM heads (6)")
    p.add_argument("--no-ssm-norm", dest="ssm_norm", action="store_false", help="no ssm_norm (it is optional)")
    p.add_argument("--rope-base", type=float, default=10000.0)
    p.add_argument("--type", dest="wtype", default="Q8_0", help="format of the layer matrices (default Q8_0)")
    p.add_argument("--embd-type", default="F32", help="format of token_embd (default F32)")
    p.add_argument("--head-type", default=None, help="format of output.weight (default: --type)")
    p.add_argument("--tied", action="store_true", help="no output.weight: token_embd is the head")
    p.set_defaults(synth=lambda a: synth_falcon_h1(
        a.out, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
        ssm_inner=a.ssm_inner, ssm_conv=a.ssm_conv, ssm_state=a.ssm_state, ssm_groups=a.ssm_groups,
        ssm_heads=a.ssm_heads, ssm_norm=a.ssm_norm, ctx=a.ctx, rope_base=a.rope_base, wtype=a.wtype,
        embd_type=a.embd_type, head_type=a.head_type, tied=a.tied, seed=a.seed, progress=_bar_on()))
    _with_shapes(p, FALCON_H1_SHAPES)


def synth_mamba(path, *, layers: int = 4, dim: int = 256, ssm_state: int = 16, ssm_conv: int = 4,
                dt_rank: int | None = None, dt_b_c_rms: bool = False, ctx: int = 1024, wtype: str = "Q8_0",
                embd_type: str = "F32", head_type: str | None = None, tied: bool = False, seed: int = 0,
                vocab: dict | None = None, progress: bool = False) -> str:
    """A Mamba-1 model (llama.cpp's mamba) with random weights, as its converter writes it: every layer
    attn_norm and a Mamba-1 mixer, d_inner = 2 dim: ssm_in [2 d_inner, dim] (x, z), ssm_conv1d
    [d_inner, ssm_conv] and its bias, ssm_x [R + 2 N, d_inner] (dt, B, C), ssm_dt [d_inner, R] (times
    0.5: steps near the bias's) and its bias (softplus of it in [1e-3, 1e-1], Mamba's initialisation),
    ssm_a [d_inner, N] (-exp(A_log), A_log = log(1..N) jittered), ssm_d [d_inner], ssm_out [dim, d_inner];
    R = dt_rank (default ceil(dim / 16), Mamba's); dt_b_c_rms writes ssm.dt_b_c_rms (Falcon-Mamba)."""
    inner, N, R = 2 * dim, ssm_state, -(-dim // 16) if dt_rank is None else dt_rank
    if N < 1 or ssm_conv < 1 or R < 1:
        raise ValueError(f"synth: --ssm-state ({N}), --ssm-conv ({ssm_conv}) and --dt-rank ({R}) must be positive")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, "mamba", progress=progress, fit=True)
    a = w.arch
    for k, v in (("block_count", layers), ("context_length", ctx), ("embedding_length", dim),
                 ("feed_forward_length", 0), ("attention.head_count", 0), ("ssm.conv_kernel", ssm_conv),
                 ("ssm.inner_size", inner), ("ssm.state_size", N), ("ssm.time_step_rank", R)):
        w.meta(f"{a}.{k}", int(v))
    w.meta(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    if dt_b_c_rms:
        w.meta(f"{a}.ssm.dt_b_c_rms", True)
    w.meta("general.name", "lowbit synthetic mamba")
    w.meta("general.file_type", 0)
    w.copy_metadata(vocab, prefix=VOCAB_PREFIX)
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=head_type, wtype=wtype, tied=tied)
    for i in range(layers):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        add_mamba1(w, rng, p, dim=dim, inner=inner, N=N, R=R, ssm_conv=ssm_conv, wtype=wtype)
    w.close()
    return str(path)


def add_mamba1(w: Writer, rng: np.random.Generator, p: str, *, dim: int, inner: int, N: int, R: int, ssm_conv: int,
               wtype: str, norms: bool = False) -> None:
    """A Mamba-1 mixer's tensors (synth_mamba's), in this order (the random draws depend on it);
    norms: Jamba's dt / B / C norm weights after them."""
    w.add(p + "ssm_in.weight", gauss(rng, 2 * inner, dim), wtype)
    w.add(p + "ssm_conv1d.weight", gauss(rng, inner, ssm_conv, scale=0.5))
    w.add(p + "ssm_conv1d.bias", (0.5 * rng.standard_normal(inner)).astype(np.float32))
    w.add(p + "ssm_x.weight", gauss(rng, R + 2 * N, inner), wtype)
    w.add(p + "ssm_dt.weight", gauss(rng, inner, R) * np.float32(0.5))
    w.add(p + "ssm_dt.bias", np.log(np.expm1(rng.uniform(1e-3, 1e-1, inner))).astype(np.float32))
    a_log = np.log(np.arange(1, N + 1, dtype=np.float64))[None, :] + 0.1 * rng.standard_normal((inner, N))
    w.add(p + "ssm_a", (-np.exp(a_log)).astype(np.float32))
    w.add(p + "ssm_d", rng.uniform(0.5, 1.5, inner).astype(np.float32))
    w.add(p + "ssm_out.weight", gauss(rng, dim, inner), wtype)
    if norms:
        for nm, n in (("ssm_dt_norm", R), ("ssm_b_norm", N), ("ssm_c_norm", N)):
            w.add(p + nm + ".weight", norm_weight(rng, n))


def synth_jamba(path, *, layers: int = 4, dim: int = 256, ffn: int = 512, heads: int = 4, kv_heads: int = 2,
                attn_period: int = 4, attn_offset: int = 2, experts: int = 8, top_k: int = 2, expert_period: int = 2,
                expert_offset: int = 1, ssm_state: int = 16, ssm_conv: int = 4, dt_rank: int | None = None,
                ctx: int = 1024, wtype: str = "Q8_0", expert_type: str | None = None, embd_type: str = "F32",
                seed: int = 0, vocab: dict | None = None, progress: bool = False) -> str:
    """A Jamba model (llama.cpp's jamba, as convert_hf_to_gguf writes it) with random weights: layer i
    attention (no rope) where i % attn_period == attn_offset, else a Mamba-1 mixer (synth_mamba's,
    d_inner = 2 dim) with its dt / B / C norm weights; head_count_kv one per layer (0: Mamba); every
    layer then ffn_norm and the experts (ffn_gate_inp, softmax top_k of `experts` SwiGLUs of ffn,
    in expert_type) where i % expert_period == expert_offset (experts 0: none), else a dense SwiGLU
    of ffn. Jamba v0.1 / 1.5: attention 1 in 8 at offset 4, experts 1 in 2 at offset 1."""
    inner, N, R = 2 * dim, ssm_state, -(-dim // 16) if dt_rank is None else dt_rank
    attn = [i % attn_period == attn_offset for i in range(layers)]
    moe = [bool(experts) and i % expert_period == expert_offset for i in range(layers)]
    if experts and not 1 <= top_k <= experts:
        raise ValueError(f"synth jamba: top_k ({top_k}) must be in 1..experts ({experts})")
    rng = np.random.default_rng(seed)
    vocab = vocab or default_vocab()
    nv = vocab_size(vocab)
    w = Writer(path, "jamba", progress=progress, fit=True)
    a = w.arch
    hd = dim // heads
    write_header(w, vocab, layers=layers, dim=dim, ffn=ffn, heads=heads,
                 kv_heads=[kv_heads if x else 0 for x in attn], head_dim=hd, ctx=ctx)
    for k, v in (("ssm.conv_kernel", ssm_conv), ("ssm.inner_size", inner), ("ssm.state_size", N),
                 ("ssm.time_step_rank", R)):
        w.meta(f"{a}.{k}", int(v))
    if experts:
        w.meta(f"{a}.expert_count", int(experts))
        w.meta(f"{a}.expert_used_count", int(top_k))
    add_ends(w, rng, nv, dim, embd_type=embd_type, head_type=None, wtype=wtype, tied=False)
    for i in range(layers):
        p = f"blk.{i}."
        w.add(p + "attn_norm.weight", norm_weight(rng, dim))
        if attn[i]:
            w.add(p + "attn_q.weight", gauss(rng, heads * hd, dim), wtype)
            w.add(p + "attn_k.weight", gauss(rng, kv_heads * hd, dim), wtype)
            w.add(p + "attn_v.weight", gauss(rng, kv_heads * hd, dim), wtype)
            w.add(p + "attn_output.weight", gauss(rng, dim, heads * hd), wtype)
        else:
            add_mamba1(w, rng, p, dim=dim, inner=inner, N=N, R=R, ssm_conv=ssm_conv, wtype=wtype, norms=True)
        w.add(p + "ffn_norm.weight", norm_weight(rng, dim))
        if moe[i]:
            w.add(p + "ffn_gate_inp.weight", gauss(rng, experts, dim))
            for nm, shape in (("gate", (experts, ffn, dim)), ("up", (experts, ffn, dim)), ("down", (experts, dim, ffn))):
                w.add(p + f"ffn_{nm}_exps.weight", gauss(rng, *shape), expert_type or wtype)
        else:
            add_glu(w, rng, p, width=ffn, dim=dim, wtype=wtype)
    w.close()
    return str(path)


def _add_mamba(ss) -> None:
    p = ss.add_parser("mamba", help="a Mamba-1 model (mamba: Mamba, Falcon-Mamba with --dt-b-c-rms)",
                      description="Write a Mamba-1 model (llama.cpp's mamba) with random weights and SmolLM2's "
                                  "vocabulary.")
    p.add_argument("out", help="the GGUF file to write")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256, help="model width (d_inner is twice it)")
    p.add_argument("--ssm-state", type=int, default=16, help="the state size N per channel (16)")
    p.add_argument("--ssm-conv", type=int, default=4, help="the conv's kernel width (4)")
    p.add_argument("--dt-rank", type=int, default=None, help="dt's projection rank (default ceil(dim / 16))")
    p.add_argument("--dt-b-c-rms", action="store_true", help="dt, B and C RMS-normed (Falcon-Mamba)")
    p.add_argument("--ctx", type=int, default=1024, help="context length written to the file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--type", dest="wtype", default="Q8_0", help="format of the layer matrices (default Q8_0)")
    p.add_argument("--embd-type", default="F32", help="format of token_embd (default F32)")
    p.add_argument("--head-type", default=None, help="format of output.weight (default: --type)")
    p.add_argument("--tied", action="store_true", help="no output.weight: token_embd is the head")
    p.set_defaults(synth=lambda a: synth_mamba(
        a.out, layers=a.layers, dim=a.dim, ssm_state=a.ssm_state, ssm_conv=a.ssm_conv, dt_rank=a.dt_rank,
        dt_b_c_rms=a.dt_b_c_rms, ctx=a.ctx, wtype=a.wtype, embd_type=a.embd_type, head_type=a.head_type,
        tied=a.tied, seed=a.seed, progress=_bar_on()))


# Gemma 4's sizes as recalled, approximate (not checked offline: the layer counts are llama.cpp's
# loader's, 60, 30 and 35; the widths, E2B's pattern and shared layers are from memory). `lowbit synth gemma4 OUT --shape gemma-4-31b
# --layers 8`: an 8-layer slice. The vocabulary stays SmolLM2's 49152 (Gemma 4's: 262144).
GEMMA4_SHAPES = {
    "gemma-4-31b": dict(layers=60, dim=5376, ffn=21504, heads=32, kv_heads=16, kv_heads_full=4, head_dim=256,
                        head_dim_full=512, window=1024, swa_pattern=6, ctx=262144, arch="gemma4"),
    "gemma-4-26b-a4b": dict(layers=30, dim=2816, ffn=2112, heads=16, kv_heads=8, kv_heads_full=2, head_dim=256,
                            head_dim_full=512, window=1024, swa_pattern=6, experts=128, top_k=8, expert_ffn=704,
                            ctx=262144, arch="gemma4"),
    "gemma-4-e2b": dict(layers=35, dim=1536, ffn=6144, heads=8, kv_heads=1, kv_heads_full=1, head_dim=256,
                        head_dim_full=512, window=512, swa_pattern=5, ple_dim=256, shared_kv=20, ctx=131072,
                        arch="gemma4"),
}


def _add_gemma4(ss) -> None:
    p = ss.add_parser("gemma4", help="a Gemma 4 model (dense, --experts: 26B-A4B's MoE, --ple-dim / --shared-kv: "
                                     "E2B / E4B's): sliding and full layers of different head widths",
                      description="Write a Gemma 4 model (llama.cpp's gemma4) with random weights and SmolLM2's "
                                  "vocabulary.")
    _shape_options(p, layers=6, dim=256, ffn=512, heads=4, kv_heads=2)
    p.add_argument("--arch", default="gemma4", choices=["gemma4"], help=argparse.SUPPRESS)
    _shape_option(p, GEMMA4_SHAPES, "gemma-4-31b")
    p.add_argument("--kv-heads-full", type=int, default=1, help="KV heads of the full-attention layers (1)")
    p.add_argument("--head-dim", type=int, default=64, help="head width of the sliding layers (64)")
    p.add_argument("--head-dim-full", type=int, default=128, help="head width of the full layers (128)")
    p.add_argument("--window", type=int, default=64, help="the sliding layers' window (64)")
    p.add_argument("--swa-pattern", type=int, default=3, help="period: every layer slides but the last of each (3)")
    p.add_argument("--rope-dims-swa", type=int, default=None, help="rotated dims of a sliding layer (default all)")
    p.add_argument("--rope-fraction-full", type=float, default=0.25,
                   help="rotated fraction of a full layer's dims (its rope_freqs; 0.25)")
    p.add_argument("--softcap", type=float, default=30.0, help="final_logit_softcapping (0: none; 30)")
    p.add_argument("--v-full", dest="v_shared_full", action="store_false",
                   help="the full layers have attn_v (default: none, v = k's projection)")
    p.add_argument("--experts", type=int, default=0, help="routed experts beside each layer's MLP (0: dense; 26B-A4B)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (2)")
    p.add_argument("--expert-ffn", type=int, default=128, help="an expert's FFN width (128)")
    p.add_argument("--expert-type", default=None, help="format of the expert tensors (default: --type)")
    p.add_argument("--ple-dim", type=int, default=0, help="per-layer embedding width (E2B / E4B; 0: none)")
    p.add_argument("--shared-kv", type=int, default=0, help="the last N layers read earlier layers' KV (E2B / E4B)")
    p.add_argument("--double-wide", action="store_true", help="the shared-KV layers' FFNs twice as wide")
    p.add_argument("--type", dest="wtype", default="Q8_0", help="format of the layer matrices (default Q8_0)")
    p.add_argument("--embd-type", default="F32", help="format of token_embd, also the head (default F32)")
    p.set_defaults(synth=lambda a: synth_gemma4(
        a.out, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads,
        kv_heads_full=a.kv_heads_full, head_dim=a.head_dim, head_dim_full=a.head_dim_full, window=a.window,
        swa_pattern=a.swa_pattern, rope_dims_swa=a.rope_dims_swa, rope_fraction_full=a.rope_fraction_full,
        softcap=a.softcap, v_shared_full=a.v_shared_full, experts=a.experts, top_k=a.top_k,
        expert_ffn=a.expert_ffn, expert_type=a.expert_type, ple_dim=a.ple_dim, shared_kv=a.shared_kv,
        double_wide=a.double_wide, ctx=a.ctx, wtype=a.wtype, embd_type=a.embd_type,
        seed=a.seed, progress=_bar_on()))
    _with_shapes(p, GEMMA4_SHAPES)


# Gemma 3n E2B's sizes as recalled (approximate, not checked offline: 30 layers as llama.cpp's loader
# names E2B, 35 E4B). The vocabulary stays SmolLM2's 49152 (Gemma 3n's: 262144).
GEMMA3N_SHAPES = {"gemma-3n-e2b": dict(layers=30, dim=2048, ffn=8192, heads=8, kv_heads=2, head_dim=256, window=512,
                                       ple_dim=256, laurel_rank=64, ctx=32768, arch="gemma3n")}


def _add_gemma3n(ss) -> None:
    p = ss.add_parser("gemma3n", help="a Gemma 3n model (E2B / E4B): AltUp streams, LAuReL, per-layer embeddings",
                      description="Write a Gemma 3n model (llama.cpp's gemma3n) with random weights and SmolLM2's "
                                  "vocabulary.")
    _shape_options(p, layers=6, dim=256, ffn=512, heads=4, kv_heads=2)
    p.add_argument("--arch", default="gemma3n", choices=["gemma3n"], help=argparse.SUPPRESS)
    _shape_option(p, GEMMA3N_SHAPES, "gemma-3n-e2b")
    p.add_argument("--head-dim", type=int, default=64, help="head width (64)")
    p.add_argument("--window", type=int, default=64, help="the sliding layers' window (64)")
    p.add_argument("--ple-dim", type=int, default=256, help="per-layer embedding width (256: llama.cpp reads no other)")
    p.add_argument("--laurel-rank", type=int, default=64, help="LAuReL rank (64: llama.cpp reads no other)")
    p.add_argument("--type", dest="wtype", default="Q8_0", help="format of the layer matrices (default Q8_0)")
    p.add_argument("--embd-type", default="F32", help="format of token_embd, also the head (default F32)")
    p.set_defaults(synth=lambda a: synth_gemma3n(
        a.out, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
        window=a.window, ple_dim=a.ple_dim, laurel_rank=a.laurel_rank, ctx=a.ctx, wtype=a.wtype,
        embd_type=a.embd_type, seed=a.seed, progress=_bar_on()))
    _with_shapes(p, GEMMA3N_SHAPES)


def _add_jamba(ss) -> None:
    p = ss.add_parser("jamba", help="a Jamba model: Mamba-1 and attention layers, experts on every other layer",
                      description="Write a Jamba model (llama.cpp's jamba) with random weights and SmolLM2's vocabulary.")
    _shape_options(p, layers=4, dim=256, ffn=512, heads=4, kv_heads=2)
    p.add_argument("--attn-period", type=int, default=4, help="one attention layer in this many (4; Jamba: 8)")
    p.add_argument("--attn-offset", type=int, default=2, help="the attention layer's place in its period (2; Jamba: 4)")
    p.add_argument("--experts", type=int, default=8, help="experts (8; 0: every FFN dense)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (2)")
    p.add_argument("--ssm-state", type=int, default=16, help="the Mamba state size N per channel (16)")
    p.add_argument("--type", dest="wtype", default="Q8_0", help="format of the layer matrices (default Q8_0)")
    p.add_argument("--expert-type", default=None, help="format of the expert tensors (default: --type)")
    p.add_argument("--embd-type", default="F32", help="format of token_embd (default F32)")
    p.set_defaults(synth=lambda a: synth_jamba(
        a.out, layers=a.layers, dim=a.dim, ffn=a.ffn, heads=a.heads, kv_heads=a.kv_heads, attn_period=a.attn_period,
        attn_offset=a.attn_offset, experts=a.experts, top_k=a.top_k, ssm_state=a.ssm_state, ctx=a.ctx,
        wtype=a.wtype, expert_type=a.expert_type, embd_type=a.embd_type, seed=a.seed, progress=_bar_on()))


# KIND -> function adding its sub-parser (each sets `synth`: args -> path written)
FAMILIES = {"dense": _add_dense, "moe": _add_moe, "bitnet": _add_bitnet, "lfm2": _add_lfm2,
            "granitehybrid": _add_granite_hybrid, "nemotron_h": _add_nemotron_h, "falcon-h1": _add_falcon_h1,
            "mamba": _add_mamba, "gemma4": _add_gemma4, "gemma3n": _add_gemma3n,
            "jamba": _add_jamba}


def _bar_on() -> bool:
    return sys.stderr.isatty()


def cmd_synth(a: argparse.Namespace) -> int:
    try:
        path = a.synth(a)
    except ValueError as e:  # the options do not describe a model (a usage error)
        print(f"lowbit synth: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("synth", help="write a random-weight model (tests, benchmarks)",
                       description="Write a GGUF model with random weights and the default model's "
                                   "vocabulary, loadable by lowbit and llama.cpp.")
    ss = s.add_subparsers(dest="kind", metavar="KIND", required=True)
    for add in FAMILIES.values():
        add(ss)
    s.set_defaults(func=cmd_synth)
