"""I4 by property: for any float32 row (NaN, inf, denormals, ties included), lowbit's
activation quantizers write exactly ggml's bytes, on every level."""
import numpy as np
from conftest import LEVELS
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from lowbit._native import lib
from lowbit.formats import BY_NAME as F

floats = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.integers(-300, 300).map(lambda i: np.float32(i) / np.float32(2)),  # .5 ties
)


@settings(max_examples=150, deadline=None)
@given(row=arrays(np.float32, 256, elements=floats),
       name=st.sampled_from(["Q8_0", "Q8_1", "Q8_K"]), level=st.sampled_from(LEVELS))
def test_quantize_act_bytes_equal_ggml(ggml, row, name, level):
    ours = lib.quantize_act(F[name].id, row[None, :], list(lib.isa_names()).index(level))
    theirs = ggml.from_float(name, row[None, :])
    assert ours.tobytes() == theirs.tobytes(), f"{name}/{level}: row {row.tolist()}"


@settings(max_examples=150, deadline=None)
@given(row=st.integers(1, 300).flatmap(lambda n: arrays(np.float32, n, elements=floats)),
       level=st.sampled_from(LEVELS))
def test_quantize_act_i8s_bytes_equal_reference(row, level):
    """I8_S is lowbit's own format (no ggml counterpart): every level writes the scalar
    reference's bytes, for any length (not only multiples of the SIMD chunk)."""
    idx = list(lib.isa_names()).index(level)
    ours = lib.quantize_act(F["I8_S"].id, row[None, :], idx)
    ref = lib.quantize_act(F["I8_S"].id, row[None, :], 0)
    assert ours.tobytes() == ref.tobytes(), f"I8_S/{level}: row {row.tolist()}"


def test_levels_run_their_own_quantizers():
    """The hypothesis tests above exercise each level's own SIMD quantizer, not an alias."""
    for level in LEVELS:
        idx = list(lib.isa_names()).index(level)
        for name in ["Q8_0", "Q8_1", "Q8_K", "I8_S"]:
            k = lib.quant_act_kernel(F[name].id, idx)
            own = f"quant_act_{name.lower()}_{level}"
            assert k is not None and (k[0] == own or own in lib.cpu_info()["disabled"]), (level, k)
