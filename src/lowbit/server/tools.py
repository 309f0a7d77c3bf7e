"""OpenAI `tools` / `tool_choice` for the chat endpoint: the tool-call formats of chat templates.

A model calls a tool in the syntax its chat template taught it. As llama.cpp's server does with
--jinja (common/chat.cpp: the format is detected from the template's text), each format here is
one row of FORMATS with four parts:

    detect(template source) -> bool   which templates use it (first match wins; generic last)
    render(messages, tools)           the prompt's messages and the template's `tools` variable
    grammar(tools, parallel, auto)    an llguidance Lark grammar whose output is a call (or, for
                                      generic with tool_choice auto, a call or a response)
    parse(text, names)                model output -> (content or None, [calls])

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

Malformed output (a <tool_call> block whose JSON does not parse, an unknown tool name) is kept
as text content, never an error: the client sees what the model said. Output with no call is the
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
        """(content, calls as OpenAI's message.tool_calls); no calls when tools are not offered."""
        if not self.offered:
            return text, []
        content, calls = self.format.parse(text, {t["name"] for t in self.tools})
        if not self.parallel:
            calls = calls[:1]
        return content, [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                          "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                         for c in calls]


class CallStream:
    """A streamed reply with tools offered: push() each text piece and get what may go out now as
    content; text that may be (the start of) a call is held back (Format.stream_from) until
    finish() parses it: (content after what went out, or None; calls as OpenAI's tool_calls)."""

    def __init__(self, tools: Tools):
        self.tools, self.text, self.sent = tools, "", 0

    def push(self, piece: str) -> str:
        self.text += piece
        i = self.tools.format.stream_from(self.text)
        end = len(self.text) if i is None else max(i, self.sent)
        out, self.sent = self.text[self.sent:end], end
        return out

    def finish(self) -> tuple[str | None, list[dict]]:
        return self.tools.parse(self.text[self.sent:])


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


def _decode_call(obj, names: set[str], args_keys: tuple[str, ...]) -> dict | None:
    """{"name", "arguments"} of a parsed call object, or None when it is not a call of `names`."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    for k in args_keys:
        if isinstance(obj.get(k), dict):
            return {"name": obj["name"], "arguments": obj[k]}
    return None


_DECODER = json.JSONDecoder()


def _raw_json(text: str, at: int):
    """(value, end) of the JSON value at text[at:] after whitespace, or (None, at) if none."""
    i = len(text) - len(text[at:].lstrip())
    try:
        return _DECODER.raw_decode(text, i)
    except ValueError:
        return None, at


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


def _hermes_parse(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    start = text.find(_HERMES_OPEN)
    if start < 0:
        return text, []
    calls, rest, at = [], [text[:start]], start
    while at >= 0:
        obj, end = _raw_json(text, at + len(_HERMES_OPEN))
        call = _decode_call(obj, names, ("arguments", "parameters"))
        close = text.find(_HERMES_CLOSE, end) if call is not None else -1
        if call is None or close < 0 or text[end:close].strip():  # malformed or unclosed: the block stays text
            nxt = text.find(_HERMES_OPEN, at + 1)
            rest.append(text[at:nxt if nxt >= 0 else len(text)])
            at = nxt
            continue
        calls.append(call)
        at = text.find(_HERMES_OPEN, close)
        rest.append(text[close + len(_HERMES_CLOSE):at if at >= 0 else len(text)])
    return _content("".join(rest)), calls


# llama3 ---------------------------------------------------------------------------------------
_PYTHON_TAG = "<|python_tag|>"


def _llama3_grammar(tools: list[dict], parallel: bool, auto: bool) -> str:
    return f"start: {_json(_call_schema(tools, 'parameters'))}\n"  # one call a turn (the template's rule)


def _llama3_parse(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    """The whole output is the call(s): JSON objects (after an optional <|python_tag|>), apart
    by whitespace or ";" as llama.cpp accepts; anything else is content."""
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG):]
    calls, at = [], 0
    while True:
        obj, end = _raw_json(body, at)
        call = _decode_call(obj, names, ("parameters", "arguments"))
        if call is None:
            break
        calls.append(call)
        at = end
        tail = body[at:].lstrip()
        if tail.startswith(";"):
            at = len(body) - len(tail) + 1
    if not calls or body[at:].strip():
        return text, []
    return None, calls


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


def _generic_parse(text: str, names: set[str]) -> tuple[str | None, list[dict]]:
    obj, end = _raw_json(text, 0)
    if not isinstance(obj, dict) or text[end:].strip():
        return text, []
    if isinstance(obj.get("response"), str) and len(obj) == 1:
        return obj["response"], []
    raw = obj.get("tool_calls", [obj["tool_call"]] if "tool_call" in obj else None)
    calls = [_decode_call(c, names, ("arguments", "parameters")) for c in raw] if isinstance(raw, list) else [None]
    if not calls or None in calls:
        return text, []
    return None, calls


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
           False, _hermes_stream_from),
    Format("llama3", lambda src: "<|start_header_id|>ipython<|end_header_id|>" in src, _render_native,
           _llama3_grammar, _llama3_parse, False, _llama3_stream_from),
    Format("generic", lambda src: True, _generic_render, _generic_grammar, _generic_parse, True, lambda text: 0),
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
