"""`lowbit quantize IN OUT --type T`: rewrite a GGUF model with its weight matrices in other
formats, one tensor in memory at a time, the way llama.cpp's llama-quantize does it.

--type is a llama.cpp file type (a "mix") or lowbit's I2_S:
    F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q2_K_S Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M
    Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS TQ1_0 TQ2_0 IQ2_XXS IQ2_XS IQ2_S IQ2_M IQ3_XXS IQ3_XS IQ3_S
    IQ3_M IQ1_S IQ1_M (and Q3_K, Q4_K, Q5_K: llama-quantize's aliases of the _M mixes). The IQ1
    and IQ2 types and IQ3_XXS need an importance matrix (--imatrix), as in llama-quantize.
Which tensor gets which format follows llama.cpp's llama_tensor_get_type (src/llama-quant.cpp):
    - only tensors of 2 or more dims whose name ends in "weight" are quantized; norms, the MoE
      router (ffn_gate_inp) and a few named small tensors are copied as they are;
    - a mix upgrades some tensors (attn_v, ffn_down in the first/last layers, attn_output,
      the output head and a tied token_embd to Q6_K, ...), counting them in llama.cpp's tensor
      order (by layer, then by name), which is also the order the output file is written in;
    - a row that is not a whole number of the target's blocks falls back to a 32-block format
      (IQ4_XS -> IQ4_NL, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K/TQ -> Q4_0), or
      F16 when even that does not fit;
    - --output-type / --token-embedding-type set those two tensors, --pure turns the mix's
      upgrades off, --leave-output-tensor copies output.weight as it is.
The bytes of every quantized tensor are lowbit's own quantizers' (csrc/quant/), byte-identical
to ggml_quantize_chunk on the same floats: the source tensor is dequantized to float32 (F16,
BF16 exactly) and quantized per expert slice with that slice's importance weights (--imatrix).

Departures from llama-quantize, on purpose:
    - a quantized source is refused unless --allow-requantize only when the target is itself
      a quantized format (dequantizing to F16/BF16/F32 is always allowed) or both are ternary
      (TQ1_0 / TQ2_0 / I2_S hold the same codes: converting between them loses nothing);
    - TQ1_0 / TQ2_0 / I2_S refuse a tensor that is not ternary (per block for TQ, per tensor
      for I2_S) unless --force (then packed as llama.cpp packs it): a non-ternary model packed
      into them is garbage. The BitNet families (bitnet, bitnet-b1.58) are the exception: their
      latent float weights are ternarised with BitNet's absmean rule (writer.absmean_ternary).
    - I2_S (bitnet.cpp's format, not a llama.cpp file type), and TQ1_0 / TQ2_0 on the BitNet
      families, follow bitnet.cpp's rules (plan_ternary): every layer matrix in the type, the
      BitNet families keep token_embd / output unless --token-embedding-type / --output-type
      say otherwise, and the source's tensor order is kept.
"""
from __future__ import annotations

import argparse
import os
import re
import struct
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import gguf
from .formats import FALLBACK, fit_type
from .formats import get as get_format

BITNET_ARCHS = ("bitnet", "bitnet-b1.58")
TERNARY = ("I2_S", "TQ1_0", "TQ2_0")
FLOAT = ("F32", "F16", "BF16")

