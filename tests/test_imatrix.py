"""`lowbit imatrix` (llama.cpp's importance-matrix method) and its two file formats."""
import subprocess
import sys

import numpy as np
import pytest

from lowbit import gguf
from lowbit.imatrix import Imatrix, Stats, compute, load, read_imatrix, save_gguf, save_legacy
from lowbit.synth import synth_dense, synth_moe

TEXT = " ".join(f"Sentence number {i} says that the {w} is {c}." for i, (w, c) in
                enumerate([("sky", "blue"), ("grass", "green"), ("sun", "bright"), ("sea", "deep")] * 40))


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return synth_dense(tmp_path_factory.mktemp("im") / "d.gguf", layers=2, dim=256, ffn=512, wtype="Q8_0")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return synth_moe(tmp_path_factory.mktemp("imm") / "m.gguf", arch="qwen3moe", layers=1, dim=256, experts=4,
                     top_k=2, expert_ffn=256, wtype="Q8_0", expert_type="Q8_0", router_type="F32")


def _rmsnorm(x, w, eps):
    x = x.astype(np.float64)
    return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)) * w


def test_dense_sums_are_the_squared_matmul_inputs(dense):
    from lowbit.model import load as load_model
    im = compute(dense, TEXT, ctx=64, chunks=2)
    assert im.chunk_count == 2 and im.chunk_size == 64
    q = im.entries["blk.0.attn_q.weight"]
    assert q.counts.tolist() == [128]
    # q, k and v of a layer multiply the same input; gate and up too
    for a, b in (("attn_q", "attn_k"), ("attn_q", "attn_v"), ("ffn_gate", "ffn_up")):
        assert np.array_equal(im.entries[f"blk.1.{a}.weight"].sums, im.entries[f"blk.1.{b}.weight"].sums), (a, b)
    # layer 0's q input is rmsnorm(token embedding) * attn_norm: computed here from the file
    m = load_model(dense, n_ctx=64)
    ids = m.tokenize(TEXT)[:128]
    for c in (0, 64):
        if m.tokenizer.add_bos:
            ids[c] = m.tokenizer.bos_id
    with gguf.open(dense) as f:
        emb = np.asarray(f.tensors["token_embd.weight"].raw).view(np.float32).reshape(-1, 256)
        norm = np.asarray(f.tensors["blk.0.attn_norm.weight"].raw).view(np.float32)
        eps = f.metadata["llama.attention.layer_norm_rms_epsilon"]
    x = _rmsnorm(emb[ids], norm, eps)
    want = (x * x).sum(0)
    np.testing.assert_allclose(q.sums[0], want, rtol=1e-4)


def test_moe_sums_per_expert(moe):
    im = compute(moe, TEXT, ctx=64, chunks=2)
    g = im.entries["blk.0.ffn_gate_exps.weight"]
    assert g.sums.shape == (4, 256) and g.counts.sum() == 2 * 128  # top-2 of 128 tokens
    assert np.array_equal(im.entries["blk.0.ffn_up_exps.weight"].sums, g.sums)
    d = im.entries["blk.0.ffn_down_exps.weight"]
    assert d.sums.shape == (4, 256) and np.array_equal(d.counts, g.counts)
    # the router sees every token's FFN input once; the experts see each one K times in all
    router = im.entries["blk.0.ffn_gate_inp.weight"].sums[0]
    np.testing.assert_allclose(g.sums.sum(0), 2 * router, rtol=1e-5)


def test_files_round_trip_and_normalise(tmp_path):
    rng = np.random.default_rng(0)
    im = Imatrix(datasets=["t.txt"], chunk_count=5, chunk_size=512)
    im.entries["blk.0.attn_q.weight"] = Stats(rng.random((1, 64)).astype(np.float32) * 100, np.array([2560]))
    im.entries["blk.0.ffn_up_exps.weight"] = Stats(rng.random((3, 32)).astype(np.float32), np.array([10, 0, 7]))
    save_gguf(im, tmp_path / "a.gguf")
    back = load(tmp_path / "a.gguf")
    assert not back.legacy and back.chunk_count == 5 and back.chunk_size == 512 and back.datasets == ["t.txt"]
    for k, s in im.entries.items():
        assert np.array_equal(back.entries[k].sums, s.sums) and np.array_equal(back.entries[k].counts, s.counts)
    w = read_imatrix(tmp_path / "a.gguf")
    assert np.array_equal(w["blk.0.attn_q.weight"], im.entries["blk.0.attn_q.weight"].sums[0] / np.float32(2560))
    assert np.array_equal(w["blk.0.ffn_up_exps.weight"][32:64], np.ones(32, np.float32))
    # legacy: values stored as (sum / count) * ncall, read back / ncall (ncall = ceil(count / chunk))
    save_legacy(im, tmp_path / "a.dat")
    leg = load(tmp_path / "a.dat")
    assert leg.legacy and leg.chunk_count == 5 and leg.datasets == ["t.txt"]
    wl = read_imatrix(tmp_path / "a.dat")
    np.testing.assert_allclose(wl["blk.0.attn_q.weight"], w["blk.0.attn_q.weight"], rtol=1e-6)


def test_bad_files_are_one_line_errors(tmp_path):
    p = tmp_path / "junk.dat"
    p.write_bytes(b"\x05\x00\x00\x00\xff\xff")
    with pytest.raises(ValueError, match="junk.dat"):
        load(p)
    with pytest.raises(ValueError, match="cannot open"):
        load(tmp_path / "missing.gguf")


def test_cli_imatrix_then_quantize_with_it(dense, tmp_path):
    txt = tmp_path / "t.txt"
    txt.write_text(TEXT)
    out = tmp_path / "im.gguf"
    r = subprocess.run([sys.executable, "-m", "lowbit.cli", "imatrix", "-m", dense, "-f", str(txt), "-o", str(out),
                        "-c", "64", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert len(load(out).entries) == 2 * 7
    r = subprocess.run([sys.executable, "-m", "lowbit.cli", "quantize", dense, str(tmp_path / "q.gguf"), "Q4_K_M",
                        "--imatrix", str(out), "--allow-requantize", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "lowbit.cli", "imatrix", "-m", dense, "-f", str(tmp_path / "no.txt")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot read" in r.stderr and "Traceback" not in r.stderr
