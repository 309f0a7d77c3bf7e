"""ggml itself as the oracle and the peer: the CPU backend the llama-cpp-python wheel builds.

Loaded with ctypes from the wheel's lib/ directory: libggml-base.so (quantizers, row sizes,
dequantizers) and libggml-cpu.so (type traits: from_float, vec_dot, vec_dot_type). Used by
the tests (parity) and by `lowbit bench` (speed on the same bytes). If the wheel is missing
this raises RuntimeError naming the fix (pip install "lowbit[test]").
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

GGML_TYPES = {  # ggml type ids (ggml.h); I2_S is bitnet.cpp's and unknown to ggml
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15,
    "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21,
    "IQ2_S": 22, "IQ4_XS": 23, "IQ1_M": 29, "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39,
}

_from_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_vec_dot_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_int)


class _TraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


from .peer import PeerMissing  # noqa: F401 - raised when llama-cpp-python is missing (lowbit.peer)


def _lib_dir() -> str:
    """The wheel's lib/ directory, or LOWBIT_GGML_LIB_DIR: the libggml-base.so / libggml-cpu.so
    of another build of the same ggml, e.g. one made for AVX2 only (BENCHMARKS.md), so that
    `lowbit bench` can put the avx2 level beside an AVX2 ggml. (The wheel's ggml is built for
    this machine: on an AVX-512 CPU its AVX2 source runs with 32 vector registers.)"""
    d = os.environ.get("LOWBIT_GGML_LIB_DIR")
    if not d:
        from .peer import require
        d = os.path.join(os.path.dirname(require().__file__), "lib")
    if not os.path.exists(os.path.join(d, "libggml-cpu.so")):
        raise RuntimeError(f"ggml oracle: no libggml-cpu.so in {d}")
    return d


def _soname_file(d: str, name: str) -> str:
    """The file of `name` that llama_cpp's libllama loads (its soname, name.so.0), so that the
    oracle and llama.cpp share one ggml in a process (the wheel ships copies, not symlinks: by
    the plain name.so ggml would be loaded twice, and its i-quant grid tables, up to 19 s each
    to build, built twice); name.so where there is no .so.0 (another build of ggml)."""
    so0 = os.path.join(d, name + ".so.0")
    return so0 if os.path.exists(so0) else os.path.join(d, name + ".so")


class Ggml:
    def __init__(self):
        d = self.lib_dir = _lib_dir()
        self.base = ctypes.CDLL(_soname_file(d, "libggml-base"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(_soname_file(d, "libggml-cpu"), mode=ctypes.RTLD_GLOBAL)
        self.cpu.ggml_cpu_init()
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TraitsCpu)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
        self.base.ggml_row_size.restype = ctypes.c_size_t
        self.base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        self.base.ggml_blck_size.restype = ctypes.c_int64
        self.base.ggml_blck_size.argtypes = [ctypes.c_int]
        self.base.ggml_type_size.restype = ctypes.c_size_t
        self.base.ggml_type_size.argtypes = [ctypes.c_int]
        self.base.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                                  ctypes.c_void_p]
        self.base.ggml_quantize_init.argtypes = [ctypes.c_int]

    def traits(self, name: str) -> _TraitsCpu:
        return self.cpu.ggml_get_type_traits_cpu(GGML_TYPES[name]).contents

    def row_size(self, name: str, n: int) -> int:
        return self.base.ggml_row_size(GGML_TYPES[name], n)

    def quantize(self, name: str, w: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        """ggml_quantize_chunk: float32 w[rows, n] -> uint8[rows, row_size] (ggml's own bytes).
        imatrix: n importance weights (one per column) or None (the formats that require one,
        ggml_quantize_requires_imatrix, get all ones)."""
        w = np.ascontiguousarray(w, dtype=np.float32)
        rows, n = w.shape
        t = GGML_TYPES[name]
        self.base.ggml_quantize_init(t)
        out = np.zeros((rows, self.row_size(name, n)), dtype=np.uint8)
        if imatrix is None and self.requires_imatrix(name):
            imatrix = np.ones(n, dtype=np.float32)
        if imatrix is not None:
            imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
            assert imatrix.shape == (n,), imatrix.shape
        self.base.ggml_quantize_chunk(t, w.ctypes.data, out.ctypes.data, 0, rows, n,
                                      imatrix.ctypes.data if imatrix is not None else None)
        return out

    def requires_imatrix(self, name: str) -> bool:
        """ggml_quantize_requires_imatrix: ggml_quantize_chunk asserts an importance matrix."""
        fn = self.base.ggml_quantize_requires_imatrix
        fn.restype = ctypes.c_bool
        fn.argtypes = [ctypes.c_int]
        return bool(fn(GGML_TYPES[name]))

    def from_float(self, name: str, x: np.ndarray) -> np.ndarray:
        """The CPU backend's from_float for an activation format: float32 x[nt, n] -> uint8 rows."""
        x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
        fn = _from_float_t(self.traits(name).from_float)
        out = np.zeros((x.shape[0], self.row_size(name, x.shape[1])), dtype=np.uint8)
        for i in range(x.shape[0]):
            fn(x[i].ctypes.data, out[i].ctypes.data, x.shape[1])
        return out

    def vec_dot_type(self, name: str) -> str:
        t = self.traits(name).vec_dot_type
        return next(k for k, v in GGML_TYPES.items() if v == t)

    def vec_dot_addr(self, name: str) -> int:
        """Address of the CPU backend's vec_dot for a weight format (for C++ benchmark loops)."""
        return int(self.traits(name).vec_dot)

    def vec_dot(self, name: str, w: np.ndarray, act: np.ndarray, n: int) -> np.ndarray:
        """out[t, r] = ggml vec_dot(W[r], act[t]) on the given bytes."""
        fn = _vec_dot_t(self.traits(name).vec_dot)
        out = np.zeros((act.shape[0], w.shape[0]), dtype=np.float32)
        s = ctypes.c_float()
        for t in range(act.shape[0]):
            for r in range(w.shape[0]):
                fn(n, ctypes.byref(s), 0, w[r].ctypes.data, 0, act[t].ctypes.data, 0, 1)
                out[t, r] = s.value
        return out


_instance: Ggml | None = None


def ggml() -> Ggml:
    global _instance
    if _instance is None:
        _instance = Ggml()
    return _instance
