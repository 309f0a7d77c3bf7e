"""Structured output with llguidance (the constraint library llama.cpp integrates): OpenAI's
`response_format` {"type": "json_object"} and {"type": "json_schema", "json_schema": {"schema":
..., "strict": true}} become a grammar; each step, the tokens the grammar cannot take next are
masked out of the request's logits before sampling (so every sampled output parses and matches
the schema), and the sampled token is fed to the matcher. The end-of-generation token is allowed
only where the grammar may end, and generation stops as soon as the grammar cannot continue.

llguidance sees the model's vocabulary as llama.cpp hands it over: every token's bytes, control
tokens marked with a leading 0xff byte (never text the grammar can produce), and our own
tokenizer (no `transformers` needed). Built once per tokenizer: ~1 s for 49k tokens.
The mask of a request's next token is computed off the critical path: as soon as a token is
accepted, prefetch() hands the matcher to a worker thread, which computes the allowed set while
the engine runs the next forward (both release the GIL); mask() then only waits for it (done
by then) and writes -inf over the logits the grammar rules out.

With speculative decoding (the scheduler), a request's drafts are cut at the first token the
grammar rejects (valid_prefix: nothing consumed), and the window's rows are masked one by one as
the verification reaches them (advance: the accepted draft consumed, then the next row masked
with the state after it), so the matcher only ever takes accepted tokens (no rollback) and every
row is masked exactly as non-speculative decoding masks that position: greedy outputs are the
same tokens.
"""
from __future__ import annotations

import json

import numpy as np

_LLTOK: dict[int, tuple] = {}  # id(tokenizer) -> (the tokenizer, kept alive so its id stays its own; LLTokenizer)


class FormatError(ValueError):
    """response_format is not one lowbit can follow (HTTP 400, param response_format)."""


def _lltokenizer(tokenizer, n_vocab: int):
    import llguidance
    key = id(tokenizer)
    if key not in _LLTOK:
        special = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]
        toks = [(b"\xff" if tokenizer.is_special(i) else b"") + tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
        toks += [b""] * (n_vocab - len(toks))

        class Wrapper:  # llguidance's TokenizerWrapper protocol
            is_tokenizer_wrapper = True
            tokens = toks
            eos_token_id = tokenizer.eos_id
            bos_token_id = tokenizer.bos_id
            special_token_ids = special

            def __call__(self, s):
                s = s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s
                return tokenizer.encode(s, add_bos=False, special=False)

        _LLTOK[key] = (tokenizer, llguidance.LLTokenizer(Wrapper(), n_vocab=n_vocab,
                                                        eos_token=sorted(tokenizer.eog_ids)))
    return _LLTOK[key][1]


def grammar(response_format) -> str | None:
    """The llguidance grammar of an OpenAI response_format (None: free text). Raises FormatError."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise FormatError("'response_format' must be an object")
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    try:
        import llguidance
    except ImportError:
        raise FormatError("structured output needs llguidance: pip install 'lowbit[server]'") from None
    if kind == "json_object":
        schema = {"type": "object"}
    elif kind == "json_schema":
        js = response_format.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
            raise FormatError("'response_format.json_schema' must be an object with a 'schema' object")
        schema = js.get("schema", {})
    else:
        raise FormatError(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', not {kind!r}")
    try:
        # compact separators: no free runs of whitespace between the values
        g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides={"whitespace_flexible": False})
    except ValueError as e:
        raise FormatError(f"'response_format': {e}") from None
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(g)
    if is_error:
        raise FormatError(f"'response_format': the schema cannot be followed: {msgs[0] if msgs else '?'}")
    return g


class Constraint:
    """One request's matcher: mask(logits) before sampling, accept(token) after."""

    def __init__(self, tokenizer, n_vocab: int, grammar_text: str):
        import llguidance
        self.n_vocab = n_vocab
        self.m = llguidance.LLMatcher(_lltokenizer(tokenizer, n_vocab), grammar_text, log_level=0)
        if self.m.is_error():
            raise FormatError(f"'response_format': {self.m.get_error()}")
        self._next = None  # a Future of _allowed() for the next token (prefetch)

    def _allowed(self) -> tuple[bool, np.ndarray]:
        """(True, allowed ids) or (False, ruled-out ids): whichever list is shorter."""
        a = np.frombuffer(self.m.compute_logit_bias(), dtype=np.uint8)[:self.n_vocab]
        ok = np.flatnonzero(a)
        if ok.size <= self.n_vocab // 2:
            return True, ok
        bad = np.flatnonzero(a == 0)
        return False, np.concatenate([bad, np.arange(a.size, self.n_vocab)]) if a.size < self.n_vocab else bad

    def prefetch(self, pool) -> None:
        """Start computing the next token's mask on `pool` (an executor) while the forward runs."""
        self._next = pool.submit(self._allowed)

    def mask(self, logits: np.ndarray) -> None:
        """Disallowed tokens' logits to -inf, in place."""
        keep, ids = self._next.result() if self._next is not None else self._allowed()
        self._next = None
        if keep:
            kept = logits[ids]
            logits.fill(-np.inf)
            logits[ids] = kept
        else:
            logits[ids] = -np.inf

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of tokens, in order, the grammar takes from here (nothing is consumed): a
        speculative draft is cut there before it is verified."""
        if self._next is not None:  # (the prefetch reads the matcher: let it finish first)
            self._next.result()
        return self.m.validate_tokens(tokens) if tokens else 0

    def advance(self, token: int, logits: np.ndarray) -> None:
        """A speculative window's next row: take the accepted draft `token` (the row before was
        verified with it), then mask `logits`, the row after it. Computed here, on the engine
        thread (no prefetch: whether the row is needed shows only as the window is verified)."""
        self.accept(token)
        self.mask(logits)

    def accept(self, token: int) -> None:
        if self._next is not None:  # (never while a prefetch runs: mask() came first)
            self._next.result()
            self._next = None
        self.m.consume_token(token)

    @property
    def finished(self) -> bool:
        """The grammar can take nothing more (the output is complete)."""
        return self.m.is_stopped()

    @property
    def error(self) -> str | None:
        return self.m.get_error() if self.m.is_error() else None
