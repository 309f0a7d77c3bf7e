"""lowbit's own weight quantizers (csrc/quant/) against ggml's ggml_quantize_chunk (the
llama-cpp-python wheel's libggml-base, via lowbit.ggml_oracle): the bytes must be equal, for
every format, with and without an importance matrix, on random rows and on the worst cases.
On a mismatch the first differing block is printed with both decodings."""
import os

import numpy as np
import pytest

from lowbit import kernels
from lowbit.formats import get as get_format

FORMATS = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
           "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0"]
USES_IMATRIX = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}
# (format, with an importance matrix): the formats whose quantizer reads one, both ways
CASES = [pytest.param(f, im, id=f"{f}-{'imatrix' if im else 'plain'}") for f in FORMATS
         for im in ((False, True) if f in USES_IMATRIX else (False,))]


@pytest.fixture(scope="module")
def g():
    from lowbit.ggml_oracle import ggml
    return ggml()


def _first_diff(fmt, ours, theirs, n):
    """A message naming the first differing row and block, with both decodings of it."""
    f = get_format(fmt)
    rows = np.nonzero((ours != theirs).any(axis=1))[0]
    r = int(rows[0])
    bb = f.bytes
    col = int(np.nonzero(ours[r] != theirs[r])[0][0])
    blk = col // bb
    a = ours[r:r + 1, blk * bb:(blk + 1) * bb].copy()
    b = theirs[r:r + 1, blk * bb:(blk + 1) * bb].copy()
    da = kernels.dequantize(f, a, f.block)[0]
    db = kernels.dequantize(f, b, f.block)[0]
    return (f"{fmt}: {len(rows)} rows differ; first: row {r} block {blk} (byte {col})\n"
            f"  lowbit bytes {a[0].tolist()}\n  ggml   bytes {b[0].tolist()}\n"
            f"  lowbit decodes {np.array2string(da, precision=4, max_line_width=200)}\n"
            f"  ggml   decodes {np.array2string(db, precision=4, max_line_width=200)}")


def _check(g, fmt, w, imatrix=None, threads=None):
    w = np.ascontiguousarray(w, dtype=np.float32)
    ours = kernels.quantize(fmt, w, imatrix=imatrix, threads=threads).reshape(w.shape[0], -1)
    theirs = g.quantize(fmt, w, imatrix=imatrix)
    assert ours.shape == theirs.shape
    if not np.array_equal(ours, theirs):
        pytest.fail(_first_diff(fmt, ours, theirs, w.shape[1]))


def _imatrix(rng, n):
    # squared-activation-like weights: positive, spread over orders of magnitude, a few zeros
    im = (rng.standard_normal(n) ** 2 * np.exp(rng.normal(0, 1.5, n))).astype(np.float32)
    im[rng.integers(0, n, max(1, n // 64))] = 0.0
    return im


@pytest.mark.parametrize("fmt, with_imatrix", CASES)
@pytest.mark.parametrize("rows, n", [(1, 256), (7, 512), (33, 1024), (3, 4096)])
def test_random_rows_equal_ggml(g, fmt, with_imatrix, rows, n):
    rng = np.random.default_rng(rows * 7919 + n)
    w = rng.standard_normal((rows, n)).astype(np.float32) * np.float32(0.02)
    w[:, rng.integers(0, n, 4)] *= 8  # a few larger columns, as real weights have
    _check(g, fmt, w, _imatrix(rng, n) if with_imatrix else None)


def _worst_cases(n, rng):
    cases = {
        "zeros": np.zeros((2, n)),
        "constant": np.full((3, n), 0.37),
        "negative constant": np.full((2, n), -1.5),
        "one huge outlier": np.where(np.arange(n) == n // 3, 1e4, rng.standard_normal(n) * 1e-3)[None, :],
        "denormals": (rng.standard_normal((2, n)) * 1e-39),
        "tiny": rng.standard_normal((2, n)) * 1e-12,
        "large": rng.standard_normal((2, n)) * 3e4,
        "sparse": np.where(rng.random((3, n)) < 0.05, rng.standard_normal((3, n)), 0.0),
        "ternary": rng.integers(-1, 2, (3, n)) * 0.125,
        "half zero blocks": np.where((np.arange(n) // 32) % 2 == 0, rng.standard_normal(n), 0.0)[None, :],
        "ties": np.round(rng.standard_normal((2, n)) * 8) / 8,
    }
    return {k: v.astype(np.float32) for k, v in cases.items()}


@pytest.mark.parametrize("fmt, with_imatrix", CASES)
def test_worst_cases_equal_ggml(g, fmt, with_imatrix):
    n = 512
    rng = np.random.default_rng(5)
    im = _imatrix(rng, n) if with_imatrix else None
    for name, w in _worst_cases(n, rng).items():
        try:
            _check(g, fmt, w, im)
        except pytest.fail.Exception as e:
            pytest.fail(f"[{name}] {e}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_non_finite_values_equal_ggml(g, fmt):
    """ggml_quantize_chunk does not reject inf / NaN (llama.cpp validates the result later);
    lowbit makes the same bytes from them."""
    n = 256
    rng = np.random.default_rng(9)
    w = rng.standard_normal((4, n)).astype(np.float32)
    w[0, 5] = np.inf
    w[1, 17] = -np.inf
    w[2, 100] = np.nan
    w[3, :] = np.nan
    _check(g, fmt, w)


def test_formats_without_imatrix_use_ignore_it_as_ggml_does(g):
    rng = np.random.default_rng(6)
    w = rng.standard_normal((3, 256)).astype(np.float32)
    for fmt in sorted(set(FORMATS) - USES_IMATRIX):
        _check(g, fmt, w, _imatrix(rng, 256))


def test_imatrix_of_all_ones_and_zeros_equal_ggml(g):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 512)).astype(np.float32)
    for fmt in sorted(USES_IMATRIX):
        _check(g, fmt, w, np.ones(512, np.float32))
        _check(g, fmt, w, np.zeros(512, np.float32))


def test_result_does_not_depend_on_the_thread_count(g):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((67, 1024)).astype(np.float32)
    im = _imatrix(rng, 1024)
    for fmt in ("Q4_K", "IQ4_XS", "Q6_K"):
        one = kernels.quantize(fmt, w, imatrix=im, threads=1)
        for th in (2, 3, 8):
            assert np.array_equal(kernels.quantize(fmt, w, imatrix=im, threads=th), one), (fmt, th)


def test_bad_requests_are_one_line_errors():
    w = np.zeros((2, 100), np.float32)
    with pytest.raises(ValueError, match="multiple of the block size"):
        kernels.quantize("Q4_K", w)
    with pytest.raises(ValueError, match="importance matrix has 3 values"):
        kernels.quantize("Q4_0", np.zeros((2, 64), np.float32), imatrix=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="no quantizer for IQ2_XS|needs an importance matrix"):
        kernels.quantize("IQ2_XS", np.zeros((2, 256), np.float32))


def test_ggml_base_is_built_without_fma():
    """lowbit builds its quantizers with -ffp-contract=off; their bytes equal ggml's only if ggml's
    scalar quantizers are not contracted into FMA either. The wheel builds libggml-base for generic
    x86-64 (no FMA to contract into): if that ever changes this test says so first."""
    import shutil
    import subprocess
    from lowbit.ggml_oracle import _lib_dir
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    lib = os.path.join(_lib_dir(), "libggml-base.so")
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], capture_output=True, text=True).stdout
    assert "vfmadd" not in dis and "vfmsub" not in dis and "vfnmadd" not in dis
