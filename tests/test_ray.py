"""lowbit on Ray (issue 26): pipeline stages and `lowbit serve --ray` replicas, on Ray's local
cluster (loopback only, started and stopped by the code under test).

- A 2-stage pipeline (lowbit.load(stages=2): two Ray actors, each holding half the layers' bytes)
  gives bitwise the logits of one process and the same greedy text, on the default model and on a
  synthetic MoE; a batch of several slots (cut into micro-batches in flight together) too; the
  KV bytes the prefix cache copies are the one-process layout, byte for byte.
- Two replicas behind Ray Serve answer the openai client, streaming and not, with the text one
  process gives; a replica's worker killed by PID: requests after it succeed within 30 s.
- Shutdown (close(), SIGTERM to `lowbit serve --ray`) leaves none of the processes it started.
- The health check's stuck-engine rule, the layer split and the usage errors, without Ray.
Skipped only where Ray is not importable.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import lowbit
from lowbit.distributed.pipeline import split_layers
from lowbit.server.ray_serve import HealthWatch, Options, parse_autoscale

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'lowbit[ray]')")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'lowbit[ray]')")

PROMPT = "The capital of France is Paris, and the capital of Germany is"


# -- process bookkeeping (/proc: no psutil needed) ---------------------------------------------------
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid: int) -> set[int]:
    kids, out, todo = _children(), set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def mapped_resident(pid: int, path: str) -> int:
    """Bytes of the file at `path` resident in process pid's mappings (/proc/PID/smaps Rss)."""
    cur, rss = False, 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if not head.endswith(":"):  # a mapping's first line: address range ... path
                cur = line.rstrip().endswith(os.path.basename(path))
            elif cur and head == "Rss:":
                rss += int(line.split()[1]) * 1024
    return rss


def wait_gone(pids, limit_s: float = 30.0) -> set[int]:
    end = time.monotonic() + limit_s
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = {p for p in left if alive(p)}
    return left


# -- without Ray ---------------------------------------------------------------------------------
def test_split_layers_contiguous_and_balanced():
    sizes = [10] * 8
    assert split_layers(sizes, 2) == [(0, 4), (4, 8)]
    assert split_layers(sizes, 2, head=20) == [(0, 5), (5, 8)]  # the head streams in the last stage
    assert split_layers([1, 1, 1, 9], 2) == [(0, 3), (3, 4)]
    r = split_layers(list(range(1, 31)), 4)
    assert r[0][0] == 0 and r[-1][1] == 30 and all(a[1] == b[0] and a[0] < a[1] for a, b in zip(r, r[1:]))
    with pytest.raises(ValueError):
        split_layers(sizes, 9)


class _FakeSched:
    def __init__(self):
        self.steps, self.active, self.queued = 0, 0, 0
        self._thread = threading.current_thread()

    def status(self):
        return {"steps": self.steps, "active": self.active, "queued": self.queued}


class _FakeState:
    def __init__(self, sched):
        self.scheduler, self.load_error = sched, None


def test_health_check_fails_a_stuck_engine():
    now = [0.0]
    w, s = HealthWatch(30.0, clock=lambda: now[0]), _FakeSched()
    st = _FakeState(s)
    assert w.check(st) is None
    now[0] = 100.0
    assert w.check(st) is None  # idle for long: healthy
    s.active = 2
    assert w.check(st) is None
    now[0] = 120.0
    s.steps = 5
    assert w.check(st) is None  # progress
    now[0] = 149.0
    assert w.check(st) is None
    now[0] = 151.0
    assert "no step for 31 s" in w.check(st)  # busy, and no step for 31 s
    s.steps = 6
    assert w.check(st) is None
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    s._thread = dead
    assert "engine thread has stopped" in w.check(st)
    st.load_error = "GGUFError: bad file"
    assert "failed to load" in w.check(st)


