"""The kernel API refuses bad arguments with a clear ValueError/TypeError before native code runs."""
import subprocess
import sys

import numpy as np
import pytest

import lowbit
from lowbit import kernels as K
from lowbit.generate import Stats
from lowbit._native import lib

RAW = np.zeros((4, 18), np.uint8)          # 4 rows of Q4_0, n = 32
X = np.ones((2, 32), np.float32)


@pytest.mark.parametrize("call,exc,needle", [
    (lambda: K.matmul("Q4_0", RAW.astype(np.int8), X), TypeError, "uint8"),
    (lambda: K.matmul("Q4_0", np.zeros((4, 17), np.uint8), X), ValueError, "whole number"),
    (lambda: K.matmul("Q4_0", RAW, np.ones((2, 31), np.float32)), ValueError, "values per token"),
    (lambda: K.matmul("Q4_0", RAW, np.ones((0, 32), np.float32)), ValueError, "at least one token"),
    (lambda: K.matmul("Q4_0", RAW, np.ones((2, 32), np.int32)), TypeError, "float"),
    (lambda: K.matmul("Q4_0", RAW[:, ::2], X), ValueError, "C-contiguous"),
    (lambda: K.matmul("Q4_0", np.zeros((4, 36), np.uint8)[:, :18], X), ValueError, "C-contiguous"),
    (lambda: K.matmul("NOPE", RAW, X), ValueError, "unknown format"),
    (lambda: K.matmul("Q8_1", RAW, X), ValueError, "not a weight format"),
    (lambda: K.matmul("I2_S", np.zeros((2, 32), np.uint8), np.ones((1, 128), np.float32)), ValueError, "w_scale"),
    (lambda: K.matmul("Q4_0", RAW, X, threads=0), ValueError, "threads"),
    (lambda: K.quantize_act("Q4_0", X), ValueError, "not an activation format"),
    (lambda: K.quantize_act("Q8_K", X), ValueError, "multiple of the block size 256"),
    (lambda: K.quantize("Q8_K", np.ones((1, 256), np.float32)), ValueError, "no quantizer"),
    (lambda: K.dequantize("Q4_0", RAW, n=64), ValueError, "needs 36 bytes"),
    (lambda: K.matmul_act("Q4_0", RAW, np.zeros((2, 33), np.uint8)), ValueError, "34 bytes per token"),
    (lambda: K.matmul_act("Q4_0", RAW, np.zeros((2, 34), np.uint8), r0=2, r1=9), ValueError, "row range"),
    (lambda: K.kernel("Q4_0", 9), ValueError, "1..8"),
])
def test_bad_arguments(call, exc, needle):
    with pytest.raises(exc, match=needle):
        call()


def test_stats_say_which_kernel_ran():
    K.reset_stats()
    K.matmul("Q8_0", np.zeros((3, 34), np.uint8), np.ones((11, 32), np.float32))
    s = {(d["format"], d["nt"]): d for d in K.stats()}
    # 11 tokens = a window of 8 and one of 3, after one quantizer call for the 11 tokens
    assert set(s) == {("Q8_0", 8), ("Q8_0", 3), ("Q8_0", None)}
    assert s[("Q8_0", 8)]["kernel"] == K.kernel("Q8_0", 8)[0] and s[("Q8_0", 8)]["rows"] == 3
    q = s[("Q8_0", None)]
    assert q["op"] == "quantize" and q["kernel"] == K.quant_act_kernel("Q8_0")[0]
    assert (q["calls"], q["rows"], q["values"]) == (1, 11, 11 * 32)
    K.reset_stats()
    assert K.stats() == []


def run_cli(*args, env=None):
    import os
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "lowbit.cli", *args], capture_output=True, text=True, env=e)


def test_info_prints_cpu_and_kernels():
    r = run_cli("info")
    assert r.returncode == 0, r.stderr
    assert "CPU" in r.stdout and "selected" in r.stdout
    for f in lowbit.formats():
        if f.weight:
            assert f"\n{f.name} " in r.stdout and "rows_" in r.stdout


