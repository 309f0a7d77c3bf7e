"""OpenAI's sampling fields in `lowbit serve`: presence / frequency penalties, logprobs (chat and
the legacy completions shape, streamed and not, with speculative decoding and with structured
output), and n > 1 choices; through the openai client and raw HTTP.

The references are independent of the server's code: the raw logits of the prompt plus the
returned tokens, teacher-forced through Model.logits on a separate in-process model (the engine's
logits are bitwise chunk- and batch-invariant, I2/I8), then float64 numpy here: the log-softmax
for logprobs, and the argmax of logits + bias - penalties (counts kept by this test) for greedy
penalised outputs. The returned tokens' ids come from their bytes (every token of the synthetic
model's vocabulary has distinct bytes).
"""
import json

import httpx
import numpy as np
import pytest

import lowbit
from serve_util import alone, chat_prompt, openai_client, running, synth_model

CTX = 512
PARALLEL = 4
MSGS = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return synth_model(tmp_path_factory.mktemp("ssampling") / "synth.gguf")


@pytest.fixture(scope="module")
def server(path):
    with running("-m", path, "--ctx", str(CTX), "--parallel", str(PARALLEL), "-t", "2") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.url)


@pytest.fixture(scope="module")
def ref(path):
    return lowbit.load(path, n_ctx=CTX, threads=2)


@pytest.fixture(scope="module")
def ids_of(ref):
    pieces = {}
    for i in range(ref.config.vocab):
        pieces.setdefault(ref.tokenizer.piece(i), []).append(i)
    assert all(len(v) == 1 for v in pieces.values())  # distinct bytes: the ids follow from them
    return lambda entries: [pieces[bytes(e["bytes"] if isinstance(e, dict) else e.bytes)][0] for e in entries]


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=120)


def raw_rows(ref, prompt: list[int], ids: list[int]) -> np.ndarray:
    """float64 rows of the raw logits each of ids was drawn from (teacher-forced)."""
    lg = ref.logits(prompt + ids)
    return lg[len(prompt) - 1:len(prompt) - 1 + len(ids)].astype(np.float64)


def log_softmax64(rows: np.ndarray) -> np.ndarray:
    m = rows.max(axis=-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))


def chat_ids(ref):
    return ref.tokenize(chat_prompt(ref, MSGS))


def check_chat_logprobs(ref, prompt, content, ids, k):
    """content: chat logprobs entries (dicts) of tokens ids; each logprob and top list against
    float64 numpy over the teacher-forced raw logits."""
    ls = log_softmax64(raw_rows(ref, prompt, ids))
    assert len(content) == len(ids)
    for j, (e, t) in enumerate(zip(content, ids)):
        assert e["logprob"] == pytest.approx(ls[j, t], abs=2e-5)
        want = np.argsort(-ls[j], kind="stable")[:k]
        got = e["top_logprobs"]
        assert len(got) == k
        assert [g["logprob"] for g in got] == pytest.approx(ls[j, want].tolist(), abs=2e-5)
        assert [bytes(g["bytes"]) for g in got] == [ref.tokenizer.piece(int(i)) for i in want]
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(got, got[1:]))  # most likely first


# ---- presence / frequency penalties ----------------------------------------------------------
def penalised_greedy_ok(ref, prompt, ids, bias: dict, presence: float, frequency: float) -> None:
    """Every id is the argmax of raw logits + bias - frequency * count - presence * (count > 0),
    counts over the ids before it (OpenAI's rule, written out here)."""
    rows = raw_rows(ref, prompt, ids)
    count = np.zeros(rows.shape[1])
    for j, t in enumerate(ids):
        z = rows[j].copy()
        for b, v in bias.items():
            z[b] += v
        z -= frequency * count + presence * (count > 0)
        assert t == int(np.argmax(z)), j
        count[t] += 1


BIAS = {"1000": 6.0, "2000": 5.5}  # two tokens above the rest: greedy repeats the first


def test_frequency_penalty_changes_a_repeating_greedy_output(server, ref, ids_of):
    base = {"model": "synth", "messages": MSGS, "max_tokens": 16, "temperature": 0, "logit_bias": BIAS,
            "logprobs": True}
    prompt = chat_ids(ref)
    plain = post(server, "/v1/chat/completions", base).json()["choices"][0]
    ids = ids_of(plain["logprobs"]["content"])
    assert ids.count(1000) >= 12  # the output repeats (the bias holds it there)
    bias = {int(k): v for k, v in BIAS.items()}
    penalised_greedy_ok(ref, prompt, ids, bias, 0.0, 0.0)
    for pres, freq in [(0.0, 2.0), (1.0, 0.5), (-2.0, -2.0), (2.0, 0.0)]:
        r = post(server, "/v1/chat/completions", {**base, "presence_penalty": pres, "frequency_penalty": freq})
        got = ids_of(r.json()["choices"][0]["logprobs"]["content"])
        penalised_greedy_ok(ref, prompt, got, bias, pres, freq)
        if pres > 0 or freq > 0:
            assert got != ids and got.count(1000) < 12
    # 0 is no field: the same output
    r = post(server, "/v1/chat/completions", {**base, "presence_penalty": 0, "frequency_penalty": 0.0})
    assert r.json()["choices"][0]["message"]["content"] == plain["message"]["content"]