def test_options_and_usage_errors():
    assert parse_autoscale("1:4") == (1, 4)
    with pytest.raises(ValueError):
        parse_autoscale("4")
    assert Options(autoscale=(3, 2)).check() and Options(parallel=0).check() and Options().check() is None
    # the weights' memory and the KV cache reach every replica's and stage's load
    from lowbit.server.ray_serve import _load_kwargs
    kw = _load_kwargs(Options(memory="hugepages", mlock=True, kv="q8_0", kv_v="q4_0"))
    assert (kw["memory"], kw["mlock"], kw["kv"], kw["kv_v"]) == ("hugepages", True, "q8_0", "q4_0")
    assert "memory must be" in Options(memory="disk").check()
    assert "V cache needs a quantized K cache" in Options(kv_v="q8_0").check()
    assert "--stages keeps an f16 KV cache" in Options(stages=2, kv="q8_0").check()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args, msg in ((["--replicas", "2"], "--replicas needs --ray"),
                      (["--ray", "--autoscale", "3"], "MIN:MAX"),
                      (["--ray", "--replicas", "0"], "--replicas must be >= 1"),
                      (["--ray", "--replicas", "2", "--autoscale", "1:2"], "exclude each other"),
                      (["--ray", "--stages", "2", "--kv", "q8_0"], "--stages keeps an f16 KV cache"),
                      (["--ray", "--port", "0"], "--port must be in")):
        r = subprocess.run([sys.executable, "-m", "lowbit.cli", "serve", *args], capture_output=True, text=True,
                           env=env, timeout=60)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_coalesced_stream_carries_the_same_text():
    """--coalesce N: each SSE event carries up to N tokens' text; the text is the same."""
    from starlette.testclient import TestClient
    from lowbit.server.app import create_app
    m = lowbit.load(n_ctx=128, n_slots=1)
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True}

    def events(coalesce):
        app = create_app(lambda: m, model_id="m", parallel=1, access_log=None, coalesce=coalesce)
        with TestClient(app) as c:
            while c.get("/health").status_code != 200:
                time.sleep(0.05)
            lines = [ln for ln in c.post("/v1/completions", json=body).text.splitlines() if ln.startswith("data: {")]
        import json
        evs = [json.loads(ln[6:]) for ln in lines]
        return [e["choices"][0]["text"] for e in evs if e["choices"][0]["text"]], evs[-1]["usage"]

    one, u1 = events(1)
    four, u4 = events(4)
    assert "".join(one) == "".join(four) and u1 == u4 and u1["completion_tokens"] == 12
    assert len(one) == 12 and len(four) == 3  # 12 tokens, 4 per event


def test_serve_run_build_entry_point():
    from lowbit.server import ray_serve
    app = ray_serve.build({"parallel": "2", "replicas": "2", "stuck_after": "10", "autoscale": "1:3"})
    assert type(app).__name__ == "Application"
    with pytest.raises(ValueError, match="unknown option"):
        ray_serve.build({"paralel": "2"})
    with pytest.raises(ValueError, match="parallel"):
        ray_serve.build({"parallel": "0"})


