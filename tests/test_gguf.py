"""GGUF loading: a valid file round-trips; every kind of damage is a GGUFError, never a crash."""
import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import warnings

import numpy as np
import pytest
from gguf_bytes import ARR, F32, I32, STR, U32, build, sample

import lowbit
from lowbit import gguf
from lowbit.gguf import GGUFError


def write(tmp_path, data, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def test_valid_file_loads(tmp_path):
    data, src = sample()
    with lowbit.gguf.open(write(tmp_path, data)) as f:
        md = f.metadata
        assert md["general.architecture"] == "llama" and md["general.name"] == "tiny ünïcode"
        assert md["llama.block_count"] == 2 and md["llama.rope.freq_base"] == 10000.0
        assert md["x.i8"] == -7 and md["x.u64"] == 2**40 and md["x.i64"] == -(2**40) and md["x.bool"] is True
        assert md["tokenizer.ggml.tokens"] == ["<s>", "a", "bc", "ü"]
        assert md["tokenizer.ggml.scores"] == [0.0, -1.5, -2.0, 3.25]
        assert md["x.nested"] == [[1, 2], [3]] and md["x.bools"] == [True, False]
        q = f.tensors["blk.0.attn_q.weight"]
        assert q.format.name == "Q4_0" and q.shape == (3, 64) and q.ne == (64, 3) and q.rows == 3
        np.testing.assert_array_equal(q.matrix(), src["q40"])
        assert q.raw.base is not None and not q.raw.flags.writeable  # a view of the mapping
        norm = f.tensors["norm.weight"]
        np.testing.assert_array_equal(norm.matrix().view(np.float32), src["f32"])
        i2 = f.tensors["blk.0.ffn_up.weight"]
        assert i2.format.name == "I2_S" and i2.nbytes == 2 * 64 + 32 and i2.w_scale == 0.75
        assert i2.matrix().tobytes() == src["i2s"][:128]
        # the tensor is usable by the kernels as it is
        y = lowbit.kernels.matmul(q, np.ones((2, 64), np.float32))
        assert y.shape == (2, 3)


def test_gguf_py_written_file_loads(tmp_path):
    """A file written by gguf-py's GGUFWriter (the reference writer) loads with the same bytes."""
    import gguf
    p = str(tmp_path / "w.gguf")
    w = gguf.GGUFWriter(p, "llama")
    w.add_uint32("llama.context_length", 128)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b"])
    a = np.arange(64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("t", a)
    raw = np.arange(2 * 34, dtype=np.uint8).reshape(2, 34)
    w.add_tensor("q", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with lowbit.gguf.open(p) as f:
        assert f.metadata["llama.context_length"] == 128 and f.metadata["tokenizer.ggml.tokens"] == ["a", "b"]
        np.testing.assert_array_equal(f.tensors["t"].matrix().view(np.float32), a)
        assert f.tensors["q"].format.name == "Q8_0" and f.tensors["q"].shape == (2, 32)
        np.testing.assert_array_equal(f.tensors["q"].matrix(), raw)


@pytest.mark.parametrize("case,needle", [
    (b"GGUX" + b"\0" * 60, "wrong magic"),
    (b"GG", "truncated"),
    (b"", "empty file"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "unsupported GGUF version 1"),
    (b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0), "tensor count"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**62), "metadata count"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**61), "string length"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 77), "unknown metadata value type 77"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", ARR, U32, 2**60), "past the end"),
])
def test_bad_headers(tmp_path, case, needle):
    p = write(tmp_path, case)
    with pytest.raises(GGUFError) as e:
        lowbit.gguf.open(p)
    msg = str(e.value)
    assert needle in msg and p in msg and "\n" not in msg, msg


def one_tensor(tid, ne, nbytes, md=()):
    return build(list(md), [("w", tid, ne, bytes(nbytes))])


