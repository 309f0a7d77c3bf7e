"""The I2_S GEMM (KernelEntry::gemm) against the row kernels: csrc/x86/gemm.inl's gemm_i2s (tokens in
lanes: avx2, avx512, amx) and csrc/x86/ternary.inl's i2s_gemm (avx2vnni, and avx2 under LOWBIT_I2S_FOLD=1:
it decodes a tile of rows once into an L1 scratch and runs every 8-token window of the chunk through
the row kernels' own body, i2s_row). Each forms the same exact integer per row and token, so its output
must be BITWISE the row kernels' in windows of <= 8 tokens and the reference expression (I1, I2, I3):
  - every level x nt in {9, 13, 16, 17, 24, 33, 45, 64} (passes of 2 vectors and of 1, padded lanes)
    x odd row counts, random codes and activations,
    rows of 23 blocks (two avx2 fold groups of 10 + a tail of 3), one and two threads;
  - rows wider than the scratch (n > 16384: the GEMM falls back to the row kernels' windows);
  - the adversarial worst case (all codes 3, activations all +127 / all -128 / mixed) gives the
    exact int64 sum through the GEMM on every level, with the deferred fold and with
    LOWBIT_I2S_FOLD=1 (a subprocess: the variable is read once at import);
  - the counters name the GEMM (nt = 0) after a 64-token matmul that takes it, and the row
    kernel after an 8-token one; LOWBIT_I2S_GEMM_MIN_NT gates it, LOWBIT_NO_<name>=1 removes it.
matmul_act's `path` argument: 0 as dispatched, 1 row-kernel windows only, 2 the GEMM for any nt.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ALL_LEVELS, LEVELS, REFERENCE_LEVELS
from test_ternary_simd import ISA, act_patterns, i2s_expected, i8s_rows, same_bits, weight_patterns

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

I2S = F["I2_S"].id
# (the amx level too: its I2_S GEMM takes tile products)
GEMM_LEVELS = [lv for lv in ALL_LEVELS if lib.gemm_kernel(I2S, ISA.index(lv)) is not None]
NTS = [9, 13, 16, 17, 24, 33, 45, 64]


def mm(raw, act, n, level, path, w_scale=1.0, threads=1):
    out = np.full((act.shape[0], raw.shape[0]), np.float32(-7.25))
    lib.matmul_act(I2S, raw, act, n, w_scale, out, 0, raw.shape[0], threads, ISA.index(level), path)
    return out


def test_simd_levels_have_a_gemm_and_scalar_has_none():
    for lv in ALL_LEVELS:
        g = lib.gemm_kernel(I2S, ISA.index(lv))
        if lv == "scalar" or lv in REFERENCE_LEVELS:  # avx / aarch64: window kernels only
            assert g is None
        else:
            assert g is not None and g[0].startswith(f"gemm_i2_s_i8_s_{lv}") and g[1] == lv, g


@pytest.mark.parametrize("rows", [1, 7, 37, 150])  # 150: several row tiles, the last partial
@pytest.mark.parametrize("level", GEMM_LEVELS)
def test_gemm_bitwise_equals_windows_and_reference(rng, level, rows):
    nb = 23
    n = nb * 128
    raw = rng.integers(0, 256, (rows, nb * 32), dtype=np.uint8)
    x = rng.standard_normal((64, n)).astype(np.float32)
    act = lib.quantize_act(F["I8_S"].id, x, ISA.index(level))
    w_scale = 0.0371
    for nt in NTS:
        g = mm(raw, act[:nt], n, level, 2, w_scale)
        w = mm(raw, act[:nt], n, level, 1, w_scale)
        assert same_bits(g, w), f"{level}/rows={rows}/nt={nt}: GEMM != windows"
        want, _ = i2s_expected(raw, act[:nt], n, w_scale)
        assert same_bits(g, want), f"{level}/rows={rows}/nt={nt}: GEMM != reference"
        assert same_bits(mm(raw, act[:nt], n, level, 2, w_scale, threads=2), g)
        # a token's result does not depend on the chunk it ran in (I2)
        assert same_bits(mm(raw, act[nt - 1:nt], n, level, 1, w_scale), g[nt - 1:nt])


@pytest.mark.parametrize("level", GEMM_LEVELS)
def test_gemm_rows_wider_than_the_scratch(rng, level):
    nb = 129  # n = 16512 > 16384 codes per row: the GEMM runs the row kernels' windows
    n = nb * 128
    raw = rng.integers(0, 256, (3, nb * 32), dtype=np.uint8)
    act = lib.quantize_act(F["I8_S"].id, rng.standard_normal((17, n)).astype(np.float32), ISA.index(level))
    g = mm(raw, act, n, level, 2)
    assert same_bits(g, mm(raw, act, n, level, 1))
    assert same_bits(g, i2s_expected(raw, act, n, 1.0)[0])


def worst_case(rng, nb):
    n = nb * 128
    raw = np.concatenate([np.full((3, nb * 32), 0xFF, np.uint8), weight_patterns(6, nb, rng)])
    # tokens alternate all +127 / all -128 (so every chunk has both), then mixed worst cases
    q = np.concatenate([np.where(np.arange(48)[:, None] % 2, -128, 127) * np.ones((1, n), np.int64),
                        act_patterns(16, n, rng)])
    return raw, i8s_rows(q), n


@pytest.mark.parametrize("level", GEMM_LEVELS)
def test_gemm_worst_case_exact(rng, level):
    """All codes 3 x all +127 / all -128: the largest int16 partials the avx2 fold allows
    (10 blocks x 3048 / 3072 per lane); 21 blocks = two fold groups and a tail of 1."""
    raw, act, n = worst_case(rng, 21)
    total = act[:, 4:8].copy().view("<i4").astype(np.int64)
    for nt in NTS:
        ours = mm(raw, act[:nt], n, level, 2)
        want, S = i2s_expected(raw, act[:nt], n, 1.0)
        assert same_bits(ours, want), f"{level}/nt={nt}"
        np.testing.assert_array_equal(ours.astype(np.int64), S - total[:nt])  # exact in float here
        assert S[0, 0] == 3 * 127 * n and S[1, 0] == -3 * 128 * n


_CHILD = r"""
import json, sys
import numpy as np
from lowbit._native import lib
from lowbit import kernels as K
raw, act = np.load(sys.argv[1]), np.load(sys.argv[2])
n = int(sys.argv[3])
ISA = list(lib.isa_names())
res = {"levels": list(lib.levels()), "gemm": {}, "selected": lib.cpu_info()["selected"],
       "disabled": list(lib.cpu_info()["disabled"])}