def test_max_isa_cap_is_obeyed():
    r = run_cli("info", env={"LOWBIT_MAX_ISA": "scalar"})
    assert r.returncode == 0, r.stderr
    assert "-> selected scalar" in r.stdout and "_avx" not in r.stdout
    r = subprocess.run([sys.executable, "-c", "import lowbit; print(lowbit._native.lib.levels())"],
                       capture_output=True, text=True, env={**__import__("os").environ, "LOWBIT_MAX_ISA": "scalar"})
    assert r.stdout.strip() == "['scalar']", r.stdout + r.stderr


def test_levels_need_their_own_features():
    """A level runs only where the CPU has its own features: the ladder is not a chain (AMD Zen 4
    has AVX-512 VNNI but not the VEX AVX-VNNI the avx2vnni level is built with). Every kernel that
    runs at any available level names a level whose features the CPU has (I6)."""
    feats = set(lib.cpu_info()["features"])
    need = {"avx": {"avx"}, "avx2": {"avx2", "fma", "f16c"}, "avx2vnni": {"avx2", "fma", "f16c", "avx_vnni"},
            "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}}
    # amx: avx512's and the tiles', or, emulated (LOWBIT_AMX=emulate), avx2's
    need["amx"] = need["avx2"] if lib.cpu_info()["amx_emulated"] else need["avx512"] | {"amx_tile", "amx_int8"}
    isa_id = {name: i for i, name in enumerate(lib.isa_names())}  # csrc/kernels.h
    for lv in lib.levels():
        assert need.get(lv, set()) <= feats, (lv, sorted(feats))
        for f in lowbit.formats():
            if f.weight:
                k = lib.kernel(f.id, 1, isa_id[lv])
                assert k is None or need.get(k[1], set()) <= feats, (f.name, lv, k)


def test_bad_max_isa_is_a_clear_error():
    r = run_cli("info", env={"LOWBIT_MAX_ISA": "avx9000"})
    assert r.returncode != 0 and "LOWBIT_MAX_ISA=avx9000" in r.stderr


def test_no_kernel_switch_falls_back_and_is_reported():
    """LOWBIT_NO_<KERNEL>=1 turns one kernel off: the level below runs it, info says so."""
    import json
    probe = ("import json, lowbit; from lowbit._native import lib; "
             "print(json.dumps({f.name: lib.kernel(f.id, 2) for f in lowbit.formats() if f.weight}))")
    base = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    simd = {k: v for k, v in base.items() if v[1] != "scalar"}
    if not simd:  # scalar-only build: the reference itself can never be turned off
        name = base["Q4_0"][0]
        r = run_cli("info", env={"LOWBIT_NO_" + name.upper(): "1"})
        assert r.returncode == 0 and name in r.stdout
        return
    fmt, (name, level) = sorted(simd.items())[0]
    env = {"LOWBIT_NO_" + name.upper(): "1"}
    after = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                      env={**__import__("os").environ, **env}).stdout)
    assert after[fmt][0] != name, f"{name} still runs with LOWBIT_NO_{name.upper()}=1"
    r = run_cli("info", env=env)
    assert "disabled" in r.stdout and name in r.stdout


