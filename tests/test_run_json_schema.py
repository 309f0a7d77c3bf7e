"""Structured output outside the server: `lowbit run --json-schema FILE` and
generate(..., json_schema=...) (llguidance masks every token the schema rules out; the text must
parse and match the schema, checked here by hand, not by the library that built the mask)."""
import json

import pytest

import lowbit

pytest.importorskip("llguidance", reason="structured output needs llguidance (lowbit[server])")

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer"},
                         "pet": {"enum": ["cat", "dog", "fish"]}},
          "required": ["name", "age", "pet"], "additionalProperties": False}


def matches(text: str) -> dict:
    v = json.loads(text)
    assert isinstance(v, dict) and set(v) == {"name", "age", "pet"}, v
    assert isinstance(v["name"], str) and len(v["name"]) <= 12, v
    assert isinstance(v["age"], int) and not isinstance(v["age"], bool), v
    assert v["pet"] in ("cat", "dog", "fish"), v
    return v


@pytest.fixture(scope="module")
def model():
    return lowbit.load(None, n_ctx=512)


def test_generate_follows_the_schema(model):
    prompt = "Describe a person as JSON with their name, age and pet:"
    free = "".join(model.generate(prompt, max_tokens=40))
    with pytest.raises(ValueError):  # without the schema the model writes prose: the test can fail
        matches(free)
    stats = lowbit.generate.Stats()
    matches("".join(model.generate(prompt, max_tokens=200, json_schema=SCHEMA, stats=stats)))
    assert stats.stop == "eog"  # ended by the grammar, not by max_tokens
    for seed in (1, 2, 3):  # sampled: still valid
        matches("".join(model.generate(prompt, max_tokens=200, json_schema=SCHEMA, temperature=1.0, seed=seed)))


def test_json_schema_refuses_speculation_and_bad_schemas(model):
    with pytest.raises(ValueError, match="plain decoding"):
        list(model.generate("x", json_schema=SCHEMA, draft="lookup"))
    with pytest.raises(ValueError, match="json_schema"):
        list(model.generate("x", json_schema={"type": "no-such-type"}))


def test_run_cli(tmp_path, capsys):  # (its one-line errors: tests/test_cli.py)
    from lowbit.cli import main
    f = tmp_path / "s.json"
    f.write_text(json.dumps(SCHEMA))
    assert main(["run", "-p", "A person as JSON:", "-n", "200", "--json-schema", str(f)]) == 0
    matches(capsys.readouterr().out.strip())
