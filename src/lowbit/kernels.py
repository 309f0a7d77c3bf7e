"""The kernel API (DESIGN.md): quantize, dequantize, matmul, call statistics.

Every argument is checked here, with a message that names the problem, before any native
code runs; arrays are passed to the extension without copies (weights must already be
C-contiguous uint8; float activations are converted to float32 if needed, as they are
small). Native calls release the GIL.

    raw = t.matrix()                                  # uint8[rows, row_bytes], from gguf
    y = lowbit.kernels.matmul("Q4_K", raw, x)         # x float32[nt, n] -> float32[nt, rows]
"""
from __future__ import annotations

import numpy as np

from .formats import BY_ID, BY_NAME, Format
from .formats import formats as all_formats
from .formats import get as get_format
from ._native import lib

__all__ = ["quantize", "quantize_act", "dequantize", "matmul", "matmul_act", "split_tensor", "kernel",
           "stats", "reset_stats"]


def _weights(f: Format, raw, n: int | None) -> tuple[np.ndarray, int]:
    """Validate weight rows raw[rows, row_bytes]; return (raw, n)."""
    if not isinstance(raw, np.ndarray):
        raise TypeError(f"{f.name} weights must be a numpy uint8 array, not {type(raw).__name__}")
    if raw.dtype != np.uint8:
        raise TypeError(f"{f.name} weights must be uint8 bytes, not {raw.dtype}")
    if raw.ndim != 2:
        raise ValueError(f"{f.name} weights must be 2-D [rows, row_bytes], got shape {raw.shape}")
    if not raw.flags.c_contiguous:
        raise ValueError(f"{f.name} weights must be C-contiguous (lowbit never copies weights)")
    if not f.weight:
        raise ValueError(f"{f.name} is not a weight format")
    rb = raw.shape[1]
    if n is None:
        if rb % f.bytes:
            raise ValueError(f"{f.name}: a row of {rb} bytes is not a whole number of {f.bytes}-byte blocks")
        n = rb // f.bytes * f.block
    _check_n(f, n)
    if f.row_bytes(n) != rb:
        raise ValueError(f"{f.name}: a row of n={n} needs {f.row_bytes(n)} bytes, got {rb}")
    return raw, n


def _check_n(f: Format, n) -> None:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise TypeError(f"n must be an int, not {type(n).__name__}")
    if n <= 0 or n % f.block:
        raise ValueError(f"{f.name}: n={n} is not a positive multiple of the block size {f.block}")


def _floats(x, what: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"{what} must be a float array, not {x.dtype}")
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"{what} must be 1-D [n] or 2-D [nt, n], got shape {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)


def _w_scale(f: Format, w_scale) -> float:
    if f.tensor_pad and w_scale is None:
        raise ValueError(f"{f.name} needs the tensor's scale: pass w_scale= (Tensor.w_scale)")
    return 1.0 if w_scale is None else float(w_scale)


def _threads(threads) -> int:
    if threads is None:
        return 0
    if not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    return int(threads)


def quantize(fmt, w) -> np.ndarray:
    """Quantize float weights w[rows, n] into one flat uint8 tensor (with the format's pad)."""
    f = get_format(fmt)
    w = _floats(w, "weights")
    _check_n(f, w.shape[1])
    if not lib.capabilities(f.id)["quantize"]:
        raise ValueError(f"lowbit has no quantizer for {f.name}")
    return lib.quantize(f.id, w)[0]


def quantize_act(fmt, x) -> np.ndarray:
    """Quantize activations x[nt, n] (float) into uint8[nt, act_row_bytes] of format fmt."""
    f = get_format(fmt)
    if not f.activation:
        raise ValueError(f"{f.name} is not an activation format (activations: "
                         f"{', '.join(g.name for g in all_formats() if g.activation)})")
    x = _floats(x, "activations")
    _check_n(f, x.shape[1])
    return lib.quantize_act(f.id, x)


def dequantize(fmt, raw, n: int | None = None, w_scale: float | None = None) -> np.ndarray:
    """Dequantize rows raw[rows, row_bytes] of format fmt into float32[rows, n]."""
    f = get_format(fmt)
    if f.weight:
        raw, n = _weights(f, raw, n)
    else:  # activation rows (Q8_K, I8_S, ...): n must be given for I8_S
        if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 2:
            raise TypeError(f"{f.name} rows must be a 2-D uint8 array")
        if n is None:
            if f.name == "I8_S":
                raise ValueError("I8_S rows need n")
            n = raw.shape[1] // f.bytes * f.block
        _check_n(f, n)
        if f.row_bytes(n) != raw.shape[1]:
            raise ValueError(f"{f.name}: a row of n={n} needs {f.row_bytes(n)} bytes, got {raw.shape[1]}")
        raw = np.ascontiguousarray(raw)
    return lib.dequantize(f.id, raw, int(n), 1.0 if w_scale is None else float(w_scale))


