"""The R8 layouts (csrc/repack.h) of Q4_K, Q5_K and IQ4_XS (8 rows x super-blocks) and of Q4_0, Q4_1 and
Q8_0 (8 rows x pairs of blocks): the engine repacks those matrices at load where the selected level
has kernels for them (Q4_K, Q4_0 and Q4_1 from avx2: csrc/x86/avx2/kq_r8.cpp and lg_r8.cpp; all six at avx512:
csrc/x86/avx512/kq_r8.cpp and lg_r8.cpp; their GEMMs' decode in csrc/x86/gemm.inl). Every (row, token) result must be bitwise the format's own
entry's on the rows as the file has them (I2, I3, I8): the kernels on any row range and thread count, every window
and the GEMM (with and without a tail), and whole models (dense and MoE, prompt chunks and decode steps) with and
without LOWBIT_NO_REPACK=1. A format's tests are skipped where the selected level has no kernels for its layout
(Q4_K, Q4_0, Q4_1: the CPU lacks avx2; the others: avx512f + avx512vnni + avx512vl)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lowbit import kernels
from lowbit._native import lib
from lowbit.synth import synth_dense, synth_moe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = kernels.repacked_layouts()
R8 = "Q4_K" in LAYOUTS
FORMATS = ["Q4_K", "Q5_K", "Q4_0", "Q4_1", "Q8_0", "IQ4_XS"]
# the level whose R8 kernels run (avx2vnni runs avx2's: it adds none)
R8_LEVEL = "avx512" if "Q5_K" in LAYOUTS else "avx2"
# the layouts avx2 (and avx2vnni) has kernels for
AVX2_LAYOUTS = ["Q4_K", "Q4_0", "Q4_1"]


def needs_layout(*fmts):
    """Skip unless the selected level has kernels for every one of these formats' R8 layouts."""
    missing = [f for f in fmts if f not in LAYOUTS]
    if missing:
        flags = "avx2" if set(missing) <= set(AVX2_LAYOUTS) else "avx512f + avx512vl + avx512vnni"
        pytest.skip(f"the R8 kernels of {', '.join(missing)} need {flags} (or LOWBIT_NO_REPACK / a lower "
                    "LOWBIT_MAX_ISA is set)")
LEGACY = ("Q4_0", "Q4_1", "Q8_0")
ID = {"Q4_K": 12, "Q5_K": 13, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "IQ4_XS": 23}
ACT = {"Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q8_0": "Q8_0", "IQ4_XS": "Q8_K"}
# widths: k-quants whole super-blocks; the legacy pairs of blocks (n / 64 pairs: 1, 3, 9 and 32,
# so that whole runs of 4 pairs, and 1, 2 or 3 left over, all occur)
WIDTHS = {"Q4_K": (256, 768, 2048), "Q5_K": (256, 768, 2048), "IQ4_XS": (256, 768, 2048), "Q4_0": (64, 192, 576, 2048),
          "Q4_1": (64, 192, 576, 2048), "Q8_0": (64, 192, 576, 2048)}


def kq_rows(fmt, rng, rows, n, scale=1.0):
    w = (rng.standard_normal((rows, n)) * scale).astype(np.float32)
    rb = kernels.get_format(fmt).row_bytes(n)
    return np.ascontiguousarray(kernels.quantize(fmt, w)[: rows * rb]).reshape(rows, rb)


def q4k_rows(rng, rows, n, scale=1.0):
    return kq_rows("Q4_K", rng, rows, n, scale)


