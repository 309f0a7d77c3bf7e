"""Multi-sequence engine: KV slots and one batched forward over tokens of several sequences.

The contract the server relies on: a sequence's logits in a mixed batch (other sequences'
decode tokens and prompt chunks beside it, in any slot) are bitwise identical to running that
sequence alone through the single-sequence forward; rewinding one slot leaves the others alone.
"""
import numpy as np
import pytest

import lowbit
from lowbit.synth import synth_dense


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def path(request, tmp_path_factory):
    p = tmp_path_factory.mktemp("batch") / f"{request.param}.gguf"
    return synth_dense(p, arch=request.param, layers=2, dim=128, ffn=256, heads=4, kv_heads=2, ctx=512,
                       wtype="Q4_0" if request.param == "llama" else "Q8_0", seed=3)


@pytest.fixture(scope="module")
def model(path):
    return lowbit.load(path, n_ctx=256, threads=2, n_slots=4)


def alone(model, ids, chunk=None):
    """Every position's logits of ids, run alone in slot 0 (in chunks of `chunk`, default: one
    token at a time, as decode runs)."""
    model.reset()
    chunk = chunk or 1
    return np.concatenate([model.forward(ids[i:i + chunk], all_logits=True) for i in range(0, len(ids), chunk)])


def seqs(rng, n, lo=5, hi=40):
    return [[int(t) for t in rng.integers(0, 49152, size=int(rng.integers(lo, hi)))] for _ in range(n)]


def test_mixed_batch_bitwise_equals_alone(model, rng):
    """Three sequences in slots 3, 1, 2 (slot 0 is the reference's): each step runs one prompt
    chunk of uneven size for some and one decode token for others, all in one forward."""
    ids = seqs(rng, 3)
    refs = [alone(model, s) for s in ids]
    slots = [3, 1, 2]
    for s in slots:
        model.rewind(0, slot=s)
    got = [[] for _ in ids]
    done = [0, 0, 0]
    step = 0
    while any(d < len(s) for d, s in zip(done, ids)):
        batch, who = [], []
        for i, s in enumerate(ids):
            if done[i] >= len(s):
                continue
            # sequence i takes chunks of 1, 3, 7, ... tokens: prompt chunks beside decode tokens
            n = 1 if (step + i) % 2 else min(len(s) - done[i], 1 + 2 * ((step + i) % 4))
            batch.append((slots[i], s[done[i]:done[i] + n]))
            who.append(i)
        outs = model.forward_batch(batch, all_logits=True)
        for i, (slot, run), lg in zip(who, batch, outs):
            assert lg.shape == (len(run), model.config.vocab)
            got[i].append(lg)
            done[i] += len(run)
        step += 1
    for i, s in enumerate(ids):
        mine = np.concatenate(got[i])
        assert np.array_equal(mine, refs[i]), f"sequence {i}: batched logits differ from alone"
        assert model.slot_pos[slots[i]] == len(s)
        assert model.slot_tokens[slots[i]] == s


def test_last_logits_only_and_prefill_chunk_in_batch(model, rng):
    """all_logits=False gives each run's last token's logits, equal to the alone run's."""
    a, b = seqs(rng, 2, 10, 20)
    ra, rb = alone(model, a), alone(model, b)
    model.rewind(0, slot=1)
    model.rewind(0, slot=2)
    # a's whole prompt beside b's first token, then a decode token of each
    la, lb = model.forward_batch([(1, a[:-1]), (2, b[:1])])
    assert la.shape == (1, model.config.vocab)
    assert np.array_equal(la[0], ra[len(a) - 2]) and np.array_equal(lb[0], rb[0])
    la, lb = model.forward_batch([(2, b[1:]), (1, a[-1:])])
    assert np.array_equal(la[0], rb[-1]) and np.array_equal(lb[0], ra[-1])


def test_rewind_one_slot_keeps_the_others(model, rng):
    a, b, a2 = seqs(rng, 3, 12, 20)
    ra, rb = alone(model, a), alone(model, b)
    cut = 6
    r_new = alone(model, a[:cut] + a2)  # a rewound to `cut`, then continued with a2
    for s in (1, 2):
        model.rewind(0, slot=s)
    model.forward_batch([(1, a), (2, b[:8])])
    model.rewind(cut, slot=1)
    assert model.slot_pos[1] == cut and model.slot_tokens[1] == a[:cut] and model.slot_pos[2] == 8
    outs = model.forward_batch([(1, a2), (2, b[8:])], all_logits=True)
    assert np.array_equal(outs[0], r_new[cut:])
    assert np.array_equal(outs[1], rb[8:])
    with pytest.raises(ValueError, match="cannot rewind"):
        model.rewind(model.slot_pos[1] + 1, slot=1)
    with pytest.raises(ValueError, match="slot"):
        model.rewind(0, slot=4)
    del ra


