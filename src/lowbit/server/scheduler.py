"""The scheduler: one engine thread runs every request's tokens in shared batched forwards.

Requests queue; up to `parallel` are active, each in its own KV slot. Every step gathers, in
one `Model.forward_batch` call, one decode token from each active sequence that is decoding
and prompt chunks of those still prefilling (up to `step_tokens` tokens in all), so each
weight row is decoded once per step for all of them. Each request has its own Sampler (its
own seed), and the engine gives a sequence bitwise the same logits whatever else is in the
batch, so a request's output is the same as if it ran alone (greedy or sampled).

Generation follows lowbit.generate.generate: sample from the last logits (history = prompt +
generated), stop on an end-of-generation token (not emitted), after max_tokens tokens, when
the slot's context is full, or on a stop string. Stop strings are held back: no part of a
stop string is ever emitted, and the text ends just before the first one.

A request's events go to its `emit` callback. The events of a step are gathered and handed over
once per step: to `deliver(list of (emit, event))` when the scheduler has one (the server's
posts the whole list to its event loop in one call, so emit runs on the loop thread and the
engine thread pays one wake-up per step, not one per token), else each emit is called on the
engine thread:
    ("logprobs", [(token, logprob, {top id: logprob})])
                                                    a generated token's log-probabilities (only
                                                    for a request with logprobs set; before the
                                                    text event that carries the token's text)
    ("text", str)                                   more text (never empty)
    ("done", finish_reason, usage dict)             last event: "stop" or "length"
    ("error", message[, "shutdown"])                last event: the step failed, or the shutdown
                                                    grace ran out (drain)
Cancelling a request (its client went away) frees its slot before the next step.

Logprobs (Request.logprobs = k): each generated token's log-probability and the k most likely
tokens', of the model's raw logits row that token was drawn from (generate.token_logprobs:
before logit_bias, the grammar's mask, the penalties, temperature and filters), computed only
for such requests; with speculation, the rows of the accepted tokens. End-of-generation tokens
are not reported (they are not generated text either).

With a prefix cache (prefix.py), a request admitted to a slot first gets the longest cached
prefix of its prompt copied in (usage.prompt_tokens_details.cached_tokens says how many), and
the whole blocks of every slot are stored as its prompt is computed and when it finishes (so the
next chat turn, whose prompt holds this turn's reply, finds it). A request admitted while an
earlier one is still computing a prefix they share (whole blocks beyond what is cached: several
clients sending one long system prompt at once) waits without computing until the leader has
passed it, then copies those blocks from the cache: the prefix is computed once. On a hybrid
model the cache also keeps recurrent-state snapshots at a prompt's Request.snaps (its chunks are
cut to end there; a leader keeps one where its follower goes on) and at a finished reply's last
whole block (copied out as the reply passes each block end: _reply_state; a speculative window
ends at the next block end so that the slot stands on each), and a hit needs one.

With a Speculator (spec.py: --lookup, --draft), each decoding request's window is its pending
token plus up to `spec_k` drafts, all windows verified in the step's one forward (every row's
logits); generate.verify keeps the longest accepted prefix plus the target's own next token, and
the slot is rewound past the rejected drafts. Greedy requests give the same tokens as without
speculation (a token's logits are bitwise the same alone or in a window: invariant I2); sampled
ones draw from the target's distribution (rejection sampling). Structured-output requests draft
too: their drafts are cut at the first token the grammar rejects, each window row is masked with
the grammar's state after the drafts before it as the verification reaches it, and the matcher
takes only the accepted tokens (structured.py), so greedy ones give the non-speculative tokens;
drafts drawn from a distribution (a draft model, sampled) are dropped for them (a cut would bias
the rejection sampling).

drain(grace) starts a graceful shutdown: new requests are refused (Draining), those accepted run
on, and the ones still unfinished after `grace` seconds end with an error event.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..generate import stop_prefix, token_logprobs, verify
from ..sampling import Sampler

# The cost of one more token in a step, relative to a one-token step (speculation's drafting
# policy). A verify window of w tokens costs ~1 + 0.2 (w - 1) one-token steps on one sequence
# (BENCHMARKS.md, issue 7: w=5 1.79, F16 target), more once a step holds many sequences' tokens
# (issue 23: ~0.3 per token at 4 tokens).
SPEC_TOKEN_COST = 0.25
SPEC_PRIOR_FLOOR = 0.3  # the acceptance a request is credited with before its own windows say more
SPEC_FORGET = 0.9       # per step without drafts, a request's record shrinks by this: it probes again


class QueueFull(RuntimeError):
    """The queue holds max_queue requests: the client should retry later (HTTP 429)."""


class Draining(RuntimeError):
    """The server is shutting down and takes no new requests (HTTP 503)."""


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    emit: Callable[[tuple], None]
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to the logits before sampling
    constraint: object = None    # structured.Constraint: masks the logits, takes each sampled token
    logprobs: int | None = None  # None: none; k: emit each token's logprob and the top k (0..20)
    id: int = field(default_factory=itertools.count().__next__)
    cancelled: bool = False
    t_submit: float = field(default_factory=time.perf_counter)
    cached: int = 0              # prompt positions whose KV came from the prefix cache
    snaps: list = field(default_factory=list)  # hybrid models: positions (ascending) where the prompt's
    #                                            chunks end and the cache keeps the recurrent state
    # engine-thread state
    slot: int = -1
    fed: int = 0                 # prompt tokens already in the KV cache
    history: list[int] = field(default_factory=list)
    generated: int = 0
    next_token: int | None = None  # sampled, not yet in the cache
    decoder: object = None
    text: str = ""               # all generated text (for stop strings)
    sent: int = 0                # characters of text already emitted
    t_last: float = 0.0          # when the last token was sampled (0: none yet)
    follow: tuple | None = None  # (leader, positions): wait while the leader computes our shared prefix
    drafts: list[int] = field(default_factory=list)  # this step's drafts after next_token (speculation)
    q: list | None = None        # the rows of the draft distribution they were drawn from (None: one-hot)
    spec_acc: float = 0.0        # this request's drafts accepted, and windows that rejected one
    spec_rej: float = 0.0        # (both fade while it does not draft: SPEC_FORGET)
    reply_state: tuple | None = None  # hybrid models with a prefix cache: (pos, the recurrent state
    #                                   there), the last block end its reply reached (_reply_state)


class Scheduler:
    def __init__(self, model, parallel: int | None = None, step_tokens: int = 64, max_queue: int = 256,
                 cache=None, metrics=None, deliver: Callable[[list], None] | None = None,
                 spec=None, spec_k: int = 4, spec_cost: float = SPEC_TOKEN_COST):
        """cache: a PrefixCache over this model (or None); metrics: a Metrics to feed (or None);
        deliver: takes each step's [(emit, event), ...] (None: emit is called here); spec: a
        Speculator (spec.py) proposing up to spec_k drafts per decoding request and step (None:
        no speculation); spec_cost: one more token's cost in a step relative to a one-token step,
        for the drafting policy (_plan; 0: always spec_k drafts)."""
        self.model = model
        self.cache, self.metrics, self.deliver = cache, metrics, deliver
        self._pending: list[tuple[Callable, tuple]] = []  # this step's events, not yet handed over
        self.parallel = int(parallel or model.n_slots)
        if not 1 <= self.parallel <= model.n_slots:
            raise ValueError(f"parallel must be 1..{model.n_slots} (the model's KV slots)")
        self.spec, self.spec_k, self.spec_cost = spec, int(spec_k), float(spec_cost)
        if not 0.0 <= self.spec_cost <= 100.0:
            raise ValueError(f"spec_cost must be in 0..100, got {spec_cost}")
        if spec is not None and not 1 <= self.spec_k <= 64:
            raise ValueError(f"spec_k must be in 1..64, got {spec_k}")
        # a step holds every active sequence's decode window (token + drafts) plus prompt chunks
        window = 1 + (self.spec_k if spec is not None else 0)
        self.step_tokens = max(int(step_tokens), self.parallel * window + 8)
        self.max_queue = int(max_queue)
        self.eog = set(model.tokenizer.eog_ids)
        self._cv = threading.Condition()
        self._queue: collections.deque[Request] = collections.deque()
        self._active: list[Request] = []
        self._free = list(range(self.parallel))
        self._stopping = False
        self._deadline: float | None = None  # draining: unfinished requests fail at this time
        # counters (read by status(); written on the engine thread under _cv)
        self.done = self.cancelled = self.failed = self.aborted = 0
        self.prompt_tokens = self.generated_tokens = self.steps = self.decode_steps = 0
        self.spec_windows = self.drafted = self.accepted = 0  # windows with drafts, drafts, accepted
        self.spec_rejects = 0  # windows that rejected a draft
        self.grammar_cut = 0  # drafts cut because a structured output's grammar rejects them
        # (time, tokens sampled) of recent steps, for tokens/s (bounded: no growth when nobody asks)
        self._recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=4096)
        self._obs: tuple[list, list, list] = ([], [], [])
        self._mask_pool = None  # structured output: one worker computing next-token masks
        self._thread = threading.Thread(target=self._loop, name="lowbit-engine", daemon=True)
        self._thread.start()

    # -- called from any thread ------------------------------------------------------------
    def submit(self, req: Request) -> None:
        if not req.prompt:
            raise ValueError("the prompt is empty")
        if len(req.prompt) >= self.model.n_ctx:
            raise ValueError(f"the prompt has {len(req.prompt)} tokens; the context holds {self.model.n_ctx}")
        if req.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        req.sampler.prompt_len = len(req.prompt)  # presence / frequency count what follows it
        with self._cv:
            if self._stopping or self._deadline is not None:
                raise Draining("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFull(f"{len(self._queue)} requests are already waiting; try again later")
            self._queue.append(req)
            self._cv.notify()

    def cancel(self, req: Request) -> None:
        """The client is gone: drop the request (its slot is freed before the next step)."""
        with self._cv:
            req.cancelled = True
            self._cv.notify()

    def drain(self, grace: float) -> None:
        """Refuse new requests; requests still unfinished `grace` seconds from now end with an
        error event ("the server is shutting down")."""
        with self._cv:
            if self._deadline is None:
                self._deadline = time.monotonic() + max(0.0, grace)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=10)
        if self._mask_pool is not None:
            self._mask_pool.shutdown(wait=False)

    def status(self) -> dict:
        with self._cv:
            now = time.perf_counter()
            while self._recent and self._recent[0][0] < now - 10.0:
                self._recent.popleft()
            span = now - self._recent[0][0] if len(self._recent) > 1 else 0.0
            rate = sum(n for _, n in list(self._recent)[1:]) / span if span > 0 else 0.0
            return {"active": len(self._active), "queued": len(self._queue), "parallel": self.parallel,
                    "free_slots": len(self._free),
                    "done": self.done, "cancelled": self.cancelled, "failed": self.failed,
                    "aborted": self.aborted,
                    "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
                    "steps": self.steps, "decode_steps": self.decode_steps,
                    "tokens_per_second": round(rate, 2), "spec": self._spec_status()}

    def _spec_status(self) -> dict | None:
        if self.spec is None:
            return None
        return {"drafter": getattr(self.spec, "name", type(self.spec).__name__), "k": self.spec_k,
                "cost_per_token": self.spec_cost,
                "windows": self.spec_windows, "drafted": self.drafted, "accepted": self.accepted,
                "grammar_cut": self.grammar_cut,
                "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else None}

    # -- the engine thread -----------------------------------------------------------------
    def _release(self, req: Request) -> None:
        self._active.remove(req)
        self._free.append(req.slot)
        if self.spec is not None:
            self.spec.release(req)
        req.slot = -1

    def _admit(self) -> bool:
        """Under _cv: drop cancelled requests, fill free slots from the queue. False: stop."""
        while True:
            for r in [r for r in self._active if r.cancelled]:
                self._release(r)
                self.cancelled += 1
            for r in [r for r in self._queue if r.cancelled]:
                self._queue.remove(r)
                self.cancelled += 1
            if self._deadline is not None and time.monotonic() >= self._deadline:
                for r in self._active + list(self._queue):  # shutdown: what is left ends now
                    if r.slot >= 0:
                        self._release(r)
                    self.aborted += 1
                    self._emit(r, ("error", "the server is shutting down", "shutdown"))
                self._queue.clear()
                self._flush()
            while self._queue and self._free:
                r = self._queue.popleft()
                r.slot = self._free.pop(0)
                self.model.rewind(0, slot=r.slot)
                if self.cache is not None:  # the longest cached prefix of the prompt, copied in
                    r.cached = r.fed = self.cache.load(r.prompt, r.slot)
                    r.snaps = self.cache.snapshot_points(r.prompt, r.fed)
                    r.follow = self._leader(r)
                r.history = list(r.prompt)
                r.decoder = self.model.tokenizer.stream()
                if r.constraint is not None:  # the first mask, computed while the prompt runs
                    r.constraint.prefetch(self._masks())
                if self._drafts(r):
                    self.spec.admit(r)
                self._active.append(r)
            if self._stopping:
                return False
            if self._active:
                return True
            left = None if self._deadline is None else self._deadline - time.monotonic()
            self._cv.wait(left if left is not None and left > 0 else None)

    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self._admit():
                    break
                active = list(self._active)
            # decode windows first (each decoding sequence's token, and its drafts), then prompt
            # chunks, FIFO
            batch, who, want = [], [], []
            budget = self.step_tokens
            try:
                prefill = sum(len(r.prompt) - r.fed for r in active if r.next_token is None)
                self._propose([r for r in active if r.next_token is not None], prefill)
            except Exception as e:  # noqa: BLE001 - the drafter failed: these requests fail, not the server
                self._fail([r for r in active if r.next_token is not None], e)
                continue
            for r in active:
                if r.next_token is not None:
                    batch.append((r.slot, [r.next_token] + r.drafts))
                    who.append(r)
                    want.append(1 + len(r.drafts) if r.drafts else True)
                    budget -= 1 + len(r.drafts)
            for r in active:
                if r.next_token is None and r.follow is not None and not self._caught_up(r):
                    continue  # its leader is computing their shared prefix: no work twice
                if r.next_token is None and budget > 0:
                    n = min(len(r.prompt) - r.fed, budget)
                    for p in r.snaps:  # a chunk ends where the recurrent state is to be kept
                        if r.fed < p < r.fed + n:
                            n = p - r.fed
                            break
                    batch.append((r.slot, r.prompt[r.fed:r.fed + n]))
                    who.append(r)
                    want.append(r.fed + n == len(r.prompt))  # logits only after the whole prompt
                    budget -= n
            if not batch:  # every request waits on a leader (cannot happen: leaders are earlier)
                for r in active:
                    r.follow = None
                continue
            t_step = time.perf_counter()
            try:
                outs = self.model.forward_batch(batch, want=want)
            except Exception as e:  # noqa: BLE001 - reported to the requests, the server stays up
                self._fail(who, e)
                continue
            t_step = time.perf_counter() - t_step
            sampled = generated = prompt = 0
            finished = []
            self._obs = ([], [], [])  # this step's TTFT, per-token and duration observations
            for r, (slot, run), lg in zip(who, batch, outs):
                if r.next_token is None:  # a prompt chunk
                    r.fed += len(run)
                    prompt += len(run)
                    if self.cache is not None:  # share the computed blocks with requests to come
                        self.cache.store(slot, r.fed, state=r.fed in r.snaps)
                    if lg is None:
                        continue
                else:
                    r.next_token = None
                sampled += 1
                before = r.generated
                try:
                    if self._verify(r, lg) if self._drafts(r) else self._sample(r, lg[-1]):
                        finished.append(r)
                    if self.cache is not None and self.cache.replies and r.slot >= 0:
                        self._reply_state(r)
                except Exception as e:  # noqa: BLE001 - one request's failure is its own
                    self._fail([r], e)
                generated += r.generated - before  # an end-of-generation token is sampled, not generated
            if self.cache is not None:
                for r in finished:  # the reply too: the next chat turn's prompt holds it (and, on a
                    if r.slot >= 0:  # hybrid model, the state at its last whole block, to resume there)
                        self.cache.store(r.slot, snapshot=r.reply_state)
                        r.reply_state = None  # (the cache owns the array now)
            if self.metrics is not None:
                self.metrics.tokens(prompt=prompt, generated=generated)
                self.metrics.observe(*self._obs, step=(t_step, sum(len(run) for _, run in batch)))
            with self._cv:
                self.steps += 1
                self.decode_steps += sampled > 0  # steps that sampled (ended a prompt or decoded)
                self.prompt_tokens += prompt
                self.generated_tokens += generated
                self._recent.append((time.perf_counter(), generated))
                for r in finished:
                    if r.slot >= 0:
                        self._release(r)
                        self.done += 1
            self._flush()  # after the counters: a client that sees "done" sees it counted

    def _leader(self, r: Request) -> tuple | None:
        """An earlier active request still computing a longer whole-block prefix that r shares
        (the one that shares most), and that length; None if there is none."""
        B = self.cache.block
        best = None
        for p in self._active:
            if p is r or p.next_token is not None or p.fed >= len(p.prompt):
                continue
            n = min(len(p.prompt), len(r.prompt) - 1)
            a, b = p.prompt[:n], r.prompt[:n]
            same = n if a == b else next(i for i in range(n) if a[i] != b[i])
            upto = same // B * B
            if upto > max(r.fed, p.fed) and (best is None or upto > best[1]):
                best = (p, upto)
        if best is not None and self.cache.hybrid and best[1] not in best[0].snaps:
            best[0].snaps = sorted(best[0].snaps + [best[1]])  # the leader keeps the state where r goes on
        return best

    def _reply_state(self, r: Request) -> None:
        """Hybrid models: when r's slot stands at a block end past its prompt's own snapshots
        (its reply's tokens reached it), copy the recurrent state out (into r's one array, reused):
        the prefix cache keeps the last such copy with the reply's KV when r finishes. A copy per
        BLOCK tokens of reply; the slot is never rewound below it (speculation rewinds only past
        the verified tokens)."""
        m, pos = self.model, self.model.slot_pos[r.slot]
        if pos % self.cache.block or pos < len(r.prompt) or m.engine.rstate_pos(r.slot) != pos:
            return
        st = r.reply_state[1] if r.reply_state is not None else np.empty(self.cache.state_bytes, np.uint8)
        m.engine.rstate_copy(r.slot, st, True)
        r.reply_state = (pos, st)

    def _caught_up(self, r: Request) -> bool:
        """r's leader has computed their shared prefix (or is gone): copy what the cache holds
        of it and let r go on (True); False while r should wait."""
        p, upto = r.follow
        if p.slot >= 0 and not p.cancelled and p.fed < upto:
            return False
        r.follow = None
        n = self.cache.load(r.prompt, r.slot)
        r.fed += n
        r.cached += n
        return True

    def _fail(self, reqs: list[Request], e: Exception) -> None:
        with self._cv:
            for r in reqs:
                if r.slot >= 0:
                    self._release(r)
                self.failed += 1
                self._emit(r, ("error", f"{type(e).__name__}: {e}"))
        self._flush()

    def _emit(self, r: Request, event: tuple) -> None:
        self._pending.append((r, event))

    def _flush(self) -> None:
        """Hand this step's events over (one deliver call, or each emit here)."""
        if not self._pending:
            return
        evs, self._pending = self._pending, []
        if self.deliver is not None:
            try:
                self.deliver([(r.emit, ev) for r, ev in evs])
                return
            except Exception:  # noqa: BLE001 - the loop is gone (shutdown): its clients are too
                for r, _ in evs:
                    r.cancelled = True
                return
        for r, ev in evs:
            try:
                r.emit(ev)
            except Exception:  # noqa: BLE001 - a gone client's queue must not stop the engine
                r.cancelled = True

    def _drafts(self, r: Request) -> bool:
        """Does r speculate? With a Speculator (structured output too: _propose, _verify)."""
        return self.spec is not None

    def _propose(self, decoding: list[Request], prefill: int = 0) -> None:
        """Each decoding request's drafts for this step (r.drafts, r.q): up to spec_k, as many as
        its context and max_tokens leave room for (the window's last token is the target's own),
        and as the drafting policy (_plan) finds worth their cost. prefill: prompt tokens waiting."""
        asks = []
        for r in decoding:
            r.drafts, r.q = [], None
            if self._drafts(r) and not r.cancelled:
                pos = self.model.slot_pos[r.slot]
                k = min(self.spec_k, self.model.n_ctx - pos - 1, r.max_tokens - r.generated - 1)
                if self.cache is not None and self.cache.replies:
                    # the window ends at the next block end at most, so that the slot stands on
                    # every block end after some step (_reply_state)
                    k = min(k, -(-(pos + 1) // self.cache.block) * self.cache.block - pos - 1)
                if k > 0:
                    asks.append((r, k))
        if asks and self.spec_cost > 0:
            tokens = len(decoding) + min(prefill, max(0, self.step_tokens - len(decoding)))
            asks = self._plan(asks, len(decoding), tokens)
        if asks:
            for (r, k), (drafts, q) in zip(asks, self.spec.propose(asks)):
                r.drafts, r.q = [int(t) for t in drafts[:k]], q
                c = r.constraint
                if c is not None and r.drafts:  # structured output: cut where the grammar rejects
                    if q is not None:  # (drafts drawn from a distribution: a cut would bias the
                        r.drafts, r.q = [], None  # rejection sampling, whose residual needs them all)
                    else:
                        # (the grammar has taken the pending token: a token is accepted as it is
                        # sampled); an end of generation comes as the target's own token, masked
                        eog = next((i for i, t in enumerate(r.drafts) if t in self.eog), len(r.drafts))
                        n = c.valid_prefix(r.drafts[:eog])
                        with self._cv:
                            self.grammar_cut += len(r.drafts) - n
                        del r.drafts[n:]

    def _plan(self, asks: list[tuple], decoding: int, tokens: int) -> list[tuple]:
        """The drafting policy: how many drafts each request gets this step. A step of T tokens
        costs ~1 + c T one-token steps (c = spec_cost) and yields one token per decoding request;
        request r's j-th draft adds a^j expected tokens (a: r's acceptance rate, estimated from
        its own windows with the server's rate, at least SPEC_PRIOR_FLOOR, as a prior worth 4
        drafts) for c more cost. Drafts are taken best first while they raise the step's expected
        tokens per cost: a^j > c P / C (P, C: the tokens and cost so far). One client and good
        drafts: up to spec_k; many clients (a step already costly) or poor drafts: few or none. A
        request left without drafts forgets its record slowly, so it probes again later (text
        that starts to repeat itself is lookup's best case)."""
        import heapq
        c = self.spec_cost
        prior = max(SPEC_PRIOR_FLOOR, (self.accepted + 1) / (self.accepted + self.spec_rejects + 2))
        heap = []
        for i, (r, k) in enumerate(asks):
            a = (r.spec_acc + 4 * prior) / (r.spec_acc + r.spec_rej + 4)
            heapq.heappush(heap, (-a, i, 1, a))
        got = [0] * len(asks)
        P, C = float(decoding), 1.0 + c * tokens
        while heap:
            g, i, j, a = heapq.heappop(heap)
            if -g <= c * P / C:
                break
            got[i] = j
            P, C = P - g, C + c
            if j < asks[i][1]:
                heapq.heappush(heap, (g * a, i, j + 1, a))
        for (r, _), n in zip(asks, got):
            if n == 0:
                r.spec_acc *= SPEC_FORGET
                r.spec_rej *= SPEC_FORGET
        return [(r, n) for (r, _), n in zip(asks, got) if n > 0]

    def _verify(self, r: Request, rows) -> bool:
        """A speculating request's window: rows[i] are the target's logits after its history and
        drafts[:i]. Keep the accepted drafts and the target's next token (generate.verify), rewind
        the slot past the rejected ones, take the new tokens in order; True when r has finished."""
        if r.cancelled:
            return False
        raw = rows.copy() if r.logprobs is not None else None  # (before the bias and masks below)
        if r.logit_bias:  # in place, every row: this step's own output
            for t, b in r.logit_bias.items():
                rows[:, t] += b
        c = r.constraint
        reach = None
        if c is not None:  # row i masked with the grammar after drafts[:i], as verify reaches it
            def reach(i: int) -> None:
                if i == 0:
                    c.mask(rows[0])
                else:
                    c.advance(r.drafts[i - 1], rows[i])
        n_ok, nxt = verify(rows, r.drafts, r.q, r.history, r.sampler, reach)
        if c is not None:  # the grammar has taken drafts[:n_ok]; now the target's own token
            c.accept(nxt)
            if c.error:
                raise RuntimeError(f"structured output: {c.error}")
        d = len(r.drafts)
        if d:
            self.model.rewind(self.model.slot_pos[r.slot] - (d - n_ok), slot=r.slot)
            r.spec_acc += n_ok
            r.spec_rej += n_ok < d
            with self._cv:
                self.spec_windows += 1
                self.drafted += d
                self.accepted += n_ok
                self.spec_rejects += n_ok < d
        new, r.drafts, r.q = r.drafts[:n_ok] + [nxt], [], None
        for j, tok in enumerate(new):  # new[j] was drawn from row j
            if self._take(r, tok, more=j + 1 < len(new), raw=None if raw is None else raw[j]):
                return True
        self.spec.commit(r)
        return False

    def _sample(self, r: Request, logits) -> bool:
        """Sample r's next token and emit its text; True when r has finished."""
        if r.cancelled:
            return False  # freed before the next step
        raw = logits.copy() if r.logprobs is not None else None  # (before the bias and mask below)
        if r.logit_bias:  # in place: the row is this step's own output, read by nobody else
            for t, b in r.logit_bias.items():
                logits[t] += b
        c = r.constraint
        if c is not None:  # structured output: what the grammar cannot take next is out
            c.mask(logits)
        tok = r.sampler.sample(logits, r.history)
        if c is not None:
            c.accept(tok)
            if c.error:
                raise RuntimeError(f"structured output: {c.error}")
        return self._take(r, tok, raw=raw)

    def _take(self, r: Request, tok: int, more: bool = False, raw: np.ndarray | None = None) -> bool:
        """r's next token is tok: emit its text, check the ends; True when r has finished (else
        tok is r's pending token, fed by the next step). more: a verified window's tokens follow
        (structured output: the grammar has already taken them, so its end and next mask wait
        for the last; a grammar that ended here is followed only by an end-of-generation token).
        raw: the raw logits row tok was drawn from, for a request with logprobs."""
        c = r.constraint
        now = time.perf_counter()
        if r.t_last:
            self._obs[1].append(now - r.t_last)
        else:
            self._obs[0].append(now - r.t_submit)
        r.t_last = now
        if tok in self.eog:
            return self._finish(r, "stop")
        if raw is not None:
            self._emit(r, ("logprobs", [(tok, *token_logprobs(raw, tok, r.logprobs))]))
        r.history.append(tok)
        r.generated += 1
        r.text += r.decoder.push(tok)
        if self._flush_text(r):
            return self._finish(r, "stop", stopped=True)
        if c is not None and c.finished and not more:  # the grammar's output is complete
            return self._finish(r, "stop")
        # the context is full when the cache cannot take tok (it holds every earlier token)
        if r.generated >= r.max_tokens or len(r.history) > self.model.n_ctx:
            return self._finish(r, "length")
        r.next_token = tok
        if c is not None and not more:  # the next mask, computed while the next forward runs
            c.prefetch(self._masks())
        return False

    def _masks(self):
        """The worker that computes structured output's next-token masks (started on first use)."""
        if self._mask_pool is None:
            import concurrent.futures
            self._mask_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lowbit-mask")
        return self._mask_pool

    def _flush_text(self, r: Request, final: bool = False) -> bool:
        """Emit what is safe to emit; True when a stop string was found (text cut before it)."""
        end = len(r.text)
        hit = -1
        if r.stop:
            # a stop string can only start where it was not yet fully seen
            start = max(0, r.sent - max(len(s) for s in r.stop))
            hit = min((i for i in (r.text.find(s, start) for s in r.stop) if i >= 0), default=-1)
            if hit >= 0:
                end = hit
            elif not final:  # hold back a tail that may be the start of a stop string
                end = len(r.text) - stop_prefix(r.text, r.stop)
        if end > r.sent:
            self._emit(r, ("text", r.text[r.sent:end]))
            r.sent = end
        return hit >= 0

    def _finish(self, r: Request, reason: str, stopped: bool = False) -> bool:
        if not stopped:
            r.text += r.decoder.flush()
            if self._flush_text(r, final=True):
                reason = "stop"
        usage = {"prompt_tokens": len(r.prompt), "completion_tokens": r.generated,
                 "total_tokens": len(r.prompt) + r.generated,
                 "prompt_tokens_details": {"cached_tokens": r.cached}}
        self._obs[2].append(time.perf_counter() - r.t_submit)
        self._emit(r, ("done", reason, usage))
        return True
