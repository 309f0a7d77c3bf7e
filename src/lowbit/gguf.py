"""GGUF loading: mmap, zero copy, every tensor validated before anything is returned.

A small reader of our own rather than gguf-py's: gguf-py cannot read bitnet.cpp's I2_S
(type 36, a slot mainline ggml has retired), and a loader must turn every kind of damage
into one clear error, never a numpy exception, a huge allocation or a crash.

    f = lowbit.gguf.open("model.gguf")
    f.metadata["general.architecture"]      # typed values: int, float, bool, str, list
    t = f.tensors["blk.0.attn_q.weight"]
    t.format.name, t.shape, t.raw           # raw: zero-copy uint8 view of the tensor bytes
    t.matrix()                              # uint8[rows, row_bytes]: what kernels take

Shapes are given in numpy order (outermost first); ``ne`` keeps ggml's order.
Any problem raises GGUFError("<file>: <where>: <problem>").
"""
from __future__ import annotations

import builtins
import mmap
import os
import stat
import struct
from dataclasses import dataclass, field

import numpy as np

from .formats import BY_ID, BY_NAME, Format
from .formats import formats as all_formats
from .formats import get as get_format

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_ARRAY_DEPTH = 4
MAX_STRING = 1 << 30
_U64 = struct.Struct("<Q")

# GGUF metadata value types: id -> (struct code or None, name)
_SCALARS = {
    0: ("<B", "uint8"), 1: ("<b", "int8"), 2: ("<H", "uint16"), 3: ("<h", "int16"),
    4: ("<I", "uint32"), 5: ("<i", "int32"), 6: ("<f", "float32"), 7: ("<?", "bool"),
    10: ("<Q", "uint64"), 11: ("<q", "int64"), 12: ("<d", "float64"),
}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
          10: "<u8", 11: "<i8", 12: "<f8"}
T_STRING, T_ARRAY = 8, 9


class GGUFError(ValueError):
    """A GGUF file that cannot be loaded; the message names the file, the place and the problem."""


@dataclass
class Tensor:
    name: str
    format: Format
    ne: tuple[int, ...]          # ggml order: ne[0] is the row length
    offset: int                  # absolute byte offset in the file
    nbytes: int                  # including the format's tensor pad (I2_S)
    raw: np.ndarray = field(repr=False)  # uint8[nbytes], a view into the mmap

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    @property
    def n(self) -> int:
        """Values per row."""
        return self.ne[0]

    @property
    def rows(self) -> int:
        r = 1
        for d in self.ne[1:]:
            r *= d
        return r

    @property
    def row_bytes(self) -> int:
        return self.format.row_bytes(self.n)

    def matrix(self) -> np.ndarray:
        """uint8[rows, row_bytes] view of the rows (without the I2_S scale and pad)."""
        return self.raw[: self.rows * self.row_bytes].reshape(self.rows, self.row_bytes)

    @property
    def w_scale(self) -> float:
        """The per-tensor scale (I2_S: the float right after the codes); 1.0 otherwise."""
        if self.format.tensor_pad == 0:
            return 1.0
        at = self.rows * self.row_bytes
        return float(self.raw[at : at + 4].view("<f4")[0])


class GGUFFile:
    """An opened GGUF file. Tensors are views into one read-only mmap."""

    def __init__(self, path: str, version: int, metadata: dict, tensors: dict[str, Tensor],
                 alignment: int, data_offset: int, mm: mmap.mmap | None):
        self.path = path
        self.version = version
        self.metadata = metadata
        self.tensors = tensors
        self.alignment = alignment
        self.data_offset = data_offset
        self.metadata_types: dict = {}  # key -> (value type, array element type or None)
        self._mm = mm
        self.memory = "mmap"  # where the bytes live: gguf.open's memory argument
        self.locked = False   # pinned by mlock

    def drop_pages(self, ranges) -> int:
        """Give back the resident pages of byte ranges [(address, bytes), ...] of this file's map
        that nothing reads any more (matrices the engine repacked into its own copy): with
        memory "mmap" only (a map of the file reads them again from it if they are ever touched;
        the copies of "copy" / "hugepages" would read back as zeros) and not under mlock.
        Returns the bytes given back."""
        if self.memory != "mmap" or self.locked or self._mm is None or not ranges or not hasattr(mmap, "MADV_DONTNEED"):
            return 0
        base = int(np.frombuffer(self._mm, dtype=np.uint8).ctypes.data)
        size, page, done = len(self._mm), mmap.PAGESIZE, 0
        for addr, nbytes in ranges:
            off = int(addr) - base
            if off < 0 or off + int(nbytes) > size:
                continue  # not in this file's map
            start, end = -(-off // page) * page, (off + int(nbytes)) // page * page
            if end > start:
                try:
                    self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)
                    done += end - start
                except OSError:
                    pass
        return done

    def close(self) -> None:
        """Drop this file's references to the mapping (views handed out keep it alive)."""
        self.tensors = {}
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # a tensor view is still in use; the mapping goes with it

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"


