"""BF16 rows on AMX-BF16 tiles: the amx level's windows and GEMM of BF16 (csrc/x86/bf16_tiles.inl).

At the amx level a BF16 matrix runs on tiles for every window (1..8 tokens) and chunk (the GEMM),
one arithmetic: activations rounded to bfloat16 (as ggml's BF16 matmuls round theirs), TDPBF16PS
over slices of 32 values in order. Here, on the hardware where the CPU has amx_bf16, else on the
emulator (LOWBIT_AMX=emulate, a model of TDPBF16PS that is not the hardware's bits: .ci/run runs
this file so):
  - within 1e-5 of the largest output of float64 on the same bf16 weights and bf16-rounded
    activations, and of ggml's vec_dot (bf16 x bf16) on the same bytes; within the documented bound
    of the level below's float32-activation windows (2^-8 of sum |w x|);
  - I2 / I8: a token's result is bitwise the same alone, in any window and in the GEMM, any chunk;
  - I3: any row range and two threads give the same bits and write nothing else;
  - dispatch: one kernel name for windows and GEMM; LOWBIT_NO_ROWS_BF16_BF16_AMX=1 leaves the level
    below's float windows (and no GEMM), LOWBIT_NO_GEMM=1 the tile windows only;
  - a BF16 model's logits are bitwise the same for any chunking of its prompt.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

ISA = {n: i for i, n in enumerate(lib.isa_names())}
BF16 = F["BF16"].id
TILES = "amx" in lib.levels() and lib.kernel(BF16, 1, ISA["amx"])[0] == "rows_bf16_bf16_amx"
pytestmark = pytest.mark.skipif(
    not TILES, reason="needs CPU flags amx_tile, amx_int8, amx_bf16 (or LOWBIT_AMX=emulate on an avx2 CPU)")


def encode(w):
    """float32 w -> bf16 row bytes (truncated) and the float64 values they hold."""
    raw = (np.ascontiguousarray(w, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return raw, (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def bf16_round(x):
    """float32 -> bfloat16 to nearest even (finite values), as float64."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
    return r.view(np.float32).astype(np.float64)


def run(raw, x, level="amx", threads=1, out=None, r0=0, r1=None):
    rows, n = raw.shape
    x = np.ascontiguousarray(x, np.float32)
    if out is None:
        out = np.zeros((x.shape[0], rows), np.float32)
    lib.matmul_act(BF16, raw.view(np.uint8), x.view(np.uint8), n, 1.0, out, r0, rows if r1 is None else r1,
                   threads, ISA[level])
    return out


def worst(ours, ref):
    t, r = np.unravel_index(np.argmax(np.abs(ours - ref)), ref.shape)
    return f"worst at token {t}, row {r}: {ours[t, r]!r} vs {ref[t, r]!r}"


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 100, 1000, 4096 + 5])
def test_against_float64_of_bf16_activations(rng, n):
    for rows in (1, 15, 16, 17, 37):
        raw, w64 = encode(rng.standard_normal((rows, n)))
        for nt in (1, 3, 8, 9, 16, 17, 40):
            x = rng.standard_normal((nt, n)).astype(np.float32)
            ours = run(raw, x)
            ref = bf16_round(x) @ w64.T
            err = np.abs(ours - ref).max()
            assert err <= 1e-5 * np.abs(ref).max(), f"n={n} rows={rows} nt={nt}: err {err:.3g}; {worst(ours, ref)}"


def test_against_ggml_vec_dot(ggml, rng):
    """ggml's BF16 vec_dot rounds its activations to bf16 as the tiles do (from_float BF16)."""
    for n in (64, 96 + 32, 2048):
        rows = 19
        raw, _ = encode(rng.standard_normal((rows, n)))
        x = rng.standard_normal((20, n)).astype(np.float32)
        ours = run(raw, x)
        theirs = ggml.vec_dot("BF16", raw.view(np.uint8), ggml.from_float("BF16", x), n)
        err = np.abs(ours - theirs).max()
        assert err <= 1e-5 * np.abs(theirs).max(), f"n={n}: err {err:.3g}; {worst(ours, theirs)}"


def test_bound_against_the_level_below(rng):
    """The level below (float32 activations, floatrows.inl) differs by the activations' rounding only:
    |tiles - below| <= 2^-8 * sum_k |w_k x_k| (2^-9 per value, and float32 accumulation on both sides)."""
    below = [lv for lv in lib.levels() if lv != "amx"][-1]
    for n in (33, 4096):
        raw, w64 = encode(rng.standard_normal((21, n)))
        x = rng.standard_normal((12, n)).astype(np.float32)
        ours, theirs = run(raw, x), run(raw, x, below)
        bound = 2.0 ** -8 * (np.abs(x.astype(np.float64)) @ np.abs(w64).T)
        assert np.all(np.abs(ours - theirs) <= bound), worst(ours, theirs)
        assert not np.array_equal(ours, theirs)  # (the tiles did run: another arithmetic)


