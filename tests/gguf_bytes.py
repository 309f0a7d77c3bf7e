"""A tiny GGUF writer for tests: exact control over every byte (and over damage)."""
from __future__ import annotations

import struct

import numpy as np

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_CODES = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, v) -> bytes:
    if vtype in _CODES:
        return struct.pack(_CODES[vtype], v)
    if vtype == STR:
        return _str(v)
    if vtype == ARR:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(_value(etype, x) for x in items)
    raise ValueError(vtype)


def build(metadata: list[tuple[str, int, object]], tensors: list[tuple[str, int, tuple, bytes]],
          alignment: int = 32, version: int = 3) -> bytes:
    """metadata: (key, type, value); tensors: (name, ggml type id, ne (ggml order), data bytes)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata)))
    for key, vtype, v in metadata:
        out += _str(key) + struct.pack("<I", vtype) + _value(vtype, v)
    offset = 0
    offsets = []
    for name, tid, ne, data in tensors:
        offsets.append(offset)
        out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", tid, offset)
        offset += (len(data) + alignment - 1) // alignment * alignment
    out += b"\0" * ((-len(out)) % alignment)
    for (name, tid, ne, data), off in zip(tensors, offsets):
        out += data + b"\0" * ((-len(data)) % alignment)
    return bytes(out)


def sample(rng=None) -> tuple[bytes, dict]:
    """A small valid file with every metadata type and a few formats (I2_S included)."""
    rng = rng or np.random.default_rng(0)
    md = [
        ("general.architecture", STR, "llama"), ("general.name", STR, "tiny ünïcode"),
        ("llama.block_count", U32, 2), ("llama.rope.freq_base", F32, 10000.0),
        ("x.u8", U8, 7), ("x.i8", I8, -7), ("x.u16", U16, 65535), ("x.i16", I16, -300),
        ("x.i32", I32, -5), ("x.u64", U64, 2**40), ("x.i64", I64, -(2**40)), ("x.f64", F64, 0.125),
        ("x.bool", BOOL, True), ("tokenizer.ggml.tokens", ARR, (STR, ["<s>", "a", "bc", "ü"])),
        ("tokenizer.ggml.scores", ARR, (F32, [0.0, -1.5, -2.0, 3.25])),
        ("x.nested", ARR, (ARR, [(I32, [1, 2]), (I32, [3])])), ("x.bools", ARR, (BOOL, [True, False])),
    ]
    q40 = rng.integers(0, 256, (3, 2 * 18), dtype=np.uint8)
    q40[:, 0:2] = q40[:, 18:20] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    f32 = rng.standard_normal((2, 8)).astype(np.float32)
    i2s = rng.integers(0, 256, 2 * 128 // 4 * 2, dtype=np.uint8).tobytes() + struct.pack("<f", 0.75) + b"\0" * 28
    tensors = [("blk.0.attn_q.weight", 2, (64, 3), q40.tobytes()),
               ("norm.weight", 0, (8, 2), f32.tobytes()),
               ("blk.0.ffn_up.weight", 36, (256, 2), i2s)]
    return build(md, tensors), {"md": md, "q40": q40, "f32": f32, "i2s": i2s}
