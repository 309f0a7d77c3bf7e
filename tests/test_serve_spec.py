"""Speculative decoding in the server (server/spec.py, the scheduler's windows), on a random-weight
model (serve_util.synth_model, Q8_0) and its draft: the same weights in Q4_0 (they agree most of
the time, not always, so both accepted and rejected drafts occur and the counters are asserted).

- Greedy requests give the same tokens with --lookup or --draft as without speculation, token for
  token (Request.history), several concurrent requests of mixed prompt and output lengths, more
  requests than slots (queueing), stop strings, a repetition penalty, logit_bias, the prefix
  cache; the windows both accepted and rejected drafts (asserted: the test can fail).
- Sampled requests are verified by rejection sampling (generate.verify): with top_k=1 at
  temperature 0.9 the target's distribution is one-hot, so the speculative output must be the
  greedy one, drafts drawn from the draft's q rows included.
- Structured output drafts (drafts cut where the grammar rejects them, rows masked one by one as
  the verification reaches them): the plain scheduler's greedy tokens, outputs that match the
  schema; a draft model's sampled drafts are not used for it.
- A hybrid model (recurrent layers) gets its state rolled back with the KV: same greedy tokens.
- A request cancelled mid-speculation leaves no slot or drafter state behind.
- Over HTTP: `lowbit serve --lookup` / `--draft` answer as the plain generation does, /v1/status
  and /metrics count drafts; bad flags are one-line errors with exit 2.
"""
import concurrent.futures as cf
import json
import queue
import subprocess
import sys
import threading
import time

import httpx
import pytest

import lowbit
from lowbit.sampling import Sampler
from lowbit.server import spec
from lowbit.server.prefix import PrefixCache
from lowbit.server.scheduler import Request, Scheduler
from serve_util import alone, free_port, running, synth_model