@pytest.mark.parametrize("data,needle", [
    (one_tensor(99, (32, 1), 18), "unknown or unsupported type id 99"),
    (one_tensor(2, (33, 1), 18), "not a whole number of Q4_0 blocks"),
    (one_tensor(2, (0, 1), 0), "impossible shape"),
    (one_tensor(2, (32, 2**45), 18), "impossible shape"),
    (one_tensor(12, (256, 4), 144), "runs past the end"),
    (one_tensor(36, (128, 1), 32), "runs past the end"),       # I2_S without its scale
    (one_tensor(9, (32, 1), 36), "unknown or unsupported type id 9"),  # Q8_1 is activation-only
    (one_tensor(0, (8,), 32, md=[("general.alignment", U32, 24)]), "not a power of two"),
    (build([], [("w", 0, (8,), bytes(32)), ("w", 0, (8,), bytes(32))]), "duplicate tensor name"),
    (build([("a", U32, 1), ("a", U32, 2)], []), "duplicate key"),
])
def test_bad_tensors(tmp_path, data, needle):
    p = write(tmp_path, data)
    with pytest.raises(GGUFError) as e:
        lowbit.gguf.open(p)
    assert needle in str(e.value) and "'w'" in str(e.value) or needle in str(e.value), str(e.value)


def test_overlapping_and_misaligned_tensors(tmp_path):
    data = bytearray(build([], [("a", 0, (8,), bytes(32)), ("b", 0, (8,), bytes(32))]))
    i = data.index(b"b") + 1 + 4 + 8 + 4   # name, n_dims, ne0, type -> offset field of "b"
    struct.pack_into("<Q", data, i, 0)
    with pytest.raises(GGUFError, match="overlaps"):
        lowbit.gguf.open(write(tmp_path, bytes(data)))
    struct.pack_into("<Q", data, i, 8)
    with pytest.raises(GGUFError, match="not aligned"):
        lowbit.gguf.open(write(tmp_path, bytes(data), "m2.gguf"))


def test_missing_file():
    with pytest.raises(GGUFError, match="cannot open"):
        lowbit.gguf.open("/nonexistent/model.gguf")


CORPUS_RUNNER = r"""
import json, os, sys
import lowbit
from lowbit.gguf import GGUFError
d = sys.argv[1]
res = {}
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    try:
        with lowbit.gguf.open(p) as f:
            for t in f.tensors.values():
                t.matrix().sum()           # touch every byte of every tensor
        res[name] = ["loaded", ""]
    except GGUFError as e:
        res[name] = ["rejected", str(e)]
    except BaseException as e:
        res[name] = ["other", f"{type(e).__name__}: {e}"]
print(json.dumps(res))
"""


