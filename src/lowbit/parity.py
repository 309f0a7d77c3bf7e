"""`lowbit parity`: every row kernel on this CPU against the scalar reference and ggml's vec_dot.

For each weight format, each ISA level available here and each window size nt = 1..8, on
weights quantized by ggml itself (lowbit's quantizer for I2_S) and activations from lowbit's
activation quantizer:

  rel_ref    max |ours - scalar reference| / max |reference|        (contract: <= 1e-5)
  rel_ggml   max |ours - ggml vec_dot| / max |ggml|                  (contract: <= 1e-5)
  width      rows whose outputs differ in any bit from the same tokens run alone (I2: 0)

Exits 1 if any figure breaks its contract: a mismatch is a failure, not a line of output.
"""
from __future__ import annotations

import sys

import numpy as np

from ._native import lib
from .kernels import quantize, split_tensor
from .formats import BY_NAME, formats
from .formats import get as get_format

LEVELS = list(lib.isa_names())
TOL = 1e-5


def _weights(ggml, f, rows: int, n: int, rng):
    w = rng.standard_normal((rows, n)).astype(np.float32)
    if f.name == "I2_S":  # ggml has no I2_S: lowbit's own quantizer
        return split_tensor(f, quantize(f, w), n)
    return ggml.quantize(f.name, w), 1.0


def _run(f, raw, act, n, w_scale, isa):
    out = np.zeros((act.shape[0], raw.shape[0]), np.float32)
    lib.matmul_act(f.id, raw, act, n, w_scale, out, 0, raw.shape[0], 1, LEVELS.index(isa))
    return out


def parity(names: list[str], rows: int = 33, blocks: int = 4, out=sys.stdout) -> int:
    from .ggml_oracle import ggml as get_ggml
    ggml = get_ggml()
    rng = np.random.default_rng(0)
    levels = list(lib.levels())
    bad = 0
    print(f"{'format':<8} {'level':<9} {'nt':>2} {'rel_ref':>9} {'rel_ggml':>9} {'width':>5}  kernel", file=out)
    for name in names:
        f = BY_NAME[name]
        n = f.block * blocks if f.block > 1 else 96
        raw, w_scale = _weights(ggml, f, rows, n, rng)
        x = rng.standard_normal((8, n)).astype(np.float32)
        a = BY_NAME[f.act]
        act = x.view(np.uint8).reshape(8, -1) if a.name == "F32" else lib.quantize_act(a.id, x, 0)
        ref0 = _run(f, raw, act, n, w_scale, "scalar")
        theirs0 = None
        if a.name != "F32" and f.name != "I2_S":
            theirs0 = ggml.vec_dot(f.name, raw, act, n)
        tiles = None  # BF16 on AMX-BF16 tiles rounds its activations to bf16, as ggml's BF16 vec_dot does:
        if f.name == "BF16":  # the reference and ggml on the rounded activations (csrc/x86/bf16_tiles.inl)
            # (the BF16 quantizer's rounding, ggml's: the tiles' too, csrc/fp16.h f32_to_bf16)
            xb = (quantize("BF16", x).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(x.shape)
            tiles = (_run(f, raw, xb.view(np.uint8).reshape(8, -1), n, w_scale, "scalar"),
                     ggml.vec_dot(f.name, raw, ggml.from_float("BF16", x), n))
        for lv in levels:
            alone = np.concatenate([_run(f, raw, act[t:t + 1], n, w_scale, lv) for t in range(8)])
            ref, theirs = (tiles if tiles is not None and "_bf16_bf16_" in lib.kernel(f.id, 1, LEVELS.index(lv))[0]
                           else (ref0, theirs0))
            for nt in range(1, 9):
                ours = _run(f, raw, act[:nt], n, w_scale, lv)
                rel_ref = float(np.abs(ours - ref[:nt]).max() / max(np.abs(ref[:nt]).max(), 1e-30))
                rel_g = (float(np.abs(ours - theirs[:nt]).max() / max(np.abs(theirs[:nt]).max(), 1e-30))
                         if theirs is not None else float("nan"))
                width = int(np.any(ours.view(np.uint32) != alone[:nt].view(np.uint32), axis=0).sum())
                fail = rel_ref > TOL or (theirs is not None and rel_g > TOL) or width
                bad += bool(fail)
                k = lib.kernel(f.id, nt, LEVELS.index(lv))[0]
                g = f"{rel_g:9.2e}" if theirs is not None else f"{'-':>9}"
                print(f"{f.name:<8} {lv:<9} {nt:>2} {rel_ref:9.2e} {g} {width:>5}  {k}"
                      + ("   <-- MISMATCH" if fail else ""), file=out, flush=True)
    print(f"{'all within contract' if not bad else f'{bad} mismatches'} "
          f"({len(names)} formats x {len(levels)} levels x nt 1..8)", file=out)
    return 1 if bad else 0


def add_parser(sub) -> None:
    p = sub.add_parser("parity", help="every kernel on this CPU vs the scalar reference and ggml (exit 1 on mismatch)",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--formats", default=None, help="comma-separated weight formats (default: all)")
    p.add_argument("--rows", type=int, default=33, help="rows per matrix (odd on purpose)")
    p.set_defaults(func=lambda a: parity(
        [get_format(s.strip()).name for s in a.formats.split(",") if s.strip()] if a.formats
        else [f.name for f in formats() if f.weight], rows=a.rows))
