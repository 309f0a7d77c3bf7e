#!/usr/bin/env python3
"""Generate csrc/ref/iq_tables.h, the i-quant lookup tables, from gguf-py.

The grids come from the `gguf` package (gguf.quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S, IQ1_S, IQ4_NL), which stores each grid as 2- or 3-bit indices into a small value
map. The kernels want them the way ggml-common.h packs them: one integer per grid row,
element j of the row in byte j (little-endian), so a row loads as 8 (or 4) int8 lanes.

  iq2xxs_grid uint64[256]   bytes in {0x08, 0x19, 0x2b}
  iq2xs_grid  uint64[512]   same values
  iq2s_grid   uint64[1024]  same values
  iq3xxs_grid uint32[256]   bytes in {0x04, 0x0c, ..., 0x3e}
  iq3s_grid   uint32[512]   bytes in {1, 3, ..., 15}
  iq1s_grid   uint64[2048]  bytes -1/0/+1 as int8 (0xff, 0x00, 0x01)
  kvalues_iq4nl int8[16]    IQ4_NL / IQ4_XS code book
  ksigns_iq2xs  uint8[128]  7 sign bits plus an 8th that makes the count of set bits even
  iq1s_delta / iq1m_delta   float, IQ1_S / IQ1_M grid offset

ksigns_iq2xs is derived from its definition (index | parity(index) << 7), not copied.

Usage:  python tools/gen_iq_tables.py            (rewrites csrc/ref/iq_tables.h)
        python tools/gen_iq_tables.py --check    (exit 1 if the checked-in file differs)
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = ROOT / "csrc" / "ref" / "iq_tables.h"

# (C name, gguf.quants class name, C element type, expected row count, elements per row)
GRIDS = [
    ("iq2xxs_grid", "IQ2_XXS", "uint64_t", 256, 8),
    ("iq2xs_grid", "IQ2_XS", "uint64_t", 512, 8),
    ("iq2s_grid", "IQ2_S", "uint64_t", 1024, 8),
    ("iq3xxs_grid", "IQ3_XXS", "uint32_t", 256, 4),
    ("iq3s_grid", "IQ3_S", "uint32_t", 512, 4),
    ("iq1s_grid", "IQ1_S", "uint64_t", 2048, 8),
]


def grid_rows(cls) -> np.ndarray:
    """The grid of a gguf.quants class as an int64 array [rows, elems] of its values."""
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    values = grid.astype(np.int64)
    if not np.array_equal(values.astype(np.float32), grid):
        raise ValueError(f"{cls.__name__}: grid values are not integers")
    return values


def pack_rows(values: np.ndarray) -> list[int]:
    """Pack each row: element j becomes byte j (two's complement for negative values)."""
    packed = []
    for row in values:
        word = 0
        for j, v in enumerate(row):
            if not -128 <= v <= 255:
                raise ValueError(f"grid value {v} does not fit a byte")
            word |= (int(v) & 0xFF) << (8 * j)
        packed.append(word)
    return packed


def ksigns() -> list[int]:
    """ksigns_iq2xs[i] = i | (popcount(i) odd) << 7: 8 signs with an even count of minuses."""
    return [i | ((bin(i).count("1") & 1) << 7) for i in range(128)]


def build_tables() -> dict:
    """All tables as plain Python data, keyed by their C name."""
    from gguf import quants

    tables = {}
    for name, cls_name, ctype, rows, elems in GRIDS:
        values = grid_rows(getattr(quants, cls_name))
        if values.shape != (rows, elems):
            raise ValueError(f"{cls_name}: grid shape {values.shape}, expected {(rows, elems)}")
        tables[name] = (ctype, pack_rows(values))
    # IQ1_M shares IQ1_S's grid; make sure gguf-py agrees before relying on it.
    if not np.array_equal(grid_rows(quants.IQ1_M), grid_rows(quants.IQ1_S)):
        raise ValueError("IQ1_M and IQ1_S grids differ")
    kvalues = [int(v) for v in quants.IQ4_NL.kvalues]
    if len(kvalues) != 16:
        raise ValueError("kvalues_iq4nl must have 16 entries")
    tables["kvalues_iq4nl"] = ("int8_t", kvalues)
    tables["ksigns_iq2xs"] = ("uint8_t", ksigns())
    tables["iq1s_delta"] = ("float", float(quants.IQ1_S.delta))
    tables["iq1m_delta"] = ("float", float(quants.IQ1_M.delta))
    return tables


def _format_array(name: str, ctype: str, values: list[int]) -> str:
    if ctype == "uint64_t":
        items, per_line = [f"0x{v:016x}" for v in values], 4
    elif ctype == "uint32_t":
        items, per_line = [f"0x{v:08x}" for v in values], 8
    else:
        items, per_line = [f"{v:4d}" for v in values], 16
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    body = ",\n".join("    " + line for line in lines)
    return f"inline constexpr {ctype} {name}[{len(values)}] = {{\n{body},\n}};\n"


def render_header(tables: dict) -> str:
    out = [
        "// GENERATED FILE, do not edit: written by tools/gen_iq_tables.py from the gguf package",
        "// (gguf.quants grids, IQ4_NL code book, IQ1 deltas). tests/test_iq_tables.py fails if",
        "// this file drifts from a fresh generation.",
        "//",
        "// Grids are packed as in ggml-common.h: element j of a grid row is byte j of the",
        "// integer (little-endian), so a row loads directly as 8 (or 4) byte lanes.",
        "// iq1s_grid bytes are int8 -1/0/+1. ksigns_iq2xs[i] = i | parity(i) << 7.",
        "#pragma once",
        "#include <cstdint>",
        "",
        "namespace lowbit::iq {",
        "",
    ]
    for name, (ctype, data) in tables.items():
        if ctype == "float":
            out.append(f"inline constexpr float {name} = {data!r}f;\n")
        else:
            out.append(_format_array(name, ctype, data))
    out.append("}  // namespace lowbit::iq\n")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ap.add_argument("--out", type=pathlib.Path, default=HEADER)
    args = ap.parse_args(argv)
    text = render_header(build_tables())
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date; run tools/gen_iq_tables.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
