"""Builds compared inside one process: each build's extension module loaded side by side and its
GEMM (or windows) called in rotation on the same rows and activations, one thread, so a burst of
load on a shared host hits every build alike. Prints per build the min and median microseconds
per row and token. (BENCHMARKS.md round (19): the legacy GEMM's unsigned codes and rows.)

    PYTHONPATH=build/dev:src taskset -c 0 python tools/ab_gemm_inproc.py DIR[:PATH],DIR[:PATH],... \
        FORMAT[,FORMAT] N ROWS NT REPS [PATH]

DIR: a build directory holding _lowbit*.so (copy a build's .so into its own directory to keep it);
PATH: matmul's path, 2 the GEMM (default), 1 the windows, 0 as dispatched; per entry (DIR:1) or
for all. FORMAT may end in _R8 (the layout the engine repacks to). Example, the GEMM against the
windows of one build: tools/ab_gemm_inproc.py build/dev:1,build/dev:2 Q5_1 1408 256 32 30
"""
import glob
import importlib.util
import sys

import numpy as np

if len(sys.argv) < 7:
    sys.exit(__doc__)
entries = [e.rsplit(":", 1) if ":" in e else [e, None] for e in sys.argv[1].split(",")]
mods = []
for d, _ in entries:  # (nanobind warns that the second module's types were registered: harmless here)
    so = glob.glob(d + "/_lowbit*.so")
    if not so:
        sys.exit(f"no _lowbit*.so in {d}")
    spec = importlib.util.spec_from_file_location("_lowbit", so[0])
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    mods.append(m)

from lowbit._native import lib  # noqa: E402
from lowbit.bench import _weights  # noqa: E402
from lowbit.formats import BY_NAME, get as get_format  # noqa: E402
from lowbit.ggml_oracle import ggml  # noqa: E402

fmts, n, rows, nt, reps = sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
path = int(sys.argv[7]) if len(sys.argv) > 7 else 2
paths = [int(p) if p is not None else path for _, p in entries]
rng = np.random.default_rng(0)
g = ggml()
for name in fmts:
    r8 = name.upper().endswith("_R8")
    f = get_format(name[:-3] if r8 else name)
    raw = _weights(f, n, rows, rng, g)
    act = lib.quantize_act(BY_NAME[f.act].id, rng.standard_normal((nt, n)).astype(np.float32))
    ts = [[] for _ in mods]
    for i in range(reps):
        for k in range(len(mods)):
            j = (k + i) % len(mods)  # the order rotates: no build always runs first
            ts[j].append(mods[j].bench_matmul(f.id, raw, act, n, 0.5, 1, 1, -1, paths[j], r8))
    per = lambda t: t / (rows * nt) * 1e6  # noqa: E731
    print(name, "  ".join(f"{d}:{p}: min {per(min(t)):.5f} med {per(float(np.median(t))):.5f}"
                          for (d, _), p, t in zip(entries, paths, ts)), flush=True)
