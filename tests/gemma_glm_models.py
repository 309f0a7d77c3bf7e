"""The synthetic gemma3, gemma2 and glm4moe models of tests/test_gemma_glm*.py, their llama.cpp peers and
the teacher-forced comparison (module-scoped fixtures: import them into a test module)."""
import numpy as np
import pytest

from llama_ref import llama_greedy
from lowbit.synth import synth_dense, synth_moe

PROMPT = b"Once upon a time, in a small village by the sea, the quick brown fox"
GEN = 40
ROUTE_TIE = 1e-3
GEMMA = dict(arch="gemma3", layers=6, dim=256, ffn=512, heads=4, kv_heads=2, head_dim=128, window=8,
             rope_base=1e6, softcap=4.0, rope_linear=8.0, embd_type="F16", wtype="Q8_0", seed=5)
# gemma2: layers 0 and 2 slide over 8 positions; the attention soft-cap at 1.5 bites (scores here
# span a few units; Gemma 2's own 50 would barely touch them), the final one at 4
GEMMA2 = dict(arch="gemma2", layers=4, dim=256, ffn=512, heads=4, kv_heads=2, head_dim=128, window=8,
              softcap=4.0, attn_softcap=1.5, embd_type="F16", wtype="Q8_0", seed=6)
GLM = dict(arch="glm4moe", layers=4, dim=256, heads=4, kv_heads=2, head_dim=64, experts=16, top_k=4,
           expert_ffn=256, dense_ffn=512, leading_dense=1, shared_experts=1, nextn=1, rope_dims=32,
           embd_type="F16", wtype="Q8_0", expert_type="Q4_K", seed=7)
@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory):
    return synth_dense(tmp_path_factory.mktemp("gemma") / "gemma3.gguf", **GEMMA)


@pytest.fixture(scope="module")
def gemma2_path(tmp_path_factory):
    return synth_dense(tmp_path_factory.mktemp("gemma2") / "gemma2.gguf", **GEMMA2)


@pytest.fixture(scope="module")
def glm_path(tmp_path_factory):
    return synth_moe(tmp_path_factory.mktemp("glm") / "glm4moe.gguf", **GLM)


def peer(path):
    from lowbit import peer as p
    # one llama.cpp thread: its per-node thread barrier stalls for seconds on a busy machine
    return p.Llama(str(path), n_ctx=128, logits_all=True, verbose=False, n_threads=1)


@pytest.fixture(scope="module")
def gemma_llm(gemma_path):
    return peer(gemma_path)


@pytest.fixture(scope="module")
def gemma2_llm(gemma2_path):
    return peer(gemma2_path)


@pytest.fixture(scope="module")
def glm_llm(glm_path):
    return peer(glm_path)


@pytest.fixture(scope="module")
def gemma_greedy(gemma_llm):
    """llama.cpp's greedy continuation of PROMPT and its logits: (ids, float32[len, vocab])."""
    return llama_greedy(gemma_llm, gemma_llm.tokenize(PROMPT, add_bos=False), GEN)


@pytest.fixture(scope="module")
def gemma2_greedy(gemma2_llm):
    return llama_greedy(gemma2_llm, gemma2_llm.tokenize(PROMPT, add_bos=False), GEN)


@pytest.fixture(scope="module")
def glm_greedy(glm_llm):
    return llama_greedy(glm_llm, glm_llm.tokenize(PROMPT, add_bos=False), GEN)


def family(which, request):
    """(file, llama.cpp peer, its greedy run) of "gemma3", "gemma2" or "glm4moe"."""
    k = {"gemma3": "gemma", "gemma2": "gemma2", "glm4moe": "glm"}[which]
    return tuple(request.getfixturevalue(f"{k}_{x}") for x in ("path", "llm", "greedy"))


def compare(m, run):
    ids, ref = run
    m.reset()
    ours = m.forward(ids, all_logits=True)
    tie = np.zeros(len(ids), bool)
    if m.config.n_expert:
        for layer in range(m.config.n_dense_lead, m.config.n_layer):
            tie |= np.array(m.engine.last_route_margins(layer)) < ROUTE_TIE
    top2 = np.sort(ref, 1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0] >= 0.1) & ~tie
    agree = int((ours.argmax(1) == ref.argmax(1))[clear].sum())
    return ids, ours, ref, tie, int(clear.sum()), agree