def test_i2s_flat_tensor_round_trip():
    """quantize("I2_S", W) gives the tensor as a bitnet.cpp GGUF holds it; matmul takes it flat."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 256)).astype(np.float32)
    flat = K.quantize("I2_S", w)
    assert flat.shape == (6 * 256 // 4 + 32,)
    rows, scale = K.split_tensor("I2_S", flat, 256)
    assert rows.shape == (6, 64) and scale == np.float32(np.abs(w).mean(dtype=np.float64))
    x = rng.standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_array_equal(K.matmul("I2_S", flat, x), K.matmul("I2_S", rows, x, w_scale=scale))
    deq = K.dequantize("I2_S", rows, w_scale=scale)
    ternary = np.clip(np.round(w / scale), -1, 1) * scale
    np.testing.assert_array_equal(deq, ternary.astype(np.float32))
    with pytest.raises(ValueError, match="whole rows"):
        K.matmul("I2_S", flat[:-1], x)


def test_parity_command_runs_every_level_and_passes():
    r = run_cli("parity", "--formats", "Q4_0,Q4_K,IQ2_XS,I2_S,BF16", "--rows", "9")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    from lowbit._native import lib
    for lv in lib.levels():
        assert f"Q4_K     {lv:<9}  8" in r.stdout
    assert "all within contract" in r.stdout and "MISMATCH" not in r.stdout
    r = run_cli("parity", "--formats", "Q9_9")
    assert r.returncode == 1 and "unknown format" in r.stderr


# ---- the model API: details, sessions, OpenAI-shaped completions ---------------------------------
# Against the model's own forward pass run from scratch on a separate Model (fresh cache, one
# sequence, nothing shared), and against log-softmax of Model.logits computed independently.

PROMPT = "The capital of France is"
COUNT = "Count: 1, 2, 3,"


@pytest.fixture(scope="module")
def smol():
    return lowbit.load(n_ctx=256, threads=2)


@pytest.fixture(scope="module")
def ref():
    """A second Model of the same file: the reference runs alone on it."""
    return lowbit.load(n_ctx=256, threads=2)


def greedy_ref(ref, ids, n):
    """n greedy tokens after ids by the plainest loop there is: full logits from scratch."""
    out = list(ids)
    for _ in range(n):
        out.append(int(np.argmax(ref.logits(out)[-1])))
    return out[len(ids):]


def test_generate_details_gives_ids_text_and_finish_reason(smol, ref):
    pieces = list(smol.generate(PROMPT, max_tokens=6, details=True))
    ids = [t for p in pieces for t in p.ids]
    assert ids == greedy_ref(ref, smol.tokenize(PROMPT), 6)
    assert "".join(p.text for p in pieces) == "".join(smol.generate(PROMPT, max_tokens=6)) == smol.detokenize(ids)
    assert [p.finish_reason for p in pieces[:-1]] == [None] * (len(pieces) - 1)
    assert pieces[-1].finish_reason == "length" and pieces[-1].ids == []


def test_generate_penalties_and_logprobs_against_the_plain_loop(smol, ref):
    """generate(presence_penalty, frequency_penalty, logprobs=k): each token is the argmax of the
    raw logits minus OpenAI's penalties over the tokens before it (counts kept here), and its
    logprobs are float64 numpy's log-softmax of those raw logits."""
    ids = smol.tokenize(COUNT)
    pieces = list(smol.generate(COUNT, max_tokens=16, details=True, logprobs=4, presence_penalty=0.7,
                                frequency_penalty=1.3))
    got = [t for p in pieces for t in p.ids]
    lps = [lp for p in pieces for lp in (p.logprobs or [])]
    rows = ref.logits(ids + got)[len(ids) - 1:-1].astype(np.float64)
    count = np.zeros(rows.shape[1])
    for j, t in enumerate(got):
        assert t == int(np.argmax(rows[j] - 1.3 * count - 0.7 * (count > 0))), j
        count[t] += 1
        ls = rows[j] - rows[j].max() - np.log(np.exp(rows[j] - rows[j].max()).sum())
        assert lps[j][0] == pytest.approx(ls[t], abs=1e-6)
        top = np.argsort(-ls, kind="stable")[:4]
        assert list(lps[j][1]) == top.tolist() and list(lps[j][1].values()) == pytest.approx(ls[top], abs=1e-6)
    assert got != greedy_ref(ref, ids, 16)  # the penalties changed the text
    with pytest.raises(ValueError, match="-2..2"):
        list(smol.generate(COUNT, max_tokens=2, presence_penalty=3))


