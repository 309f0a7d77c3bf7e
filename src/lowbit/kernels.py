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

__all__ = ["quantize", "quantize_act", "dequantize", "matmul", "matmul_act", "matmul_glu", "glu", "split_tensor",
           "kernel", "glu_kernel", "quant_act_kernel", "stats", "reset_stats"]

GLU_KINDS = {"silu": 0, "relu2": 1, "geglu": 3}  # csrc/kernels.h GluKind (the epilogue alone: all three)
FUSED_GLU_KINDS = ("silu", "relu2", "geglu")     # matmul_glu's (gate, up and the epilogue fused)
GLU_OPS = {0: "silu", 1: "relu2", 2: "swiglu_oai", 3: "geglu"}  # counter kinds -> names (stats)


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


def quantize(fmt, w, imatrix=None, threads=None) -> np.ndarray:
    """Quantize float weights w[rows, n] into one flat uint8 tensor (with the format's pad) by
    lowbit's own quantizers (csrc/quant/, byte-identical to ggml_quantize_chunk), rows split
    over threads. imatrix: n importance weights (one per column) or None."""
    f = get_format(fmt)
    w = _floats(w, "weights")
    _check_n(f, w.shape[1])
    has, needs, _ = lib.quantizer_info(f.id)
    if not has:
        raise ValueError(f"lowbit has no quantizer for {f.name}")
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if imatrix.size != w.shape[1]:
            raise ValueError(f"{f.name}: the importance matrix has {imatrix.size} values for rows of {w.shape[1]}")
    elif needs:
        raise ValueError(f"{f.name} needs an importance matrix (lowbit imatrix)")
    return lib.quantize_rows(f.id, w, imatrix, _threads(threads))[0]


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
               w_scale: float | None = None, repacked: bool = False) -> np.ndarray:
    """out[t, r] = W[r] . act[t] for rows [r0, r1), act already quantized (uint8[nt, act_row_bytes]).

    Rows outside [r0, r1) of ``out`` are left as they were. repacked: run the rows (of a format in
    R8_FORMATS, a multiple of 8 of them) in the layout the engine repacks them to at load (csrc/repack.h),
    by that layout's kernels (ValueError where this level has none: repacked_layouts()).
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
    lib.matmul_act(f.id, raw, act, int(n), _w_scale(f, w_scale), out, int(r0), int(r1), _threads(threads),
                   repacked=bool(repacked))
    return out


def repacked_layouts() -> list[str]:
    """The formats whose matrices the engine repacks at load at this level (csrc/repack.h):
    those of R8_FORMATS whose R8 layout has kernels at the selected level (avx2: Q4_K, Q4_0, Q4_1;
    avx512: all six), else [].
    The engine's LOWBIT_NO_REPACK=1 keeps every matrix as the file has it."""
    return [name for name in R8_FORMATS if lib.has_repacked(BY_NAME[name].id)]


# The formats with an R8 layout (csrc/repack.h), and lib's ids of its kernels (csrc/kernels.h
# kR8FirstId + i for kR8Formats[i]): lib.kernel(R8_KERNEL_IDS["Q4_K"], nt), `lowbit bench kernels
# --formats Q4_K_R8`
R8_FORMATS = ("Q4_K", "Q5_K", "Q4_0", "Q4_1", "Q8_0", "IQ4_XS")
R8_KERNEL_IDS = {name: 1002 + i for i, name in enumerate(R8_FORMATS)}


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


def _glu_kind(kind) -> int:
    if not isinstance(kind, str) or kind not in GLU_KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, GLU_KINDS))}, got {kind!r}")
    return GLU_KINDS[kind]


def _level(isa) -> int:
    """A level name (``"avx2"``) or None (what dispatch selected) -> the native level index."""
    if isa is None:
        return -1
    names = list(lib.isa_names())
    if isa not in names:
        raise ValueError(f"isa must be one of {', '.join(names)} or None, got {isa!r}")
    return names.index(isa)


def glu(g, u, kind: str = "silu", *, isa: str | None = None) -> np.ndarray:
    """The FFN's GLU epilogue alone: act(g) * u elementwise, act = silu (g / (1 + exp(-g)),
    ggml's vectorised exp), relu2 ((g > 0 ? g : 0)^2) or geglu (gemma3: ggml's gelu-tanh through its
    fp16 table, csrc/kernels.h GLU_GEGLU); float32, same shape as g."""
    k = _glu_kind(kind)
    g = np.ascontiguousarray(np.asarray(g, dtype=np.float32))
    u = np.ascontiguousarray(np.asarray(u, dtype=np.float32))
    if g.shape != u.shape:
        raise ValueError(f"g and u differ in shape: {g.shape} vs {u.shape}")
    out = np.empty_like(g)
    lib.glu(g.reshape(-1), u.reshape(-1), out.reshape(-1), k, _level(isa))
    return out


