"""Quantize wall time: lowbit quantize vs llama.cpp's llama_model_quantize on the same file,
file types and threads, in one process run (interleaved, median of --reps), and whether the
outputs are identical tensor for tensor.

    python tools/bench_quantize.py SRC.gguf --types Q8_0 Q4_K_M Q6_K IQ4_XS -t 2 --reps 3
    python tools/bench_quantize.py SRC.gguf --types IQ2_XS IQ3_XXS --imatrix imatrix.gguf -t 2
    python tools/bench_quantize.py --formats        # per format, one thread: lowbit vs ggml_quantize_chunk

Both run in this process (no interpreter start-up in either time); each writes to a temporary
file that is removed after the comparison. llama-cpp-python is needed (a benchmark, not the
runtime). The grid i-quants' tables (ggml's neighbour lists, built at its first use: ~5 s for
IQ2_XS, ~19 s for IQ1 on one core; lowbit's in < 0.3 s) are built on both sides before timing."""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", nargs="?")
    ap.add_argument("--formats", nargs="*", default=None, metavar="FMT",
                    help="per-format quantizer table (no file): these formats, or all")
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q4_K_M", "Q6_K", "Q5_K_S", "Q3_K_M", "IQ4_XS"])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--imatrix", default=None, help="importance matrix for both (GGUF or legacy .dat)")
    a = ap.parse_args()
    if a.formats is not None:
        return formats_table(a.formats)
    if not a.src:
        ap.error("give SRC.gguf (or --formats)")

    import llama_cpp
    import numpy as np

    from lowbit import gguf
    from lowbit.quantize import MIXES, quantize_file

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept alive: llama.cpp calls it
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))

    keep, im_arr = [], None
    if a.imatrix:  # llama_model_quantize takes the weights as a NULL-terminated array
        from lowbit.imatrix import read_imatrix

        class Entry(ctypes.Structure):
            _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.POINTER(ctypes.c_float)),
                        ("size", ctypes.c_size_t)]
        weights = read_imatrix(a.imatrix)
        im_arr = (Entry * (len(weights) + 1))()
        for i, (name, v) in enumerate(sorted(weights.items())):
            v = np.ascontiguousarray(v, dtype=np.float32)
            keep.append(v)
            im_arr[i] = Entry(name.encode(), v.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), v.size)
        im_arr[len(weights)] = Entry(None, None, 0)

    def theirs(dst, mix):
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype, p.nthread = MIXES[mix][0], a.threads
        if im_arr is not None:
            p.imatrix = ctypes.cast(im_arr, type(p.imatrix))
        assert llama_cpp.llama_model_quantize(a.src.encode(), dst.encode(), ctypes.byref(p)) == 0

    def ours(dst, mix):
        quantize_file(a.src, dst, mix, threads=a.threads, imatrix=a.imatrix)

    if any(m.startswith(("IQ1", "IQ2", "IQ3")) for m in a.types):  # both sides' grid tables, untimed
        from lowbit import kernels
        from lowbit.ggml_oracle import ggml
        one, ones = np.ones((1, 256), np.float32), np.ones(256, np.float32)
        for f in GRID:
            ggml().quantize(f, one, imatrix=ones)
            kernels.quantize(f, one, imatrix=ones)

    def same(x, y):
        with gguf.open(x) as f, gguf.open(y) as g:
            return all(t.format.name == g.tensors[n].format.name and
                       np.array_equal(np.asarray(t.raw), np.asarray(g.tensors[n].raw)) for n, t in f.tensors.items())

    size = os.path.getsize(a.src) / 1e6
    print(f"source {a.src} ({size:.0f} MB), threads {a.threads}, median of {a.reps}")
    print(f"| type | llama_model_quantize s | lowbit quantize s | lowbit / llama.cpp | identical |")
    print(f"|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for mix in a.types:
            tl, to = [], []
            for _ in range(a.reps):
                for fn, acc, name in ((theirs, tl, "ll"), (ours, to, "lb")):
                    t0 = time.perf_counter()
                    fn(os.path.join(d, f"{name}.gguf"), mix)
                    acc.append(time.perf_counter() - t0)
            ident = same(os.path.join(d, "lb.gguf"), os.path.join(d, "ll.gguf"))
            ml, mo = statistics.median(tl), statistics.median(to)
            print(f"| {mix} | {ml:.2f} | {mo:.2f} | {mo / ml:.2f} | {'yes' if ident else 'NO'} |", flush=True)


GRID = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]


def formats_table(only: list[str]) -> None:
    """256 rows x 4096 random normal values, importance weights x^2 of a random normal where the
    format reads them; one thread; min of 5; ratios in one run."""
    import time

    import numpy as np

    from lowbit import kernels
    from lowbit.ggml_oracle import ggml
    g = ggml()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 4096)).astype(np.float32)
    im = (rng.standard_normal(4096) ** 2).astype(np.float32)
    print("| format | imatrix | lowbit ms | ggml ms | lowbit / ggml | identical |")
    print("|---|---|---|---|---|---|")
    for f in ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
              "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0"] + GRID:
        if only and f not in only:
            continue
        if f in GRID:  # grid tables built before timing (ggml: at its first call)
            g.quantize(f, w[:1, :256], imatrix=im[:256])
            kernels.quantize(f, w[:1, :256], imatrix=im[:256])
        plain = f not in ("IQ2_XXS", "IQ2_XS", "IQ1_S")  # (these need an importance matrix)
        for imx in ((None,) if f in ("F16", "BF16", "Q8_0", "TQ1_0", "TQ2_0") else
                    (None, im) if plain else (im,)):
            a, b = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                x = kernels.quantize(f, w, imatrix=imx, threads=1)
                a.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                y = g.quantize(f, w, imatrix=imx)
                b.append(time.perf_counter() - t0)
            same = np.array_equal(x.reshape(y.shape), y)
            print(f"| {f} | {'yes' if imx is not None else 'no'} | {min(a) * 1e3:.1f} | {min(b) * 1e3:.1f} | "
                  f"{min(a) / min(b):.2f} | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