def test_single_sequence_api_is_slot_zero(model, rng):
    """forward/rewind/pos are slot 0's: a forward_batch on slot 0 continues what forward did."""
    a = seqs(rng, 1, 10, 12)[0]
    ra = alone(model, a)
    model.reset()
    model.forward(a[:4])
    assert model.pos == 4 and model.slot_pos[0] == 4 and model.tokens == a[:4]
    (lg,) = model.forward_batch([(0, a[4:])], all_logits=True)
    assert np.array_equal(lg, ra[4:]) and model.pos == len(a)


def test_bad_batches_are_value_errors(model):
    model.rewind(0, slot=1)
    with pytest.raises(ValueError, match="twice"):
        model.forward_batch([(1, [1]), (1, [2])])
    with pytest.raises(ValueError, match="outside"):
        model.forward_batch([(7, [1])])
    with pytest.raises(ValueError, match="no tokens"):
        model.forward_batch([(1, [])])
    with pytest.raises(ValueError, match="context full"):
        model.forward_batch([(1, [1] * (model.n_ctx + 1))])
    with pytest.raises(ValueError, match="vocabulary"):
        model.forward_batch([(1, [1 << 20])])
    assert model.slot_pos[1] == 0  # a rejected batch changes nothing
    # the native call checks what Python would not: duplicate (slot, position) pairs
    e = model.engine
    z = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="two tokens at position 0 of slot 0"):
        e.forward_batch(z, z, z, np.array([1], np.int32), np.empty((1, model.config.vocab), np.float32))
    with pytest.raises(ValueError, match="output row"):
        e.forward_batch(z[:1], z[:1], z[:1], np.array([3], np.int32), np.empty((1, model.config.vocab), np.float32))


def test_n_slots_must_be_positive(path):
    with pytest.raises(ValueError, match="n_slots"):
        lowbit.load(path, n_ctx=16, n_slots=0)


def test_prompt_attention_blocks_bitwise_equal_one_token_at_a_time(tmp_path):
    """A prompt chunk's attention runs blocks of up to 16 tokens x a GQA group's heads as the query
    rows of one shared-rows kernel call (Engine::attention), fewer tokens per block when the scores
    would pass 1 MB (here 16 heads per KV head: 8 tokens per block past 1024 positions, 5 past
    3277). A token's logits must be bitwise those of the token run alone, whatever block, chunk
    or thread count it ran in (I2, I3, I8)."""
    p = synth_dense(tmp_path / "g16.gguf", layers=2, dim=128, ffn=256, heads=16, kv_heads=1, ctx=4096,
                    wtype="Q8_0", seed=5)
    m = lowbit.load(p, n_ctx=3400, threads=2)
    ids = [int(t) for t in np.random.default_rng(7).integers(0, 49152, size=3350)]
    one = alone(m, ids)
    for chunk in (256, 61):
        got = alone(m, ids, chunk)
        bad = np.flatnonzero((got != one).any(axis=1))
        assert bad.size == 0, f"chunk {chunk}: positions {bad[:8]} differ from one token at a time"
    m1 = lowbit.load(p, n_ctx=3400, threads=1)
    assert np.array_equal(alone(m1, ids, 1000), one)


def test_kv_on_huge_pages_gives_the_same_logits():
    """The KV cache goes on 2 MB pages where a slot's K or V takes >= 8 MB (csrc/engine.cpp): the
    default model at n_ctx 2048 (23 MB a slot's K) against n_ctx 256 (3 MB: 4 KB pages), a batch over
    four slots with a prompt chunk and decode tokens each, then one more step: bitwise the same
    logits, whichever mapping (an offset or a slot stride wrong in the aligned mapping would not be)."""
    path = lowbit.model.default_model_path()
    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(0, 49152, size=n)] for n in (9, 30, 17, 5)]
    out = []
    for ctx in (2048, 256):
        m = lowbit.load(path, n_ctx=ctx, threads=2, n_slots=4)
        first = m.forward_batch([(s, p) for s, p in enumerate(prompts)], all_logits=True)
        step = m.forward_batch([(s, [int(7 + 3 * s)]) for s in range(4)])
        out.append(np.concatenate(first + step))
        del m
    assert np.array_equal(out[0].view(np.uint32), out[1].view(np.uint32))