def glu_kernel(isa: str | None = None) -> tuple[str, str]:
    """(epilogue name, ISA level) of the GLU epilogue that runs (at level isa)."""
    return lib.glu_kernel(_level(isa))


def matmul_glu(fmt_gate, raw_gate, raw_up, x, *, fmt_up=None, kind: str = "silu", threads: int | None = None,
               w_scale_gate: float | None = None, w_scale_up: float | None = None,
               isa: str | None = None) -> np.ndarray:
    """y[t, r] = act(G[r] . x[t]) * (U[r] . x[t]): an FFN's gate and up with the GLU epilogue
    fused (one pass over the rows, x quantized once), act = "silu" or "relu2".

    Bitwise equal to ``glu(matmul(fmt_gate, raw_gate, x), matmul(fmt_up, raw_up, x), kind)``.
    ``fmt_up`` defaults to ``fmt_gate``; the two formats must pair with the same activation
    format (else run the two matmuls). ``isa``: run that level's kernels (tests), default what
    dispatch selected.
    """
    fg = get_format(fmt_gate)
    fu = fg if fmt_up is None else get_format(fmt_up)
    k = _glu_kind(kind)
    if kind not in FUSED_GLU_KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, FUSED_GLU_KINDS))} (fused), got {kind!r}")
    level = _level(isa)
    if fg.act != fu.act:
        raise ValueError(f"gate ({fg.name}, activations {fg.act}) and up ({fu.name}, activations {fu.act}) "
                         "pair with different activation formats: use two matmul calls and glu()")
    x = _floats(x, "activations")
    raw_gate, n = _weights(fg, raw_gate, None)
    raw_up, nu = _weights(fu, raw_up, None)
    if n != nu:
        raise ValueError(f"gate rows have {n} values, up rows {nu}")
    if raw_gate.shape[0] != raw_up.shape[0]:
        raise ValueError(f"gate has {raw_gate.shape[0]} rows, up {raw_up.shape[0]}")
    if x.shape[1] != n:
        raise ValueError(f"activations have {x.shape[1]} values per token, the weights' rows {n}")
    if x.shape[0] < 1:
        raise ValueError("need at least one token (nt >= 1)")
    a = BY_NAME[fg.act]
    act = lib.quantize_act(a.id, x, level)  # once, shared by gate and up (F32: the floats' bytes)
    out = np.empty((x.shape[0], raw_gate.shape[0]), dtype=np.float32)
    lib.matmul_glu(fg.id, raw_gate, _w_scale(fg, w_scale_gate), fu.id, raw_up, _w_scale(fu, w_scale_up), act,
                   int(n), k, out, _threads(threads), level)
    return out


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


def quant_act_kernel(fmt) -> tuple[str, str] | None:
    """(quantizer name, level) that turns float activations into activation format fmt
    (Q8_0, Q8_1, Q8_K, I8_S), or None for a format that is not one."""
    f = get_format(fmt)
    return tuple(lib.quant_act_kernel(f.id)) if f.activation and f.name != "F32" else None


def stats() -> list[dict]:
    """Kernel calls since the last reset: which row kernel ran, per format and window (nt = 0:
    the format's GEMM, one call per matmul whatever its token count; nt = 16: the wide window,
    lib.wide_kernel); then the GLU epilogue's
    calls (format None, op "silu" / "relu2", values = rows x tokens); then the activation
    quantizers' (format: the activation format, op "quantize", rows = tokens, values = rows x
    n)."""
    rows = [dict(format=BY_ID[i].name, nt=nt, kernel=k, calls=c, rows=r)
            for i, nt, k, c, r in lib.stats()]
    glu = [dict(format=None, nt=None, op=GLU_OPS[kind], kernel=k, calls=c, rows=r, values=v)
           for kind, k, c, r, v in lib.glu_stats()]
    quant = [dict(format=BY_ID[i].name, nt=None, op="quantize", kernel=k, calls=c, rows=r, values=v)
             for i, k, c, r, v in lib.quant_stats()]
    return rows + glu + quant


def reset_stats() -> None:
    lib.reset_stats()
