"""The synthetic DeepSeek V2 / V3 (deepseek2) models of tests/test_deepseek2*.py and their llama.cpp
peers (a module-scoped fixture: import it into a test module).

Two models (lowbit.synth.synth_deepseek2), 3 layers each (layer 0 a dense SwiGLU FFN, 1-2 routed
experts plus 2 shared experts), width 256, 4 heads, kv_lora_rank 64, qk_nope 32, rope 16, v_head 32,
YaRN factor 40 with V2-Lite's yarn_log_multiplier (so the softmax scale carries DeepSeek's mscale^2):
  "v2":  a plain attn_q (no q_lora, as V2-Lite), softmax gating over 8 experts, top-2;
  "v3":  q_lora 64 (attn_q_a, attn_q_a_norm, attn_q_b), sigmoid gating with exp_probs_b, the top-K
         renormalised and times 2.5, group-limited routing (4 groups of 4 experts, 2 used), top-4.
"""
import pytest

import lowbit
from gemma_glm_models import PROMPT, peer
from llama_ref import llama_greedy
from lowbit.synth import synth_deepseek2

BASE = dict(layers=3, dim=256, heads=4, kv_lora_rank=64, qk_nope=32, rope_dims=16, v_head_dim=32, experts=8,
            top_k=2, expert_ffn=256, dense_ffn=512, leading_dense=1, shared_experts=2, embd_type="F16",
            wtype="Q8_0", expert_type="Q4_K")
MODELS = {"v2": dict(BASE, seed=21),
          "v3": dict(BASE, q_lora_rank=64, gating="sigmoid", expert_norm=True, expert_scale=2.5, experts=16,
                     top_k=4, expert_groups=4, expert_groups_used=2, seed=22)}
GEN = 40


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """ds(which) -> (path, llama.cpp peer, its greedy run of PROMPT), each made once per module."""
    out, d = {}, tmp_path_factory.mktemp("deepseek2")

    def get(which):
        if which not in out:
            path = synth_deepseek2(d / f"{which}.gguf", **MODELS[which])
            llm = peer(path)
            out[which] = (path, llm, llama_greedy(llm, llm.tokenize(PROMPT, add_bos=False), GEN))
        return out[which]
    return get


def load(path, **kw):
    return lowbit.load(path, n_ctx=kw.pop("n_ctx", 128), threads=kw.pop("threads", 2), **kw)