# -- pipeline stages -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the pipeline tests (starting one takes ~10 s); the last of them
    closes it and checks what is left."""
    from lowbit.distributed import Cluster
    c = Cluster()
    yield c
    c.close()


def _same_as_one_process(path, prompt_ids, gen: int, n_ctx: int = 256):
    one = lowbit.load(path, n_ctx=n_ctx, n_slots=3)
    pipe = lowbit.load(path, n_ctx=n_ctx, n_slots=3, stages=2)
    try:
        eng = pipe.engine
        assert len(eng.ranges) == 2 and eng.ranges[0][0] == 0 and eng.ranges[1][1] == one.config.n_layer
        assert eng.ranges[0][1] == eng.ranges[1][0]
        pids = [s["pid"] for s in eng.stage_info]
        assert len(set(pids)) == 2 and os.getpid() not in pids  # two actor processes
        # each stage binds only its own weights
        assert all(0 < s["weight_bytes"] < sum(t.raw.nbytes for t in one.file.tensors.values())
                   for s in eng.stage_info)
        # teacher-forced logits of every position, in chunks of 16 (several stage round trips)
        a, b = one.logits(prompt_ids, chunk=16), pipe.logits(prompt_ids, chunk=16)
        assert a.shape == b.shape and np.array_equal(a, b)
        # greedy decoding
        ta = list(one.generate(prompt_ids, max_tokens=gen))
        tb = list(pipe.generate(prompt_ids, max_tokens=gen))
        assert ta == tb and len(ta) > 0
        # each stage has touched only its own part of the file (its layers; the embedding rows
        # it read or the head), never all of it
        size = os.path.getsize(path)
        for s in eng.stage_info:
            assert 0 < mapped_resident(s["pid"], path) < 0.75 * size, (s, mapped_resident(s["pid"], path), size)
        # three slots in one batch: micro-batches in flight through both stages at once
        for m in (one, pipe):
            for s in range(3):
                m.rewind(0, slot=s)
        long = (prompt_ids * 4)[:40]
        runs = [(0, long[:20]), (1, long[:24]), (2, long[3:21])]  # 62 tokens: 2 micro-batches
        pipe.engine.timing(reset=True)
        oa, ob = one.forward_batch(runs, all_logits=True), pipe.forward_batch(runs, all_logits=True)
        assert [c for _, c in pipe.engine.timing()] == [2, 2]  # each stage ran both micro-batches
        assert all(np.array_equal(x, y) for x, y in zip(oa, ob))
        prompt_ids = long
        step = [(0, [prompt_ids[20]]), (1, [prompt_ids[24]]), (2, [prompt_ids[21]])]
        oa, ob = one.forward_batch(step), pipe.forward_batch(step)
        assert all(np.array_equal(x, y) for x, y in zip(oa, ob))
        # the KV bytes the prefix cache copies: the one-process layout, byte for byte
        if not one.config.hybrid:
            n = 8
            assert pipe.engine.kv_bytes(n) == one.engine.kv_bytes(n)
            ka, kb = np.empty(one.engine.kv_bytes(n), np.uint8), np.empty(pipe.engine.kv_bytes(n), np.uint8)
            one.engine.kv_copy(1, 0, n, ka, True)
            pipe.engine.kv_copy(1, 0, n, kb, True)
            assert np.array_equal(ka, kb)
        return pids
    finally:
        pipe.close()


def test_pipeline_default_model_bitwise(cluster):
    m = lowbit.load(n_ctx=64)
    ids = m.tokenize(PROMPT)
    pids = _same_as_one_process(m.path, ids, gen=24)
    assert not wait_gone(pids), "close() left stage actors running"
    assert ray.is_initialized()  # the cluster it shared stays up for its other user


def test_pipeline_synthetic_moe_bitwise(cluster, tmp_path):
    from lowbit.cli import main
    path = tmp_path / "moe.gguf"
    assert main(["synth", "moe", str(path), "--arch", "qwen3moe", "--layers", "4", "--dim", "256",
                 "--experts", "8", "--top-k", "2"]) == 0
    m = lowbit.load(str(path), n_ctx=64)
    ids = m.tokenize(PROMPT)
    _same_as_one_process(str(path), ids, gen=16)


def test_pipeline_hybrid_rewind_bitwise(cluster, tmp_path):
    """qwen35 (gated delta-net layers): each stage keeps its layers' recurrent states; a rewind
    restores every stage's (rstate_copy across stages) and the logits stay bitwise."""
    from lowbit.synth import synth_hybrid
    path = synth_hybrid(tmp_path / "q35.gguf", arch="qwen35", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64,
                        rope_dims=32, sections=(2, 2, 2, 2), full_attention_interval=2, ssm_conv=4, ssm_state=32,
                        ssm_groups=2, ssm_heads=4, ffn=512, embd_type="F16", wtype="Q8_0", seed=5)
    # (the stages read their weights into memory: load()'s memory option reaches them)
    one, pipe = lowbit.load(path, n_ctx=64), lowbit.load(path, n_ctx=64, stages=2, memory="copy")
    try:
        ids = one.tokenize(PROMPT)
        assert pipe.config.hybrid and len(ids) > 12
        assert [s["memory"] for s in pipe.engine.stage_info] == ["copy", "copy"]
        assert all(mapped_resident(s["pid"], path) == 0 for s in pipe.engine.stage_info)  # no map of the file
        for m in (one, pipe):
            m.reset()
            m.forward(ids[:10])
            m.forward(ids[10:])   # a checkpoint of every stage's state at 10
            m.rewind(6)           # back before it: replayed from the start in every stage
        a, b = one.forward(ids[6:], all_logits=True), pipe.forward(ids[6:], all_logits=True)
        assert np.array_equal(a, b)
        assert pipe.engine.rstate_pos(0) == one.engine.rstate_pos(0) == len(ids)
        buf_a, buf_b = np.empty(one.engine.rstate_bytes(), np.uint8), np.empty(pipe.engine.rstate_bytes(), np.uint8)
        one.engine.rstate_copy(0, buf_a, True)
        pipe.engine.rstate_copy(0, buf_b, True)
        assert len(buf_b) == len(buf_a) + 8  # each stage's own position word, then its layers' states
        assert list(one.generate(ids, max_tokens=12)) == list(pipe.generate(ids, max_tokens=12))
    finally:
        pipe.close()


def test_pipeline_cluster_close_leaves_no_process(cluster):
    from lowbit.distributed import cluster as mod
    session = cluster.session_dir
    started = {p for p in descendants(os.getpid()) if "ray" in cmdline(p)}
    assert session and started
    cluster.close()
    assert mod._LOCAL["users"] == 0 and not ray.is_initialized() and not os.path.exists(session)
    left = wait_gone(started)
    assert not left, [cmdline(p)[:80] for p in left]


# -- replicas behind Ray Serve -------------------------------------------------------------------
REPLICA = "ray::ServeReplica:lowbit:LowbitReplica"


@pytest.fixture(scope="module")
def served():
    from serve_util import Server
    # --no-mmap: the replicas read the weights into memory (checked: none maps the file)
    srv = Server("--ray", "--replicas", "2", "--parallel", "2", "--ctx", "256", "--threads", "1", "--no-mmap")
    try:
        srv.wait_ready(240)
        end = time.monotonic() + 120  # the banner: serve.run has returned (every replica is running)
        while "lowbit serve --ray: http" not in srv.output() or len(_replicas(srv)) < 2:
            assert time.monotonic() < end and srv.proc.poll() is None, srv.output()
            time.sleep(0.2)
        yield srv
    finally:
        srv.stop()


