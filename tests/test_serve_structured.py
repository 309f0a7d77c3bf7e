"""Structured output: `response_format` json_object / json_schema (strict) through the openai
client, on a random-weight model (whose free text is never JSON): every output, greedy or
sampled, streamed or not, must parse and match the schema (checked here by hand, not by
llguidance), and a response_format lowbit cannot follow is a 400 naming it."""
import json

import httpx
import pytest

from serve_util import openai_client, running, synth_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


def matches(v) -> bool:
    """SCHEMA, checked by hand."""
    return (isinstance(v, dict) and set(v) == {"name", "age", "tags", "ok"}
            and isinstance(v["name"], str) and len(v["name"]) <= 12
            and isinstance(v["age"], int) and not isinstance(v["age"], bool) and 0 <= v["age"] <= 150
            and isinstance(v["tags"], list) and len(v["tags"]) <= 3 and all(t in ("red", "green", "blue") for t in v["tags"])
            and isinstance(v["ok"], bool))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = synth_model(tmp_path_factory.mktemp("structured") / "synth.gguf")
    with running("-m", path, "--ctx", "512", "--parallel", "4", "-t", "2") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.url, timeout=300)


def ask(client, fmt, stream, **sampling):
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    r = client.chat.completions.create(model="synth", messages=msgs, max_tokens=200, response_format=fmt,
                                       stream=stream, **sampling)
    if stream:
        chunks = list(r)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].choices[0].finish_reason
    return r.choices[0].message.content, r.choices[0].finish_reason


def test_free_text_of_this_model_is_not_json(client):
    text, _ = ask(client, None, False, temperature=0)
    with pytest.raises(ValueError):
        json.loads(text)


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=1.0, seed=1), dict(temperature=1.0, seed=2),
                                      dict(temperature=1.5, top_p=0.95, seed=3)])
@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_parses_and_matches(client, sampling, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}
    text, reason = ask(client, fmt, stream, **sampling)
    assert reason == "stop", text
    assert matches(json.loads(text)), text


@pytest.mark.parametrize("seed", [4, 5])
def test_json_object_output_is_an_object(client, seed):
    text, reason = ask(client, {"type": "json_object"}, False, temperature=0.8, seed=seed)
    assert text.startswith("{"), text
    if reason == "stop":  # any object may run on to max_tokens; a finished one must parse
        assert isinstance(json.loads(text), dict), text


def test_concurrent_constrained_and_free_requests(client):
    import concurrent.futures as cf
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}
    jobs = [(fmt if i % 2 == 0 else None, i) for i in range(6)]
    with cf.ThreadPoolExecutor(6) as ex:
        outs = list(ex.map(lambda j: ask(client, j[0], j[1] % 3 == 0, temperature=1.0, seed=j[1]), jobs))
    for (fmt_i, _), (text, reason) in zip(jobs, outs):
        if fmt_i is not None:
            assert reason == "stop" and matches(json.loads(text)), text


@pytest.mark.parametrize("fmt", ["json", {"type": "xml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": 5},
                                 {"type": "json_schema", "json_schema": {"schema": 5}},
                                 {"type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}}])
def test_bad_response_format_is_400(server, fmt):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "response_format": fmt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format"
