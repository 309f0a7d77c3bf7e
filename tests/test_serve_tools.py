"""tools / tool_choice (server/tools.py): the format parsers on hand-written model outputs of each
format, the format detection on real templates (Qwen 2.5's and Llama 3.1's, tests/data/templates,
as their authors publish them), and the openai client against `lowbit serve` on random-weight
models with those templates and with SmolLM2's (no tool syntax: the generic format). Random
weights never call a tool on their own, so "required" and a named function are what make the
output a call: it must parse, name an offered tool, and its arguments must match the tool's
schema (checked here by hand, not by llguidance). The 400s name their field."""
import json
import os

import httpx
import openai
import pytest

from lowbit.server import tools as T
from serve_util import TEMPLATES, openai_client, running, synth_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city over some days.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 12},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                    "b": {"type": "boolean"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
NAMES = {"get_weather", "add"}


def valid_args(name: str, arguments: str) -> bool:
    """The tools' schemas, checked by hand."""
    v = json.loads(arguments)
    if name == "get_weather":
        return (isinstance(v, dict) and set(v) == {"city", "days"} and isinstance(v["city"], str)
                and len(v["city"]) <= 12 and type(v["days"]) is int and 1 <= v["days"] <= 7)
    if name == "add":
        return (isinstance(v, dict) and set(v) == {"a", "b"} and type(v["a"]) is int and 0 <= v["a"] <= 99
                and isinstance(v["b"], bool))
    return False


# -- the formats, on hand-written outputs ---------------------------------------------------------
def decoded(parsed):
    """A Format.parse result with each call's arguments text decoded (the text is checked apart)."""
    content, calls = parsed
    return content, [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in calls]


def test_detect_on_real_templates():
    def fmt(name):
        with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
            return T.detect(f.read()).name
    assert fmt("Qwen-Qwen2.5-7B-Instruct.jinja") == "hermes"
    assert fmt("meta-llama-Llama-3.1-8B-Instruct.jinja") == "llama3"
    assert T.detect("{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}").name == "generic"


def test_hermes_parse():
    h = T.by_name("hermes")
    out = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n'
           '</tool_call>\n<tool_call>\n{"name":"add","arguments":{"a":1,"b":true}}\n</tool_call>')
    assert decoded(h.parse(out, NAMES)) == ("Let me check.", [{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}},
                                                     {"name": "add", "arguments": {"a": 1, "b": True}}])
    assert h.parse("just text", NAMES) == ("just text", [])
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>'  # malformed JSON: content
    assert h.parse(bad, NAMES) == (bad, [])
    unclosed = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": true}}x'  # no </tool_call>: content
    assert h.parse(unclosed, NAMES) == (unclosed, [])
    unknown = '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>'  # not an offered tool: content
    assert h.parse(unknown, NAMES) == (unknown, [])
    # a call cut off at the end (max_tokens), its name whole: a call with its arguments so far
    assert h.parse('Hm <tool_call>\n{"name": "add", "arguments": {"a": 2, "b', NAMES) == (
        "Hm", [{"name": "add", "arguments": '{"a": 2, "b'}])
    # a good call and a truncated one whose name is not whole: the call, the rest as content
    c, calls = h.parse('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": false}}\n</tool_call>\n<tool_call>\n{"na',
                       NAMES)
    assert calls == [{"name": "add", "arguments": '{"a": 2, "b": false}'}] and c == '<tool_call>\n{"na'


def test_llama3_parse():
    l3 = T.by_name("llama3")
    assert l3.parse('{"name": "add", "parameters": {"a": 3,\n "b": true}}', NAMES) == (
        None, [{"name": "add", "arguments": '{"a": 3,\n "b": true}'}])  # the model's own text
    two = '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": true}}; {"name": "get_weather", "parameters": {}}'
    assert [c["name"] for c in l3.parse(two, NAMES)[1]] == ["add", "get_weather"]
    for text in ('Sure: {"name": "add", "parameters": {}}',    # text before: not a call in this format
                 '{"name": "add", "parameters": {"a": 1}} }',   # malformed
                 '{"name": "add", "parameters": {}} and more',  # trailing text
                 "The answer is 4."):
        assert l3.parse(text, NAMES) == (text, [])
    # the output ends inside a call (max_tokens): a call with its arguments so far, as it streamed
    assert l3.parse('{"name": "add", "parameters": {"a": 1', NAMES) == (None, [{"name": "add", "arguments": '{"a": 1'}])


