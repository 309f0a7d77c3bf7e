"""The wide window (KernelEntry::wide, csrc/x86/legacy.inl rows_nt<F, 16>): avx512's legacy-format
row kernels at 16 tokens per pass over a row (four token-transposed chunks sharing each row's
decode and each broadcast code dword), for a chunk that takes no GEMM.

Its contract is the row kernels' at nt = 16 and its promise is bitwise theirs per token (I2: the
same integer sums per (token, block), the same float steps in the same class order), so:
  - every legacy format, widths of 1..65 blocks (class tails), 1..37 rows (the last row alone),
    16..40 tokens (the wide window, then windows of <= 8), one and two threads and a row
    sub-range (I3): bitwise matmul_act's windows of <= 8 (path 3);
  - rows long enough that the kernels go in slices of K (legacy.inl rows_sliced: the windows'
    records past 85% of L1D; 2304..14336 values, 71 rows: three tiles of 32, the last partial):
    the wide window and every window size 1..8 bitwise the same kernels unsliced (the same rows
    cut into lengths that need no slice are not the same sums, so the check is against windows
    of other sizes, which slice elsewhere or not at all, and against the reference within I5);
  - extreme codes and activations (every sum an exact integer): exactly ggml's vec_dot;
  - the counters name the kernel that ran (nt = 16); LOWBIT_NO_WIDE=1 removes it (a subprocess);
  - the engine: the default model's logits for a prompt in chunks of 16 and 20 tokens (the wide
    window, its GEMM gate being 32) are bitwise the chunk-of-1 logits.
matmul_act's `path`: 1 the row kernels (the wide window where it takes), 3 windows of <= 8 only.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import FMA_LEVELS, LEVELS, assert_bitwise, legacy_extremes

from lowbit import kernels as K
from lowbit._native import lib
from lowbit.formats import BY_NAME as F

FORMATS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4"]
ISA = list(lib.isa_names())
WIDE_LEVELS = [lv for lv in LEVELS if lv == "avx512"]  # the levels with a wide window (written here)
NEEDS = pytest.mark.skipif(not WIDE_LEVELS, reason="the wide window is avx512's: needs CPU flags avx512f avx512bw "
                                                   "avx512vl avx512_vnni and LOWBIT_MAX_ISA >= avx512")


def mm(name, raw, act, n, level, path, threads=1, r0=0, r1=None):
    rows = raw.shape[0]
    out = np.full((act.shape[0], rows), np.float32(-7.25))
    lib.matmul_act(F[name].id, raw, act, n, 1.0, out, r0, rows if r1 is None else r1, threads, ISA.index(level), path)
    return out


def check_same(got, want, what, name, n):
    assert_bitwise(got, want, what, f"{name}, {n // 32} blocks", "wide", "windows")


def test_levels_with_a_wide_window():
    act = {"Q4_1": "q8_1", "Q5_1": "q8_1"}
    for lv in LEVELS:
        for name in FORMATS + ["Q4_K", "Q6_K", "I2_S"]:
            w = lib.wide_kernel(F[name].id, ISA.index(lv))
            if lv in WIDE_LEVELS and name in FORMATS:
                want = f"rows16_{name.lower()}_{act.get(name, 'q8_0')}_avx512"
                assert w is not None and tuple(w) == (want, "avx512"), w
            else:
                assert w is None, (lv, name, w)


@NEEDS
@pytest.mark.parametrize("name", FORMATS)
def test_wide_bitwise_equals_windows(ggml, rng, name):
    level = WIDE_LEVELS[0]
    for nb in (1, 3, 8, 9, 18, 48, 65):
        n = nb * 32
        for rows in (1, 7, 37):
            w = rng.standard_normal((rows, n)).astype(np.float32)
            w[rows // 2, n // 3] = 30.0  # an outlier block
            raw = ggml.quantize(name, w)
            act = lib.quantize_act(F[F[name].act].id, (rng.standard_normal((40, n)) * 2.0).astype(np.float32),
                                   ISA.index(level))
            for nt in (16, 17, 23, 31, 40):
                want = mm(name, raw, act[:nt], n, level, 3)
                check_same(mm(name, raw, act[:nt], n, level, 1), want, f"nt={nt}, rows={rows}", name, n)
                if rows == 37 and nt in (16, 40):
                    check_same(mm(name, raw, act[:nt], n, level, 1, threads=2), want, f"nt={nt}, 2 threads", name, n)
                    got = mm(name, raw, act[:nt], n, level, 1, r0=5, r1=30)
                    check_same(got[:, 5:30], want[:, 5:30], f"nt={nt}, rows 5..29", name, n)


@NEEDS
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("pattern", [0xFF, 0x00, 0xAA, "random"])
def test_wide_exact_at_the_extremes(ggml, rng, name, pattern):
    """Extreme codes under scales of 1 and activation codes of +-127 (every d_a = 1): each sum is
    an exact integer, so the wide window equals ggml's vec_dot exactly (I1)."""
    level = WIDE_LEVELS[0]
    f = F[name]
    rows, nb = 5, 19
    raw = legacy_extremes(rng, name, rows, nb, pattern)
    n = 32 * nb
    q = np.full(n, 127.0)
    alt = np.where(np.arange(n) % 2, 127.0, -127.0)
    mixed = np.where(np.arange(n) % 32 == 0, 127.0, rng.integers(-127, 128, n))
    x = np.stack([q, -q, alt, -alt, mixed, -mixed, q[::-1], mixed[::-1]] * 2).astype(np.float32)  # 16 tokens
    act = lib.quantize_act(F[f.act].id, x, 0)
    ref = ggml.vec_dot(name, raw, act, n).astype(np.float32)
    np.testing.assert_array_equal(mm(name, raw, act, n, level, 1), ref, err_msg=f"{name}/{pattern}")


