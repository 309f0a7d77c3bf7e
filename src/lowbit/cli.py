"""The `lowbit` command line: `lowbit info`, `lowbit bench` (more arrive with the engine)."""
from __future__ import annotations

import argparse
import sys


def cmd_info(args: argparse.Namespace) -> int:
    from .formats import formats
    from ._native import lib
    c = lib.cpu_info()
    print(f"lowbit {__import__('lowbit').__version__}")
    print(f"CPU       {c['model'] or '(unknown)'}")
    print(f"features  {' '.join(c['features']) or '(baseline x86-64 only)'}")
    print(f"levels    CPU best {c['best']}, built up to {c['built']}, LOWBIT_MAX_ISA cap {c['cap']}"
          f" -> selected {c['selected']}")
    print(f"threads   {c['threads']}")
    if c["disabled"]:
        print(f"disabled  {' '.join(c['disabled'])}")
    nts = [1, 2, 4, 8]
    print()
    print(f"{'format':<8} {'act':<5} {'block':>5} {'bytes':>5}  " + "  ".join(f"nt={nt}" for nt in nts))
    for f in formats():
        if not f.weight:
            continue
        ks = [lib.kernel(f.id, nt) for nt in nts]
        names = [k[0] if k else "-" for k in ks]
        same = len(set(names)) == 1
        kern = names[0] if same else "  ".join(names)
        print(f"{f.name:<8} {f.act:<5} {f.block:>5} {f.bytes:>5}  {kern}" + ("  (all nt)" if same else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lowbit",
        description="Fast, verified CPU inference of low-bit GGUF models.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    s = sub.add_parser("info", help="CPU features, the selected ISA level and the kernel each format runs",
                       description="Print the CPU model and features, the ISA level dispatch selected "
                                   "(capped by LOWBIT_MAX_ISA), and for each weight format the row kernel "
                                   "that runs at window sizes 1, 2, 4 and 8.")
    s.set_defaults(func=cmd_info)
    from . import bench
    bench.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, OSError) as e:
        print(f"lowbit: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
