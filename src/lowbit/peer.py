"""The llama.cpp peer, made in one place: the tests, `lowbit bench e2e|serve` and every other
comparison with llama.cpp (llama-cpp-python) get it from here. The runtime never imports it.

Why a place of its own: on some hosts llama.cpp's *default* configuration crashes. On Sapphire
Rapids-class Xeons (AMX-INT8/BF16) its extra buffer types -- the AMX tiles and the weight
repacking, `llama_model_params.use_extra_bufts` -- segfault inside `llama_decode` (seen with
llama-cpp-python 0.3.36 on SmolLM2 Q4_1), while llama.cpp with them off runs. So:

1. Before first use of a model, `config()` runs a child process that loads the model in
   llama.cpp's default configuration and runs a short prefill and a few decode steps. If the
   child dies, the peer runs with the extra buffer types off, and says so in one line:
   `llama.cpp peer: extra buffer types off (their AMX/repack path crashes on this CPU: SIGSEGV)`.
2. The verdict is cached for the whole process tree in the environment variable LOWBIT_PEER
   (`<key>=on|off;...`, the key being the model's set of tensor types, which is what selects
   the repack/AMX paths), so a test session or a bench probes once per kind of model, and
   children (the server bench's llama_cpp.server, the bench worker) inherit it.
   LOWBIT_PEER_EXTRA_BUFTS=on|off overrides the probe.
3. Benchmarks run llama.cpp in a child process (`Worker`; `server_argv` for llama_cpp.server),
   so a crash the probe did not foresee cannot take lowbit down: it is reported as
   `peer crashed: ... SIGSEGV` and the bench prints lowbit's side.

LOWBIT_PEER_PYTHON (default: this interpreter) is the program the peer's children run as; the
tests point it at a script that kills itself with SIGSEGV to prove the switch.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

ENV_CACHE = "LOWBIT_PEER"
ENV_FORCE = "LOWBIT_PEER_EXTRA_BUFTS"
ENV_PYTHON = "LOWBIT_PEER_PYTHON"
PROBE_PROMPT_TOKENS = 64   # > 32: llama.cpp's batched (repack / AMX) matmul path runs
PROBE_DECODE_TOKENS = 4
PROBE_TIMEOUT_S = 600


class PeerMissing(RuntimeError):
    """llama-cpp-python is not installed (the commands that need it exit 2 with this message)."""


class PeerCrashed(RuntimeError):
    """The llama.cpp child process died (message: `peer crashed: ...` with the signal)."""


def require():
    """The llama_cpp module, or PeerMissing naming the install command."""
    try:
        import llama_cpp
    except ImportError as e:
        raise PeerMissing("this needs llama-cpp-python (ggml and llama.cpp, the peer), which is not installed: "
                          "pip install 'lowbit[bench]' (or: pip install llama-cpp-python)") from None
    return llama_cpp


def _python() -> list[str]:
    return [os.environ.get(ENV_PYTHON) or sys.executable]


def describe_exit(code: int) -> str:
    """`SIGSEGV` for a child killed by a signal, `exit status N` otherwise."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


# ---- the verdict: extra buffer types on or off, per kind of model, cached in the environment

@dataclass(frozen=True)
class PeerConfig:
    extra_bufts: bool
    how: str        # "probed", "cached", "forced by LOWBIT_PEER_EXTRA_BUFTS"
    reason: str = ""  # why they are off (the probe child's death)

    def line(self) -> str:
        """One line for a benchmark header / a test log."""
        if self.extra_bufts:
            return f"llama.cpp peer: default configuration (extra buffer types on; {self.how})"
        why = f": {self.reason}" if self.reason else ""
        return (f"llama.cpp peer: extra buffer types off (their AMX/repack path crashes on this CPU{why}; "
                f"{self.how})")


def model_key(path: str) -> str:
    """The model's tensor types, sorted ("F32+Q4_1+Q6_K"): what selects llama.cpp's repack and
    AMX buffer types. A file lowbit cannot read is keyed by its path."""
    from . import gguf
    try:
        with gguf.open(path) as f:
            return "+".join(sorted({t.format.name for t in f.tensors.values()}))
    except Exception:  # noqa: BLE001 - any unreadable file: key by name, the probe decides
        return os.path.abspath(path).replace(";", "_").replace("=", "_")


