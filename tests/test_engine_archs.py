"""Each supported architecture (llama, qwen2, qwen3) on a small random model, against llama.cpp.

The model is written with gguf-py's GGUFWriter: 2 layers, width 64, 4 query heads over 2 KV
heads (GQA), random F32 weights (so no activation quantization on either side), SmolLM2's
vocabulary. qwen2 adds q/k/v biases and NeoX rope; qwen3 adds per-head q/k RMSNorm and NeoX
rope; llama uses adjacent-pair rope. A mix-up in any of these moves logits by whole units.
"""
import numpy as np
import pytest

import lowbit

DIM, HEADS, KV, HD, FFN, LAYERS = 64, 4, 2, 16, 128, 2


def write_model(path, arch, vocab_md, vocab_size, rng, kv_q8=False):
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(HD)
    for k, v in vocab_md.items():
        if isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        else:
            w.add_uint32(k, v)

    def t(name, *shape, scale=None):
        a = rng.standard_normal(shape).astype(np.float32) * np.float32(scale or 1.0 / np.sqrt(shape[-1]))
        if kv_q8 and (".attn_k." in name or ".attn_v." in name):
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    t("token_embd.weight", vocab_size, DIM, scale=1.0)
    t("output.weight", vocab_size, DIM)
    w.add_tensor("output_norm.weight", (1.0 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", (1.0 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", (1.0 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))
        t(p + "attn_q.weight", HEADS * HD, DIM)
        t(p + "attn_k.weight", KV * HD, DIM)
        t(p + "attn_v.weight", KV * HD, DIM)
        t(p + "attn_output.weight", DIM, HEADS * HD)
        t(p + "ffn_gate.weight", FFN, DIM)
        t(p + "ffn_up.weight", FFN, DIM)
        t(p + "ffn_down.weight", DIM, FFN)
        if arch == "qwen2":
            for s, rows in (("attn_q", HEADS * HD), ("attn_k", KV * HD), ("attn_v", KV * HD)):
                w.add_tensor(p + s + ".bias", (0.5 * rng.standard_normal(rows)).astype(np.float32))
        if arch == "qwen3":
            w.add_tensor(p + "attn_q_norm.weight", (1.0 + 0.2 * rng.standard_normal(HD)).astype(np.float32))
            w.add_tensor(p + "attn_k_norm.weight", (1.0 + 0.2 * rng.standard_normal(HD)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def vocab():
    f = lowbit.gguf.open(lowbit.model.default_model_path())
    md = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}
    return md, len(md["tokenizer.ggml.tokens"])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "llama+q8kv"])
def test_architecture_matches_llama_cpp(tmp_path, vocab, arch):
    """llama+q8kv: q in F32 but k/v in Q8_0, so one layer input is shared by matmuls with
    different activation formats (the engine must not reuse a stale quantized copy)."""
    from lowbit import peer
    md, nv = vocab
    kv_q8 = arch.endswith("+q8kv")
    arch = arch.split("+")[0]
    path = tmp_path / f"{arch}.gguf"
    write_model(path, arch, md, nv, np.random.default_rng(7), kv_q8=kv_q8)
    m = lowbit.load(str(path), n_ctx=64, threads=2)
    assert m.config.arch == arch and m.config.rope_neox == (arch != "llama")
    assert m.config.qkv_bias == (arch == "qwen2") and m.config.qk_norm == (arch == "qwen3")
    llm = peer.Llama(str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=2)
    ids = llm.tokenize(b"The quick brown fox jumps over the lazy dog again and again", add_bos=False)
    llm.reset()
    llm.eval(ids)
    ref = np.array(llm.scores[: len(ids)])
    ours = m.logits(ids)
    spread = float((ref.max(1) - ref.min(1)).mean())
    err = float(np.abs(ours - ref).max())
    assert err <= (2e-2 if kv_q8 else 2e-3) * spread, f"{arch}: max |logit diff| {err:.4g} against a spread of {spread:.3g}"
    assert np.array_equal(ours.argmax(1), ref.argmax(1))
