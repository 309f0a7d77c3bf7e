"""`lowbit serve` operations: /metrics, the access log, CORS, GET /v1/models/{id}, messages the
chat API refuses, bad --host / --port, a full queue (429 + Retry-After), graceful shutdown on
SIGTERM. A small synthetic model; the server runs as a subprocess (or in process where the test
must hold the engine still)."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

import lowbit
from serve_util import Server, alone, chat_prompt, free_port, openai_client, running, synth_model

CTX = 256


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return synth_model(tmp_path_factory.mktemp("ops") / "synth.gguf")


@pytest.fixture(scope="module")
def server(path):
    with running("-m", path, "--ctx", str(CTX), "--parallel", "2", "-t", "2",
                 "--cors", "https://a.example,https://b.example") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.url, timeout=120)


@pytest.fixture(scope="module")
def ref(path):
    return lowbit.load(path, n_ctx=CTX, threads=2)


def is_error(r, status, param=None, code=None):
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e


def wait_for(pred, limit_s=60.0):
    """Poll until pred() (a guard against a hang, not a timing check)."""
    end = time.monotonic() + limit_s
    while not pred():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.02)


# -- /metrics ----------------------------------------------------------------------------------
def scrape(server) -> dict[str, float]:
    """The exposition text parsed: 'name{labels}' -> value, every line checked for the format."""
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out, typed = {}, {}
    for line in r.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            typed[name] = kind
            continue
        if line.startswith("# HELP "):
            continue
        m = re.fullmatch(r'([a-z_]+)(\{[a-z_]+="[^"]*"(?:,[a-z_]+="[^"]*")*\})? (\S+)', line)
        assert m, f"not a sample line: {line!r}"
        base = re.sub(r"_(bucket|sum|count)$", "", m[1]) if m[1] not in typed else m[1]
        assert base in typed, f"{m[1]} has no # TYPE"
        out[m[1] + (m[2] or "")] = float(m[3])
    return out


def test_metrics_count_requests_tokens_and_latencies(server, client):
    before = scrape(server)
    n_req, toks = 3, [5, 7, 9]
    for n in toks:
        r = client.completions.create(model="synth", prompt="Metrics please", max_tokens=n, temperature=0)
        assert r.usage.completion_tokens == n
    after = scrape(server)

    def d(k):
        return after.get(k, 0.0) - before.get(k, 0.0)

    assert d('lowbit_requests_total{endpoint="/v1/completions",status="200"}') == n_req
    assert d("lowbit_generation_tokens_total") == sum(toks)
    assert d("lowbit_prompt_tokens_total") > 0
    # one TTFT per request; one per-token gap for every token after a request's first
    assert d("lowbit_time_to_first_token_seconds_count") == n_req
    assert d("lowbit_time_per_output_token_seconds_count") == sum(toks) - n_req
    assert d("lowbit_request_duration_seconds_count") == n_req
    # every step's forward: the tokens it computed are the prompts' and each generated token but a
    # request's last (sampled, never fed back)
    assert d("lowbit_engine_step_tokens_sum") == d("lowbit_prompt_tokens_total") + sum(toks) - n_req
    assert d("lowbit_engine_step_seconds_count") == d("lowbit_engine_step_tokens_count") >= max(toks)
    assert d("lowbit_engine_step_seconds_sum") > 0
    assert after['lowbit_time_to_first_token_seconds_bucket{le="+Inf"}'] == after[
        "lowbit_time_to_first_token_seconds_count"]
    buckets = [v for k, v in after.items() if k.startswith("lowbit_time_per_output_token_seconds_bucket")]
    assert buckets == sorted(buckets)  # cumulative
    assert after["lowbit_slots_total"] == 2 and after["lowbit_slots_busy"] == 0 and after["lowbit_queue_depth"] == 0
    assert "lowbit_prefix_cache_lookups_total" in after
    # the scrape itself is counted, and a 404 by its route, not its raw path
    httpx.get(server.url + "/v1/models/nope")
    again = scrape(server)
    assert again['lowbit_requests_total{endpoint="/metrics",status="200"}'] >= 2
    assert again['lowbit_requests_total{endpoint="/v1/models/{id}",status="404"}'] >= 1


def test_access_log_one_line_per_request(server, client):
    tag = f"/v1/models/log-probe-{time.monotonic_ns()}"
    httpx.get(server.url + tag)
    r = client.chat.completions.create(model="synth", messages=[{"role": "user", "content": "log me"}],
                                       max_tokens=3, temperature=0)
    n_prompt = r.usage.prompt_tokens

    def chat_lines():  # the line is written once the response has gone out: poll for it
        return [ln for ln in server.output().splitlines() if ln.startswith("lowbit: ")
                and '"POST /v1/chat/completions" 200' in ln and f"prompt={n_prompt} " in ln]

    wait_for(lambda: chat_lines())
    lines = [ln for ln in server.output().splitlines() if ln.startswith("lowbit: ")]
    assert sum(tag in ln for ln in lines) == 1
    chat = chat_lines()
    assert chat[-1].endswith("completion=3"), chat
    assert re.match(r'lowbit: 127\.0\.0\.1:\d+ "POST /v1/chat/completions" 200 \d+\.\d{3}s \d+B prompt=\d+ '
                    r'cached=\d+ completion=3$', chat[-1])


# -- CORS ----------------------------------------------------------------------------------------
def test_cors(server):
    pre = {"Origin": "https://a.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(server.url + "/v1/chat/completions", headers=pre)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://a.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    r = httpx.options(server.url + "/v1/chat/completions", headers={**pre, "Origin": "https://evil.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "https://b.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://b.example"
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# -- /v1/models/{id} -------------------------------------------------------------------------------
def test_models_retrieve(server, client):
    m = client.models.retrieve("synth")
    assert m.id == "synth" and m.object == "model" and m.owned_by == "lowbit"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found"
    is_error(httpx.get(server.url + "/v1/models/gpt-4o"), 404, "model", "model_not_found")
    is_error(httpx.get(server.url + "/v1/models/org/name"), 404, "model", "model_not_found")


# -- messages the chat API refuses ---------------------------------------------------------------
@pytest.mark.parametrize("messages,param", [
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "system", "content": "hi"}, {"role": "assistant"}], "messages[1].content"),
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "User", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": "hi"}, {"role": "function", "content": "x"}], "messages[1].role"),
])
def test_bad_messages_are_400(server, client, messages, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    is_error(r, 400, param)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="synth", messages=messages, max_tokens=2)


def test_developer_role_is_system(client, ref):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text, _, _ = alone(ref, chat_prompt(ref, msgs), 6)
    r = client.chat.completions.create(model="synth", max_tokens=6, temperature=0,
                                       messages=[{"role": "developer", "content": "Be brief."}, msgs[1]])
    assert r.choices[0].message.content == text


# -- bad --host / --port -----------------------------------------------------------------------------
def run_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "lowbit.cli", "serve", *args], capture_output=True, text=True,
                          timeout=timeout, env=os.environ.copy())


@pytest.mark.parametrize("args,says", [
    (["--port", "99999"], "--port must be in 0..65535"),
    (["--port", "-1"], "--port must be in 0..65535"),
    (["--host", "no-such-host.invalid"], "--host"),
    (["--host", "203.0.113.7"], "cannot listen on 203.0.113.7"),  # TEST-NET-3: no local interface has it
    (["--parallel", "0"], "--parallel must be >= 1"),
    (["--queue", "-2"], "--queue must be >= 0"),
])
def test_bad_address_or_option_is_one_line_exit_2(path, args, says):
    r = run_cli("-m", path, *args)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    # (options are checked by the CLI before serve starts: "lowbit: error:"; the address by serve)
    assert len(lines) == 1 and lines[0].startswith(("lowbit: error: ", "lowbit serve: error: ")), r.stderr
    assert says in lines[0], r.stderr
    assert "Traceback" not in r.stderr and " on http" not in r.stderr


def test_port_in_use_is_one_line_exit_2(path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run_cli("-m", path, "--port", str(port))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0], r.stderr


# -- a full queue: 429 with Retry-After (in process: the test holds the engine's step) -------------
class Gated:
    """The model, except that forward_batch waits until the test opens the gate."""

    def __init__(self, model):
        self.m = model
        self.gate, self.entered = threading.Event(), threading.Event()

    def __getattr__(self, k):
        return getattr(self.m, k)

    def forward_batch(self, *a, **k):
        self.entered.set()
        self.gate.wait(120)
        return self.m.forward_batch(*a, **k)


def test_full_queue_is_429_with_retry_after(path):
    import uvicorn

    from lowbit.server.app import create_app
    gated = Gated(lowbit.load(path, n_ctx=64, threads=1, n_slots=1))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    app = create_app(lambda: gated, model_id="gated", parallel=1, max_queue=1, access_log=None)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    results = {}

    def post(name):
        results[name] = httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=120)

    try:
        wait_for(lambda: srv.started and httpx.get(url + "/health").status_code == 200)
        a = threading.Thread(target=post, args=("a",))
        a.start()
        assert gated.entered.wait(60)          # a runs (held in its first step)
        b = threading.Thread(target=post, args=("b",))
        b.start()
        wait_for(lambda: app.state.lowbit.scheduler.status()["queued"] == 1)  # b waits
        r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2})
        is_error(r, 429, code="queue_full")
        assert r.headers["retry-after"] == "1"
        gated.gate.set()
        a.join(60)
        b.join(60)
        assert results["a"].status_code == 200 and results["b"].status_code == 200
        m = httpx.get(url + "/metrics").text
        assert 'lowbit_requests_total{endpoint="/v1/completions",status="429"} 1' in m
    finally:
        gated.gate.set()
        srv.should_exit = True
        th.join(30)


# -- graceful shutdown -------------------------------------------------------------------------------
def stream_lines(url, body):
    """A streaming completion, its SSE events as they come."""
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def test_sigterm_lets_running_requests_finish_then_exits_0(path, ref):
    s = Server("-m", path, "--ctx", str(CTX), "--parallel", "2", "-t", "2", "--shutdown-grace", "60")
    try:
        s.wait_ready()
        text, _, n = alone(ref, "Before the shutdown", 40)
        it = stream_lines(s.url, {"prompt": "Before the shutdown", "max_tokens": 40, "temperature": 0})
        got = [next(it)["choices"][0]["text"]]
        s.proc.send_signal(signal.SIGTERM)
        evs = list(it)
        got += [e["choices"][0]["text"] for e in evs if e.get("choices")]
        assert "".join(got) == text and evs[-1]["choices"][0]["finish_reason"] == "length"
        assert s.proc.wait(timeout=60) == 0
        out = s.output()
        assert "shutting down (1 running" in out and "lowbit serve: stopped" in out and "Traceback" not in out
        with pytest.raises(httpx.TransportError):  # nothing listens any more
            httpx.get(s.url + "/health", timeout=5)
    finally:
        s.stop()


def test_sigterm_after_the_grace_ends_requests_with_an_error(path):
    s = Server("-m", path, "--ctx", "4096", "--parallel", "2", "-t", "2", "--shutdown-grace", "0")
    try:
        s.wait_ready()
        it = stream_lines(s.url, {"prompt": "A very long story", "max_tokens": 4000, "temperature": 0,
                                  "logit_bias": {str(t): -100 for t in lowbit.load(path, n_ctx=8).tokenizer.eog_ids}})
        next(it)
        s.proc.send_signal(signal.SIGTERM)
        evs = list(it)
        assert evs and evs[-1].get("error", {}).get("message") == "the server is shutting down", evs[-1:]
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.stop()
