"""`lowbit quantize` against llama.cpp's own llama_model_quantize (llama-cpp-python, tests only):
the same source file and file type must give every tensor the same format and the same bytes.
lowbit runs in a child process in which llama_cpp cannot be imported, which proves the runtime
does not borrow llama.cpp's quantizers."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from lowbit import gguf
from lowbit.imatrix import Imatrix, Stats, save_gguf, save_legacy
from lowbit.quantize import MIXES
from lowbit.synth import small_vocab, synth_dense, synth_moe

llama_cpp = pytest.importorskip("llama_cpp")  # the oracle; the rest of the suite needs it too

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
# imports lowbit's CLI with llama_cpp made unimportable (sys.modules[name] = None -> ImportError)
BLOCKED = ("import sys; sys.modules['llama_cpp'] = None; from lowbit.cli import main; "
           "sys.exit(main(sys.argv[1:]))")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("qll")
    vocab = small_vocab()
    return {
        # 8 layers: the mixes' "first / last eighth" and every-third-layer upgrades all occur
        "dense": synth_dense(d / "dense.gguf", layers=8, dim=256, ffn=256, heads=8, kv_heads=2, wtype="F16",
                             embd_type="F16", vocab=vocab, seed=1),
        # rows of 320 are not whole 256-blocks: llama.cpp's fallbacks (Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_0)
        "odd": synth_dense(d / "odd.gguf", layers=3, dim=320, ffn=640, heads=5, kv_heads=5, wtype="F16",
                           embd_type="F32", tied=True, vocab=vocab, seed=2),
    }


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    d = tmp_path_factory.mktemp("qllm")
    return synth_moe(d / "moe.gguf", arch="qwen3moe", layers=2, dim=256, experts=8, top_k=2, expert_ffn=256,
                     wtype="F16", expert_type="F16", embd_type="F16", head_type="F16", seed=3,
                     vocab=small_vocab())


def llama_quantize(src, dst, mix, imatrix: dict | None = None, **params):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = MIXES[mix][0]
    p.nthread = 2
    for k, v in params.items():
        setattr(p, k, v)
    keep = []
    if imatrix is not None:
        class Entry(ctypes.Structure):
            _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.POINTER(ctypes.c_float)), ("size", ctypes.c_size_t)]
        arr = (Entry * (len(imatrix) + 1))()
        for i, (name, v) in enumerate(sorted(imatrix.items())):
            v = np.ascontiguousarray(v, dtype=np.float32)
            keep.append(v)
            arr[i] = Entry(name.encode(), v.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), v.size)
        arr[len(imatrix)] = Entry(None, None, 0)
        keep.append(arr)
        p.imatrix = ctypes.cast(arr, type(p.imatrix))
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p)) == 0


def lowbit_quantize(src, dst, mix, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([p for p in sys.path if p]))
    r = subprocess.run([sys.executable, "-c", BLOCKED, "quantize", str(src), str(dst), mix, "-q", *args],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r


def assert_same_tensors(ours, theirs):
    with gguf.open(ours) as a, gguf.open(theirs) as b:
        assert set(a.tensors) == set(b.tensors)
        bad = []
        for name, ta in a.tensors.items():
            tb = b.tensors[name]
            if ta.format.name != tb.format.name:
                bad.append(f"{name}: lowbit {ta.format.name}, llama.cpp {tb.format.name}")
            elif bytes(ta.raw) != bytes(tb.raw):
                diff = np.count_nonzero(np.asarray(ta.raw).reshape(-1) != np.asarray(tb.raw).reshape(-1))
                bad.append(f"{name} ({ta.format.name}): {diff} bytes differ")
        assert not bad, "\n".join(bad)
        assert list(a.tensors) == list(b.tensors)  # llama.cpp's order (by layer, then name)
        assert a.metadata["general.file_type"] == b.metadata["general.file_type"]


# the six mixes and two more on the 8-layer file; on the file of 320-value rows the mixes
# whose formats fall back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL, Q3_K -> Q4_0)
CASES = [("dense", m) for m in ("Q4_K_M", "Q5_K_S", "Q6_K", "IQ4_XS", "Q8_0", "Q3_K_M", "Q2_K", "Q4_0")] + \
        [("odd", m) for m in ("Q4_K_M", "Q3_K_M", "IQ4_XS", "Q5_K_S")]


@pytest.mark.parametrize("model, mix", CASES)
def test_mix_equals_llama_model_quantize(models, tmp_path, mix, model):
    src = models[model]
    llama_quantize(src, tmp_path / "llama.gguf", mix)
    lowbit_quantize(src, tmp_path / "lowbit.gguf", mix)
    assert_same_tensors(tmp_path / "lowbit.gguf", tmp_path / "llama.gguf")


@pytest.mark.parametrize("mix", ["Q4_K_M", "IQ4_XS", "Q3_K_L"])
def test_moe_mix_equals_llama_model_quantize(moe, tmp_path, mix):
    llama_quantize(moe, tmp_path / "llama.gguf", mix)
    lowbit_quantize(moe, tmp_path / "lowbit.gguf", mix)
    assert_same_tensors(tmp_path / "lowbit.gguf", tmp_path / "llama.gguf")


@pytest.mark.parametrize("mix, kw, args", [
    ("Q4_K_M", dict(pure=True), ["--pure"]),
    ("Q5_K_M", dict(output_tensor_type=8, token_embedding_type=12), ["--output-type", "Q8_0",
                                                                     "--token-embedding-type", "Q4_K"]),
    ("Q6_K", dict(quantize_output_tensor=False), ["--leave-output-tensor"]),
])
def test_options_equal_llama_model_quantize(models, tmp_path, mix, kw, args):
    llama_quantize(models["dense"], tmp_path / "llama.gguf", mix, **kw)
    lowbit_quantize(models["dense"], tmp_path / "lowbit.gguf", mix, *args)
    assert_same_tensors(tmp_path / "lowbit.gguf", tmp_path / "llama.gguf")


def _random_imatrix(path, rng):
    """Weights for every matrix of the file, as sums and counts (some experts never seen)."""
    im = Imatrix(datasets=["random.txt"], chunk_count=3, chunk_size=512)
    with gguf.open(path) as f:
        for name, t in f.tensors.items():
            if len(t.shape) < 2 or not name.startswith("blk."):
                continue
            n_mat = t.shape[0] if len(t.shape) == 3 else 1
            sums = (rng.standard_normal((n_mat, t.n)) ** 2 * 50).astype(np.float32)
            counts = rng.integers(1, 400, n_mat).astype(np.int64)
            if n_mat > 1:
                counts[1] = 0  # an expert no token reached: llama-quantize weighs it with ones
            im.entries[name] = Stats(sums, counts)
    return im


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
@pytest.mark.parametrize("mix", ["Q4_K_M", "IQ4_XS", "Q3_K_M", "Q5_0"])
def test_imatrix_mix_equals_llama_model_quantize(models, moe, tmp_path, fmt, mix):
    # the MoE file (per-expert weights) in the GGUF format; the legacy .dat keeps one count per
    # matrix, so it gets the dense file
    src = moe if mix == "IQ4_XS" and fmt == "gguf" else models["dense"]
    im = _random_imatrix(src, np.random.default_rng(7))
    path = tmp_path / f"imatrix.{fmt}"
    (save_gguf if fmt == "gguf" else save_legacy)(im, path)
    from lowbit.imatrix import read_imatrix
    weights = read_imatrix(path)  # what llama-quantize would load from the file (checked below)
    llama_quantize(src, tmp_path / "llama.gguf", mix, imatrix=weights)
    lowbit_quantize(src, tmp_path / "lowbit.gguf", mix, "--imatrix", str(path))
    assert_same_tensors(tmp_path / "lowbit.gguf", tmp_path / "llama.gguf")


def test_imatrix_files_normalise_as_llama_quantize():
    """GGUF: sums / count per expert (an expert with no tokens: ones); legacy: (sum/count*ncall)/ncall."""
    rng = np.random.default_rng(1)
    sums = rng.random((3, 64)).astype(np.float32) * 10
    im = Imatrix(entries={"blk.0.ffn_up_exps.weight": Stats(sums, np.array([4, 0, 7]))}, chunk_size=512)
    w = im.weights()["blk.0.ffn_up_exps.weight"].reshape(3, 64)
    assert np.array_equal(w[0], sums[0] / np.float32(4))
    assert np.array_equal(w[1], np.ones(64, np.float32))
    assert np.array_equal(w[2], sums[2] / np.float32(7))


# The grid i-quants' mixes need an importance matrix (llama-quantize refuses them without one).
# IQ2_XS and IQ3_XXS on both files (the 320-value rows fall back to IQ4_NL), the others on the
# 8-layer file.
GRID_CASES = [("dense", "IQ2_XS"), ("dense", "IQ3_XXS"), ("odd", "IQ2_XS"), ("odd", "IQ3_XXS")] + \
             [("dense", m) for m in ("IQ2_XXS", "IQ2_S", "IQ2_M", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ1_S", "IQ1_M")]


@pytest.mark.parametrize("model, mix", GRID_CASES)
def test_grid_iquant_mix_with_imatrix_equals_llama_model_quantize(models, tmp_path, model, mix):
    src = models[model]
    rng = np.random.default_rng(11)
    im = _random_imatrix(src, rng)
    with gguf.open(src) as f:  # llama-imatrix also collects the output head's activations
        if "output.weight" in f.tensors:
            n = f.tensors["output.weight"].n
            im.entries["output.weight"] = Stats((rng.standard_normal((1, n)) ** 2 * 50).astype(np.float32),
                                                np.array([300]))
    path = tmp_path / "imatrix.gguf"
    save_gguf(im, path)
    from lowbit.imatrix import read_imatrix
    llama_quantize(src, tmp_path / "llama.gguf", mix, imatrix=read_imatrix(path))
    lowbit_quantize(src, tmp_path / "lowbit.gguf", mix, "--imatrix", str(path))
    assert_same_tensors(tmp_path / "lowbit.gguf", tmp_path / "llama.gguf")


@pytest.mark.parametrize("mix", ["IQ2_XS", "IQ1_M", "IQ3_XXS"])
def test_grid_iquant_mix_without_imatrix_is_a_usage_error(models, tmp_path, mix):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([p for p in sys.path if p]))
    r = subprocess.run([sys.executable, "-c", BLOCKED, "quantize", str(models["dense"]), str(tmp_path / "o.gguf"),
                        mix, "-q"], capture_output=True, text=True, env=env)
    assert r.returncode == 2, r.stderr
    assert "needs an importance matrix" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.gguf").exists()