# llama.cpp's file types (llama_ftype, include/llama.h): name -> (id, default tensor format).
MIXES = {
    "F32": (0, "F32"), "F16": (1, "F16"), "Q4_0": (2, "Q4_0"), "Q4_1": (3, "Q4_1"), "Q8_0": (7, "Q8_0"),
    "Q5_0": (8, "Q5_0"), "Q5_1": (9, "Q5_1"), "Q2_K": (10, "Q2_K"), "Q3_K_S": (11, "Q3_K"),
    "Q3_K_M": (12, "Q3_K"), "Q3_K_L": (13, "Q3_K"), "Q4_K_S": (14, "Q4_K"), "Q4_K_M": (15, "Q4_K"),
    "Q5_K_S": (16, "Q5_K"), "Q5_K_M": (17, "Q5_K"), "Q6_K": (18, "Q6_K"), "IQ2_XXS": (19, "IQ2_XXS"),
    "IQ2_XS": (20, "IQ2_XS"), "Q2_K_S": (21, "Q2_K"), "IQ3_XS": (22, "IQ3_S"), "IQ3_XXS": (23, "IQ3_XXS"),
    "IQ1_S": (24, "IQ1_S"), "IQ4_NL": (25, "IQ4_NL"), "IQ3_S": (26, "IQ3_S"), "IQ3_M": (27, "IQ3_S"),
    "IQ2_S": (28, "IQ2_XS"), "IQ2_M": (29, "IQ2_S"), "IQ4_XS": (30, "IQ4_XS"), "IQ1_M": (31, "IQ1_M"),
    "BF16": (32, "BF16"), "TQ1_0": (36, "TQ1_0"), "TQ2_0": (37, "TQ2_0"), "MXFP4": (38, "MXFP4"),
}
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}  # as llama-quantize accepts them
I2S_FILE_TYPE = 40  # bitnet.cpp's general.file_type for I2_S files (informational)
QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION, written as llama.cpp writes it
# formats whose quantizer needs an importance matrix (ggml_quantize_requires_imatrix: IQ1_M's
# runs without one), and the ones llama.cpp refuses to make without one (tensor_requires_imatrix)
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
REQUIRES_IMATRIX = {"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"}
# names (substrings) llama.cpp never quantizes (tensor_allows_quantization)
KEEP_SUBSTRINGS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                   "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                   "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
                   "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
                   "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
                   "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
                   "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
                   "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
                   "mm.a.code_embd")
KEEP_NAMES = ("position_embd.weight", "token_types.weight")
TOKEN_EMBD_NAMES = ("token_embd.weight", "per_layer_token_embd.weight")


class QuantizeError(ValueError):
    """A request lowbit quantize refuses (one line, names the problem)."""


def _fmt(name: str):
    return get_format(name)


def _is_quantized(fmt) -> bool:
    return fmt.name not in FLOAT


# ---- llama.cpp's per-tensor type choice ---------------------------------------------------------
def category(name: str) -> str:
    """llama.cpp's tensor_get_category: a broad role from the name."""
    if name == "output.weight":
        return "output"
    if name in TOKEN_EMBD_NAMES:
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                     ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                     ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def _is_attn_v(cat: str) -> bool:
    return cat in ("attn_v", "attn_qkv", "attn_kv_b")


def _layer_of(name: str) -> int:
    m = re.match(r"blk\.(-?\d+)\.", name)
    return int(m.group(1)) if m else -1


def llama_order(names) -> list[str]:
    """llama.cpp's tensor order (its weights map): by layer (non-layer tensors first), then name."""
    return sorted(names, key=lambda n: (_layer_of(n), n.encode()))


