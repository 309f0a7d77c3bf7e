"""llama.cpp (llama-cpp-python) as the end-to-end reference of the engine tests."""
import numpy as np


PROMPT = b"Once upon a time, in a small village by the sea, the quick brown fox"


def synth_files(tmp_path_factory, kind: str, synth, files: dict) -> dict:
    """{name: path} of synth(dir / "<name>.gguf", **files[name]) for every name, in a fresh directory."""
    d = tmp_path_factory.mktemp(kind)
    return {k: synth(d / f"{k}.gguf", **v) for k, v in files.items()}


def family_fixtures(kind: str, synth, files: dict, n_ctx: int):
    """A family test module's two module-scoped fixtures: paths ({name: synth(dir / "<name>.gguf",
    **files[name])}) and case, per file (name, path, llama.cpp's greedy run of it: ids, logits).
    Use: `paths, case = family_fixtures("lfm2", synth_lfm2, FILES, N_CTX)`."""
    import pytest

    @pytest.fixture(scope="module")
    def paths(tmp_path_factory):
        return synth_files(tmp_path_factory, kind, synth, files)

    @pytest.fixture(scope="module", params=sorted(files))
    def case(request, paths):
        return request.param, paths[request.param], peer_greedy(paths[request.param], n_ctx)
    return paths, case


def peer_llama(path, n_ctx: int):
    """llama.cpp (lowbit.peer, its crash-safe configuration) on path with every position's logits, 1 thread."""
    from lowbit import peer
    return peer.Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=1)


def peer_greedy(path, n_ctx: int, n: int = 540):
    """llama.cpp's greedy run of n tokens after PROMPT on path (llama_greedy: ids, logits)."""
    llm = peer_llama(path, n_ctx)
    return llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), n)


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


def perplexity_matches(path, n_ctx: int, llm, name: str = "", tol: float = 0.005) -> None:
    """lowbit's perplexity of the package's passage (chunks of 128, the model of path) is within
    tol (0.5%) of llama.cpp's (llm, loaded from the same file), over the same >= 100 tokens."""
    import os

    import lowbit
    from lowbit.perplexity import perplexity
    text = open(os.path.join(os.path.dirname(lowbit.__file__), "data", "passage.txt"), encoding="utf-8").read()
    ours, n = perplexity(lowbit.load(path, n_ctx=n_ctx, threads=2), text, ctx=128, progress=False)
    theirs, count = llama_perplexity(llm, text, 128)
    print(f"\n{name} perplexity lowbit {ours:.4f} llama.cpp {theirs:.4f} ({n} tokens)")
    assert count == n and n >= 100 and abs(ours - theirs) <= tol * theirs


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
        if (c.layer_parts and c.layer_parts[layer] != 2) or not c.moe_at(layer):  # (nemotron_h_moe: a mixer
            # layer routes nothing; jamba: nor does a dense one)
            continue
        clear &= np.array(m.engine.last_route_margins(layer)) >= tie
    return ours, ref, clear


def features_matter(monkeypatch, path, n_ctx: int, run, wrong: dict, tie: float = ROUTE_TIE, match: float | None = 0.5):
    """lowbit's model of path matches llama.cpp's logits (max |diff| < 0.5 at the judged positions
    of forced_logits), and each feature done wrong (wrong: what -> ModelConfig changes, load_with)
    moves them by > 0.5 at the positions judged in both. Returns the right model and its logits.
    match None: the right model's max |diff| is not bounded here (an MoE whose routing flips just
    past the tie bound move later positions through attention; its top-1 test judges its parity)."""
    import lowbit
    m = lowbit.load(path, n_ctx=n_ctx, threads=2)
    ours, ref, clear = forced_logits(m, run, tie)
    good = float(np.abs(ours - ref)[clear].max())
    assert match is None or good < match, f"max |diff| {good:.3f} where it should match"
    for what, changes in wrong.items():
        bad_logits, _, bad_clear = forced_logits(load_with(monkeypatch, path, n_ctx, **changes), run, tie)
        bad = float(np.abs(bad_logits - ref)[clear & bad_clear].max())
        assert bad > 0.5, f"{what}: max |diff| {bad:.3f}: the change is not seen"
    return m, ours


def top1_matches(case, n_ctx: int, tie: float = ROUTE_TIE, least: float = 0.5) -> None:
    """A family test's case (name, path, llama.cpp's greedy run): lowbit's teacher-forced top-1 agrees
    with llama.cpp's at >= 99% of the judged positions (forced_logits), which are >= `least` of all."""
    import lowbit
    name, path, run = case
    ours, ref, counted, agree = compare_top1(lowbit.load(path, n_ctx=n_ctx, threads=2), run, tie)
    print(f"\n{name}: top-1 {agree}/{counted}, max |logit diff| {np.abs(ours - ref).max():.4f}")
    assert counted >= least * len(ref) and agree >= 0.99 * counted


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


