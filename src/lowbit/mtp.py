"""MTP (multi-token prediction, "nextn") speculative decoding: the model's own MTP block as the
draft (qwen35moe, qwen35, qwen3next, glm4moe, deepseek2 files with nextn_predict_layers >= 1).

The block, as llama.cpp's DECODER_MTP graphs compute it (src/models/qwen35moe.cpp graph_mtp, the
same in qwen35.cpp, qwen3next.cpp, glm4-moe.cpp, deepseek2.cpp), for token x at position p and a
hidden state h (dim floats):

    e   = RMSNorm(embed(x)) * nextn.enorm         embed: nextn.embed_tokens if present, else token_embd
    g   = RMSNorm(h) * nextn.hnorm
    y   = nextn.eh_proj . [e | g]                  eh_proj [dim, 2 dim]: the embedding half first
    y   = one decoder layer of the trunk's kind over y at position p (the block's attention, with
          its own KV cache of the MTP positions, and the trunk's FFN kind: experts + shared expert
          for the MoE models, a dense SwiGLU for qwen35)
    h'  = RMSNorm(y) * (nextn.shared_head_norm, else output_norm)      (llama.cpp's t_h_nextn)
    logits = (nextn.shared_head_head, else the model's output) . h'

h for the token at position p is the trunk's t_h_nextn at p - 1: its last residual after the
output norm (engine.hidden), zeros at p = 0. The block's KV cell at p is valid once it was
computed from the committed token at p and the trunk's h at p - 1 (llama.cpp's "catch-up" decode
of every target batch); we catch up lazily, in the next propose, and only over committed positions.

Drafting (MTP.propose) follows llama.cpp's common_speculative draft-mtp (common/speculative.cpp)
and DeepSeek-V3: draft 1 from (the last committed token, the trunk's h before it); draft k + 1
from (draft k, the block's own h' of draft k), at the next position. Drafts are the block's
argmax (proposals are deterministic: q one-hot, so sampling with temperature stays exact).
Cells written for drafts are overwritten by the next catch-up; a rejected draft needs no rewind
(the block's attention reads positions < p from the cache and p itself, never later cells).

The block runs in an engine of its own (one pipeline stage holding layer n_layer of n_layer + 1:
csrc/engine.h forward_layers with the glue's output as x_in, then the head), per drafter: two
generations drafting at once never share state. The weights are the model's mmap, not copied.
"""
from __future__ import annotations

import numpy as np

from . import kernels
from ._native import lib
from .gguf import GGUFError
from .model import common_prefix


MTP_ARCHS = ("qwen35moe", "qwen35", "qwen3next", "glm4moe", "deepseek2")  # llama.cpp's DECODER_MTP graphs


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """ggml's rms_norm then mul: x / sqrt(mean(x^2) + eps) * w, rows of x[T, n] (sum in float64)."""
    ms = np.mean(np.square(x, dtype=np.float64), axis=1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + eps)).astype(np.float32)) * w


class MTPHead:
    """The model's first MTP block and its glue, with a KV cache of n_ctx positions (one sequence)."""

    def __init__(self, model):
        c = model.config
        if c.n_nextn < 1:
            raise ValueError(f"{model.path}: this model has no MTP (nextn) block (nextn_predict_layers is 0)")
        if c.arch not in MTP_ARCHS:  # (glm4: llama.cpp loads its block and has no graph to run it)
            raise ValueError(f"{model.path}: {c.arch}'s MTP block is not run (MTP drafts for: {', '.join(MTP_ARCHS)})")
        if not hasattr(model.engine, "hidden"):
            raise ValueError("the MTP drafter needs the model in this process (not a pipeline of stages)")
        from .model import make_engine
        self.model, self.config, self.n_ctx = model, c, model.n_ctx
        L = c.n_layer  # the first MTP block's index: blocks after the trunk
        p = f"blk.{L}.nextn."
        t = model.file.tensors
        for name in ("eh_proj", "enorm", "hnorm"):
            if p + name + ".weight" not in t:
                raise GGUFError(f"{model.path}: the MTP block lacks {p}{name}.weight")
        self.engine = make_engine(c, model.n_ctx, 1, L, L + 1, model.kv_k, model.kv_v, n_layer=L + 1)
        if model.threads:
            self.engine.set_threads(model.threads)
        e = self.engine
        self._keep: list = []  # what e points into (besides the mmap): lives with this head, not the model
        model._bind_weights(e, (L, L + 1), self._keep)
        head_norm = p + "shared_head_norm.weight" if p + "shared_head_norm.weight" in t else "output_norm.weight"
        head = (p + "shared_head_head.weight" if p + "shared_head_head.weight" in t
                else "token_embd.weight" if c.tied_output else "output.weight")
        model._vec("output_norm", -1, head_norm, engine=e, keep=self._keep)
        model._mat("output", -1, head, engine=e, keep=self._keep)
        problem = e.validate()
        if problem:
            raise GGUFError(f"{model.path}: MTP block: {problem}")
        self.embd = t[p + "embed_tokens.weight"] if p + "embed_tokens.weight" in t else t["token_embd.weight"]
        self.eh_proj = t[p + "eh_proj.weight"]
        self.enorm, self.hnorm = self._f32(p + "enorm.weight"), self._f32(p + "hnorm.weight")
        if self.eh_proj.n != 2 * c.dim or self.eh_proj.rows != c.dim:
            raise GGUFError(f"{model.path}: {p}eh_proj.weight is [{self.eh_proj.rows}, {self.eh_proj.n}], "
                            f"expected [{c.dim}, {2 * c.dim}]")

    def _f32(self, name: str) -> np.ndarray:
        t = self.model.file.tensors[name]
        v = lib.dequantize(t.format.id, t.matrix(), t.n, t.w_scale, -1).reshape(-1)
        return np.ascontiguousarray(v, dtype=np.float32)

    # -- the glue, as named steps ------------------------------------------------------------
    def embed(self, tokens) -> np.ndarray:
        t = self.embd
        rows = np.ascontiguousarray(t.matrix()[np.asarray(tokens, np.int64)])
        return lib.dequantize(t.format.id, rows, t.n, t.w_scale, -1).reshape(len(tokens), -1).astype(np.float32)

    def project(self, tokens, h: np.ndarray) -> np.ndarray:
        """eh_proj . [enorm(embed(tokens)) | hnorm(h)]: the block's input residual [T, dim]."""
        eps = self.config.eps
        cat = np.concatenate([rms_norm(self.embed(tokens), self.enorm, eps), rms_norm(h, self.hnorm, eps)], axis=1)
        return kernels.matmul(self.eh_proj, np.ascontiguousarray(cat, np.float32), threads=self.model.threads)

    def step(self, tokens, h: np.ndarray, p0: int) -> tuple[np.ndarray, np.ndarray]:
        """Run the block on tokens at positions p0.. with hidden states h[T, dim] (writing its KV
        cells there); return the last token's logits [vocab] and its own hidden state h' [dim]."""
        T = len(tokens)
        x = np.ascontiguousarray(self.project(tokens, h), np.float32)
        logits = np.empty((1, self.config.vocab), np.float32)
        self.engine.forward_layers(np.asarray(tokens, np.int32), np.zeros(T, np.int32),
                                   np.arange(p0, p0 + T, dtype=np.int32), x, None,
                                   np.array([T - 1], np.int32), logits)
        hid = np.empty((1, self.config.dim), np.float32)
        self.engine.hidden(np.array([T - 1], np.int32), hid)
        return logits[0], hid