def ggml_n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims of a tensor of numpy shape `shape` (trailing size-1 ggml dims do not count)."""
    ne = list(reversed(shape))
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


@dataclass
class Options:
    mix: str                             # a MIXES name or "I2_S"
    output_type: str | None = None       # --output-type
    token_embedding_type: str | None = None  # --token-embedding-type
    pure: bool = False
    leave_output_tensor: bool = False
    allow_requantize: bool = False
    force: bool = False
    has_imatrix: bool = False


class Planner:
    """llama_tensor_get_type with its counters: call target() once per tensor in llama_order."""

    def __init__(self, f: gguf.GGUFFile, opt: Options):
        md = f.metadata
        self.opt = opt
        self.arch = md.get("general.architecture", "")
        a = self.arch

        def first(v, default=0):
            if isinstance(v, (list, tuple, np.ndarray)):
                return int(v[0]) if len(v) else default
            return int(v) if v is not None else default
        self.n_layer = first(md.get(f"{a}.block_count"))
        n_head = first(md.get(f"{a}.attention.head_count"))
        n_head_kv = first(md.get(f"{a}.attention.head_count_kv"), n_head)
        self.n_gqa = n_head // n_head_kv if n_head_kv else 0
        self.n_expert = first(md.get(f"{a}.expert_count"))
        # llama.cpp's LLM_TYPE_70B (a Llama of 80 layers with grouped KV heads); other 70B-class
        # families are not detected here
        self.is_70b = a == "llama" and self.n_layer == 80 and n_head != n_head_kv
        self.ftype, default = MIXES[opt.mix]
        self.default = default
        names = list(f.tensors)
        cats = [category(n) for n in names]
        self.n_attention_wv = sum(_is_attn_v(c) for c in cats)
        self.tied = "output" not in cats
        self.n_ffn = self.n_layer
        self.i_attention_wv = self.i_ffn_down = self.i_ffn_gate = self.i_ffn_up = 0
        self.notes: dict[str, tuple[str, str]] = {}  # name -> (format wanted, fallback)

    def allows_quantization(self, name: str, shape) -> bool:
        if ggml_n_dims(tuple(shape)) < 2 or not name.endswith("weight"):
            return False
        if name == "output.weight" and self.opt.leave_output_tensor:
            return False
        if name in KEEP_NAMES or any(s in name for s in KEEP_SUBSTRINGS):
            return False
        return True

    def _layer(self, counter: int, name: str) -> tuple[int, int]:
        if self.n_expert > 1:
            i = _layer_of(name)
            if not 0 <= i < self.n_ffn:
                raise QuantizeError(f"quantize: cannot tell the layer of {name} (block_count {self.n_ffn})")
            return i, self.n_ffn
        return counter, self.n_ffn

    @staticmethod
    def _more_bits(i: int, n: int) -> bool:
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    def _mix_rule(self, t: str, name: str, ncols: int, cat: str) -> str:
        """llama_tensor_get_type_impl: the mix's choice for one tensor (t = the default)."""
        ft, arch, o = self.opt.mix, self.arch, self.opt
        low_iq = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
        if cat == "output" or (self.tied and cat == "token_embd"):
            if o.output_type is not None:
                return o.output_type
            if arch == "falcon" or ncols % _fmt(t).block:
                return "Q8_0"
            if ft in ("IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"):
                return "Q5_K"
            return "Q6_K" if t != "Q8_0" else t
        if cat == "token_embd":
            if o.token_embedding_type is not None:
                return o.token_embedding_type
            if ft in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
                return "Q2_K"
            if ft in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
                return "IQ3_S"
            if ft in ("TQ1_0", "TQ2_0"):
                return "Q4_K"
            return t
        if ft in low_iq:
            if _is_attn_v(cat):
                if self.n_gqa >= 4 or self.n_expert >= 4:
                    t = "Q4_K"
                else:
                    t = "IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K"
                self.i_attention_wv += 1
            elif self.n_expert == 8 and cat == "attn_k":
                t = "Q4_K"
            elif cat == "ffn_down":
                if self.i_ffn_down < self.n_ffn // 8:
                    t = "IQ3_S" if ft in ("IQ2_S", "IQ2_M") else "Q2_K"
                self.i_ffn_down += 1
            elif cat == "attn_output":
                if self.n_expert == 8:
                    t = "Q5_K"
                elif ft in ("IQ1_S", "IQ1_M"):
                    t = "IQ2_XXS"
                elif ft in ("IQ2_S", "IQ2_M"):
                    t = "IQ3_S"
            return t
        if _is_attn_v(cat):
            wv, nwv = self.i_attention_wv, self.n_attention_wv
            if ft == "Q2_K":
                t = "Q4_K" if self.n_gqa >= 4 else "Q3_K"
            elif ft == "Q2_K_S" and self.n_gqa >= 4:
                t = "Q4_K"
            elif ft == "IQ3_XXS":
                t = "Q4_K" if self.n_gqa >= 4 else ("IQ3_S" if not o.has_imatrix else "IQ3_XXS")
            elif ft in ("IQ3_XS", "IQ3_S") and self.n_gqa >= 4:
                t = "Q4_K"
            elif ft == "IQ3_M":
                t = "Q4_K"
            elif ft == "Q3_K_M":
                t = "Q5_K" if wv < 2 else "Q4_K"
            elif ft == "Q3_K_L":
                t = "Q5_K"
            elif ft in ("IQ4_NL", "IQ4_XS") and self.n_gqa >= 4:
                t = "Q5_K"
            elif ft in ("Q4_K_M", "Q5_K_M") and self._more_bits(wv, nwv):
                t = "Q6_K"
            elif ft == "Q4_K_S" and wv < 4:
                t = "Q5_K"
            if self.is_70b and t in ("Q3_K", "Q4_K"):
                t = "Q5_K"
            if self.n_expert == 8:
                t = "Q8_0"
            self.i_attention_wv += 1
        elif cat == "attn_k":
            if self.n_expert == 8:
                t = "Q8_0"
            elif ft == "IQ3_XS":
                t = "IQ3_XXS"
            elif ft == "IQ3_XXS":
                t = "IQ2_S"
        elif cat == "attn_q":
            if ft == "IQ3_XS":
                t = "IQ3_XXS"
            elif ft == "IQ3_XXS":
                t = "IQ2_S"
        elif cat == "ffn_down":
            i, n = self._layer(self.i_ffn_down, name)
            if ft == "Q2_K":
                t = "Q3_K"
            elif ft == "Q2_K_S":
                if i < n // 8:
                    t = "Q4_K"
            elif ft == "IQ3_XXS" and not o.has_imatrix:
                t = "Q4_K" if i < n // 8 else "Q3_K"
            elif ft == "Q3_K_M":
                t = "Q5_K" if i < n // 16 else ("Q4_K" if arch != "falcon" or self._more_bits(i, n) else "Q3_K")
            elif ft == "IQ3_M" and (i < n // 8 or (self.n_expert == 8 and self._more_bits(i, n))):
                t = "Q4_K"
            elif ft == "Q3_K_L":
                t = "Q4_K" if arch == "falcon" else "Q5_K"
            elif ft == "Q4_K_M":
                if arch == "falcon":
                    t = "Q6_K" if i < n // 16 else ("Q5_K" if self._more_bits(i, n) else "Q4_K")
                elif self._more_bits(i, n):
                    t = "Q6_K"
            elif i < n // 8 and ft in ("IQ4_NL", "IQ4_XS") and not o.has_imatrix:
                t = "Q5_K"
            elif ft == "Q5_K_M" and self._more_bits(i, n):
                t = "Q6_K"
            elif ft == "Q4_K_S" and arch != "falcon" and i < n // 8:
                t = "Q5_K"
            elif ft in ("Q4_0", "Q5_0") and o.has_imatrix and i < n // 8:
                t = "Q4_1" if ft == "Q4_0" else "Q5_1"
            self.i_ffn_down += 1
        elif cat == "attn_output":
            if arch != "falcon":
                if self.n_expert == 8:
                    if ft in ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M",
                              "IQ3_S", "IQ3_M", "IQ4_XS"):
                        t = "Q5_K"
                else:
                    t = {"Q2_K": "Q3_K", "IQ3_XXS": "IQ3_S", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K",
                         "IQ3_M": "Q4_K"}.get(ft, t)
            elif ft == "Q3_K_L":
                t = "Q4_K"
        elif cat == "attn_qkv":  # unreachable (attn_qkv is attn_v-like), kept as llama.cpp has it
            pass
        elif cat == "ffn_gate":
            i, n = self._layer(self.i_ffn_gate, name)
            if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
                t = "IQ3_XXS"
            self.i_ffn_gate += 1
        elif cat == "ffn_up":
            i, n = self._layer(self.i_ffn_up, name)
            if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
                t = "IQ3_XXS"
            self.i_ffn_up += 1
        return t

    def _fallback(self, name: str, ncols: int, t: str) -> str:
        if ncols % _fmt(t).block == 0:
            return t
        if t not in FALLBACK and _fmt(t).block > 32:
            raise QuantizeError(f"quantize: no fallback format for {t} (rows of {ncols} in {name})")
        back = fit_type(t, ncols)  # (the fallback, or F16 where its blocks do not divide the rows either)
        self.notes[name] = (t, back)
        return back

    def target(self, name: str, t) -> str:
        """The format name tensor `name` (gguf Tensor t) is written in."""
        if not self.allows_quantization(name, t.shape):
            return t.format.name
        cat = category(name)
        o = self.opt
        if o.token_embedding_type is not None and cat == "token_embd":
            return o.token_embedding_type
        if o.output_type is not None and cat == "output":
            return o.output_type
        new = self.default
        if new not in FLOAT:
            if not o.pure:
                new = self._mix_rule(new, name, t.n, cat)
            new = self._fallback(name, t.n, new)
        return new


