"""`lowbit serve --ray`: replicas of the `lowbit serve` app behind Ray Serve (the extra lowbit[ray]).

Each replica is the unchanged Starlette app of app.py with its own model, scheduler and batching
(every replica decodes up to --parallel requests in one batched pass); Ray Serve's proxy routes
requests to them and replaces a replica that dies. Settings (issue 26's feasibility study):

- max_ongoing_requests = --parallel: a replica gets as many requests as it has slots (Serve's
  default, 5, would leave slots idle); the rest wait in Serve's router for the first free one.
- Serve's health check calls the replica's check_health: it fails when the model failed to load,
  the engine thread died, or requests are waiting and no batched step has finished for
  --stuck-after seconds (a stuck engine thread); Serve then replaces the replica.
- --ingress proxy (Serve's default proxy: ~6 ms a request, ~0.9 ms of CPU a streamed token) or
  haproxy (Serve's HAProxy mode: ~1 ms and ~0.15 ms; note that it makes replicas listen on all
  interfaces for HAProxy on other machines). --coalesce N sends up to N tokens per SSE event.
- --ray-address ADDR joins a running cluster; without it a local cluster starts on 127.0.0.1 and
  is stopped on exit (lowbit/distributed/cluster.py: never `ray stop`).
- --stages K: each replica is a pipeline of K Ray actors holding a range of layers each
  (lowbit/distributed/pipeline.py), for a model larger than one machine.

`serve run lowbit.server.ray_serve:build model=PATH parallel=4 replicas=2` deploys the same app
with Serve's own CLI (arguments as key=value; the names of `lowbit serve --ray`'s options).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, fields

APP_NAME = "lowbit"
SHUTDOWN_WAIT_S = 15  # seconds serve.shutdown() gets before the cluster is stopped regardless


@dataclass
class Options:
    """What a deployment is made of (the options of `lowbit serve --ray`)."""
    model: str | None = None
    parallel: int = 4
    ctx: int | None = None
    threads: int | None = None
    alias: str | None = None
    api_key: str | None = None
    step_tokens: int = 64
    queue: int = 256
    cache_mb: float = 256.0
    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas
    stages: int = 1
    coalesce: int = 1
    stuck_after: float = 30.0
    health_period: float = 5.0
    access_log: bool = False
    cors: list[str] | None = field(default=None)
    # the weights in memory and the KV cache, as `lowbit serve` takes them (cli._memory, kv_kwargs):
    # each replica (and each pipeline stage) loads its model with these
    memory: str = "mmap"        # "mmap", "copy" (--no-mmap) or "hugepages"
    mlock: bool = False
    kv: str | None = None
    kv_k: str | None = None
    kv_v: str | None = None

    def check(self) -> str | None:
        """The first problem with these options, or None."""
        for name, v, lo in (("parallel", self.parallel, 1), ("replicas", self.replicas, 1), ("stages", self.stages, 1),
                            ("coalesce", self.coalesce, 1), ("step-tokens", self.step_tokens, 1),
                            ("queue", self.queue, 0)):
            if v < lo:
                return f"--{name} must be >= {lo}, got {v}"
        if self.ctx is not None and self.ctx < 2:
            return f"--ctx must be >= 2, got {self.ctx}"
        if self.threads is not None and self.threads < 1:
            return f"--threads must be >= 1, got {self.threads}"
        if self.memory not in ("mmap", "copy", "hugepages"):
            return f"memory must be mmap, copy or hugepages, got {self.memory!r}"
        from ..model import kv_types
        try:
            quant_kv = kv_types(self.kv, self.kv_k, self.kv_v) != ("f16", "f16")
        except ValueError as e:
            return str(e).replace("kv_k", "--kv-k").replace("kv='f16'", "--kv f16")
        if quant_kv and self.stages > 1:
            return "--stages keeps an f16 KV cache: drop --kv / --kv-k / --kv-v"
        if self.autoscale is not None and not 1 <= self.autoscale[0] <= self.autoscale[1]:
            return f"--autoscale MIN:MAX needs 1 <= MIN <= MAX, got {self.autoscale[0]}:{self.autoscale[1]}"
        if self.stuck_after <= 0 or self.health_period <= 0 or self.cache_mb < 0:
            return "--stuck-after, the health period and --cache-mb must be positive"
        return None


def parse_autoscale(text: str) -> tuple[int, int]:
    lo, sep, hi = str(text).partition(":")
    try:
        if not sep:
            raise ValueError
        return int(lo), int(hi)
    except ValueError:
        raise ValueError(f"--autoscale takes MIN:MAX (e.g. 1:4), got {text!r}") from None


class HealthWatch:
    """Whether a replica's engine is healthy: check(state) returns None or the problem. Stuck:
    requests are running or waiting and the scheduler's step counter has not moved for
    stuck_after seconds (a batched step of --step-tokens tokens takes well under a second on a
    model that fits; a hung native call or a deadlock never finishes one)."""

    def __init__(self, stuck_after: float, clock=time.monotonic):
        self.stuck_after, self.clock = float(stuck_after), clock
        self._steps, self._since = None, clock()

    def check(self, st) -> str | None:
        if st.load_error:
            return f"the model failed to load: {st.load_error}"
        sched = st.scheduler
        if sched is None:
            return None  # loading (the replica's constructor loads the model; this is the app's startup)
        if not sched._thread.is_alive():
            return "the engine thread has stopped"
        s = sched.status()
        now = self.clock()
        if s["active"] == 0 and s["queued"] == 0 or s["steps"] != self._steps:
            self._steps, self._since = s["steps"], now  # idle, or making progress
            return None
        if now - self._since >= self.stuck_after:
            return (f"the engine has finished no step for {now - self._since:.0f} s with {s['active']} running "
                    f"and {s['queued']} waiting requests")
        return None


def _load_kwargs(o: Options) -> dict:
    from ..model import default_model_path
    return dict(path=o.model or default_model_path(), n_ctx=o.ctx, threads=o.threads, n_slots=o.parallel,
                stages=o.stages if o.stages > 1 else None, memory=o.memory, mlock=o.mlock, kv=o.kv, kv_k=o.kv_k,
                kv_v=o.kv_v)


class LowbitReplica:
    """One Serve replica: a lowbit Model (or pipeline) and the `lowbit serve` app over it."""

    def __init__(self, opts: dict):
        from ..model import load
        from .app import _stderr, create_app
        o = Options(**opts)
        kw = _load_kwargs(o)
        self._model = model = load(**kw)  # here, not on the app's thread: the replica is ready when loaded
        model_id = o.alias or os.path.splitext(os.path.basename(kw["path"]))[0]
        self._lowbit_app = create_app(lambda: model, model_id=model_id, parallel=o.parallel, api_key=o.api_key,
                                      step_tokens=o.step_tokens, max_queue=o.queue, cache_mb=o.cache_mb,
                                      cors=o.cors, access_log=_stderr if o.access_log else None,
                                      coalesce=o.coalesce)
        self._watch = HealthWatch(o.stuck_after)

    def __serve_build_asgi_app__(self):
        return self._lowbit_app

    def check_health(self) -> None:
        """Serve's health check: raising marks this replica unhealthy (Serve replaces it)."""
        problem = self._watch.check(self._lowbit_app.state.lowbit)
        if problem:
            raise RuntimeError(problem)

    def __del__(self):
        m = getattr(self, "_model", None)
        if m is not None:
            m.close()


