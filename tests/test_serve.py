"""`lowbit serve` through the official `openai` client, against a server this test starts on a
free local port (a small synthetic model: fast under every ISA level).

Reference outputs come from lowbit.generate.generate on a separate in-process Model: the
single-sequence forward and its own generation loop. The server must give each request the
same text (greedy, and sampled with the same seed), whatever else runs beside it.
"""
import concurrent.futures as cf
import json
import socket
import time

import httpx
import openai
import pytest

import lowbit
from serve_util import Server, alone, chat_prompt, openai_client, running, synth_model

KEY = "sk-lowbit-test"
CTX = 256
PARALLEL = 4


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return synth_model(tmp_path_factory.mktemp("serve") / "synth.gguf")


@pytest.fixture(scope="module")
def server(path):
    # --step-tokens 12: prompts are prefilled in chunks, beside other requests' decode tokens
    with running("-m", path, "--ctx", str(CTX), "--parallel", str(PARALLEL), "-t", "2", "--api-key", KEY,
                 "--step-tokens", "12") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.url, KEY, timeout=120)


@pytest.fixture(scope="module")
def ref(path):
    return lowbit.load(path, n_ctx=CTX, threads=2)


def status(server):
    r = httpx.get(server.url + "/v1/status", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    return r.json()


MESSAGES = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": [{"type": "text", "text": "Count "}, {"type": "text", "text": "to five"}]}],
    [{"role": "user", "content": "Why is the sky blue? " * 6}],
]


def flat(messages):
    return [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
             else "".join(p["text"] for p in m["content"])} for m in messages]


def test_models_and_status(client, server):
    ids = [m.id for m in client.models.list()]
    assert ids == ["synth"]
    s = status(server)
    assert s["model"] == "synth" and s["n_ctx"] == CTX and s["parallel"] == PARALLEL
    assert "Q8_0" in s["kernels"] and s["kernels"]["Q8_0"]["nt=1"].startswith("rows_q8_0")
    assert {"active", "queued", "done", "cancelled"} <= set(s["requests"])