def test_finish_reasons_stop_and_context(smol):
    st = Stats()
    pieces = list(smol.generate("Count: 1, 2, 3,", max_tokens=30, stop=[" 5"], stats=st, details=True))
    assert pieces[-1].finish_reason == "stop" and st.stop == "stop"
    small = lowbit.load(n_ctx=24, threads=2)
    st = Stats()
    ids = small.tokenize(COUNT)
    text = "".join(small.generate(COUNT, max_tokens=-1, stats=st, temperature=0))
    assert st.stop == "context" and st.generated == 24 - len(ids) + 1, (st, text)
    last = list(small.generate(COUNT, max_tokens=None, details=True))[-1]
    assert last.finish_reason == "length"
    for bad in (0, -2):
        with pytest.raises(ValueError, match="max_tokens"):
            list(small.generate(PROMPT, max_tokens=bad))


def test_the_next_prompt_reuses_the_cache_and_gives_the_same_tokens(smol, ref):
    """A prompt that extends the previous generation prefills only its new tokens, and the
    tokens are those of a fresh model (invariant I8: chunking does not change logits)."""
    ids = smol.tokenize(PROMPT)
    first = [t for p in smol.generate(ids, max_tokens=5, details=True) for t in p.ids]
    more = ids + first + smol.tokenize(" And the capital of Spain is", add_bos=False)
    st = Stats()
    second = [t for p in smol.generate(more, max_tokens=5, details=True, stats=st) for t in p.ids]
    assert st.cached == len(ids) + len(first) - 1  # the cache held the prompt and all but the last token
    assert second == greedy_ref(ref, more, 5)


def run_alone(m, prompt, **kw):
    return [t for p in m.generate(prompt, details=True, **kw) for t in p.ids]


@pytest.mark.parametrize("n_slots", [1, 2])
def test_two_live_generators_are_both_correct(n_slots, ref):
    """Two generators on one Model, stepped in turn: each gives what it gives alone. With
    n_slots=2 each has its own slot; with 1 they share it and re-read their context."""
    m = lowbit.load(n_ctx=128, threads=2, n_slots=n_slots)
    a_kw = dict(max_tokens=8)
    b_kw = dict(max_tokens=8, temperature=0.9, seed=5)
    alone_a = run_alone(ref, PROMPT, **a_kw)
    alone_b = run_alone(ref, "Once upon a time", **b_kw)
    ga = m.generate(PROMPT, details=True, **a_kw)
    gb = m.generate("Once upon a time", details=True, **b_kw)
    got_a, got_b = [], []
    with __import__("warnings").catch_warnings(record=True) as w:
        __import__("warnings").simplefilter("always")
        for pa, pb in zip(ga, gb):
            got_a += pa.ids
            got_b += pb.ids
        got_a += [t for p in ga for t in p.ids]
        got_b += [t for p in gb for t in p.ids]
    assert got_a == alone_a and got_b == alone_b
    shared = [x for x in w if "share" in str(x.message)]
    assert bool(shared) == (n_slots == 1)
    assert m._live == [0] * n_slots  # both released their slots


def test_closing_a_generator_early_frees_its_slot(smol):
    g = smol.generate(PROMPT, max_tokens=20)
    next(g)
    assert sum(smol._live) == 1
    g.close()
    assert sum(smol._live) == 0


