"""BitNet b1.58 end to end: the `bitnet` (llama.cpp) and `bitnet-b1.58` (bitnet.cpp) families on
small models written by `lowbit synth bitnet` (random ternary weights, SmolLM2's vocabulary).

  - bitnet, TQ2_0: teacher-forced against llama.cpp's own greedy continuation (llama.cpp loads
    the file), top-1 equal at >= 99% of the positions whose top-2 margin is >= 0.1 logit; with
    the per-tensor scales as separate `.scale` tensors too.
  - bitnet-b1.58 (squared ReLU, which llama.cpp cannot run): against a float64 numpy forward of
    the same weights (gguf-py's dequantization of the TQ2_0 file), within a bound derived from
    the int8 activation rounding (see test_bitnet_b158_matches_float64); the same ternary
    matrix stored as I2_S and as TQ2_0 gives the same top-1.
  - a token's logits are bitwise the same alone or in a window, and with 1 or 2 threads.
  - `lowbit perplexity` prints the same line with LOWBIT_I2S_FOLD=1 and without, at avx2.
  - a bitnet.cpp-style I2_S file (its metadata keys, tensor names, types and I2_S layout).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import lowbit
from llama_ref import llama_greedy
from lowbit import synth
from lowbit._native import lib
from lowbit.gguf import GGUFError

SHAPE = dict(layers=3, dim=256, ffn=512, heads=4, kv_heads=2, ctx=256)
TEXT = "The quick brown fox jumps over the lazy dog. Then it ran into the forest and"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same ternary weights (seed) as bitnet-b1.58 I2_S and TQ2_0, and bitnet TQ2_0 files."""
    d = tmp_path_factory.mktemp("bitnet")
    out = {}
    for key, arch, wtype, extra in [("b158_i2s", "bitnet-b1.58", "I2_S", {}),
                                    ("b158_tq2", "bitnet-b1.58", "TQ2_0", {}),
                                    ("bitnet_tq2", "bitnet", "TQ2_0", {}),
                                    ("bitnet_tq2_scales", "bitnet", "TQ2_0", {"scale_tensors": True})]:
        out[key] = synth.synth_bitnet(d / f"{key}.gguf", arch=arch, wtype=wtype, seed=3, **SHAPE, **extra)
    return out


def top1_agreement(ours: np.ndarray, ref: np.ndarray, margin: float = 0.1) -> tuple[float, int]:
    """Fraction of positions whose reference top-2 margin is >= margin where the argmaxes agree."""
    s = np.sort(ref, axis=1)
    decided = (s[:, -1] - s[:, -2]) >= margin
    agree = ours.argmax(1) == ref.argmax(1)
    return float(agree[decided].mean()), int(decided.sum())


# ---- bitnet (llama.cpp's architecture) against llama.cpp ----------------------------------------

@pytest.mark.parametrize("key", ["bitnet_tq2", "bitnet_tq2_scales"])
def test_bitnet_matches_llama_cpp(files, key):
    from lowbit import peer
    path = files[key]
    llm = peer.Llama(path, n_ctx=128, logits_all=True, verbose=False, n_threads=2)
    prompt = llm.tokenize(TEXT.encode(), add_bos=False)
    ids, ref = llama_greedy(llm, prompt, 40)
    m = lowbit.load(path, n_ctx=128, threads=2)
    assert m.config.arch == "bitnet" and m.config.sub_norm and m.config.ffn_act == "silu" and m.config.rope_neox
    ours = m.logits(ids)
    rate, n = top1_agreement(ours, ref)
    assert n >= 0.9 * len(ids), f"only {n} of {len(ids)} positions have a top-2 margin >= 0.1"
    assert rate >= 0.99, f"top-1 agrees with llama.cpp at {rate:.1%} of {n} positions"
    # teacher-forced: at the generated positions llama.cpp's greedy token is its argmax; ours
    # picks the same token wherever llama.cpp's choice is decided (margin >= 0.1)
    gen = slice(len(prompt) - 1, len(ids) - 1)
    assert np.array_equal(ref[gen].argmax(1), ids[len(prompt):])
    assert top1_agreement(ours[gen], ref[gen])[0] >= 0.99
    # and the logits themselves are close (activation rounding only: ~2% of their rms)
    assert float(np.sqrt(((ours - ref) ** 2).mean())) < 0.05 * float(ref.std())


