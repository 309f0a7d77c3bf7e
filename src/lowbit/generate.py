"""Generation as a few named steps.

    prefill(model, ids)            run the prompt through the model in chunks, return last logits
    decode_one(model, tok)         append one token, return its logits
    plain(model, ids, sampler)     token ids, one forward per token
    speculative(model, ids, sampler, drafter, k)
                                   token ids, one forward per round: the last token plus up to k
                                   drafts verified as one window (each weight row decoded once)
    generate(model, prompt)        either of the two, then EOG, max_tokens, stop strings, text
                                   (or Piece objects: text, token ids, finish reason, logprobs)

generate runs on a Sequence (Model.sequence): a KV slot of its own for as long as it is live,
so two live generators on one Model never corrupt each other. The slot keeps its cache when
the generation ends; the next prompt that starts with the same tokens (a chat's next turn)
prefills only the tokens after the shared prefix. That is exact: a token's logits do not
depend on how the prompt was chunked (invariant I8).

Speculative decoding is exact: with greedy sampling it yields the same tokens as plain(), for
every k and drafter, because a token's logits are bitwise the same alone or in a window
(invariant I2 of the row kernels; attention computes each query row on its own). With
temperature > 0 it draws from the target's distribution: draft d with draft probability q(d)
is accepted with probability min(1, p(d)/q(d)); on rejection the token is drawn from
norm(max(p - q, 0)) (Leviathan et al. 2023). A drafter that proposes deterministically (the
prompt lookup) has q = one-hot.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .sampling import Sampler

# Tokens per forward call while prefilling. Chunks of >= 32 tokens take the GEMM tier where the
# format has one (csrc/x86/gemm.inl), and a longer chunk amortises its activation panel and the
# per-call work: on Zen 4, default model, 512-token prompt, 2 threads, one run (issue 18,
# BENCHMARKS.md): 64 -> 277 tok/s, 128 -> 306, 256 -> 325, 512 -> 389. Logits do not depend on
# the chunking (I8).
PREFILL_CHUNK = 512
DEFAULT_SPEC = 4    # drafts per round


@dataclass
class Stats:
    prompt_tokens: int = 0
    cached: int = 0         # prompt tokens whose KV was reused from the slot's cache (not prefilled)
    generated: int = 0
    stop: str = ""          # why generation ended: "eog", "stop" (a stop string), "max_tokens", "context"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # speculative rounds (0 for plain decoding)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    layers: bool = False                  # collect the engine's per-layer counters (lowbit run --stats)
    prefill_layers: list | None = None    # engine.stats() of the prefill, then of the decode
    decode_layers: list | None = None

    def line(self) -> str:
        new = self.prompt_tokens - self.cached
        pf = new / self.prefill_s if self.prefill_s else 0.0
        dc = self.generated / self.decode_s if self.decode_s else 0.0
        s = f"prefill {new} tokens at {pf:.1f} tok/s, "
        if self.cached:
            s = f"prefill {new} tokens at {pf:.1f} tok/s ({self.cached} reused from the cache), "
        s += f"decode {self.generated} tokens at {dc:.1f} tok/s"
        if self.rounds:
            busy = self.draft_s + self.verify_s
            s += (f"; speculative: {self.rounds} rounds, {self.accepted}/{self.drafted} drafts accepted, "
                  f"{(self.accepted + self.rounds) / self.rounds:.2f} tokens per round, "
                  f"{1e3 * busy / self.rounds:.1f} ms per round "
                  f"(draft {100 * self.draft_s / busy:.0f}%, verify {100 * self.verify_s / busy:.0f}%)")
        return s


def prefill(model, ids: list[int], chunk: int = PREFILL_CHUNK) -> np.ndarray:
    logits = None
    for i in range(0, len(ids), chunk):
        logits = model.forward(ids[i:i + chunk])
    return logits[-1]


def timed_prefill(model, ids: list[int], stats: Stats) -> np.ndarray:
    """prefill, timed into stats; with stats.layers also the engine's per-layer counters."""
    if stats.layers:
        model.engine.set_stats(True)
        model.engine.reset_stats()
    t0 = time.perf_counter()
    logits = prefill(model, ids)
    stats.prefill_s = time.perf_counter() - t0
    if stats.layers:
        stats.prefill_layers = model.engine.stats()
        model.engine.reset_stats()
    return logits


