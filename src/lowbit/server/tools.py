"""OpenAI `tools` / `tool_choice` for the chat endpoint: the tool-call formats of chat templates.

A model calls a tool in the syntax its chat template taught it. As llama.cpp's server does with
--jinja (common/chat.cpp: the format is detected from the template's text), each format here is
one row of FORMATS with these parts:

    detect(template source) -> bool   which templates use it (first match wins; generic last)
    render(messages, tools)           the prompt's messages and the template's `tools` variable
    grammar(tools, parallel, auto)    an llguidance Lark grammar whose output is a call (or, for
                                      generic with tool_choice auto, a call or a response)
    parse(text, names)                model output -> (content or None, [calls])
    stream_from(text)                 where a call may begin in the text so far (streaming)
    partial(text, names)              the calls in unfinished output so far (streaming)

The formats:

    hermes   Hermes 2 Pro / Qwen 2.5 / Qwen 3: `<tool_call>\\n{"name": N, "arguments": {..}}\\n</tool_call>`,
             one block per call; the template names <tool_call> (llama.cpp: src.find("<tool_call>")).
    llama3   Llama 3.1 / 3.2 / 3.3 JSON tool calling: `{"name": N, "parameters": {..}}`, one call
             per turn (the template refuses several); the template has an ipython role header
             (llama.cpp: "<|start_header_id|>ipython<|end_header_id|>").
    generic  any other template (llama.cpp's COMMON_CHAT_FORMAT_GENERIC): the tools and the
             instruction to answer in JSON go in a system message; the output is
             {"tool_calls": [{"name": N, "arguments": {..}}, ..]} or {"response": "text"}, always
             constrained (the model has no syntax of its own to fall back on).

tool_choice: "none" renders without tools (no grammar, no parsing); "auto" renders with them
and parses calls out of the text (generic: constrained to call-or-response); "required" and
{"type": "function", "function": {"name": X}} constrain the output to calls (of X only), each
call's arguments following its tool's `parameters` schema (llguidance's %json inside the Lark
grammar, compact separators). parallel_tool_calls false: one call at most.

A call's `arguments` string is the model's own JSON text of them (compact under a grammar); with
stream=true it goes out piece by piece as the model writes it (CallStream), and the pieces add up
to the non-streamed string.

Malformed output (a <tool_call> block whose JSON does not parse, an unknown tool name) is kept
as text content, never an error: the client sees what the model said. A call the output ends in
(max_tokens came first; its name whole) is a call with its arguments so far, as it streamed
(a stream cannot take a call back); the finish_reason then stays "length". Output with no call is the
content unchanged (as streamed); around calls, the text is stripped.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Callable


class ToolError(ValueError):
    """A tools / tool_choice field lowbit cannot follow (HTTP 400); .param names the field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