class MTP:
    """Drafter (start / propose / commit, as Lookup and DraftModel) running the target's MTP block.
    attach(seq) before the target's prefill: the drafter then receives the trunk's hidden state of
    every position the target runs (Model.set_hidden_sink). One drafter per sequence at a time (a
    chat keeps one across its turns: its cells then cover the reused prefix, see reusable). The
    trunk's hidden rows of a prompt are held until the next propose catches up over them
    (dim float32 per position)."""

    CATCHUP_CHUNK = 512

    def __init__(self, model, head: MTPHead | None = None):
        self.head = head if head is not None else MTPHead(model)
        self.dim = model.config.dim
        self.h: dict[int, np.ndarray] = {}   # position -> the trunk's t_h_nextn there
        self.done: list[int] = []            # tokens whose MTP cells (0..len-1) are valid
        self.target = None
        self.steps = 0                        # MTP block calls (tests, stats)
        self.draft_logits: list[np.ndarray] = []  # the last propose's logits, one row per draft (tests)

    # -- the target's hidden states ----------------------------------------------------------
    def attach(self, target) -> None:
        self.target = target
        target.set_hidden_sink(self._sink)

    def detach(self) -> None:
        if self.target is not None:
            self.target.set_hidden_sink(None)
            self.target = None

    def _sink(self, p0: int, row0: int, n: int) -> None:
        rows = np.empty((n, self.dim), np.float32)
        self.target.engine.hidden(np.arange(row0, row0 + n, dtype=np.int32), rows)
        for i in range(n):
            self.h[p0 + i] = rows[i]
        for q in [q for q in self.h if q >= p0 + n]:  # rows of positions forgotten by a rewind
            del self.h[q]
        del self.done[p0 + 1:]  # cells after p0 read hidden states just replaced

    def _h(self, q: int) -> np.ndarray:
        return np.zeros(self.dim, np.float32) if q < 0 else self.h[q]

    def reusable(self, ids: list[int], keep: int) -> int:
        """How much of the slot's cached prefix (keep tokens of ids) a generation may reuse with this
        drafter: no more than the prefix its MTP cells were computed for (a new drafter: none, so
        the prompt is prefilled and every position's hidden state reaches it), and the trunk's
        hidden state before the first re-run position must be known."""
        n = common_prefix(self.done, ids)
        k = min(keep, n)
        if k == n and k > 0 and (k - 1) not in self.h:
            k -= 1
        return k

    # -- the drafter interface ---------------------------------------------------------------
    def start(self, ids: list[int]) -> None:
        pass

    def propose(self, history: list[int], k: int) -> tuple[list[int], None]:
        P = len(history) - 1  # the target holds history[:P]; history[P] is the token to verify
        k = min(k, self.head.n_ctx - P)  # draft i's cell is at P + i - 1
        if k <= 0 or P < 0:
            return [], None
        n = min(common_prefix(self.done, history), P)
        if any(q not in self.h for q in range(max(n - 1, 0), P)):
            return [], None  # (a hidden state the catch-up needs never reached us: nothing to draft from)
        # catch up cells n..P (committed tokens, the trunk's hidden states), chunked; the last
        # chunk ends with position P, whose logits give draft 1
        for i in range(n, P + 1, self.CATCHUP_CHUNK):
            j = min(P + 1, i + self.CATCHUP_CHUNK)
            hs = np.stack([self._h(q - 1) for q in range(i, j)])
            logits, hid = self.head.step(history[i:j], hs, i)
            self.steps += 1
        self.done = list(history[:P + 1])
        for q in [q for q in self.h if q < P - 1]:  # no longer needed
            del self.h[q]
        drafts, self.draft_logits = [int(np.argmax(logits))], [logits]
        for i in range(1, k):
            logits, hid = self.head.step([drafts[-1]], hid, P + i)
            self.steps += 1
            drafts.append(int(np.argmax(logits)))
            self.draft_logits.append(logits)
        return drafts, None

    def commit(self, history: list[int]) -> None:
        pass