def decode_one(model, token: int) -> np.ndarray:
    return model.forward([token])[-1]


def plain(model, ids: list[int], sampler: Sampler, stats: Stats, record=None, history: list[int] | None = None,
          constraint=None):
    """Yield sampled token ids, one forward per token, until the context is full.
    ids: the tokens to prefill (the model's cache may already hold earlier ones: then history
    is the whole prompt, for the repetition penalty). record(logits_row): called with the
    logits each yielded token was sampled from, before it is yielded. constraint: a
    server.structured.Constraint (json_schema): the tokens its grammar rules out are masked before
    each sampling; once the grammar is complete an end-of-generation token follows."""
    logits = timed_prefill(model, ids, stats)
    history = list(ids) if history is None else list(history)
    while True:
        if constraint is not None:
            constraint.mask(logits)
        tok = sampler.sample(logits, history)
        if constraint is not None:
            constraint.accept(tok)
            if constraint.error:
                raise RuntimeError(f"structured output: {constraint.error}")
        history.append(tok)
        if record is not None:
            record(logits)
        yield tok
        if constraint is not None and constraint.finished:
            yield min(model.tokenizer.eog_ids)  # the output is complete: end of generation
            return
        if model.pos >= model.n_ctx:
            return
        logits = decode_one(model, tok)


# ---- drafters -------------------------------------------------------------------------------
class Lookup:
    """Prompt lookup: find the latest earlier occurrence of the text's last n tokens (n from
    ngram_max down to ngram_min) and propose the tokens that followed it. No second model;
    pays off where the output copies from the input (rewriting, summarising, code edits)."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("lookup: need 1 <= ngram_min <= ngram_max")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def start(self, ids: list[int]) -> None:
        pass

    def propose(self, history: list[int], k: int) -> tuple[list[int], None]:
        """Up to k tokens, and None for q: deterministic proposals (q is one-hot)."""
        h = np.asarray(history, dtype=np.int64)
        for n in range(min(self.ngram_max, len(h) - 1), self.ngram_min - 1, -1):
            key = h[-n:]
            # starts i < len - n with h[i:i+n] == key; the latest wins (most local context)
            cand = np.flatnonzero(h[: len(h) - n] == key[0])
            for i in cand[::-1]:
                if np.array_equal(h[i:i + n], key):
                    return h[i + n:i + n + k].tolist(), None
        return [], None

    def commit(self, history: list[int]) -> None:
        pass


class DraftModel:
    """A second, smaller (or lower-bit) model of the same vocabulary, run by lowbit with its own
    KV cache; it proposes k tokens one forward each, sampling like the target (greedy, or the
    same temperature and filters, which gives the q rows of speculative sampling)."""

    def __init__(self, draft, sampler: Sampler):
        self.m = draft
        self.sampler = sampler.replace(seed=None if sampler.seed is None else sampler.seed + 1)

    def start(self, ids: list[int]) -> None:
        self.m.reset()
        if len(ids) > 1:
            prefill(self.m, ids[:-1])

    def propose(self, history: list[int], k: int) -> tuple[list[int], list[np.ndarray] | None]:
        m = self.m
        k = min(k, m.n_ctx - len(history))  # the draft's cache must hold history + k - 1
        self.commit(history)  # the draft model may have run something else since (another generation)
        if m.pos == len(history):
            m.rewind(m.pos - 1)  # the logits after history need its last token run again
        if k <= 0:
            return [], None
        logits = m.forward(history[m.pos:])[-1]
        drafts, q, h = [], [], list(history)
        for i in range(k):
            if self.sampler.greedy:
                d = self.sampler.sample(logits, h)
            else:
                p = self.sampler.probs(logits, h)
                d = int(self.sampler.rng.choice(p.size, p=p))
                q.append(p)
            drafts.append(d)
            h.append(d)
            if i + 1 < k:
                logits = decode_one(m, d)
        return drafts, None if self.sampler.greedy else q

    def commit(self, history: list[int]) -> None:
        """Roll the draft's cache back to the longest prefix it shares with history."""
        m = self.m
        n = min(m.pos, len(history))
        same = np.asarray(m.tokens[:n]) == np.asarray(history[:n])
        keep = n if same.all() else int(np.argmin(same))
        m.rewind(keep)


