"""The kernel API refuses bad arguments with a clear ValueError/TypeError before native code runs."""
import subprocess
import sys

import numpy as np
import pytest

import lowbit
from lowbit import kernels as K

RAW = np.zeros((4, 18), np.uint8)          # 4 rows of Q4_0, n = 32
X = np.ones((2, 32), np.float32)


@pytest.mark.parametrize("call,exc,needle", [
    (lambda: K.matmul("Q4_0", RAW.astype(np.int8), X), TypeError, "uint8"),
    (lambda: K.matmul("Q4_0", np.zeros((4, 17), np.uint8), X), ValueError, "whole number"),
    (lambda: K.matmul("Q4_0", RAW, np.ones((2, 31), np.float32)), ValueError, "values per token"),
    (lambda: K.matmul("Q4_0", RAW, np.ones((0, 32), np.float32)), ValueError, "at least one token"),
    (lambda: K.matmul("Q4_0", RAW, np.ones((2, 32), np.int32)), TypeError, "float"),
    (lambda: K.matmul("Q4_0", RAW[:, ::2], X), ValueError, "C-contiguous"),
    (lambda: K.matmul("Q4_0", np.zeros((4, 36), np.uint8)[:, :18], X), ValueError, "C-contiguous"),
    (lambda: K.matmul("NOPE", RAW, X), ValueError, "unknown format"),
    (lambda: K.matmul("Q8_1", RAW, X), ValueError, "not a weight format"),
    (lambda: K.matmul("I2_S", np.zeros((2, 32), np.uint8), np.ones((1, 128), np.float32)), ValueError, "w_scale"),
    (lambda: K.matmul("Q4_0", RAW, X, threads=0), ValueError, "threads"),
    (lambda: K.quantize_act("Q4_0", X), ValueError, "not an activation format"),
    (lambda: K.quantize_act("Q8_K", X), ValueError, "multiple of the block size 256"),
    (lambda: K.quantize("IQ3_S", np.ones((1, 256), np.float32)), ValueError, "no quantizer"),
    (lambda: K.dequantize("Q4_0", RAW, n=64), ValueError, "needs 36 bytes"),
    (lambda: K.matmul_act("Q4_0", RAW, np.zeros((2, 33), np.uint8)), ValueError, "34 bytes per token"),
    (lambda: K.matmul_act("Q4_0", RAW, np.zeros((2, 34), np.uint8), r0=2, r1=9), ValueError, "row range"),
    (lambda: K.kernel("Q4_0", 9), ValueError, "1..8"),
])
def test_bad_arguments(call, exc, needle):
    with pytest.raises(exc, match=needle):
        call()


def test_stats_say_which_kernel_ran():
    K.reset_stats()
    K.matmul("Q8_0", np.zeros((3, 34), np.uint8), np.ones((11, 32), np.float32))
    s = {(d["format"], d["nt"]): d for d in K.stats()}
    # 11 tokens = a window of 8 and one of 3, after one quantizer call for the 11 tokens
    assert set(s) == {("Q8_0", 8), ("Q8_0", 3), ("Q8_0", None)}
    assert s[("Q8_0", 8)]["kernel"] == K.kernel("Q8_0", 8)[0] and s[("Q8_0", 8)]["rows"] == 3
    q = s[("Q8_0", None)]
    assert q["op"] == "quantize" and q["kernel"] == K.quant_act_kernel("Q8_0")[0]
    assert (q["calls"], q["rows"], q["values"]) == (1, 11, 11 * 32)
    K.reset_stats()
    assert K.stats() == []


def run_cli(*args, env=None):
    import os
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "lowbit.cli", *args], capture_output=True, text=True, env=e)


def test_info_prints_cpu_and_kernels():
    r = run_cli("info")
    assert r.returncode == 0, r.stderr
    assert "CPU" in r.stdout and "selected" in r.stdout
    for f in lowbit.formats():
        if f.weight:
            assert f"\n{f.name} " in r.stdout and "rows_" in r.stdout


def test_max_isa_cap_is_obeyed():
    r = run_cli("info", env={"LOWBIT_MAX_ISA": "scalar"})
    assert r.returncode == 0, r.stderr
    assert "-> selected scalar" in r.stdout and "_avx" not in r.stdout
    r = subprocess.run([sys.executable, "-c", "import lowbit; print(lowbit._native.lib.levels())"],
                       capture_output=True, text=True, env={**__import__("os").environ, "LOWBIT_MAX_ISA": "scalar"})
    assert r.stdout.strip() == "['scalar']", r.stdout + r.stderr


def test_bad_max_isa_is_a_clear_error():
    r = run_cli("info", env={"LOWBIT_MAX_ISA": "avx9000"})
    assert r.returncode != 0 and "LOWBIT_MAX_ISA=avx9000" in r.stderr


def test_no_kernel_switch_falls_back_and_is_reported():
    """LOWBIT_NO_<KERNEL>=1 turns one kernel off: the level below runs it, info says so."""
    import json
    probe = ("import json, lowbit; from lowbit._native import lib; "
             "print(json.dumps({f.name: lib.kernel(f.id, 2) for f in lowbit.formats() if f.weight}))")
    base = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    simd = {k: v for k, v in base.items() if v[1] != "scalar"}
    if not simd:  # scalar-only build: the reference itself can never be turned off
        name = base["Q4_0"][0]
        r = run_cli("info", env={"LOWBIT_NO_" + name.upper(): "1"})
        assert r.returncode == 0 and name in r.stdout
        return
    fmt, (name, level) = sorted(simd.items())[0]
    env = {"LOWBIT_NO_" + name.upper(): "1"}
    after = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                      env={**__import__("os").environ, **env}).stdout)
    assert after[fmt][0] != name, f"{name} still runs with LOWBIT_NO_{name.upper()}=1"
    r = run_cli("info", env=env)
    assert "disabled" in r.stdout and name in r.stdout


def test_i2s_flat_tensor_round_trip():
    """quantize("I2_S", W) gives the tensor as a bitnet.cpp GGUF holds it; matmul takes it flat."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 256)).astype(np.float32)
    flat = K.quantize("I2_S", w)
    assert flat.shape == (6 * 256 // 4 + 32,)
    rows, scale = K.split_tensor("I2_S", flat, 256)
    assert rows.shape == (6, 64) and scale == np.float32(np.abs(w).mean(dtype=np.float64))
    x = rng.standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_array_equal(K.matmul("I2_S", flat, x), K.matmul("I2_S", rows, x, w_scale=scale))
    deq = K.dequantize("I2_S", rows, w_scale=scale)
    ternary = np.clip(np.round(w / scale), -1, 1) * scale
    np.testing.assert_array_equal(deq, ternary.astype(np.float32))
    with pytest.raises(ValueError, match="whole rows"):
        K.matmul("I2_S", flat[:-1], x)


def test_parity_command_runs_every_level_and_passes():
    r = run_cli("parity", "--formats", "Q4_0,Q4_K,IQ2_XS,I2_S,BF16", "--rows", "9")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    from lowbit._native import lib
    for lv in lib.levels():
        assert f"Q4_K     {lv:<9}  8" in r.stdout
    assert "all within contract" in r.stdout and "MISMATCH" not in r.stdout
    r = run_cli("parity", "--formats", "Q9_9")
    assert r.returncode == 1 and "unknown format" in r.stderr