# ---- bitnet-b1.58 against float64 ---------------------------------------------------------------

def _deq(t) -> np.ndarray:
    """gguf-py's (independent) dequantization of a tensor's bytes (a lowbit.gguf Tensor's raw view;
    gguf-py's own reader takes seconds over the 49152-token vocabulary)."""
    import gguf
    if t.format.name == "F32":
        return t.raw.view(np.float32).astype(np.float64).reshape(t.shape)
    raw = t.matrix()
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.format.id)).astype(np.float64).reshape(t.shape)


def _reference(path: str, ids: list[int]):
    """float64 forward of a bitnet-b1.58 TQ2_0 file (weights by gguf-py), llama.cpp's graph
    (bitnet.cpp's build_bitnet_158): returns (logits, eps) where eps[t] is the relative rounding
    of token t's path (see test_bitnet_b158_matches_float64)."""
    f = lowbit.gguf.open(path)
    T, md = f.tensors, f.metadata
    a = "bitnet-b1.58"
    L, dim = md[f"{a}.block_count"], md[f"{a}.embedding_length"]
    nh, nkv = md[f"{a}.attention.head_count"], md[f"{a}.attention.head_count_kv"]
    eps, base = md[f"{a}.attention.layer_norm_rms_epsilon"], md[f"{a}.rope.freq_base"]
    hd = dim // nh
    W = lambda n: _deq(T[n])  # noqa: E731
    E = W("token_embd.weight")
    x = E[ids]
    n = len(ids)
    var = np.zeros(n)  # sum of squared relative roundings along each token's path

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def mm(v, name):
        # the engine quantizes v to int8 per row (I8_S) or per 256-block (Q8_K): relative
        # rounding std (amax / 127) / sqrt(12) / rms(v) at most (block amax <= row amax)
        nonlocal var
        var += (np.abs(v).max(-1) / 127.0 / np.sqrt(12.0) / np.sqrt((v * v).mean(-1))) ** 2
        return v @ W(name).T

    half = hd // 2
    inv = base ** (-np.arange(half) * 2.0 / hd)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v, heads):  # NeoX: pairs (i, i + hd/2)
        v = v.reshape(n, heads, hd)
        a0, a1 = v[..., :half], v[..., half:]
        return np.concatenate([a0 * cos - a1 * sin, a0 * sin + a1 * cos], -1)

    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W(p + "attn_norm.weight"))
        q, k, v = rope(mm(h, p + "attn_q.weight"), nh), rope(mm(h, p + "attn_k.weight"), nkv), \
            mm(h, p + "attn_v.weight").reshape(n, nkv, hd)
        var += 2 * (2.0 ** -11 / np.sqrt(3)) ** 2  # k and v cached in half
        att = np.empty((n, nh, hd))
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for hh in range(nh):
            s = q[:, hh] @ k[:, hh // (nh // nkv)].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(1, keepdims=True))
            att[:, hh] = (s / s.sum(1, keepdims=True)) @ v[:, hh // (nh // nkv)]
        att = rms(att.reshape(n, dim), W(p + "attn_sub_norm.weight"))
        x = x + mm(att, p + "attn_output.weight")
        h = rms(x, W(p + "ffn_norm.weight"))
        g, u = mm(h, p + "ffn_gate.weight"), mm(h, p + "ffn_up.weight")
        f = rms(np.maximum(g, 0.0) ** 2 * u, W(p + "ffn_sub_norm.weight"))
        x = x + mm(f, p + "ffn_down.weight")
    h = rms(x, W("output_norm.weight"))
    return h @ E.T, np.sqrt(var)


@pytest.mark.parametrize("key", ["b158_tq2", "b158_i2s"])
def test_bitnet_b158_matches_float64(files, key):
    """Bound. Each matmul quantizes its input v (n values) to int8: v_k -> v_k + e_k with
    |e_k| <= amax/127/2, e_k ~ uniform, so e has rms (amax/127)/sqrt(12) and the output error of
    any fixed matrix relative to its output is that over rms(v): eps_i = amax/(127 sqrt(12) rms)
    (I8_S uses the row's amax; Q8_K a 256-block's, which is smaller). Independent roundings add
    in quadrature along a token's path: eps = sqrt(sum eps_i^2) over the 7 matmuls of every
    layer (plus 2^-11/sqrt(3) for each of k and v stored in half). The sub-norms re-normalise
    each branch, so the final hidden state carries a relative error ~eps and a logit
    E_v . h an error ~eps * rms(logits) (E_v . dh with dh of norm eps |h| in a random
    direction). Over the vocabulary (49152 values per token, |N(0,1)| max ~4.4) we allow 8 of
    those standard deviations. float32 accumulation (~1e-6) is far below."""
    ids = lowbit.load(files["b158_tq2"], n_ctx=64).tokenize(TEXT, add_bos=False)[:24]
    ref, eps = _reference(files["b158_tq2"], ids)
    m = lowbit.load(files[key], n_ctx=64, threads=2)
    assert m.config.arch == "bitnet-b1.58" and m.config.ffn_act == "relu2" and m.config.tied_output
    ours = m.logits(ids).astype(np.float64)
    sigma = eps * ref.std(1)
    err = np.abs(ours - ref).max(1)
    assert np.all(err <= 8 * sigma), f"max |logit diff| / (eps * rms logits) = {np.max(err / sigma):.2f}"
    assert np.all(err > 0)  # the activations really are quantized (not a float path)
    rate, n = top1_agreement(ours, ref)
    assert rate >= 0.99 and n >= 0.9 * len(ids)


def test_i2s_and_tq2_hold_the_same_matrix_and_agree(files):
    """The synth writes the same ternary matrix into both formats: gguf-py's TQ2_0 dequant equals
    lowbit's I2_S dequant (codes * fp32 scale) bit for bit. The two models then differ only in
    their activation rounding (I8_S per row vs Q8_K per 256-block), each ~3% of the logits' rms
    (~0.12 logit at rms 4, the float64 test's bound), so a top-2 gap moves by ~0.15 between
    them: the top-1 must agree wherever a margin is >= 0.6 (4 of those), and at >= 95% of the
    positions with a margin >= 0.1."""
    r = lowbit.gguf.open(files["b158_tq2"]).tensors
    fi = lowbit.gguf.open(files["b158_i2s"])
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.2.attn_k.weight"):
        t = fi.tensors[name]
        assert t.format.name == "I2_S"
        mine = lowbit.kernels.dequantize("I2_S", t.matrix(), t.n, t.w_scale)
        assert np.array_equal(mine, _deq(r[name]).astype(np.float32)), name
    with open(os.path.join(os.path.dirname(__file__), "data", "ppl.txt"), encoding="utf-8") as fh:
        text = fh.read()
    m = lowbit.load(files["b158_tq2"], n_ctx=128)
    ids = m.tokenize(text, add_bos=False)[:120]
    b = m.logits(ids)
    a = lowbit.load(files["b158_i2s"], n_ctx=128).logits(ids)
    for x, y in ((a, b), (b, a)):
        rate, n = top1_agreement(x, y, margin=0.6)
        assert rate == 1.0 and n >= len(ids) // 4
        assert top1_agreement(x, y, margin=0.1)[0] >= 0.95


# ---- invariants ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["b158_i2s", "bitnet_tq2_scales"])
def test_window_alone_and_threads_bitwise(files, key):
    ids = lowbit.load(files[key], n_ctx=64).tokenize(TEXT, add_bos=False)[:13]
    win = lowbit.load(files[key], n_ctx=64, threads=2).logits(ids, chunk=13)  # windows of 8 + 5
    m1 = lowbit.load(files[key], n_ctx=64, threads=1)
    alone = np.concatenate([m1.forward([t], all_logits=True) for t in ids])
    assert np.array_equal(win, alone)


def _run(args, env_extra, check=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWBIT_")}
    env.update(env_extra)
    src = os.path.join(os.path.dirname(lowbit.__file__), "..")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(lib.__file__), os.path.abspath(src),
                                         env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, check=check)


@pytest.mark.skipif("avx2" not in lib.cpu_info()["features"], reason="the fold deferral is an avx2 kernel")
def test_perplexity_identical_with_and_without_fold(files, tmp_path):
    """LOWBIT_I2S_FOLD=1 folds the int16 block sums every block instead of every 10: cost only."""
    with open(os.path.join(os.path.dirname(__file__), "data", "ppl.txt"), encoding="utf-8") as fh:
        (tmp_path / "text.txt").write_text(fh.read()[:1500], encoding="utf-8")  # ~4 chunks of 64
    text = str(tmp_path / "text.txt")
    lines, kernels = [], []
    code = ("import sys; from lowbit import kernels; from lowbit.cli import main; "
            "print(kernels.kernel('I2_S', 1)[0]); sys.exit(main(sys.argv[1:]))")
    for fold in ({}, {"LOWBIT_I2S_FOLD": "1"}):
        r = _run(["-c", code, "perplexity", "-m", files["b158_i2s"], "-f", text, "--ppl-ctx", "64",
                  "-c", "64", "-t", "2", "-q"], {"LOWBIT_MAX_ISA": "avx2", **fold})
        k, line = r.stdout.strip().splitlines()
        kernels.append(k)
        lines.append(line)
    assert kernels == ["rows_i2_s_i8_s_avx2", "rows_i2_s_i8_s_avx2_fold1"]
    assert lines[0].startswith("perplexity ") and lines[0] == lines[1], lines


# ---- bitnet.cpp's file layout and errors -----------------------------------------------------------

def _pack_i2s_reference(codes: np.ndarray, scale: float) -> bytes:
    """bitnet.cpp's x86 I2_S packing written out per byte: in each 128-weight block, byte j
    holds weights j, 32+j, 64+j, 96+j as (code+1) in bits 7:6, 5:4, 3:2, 1:0; then the fp32
    scale, and the tensor is 32 bytes longer than its codes."""
    flat = codes.reshape(-1)
    out = bytearray()
    for b0 in range(0, flat.size, 128):
        for j in range(32):
            byte = 0
            for g in range(4):
                byte |= (int(flat[b0 + 32 * g + j]) + 1) << (6 - 2 * g)
            out.append(byte)
    return bytes(out) + np.float32(scale).tobytes() + bytes(28)


def test_bitnet_cpp_style_file(files):
    """What bitnet.cpp's converter writes for BitNet b1.58 2B-4T (architecture bitnet-b1.58): its
    metadata keys, 1 + 11 * layers + 1 tensors with its names, every layer matrix I2_S (type 36)
    with the fp32 scale after the codes, norms F32, token_embd F16 and no output.weight."""
    f = lowbit.gguf.open(files["b158_i2s"])
    a = "bitnet-b1.58"
    md = f.metadata
    assert md["general.architecture"] == a and md["general.file_type"] == 40
    for k in ("vocab_size", "context_length", "embedding_length", "block_count", "feed_forward_length",
              "rope.dimension_count", "attention.head_count", "attention.head_count_kv", "rope.freq_base",
              "attention.layer_norm_rms_epsilon"):
        assert f"{a}.{k}" in md, k
    L = SHAPE["layers"]
    assert len(f.tensors) == 1 + 11 * L + 1 and "output.weight" not in f.tensors
    assert f.tensors["token_embd.weight"].format.name == "F16"
    for i in range(L):
        for m in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            t = f.tensors[f"blk.{i}.{m}.weight"]
            assert t.format.id == 36 and t.nbytes == t.rows * t.n // 4 + 32
        for v in ("attn_norm", "attn_sub_norm", "ffn_norm", "ffn_sub_norm"):
            assert f.tensors[f"blk.{i}.{v}.weight"].format.name == "F32"
    # the I2_S bytes are bitnet.cpp's packing of the TQ2_0 file's ternary matrix
    tq = lowbit.gguf.open(files["b158_tq2"]).tensors["blk.1.attn_v.weight"]
    w = _deq(tq)
    scale = float(np.abs(w).max())
    codes = np.rint(w / scale).astype(np.int8)
    assert bytes(f.tensors["blk.1.attn_v.weight"].raw) == _pack_i2s_reference(codes, scale)
    # and it runs: a greedy continuation from the engine, finite logits
    m = lowbit.load(files["b158_i2s"], n_ctx=64)
    out = m.logits(m.tokenize(TEXT, add_bos=False)[:8])
    assert np.isfinite(out).all()


def test_synth_cli_and_bad_files(tmp_path):
    from lowbit.cli import main
    p = tmp_path / "tiny.gguf"
    assert main(["synth", "bitnet", str(p), "--layers", "1", "--dim", "256", "--ffn", "256", "--heads", "2",
                 "--kv-heads", "1", "--type", "TQ1_0", "--arch", "bitnet"]) == 0
    m = lowbit.load(p, n_ctx=16)
    assert m.file.tensors["blk.0.ffn_up.weight"].format.name == "TQ1_0" and m.config.arch == "bitnet"
    assert np.isfinite(m.logits([1, 2, 3])).all()
    # a bitnet file without its sub-norm: one clear error
    from lowbit.writer import Writer
    src = lowbit.gguf.open(p)
    q = tmp_path / "nosub.gguf"
    w = Writer(q, "bitnet")
    w.copy_metadata(src.metadata)
    for name, t in src.tensors.items():
        if name != "blk.0.ffn_sub_norm.weight":
            w.add_raw(name, t.format, t.shape, t.raw)
    w.close()
    with pytest.raises(GGUFError, match="ffn_sub_norm"):
        lowbit.load(q, n_ctx=16)
    # an unknown BitNet variant (bitnet.cpp's fork also names "bitnet-25"): one clear error
    r = tmp_path / "b25.gguf"
    w = Writer(r, "bitnet-25")
    w.copy_metadata({k.replace("bitnet.", "bitnet-25.", 1): v for k, v in src.metadata.items()})
    for name, t in src.tensors.items():
        w.add_raw(name, t.format, t.shape, t.raw)
    w.close()
    with pytest.raises(GGUFError, match="'bitnet-25' is not supported.*bitnet-b1.58"):
        lowbit.load(r, n_ctx=16)
    with pytest.raises(ValueError, match="arch must be"):
        synth.synth_bitnet(tmp_path / "x.gguf", arch="bitnet-25")


# ---- lowbit quantize on the BitNet families -------------------------------------------------------

def _layer_mats(f):
    return [n for n, t in f.tensors.items() if n.startswith("blk.") and len(t.shape) == 2]


def test_quantize_between_ternary_formats_is_exact(files, tmp_path):
    """TQ2_0 -> I2_S gives byte for byte the I2_S file the synth packed from the same codes (and
    back); token_embd kept F16 with --token-embedding-type F16, 1-D tensors are copied; TQ1_0
    holds the same matrix."""
    from lowbit.quantize import quantize_file
    for src, dst, want, ft in (("b158_tq2", "I2_S", "b158_i2s", 40), ("b158_i2s", "TQ2_0", "b158_tq2", 37)):
        out = tmp_path / f"{src}-{dst}.gguf"
        # token_embd kept F16 as in the synth's files (by llama.cpp's rules the tied head would be
        # Q6_K: a different model, not the same codes repacked)
        types = quantize_file(files[src], out, dst, embd_type="F16")
        assert types["token_embd.weight"] == "F16"
        with lowbit.gguf.open(out) as g, lowbit.gguf.open(files[want]) as w:
            assert g.metadata["general.file_type"] == ft
            # the same tensors (quantize writes them in llama-quantize's order, the synth in its own)
            assert sorted(g.tensors) == sorted(w.tensors)
            for name, t in g.tensors.items():
                assert t.format.name == w.tensors[name].format.name, name
                assert bytes(t.raw) == bytes(w.tensors[name].raw), name
    out = tmp_path / "tq1.gguf"
    quantize_file(files["b158_i2s"], out, "TQ1_0")
    with lowbit.gguf.open(out) as g, lowbit.gguf.open(files["b158_tq2"]) as w:
        for name in _layer_mats(g):
            assert g.tensors[name].format.name == "TQ1_0"
            assert np.array_equal(_deq(g.tensors[name]), _deq(w.tensors[name])), name
    m = lowbit.load(out, n_ctx=32)
    assert np.isfinite(m.logits(m.tokenize(TEXT)[:8])).all()


def test_quantize_tied_head_and_latent_weights(files, tmp_path):
    from lowbit.quantize import quantize_file
    from lowbit.writer import absmean_ternary
    # the tied head's format is token_embd's: --embd-type Q8_0; --head-type has nothing to act on
    out = tmp_path / "q8head.gguf"
    quantize_file(files["b158_i2s"], out, "I2_S", embd_type="Q8_0")
    m = lowbit.load(out, n_ctx=64)
    assert m.file.tensors["token_embd.weight"].format.name == "Q8_0" and m.config.tied_output
    ids = m.tokenize(TEXT, add_bos=False)
    ref = lowbit.load(files["b158_i2s"], n_ctx=64).logits(ids)
    assert top1_agreement(m.logits(ids), ref, margin=0.6)[0] == 1.0
    with pytest.raises(ValueError, match="tied"):
        quantize_file(files["b158_i2s"], tmp_path / "x.gguf", "I2_S", head_type="Q8_0")
    # latent (not yet ternary) float weights: BitNet's absmean rule per tensor, as bitnet.cpp's
    # and llama.cpp's converters apply it (s = 1 / mean|W|; round(W s) clamped to [-1, 1])
    rng = np.random.default_rng(5)
    W = rng.standard_normal((64, 256)).astype(np.float32)
    s = 1.0 / max(float(np.abs(W).mean()), 1e-5)
    codes = np.clip(np.rint(W * s), -1, 1)
    t = absmean_ternary(W)
    assert np.array_equal(np.sign(t), codes) and len(np.unique(np.abs(t[t != 0]))) == 1
    assert np.allclose(np.abs(t[t != 0]), 1.0 / s, rtol=1e-6)
    assert absmean_ternary(t) is not None and np.array_equal(absmean_ternary(t), t)  # already ternary: as is
    from lowbit.writer import Writer
    src = tmp_path / "latent.gguf"
    w = Writer(src, "bitnet")
    w.copy_metadata(lowbit.gguf.open(files["bitnet_tq2"]).metadata)
    with lowbit.gguf.open(files["bitnet_tq2"]) as f:
        for name, tt in f.tensors.items():
            if name == "blk.0.ffn_up.weight":
                w.add(name, rng.standard_normal(tt.shape).astype(np.float32), "F32")
            else:
                w.add_raw(name, tt.format, tt.shape, tt.raw)
    w.close()
    out = tmp_path / "latent-tq2.gguf"
    quantize_file(src, out, "TQ2_0")
    with lowbit.gguf.open(src) as a, lowbit.gguf.open(out) as b:
        lat = a.tensors["blk.0.ffn_up.weight"].raw.view(np.float32).reshape(a.tensors["blk.0.ffn_up.weight"].shape)
        got = _deq(b.tensors["blk.0.ffn_up.weight"])
        assert np.array_equal(np.sign(got), np.sign(absmean_ternary(lat)))