def test_penalties_on_completions_and_the_python_api(server, ref):
    text, _, _ = alone(ref, "The quick brown fox", 12, frequency_penalty=1.5, presence_penalty=0.5)
    r = post(server, "/v1/completions", {"model": "synth", "prompt": "The quick brown fox", "max_tokens": 12,
                                         "temperature": 0, "frequency_penalty": 1.5, "presence_penalty": 0.5})
    assert r.json()["choices"][0]["text"] == text


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.01), ("presence_penalty", -3),
                                         ("frequency_penalty", 2.5), ("frequency_penalty", "1"),
                                         ("logprobs", 6), ("logprobs", True), ("logprobs", -1), ("n", 9),
                                         ("echo", True)])
def test_bad_completions_fields_are_400(server, field, value):
    r = post(server, "/v1/completions", {"model": "synth", "prompt": "hi", "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == field and e["type"] == "invalid_request_error" and field in e["message"]


# ---- logprobs --------------------------------------------------------------------------------
def test_chat_logprobs_against_numpy_and_parsed_by_openai(client, ref, ids_of):
    r = client.chat.completions.create(model="synth", messages=MSGS, max_tokens=10, temperature=0, logprobs=True,
                                       top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 10
    assert len(content[0].top_logprobs) == 5 and isinstance(content[0].top_logprobs[0].logprob, float)
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in content) == r.choices[0].message.content
    ents = [e.model_dump() for e in content]
    ids = ids_of(ents)
    check_chat_logprobs(ref, chat_ids(ref), ents, ids, 5)
    # greedy: the sampled token is the most likely one
    assert all(e["top_logprobs"][0]["logprob"] == e["logprob"] for e in ents)


def test_sampled_token_is_reported_outside_the_top_list(server, ref, ids_of):
    # a bias puts a token the raw logits rank low on top: its raw logprob is still reported
    body = {"model": "synth", "messages": MSGS, "max_tokens": 3, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "logit_bias": {"777": 100}}
    c = post(server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]
    ids = ids_of(c)
    assert ids == [777] * 3
    check_chat_logprobs(ref, chat_ids(ref), c, ids, 2)
    assert all(777 not in ids_of(e["top_logprobs"]) for e in c)
    c = post(server, "/v1/chat/completions", {**body, "top_logprobs": 0}).json()["choices"][0]["logprobs"]
    assert all(e["top_logprobs"] == [] for e in c["content"])
    # sampled, with a seed: the drawn tokens' raw logprobs
    c = post(server, "/v1/chat/completions", {**body, "logit_bias": {}, "temperature": 1.0, "seed": 5,
                                              "max_tokens": 8}).json()["choices"][0]["logprobs"]["content"]
    check_chat_logprobs(ref, chat_ids(ref), c, ids_of(c), 2)
    # asked for nothing: null
    r = post(server, "/v1/chat/completions", {"model": "synth", "messages": MSGS, "max_tokens": 2}).json()
    assert r["choices"][0]["logprobs"] is None


def test_completions_legacy_logprobs(server, ref):
    prompt = ref.tokenize("Once upon a time")
    r = post(server, "/v1/completions", {"model": "synth", "prompt": prompt, "max_tokens": 8, "temperature": 0,
                                         "logprobs": 3}).json()
    lp = r["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    from lowbit.generate import generate
    ids = [t for p in generate(ref, prompt, max_tokens=8, details=True) for t in p.ids]  # greedy's tokens
    assert lp["tokens"] == [ref.tokenizer.piece(t).decode("utf-8", "replace") for t in ids]
    ls = log_softmax64(raw_rows(ref, prompt, ids))
    assert lp["token_logprobs"] == pytest.approx([ls[j, t] for j, t in enumerate(ids)], abs=2e-5)
    for j, top in enumerate(lp["top_logprobs"]):
        want = np.argsort(-ls[j], kind="stable")[:3]
        assert list(top) == [ref.tokenizer.piece(int(i)).decode("utf-8", "replace") for i in want]
        assert list(top.values()) == pytest.approx(ls[j, want].tolist(), abs=2e-5)
    assert lp["text_offset"] == np.cumsum([0] + [len(s) for s in lp["tokens"]])[:-1].tolist()
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]


def sse(server, path, body) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize("chat", [True, False])
def test_streamed_logprobs_concatenate_to_the_whole(server, chat):
    if chat:
        path, body = "/v1/chat/completions", {"model": "synth", "messages": MSGS, "max_tokens": 14, "temperature": 0,
                                              "logprobs": True, "top_logprobs": 3, "stop": ["zz"]}
    else:
        path, body = "/v1/completions", {"model": "synth", "prompt": "Hello there", "max_tokens": 14,
                                         "temperature": 0, "logprobs": 3}
    whole = post(server, path, body).json()["choices"][0]["logprobs"]
    chunks = sse(server, path, body)
    lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    if chat:
        assert [e for lp in lps for e in lp["content"]] == whole["content"]
    else:
        for key in whole:
            assert [x for lp in lps for x in lp[key]] == whole[key]


# ---- n > 1 -----------------------------------------------------------------------------------
def test_n_greedy_choices_are_identical(client, ref):
    text, _, n = alone(ref, chat_prompt(ref, MSGS), 12)
    r = client.chat.completions.create(model="synth", messages=MSGS, max_tokens=12, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == [text] * 3
    assert r.usage.completion_tokens == 3 * 12 and r.usage.prompt_tokens == len(chat_ids(ref))
    assert r.usage.total_tokens == r.usage.prompt_tokens + 36


def test_n_with_a_seed_is_deterministic_per_choice(client, ref):
    from lowbit.sampling import Sampler
    kw = dict(model="synth", prompt="Once upon a time", max_tokens=10, temperature=1.0, seed=42)
    a = client.completions.create(n=4, **kw)
    b = client.completions.create(n=4, **kw)
    texts = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(b.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1  # independent streams
    assert client.completions.create(n=1, **kw).choices[0].text == texts[0]  # choice 0: the seed itself
    for i in range(4):  # choice i: Sampler.choice(i)'s seed, as the Python API draws it alone
        seed = Sampler(seed=42).choice(i).seed
        assert texts[i] == alone(ref, "Once upon a time", 10, temperature=1.0, seed=seed)[0]
    # no seed: choices differ (sampled)
    r = client.completions.create(model="synth", prompt="Once upon a time", max_tokens=10, temperature=1.0, n=3)
    assert len({c.text for c in r.choices}) > 1


@pytest.mark.parametrize("chat", [True, False])
def test_n_streamed(client, chat):
    if chat:
        kw = dict(model="synth", messages=MSGS, max_tokens=9, temperature=0.8, seed=3, n=3)
        whole = client.chat.completions.create(**kw)
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        piece = lambda c: c.delta.content or ""  # noqa: E731
        want = {c.index: c.message.content for c in whole.choices}
    else:
        kw = dict(model="synth", prompt="Hello there", max_tokens=9, temperature=0.8, seed=3, n=3)
        whole = client.completions.create(**kw)
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
        piece = lambda c: c.text  # noqa: E731
        want = {c.index: c.text for c in whole.choices}
    got, ends = {}, {}
    for ch in chunks:
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + piece(c)
            if c.finish_reason is not None:
                ends[c.index] = ends.get(c.index, 0) + 1
    assert got == want and ends == {0: 1, 1: 1, 2: 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 27


def test_n_more_than_the_slots_and_the_prompt_computed_once(server, client):
    def prompt_tokens():
        return httpx.get(server.url + "/v1/status").json()["requests"]["prompt_tokens"]
    prompt = "A long shared prompt about colours and shapes. " * 12  # several 32-token blocks
    before = prompt_tokens()
    r = client.completions.create(model="synth", prompt=prompt, max_tokens=4, temperature=0, n=6)
    assert len(r.choices) == 6 and len({c.text for c in r.choices}) == 1
    n_prompt = r.usage.prompt_tokens
    computed = prompt_tokens() - before
    # the whole blocks once (the prefix cache); each choice its own last partial block at most
    assert computed < n_prompt + 6 * 32, (computed, n_prompt)


# ---- with speculative decoding and structured output ----------------------------------------
def test_logprobs_with_lookup_speculation_and_structured_output(path, ref, ids_of):
    with running("-m", path, "--ctx", str(CTX), "--parallel", "2", "-t", "2", "--lookup") as s:
        # a bias that makes the text repeat: lookup's drafts are accepted, windows of several tokens
        body = {"model": "synth", "messages": MSGS, "max_tokens": 16, "temperature": 0, "logprobs": True,
                "top_logprobs": 3, "logit_bias": {"1000": 6.0, "2000": 5.5}, "frequency_penalty": 0.3}
        r = post(s, "/v1/chat/completions", body).json()
        c = r["choices"][0]["logprobs"]["content"]
        check_chat_logprobs(ref, chat_ids(ref), c, ids_of(c), 3)
        st = httpx.get(s.url + "/v1/status").json()["spec"]
        assert st["accepted"] > 0  # the logprobs above include accepted drafts' rows
        # structured output: the raw distribution (before the grammar's mask)
        body = {"model": "synth", "messages": MSGS, "max_tokens": 24, "temperature": 0, "logprobs": True,
                "top_logprobs": 2, "response_format": {"type": "json_object"}}
        r = post(s, "/v1/chat/completions", body).json()
        c = r["choices"][0]["logprobs"]["content"]
        assert "".join(bytes(e["bytes"]).decode() for e in c) == r["choices"][0]["message"]["content"]
        check_chat_logprobs(ref, chat_ids(ref), c, ids_of(c), 2)