class _Cursor:
    """Bounds-checked reads from the header; every overrun is a GGUFError."""

    def __init__(self, buf, size: int, path: str):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0
        self.where = "header"

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {self.where}: {problem}")

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated (need {n} bytes at offset {self.pos}, file has {self.size})")

    def scalar(self, code: str):
        n = struct.calcsize(code)
        self.need(n)
        v = struct.unpack_from(code, self.buf, self.pos)[0]
        self.pos += n
        return v

    def u32(self) -> int:
        return self.scalar("<I")

    def u64(self) -> int:
        return self.scalar("<Q")

    def string(self) -> str:
        return self._strings(1)[0]

    def _strings(self, count: int) -> list[str]:
        """count strings in a row (a vocabulary, its merges; string() is one): the length and the bytes
        read in one loop (a 49152-token vocabulary took a third of a small model's load through a
        call chain per string)."""
        buf, pos, size, out = self.buf, self.pos, self.size, []
        length = _U64.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8)
            n = length(buf, pos)[0]
            pos += 8
            if n > MAX_STRING or pos + n > size:
                self.pos = pos
                if n > MAX_STRING:
                    raise self.fail(f"string length {n} is absurd")
                self.need(n)
            out.append(str(buf[pos:pos + n], "utf-8", "replace"))
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype][0])
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.fail("arrays nested too deep")
            etype = self.u32()
            count = self.u64()
            if etype in _NUMPY:
                width = np.dtype(_NUMPY[etype]).itemsize
                if count > (self.size - self.pos) // width:
                    raise self.fail(f"array of {count} values runs past the end of the file")
                a = np.frombuffer(self.buf, dtype=_NUMPY[etype], count=count, offset=self.pos).copy()
                self.pos += count * width
                return a.tolist()
            if etype == 7:
                if count > self.size - self.pos:
                    raise self.fail(f"array of {count} values runs past the end of the file")
                a = np.frombuffer(self.buf, dtype=np.uint8, count=count, offset=self.pos)
                self.pos += count
                return [bool(x) for x in a]
            if etype in (T_STRING, T_ARRAY):
                # every element takes at least 8 bytes (a length or a type+count)
                if count > (self.size - self.pos) // 8:
                    raise self.fail(f"array of {count} values runs past the end of the file")
                if etype == T_STRING:
                    return self._strings(count)
                return [self.value(etype, depth + 1) for _ in range(count)]
            raise self.fail(f"unknown array element type {etype}")
        raise self.fail(f"unknown metadata value type {vtype}")


MEMORY_MODES = ("mmap", "copy", "hugepages")


