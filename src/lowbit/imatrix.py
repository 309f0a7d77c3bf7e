"""Importance matrices: llama.cpp's two file formats (read and write), and `lowbit imatrix`.

An importance matrix holds, for each weight matrix W[rows, n] of a model, the sum over tokens
of the squared activation x_j^2 that multiplied column j (one vector of n per expert for MoE
expert tensors), and how many tokens were summed. A quantizer weighs its rounding error by
these (csrc/quant/: qw = mean x^2 of the column).

Files (as llama.cpp's llama-imatrix writes them and llama-quantize reads them):
  GGUF    general.type = "imatrix", imatrix.datasets [str], imatrix.chunk_count u32,
          imatrix.chunk_size u32; per matrix <name>.in_sum2 F32 [n_mat, n] (the sums) and
          <name>.counts F32 [n_mat, 1] (tokens per expert)
  legacy  .dat: int32 entries; per entry int32 name length, the name, int32 ncall, int32 nval,
          float32[nval] = (sum / count) * ncall; then optionally int32 chunk count, int32
          length and the dataset file name
read_imatrix() normalises either to what the quantizers take: sum / count (an expert with no
tokens: 1), or legacy value / ncall.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np


class ImatrixError(ValueError):
    """A file that is not a readable importance matrix (one line, names the problem)."""


@dataclass
class Stats:
    """The collected sums of one weight matrix: sums[n_mat, n] (float32) and counts[n_mat]."""
    sums: np.ndarray
    counts: np.ndarray


@dataclass
class Imatrix:
    entries: dict[str, Stats] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False

    def weights(self) -> dict[str, np.ndarray]:
        """name -> float32 importance weights (n_mat * n values), as llama-quantize normalises them."""
        out = {}
        for name, s in self.entries.items():
            if self.legacy:
                ncall = int(s.counts[0]) if s.counts.size else 0
                w = s.sums.reshape(-1) / np.float32(ncall) if ncall > 0 else s.sums.reshape(-1).copy()
            else:
                n_mat = s.counts.size
                sums = s.sums.reshape(n_mat, -1)
                w = np.ones_like(sums)
                for j in range(n_mat):
                    c = np.float32(s.counts[j])
                    if c > 0:
                        w[j] = sums[j] / c
                w = w.reshape(-1)
            out[name] = w.astype(np.float32)
        return out


def _load_gguf(path: str) -> Imatrix:
    from . import gguf
    with gguf.open(path) as f:
        md = f.metadata
        im = Imatrix(datasets=[str(d) for d in md.get("imatrix.datasets", [])],
                     chunk_count=int(md.get("imatrix.chunk_count", 0)), chunk_size=int(md.get("imatrix.chunk_size", 0)))
        parts: dict[str, dict[str, np.ndarray]] = {}
        for name, t in f.tensors.items():
            for suffix in (".in_sum2", ".counts"):
                if name.endswith(suffix):
                    if t.format.name != "F32":
                        raise ImatrixError(f"{path}: {name} is {t.format.name}, not F32")
                    parts.setdefault(name[:-len(suffix)], {})[suffix] = \
                        np.asarray(t.matrix()).view(np.float32).reshape(t.shape).copy()
        for name, p in sorted(parts.items()):
            if len(p) != 2:
                raise ImatrixError(f"{path}: {name} has sums without counts or counts without sums")
            counts = np.round(p[".counts"].reshape(-1)).astype(np.int64)
            im.entries[name] = Stats(p[".in_sum2"].reshape(counts.size, -1), counts)
        if not im.entries:
            raise ImatrixError(f"{path}: no importance data (no <name>.in_sum2 tensors)")
    return im


def _load_legacy(path: str) -> Imatrix:
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ImatrixError(f"{path}: truncated at byte {pos} (not a GGUF or legacy .dat importance matrix)")
        v = struct.unpack_from(fmt, data, pos)
        pos += size
        return v
    (n_entries,) = take("<i")
    if n_entries < 1 or n_entries > 1_000_000:
        raise ImatrixError(f"{path}: not a GGUF or legacy .dat importance matrix ({n_entries} entries)")
    im = Imatrix(legacy=True)
    for _ in range(n_entries):
        (length,) = take("<i")
        if not 0 < length < 4096:
            raise ImatrixError(f"{path}: bad name length {length} at byte {pos - 4}")
        name = take(f"<{length}s")[0].decode("utf-8", "replace")
        ncall, nval = take("<ii")
        if nval < 1:
            raise ImatrixError(f"{path}: {name} has {nval} values")
        sums = np.frombuffer(data, np.float32, nval, pos).copy()
        if pos + 4 * nval > len(data):
            raise ImatrixError(f"{path}: truncated in {name}")
        pos += 4 * nval
        im.entries[name] = Stats(sums.reshape(1, -1), np.array([ncall], np.int64))
    if pos + 4 <= len(data):
        (im.chunk_count,) = take("<i")
        if pos + 4 <= len(data):
            (length,) = take("<i")
            if 0 < length <= len(data) - pos:
                im.datasets.append(take(f"<{length}s")[0].decode("utf-8", "replace"))
    return im


def load(path: str | os.PathLike) -> Imatrix:
    """Read an importance matrix file of either format."""
    path = str(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise ImatrixError(f"{path}: cannot open: {e.strerror}") from None
    return _load_gguf(path) if magic == b"GGUF" else _load_legacy(path)


def read_imatrix(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """name -> float32 importance weights, as llama-quantize derives them from the file."""
    return load(path).weights()


def save_gguf(im: Imatrix, path: str | os.PathLike) -> None:
    """Write im in llama.cpp's GGUF imatrix format (entries in name order)."""
    import gguf as ggufpy
    w = ggufpy.GGUFWriter(str(path), arch=None) if _writer_takes_no_arch() else ggufpy.GGUFWriter(str(path), "imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", list(im.datasets))
    w.add_uint32("imatrix.chunk_count", int(im.chunk_count))
    w.add_uint32("imatrix.chunk_size", int(im.chunk_size))
    for name in sorted(im.entries):
        s = im.entries[name]
        n_mat = s.counts.size
        w.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(s.sums.reshape(n_mat, -1), dtype=np.float32))
        w.add_tensor(f"{name}.counts", np.asarray(s.counts, dtype=np.float32).reshape(n_mat, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _writer_takes_no_arch() -> bool:
    import inspect

    import gguf as ggufpy
    p = inspect.signature(ggufpy.GGUFWriter.__init__).parameters.get("arch")
    return p is not None and p.default is None


def save_legacy(im: Imatrix, path: str | os.PathLike) -> None:
    """Write im in llama.cpp's legacy .dat format (entries with no tokens at all are left out)."""
    chunk = max(im.chunk_size, 1)
    keep = [n for n in sorted(im.entries) if np.any(im.entries[n].counts > 0)]
    with open(path, "wb") as fh:
        fh.write(struct.pack("<i", len(keep)))
        for name in keep:
            s = im.entries[name]
            b = name.encode()
            ncall = int((int(s.counts.max()) + chunk - 1) // chunk)
            n_mat = s.counts.size
            sums = s.sums.reshape(n_mat, -1).astype(np.float32)
            out = np.empty_like(sums)
            for j in range(n_mat):
                c = np.float32(s.counts[j])
                out[j] = (sums[j] / c) * np.float32(ncall) if c != 0 else np.float32(ncall)
            fh.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", ncall, out.size))
            fh.write(out.reshape(-1).tobytes())
        fh.write(struct.pack("<i", int(im.chunk_count)))
        ds = (im.datasets[-1] if im.datasets else "").encode()
        fh.write(struct.pack("<i", len(ds)) + ds)


# ---- lowbit imatrix: collect the matrix from a model running over a text -------------------------
def compute(model_path: str | os.PathLike | None, text: str, ctx: int = 512, chunks: int | None = None,
            threads: int | None = None, progress: bool = False, dataset: str = "") -> Imatrix:
    """llama.cpp's imatrix method: tokenize the text, cut it into chunks of ctx tokens (the first
    token of each replaced by BOS when the vocabulary adds one), run each chunk through the model
    from an empty context, and sum x_j^2 of the input of every matmul of a layer matrix (blk.*),
    per expert for MoE expert tensors, counting the tokens."""
    from .model import load
    from .progress import bar
    m = load(model_path, n_ctx=ctx, threads=threads)
    ids = m.tokenize(text)
    n_chunk = len(ids) // ctx
    if chunks is not None:
        n_chunk = min(n_chunk, chunks)
    if n_chunk < 1:
        raise ImatrixError(f"imatrix: the text has {len(ids)} tokens, fewer than one chunk of {ctx} "
                           f"(--ctx sets the chunk size)")
    bos = m.tokenizer.bos_id if getattr(m.tokenizer, "add_bos", False) else None
    addr = {}
    for name, t in m.file.tensors.items():
        if name.startswith("blk.") and len(t.shape) >= 2:
            addr.setdefault(int(t.matrix().ctypes.data), name)
    e = m.engine
    e.clear_act_sums()
    e.collect_acts(True)
    b = bar(n_chunk, "imatrix", unit="chunk", enabled=progress)
    try:
        for c in range(n_chunk):
            toks = list(ids[c * ctx:(c + 1) * ctx])
            if bos is not None:
                toks[0] = bos
            m.reset()
            m.forward(toks)
            b.update(1)
    finally:
        e.collect_acts(False)
        b.close()
    im = Imatrix(datasets=[dataset] if dataset else [], chunk_count=n_chunk, chunk_size=ctx)
    for w, (sums, counts) in e.act_sums().items():
        name = addr.get(int(w))
        if name is not None:
            im.entries[name] = Stats(np.asarray(sums, dtype=np.float32), np.asarray(counts, dtype=np.int64))
    return im


def cmd_imatrix(a) -> int:
    import sys
    try:
        with open(a.file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        print(f"lowbit: error: {a.file}: cannot read: {e.strerror}", file=sys.stderr)
        return 2
    fmt = a.output_format or ("dat" if str(a.output).endswith(".dat") else "gguf")
    im = compute(a.model, text, ctx=a.ctx, chunks=a.chunks, threads=a.threads,
                 progress=not a.quiet and sys.stderr.isatty(), dataset=os.path.basename(a.file))
    (save_legacy if fmt == "dat" else save_gguf)(im, a.output)
    print(f"wrote {a.output}: {len(im.entries)} matrices, {im.chunk_count} chunks of {im.chunk_size} tokens "
          f"({fmt})", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("imatrix", help="an importance matrix of a model over a text (llama.cpp's method)",
                       description="Run the model over the text in chunks of --ctx tokens and write, per layer "
                                   "matrix, the sums of the squared activations of its input columns (llama.cpp's "
                                   "imatrix; GGUF or legacy .dat). `lowbit quantize --imatrix FILE` reads it.")
    p.add_argument("-m", "--model", default=None, help="GGUF model (default: the default model)")
    p.add_argument("-f", "--file", required=True, help="a UTF-8 text file")
    p.add_argument("-o", "--output", default="imatrix.gguf", help="file to write (default imatrix.gguf)")
    p.add_argument("--output-format", choices=("gguf", "dat"), default=None,
                   help="gguf or the legacy dat (default: from the name; .dat is legacy)")
    p.add_argument("-c", "--ctx", type=int, default=512, help="tokens per chunk (default 512)")
    p.add_argument("--chunks", type=int, default=None, help="at most this many chunks")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_imatrix)
