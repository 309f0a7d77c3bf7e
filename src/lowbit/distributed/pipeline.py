"""A model as a pipeline of Ray actors: lowbit.load(path, stages=K), lowbit serve --ray --stages K.

For a model larger than one machine's RAM: the layers are split into K contiguous ranges of about
equal bytes (split_layers); stage k is one Ray actor that opens the same GGUF (the same path on
every machine) and binds only the tensors of its layers (the first also the token embedding, the
last the output norm and head: it never reads another stage's bytes), with an engine
(csrc/engine.h forward_layers) that keeps its layers' KV cache and recurrent states for every
slot. A step's tokens enter stage 0 as token ids; the residual stream, float32 [T][dim] (a few KB
per token), crosses to the next stage; the last returns the logits. Only activations move: each
layer's weights, experts included, stay where they are, so a step costs K-1 hops, not one per layer
or per expert.

PipelineEngine has the native engine's interface (forward, forward_batch, kv_bytes / kv_copy,
rstate_*), so lowbit.Model, generate, the scheduler and the server run on it unchanged. The stages
are chained as a Ray Compiled Graph (shared-memory channels, ~0.3-0.6 ms a hop instead of ~1.2 ms
for an actor call; LOWBIT_RAY_COMPILED=0: plain actor calls). A forward_batch over several slots is
cut into micro-batches (whole slots each, up to K of them, of at least 16 tokens: prompt chunks), all
submitted before any result is read: while stage 1 runs micro-batch 0, stage 0 runs micro-batch 1.
(Decode steps go whole: a stage's cost there is reading its weights, once per call. Keeping every
stage busy during decode needs K groups of requests stepping independently, a scheduler that keeps
K steps in flight: not done.) A token's
logits are bitwise what one process gives: the same code runs the same per-token arithmetic, the
residual stream crosses as exact float32 bytes, and a token's result does not depend on what else is
in its batch (DESIGN.md I2, I8).
"""
from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np

from .cluster import Cluster, import_ray


def layer_bytes(f, n_layer: int) -> list[int]:
    """Bytes of each layer's tensors (blk.N.*) in an opened GGUF file."""
    out = [0] * n_layer
    for name, t in f.tensors.items():
        if name.startswith("blk."):
            i = int(name.split(".", 2)[1])
            if i < n_layer:
                out[i] += int(t.raw.nbytes)
    return out


def split_layers(sizes: list[int], k: int, head: int = 0) -> list[tuple[int, int]]:
    """K contiguous non-empty layer ranges [l0, l1) minimising the largest stage's bytes (the last
    stage also streams the output head's `head` bytes every step); ties: the earliest cut."""
    n = len(sizes)
    if not 1 <= k <= n:
        raise ValueError(f"stages must be in 1..{n} (the model's layers), got {k}")
    pre = [0]
    for s in sizes:
        pre.append(pre[-1] + s)
    inf = float("inf")
    # best[j][i]: the smallest max-stage bytes splitting layers [0, i) into j stages
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            extra = head if (j == k and i == n) else 0
            for p in range(j - 1, i):
                v = max(best[j - 1][p], pre[i] - pre[p] + extra)
                if v < best[j][i]:
                    best[j][i], cut[j][i] = v, p
    ranges, i = [], n
    for j in range(k, 0, -1):
        p = cut[j][i]
        ranges.append((p, i))
        i = p
    return ranges[::-1]


