"""The prefix cache: KV of token blocks shared across requests and chat turns (as vLLM's
automatic prefix caching does), least recently used blocks evicted first within a byte budget.

A sequence's tokens split into blocks of BLOCK tokens. Block i is keyed by (its parent block's
id, its own tokens): the key names the whole prefix up to the block's end, exactly (a tuple of
token ids, no hash that could collide), so two prompts share a block only if they share every
token before its end. A block holds the KV of its positions for every layer, copied out of a
slot by Engine.kv_copy and copied back into another slot for a later request with that prefix.
The bytes are the cache's own (half or float32), copied unchanged, and a token's KV depends only
on the tokens before it (I8: not on how the prompt was chunked), so a request served from the
cache gets bitwise the logits it would get computing its whole prompt.

At least the prompt's last token is always computed (its logits give the first sampled token),
so a prompt reuses at most (len - 1) // BLOCK blocks. Every use touches a chain from its leaf up
to the root, so a parent is never older than its children and eviction (oldest first) takes
leaves; if an evicted block still had children (it cannot, but cheaply so), they go too.

Hybrid models (recurrent layers: qwen35, qwen35moe, qwen3next, lfm2, lfm2moe): a slot's state at position p
is its KV up to p and the conv + delta-net state after token p-1, which no KV block holds. A
block may therefore carry a snapshot of that recurrent state at its end (Engine.rstate_copy,
rstate_bytes each: far larger than a block's KV, so kept only where a later request can use it:
snapshot_points, and a finished reply's last whole block: the scheduler copies the state out
as a reply passes each block end, and hands the last copy to store(snapshot=...) with the reply's
KV, so the next chat turn resumes after the reply), counted in the budget and evicted with its
block. A hybrid lookup takes the longest cached chain that ends at a block with a snapshot and
loads its KV and that state: the slot is then exactly as if it had computed the prefix (the state
is bitwise the same however the tokens were chunked, as Model.rewind relies on), so outputs stay
bitwise those without a cache.

Only the engine thread calls load / store; stats() may be read from any thread.
"""
from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field

import numpy as np

BLOCK = 32  # tokens per block


@dataclass(eq=False)
class _Block:
    id: int
    key: tuple                     # (parent id, tokens of this block)
    kv: np.ndarray                 # uint8[Engine.kv_bytes(BLOCK)]
    parent: tuple | None           # the parent block's key (None: a first block)
    children: set = field(default_factory=set)   # keys of child blocks
    state: np.ndarray | None = None  # hybrid models: the recurrent state after the block's last
    #                                  token (uint8[Engine.rstate_bytes()]), or None


