"""`lowbit quantize` and the GGUF writer: what a rewritten file holds, checked against the
source file, gguf-py's and ggml's own quantizers, and llama.cpp loading it."""
import subprocess
import sys

import numpy as np
import pytest

from lowbit import gguf, kernels
from lowbit.quantize import quantize_file
from lowbit.synth import synth_dense
from lowbit.writer import Writer, quantize_tensor


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A small dense model: Q8_0 matrices, F32 embedding, rows of 256 (every block size divides)."""
    return synth_dense(tmp_path_factory.mktemp("q") / "src.gguf", layers=2, dim=256, ffn=512, wtype="Q8_0")


def _floats(t):
    return kernels.dequantize(t.format, t.matrix(), t.n, w_scale=t.w_scale if t.format.tensor_pad else None)


@pytest.mark.parametrize("wtype", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K", "TQ2_0", "I2_S"])
def test_quantize_each_matrix_is_the_quantizer_of_the_source_floats(src, tmp_path, wtype):
    out = tmp_path / f"out-{wtype}.gguf"
    types = quantize_file(src, out, wtype)
    with gguf.open(src) as a, gguf.open(out) as b:
        assert list(a.tensors) == list(b.tensors)
        for name, ta in a.tensors.items():
            tb = b.tensors[name]
            assert tb.shape == ta.shape, name
            assert tb.format.name == types[name], name
            if len(ta.shape) == 1:
                assert tb.format.name == ta.format.name and bytes(tb.raw) == bytes(ta.raw), name
                continue
            assert tb.format.name == wtype, name
            # the bytes are exactly what the quantizer makes of the source's floats
            want = np.asarray(quantize_tensor(wtype, _floats(ta))).reshape(-1)
            got = np.asarray(tb.raw).reshape(-1)
            assert np.array_equal(got, want), f"{name}: {np.count_nonzero(got != want)} bytes differ"
        # the metadata is copied with its types (only the file type changes)
        for k, v in a.metadata.items():
            if k != "general.file_type":
                assert b.metadata[k] == v, k
                assert b.metadata_types[k] == a.metadata_types[k], k


def test_gguf_py_and_ggml_quantizers_agree_where_both_exist():
    """writer.quantize_tensor takes gguf-py's quantizer for Q4_0/Q8_0; ggml's must give the same bytes."""
    from lowbit.ggml_oracle import ggml
    w = np.random.default_rng(1).standard_normal((16, 512)).astype(np.float32)
    for fmt in ("Q4_0", "Q8_0", "Q5_1"):
        assert np.array_equal(quantize_tensor(fmt, w).reshape(16, -1), ggml().quantize(fmt, w)), fmt


def test_same_format_is_copied_byte_for_byte(src, tmp_path):
    out = tmp_path / "same.gguf"
    quantize_file(src, out, "Q8_0", embd_type="F32")
    with gguf.open(src) as a, gguf.open(out) as b:
        for name, ta in a.tensors.items():
            assert bytes(b.tensors[name].raw) == bytes(ta.raw), name


def test_rows_that_are_not_whole_blocks_keep_their_format(tmp_path):
    src = synth_dense(tmp_path / "odd.gguf", layers=1, dim=96, ffn=192, heads=2, kv_heads=1, wtype="Q8_0")
    out = tmp_path / "odd-q4k.gguf"
    types = quantize_file(src, out, "Q4_K")  # 96 and 192 are not multiples of 256
    assert types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["blk.0.ffn_down.weight"] == "Q8_0"


def test_llama_cpp_runs_the_rewritten_file_like_lowbit(src, tmp_path):
    """The F16 rewrite of a model: llama.cpp loads it and its logits match lowbit's."""
    import lowbit
    from lowbit import peer
    out = tmp_path / "f16.gguf"
    quantize_file(src, out, "F16")
    m = lowbit.load(out)
    ids = m.tokenize("The quick brown fox jumps over the lazy dog")
    ours = m.logits(ids)
    llm = peer.Llama(str(out), n_ctx=64, logits_all=True, verbose=False)
    llm.eval(ids)
    theirs = np.array(llm.scores[:len(ids)])
    assert np.abs(ours - theirs).max() < 0.05 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.9


def test_i2_s_tensor_round_trip_through_the_writer(tmp_path):
    """An I2_S tensor (type 36, unknown to gguf-py) written by Writer reads back with its scale."""
    rng = np.random.default_rng(2)
    codes = rng.integers(-1, 2, size=(8, 256)).astype(np.float32)
    w = Writer(tmp_path / "i2s.gguf", "llama")
    w.add("t", codes * 0.25, "I2_S")
    w.close()
    with gguf.open(tmp_path / "i2s.gguf") as f:
        t = f.tensors["t"]
        assert t.format.name == "I2_S" and t.shape == (8, 256)
        assert t.w_scale == pytest.approx(0.25)
        assert np.array_equal(_floats(t), codes * np.float32(0.25))


@pytest.mark.parametrize("argv, problem", [
    (["--type", "Q8_K"], "not a weight format"),
    (["--type", "Q9_9"], "unknown format"),
])
def test_quantize_cli_bad_requests_are_one_line_errors(src, tmp_path, argv, problem):
    r = subprocess.run([sys.executable, "-m", "lowbit.cli", "quantize", str(src), str(tmp_path / "x.gguf"), *argv],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert problem in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.part").exists()


def test_quantize_refuses_to_overwrite_its_input(src):
    with pytest.raises(ValueError, match="same file"):
        quantize_file(src, src, "F16")
