"""ActOut (csrc/matmul.h): the FFN's down input and the attention output are quantized by the
threads that compute them, block by block, not by the caller after the dispatch. The bytes are the
same either way, so the logits are bitwise the same with LOWBIT_NO_ACT_OUT=1 (the caller's
quantization): prefill chunks, one-token decode and a batched step of several slots; the legacy
Q8_1 / Q8_0 activations (both uses), Q8_K (the FFN only: blocks of 256 > the head's 64 values),
GQA groups and one kv head per head (the per-head path), a q8_0 K cache (the quantized cache's
kernels). With a q8_0 V cache too, V is rotated (llama.cpp's rot_v) and the rotation undone on
the attention output, so there the caller quantizes after it: the switch must change nothing.
The kernel-level test of the GLU side is test_glu's test_glu_output_quantized_by_its_dispatch."""
import os
import subprocess
import sys

import numpy as np
import pytest

_RUN = r"""
import sys
import numpy as np
import lowbit
path, kv, out = sys.argv[1], sys.argv[2], sys.argv[3]
kw = {"f16": {}, "q8_0": {"kv": "q8_0"}, "k8": {"kv_k": "q8_0"}}[kv]
m = lowbit.load(path, n_ctx=128, threads=2, n_slots=3, **kw)
ids = (m.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole.", add_bos=False) * 4)[:40]
res = [m.logits(ids, chunk=40), m.logits(ids, chunk=1)]
for s in range(3):  # three slots at different positions, then one batched decode step
    m.rewind(0, s)
    m.forward_batch([(s, ids[: 5 + 7 * s])])
res += list(m.forward_batch([(s, [ids[20 + s]]) for s in range(3)]))
np.save(out, np.concatenate([np.asarray(r, np.float32).reshape(-1, np.asarray(r).shape[-1]) for r in res]))
"""


def _model(kind, tmp_path):
    from lowbit import synth
    if kind == "default":
        from lowbit.model import default_model_path
        return default_model_path()
    if kind == "q4_k":  # Q8_K activations: the FFN's ActOut (768 = 3 x 256), not the attention's
        return synth.synth_dense(tmp_path / "k.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=2,
                                 wtype="Q4_K", head_type="Q6_K", seed=11)
    # Q8_0 activations, a kv head per head: the per-head attention path at one token
    return synth.synth_dense(tmp_path / "q.gguf", layers=2, dim=512, ffn=768, heads=8, kv_heads=8,
                             wtype="Q4_0", head_type="Q8_0", seed=12)


@pytest.mark.parametrize("kind,kv", [("default", "f16"), ("default", "k8"), ("default", "q8_0"), ("q4_k", "f16"),
                                     ("q4_0_mha", "f16"), ("q4_0_mha", "k8")])
def test_logits_identical_with_and_without_act_out(tmp_path, kind, kv):
    path = _model(kind, tmp_path)
    got = {}
    for tag, extra in (("on", {}), ("off", {"LOWBIT_NO_ACT_OUT": "1"})):
        env = {k: v for k, v in os.environ.items() if k != "LOWBIT_NO_ACT_OUT"}
        env.update(extra)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        out = tmp_path / f"{tag}.npy"
        p = subprocess.run([sys.executable, "-c", _RUN, str(path), kv, str(out)], env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        got[tag] = np.load(out)
    a, b = got["on"], got["off"]
    assert a.shape == b.shape and a.shape[0] == 40 + 40 + 3
    bad = np.argwhere(a.view(np.uint32) != b.view(np.uint32))
    assert bad.size == 0, f"{kind}, kv {kv}: row {bad[0][0]} differs (rows 0-39 prefill, 40-79 decode, 80-82 batched)"