def plan_ternary(f: gguf.GGUFFile, opt: Options, target: str) -> dict[str, str]:
    """I2_S (any model) and the ternary types of the BitNet families (bitnet.cpp's rules, not
    llama.cpp's mix): every layer matrix of 2+ dims in `target`; token_embd and output as
    --token-embedding-type / --output-type say, else kept in a BitNet family (bitnet.cpp keeps the
    embedding in float: a ternary embedding would be another model) and `target` otherwise; rows
    that are not whole blocks keep their format."""
    bitnet = f.metadata.get("general.architecture") in BITNET_ARCHS
    out = {}
    for name, t in f.tensors.items():
        if ggml_n_dims(tuple(t.shape)) < 2 or "ffn_gate_inp" in name or "_norm" in name:
            out[name] = t.format.name
        elif name in TOKEN_EMBD_NAMES and opt.token_embedding_type is not None:
            out[name] = opt.token_embedding_type
        elif name == "output.weight" and opt.output_type is not None:
            out[name] = opt.output_type
        elif name == "output.weight" and opt.leave_output_tensor:
            out[name] = t.format.name
        elif bitnet and name in TOKEN_EMBD_NAMES + ("output.weight",):
            out[name] = t.format.name
        elif t.n % get_format(target).block:
            out[name] = t.format.name
        else:
            out[name] = target
    return out


