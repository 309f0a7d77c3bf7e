"""`lowbit bench serve`'s load generator (lowbit/server/bench.py) against a real `lowbit serve`:
every client gets exactly the tokens it asked for (the end-of-generation tokens are banned), the
times it reports are in order, and an HTTP error is an error, not a count of zero. Function only:
no time is asserted (the figures are BENCHMARKS.md's)."""
import io
import time

import pytest

from lowbit.server import bench


@pytest.fixture(scope="module")
def eog_ban():
    from lowbit import gguf
    from lowbit.model import default_model_path
    from lowbit.tokenizer import Tokenizer
    with gguf.open(default_model_path()) as f:
        return {str(t): -100 for t in Tokenizer.from_gguf(f.metadata).eog_ids}


@pytest.fixture(scope="module")
def server():
    import sys
    from lowbit.model import default_model_path
    p = bench._Proc([sys.executable, "-m", "lowbit.cli", "serve", "-m", default_model_path(), "-t", "1",
                     "--parallel", "3", "--ctx", "256"], "/health")
    yield p
    p.stop()


def test_every_stream_gets_its_tokens_and_times_in_order(server, eog_ban):
    t0 = time.perf_counter()
    n, first, last = bench._stream(server.url, "Once upon a time", 7, eog_ban, t0)
    assert n == 7
    assert 0 < first <= last <= time.perf_counter() - t0
    rate, ttfts, total = bench._round(server.url, 3, 5, eog_ban)
    assert total == 15 and len(ttfts) == 3 and rate > 0


def test_measure_reports_per_round_counts(server, eog_ban):
    out = io.StringIO()
    r = bench._measure("lowbit", server.url, 2, 4, 1, eog_ban, out)
    assert r["tokens"] == [8] and r["one"] > 0 and r["many"] > 0
    assert "2 clients" in out.getvalue()


def test_an_http_error_is_raised(server):
    with pytest.raises(RuntimeError, match="HTTP 400"):
        bench._stream(server.url, "x", -5, {}, time.perf_counter())  # max_tokens < -1: a 400


def test_step_ceiling_times_both_steps():
    """bench serve's engine ceiling: both step times measured and the ratio formed from them."""
    from lowbit.model import default_model_path
    r = bench.step_ceiling(default_model_path(), 1, 3, secs=0.05, reps=1)
    assert r["one_ms"] > 0 and r["many_ms"] > 0
    assert r["ceiling"] == pytest.approx(3 * r["one_ms"] / r["many_ms"])