class Stage:
    """One pipeline stage (a Ray actor): layers [l0, l1) of the GGUF at `path` in an engine of
    n_slots slots of n_ctx positions. run() takes the step's message and returns the next
    stage's (the residual stream in "x") or, in the last stage, the logits."""

    def __init__(self, path: str, n_ctx: int, n_slots: int, layers: tuple[int, int], threads: int | None,
                 lookahead: bool, memory: str = "mmap", mlock: bool = False):
        from ..model import Model
        self.m = Model(path, n_ctx=n_ctx, threads=threads, n_slots=n_slots, layers=tuple(layers),
                       lookahead=lookahead, memory=memory, mlock=mlock)
        self.memory = memory
        self.e, c = self.m.engine, self.m.config
        self.dim, self.vocab = c.dim, c.vocab
        self.last = layers[1] == c.n_layer
        self.busy, self.calls = 0.0, 0  # seconds in forward_layers, calls (bench pipeline)

    def info(self) -> dict:
        """Who and where: pid, layers, bytes of weights this stage binds, resident memory."""
        import resource
        return {"pid": os.getpid(), "layers": list(self.m.layers), "memory": self.memory,
                "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                "weight_bytes": int(sum(a.nbytes for a in self.m._keep))}

    def run(self, msg: dict):
        tokens, slots, pos, rows = msg["tokens"], msg["slots"], msg["pos"], msg["rows"]
        t0 = time.perf_counter()
        if self.last:
            res = np.empty((len(rows), self.vocab), np.float32)
            self.e.forward_layers(tokens, slots, pos, msg.get("x"), None, rows, res)
        else:
            out = np.empty((len(tokens), self.dim), np.float32)
            self.e.forward_layers(tokens, slots, pos, msg.get("x"), out, rows, None)
            res = {**msg, "x": out}
        self.busy += time.perf_counter() - t0
        self.calls += 1
        return res

    def timing(self, reset: bool = False) -> tuple[float, int]:
        """(seconds in forward_layers, calls) since the last reset."""
        r = (self.busy, self.calls)
        if reset:
            self.busy, self.calls = 0.0, 0
        return r

    # the slot state this stage holds (the prefix cache, hybrid models' rewinds)
    def kv_bytes(self, n: int) -> int:
        return int(self.e.kv_bytes(n))

    def kv_copy(self, slot: int, p0: int, n: int, buf: np.ndarray | None):
        if buf is None:  # save
            out = np.empty(self.e.kv_bytes(n), np.uint8)
            self.e.kv_copy(slot, p0, n, out, True)
            return out
        self.e.kv_copy(slot, p0, n, np.array(buf, np.uint8), False)  # (a writable copy: Ray hands it over read-only)
        return None

    def rstate_bytes(self) -> int:
        return int(self.e.rstate_bytes())

    def rstate_pos(self, slot: int) -> int:
        return int(self.e.rstate_pos(slot))

    def rstate_copy(self, slot: int, buf: np.ndarray | None):
        if buf is None:
            out = np.empty(self.e.rstate_bytes(), np.uint8)
            self.e.rstate_copy(slot, out, True)
            return out
        self.e.rstate_copy(slot, np.array(buf, np.uint8), False)  # (a writable copy: Ray hands it over read-only)
        return None


MICRO_BATCH_MIN_TOKENS = 16


class PipelineEngine:
    """The native engine's interface over K stage actors (see the module doc). Starts a local Ray
    cluster when this process is not connected to one (and stops it on close())."""

    def __init__(self, path: str, config, n_ctx: int, n_slots: int, stages: int, threads: int | None = None,
                 lookahead: bool = False, address: str | None = None, compiled: bool | None = None,
                 placement: str = "SPREAD", memory: str = "mmap", mlock: bool = False):
        from .. import gguf
        c = config
        self.config, self.n_ctx, self.n_slots, self.n_stages = c, n_ctx, n_slots, int(stages)
        f = gguf.open(path)
        head = f.tensors["output.weight" if "output.weight" in f.tensors else "token_embd.weight"].raw.nbytes
        self.ranges = split_layers(layer_bytes(f, c.n_layer), self.n_stages, head=int(head))
        del f
        self.cluster = Cluster(address)
        self.stages, self.pg, self._dag = [], None, None
        try:  # (a stage that fails to load: its actors, the placement group and the cluster are released)
            ray = self.ray = self.cluster.ray
            from ray.util.placement_group import placement_group, remove_placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
            self._remove_pg = remove_placement_group
            # one bundle per stage; SPREAD puts them on different machines when there are several
            # (STRICT_SPREAD would refuse a one-machine cluster)
            self.pg = placement_group([{"CPU": 1}] * self.n_stages, strategy=placement)
            ray.get(self.pg.ready(), timeout=120)
            actor = ray.remote(Stage)
            self.stages = [actor.options(num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=i)).remote(path, n_ctx, n_slots, r, threads, lookahead,
                                                                      memory, mlock)
                for i, r in enumerate(self.ranges)]
            self.stage_info = ray.get([s.info.remote() for s in self.stages])  # (waits for every load; raises its error)
            if compiled is None:
                compiled = os.environ.get("LOWBIT_RAY_COMPILED", "1") != "0"
            self._dag = None
            if compiled:
                from ray.dag import InputNode
                with InputNode() as inp:
                    node = inp
                    for s in self.stages:
                        node = s.run.bind(node)
                # a stage may take long on a big prompt chunk (Ray's default waits: 10 s); micro-batches
                # in flight: up to K per forward_batch
                self._dag = node.experimental_compile(_submit_timeout=3600,
                                                      _max_inflight_executions=max(10, 2 * self.n_stages))
        except BaseException:
            PipelineEngine._shutdown(self._dag, self.stages, self.pg, getattr(self, "_remove_pg", lambda pg: None),
                                     self.cluster, self.cluster.ray)
            raise
        self._lock = threading.Lock()  # one forward at a time (as the native engine)
        self._closed = False
        self._finalizer = weakref.finalize(self, PipelineEngine._shutdown, self._dag, self.stages, self.pg,
                                           self._remove_pg, self.cluster, ray)

    # -- the native engine's interface -----------------------------------------------------
    @property
    def hybrid(self) -> bool:
        return bool(self.config.hybrid)

    @property
    def layer_range(self) -> tuple[int, int]:
        return 0, self.config.n_layer

    def validate(self) -> str:
        return ""

    def _submit(self, msg: dict):
        if self._dag is not None:
            return self._dag.execute(msg)
        ref = msg
        for s in self.stages:
            ref = s.run.remote(ref)
        return ref

    def forward(self, tokens: np.ndarray, pos: int, logits: np.ndarray, all_logits: bool) -> None:
        T = len(tokens)
        rows = np.arange(T, dtype=np.int32) if all_logits else np.array([T - 1], np.int32)
        self.forward_batch(np.asarray(tokens, np.int32), np.zeros(T, np.int32), np.arange(pos, pos + T, dtype=np.int32),
                           rows, logits)

    def forward_batch(self, tokens, slots, pos, out_rows, logits) -> None:
        """As the native forward_batch; the batch is cut into micro-batches of whole slots."""
        if self._closed:
            raise RuntimeError("the pipeline is closed")
        tokens, slots, pos, out_rows = (np.asarray(a, np.int32) for a in (tokens, slots, pos, out_rows))
        if not (len(tokens) == len(slots) == len(pos)) or logits.shape != (len(out_rows), self.config.vocab):
            raise ValueError("forward_batch: tokens, slots, pos and the logits buffer disagree in shape")
        order = list(dict.fromkeys(slots.tolist()))  # the batch's slots, first appearance first
        # Micro-batches pay off where a stage's time grows with the tokens (prompt chunks): stage 0
        # runs micro-batch 1 while stage 1 runs micro-batch 0. A decode step (a token per slot) is
        # bound by reading the weights, once per call: cut in M it would read them M times per
        # stage. So: as many as the stages, of at least MICRO_BATCH_MIN_TOKENS tokens each.
        m = max(1, min(self.n_stages, len(order), len(tokens) // MICRO_BATCH_MIN_TOKENS))
        group_of = {s: i * m // len(order) for i, s in enumerate(order)}  # contiguous runs of slots
        g = np.fromiter((group_of[s] for s in slots.tolist()), np.int64, len(slots))
        parts, refs = [], []
        with self._lock:
            for j in range(m):
                idx = np.flatnonzero(g == j)
                # the output rows in this micro-batch, renumbered within it
                mine = np.flatnonzero(g[out_rows] == j) if len(out_rows) else np.empty(0, np.int64)
                local = np.searchsorted(idx, out_rows[mine]).astype(np.int32)
                msg = {"tokens": tokens[idx], "slots": slots[idx], "pos": pos[idx], "rows": local}
                parts.append(mine)
                refs.append(self._submit(msg))  # all in flight before the first result is read
            outs = [self._get(r) for r in refs]
        for mine, lg in zip(parts, outs):
            logits[mine] = lg

    def _get(self, ref):
        return self.ray.get(ref, timeout=None) if self._dag is None else ref.get(timeout=3600)

    def _each(self, method: str, *args):
        return self.ray.get([getattr(s, method).remote(*args) for s in self.stages])

    def kv_bytes(self, n: int) -> int:
        return int(sum(self._each("kv_bytes", n)))

    def kv_copy(self, slot: int, p0: int, n: int, buf: np.ndarray, save: bool) -> None:
        """The stages' KV bytes, concatenated in layer order: the one-engine layout
        [layer][K, V][n][n_kv * head_dim]."""
        sizes = self._each("kv_bytes", n)
        if len(buf) != sum(sizes):
            raise ValueError("kv_copy: the buffer must hold kv_bytes(n) bytes")
        at = np.cumsum([0] + sizes)
        if save:
            for i, part in enumerate(self._each("kv_copy", slot, p0, n, None)):
                buf[at[i]:at[i + 1]] = part
        else:
            self.ray.get([s.kv_copy.remote(slot, p0, n, buf[at[i]:at[i + 1]]) for i, s in enumerate(self.stages)])

    def rstate_bytes(self) -> int:
        return int(sum(self._each("rstate_bytes")))

    def rstate_pos(self, slot: int) -> int:
        return int(self.ray.get(self.stages[0].rstate_pos.remote(slot)))

    def rstate_copy(self, slot: int, buf: np.ndarray, save: bool) -> None:
        """Each stage's recurrent state of the slot (its own position first), concatenated."""
        sizes = self._each("rstate_bytes")
        at = np.cumsum([0] + sizes)
        if save:
            for i, part in enumerate(self._each("rstate_copy", slot, None)):
                buf[at[i]:at[i + 1]] = part
        else:
            self.ray.get([s.rstate_copy.remote(slot, buf[at[i]:at[i + 1]]) for i, s in enumerate(self.stages)])

    def timing(self, reset: bool = False) -> list[tuple[float, int]]:
        """Per stage: (seconds computing, forward calls) since the last reset."""
        return self._each("timing", reset)

    def set_threads(self, t: int) -> None:
        raise NotImplementedError("a pipeline's threads are set when it is loaded (load(threads=N))")

    # -- shutdown --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the stage actors (and the local cluster this engine started)."""
        self._closed = True
        self._finalizer()

    @staticmethod
    def _shutdown(dag, stages, pg, remove_pg, cluster, ray) -> None:
        try:
            if dag is not None:
                dag.teardown()
            for s in stages:
                ray.kill(s)
            remove_pg(pg)
        except Exception:  # noqa: BLE001 - the cluster may be gone already
            pass
        cluster.close()
