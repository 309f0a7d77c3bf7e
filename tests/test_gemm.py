"""The GEMM tier (csrc/x86/gemm.inl, avx512 / avx2vnni / avx2: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (not
at avx2), IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ2_0, TQ1_0 x Q8_K (the i-quants' float
step: multiply then add, IQ1_*'s 0.125 on the block integer, IQ2_*'s 0.125 and IQ3_XXS's 0.25 after the
last block); Q4_0, Q5_0, Q8_0 x Q8_0; Q4_1, Q5_1 x Q8_1; avx2's Q8_0 by the sign trick, its codes being
too wide for vdot's vpmaddubsw)
against the row kernels, and the engine's prompt chunks through it (I8, tier invariance).

The GEMM holds tokens in lanes and forms each (row, token, block)'s exact integer sums its own
way, then takes the row kernels' float steps in their order (k-quants: GROUPS per super-block;
legacy: the 8 block classes and the final tree), so its output must be BITWISE the row kernels'
in windows of <= 8 tokens (which test_kquants_simd / test_legacy_simd / test_kernels tie to the
reference and ggml within I5, and exactly on integer-exact inputs):
  - nt in {1, 9, 16, 17, 33, 64, 100} x rows {1, 7, 37} x widths of 1, 6 and 16 super-blocks
    (legacy: 1, 9, 18 and 48 blocks: class tails), random weights with an outlier, one and two
    threads (I3);
  - adversarial bytes: every code and scale byte random (the largest codes and scales included),
    a row of all-ones bytes (the largest codes) and one of zero codes under the largest scales
    (Q6_K's -32, Q4_0's -8), fp16 scales of 1.0 and activations +127 / -128 / mixed: exact
    integer sums, bitwise again (at avx2: the int16 saturation bound of vpmaddubsw);
  - every token count 1..40 on 13 rows (microkernel and lane tails);
  - as dispatched, a chunk's short tail past whole lane vectors through the windows (gemm_tokens),
    bitwise, the counters naming the GEMM and the tail's window;
  - counters name the GEMM (nt = 0) for a 64-token matmul and the row kernel for 8 tokens;
    LOWBIT_KQ_GEMM_MIN_NT moves the gate, LOWBIT_NO_GEMM=1 removes it (a subprocess each);
  - avx2's Q8_0 (the sign trick): codes -128 / 127 against activations -127 / 127 give the exact
    int64 dot (GEMM, windows and the scalar reference), and activation codes of -128 (which the
    quantizer makes of NaN) give the windows' and ggml's AVX2 sum, whose -(-128) wraps;
  - a dense Q4_K / Q6_K model, a dense Q4_0 model, a dense Q8_0 model, a dense Q3_K model with an IQ4_XS
    head (IQ4_XS: the i-quants' float step, multiply then add), a dense Q2_K model, a dense IQ3_XXS model
    with an IQ2_S head, a dense TQ2_0 model with an IQ3_S head, a qwen3moe with Q4_K / Q5_K experts and the
    default model (Q4_1, Q8_0 embeddings) give bitwise the same logits for a prompt in chunks of
    1, 8, 40 and 100 tokens, the GEMM on (from 16 tokens: every format's GEMM runs whatever the
    level's gates) and off.
matmul_act's `path`: 0 as dispatched, 1 row-kernel windows only, 2 the GEMM for any nt.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ALL_LEVELS as LEVELS, assert_bitwise  # (the GEMM-only amx level too)

from lowbit._native import lib
from lowbit.kernels import repacked_layouts
from lowbit.formats import BY_NAME as F

ISA = lib.isa_names()
KQ = ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K"]
IQ = ["IQ4_XS"]  # the k-quant GEMM with the i-quants' float step (gemm.inl GIQ4XS)
# the grid i-quants, IQ1_* and the ternary formats: signed codes under integer scales, the i-quants'
# float step with POST (IQ1_*) and FINAL (IQ2_*, IQ3_XXS) (gemm.inl GIQ3XXS ... GTQ1)
IQG = ["IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ2_0", "TQ1_0"]
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
ALL = KQ + IQ + IQG + LEGACY
ACT = {"Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K", "Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q5_0": "Q8_0", "Q5_1": "Q8_1",
       "Q8_0": "Q8_0", "Q3_K": "Q8_K", "IQ4_XS": "Q8_K", "Q2_K": "Q8_K", **dict.fromkeys(IQG, "Q8_K")}
GEMM_LEVELS = [lv for lv in LEVELS if lib.gemm_kernel(F["Q4_K"].id, ISA.index(lv)) is not None]
NEEDS = pytest.mark.skipif(not GEMM_LEVELS, reason="needs an x86 level with a GEMM: CPU flag avx2 "
                                                   "under LOWBIT_MAX_ISA >= avx2")
# The formats with a GEMM per level (written here, not read from the library): every one at
# every level but IQ4_XS at avx2 (its codes, -127..113, are too wide for that level's vdot); avx2's Q8_0
# by the sign trick (its codes are too wide for vdot's vpmaddubsw).
GEMM_FORMATS = {"avx512": ALL, "avx2vnni": ALL, "avx2": [n for n in ALL if n != "IQ4_XS"]}
# The gates (gemm_min_nt) as measured per level (gemm.inl: kKqGemmMinNt ...), per format
GATES = {"avx512": {**dict.fromkeys(ALL, 32), "Q4_K": 9, "Q5_K": 9, "Q6_K": 12, "Q3_K": 9, "IQ4_XS": 9, "Q2_K": 12, "IQ3_XXS": 9, "IQ3_S": 16,
                    "IQ2_XXS": 12, "IQ2_XS": 16, "IQ2_S": 16, "IQ1_S": 16, "IQ1_M": 16, "TQ2_0": 16, "TQ1_0": 24},
         "avx2vnni": {**dict.fromkeys(ALL, 32), "Q4_K": 16, "Q5_K": 16, "Q6_K": 24, "Q3_K": 16, "IQ4_XS": 16, "Q2_K": 24, **dict.fromkeys(IQG, 24),
                      "IQ3_XXS": 16, "TQ1_0": 32},
         "avx2": {"Q3_K": 16, "Q2_K": 16, "Q4_K": 16, "Q5_K": 16, "Q6_K": 128, "Q4_0": 64, "Q4_1": 64, "Q5_0": 128, "Q5_1": 24, "Q8_0": 64,
                  **dict.fromkeys(IQG, 32), "IQ3_S": 16, "IQ1_S": 16, "TQ2_0": 64, "TQ1_0": 64}}

# Tokens per lane vector of each level's GEMM, and the longest tail past whole vectors that the
# windows take (gemm.inl: LANES, kGemmTail)
LANES_TAIL = {"avx512": (16, 4), "avx2vnni": (8, 4), "avx2": (8, 4)}

# The amx level (tests/test_amx.py) replaces the GEMMs of the k-quant family and the legacy formats
# (AMX_OWN) and I2_S's (tests/test_i2s_gemm.py). Its own are built on avx512's lane vectors and gates, or,
# emulated (LOWBIT_AMX=emulate, any CPU with avx2), on avx2's, where Q8_0 keeps avx2's GEMM (the sign
# trick, whose wrap at an activation of -128 the windows share and the tiles would not).
AMX_BELOW = LEVELS[LEVELS.index("amx") - 1] if "amx" in LEVELS else None
# The 16-sub-block formats' tile GEMM lost to avx512's: the amx level leaves them (gemm.inl amx_takes)
AMX_LEAVES = ["Q6_K", "Q3_K", "IQ2_XS", "IQ2_S", "IQ1_M"]
AMX_OWN = [n for n in KQ + IQ + IQG + LEGACY if n not in AMX_LEAVES]
_amx_base = None
if AMX_BELOW:
    _amx_base = "avx2" if lib.cpu_info()["amx_emulated"] else "avx512"
    if _amx_base == "avx2":
        AMX_OWN = [n for n in AMX_OWN if n != "Q8_0"]
    _left = [n for n in KQ + IQ + IQG + LEGACY if n not in AMX_OWN and n in GEMM_FORMATS.get(AMX_BELOW, ())]
    GEMM_FORMATS["amx"] = AMX_OWN + _left
    GATES["amx"] = {**{n: GATES[_amx_base].get(n, GATES[_amx_base]["Q4_K"]) for n in AMX_OWN},
                    **{n: GATES[AMX_BELOW][n] for n in _left}}
    LANES_TAIL["amx"] = LANES_TAIL[_amx_base]


def owner(level, name):
    """The level whose GEMM runs for format name at level (amx: the level below's for the formats it leaves)."""
    return AMX_BELOW if level == "amx" and name not in AMX_OWN else level


def gemm_cases(*names):
    """(level, format) for every level under test with a GEMM and every format it has one for."""
    return [(lv, n) for lv in GEMM_LEVELS for n in names if n in GEMM_FORMATS[lv]]
NTS = [1, 9, 16, 17, 33, 64, 100]
FP16_AT = {"Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q3_K": [108], "IQ4_XS": [0], "Q2_K": [80, 82], "IQ3_XXS": [0], "IQ3_S": [0], "IQ2_XXS": [0], "IQ2_XS": [0],
           "IQ2_S": [0], "IQ1_S": [0], "IQ1_M": [], "TQ2_0": [64], "TQ1_0": [52], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
           "Q8_0": [0]}
BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q3_K": 110, "IQ4_XS": 136, "Q2_K": 84, "IQ3_XXS": 98, "IQ3_S": 110, "IQ2_XXS": 66, "IQ2_XS": 74, "IQ2_S": 82,
         "IQ1_S": 50, "IQ1_M": 56, "TQ2_0": 66, "TQ1_0": 54, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}