def open(path: str | os.PathLike, memory: str = "mmap", mlock: bool = False,  # noqa: A001 - the natural name
         progress: bool = False) -> GGUFFile:
    """Open and validate a GGUF file; raises GGUFError on any problem.

    memory: where the tensors' bytes live.
      "mmap"       a read-only map of the file (the default): nothing is read before it is used,
                   pages are shared with the page cache and with other processes; advised
                   MADV_HUGEPAGE (the page cache's 2 MB folios where the kernel has them).
      "copy"       the file read into private anonymous memory up front (llama.cpp's --no-mmap).
      "hugepages"  as "copy", the memory advised MADV_HUGEPAGE before it is touched, so the
                   kernel backs it with 2 MB pages where it can (transparent huge pages in
                   "madvise" or "always" mode): one TLB entry per 2 MB instead of per 4 KB
                   while decode streams the weights.
    mlock: pin the bytes in RAM (mlock(2)); a refusal (RLIMIT_MEMLOCK) is a warning, not an error.
    progress: a bar on stderr while a copy is read (files of 256 MB and more)."""
    path = os.fspath(path)
    if memory not in MEMORY_MODES:
        raise ValueError(f"memory must be one of {', '.join(MEMORY_MODES)}, got {memory!r}")
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise GGUFError(f"{path}: is a directory, not a GGUF file")
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError(f"{path}: not a regular file")
        size = st.st_size
        if size == 0:
            raise GGUFError(f"{path}: header: empty file")
        if memory == "mmap":
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            _advise_huge_map(mm)
        else:
            mm = _read_copy(fd, path, size, memory == "hugepages", progress)
    except OSError as e:
        raise GGUFError(f"{path}: cannot {'map' if memory == 'mmap' else 'read'}: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        f = _parse(path, mm, size)
    except BaseException:
        try:
            mm.close()
        except BufferError:  # pragma: no cover - no views are made before validation ends
            pass
        raise
    f.memory = memory
    if mlock:
        f.locked = _mlock(mm, size)
    return f


def _advise_huge_map(mm: mmap.mmap) -> None:
    """MADV_HUGEPAGE on the file's map. Where the page cache keeps large folios (Linux 6.x with
    ext4 or xfs, transparent huge pages in "madvise" or "always" mode), the pages this map reads
    in are 2 MB folios, mapped by one TLB entry each, and stay so for every later map of the file
    (pages already cached in 4 KB folios stay as they are until they are evicted). On the Zen 3
    VM of BENCHMARKS.md ("BitNet I2_S decode at DRAM speed") decode from 4 KB pages ran at
    0.7-0.9x of the same weights in 2 MB pages (a guest's TLB miss is a nested page walk). A file
    the page cache already holds in 4 KB folios (written by small writes, e.g. just quantized)
    keeps them until evicted: --hugepages is the remedy for it.
    Advisory: where the kernel cannot do it, nothing changes."""
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # (EINVAL where THP is compiled out)
            pass


def _read_copy(fd: int, path: str, size: int, huge: bool, progress: bool) -> mmap.mmap:
    """The whole file in private anonymous memory (MAP_PRIVATE: transparent huge pages apply to
    private anonymous memory under /sys/kernel/mm/transparent_hugepage/enabled; shared anonymous
    memory would be shmem, governed by another switch)."""
    from .progress import bar
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        mm.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: faults then allocate 2 MB pages
    view = memoryview(mm)
    b = bar(size, f"reading {os.path.basename(path)}", enabled=progress and size >= 256 << 20)
    try:
        at, piece = 0, 64 << 20
        while at < size:
            got = os.readv(fd, [view[at:min(size, at + piece)]])
            if got <= 0:
                raise GGUFError(f"{path}: the file ended at byte {at} while reading {size} (changed under us?)")
            at += got
            b.update(got)
    finally:
        b.close()
        view.release()
    return mm


def _mlock(mm: mmap.mmap, size: int) -> bool:
    import ctypes
    import warnings
    libc = ctypes.CDLL(None, use_errno=True)
    addr = np.frombuffer(mm, dtype=np.uint8, count=1).ctypes.data
    if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) == 0:
        return True
    err = ctypes.get_errno()
    warnings.warn(f"mlock of {size >> 20} MB of weights refused ({os.strerror(err)}): running unlocked "
                  f"(raise `ulimit -l`, or run without --mlock)", RuntimeWarning, stacklevel=3)
    return False