def test_generic_parse_and_render():
    g = T.by_name("generic")
    assert decoded(g.parse('{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": false}}, '
                           '{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}]}', NAMES))[1] == [
        {"name": "add", "arguments": {"a": 1, "b": False}}, {"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}]
    assert g.parse('{"response": "Hello there"}', NAMES) == ("Hello there", [])
    for text in ('{"tool_calls": [{"na', '{"tool_calls": [{"name": "nope", "arguments": {}}]}', "plain",
                 '{"tool_calls": [{"name": "add", "arguments": {}}, {"name": "nope", "arguments": {}}]}'):
        assert g.parse(text, NAMES) == (text, [])
    # the output ends inside a call, its name whole (max_tokens): a call with its arguments so far
    assert g.parse('{"tool_calls": [{"name": "add", "arguments": {"a": 1}}, {"name": "add", "arguments": {"a"',
                   NAMES)[1] == [{"name": "add", "arguments": '{"a": 1}'}, {"name": "add", "arguments": '{"a"'}]
    # ... or cut off before the next call's name is whole: the whole ones, as they streamed
    assert g.parse('{"tool_calls": [{"name": "add", "arguments": {}}, {"name": "ad', NAMES) == (
        None, [{"name": "add", "arguments": "{}"}])
    assert g.parse('{"response": "cut \\u00e9 sho', NAMES) == ("cut \u00e9 sho", [])  # max_tokens: as it streamed
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": True}}}]},
            {"role": "tool", "content": "2", "tool_call_id": "call_1"}]
    out, tools = g.render(msgs, [t["function"] for t in TOOLS])
    assert tools is None and out[0]["role"] == "system" and "get_weather" in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": True}, "id": "call_1"}]}
    assert out[3] == {"role": "user", "content": '{"tool_response": {"tool_call_id": "call_1", "content": "2"}}'}


def test_hermes_stream_holds_back_a_call():
    s = T.by_name("hermes").stream_from
    assert s("Hello") is None and s("Hello <tool") == 6 and s("Hi<tool_call>{") == 2 and s("a <toolbox") is None


def test_call_stream_releases_text_and_holds_calls():
    t = T.parse_request({"tools": TOOLS}, "<tool_call>")  # hermes, auto
    s = T.CallStream(t)
    out = [s.push(p) for p in ["Let", " me <to", "ol_call>\n{\"name\": \"add\", ", '"arguments": {"a": 5, "b": true}}',
                               "\n</tool_call>"]]
    assert [c for c, _ in out] == ["Let", " me ", "", "", ""]
    head = out[2][1]  # the name is whole: the call goes out, with no arguments yet
    assert len(head) == 1 and head[0]["function"] == {"name": "add", "arguments": ""} and head[0]["index"] == 0
    assert out[3][1] == [{"index": 0, "function": {"arguments": '{"a": 5, "b": true}'}}] and out[4][1] == []
    content, deltas, called = s.finish()
    assert content is None and deltas == [] and called
    s = T.CallStream(t)  # a tail that looked like a call but was not: released once it is clear
    assert [s.push(p) for p in ["a <tool", "box b"]] == [("a ", []), ("<toolbox b", [])] and s.finish() == ("", [], False)
    s = T.CallStream(T.parse_request({"tools": TOOLS}, ""))  # generic: a response's text streams as content
    assert s.push('{"response": "h') == ("h", []) and s.push('i"}') == ("i", []) and s.finish() == ("", [], False)
    s = T.CallStream(T.parse_request({"tools": TOOLS}, "<|start_header_id|>ipython<|end_header_id|>"))  # llama3
    assert s.push("Hello") == ("Hello", []) and s.push(' {"name"') == (' {"name"', []) and s.finish() == ("", [], False)


# hand-written outputs of each format (template marker, output, the calls' names)
OUTPUTS = {
    "hermes": ("<tool_call>", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo \\"N\\" \u00e5", '
               '"days": 2}}\n</tool_call>\n<tool_call>\n{"arguments":{"a":1,"b":true},"name":"add"}\n</tool_call>',
               ["get_weather", "add"]),
    "llama3": ("<|start_header_id|>ipython<|end_header_id|>",
               '<|python_tag|>{"name": "add", "parameters": {"a": 17, "b": false}}; '
               '{"name": "get_weather", "parameters": {"city": "Rome", "days": 3}}', ["add", "get_weather"]),
    "generic": ("", '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": false}}, '
                '{"name": "get_weather", "arguments": {"city": "[Rome]", "days": 1}}]}', ["add", "get_weather"]),
}


def accumulate(chunks):
    """The calls a client assembles from delta.tool_calls items (OpenAI's accumulation by index)."""
    calls = {}
    for d in chunks:
        c = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
        if d.get("id") is not None:
            assert c["id"] is None and d["type"] == "function"  # the header comes once, first
            c["id"], c["name"] = d["id"], d["function"]["name"]
        c["arguments"] += d["function"].get("arguments", "")
    return [calls[k] for k in sorted(calls)]


@pytest.mark.parametrize("fmt", list(OUTPUTS))
@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_call_stream_adds_up_to_the_parse(fmt, size):
    """Streamed in pieces of `size` characters, the deltas add up to the non-streamed calls, and the
    arguments go out as they are written: some of a call's arguments before its end is seen."""
    marker, text, names = OUTPUTS[fmt]
    t = T.parse_request({"tools": TOOLS}, marker)
    assert t.format.name == fmt
    content, calls = t.parse(text)
    assert [c["function"]["name"] for c in calls] == names
    s, deltas, streamed, early = T.CallStream(t), [], "", 0
    for i in range(0, len(text), size):
        c, d = s.push(text[i:i + size])
        streamed += c
        deltas += d
        done = len(text[:i + size])
        # arguments sent while the text so far does not hold their whole call yet
        early += sum(1 for x in d if x["function"].get("arguments") and done < len(text))
    c, d, called = s.finish()
    deltas += d
    got = accumulate(deltas)
    assert called and [(g["name"], g["arguments"]) for g in got] == [
        (x["function"]["name"], x["function"]["arguments"]) for x in calls]
    assert [json.loads(g["arguments"]) for g in got]  # JSON, the model's own text
    assert "<tool_call>" not in streamed + (c or "") and "python_tag" not in streamed
    assert (streamed + (c or "")).strip() == (content or "")  # the content before a call streamed as content
    if size < 1000:
        assert early > 1, "the arguments came whole at the end"


def test_generic_response_streams_as_content():
    """tool_choice auto with the generic format: {"response": "..."}'s text goes out as it is
    written, escapes decoded (one cut off at a piece's end, a surrogate pair split, waits), and
    adds up to the non-streamed content."""
    t = T.parse_request({"tools": TOOLS}, "")
    text = '{"response": "Tab\\there, \\"quoted\\" \\u00e9t\\u00e9 \\ud83d\\ude00 done\\n"}'
    want = t.parse(text)[0]
    assert want == 'Tab\there, "quoted" \u00e9t\u00e9 \U0001F600 done\n'
    for size in (1, 2, 5):
        s, out, grew = T.CallStream(t), "", 0
        for i in range(0, len(text), size):
            c, d = s.push(text[i:i + size])
            assert d == []
            out += c
            grew += bool(c)
        c, d, called = s.finish()
        assert out + (c or "") == want and not called and grew > 5


@pytest.mark.parametrize("fmt", list(OUTPUTS))
def test_call_stream_cut_anywhere_adds_up_to_the_parse(fmt):
    """The output cut off at every position (max_tokens): its stream (pieces of 3 characters)
    assembles the calls the non-streamed answer has, a call cut off in its arguments included."""
    marker, text, _ = OUTPUTS[fmt]
    t = T.parse_request({"tools": TOOLS}, marker)
    cut_calls = 0
    for n in range(1, len(text) + 1):
        cut = text[:n]
        s, deltas = T.CallStream(t), []
        for i in range(0, n, 3):
            deltas += s.push(cut[i:i + 3])[1]
        deltas += s.finish()[1]
        want = [(c["function"]["name"], c["function"]["arguments"]) for c in t.parse(cut)[1]]
        assert [(g["name"], g["arguments"]) for g in accumulate(deltas)] == want, cut
        cut_calls += bool(want) and not want[-1][1].endswith("}")
    assert cut_calls > 10  # (cuts inside the arguments were among them)


def test_call_stream_one_call_without_parallel():
    t = T.parse_request({"tools": TOOLS, "parallel_tool_calls": False}, "<tool_call>")
    s = T.CallStream(t)
    deltas = s.push(OUTPUTS["hermes"][1])[1] + s.finish()[1]
    assert [g["name"] for g in accumulate(deltas)] == ["get_weather"] and len(t.parse(OUTPUTS["hermes"][1])[1]) == 1


def test_request_errors():
    def err(d):
        with pytest.raises(T.ToolError) as e:
            T.parse_request(d, "")
        return e.value.param
    assert err({"tools": {"a": 1}}) == "tools"
    assert err({"tools": [{"type": "function", "function": {"description": "x"}}]}) == "tools[0].function.name"
    assert err({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}) == "tools[0].function.parameters"
    assert err({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}) == "tool_choice"
    assert err({"tool_choice": "required"}) == "tool_choice"
    assert err({"tools": TOOLS, "tool_choice": "sometimes"}) == "tool_choice"
    assert T.parse_request({"tools": TOOLS}, "").choice == "auto"
    assert T.parse_request({}, "") is None


# -- the server ----------------------------------------------------------------------------------
MODELS = {"hermes": "Qwen-Qwen2.5-7B-Instruct.jinja", "llama3": "meta-llama-Llama-3.1-8B-Instruct.jinja", "generic": None}


@pytest.fixture(scope="module", params=list(MODELS))
def server(request, tmp_path_factory):
    path = synth_model(tmp_path_factory.mktemp("tools") / "synth.gguf", MODELS[request.param])
    with running("-m", path, "--ctx", "2048", "--parallel", "2", "-t", "2") as s:
        s.format = request.param
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server.url, timeout=300)