def _replicas(srv) -> list[int]:
    return sorted(p for p in descendants(srv.proc.pid) if cmdline(p).startswith(REPLICA) and alive(p))


def test_two_replicas_answer_openai_like_one_process(served):
    from openai import OpenAI
    assert len(_replicas(served)) == 2
    path = lowbit.model.default_model_path()
    assert all(mapped_resident(p, path) == 0 for p in _replicas(served))  # --no-mmap reached them
    m = lowbit.load(n_ctx=256)
    client = OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    want = m.create_completion(PROMPT, max_tokens=16, temperature=0)["choices"][0]["text"]
    msgs = [{"role": "user", "content": "Name a color."}]
    want_chat = m.create_chat_completion(msgs, max_tokens=16, temperature=0)["choices"][0]["message"]["content"]
    results = {}

    def one(i):
        if i % 2:
            r = client.completions.create(model="x", prompt=PROMPT, max_tokens=16, temperature=0)
            results[i] = r.choices[0].text
        else:
            s = client.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0, stream=True)
            results[i] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]  # more than one replica's slots
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(results) == 6
    for i, text in results.items():
        assert text == (want if i % 2 else want_chat), (i, text)


def test_killed_replica_is_replaced(served):
    import httpx
    before = _replicas(served)
    assert len(before) == 2
    os.kill(before[0], signal.SIGKILL)
    t0 = time.monotonic()
    ok_at = None
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    while time.monotonic() - t0 < 30:
        try:
            r = httpx.post(served.url + "/v1/completions", json=body, timeout=10)
            if r.status_code == 200:
                ok_at = time.monotonic() - t0
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    assert ok_at is not None, "no request succeeded within 30 s of the kill"
    # every request after that succeeds
    for _ in range(6):
        assert httpx.post(served.url + "/v1/completions", json=body, timeout=30).status_code == 200
    end = time.monotonic() + 30
    while time.monotonic() < end and not (len(_replicas(served)) == 2 and before[0] not in _replicas(served)):
        time.sleep(0.5)
    after = _replicas(served)
    assert len(after) == 2 and before[0] not in after and before[1] in after


def test_shutdown_leaves_no_process(served):
    started = descendants(served.proc.pid)
    assert any(cmdline(p).startswith(REPLICA) for p in started)
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(60) == 0, served.output()
    assert "stopped" in served.output()
    left = wait_gone(started)
    assert not left, [cmdline(p)[:80] for p in left]


def test_serve_stages_pipeline_replica():
    """lowbit serve --ray --stages 2: a replica whose model is a 2-stage pipeline answers with the
    one-process text; SIGTERM leaves none of its processes (replica, stages, cluster)."""
    import httpx
    from serve_util import Server
    srv = Server("--ray", "--stages", "2", "--parallel", "2", "--ctx", "256")
    try:
        srv.wait_ready(240)
        m = lowbit.load(n_ctx=256)
        want = m.create_completion(PROMPT, max_tokens=16, temperature=0)["choices"][0]["text"]
        for stream in (False, True):
            body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stream": stream}
            r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200
            if stream:
                import json
                text = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in r.text.splitlines()
                               if ln.startswith("data: {"))
            else:
                text = r.json()["choices"][0]["text"]
            assert text == want
        started = descendants(srv.proc.pid)
        assert sum(cmdline(p).startswith("ray::Stage") for p in started) == 2
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.output()
        left = wait_gone(started)
        assert not left, [cmdline(p)[:80] for p in left]
    finally:
        srv.stop()


def test_sigterm_while_serve_starts_is_a_clean_stop():
    """SIGTERM while Serve is still starting (its controller is up, the app may not be): lowbit's
    handler is already in place, so the server finishes starting, shuts down and exits 0, and none
    of its processes stay (before, Ray's own handler could take such a SIGTERM: exit 15)."""
    from serve_util import Server
    srv = Server("--ray", "--parallel", "1", "--ctx", "128")
    try:
        end = time.monotonic() + 180
        seen: set[int] = set()
        while time.monotonic() < end:
            seen |= descendants(srv.proc.pid)
            if any(cmdline(p).startswith("ray::ServeController") for p in seen):
                break
            assert srv.proc.poll() is None, srv.output()
            time.sleep(0.02)
        else:
            pytest.fail("Serve's controller never started")
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(120) == 0, srv.output()
        left = wait_gone(seen | descendants(srv.proc.pid))
        assert not left, [cmdline(p)[:80] for p in left]
    finally:
        srv.stop()
