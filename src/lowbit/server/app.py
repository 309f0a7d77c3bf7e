"""The OpenAI-compatible HTTP app (Starlette), over the batched scheduler.

    POST /v1/chat/completions   messages -> the GGUF's chat template; stream via SSE
    POST /v1/completions        prompt: a string, [string], [token ids] or [[token ids]]
    GET  /v1/models             the one model
    GET  /v1/models/{id}        that model, or 404 (model_not_found)
    GET  /v1/status             model, kernel per weight format, requests, tokens/s, prefix cache,
                                speculative decoding (drafter, k, drafted, accepted, acceptance rate)
    GET  /health                503 while the model loads, 200 when ready (no API key needed)
    GET  /metrics               Prometheus text format (metrics.py; no API key needed, as /health)

Bad input gets a 4xx with OpenAI's error body {"error": {"message", "type", "param", "code"}},
never a 500: malformed JSON, a body that is not an object, wrong types, out-of-range values,
a prompt that does not fit the context, max_tokens <= 0, a missing or wrong API key, a message
without content or with an unknown role. A full queue is a 429 and a server shutting down a 503,
both with Retry-After. Every request gets one access-log line on stderr. Unknown fields are
ignored.

Sampling fields: temperature (0..2; below 1e-4 greedy), top_p, seed, logit_bias,
presence_penalty and frequency_penalty (-2..2, OpenAI's rule over the tokens this choice has
generated: lowbit.sampling.Sampler, whose docstring has the order of every step), and
llama.cpp's extensions top_k, min_p, repeat_penalty.

n (1..MAX_N): n choices, each its own sequence (a request per choice in the scheduler, choice i
with index i). With a seed, choice i draws from Sampler.choice(i)'s seed (choice 0: the seed
itself; i > 0: SeedSequence([seed, i])); greedy choices are identical. The prompt's whole blocks
are computed once when the prefix cache is on (--cache-mb, the default): the choices after the
first wait for it to pass their shared prefix and copy it (scheduler._leader); what is left of
the last block, each choice computes. usage counts the prompt once and every choice's
completion tokens; a stream's choices each end with their own finish_reason chunk, and the last
to end carries the usage.

logprobs: chat takes logprobs true and top_logprobs 0..20 (choices[i].logprobs.content: token,
logprob, bytes, top_logprobs), completions logprobs 0..5 (the legacy tokens, token_logprobs,
top_logprobs, text_offset; offsets count the reported tokens' characters from the completion's
start; echo is refused: the prompt's logprobs are not computed). The log-probabilities are the
log-softmax, in float64, of the model's raw logits row the token was drawn from
(generate.token_logprobs): before logit_bias, penalties, temperature and filters, and before a
structured output's grammar mask (the raw distribution: its top alternatives may include tokens
the grammar ruled out), as vLLM returns by default; with speculative decoding, the accepted
tokens' rows. The sampled token's logprob is given even when it is not in the top list. A
streamed chunk carries the logprobs of the tokens reported since the previous chunk of its
choice (a token's text held back for a stop string goes with a later chunk); the
end-of-generation token is not reported. Only requests that ask pay for the log-softmax.

tools / tool_choice / parallel_tool_calls (tools.py): the tools go to the chat template, calls
are parsed out of the output in the template's format (message.tool_calls, finish_reason
"tool_calls", or "length" when max_tokens cut a call off; streamed as delta.tool_calls, the
arguments piece by piece as the model writes them) and tool_choice "required" or a named
function constrains the output to calls with llguidance. response_format json_object / json_schema constrains the output with llguidance
(structured.py): every output parses and matches the schema. logit_bias ({"token id": bias in
-100..100}) is added to the logits before sampling, as OpenAI does. Extensions as llama.cpp's server names them: top_k, min_p, repeat_penalty.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import sys
import threading
import time
import uuid
from typing import Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..completion import chat_logprobs, legacy_logprobs
from ..sampling import Sampler
from .metrics import Metrics
from .prefix import PrefixCache
from .scheduler import Draining, QueueFull, Request, Scheduler
from .structured import Constraint, FormatError, grammar
from .tools import CallStream, ToolError, Tools, history, parse_request, validate_grammar

MAX_BODY = 8 << 20   # bytes of request body accepted
DRAIN_BODY = 64 << 20  # bytes of an oversized body read and dropped before the 413
MAX_STOP = 4         # stop strings per request (OpenAI's limit)
MAX_N = 8            # choices per request
MAX_TOP_LOGPROBS = {True: 20, False: 5}  # top alternatives per token: chat, completions (OpenAI's limits)
RETRY_AFTER = {429: "1", 503: "5"}  # seconds a client should wait: a full queue, a shutdown
# roles a chat message may have ("developer" is OpenAI's newer name for "system")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):  # noqa: A002 - OpenAI's field name
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": RETRY_AFTER[self.status]} if self.status in RETRY_AFTER else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


# -- request fields ------------------------------------------------------------------------------
def _int(d: dict, key: str, default, lo: int | None = None, hi: int | None = None):
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be an integer, not {type(v).__name__}", key)
    if lo is not None and v < lo or hi is not None and v > hi:
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ApiError(400, f"'{key}' must be {rng}, got {v}", key)
    return v


def _num(d: dict, key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise ApiError(400, f"'{key}' must be a finite number", key)
    if v > hi or v < lo or lo_open and v == lo:
        raise ApiError(400, f"'{key}' must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v}", key)
    return float(v)


def _bool(d: dict, key: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"'{key}' must be a boolean", key)
    return v


def _stop(d: dict) -> list[str]:
    v = d.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ApiError(400, "'stop' must be a string or a list of strings", "stop")
    if len(v) > MAX_STOP:
        raise ApiError(400, f"'stop' takes at most {MAX_STOP} strings", "stop")
    return [s for s in v if s]


def _logit_bias(d: dict, vocab: int) -> dict[int, float]:
    v = d.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ApiError(400, "'logit_bias' must be an object mapping token ids to numbers", "logit_bias")
    out = {}
    for k, b in v.items():
        try:
            t = int(k)
        except ValueError:
            raise ApiError(400, f"'logit_bias': {k!r} is not a token id", "logit_bias") from None
        if not 0 <= t < vocab:
            raise ApiError(400, f"'logit_bias': token id {t} outside 0..{vocab - 1}", "logit_bias")
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not -100 <= b <= 100:
            raise ApiError(400, f"'logit_bias': the bias of {k} must be a number in -100..100", "logit_bias")
        out[t] = float(b)
    return out


def _sampler(d: dict) -> Sampler:
    top_p = _num(d, "top_p", 1.0, 0.0, 1.0)
    temperature = _num(d, "temperature", 1.0, 0.0, 2.0)
    seed = _int(d, "seed", None)
    return Sampler(temperature=temperature if temperature >= 1e-4 else 0.0,  # the t -> 0 limit: greedy (and
                   #                                                     no overflow of logits / t)
                   top_k=_int(d, "top_k", 0, lo=0),
                   top_p=top_p if top_p > 0 else 1e-12,  # 0: only the most likely token remains
                   min_p=_num(d, "min_p", 0.0, 0.0, 1.0),
                   repeat_penalty=_num(d, "repeat_penalty", 1.0, 0.0, 100.0, lo_open=True),
                   presence_penalty=_num(d, "presence_penalty", 0.0, -2.0, 2.0),
                   frequency_penalty=_num(d, "frequency_penalty", 0.0, -2.0, 2.0),
                   seed=None if seed is None else seed & (2**64 - 1))  # any integer, as OpenAI takes


def _logprobs(d: dict, chat: bool) -> int | None:
    """Top alternatives per token to report (None: no logprobs): chat's logprobs (bool) and
    top_logprobs, completions' logprobs (int)."""
    hi = MAX_TOP_LOGPROBS[chat]
    if not chat:
        if d.get("echo"):  # the prompt's logprobs (lm-eval's loglikelihood): refused, not ignored
            raise ApiError(400, "'echo' is not supported (the prompt's tokens and logprobs are not returned)", "echo")
        return None if d.get("logprobs") is False else _int(d, "logprobs", None, lo=0, hi=hi)
    top = _int(d, "top_logprobs", None, lo=0, hi=hi)
    if not _bool(d, "logprobs", False):
        if top:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def _usage(usages: list[dict]) -> dict:
    """The usage of an n-choice request: the prompt once (and its cached tokens as the first
    choice found them), every choice's completion tokens."""
    u = usages[0]
    done = sum(x["completion_tokens"] for x in usages)
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": done,
            "total_tokens": u["prompt_tokens"] + done, "prompt_tokens_details": u["prompt_tokens_details"]}