def test_chat_matches_generate_alone(client, ref):
    msgs = MESSAGES[1]
    text, _, n = alone(ref, chat_prompt(ref, flat(msgs)), 20)
    r = client.chat.completions.create(model="synth", messages=msgs, max_tokens=20, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == "length" and n == 20
    assert r.usage.completion_tokens == 20
    assert r.usage.prompt_tokens == len(ref.tokenize(chat_prompt(ref, flat(msgs))))
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20


def test_chat_stream_matches_and_ends_with_usage(client, ref):
    msgs = MESSAGES[2]
    text, _, _ = alone(ref, chat_prompt(ref, flat(msgs)), 16)
    chunks = list(client.chat.completions.create(model="synth", messages=msgs, max_tokens=16, temperature=0,
                                                 stream=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    last = chunks[-1]
    assert last.choices[0].finish_reason == "length" and last.usage.completion_tokens == 16
    # stream_options.include_usage: OpenAI's extra final chunk, with no choices
    chunks = list(client.chat.completions.create(model="synth", messages=msgs, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_completions_text_and_token_prompts(client, ref):
    text, _, _ = alone(ref, "The quick brown fox", 12)
    r = client.completions.create(model="synth", prompt="The quick brown fox", max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == text
    ids = ref.tokenize("The quick brown fox")
    r2 = client.completions.create(model="synth", prompt=ids, max_tokens=12, temperature=0)
    assert r2.choices[0].text == text and r2.usage.prompt_tokens == len(ids)
    chunks = list(client.completions.create(model="synth", prompt="The quick brown fox", max_tokens=12,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 12


def test_sampled_with_seed_matches_generate_alone(client, ref):
    text, _, _ = alone(ref, "Once upon a time", 24, temperature=0.9, top_p=0.95, seed=1234)
    greedy, _, _ = alone(ref, "Once upon a time", 24)
    assert text != greedy  # the sampled path really samples
    for stream in (False, True):
        r = client.completions.create(model="synth", prompt="Once upon a time", max_tokens=24, temperature=0.9,
                                      top_p=0.95, seed=1234, stream=stream)
        got = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
        assert got == text


def test_concurrent_clients_same_as_alone(client, ref, server):
    """10 requests at once on 4 slots (the rest queue): greedy and seeded sampling, chat and
    completions, streaming or not, prompts of different lengths; each gets its alone output."""
    jobs = []
    for i in range(10):
        msgs = MESSAGES[i % len(MESSAGES)]
        samp = dict(temperature=0.8, seed=100 + i) if i % 3 == 1 else dict(temperature=0)
        n = 10 + 3 * i
        jobs.append((i, msgs, samp, n, i % 2 == 0))
    want = {i: alone(ref, chat_prompt(ref, flat(m)), n, **s)[0] for i, m, s, n, _ in jobs}
    before = status(server)["requests"]

    def run(job):
        i, msgs, samp, n, stream = job
        r = client.chat.completions.create(model="synth", messages=msgs, max_tokens=n, stream=stream, **samp)
        if stream:
            return i, "".join(c.choices[0].delta.content or "" for c in r if c.choices)
        return i, r.choices[0].message.content

    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        got = dict(ex.map(run, jobs))
    assert got == want
    after = status(server)["requests"]
    tokens = after["generated_tokens"] - before["generated_tokens"]
    steps = after["decode_steps"] - before["decode_steps"]
    assert tokens == sum(n for _, _, _, n, _ in jobs)
    # requests shared steps: far fewer forward passes that sample than tokens (one each if alone)
    assert steps < 0.5 * tokens, (steps, tokens)


def test_logit_bias(client, ref):
    """A bias of -100 on the token greedy decoding picks first moves the first pick elsewhere;
    +100 on some token makes it the pick at every step."""
    ids = ref.tokenize("Hello")
    ref.reset()
    lg = ref.forward(ids)[-1]
    first = int(lg.argmax())
    out = []
    for _ in range(6):  # greedy with the bias, by hand
        z = lg.copy()
        z[first] -= 100
        out.append(int(z.argmax()))
        lg = ref.forward(out[-1:])[-1]
    assert out[0] != first
    r = client.completions.create(model="synth", prompt=ids, max_tokens=6, temperature=0,
                                  logit_bias={str(first): -100})
    assert r.choices[0].text == ref.detokenize(out)
    r = client.completions.create(model="synth", prompt=ids, max_tokens=6, temperature=0,
                                  logit_bias={"42": 100})
    assert r.choices[0].text == ref.detokenize([42] * 6)


def test_stop_strings(client, ref):
    prompt = "In the beginning"
    full, pieces, _ = alone(ref, prompt, 30)
    # a stop string spanning two tokens' text: it must be held back, never half-sent
    k = next(i for i in range(3, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 2)
    stop = pieces[k][-2:] + pieces[k + 1][:2]
    cut = full[:full.find(stop)]
    for stream in (False, True):
        r = client.completions.create(model="synth", prompt=prompt, max_tokens=30, temperature=0,
                                      stop=["never-in-this-text", stop], stream=stream)
        if stream:
            chunks = list(r)
            got = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            got, reason = r.choices[0].text, r.choices[0].finish_reason
        assert got == cut and reason == "stop"


def test_eog_and_context_limit(client, ref, server):
    """No max_tokens: generation runs until the slot's context is full (finish "length")."""
    ids = ref.tokenize("Tell me everything. " * 40)  # ~200 tokens: the rest of the context is short
    assert 150 < len(ids) < CTX - 20
    text, _, n = alone(ref, ids, CTX)
    r = client.completions.create(model="synth", prompt=ids, temperature=0)
    assert r.choices[0].text == text and r.usage.completion_tokens == n
    # the last token sampled need not fit the cache: it is never fed back
    full = n == CTX - len(ids) + 1
    assert r.choices[0].finish_reason == ("length" if full else "stop")


# -- bad and hostile input -------------------------------------------------------------------------
def post(server, path, body, key=KEY, raw=False):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if raw:
        headers["Content-Type"] = "application/json"
        return httpx.post(server.url + path, content=body, headers=headers, timeout=60)
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def is_error(r, status, param=None):
    assert r.status_code == status, (r.status_code, r.text)
    e = r.json()["error"]
    assert isinstance(e["message"], str) and e["message"] and isinstance(e["type"], str)
    assert set(e) == {"message", "type", "param", "code"}
    if param is not None:
        assert e["param"] == param, e


GOOD_CHAT = {"model": "synth", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


@pytest.mark.parametrize("change,param", [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [["user", "hi"]]}, "messages[0]"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a", 1]}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": 3}, "stream_options"),
    ({"n": 9}, "n"),
    ({"n": 0}, "n"),
    ({"n": "2"}, "n"),
    ({"logprobs": 1}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"presence_penalty": "x"}, "presence_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"frequency_penalty": True}, "frequency_penalty"),
    ({"top_k": -1}, "top_k"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {str(10**7): 1}}, "logit_bias"),
])
def test_bad_chat_fields_are_400(server, change, param):
    is_error(post(server, "/v1/chat/completions", {**GOOD_CHAT, **change}), 400, param)


@pytest.mark.parametrize("prompt", [None, 5, {"text": "x"}, [], ["a", "b"], [1, "a"], [[1], [2]], [10**9], [-1],
                                    [True, 2]])
def test_bad_prompts_are_400(server, prompt):
    body = {"model": "synth", "max_tokens": 2}
    if prompt is not None:
        body["prompt"] = prompt
    is_error(post(server, "/v1/completions", body), 400, "prompt")


@pytest.mark.parametrize("body", [b"{bad json", b"", b"[1, 2]", b'"text"', b"null", b"\xff\xfe\x00",
                                  b'{"temperature": NaN, "prompt": "x"}', b"[" * 100000 + b"]" * 100000])
def test_malformed_bodies_are_400(server, body):
    for path in ("/v1/completions", "/v1/chat/completions"):
        is_error(post(server, path, body, raw=True), 400)


def test_text_that_cannot_be_tokenized(server):
    """JSON may carry a lone surrogate, which is no Unicode text: 400, not a crash."""
    r = post(server, "/v1/completions", b'{"prompt": "abc \\ud800 def", "max_tokens": 2}', raw=True)
    is_error(r, 400, "prompt")
    r = post(server, "/v1/chat/completions",
             b'{"messages": [{"role": "user", "content": "\\udfff"}], "max_tokens": 2}', raw=True)
    is_error(r, 400, "messages")


def test_prompt_longer_than_context(server, client, ref):
    r = post(server, "/v1/completions", {"prompt": [1] * CTX, "max_tokens": 2})
    is_error(r, 400, "prompt")
    assert r.json()["error"]["code"] == "context_length_exceeded"
    long_msg = [{"role": "user", "content": "word " * (2 * CTX)}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="synth", messages=long_msg, max_tokens=2)
    assert e.value.code == "context_length_exceeded"


def test_api_key(server):
    for key in (None, "sk-wrong", ""):
        is_error(post(server, "/v1/chat/completions", GOOD_CHAT, key=key), 401)
        c = openai.OpenAI(base_url=server.url + "/v1", api_key=key or "sk-other", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            c.models.list()
    r = httpx.get(server.url + "/v1/models", headers={"Authorization": "Basic " + KEY})
    is_error(r, 401)
    assert httpx.get(server.url + "/health").status_code == 200  # no key needed


def test_unknown_fields_ignored_and_routes(server, client, ref):
    text, _, _ = alone(ref, chat_prompt(ref, GOOD_CHAT["messages"]), 4)
    r = client.chat.completions.create(model="any-name", messages=GOOD_CHAT["messages"], max_tokens=4,
                                       temperature=0, extra_body={"frobnicate": [1, {"x": None}], "mirostat": 2},
                                       presence_penalty=0.0, user="someone")
    assert r.choices[0].message.content == text
    is_error(httpx.get(server.url + "/v1/nothing-here"), 404)
    is_error(httpx.get(server.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}), 405)
    is_error(post(server, "/v1/completions", b"{" + b" " * (9 << 20) + b"}", raw=True), 413)


def test_edge_values_are_served(client, ref):
    """Values at the edges of their ranges are served, not failed: a negative or huge seed, a
    temperature so small that logits / t would overflow (its limit, greedy), top_p 0."""
    ids = ref.tokenize("Edges")
    greedy, _, _ = alone(ref, ids, 4)
    for extra in ({"seed": -5, "temperature": 0.5}, {"seed": 2**70, "temperature": 0.5},
                  {"temperature": 1e-300}, {"temperature": 0.7, "top_p": 0}):
        r = client.completions.create(model="synth", prompt=ids, max_tokens=4, **extra)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
        if "seed" not in extra:
            assert r.choices[0].text == greedy


def test_server_survives_bad_input(server, client, ref):
    """After every bad request above (and a burst now), the server still answers correctly."""
    bad = [b"{", b"[]", json.dumps({"messages": 3}).encode(), json.dumps({**GOOD_CHAT, "max_tokens": 0}).encode()]
    with cf.ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(lambda b: post(server, "/v1/chat/completions", b, raw=True).status_code, bad * 8))
    assert set(codes) == {400}
    text, _, _ = alone(ref, chat_prompt(ref, flat(MESSAGES[0])), 8)
    r = client.chat.completions.create(model="synth", messages=MESSAGES[0], max_tokens=8, temperature=0)
    assert r.choices[0].message.content == text
    assert server.proc.poll() is None


def wait_for(pred, limit_s=60.0):
    """Poll until pred() (a guard against a hang, not a timing check)."""
    end = time.monotonic() + limit_s
    while not pred():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.02)


def test_disconnect_mid_stream_frees_the_slot(server, client, ref):
    """Fill every slot with long streams, read a little of each, hang up: the slots free at once
    (the engine drops them before its next step) and the next request gets one."""
    before = status(server)["requests"]
    streams = [client.completions.create(model="synth", prompt=f"Story number {i}:", max_tokens=CTX - 20,
                                         temperature=0, stream=True) for i in range(PARALLEL)]
    for s in streams:
        it = iter(s)
        next(it)
        next(it)
    for s in streams:
        s.close()
    text, _, _ = alone(ref, "After the hang-up", 8)
    r = client.completions.create(model="synth", prompt="After the hang-up", max_tokens=8, temperature=0)
    assert r.choices[0].text == text
    wait_for(lambda: status(server)["requests"]["cancelled"] - before["cancelled"] == PARALLEL)
    after = status(server)["requests"]
    assert after["done"] - before["done"] == 1
    assert after["active"] == 0 and after["queued"] == 0
    # the hung-up streams stopped early: far fewer tokens than they asked for
    assert after["generated_tokens"] - before["generated_tokens"] < PARALLEL * (CTX - 20) // 2


def test_disconnect_while_waiting_for_a_whole_reply(server, client, ref):
    """A non-streaming client that sends its request and hangs up is dropped too."""
    before = status(server)["requests"]
    body = json.dumps({"prompt": "x", "max_tokens": CTX - 20, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
    wait_for(lambda: status(server)["requests"]["cancelled"] - before["cancelled"] == 1)
    after = status(server)["requests"]
    assert after["done"] == before["done"] and after["active"] == 0
    text, _, _ = alone(ref, "After the hang-up", 8)
    r = client.completions.create(model="synth", prompt="After the hang-up", max_tokens=8, temperature=0)
    assert r.choices[0].text == text


# -- /health while loading, in process (the loader waits for the test) ---------------------------
def test_health_503_while_loading_then_200(path):
    import threading

    import uvicorn

    from lowbit.server.app import create_app
    from serve_util import free_port

    gate = threading.Event()

    def load():
        gate.wait(120)
        return lowbit.load(path, n_ctx=64, threads=1, n_slots=2)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    app = create_app(load, model_id="gated", parallel=2)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    try:
        wait_for(lambda: srv.started)
        r = httpx.get(url + "/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        for p in ("/v1/models", "/v1/status"):
            is_error(httpx.get(url + p), 503)
        is_error(httpx.post(url + "/v1/completions", json={"prompt": "x"}), 503)
        gate.set()
        wait_for(lambda: httpx.get(url + "/health").status_code == 200)
        assert httpx.get(url + "/health").json() == {"status": "ok"}
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in c.models.list()] == ["gated"]
    finally:
        gate.set()
        srv.should_exit = True
        th.join(30)


def test_failed_load_is_reported(tmp_path):
    """A file that is not a model: /health says so (503) and the CLI exits 1 with the reason."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    s = Server("-m", str(bad))
    try:
        assert s.proc.wait(timeout=120) == 1
        assert "error" in s.output() and "bad.gguf" in s.output()
    finally:
        s.stop()


def test_kv_cache_and_memory_options_reach_the_server(path):
    """`lowbit serve --kv q8_0 --hugepages`: the options reach the model (/v1/status says so), and
    concurrent requests each get the text of an in-process model loaded the same way, alone."""
    ref_q8 = lowbit.load(path, n_ctx=CTX, threads=2, kv="q8_0", memory="hugepages")
    prompts = ["Once upon a time", "The numbers are 1, 2, 3,"]
    want = [alone(ref_q8, p, 12)[0] for p in prompts]
    with running("-m", path, "--ctx", str(CTX), "--parallel", "2", "-t", "2", "--kv", "q8_0", "--hugepages") as s:
        st = httpx.get(s.url + "/v1/status").json()
        assert (st["kv"]["k"], st["kv"]["v"]) == ("q8_0", "q8_0") and st["weights"]["memory"] == "hugepages", st
        c = openai_client(s.url)
        with cf.ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda p: c.completions.create(model="m", prompt=p, max_tokens=12,
                                                            temperature=0).choices[0].text, prompts))
    assert got == want
