"""Speculative decoding in the server: drafters that propose tokens for many requests at once.

The scheduler (scheduler.py) asks a Speculator, once per step, for up to k drafts for every
request that is decoding; each request's window (its pending token + its drafts) goes into the
step's one batched forward with all logits; generate.verify decides each window; the rejected
positions are rewound per slot (Model.rewind: KV, and the recurrent state of hybrid models).

A Speculator has four methods, all called on the engine thread:

    admit(req)                 the request got a KV slot (req.slot) and will decode there
    propose([(req, k), ...])   -> [(drafts, q), ...]: up to k token ids per request, and q, the
                               rows of the draft distribution each draft was drawn from (None:
                               deterministic proposals, q is one-hot; generate.verify's rule)
    commit(req)                req.history grew (accepted drafts and the target's next token)
    release(req)               the request left its slot (finished, cancelled, failed)

Two kinds:
  PerRequest(factory)  any generate.py drafter (start / propose / commit: Lookup, DraftModel, an
                       MTP head), one instance per request made by factory(req) (None: this request
                       does not draft). Proposals run one request after the other: right for
                       drafters that cost no forward (the n-gram lookup).
  DraftSlots(model)    a draft model (same vocabulary) whose KV slots mirror the target's: slot s of
                       the draft holds request s's tokens. A step's drafting is batched: one
                       forward_batch catches every request's draft cache up with its history (and
                       gives the first draft's logits), then k - 1 forward_batch calls of one token
                       per request; never a loop of single-sequence forwards.

How many drafts a request gets in a step is the scheduler's policy (Scheduler._plan): drafts are
made while their expected accepted tokens are worth the step's extra tokens (--spec-cost), so a
step of many sequences, or a request whose drafts keep failing, drafts little or not at all.

Which requests draft (Scheduler._drafts): greedy and sampled requests both do (sampled ones
are verified by rejection sampling, generate.verify, so their tokens follow the target's
distribution; they are not the non-speculative server's tokens, which come from another draw of
the same rng), and so do requests with structured output (an llguidance mask): their drafts are
cut at the first token the grammar rejects, each row is masked with the grammar after the drafts
before it as generate.verify reaches it (its `reach` hook), and the matcher takes the accepted
tokens only; a draft model's sampled drafts (with q rows) are dropped for them, as cutting those
would bias the rejection sampling.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from ..generate import Lookup, check_draft
from ..model import common_prefix
from ..sampling import Sampler

CATCHUP_CHUNK = 256  # draft-cache tokens per slot per forward_batch while catching up (a prompt)


class PerRequest:
    """One generate.py drafter per request: factory(req) -> drafter (start/propose/commit) or None."""

    def __init__(self, factory: Callable, name: str = "lookup"):
        self.factory, self.name = factory, name
        self._d: dict[int, object] = {}

    def admit(self, req) -> None:
        d = self.factory(req)
        if d is not None:
            d.start(list(req.history))
            self._d[req.id] = d

    def propose(self, asks: list[tuple]) -> list[tuple[list[int], list | None]]:
        out = []
        for req, k in asks:
            d = self._d.get(req.id)
            out.append(d.propose(req.history, k) if d is not None and k > 0 else ([], None))
        return out

    def commit(self, req) -> None:
        d = self._d.get(req.id)
        if d is not None:
            d.commit(req.history)

    def release(self, req) -> None:
        d = self._d.pop(req.id, None)
        if d is not None and hasattr(d, "detach"):  # (MTP: stop taking the slot's hidden states)
            d.detach()


def lookup() -> PerRequest:
    """Prompt lookup (n-gram matches in the request's own prompt and output) for every request."""
    return PerRequest(lambda req: Lookup(), "lookup")


class _SlotTarget:
    """Slot s of a model as an MTP drafter's target (mtp.MTP.attach): the engine, and the slot's
    hidden-state hook."""

    def __init__(self, model, slot: int):
        self.model, self.slot, self.engine = model, slot, model.engine

    def set_hidden_sink(self, fn) -> None:
        self.model.set_hidden_sink(fn, self.slot)


def mtp(model) -> PerRequest:
    """The model's own MTP block (lowbit.mtp) drafting for every request: one MTP head (a one-layer
    engine and cache) per slot, kept across the slot's requests; the drafter is attached to the
    request's slot before its prompt runs, so it sees every position's hidden state. A prompt
    (part) taken from the prefix cache never ran here: such a request drafts nothing (its outputs
    are unchanged)."""
    from ..mtp import MTP, MTPHead
    heads: dict[int, MTPHead] = {}

    def factory(req):
        if req.slot not in heads:
            heads[req.slot] = MTPHead(model)
        d = MTP(model, heads[req.slot])
        d.attach(_SlotTarget(model, req.slot))
        return d
    return PerRequest(factory, "mtp")


class DraftSlots:
    """A draft model whose slot s drafts for the request in the target's slot s (batched)."""

    name = "draft"

    def __init__(self, draft, target=None):
        """draft: a loaded Model with at least the target's slots and context; target: checked to
        share the draft's vocabulary (generate.check_draft) when given."""
        if target is not None:
            check_draft(target, draft)
            if draft.n_slots < target.n_slots or draft.n_ctx < target.n_ctx:
                raise ValueError(f"the draft model needs >= {target.n_slots} slots of >= {target.n_ctx} positions")
        self.m = draft
        self._samplers: dict[int, Sampler] = {}

    def admit(self, req) -> None:
        s = req.sampler  # the draft samples as the target does (the q rows of speculative sampling)
        self._samplers[req.id] = s.replace(seed=None if s.seed is None else s.seed + 1)

    def release(self, req) -> None:
        self._samplers.pop(req.id, None)

    def commit(self, req) -> None:
        pass  # propose rolls the draft slot back to what it shares with the history

    def propose(self, asks: list[tuple]) -> list[tuple[list[int], list | None]]:
        m = self.m
        out: list[tuple[list[int], list | None]] = [([], None) for _ in asks]
        live = []  # (index in asks, req, k, the draft's tokens still to feed)
        for i, (req, k) in enumerate(asks):
            k = min(k, m.n_ctx - len(req.history))  # the draft's cache must hold history + k - 1
            if k <= 0:
                continue
            s, h = req.slot, req.history
            keep = min(common_prefix(m.slot_tokens[s], h), len(h) - 1)  # the last token runs again: its logits
            m.rewind(keep, slot=s)
            live.append((i, req, k, h[keep:]))
        if not live:
            return out
        # catch up: every slot's missing tokens, CATCHUP_CHUNK per slot per call; the logits of
        # each slot's last token come with its last chunk
        logits: dict[int, np.ndarray] = {}
        todo = list(live)
        while todo:
            runs = [(req.slot, rest[:CATCHUP_CHUNK]) for _, req, _, rest in todo]
            want = [len(rest) <= CATCHUP_CHUNK for _, _, _, rest in todo]
            res = m.forward_batch(runs, want=want)
            nxt = []
            for (i, req, k, rest), w, lg in zip(todo, want, res):
                if w:
                    logits[i] = lg[-1]
                else:
                    nxt.append((i, req, k, rest[CATCHUP_CHUNK:]))
            todo = nxt
        drafts = {i: [] for i, *_ in live}
        qs = {i: [] for i, *_ in live}
        hist = {i: list(req.history) for i, req, _, _ in live}
        for step in range(max(k for _, _, k, _ in live)):
            feed = []
            for i, req, k, _ in live:
                if step >= k:
                    continue
                smp, lg = self._samplers[req.id], logits[i]
                if req.logit_bias:  # drafts the target's bias rules out would only be rejected
                    lg = lg.copy()
                    for t, b in req.logit_bias.items():
                        lg[t] += b
                if smp.greedy:
                    d = smp.sample(lg, hist[i])
                else:
                    p = smp.probs(lg, hist[i])
                    d = int(smp.rng.choice(p.size, p=p))
                    qs[i].append(p)
                drafts[i].append(d)
                hist[i].append(d)
                if step + 1 < k:
                    feed.append((i, req.slot, d))
            if not feed:
                break
            res = m.forward_batch([(s, [d]) for _, s, d in feed])
            for (i, _, _), lg in zip(feed, res):
                logits[i] = lg[-1]
        for i, req, _, _ in live:
            out[i] = (drafts[i], None if self._samplers[req.id].greedy else qs[i])
        return out


def speculator_args(a, target_path: str) -> tuple[Callable | None, int, str | None]:
    """`lowbit serve`'s --draft / --lookup / --spec: (speculator(model) or None, k, a usage problem
    or None). The draft file is checked here, before the server starts: it must exist and share
    the target's vocabulary (read from both files' metadata; nothing is loaded)."""
    if getattr(a, "mtp", None) is not None:
        if a.spec is not None:
            return None, a.mtp, "--mtp N sets the drafts per step: drop --spec"
        if not 1 <= a.mtp <= 64:
            return None, a.mtp, f"--mtp must be in 1..64, got {a.mtp}"
        if a.spec_cost is not None and not 0 <= a.spec_cost <= 100:
            return None, a.mtp, f"--spec-cost must be in 0..100, got {a.spec_cost:g}"
        problem = _mtp_problem(target_path)
        return (None if problem else mtp), a.mtp, problem
    k = 4 if a.spec is None else a.spec
    if not (a.draft or a.lookup):
        given = "--spec" if a.spec is not None else "--spec-cost" if a.spec_cost is not None else None
        return None, k, f"{given} needs --draft MODEL or --lookup" if given else None
    if not 1 <= k <= 64:
        return None, k, f"--spec must be in 1..64, got {k}"
    if a.spec_cost is not None and not 0 <= a.spec_cost <= 100:
        return None, k, f"--spec-cost must be in 0..100, got {a.spec_cost:g}"
    if a.lookup:
        return lambda model: lookup(), k, None
    path = a.draft
    if not os.path.isfile(path):
        return None, k, f"--draft: no such model file: {path}"
    problem = _vocab_problem(target_path, path)
    if problem:
        return None, k, problem

    def make(model):
        from ..model import load
        draft = load(path, n_ctx=model.n_ctx, threads=a.threads, n_slots=model.n_slots)
        return DraftSlots(draft, model)
    return make, k, None


def _mtp_problem(path: str) -> str | None:
    """Why --mtp cannot run this model (None: it has an MTP block), from the file's metadata."""
    from .. import gguf
    from ..model import ModelConfig
    try:
        with gguf.open(path) as f:
            arch = f.metadata.get("general.architecture")
            n = ModelConfig.nextn_layers(f, arch)
    except (ValueError, OSError) as e:  # (GGUFError is a ValueError)
        return f"--mtp: cannot read {path}: {e}"
    return None if n > 0 else f"--mtp: {path} has no MTP (nextn) block ({arch})"


def _vocab_problem(target_path: str, draft_path: str) -> str | None:
    from .. import gguf
    from ..tokenizer import Tokenizer
    toks = []
    for p in (target_path, draft_path):
        try:
            with gguf.open(p) as f:
                toks.append(Tokenizer.from_gguf(f.metadata).tokens)
        except (ValueError, OSError, KeyError) as e:  # GGUFError is a ValueError
            return f"--draft: cannot read {p}: {e}"
    if toks[0] != toks[1]:
        return (f"--draft: {draft_path} does not share the model's vocabulary "
                f"({len(toks[1])} vs {len(toks[0])} tokens)")
    return None
