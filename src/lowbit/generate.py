"""Generation as a few named steps: prefill, decode_one, generate.

    prefill(model, ids)       run the prompt through the model in chunks, return last logits
    decode_one(model, tok)    append one token, return its logits
    generate(model, prompt)   prefill, then sample / decode until max_tokens, EOG or a stop string
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .sampling import Sampler

PREFILL_CHUNK = 64  # tokens per forward call while prefilling (the kernels take 8 per window)


@dataclass
class Stats:
    prompt_tokens: int = 0
    generated: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    layers: bool = False                  # collect the engine's per-layer counters (lowbit run --stats)
    prefill_layers: list | None = None    # engine.stats() of the prefill, then of the decode
    decode_layers: list | None = None

    def line(self) -> str:
        pf = self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0
        dc = self.generated / self.decode_s if self.decode_s else 0.0
        return (f"prefill {self.prompt_tokens} tokens at {pf:.1f} tok/s, "
                f"decode {self.generated} tokens at {dc:.1f} tok/s")


def prefill(model, ids: list[int], chunk: int = PREFILL_CHUNK) -> np.ndarray:
    logits = None
    for i in range(0, len(ids), chunk):
        logits = model.forward(ids[i:i + chunk])
    return logits[-1]


def decode_one(model, token: int) -> np.ndarray:
    return model.forward([token])[-1]


def generate(model, prompt, max_tokens: int = 128, stop: list[str] | None = None, stats: Stats | None = None,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             repeat_penalty: float = 1.0, seed: int | None = None):
    """Yield text pieces as they decode. The KV cache starts empty for each call."""
    ids = model.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise ValueError("the prompt is empty")
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    if len(ids) >= model.n_ctx:
        raise ValueError(f"the prompt has {len(ids)} tokens; the context holds {model.n_ctx}")
    sampler = Sampler(temperature, top_k, top_p, min_p, repeat_penalty, seed=seed)
    stats = stats if stats is not None else Stats()
    stats.prompt_tokens = len(ids)
    model.reset()
    if stats.layers:
        model.engine.set_stats(True)
        model.engine.reset_stats()
    t0 = time.perf_counter()
    logits = prefill(model, ids)
    stats.prefill_s = time.perf_counter() - t0
    if stats.layers:
        stats.prefill_layers = model.engine.stats()
        model.engine.reset_stats()
    history = list(ids)
    out = model.tokenizer.stream()
    text = ""
    stops = [s for s in (stop or []) if s]
    t0 = time.perf_counter()
    try:
        for _ in range(max_tokens):
            tok = sampler.sample(logits, history)
            if tok in model.tokenizer.eog_ids:
                break
            history.append(tok)
            stats.generated += 1
            piece = out.push(tok)
            if stops and piece:
                text += piece
                hit = min((text.find(s) for s in stops if s in text), default=-1)
                if hit >= 0:
                    rest = hit - (len(text) - len(piece))
                    if rest > 0:
                        yield piece[:rest]
                    return
            if piece:
                yield piece
            if model.pos >= model.n_ctx:
                break
            logits = decode_one(model, tok)
        tail = out.flush()
        if tail:
            yield tail
    finally:
        stats.decode_s = time.perf_counter() - t0
        if stats.layers:
            stats.decode_layers = model.engine.stats()
            model.engine.set_stats(False)


def layer_table(layers: list[dict], title: str) -> str:
    """engine.stats() as a table: per layer, distinct experts per window (forward call), MB of
    weights streamed per token, and ms per token in attention / router / experts / dense FFN."""
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
    return "\n".join(rows)
