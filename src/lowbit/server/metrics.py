"""Counters, gauges and histograms for `GET /metrics`, in Prometheus' text format (version 0.0.4).

No client library: the exposition format is a few lines of text. Writers are the engine thread
(tokens, TTFT, per-token latency, cache hits) and the event loop (requests by status); an update
is one small critical section under the registry's lock, and a scrape renders a consistent copy.

    lowbit_requests_total{endpoint, status}      HTTP requests answered, by endpoint and status code
    lowbit_prompt_tokens_total                   prompt tokens computed (not those the prefix cache gave)
    lowbit_generation_tokens_total               tokens generated
    lowbit_time_to_first_token_seconds           histogram: submit -> first generated token
    lowbit_time_per_output_token_seconds         histogram: between consecutive tokens of a request
    lowbit_request_duration_seconds              histogram: submit -> last event, per finished request
    lowbit_engine_step_seconds                   histogram: one batched forward of the engine (a step)
    lowbit_engine_step_tokens                    histogram: the tokens a step computed (decode tokens,
                                                 drafts and prompt chunks of every active request)
    lowbit_queue_depth / lowbit_slots_busy / lowbit_slots_total     gauges, read at scrape time
    lowbit_prefix_cache_*                        lookups, hits, tokens reused, bytes held, evictions
    lowbit_spec_drafted_total / _accepted_total  speculative decoding: drafts verified, drafts accepted
"""
from __future__ import annotations

import bisect
import threading

# bucket upper bounds in seconds (le); +Inf is implicit
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """Cumulative buckets as Prometheus exposes them (counts per bucket, summed at render)."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, acc = [], 0
        for b, c in zip(self.bounds, self.counts):
            acc += c
            out.append(f'{name}_bucket{{le="{b:g}"}} {acc}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.duration = Histogram(DURATION_BUCKETS)
        self.step = Histogram(STEP_BUCKETS)
        self.step_tokens = Histogram(STEP_TOKEN_BUCKETS)

    # -- writers --------------------------------------------------------------------------------
    def request(self, endpoint: str, status: int) -> None:
        with self.lock:
            k = (endpoint, int(status))
            self.requests[k] = self.requests.get(k, 0) + 1

    def tokens(self, prompt: int = 0, generated: int = 0) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated

    def observe(self, ttft: list[float], tpot: list[float], duration: list[float],
                step: tuple[float, int] | None = None) -> None:
        """A step's worth of observations at once (one lock round per step, not per token); step:
        its forward's (seconds, tokens computed). An operator reads from the step histograms
        whether the engine or the server around it bounds the tokens per second (the per-token
        gaps against the steps' times)."""
        with self.lock:
            if step is not None:
                self.step.observe(step[0])
                self.step_tokens.observe(step[1])
            for v in ttft:
                self.ttft.observe(v)
            for v in tpot:
                self.tpot.observe(v)
            for v in duration:
                self.duration.observe(v)

    # -- the scrape -----------------------------------------------------------------------------
    def render(self, gauges: dict[str, tuple[str, float]], cache: dict | None, spec: dict | None = None) -> str:
        """The exposition text. gauges: name -> (help, value), read by the caller at scrape time;
        cache: the prefix cache's counters (PrefixCache.stats()) or None; spec: the scheduler's
        speculative decoding counters (Scheduler.status()["spec"]) or None."""
        out: list[str] = []

        def head(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")

        with self.lock:
            head("lowbit_requests_total", "counter", "HTTP requests answered, by endpoint and status code")
            for (ep, code), n in sorted(self.requests.items()):
                out.append(f'lowbit_requests_total{{endpoint="{_esc(ep)}",status="{code}"}} {n}')
            head("lowbit_prompt_tokens_total", "counter", "Prompt tokens computed (not those the prefix cache gave)")
            out.append(f"lowbit_prompt_tokens_total {self.prompt_tokens}")
            head("lowbit_generation_tokens_total", "counter", "Tokens generated")
            out.append(f"lowbit_generation_tokens_total {self.generation_tokens}")
            for name, h, help_ in (
                    ("lowbit_time_to_first_token_seconds", self.ttft, "Time from submit to the first generated token"),
                    ("lowbit_time_per_output_token_seconds", self.tpot,
                     "Time between consecutive generated tokens of a request"),
                    ("lowbit_request_duration_seconds", self.duration, "Time from submit to a request's last event"),
                    ("lowbit_engine_step_seconds", self.step, "One batched forward of the engine (a step)"),
                    ("lowbit_engine_step_tokens", self.step_tokens,
                     "Tokens a step computed: decode tokens, drafts and prompt chunks of every active request")):
                head(name, "histogram", help_)
                out += h.lines(name)
        for name, (help_, v) in gauges.items():
            head(name, "gauge", help_)
            out.append(f"{name} {v:g}")
        if cache is not None:
            for key, kind, help_ in (
                    ("lookups", "counter", "Requests that looked up the prefix cache"),
                    ("hits", "counter", "Lookups that reused at least one cached block"),
                    ("hit_tokens", "counter", "Prompt tokens whose KV came from the cache"),
                    ("inserted_blocks", "counter", "Blocks of KV stored"),
                    ("evicted_blocks", "counter", "Blocks of KV evicted (least recently used first)"),
                    ("blocks", "gauge", "Blocks of KV held"),
                    ("bytes", "gauge", "Bytes of KV (and recurrent-state snapshots) held"),
                    ("snapshots", "gauge", "Blocks holding a hybrid model's recurrent state"),
                    ("capacity_bytes", "gauge", "The cache's budget in bytes (--cache-mb)")):
                name = f"lowbit_prefix_cache_{key}" + ("_total" if kind == "counter" else "")
                head(name, kind, help_)
                out.append(f"{name} {cache[key]}")
        if spec is not None:
            for key, help_ in (("windows", "Verify windows that carried drafts"),
                               ("drafted", "Draft tokens verified"), ("accepted", "Draft tokens accepted")):
                name = f"lowbit_spec_{key}_total"
                head(name, "counter", help_)
                out.append(f"{name} {spec[key]}")
        return "\n".join(out) + "\n"