def check_draft(target, draft) -> None:
    """A draft must share the target's vocabulary token for token."""
    a, b = target.tokenizer, draft.tokenizer
    if a.vocab_size != b.vocab_size or a.tokens != b.tokens or target.config.vocab != draft.config.vocab:
        raise ValueError(f"the draft model {draft.path} does not share the target's vocabulary "
                         f"({b.vocab_size} vs {a.vocab_size} tokens)")


def verify(logits: np.ndarray, drafts: list[int], q: list[np.ndarray] | None, history: list[int],
           sampler: Sampler, reach: Callable[[int], None] | None = None) -> tuple[int, int]:
    """Decide a round. logits[i] is the target's after history + drafts[:i]. Returns (number of
    drafts accepted, the token that follows them: the target's correction or its bonus).
    reach(i): called before row i is read, which is once drafts[:i] are accepted (rows in order;
    the server's structured output masks row i there, with the grammar after those drafts)."""
    h = list(history)
    for i, d in enumerate(drafts):
        if reach is not None:
            reach(i)
        if sampler.greedy:
            t = sampler.sample(logits[i], h)
            if t != d:
                return i, t
        else:
            p = sampler.probs(logits[i], h)
            qd = 1.0 if q is None else q[i][d]
            if sampler.rng.random() * qd >= p[d]:  # reject: u >= p(d)/q(d)
                r = p.copy()
                if q is None:
                    r[d] = 0.0
                else:
                    r = np.maximum(p - q[i], 0.0)
                s = r.sum()
                r = r / s if s > 0 else p
                return i, int(sampler.rng.choice(r.size, p=r))
        h.append(d)
    if reach is not None:
        reach(len(drafts))
    return len(drafts), sampler.sample(logits[len(drafts)], h)


def speculative(model, ids: list[int], sampler: Sampler, drafter, k: int, stats: Stats, record=None,
                history: list[int] | None = None):
    """Yield token ids, several per forward: each round the target verifies the last token and
    up to k drafts as one window, keeps the accepted prefix plus its own next token, and rolls
    the rejected positions back (Model.rewind: O(1), nothing copied). ids, history, record: as
    plain()."""
    if not 1 <= k <= 64:
        raise ValueError(f"spec must be in 1..64, got {k}")
    if hasattr(drafter, "attach"):  # the MTP drafter reads the target's hidden states (lowbit.mtp)
        drafter.attach(model)
        try:
            yield from _speculative(model, ids, sampler, drafter, k, stats, record, history)
        finally:
            drafter.detach()
    else:
        yield from _speculative(model, ids, sampler, drafter, k, stats, record, history)


def _speculative(model, ids, sampler, drafter, k, stats, record, history):
    logits = timed_prefill(model, ids, stats)
    history = list(ids) if history is None else list(history)
    prompt = list(history)
    tok = sampler.sample(logits, history)
    history.append(tok)
    t0 = time.perf_counter()
    drafter.start(prompt)
    stats.draft_s += time.perf_counter() - t0
    if record is not None:
        record(logits)
    yield tok
    while model.pos < model.n_ctx:
        t0 = time.perf_counter()
        drafts, q = drafter.propose(history, min(k, model.n_ctx - model.pos - 1))
        t1 = time.perf_counter()
        logits = model.forward([history[-1]] + drafts, all_logits=True)
        n_ok, nxt = verify(logits, drafts, q, history, sampler)
        model.rewind(model.pos - (len(drafts) - n_ok))
        new = drafts[:n_ok] + [nxt]
        history.extend(new)
        t2 = time.perf_counter()
        drafter.commit(history)
        stats.draft_s += t1 - t0 + time.perf_counter() - t2
        stats.verify_s += t2 - t1
        stats.rounds += 1
        stats.drafted += len(drafts)
        stats.accepted += n_ok
        for i, t in enumerate(new):
            if record is not None:
                record(logits[i])
            yield t


def stop_prefix(text: str, stops: list[str]) -> int:
    """Length of the longest end of text that is the start of a stop string (held back)."""
    return max((k for s in stops for k in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:k])),
               default=0)


def make_drafter(model, draft, sampler: Sampler):
    """draft: "lookup", "mtp" (the model's own MTP block: lowbit.mtp), a loaded Model, or a
    Drafter (start/propose/commit) used as it is."""
    if isinstance(draft, str):
        if draft == "mtp":
            from .mtp import MTP
            return MTP(model)
        if draft != "lookup":
            raise ValueError(f"draft must be 'lookup', 'mtp' or a loaded Model, not {draft!r}")
        return Lookup()
    if hasattr(draft, "propose"):
        return draft
    check_draft(model, draft)
    return DraftModel(draft, sampler)


