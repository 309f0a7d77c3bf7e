"""Synthetic models with an MTP block whose drafts are known functions (tests/test_mtp.py,
tests/test_serve_spec.py): edit a synthetic file's tensors in place."""
import numpy as np
from gguf import GGUFReader

import lowbit

DIM = 128
SMALL = dict(layers=4, dim=DIM, heads=2, kv_heads=1, head_dim=64, rope_dims=32, sections=(2, 2, 2, 2), rope_base=1e4,
             full_attention_interval=2, ssm_conv=4, ssm_state=16, ssm_groups=2, ssm_heads=4, experts=4, top_k=2,
             expert_ffn=128, shared_ffn=128, ffn=256, embd_type="F32", wtype="F32", expert_type="Q8_0", seed=5)


def edit(path, fn):
    """fn({tensor name: its data as a writable numpy view}) on the file in place (float tensors as
    values; a quantized one as its raw bytes: set it with set_q8_0)."""
    r = GGUFReader(path, "r+")
    fn({t.name: t.data for t in r.tensors})
    r.data.flush()
    del r
    return path


def set_matrix(d, W):
    """A tensor's data to the matrix W: as it is (F32 / F16), or its Q8_0 bytes (lowbit's quantizer,
    byte-identical to ggml's): what lowbit and llama.cpp read back is W to Q8_0's rounding."""
    if d.dtype == np.uint8:
        d[...] = lowbit.kernels.quantize("Q8_0", W).reshape(d.shape)
    else:
        d[...] = W


def mtp_block_silent(T, L):
    """The MTP block L's attention and FFN add exactly 0: zero input norms (q, k, v, the FFN input
    are 0 or biases) and a zero attention output matrix."""
    for nm in ("attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight", "attn_output.weight"):
        if f"blk.{L}.{nm}" in T:
            T[f"blk.{L}.{nm}"][...] = 0


def eh(half, dim=DIM):
    """eh_proj [dim, 2 dim] (numpy [rows, cols]) selecting the embedding ("e") or the hidden ("h") half."""
    m = np.zeros((dim, 2 * dim), np.float32)
    (m[:, :dim] if half == "e" else m[:, dim:])[...] = np.eye(dim)
    return m


def near_bigram(T, L, alpha=0.2):
    """Trunk layers' input norms times alpha (each layer adds little: the logits are nearly a bigram
    of the current token), MTP block = that bigram: eh_proj [I | 0], silent block, enorm 1,
    shared_head_norm = output_norm."""
    for n, d in T.items():
        if n.startswith("blk.") and int(n.split(".")[1]) < L and n.endswith(("attn_norm.weight", "ffn_norm.weight",
                                                                            "post_attention_norm.weight")):
            d[...] *= alpha
    set_matrix(T[f"blk.{L}.nextn.eh_proj.weight"], eh("e", T["output_norm.weight"].shape[-1]))
    mtp_block_silent(T, L)
    T[f"blk.{L}.nextn.enorm.weight"][...] = 1
    T[f"blk.{L}.nextn.shared_head_norm.weight"][...] = T["output_norm.weight"]
