"""OpenAI-shaped completions on a Model, as llama-cpp-python users know them.

    m.create_completion("The capital of France is", max_tokens=16)
        -> {"id", "object": "text_completion", "created", "model",
            "choices": [{"index": 0, "text", "logprobs", "finish_reason"}],
            "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}
    m.create_chat_completion([{"role": "user", "content": "Hi"}])
        -> {..., "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content"}, "logprobs", "finish_reason"}],
            "usage": {...}}

stream=True returns an iterator of chunks instead: completions carry choices[0].text, chat
completions choices[0].delta ({"role": "assistant"} first, then {"content": ...}, {} last).
The last chunk has the finish_reason ("stop": end of generation or a stop string; "length":
max_tokens or a full context) and, as lowbit serve's streams, the usage.

Defaults are llama-cpp-python's: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
repeat_penalty 1.0, presence_penalty and frequency_penalty 0 (temperature 0: greedy); max_tokens 16 for completions, None (until the end
of the reply or a full context) for chat. logprobs: completions take an int (top alternatives
per token, OpenAI's legacy shape: tokens, token_logprobs, top_logprobs, text_offset); chat takes
logprobs=True and top_logprobs=N (OpenAI's shape: content[i].token, logprob, bytes,
top_logprobs). Log-probabilities are of the raw logits (before temperature and filters).

Each call is one generation on its own KV slot while it runs (see lowbit.model: sessions), so
several live streams on one Model are each correct.
"""
from __future__ import annotations

import time
import uuid

from .generate import Piece, Stats, generate

SAMPLING_DEFAULTS = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                         presence_penalty=0.0, frequency_penalty=0.0)


def _options(kw: dict) -> dict:
    """The sampling and generation options, llama-cpp-python's names; unknown names refused
    (a typo must not silently fall back to a default)."""
    allowed = set(SAMPLING_DEFAULTS) | {"seed", "stop"}
    bad = sorted(set(kw) - allowed)
    if bad:
        raise TypeError(f"unexpected argument(s): {', '.join(bad)} (supported: {', '.join(sorted(allowed))}, "
                        f"max_tokens, stream, logprobs)")
    return {**SAMPLING_DEFAULTS, **kw}


def _run(model, prompt_ids: list[int], max_tokens, logprobs, opts, st: Stats):
    """Yield Pieces as the generation runs, merging those with no text yet (a token inside a
    character, or text held back for a stop string) into the next one; st is complete after
    the last."""
    ids, lps = [], []
    for p in generate(model, prompt_ids, max_tokens=max_tokens, stats=st, details=True, logprobs=logprobs, **opts):
        ids += p.ids
        lps += p.logprobs or []
        if p.text or p.finish_reason is not None:
            yield Piece(p.text, ids, p.finish_reason, lps if logprobs is not None else None)
            ids, lps = [], []


def _usage(st: Stats) -> dict:
    return {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.generated,
            "total_tokens": st.prompt_tokens + st.generated}


# ---- logprobs in OpenAI's two shapes (also the server's: lowbit.server.app) ---------------------
# entries: per generated token (token id, its log-probability, {top id: log-probability}),
# generate.token_logprobs' values
def entries(pieces) -> list[tuple[int, float, dict[int, float]]]:
    return [(t, lp, top) for p in pieces for t, (lp, top) in zip(p.ids, p.logprobs or [])]


def _text(tokenizer, t: int) -> str:
    """A token's bytes as text (a piece of a character: U+FFFD)."""
    return tokenizer.piece(t).decode("utf-8", errors="replace")


def legacy_logprobs(tokenizer, ents, offset0: int) -> dict:
    """OpenAI's completion logprobs: per generated token its text, log-probability, top
    alternatives {text: logprob} and character offset in the text (from offset0)."""
    out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    at = offset0
    for t, lp, top in ents:
        s = _text(tokenizer, t)
        out["tokens"].append(s)
        out["text_offset"].append(at)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({_text(tokenizer, k): v for k, v in top.items()})
        at += len(s)
    return out