@NEEDS
def test_counters():
    level = WIDE_LEVELS[0]
    n = 256
    raw = np.zeros((9, n // 32 * F["Q4_1"].bytes), np.uint8)
    act = lib.quantize_act(F["Q8_1"].id, np.ones((20, n), np.float32), ISA.index(level))
    K.reset_stats()
    mm("Q4_1", raw, act, n, level, 1)  # 16 + 4
    mm("Q4_1", raw, act, n, level, 3)  # 8 + 8 + 4
    ran = sorted({(s["nt"], s["calls"], s["kernel"]) for s in K.stats() if s["format"] == "Q4_1"})
    win = lib.kernel(F["Q4_1"].id, 8, ISA.index(level))[0]
    assert ran == [(4, 2, win), (8, 2, win), (16, 1, "rows16_q4_1_q8_1_avx512")], ran


_CHILD = r"""
import json
from lowbit._native import lib
from lowbit.formats import BY_NAME as F
print(json.dumps({"wide": lib.wide_kernel(F["Q4_0"].id), "disabled": lib.cpu_info()["disabled"]}))
"""


@NEEDS
def test_switched_off():
    if lib.cpu_info()["selected"] not in WIDE_LEVELS:
        pytest.skip("the dispatched level is below avx512 (LOWBIT_MAX_ISA)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWBIT_NO_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    res = {}
    for tag, extra in (("on", {}), ("off", {"LOWBIT_NO_WIDE": "1"})):
        p = subprocess.run([sys.executable, "-c", _CHILD], env={**env, **extra}, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        res[tag] = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["on"]["wide"][0] == "rows16_q4_0_q8_0_avx512" and "wide" not in res["on"]["disabled"], res
    assert res["off"]["wide"] is None and "wide" in res["off"]["disabled"], res


@NEEDS
def test_engine_chunks_through_the_wide_window():
    import lowbit
    if lib.cpu_info()["selected"] not in WIDE_LEVELS:
        pytest.skip("the dispatched level is below avx512 (LOWBIT_MAX_ISA)")
    m = lowbit.load(None, n_ctx=128, threads=2)  # the default model: Q4_1 layers, a Q8_0 head
    ids = (m.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole.",
                      add_bos=False) * 4)[:40]
    m.reset()
    base = m.logits(ids, chunk=1)
    for chunk in (16, 20):
        m.reset()
        K.reset_stats()
        got = m.logits(ids, chunk=chunk)
        ran = {s["kernel"] for s in K.stats() if s["nt"] == 16}
        # (the layers' and the head's R8 layouts' wide windows where the engine repacked them)
        want = {"rows16_q4_1_q8_1_avx512", "rows16_q8_0_q8_0_avx512"}
        for fmt in K.repacked_layouts():
            want = {w.replace(f"rows16_{fmt.lower()}_", f"rows16_{fmt.lower()}_r8_") for w in want}
        assert ran == want, ran
        bad = np.argwhere(got.view(np.uint32) != base.view(np.uint32))
        assert bad.size == 0, f"chunk {chunk}: position {bad[0][0]} differs from chunk 1"


# Rows whose window records pass 85% of L1D go in slices of K (legacy.inl rows_sliced). For every
# window size the kernel with slices must give the unsliced kernel's floats; there is no unsliced
# kernel to call at these widths, so: the window sizes, which slice at different widths (at 48 KB
# of L1D at avx512: 16 tokens above 2048 values, 8 above 4096, 5 above 6656, 1 not below 33K; the
# avx2 levels' records differ), agree bitwise with each other and with ggml within I5. At every
# level with the window kernels' FMA arithmetic (the levels agree bitwise: test_legacy_simd).
@pytest.mark.parametrize("level", [lv for lv in FMA_LEVELS if lv in ("avx2", "avx2vnni", "avx512")])
@pytest.mark.parametrize("name", FORMATS)
def test_long_rows_in_slices_bitwise(ggml, rng, name, level):
    for n in (2304, 4128, 14336):
        rows = 71
        w = rng.standard_normal((rows, n)).astype(np.float32)
        w[3, n - 5] = 25.0  # an outlier in the last slice
        raw = ggml.quantize(name, w)
        act = lib.quantize_act(F[F[name].act].id, (rng.standard_normal((16, n)) * 2.0).astype(np.float32),
                               ISA.index(level))
        one = np.concatenate([mm(name, raw, act[t:t + 1], n, level, 3) for t in range(16)])
        runs = [(nt, 3) for nt in (2, 4, 5, 8)] + ([(16, 1)] if level in WIDE_LEVELS else [])
        for nt, path in runs:
            got = mm(name, raw, act[:nt], n, level, path)
            check_same(got, one[:nt], f"n={n}, {nt} tokens, path {path}, {level}", name, n)
        ref = ggml.vec_dot(name, raw, act, n)
        np.testing.assert_allclose(one, ref, rtol=0, atol=1e-5 * np.abs(ref).max())
