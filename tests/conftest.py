import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import lowbit  # noqa: E402
from lowbit._native import lib  # noqa: E402

ALL_LEVELS = list(lib.levels())  # every level this CPU, build and LOWBIT_MAX_ISA allow
# Levels that replace the GEMM tier only (amx: csrc/x86/amx; its windows, quantizers, attention and
# the rest are the level's below, which the per-level tests cover as that level; but for BF16's tile
# rows, tests/test_amx_bf16.py's): tests/test_gemm.py and tests/test_amx.py take them (ALL_LEVELS);
# the engine runs them where they are selected.
GEMM_ONLY_LEVELS = {"amx"}
LEVELS = [lv for lv in ALL_LEVELS if lv not in GEMM_ONLY_LEVELS]
# Levels whose kernels follow the scalar reference's arithmetic exactly, so their outputs are
# bitwise the reference's: x86 avx and the aarch64 levels (csrc/x86/avx/avx.h, csrc/arm/simd.h).
# The other SIMD levels (avx2, avx2vnni, avx512) share one FMA arithmetic: bitwise equal to each
# other, within I5 of the reference.
REFERENCE_LEVELS = {"avx", "neon", "dotprod", "i8mm"}
FMA_LEVELS = [lv for lv in LEVELS if lv != "scalar" and lv not in REFERENCE_LEVELS]


def own_levels(type_id):
    """The SIMD levels under test whose table has kernels of their own for type_id (avx covers
    only some families: csrc/x86/avx/register.cpp)."""
    isa = list(lib.isa_names())
    return [lv for lv in LEVELS if lv != "scalar" and lib.kernel(type_id, 1, isa.index(lv))[1] == lv]


@pytest.fixture(scope="session")
def ggml():
    from lowbit.ggml_oracle import ggml as get
    return get()


@pytest.fixture
def rng(request):
    # a fixed seed per test id: failures reproduce
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def pytest_report_header(config):
    c = lib.cpu_info()
    return f"lowbit: CPU {c['model']}; levels under test: {', '.join(ALL_LEVELS)} (selected {c['selected']})"


def legacy_extremes(rng, name, rows, nb, pattern):
    """Raw rows of a legacy format (Q4_0 .. Q8_0, IQ4_NL, MXFP4) whose every dot with activation
    codes +-127 under d_a = 1 is an exact integer: code bytes all `pattern` (or random), every
    block's scale 1 (MXFP4: e8m0 128, halved: w = kvalues_mxfp4[code]) and m = 1 (Q4_1 / Q5_1)."""
    from lowbit.formats import BY_NAME
    f = BY_NAME[name]
    if pattern == "random":
        raw = rng.integers(0, 256, (rows, nb, f.bytes), dtype=np.uint8)
    else:
        raw = np.full((rows, nb, f.bytes), pattern, np.uint8)
    one = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    if name == "MXFP4":
        raw[:, :, 0] = 128
    else:
        raw[:, :, 0:2] = one
    if name in ("Q4_1", "Q5_1"):
        raw[:, :, 2:4] = one
    return raw.reshape(rows, nb * f.bytes)


def assert_bitwise(got, want, what, where, a="got", b="want"):
    """got and want ([tokens][rows] floats) bit for bit; else the count and the first that differs."""
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    if bad.size:
        t, r = bad[0]
        raise AssertionError(f"{what}: {len(bad)} outputs differ; first token {t} row {r} ({where}): "
                             f"{a} {got[t, r]!r} {b} {want[t, r]!r}")