N_CTX = 256
PARALLEL = 3
# (prompt text, max_tokens, request options): mixed lengths; one repeats itself (lookup's case)
JOBS = [
    ("The quick brown fox", 40, {}),
    ("one two three four one two three four one two three four one two", 24, {}),
    ("A much longer prompt, about the history of the printing press, which began in the fifteenth "
     "century with movable type and spread quickly across Europe", 48, {}),
    ("Hello", 9, {}),
    ("Lists: red green blue, red green blue, red green", 30, {"repeat_penalty": 1.3}),
    ("Stop somewhere", 40, {"stop": ["e"]}),
    # a bias that makes a few tokens recur: lookup's drafts are then sometimes right, sometimes not
    ("Three tokens", 30, {"logit_bias": {17: 3.0, 18: 3.0, 19: 3.0, 20: 3.0}}),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from lowbit.synth import default_vocab, synth_dense
    d = tmp_path_factory.mktemp("sspec")
    target = synth_model(d / "target.gguf")
    # the same random weights (same seed), rounded to Q4_0: the draft
    draft = synth_dense(d / "draft.gguf", layers=2, dim=128, ffn=256, heads=4, kv_heads=2, ctx=4096, wtype="Q4_0",
                        seed=11)
    # another vocabulary: the default one and 8 tokens more
    v = dict(default_vocab())
    for key, extra in (("tokenizer.ggml.tokens", [f"<extra_{i}>" for i in range(8)]),
                       ("tokenizer.ggml.token_type", [1] * 8), ("tokenizer.ggml.scores", [0.0] * 8)):
        if key in v:
            v[key] = list(v[key]) + extra
    other = synth_dense(d / "other.gguf", layers=1, dim=64, ffn=128, heads=2, kv_heads=1, ctx=512, wtype="Q8_0",
                        vocab=v)
    return {"target": target, "draft": draft, "other": other}


@pytest.fixture(scope="module")
def model(paths):
    return lowbit.load(paths["target"], n_ctx=N_CTX, threads=2, n_slots=PARALLEL)


@pytest.fixture(scope="module")
def draft(paths):
    return lowbit.load(paths["draft"], n_ctx=N_CTX, threads=2, n_slots=PARALLEL)


def submit(sched, ids, n, opts, **sampling):
    q = queue.Queue()
    o = dict(opts)
    r = Request(prompt=list(ids), max_tokens=n, sampler=Sampler(repeat_penalty=o.pop("repeat_penalty", 1.0), **sampling),
                emit=q.put, **o)
    sched.submit(r)
    return r, q


def drain(q, limit=120):
    text = ""
    while True:
        ev = q.get(timeout=limit)
        if ev[0] == "text":
            text += ev[1]
        else:
            assert ev[0] == "done", ev
            return text, ev


def serve_all(model, jobs, speculator=None, k=4, cache=False, cost=0.0, **sampling):
    """Every job submitted at once (more jobs than slots): per job (tokens generated, text,
    finish reason), and the scheduler's final status. cost: the drafting policy's (0: k drafts
    whenever the drafter has them)."""
    sched = Scheduler(model, PARALLEL, spec=speculator, spec_k=k, spec_cost=cost,
                      cache=PrefixCache(model, 8 << 20) if cache else None)
    try:
        with sched._cv:  # all queued before the first step: which requests share a step (and so
            # what the drafting policy sees) must not depend on the machine's load
            reqs = [submit(sched, model.tokenize(p), n, o, **sampling) for p, n, o in jobs]
        outs = []
        for r, q in reqs:
            text, ev = drain(q)
            outs.append((r.history[len(r.prompt):], text, ev[1], ev[2]["completion_tokens"]))
        return outs, sched.status()
    finally:
        sched.close()


@pytest.fixture(scope="module")
def plain_outputs(model):
    outs, st = serve_all(model, JOBS)
    assert st["spec"] is None
    plain_status.update(st)
    return outs


plain_status: dict = {}  # the non-speculative run's scheduler status (steps)


@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_greedy_tokens_identical_with_speculation(model, draft, plain_outputs, kind):
    sp = spec.lookup() if kind == "lookup" else spec.DraftSlots(draft, model)
    outs, st = serve_all(model, JOBS, sp, k=4, cache=kind == "draft")
    for (p, n, _), want, got in zip(JOBS, plain_outputs, outs):
        assert got == want, (p, n)
    s = st["spec"]
    # both verdicts occurred: some drafts accepted, some rejected
    assert 0 < s["accepted"] < s["drafted"], s
    assert s["acceptance_rate"] == round(s["accepted"] / s["drafted"], 4)
    assert st["free_slots"] == PARALLEL and st["active"] == 0 and st["done"] == len(JOBS)
    # accepted drafts saved steps (batched forwards) over the same requests
    assert st["steps"] < plain_status["steps"], (st, plain_status)


def test_drafting_policy_drafts_less_when_drafts_do_not_pay(model, plain_outputs):
    """The policy (spec_cost > 0): the same tokens; with three requests per step and lookup's
    poor drafts on most of them, fewer drafts than always drafting k, the good ones still drafted."""
    free, st0 = serve_all(model, JOBS, spec.lookup(), k=4, cost=0.0)
    kept, st1 = serve_all(model, JOBS, spec.lookup(), k=4, cost=0.25)
    assert [o[0] for o in kept] == [o[0] for o in plain_outputs]
    assert 0 < st1["spec"]["drafted"] < st0["spec"]["drafted"], (st0["spec"], st1["spec"])
    assert st1["spec"]["acceptance_rate"] > st0["spec"]["acceptance_rate"]


def test_plain_server_matches_generate(model, plain_outputs):
    """The reference itself: the non-speculative server's tokens are lowbit.generate's alone."""
    for (p, n, o), (toks, text, _, count) in zip(JOBS[:4], plain_outputs[:4]):
        want, _, m = alone(model, p, n)
        assert (text, count) == (want, m)


def test_sampled_verify_keeps_target_distribution(model, draft, plain_outputs):
    """top_k=1 makes the target's distribution one-hot at any temperature: rejection sampling
    must then give exactly the greedy tokens, whatever the draft drew from its own q rows."""
    pick = [0, 1, 2, 3, len(JOBS) - 1]
    for sp in (spec.lookup(), spec.DraftSlots(draft, model)):
        outs, st = serve_all(model, [JOBS[i] for i in pick], sp, k=3, temperature=0.9, top_k=1, seed=7)
        assert [o[0] for o in outs] == [plain_outputs[i][0] for i in pick]
        assert 0 < st["spec"]["accepted"] < st["spec"]["drafted"], st["spec"]  # rejections resampled


# a schema whose output repeats itself (lookup's case), and prompts that show such JSON
ITEMS = {"type": "object", "properties": {"items": {
    "type": "array", "minItems": 3, "maxItems": 8,
    "items": {"type": "object", "properties": {"c": {"enum": ["red", "green", "blue"]},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["c", "n"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}
STRUCTURED = ['JSON please: {"items":[{"c":"red","n":1},{"c":"blue","n":2},{"c":"red","n":3}]}',
              'Colours: {"items":[{"c":"green","n":10},{"c":"green","n":11}]} again:',
              "Describe three things.",
              '{"items":[{"c":"blue","n":7}]}{"items":[{"c":"blue","n":7}]}']


def items_ok(text: str) -> bool:
    """ITEMS, checked by hand."""
    v = json.loads(text)
    return (set(v) == {"items"} and isinstance(v["items"], list) and 3 <= len(v["items"]) <= 8
            and all(set(i) == {"c", "n"} and i["c"] in ("red", "green", "blue") and type(i["n"]) is int
                    and 0 <= i["n"] <= 99 for i in v["items"]))


def serve_structured(model, sp, **sampling):
    """STRUCTURED's prompts at once (more than the slots), each constrained to ITEMS: per
    request (tokens, text, finish reason), and the scheduler's status."""
    from lowbit.server.structured import Constraint, grammar
    g = grammar({"type": "json_schema", "json_schema": {"schema": ITEMS, "strict": True}})
    sched = Scheduler(model, PARALLEL, spec=sp, spec_k=4, spec_cost=0.0)
    try:
        reqs = [submit(sched, model.tokenize(p), 120, {"constraint": Constraint(model.tokenizer, model.config.vocab, g)},
                       **sampling) for p in STRUCTURED]
        outs = []
        for r, q in reqs:
            text, ev = drain(q)
            outs.append((r.history[len(r.prompt):], text, ev[1]))
        return outs, sched.status()
    finally:
        sched.close()


def test_structured_output_speculates_with_the_same_tokens(model):
    """Structured output with --lookup: drafts cut where the grammar rejects them, rows masked with
    the grammar after the drafts before them, the matcher advanced over accepted tokens only: the
    greedy tokens of the non-speculative scheduler, every output parses and matches the schema;
    drafts were accepted, rejected and cut. Sampled with top_k=1 (one-hot: rejection sampling
    must give the greedy tokens) too."""
    want, _ = serve_structured(model, None)
    for _, text, reason in want:
        assert reason == "stop" and items_ok(text), text
    got, st = serve_structured(model, spec.lookup())
    assert got == want
    s = st["spec"]
    assert 0 < s["accepted"] < s["drafted"] and s["grammar_cut"] > 0, s
    assert st["free_slots"] == PARALLEL and st["done"] == len(STRUCTURED)
    got, st = serve_structured(model, spec.lookup(), temperature=0.9, top_k=1, seed=3)
    assert [g[0] for g in got] == [w[0] for w in want] and st["spec"]["accepted"] > 0


def test_structured_output_with_sampled_draft_model_drafts_nothing(model, draft):
    """A draft model's sampled drafts (with q rows) cannot be cut without biasing the rejection
    sampling: a constrained sampled request does not use them (and still matches the schema)."""
    outs, st = serve_structured(model, spec.DraftSlots(draft, model), temperature=1.0, seed=5)
    assert st["spec"]["drafted"] == 0
    for _, text, reason in outs:
        assert reason == "stop" and items_ok(text), text


class Held(spec.DraftSlots):
    """The draft model, except that its third proposal waits for the test to open the gate."""

    def __init__(self, *a):
        super().__init__(*a)
        self.calls, self.entered, self.gate = 0, threading.Event(), threading.Event()

    def propose(self, asks):
        self.calls += 1
        if self.calls == 3:
            self.entered.set()
            self.gate.wait(120)
        return super().propose(asks)


def test_cancel_mid_speculation_leaks_nothing(model, draft, plain_outputs):
    sp = Held(draft, model)
    sched = Scheduler(model, PARALLEL, spec=sp, spec_k=4)
    try:
        r, q = submit(sched, model.tokenize(JOBS[0][0]), 200, {"logit_bias": {t: -100.0 for t in model.tokenizer.eog_ids}})
        assert sp.entered.wait(120)  # mid-speculation: two windows verified, the third being drafted
        sched.cancel(r)
        sp.gate.set()
        end = time.monotonic() + 60
        while sched.status()["active"] and time.monotonic() < end:
            time.sleep(0.01)
        st = sched.status()
        assert st["active"] == 0 and st["free_slots"] == PARALLEL and st["cancelled"] == 1
        assert sp._samplers == {}  # the drafter forgot it
        assert st["spec"]["drafted"] > 0
        # the slots serve the next requests as before
        p, n, o = JOBS[1]
        r2, q2 = submit(sched, model.tokenize(p), n, o)
        drain(q2)
        assert r2.history[len(r2.prompt):] == plain_outputs[1][0]
    finally:
        sched.close()


def test_hybrid_model_rewinds_recurrent_state(tmp_path):
    """A hybrid Qwen (gated delta-net layers): a rejected draft rolls back the slot's recurrent
    state too (Model.rewind), so greedy tokens stay those of the plain scheduler."""
    from lowbit.synth import synth_hybrid
    p = synth_hybrid(tmp_path / "q35.gguf", arch="qwen35", layers=2, dim=128, heads=2, kv_heads=1, ffn=128,
                     full_attention_interval=2, ssm_state=16, seed=4)
    m = lowbit.load(p, n_ctx=128, threads=2, n_slots=PARALLEL)
    want, _ = serve_all(m, JOBS)
    got, st = serve_all(m, JOBS, spec.lookup(), k=3)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert 0 < st["spec"]["accepted"] < st["spec"]["drafted"], st["spec"]


def test_mtp_drafts_for_every_request(tmp_path):
    """--mtp: each request's drafts come from the model's own MTP block, attached to its slot (a
    near-bigram hybrid model whose MTP block is that bigram, tests/mtp_models.py): greedy tokens are
    the plain scheduler's, with drafts both accepted and rejected."""
    from lowbit.synth import synth_hybrid
    from mtp_models import SMALL, edit, near_bigram
    p = edit(synth_hybrid(tmp_path / "m.gguf", arch="qwen35moe", mtp_layers=1, **SMALL), lambda T: near_bigram(T, 4))
    m = lowbit.load(p, n_ctx=N_CTX, threads=2, n_slots=PARALLEL)
    want, _ = serve_all(m, JOBS)
    got, st = serve_all(m, JOBS, spec.mtp(m), k=3)
    assert [g[0] for g in got] == [w[0] for w in want]
    assert 0 < st["spec"]["accepted"] < st["spec"]["drafted"], st["spec"]
    assert st["spec"]["drafter"] == "mtp"


# -- the command -----------------------------------------------------------------------------------
def stream_completion(url, prompt, n, opts):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, **opts}
    if "logit_bias" in opts:
        body["logit_bias"] = {str(t): b for t, b in opts["logit_bias"].items()}
    text = ""
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                if ev.get("choices"):
                    text += ev["choices"][0]["text"]
    return text


@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_serve_speculative_matches_plain_scheduler(paths, plain_outputs, kind):
    # --spec-cost 0: every window drafts (the policy, which depends on which requests happen to
    # share a step, is tested in-process above); lookup's drafts are then right on the repeating
    # prompts whatever the timing, so the counters can be asserted
    flag = ["--lookup"] if kind == "lookup" else ["--draft", paths["draft"]]
    jobs = JOBS
    with running("-m", paths["target"], "--ctx", str(N_CTX), "--parallel", str(PARALLEL), "-t", "2",
                 *flag, "--spec", "3", "--spec-cost", "0") as s:
        with cf.ThreadPoolExecutor(len(jobs)) as ex:
            got = list(ex.map(lambda j: stream_completion(s.url, *j), jobs))
        st = httpx.get(s.url + "/v1/status", timeout=30).json()
        metrics = httpx.get(s.url + "/metrics", timeout=30).text
    for (p, n, o), want, text in zip(jobs, plain_outputs, got):
        assert text == want[1], p
    sp = st["spec"]
    assert sp["drafter"] == kind and sp["k"] == 3 and 0 < sp["accepted"] <= sp["drafted"]
    assert st["requests"]["free_slots"] == PARALLEL
    assert f"lowbit_spec_drafted_total {sp['drafted']}" in metrics
    assert f"lowbit_spec_accepted_total {sp['accepted']}" in metrics


def test_serve_lookup_structured_matches_plain_scheduler(paths, model):
    """`lowbit serve --lookup --spec-cost 0` with response_format json_schema: the plain
    scheduler's greedy texts, each matching the schema; the server drafted and cut drafts."""
    want, _ = serve_structured(model, None)
    fmt = {"type": "json_schema", "json_schema": {"name": "items", "strict": True, "schema": ITEMS}}
    with running("-m", paths["target"], "--ctx", str(N_CTX), "--parallel", str(PARALLEL), "-t", "2",
                 "--lookup", "--spec", "4", "--spec-cost", "0") as s:
        def ask(prompt):
            r = httpx.post(s.url + "/v1/completions", timeout=300, json={
                "prompt": prompt, "max_tokens": 120, "temperature": 0, "response_format": fmt})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]
        with cf.ThreadPoolExecutor(len(STRUCTURED)) as ex:
            got = list(ex.map(ask, STRUCTURED))
        sp = httpx.get(s.url + "/v1/status", timeout=30).json()["spec"]
    assert got == [w[1] for w in want]
    assert all(items_ok(t) for t in got)
    assert 0 < sp["accepted"] < sp["drafted"] and sp["grammar_cut"] > 0, sp


@pytest.mark.parametrize("args, words", [
    (["--lookup", "--spec", "0"], "--spec must be in 1..64"),
    (["--spec", "3"], "--spec needs --draft MODEL or --lookup"),
    (["--spec-cost", "0.5"], "--spec-cost needs --draft MODEL or --lookup"),
    (["--lookup", "--spec-cost", "-1"], "--spec-cost must be in 0..100"),
    (["--draft", "missing.gguf"], "no such model file"),
    (["--draft", "OTHER"], "does not share the model's vocabulary"),
    (["--mtp", "2"], "has no MTP (nextn) block"),
    (["--mtp", "0"], "--mtp must be in 1..64"),
    (["--mtp", "2", "--spec", "3"], "drop --spec"),
    (["--mtp", "2", "--lookup"], "not allowed with argument"),
])
def test_bad_spec_flags_are_one_line_usage_errors(paths, args, words):
    args = [paths["other"] if a == "OTHER" else a for a in args]
    p = subprocess.run([sys.executable, "-m", "lowbit.cli", "serve", "-m", paths["target"], "--port", str(free_port()),
                        *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], p.stderr
