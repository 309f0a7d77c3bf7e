"""A/B of the sampler's per-token cost, two versions of src/lowbit/sampling.py interleaved on 49152
logits (the default model's vocabulary) and a 200-token history. BENCHMARKS.md, "Sampling".

    git show <rev>:src/lowbit/sampling.py > /tmp/sampling_old.py
    python tools/ab_sampling.py /tmp/sampling_old.py src/lowbit/sampling.py
"""
import importlib.util, time, sys
import numpy as np
def load(p, name):
    spec = importlib.util.spec_from_file_location(name, p); m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m
old, new = load(sys.argv[1], "old"), load(sys.argv[2], "new")
z = (np.random.default_rng(0).standard_normal(49152) * 3).astype(np.float32)
hist = list(range(200))
for kw in (dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05), dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)):
    res = {"old": [], "new": []}
    so, sn = old.Sampler(seed=1, **kw), new.Sampler(seed=1, **kw)
    for i in range(150):
        for k, s in (("old", so), ("new", sn)):
            t = time.perf_counter(); s.sample(z, hist); res[k].append(time.perf_counter() - t)
    o, n = np.median(res["old"]) * 1e3, np.median(res["new"]) * 1e3
    print(f"{str(kw):62s} old {o:6.3f} ms  new {n:6.3f} ms  {o / n:5.1f}x")
