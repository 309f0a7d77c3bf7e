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
# The i-quants with grid searches (csrc/quant/iq2_iq3.cpp, iq1.cpp). ggml_quantize_chunk asserts
# an importance matrix for the first three (ggml_quantize_requires_imatrix); the others take
# none too. ggml aborts on non-finite values in them: lowbit refuses those (tested below).
GRID = ["IQ2_XS", "IQ3_XXS", "IQ2_XXS", "IQ3_S", "IQ2_S", "IQ1_S", "IQ1_M"]
GGML_REQUIRES_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
GRID_CASES = [pytest.param(f, im, id=f"{f}-{'imatrix' if im else 'plain'}") for f in GRID
              for im in ((True,) if f in GGML_REQUIRES_IMATRIX else (False, True))]


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


# ---- the grid i-quants ------------------------------------------------------------------------
# Their searches are slow in ggml too: few, small rows (odd row counts, widths 256..4096).

@pytest.mark.parametrize("fmt, with_imatrix", GRID_CASES)
@pytest.mark.parametrize("rows, n", [(1, 256), (5, 768), (3, 4096)])
def test_grid_random_rows_equal_ggml(g, fmt, with_imatrix, rows, n):
    rng = np.random.default_rng(rows * 7919 + n)
    w = rng.standard_normal((rows, n)).astype(np.float32) * np.float32(0.02)
    w[:, rng.integers(0, n, 4)] *= 8  # a few larger columns, as real weights have
    _check(g, fmt, w, _imatrix(rng, n) if with_imatrix else None)


@pytest.mark.parametrize("fmt, with_imatrix", GRID_CASES)
def test_grid_worst_cases_equal_ggml(g, fmt, with_imatrix):
    n = 256
    rng = np.random.default_rng(5)
    im = _imatrix(rng, n) if with_imatrix else None
    cases = _worst_cases(n, rng)
    # heavy-tailed rows: many groups fall off the grid, the neighbour searches decide
    cases["heavy tails"] = (rng.standard_t(1.5, (3, n)) * 0.01).astype(np.float32)
    # one block of equal values: the sorts of IQ1 meet ties
    cases["equal values"] = np.tile(np.repeat(np.float32([0.5, -0.25, 0.0, 1.0]), 8), (2, n // 32))
    for name, w in cases.items():
        try:
            _check(g, fmt, w, im)
        except pytest.fail.Exception as e:
            pytest.fail(f"[{name}] {e}")


def test_grid_imatrix_of_all_ones_and_zeros_equal_ggml(g):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((3, 512)).astype(np.float32)
    for fmt in GRID:
        _check(g, fmt, w, np.ones(512, np.float32))
        _check(g, fmt, w, np.zeros(512, np.float32))


def test_grid_result_does_not_depend_on_the_thread_count():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((23, 512)).astype(np.float32)
    im = _imatrix(rng, 512)
    for fmt in ("IQ2_XS", "IQ3_XXS", "IQ1_M"):
        one = kernels.quantize(fmt, w, imatrix=im, threads=1)
        for th in (2, 5):
            assert np.array_equal(kernels.quantize(fmt, w, imatrix=im, threads=th), one), (fmt, th)


def test_imatrix_requirement_is_ggml_s(g):
    """lowbit asks for an importance matrix exactly where ggml_quantize_chunk asserts one."""
    for f in FORMATS + GRID:
        has, needs, uses = kernels.lib.quantizer_info(get_format(f).id)
        assert has and needs == g.requires_imatrix(f), f
    with pytest.raises(ValueError, match="IQ1_S needs an importance matrix"):
        kernels.quantize("IQ1_S", np.ones((2, 256), np.float32))


def _ggml_in_child(g, fmt, w, im):
    """ggml_quantize_chunk in a forked child (ggml may abort it): its bytes, or None if the child
    was killed by a signal. The parent has initialised ggml's grids, so the child does not."""
    g.quantize(fmt, np.ones((1, w.shape[1]), np.float32), imatrix=im)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: ggml only, then out without any Python cleanup
        try:
            import faulthandler
            import resource
            faulthandler.disable()  # an abort is expected: no traceback, no core file
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.environ["GGML_NO_BACKTRACE"] = "1"  # (else ggml_abort runs gdb on itself first)
            os.close(rfd)
            os.write(wfd, g.quantize(fmt, w, imatrix=im).tobytes())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        data = r.read()
    _, status = os.waitpid(pid, 0)
    return None if os.WIFSIGNALED(status) else np.frombuffer(data, np.uint8).reshape(w.shape[0], -1)


@pytest.mark.parametrize("fmt", GRID)
def test_grid_non_finite_or_overflowing_rows_as_ggml_or_refused(g, fmt):
    """Where ggml aborts the process (a grid search finds no grid point at a finite distance:
    inf, NaN, values whose square overflows), lowbit raises a one-line error naming the first
    such row; where ggml makes bytes, lowbit makes the same."""
    rng = np.random.default_rng(9)
    im = np.linspace(0.5, 2, 256, dtype=np.float32)
    aborted = 0
    for bad in (np.inf, -np.inf, np.nan, 1e30):
        w = rng.standard_normal((1, 256)).astype(np.float32)
        w[0, 17] = bad
        theirs = _ggml_in_child(g, fmt, w, im)
        if theirs is None:
            aborted += 1
            rows = np.concatenate([rng.standard_normal((2, 256)).astype(np.float32), w])  # the bad row is row 2
            with pytest.raises(ValueError, match=f"quantize: {fmt}: row 2: ") as e:
                kernels.quantize(fmt, rows, imatrix=im, threads=3)
            assert "\n" not in str(e.value)
        else:
            ours = kernels.quantize(fmt, w, imatrix=im).reshape(1, -1)
            if not np.array_equal(ours, theirs):
                pytest.fail(f"[{bad}] " + _first_diff(fmt, ours, theirs, 256))
    # the inputs do reach ggml's abort (IQ2_XXS and the IQ1 types make bytes of all four)
    assert aborted > 0 or fmt in ("IQ2_XXS", "IQ1_S", "IQ1_M")