MSGS = [{"role": "user", "content": "What is the weather in Paris tomorrow?"}]


def check_calls(calls, names=NAMES, cut=False):
    """Each call names an offered tool with arguments matching its schema; cut (finish_reason
    "length"): the last one was cut off by max_tokens, its arguments the start of a JSON text."""
    assert calls
    for i, c in enumerate(calls):
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in names
        if cut and i == len(calls) - 1:
            assert not c.function.arguments or c.function.arguments.startswith("{")
        else:
            assert valid_args(c.function.name, c.function.arguments), c.function.arguments


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_call(client, choice):
    tc = "required" if choice == "required" else {"type": "function", "function": {"name": "add"}}
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice=tc, max_tokens=120,
                                       parallel_tool_calls=False, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert len(ch.message.tool_calls) == 1
    check_calls(ch.message.tool_calls, NAMES if choice == "required" else {"add"})


def test_forced_call_sampled_parallel(client):
    """Sampled, several calls allowed: every call complete and valid (but a last one cut off by
    max_tokens, finish_reason "length")."""
    for seed in range(3):
        r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required",
                                           max_tokens=150, temperature=1.0, seed=seed)
        check_calls(r.choices[0].message.tool_calls, cut=r.choices[0].finish_reason == "length")


def test_forced_call_streamed(client):
    """The openai client's stream helper assembles delta.tool_calls into the final message."""
    with client.chat.completions.stream(model="m", messages=MSGS, tools=TOOLS, max_tokens=120, temperature=0,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}}) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    ch = final.choices[0]
    assert ch.finish_reason == "tool_calls"
    check_calls(ch.message.tool_calls, {"get_weather"})
    # the same call as the non-streamed request (greedy)
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=120, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].message.tool_calls[0].function.arguments == ch.message.tool_calls[0].function.arguments


