"""`lowbit quantize` and the GGUF writer: what a rewritten file holds, checked against the
source file, gguf-py's and ggml's own quantizers, and llama.cpp loading it."""
import os
import subprocess
import sys

import numpy as np
import pytest

from lowbit import gguf, kernels
from lowbit.quantize import quantize_file
from lowbit.synth import small_vocab, synth_dense
from lowbit.writer import Writer


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A small dense model: F16 matrices, F32 embedding, rows of 256 (every block size divides)."""
    return synth_dense(tmp_path_factory.mktemp("q") / "src.gguf", layers=2, dim=256, ffn=512, wtype="F16",
                       vocab=small_vocab())


@pytest.fixture(scope="module")
def src_q8(tmp_path_factory):
    """The same shape with Q8_0 matrices: a quantized source."""
    return synth_dense(tmp_path_factory.mktemp("q8") / "src.gguf", layers=2, dim=256, ffn=512, wtype="Q8_0",
                       vocab=small_vocab())


def _floats(t):
    return kernels.dequantize(t.format, t.matrix(), t.n, w_scale=t.w_scale if t.format.tensor_pad else None)


@pytest.mark.parametrize("mix, fmt", [("F16", "F16"), ("BF16", "BF16"), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_0"),
                                      ("Q4_1", "Q4_1"), ("Q5_0", "Q5_0"), ("Q4_K_M", "Q4_K"), ("Q6_K", "Q6_K"),
                                      ("Q3_K_S", "Q3_K"), ("IQ4_XS", "IQ4_XS")])
def test_pure_quantize_each_matrix_is_ggmls_quantizer_of_the_source_floats(src, tmp_path, mix, fmt):
    """--pure: every tensor llama.cpp quantizes (2+ dims, a name ending in weight, not a norm) in the
    file type's format, its bytes those of ggml_quantize_chunk on the source's floats."""
    from lowbit.ggml_oracle import ggml
    out = tmp_path / f"out-{mix}.gguf"
    types = quantize_file(src, out, mix, pure=True)
    with gguf.open(src) as a, gguf.open(out) as b:
        assert sorted(a.tensors) == sorted(b.tensors)
        assert list(b.tensors) == list(types)
        for name, ta in a.tensors.items():
            tb = b.tensors[name]
            assert tb.shape == ta.shape, name
            assert tb.format.name == types[name], name
            if len(ta.shape) == 1:
                assert tb.format.name == ta.format.name and bytes(tb.raw) == bytes(ta.raw), name
                continue
            assert tb.format.name == fmt, name
            want = ggml().quantize(fmt, _floats(ta)).reshape(-1)
            got = np.asarray(tb.raw).reshape(-1)
            assert np.array_equal(got, want), f"{name}: {np.count_nonzero(got != want)} bytes differ"
        # the metadata is copied with its types (the file type and quantization version are llama.cpp's)
        assert b.metadata["general.quantization_version"] == 2
        for k, v in a.metadata.items():
            if k not in ("general.file_type", "general.quantization_version"):
                assert b.metadata[k] == v, k
                assert b.metadata_types[k] == a.metadata_types[k], k


def test_mix_upgrades_follow_llama_cpps_rules(src, tmp_path):
    """Q4_K_M on a 2-layer file: llama.cpp's use_more_bits(i, 2) holds for layer 1 only (i >= 7*2/8),
    so attn_v and ffn_down are Q6_K there and Q4_K in layer 0; the head Q6_K, the rest Q4_K."""
    types = quantize_file(src, tmp_path / "m.gguf", "Q4_K_M")
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    for i, more in ((0, "Q4_K"), (1, "Q6_K")):
        assert types[f"blk.{i}.attn_v.weight"] == more
        assert types[f"blk.{i}.ffn_down.weight"] == more
        assert types[f"blk.{i}.attn_q.weight"] == "Q4_K"
        assert types[f"blk.{i}.ffn_up.weight"] == "Q4_K"
        assert types[f"blk.{i}.attn_norm.weight"] == "F32"


def test_same_format_is_copied_byte_for_byte(src, tmp_path):
    out = tmp_path / "same.gguf"
    quantize_file(src, out, "F16", embd_type="F32")
    with gguf.open(src) as a, gguf.open(out) as b:
        for name, ta in a.tensors.items():
            assert bytes(b.tensors[name].raw) == bytes(ta.raw), name


def test_rows_that_are_not_whole_blocks_fall_back_as_llama_cpp(tmp_path):
    src = synth_dense(tmp_path / "odd.gguf", layers=1, dim=96, ffn=192, heads=2, kv_heads=1, wtype="F16",
                      vocab=small_vocab())
    types = quantize_file(src, tmp_path / "odd-q4k.gguf", "Q4_K_S")  # 96, 192: not multiples of 256
    assert types["blk.0.attn_q.weight"] == "Q5_0"      # Q4_K -> Q5_0
    assert types["blk.0.attn_v.weight"] == "Q5_1"      # Q4_K_S's first attn_v: Q5_K -> Q5_1
    assert types["blk.0.ffn_down.weight"] == "Q5_0"    # 1 layer: no "first eighth" (1/8 = 0): Q4_K -> Q5_0
    assert types["output.weight"] == "Q8_0"            # the head: Q8_0 when rows are not whole blocks
    types = quantize_file(src, tmp_path / "odd-iq4.gguf", "IQ4_XS")
    assert types["blk.0.attn_q.weight"] == "IQ4_NL"


def test_a_quantized_source_needs_allow_requantize(src_q8, tmp_path):
    with pytest.raises(ValueError, match="already Q8_0.*--allow-requantize"):
        quantize_file(src_q8, tmp_path / "x.gguf", "Q4_K_M")
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.part").exists()
    types = quantize_file(src_q8, tmp_path / "y.gguf", "Q4_K_M", allow_requantize=True)
    assert types["blk.0.attn_q.weight"] == "Q4_K"
    # dequantizing to a float format is not requantizing
    types = quantize_file(src_q8, tmp_path / "z.gguf", "F16")
    assert types["blk.0.attn_q.weight"] == "F16"


def test_ternary_formats_refuse_weights_that_are_not_ternary(src, tmp_path):
    with pytest.raises(ValueError, match="not ternary.*--force"):
        quantize_file(src, tmp_path / "t.gguf", "TQ2_0")
    with pytest.raises(ValueError, match="not ternary.*--force"):
        quantize_file(src, tmp_path / "i.gguf", "I2_S")
    types = quantize_file(src, tmp_path / "t.gguf", "TQ2_0", force=True)
    assert types["blk.0.ffn_up.weight"] == "TQ2_0"


def test_ternary_model_converts_between_ternary_formats_without_loss(tmp_path):
    """The README's BitNet example: a TQ2_0 model to I2_S (lossless, no --allow-requantize)."""
    from lowbit.synth import synth_bitnet
    src = synth_bitnet(tmp_path / "b.gguf", arch="bitnet", wtype="TQ2_0", layers=1, dim=256, ffn=512, heads=4,
                       kv_heads=2)
    out = tmp_path / "b-i2s.gguf"
    types = quantize_file(src, out, "I2_S", embd_type="Q8_0")
    assert types["blk.0.ffn_up.weight"] == "I2_S" and types["token_embd.weight"] == "Q8_0"
    with gguf.open(src) as a, gguf.open(out) as b:
        for name in ("blk.0.ffn_up.weight", "blk.0.attn_q.weight"):
            assert np.array_equal(_floats(a.tensors[name]), _floats(b.tensors[name])), name