def _cache() -> dict[str, str]:
    out = {}
    for item in os.environ.get(ENV_CACHE, "").split(";"):
        k, _, v = item.rpartition("=")
        if k and v in ("on", "off"):
            out[k] = v
    return out


def _store(key: str, on: bool) -> None:
    c = _cache()
    c[key] = "on" if on else "off"
    os.environ[ENV_CACHE] = ";".join(f"{k}={v}" for k, v in c.items())


def probe(path: str, extra_bufts: bool = True, threads: int = 2) -> tuple[bool, str]:
    """Run llama.cpp on `path` in a child (prefill PROBE_PROMPT_TOKENS, decode a few): (survived,
    how it died)."""
    argv = _python() + ["-m", "lowbit.peer", "probe", path, "on" if extra_bufts else "off", str(threads)]
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"no answer in {PROBE_TIMEOUT_S} s"
    except OSError as e:
        return False, f"cannot start {argv[0]}: {e.strerror}"
    if r.returncode == 0:
        return True, ""
    tail = r.stderr.decode(errors="replace").strip().splitlines()
    last = f" ({tail[-1][:200]})" if tail and r.returncode > 0 else ""
    return False, describe_exit(r.returncode) + last


def config(path: str, threads: int = 2, quiet: bool = False) -> PeerConfig:
    """The configuration the peer runs `path` with (probing once per kind of model and process
    tree). Raises PeerCrashed if llama.cpp dies on it with the extra buffer types off too."""
    forced = os.environ.get(ENV_FORCE, "").strip().lower()
    if forced in ("on", "off"):
        return PeerConfig(forced == "on", f"forced by {ENV_FORCE}")
    key = model_key(path)
    cached = _cache().get(key)
    if cached:
        return PeerConfig(cached == "on", "cached")
    ok, why = probe(path, True, threads)
    if ok:
        _store(key, True)
        return PeerConfig(True, "probed")
    ok_off, why_off = probe(path, False, threads)
    if not ok_off:
        raise PeerCrashed(f"peer crashed: llama.cpp dies on {os.path.basename(path)} with its extra buffer types "
                          f"on ({why}) and off ({why_off})")
    _store(key, False)
    cfg = PeerConfig(False, "probed", why)
    if not quiet:
        print(cfg.line(), file=sys.stderr, flush=True)
    return cfg


# ---- making llama.cpp objects with the verdict applied

@contextlib.contextmanager
def _default_params(extra_bufts: bool):
    """llama-cpp-python builds its model params from llama_model_default_params() inside
    Llama.__init__ (no argument for use_extra_bufts): wrap that one function meanwhile."""
    ll = require()
    mod = ll.llama_cpp
    orig = mod.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = extra_bufts
        return p

    mod.llama_model_default_params = params
    try:
        yield
    finally:
        mod.llama_model_default_params = orig


def Llama(model_path: str, *, extra_bufts: bool | None = None, **kw):
    """llama_cpp.Llama(model_path, **kw) in the configuration that survives on this host
    (`extra_bufts` None: probed by config()). Read back: `.model_params.use_extra_bufts`."""
    ll = require()
    if extra_bufts is None and kw.get("vocab_only"):
        extra_bufts = True  # no weights, no compute: nothing to probe
    if extra_bufts is None:
        extra_bufts = config(model_path, threads=kw.get("n_threads") or 2).extra_bufts
    kw.setdefault("verbose", False)
    with _default_params(extra_bufts):
        return ll.Llama(model_path=model_path, **kw)


def server_argv(model_path: str, args: list[str], threads: int = 2) -> list[str]:
    """argv of llama-cpp-python's server (`python -m llama_cpp.server --model PATH ARGS`) run in
    the probed configuration, through this module's launcher."""
    require()
    on = config(model_path, threads=threads).extra_bufts
    return _python() + ["-m", "lowbit.peer", "server", "on" if on else "off", "--model", model_path] + args


# ---- a llama.cpp worker process (benchmarks): a crash there cannot take lowbit down