class PrefixCache:
    def __init__(self, model, capacity_bytes: int, block: int = BLOCK, replies: bool = True):
        """replies (hybrid models): keep a finished reply's state at its last whole block (the
        scheduler reads it; False only to measure what it saves)."""
        if block < 1:
            raise ValueError("prefix cache: block must be >= 1")
        self.model, self.block = model, int(block)
        self.capacity = int(capacity_bytes)
        self.block_bytes = int(model.engine.kv_bytes(self.block))
        self.hybrid = bool(getattr(model.engine, "hybrid", False))
        self.replies = self.hybrid and bool(replies)
        self.state_bytes = int(model.engine.rstate_bytes()) if self.hybrid else 0
        self.bytes = 0  # the blocks' KV and snapshots held
        self.snapshots = 0  # blocks holding a recurrent state
        self._blocks: collections.OrderedDict[tuple, _Block] = collections.OrderedDict()  # oldest first
        self._ids = itertools.count(1)  # 0: the root (the empty prefix)
        self.lookups = self.hits = self.hit_tokens = self.inserted = self.evicted = 0

    def stats(self) -> dict:
        return {"lookups": self.lookups, "hits": self.hits, "hit_tokens": self.hit_tokens,
                "inserted_blocks": self.inserted, "evicted_blocks": self.evicted, "blocks": len(self._blocks),
                "bytes": self.bytes, "capacity_bytes": self.capacity, "snapshots": self.snapshots}

    def _chain(self, tokens: list[int], n_blocks: int) -> list[_Block]:
        """The cached blocks of tokens' first n_blocks blocks, from the root, up to the first miss."""
        chain, parent, B = [], 0, self.block
        for i in range(n_blocks):
            b = self._blocks.get((parent, tuple(tokens[i * B:(i + 1) * B])))
            if b is None:
                break
            chain.append(b)
            parent = b.id
        return chain

    def _touch(self, chain: list[_Block]) -> None:
        for b in reversed(chain):  # leaf first: the root ends up the most recent
            self._blocks.move_to_end(b.key)

    def load(self, tokens: list[int], slot: int) -> int:
        """Copy the longest cached prefix of tokens (whole blocks, leaving at least one token to
        compute) into `slot`, after what it already holds (nothing, or a whole-block prefix of
        tokens: a request that waited for another to compute their shared prefix); returns the
        positions copied (0: a miss)."""
        m, B = self.model, self.block
        held = m.slot_pos[slot]
        if held % B or m.slot_tokens[slot][:held] != list(tokens[:held]):
            raise ValueError(f"prefix cache: slot {slot} holds something other than a whole-block prefix")
        self.lookups += 1
        chain = self._chain(tokens, (len(tokens) - 1) // B) if self.capacity > 0 else []
        if self.hybrid:  # up to the last block with the recurrent state at its end
            while chain and chain[-1].state is None:
                chain.pop()
        if len(chain) <= held // B:
            return 0
        for i in range(held // B, len(chain)):
            m.engine.kv_copy(slot, i * B, B, chain[i].kv, False)
        if self.hybrid:
            m.engine.rstate_copy(slot, chain[-1].state, False)
        n = len(chain) * B
        m.slot_pos[slot] = n  # the slot now holds these positions (Model's per-slot bookkeeping)
        m.slot_tokens[slot][held:] = tokens[held:n]
        self._touch(chain)
        self.hits += 1
        self.hit_tokens += n - held
        return n - held

    def snapshot_points(self, tokens: list[int], loaded: int) -> list[int]:
        """Hybrid models: the positions (block ends, > loaded) at which a prompt being computed
        should leave its recurrent state (store(state=True) there), where a later request can
        use it: the end of the cached KV chain it shares with an earlier prompt (where prompts
        branch, as a shared system prompt's end) and its own last whole block before its last
        token (the same prompt again, or the next chat turn). [] for other models."""
        if not self.hybrid or self.capacity <= 0:
            return []
        B = self.block
        whole = (len(tokens) - 1) // B
        shared = len(self._chain(tokens, whole)) * B
        return sorted({p for p in (shared, whole * B) if p > loaded})

    def store(self, slot: int, upto: int | None = None, state: bool = False,
              snapshot: tuple[int, np.ndarray] | None = None) -> int:
        """Keep the whole blocks of `slot`'s positions [0, upto) (default: all it holds) that
        are not cached yet; returns the blocks added. state (hybrid models): also keep the
        slot's recurrent state in the block ending at its current position (which must be a
        block end within upto, the engine's state being there). snapshot (hybrid models): (pos,
        state) the slot's recurrent state taken earlier at pos, a block end within upto whose
        tokens the slot still holds (a reply's last whole block: the engine has moved on since);
        the block ending there adopts the array (no copy) unless it has a state already. Evicts
        the least recently used beyond the budget (a chain longer than the budget keeps its
        first blocks)."""
        if self.capacity < self.block_bytes:
            return 0
        m, B = self.model, self.block
        held = m.slot_pos[slot] if upto is None else min(upto, m.slot_pos[slot])
        tokens = m.slot_tokens[slot]
        n_blocks = held // B
        chain = self._chain(tokens, n_blocks)
        added = 0
        parent = chain[-1].id if chain else 0
        for i in range(len(chain), n_blocks):
            key = (parent, tuple(tokens[i * B:(i + 1) * B]))
            kv = np.empty(self.block_bytes, np.uint8)
            m.engine.kv_copy(slot, i * B, B, kv, True)
            b = _Block(next(self._ids), key, kv, chain[-1].key if chain else None)
            if chain:
                chain[-1].children.add(key)
            self._blocks[key] = b
            self.bytes += self.block_bytes
            chain.append(b)
            parent = b.id
            added += 1
        self.inserted += added
        at = m.slot_pos[slot]
        if state and self.hybrid and 0 < at <= held and at % B == 0 and m.engine.rstate_pos(slot) == at:
            b = chain[at // B - 1]
            if b.state is None:
                b.state = np.empty(self.state_bytes, np.uint8)
                m.engine.rstate_copy(slot, b.state, True)
                self._add_state(b, b.state)
        if snapshot is not None and self.hybrid:
            pos, st = snapshot
            if 0 < pos <= held and pos % B == 0 and st.size == self.state_bytes and chain[pos // B - 1].state is None:
                self._add_state(chain[pos // B - 1], st)
        self._touch(chain)
        while self._blocks and self.bytes > self.capacity:
            self._evict(next(iter(self._blocks)))
        return added

    def _add_state(self, b: _Block, state: np.ndarray) -> None:
        b.state = state
        self.bytes += self.state_bytes
        self.snapshots += 1

    def _evict(self, key: tuple) -> None:
        b = self._blocks.pop(key, None)
        if b is None:
            return
        self.evicted += 1
        self.bytes -= self.block_bytes
        if b.state is not None:
            self.bytes -= self.state_bytes
            self.snapshots -= 1
        for c in list(b.children):
            self._evict(c)
        p = self._blocks.get(b.parent) if b.parent is not None else None
        if p is not None:
            p.children.discard(key)

    def clear(self) -> None:
        self._blocks.clear()
        self.bytes = self.snapshots = 0