def _chat_text(messages) -> list[dict]:
    """messages as the chat template takes them: role and string content."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"'{p}' must be an object", p)
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise ApiError(400, f"'{p}.role' must be a non-empty string", p + ".role")
        if role not in ROLES:
            raise ApiError(400, f"'{p}.role': unknown role {role[:40]!r} (one of {', '.join(ROLES)})", p + ".role")
        if content is None:
            if role != "assistant" or not m.get("tool_calls"):  # only a tool-calling turn may omit it
                raise ApiError(400, f"'{p}' has no content", p + ".content")
            content = ""
        elif isinstance(content, list):  # content parts: text only
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ApiError(400, f"'{p}.content': only text parts are supported", p + ".content")
                parts.append(part["text"])
            content = "".join(parts)
        elif not isinstance(content, str):
            raise ApiError(400, f"'{p}.content' must be a string or a list of text parts", p + ".content")
        try:
            out.append({"role": ROLES[role], "content": content, **history(m, p)})
        except ToolError as e:
            raise ApiError(400, str(e), e.param) from None
    return out


# -- the access log and the request counter -----------------------------------------------------
ENDPOINTS = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/status", "/health", "/metrics"}


def _endpoint(path: str) -> str:
    """The metrics label of a path: the route, never the raw path (an unbounded label set)."""
    if path in ENDPOINTS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


class AccessLog:
    """ASGI middleware: one line per HTTP request once its response has ended (or its client has
    gone), and the lowbit_requests_total counter. A handler that ran a generation leaves its
    scheduler Requests (one per choice) in scope["lowbit.request"]; the line then carries their
    token counts (the prompt once, every choice's completion tokens):

        lowbit: 127.0.0.1:50312 "POST /v1/chat/completions" 200 0.412s 1830B prompt=31 cached=0 completion=16
    """

    def __init__(self, app, metrics: Metrics, write: Callable[[str], None] | None):
        self.app, self.metrics, self.write = app, metrics, write

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status, size, ended = 0, 0, False

        async def send_logged(msg):
            nonlocal status, size, ended
            if msg["type"] == "http.response.start":
                status = msg["status"]
            elif msg["type"] == "http.response.body":
                size += len(msg.get("body", b""))
                ended = not msg.get("more_body", False)
            await send(msg)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            code = status or 500
            self.metrics.request(_endpoint(scope["path"]), code)
            if self.write is not None:
                c = scope.get("client")
                who = f"{c[0]}:{c[1]}" if c else "-"
                # the path as sent, but never a quote or a line break of its own in the log
                path = scope["path"][:300].encode("unicode_escape").decode("ascii").replace('"', "%22")
                line = (f'lowbit: {who} "{scope["method"]} {path}" {code} '
                        f"{time.perf_counter() - t0:.3f}s {size}B")
                rs = scope.get("lowbit.request")
                if rs:
                    line += (f" prompt={len(rs[0].prompt)} cached={rs[0].cached} "
                             f"completion={sum(r.generated for r in rs)}")
                if not ended:
                    line += " (client gone)"
                self.write(line)


# The KV cache a server commits ahead of its requests, at most (whole slots, at least one): a
# model's slots of long contexts (up to 16, as fit in half of the free memory) would otherwise take
# gigabytes, and on a VM that backs memory at first touch (~100 MB/s, BENCHMARKS.md round 26) a
# core's time for a minute, for slots a server may never run; those past it commit at first use.
KV_AHEAD_BYTES = 1 << 30


def kv_slots_ahead(model, parallel: int) -> int:
    """How many of its `parallel` slots a server commits after load (KV_AHEAD_BYTES)."""
    per = max(1, int(model.engine.kv_bytes(model.n_ctx)))
    return max(1, min(parallel, KV_AHEAD_BYTES // per))


def _commit_slots(commit, n: int) -> None:
    """The KV cache of the server's first n slots committed (on a thread of its own, beside requests):
    a slot that does not fit fails here quietly and, as before, in the request that first uses it."""
    try:
        commit(n)
    except Exception:  # noqa: BLE001 - reported by that request
        pass


def _run_emits(evs: list) -> None:
    """On the event loop: one step's events, each to its request's queue."""
    for emit, ev in evs:
        emit(ev)


def _failure(ev: tuple) -> ApiError:
    """A scheduler's ("error", message[, "shutdown"]) event as the error a client gets."""
    if len(ev) > 2 and ev[2] == "shutdown":
        return ApiError(503, ev[1], type="unavailable_error", code="shutting_down")
    return ApiError(500, f"generation failed: {ev[1]}", type="server_error")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the app -------------------------------------------------------------------------------------
class State:
    """What the handlers share: the model and scheduler once loaded."""

    def __init__(self, model_id: str, api_key: str | None, parallel: int):
        self.model_id, self.api_key, self.parallel = model_id, api_key, parallel
        self.kv_ahead = None  # slots whose KV cache the server commits after load (kv_slots_ahead)
        self.model = None
        self.scheduler: Scheduler | None = None
        self.cache: PrefixCache | None = None
        self.metrics = Metrics()
        self.load_error: str | None = None
        self.created = int(time.time())
        self.on_load_error: Callable[[str], None] | None = None
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's event loop (set at startup)

    def drain(self, grace: float) -> None:
        """Graceful shutdown: refuse new requests, end the unfinished ones after grace seconds."""
        self.draining = True
        if self.scheduler is not None:
            self.scheduler.drain(grace)


def create_app(load: Callable[[], object], *, model_id: str, parallel: int | None, api_key: str | None = None,
               step_tokens: int = 64, max_queue: int = 256, cache_mb: float = 0.0, cors: list[str] | None = None,
               access_log: Callable[[str], None] | None = _stderr, coalesce: int = 1,
               speculator: Callable[[object], object] | None = None, spec_k: int = 4,
               spec_cost: float | None = None) -> Starlette:
    """The app. `load()` returns a lowbit Model with >= parallel KV slots (parallel None: all of
    its slots, the line "lowbit serve: N parallel sequences ..." going to access_log); it runs on a thread at startup, /health answers 503 until it returns. max_queue: requests waiting beyond the running
    ones (more: 429); cache_mb: the prefix cache's budget (0: none); cors: allowed origins ("*":
    any); access_log: where the per-request lines go (None: nowhere); coalesce: text pieces (tokens)
    per streamed SSE event at most, an event going out once it has that many or the stream ends (a
    proxy in front, as Ray Serve's, pays per event: fewer events, less of its CPU per token);
    speculator: speculator(model) -> a spec.py Speculator (prompt lookup, a draft model), made on
    the loading thread after the model (None: no speculative decoding); spec_k: drafts per window;
    spec_cost: the drafting policy's cost of a token (scheduler.SPEC_TOKEN_COST when None)."""
    st = State(model_id, api_key or None, parallel)

    def loader():
        try:
            model = load()
            # (a hybrid model's cache keeps recurrent-state snapshots beside the KV: prefix.py)
            cache = PrefixCache(model, int(cache_mb * 2**20)) if cache_mb > 0 else None
            loop = st.loop

            def deliver(evs):  # on the engine thread: one wake-up of the event loop per step
                loop.call_soon_threadsafe(_run_emits, evs)

            spec = speculator(model) if speculator is not None else None
            par = parallel
            if par is None:  # all the model's slots (load(n_slots="auto"): as many as fit)
                par = st.parallel = model.n_slots
                if access_log is not None:
                    access_log(f"lowbit serve: {par} parallel sequences (--parallel auto: each a KV cache of "
                               f"{model.engine.kv_bytes(model.n_ctx) / 2**20:.0f} MB for {model.n_ctx} positions, "
                               f"committed after load up to {KV_AHEAD_BYTES >> 20} MB in all, the rest at first use)")
            sched = Scheduler(model, par, step_tokens=step_tokens, max_queue=max_queue, cache=cache,
                              metrics=st.metrics, deliver=deliver, spec=spec, spec_k=spec_k,
                              **({} if spec_cost is None else {"spec_cost": spec_cost}))
            st.model, st.cache = model, cache
            commit = getattr(model.engine, "commit_slots", None)  # (a pipeline's stages commit as they run)
            if commit is not None:  # the slots' KV resident now, not during the first burst of requests
                st.kv_ahead = kv_slots_ahead(model, par)
                threading.Thread(target=_commit_slots, args=(commit, st.kv_ahead), name="lowbit-kv",
                                 daemon=True).start()
            st.scheduler = sched  # last: handlers take a set scheduler to mean "ready"
        except Exception as e:  # noqa: BLE001 - reported by /health and the CLI
            st.load_error = f"{type(e).__name__}: {e}"
            if st.on_load_error:
                st.on_load_error(st.load_error)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        st.loop = asyncio.get_running_loop()
        threading.Thread(target=loader, name="lowbit-load", daemon=True).start()
        yield
        if st.scheduler:
            st.scheduler.close()

    def ready(request: HTTPRequest):
        """The API key, then the model: raise ApiError unless both are there."""
        if st.api_key is not None:
            auth = request.headers.get("authorization", "")
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else None
            if given is None:
                raise ApiError(401, "missing API key (send 'Authorization: Bearer KEY')", code="invalid_api_key")
            if not hmac.compare_digest(given.encode(), st.api_key.encode()):
                raise ApiError(401, "incorrect API key", code="invalid_api_key")
        if st.scheduler is None:
            if st.load_error:
                raise ApiError(503, f"the model failed to load: {st.load_error}", type="unavailable_error")
            raise ApiError(503, "the model is loading", type="unavailable_error", code="model_loading")

    async def body(request: HTTPRequest) -> dict:
        buf = bytearray()
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size <= MAX_BODY:
                buf += chunk
            elif size > DRAIN_BODY:
                break  # answer now: the connection closes with the response
        if size > MAX_BODY:  # read (and dropped) the rest first, so the client sees the answer
            raise ApiError(413, f"the request body exceeds {MAX_BODY} bytes")
        try:
            data = json.loads(buf)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise ApiError(400, "the request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return data

    def common(d: dict, chat: bool) -> dict:
        n = _int(d, "n", 1, lo=1, hi=MAX_N)
        logprobs = _logprobs(d, chat)
        key = "max_completion_tokens" if d.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = _int(d, key, None, lo=1)
        stream = _bool(d, "stream", False)
        so = d.get("stream_options")
        if so is not None and not isinstance(so, dict):
            raise ApiError(400, "'stream_options' must be an object", "stream_options")
        include_usage = _bool(so or {}, "include_usage", False)
        try:
            g = grammar(d.get("response_format"))
        except FormatError as e:
            raise ApiError(400, str(e), "response_format") from None
        return dict(n=n, logprobs=logprobs, max_tokens=max_tokens, stream=stream, include_usage=include_usage,
                    stop=_stop(d),
                    sampler=_sampler(d), logit_bias=_logit_bias(d, st.model.config.vocab), grammar=g)

    async def tokenize(text: str, param: str) -> list[int]:
        """On a worker thread: a long prompt must not stall the other clients' streams."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in the JSON) is no Unicode text
            raise ApiError(400, f"the text is not valid Unicode: {e.reason} at character {e.start}", param) from None
        return await run_in_threadpool(st.model.tokenize, text)

    def fits(ids: list[int], param: str) -> None:
        n_ctx = st.model.n_ctx
        if not ids:
            raise ApiError(400, "the prompt is empty", param)
        if len(ids) >= n_ctx:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; this server's context holds {n_ctx} "
                           f"(prompt and completion)", param, code="context_length_exceeded")

    async def run(request: HTTPRequest, ids: list[int], o: dict, chat: bool, tools: Tools | None = None) -> Response:
        """Generate o["n"] choices for a prompt, one scheduler Request each; tools: the chat
        request's tools when offered (calls parsed out)."""
        sched = st.scheduler
        n = o["n"]
        q: asyncio.Queue = asyncio.Queue()  # (choice index, event), from every choice
        max_tokens = o["max_tokens"] or st.model.n_ctx  # none given: until the context is full
        constraints = [None] * n
        if o["grammar"] is not None:  # a worker thread: the first one builds llguidance's vocabulary (~1 s)
            try:
                for i in range(n):  # (each choice its own matcher state)
                    constraints[i] = await run_in_threadpool(Constraint, st.model.tokenizer, st.model.config.vocab,
                                                             o["grammar"])
            except FormatError as e:
                raise ApiError(400, str(e), "tools" if tools is not None else "response_format") from None
        # emit is called on this loop's thread (the scheduler's deliver posts the events here)
        reqs = [Request(prompt=ids, max_tokens=max_tokens, sampler=o["sampler"].choice(i),
                        emit=lambda ev, i=i: q.put_nowait((i, ev)), stop=o["stop"], logit_bias=o["logit_bias"],
                        constraint=constraints[i], logprobs=o["logprobs"]) for i in range(n)]
        try:  # consecutive in the queue: the choices after the first share its prompt blocks
            for r in reqs:
                sched.submit(r)
        except (QueueFull, Draining, ValueError) as e:
            for r in reqs:
                sched.cancel(r)
            if isinstance(e, QueueFull):
                raise ApiError(429, str(e), type="server_busy", code="queue_full") from None
            if isinstance(e, Draining):
                raise ApiError(503, str(e), type="unavailable_error", code="shutting_down") from None
            raise ApiError(400, str(e)) from None
        request.scope["lowbit.request"] = reqs  # for the access log
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": st.model_id}
        if o["stream"]:
            return StreamingResponse(stream(reqs, q, head, chat, o["include_usage"], tools),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        # not streaming: collect, and cancel if the client goes away meanwhile
        async def watch():
            while (await request.receive())["type"] != "http.disconnect":
                pass
            q.put_nowait((None, ("gone",)))

        watcher = asyncio.create_task(watch())
        texts = [[] for _ in range(n)]
        ents = [[] for _ in range(n)]  # logprob entries
        ends: list[tuple | None] = [None] * n  # (finish_reason, usage)
        try:
            while None in ends:
                i, ev = await q.get()
                if ev[0] == "text":
                    texts[i].append(ev[1])
                elif ev[0] == "logprobs":
                    ents[i] += ev[1]
                elif ev[0] == "done":
                    ends[i] = ev[1:]
                elif ev[0] == "error":
                    return _failure(ev).response()
                else:  # gone
                    return Response(status_code=499)
        finally:
            watcher.cancel()
            for r, e in zip(reqs, ends):
                if e is None:  # (an error or a gone client: the other choices stop too)
                    sched.cancel(r)
        tok = st.model.tokenizer
        choices = []
        for i, ((reason, _), text) in enumerate(zip(ends, texts)):
            lp = None
            if o["logprobs"] is not None:
                lp = chat_logprobs(tok, ents[i], o["logprobs"]) if chat else legacy_logprobs(tok, ents[i], 0)
            if chat:
                message = {"role": "assistant", "content": "".join(text)}
                if tools is not None:
                    message["content"], calls = tools.parse(message["content"])
                    if calls:  # (a call cut off by max_tokens: "length" says so)
                        message["tool_calls"] = calls
                        reason = reason if reason == "length" else "tool_calls"
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
            else:
                choices.append({"index": i, "text": "".join(text), "logprobs": lp, "finish_reason": reason})
        return JSONResponse({**head, "object": "chat.completion" if chat else "text_completion",
                             "choices": choices, "usage": _usage([u for _, u in ends])})

    async def stream(reqs: list[Request], q: asyncio.Queue, head: dict, chat: bool, include_usage: bool,
                     tools: Tools | None = None):
        """SSE events of a generation's choices (q: (choice index, event)); each chunk has one
        choice, with its index. With tools (tools.CallStream), text that may be (the start of) a
        call is held back, and calls go out as delta.tool_calls OpenAI's way: one chunk with
        index, id, type and name (arguments "") once the name is whole, then chunks of the
        arguments' text as the model writes it; at the end the held text's content, the rest of
        the calls, and finish_reason "tool_calls". Logprobs ride on the next chunk of their
        choice after their event (the finish_reason chunk takes what is left)."""
        def sse(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        n, tok, top_n = len(reqs), st.model.tokenizer, reqs[0].logprobs
        calls_stream = [CallStream(tools) if tools is not None else None for _ in range(n)]
        pending = [[] for _ in range(n)]  # logprob entries not yet sent
        offset = [0] * n                  # completions: characters of the tokens reported (text_offset)
        usages: list[dict | None] = [None] * n

        def logprobs(i: int) -> dict | None:
            """Choice i's pending logprobs in the endpoint's shape (None: none pending)."""
            if not pending[i]:
                return None
            ents, pending[i] = pending[i], []
            if chat:
                return chat_logprobs(tok, ents, top_n)
            out = legacy_logprobs(tok, ents, offset[i])
            offset[i] += sum(len(t) for t in out["tokens"])
            return out

        def release(i: int, piece: str) -> list[dict]:
            """The chunks of a text piece of choice i: content, and tool-call deltas."""
            if calls_stream[i] is None:
                return [chunk(i, piece)] if piece else []
            content, deltas = calls_stream[i].push(piece)
            return ([chunk(i, content)] if content else []) + [tool_chunk(i, d) for d in deltas]

        def calls_chunks(i: int, reason: str) -> tuple[list[dict], str]:
            """The chunks of the held text (content, then the calls' rest), and the finish reason."""
            content, deltas, called = calls_stream[i].finish()
            out = [chunk(i, content)] if content else []
            return out + [tool_chunk(i, d) for d in deltas], "tool_calls" if called and reason != "length" else reason

        def tool_chunk(i: int, call: dict) -> dict:
            return {**head, "choices": [{"index": i, "delta": {"tool_calls": [call]}, "logprobs": logprobs(i),
                                         "finish_reason": None}]}

        def chunk(i: int, piece: str | None, reason: str | None = None, role: bool = False) -> dict:
            lp = None if role else logprobs(i)
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": piece} if piece else {})
                c = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": reason}
            else:
                c = {"index": i, "text": piece or "", "logprobs": lp, "finish_reason": reason}
            return {**head, "choices": [c]}

        left = n
        try:
            if chat:
                for i in range(n):
                    yield sse(chunk(i, None, role=True))
            nxt = None
            while True:
                i, ev = nxt or await q.get()
                nxt = None
                if ev[0] == "logprobs":
                    pending[i] += ev[1]
                    continue
                if ev[0] == "text":
                    pieces = [ev[1]]
                    while len(pieces) < coalesce:  # (coalesce > 1: wait for more of this choice, or the end)
                        j, e = await q.get()
                        if j == i and e[0] == "logprobs":
                            pending[i] += e[1]
                        elif j == i and e[0] == "text":
                            pieces.append(e[1])
                        else:
                            nxt = (j, e)
                            break
                    for c in release(i, "".join(pieces)):
                        yield sse(c)
                    continue
                if ev[0] == "done":
                    _, reason, usages[i] = ev
                    left -= 1
                    if calls_stream[i] is not None:
                        held, reason = calls_chunks(i, reason)
                        for c in held:
                            yield sse(c)
                    if left:
                        yield sse(chunk(i, None, reason))
                        continue
                    # usage (every choice's) rides on the last chunk; with stream_options.include_usage
                    # also in OpenAI's extra final chunk with no choices
                    usage = _usage(usages)
                    yield sse({**chunk(i, None, reason), "usage": usage})
                    if include_usage:
                        yield sse({**head, "choices": [], "usage": usage})
                else:
                    yield sse(_failure(ev).body())
                yield "data: [DONE]\n\n"
                return
        finally:
            for r, u in zip(reqs, usages):
                if u is None:  # the client went away (the response task was cancelled), or an error
                    st.scheduler.cancel(r)

    # -- endpoints -----------------------------------------------------------------------------
    def api(handler):
        async def wrapped(request: HTTPRequest) -> Response:
            try:
                ready(request)
                return await handler(request)
            except ApiError as e:
                return e.response()
        return wrapped

    def chat_tools(d: dict, o: dict) -> Tools | None:
        """The request's tools (None: none); their grammar replaces o["grammar"] when they constrain."""
        try:
            t = parse_request(d, st.model.tokenizer.chat_template)
        except ToolError as e:
            raise ApiError(400, str(e), e.param) from None
        if t is None:
            return None
        g = t.grammar()
        if g is not None:
            if o["grammar"] is not None:
                raise ApiError(400, "'response_format' cannot be combined with tools the output must call "
                               "(tool_choice \"required\", a named function, or a template with no tool syntax)",
                               "response_format")
            err = validate_grammar(g)
            if err is not None:
                raise ApiError(400, f"'tools': a tool's parameters cannot be followed: {err}", "tools")
            o["grammar"] = g
        return t

    async def chat_completions(request: HTTPRequest) -> Response:
        d = await body(request)
        o = common(d, chat=True)
        messages = _chat_text(d.get("messages"))
        tools = chat_tools(d, o)
        tok = st.model.tokenizer
        extra = {}
        if tools is not None:
            messages, offered = tools.render(messages)
            if offered is not None:
                extra["tools"] = offered
        try:
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, **extra)
        except Exception as e:  # noqa: BLE001 - the template's own complaint (roles, order) is the client's
            raise ApiError(400, f"chat template: {e}", "messages") from None
        ids = await tokenize(prompt, "messages")
        fits(ids, "messages")
        return await run(request, ids, o, chat=True, tools=tools if tools is not None and tools.offered else None)

    async def completions(request: HTTPRequest) -> Response:
        d = await body(request)
        o = common(d, chat=False)
        p = d.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]  # a batch of one prompt
        vocab = st.model.config.vocab
        if isinstance(p, str):
            ids = await tokenize(p, "prompt")
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            if any(not 0 <= t < vocab for t in p):
                raise ApiError(400, f"'prompt': token ids must be in 0..{vocab - 1}", "prompt")
            ids = list(p)
        elif isinstance(p, list) and p:
            raise ApiError(400, "only one prompt per request is supported", "prompt")
        else:
            raise ApiError(400, "'prompt' must be a string or a list of token ids", "prompt")
        fits(ids, "prompt")
        return await run(request, ids, o, chat=False)

    def model_card() -> dict:
        return {"id": st.model_id, "object": "model", "created": st.created, "owned_by": "lowbit"}

    async def models(request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: HTTPRequest) -> Response:
        name = request.path_params["model_id"]
        if name != st.model_id:
            raise ApiError(404, f"The model '{name[:200]}' does not exist (this server has '{st.model_id}')",
                           "model", code="model_not_found")
        return JSONResponse(model_card())

    async def metrics(request: HTTPRequest) -> Response:
        sched = st.scheduler
        s = sched.status() if sched is not None else {"active": 0, "queued": 0}
        gauges = {"lowbit_queue_depth": ("Requests waiting for a slot", s["queued"]),
                  "lowbit_slots_busy": ("KV slots running a request", s["active"]),
                  "lowbit_slots_total": ("KV slots (--parallel)", st.parallel or 0),
                  "lowbit_model_ready": ("1 once the model has loaded", int(sched is not None))}
        text = st.metrics.render(gauges, st.cache.stats() if st.cache is not None else None, s.get("spec"))
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def status(request: HTTPRequest) -> Response:
        from .._native import lib
        m = st.model
        kinds = sorted({t.format.name for t in m.file.tensors.values() if len(t.shape) == 2})
        fmts = {t.format.name: t.format.id for t in m.file.tensors.values()}
        kernels = {}
        for name in kinds:
            k1, k8 = lib.kernel(fmts[name], 1), lib.kernel(fmts[name], 8)
            if k1:
                kernels[name] = {"nt=1": k1[0], "nt=8": k8[0] if k8 else None, "level": k1[1]}
        s = st.scheduler.status()
        return JSONResponse({"model": st.model_id, "path": m.path, "arch": m.config.arch,
                             "n_ctx": m.n_ctx, "parallel": s.pop("parallel"),
                             "kv": {"k": getattr(m, "kv_k", "f16"), "v": getattr(m, "kv_v", "f16"),
                                    "slots_committed": getattr(m.engine, "slots_committed", None),
                                    "slots_ahead": st.kv_ahead},
                             "weights": {"memory": m.file.memory, "locked": m.file.locked,
                                         "prefetch": m.prefetch_state()},
                             "level": lib.cpu_info()["selected"], "kernels": kernels,
                             "tokens_per_second": s.pop("tokens_per_second"), "spec": s.pop("spec"), "requests": s,
                             "prefix_cache": st.cache.stats() if st.cache is not None else None})

    async def health(request: HTTPRequest) -> Response:
        if st.draining:
            return JSONResponse({"status": "shutting down", "error": {
                "message": "the server is shutting down", "type": "unavailable_error", "code": "shutting_down"}},
                status_code=503, headers={"Retry-After": RETRY_AFTER[503]})
        if st.scheduler is not None:
            return JSONResponse({"status": "ok"})
        if st.load_error:
            return JSONResponse({"status": "error", "error": {"message": st.load_error,
                                                             "type": "unavailable_error"}}, status_code=503)
        return JSONResponse({"status": "loading", "error": {"message": "the model is loading",
                                                           "type": "unavailable_error", "code": "model_loading"}},
                            status_code=503)

    async def http_error(request: HTTPRequest, exc: HTTPException) -> Response:
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()

    async def server_error(request: HTTPRequest, exc: Exception) -> Response:
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error").response()

    routes = [
        Route("/v1/chat/completions", api(chat_completions), methods=["POST"]),
        Route("/v1/completions", api(completions), methods=["POST"]),
        Route("/v1/models", api(models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", api(model), methods=["GET"]),
        Route("/v1/status", api(status), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    middleware = [Middleware(AccessLog, metrics=st.metrics, write=access_log)]
    if cors:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors), allow_methods=["GET", "POST"],
                                     allow_headers=["*"], max_age=600))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_error, Exception: server_error})
    app.state.lowbit = st
    return app