outs = {}
for lv in res["levels"]:
    isa = ISA.index(lv)
    g = lib.gemm_kernel(36, isa)
    res["gemm"][lv] = list(g) if g else None
    if not g:
        continue
    for nt in (9, 16, 17, 33, 64):
        for path in (1, 2):
            out = np.zeros((nt, raw.shape[0]), np.float32)
            lib.matmul_act(36, raw, act[:nt], n, 0.5, out, 0, raw.shape[0], 1, isa, path)
            outs[f"{lv}_{nt}_{path}"] = out
stats = {}
for nt in (64, 8):
    K.reset_stats()
    out = np.zeros((nt, raw.shape[0]), np.float32)
    lib.matmul_act(36, raw, act[:nt], n, 0.5, out, 0, raw.shape[0], 1, -1, 0)
    stats[nt] = [(s["nt"], s["kernel"]) for s in K.stats() if s["format"] == "I2_S"]
res["stats"] = stats
np.savez(sys.argv[4], **outs)
print(json.dumps(res))
"""


def child(tmp_path, env_extra, raw, act, n, tag):
    np.save(tmp_path / "raw.npy", raw)
    np.save(tmp_path / "act.npy", act)
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("LOWBIT_NO_") or k in ("LOWBIT_I2S_FOLD", "LOWBIT_I2S_GEMM_MIN_NT"))}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = tmp_path / f"{tag}.npz"
    p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "raw.npy"), str(tmp_path / "act.npy"), str(n),
                        str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), np.load(out)


@pytest.mark.skipif(not GEMM_LEVELS, reason="needs a SIMD level: CPU flags avx2, fma, f16c, under LOWBIT_MAX_ISA >= avx2")
def test_gemm_forced_fold_and_counters(rng, tmp_path):
    """LOWBIT_I2S_FOLD=1: the avx2 GEMM has its own name and the same output bitwise (worst case
    included) as the deferred one and the reference. LOWBIT_I2S_GEMM_MIN_NT=9: a 64-token
    matmul counts the GEMM (nt 0), an 8-token one the row kernel; by default the GEMM is off."""
    raw, act, n = worst_case(rng, 21)
    base, a = child(tmp_path, {}, raw, act, n, "base")
    gated, b = child(tmp_path, {"LOWBIT_I2S_GEMM_MIN_NT": "9"}, raw, act, n, "gated")
    fold1, c = child(tmp_path, {"LOWBIT_I2S_FOLD": "1", "LOWBIT_I2S_GEMM_MIN_NT": "9"}, raw, act, n, "fold1")
    sel = base["selected"]
    rows_name = lib.kernel(I2S, 8, ISA.index(sel))[0]
    # default: avx512's, amx's and avx2's GEMM (csrc/x86/gemm.inl, tokens in lanes) from 16 tokens; at
    # avx2vnni the tile-decode GEMM is gated off, and a 64-token matmul is 8 windows of the row kernel
    if sel in ("avx512", "amx", "avx2"):
        assert base["gemm"][sel][2] == 16
        assert base["stats"]["64"] == [[0, f"gemm_i2_s_i8_s_{sel}"]] and base["stats"]["8"] == [[8, rows_name]]
    else:
        assert base["gemm"][sel][2] == 0
        assert base["stats"]["64"] == [[8, rows_name]] and base["stats"]["8"] == [[8, rows_name]]
    assert gated["gemm"][sel][2] == 9
    assert gated["stats"]["64"] == [[0, f"gemm_i2_s_i8_s_{sel}"]], gated["stats"]
    assert gated["stats"]["8"] == [[8, rows_name]], gated["stats"]
    if "avx2" in fold1["gemm"]:
        assert fold1["gemm"]["avx2"][0] == "gemm_i2_s_i8_s_avx2_fold1"
        assert base["gemm"]["avx2"][0] == "gemm_i2_s_i8_s_avx2"
    for k in a.files:
        lv, nt, path = k.split("_")
        want, _ = i2s_expected(raw, act[:int(nt)], n, 0.5)
        assert same_bits(a[k], want), k
        assert same_bits(b[k], a[k]) and same_bits(c[k], a[k]), k


@pytest.mark.skipif("avx2" not in GEMM_LEVELS, reason="needs the avx2 level: CPU flags avx2, fma, f16c, under LOWBIT_MAX_ISA >= avx2")
def test_gemm_can_be_turned_off(rng, tmp_path):
    raw, act, n = worst_case(rng, 2)
    r, _ = child(tmp_path, {"LOWBIT_I2S_GEMM_MIN_NT": "9", "LOWBIT_NO_GEMM_I2_S_I8_S_AVX2": "1"}, raw, act, n, "off")
    assert "gemm_i2_s_i8_s_avx2" in r["disabled"]
    assert r["gemm"]["avx2"] is None
    for lv in ("avx2vnni", "avx512"):
        if lv in r["levels"]:
            assert r["gemm"][lv][0] == f"gemm_i2_s_i8_s_{lv}"


# ---- end to end: the engine's prompt chunks through the GEMM -----------------------------------

_ENGINE_CHILD = r"""
import json, sys
import numpy as np
import lowbit
from lowbit import kernels as K
from lowbit._native import lib
m = lowbit.load(sys.argv[1], n_ctx=64, threads=2)
ids = m.tokenize(sys.argv[2], add_bos=False)[:40]
K.reset_stats()
logits = m.logits(ids, chunk=40)  # one 40-token chunk per layer matmul
np.save(sys.argv[3], logits)
print(json.dumps(sorted({s["kernel"] for s in K.stats() if s["format"] == "I2_S"})))
"""


@pytest.mark.skipif(not GEMM_LEVELS, reason="needs a SIMD level: CPU flags avx2, fma, f16c, under LOWBIT_MAX_ISA >= avx2")
def test_engine_logits_identical_with_the_gemm(tmp_path):
    """A bitnet-b1.58 I2_S model's logits for a 40-token prompt chunk are bitwise the same with
    the GEMM on (LOWBIT_I2S_GEMM_MIN_NT=9: every I2_S matmul of the chunk takes it, the fused
    gate/up with its GLU epilogue too) and off."""
    from lowbit import synth
    from test_bitnet import SHAPE, TEXT
    path = synth.synth_bitnet(tmp_path / "b158.gguf", arch="bitnet-b1.58", wtype="I2_S", seed=3, **SHAPE)
    text = TEXT * 3
    runs = []
    for tag, extra in (("off", {"LOWBIT_I2S_GEMM_MIN_NT": "0"}), ("on", {"LOWBIT_I2S_GEMM_MIN_NT": "9"})):
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("LOWBIT_NO_") or k in ("LOWBIT_I2S_FOLD", "LOWBIT_I2S_GEMM_MIN_NT"))}
        env.update(extra)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        out = tmp_path / f"{tag}.npy"
        p = subprocess.run([sys.executable, "-c", _ENGINE_CHILD, str(path), text, str(out)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        runs.append((json.loads(p.stdout.strip().splitlines()[-1]), np.load(out)))
    (k_off, off), (k_on, on) = runs
    sel = lib.cpu_info()["selected"]
    assert k_off and all(k.startswith("rows_i2_s_i8_s_") for k in k_off), k_off
    assert k_on == [f"gemm_i2_s_i8_s_{sel}"], k_on
    assert off.shape[0] == 40 and same_bits(on, off)