@pytest.mark.parametrize("fmt", FORMATS)
def test_repack_is_a_permutation_of_the_bytes(fmt):
    rng = np.random.default_rng(0)
    for n, rows in zip(WIDTHS[fmt], (8, 24, 16, 8)):
        raw = kq_rows(fmt, rng, rows, n)
        r8 = lib.repack_r8(ID[fmt], raw, n)
        assert r8.shape == raw.shape
        assert np.array_equal(np.sort(r8.reshape(-1)), np.sort(raw.reshape(-1)))  # same bytes, moved
        assert not np.array_equal(r8, raw)
        assert np.array_equal(lib.repack_r8(ID[fmt], r8, n, back=True), raw)
        flat = r8.reshape(-1)
        if fmt in LEGACY:
            # pair 0 of rows 0..7: lane l = 2j + h is row j's block h: its d at 2l, its m at 32 + 2l
            # (Q4_1), its code dword k at (the group's codes) + 64k + 4l
            blk = kernels.get_format(fmt).bytes
            gqs, qs = {"Q4_0": (32, 2), "Q4_1": (64, 4), "Q8_0": (32, 2)}[fmt]
            for j in range(8):
                for h in range(2):
                    lane, b = 2 * j + h, h * blk
                    assert bytes(flat[2 * lane:2 * lane + 2]) == bytes(raw[j, b:b + 2])
                    if fmt == "Q4_1":
                        assert bytes(flat[32 + 2 * lane:34 + 2 * lane]) == bytes(raw[j, b + 2:b + 4])
                    for k in (0, 3):
                        o = gqs + 64 * k + 4 * lane
                        assert bytes(flat[o:o + 4]) == bytes(raw[j, b + qs + 4 * k:b + qs + 4 * k + 4])
            continue
        # super-block 0 of rows 0..7: d of row j at 2j, its first code dword at qs + 4j (Q5_K: its
        # first qh dword at 128 + 4j; IQ4_XS: scales_h at 16 + 2j, scales_l at 32 + 4j, code dword i
        # at 64 + 32i + 4j)
        qs = {"Q4_K": (128, 16), "Q5_K": (384, 48), "IQ4_XS": (64, 8)}[fmt]  # (the group's codes, the super-block's)
        for j in range(8):
            assert bytes(flat[2 * j:2 * j + 2]) == bytes(raw[j, 0:2])
            assert bytes(flat[qs[0] + 4 * j:qs[0] + 4 + 4 * j]) == bytes(raw[j, qs[1]:qs[1] + 4])
            if fmt == "Q5_K":
                assert bytes(flat[128 + 4 * j:132 + 4 * j]) == bytes(raw[j, 16:20])
            if fmt == "IQ4_XS":
                assert bytes(flat[16 + 2 * j:18 + 2 * j]) == bytes(raw[j, 2:4])
                assert bytes(flat[32 + 4 * j:36 + 4 * j]) == bytes(raw[j, 4:8])
                for i in (1, 5, 31):
                    o = 64 + 32 * i + 4 * j
                    assert bytes(flat[o:o + 4]) == bytes(raw[j, 8 + 4 * i:12 + 4 * i])
    with pytest.raises(ValueError, match="multiple of 8 rows"):
        lib.repack_r8(ID[fmt], kq_rows(fmt, rng, 12, WIDTHS[fmt][0]), WIDTHS[fmt][0])
    if fmt in LEGACY:  # a row of one block: no pair
        with pytest.raises(ValueError, match="multiple of 64 values"):
            lib.repack_r8(ID[fmt], kq_rows(fmt, rng, 8, 32), 32)
    with pytest.raises(ValueError, match="Q6_K has no R8 layout"):
        lib.repack_r8(14, np.zeros((8, 210), np.uint8), 256)