# -- the request's fields -------------------------------------------------------------------------
@dataclass
class Tools:
    """A request's validated tools: [{"name", "description", "parameters"}], the choice ("none",
    "auto", "required" or a tool's name), parallel_tool_calls, and the template's format."""
    tools: list[dict]
    choice: str
    parallel: bool
    format: "Format"

    @property
    def offered(self) -> bool:
        """The model sees the tools (tool_choice is not "none")."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> list[dict] | None:
        """The tools the output must call (required: all, named: that one), or None (free)."""
        if not self.offered or self.choice == "auto":
            return None
        return self.tools if self.choice == "required" else [t for t in self.tools if t["name"] == self.choice]

    def grammar(self) -> str | None:
        """The llguidance grammar of the output, None when unconstrained."""
        forced = self.forced
        if forced is not None:
            return self.format.grammar(forced, self.parallel, False)
        if self.offered and self.format.constrain_auto:
            return self.format.grammar(self.tools, self.parallel, True)
        return None

    def render(self, messages: list[dict]) -> tuple[list[dict], list[dict] | None]:
        """(messages, tools) for the chat template: the format's rendering when tools are offered;
        with tool_choice none the history is still rendered the format's way, without tools."""
        return self.format.render(messages, self.tools if self.offered else None)

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, calls as OpenAI's message.tool_calls); no calls when tools are not offered.
        A call's arguments are the model's own JSON text of them."""
        if not self.offered:
            return text, []
        content, calls = self.format.parse(text, {t["name"] for t in self.tools})
        if not self.parallel:
            calls = calls[:1]
        return content, [{"id": _call_id(), "type": "function",
                          "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]

    def partial(self, text: str) -> list[tuple[str, str]]:
        """The calls in text so far: [(name, arguments' text so far)] (Format.partial)."""
        if not self.offered:
            return []
        calls = self.format.partial(text, {t["name"] for t in self.tools})
        return calls if self.parallel else calls[:1]


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class CallStream:
    """A streamed reply with tools offered, as OpenAI streams one: push() each text piece and get
    what may go out now: (content, [delta.tool_calls items]). Text before a call goes out as
    content; from where a call may begin (Format.stream_from) the text is held and re-scanned
    after each piece (Format.partial; llama.cpp's server re-parses the partial message and sends
    the diff, common_chat_msg_diff::compute_diffs): a call goes out as {"index", "id", "type",
    "function": {"name", "arguments": ""}} once its name is whole, then {"index", "function":
    {"arguments": piece}} as the model writes them. finish() parses the held text as the
    non-streamed answer does: (its content, or None; the deltas still to send; whether there were
    calls). Accumulated, the deltas are the non-streamed calls: a call's arguments text only grows.
    Content in the held text goes out as it is written where the format says what it is
    (Format.partial_content: the generic format's {"response": "..."}).

    Output the final parse rejects after its call went out cannot be taken back: that call keeps
    what was sent, while the non-streamed answer has the text as content. That is free text
    (tool_choice auto) gone wrong: a name with no arguments, broken JSON, text after a whole call
    object in the same block, llama3's call followed by text. Constrained output never does it
    (a call cut off by max_tokens is a call in both answers: _Call.cut_off)."""

    def __init__(self, tools: Tools):
        self.tools, self.text, self.sent = tools, "", 0
        self.calls: list[list[str]] = []  # [id, arguments sent] of each call sent
        self.held_content = ""  # content sent out of the held text (Format.partial_content)

    def push(self, piece: str) -> tuple[str, list[dict]]:
        self.text += piece
        if self.calls:  # a call went out: the rest is held (its content comes with finish)
            out = ""
        else:
            i = self.tools.format.stream_from(self.text)
            end = len(self.text) if i is None else max(i, self.sent)
            out, self.sent = self.text[self.sent:end], end
            held = self.tools.format.partial_content(self.text[self.sent:])
            if len(held) > len(self.held_content) and held.startswith(self.held_content):
                out, self.held_content = out + held[len(self.held_content):], held
        return out, self._deltas(self.tools.partial(self.text[self.sent:]))

    def finish(self) -> tuple[str | None, list[dict], bool]:
        content, calls = self.tools.parse(self.text[self.sent:])
        if self.held_content and content is not None and content.startswith(self.held_content):
            content = content[len(self.held_content):]
        return content, self._deltas([(c["function"]["name"], c["function"]["arguments"]) for c in calls]), \
            bool(calls or self.calls)

    def _deltas(self, calls: list[tuple[str, str]]) -> list[dict]:
        out = []
        for k, (name, args) in enumerate(calls):
            if k == len(self.calls):
                self.calls.append([_call_id(), ""])
                out.append({"index": k, "id": self.calls[k][0], "type": "function",
                            "function": {"name": name, "arguments": ""}})
            sent = self.calls[k][1]
            if len(args) > len(sent) and args.startswith(sent):
                out.append({"index": k, "function": {"arguments": args[len(sent):]}})
                self.calls[k][1] = args
        return out


def parse_request(d: dict, template: str | None) -> Tools | None:
    """The tools of a chat request body (None: none given and no tool_choice). Raises ToolError."""
    raw, choice = d.get("tools"), d.get("tool_choice")
    parallel = d.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise ToolError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    if raw is None and choice is None:
        return None
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ToolError("'tools' must be a list of {\"type\": \"function\", \"function\": {...}} objects", "tools")
    tools, names = [], set()
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
            raise ToolError(f"'{p}' must be {{\"type\": \"function\", \"function\": {{...}}}}", p)
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(f"'{p}.function.name' must be a non-empty string", p + ".function.name")
        if name in names:
            raise ToolError(f"'{p}': the tool name {name[:64]!r} is given twice", p + ".function.name")
        params = f.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ToolError(f"'{p}.function.parameters' must be a JSON schema object", p + ".function.parameters")
        desc = f.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ToolError(f"'{p}.function.description' must be a string", p + ".function.description")
        names.add(name)
        tools.append({"name": name, "description": desc or "", "parameters": params})
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, dict):
        f = choice.get("function")
        name = f.get("name") if isinstance(f, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise ToolError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                            "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        if name not in names:
            raise ToolError(f"'tool_choice' names the function {name[:64]!r}, which is not in 'tools'", "tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise ToolError("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
    elif choice == "required" and not tools:
        raise ToolError("'tool_choice' is \"required\" but no 'tools' are given", "tool_choice")
    return Tools(tools, choice, parallel, detect(template or ""))


def history(m: dict, p: str) -> dict:
    """An assistant message's tool_calls, or a tool message's tool_call_id, as templates take
    them: {"tool_calls": [{"id", "type", "function": {"name", "arguments": a dict}}]} (Qwen's
    and Llama's templates write `arguments | tojson`: a JSON string would be quoted twice)."""
    out = {}
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise ToolError(f"'{p}.tool_calls' must be a list", p + ".tool_calls")
        out["tool_calls"] = []
        for j, c in enumerate(calls):
            f = c.get("function") if isinstance(c, dict) else None
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise ToolError(f"'{p}.tool_calls[{j}]' must have a function with a name", f"{p}.tool_calls[{j}]")
            args = f.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    raise ToolError(f"'{p}.tool_calls[{j}].function.arguments' is not JSON",
                                    f"{p}.tool_calls[{j}].function.arguments") from None
            out["tool_calls"].append({"id": c.get("id") or f"call_{j}", "type": "function",
                                      "function": {"name": f["name"], "arguments": args}})
    for k in ("tool_call_id", "name"):
        if isinstance(m.get(k), str):
            out[k] = m[k]
    return out


# -- the formats ----------------------------------------------------------------------------------
def _call_schema(tools: list[dict], args_key: str) -> dict:
    """JSON schema of one call {"name": N, args_key: arguments} of any of `tools` (compact)."""
    one = [{"type": "object", "properties": {"name": {"const": t["name"]}, args_key: t["parameters"]},
            "required": ["name", args_key], "additionalProperties": False} for t in tools]
    return one[0] if len(one) == 1 else {"anyOf": one}


def _json(schema: dict) -> str:
    """A Lark rule body: the JSON of `schema`, compact (no free runs of whitespace)."""
    return "%json " + json.dumps({**schema, "x-guidance": {"whitespace_flexible": False}})


# -- scanning calls: one scanner for the final parse and the stream -----------------------------------
# A call's `arguments` is the model's own JSON text of them (as OpenAI's are "generated by the
# model"), not a re-serialisation: then the pieces a stream sends as the model writes them add up
# to exactly the non-streamed answer's string. The scanner finds that text's span in a call
# object that may still be being written; the final parse and the stream's progress both use it.
_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


@dataclass
class _Call:
    """A call object {"name": N, <args key>: {...}} scanned in text, maybe unfinished."""
    name: str | None = None       # the "name" member once its string is complete
    args: int | None = None       # where the arguments object starts (its first "{")
    args_end: int | None = None   # just after it (None: still being written)
    end: int | None = None        # just after the call's "}" (None: not closed yet)

    def valid(self, names: set[str]) -> bool:
        """A complete call of an offered tool, with its arguments object."""
        return self.end is not None and self.name in names and self.args_end is not None

    def cut_off(self, names: set[str]) -> bool:
        """A call of an offered tool that the text ends inside (max_tokens, or an end of
        generation, came first): kept as a call with its arguments so far, as it streamed."""
        return self.end is None and self.name in names

    def arguments(self, text: str) -> str:
        """The arguments' JSON text so far ("" before they start)."""
        return "" if self.args is None else text[self.args:self.args_end if self.args_end is not None else len(text)]


def _scan_object(text: str, at: int, value: Callable[[str, int], int | None]) -> tuple[bool, int | None]:
    """Walk the JSON object at text[at:] (after whitespace) member by member: value(key, start)
    reads each member's value and returns where it ends (None: it does not end in text, still
    being written or broken). Returns (is an object so far: False when the text there starts
    something else, where the object ends or None while unfinished)."""
    i = _skip(text, at)
    if i == len(text):
        return True, None
    if text[i] != "{":
        return False, None
    i, first = i + 1, True
    while True:
        i = _skip(text, i)
        if i == len(text):
            return True, None
        if text[i] == "}":
            return True, i + 1
        if not first:
            if text[i] != ",":
                return True, None  # broken: it never closes
            i = _skip(text, i + 1)
        if i == len(text) or text[i] != '"':
            return True, None
        try:
            key, i = _DECODER.raw_decode(text, i)
        except ValueError:
            return True, None
        i = _skip(text, i)
        if i == len(text) or text[i] != ":":
            return True, None
        i = value(key, _skip(text, i + 1))
        if i is None:
            return True, None
        first = False


def _scan_array(text: str, at: int, item: Callable[[int], int | None]) -> int | None:
    """Walk the JSON array at text[at] ("["): item(start) reads each element and returns where it
    ends (None: it does not). Returns where the array ends, None while unfinished (or broken)."""
    i, first = at + 1, True
    while True:
        i = _skip(text, i)
        if i == len(text):
            return None
        if text[i] == "]":
            return i + 1
        if not first:
            if text[i] != ",":
                return None
            i = _skip(text, i + 1)
        i = item(i)
        if i is None:
            return None
        first = False


def _decode_value(text: str, at: int) -> tuple[object, int | None]:
    """(value, end) of the JSON value at text[at:], or (None, None) when it does not end there."""
    try:
        return _DECODER.raw_decode(text, at)
    except ValueError:
        return None, None


def _scan_call(text: str, at: int, args_keys: tuple[str, ...]) -> _Call | None:
    """The call object at text[at:] (after whitespace) as far as it goes; None when the text
    there is not (the start of) an object. The arguments are the first member whose key is one of
    args_keys and whose value is an object; "name" is the first member so named. A member that
    does not decode (text that ends in it, or broken JSON) ends the scan: the call stays open."""
    c = _Call()

    def value(key: str, v: int) -> int | None:
        is_args = key in args_keys and c.args is None and text.startswith("{", v)
        if is_args:
            c.args = v
        val, end = _decode_value(text, v)
        if is_args:
            c.args_end = end
        elif key == "name" and c.name is None and isinstance(val, str) and end is not None:
            c.name = val
        return end

    ok, c.end = _scan_object(text, at, value)
    return c if ok else None


def _content(text: str) -> str | None:
    text = text.strip()
    return text or None


# hermes ---------------------------------------------------------------------------------------
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"


def _hermes_grammar(tools: list[dict], parallel: bool, auto: bool) -> str:
    rep = ' ("\\n" call)*' if parallel else ""
    return (f"start: call{rep}\n"
            f'call: "{_HERMES_OPEN}\\n" body "\\n{_HERMES_CLOSE}"\n'
            f"body: {_json(_call_schema(tools, 'arguments'))}\n")


_HERMES_ARGS = ("arguments", "parameters")


def _hermes_blocks(text: str, names: set[str]):
    """Each <tool_call> block of text: (its start, its call scanned (None: not an object), just
    after its </tool_call> when it is a whole valid call (None: it is text), where the next block
    starts (len(text): none))."""
    at = text.find(_HERMES_OPEN)
    while at >= 0:
        c = _scan_call(text, at + len(_HERMES_OPEN), _HERMES_ARGS)
        close = text.find(_HERMES_CLOSE, c.end) if c is not None and c.valid(names) else -1
        end = close + len(_HERMES_CLOSE) if close >= 0 and not text[c.end:close].strip() else None
        nxt = text.find(_HERMES_OPEN, at + 1 if end is None else end)
        yield at, c, end, nxt if nxt >= 0 else len(text)
        at = nxt


def _hermes_cut_off(text: str, at: int, c: _Call | None, names: set[str]) -> bool:
    """The output ends in the last block's call (in it, or before its </tool_call> is whole)."""
    if c is None:
        return False
    if c.end is None:
        return c.cut_off(names) and _HERMES_CLOSE not in text[at:]
    return c.valid(names) and _HERMES_CLOSE.startswith(text[c.end:].strip())


def _hermes_parse(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    start = text.find(_HERMES_OPEN)
    if start < 0:
        return text, []
    calls, rest = [], [text[:start]]
    for at, c, end, nxt in _hermes_blocks(text, names):
        if end is None and nxt == len(text) and _hermes_cut_off(text, at, c, names):
            calls.append({"name": c.name, "arguments": c.arguments(text)})
        elif end is None:  # malformed or unclosed: the block stays text
            rest.append(text[at:nxt])
        else:
            calls.append({"name": c.name, "arguments": c.arguments(text)})
            rest.append(text[end:nxt])
    return _content("".join(rest)), calls


def _hermes_partial(text: str, names: set[str]) -> list[tuple[str, str]]:
    out = []
    for _, c, end, _ in _hermes_blocks(text, names):
        if c is None or c.name not in names:
            break
        out.append((c.name, c.arguments(text)))
        if end is None:  # the block being written (or a malformed one: nothing after it streams)
            break
    return out


# llama3 ---------------------------------------------------------------------------------------
_PYTHON_TAG = "<|python_tag|>"


def _llama3_grammar(tools: list[dict], parallel: bool, auto: bool) -> str:
    return f"start: {_json(_call_schema(tools, 'parameters'))}\n"  # one call a turn (the template's rule)


_LLAMA3_ARGS = ("parameters", "arguments")


def _llama3_calls(text: str, names: set[str]) -> tuple[str, list[_Call], _Call | None, int]:
    """The whole output is the call(s): JSON objects (after an optional <|python_tag|>), apart
    by whitespace or ";" as llama.cpp accepts. (the body scanned, its whole valid calls, the
    object after them (None: not one), where it starts)."""
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG):]
    calls, at = [], 0
    while True:
        c = _scan_call(body, at, _LLAMA3_ARGS)
        if c is None or not c.valid(names):
            return body, calls, c, at
        calls.append(c)
        at = c.end
        tail = body[at:].lstrip()
        if tail.startswith(";"):
            at = len(body) - len(tail) + 1


def _llama3_parse(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """Anything but calls in the output makes all of it content."""
    body, calls, last, at = _llama3_calls(text, names)
    if last is not None and last.end is None and (calls or last.name is not None):
        # the output ends in a call (max_tokens): kept with its arguments so far once its name
        # is whole, as it streamed; a call not yet named after whole ones is dropped
        calls, at = calls + ([last] if last.cut_off(names) else []), len(body)
    if not calls or body[at:].strip():
        return text, []
    return None, [{"name": c.name, "arguments": c.arguments(body)} for c in calls]


def _llama3_partial(text: str, names: set[str]) -> list[tuple[str, str]]:
    body, calls, last, _ = _llama3_calls(text, names)
    if last is not None and last.end is None and last.name in names:
        calls.append(last)
    return [(c.name, c.arguments(body)) for c in calls]


# generic --------------------------------------------------------------------------------------
GENERIC_INSTRUCTION = ("Respond in JSON format, either with `tool_calls` (a request to call tools) or with "
                       "`response` (your reply to the user's request).")


def _generic_render(messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], None]:
    """The template knows no tools: they and the instruction go in the system message; earlier
    calls become the assistant's JSON and tool results a user message {"tool_response": ...}
    (as minja's polyfills for llama.cpp)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"], "id": c["id"]}
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        elif m["role"] == "tool":
            r = {"tool_call_id": m.get("tool_call_id"), "content": m["content"]}
            out.append({"role": "user", "content": json.dumps({"tool_response": r}, ensure_ascii=False)})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        text = ("You can call these tools:\n" + json.dumps([{"type": "function", "function": t} for t in tools],
                                                           ensure_ascii=False, indent=2)
                + "\n\n" + GENERIC_INSTRUCTION)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, None


def _generic_grammar(tools: list[dict], parallel: bool, auto: bool) -> str:
    calls = {"type": "array", "items": _call_schema(tools, "arguments"), "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    call = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
            "additionalProperties": False}
    if auto:
        reply = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                 "additionalProperties": False}
        return f"start: {_json({'anyOf': [call, reply]})}\n"
    return f"start: {_json(call)}\n"


def _generic_calls(text: str, names: set[str]) -> tuple[list[_Call], int | None]:
    """The calls of {"tool_calls": [call, ..]} (or {"tool_call": call}) at the start of text, as
    far as it goes (the last may be unfinished or invalid), and where the object ends (None:
    unfinished, or not such an object: an invalid call ends the scan)."""
    calls: list[_Call] = []

    def call(at: int) -> int | None:
        c = _scan_call(text, at, _HERMES_ARGS)
        if c is None:
            return None
        calls.append(c)
        return c.end if c.valid(names) else None

    def value(key: str, v: int) -> int | None:
        if key == "tool_calls" and text.startswith("[", v):
            return _scan_array(text, v, call)
        if key == "tool_call" and text.startswith("{", v):
            return call(v)
        return _decode_value(text, v)[1]

    ok, end = _scan_object(text, 0, value)
    return calls, end if ok else None


def _generic_parse(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """A response's text is the content; an unfinished one (max_tokens ended it) too, as far as
    it goes (as it streamed); anything else that is not calls is the text itself."""
    obj, end = _decode_value(text, _skip(text, 0))
    if end is None and _generic_response_at(text) is not None:
        return _generic_partial_content(text), []
    if end is None:  # the output ends in a call or after one (max_tokens), the ones before it whole:
        calls, _ = _generic_calls(text, names)  # kept as they streamed (one not yet named dropped)
        if calls and (calls[-1].valid(names) or calls[-1].end is None) and all(c.valid(names) for c in calls[:-1]):
            calls = [c for c in calls if c.name in names]
            if calls:
                return None, [{"name": c.name, "arguments": c.arguments(text)} for c in calls]
    if not isinstance(obj, dict) or text[end:].strip():
        return text, []
    if isinstance(obj.get("response"), str) and len(obj) == 1:
        return obj["response"], []
    calls, _ = _generic_calls(text, names)
    if not calls or not all(c.valid(names) for c in calls):
        return text, []
    return None, [{"name": c.name, "arguments": c.arguments(text)} for c in calls]


def _generic_partial(text: str, names: set[str]) -> list[tuple[str, str]]:
    calls, _ = _generic_calls(text, names)
    out = []
    for c in calls:
        if c.name not in names:
            break
        out.append((c.name, c.arguments(text)))
    return out


def _partial_string(text: str, at: int) -> str:
    """The JSON string at text[at] ('"') decoded as far as it is written: an escape cut off at
    the end, or the first half of a surrogate pair, waits for the rest ("" when it cannot decode)."""
    v, end = _decode_value(text, at)
    if end is not None:
        return v if isinstance(v, str) else ""
    raw = text[at + 1:]
    for cut in range(min(6, len(raw)) + 1):  # (the longest escape: \uXXXX)
        try:
            out = json.loads('"' + raw[:len(raw) - cut] + '"')
        except ValueError:
            continue
        return out[:-1] if out and "\ud800" <= out[-1] <= "\udbff" else out
    return ""


def _generic_response_at(text: str) -> int | None:
    """Where the string of text's {"response": "..."} starts, once it has (None: not such text)."""
    i = _skip(text, 0)
    if not text.startswith("{", i):
        return None
    key, j = _decode_value(text, _skip(text, i + 1))
    if key != "response":
        return None
    j = _skip(text, j)
    if not text.startswith(":", j):
        return None
    v = _skip(text, j + 1)
    return v if text.startswith('"', v) else None


def _generic_partial_content(text: str) -> str:
    """{"response": "text"} streams its text as content as it is written (what the final parse
    gives as content, the grammar of tool_choice auto allowing no other member)."""
    v = _generic_response_at(text)
    return "" if v is None else _partial_string(text, v)


# -- the table ------------------------------------------------------------------------------------
def _render_native(messages: list[dict], tools: list[dict] | None) -> tuple[list[dict], list[dict] | None]:
    """The template takes tools and the tool-call history itself (OpenAI's shapes)."""
    return messages, None if tools is None else [{"type": "function", "function": t} for t in tools]


@dataclass(frozen=True)
class Format:
    name: str
    detect: Callable[[str], bool]
    render: Callable[[list[dict], list[dict] | None], tuple[list[dict], list[dict] | None]]
    grammar: Callable[[list[dict], bool, bool], str]
    parse: Callable[[str, set[str]], tuple[str | None, list[dict]]]
    constrain_auto: bool  # tool_choice auto is constrained too (the generic format's JSON)
    stream_from: Callable[[str], int | None]  # where in the text so far a call may begin (None: nowhere)
    partial: Callable[[str, set[str]], list[tuple[str, str]]]  # the calls in (held) text so far:
    #   [(name, arguments' JSON text so far)], each once its name is whole; for whole valid calls
    #   what parse gives (the same scanner), the last one maybe still being written
    partial_content: Callable[[str], str] = lambda text: ""  # content in the held text so far
    #   that parse will give (a prefix of it): generic's {"response": ...}; the others' comes at the end


def _hermes_stream_from(text: str) -> int | None:
    """The first <tool_call> or a tail of text that may grow into one."""
    i = text.find(_HERMES_OPEN)
    if i >= 0:
        return i
    for k in range(min(len(_HERMES_OPEN) - 1, len(text)), 0, -1):
        if _HERMES_OPEN.startswith(text[-k:]):
            return len(text) - k
    return None


def _llama3_stream_from(text: str) -> int | None:
    """A call is the whole output: hold everything once it starts like one ("{", <|python_tag|>)."""
    s = text.lstrip()
    return 0 if not s or s[0] == "{" or _PYTHON_TAG.startswith(s[:len(_PYTHON_TAG)]) else None


FORMATS = [
    Format("hermes", lambda src: _HERMES_OPEN in src, _render_native, _hermes_grammar, _hermes_parse,
           False, _hermes_stream_from, _hermes_partial),
    Format("llama3", lambda src: "<|start_header_id|>ipython<|end_header_id|>" in src, _render_native,
           _llama3_grammar, _llama3_parse, False, _llama3_stream_from, _llama3_partial),
    Format("generic", lambda src: True, _generic_render, _generic_grammar, _generic_parse, True, lambda text: 0,
           _generic_partial, _generic_partial_content),
]


def detect(template: str) -> Format:
    """The tool-call format of a chat template's source (generic when it shows none)."""
    return next(f for f in FORMATS if f.detect(template))


def by_name(name: str) -> Format:
    return next(f for f in FORMATS if f.name == name)


def validate_grammar(g: str) -> str | None:
    """llguidance's complaint about a grammar (a tool's parameters it cannot follow), or None."""
    import llguidance
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(g)
    return (msgs[0] if msgs else "invalid grammar") if is_error else None


__all__ = ["FORMATS", "CallStream", "Format", "ToolError", "Tools", "by_name", "detect", "history", "parse_request",
           "validate_grammar"]