class Worker:
    """llama.cpp on one model in a child process, driven over a pipe (one JSON line per call).

        w = Worker(path, n_ctx=600, n_threads=2)   # probes first (config())
        prefill_s, decode_s = w.timed_greedy(token_ids, 64)
        w.close()

    Times are llama.cpp's own perf counters (no Python in them). If the child dies, the call
    raises PeerCrashed("peer crashed: llama.cpp died with SIGSEGV ...")."""

    def __init__(self, model_path: str, **kw):
        require()
        self.cfg = config(model_path, threads=kw.get("n_threads") or 2)
        argv = _python() + ["-m", "lowbit.peer", "worker", "on" if self.cfg.extra_bufts else "off", model_path,
                            json.dumps(kw)]
        self._err = tempfile.TemporaryFile()  # a file, not a pipe: llama.cpp's logs can never block it
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._err, text=True, bufsize=1)
        except OSError as e:
            raise PeerCrashed(f"peer crashed: cannot start {argv[0]}: {e.strerror}") from None
        self._call({"op": "ready"})

    def _call(self, msg: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            code = self.proc.wait()
            self._err.seek(0)
            err = self._err.read().decode(errors="replace").strip().splitlines()
            tail = f" ({err[-1][:200]})" if err and code > 0 else ""
            raise PeerCrashed(f"peer crashed: llama.cpp died with {describe_exit(code)}{tail}")
        r = json.loads(line)
        if "error" in r:
            raise RuntimeError(f"llama.cpp peer: {r['error']}")
        return r

    def timed_greedy(self, tokens: list[int], gen: int) -> tuple[float, float]:
        """Prefill `tokens` from an empty cache, then `gen` greedy decode steps: (prefill s, decode s)."""
        r = self._call({"op": "greedy", "tokens": list(map(int, tokens)), "gen": gen})
        return r["prefill_s"], r["decode_s"]

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- the children's side: python -m lowbit.peer probe|worker|server ...

def _greedy(llm, tokens: list[int], gen: int) -> tuple[float, float]:
    import numpy as np
    ll = require()
    llm.reset()
    ctx = llm._ctx.ctx
    ll.llama_perf_context_reset(ctx)
    llm.eval(tokens)
    nv = llm.n_vocab()
    tok = int(np.argmax(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(nv,))))
    for _ in range(gen):
        llm.eval([tok])
        tok = int(np.argmax(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(nv,))))
    p = ll.llama_perf_context(ctx)
    return p.t_p_eval_ms / 1e3, p.t_eval_ms / 1e3


def _child_probe(path: str, on: str, threads: str) -> int:
    n = PROBE_PROMPT_TOKENS + PROBE_DECODE_TOKENS + 8
    llm = Llama(path, extra_bufts=on == "on", n_ctx=n, n_batch=512, n_threads=int(threads),
                n_threads_batch=int(threads))
    vocab = llm.n_vocab()
    toks = [(7 * i + 11) % vocab for i in range(PROBE_PROMPT_TOKENS)]
    _greedy(llm, toks, PROBE_DECODE_TOKENS)
    return 0


def _child_worker(on: str, path: str, kw: str) -> int:
    llm = Llama(path, extra_bufts=on == "on", **json.loads(kw))
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "ready":
            r = {"ok": True, "extra_bufts": bool(llm.model_params.use_extra_bufts)}
        elif msg["op"] == "greedy":
            p, d = _greedy(llm, msg["tokens"], msg["gen"])
            r = {"prefill_s": p, "decode_s": d}
        else:
            r = {"error": f"unknown op {msg['op']!r}"}
        print(json.dumps(r), flush=True)
    return 0


def _child_server(on: str, args: list[str]) -> int:
    require()
    from llama_cpp.server.__main__ import main
    print(f"llama.cpp peer: llama_cpp.server with use_extra_bufts={on == 'on'}", file=sys.stderr, flush=True)
    sys.argv = ["llama_cpp.server"] + args
    with _default_params(on == "on"):
        main()
    return 0


def main(argv: list[str] | None = None) -> int:
    a = sys.argv[1:] if argv is None else argv
    if a[:1] == ["probe"] and len(a) == 4:
        return _child_probe(*a[1:])
    if a[:1] == ["worker"] and len(a) == 4:
        return _child_worker(*a[1:])
    if a[:1] == ["server"] and len(a) >= 2:
        return _child_server(a[1], a[2:])
    print("usage: python -m lowbit.peer probe PATH on|off THREADS | worker on|off PATH KWARGS_JSON | "
          "server on|off LLAMA_CPP_SERVER_ARGS...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