def test_create_completion_is_openai_shaped(smol, ref):
    r = smol.create_completion(PROMPT, max_tokens=6, temperature=0, logprobs=3)
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-") and isinstance(r["created"], int)
    (c,) = r["choices"]
    ids = smol.tokenize(PROMPT)
    want = greedy_ref(ref, ids, 6)
    assert c["text"] == ref.detokenize(want) and c["index"] == 0 and c["finish_reason"] == "length"
    assert r["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 6, "total_tokens": len(ids) + 6}
    # logprobs: log-softmax of the raw logits, computed here from Model.logits on the other model
    lp = c["logprobs"]
    rows = ref.logits(ids + want)[len(ids) - 1:-1].astype(np.float64)
    ls = rows - rows.max(1, keepdims=True)
    ls -= np.log(np.exp(ls).sum(1, keepdims=True))
    np.testing.assert_allclose(lp["token_logprobs"], [ls[i, t] for i, t in enumerate(want)], rtol=0, atol=1e-6)
    assert lp["tokens"] == [ref.tokenizer.piece(t).decode("utf-8", "replace") for t in want]
    assert all(len(top) <= 3 and max(top.values()) == pytest.approx(ls[i].max(), abs=1e-6)
               for i, top in enumerate(lp["top_logprobs"]))
    assert lp["text_offset"][0] == 0 and "".join(lp["tokens"]) == c["text"]
    assert smol.create_completion(PROMPT, max_tokens=3)["choices"][0]["logprobs"] is None


def test_create_completion_stream_matches_the_whole(smol):
    whole = smol.create_completion(PROMPT, max_tokens=8, temperature=0)
    chunks = list(smol.create_completion(PROMPT, max_tokens=8, temperature=0, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"] == whole["usage"] and len({c["id"] for c in chunks}) == 1


def test_create_chat_completion_and_its_stream(smol):
    msgs = [{"role": "user", "content": "Say hello."}]
    r = smol.create_chat_completion(msgs, max_tokens=24, temperature=0)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    (c,) = r["choices"]
    assert c["message"]["role"] == "assistant"
    assert c["message"]["content"] == "".join(smol.chat(msgs, max_tokens=24))  # greedy both
    assert c["finish_reason"] in ("stop", "length") and r["usage"]["completion_tokens"] >= 1
    chunks = list(smol.create_chat_completion(msgs, max_tokens=24, temperature=0, stream=True))
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == c["message"]["content"]
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == c["finish_reason"]
    assert chunks[-1]["usage"] == r["usage"]
    r = smol.create_chat_completion(msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] == 4
    assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2 and bytes(e["bytes"]).decode("utf-8", "replace")
               == e["token"] for e in content)
    assert "".join(e["token"] for e in content) == r["choices"][0]["message"]["content"]


def test_completion_defaults_are_llama_cpp_pythons_and_bad_arguments_are_refused(smol):
    from lowbit.completion import SAMPLING_DEFAULTS
    assert SAMPLING_DEFAULTS == dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                                     presence_penalty=0.0, frequency_penalty=0.0)
    a = smol.create_completion(PROMPT, max_tokens=8, seed=3)["choices"][0]["text"]
    assert a == smol.create_completion(PROMPT, max_tokens=8, seed=3)["choices"][0]["text"]
    with pytest.raises(TypeError, match="temprature"):
        smol.create_completion(PROMPT, temprature=0)
    with pytest.raises(ValueError, match="messages"):
        smol.create_chat_completion([])
    with pytest.raises(ValueError, match="messages\\[0\\]"):
        smol.create_chat_completion([{"content": "no role"}])
    with pytest.raises(ValueError, match="top_logprobs"):
        smol.create_chat_completion([{"role": "user", "content": "hi"}], top_logprobs=2)


def test_bad_prompts_and_token_ids_are_refused(smol):
    with pytest.raises(ValueError, match="no tokens"):
        smol.logits([])
    with pytest.raises(ValueError, match="token id 999999 outside the vocabulary"):
        smol.logits([1, 999999])
    with pytest.raises(TypeError, match="text or a list of token ids, not NoneType"):
        list(smol.generate(None, max_tokens=2))
    with pytest.raises(ValueError, match="the prompt is empty"):
        list(smol.generate([], max_tokens=2))


def test_a_directory_is_a_gguf_error(tmp_path):
    with pytest.raises(lowbit.GGUFError, match="is a directory"):
        lowbit.load(str(tmp_path))
    with pytest.raises(lowbit.GGUFError, match="No such file"):
        lowbit.load(str(tmp_path / "nope.gguf"))


def test_bad_model_arguments_are_refused(monkeypatch):
    with pytest.raises(ValueError, match="n_ctx must be >= 1"):
        lowbit.load(n_ctx=0)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        lowbit.load(n_ctx=8, threads=0)
    monkeypatch.setenv("LOWBIT_THREADS", "abc")
    with pytest.warns(RuntimeWarning, match="LOWBIT_THREADS='abc'"):
        lowbit.load(n_ctx=8)