@dataclass
class Piece:
    """One step of generate(details=True). The ids of all pieces are the generated tokens in
    order (without the end-of-generation token); their texts are the output text (a stop string
    and what follows it are cut). The last piece has a finish_reason and no ids."""
    text: str                             # may be "" (a token inside a UTF-8 character, or held back)
    ids: list[int]                        # the tokens since the previous piece
    finish_reason: str | None = None      # last piece: "stop" (end of generation or a stop string), "length"
    logprobs: list[tuple[float, dict[int, float]]] | None = None
    # per id when asked (generate(logprobs=k)): (natural-log probability of the id, {id: log
    # probability} of the k most likely tokens, most likely first) under the raw logits
    # (token_logprobs: before penalties, temperature and filters)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax of a logits row: logit - (max + log sum exp(logit - max)), the sum's
    terms exp'd in float32 (numpy's float64 exp has no SIMD path on AVX2: 2x the time of the
    whole row here, tools/bench_sampling.py) and summed in float64. Each term is good to 1 ulp
    (6e-8 relative), so every value is within ~1e-7 of the all-float64 result (2.5e-9 measured
    on a 49152-token row), below the float32 logits' own rounding (1e-6 at |logit| ~ 10)."""
    x = np.asarray(logits, dtype=np.float32)
    m = x.max()
    return np.asarray(logits, dtype=np.float64) - (float(m) + np.log(np.exp(x - m).sum(dtype=np.float64)))


def token_logprobs(row: np.ndarray, tok: int, k: int) -> tuple[float, dict[int, float]]:
    """The log-probability of tok and the k most likely tokens' ({id: logprob}, most likely
    first; ties by id) under a raw logits row: log_softmax of the model's own distribution,
    before penalties, logit_bias, grammar masks, temperature and filters (vLLM's default,
    llama-cpp-python's rule). The sampled token's is given even when it is not among the k.
    O(vocab), only for sequences that ask. The top k are k argmax passes over a float32 copy of
    the row (the log-softmax's order: it is the row shifted by a constant; argmax takes the
    lowest id of a tie): for k <= 20 cheaper than an argpartition of the vocabulary."""
    ls = log_softmax(row)
    x = np.array(row, dtype=np.float32)
    top = {}
    for _ in range(min(k, x.size)):
        t = int(np.argmax(x))
        top[t] = float(ls[t])
        x[t] = -np.inf
    return float(ls[tok]), top


def generate(model, prompt, max_tokens: int | None = 128, stop: list[str] | str | None = None,
             stats: Stats | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             min_p: float = 0.0, repeat_penalty: float = 1.0, seed: int | None = None,
             presence_penalty: float = 0.0, frequency_penalty: float = 0.0, draft=None,
             spec: int = DEFAULT_SPEC, details: bool = False, logprobs: int | None = None,
             json_schema: dict | None = None):
    """Yield text pieces as they decode (with details=True: Piece objects, the last one with the
    finish reason). Greedy unless temperature > 0.

    prompt: text or token ids; max_tokens: None or -1 = until the end of generation or a full
    context; stop: strings that end the text (not included); draft: None (plain decoding),
    "lookup" (prompt lookup), "mtp" (the model's own MTP block, lowbit.mtp) or a loaded draft
    Model; spec: drafts per round; presence_penalty / frequency_penalty: OpenAI's penalties
    (-2..2) on the tokens generated so far (Sampler's docstring: the order and the window);
    logprobs: None, or the number of top alternatives to report per token (0..20; 0: only the
    chosen token's) in Pieces (details=True; Piece.logprobs: raw-logit log-probabilities,
    token_logprobs); json_schema: a JSON schema (dict) the output
    must match (llguidance masks every token the schema rules out; plain decoding only).
    stats.stop tells why it ended ("eog", "stop", "max_tokens", "context").
    The generation claims a KV slot of `model` (Model.sequence) until it ends or is closed.
    """
    if not isinstance(prompt, (str, list, tuple, np.ndarray)):
        raise TypeError(f"the prompt must be text or a list of token ids, not {type(prompt).__name__}")
    ids = model.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise ValueError("the prompt is empty")
    if max_tokens is None or max_tokens == -1:
        max_tokens = None
    elif max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1 (or -1 / None: until done), got {max_tokens}")
    if len(ids) >= model.n_ctx:
        raise ValueError(f"the prompt has {len(ids)} tokens; the context holds {model.n_ctx}")
    if logprobs is not None and not 0 <= int(logprobs) <= 20:
        raise ValueError(f"logprobs must be in 0..20, got {logprobs}")
    sampler = Sampler(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed, presence_penalty=presence_penalty,
                      frequency_penalty=frequency_penalty, prompt_len=len(ids))
    constraint = None
    if json_schema is not None:
        if draft is not None:
            raise ValueError("json_schema needs plain decoding (no draft)")
        from .server.structured import Constraint, FormatError, grammar
        try:
            g = grammar({"type": "json_schema", "json_schema": {"schema": json_schema}})
            constraint = Constraint(model.tokenizer, model.config.vocab, g)
        except FormatError as e:
            raise ValueError(str(e).replace("'response_format'", "json_schema", 1)) from None
    drafter = None if draft is None else make_drafter(model, draft, sampler)
    stats = stats if stats is not None else Stats()
    stats.prompt_tokens = len(ids)
    pieces = _pieces(model, ids, max_tokens, [stop] if isinstance(stop, str) else stop, stats, sampler,
                     drafter, spec, logprobs, constraint)
    try:
        if details:
            yield from pieces
        else:
            for p in pieces:
                if p.text:
                    yield p.text
    finally:
        pieces.close()