def application(o: Options):
    """The Serve application of these options (deploy with serve.run)."""
    from ray import serve
    cls = serve.ingress(None)(type("LowbitReplica", (LowbitReplica,), {}))
    kw = dict(name="LowbitReplica", max_ongoing_requests=o.parallel, health_check_period_s=o.health_period,
              health_check_timeout_s=max(10.0, o.health_period * 2), graceful_shutdown_timeout_s=5,
              ray_actor_options={"num_cpus": 0 if o.stages > 1 else (o.threads or 1)})
    if o.autoscale is not None:
        kw["autoscaling_config"] = {"min_replicas": o.autoscale[0], "max_replicas": o.autoscale[1],
                                    "initial_replicas": o.autoscale[0], "target_ongoing_requests": o.parallel,
                                    "upscale_delay_s": 2.0, "downscale_delay_s": 60.0}
    else:
        kw["num_replicas"] = o.replicas
    opts = {f.name: getattr(o, f.name) for f in fields(Options)}
    return serve.deployment(**kw)(cls).bind(opts)


def build(args: dict):
    """`serve run lowbit.server.ray_serve:build key=value ...`: the application of those options
    (model, parallel, ctx, threads, replicas, autoscale=MIN:MAX, stages, coalesce, ...)."""
    conv = {f.name: f.type for f in fields(Options)}
    o = Options()
    for k, v in (args or {}).items():
        k = k.replace("-", "_")
        if k not in conv:
            raise ValueError(f"lowbit: unknown option {k!r} (one of {', '.join(sorted(conv))})")
        if k == "autoscale":
            v = parse_autoscale(v)
        elif k in ("model", "alias", "api_key"):
            v = str(v)
        elif k == "access_log":
            v = str(v).lower() in ("1", "true", "yes")
        elif k in ("cache_mb", "stuck_after", "health_period"):
            v = float(v)
        elif k == "cors":
            v = [s for s in str(v).split(",") if s]
        else:
            v = int(v)
        setattr(o, k, v)
    problem = o.check()
    if problem:
        raise ValueError(f"lowbit: {problem}")
    return application(o)