BLOCK = {**dict.fromkeys(IQG, 256), "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q3_K": 256, "IQ4_XS": 256, "Q2_K": 256, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32}
WIDTHS = {256: (1, 6, 16), 32: (1, 9, 18, 48)}  # blocks per row


def mm(name, raw, act, n, level, path, threads=1):
    out = np.full((act.shape[0], raw.shape[0]), np.float32(-7.25))
    lib.matmul_act(F[name].id, raw, act, n, 1.0, out, 0, raw.shape[0], threads, ISA.index(level), path)
    return out


def q8k(x, level, fmt="Q8_K"):
    return lib.quantize_act(F[fmt].id, np.ascontiguousarray(x, dtype=np.float32), ISA.index(level))


def check_same(got, want, what, name, n):
    assert_bitwise(got, want, what, f"{name}, {n // BLOCK[name]} blocks", "gemm", "windows")


def test_levels_with_a_gemm():
    for lv in LEVELS:
        for name in ALL:
            g = lib.gemm_kernel(F[name].id, ISA.index(lv))
            if name in GEMM_FORMATS.get(lv, ()):
                own = owner(lv, name)
                want = f"gemm_{name.lower()}_{ACT[name].lower()}_{own}"
                assert g is not None and tuple(g) == (want, own, GATES[lv][name]), g
            else:  # scalar, avx; avx2's Q8_0 (codes beyond its vdot's bound): windows only
                assert g is None, (lv, name, g)


