"""`--plot OUT.png` for `lowbit bench kernels|e2e|serve`: the ratio table as a bar chart.

matplotlib is an optional extra (`pip install 'lowbit[plot]'`); it is imported only when a plot
is drawn (the Agg backend: no display needed). The bench commands call `option(parser)` to add
the flag and `after(args, kind, results)` once they have their results; the CLI checks before
the benchmark starts that matplotlib is there and the output directory is writable (`check`).

Every chart draws ratios, lowbit over the peer (higher is better for lowbit), with a line at 1:
    kernels  per format, a bar per window size: ggml's time / lowbit's time per row and token
    e2e      prefill and decode: lowbit tok/s / llama.cpp tok/s
    serve    1 client and N clients: lowbit serve tok/s / llama_cpp.server tok/s
"""
from __future__ import annotations

import os


def option(p) -> None:
    p.add_argument("--plot", metavar="OUT.png", default=None,
                   help="also draw the ratios to this image (needs matplotlib: pip install 'lowbit[plot]')")


def check(path: str) -> str | None:
    """Why a plot to `path` cannot be drawn (None: it can), before any benchmark runs."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, which is not installed (pip install 'lowbit[plot]')"
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        return f"--plot {path}: the directory {d} does not exist"
    if not os.access(d, os.W_OK):
        return f"--plot {path}: the directory {d} is not writable"
    if os.path.isdir(path):
        return f"--plot {path} is a directory"
    return None


def after(args, kind: str, results) -> int:
    """Draw `results` of bench `kind` to args.plot when asked; 0 (the command's exit code)."""
    path = getattr(args, "plot", None)
    if path and results:
        draw(kind, results, path)
    return 0


def series(kind: str, results) -> tuple[str, list[str], dict[str, list[float | None]]]:
    """(title, group labels, {series name: one ratio per group}) of a bench's results."""
    if kind == "kernels":
        fmts = list(dict.fromkeys(r["format"] for r in results))
        nts = sorted({r["nt"] for r in results})
        by = {(r["format"], r["nt"]): r["ratio"] for r in results}
        t = results[0].get("threads", 1)
        return (f"row kernels: ggml time / lowbit time ({t} thread{'s' if t != 1 else ''})", fmts,
                {f"nt={nt}": [by.get((f, nt)) for f in fmts] for nt in nts})
    if kind == "e2e":
        return (f"{results['model']}, {results['threads']} threads: lowbit tok/s / llama.cpp tok/s",
                ["prefill", "decode"], {"lowbit / llama.cpp": [results["prefill_ratio"], results["decode_ratio"]]})
    if kind == "serve":
        lb, ll = results["lowbit"], results.get("llama")
        labels = ["1 client", "N clients"]
        if not ll:  # lowbit alone: how N clients scale over 1
            return ("lowbit serve: aggregate tok/s, N clients / 1 client", ["N / 1"],
                    {"lowbit": [lb["many"] / lb["one"]]})
        return ("lowbit serve tok/s / llama_cpp.server tok/s", labels,
                {"lowbit / llama_cpp.server": [lb["one"] / ll["one"], lb["many"] / ll["many"]]})
    raise ValueError(f"no plot for bench {kind!r}")


def draw(kind: str, results, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, labels, ser = series(kind, results)
    n = len(ser)
    width = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(labels) * max(n, 1) + 2), 4.0))
    for i, (name, vals) in enumerate(ser.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [v if v is not None else 0.0 for v in vals], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=45 if len(labels) > 6 else 0, ha="right" if len(labels) > 6 else "center")
    ax.set_ylabel("ratio (> 1: lowbit faster)")
    ax.set_title(title, fontsize=10)
    if n > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