def serve_ray(o: Options, host: str, port: int, address: str | None, ingress: str, out=sys.stderr,
              stop: threading.Event | None = None) -> int:
    """Run the deployment until SIGINT / SIGTERM (or `stop` is set), then take it down: Serve's
    actors, and the local cluster if one was started here. Returns the exit code."""
    from ..distributed import Cluster
    if ingress == "haproxy":  # read by Serve's controller when it starts (the local cluster inherits it)
        os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
        # HAProxy's drain on shutdown (Ray's default: up to 120 s): a few seconds
        os.environ.setdefault("RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S", "5")
    cluster = Cluster(address)
    stop = stop or threading.Event()
    handlers, up = {}, threading.Event()

    # SIGINT / SIGTERM set `stop` from here on, during Serve's start too (serve.run polls with
    # sleeps after the proxy already answers; a SIGTERM there met Ray's own handler, which exits
    # 15): a stop asked for while starting is a clean shutdown once the app is up. A second one
    # while it starts gives up on the start (KeyboardInterrupt), as a first one used to.
    def on_signal(*_):
        if stop.is_set() and not up.is_set():
            raise KeyboardInterrupt
        stop.set()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, on_signal)
    try:
        from ray import serve
        serve.start(http_options={"host": host, "port": port}, logging_config={"log_level": "WARNING"})
        t0 = time.monotonic()
        serve.run(application(o), name=APP_NAME, route_prefix="/", blocking=False)
        n = f"autoscale {o.autoscale[0]}..{o.autoscale[1]}" if o.autoscale else f"{o.replicas}"
        print(f"lowbit serve --ray: http://{host}:{port}/v1 ({n} replica(s) x {o.parallel} parallel sequences"
              f"{f', {o.stages} pipeline stages each' if o.stages > 1 else ''}, ingress {ingress}, "
              f"{'cluster ' + address if address else 'local Ray cluster'}; ready in {time.monotonic() - t0:.1f} s)",
              file=out, flush=True)
        up.set()
        while not stop.wait(0.5):
            pass
        print("lowbit serve --ray: shutting down", file=out, flush=True)
        # Serve's own shutdown, bounded: it can wait on a proxy's drain (HAProxy's hard stop); a
        # local cluster's processes all end with it below anyway
        errors = []

        def down():  # (a joined cluster may serve other applications: remove only ours)
            try:
                serve.delete(APP_NAME) if address else serve.shutdown()
            except Exception as e:  # noqa: BLE001 - reported, the cluster goes next anyway
                errors.append(e)
        t = threading.Thread(target=down, name="serve-shutdown", daemon=True)
        t.start()
        t.join(SHUTDOWN_WAIT_S)
        if t.is_alive() or errors:
            why = f"{type(errors[0]).__name__}: {errors[0]}" if errors else f"still waiting after {SHUTDOWN_WAIT_S} s"
            print(f"lowbit serve --ray: Serve's shutdown: {why}", file=out, flush=True)
    finally:
        cluster.close()
        for sig, h in handlers.items():
            signal.signal(sig, h)
    print("lowbit serve --ray: stopped", file=out, flush=True)
    return 0