def huge_page_bytes(f: "GGUFFile") -> int:
    """Bytes of the file's memory that the kernel backs with huge pages now (/proc/self/smaps:
    AnonHugePages, plus FilePmdMapped for a map of the file); 0 where that cannot be read."""
    if f._mm is None:
        return 0
    lo = np.frombuffer(f._mm, dtype=np.uint8, count=1).ctypes.data
    hi = lo + len(f._mm)
    total, inside = 0, False
    try:
        with builtins.open("/proc/self/smaps") as sm:
            for line in sm:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):
                    a, b = (int(x, 16) for x in head.split("-"))
                    inside = a < hi and b > lo
                elif inside and line.startswith(("AnonHugePages:", "FilePmdMapped:")):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def _parse(path: str, mm: mmap.mmap, size: int) -> GGUFFile:
    c = _Cursor(mm, size, path)
    c.need(4)
    if bytes(mm[0:4]) != GGUF_MAGIC:
        raise c.fail(f"wrong magic {bytes(mm[0:4])!r}, not a GGUF file")
    c.pos = 4
    version = c.u32()
    if version not in (2, 3):
        raise c.fail(f"unsupported GGUF version {version} (lowbit reads 2 and 3)")
    n_tensors = c.u64()
    n_kv = c.u64()
    # A tensor info takes >= 8+4+8+4+8 bytes, a key/value >= 8+4+1: bound the counts by the file.
    if n_tensors > size // 32:
        raise c.fail(f"tensor count {n_tensors} is absurd for a file of {size} bytes")
    if n_kv > size // 13:
        raise c.fail(f"metadata count {n_kv} is absurd for a file of {size} bytes")

    metadata: dict = {}
    types: dict = {}  # key -> (GGUF value type, array element type or None): for writing it back
    for i in range(n_kv):
        c.where = f"metadata #{i}"
        key = c.string()
        c.where = f"metadata {key!r}"
        if key in metadata:
            raise c.fail("duplicate key")
        vtype = c.u32()
        etype = struct.unpack_from("<I", mm, c.pos)[0] if vtype == T_ARRAY and c.pos + 4 <= size else None
        metadata[key] = c.value(vtype)
        types[key] = (vtype, etype)

    infos = []
    for i in range(n_tensors):
        c.where = f"tensor #{i}"
        name = c.string()
        c.where = f"tensor {name!r}"
        n_dims = c.u32()
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"{n_dims} dimensions (1..{MAX_DIMS} allowed)")
        ne = tuple(c.u64() for _ in range(n_dims))
        type_id = c.u32()
        offset = c.u64()
        infos.append((name, ne, type_id, offset))

    c.where = "header"
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 \
            or alignment & (alignment - 1) or alignment > 1 << 20:
        raise c.fail(f"general.alignment={alignment!r} is not a power of two")
    data_offset = (c.pos + alignment - 1) // alignment * alignment

    tensors: dict = {}  # name -> (format, ne, start, nbytes) until all are checked
    spans = []
    for name, ne, type_id, offset in infos:
        c.where = f"tensor {name!r}"
        if name in tensors:
            raise c.fail("duplicate tensor name")
        fmt = BY_ID.get(type_id)
        if fmt is None or not fmt.weight:
            raise c.fail(f"unknown or unsupported type id {type_id}")
        if any(d == 0 for d in ne) or any(d > 1 << 40 for d in ne):
            raise c.fail(f"impossible shape {list(ne)}")
        count = 1
        for d in ne:
            count *= d
        if count > 1 << 50:
            raise c.fail(f"impossible shape {list(ne)} ({count} values)")
        if ne[0] % fmt.block:
            raise c.fail(f"row length {ne[0]} is not a whole number of {fmt.name} blocks of {fmt.block}")
        nbytes = count // ne[0] * fmt.row_bytes(ne[0]) + fmt.tensor_pad
        if offset % alignment:
            raise c.fail(f"data offset {offset} is not aligned to {alignment}")
        start = data_offset + offset
        if start + nbytes > size:
            raise c.fail(f"data [{start}, {start + nbytes}) runs past the end of the file ({size} bytes)")
        tensors[name] = (fmt, ne, start, nbytes)
        spans.append((start, start + nbytes, name))

    spans.sort()
    for (b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise GGUFError(f"{path}: tensor {n1!r}: data overlaps tensor {n0!r}")
    # every check passed: only now hand out views of the mapping
    tensors = {name: Tensor(name, fmt, ne, start, nbytes,
                            np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start))
               for name, (fmt, ne, start, nbytes) in tensors.items()}
    f = GGUFFile(path, version, metadata, tensors, alignment, data_offset, mm)
    f.metadata_types = types
    return f