# ---- importance matrices ------------------------------------------------------------------------
def load_imatrix(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read an importance matrix in llama.cpp's GGUF format (<name>.in_sum2 / <name>.counts per
    matrix) or its legacy .dat format, into name -> float32 weights (one per column, per expert),
    normalised as llama-quantize does (sums / count; an expert never seen: 1)."""
    from .imatrix import read_imatrix
    return read_imatrix(path)


# ---- the output file (GGUF v3, written directly: gguf-py packs 100k vocabulary strings one call
# at a time, seconds per file; here each array is packed in one go) -----------------------------
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
       12: "<f8"}


def _gguf_str(v: str) -> bytes:
    b = v.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _kv_bytes(key: str, value, vt: int, et: int | None) -> bytes:
    """One GGUF key-value pair: key, value type, value (arrays: element type, count, elements)."""
    out = [_gguf_str(key), struct.pack("<I", vt)]
    if vt == 8:
        out.append(_gguf_str(value))
    elif vt == 9:
        items = list(value) if not isinstance(value, np.ndarray) else value
        out.append(struct.pack("<IQ", et, len(items)))
        if et not in _NP and et != 8:
            raise QuantizeError(f"quantize: metadata {key}: arrays of arrays are not copied by lowbit")
        if et == 8:
            enc = [x.encode("utf-8") for x in items]
            lens = np.fromiter((len(b) for b in enc), dtype="<u8", count=len(enc))
            out.append(b"".join(l + b for l, b in zip((x.tobytes() for x in lens), enc)))
        else:
            out.append(np.asarray(items, dtype=_NP[et]).tobytes())
    else:
        out.append(struct.pack(_SCALAR[vt], value))
    return b"".join(out)


class _GGUFOut:
    """A GGUF file written as quantize makes it: the header, metadata and tensor table first, then
    each tensor's bytes in plan order, aligned as the source's general.alignment says."""

    def __init__(self, path: str, kvs: list[bytes], tensors: list[tuple[str, tuple, int, int]], align: int):
        self.fh = open(path, "wb")
        self.align = align
        head = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(kvs))] + kvs
        offset = 0
        self.sizes = []
        for name, shape, type_id, nbytes in tensors:  # shape in numpy order; GGUF lists ne0 first
            dims = tuple(reversed(shape))
            head.append(_gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) +
                        struct.pack("<IQ", type_id, offset))
            offset += (nbytes + align - 1) // align * align
            self.sizes.append(nbytes)
        blob = b"".join(head)
        self.fh.write(blob + b"\0" * ((-len(blob)) % align))
        self.i = 0

    def write(self, raw) -> None:
        b = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        if b.size != self.sizes[self.i]:
            raise ValueError(f"quantize: tensor {self.i} has {b.size} bytes, planned {self.sizes[self.i]}")
        self.fh.write(memoryview(b))
        self.fh.write(b"\0" * ((-b.size) % self.align))
        self.i += 1

    def close(self) -> None:
        self.fh.close()


# ---- the file -------------------------------------------------------------------------------------
def _ternary(w: np.ndarray, block: int | None) -> bool:
    """Every block (or the whole tensor, block None) holds values in {0, +a, -a} for one a."""
    a = np.abs(w.reshape(-1, block) if block else w.reshape(1, -1))
    m = a.max(axis=1, keepdims=True)
    return bool(np.all((a == 0) | (a == m)))


def _floats(t) -> np.ndarray:
    """Tensor t as float32 of its shape (F32 / F16 / BF16 exactly; others by lowbit's dequantizer)."""
    from .kernels import dequantize
    if t.format.name == "F32":
        return np.asarray(t.matrix()).view(np.float32).reshape(t.shape)
    if t.format.name == "F16":  # exact (ggml_fp16_to_fp32_row), as numpy converts halves
        return np.asarray(t.matrix()).view(np.float16).astype(np.float32).reshape(t.shape)
    if t.format.name == "BF16":  # exact: the bfloat16 bits are the float's top half
        return (np.asarray(t.matrix()).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
    w = dequantize(t.format, t.matrix(), t.n, w_scale=t.w_scale if t.format.tensor_pad else None)
    return w.reshape(t.shape)


def _convert(f: gguf.GGUFFile, name: str, target: str, opt: Options, imatrix: np.ndarray | None,
             threads: int | None) -> np.ndarray:
    """The bytes of tensor `name` in format target (one expert slice at a time for 3-D tensors)."""
    from .writer import absmean_ternary, quantize_tensor
    t = f.tensors[name]
    w = _floats(t)
    tf = get_format(target)
    arch = f.metadata.get("general.architecture")
    if target in TERNARY and name not in TOKEN_EMBD_NAMES + ("output.weight",):
        if not _ternary(w, None if target == "I2_S" else tf.block):
            if arch in BITNET_ARCHS:  # latent BitNet weights: BitNet's own ternarisation
                w = absmean_ternary(w)
            elif not opt.force:
                raise QuantizeError(f"quantize: {name} is not ternary (its values are not {{0, +-a}} per "
                                    f"{'tensor' if target == 'I2_S' else 'block of ' + str(tf.block)}): "
                                    f"{target} would make it garbage; --force packs it anyway")
    if target == "I2_S":
        return quantize_tensor(tf, w.reshape(-1, t.n), threads=threads)
    rows_per_slice = int(np.prod(t.shape[1:-1])) if len(t.shape) > 2 else (t.shape[0] if len(t.shape) == 2 else 1)
    w2 = w.reshape(-1, t.n)
    if imatrix is None or len(t.shape) <= 2:
        return quantize_tensor(tf, w2, imatrix=imatrix, threads=threads)
    n_exp = w2.shape[0] // rows_per_slice
    im = imatrix.reshape(n_exp, t.n)
    out = [quantize_tensor(tf, w2[e * rows_per_slice:(e + 1) * rows_per_slice], imatrix=im[e], threads=threads)
           for e in range(n_exp)]
    return np.concatenate(out)


def _resolve_mix(wtype: str) -> str:
    name = str(wtype).upper()
    name = ALIASES.get(name, name)
    if name == "I2_S" or name in MIXES:
        return name
    try:
        f = get_format(name)
    except ValueError:
        raise QuantizeError(f"quantize: unknown format {wtype!r}; types: {', '.join(list(MIXES) + ['I2_S'])}") from None
    if not f.weight:
        raise QuantizeError(f"quantize: {f.name} is not a weight format")
    raise QuantizeError(f"quantize: {f.name} is a tensor format, not a file type; types: "
                        f"{', '.join(list(MIXES) + ['I2_S'])} (or --pure with one)")


def _check_format(kind: str, name: str | None) -> str | None:
    if name is None:
        return None
    try:
        f = get_format(name)
    except ValueError:
        raise QuantizeError(f"quantize: {kind}: unknown format {name!r}") from None
    if not f.weight:
        raise QuantizeError(f"quantize: {kind}: {f.name} is not a weight format")
    return f.name


def quantize_file(src: str | os.PathLike, dst: str | os.PathLike, wtype, embd_type=None, head_type=None,
                  progress: bool = False, *, pure: bool = False, leave_output_tensor: bool = False,
                  allow_requantize: bool = False, force: bool = False, imatrix=None,
                  threads: int | None = None) -> dict[str, str]:
    """Write dst: src with its tensors in the formats llama.cpp's mix `wtype` chooses (see the
    module doc). embd_type / head_type: --token-embedding-type / --output-type. imatrix: a path
    or a dict name -> float32 weights. Returns name -> format name, in the file's order."""
    if os.path.abspath(src) == os.path.abspath(dst):
        raise QuantizeError("quantize: IN and OUT are the same file")
    mix = _resolve_mix(wtype)
    opt = Options(mix, _check_format("--output-type", head_type), _check_format("--token-embedding-type", embd_type),
                  pure, leave_output_tensor, allow_requantize, force)
    im = load_imatrix(imatrix) if isinstance(imatrix, (str, os.PathLike)) else imatrix
    opt.has_imatrix = im is not None
    if im is not None:
        for k, v in im.items():
            if not np.all(np.isfinite(v)):
                raise QuantizeError(f"quantize: the importance matrix has a non-finite value for {k}")
    with gguf.open(src) as f:
        arch = f.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise gguf.GGUFError(f"{src}: general.architecture is missing")
        if head_type is not None and "output.weight" not in f.tensors:
            raise QuantizeError(f"quantize: {src} has no output.weight (its head is tied to token_embd): "
                                f"--token-embedding-type sets the head's format")
        if mix == "I2_S" or (arch in BITNET_ARCHS and mix in TERNARY):
            order = list(f.tensors)  # bitnet.cpp's rules keep the source's order
            targets = plan_ternary(f, opt, mix)
            notes: dict[str, tuple[str, str]] = {}
            file_type = I2S_FILE_TYPE if mix == "I2_S" else MIXES[mix][0]
        else:
            order = llama_order(f.tensors)
            planner = Planner(f, opt)
            targets = {name: planner.target(name, f.tensors[name]) for name in order}
            notes, file_type = planner.notes, MIXES[mix][0]
        # refuse what cannot be made before writing anything
        for name in order:
            t, target = f.tensors[name], targets[name]
            if target == t.format.name:
                continue
            tf = get_format(target)
            has, needs, _ = _quantizer_info(tf)
            if not has:
                raise QuantizeError(f"quantize: lowbit has no quantizer for {target} yet ({name})")
            requires = (target in REQUIRES_IMATRIX or (target == "Q2_K" and mix == "Q2_K_S")) and \
                name not in TOKEN_EMBD_NAMES + ("output.weight",)
            if (needs or requires) and (im is None or name not in im):
                raise QuantizeError(f"quantize: {target} ({name}) needs an importance matrix: lowbit imatrix "
                                    f"-m MODEL -f TEXT -o imatrix.gguf, then --imatrix imatrix.gguf")
            if _is_quantized(t.format) and _is_quantized(tf) and not allow_requantize and \
                    not (t.format.name in TERNARY and target in TERNARY):
                raise QuantizeError(f"quantize: {name} is already {t.format.name}: requantizing loses "
                                    f"precision twice (--allow-requantize to do it anyway)")
        tmp = str(dst) + ".part"
        kvs = []
        for k, v in f.metadata.items():
            if k in ("general.file_type", "general.quantization_version"):
                continue
            vt, et = f.metadata_types[k]
            kvs.append(_kv_bytes(k, v, vt, et))
        kvs.append(_kv_bytes("general.quantization_version", QUANTIZATION_VERSION, 4, None))
        kvs.append(_kv_bytes("general.file_type", file_type, 4, None))
        plan = []
        for name in order:
            tf, t = get_format(targets[name]), f.tensors[name]
            rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
            plan.append((name, tuple(t.shape), tf.id, rows * tf.row_bytes(t.n) + tf.tensor_pad))
        out = _GGUFOut(tmp, kvs, plan, f.alignment)
        try:
            bar = _progress(progress, sum(p[3] for p in plan), "quantize")
            for name in order:
                t, target = f.tensors[name], targets[name]
                if target == t.format.name:
                    raw = t.raw
                else:
                    slice_im = None
                    if im is not None and name in im and get_format(target).name not in FLOAT:
                        slice_im = np.asarray(im[name], dtype=np.float32)
                        n_exp = t.shape[0] if len(t.shape) == 3 else 1
                        if slice_im.size != t.n * n_exp:
                            if name not in TOKEN_EMBD_NAMES:
                                raise QuantizeError(f"quantize: the importance matrix has {slice_im.size} values for "
                                                    f"{name}, which needs {t.n * n_exp}")
                            slice_im = None
                    try:
                        raw = _convert(f, name, target, opt, slice_im, threads)
                    except ValueError as e:  # a row the quantizer cannot take (e.g. inf for a grid i-quant)
                        raise QuantizeError(f"quantize: {name}: {e}") from None
                out.write(raw)
                bar.update(np.asarray(raw).nbytes, name)
            bar.close()
            out.close()
        except BaseException:
            out.close()
            os.unlink(tmp)
            raise
        if progress and notes:  # one line per kind of fallback
            kinds: dict[tuple[str, str], int] = {}
            for fell in notes.values():
                kinds[fell] = kinds.get(fell, 0) + 1
            for (want, got), c in kinds.items():
                print(f"note: {c} tensors' rows are not whole {want} blocks: {got}", file=sys.stderr)
    os.replace(tmp, dst)
    return {name: targets[name] for name in order}


def _quantizer_info(fmt) -> tuple[bool, bool, bool]:
    from ._native import lib
    return tuple(lib.quantizer_info(fmt.id))


def _progress(enabled: bool, total_bytes: int, what: str):
    """A tqdm bar over bytes written (MB/s, ETA) when enabled, else a silent one."""
    from .progress import bar
    return bar(total_bytes, what, enabled=enabled)


def cmd_quantize(a: argparse.Namespace) -> int:
    wtype = a.type or a.type_pos
    if wtype is None:
        print("lowbit quantize: give the type (--type Q4_K_M, or as the third argument)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        types = _run(a, wtype)
    except QuantizeError as e:  # a request lowbit refuses: a usage error
        print(f"lowbit: error: {e}", file=sys.stderr)
        return 2
    size = os.path.getsize(a.output)
    counts: dict[str, int] = {}
    for v in types.values():
        counts[v] = counts.get(v, 0) + 1
    print(f"wrote {a.output}: {size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s, tensors " +
          ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())), file=sys.stderr)
    return 0


def _run(a: argparse.Namespace, wtype: str) -> dict[str, str]:
    return quantize_file(a.input, a.output, wtype, a.token_embedding_type or a.embd_type,
                         a.output_type or a.head_type, progress=not a.quiet and sys.stderr.isatty(),
                         pure=a.pure, leave_output_tensor=a.leave_output_tensor,
                         allow_requantize=a.allow_requantize, force=a.force, imatrix=a.imatrix,
                         threads=a.threads)


def add_parser(sub) -> None:
    q = sub.add_parser("quantize", help="rewrite a GGUF model in another weight format (llama.cpp's mixes)",
                       description="Rewrite IN with its tensors in the formats of llama.cpp's file type TYPE "
                                   "(Q4_K_M, Q5_K_S, Q6_K, IQ4_XS, Q8_0, ...: each tensor's format chosen by "
                                   "llama.cpp's rules, the bytes identical to llama-quantize's), or I2_S "
                                   "(bitnet.cpp's ternary format). lowbit's own quantizers; no llama.cpp needed.")
    q.add_argument("input", help="source GGUF")
    q.add_argument("output", help="GGUF to write (written to OUT.part, renamed when complete)")
    q.add_argument("type_pos", nargs="?", default=None, metavar="TYPE", help="file type (as llama-quantize takes it)")
    q.add_argument("--type", default=None, help="file type: " + " ".join(list(MIXES) + ["I2_S"]) +
                   " (IQ1_*, IQ2_*, IQ3_XXS: with --imatrix)")
    q.add_argument("--output-type", default=None, help="format of output.weight")
    q.add_argument("--token-embedding-type", default=None, help="format of token_embd")
    q.add_argument("--embd-type", default=None, help=argparse.SUPPRESS)  # older names of the two above
    q.add_argument("--head-type", default=None, help=argparse.SUPPRESS)
    q.add_argument("--pure", action="store_true", help="every quantizable tensor in the type's format (no mix)")
    q.add_argument("--leave-output-tensor", action="store_true", help="copy output.weight as it is")
    q.add_argument("--allow-requantize", action="store_true", help="quantize tensors that are already quantized")
    q.add_argument("--imatrix", default=None, metavar="FILE", help="importance matrix (lowbit imatrix / llama-imatrix: "
                                                                    "GGUF or legacy .dat)")
    q.add_argument("--force", action="store_true", help="pack non-ternary tensors into TQ1_0 / TQ2_0 / I2_S anyway")
    q.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all)")
    q.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=cmd_quantize)