def streamed_as_whole(client, kw) -> list[tuple[str, str]]:
    """Asserts that stream=true gives the non-streamed answer's calls (names and arguments' text):
    assembled by the openai client's stream helper and by hand from the raw chunks; the arguments
    arrive in several deltas after the call's header; no markup in the content. Returns the calls."""
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason in ("tool_calls", "length")
    pairs = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    check_calls(whole.message.tool_calls, cut=whole.finish_reason == "length")
    if whole.finish_reason == "tool_calls":  # (the helper raises LengthFinishReasonError on "length")
        with client.chat.completions.stream(**kw) as s:
            for _ in s:
                pass
            final = s.get_final_completion().choices[0]
        assert final.finish_reason == "tool_calls"
        assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == pairs
    chunks = [c.model_dump() for c in client.chat.completions.create(**kw, stream=True)]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == whole.finish_reason
    deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or []]
    assert [(g["name"], g["arguments"]) for g in accumulate(deltas)] == pairs
    for k in range(len(pairs)):  # the header first, then the arguments piece by piece
        mine = [d for d in deltas if d["index"] == k]
        assert mine[0]["id"] and mine[0]["function"]["arguments"] == "" and all(d.get("id") is None for d in mine[1:])
        assert len(mine) > 2 or whole.finish_reason == "length" and k == len(pairs) - 1, mine
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "<tool_call>" not in text and "python_tag" not in text and "tool_calls" not in text
    return pairs


