"""`lowbit quantize IN OUT --type T`: rewrite a GGUF model with its weight matrices in another
format, one tensor in memory at a time.

Which tensor gets which format (as llama.cpp's quantize decides, in simpler form):
    1-D tensors (norms, biases)            kept as they are
    the MoE router (ffn_gate_inp)          kept (routing is sensitive; it is small)
    token_embd.weight                      --embd-type (default: --type)
    output.weight                          --head-type (default: --type)
    every other matrix (2-D, 3-D experts)  --type
A matrix whose row length is not a whole number of the target's blocks keeps its format (a
note says so). BitNet families (bitnet, bitnet-b1.58) with a ternary --type (I2_S, TQ1_0,
TQ2_0): token_embd and output keep their format unless --embd-type / --head-type say otherwise
(bitnet.cpp keeps the embedding in float; a ternary embedding would be a different model), and
a matrix that is not ternary yet is ternarised per tensor with BitNet's absmean rule before TQ
packing (writer.absmean_ternary; already ternary tensors stay exact). --head-type on a model
whose head is tied to token_embd (no output.weight) is an error: --embd-type sets it. A tensor already in its target format is copied byte for byte. Otherwise it
is dequantized to float32 by lowbit's reference dequantizer and quantized by writer.py.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from . import gguf
from .formats import get as get_format
from .writer import Writer, absmean_ternary, quantize_tensor

BITNET_ARCHS = ("bitnet", "bitnet-b1.58")
TERNARY = ("I2_S", "TQ1_0", "TQ2_0")

# llama.cpp's general.file_type for files made of one weight format (llama_ftype; I2_S is
# bitnet.cpp's). Informational only: loaders read each tensor's own type.
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
             "Q6_K": 18, "IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XXS": 23, "IQ1_S": 24, "IQ4_NL": 25,
             "IQ3_S": 26, "IQ2_S": 28, "IQ4_XS": 30, "IQ1_M": 31, "BF16": 32, "TQ1_0": 36, "TQ2_0": 37,
             "I2_S": 40, "MXFP4": 38}


def plan(f: gguf.GGUFFile, wtype, embd_type=None, head_type=None) -> dict[str, tuple[object, str]]:
    """name -> (target Format, note) for every tensor of f."""
    wt = get_format(wtype)
    bitnet_ternary = f.metadata.get("general.architecture") in BITNET_ARCHS and wt.name in TERNARY
    out = {}
    for name, t in f.tensors.items():
        if len(t.shape) == 1 or "ffn_gate_inp" in name:
            out[name] = (t.format, "kept")
            continue
        if bitnet_ternary and ((name == "token_embd.weight" and embd_type is None) or
                               (name == "output.weight" and head_type is None)):
            out[name] = (t.format, "kept: BitNet's ternary formats are for the layer matrices")
            continue
        target = get_format(embd_type or wt) if name == "token_embd.weight" else \
            get_format(head_type or wt) if name == "output.weight" else wt
        if t.n % target.block:
            out[name] = (t.format, f"kept: rows of {t.n} are not whole {target.name} blocks of {target.block}")
        else:
            out[name] = (target, "")
    return out


def convert(f: gguf.GGUFFile, name: str, target) -> "np.ndarray":  # noqa: F821
    """The bytes of tensor `name` in format target."""
    from .kernels import dequantize
    t = f.tensors[name]
    if t.format.id == target.id:
        return t.raw
    w = dequantize(t.format, t.matrix(), t.n, w_scale=t.w_scale if t.format.tensor_pad else None)
    if target.name in ("TQ1_0", "TQ2_0") and f.metadata.get("general.architecture") in BITNET_ARCHS \
            and name not in ("token_embd.weight", "output.weight"):
        w = absmean_ternary(w)  # TQ packing rounds per block by max |W|: ternarise the tensor first
    return quantize_tensor(target, w.reshape(t.shape))


def quantize_file(src: str | os.PathLike, dst: str | os.PathLike, wtype, embd_type=None, head_type=None,
                  progress: bool = False) -> dict[str, str]:
    """Write dst: src with its matrices in wtype (see the module doc). Returns name -> format."""
    if os.path.abspath(src) == os.path.abspath(dst):
        raise ValueError("quantize: IN and OUT are the same file")
    wt = get_format(wtype)
    for fmt in (wt, embd_type, head_type):
        if fmt is not None and not get_format(fmt).weight:
            raise ValueError(f"quantize: {get_format(fmt).name} is not a weight format")
    with gguf.open(src) as f:
        if head_type is not None and "output.weight" not in f.tensors:
            raise ValueError(f"quantize: {src} has no output.weight (its head is tied to token_embd): "
                             f"--embd-type sets the head's format")
        p = plan(f, wt, embd_type, head_type)
        arch = f.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise gguf.GGUFError(f"{src}: general.architecture is missing")
        tmp = str(dst) + ".part"
        w = Writer(tmp, arch)
        try:
            w.copy_metadata(f.metadata, skip=("general.file_type",), types=f.metadata_types)
            if wt.name in FILE_TYPE:
                w.meta("general.file_type", FILE_TYPE[wt.name])
            for name, t in f.tensors.items():
                w.plan(name, p[name][0], t.shape)
            w.begin_data()
            t0 = time.perf_counter()
            for i, name in enumerate(f.tensors):
                w.write(convert(f, name, p[name][0]))
                if progress:
                    print(f"\r[{i + 1}/{len(f.tensors)}] {name:<40} -> {p[name][0].name:<8} "
                          f"{time.perf_counter() - t0:6.1f} s", end="", file=sys.stderr, flush=True)
            w.finish()
        except BaseException:
            w.finish()
            os.unlink(tmp)
            raise
        if progress:
            print(file=sys.stderr)
            for name, (fmt, note) in p.items():
                if note.startswith("kept:"):
                    print(f"note: {name} {note}", file=sys.stderr)
    os.replace(tmp, dst)
    return {name: fmt.name for name, (fmt, _) in p.items()}


def cmd_quantize(a: argparse.Namespace) -> int:
    types = quantize_file(a.input, a.output, a.type, a.embd_type, a.head_type, progress=not a.quiet and sys.stderr.isatty())
    size = os.path.getsize(a.output)
    counts: dict[str, int] = {}
    for v in types.values():
        counts[v] = counts.get(v, 0) + 1
    print(f"wrote {a.output}: {size / 1e6:.1f} MB, tensors " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())),
          file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    q = sub.add_parser("quantize", help="rewrite a GGUF model in another weight format",
                       description="Rewrite IN with its weight matrices in --type (norms, biases and the MoE "
                                   "router stay as they are). F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 TQ1_0 TQ2_0 "
                                   "and I2_S are quantized here; the k- and i-quants use ggml's own quantizers "
                                   "from llama-cpp-python (pip install llama-cpp-python).")
    q.add_argument("input", help="source GGUF")
    q.add_argument("output", help="GGUF to write (written to OUT.part, renamed when complete)")
    q.add_argument("--type", required=True, help="format of the weight matrices, e.g. F16, Q8_0, Q4_K, I2_S")
    q.add_argument("--embd-type", default=None, help="format of token_embd (default: --type)")
    q.add_argument("--head-type", default=None, help="format of output.weight (default: --type)")
    q.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    q.set_defaults(func=cmd_quantize)
