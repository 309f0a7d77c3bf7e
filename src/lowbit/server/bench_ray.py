"""`lowbit bench serve --ray`: `lowbit serve --ray` (Ray Serve replicas) against one `lowbit serve`.

Configurations, run one after the other (never at once) on loopback, same model and clients:
  one process     lowbit serve -t T --parallel C
  replicas=1      lowbit serve --ray --replicas 1 -t T, --ingress proxy, then haproxy
  replicas=N      lowbit serve --ray --replicas N -t T/N each, proxy, then haproxy
  (and with --coalesce K: the proxy configuration again with K tokens per SSE event)
each measured as `lowbit bench serve` does (server/bench.py: 1 streaming client, then --clients
concurrent ones, --tokens tokens each, greedy, medians over --rounds). Reported: aggregate tok/s and
TTFT, and each configuration's ratio to one process.
"""
from __future__ import annotations

import os
import sys


def bench_serve_ray(model_path: str | None, threads: int, clients: int, tokens: int, rounds: int, replicas: int,
                    coalesce: int, out=sys.stdout) -> dict:
    from .. import gguf
    from ..model import default_model_path
    from ..tokenizer import Tokenizer
    from .bench import _measure, _Proc
    path = model_path or default_model_path()
    with gguf.open(path) as f:
        eog = Tokenizer.from_gguf(f.metadata).eog_ids
    bias = {str(t): -100 for t in sorted(eog)}
    base = [sys.executable, "-m", "lowbit.cli", "serve", "-m", path, "--parallel", str(clients), "--ctx", "1024",
            "--no-access-log"]
    per = max(1, threads // replicas)
    configs = [("one process", base + ["-t", str(threads)]),
               ("ray 1 replica, proxy", base + ["-t", str(threads), "--ray", "--replicas", "1"]),
               ("ray 1 replica, haproxy", base + ["-t", str(threads), "--ray", "--replicas", "1", "--ingress", "haproxy"])]
    if replicas > 1:
        configs += [(f"ray {replicas} replicas, proxy", base + ["-t", str(per), "--ray", "--replicas", str(replicas)]),
                    (f"ray {replicas} replicas, haproxy", base + ["-t", str(per), "--ray", "--replicas", str(replicas),
                                                                  "--ingress", "haproxy"])]
    if coalesce > 1:
        configs.append((f"ray 1 replica, proxy, coalesce {coalesce}",
                        base + ["-t", str(threads), "--ray", "--replicas", "1", "--coalesce", str(coalesce)]))
    print(f"# {os.path.basename(path)}, {threads} threads in all, {clients} streaming clients x {tokens} tokens, "
          f"loopback, greedy; median of {rounds} rounds", file=out, flush=True)
    res = {}
    for name, argv in configs:
        try:
            p = _Proc(argv, "/health")
        except RuntimeError as e:
            print(f"  {name}: did not start: {e}", file=out, flush=True)
            continue
        try:
            res[name] = _measure(name, p.url, clients, tokens, rounds, bias, out)
        finally:
            p.stop()
    if "one process" not in res:
        return res
    ref = res["one process"]
    print(file=out)
    print(f"{'':40} {'1 client tok/s':>15} {f'{clients} clients tok/s':>17} {'TTFT p50 ms':>12} "
          f"{'ratio 1 / many':>15}", file=out)
    for name, r in res.items():
        print(f"{name:40} {r['one']:15.1f} {r['many']:17.1f} {r['ttft50'] * 1e3:12.0f} "
              f"{r['one'] / ref['one']:7.2f} / {r['many'] / ref['many']:.2f}", file=out)
    la = os.getloadavg()
    print(f"load average at the end: {la[0]:.1f} {la[1]:.1f} {la[2]:.1f} on {os.cpu_count()} CPUs", file=out)
    return res