def test_prefetch_modes_give_the_same_logits(monkeypatch):
    """The row kernels' weight prefetch (LOWBIT_PREFETCH: l1 4 KB ahead towards L1, or off;
    csrc/x86/prefetch.h) changes what the caches hold, never a value: a prompt chunk and batched
    decode steps give bitwise the same logits in each mode, and each model states its mode (auto:
    off only where the weights exceed the L3 cache)."""
    path = lowbit.model.default_model_path()
    rng = np.random.default_rng(12)
    prompts = [[int(t) for t in rng.integers(0, 49152, size=n)] for n in (21, 3)]
    out = {}
    for mode in ("l1", "off", "auto"):
        monkeypatch.setenv("LOWBIT_PREFETCH", mode)
        m = lowbit.load(path, n_ctx=256, threads=2, n_slots=2)
        want = mode if mode != "auto" else ("measure" if m.file_bytes() > lowbit.model.l3_cache_bytes() > 0 else "l1")
        assert m.prefetch[0] == want, m.prefetch
        if want != "measure":
            assert m.engine.prefetch() == lowbit.model.PREFETCH_MODES.index(want) and m.prefetch_state() == want
        first = m.forward_batch([(s, p) for s, p in enumerate(prompts)], all_logits=True)
        steps = [m.forward_batch([(s, [int(5 + 11 * s + k)]) for s in range(2)]) for k in range(3)]
        out[mode] = np.concatenate(first + [x for st in steps for x in st])
        del m
    for mode in ("off", "auto"):
        assert np.array_equal(out[mode].view(np.uint32), out["l1"].view(np.uint32)), mode
    monkeypatch.setenv("LOWBIT_PREFETCH", "l2")
    with pytest.raises(ValueError, match="LOWBIT_PREFETCH must be auto, l1, off or measure"):
        lowbit.load(path, n_ctx=64, threads=1)


def test_prefetch_measured_on_the_models_own_forwards(monkeypatch):
    """LOWBIT_PREFETCH=measure (auto's choice for a model above the L3 cache): the one-token
    forwards after the first kMeasureSkip alternate off and l1, timed, kMeasureEach each; then the
    mode with the lower median stays. Multi-token forwards are not timed; no logit changes."""
    path = lowbit.model.default_model_path()
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 49152, size=24)]
    monkeypatch.setenv("LOWBIT_PREFETCH", "l1")
    ref = lowbit.load(path, n_ctx=256, threads=2)
    want = [ref.forward(ids[:5])[-1]] + [ref.forward([t])[-1] for t in ids[5:]]
    monkeypatch.setenv("LOWBIT_PREFETCH", "measure")
    m = lowbit.load(path, n_ctx=256, threads=2)
    e = m.engine
    assert m.prefetch[0] == "measure" and e.prefetch_measuring and e.prefetch() == 1
    got = [m.forward(ids[:5])[-1]]  # (a prompt chunk: not timed)
    assert e.prefetch_trials == [] and "measuring (0 of" in m.prefetch_state()
    modes = []
    for t in ids[5:]:
        got.append(m.forward([t])[-1])
        modes.append(e.prefetch())
    each, skip = e.prefetch_measure_each, e.prefetch_measure_skip
    trials = e.prefetch_trials
    assert [c for c, _ in trials] == [0, 1] * each, trials  # off, l1, off, ... after the skipped ones
    assert modes[:skip] == [1] * skip and modes[skip:skip + 2 * each - 1] == ([0, 1] * each)[:-1] and not e.prefetch_measuring
    med = {c: float(np.median([s for k, s in trials if k == c])) for c in (0, 1)}
    assert e.prefetch() == (0 if med[0] < med[1] else 1)
    assert np.allclose(e.prefetch_medians, (med[0], med[1]), rtol=1e-12, atol=0)  # (what the state shows)
    assert all(m2 == e.prefetch() for m2 in modes[skip + 2 * each:])
    st = m.prefetch_state()
    assert st.startswith(lowbit.model.PREFETCH_MODES[e.prefetch()] + " (measured") and "median off" in st
    for g, w in zip(got, want):
        assert np.array_equal(g.view(np.uint32), w.view(np.uint32))
    # a pipeline stage (forward_layers, not forward_batch) measures its own layers the same way
    st = lowbit.model.Model(path, n_ctx=256, threads=2, n_slots=1, layers=(0, 10))
    assert st.prefetch[0] == "measure" and st.engine.prefetch_measuring
    z = np.zeros(1, np.int32)
    out = np.empty((1, st.config.dim), np.float32)
    for p, t in enumerate(ids[:skip + 2 * each]):
        st.engine.forward_layers(np.array([t], np.int32), z, np.array([p], np.int32), None, out, z, None)
    assert not st.engine.prefetch_measuring and len(st.engine.prefetch_trials) == 2 * each