def test_width_and_tier_invariance(rng):
    """I2 and I8: every token's bits alone (a window of 1, one B column) equal its bits in windows of
    2..8 and in the GEMM's blocks of 16 tokens, from any first token, with rows and n that leave
    short groups and a short last slice."""
    for n, rows in ((13, 7), (32 * 5 + 9, 21), (3 * 1024 + 5, 37)):
        raw, _ = encode(rng.standard_normal((rows, n)))
        x = rng.standard_normal((40, n)).astype(np.float32)
        alone = np.concatenate([run(raw, x[t:t + 1]) for t in range(40)])
        for nt in list(range(2, 10)) + [16, 17, 33, 40]:
            for t0 in range(0, 40 - nt + 1, 7):
                win = run(raw, x[t0:t0 + nt])
                bad = np.flatnonzero(win.view(np.uint32) != alone[t0:t0 + nt].view(np.uint32))
                assert bad.size == 0, f"n={n}: nt={nt} at {t0}, first (token, row) {np.unravel_index(bad[0], win.shape)}"


def test_split_invariance(rng):
    """I3: every row range [r0, r1) gives the rows' bits of the full run and writes nothing else."""
    n, rows = 32 * 3 + 5, 53
    raw, _ = encode(rng.standard_normal((rows, n)))
    for nt in (1, 5, 8, 20):
        x = rng.standard_normal((nt, n)).astype(np.float32)
        full = run(raw, x)
        for r0 in range(0, rows, 5):
            for r1 in range(r0, rows + 1, 9):
                out = np.full((nt, rows), np.float32(-7.25))
                run(raw, x, out=out, r0=r0, r1=r1)
                assert np.array_equal(out[:, r0:r1].view(np.uint32), full[:, r0:r1].view(np.uint32)), (nt, r0, r1)
                assert np.all(out[:, :r0] == np.float32(-7.25)) and np.all(out[:, r1:] == np.float32(-7.25))
        assert np.array_equal(run(raw, x, threads=2).view(np.uint32), full.view(np.uint32))


def test_nonfinite_and_subnormal(rng):
    """inf / NaN weights and activations give inf / NaN where float64 does; subnormal bf16 values
    count as zero on the tiles (TDPBF16PS's DAZ: a documented departure from the float windows)."""
    n, rows = 32 * 2 + 7, 6
    w = rng.standard_normal((rows, n)).astype(np.float32)
    w[0] = 5e-39 * np.sign(w[0])  # subnormal in bf16
    w[1, 5] = np.inf
    w[2, n - 1] = -np.inf  # in the last, short slice
    w[3, 3] = np.nan
    raw, w64 = encode(w)
    x = rng.standard_normal((3, n)).astype(np.float32)
    x[2, 7] = np.nan
    ours = run(raw, x)
    with np.errstate(invalid="ignore"):
        ref = bf16_round(x) @ np.where(np.abs(w64) < 1.2e-38, 0.0, w64).T
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(ours) & (ours > 0), np.isinf(ref) & (ref > 0))
    finite = np.isfinite(ref)
    assert np.abs(ours[finite] - ref[finite]).max() <= 1e-5 * np.abs(ref[finite]).max()
    assert np.all(ours[:2, 0] == 0)  # the row of subnormal weights, finite activations


def _child(code, **env):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


DISPATCH = """
import json
from lowbit._native import lib
from lowbit.formats import BY_NAME as F
a = lib.isa_names().index("amx"); i = F["BF16"].id
print(json.dumps({"rows": [list(lib.kernel(i, nt, a)) for nt in (1, 8)], "gemm": lib.gemm_kernel(i, a)}))
"""


def test_dispatch_and_switches():
    assert [lib.kernel(BF16, nt, ISA["amx"]) for nt in range(1, 9)] == [("rows_bf16_bf16_amx", "amx")] * 8
    assert lib.gemm_kernel(BF16, ISA["amx"]) == ("rows_bf16_bf16_amx", "amx", 9)
    below = [lv for lv in lib.levels() if lv != "amx"][-1]
    off = _child(DISPATCH, LOWBIT_NO_ROWS_BF16_BF16_AMX="1")
    assert off["rows"] == [[f"rows_bf16_f32_{below}", below]] * 2 and off["gemm"] is None, off
    nogemm = _child(DISPATCH, LOWBIT_NO_GEMM="1")
    assert nogemm["rows"] == [["rows_bf16_bf16_amx", "amx"]] * 2 and nogemm["gemm"] is None, nogemm