@NEEDS
@pytest.mark.parametrize("level,name", gemm_cases(*ALL))
@pytest.mark.parametrize("rows", [1, 7, 37, 150])  # 150: row tiles of <= 64 (amx scaled: 128), the last partial
def test_gemm_bitwise_equals_windows(ggml, rng, name, rows, level):
    for nb in WIDTHS[BLOCK[name]]:
        n = nb * BLOCK[name]
        w = rng.standard_normal((rows, n)).astype(np.float32)
        w[rows // 2, n // 3] = 30.0  # an outlier block
        raw = ggml.quantize(name, w)
        act = q8k(rng.standard_normal((max(NTS), n)) * 2.0, level, ACT[name])
        for nt in NTS:
            want = mm(name, raw, act[:nt], n, level, 1)
            check_same(mm(name, raw, act[:nt], n, level, 2), want, f"nt={nt}", name, n)
            if nt in (33, 100):  # two threads split the rows (I3)
                check_same(mm(name, raw, act[:nt], n, level, 2, threads=2), want, f"nt={nt}, 2 threads", name, n)


def adversarial(rng, name, rows, nb):
    """Random bytes everywhere (the largest codes and scales among them), fp16 scales 1.0."""
    raw = rng.integers(0, 256, (rows, nb * BYTES[name]), dtype=np.uint8)
    one = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    blocks = raw.reshape(rows, nb, BYTES[name])
    for off in FP16_AT[name]:
        blocks[:, :, off:off + 2] = one
    blocks[0, :, :] = 0xFF  # row 0: every code and scale bit set (the largest codes)
    blocks[1, :, :] = 0x00  # row 1: every code bit clear (Q6_K: -32, Q4_0: -8, Q3_K: -4, IQ4_XS: -127) under the
    # largest scales (Q3_K, IQ4_XS: 6-bit 0, i.e. -32)
    if name in SCALES_AT:
        lo, hi = SCALES_AT[name]
        blocks[1, :, lo:hi] = 0xFF if name != "Q6_K" else 0x80  # Q6_K: int8 scales of -128
    for off in FP16_AT[name]:
        blocks[0, :, off:off + 2] = one
        blocks[1, :, off:off + 2] = one
    if name == "IQ1_M":  # its fp16 d in the top nibbles of the 4 scale words (bytes 48..55): 1.0
        words = blocks[:, :, 48:56].copy().view("<u2") & 0x0FFF
        top = np.array([(0x3C00 >> (4 * k) & 0xF) << 12 for k in range(4)], "<u2")
        blocks[:, :, 48:56] = (words | top).astype("<u2").view(np.uint8)
    return raw


SCALES_AT = {"Q4_K": (4, 16), "Q5_K": (4, 16), "Q6_K": (192, 208), "Q2_K": (0, 16), "IQ2_XS": (66, 74), "IQ2_S": (74, 82),
             "IQ3_S": (106, 110)}  # the scale (and min) bytes


@NEEDS
@pytest.mark.parametrize("level,name", gemm_cases(*ALL))
@pytest.mark.parametrize("pattern", ["max", "min", "mixed"])
def test_gemm_worst_case_bitwise(rng, name, pattern, level):
    rows, nb = 9, 5 if BLOCK[name] == 256 else 19
    n = nb * BLOCK[name]
    raw = adversarial(rng, name, rows, nb)
    nt = 40
    if pattern == "max":
        x = np.full((nt, n), 127.0)
    elif pattern == "min":
        x = np.full((nt, n), -128.0)
    else:
        x = np.where(rng.random((nt, n)) < 0.5, -128.0, 127.0)
    act = q8k(x, level, ACT[name])  # the activation codes at their extremes
    want = mm(name, raw, act, n, level, 1)
    assert np.all(np.isfinite(want))
    check_same(mm(name, raw, act, n, level, 2), want, pattern, name, n)


@NEEDS
@pytest.mark.parametrize("level,name", gemm_cases(*ALL))
def test_gemm_every_token_count(ggml, rng, name, level):
    """nt = 1..40 on 13 rows (not a multiple of the microkernel's 3 or 4 rows): every lane tail."""
    rows, nb = 13, 2 if BLOCK[name] == 256 else 11
    n = nb * BLOCK[name]
    raw = ggml.quantize(name, rng.standard_normal((rows, n)).astype(np.float32))
    act = q8k(rng.standard_normal((40, n)) * 3.0, level, ACT[name])
    for nt in range(1, 41):
        check_same(mm(name, raw, act[:nt], n, level, 2), mm(name, raw, act[:nt], n, level, 1), f"nt={nt}", name, n)


def gemm_ran(fid, isa, g):
    """The GEMM that runs g GEMM tokens of a chunk: the level's, or below its crossover (the amx
    level: KernelEntry::gemm_cross) the level below's"""
    low = lib.gemm_low(fid, isa)
    return low[0] if low and g < low[2] else lib.gemm_kernel(fid, isa)[0]


@NEEDS
@pytest.mark.parametrize("level,name", gemm_cases(*ALL))
def test_gemm_tail_goes_to_the_windows(ggml, rng, name, level):
    """As dispatched (path 0), a chunk whose tokens past its last whole lane vector are at most
    the level's tail: the GEMM takes the whole vectors, the windows the tail (gemm_tokens). Each
    token bitwise the windows alone (I8), and the counters name exactly the kernels that ran."""
    from lowbit import kernels as K
    isa = ISA.index(level)
    lanes, tail = lib.gemm_tail(F[name].id, isa)
    assert (lanes, tail) == LANES_TAIL[owner(level, name)]
    gate = GATES[level][name]
    rows, nb = 13, 2 if BLOCK[name] == 256 else 11
    n = nb * BLOCK[name]
    raw = ggml.quantize(name, rng.standard_normal((rows, n)).astype(np.float32))
    nts = sorted({lanes + 1, lanes + tail, lanes + tail + 1, 2 * lanes + 1, 2 * lanes + tail, 4 * lanes + 2,
                  4 * lanes + tail + 1, gate, gate + 1})
    act = q8k(rng.standard_normal((max(nts), n)) * 3.0, level, ACT[name])
    split_seen = False
    for nt in nts:
        whole = nt // lanes * lanes
        t = nt - whole if 0 < nt - whole <= tail and whole >= gate else 0
        K.reset_stats()
        got = mm(name, raw, act[:nt], n, level, 0)
        ran = sorted({(s["nt"], s["kernel"]) for s in K.stats() if s["format"] == name})
        check_same(got, mm(name, raw, act[:nt], n, level, 1), f"nt={nt} as dispatched", name, n)
        if nt < gate:
            assert all(k != 0 for k, _ in ran), (nt, ran)
        elif t:
            split_seen = True
            assert ran == sorted({(0, gemm_ran(F[name].id, isa, nt - t)), (t, lib.kernel(F[name].id, t, isa)[0])}), (nt, ran)
        else:
            assert ran == [(0, gemm_ran(F[name].id, isa, nt))], (nt, ran)
    assert split_seen


_CHILD = r"""
import json, sys
import numpy as np
from lowbit import kernels as K
from lowbit._native import lib
from lowbit.kernels import repacked_layouts
from lowbit.formats import BY_NAME as F
raw = np.load(sys.argv[1]); act = np.load(sys.argv[2]); n = int(sys.argv[3])
res = {"gemm": lib.gemm_kernel(F["Q4_K"].id), "gemm_q8_0": lib.gemm_kernel(F["Q8_0"].id),
       "disabled": lib.cpu_info()["disabled"], "stats": {}}
for nt in (8, 64):
    K.reset_stats()
    out = np.zeros((nt, raw.shape[0]), np.float32)
    lib.matmul_act(F["Q4_K"].id, raw, act[:nt], n, 1.0, out, 0, raw.shape[0], 1, -1, 0)
    np.save(sys.argv[4] + f"_{nt}.npy", out)
    res["stats"][nt] = sorted({(s["nt"], s["kernel"]) for s in K.stats() if s["format"] == "Q4_K"})
print(json.dumps(res))
"""


def child(tmp_path, env_extra, raw, act, n, tag):
    np.save(tmp_path / "raw.npy", raw)
    np.save(tmp_path / "act.npy", act)
    env = {k: v for k, v in os.environ.items() if not (k.startswith("LOWBIT_NO_") or k == "LOWBIT_KQ_GEMM_MIN_NT")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    p = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "raw.npy"), str(tmp_path / "act.npy"), str(n),
                        str(tmp_path / tag)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res, {nt: np.load(tmp_path / f"{tag}_{nt}.npy") for nt in (8, 64)}


@NEEDS
def test_gate_counters_and_switches(ggml, rng, tmp_path):
    n = 4 * 256
    raw = ggml.quantize("Q4_K", rng.standard_normal((21, n)).astype(np.float32))
    act = q8k(rng.standard_normal((64, n)), GEMM_LEVELS[0])
    base, a = child(tmp_path, {}, raw, act, n, "base")
    sel = lib.cpu_info()["selected"]
    if sel not in GEMM_LEVELS:
        pytest.skip(f"the dispatched level {sel} has no GEMM (CPU flags avx512_vnni or avx_vnni)")
    rows_name = lib.kernel(F["Q4_K"].id, 8)[0]
    assert base["gemm"] == [f"gemm_q4_k_q8_k_{sel}", sel, GATES[sel]["Q4_K"]]
    q8 = owner(sel, "Q8_0")
    assert base["gemm_q8_0"] == [f"gemm_q8_0_q8_0_{q8}", q8, GATES[sel]["Q8_0"]]
    assert base["stats"]["64"] == [[0, f"gemm_q4_k_q8_k_{sel}"]], base["stats"]
    assert base["stats"]["8"] == [[8, rows_name]], base["stats"]
    hi, b = child(tmp_path, {"LOWBIT_KQ_GEMM_MIN_NT": "65"}, raw, act, n, "hi")
    assert hi["gemm"][2] == 65 and hi["stats"]["64"] == [[8, rows_name]], hi
    off, c = child(tmp_path, {"LOWBIT_NO_GEMM": "1"}, raw, act, n, "off")
    assert off["gemm"] is None and off["gemm_q8_0"] is None and "gemm" in off["disabled"], off
    assert off["stats"]["64"] == [[8, rows_name]], off
    for nt in (8, 64):
        check_same(b[nt], a[nt], f"gate 65, nt={nt}", "Q4_K", n)
        check_same(c[nt], a[nt], f"no gemm, nt={nt}", "Q4_K", n)


# ---- end to end: the engine's prompt chunks through the GEMM (I8) ------------------------------

_ENGINE = r"""
import json, sys
import numpy as np
import lowbit
from lowbit import kernels as K
m = lowbit.load(sys.argv[1], n_ctx=256, threads=2)
ids = (m.tokenize(sys.argv[2], add_bos=False) * 8)[:100]
out = {}
for chunk in (1, 8, 40, 100):
    m.reset()
    K.reset_stats()
    np.save(sys.argv[3] + f"_{chunk}.npy", m.logits(ids, chunk=chunk))
    out[chunk] = sorted({s["kernel"] for s in K.stats() if s["nt"] == 0})
print(json.dumps(out))
"""


@NEEDS
@pytest.mark.parametrize("kind", ["dense", "moe", "default", "q4_0", "q8_0", "q3_k", "q2_k", "iq3_xxs", "tq2_0"])
def test_engine_logits_identical_across_chunks_and_tiers(tmp_path, kind):
    from lowbit import synth
    if kind == "default":
        from lowbit.model import default_model_path
        path = default_model_path()
        want = {"gemm_q4_1_q8_1_avx512", "gemm_q8_0_q8_0_avx512"}  # the layers and the tied Q8_0 head
    elif kind == "dense":
        path = synth.synth_dense(tmp_path / "d.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="Q4_K",
                                 head_type="Q6_K", seed=5)
        want = {"gemm_q4_k_q8_k_avx512", "gemm_q6_k_q8_k_avx512"}
    elif kind == "q4_0":
        path = synth.synth_dense(tmp_path / "q.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="Q4_0",
                                 head_type="Q4_0", seed=7)
        want = {"gemm_q4_0_q8_0_avx512"}
    elif kind == "q3_k":  # Q3_K layers, an IQ4_XS head (at avx2: its windows)
        path = synth.synth_dense(tmp_path / "q3.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="Q3_K",
                                 head_type="IQ4_XS", seed=9)
        want = {"gemm_q3_k_q8_k_avx512", "gemm_iq4_xs_q8_k_avx512"}
    elif kind == "q2_k":  # Q2_K layers (mins per 16 codes), a Q4_K head
        path = synth.synth_dense(tmp_path / "q2.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="Q2_K",
                                 head_type="Q4_K", seed=10)
        want = {"gemm_q2_k_q8_k_avx512", "gemm_q4_k_q8_k_avx512"}
    elif kind == "iq3_xxs":  # IQ3_XXS layers (FINAL 0.25), an IQ2_S head (FINAL 0.125, 16 sub-blocks)
        path = synth.synth_dense(tmp_path / "iq3.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="IQ3_XXS",
                                 head_type="IQ2_S", seed=11)
        want = {"gemm_iq3_xxs_q8_k_avx512", "gemm_iq2_s_q8_k_avx512"}
    elif kind == "tq2_0":  # TQ2_0 layers, an IQ3_S head
        path = synth.synth_dense(tmp_path / "tq2.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="TQ2_0",
                                 head_type="IQ3_S", seed=12)
        want = {"gemm_tq2_0_q8_k_avx512", "gemm_iq3_s_q8_k_avx512"}
    elif kind == "q8_0":  # avx2: the sign trick's GEMM (gemm.inl, vdot_sign)
        path = synth.synth_dense(tmp_path / "q8.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="Q8_0",
                                 head_type="Q8_0", seed=8)
        want = {"gemm_q8_0_q8_0_avx512"}
    else:  # 4 experts, top 2: ~50 of the 100 tokens per expert take the GEMM
        path = synth.synth_moe(tmp_path / "m.gguf", layers=2, dim=256, experts=4, top_k=2, expert_ffn=256,
                               wtype="Q4_K", expert_type="Q4_K", down_type="Q5_K", head_type="Q6_K", seed=6)
        want = {"gemm_q4_k_q8_k_avx512", "gemm_q5_k_q8_k_avx512", "gemm_q6_k_q8_k_avx512"}
    text = "In a hole in the ground there lived a hobbit, not a nasty dirty wet hole."
    runs = {}
    # "on": every GEMM from 16 tokens (chunks of 40 and 100 take it whatever the level's measured gates),
    # the level's own (the amx level: no crossover to avx512's GEMM)
    on = {"LOWBIT_KQ_GEMM_MIN_NT": "16", "LOWBIT_LEGACY_GEMM_MIN_NT": "16", "LOWBIT_AMX_CROSS": "0"}
    for tag, extra in (("on", on), ("off", {"LOWBIT_NO_GEMM": "1"})):
        env = {k: v for k, v in os.environ.items() if not (k.startswith("LOWBIT_NO_") or k.endswith("_GEMM_MIN_NT"))}
        env.update(extra)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        p = subprocess.run([sys.executable, "-c", _ENGINE, str(path), text, str(tmp_path / tag)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        runs[tag] = json.loads(p.stdout.strip().splitlines()[-1])
    sel = lib.cpu_info()["selected"]
    for fmt in repacked_layouts():  # these formats' matrices run in the layout the engine repacks them to
        k = fmt.lower()
        want = {w.replace(f"gemm_{k}_", f"gemm_{k}_r8_") for w in want}
    if sel in GEMM_LEVELS:
        fmt = lambda kernel: "_".join(kernel.split("_")[1:3]).upper()  # gemm_q4_k_q8_k_avx512: Q4_K
        # (the emulated amx level, built on avx2's lanes, has the R8 layouts' GEMMs avx2 has: Q4_K's,
        # Q4_0's, Q4_1's; on an AVX-512 CPU the other R8 layouts take the level below's, avx512's)
        lv = lambda w: (AMX_BELOW if sel == "amx" and _amx_base == "avx2" and "_r8_" in w  # noqa: E731
                        and fmt(w) not in ("Q4_K", "Q4_0", "Q4_1") else owner(sel, fmt(w)))
        want = {w.replace("_avx512", f"_{lv(w)}") for w in want if fmt(w) in GEMM_FORMATS[sel]}
        assert set(runs["on"]["100"]) == want and set(runs["on"]["40"]) & want, runs["on"]
        assert runs["on"]["1"] == [] and runs["on"]["8"] == [], runs["on"]
    assert all(v == [] for v in runs["off"].values()), runs["off"]
    base = np.load(tmp_path / "off_1.npy")
    assert base.shape[0] == 100
    for tag in ("on", "off"):
        for chunk in (1, 8, 40, 100):
            got = np.load(tmp_path / f"{tag}_{chunk}.npy")
            bad = np.argwhere(got.view(np.uint32) != base.view(np.uint32))
            assert bad.size == 0, f"{kind}, gemm {tag}, chunk {chunk}: position {bad[0][0]} differs from chunk 1"


# ---- the numbers the GEMM is judged by: bench peak, and bench e2e's MAC count -------------------

def test_model_work_counts_the_layers_matmuls(tmp_path):
    """bench e2e's multiply-adds per token and decode bytes per token, against the shapes the
    synthetic models were written with (not read back through the code under test)."""
    from lowbit import synth
    from lowbit.bench import model_work
    d = synth.synth_dense(tmp_path / "d.gguf", layers=2, dim=256, ffn=512, heads=4, kv_heads=2, wtype="Q8_0",
                          head_type="Q8_0", seed=1)
    per_layer = 256 * 256 + 2 * (128 * 256) + 256 * 256 + 2 * (512 * 256) + 256 * 512  # q, k+v, o, gate+up, down
    w = model_work(str(d))
    assert w["macs"] == 2 * per_layer
    vocab = lowbit_vocab(d)
    assert w["bytes"] == (2 * per_layer + vocab * 256) * 34 // 32  # Q8_0: 34 bytes per 32 values
    m = synth.synth_moe(tmp_path / "m.gguf", layers=1, dim=256, experts=4, top_k=2, expert_ffn=128, wtype="Q8_0",
                        expert_type="Q8_0", router_type="Q8_0", head_type="Q8_0", seed=2)
    w = model_work(str(m))
    attn = 256 * 256 + 2 * (128 * 256) + 256 * 256
    experts = 2 * (3 * 128 * 256)  # top 2 of 4 experts: gate, up, down of 128 x 256
    router = 4 * 256
    assert w["macs"] == attn + experts + router, w
    # tied embeddings: the head is token_embd, read whole every step
    t = synth.synth_dense(tmp_path / "t.gguf", layers=2, dim=256, ffn=512, heads=4, kv_heads=2, wtype="Q8_0",
                          embd_type="Q8_0", tied=True, seed=3)
    from lowbit import gguf
    assert "output.weight" not in gguf.open(str(t)).tensors
    assert model_work(str(t))["bytes"] == (2 * per_layer + vocab * 256) * 34 // 32


def test_kv_read_per_token_counts_positions_and_windows(tmp_path):
    """bench e2e's KV bytes a decode step reads: a half cache holds n_kv * head_dim * 2 (K, V) * 2
    bytes per position and layer; a step at position pos reads pos + 1 positions (a sliding layer
    at most its window). Here: 2 KV heads of 64 -> 512 bytes; steps at positions 10..13."""
    import dataclasses
    import lowbit
    from lowbit import synth
    from lowbit.bench import kv_read_per_token
    d = synth.synth_dense(tmp_path / "d.gguf", layers=2, dim=256, ffn=512, heads=4, kv_heads=2, seed=1)
    m = lowbit.load(str(d), n_ctx=32)
    assert kv_read_per_token(m, 10, 4) == 2 * 512 * (11 + 12 + 13 + 14) // 4
    m.config = dataclasses.replace(m.config, window=(8, 0))  # layer 0 slides over 8 positions
    assert kv_read_per_token(m, 10, 4) == 512 * 8 + 512 * (11 + 12 + 13 + 14) // 4


def lowbit_vocab(path):
    from lowbit import gguf
    return gguf.open(str(path)).tensors["output.weight"].rows


def test_bench_peak_prints_a_rate_per_thread_count():
    c = lib.cpu_info()
    if c["selected"] not in ("avx2", "avx2vnni", "avx512", "amx") or c["amx_emulated"]:
        pytest.skip("bench peak's loops are x86 SIMD (CPU flags avx2, fma) or the AMX tiles (amx_tile, amx_int8)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-m", "lowbit.cli", "bench", "peak", "--threads", "1", "--reps", "1"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if not ln.startswith("# int8: ")]
    # avx2 adds its int16-sum ceiling (vpmaddubsw + vpaddw: peak.inl's peak_int8_i16)
    i16 = ["int8", "i16", "GMAC/s"] if c["selected"] == "avx2" else []
    # the amx level with AMX-BF16 adds the BF16 tiles' ceiling (TDPBF16PS: amx/peak.cpp's peak_bf16)
    i16 += ["bf16", "GMAC/s"] if c["selected"] == "amx" and c["amx_bf16"] else []
    assert lines[0].startswith("# multiply-add peak at level ") and lines[1].split() == ["threads", "int8", "GMAC/s",
                                                                                        "f32", "GFMA/s"] + i16
    row = lines[2].split()
    assert len(row) == 3 + (len(i16) > 0) and row[0] == "1" and all(float(x) > 0 for x in row[1:])


# ---- Q8_0 at avx2: the sign trick (gemm.inl, vdot_sign) ----------------------------------------

def q8_0_bytes(d, codes):
    """Q8_0 rows (weights and activations share the block: fp16 d, 32 int8 codes) from d[rows, nb]
    and codes[rows, nb * 32], written here byte by byte (not by the code under test)."""
    rows, nb = d.shape
    b = np.zeros((rows, nb, 34), np.uint8)
    b[:, :, :2] = np.ascontiguousarray(d, np.float16).view(np.uint8).reshape(rows, nb, 2)
    b[:, :, 2:] = np.ascontiguousarray(codes, np.int8).view(np.uint8).reshape(rows, nb, 32)
    return b.reshape(rows, nb * 34)


def q8_0_extreme_codes(rng, rows, nt, nb, act_min=-127):
    """Weight codes at -128 / 127 (rows 0..3: all -128, all 127, alternating, -128 with 0) and
    random in -128..127 below; activation codes +-127 (all 127, all -127, alternating, random
    signs) and random in act_min..127 after."""
    n = nb * 32
    w = rng.integers(-128, 128, (rows, n))
    w[0], w[1] = -128, 127
    w[2] = np.where(np.arange(n) % 2, 127, -128)
    w[3] = np.where(np.arange(n) % 3, -128, 0)
    a = rng.integers(act_min, 128, (nt, n))
    a[0], a[1] = 127, -127
    a[2] = np.where(np.arange(n) % 2, -127, 127)
    a[3] = np.where(rng.random(n) < 0.5, -127, 127)
    return w, a


AVX2_Q8 = pytest.mark.skipif("avx2" not in GEMM_LEVELS, reason="needs the avx2 level (CPU flags avx2 fma f16c)")


@AVX2_Q8
def test_q8_0_avx2_gemm_exact_at_the_extremes():
    """Codes -128 / 127 against activations -127 / 127 (the sign trick's worst pairs: 2 * 128 * 127
    = 32512, and -(-128) as |w|): with every scale 1.0 each output is an exact integer (|sum| <=
    19 * 32 * 128 * 127 < 2^24), so the GEMM, the windows and the scalar reference must all equal
    the int64 dot exactly."""
    rng = np.random.default_rng(18)
    rows, nt, nb = 13, 40, 19  # rows: 4 microkernels of 3 and a tail of 1; tokens: 5 lanes of 8
    w, a = q8_0_extreme_codes(rng, rows, nt, nb)
    raw, act = q8_0_bytes(np.ones((rows, nb)), w), q8_0_bytes(np.ones((nt, nb)), a)
    want = (a.astype(np.int64) @ w.T.astype(np.int64)).astype(np.float64)
    assert np.abs(want).max() < 2 ** 24 and np.abs(want).max() > 32 * 128 * 127  # exact in float32, and large
    n = nb * 32
    for level, path in (("avx2", 2), ("avx2", 1), ("scalar", 0)):
        for ntt in (1, 7, 8, 9, 17, 40):
            got = mm("Q8_0", raw, act[:ntt], n, level, path)
            bad = np.argwhere(got.astype(np.float64) != want[:ntt])
            assert bad.size == 0, (level, path, ntt, bad[0], got[tuple(bad[0])], want[tuple(bad[0])])


def sign_trick_dot(w, a):
    """What vpmaddubsw(|w|, vpsignb(a, w)) sums (written here in numpy, not read from the code):
    |w| * (a with w's sign), the negation of -128 wrapping to -128 as a byte."""
    w = w.astype(np.int64)[None, :, :]
    a = a.astype(np.int64)[:, None, :]
    s = np.where(w > 0, a, np.where(w < 0, -a, 0))
    s = np.where(s == 128, -128, s)
    return (np.abs(w) * s).sum(axis=2)


@AVX2_Q8
def test_q8_0_avx2_activation_code_minus_128(ggml):
    """An activation code of -128 exists: the quantizer (ggml's AVX2 quantize_row_q8_0, byte for
    byte) saturates a NaN's INT32_MIN to -128, and a NaN in a block's first 8 values leaves its
    amax (hence d) finite. There the sign trick is not the product (-(-128) wraps): the avx2
    windows and ggml's AVX2 vec_dot give |w| * -128 for w < 0, and the GEMM must give their bits."""
    x = np.linspace(-3.0, 3.0, 64, dtype=np.float32)[None, :].repeat(2, axis=0)
    x[0, 0] = x[1, 37] = np.nan
    q = lib.quantize_act(F["Q8_0"].id, x, ISA.index("avx2"))
    codes = q.reshape(2, 2, 34)[:, :, 2:].view(np.int8)
    d = q.reshape(2, 2, 34)[:, :, :2].copy().view(np.float16)
    assert codes[0, 0, 0] == -128 and np.isfinite(d[0, 0, 0]), (codes[0, 0, :4], d[0, 0])
    assert np.array_equal(q, ggml.from_float("Q8_0", x))  # ggml's own bytes (I4)

    rng = np.random.default_rng(128)
    rows, nt, nb = 7, 17, 11
    w, a = q8_0_extreme_codes(rng, rows, nt, nb, act_min=-128)
    a[4] = -128
    a[5] = np.where(np.arange(nb * 32) % 2, -128, 127)
    raw, act = q8_0_bytes(np.ones((rows, nb)), w), q8_0_bytes(np.ones((nt, nb)), a)
    want = sign_trick_dot(w, a).astype(np.float64)
    exact = (a.astype(np.int64) @ w.T.astype(np.int64)).astype(np.float64)
    assert (want != exact).sum() > rows  # the wrap happens (rows 0, 2, 3 against tokens 4, 5, ...)
    n = nb * 32
    for path in (2, 1):  # the GEMM, the windows
        got = mm("Q8_0", raw, act, n, "avx2", path).astype(np.float64)
        bad = np.argwhere(got != want)
        assert bad.size == 0, (path, bad[0], got[tuple(bad[0])], want[tuple(bad[0])])
    if lib.cpu_info()["selected"] == "avx2":  # an AVX2 CPU without VNNI: ggml's vec_dot is its AVX2 path
        assert np.array_equal(ggml.vec_dot("Q8_0", raw, act, n).astype(np.float64), want)


@AVX2_Q8
def test_q8_0_avx2_gemm_tiles_and_tails(ggml, rng):
    """150 rows (row tiles of 64, 64 and 22: the last five 4-row microkernels and a 2-row tail),
    tokens 1..40 and 64 (lane tails), one and two threads (I3), ggml's bytes with some codes set
    to -128 (ggml's quantizer never writes it; other GGUF writers may)."""
    rows, nb = 150, 9
    n = nb * 32
    raw = ggml.quantize("Q8_0", rng.standard_normal((rows, n)).astype(np.float32)).copy()
    codes = raw.reshape(rows, nb, 34)[:, :, 2:]
    codes[rng.random(codes.shape) < 0.05] = 0x80
    act = q8k(rng.standard_normal((64, n)) * 3.0, "avx2", "Q8_0")
    for nt in list(range(1, 41)) + [64]:
        want = mm("Q8_0", raw, act[:nt], n, "avx2", 1)
        check_same(mm("Q8_0", raw, act[:nt], n, "avx2", 2), want, f"nt={nt}", "Q8_0", n)
        if nt in (17, 64):
            check_same(mm("Q8_0", raw, act[:nt], n, "avx2", 2, threads=2), want, f"nt={nt}, 2 threads", "Q8_0", n)