def test_llama_cpp_runs_the_rewritten_file_like_lowbit(tmp_path):
    """The Q8_0 rewrite of a model: llama.cpp loads it and its logits match lowbit's."""
    import lowbit
    from lowbit import peer
    src = synth_dense(tmp_path / "src.gguf", layers=1, dim=256, ffn=512, wtype="F16")  # the real vocabulary
    out = tmp_path / "q8.gguf"
    quantize_file(src, out, "Q8_0")
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
    (["--type", "Q4_K_M", "--output-type", "Q9_9"], "unknown format"),
    (["--type", "IQ2_XS"], "IQ2_XS"),
    (["--type", "TQ1_0"], "not ternary"),
])
def test_quantize_cli_bad_requests_are_one_line_errors(src, tmp_path, argv, problem):
    r = subprocess.run([sys.executable, "-m", "lowbit.cli", "quantize", str(src), str(tmp_path / "x.gguf"), *argv],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert problem in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.part").exists()


def test_quantize_refuses_to_overwrite_its_input(src):
    with pytest.raises(ValueError, match="same file"):
        quantize_file(src, src, "F16")


# the runtime commands with llama_cpp unimportable (sys.modules[name] = None -> ImportError)
BLOCKED = ("import sys; sys.modules['llama_cpp'] = None; from lowbit.cli import main; "
           "sys.exit(main(sys.argv[1:]))")


def _blocked(*argv):
    return subprocess.run([sys.executable, "-c", BLOCKED, *argv], capture_output=True, text=True)


def test_synth_quantize_imatrix_run_without_llama_cpp(tmp_path):
    m = tmp_path / "m.gguf"
    r = _blocked("synth", "dense", str(m), "--layers", "1", "--dim", "256", "--type", "F16")
    assert r.returncode == 0, r.stderr
    txt = tmp_path / "t.txt"
    txt.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    r = _blocked("imatrix", "-m", str(m), "-f", str(txt), "-o", str(tmp_path / "im.gguf"), "-c", "64", "-q")
    assert r.returncode == 0, r.stderr
    r = _blocked("quantize", str(m), str(tmp_path / "q.gguf"), "Q4_K_M", "--imatrix", str(tmp_path / "im.gguf"), "-q")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("argv", [["parity", "--formats", "Q4_0"], ["bench", "kernels", "--formats", "Q4_0"]])
def test_peer_commands_without_llama_cpp_say_so_and_exit_2(argv):
    env_dir = os.environ.pop("LOWBIT_GGML_LIB_DIR", None)
    try:
        r = _blocked(*argv)
    finally:
        if env_dir is not None:
            os.environ["LOWBIT_GGML_LIB_DIR"] = env_dir
    assert r.returncode == 2, r.stdout[-500:] + r.stderr
    assert "pip install llama-cpp-python" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
