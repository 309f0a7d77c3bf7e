"""llama.cpp (llama-cpp-python) as the end-to-end reference of the engine tests."""
import numpy as np


def llama_greedy(llm, prompt_ids, n):
    """llama.cpp's greedy continuation of prompt_ids by n tokens, and its logits at every
    position of prompt + continuation: (ids, float32[len(ids), vocab])."""
    llm.reset()
    llm.eval(prompt_ids)
    ids = list(prompt_ids)
    for _ in range(n):
        tok = int(np.argmax(llm.scores[len(ids) - 1]))
        ids.append(tok)
        llm.eval([tok])
    return ids, np.array(llm.scores[: len(ids)])


def llama_perplexity(llm, text: str, ctx: int) -> tuple[float, int]:
    """llama.cpp's perplexity of `text` by lowbit.perplexity's method (chunks of ctx tokens, the
    second half of each scored, chunk_nll's arithmetic on llama.cpp's logits): (ppl, tokens)."""
    import numpy as np

    from lowbit.perplexity import chunk_nll
    toks = llm.tokenize(text.encode(), add_bos=False)
    nll, count = 0.0, 0
    for c in range(len(toks) // ctx):
        chunk = toks[c * ctx:(c + 1) * ctx]
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:ctx])
        nll += chunk_nll(logits[ctx // 2:ctx - 1], np.asarray(chunk[ctx // 2 + 1:])).sum()
        count += ctx - 1 - ctx // 2
    return float(np.exp(nll / count)), count


def perplexity_matches(path, n_ctx: int, llm, name: str = "") -> None:
    """lowbit's perplexity of the package's passage (chunks of 128, the model of path) is within
    0.5% of llama.cpp's (llm, loaded from the same file), over the same >= 100 tokens."""
    import os

    import lowbit
    from lowbit.perplexity import perplexity
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    ours, n = perplexity(lowbit.load(path, n_ctx=n_ctx, threads=2), text, ctx=128, progress=False)
    theirs, count = llama_perplexity(llm, text, 128)
    print(f"\n{name} perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert count == n and n >= 100 and abs(ours - theirs) <= 0.005 * theirs


def load_with(monkeypatch, path, n_ctx: int, threads: int = 2, **changes):
    """lowbit's model of `path` with some ModelConfig fields replaced (dataclasses.replace): one
    feature done wrong, for the tests that show each feature moves the logits."""
    import dataclasses

    import lowbit
    from lowbit.model import ModelConfig
    real = ModelConfig.from_gguf
    monkeypatch.setattr(ModelConfig, "from_gguf", classmethod(lambda cls, f: dataclasses.replace(real(f), **changes)))
    try:
        return lowbit.load(path, n_ctx=n_ctx, threads=threads)
    finally:
        monkeypatch.setattr(ModelConfig, "from_gguf", real)


ROUTE_TIE = 1e-3  # router margin below which float noise decides an MoE routing (tests/test_moe.py)


def forced_logits(m, run, tie: float = ROUTE_TIE):
    """Teacher-forced: lowbit's logits over run = (ids, llama.cpp's logits from llama_greedy),
    llama.cpp's, and the mask of the positions to judge: llama.cpp's top-2 margin >= 0.1 and, in
    an MoE model, no routing near-tie (< tie) in lowbit's router at any layer."""
    ids, ref = run
    m.reset()
    ours = m.forward(ids, all_logits=True)
    top2 = np.sort(ref, 1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] >= 0.1
    c = m.config
    for layer in range(c.n_dense_lead, c.n_layer if c.n_expert else 0):
        clear &= np.array(m.engine.last_route_margins(layer)) >= tie
    return ours, ref, clear


def features_matter(monkeypatch, path, n_ctx: int, run, wrong: dict, tie: float = ROUTE_TIE):
    """lowbit's model of path matches llama.cpp's logits (max |diff| < 0.5 at the judged positions
    of forced_logits), and each feature done wrong (wrong: what -> ModelConfig changes, load_with)
    moves them by > 0.5 at the positions judged in both. Returns the right model and its logits."""
    import lowbit
    m = lowbit.load(path, n_ctx=n_ctx, threads=2)
    ours, ref, clear = forced_logits(m, run, tie)
    good = float(np.abs(ours - ref)[clear].max())
    assert good < 0.5, f"max |diff| {good:.3f} where it should match"
    for what, changes in wrong.items():
        bad_logits, _, bad_clear = forced_logits(load_with(monkeypatch, path, n_ctx, **changes), run, tie)
        bad = float(np.abs(bad_logits - ref)[clear & bad_clear].max())
        assert bad > 0.5, f"{what}: max |diff| {bad:.3f}: the change is not seen"
    return m, ours


def compare_top1(m, run, tie: float = ROUTE_TIE):
    """(lowbit's logits, llama.cpp's, positions judged, top-1 agreements there): forced_logits."""
    ours, ref, clear = forced_logits(m, run, tie)
    return ours, ref, int(clear.sum()), int((ours.argmax(1) == ref.argmax(1))[clear].sum())


def lookup_spec_is_plain_greedy(m):
    """Prompt-lookup speculative decoding on m (a hybrid model: its rewinds restore the recurrent
    state) gives token for token m's plain greedy text, and at least one draft was rejected (a
    rewind really ran)."""
    prompt = "the cat sat on the mat, the cat sat on the mat, the cat sat on the"
    plain = list(m.generate(prompt, max_tokens=32))
    rewinds = []
    real = m.rewind
    m.rewind = lambda pos, slot=0: (rewinds.append(m.slot_pos[slot] - pos), real(pos, slot))
    spec = list(m.generate(prompt, max_tokens=32, draft="lookup", spec=4))
    assert "".join(spec) == "".join(plain)
    assert any(r > 0 for r in rewinds), "no draft was rejected: the test did not exercise a rewind"


def hybrid_chunks_threads_batches_bitwise(path):
    """A hybrid model's token logits do not depend on how its prompt was chunked (1, 5, all), on
    the thread count, or on another slot sharing its batch (I8): each slot's recurrent state takes
    its tokens in order, whatever the window."""
    import lowbit
    m2 = lowbit.load(path, n_ctx=64, threads=2, n_slots=2)
    ids = m2.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole, filled with the "
                      "ends of worms and an oozy smell")[:24]
    assert len(ids) == 24
    whole = m2.logits(ids, chunk=24)
    assert np.array_equal(m2.logits(ids, chunk=5), whole)
    assert np.array_equal(m2.logits(ids, chunk=1), whole)
    assert np.array_equal(lowbit.load(path, n_ctx=64, threads=1).logits(ids, chunk=24), whole)
    m2.reset()
    other = ids[::-1]
    a, b = m2.forward_batch([(0, ids[:12]), (1, other[:12])], all_logits=True)
    assert np.array_equal(a, whole[:12])
    a, b2 = m2.forward_batch([(0, ids[12:]), (1, other[12:])], all_logits=True)
    assert np.array_equal(a, whole[12:])
    m2.rewind(0, slot=1)
    assert np.array_equal(np.concatenate([b, b2]), m2.forward_batch([(1, other)], all_logits=True)[0])
