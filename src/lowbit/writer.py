"""Writing GGUF files: the one place that turns a float tensor into a format's bytes and a set
of tensors into a model file. Used by `lowbit quantize` and `lowbit synth`.

    quantize_tensor(fmt, w)   float w[rows, n] -> uint8 bytes of format fmt, by lowbit's own
                              quantizers (csrc/quant/, byte-identical to ggml_quantize_chunk;
                              I2_S: absmean ternarisation, one fp32 scale after the codes)
    Writer(path, arch)        gguf-py's GGUFWriter plus: I2_S tensors (type 36, which gguf-py does
                              not know), metadata copied from another GGUF (e.g. the vocabulary)
"""
from __future__ import annotations

import os

import numpy as np

from .formats import fit_type
from .formats import get as get_format

# Metadata keys a model file takes from the file it was made from (the tokenizer), as they are.
VOCAB_PREFIX = "tokenizer."


def quantize_tensor(fmt, w: np.ndarray, imatrix: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """Quantize float weights w[..., n] (rows = product of the outer dims) into format fmt by
    lowbit's own quantizers (csrc/quant/: byte-identical to ggml_quantize_chunk).

    Returns uint8 bytes: [rows, row_bytes] for block formats, the flat tensor (rows then the
    scale and pad) for I2_S. imatrix: n importance weights shared by every row, or None.
    Raises ValueError if lowbit has no quantizer for fmt.
    """
    from .kernels import quantize
    f = get_format(fmt)
    w = np.ascontiguousarray(w, dtype=np.float32)
    n = w.shape[-1]
    if n % f.block:
        raise ValueError(f"{f.name}: a row of {n} values is not a whole number of {f.block}-value blocks")
    w2 = w.reshape(-1, n)
    raw = quantize(f, w2, imatrix=imatrix, threads=threads)
    return raw if f.tensor_pad else raw.reshape(w2.shape[0], -1)


def absmean_ternary(w: np.ndarray) -> np.ndarray:
    """BitNet b1.58's weight quantization of a whole tensor, in float: s = max(mean |W|, 1e-5),
    W -> clamp(round(W / s), -1, 1) * s (round half to even, as torch.round). A tensor that is
    already ternary (every finite nonzero |W| the same value) comes back unchanged, so
    re-quantizing a BitNet file never moves its scale. Computed by lowbit's I2_S quantizer
    (csrc/ref/ternary.cpp, the one implementation of the rule) and its dequantizer."""
    from .kernels import dequantize, quantize, split_tensor
    w = np.asarray(w, dtype=np.float32)
    n = w.shape[-1]
    rows, scale = split_tensor("I2_S", quantize("I2_S", w.reshape(-1, n)), n)
    return dequantize("I2_S", rows, n, w_scale=scale).reshape(w.shape)


class Writer:
    """A GGUF model file being written (gguf-py's GGUFWriter underneath).

        w = Writer("out.gguf", "llama")
        w.copy_metadata(src.metadata, prefix="tokenizer.")   # the vocabulary of another file
        w.add("blk.0.attn_q.weight", W, "Q4_0")               # float W[rows, n], quantized here
        w.add_raw(name, fmt, shape, raw)                      # bytes already in fmt
        w.close()
    """

    def __init__(self, path: str | os.PathLike, arch: str, progress: bool = False, fit: bool = False):
        """progress: a bar of the tensors added (lowbit synth on a terminal). fit: a tensor whose
        rows its format's blocks do not divide is stored in llama-quant's fallback format instead
        (formats.fit_type: Q4_K -> Q5_0, ...), as synth wants; otherwise that is an error."""
        import gguf
        self.fit = fit
        self._g = gguf
        self.w = gguf.GGUFWriter(str(path), arch)
        self.arch = arch
        from .progress import bar
        self._bar = bar(None, "tensors", unit="tensor", enabled=progress)

    # ---- metadata ------------------------------------------------------------------------
    def meta(self, key: str, value, kind: str | None = None) -> None:
        """Add one key; the type follows the Python value (int -> uint32 unless kind says
        'int32'/'uint64'/..., float -> float32, bool, str, list of one of those)."""
        g, w = self._g, self.w
        if kind is not None:
            vt = {"uint8": g.GGUFValueType.UINT8, "int8": g.GGUFValueType.INT8, "uint16": g.GGUFValueType.UINT16,
                  "int16": g.GGUFValueType.INT16, "uint32": g.GGUFValueType.UINT32, "int32": g.GGUFValueType.INT32,
                  "uint64": g.GGUFValueType.UINT64, "int64": g.GGUFValueType.INT64,
                  "float32": g.GGUFValueType.FLOAT32, "float64": g.GGUFValueType.FLOAT64,
                  "bool": g.GGUFValueType.BOOL, "string": g.GGUFValueType.STRING}[kind]
            w.add_key_value(key, value, vt)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, (int, np.integer)):
            w.add_int32(key, int(value)) if value < 0 else w.add_uint32(key, int(value))
        elif isinstance(value, (float, np.floating)):
            w.add_float32(key, float(value))
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, (list, tuple, np.ndarray)):
            w.add_array(key, list(value))
        else:
            raise TypeError(f"metadata {key}: cannot write a {type(value).__name__}")

    def copy_metadata(self, metadata: dict, prefix: str = "", skip: tuple[str, ...] = (),
                      types: dict | None = None) -> None:
        """Copy the keys of another file's metadata that start with prefix. types (GGUFFile's
        metadata_types) keeps each value's GGUF type; without it the type follows the value."""
        g = self._g
        for k, v in metadata.items():
            # the writer sets the architecture and lays the data out at its own alignment
            if not k.startswith(prefix) or k in skip or k in ("general.architecture", "general.alignment"):
                continue
            if isinstance(v, np.ndarray):
                v = v.tolist()
            if types and k in types:
                vt, et = types[k]
                self.w.add_key_value(k, v, g.GGUFValueType(vt), sub_type=None if et is None else g.GGUFValueType(et))
            else:
                self.meta(k, v)

    # ---- tensors -------------------------------------------------------------------------
    def add(self, name: str, w: np.ndarray, fmt="F32") -> None:
        """Add float tensor w (numpy order, last dim = row) stored as format fmt."""
        f = get_format(fmt)
        w = np.asarray(w, dtype=np.float32)
        if self.fit and f.name != "F32":
            f = get_format(fit_type(f.name, w.shape[-1]))
        if f.name == "F32":
            self.w.add_tensor(name, np.ascontiguousarray(w))
        else:
            self.add_raw(name, f, w.shape, quantize_tensor(f, w))
        self._bar.update(1, name)

    def add_raw(self, name: str, fmt, shape: tuple[int, ...], raw: np.ndarray) -> None:
        """Add a tensor whose bytes are already in format fmt; shape in values, numpy order."""
        f = get_format(fmt)
        raw = np.ascontiguousarray(raw).view(np.uint8)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        want = rows * f.row_bytes(shape[-1]) + f.tensor_pad
        if raw.size != want:
            raise ValueError(f"{name}: {f.name} {tuple(shape)} needs {want} bytes, got {raw.size}")
        if f.name in self._g.GGMLQuantizationType.__members__:
            self.w.add_tensor(name, raw.reshape(*shape[:-1], -1), raw_dtype=self._g.GGMLQuantizationType[f.name])
        else:
            # A type gguf-py does not know (I2_S, 36): int8 bytes keep GGUFWriter from converting
            # the byte shape; the type id is written as given.
            self.w.add_tensor(name, raw.view(np.int8), raw_shape=tuple(shape), raw_dtype=f.id)

    # ---- streaming (one tensor in memory at a time: `lowbit quantize` of big files) ---------
    def plan(self, name: str, fmt, shape: tuple[int, ...]) -> int:
        """Declare a tensor whose bytes come later through write(); returns its byte size."""
        f = get_format(fmt)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        nbytes = rows * f.row_bytes(shape[-1]) + f.tensor_pad
        raw_dtype = self._g.GGMLQuantizationType[f.name] if f.name in self._g.GGMLQuantizationType.__members__ else f.id
        # float32 as the declared dtype keeps GGUFWriter from reading the shape as bytes
        self.w.add_tensor_info(name, tuple(shape), np.dtype(np.float32), nbytes, raw_dtype=raw_dtype)
        return nbytes

    def begin_data(self) -> None:
        """After every plan(): write the header, metadata and tensor table."""
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_ti_data_to_file()

    def write(self, raw: np.ndarray) -> None:
        """The bytes of the next planned tensor, in plan order."""
        self.w.write_tensor_data(np.ascontiguousarray(raw).view(np.uint8).reshape(-1))

    def finish(self) -> None:
        self.w.close()

    def close(self) -> None:
        self._bar.close()
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()