FORCED = dict(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=150)


@pytest.mark.parametrize("seed", [None, 0])
def test_streamed_calls_are_the_calls(client, seed):
    """stream=true, tool_choice required, greedy or sampled with a seed: the non-streamed calls."""
    streamed_as_whole(client, {**FORCED, **({"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed})})


def test_call_cut_off_by_max_tokens_streams_as_it_is(client):
    """max_tokens ends the output inside a call: both answers have it with its arguments so far,
    finish_reason "length"."""
    inside = 0
    for n in range(12, 40, 3):
        kw = {**FORCED, "max_tokens": n, "temperature": 0, "parallel_tool_calls": False}
        ch = client.chat.completions.create(**kw).choices[0]
        if ch.finish_reason != "length":
            break  # (the call is whole by now)
        if not ch.message.tool_calls:
            continue  # (cut before the call's name is whole: content in both answers, test_call_stream_cut_anywhere...)
        pairs = streamed_as_whole(client, kw)
        inside += len(pairs) == 1 and len(pairs[0][1]) > 2 and not pairs[0][1].endswith("}")
    assert inside >= 2  # cut in the arguments, more than once


def test_parallel_calls_stream_too(client, server):
    """Several calls in one turn (hermes, generic; llama3's template allows one): the first seed
    whose answer has two or more calls streams them all, each at its index."""
    if server.format == "llama3":
        pytest.skip("llama3: one call a turn (the template's rule)")
    for seed in range(1, 9):
        if len(streamed_as_whole(client, {**FORCED, "temperature": 1.0, "seed": seed})) >= 2:
            return
    pytest.fail("no seed gave parallel calls")


def test_auto_without_a_call_is_content(client, server):
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="auto", max_tokens=16,
                                       temperature=0)
    ch = r.choices[0]
    if server.format == "generic":  # constrained to {"tool_calls": ...} or {"response": ...}
        assert ch.finish_reason in ("tool_calls", "stop", "length")
        if ch.message.tool_calls:
            check_calls(ch.message.tool_calls)
            return
        # a response: its text streams as content as it is written, the same text
        chunks = list(client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=16,
                                                     temperature=0, stream=True))
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert "".join(pieces) == ch.message.content and len(pieces) > 2, pieces
        return
    assert ch.message.tool_calls is None and ch.finish_reason == "length" and ch.message.content
    # streamed: the same text as content deltas, no tool calls
    chunks = list(client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=16,
                                                 temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ch.message.content
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


def test_none_is_plain_generation(client):
    """tool_choice none: the prompt has no tools, the answer is the plain one."""
    plain = client.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=0)
    none = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=12,
                                          temperature=0)
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None
    offered = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=1, temperature=0)
    assert offered.usage.prompt_tokens > none.usage.prompt_tokens + 50  # the tools are in that prompt


def test_second_turn_with_a_tool_result(client):
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=120,
                                       parallel_tool_calls=False, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    history = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    r2 = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=8, temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens  # the call and its result are in the prompt


@pytest.mark.parametrize("extra, param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "delete_all"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tools_400(server, extra, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4, **extra}, timeout=60)
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["param"] == param and "\n" not in e["message"] and e["type"] == "invalid_request_error"


def test_openai_client_sees_the_400(client):
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