def load_edited(monkeypatch, path, **meta):
    """lowbit.load(path) with metadata keys replaced (None: removed) as the file is read."""
    import lowbit
    from lowbit.gguf import GGUFFile
    real = GGUFFile.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        for key, v in meta.items():
            self.metadata.pop(key, None) if v is None else self.metadata.__setitem__(key, v)
    monkeypatch.setattr(GGUFFile, "__init__", init)
    try:
        return lowbit.load(str(path), n_ctx=32)
    finally:
        monkeypatch.setattr(GGUFFile, "__init__", real)


def rstate(m, slot=0):
    """A copy of the slot's recurrent state (engine.rstate_copy's bytes)."""
    buf = np.empty(m.engine.rstate_bytes(), np.uint8)
    m.engine.rstate_copy(slot, buf, True)
    return buf


def rewinds_restore_the_state_exactly(path, state_bytes: int):
    """A hybrid model's rewinds (the checkpoint, the replay log of a 2..8-token call, a replay from the
    start) give bitwise the recurrent state of never having gone ahead, and the same logits after;
    the state is state_bytes bytes (its layout's size, from the model's shapes)."""
    import lowbit
    m = lowbit.load(path, n_ctx=64, threads=2, n_slots=2)
    ids = m.tokenize("In a hole in the ground there lived a hobbit, not a nasty dirty wet hole, filled with the ends "
                     "of worms and an oozy smell, nor yet a dry, bare, sandy hole")[:32]
    assert len(ids) == 32 and m.engine.rstate_bytes() == state_bytes

    def fresh(n):  # slot 1 runs ids[:n] from nothing
        m.rewind(0, slot=1)
        m.forward_batch([(1, ids[:n])])
        return rstate(m, 1)
    m.forward(ids[:20])
    m.forward(ids[20:26])                                   # 6 tokens: logged
    used = m.log_replays
    m.rewind(23)
    assert m.log_replays == used + 1 and np.array_equal(rstate(m), fresh(23))
    after = m.forward(ids[23:32], all_logits=True)          # 9 tokens: not logged
    assert np.array_equal(after, m.forward_batch([(1, ids[23:32])], all_logits=True)[0])
    m.rewind(27)                                            # inside that call: checkpoint + forward replay
    assert np.array_equal(rstate(m), fresh(27))
    m.rewind(10)                                            # before the checkpoint: replay from 0
    assert np.array_equal(rstate(m), fresh(10))
    for t in ids[10:14]:
        m.forward([t])
    m.rewind(13)
    assert np.array_equal(rstate(m), fresh(13))


def prefix_cache_hit_is_bitwise(path):
    """The server's prefix cache on a hybrid model: a hit loads the KV blocks and the recurrent-state
    snapshot at the chain's end, and the logits after it equal, bit for bit, those of the whole prompt."""
    import lowbit
    from lowbit.server.prefix import PrefixCache
    from test_prefix_cache_hybrid import compute, tokens
    m = lowbit.load(path, n_ctx=512, threads=2, n_slots=2)
    cache = PrefixCache(m, 64 << 20, block=32)
    shared = tokens(150, 1)
    a = shared + tokens(60, 2)
    compute(m, cache, 0, a, cache.snapshot_points(a, 0))
    b = shared + tokens(50, 3)
    m.rewind(0, slot=1)
    assert cache.load(b, 1) == 0                          # no snapshot where b branches off: no hit
    compute(m, cache, 1, b, cache.snapshot_points(b, 0))  # (b's run snapshots the shared blocks' end)
    c = shared + tokens(70, 4)
    m.rewind(0, slot=1)
    assert cache.load(c, 1) == 128 and m.engine.rstate_pos(1) == 128
    lg = m.forward_batch([(1, c[128:])], all_logits=True)[0]
    assert np.array_equal(lg, m.logits(c)[128:])


def states_matter(m, ids, ours):
    """Zeroing every recurrent state of slot 0 once, halfway through ids, moves the logits after it
    (ours: m's logits over ids, computed plainly)."""
    half = len(ids) // 2
    m.reset()
    m.forward(ids[:half])
    buf = rstate(m)
    buf[8:] = 0                                        # [int64 position][the states]: zero them
    m.engine.rstate_copy(0, buf, False)
    wiped = m.forward(ids[half:half + 4], all_logits=True)
    assert np.abs(wiped - ours[half:half + 4]).max() > 0.5