def matmul_act(fmt, raw, act, n: int | None = None, *, out: np.ndarray | None = None,
               r0: int = 0, r1: int | None = None, threads: int | None = None,
               w_scale: float | None = None) -> np.ndarray:
    """out[t, r] = W[r] . act[t] for rows [r0, r1), act already quantized (uint8[nt, act_row_bytes]).

    Rows outside [r0, r1) of ``out`` are left as they were.
    """
    f = get_format(fmt)
    raw, n = _weights(f, raw, n)
    a = BY_NAME[f.act]
    if not isinstance(act, np.ndarray) or act.dtype != np.uint8 or act.ndim != 2 or not act.flags.c_contiguous:
        raise TypeError(f"activations must be a C-contiguous uint8[nt, {a.row_bytes(n)}] array of {a.name}")
    if act.shape[0] < 1:
        raise ValueError("need at least one token (nt >= 1)")
    if act.shape[1] != a.row_bytes(n):
        raise ValueError(f"{a.name} activations for n={n} need {a.row_bytes(n)} bytes per token, got {act.shape[1]}")
    rows, nt = raw.shape[0], act.shape[0]
    if r1 is None:
        r1 = rows
    if not (0 <= r0 <= r1 <= rows):
        raise ValueError(f"row range [{r0}, {r1}) is not inside [0, {rows})")
    if out is None:
        out = np.zeros((nt, rows), dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != (nt, rows) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {(nt, rows)}")
    lib.matmul_act(f.id, raw, act, int(n), _w_scale(f, w_scale), out, int(r0), int(r1), _threads(threads))
    return out


def matmul(fmt, raw, x=None, *, threads: int | None = None, w_scale: float | None = None) -> np.ndarray:
    """y[t, r] = W[r] . x[t]: quantize x[nt, n] to fmt's activation format, run the row kernels.

    ``fmt`` may be a gguf Tensor: ``matmul(tensor, x)`` (its format, rows and scale are used).
    For I2_S, ``raw`` may be the flat tensor exactly as a bitnet.cpp GGUF holds it (what
    ``quantize("I2_S", W)`` returns): rows = code bytes * 4 / n, the scale from its tail.
    """
    from .gguf import Tensor
    if isinstance(fmt, Tensor):
        t = fmt
        fmt, w_scale = t.format, t.w_scale if w_scale is None else w_scale
        x, raw = raw, t.matrix()
    if x is None:
        raise TypeError("matmul needs activations x")
    f = get_format(fmt)
    x = _floats(x, "activations")
    if isinstance(raw, np.ndarray) and raw.ndim == 1 and f.tensor_pad:
        raw, w_scale = split_tensor(f, raw, x.shape[1], w_scale)
    raw, n = _weights(f, raw, None)
    if x.shape[1] != n:
        raise ValueError(f"activations have {x.shape[1]} values per token, the weights' rows {n}")
    if x.shape[0] < 1:
        raise ValueError("need at least one token (nt >= 1)")
    act = lib.quantize_act(BY_NAME[f.act].id, x)
    return matmul_act(f, raw, act, n, threads=threads, w_scale=w_scale)


def split_tensor(fmt, flat: np.ndarray, n: int, w_scale: float | None = None) -> tuple[np.ndarray, float]:
    """A whole tensor as a GGUF file holds it (I2_S: every row's codes, then a 32-byte tail
    whose first 4 bytes are the float scale) -> (rows uint8[rows, row_bytes], scale)."""
    f = get_format(fmt)
    if not isinstance(flat, np.ndarray) or flat.dtype != np.uint8 or flat.ndim != 1:
        raise TypeError(f"a flat {f.name} tensor must be a 1-D uint8 array")
    _check_n(f, n)
    rb, body = f.row_bytes(n), flat.size - f.tensor_pad
    if body <= 0 or body % rb:
        raise ValueError(f"{f.name}: {flat.size} bytes are not whole rows of n={n} plus the {f.tensor_pad}-byte tail")
    scale = float(flat[body:body + 4].view("<f4")[0]) if w_scale is None else float(w_scale)
    return flat[:body].reshape(body // rb, rb), scale


def kernel(fmt, nt: int = 1) -> tuple[str, str] | None:
    """(kernel name, ISA level) that runs for fmt at window size nt (1..8)."""
    f = get_format(fmt)
    if not 1 <= nt <= 8:
        raise ValueError("nt must be in 1..8")
    return lib.kernel(f.id, nt)


def stats() -> list[dict]:
    """Row-kernel calls since the last reset: which kernel ran, per format and window
    (nt = 0: the format's GEMM, one call per matmul whatever its token count)."""
    return [dict(format=BY_ID[i].name, nt=nt, kernel=k, calls=c, rows=r)
            for i, nt, k, c, r in lib.stats()]


def reset_stats() -> None:
    lib.reset_stats()
