"""Mamba-1 (llama.cpp's mamba: Mamba, Falcon-Mamba) on small synthetic files, against llama.cpp.

Every layer is attn_norm, a Mamba-1 mixer (csrc/mamba1.cpp) and the residual add. The mixer: x, z =
ssm_in . h; x through the causal conv (its bias, silu); dt | B | C = ssm_x . x (Falcon-Mamba:
ssm.dt_b_c_rms, each RMS-normed without a weight), dt = softplus(ssm_dt . dt + bias); per channel i
and state element j: s = s exp(dt_i A_ij) + B_j x_i dt_i, y_i = s . C; y = (y + x D) silu(z);
ssm_out . y. No attention, no FFN, no KV: the slot state is the conv state and the SSM state.

Files: "mb" (4 layers, width 256: d_inner 512, N 16, dt rank 16), "mb-rms" (3 layers, the dt / B / C
norms on, N 8). Parity as tests/test_granite_hybrid.py.
"""
import pytest

import lowbit
from llama_ref import (family_fixtures, features_matter, hybrid_chunks_threads_batches_bitwise,
                       load_edited, peer_llama, perplexity_matches, rewinds_restore_the_state_exactly, states_matter, top1_matches)
from lowbit.gguf import GGUFError
from lowbit.synth import synth_mamba

FILES = {"mb": dict(embd_type="F16", seed=3),
         "mb-rms": dict(layers=3, ssm_state=8, dt_b_c_rms=True, tied=True, embd_type="F16", seed=4)}
N_CTX = 640
paths, case = family_fixtures("mamba", synth_mamba, FILES, N_CTX)  # (name, path, llama.cpp's greedy run) per file


def test_config(case):
    name, path, _ = case
    m = lowbit.load(path, n_ctx=N_CTX)
    c = m.config
    n = FILES[name].get("layers", 4)
    assert c.arch == "mamba" and c.mamba1 and not c.mamba2 and c.recurrent == (True,) * n
    assert c.layer_parts == (1,) * n and c.attention_layers == [] and m.engine.kv_bytes(1) == 0
    assert (c.ssm_inner, c.ssm_state, c.ssm_dt_rank, c.ssm_dt_b_c_rms) == \
        ((512, 8, 16, True) if name == "mb-rms" else (512, 16, 16, False))


def test_teacher_forced_top1_matches_llama_cpp(case):
    top1_matches(case, N_CTX)


def test_perplexity_matches_llama_cpp(case):
    name, path, _ = case
    perplexity_matches(path, N_CTX, peer_llama(path, N_CTX), name)


def test_each_feature_matters(case, monkeypatch):
    """Done wrong, the dt / B / C norms (on where the file has them off, and off where on) move the
    logits; and zeroing the states halfway."""
    name, path, run = case
    m, ours = features_matter(monkeypatch, path, N_CTX, run,
                              {"dt_b_c_rms flipped": dict(ssm_dt_b_c_rms=name != "mb-rms")})
    states_matter(m, run[0], ours)


def test_chunks_threads_batches_and_rewinds_bitwise(paths):
    """Chunking, threads, batches (I8) and rewinds as for every hybrid model; the replay log keeps
    the conv input, dt per channel and B | C per token. The state per layer: the conv state
    [d_inner][K - 1] and the SSM state [d_inner][N]."""
    hybrid_chunks_threads_batches_bitwise(paths["mb"])
    rewinds_restore_the_state_exactly(paths["mb"], 8 + 4 * (512 * 3 + 512 * 16) * 4)


def test_synth_cli_and_info(tmp_path, capsys):
    from lowbit.cli import main
    out = tmp_path / "m.gguf"
    assert main(["synth", "mamba", str(out), "--layers", "2", "--dim", "128", "--ssm-state", "4", "--dt-rank", "5",
                 "--dt-b-c-rms"]) == 0
    c = lowbit.load(str(out), n_ctx=32).config
    assert (c.ssm_inner, c.ssm_state, c.ssm_dt_rank, c.ssm_dt_b_c_rms) == (256, 4, 5, True)
    capsys.readouterr()
    assert main(["info", "-m", str(out)]) == 0
    assert "2 of 2 layers Mamba-1 (256 channels, state 4)\n" in capsys.readouterr().out
    assert main(["synth", "mamba", str(out), "--dt-rank", "0"]) == 2


def test_bad_files_are_refused_in_one_line(paths, monkeypatch):
    cases = [({"mamba.ssm.inner_size": 300}, "ssm.inner_size = 300 must be 2 x embedding_length"),
             ({"mamba.ssm.dt_b_c_rms": 1}, "ssm.dt_b_c_rms = 1 is not a bool"),
             ({"mamba.ssm.time_step_rank": None}, "ssm.time_step_rank is missing")]
    for meta, msg in cases:
        with pytest.raises(GGUFError, match=msg) as e:
            load_edited(monkeypatch, paths["mb"], **meta)
        assert "\n" not in str(e.value)