@pytest.mark.parametrize("fmt,n", [(f, n) for f in FORMATS for n in WIDTHS[f]])
def test_r8_kernels_bitwise_the_format_entry(fmt, n):
    needs_layout(fmt)
    rng = np.random.default_rng(n)
    bad = []
    fid, kid = ID[fmt], kernels.R8_KERNEL_IDS[fmt]
    for rows in (8, 40, 264):
        raw = kq_rows(fmt, rng, rows, n, scale=2.0)
        for nt in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 20, 33, 40):
            # activations at full scale (codes +-127) and small ones, a worst case of the integer sums
            x = (rng.standard_normal((nt, n)) * (100.0 if nt % 2 else 0.01)).astype(np.float32)
            act = kernels.quantize_act(ACT[fmt], x)
            for r0, r1 in ((0, rows), (3, rows - 5), (rows // 2, rows), (1, 2)):
                if r1 <= r0:
                    continue
                for threads in (1, 2):
                    want = kernels.matmul_act(fmt, raw, act, n, r0=r0, r1=r1, threads=threads)
                    got = kernels.matmul_act(fmt, raw, act, n, r0=r0, r1=r1, threads=threads, repacked=True)
                    if not np.array_equal(got, want):
                        t, r = np.argwhere(got != want)[0]
                        bad.append(f"rows {rows} nt {nt} [{r0}, {r1}) threads {threads}: first at token {t} "
                                   f"row {r}: {got[t, r]!r} vs {want[t, r]!r}")
            if (fmt in LEGACY or fmt in ("IQ4_XS", "Q4_K")) and rows == 40 and nt in (1, 17, 40):
                # their GEMM (gated at 256 tokens; IQ4_XS's at its format's gate) on every token,
                # against the format's own windows and GEMM (paths 3, 2: csrc/bindings.cpp with_path)
                for path in (2, 3):
                    want = np.zeros((nt, rows), np.float32)
                    lib.matmul_act(fid, raw, act, n, 1.0, want, 0, rows, 2, -1, path, False)
                    got = np.zeros((nt, rows), np.float32)
                    lib.matmul_act(fid, raw, act, n, 1.0, got, 0, rows, 2, -1, 2, True)
                    if not np.array_equal(got, want):
                        t, r = np.argwhere(got != want)[0]
                        bad.append(f"R8 GEMM nt {nt} vs path {path}: first at token {t} row {r}: {got[t, r]!r} vs "
                                   f"{want[t, r]!r}")
    assert not bad, "\n".join(bad[:10])
    assert lib.kernel(kid, 1)[0].startswith(f"rows_{fmt.lower()}_r8_")


def test_r8_kernel_names_and_gemm():
    needs_layout("Q4_K")
    # avx2 (and avx2vnni): Q4_K's, Q4_0's and Q4_1's layouts; avx512: all six
    assert sorted(LAYOUTS) == sorted(FORMATS if R8_LEVEL == "avx512" else AVX2_LAYOUTS)
    for fmt in LAYOUTS:
        kid, act = kernels.R8_KERNEL_IDS[fmt], ACT[fmt].lower()
        assert lib.kernel(kid, 1)[0] == f"rows_{fmt.lower()}_r8_{act}_{R8_LEVEL}"
        assert lib.gemm_kernel(kid)[0].startswith(f"gemm_{fmt.lower()}_r8_{act}_")
        if fmt in LEGACY and R8_LEVEL == "avx512":  # 16 tokens a window: 4 passes of 4 on each group
            assert lib.wide_kernel(kid)[0] == f"rows16_{fmt.lower()}_r8_{act}_avx512"
        elif fmt in LEGACY:  # avx2: windows of 8 (its 16-token window measured slower)
            assert lib.wide_kernel(kid) is None


def test_repacked_needs_a_layout_and_rows_of_8():
    rng = np.random.default_rng(1)
    act = kernels.quantize_act("Q8_K", rng.standard_normal((1, 256)).astype(np.float32))
    if R8:
        with pytest.raises(ValueError, match="multiple of 8 rows"):
            kernels.matmul_act("Q4_K", q4k_rows(rng, 12, 256), act, 256, repacked=True)
    w8 = np.ascontiguousarray(kernels.quantize("Q5_0", rng.standard_normal((8, 256)).astype(np.float32))).reshape(8, -1)
    with pytest.raises(ValueError, match="no repacked layout"):
        kernels.matmul_act("Q5_0", w8, kernels.quantize_act("Q8_0", np.ones((1, 256), np.float32)), 256,
                           repacked=True)


# A model's logits (a prompt chunk, all rows; then 3 decode steps) and the kernels that ran, in a
# child process (LOWBIT_NO_REPACK is read once per process)
CHILD = r"""
import json, sys
import numpy as np
import lowbit
from lowbit import kernels
m = lowbit.load(sys.argv[1], n_ctx=256, threads=2)
kernels.reset_stats()
ids = [int(t) for t in np.random.default_rng(5).integers(10, 500, 40)]
out = [m.forward(ids, all_logits=True).tolist()]
for t in (7, 8, 9):
    out.append(m.forward([t]).tolist())
ks = sorted({s["kernel"] for s in kernels.stats() if s.get("format") in kernels.R8_FORMATS})
print(json.dumps({"logits": out, "kernels": ks, "repack": list(m.repack), "dropped": m.repack_dropped}))
"""


def child(path, no_repack):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("LOWBIT_NO_REPACK", None)
    if no_repack:
        env["LOWBIT_NO_REPACK"] = "1"
    r = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


# the formats of each model whose matrices take an R8 layout at avx512 (at avx2: AVX2_LAYOUTS')
MODEL_R8 = {"dense": {"Q4_K"}, "dense_q5": {"Q5_K"}, "moe": {"Q4_K", "Q5_K"}, "dense_legacy": {"Q4_1", "Q8_0"},
            "dense_q4_0": {"Q4_0", "Q8_0"}, "dense_iq4_xs": {"IQ4_XS"}}


@pytest.mark.parametrize("kind", list(MODEL_R8))
def test_models_bitwise_with_and_without_repacking(tmp_path, kind):
    if not MODEL_R8[kind] & set(LAYOUTS):
        needs_layout(*sorted(MODEL_R8[kind]))
    path = tmp_path / f"{kind}.gguf"
    if kind == "dense":
        synth_dense(path, layers=2, dim=256, ffn=768, heads=4, kv_heads=2, wtype="Q4_K", head_type="Q4_K",
                    embd_type="F16", vocab=None, seed=3)
    elif kind == "dense_q5":  # Q5_K matrices beside a Q6_K head (no layout: read as it is), as Q5_K_M's
        synth_dense(path, layers=2, dim=256, ffn=768, heads=4, kv_heads=2, wtype="Q5_K", head_type="Q6_K",
                    embd_type="F16", vocab=None, seed=5)
    elif kind == "dense_legacy":  # the default model's formats: Q4_1 matrices, a tied Q8_0 head
        synth_dense(path, layers=2, dim=192, ffn=576, heads=3, kv_heads=1, wtype="Q4_1", tied=True,
                    embd_type="Q8_0", vocab=None, seed=6)
    elif kind == "dense_q4_0":  # Q4_0 beside a width (ffn 320: 5 blocks) that takes no pairs of blocks
        synth_dense(path, layers=2, dim=256, ffn=320, heads=4, kv_heads=2, wtype="Q4_0", head_type="Q8_0",
                    embd_type="F16", vocab=None, seed=7)
    elif kind == "dense_iq4_xs":  # IQ4_XS matrices beside a Q6_K head (no layout), as IQ4_XS files have
        synth_dense(path, layers=2, dim=512, ffn=768, heads=8, kv_heads=2, wtype="IQ4_XS", head_type="Q6_K",
                    embd_type="F16", vocab=None, seed=8)
    else:
        synth_moe(path, arch="qwen3moe", wtype="Q4_K", expert_type="Q5_K", head_type="Q4_K", embd_type="F16",
                  top_k=4, seed=4)
    on, off = child(path, False), child(path, True)
    want = {f.lower() for f in MODEL_R8[kind] & set(LAYOUTS)}  # (at avx2: the MoE's Q4_K matrices, no Q8_0 head)
    assert {k.split("_r8")[0].split("_", 1)[1] for k in on["kernels"] if "_r8" in k} == want, on["kernels"]
    assert not any("r8" in k for k in off["kernels"]), off["kernels"]
    assert on["repack"][0] and not off["repack"][0] and "LOWBIT_NO_REPACK" in off["repack"][1]
    assert on["dropped"] > 0 and off["dropped"] == 0  # the mapped file's copies of them given back
    for i, (a, b) in enumerate(zip(on["logits"], off["logits"])):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.array_equal(a, b), f"call {i}: logits differ at {np.argwhere(a != b)[:3].tolist()}"
