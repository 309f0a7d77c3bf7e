"""The scheduler without HTTP: a failing step fails only the requests in it, and the engine
thread goes on serving the next ones correctly."""
import queue
import threading

import pytest

import lowbit
from lowbit.sampling import Sampler
from lowbit.server.scheduler import QueueFull, Request, Scheduler
from serve_util import alone, synth_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return lowbit.load(synth_model(tmp_path_factory.mktemp("sched") / "s.gguf"), n_ctx=128, threads=2, n_slots=2)


class Flaky:
    """The model, except that forward_batch raises while `broken` is set."""

    def __init__(self, model):
        self.m, self.broken = model, False

    def __getattr__(self, k):
        return getattr(self.m, k)

    def forward_batch(self, *a, **k):
        if self.broken:
            raise RuntimeError("injected failure")
        return self.m.forward_batch(*a, **k)


def run(sched, prompt, n, **kw):
    q = queue.Queue()
    r = Request(prompt=prompt, max_tokens=n, sampler=Sampler(**kw), emit=q.put)
    sched.submit(r)
    return q


def drain(q):
    text = ""
    while True:
        ev = q.get(timeout=120)
        if ev[0] == "text":
            text += ev[1]
        else:
            return text, ev


def test_failed_step_fails_its_requests_only(model):
    flaky = Flaky(model)
    sched = Scheduler(flaky, 2)
    try:
        ids = model.tokenize("A failing step")
        flaky.broken = True
        text, ev = drain(run(sched, ids, 5))
        assert ev[0] == "error" and "injected failure" in ev[1]
        flaky.broken = False
        want, _, n = alone(model, ids, 7, temperature=0.9, seed=5)
        text, ev = drain(run(sched, ids, 7, temperature=0.9, seed=5))
        assert text == want and ev[:2] == ("done", "length") and ev[2]["completion_tokens"] == n
        st = sched.status()
        assert st["failed"] == 1 and st["done"] == 1 and st["active"] == 0
    finally:
        sched.close()


class Gated(Flaky):
    """The model, except that forward_batch waits for the test to open the gate."""

    def __init__(self, model):
        super().__init__(model)
        self.gate, self.entered = threading.Event(), threading.Event()

    def forward_batch(self, *a, **k):
        self.entered.set()
        self.gate.wait(120)
        return self.m.forward_batch(*a, **k)


def test_submit_checks_and_queue_limit(model):
    gated = Gated(model)
    sched = Scheduler(gated, 1, max_queue=1)
    try:
        s = Sampler()
        with pytest.raises(ValueError, match="empty"):
            sched.submit(Request(prompt=[], max_tokens=1, sampler=s, emit=print))
        with pytest.raises(ValueError, match="context holds"):
            sched.submit(Request(prompt=[1] * 128, max_tokens=1, sampler=s, emit=print))
        with pytest.raises(ValueError, match="max_tokens"):
            sched.submit(Request(prompt=[1], max_tokens=0, sampler=s, emit=print))
        a = run(sched, [1, 2, 3], 3)
        assert gated.entered.wait(120)  # a is in the engine's first step
        b = run(sched, [4, 5, 6], 3)    # b waits in the queue
        assert sched.status()["queued"] == 1
        with pytest.raises(QueueFull):
            run(sched, [7], 3)
        gated.gate.set()
        assert drain(a)[1][0] == "done" and drain(b)[1][0] == "done"
    finally:
        gated.gate.set()
        sched.close()
    with pytest.raises(ValueError, match="parallel"):
        Scheduler(model, 3)