def test_bf16_model_any_chunking_bitwise(tmp_path):
    """A BF16 model at the amx level (selected here, or LOWBIT_AMX=emulate): the logits of a prompt
    are bitwise the same in chunks of 1, 7 and all at once (tiles in every window and the GEMM)."""
    from lowbit.model import load
    from lowbit.synth import synth_dense
    if lib.cpu_info()["selected"] != "amx":
        pytest.skip("the amx level is not the selected one (LOWBIT_MAX_ISA caps it)")
    p = synth_dense(str(tmp_path / "bf16.gguf"), layers=2, dim=128, ffn=320, heads=4, kv_heads=2,
                    wtype="BF16", embd_type="BF16", head_type="BF16", seed=3)
    m = load(p, n_ctx=128, threads=2)
    ids = list(np.random.default_rng(0).integers(3, 200, 45))
    lib.reset_stats()
    whole = m.logits(ids, chunk=300)
    ran = {(nt, k) for i, nt, k, c, r in lib.stats() if i == BF16}
    assert {k for _, k in ran} == {"rows_bf16_bf16_amx"} and 0 in {nt for nt, _ in ran}, ran  # (nt 0: the GEMM)
    assert np.array_equal(whole, m.logits(ids, chunk=1)) and np.array_equal(whole, m.logits(ids, chunk=7))


ROUNDING = """
import json, numpy as np
from lowbit._native import lib
from lowbit.formats import BY_NAME as F
# activations whose bf16 rounding is a tie (low 16 bits 0x8000: to even), just off a tie, or NaN;
# one-hot weight rows read each value back as the tiles rounded it
lo = np.array([0x8000, 0x7fff, 0x8001, 0x0000, 0xffff], np.uint32)
hi = np.array([0x3f80, 0x3f81, 0xbf80, 0xbf81, 0x4049, 0x7e7f, 0x0080], np.uint32)
bits = ((hi[:, None] << 16) | lo[None, :]).ravel()
n = 64
x = np.zeros((40, n), np.float32)
xb = x.view(np.uint32)
for t in range(40):
    xb[t, :] = np.roll(np.resize(bits, n), 3 * t)
x[5, 9] = np.nan
w = np.zeros((n, n), np.uint16)
w[np.arange(n), np.arange(n)] = 0x3f80  # bf16 1.0
out = np.zeros((40, n), np.float32)
lib.matmul_act(F["BF16"].id, w.view(np.uint8), x.view(np.uint8), n, 1.0, out, 0, n, 1, lib.isa_names().index("amx"))
print(json.dumps({"gemm": out.view(np.uint32).tolist()}))
"""


def test_activation_rounding_to_nearest_even_both_panel_builds():
    """The tiles see each activation rounded to bf16 to nearest, ties to even (ggml's fp32 -> bf16), NaN
    kept NaN: one-hot rows give the rounded values back, from the GEMM's vector-built panel (40 tokens)
    and from the scalar build (LOWBIT_BF16_PANEL=scalar), which must agree byte for byte."""
    vec = np.array(_child(ROUNDING)["gemm"], np.uint32)
    sca = np.array(_child(ROUNDING, LOWBIT_BF16_PANEL="scalar")["gemm"], np.uint32)
    assert np.array_equal(vec, sca)
    lo = np.array([0x8000, 0x7fff, 0x8001, 0x0000, 0xffff], np.uint32)
    hi = np.array([0x3f80, 0x3f81, 0xbf80, 0xbf81, 0x4049, 0x7e7f, 0x0080], np.uint32)
    bits = ((hi[:, None] << 16) | lo[None, :]).ravel()
    for t in range(40):
        src = np.roll(np.resize(bits, 64), 3 * t).astype(np.uint64)
        want = ((src + 0x7FFF + ((src >> 16) & 1)) >> 16 << 16).astype(np.uint32)  # ties to even
        got = vec[t]
        if t == 5:  # (a NaN activation: every one-hot row's sum has 0 x NaN in it)
            assert np.all(np.isnan(got.view(np.float32)))
            continue
        assert np.array_equal(got, want), f"token {t}: {[hex(v) for v in got[:8]]} vs {[hex(v) for v in want[:8]]}"