def _pieces(model, ids, max_tokens, stop, stats, sampler, drafter, spec, logprobs, constraint=None):
    # a slot of our own; reuse what its cache holds of this prompt (at least the last token is
    # run again: its logits start the generation)
    if hasattr(model, "sequence"):
        seq = model.sequence(ids)
    else:  # a stand-in model (tests): its one cache, emptied
        seq = model
        model.reset()
    rows = deque()  # logits rows of tokens not yet consumed (only when logprobs are asked)
    record = rows.append if logprobs is not None else None
    try:
        keep = min(_shared(seq.tokens, ids), len(ids) - 1)
        if hasattr(drafter, "reusable"):  # MTP: the cached prefix it has hidden states and cells for
            keep = drafter.reusable(ids, keep)
        seq.rewind(keep)
        stats.cached = keep
        if drafter is None:
            tokens = plain(seq, ids[keep:], sampler, stats, record=record, history=ids, constraint=constraint)
        else:
            tokens = speculative(seq, ids[keep:], sampler, drafter, spec, stats, record=record, history=ids)
        yield from _detokenize(model, tokens, max_tokens, [s for s in (stop or []) if s], stats, rows, logprobs)
    finally:
        if seq is not model:
            seq.close()


def _shared(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _detokenize(model, tokens, max_tokens, stops, stats, rows, logprobs):
    """Token ids -> Pieces: end of generation, max_tokens, stop strings (held back until they
    cannot be one), the finish reason."""
    out = model.tokenizer.stream()
    held = ""  # text not yet yielded because it may be the start of a stop string
    t0 = None
    stats.stop = "context"  # unless something else ends it first: the token source ran dry
    try:
        for tok in tokens:
            if t0 is None:  # the clock of decoding starts after the prefill
                t0 = time.perf_counter()
            row = rows.popleft() if logprobs is not None else None
            if tok in model.tokenizer.eog_ids:
                stats.stop = "eog"
                break
            stats.generated += 1
            lp = None
            if row is not None:
                lp = [token_logprobs(row, tok, logprobs)]
            piece = out.push(tok)
            if stops and piece:
                held += piece
                hit = min((held.find(s) for s in stops if s in held), default=-1)
                if hit >= 0:
                    stats.stop = "stop"
                    yield Piece(held[:hit], [tok], None, lp)
                    yield Piece("", [], "stop")
                    return
                keep = stop_prefix(held, stops)
                piece, held = held[:len(held) - keep], held[len(held) - keep:]
            yield Piece(piece, [tok], None, lp)
            if max_tokens is not None and stats.generated >= max_tokens:
                stats.stop = "max_tokens"
                break
        tail = held + out.flush()
        hit = min((tail.find(s) for s in stops if s in tail), default=-1)
        if hit >= 0:
            stats.stop = "stop"
        tail = tail[:hit] if hit >= 0 else tail
        yield Piece(tail, [], "stop" if stats.stop in ("eog", "stop") else "length")
    finally:
        tokens.close()
        if t0 is not None:
            stats.decode_s = time.perf_counter() - t0
        if stats.layers:
            stats.decode_layers = model.engine.stats()
            model.engine.set_stats(False)


def layer_table(layers: list[dict], title: str, step_s: float | None = None,
                attn_bytes: list[float] | None = None) -> str:
    """engine.stats() as a table: per layer, distinct experts per window (forward call), MB of
    weights streamed per token, and ms per token in attention / router / experts / dense FFN.
    step_s: the wall time per token of the whole step (then a line splits it into the layers'
    attention and FFN blocks, each with its GB/s of weights, and the time outside them: the
    output head, the embedding, sampling, Python); attn_bytes: per layer, the bytes of its
    attention matrices (attention_bytes()), to split the streamed bytes between the blocks."""
    rows = [f"{title}: {layers[0]['calls'] if layers else 0} windows, {layers[0]['tokens'] if layers else 0} tokens",
            f"{'layer':>5} {'experts/window':>14} {'MB/token':>9} {'attn ms':>8} {'(core)':>7} {'router ms':>9} "
            f"{'experts ms':>10} {'ffn ms':>7}"]
    tot = dict.fromkeys(("weight_bytes", "t_attn", "t_attn_core", "t_router", "t_experts", "t_ffn"), 0.0)
    for i, s in enumerate(layers):
        n, w = max(s["tokens"], 1), max(s["calls"], 1)
        for k in tot:
            tot[k] += s[k] / n
        rows.append(f"{i:>5} {s['distinct_experts'] / w:>14.1f} {s['weight_bytes'] / n / 1e6:>9.2f} "
                    f"{s['t_attn'] / n * 1e3:>8.3f} {s['t_attn_core'] / n * 1e3:>7.3f} {s['t_router'] / n * 1e3:>9.3f} "
                    f"{s['t_experts'] / n * 1e3:>10.3f} {s['t_ffn'] / n * 1e3:>7.3f}")
    rows.append(f"{'all':>5} {'':>14} {tot['weight_bytes'] / 1e6:>9.2f} {tot['t_attn'] * 1e3:>8.3f} "
                f"{tot['t_attn_core'] * 1e3:>7.3f} {tot['t_router'] * 1e3:>9.3f} {tot['t_experts'] * 1e3:>10.3f} "
                f"{tot['t_ffn'] * 1e3:>7.3f}")
    if step_s and layers:
        t_at = tot["t_attn"]
        t_ff = tot["t_router"] + tot["t_experts"] + tot["t_ffn"]
        b_at = sum(attn_bytes) if attn_bytes else 0.0
        b_ff = max(tot["weight_bytes"] - b_at, 0.0)
        gbs = lambda b, t: f"{b / t / 1e9:.1f} GB/s" if t > 0 and b > 0 else "-"  # noqa: E731
        rest = step_s - t_at - t_ff
        rows.append(f"step {step_s * 1e3:.2f} ms per token: attention blocks {t_at * 1e3:.2f} ms "
                    f"({b_at / 1e6:.0f} MB, {gbs(b_at, t_at - tot['t_attn_core'])} outside the attention core), "
                    f"FFN blocks {t_ff * 1e3:.2f} ms ({b_ff / 1e6:.0f} MB, {gbs(b_ff, t_ff)}), "
                    f"outside the layers {rest * 1e3:.2f} ms ({100 * rest / step_s:.0f}%: the output head, "
                    f"embedding, sampling, Python)")
    return "\n".join(rows)


def attention_bytes(f) -> list[float]:
    """Per layer, the bytes of its attention (or linear-attention) matrices in the GGUF: what a
    decode step streams for the layer's mixer block."""
    import re
    out: dict[int, float] = {}
    for name, t in f.tensors.items():
        m = re.match(r"blk\.(\d+)\.(attn_|ssm_)", name)
        if m and len(t.ne) >= 2 and not name.endswith("_norm.weight"):
            out[int(m.group(1))] = out.get(int(m.group(1)), 0.0) + t.nbytes
    n = max(out) + 1 if out else 0
    return [out.get(i, 0.0) for i in range(n)]