def test_malformed_corpus(tmp_path):
    """Truncations, byte flips and wrong counts: every case loads or raises GGUFError (one line,
    naming the file); none crashes or hangs the interpreter (run in a child process)."""
    data, _ = sample()
    rng = np.random.default_rng(1)
    d = tmp_path / "corpus"
    d.mkdir()
    header_end = data.index(b"\0" * 8, 200)  # roughly where tensor data starts
    cases = {}
    for cut in list(range(0, header_end + 64)) + [len(data) - 1, len(data) - 33]:
        cases[f"trunc_{cut:05d}"] = data[:cut]
    for pos in range(0, header_end):
        for val in (0x00, 0xFF, int(rng.integers(0, 256))):
            b = bytearray(data)
            if b[pos] == val:
                continue
            b[pos] = val
            cases[f"flip_{pos:05d}_{val:02x}"] = bytes(b)
    for field, off in (("ntensors", 8), ("nkv", 16)):
        for v in (0, 1, 2, 3, 4, 17, 2**31, 2**63):
            b = bytearray(data)
            struct.pack_into("<Q", b, off, v)
            cases[f"count_{field}_{v}"] = bytes(b)
    for name, b in cases.items():
        (d / name).write_bytes(b)
    r = subprocess.run([sys.executable, "-c", CORPUS_RUNNER, str(d)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the loader crashed the interpreter (exit {r.returncode}): {r.stderr[-2000:]}"
    res = json.loads(r.stdout)
    assert len(res) == len(cases)
    other = {k: v for k, v in res.items() if v[0] == "other"}
    assert not other, f"{len(other)} cases raised something other than GGUFError: {list(other.items())[:5]}"
    for k, (kind, msg) in res.items():
        if kind == "rejected":
            assert "\n" not in msg and str(d / k) in msg, msg
    rejected = sum(v[0] == "rejected" for v in res.values())
    assert rejected > len(cases) // 2  # the damage is mostly in the header: most cases must be refused
    assert res["trunc_%05d" % (len(data) - 1)][0] == "rejected"


# --- where the weights live (issue 19): a map of the file, a copy, a copy in huge pages ---

def _thp() -> str:
    try:
        v = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
        return v[v.index("[") + 1:v.index("]")]
    except (OSError, ValueError):
        return "unknown"


@pytest.mark.parametrize("memory", ["copy", "hugepages"])
def test_memory_modes_give_the_same_bytes_and_logits(memory):
    from lowbit.model import default_model_path, load
    path = default_model_path()
    a = gguf.open(path)
    b = gguf.open(path, memory=memory)
    assert b.memory == memory and a.memory == "mmap"
    assert a.tensors.keys() == b.tensors.keys()
    for name, t in a.tensors.items():
        assert np.array_equal(t.raw, b.tensors[name].raw), name
    ids = [1, 504, 3458, 282, 4235, 30, 198]
    want = load(path, n_ctx=32).logits(ids)
    got = load(path, n_ctx=32, memory=memory).logits(ids)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


@pytest.mark.skipif(_thp() not in ("madvise", "always"),
                    reason="needs transparent huge pages in madvise or always mode "
                           "(/sys/kernel/mm/transparent_hugepage/enabled)")
def test_hugepages_are_huge():
    from lowbit.model import default_model_path
    path = default_model_path()
    f = gguf.open(path, memory="hugepages")
    size = os.path.getsize(path)
    # every whole 2 MB page inside the buffer (the ends may be partial); the kernel may fall back
    # to small pages when memory is fragmented, so ask for most, not all
    assert gguf.huge_page_bytes(f) >= (size - (4 << 20)) // 2, (gguf.huge_page_bytes(f), size)
    assert gguf.huge_page_bytes(gguf.open(path, memory="copy")) <= size // 2 or _thp() == "always"


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE") or not os.path.exists("/proc/self/smaps"),
                    reason="Linux's MADV_HUGEPAGE and /proc/self/smaps")
def test_the_map_is_advised_huge(tmp_path):
    """The default map carries MADV_HUGEPAGE (VmFlags "hg"), so the page cache reads the file in
    2 MB folios where the kernel can; the copy modes are not maps of the file."""
    from lowbit.model import default_model_path
    path = str(tmp_path / "m.gguf")
    shutil.copyfile(default_model_path(), path)
    f = gguf.open(path)

    def flags():
        out, cur = [], False
        for line in open("/proc/self/smaps").read().splitlines():
            if not line[:1].isupper():  # a mapping's header line: address range, ..., path
                cur = line.endswith(path)
            elif cur and line.startswith("VmFlags:"):
                out.append(line.split()[1:])
        return out

    maps = flags()
    assert len(maps) == 1 and "hg" in maps[0], maps
    assert f.tensors  # (the map stays alive until here)


def test_mlock_pins_or_warns():
    from lowbit.model import default_model_path
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = gguf.open(default_model_path(), mlock=True)
    assert f.locked or any("mlock" in str(x.message) for x in w)


def test_memory_mode_is_checked():
    from lowbit.model import default_model_path
    with pytest.raises(ValueError, match="memory must be one of"):
        gguf.open(default_model_path(), memory="swap")


@pytest.mark.parametrize("cmd", ["memory", "ttft"])
def test_bench_memory_and_ttft_reject_bad_modes(cmd):
    r = subprocess.run([sys.executable, "-m", "lowbit.cli", "bench", cmd, "--modes", "mmap,mmap"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "distinct values" in r.stderr and "Traceback" not in r.stderr


def test_ttft_child_loads_in_each_mode():
    from lowbit.bench import _ttft_child
    from lowbit.model import default_model_path
    for mode in ("mmap", "copy"):
        r = _ttft_child(default_model_path(), 1, mode)
        assert 0 < r["load_s"] <= r["ttft_s"]


def test_attention_bytes_match_gguf_py():
    """run --stats splits a step's weight bytes by block: the attention matrices' bytes per layer,
    checked against gguf-py's reader of the same file."""
    from gguf import GGUFReader
    from lowbit.generate import attention_bytes
    from lowbit.model import default_model_path
    path = default_model_path()
    got = attention_bytes(gguf.open(path))
    want: dict[int, int] = {}
    for t in GGUFReader(path).tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and parts[2].startswith("attn_") and not parts[2].endswith("norm"):
            want[int(parts[1])] = want.get(int(parts[1]), 0) + int(t.n_bytes)
    assert got == [float(want[i]) for i in range(len(want))] and len(got) == 30
