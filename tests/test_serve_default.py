"""`lowbit serve` with the default model (SmolLM2-135M-Instruct Q4_1), no -m: concurrent
clients of the official `openai` client get the greedy text each gets alone, chat and
completions, streaming and not (the synthetic-model tests in test_serve.py cover the rest)."""
import concurrent.futures as cf
import os

import openai
import pytest

import lowbit
from serve_util import Server, alone, chat_prompt

SCALAR = os.environ.get("LOWBIT_MAX_ISA") == "scalar"  # the reference kernels are slow: a shorter run
N = 8 if SCALAR else 24
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "What is 12 times 12?",
             "Name a famous physicist."][:2 if SCALAR else 4]


@pytest.fixture(scope="module")
def server():
    s = Server("--ctx", "512", "--parallel", "4", "-t", "2")
    try:
        seen = s.wait_ready()
        assert seen[-1] == 200 and set(seen) <= {200, 503}
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def ref():
    return lowbit.load(None, n_ctx=512, threads=2)


def test_default_model_concurrent_clients_match_alone(server, ref):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model_id = client.models.list().data[0].id
    assert model_id == "SmolLM2-135M-Instruct.Q4_1"
    msgs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    want = [alone(ref, chat_prompt(ref, m), N)[0] for m in msgs]
    want_cmpl = alone(ref, "The three primary colours are", N)[0]

    def chat(i):
        stream = i % 2 == 1
        r = client.chat.completions.create(model=model_id, messages=msgs[i], max_tokens=N, temperature=0,
                                           stream=stream)
        return "".join(c.choices[0].delta.content or "" for c in r) if stream else r.choices[0].message.content

    def cmpl(stream):
        r = client.completions.create(model=model_id, prompt="The three primary colours are", max_tokens=N,
                                      temperature=0, stream=stream)
        return "".join(c.choices[0].text for c in r) if stream else r.choices[0].text

    with cf.ThreadPoolExecutor(6) as ex:
        chats = ex.map(chat, range(len(msgs)))
        cmpls = ex.map(cmpl, (False, True))
        assert list(chats) == want
        assert list(cmpls) == [want_cmpl, want_cmpl]