def chat_logprobs(tokenizer, ents, top_n: int) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [{token,
    logprob, bytes}, ...]}, ...]}; token is the token's bytes as UTF-8 (a piece of a character:
    U+FFFD), bytes its raw bytes."""
    def one(t: int, lp: float) -> dict:
        b = tokenizer.piece(t)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}
    return {"content": [{**one(t, lp), "top_logprobs": [one(k, v) for k, v in list(top.items())[:top_n]]}
                        for t, lp, top in ents]}


# ---- completions ----------------------------------------------------------------------------
def create_completion(model, prompt: str | list[int], max_tokens: int | None = 16, stream: bool = False,
                      logprobs: int | None = None, echo: bool = False, **kw):
    """A completion of `prompt` (text or token ids); see the module doc. echo: the prompt's
    text starts the returned text."""
    opts = _options(kw)
    ids = model.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if isinstance(prompt, str) and not prompt:
        raise ValueError("the prompt is empty")
    head = dict(id=f"cmpl-{uuid.uuid4().hex}", object="text_completion", created=int(time.time()),
                model=model.path)
    prefix = (prompt if isinstance(prompt, str) else model.detokenize(ids)) if echo else ""
    if stream:
        return _stream_completion(model, ids, max_tokens, logprobs, opts, head, prefix)
    st = Stats()
    pieces = list(_run(model, ids, max_tokens, logprobs, opts, st))
    text = prefix + "".join(p.text for p in pieces)
    lp = legacy_logprobs(model.tokenizer, entries(pieces), len(prefix)) if logprobs is not None else None
    return {**head, "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": pieces[-1].finish_reason}],
            "usage": _usage(st)}


def _stream_completion(model, ids, max_tokens, logprobs, opts, head, prefix):
    at = len(prefix)
    if prefix:
        yield {**head, "choices": [{"text": prefix, "index": 0, "logprobs": None, "finish_reason": None}]}
    st = Stats()
    for p in _run(model, ids, max_tokens, logprobs, opts, st):
        lp = legacy_logprobs(model.tokenizer, entries([p]), at) if logprobs is not None else None
        at += len(p.text)
        chunk = {**head, "choices": [{"text": p.text, "index": 0, "logprobs": lp, "finish_reason": p.finish_reason}]}
        if p.finish_reason is not None:
            chunk["usage"] = _usage(st)
        yield chunk


# ---- chat completions -----------------------------------------------------------------------
def _check_messages(messages) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise ValueError(f"messages[{i}] must be a dict with a 'role' string and a 'content'")


def create_chat_completion(model, messages: list[dict], max_tokens: int | None = None, stream: bool = False,
                           logprobs: bool = False, top_logprobs: int | None = None, **kw):
    """The assistant's reply to `messages` with the file's chat template; see the module doc."""
    opts = _options(kw)
    _check_messages(messages)
    if top_logprobs is not None and not logprobs:
        raise ValueError("top_logprobs needs logprobs=True")
    n_top = int(top_logprobs or 0)
    want = n_top if logprobs else None
    prompt = model.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
    ids = model.tokenize(prompt)
    head = dict(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=model.path)
    if stream:
        return _stream_chat(model, ids, max_tokens, want, n_top, opts, head)
    st = Stats()
    pieces = list(_run(model, ids, max_tokens, want, opts, st))
    lp = chat_logprobs(model.tokenizer, entries(pieces), n_top) if logprobs else None
    return {**head, "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(p.text for p in pieces)},
                         "logprobs": lp, "finish_reason": pieces[-1].finish_reason}],
            "usage": _usage(st)}


def _stream_chat(model, ids, max_tokens, want, n_top, opts, head):
    head = {**head, "object": "chat.completion.chunk"}
    yield {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]}
    st = Stats()
    for p in _run(model, ids, max_tokens, want, opts, st):
        lp = chat_logprobs(model.tokenizer, entries([p]), n_top) if want is not None else None
        if p.text:
            yield {**head, "choices": [{"index": 0, "delta": {"content": p.text}, "logprobs": lp, "finish_reason": None}]}
        if p.finish_reason is not None:
            yield {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None if p.text else lp,
                                        "finish_reason": p.finish_reason}], "usage": _usage(st)}
