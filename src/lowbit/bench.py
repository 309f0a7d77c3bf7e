"""`lowbit bench`: lowbit's row kernels next to ggml's vec_dot on the same bytes, in one run.

    lowbit bench kernels [--formats Q4_0,Q4_K] [--nt 1,2,4,8,64] [--threads N] [--cpu N]
                         [--reps N] [--mb MB | --rows R] [--n N] [--json]
    lowbit bench membw [--mb MB] [--threads N]
    lowbit bench peak [--threads N]
    lowbit bench act [--formats Q8_0,Q8_1,Q8_K,I8_S] [--n N] [--rows R] [--reps N] [--cpu N] [--json]
    lowbit bench serve [-m MODEL] [-t 2] [--clients 8] [--tokens 128]   (lowbit/server/bench.py; --ray: bench_ray.py)
    lowbit bench pipeline [-m MODEL] [--stages 2] [--slots 4]   (lowbit/distributed/bench.py)

For each format the weight matrix is `--mb` MB of rows of `--n` values (a few hundred
distinct rows quantized by ggml's own quantizer, tiled to the working set), the activations
are quantized by each side's own activation quantizer (byte-identical for the Q8 formats).
Both sides run in C++ loops over the same rows on the same thread pool: ggml's vec_dot is
called once per (row, token), as ggml's mul_mat calls it; lowbit's kernel once per window.
Reported: µs per row per token, the ratio ggml/lowbit (> 1: lowbit is faster) and lowbit's
weight-streaming rate in GB/s. Times are medians of --reps runs after a warm-up.

`bench act` times the activation quantizers on one thread: --rows rows of --n standard-normal
values (the input of one layer's matmuls for a window of tokens), quantized by the quantizer
dispatch selected, by the scalar reference and by ggml's from_float (the CPU backend's, same
input, same run; I8_S is lowbit's own format and has none). Reported in ns per value, with
ggml/lowbit (> 1: lowbit is faster).

nt > 8 times matmul's own path (row tiles, windows of 8, the 16-token wide window where the level
has one, or the format's GEMM when its gate admits nt) and names what ran; for a format with a GEMM at the level (`lowbit info`: the k-quants
and legacy formats from avx2, I2_S) it also times both paths of the level, forced ("windows" /
"gemm" columns, and their ratio: > 1 means the GEMM is faster).
"""
from __future__ import annotations

import io
import json
import os
import sys

import numpy as np

from .formats import BY_ID, BY_NAME, Format
from .formats import formats as all_formats
from .formats import get as get_format
from . import plot
from ._native import lib
from .kernels import R8_FORMATS, R8_KERNEL_IDS, quantize, repacked_layouts, split_tensor

DEFAULT_FORMATS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                   "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "IQ1_S",
                   "IQ1_M", "TQ1_0", "TQ2_0", "I2_S", "MXFP4", "BF16", "F16"]
DISTINCT_ROWS = 256




def _windows_name(f: Format, nt: int, kid: int | None = None) -> str:
    """The kernels of a chunk of nt > 8 tokens that no GEMM takes, as matmul cuts it
    (kernels.h next_window): 16 tokens at a time through the wide window while 16 remain.
    kid: the kernels' id when not the format's (an R8 layout's: kernels.R8_KERNEL_IDS)."""
    wide, parts, left = (lib.wide_kernel(f.id) if kid in (None, f.id) else None), [], nt
    while wide is not None and left >= 16:
        parts.append(wide[0])
        left -= 16
    parts += [lib.kernel(f.id if kid is None else kid, 8)[0]] * (-(-left // 8))
    return " + ".join(f"{k} x{parts.count(k)}" for k in dict.fromkeys(parts))


def _weights(fmt: Format, n: int, rows: int, rng, ggml) -> np.ndarray:
    w = rng.standard_normal((min(rows, DISTINCT_ROWS), n)).astype(np.float32)
    if fmt.name == "I2_S":  # ggml has no I2_S: lowbit's own quantizer
        base = split_tensor(fmt, quantize(fmt, w), n)[0]
    else:
        base = ggml.quantize(fmt.name, w)
    reps = -(-rows // base.shape[0])
    return np.ascontiguousarray(np.tile(base, (reps, 1))[:rows])


def bench_kernels(formats: list[str], nts: list[int], threads: int, reps: int, mb: float, n: int,
                  out=sys.stdout, as_json: bool = False, nrows: int | None = None, stat: str = "median",
                  clock: str = "wall") -> list[dict]:
    from .ggml_oracle import ggml as get_ggml
    ggml = get_ggml()
    if clock == "cpu" and threads != 1:
        raise ValueError("--clock cpu times the calling thread: use it with --threads 1")
    lib.set_bench_thread_clock(clock == "cpu")
    try:
        return _bench_kernels(ggml, formats, nts, threads, reps, mb, n, out, as_json, nrows, stat, clock)
    finally:  # the clock is process-wide: leave it as the other benches expect it
        lib.set_bench_thread_clock(False)


def _bench_kernels(ggml, formats, nts, threads, reps, mb, n, out, as_json, nrows, stat, clock) -> list[dict]:
    rng = np.random.default_rng(0)
    results = []
    if not as_json:
        c = lib.cpu_info()
        size = f"{nrows} rows" if nrows else f"{mb:g} MB of weights"
        how = (f"fastest of {reps} interleaved runs (lowbit, ggml, lowbit, ...)" if stat == "min"
               else f"median of {reps}")
        clk = "; the thread's CPU time" if clock == "cpu" else ""
        print(f"# {c['model']}; lowbit level {c['selected']}; threads {threads}; "
              f"{size} per format, n={n}; {how}{clk}", file=out)
        print(f"# ggml: {ggml.lib_dir} (vec_dot on the same bytes)", file=out)
        print(f"{'format':<8} {'nt':>2}  {'lowbit kernel':<28} {'lowbit us/row/tok':>17} "
              f"{'ggml us/row/tok':>15} {'ggml/lowbit':>11} {'lowbit GB/s':>11}", file=out)
    for name in formats:
        # Q4_K_R8, Q4_1_R8, ...: the format's rows in the layout the engine repacks them to at load
        # (csrc/repack.h), its kernels; ggml's vec_dot on the same rows as the file has them
        r8 = name.upper().endswith("_R8")
        f = get_format(name[:-3] if r8 else name)
        kid = R8_KERNEL_IDS[f.name] if r8 else f.id
        label = f"{f.name}_R8" if r8 else f.name
        rows = nrows or max(64, int(mb * 2**20) // f.row_bytes(n))
        if r8:
            rows = -(-rows // 8) * 8
        raw = _weights(f, n, rows, rng, ggml)
        w_scale = 0.5
        ggml_ok = f.name != "I2_S"
        if ggml_ok:
            gtype = ggml.vec_dot_type(f.name)
            addr = ggml.vec_dot_addr(f.name)
        for nt in nts:
            x = rng.standard_normal((nt, n)).astype(np.float32)
            act = x.view(np.uint8).reshape(nt, -1) if f.act == "F32" else lib.quantize_act(BY_NAME[f.act].id, x)
            gemm = lib.gemm_kernel(kid) if nt > 8 else None
            t_win = t_gemm = t_below = below_path = None
            if nt <= 8 and stat == "min":  # interleaved single runs, each side's fastest
                gact = ggml.from_float(gtype, x) if ggml_ok else None
                ts = [(lib.bench_rows(f.id, raw, act, n, w_scale, threads, 1, -1, r8),
                       lib.bench_vec_dot(addr, raw, gact, n, threads, 1) if ggml_ok else None) for _ in range(reps)]
                t_ours = min(t[0] for t in ts)
                t_ggml_min = min(t[1] for t in ts) if ggml_ok else None
                kname = lib.kernel(kid, nt)[0]
            elif nt <= 8:
                t_ours = lib.bench_rows(f.id, raw, act, n, w_scale, threads, reps, -1, r8)
                kname = lib.kernel(kid, nt)[0]
            else:  # matmul's path, and both of its paths forced when the format has a GEMM
                t_ours = lib.bench_matmul(f.id, raw, act, n, w_scale, threads, reps, -1, 0, r8)
                on = gemm is not None and gemm[2] > 0 and nt >= gemm[2]
                kname = gemm[0] if on else _windows_name(f, nt, kid)
                if gemm is not None:
                    t_win = lib.bench_matmul(f.id, raw, act, n, w_scale, threads, reps, -1, 1, r8)
                    t_gemm = lib.bench_matmul(f.id, raw, act, n, w_scale, threads, reps, -1, 2, r8)
                    if gemm[1] == "amx":  # the tiles against the same build a level below (avx512):
                        lv = list(lib.levels())  # its GEMM, or its windows where it has none (BF16)
                        below = lv[lv.index("amx") - 1]
                        bi = list(lib.isa_names()).index(below)
                        below_path = "gemm" if lib.gemm_kernel(kid, bi) is not None else "windows"
                        t_below = lib.bench_matmul(f.id, raw, act, n, w_scale, threads, reps, bi,
                                                   2 if below_path == "gemm" else 1, r8)
            t_ggml = None
            if nt <= 8 and stat == "min":
                t_ggml = t_ggml_min
            elif ggml_ok:
                gact = ggml.from_float(gtype, x)
                t_ggml = lib.bench_vec_dot(addr, raw, gact, n, threads, reps)
            per = lambda t: t / (rows * nt) * 1e6  # noqa: E731
            r = dict(format=label, nt=nt, kernel=kname, rows=rows, n=n, threads=threads,
                     lowbit_us_per_row_token=per(t_ours),
                     ggml_us_per_row_token=per(t_ggml) if t_ggml else None,
                     ratio=(t_ggml / t_ours) if t_ggml else None,
                     lowbit_gbps=raw.nbytes / t_ours / 1e9)
            if t_gemm is not None:
                r.update(windows_us_per_row_token=per(t_win), gemm_us_per_row_token=per(t_gemm),
                         windows_over_gemm=t_win / t_gemm, gemm_kernel=gemm[0])
            if t_below is not None:
                r.update(below_level=below, below_path=below_path, below_gemm_us_per_row_token=per(t_below), below_over_gemm=t_below / t_gemm)
            results.append(r)
            if not as_json:
                g, ratio = _cell(r["ggml_us_per_row_token"], 15, 4), _cell(r["ratio"], 11, 2)
                extra = ""
                if t_gemm is not None:
                    extra = (f"   windows {r['windows_us_per_row_token']:.4f} gemm {r['gemm_us_per_row_token']:.4f}"
                             f" windows/gemm {r['windows_over_gemm']:.2f}")
                if t_below is not None:
                    extra += (f"   {below} {below_path} {r['below_gemm_us_per_row_token']:.4f}"
                              f" {below}/amx {r['below_over_gemm']:.2f}")
                print(f"{label:<8} {nt:>2}  {kname:<28} {r['lowbit_us_per_row_token']:17.4f} {g} {ratio} "
                      f"{r['lowbit_gbps']:11.1f}{extra}", file=out, flush=True)
    return _finish(results, out, as_json)


def _cell(v, width: int, digits: int) -> str:
    """A table cell: v right-aligned with `digits` decimals, or '-' when there is no figure."""
    return f"{v:{width}.{digits}f}" if v is not None else f"{'-':>{width}}"


def _finish(results: list[dict], out, as_json: bool) -> list[dict]:
    if as_json:
        json.dump(results, out, indent=1)
        print(file=out)
    return results


ACT_FORMATS = ["Q8_0", "Q8_1", "Q8_K", "I8_S"]


def bench_act(formats: list[str], n: int, rows: int, reps: int, out=sys.stdout, as_json: bool = False) -> list[dict]:
    from .ggml_oracle import GGML_TYPES
    from .ggml_oracle import ggml as get_ggml
    ggml = get_ggml()
    x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32)
    values = rows * n
    results = []
    if not as_json:
        c = lib.cpu_info()
        print(f"# {c['model']}; lowbit level {c['selected']}; 1 thread; {rows} rows x n={n}; median of {reps}",
              file=out)
        print(f"{'format':<6} {'lowbit quantizer':<24} {'lowbit ns/val':>13} {'scalar ns/val':>13} "
              f"{'ggml ns/val':>11} {'ggml/lowbit':>11}", file=out)
    for name in formats:
        f = get_format(name)
        if not f.activation or f.name == "F32":
            raise ValueError(f"{name} is not a quantized activation format")
        kname = lib.quant_act_kernel(f.id)[0]
        t_ours = lib.bench_quant_act(f.id, x, reps)
        t_ref = lib.bench_quant_act(f.id, x, reps, 0)
        t_ggml = None
        if f.name in GGML_TYPES:
            addr = int(ggml.traits(f.name).from_float)
            t_ggml = lib.bench_from_float(addr, x, ggml.row_size(f.name, n), reps)
        r = dict(format=f.name, quantizer=kname, n=n, rows=rows, lowbit_ns_per_value=t_ours / values * 1e9,
                 scalar_ns_per_value=t_ref / values * 1e9,
                 ggml_ns_per_value=t_ggml / values * 1e9 if t_ggml else None,
                 ratio=t_ggml / t_ours if t_ggml else None)
        results.append(r)
        if not as_json:
            print(f"{f.name:<6} {kname:<24} {r['lowbit_ns_per_value']:13.3f} {r['scalar_ns_per_value']:13.3f} "
                  f"{_cell(r['ggml_ns_per_value'], 11, 3)} {_cell(r['ratio'], 11, 2)}", file=out, flush=True)
    return _finish(results, out, as_json)


def membw_buffer(mb: float) -> np.ndarray:
    """mb MB of 64-byte lines, touched (every page faulted in): bench_membw's buffer, to keep
    across repeated readings."""
    return np.ones((int(mb * 2**20) // 64, 64), np.uint8)


def bench_membw(mb: float, threads: int, reps: int, out=sys.stdout, buf: np.ndarray | None = None) -> float:
    """Read bandwidth of a plain line-by-line sum and of the same sum with the kernels'
    software prefetch (the build's distance, cpu_info()["prefetch"] bytes ahead); returns the
    higher, the limit to put a kernel's GB/s beside. buf: membw_buffer(mb) kept by a caller
    that reads the bandwidth repeatedly (mb is then its size)."""
    buf = membw_buffer(mb) if buf is None else buf
    mb = buf.nbytes / 2**20
    t_plain, _ = lib.membw(buf, threads, reps)
    t_pf, _ = lib.membw(buf, threads, reps, True)
    plain, pf = buf.nbytes / t_plain / 1e9, buf.nbytes / t_pf / 1e9
    print(f"read bandwidth: {max(plain, pf):.1f} GB/s ({mb:g} MB, {threads} threads, median of {reps}; "
          f"plain reads {plain:.1f}, with prefetch {lib.cpu_info()['prefetch']} B ahead {pf:.1f})", file=out)
    return max(plain, pf)


def bench_peak(threads: int, reps: int = 5, iters: int = 2_000_000, out=sys.stdout) -> dict:
    """The multiply-add peak per thread count at the dispatched level (csrc/x86/peak.inl: 12
    independent chains of vpdpbusd / maddubs+madd for int8, vfmadd for f32): the ceiling
    that a GEMM's or a prefill's MAC rate is reported as a share of. Returns {(kind, threads): GMAC/s}."""
    level = lib.cpu_info()["selected"]
    isa = lib.isa_names().index(level)
    res = {}
    how = ("int8: 4 independent 16x16x64 tile products per round (AMX TDPBUSD); f32: avx512's 12 chains"
           if level == "amx" else "12 independent chains per thread")
    # avx2 (no VNNI) has two int8 ceilings: the exact dot of any bytes (vpmaddubsw + vpmaddwd +
    # vpaddd, what VNNI's vpdpbusd does in one) and the int16 sums its GEMMs keep for narrow codes
    # (vpmaddubsw + vpaddw: csrc/x86/peak.inl's peak_int8_i16)
    # the amx level where the CPU has AMX-BF16: the BF16 tiles' ceiling too (TDPBF16PS, csrc/x86/amx/peak.cpp)
    bf16 = level == "amx" and lib.cpu_info()["amx_bf16"] and not lib.cpu_info()["amx_emulated"]
    kinds = ((0, "int8"), (1, "f32")) + (((2, "int8_i16"),) if level == "avx2" else ()) + (((3, "bf16"),) if bf16 else ())
    print(f"# multiply-add peak at level {level} ({how}{'; bf16: the same with TDPBF16PS, 16x16x32' if bf16 else ''}, "
          f"median of {reps})", file=out)
    if level == "avx2":
        print("# int8: the exact dot (vpmaddubsw + vpmaddwd + vpaddd); int8 i16: vpmaddubsw + vpaddw, the "
              "int16 sums of the avx2 GEMMs' narrow codes", file=out)
    print("threads  int8 GMAC/s  f32 GFMA/s" + ("  int8 i16 GMAC/s" if level == "avx2" else "")
          + ("  bf16 GMAC/s" if bf16 else ""), file=out)
    for t in range(1, threads + 1):
        row = []
        for kind, name in kinds:
            sec, macs = lib.bench_peak(isa, kind, iters, t, reps)
            res[(name, t)] = macs / sec / 1e9
            row.append(res[(name, t)])
        print(f"{t:7d}  {row[0]:11.1f}  {row[1]:10.1f}" + "".join(f"  {v:{15 if level == 'avx2' else 11}.1f}" for v in row[2:]),
              file=out, flush=True)
    return res


def model_work(path: str) -> dict:
    """Per token, from the GGUF's matrices: the multiply-adds of the layers' matmuls
    (`macs`: attention's QK and PV products and the output head are not counted) and the
    weight bytes a decode step reads (`bytes`: every layer matrix and the head; an MoE's
    expert tensors count top-k of their experts). token_embd is a lookup, not read whole, unless
    it is also the head (tied embeddings: no output.weight); nor is Gemma 4's per_layer_token_embd."""
    from . import gguf
    g = gguf.open(path)
    arch = g.metadata.get("general.architecture", "")
    top_k = int(g.metadata.get(f"{arch}.expert_used_count", 0) or 0)
    macs = nbytes = bf16 = 0
    for name, t in g.tensors.items():
        if len(t.ne) < 2 or name.startswith(("token_embd", "per_layer_token_embd")) or name.endswith("_norm.weight"):
            continue
        if len(t.ne) == 3 and "_exps" in name:  # [experts, rows, n]
            share = min(top_k, t.ne[2]) / t.ne[2] if top_k else 1.0
            macs += int(t.rows * t.n * share)
            bf16 += int(t.rows * t.n * share) if t.format.name == "BF16" else 0
            nbytes += int(t.nbytes * share)
            continue
        nbytes += t.nbytes
        if not name.startswith("output"):
            macs += t.rows * t.n
            bf16 += t.rows * t.n if t.format.name == "BF16" else 0
    if "output.weight" not in g.tensors and "token_embd.weight" in g.tensors:
        nbytes += g.tensors["token_embd.weight"].nbytes  # a tied head: the embedding read whole per step
    return {"macs": macs, "bytes": nbytes, "bf16_macs": bf16}


E2E_PROMPT = ("The history of computing is a story of machines that learned to do arithmetic faster, "
              "then to remember more, then to talk to one another. ")


def kv_cache_bytes(m, n: int) -> tuple[int, int]:
    """(bytes lowbit's cache holds for n positions of one slot, bytes of expanded half K/V for them):
    MLA (deepseek2) caches the latent rows; expanded is n_head * (key + value width) per layer."""
    c = m.config
    ours = int(m.engine.kv_bytes(n))
    attn_layers = len(c.attention_layers)
    if c.mla_rank:
        return ours, attn_layers * n * c.n_head * (c.head_dim + c.mla_v_dim) * 2
    return ours, sum(c.attn_dims(i)[1] for i in c.attention_layers) * n * 2 * 2  # (gemma4: each layer's width)


def kv_read_per_token(m, p0: int, n: int) -> int:
    """Bytes of KV cache one decode step reads, averaged over n steps from position p0: each
    attention layer reads its cache up to the step's position, a sliding-window layer its window
    (a GQA group's K/V rows are read once for its heads). A delta-net layer's recurrent state is
    not counted."""
    c = m.config
    attn = c.attention_layers
    widths = {i: c.attn_dims(i)[1] for i in attn}  # (gemma4: the layers' K widths differ)
    unit = m.engine.kv_bytes(1) / max(1, sum(widths.values()))  # bytes of one position per K element
    total = 0.0
    for pos in range(p0, p0 + n):
        for i in attn:
            w = c.window[i] if i < len(c.window) else 0
            total += unit * widths[i] * (min(pos + 1, w) if w else pos + 1)
    return int(total / max(1, n))


def bench_e2e(model_path: str | None, threads: int, prompt_tokens: int, gen_tokens: int, reps: int,
              out=sys.stdout, llama_model: str | None = None, warmup: bool = True, kv: dict | None = None,
              memory: dict | None = None) -> dict:
    """lowbit and llama.cpp (llama-cpp-python) on the same GGUF, prompt and thread count.

    llama_model: llama.cpp runs this file instead (the same model in a format llama.cpp reads,
    e.g. the TQ2_0 file an I2_S file was quantized from); the token ids are the same.

    Prefill: a prompt of `prompt_tokens` tokens from an empty cache. Decode: `gen_tokens`
    greedy tokens after it. llama.cpp's times are its own perf counters (no Python in them);
    lowbit's are wall times of model.forward (Python included). Medians of `reps` runs, after a
    warm-up run of each (warmup False: none; long prompts). memory: lowbit's weights in memory
    (load's memory / mlock; default the map of the file), llama.cpp's are its own default.
    """
    import time

    from . import peer
    from .model import default_model_path, load
    path = model_path or default_model_path()
    m = load(path, n_ctx=prompt_tokens + gen_tokens + 8, threads=threads, **(kv or {}), **(memory or {}))
    toks = m.tokenize(E2E_PROMPT * (prompt_tokens // 8 + 1))[:prompt_tokens]
    # llama.cpp with the same KV cache formats; a quantized cache runs its flash attention (a
    # quantized V needs it; lowbit's quantized attention computes as it does)
    from .model import KV_TYPES
    quant_kv = (m.kv_k, m.kv_v) != ("f16", "f16")
    peer_kv = dict(type_k=KV_TYPES[m.kv_k], type_v=KV_TYPES[m.kv_v], flash_attn=True) if quant_kv else {}
    # llama.cpp runs in a child process (peer.Worker): if it crashes, lowbit's side still reports
    crashed = llm = None
    try:
        llm = peer.Worker(llama_model or path, n_ctx=prompt_tokens + gen_tokens + 8, n_batch=512, n_ubatch=512,
                          n_threads=threads, n_threads_batch=threads, **peer_kv)
    except peer.PeerCrashed as e:
        crashed = str(e)

    from .generate import PREFILL_CHUNK

    def ours():
        m.reset()
        t0 = time.perf_counter()
        for i in range(0, len(toks), PREFILL_CHUNK):  # (as `lowbit run` prefills)
            logits = m.forward(toks[i:i + PREFILL_CHUNK])
        t1 = time.perf_counter()
        tok = int(np.argmax(logits[-1]))
        for _ in range(gen_tokens):
            tok = int(np.argmax(m.forward([tok])[-1]))
        return t1 - t0, time.perf_counter() - t1

    def theirs():
        nonlocal crashed
        if crashed:
            return None
        try:
            return llm.timed_greedy(toks, gen_tokens)
        except peer.PeerCrashed as e:
            crashed = str(e)
            return None

    def window(w: int, steps: int = 8) -> float:
        """Seconds of one forward of w tokens at the end of the cache (a speculative verify
        window), rewound after each call; median of `steps`."""
        times = []
        for i in range(steps):
            p0 = m.pos
            t0 = time.perf_counter()
            m.forward(toks[i:i + w])
            times.append(time.perf_counter() - t0)
            m.rewind(p0)
        return sorted(times)[steps // 2]

    if warmup:
        ours(); theirs()  # warm-up
    # interleaved, so a burst of load on the shared machine hits both sides alike; each
    # metric's median on its own. Each repetition also reads the machine's bandwidth (bench
    # membw, 256 MB) right after its decodes: a VM's bandwidth moves from minute to minute, so a
    # decode's share is taken against its own repetition's reading (tools/decode_share.py).
    bw_buf = membw_buffer(256.0)
    runs = [(ours(), theirs(), bench_membw(256.0, threads, 3, out=io.StringIO(), buf=bw_buf)) for _ in range(reps)]
    del bw_buf
    if llm:
        llm.close()
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    o = (med([r[0][0] for r in runs]), med([r[0][1] for r in runs]))
    theirs_ok = [r[1] for r in runs if r[1] is not None] if not crashed else []
    t = (med([r[0] for r in theirs_ok]), med([r[1] for r in theirs_ok])) if theirs_ok else None
    step = window(1)
    windows = {w: window(w) / step for w in (4, 8)}
    res = dict(model=os.path.basename(path), llama_model=os.path.basename(llama_model or path),
               threads=threads, prompt_tokens=len(toks), gen_tokens=gen_tokens, peer=llm.cfg.line() if llm else "llama.cpp peer: did not start",
               peer_crashed=crashed,
               lowbit_prefill_tps=len(toks) / o[0], lowbit_decode_tps=gen_tokens / o[1],
               llama_prefill_tps=len(toks) / t[0] if t else None, llama_decode_tps=gen_tokens / t[1] if t else None)
    res["kv"] = f"{m.kv_k}/{m.kv_v}"  # K / V cache formats, both sides (llama.cpp: flash attention if quantized)
    res["memory"] = (memory or {}).get("memory", "mmap")  # lowbit's weights: mmap, copy or hugepages
    res["kv_bytes_per_token"] = m.engine.kv_bytes(1)
    res["prefetch"] = m.prefetch_state()  # (measured in the warm-up's decode where the plan says so)
    res["prefill_ratio"] = res["lowbit_prefill_tps"] / res["llama_prefill_tps"] if t else None
    res["decode_ratio"] = res["lowbit_decode_tps"] / res["llama_decode_tps"] if t else None
    # each repetition's own pair (lowbit's run, then llama.cpp's, back to back): on a host whose
    # speed moves from second to second a burst of load hits one pair, so its ratio is the figure
    # to trust; the headline ratio above is of each side's median on its own
    res["reps"] = [dict(lowbit_prefill_s=r[0][0], lowbit_decode_s=r[0][1],
                        llama_prefill_s=r[1][0] if r[1] else None, llama_decode_s=r[1][1] if r[1] else None)
                   for r in runs]
    paired = [r for r in res["reps"] if r["llama_prefill_s"] is not None] if t else []
    res["prefill_ratios"] = [r["llama_prefill_s"] / r["lowbit_prefill_s"] for r in paired]
    res["decode_ratios"] = [r["llama_decode_s"] / r["lowbit_decode_s"] for r in paired]
    res["prefill_ratio_paired"] = med(res["prefill_ratios"]) if paired else None
    res["decode_ratio_paired"] = med(res["decode_ratios"]) if paired else None
    res["window_cost"] = windows  # lowbit: time of a w-token verify window / a 1-token step
    res["kv_bytes"], res["kv_bytes_expanded"] = kv_cache_bytes(m, len(toks) + gen_tokens)
    # the machine's limits in the same run: prefill's MAC rate against the int8 multiply-add
    # peak (bench peak), decode's weight stream against the read bandwidth (bench membw)
    work = model_work(path)
    level = lib.cpu_info()["selected"]
    try:
        sec, macs = lib.bench_peak(lib.isa_names().index(level), 0, 2_000_000, threads, 5)
        res["int8_peak_gmacs"] = macs / sec / 1e9
    except ValueError:  # a level without the peak loops (scalar, avx, aarch64)
        res["int8_peak_gmacs"] = None
    # a model of BF16 matrices at the amx level with AMX-BF16: its prefill against the bf16 tiles' peak
    res["bf16_peak_gmacs"] = None
    if level == "amx" and work["bf16_macs"] * 2 > work["macs"] and lib.cpu_info().get("amx_bf16") \
            and not lib.cpu_info()["amx_emulated"]:
        sec, macs = lib.bench_peak(lib.isa_names().index(level), 3, 2_000_000, threads, 5)
        res["bf16_peak_gmacs"] = macs / sec / 1e9
    res["int8_i16_peak_gmacs"] = None
    if level == "avx2":  # its second ceiling (bench_peak's header)
        sec, macs = lib.bench_peak(lib.isa_names().index(level), 2, 2_000_000, threads, 5)
        res["int8_i16_peak_gmacs"] = macs / sec / 1e9
    bws = [r[2] for r in runs]
    res["membw_gbs"] = med(bws)
    res["prefill_gmacs"] = work["macs"] * res["lowbit_prefill_tps"] / 1e9
    res["decode_bytes_per_token"] = work["bytes"]
    res["decode_gbs"] = work["bytes"] * res["lowbit_decode_tps"] / 1e9
    # each repetition's decode GB/s over its own bandwidth reading; the median of those
    res["decode_share"] = med([work["bytes"] * gen_tokens / r[0][1] / 1e9 / r[2] for r in runs])
    # what decode reads besides the weights: the KV cache up to each step's position
    kvr = res["decode_kv_bytes_per_token"] = kv_read_per_token(m, len(toks), gen_tokens)
    res["decode_share_with_kv"] = med([(work["bytes"] + kvr) * gen_tokens / r[0][1] / 1e9 / r[2] for r in runs])
    vs = f" (llama.cpp: {res['llama_model']})" if llama_model else ""
    print(f"# {res['model']}{vs}, {threads} threads, prompt {len(toks)} tokens, {gen_tokens} generated, "
          f"median of {reps}", file=out)
    fa = ", llama.cpp with flash attention" if quant_kv else ""
    print(f"# KV cache K/V {res['kv']} ({res['kv_bytes_per_token']} bytes per token{fa}); lowbit's weights: "
          f"{res['memory']}", file=out)
    print(f"# {res['peer']}", file=out)
    print(f"# lowbit's weight prefetch: {res['prefetch']}", file=out)
    if crashed:
        print(f"# {crashed}: llama.cpp's columns are empty", file=out)
    print(f"{'':10} {'lowbit tok/s':>12} {'llama.cpp tok/s':>15} {'ratio':>6}", file=out)
    for what in ("prefill", "decode"):
        print(f"{what:10} {res[f'lowbit_{what}_tps']:12.1f} {_cell(res[f'llama_{what}_tps'], 15, 1)} "
              f"{_cell(res[f'{what}_ratio'], 6, 2)}", file=out)
    if paired:
        print("ratio per repetition (its lowbit and llama.cpp runs back to back): prefill "
              + ", ".join(f"{x:.2f}" for x in res["prefill_ratios"]) + f" (median {res['prefill_ratio_paired']:.2f}); "
              "decode " + ", ".join(f"{x:.2f}" for x in res["decode_ratios"])
              + f" (median {res['decode_ratio_paired']:.2f})", file=out)
    kvb, kve = res["kv_bytes"], res["kv_bytes_expanded"]
    print(f"lowbit KV cache at {len(toks) + gen_tokens} positions: {kvb:,} bytes"
          + (f" (MLA latent rows; expanded half K/V would be {kve:,} bytes: {kvb / kve:.3f} of it)"
             if m.config.mla_rank else ""), file=out)
    print("lowbit verify window at the end of the cache, cost / one decode step: " +
          ", ".join(f"{w} tokens {r:.2f}x" for w, r in windows.items()), file=out)
    pk = res["int8_peak_gmacs"]
    share = f" = {100 * res['prefill_gmacs'] / pk:.0f}% of the int8 peak ({pk:.0f} GMAC/s at {level}, " \
            f"{threads} threads, bench peak)" if pk else " (no int8 peak loops at this level)"
    if res["bf16_peak_gmacs"]:
        share += f"; {100 * res['prefill_gmacs'] / res['bf16_peak_gmacs']:.0f}% of the bf16 tiles' peak " \
                 f"({res['bf16_peak_gmacs']:.0f} GMAC/s: most of its matrices are BF16)"
    pk16 = res["int8_i16_peak_gmacs"]
    if pk16:
        share += f"; {100 * res['prefill_gmacs'] / pk16:.0f}% of avx2's int16-sum peak ({pk16:.0f} GMAC/s)"
    print(f"lowbit prefill: {res['prefill_gmacs']:.1f} GMAC/s in the layers' matmuls "
          f"({work['macs'] / 1e6:.0f} M multiply-adds per token){share}", file=out)
    print(f"lowbit decode: {work['bytes'] / 1e6:.0f} MB of weights per token, {res['decode_gbs']:.1f} GB/s = "
          f"{100 * res['decode_share']:.0f}% of the read bandwidth (each repetition against its own bench membw "
          f"reading, {threads} threads: {', '.join(f'{b:.1f}' for b in bws)} GB/s); with the {kvr / 1e6:.1f} MB of "
          f"KV cache a step reads on average: {100 * res['decode_share_with_kv']:.0f}%", file=out)
    if t:  # the peer against the same limits: what a ratio to it would ask of this machine
        lw = model_work(llama_model) if llama_model else work
        res["llama_prefill_gmacs"] = lw["macs"] * res["llama_prefill_tps"] / 1e9
        res["llama_decode_gbs"] = lw["bytes"] * res["llama_decode_tps"] / 1e9
        # per repetition against its own reading, as lowbit's; 2x llama.cpp: lowbit's bytes at
        # twice llama.cpp's token rate, over the same readings
        ok = [r for r in runs if r[1] is not None]
        res["llama_decode_share"] = med([lw["bytes"] * gen_tokens / r[1][1] / 1e9 / r[2] for r in ok])
        twice = med([2 * work["bytes"] * gen_tokens / r[1][1] / 1e9 / r[2] for r in ok])
        if pk:
            print(f"llama.cpp prefill: {res['llama_prefill_gmacs']:.1f} GMAC/s = "
                  f"{100 * res['llama_prefill_gmacs'] / pk:.0f}% of the int8 peak; 3x llama.cpp would be "
                  f"{300 * work['macs'] * res['llama_prefill_tps'] / 1e9 / pk:.0f}% of it", file=out)
        print(f"llama.cpp decode: {lw['bytes'] / 1e6:.0f} MB per token, {res['llama_decode_gbs']:.1f} GB/s = "
              f"{100 * res['llama_decode_share']:.0f}% of the read bandwidth; 2x llama.cpp would read lowbit's "
              f"{work['bytes'] / 1e6:.0f} MB at {100 * twice:.0f}% of it", file=out)
    return res


def bench_memory(model_path: str | None, threads: int, modes: list[str], gen_tokens: int, reps: int,
                 out=sys.stdout) -> dict:
    """Decode with the weights in each memory mode (gguf.open: "mmap", "copy", "hugepages"; the
    file already in the page cache), the models loaded side by side in one process and timed
    interleaved (mode A, mode B, ... per repetition), each decode's weight stream as a share of
    `bench membw` measured in the same run. Returns {mode: {...}}."""
    import time

    from . import gguf
    from .model import default_model_path, load
    path = model_path or default_model_path()
    work = model_work(path)
    models, res = {}, {}
    for mode in modes:
        t0 = time.perf_counter()
        models[mode] = load(path, n_ctx=gen_tokens + 16, threads=threads, memory=mode)
        res[mode] = dict(load_s=time.perf_counter() - t0, huge_mb=gguf.huge_page_bytes(models[mode].file) / 2**20)
    prompt = models[modes[0]].tokenize(E2E_PROMPT)[:8]

    def decode(m) -> float:
        m.reset()
        tok = int(np.argmax(m.forward(prompt)[-1]))
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            tok = int(np.argmax(m.forward([tok])[-1]))
        return gen_tokens / (time.perf_counter() - t0)

    for m in models.values():
        decode(m)  # warm-up: the pages faulted in, the caches filled
    runs = {mode: [] for mode in modes}
    for _ in range(reps):
        for mode in modes:
            runs[mode].append(decode(models[mode]))
    bw = bench_membw(1024.0, threads, 3, out=io.StringIO())
    print(f"# {os.path.basename(path)}, {threads} threads, {gen_tokens} decode tokens, median of {reps} "
          f"interleaved; {work['bytes'] / 1e6:.0f} MB of weights per token; read bandwidth {bw:.1f} GB/s "
          f"(bench membw, same run); transparent huge pages: {_thp_mode()}", file=out)
    print(f"{'memory':10} {'load s':>7} {'huge MB':>8} {'decode tok/s':>12} {'GB/s':>6} {'of membw':>8} {'vs mmap':>7}",
          file=out)
    base = None
    for mode in modes:
        r = res[mode]
        r["decode_tps"] = sorted(runs[mode])[reps // 2]
        r["gbs"] = work["bytes"] * r["decode_tps"] / 1e9
        r["share"] = r["gbs"] / bw
        base = base or (res["mmap"]["decode_tps"] if "mmap" in res and "decode_tps" in res["mmap"] else r["decode_tps"])
        print(f"{mode:10} {r['load_s']:7.2f} {r['huge_mb']:8.0f} {r['decode_tps']:12.2f} {r['gbs']:6.1f} "
              f"{100 * r['share']:7.0f}% {r['decode_tps'] / base:7.2f}", file=out)
    res["membw_gbs"] = bw
    return res


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            v = f.read()
        return v[v.index("[") + 1:v.index("]")]
    except (OSError, ValueError):
        return "unknown"


def bench_kv(model_path: str | None, threads: int, context: int, gen_tokens: int, reps: int,
             kinds: list[str], out=sys.stdout, with_peer: bool = True) -> dict:
    """Decode speed at a long context per KV cache format, in one run: for each format a model
    with `context` tokens prefilled once, then `gen_tokens` greedy steps from there (rewound after
    each repetition), the formats interleaved per repetition so load bursts hit them alike; llama.cpp
    (peer.Worker; flash attention for a quantized cache) on the same tokens, its decode time from
    its own perf counters. Medians of `reps`; ratios against the first format (f16)."""
    import time

    from . import peer
    from .generate import PREFILL_CHUNK
    from .model import KV_TYPES, default_model_path, load
    path = model_path or default_model_path()
    n_ctx = context + gen_tokens + 8
    models = {kv: load(path, n_ctx=n_ctx, threads=threads, kv=kv) for kv in kinds}
    first = next(iter(models.values()))
    toks = first.tokenize(E2E_PROMPT * (context // 8 + 1))[:context]
    for m in models.values():
        m.reset()
        for i in range(0, len(toks), PREFILL_CHUNK):
            logits = m.forward(toks[i:i + PREFILL_CHUNK])
    start = int(np.argmax(logits[-1]))

    def ours(m):
        m.rewind(len(toks))
        tok = start
        t0 = time.perf_counter()
        for _ in range(gen_tokens):
            tok = int(np.argmax(m.forward([tok])[-1]))
        return time.perf_counter() - t0

    workers, crashed = {}, {}
    for kv in kinds if with_peer else []:
        q = kv != "f16"
        try:
            workers[kv] = peer.Worker(path, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                                      n_threads_batch=threads, **(dict(type_k=KV_TYPES[kv], type_v=KV_TYPES[kv],
                                                                       flash_attn=True) if q else {}))
        except (peer.PeerCrashed, RuntimeError) as e:
            crashed[kv] = str(e)
    lt = {kv: [] for kv in kinds}
    pt = {kv: [] for kv in kinds}
    for _ in range(reps):
        for kv in kinds:
            lt[kv].append(ours(models[kv]))
            if kv in workers:
                try:
                    pt[kv].append(workers[kv].timed_greedy(toks, gen_tokens)[1])
                except (peer.PeerCrashed, RuntimeError) as e:
                    crashed[kv] = str(e)
                    workers.pop(kv).close()
    for w in workers.values():
        w.close()
    med = lambda v: sorted(v)[len(v) // 2] if v else None  # noqa: E731
    res = dict(model=os.path.basename(path), threads=threads, context=len(toks), gen_tokens=gen_tokens, rows=[])
    base_l = gen_tokens / med(lt[kinds[0]])
    base_p = gen_tokens / med(pt[kinds[0]]) if pt[kinds[0]] else None
    print(f"# {res['model']}, {threads} threads, decode {gen_tokens} tokens after {len(toks)} of context, "
          f"median of {reps}" + ("; llama.cpp: flash attention for q8_0 / q4_0" if with_peer else ""), file=out)
    print(f"{'kv':6} {'KV MiB':>7} {'lowbit tok/s':>12} {'vs ' + kinds[0]:>7} {'llama.cpp tok/s':>15} "
          f"{'vs ' + kinds[0]:>7} {'lowbit/llama':>12}", file=out)
    for kv in kinds:
        ltps = gen_tokens / med(lt[kv])
        ptps = gen_tokens / med(pt[kv]) if pt[kv] else None
        mib = models[kv].engine.kv_bytes(n_ctx) / 2**20
        row = dict(kv=kv, kv_mib=mib, lowbit_tps=ltps, lowbit_vs_first=ltps / base_l, llama_tps=ptps,
                   llama_vs_first=ptps / base_p if ptps and base_p else None,
                   ratio=ltps / ptps if ptps else None, peer_crashed=crashed.get(kv))
        res["rows"].append(row)
        print(f"{kv:6} {mib:7.1f} {ltps:12.1f} {row['lowbit_vs_first']:7.2f} {_cell(ptps, 15, 1)} "
              f"{_cell(row['llama_vs_first'], 7, 2)} {_cell(row['ratio'], 12, 2)}", file=out)
        if kv in crashed:
            print(f"# {kv}: {crashed[kv]}", file=out)
    return res


def _cold_child(path: str, threads: int, gen_tokens: int, lookahead: bool) -> dict:
    """One cold run (in a fresh process, after the parent evicted the file): load, a 4-token
    prompt, gen_tokens greedy decode steps. Times are wall seconds."""
    import time

    from .model import load
    t0 = time.perf_counter()
    m = load(path, n_ctx=gen_tokens + 16, threads=threads, lookahead=lookahead)
    toks = m.tokenize(E2E_PROMPT)[:4]
    logits = m.forward(toks)
    t1 = time.perf_counter()
    tok = int(np.argmax(logits[-1]))
    for _ in range(gen_tokens):
        tok = int(np.argmax(m.forward([tok])[-1]))
    t2 = time.perf_counter()
    la = m.engine.lookahead_stats()
    return dict(first_s=t1 - t0, decode_tps=gen_tokens / (t2 - t1), hits=la["hits"], routed=la["routed"])


def evict(path: str) -> None:
    """Drop the file's pages from the page cache (POSIX_FADV_DONTNEED; pages mapped by a live
    process stay, so the runs are separate processes)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bench_cold(model_path: str, threads: int, gen_tokens: int, reps: int, out=sys.stdout) -> dict:
    """Decode speed with the model file evicted from the page cache before each run, router
    lookahead off and on (alternating, one fresh process per run), and warm for reference."""
    import subprocess
    code = ("import json, sys; from lowbit.bench import _cold_child; "
            "print(json.dumps(_cold_child(*json.loads(sys.argv[1]))))")

    def child(la: bool, cold: bool) -> dict:
        if cold:
            evict(model_path)
        else:  # the whole file in the page cache
            with open(model_path, "rb") as fh:
                while fh.read(1 << 24):
                    pass
        r = subprocess.run([sys.executable, "-c", code, json.dumps([model_path, threads, gen_tokens, la])],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout.strip().splitlines()[-1])

    runs = {(la, cold): [] for la in (False, True) for cold in (True, False)}
    for _ in range(reps):
        for la in (False, True):
            for cold in (True, False):
                runs[(la, cold)].append(child(la, cold))
    med = {k: sorted(v, key=lambda r: r["decode_tps"])[len(v) // 2] for k, v in runs.items()}
    print(f"# {os.path.basename(model_path)}, {threads} threads, 4-token prompt then {gen_tokens} decode steps, "
          f"one process per run, median of {reps}", file=out)
    print(f"{'':18} {'decode tok/s':>12} {'load+prompt s':>13} {'hit rate':>9}", file=out)
    for (la, cold), r in med.items():
        hr = f"{r['hits'] / r['routed']:.1%}" if la and r["routed"] else "-"
        print(f"{('cold' if cold else 'warm') + ', lookahead ' + ('on' if la else 'off'):18} "
              f"{r['decode_tps']:12.2f} {r['first_s']:13.2f} {hr:>9}", file=out)
    ratio = med[(True, True)]["decode_tps"] / med[(False, True)]["decode_tps"]
    print(f"cold decode, lookahead on / off: {ratio:.2f}x", file=out)
    return dict(runs={f"{'on' if la else 'off'}-{'cold' if c else 'warm'}": v for (la, c), v in runs.items()},
                cold_ratio=ratio)


def _ttft_child(path: str, threads: int, memory: str) -> dict:
    """Time to first token from a cold page cache (in a fresh process, after the parent evicted
    the file): load with the weights in `memory`, one forward of a 4-token prompt, the first
    greedy token. Wall seconds."""
    import time

    from .model import load
    t0 = time.perf_counter()
    m = load(path, n_ctx=16, threads=threads, memory=memory)
    t1 = time.perf_counter()
    int(np.argmax(m.forward(m.tokenize(E2E_PROMPT)[:4])[-1]))
    return dict(load_s=t1 - t0, ttft_s=time.perf_counter() - t0)


def _read_seconds(path: str) -> float:
    """Seconds to read the file sequentially from a cold page cache (64 MB reads): the disk's
    time for these bytes, the floor of a cold start."""
    import time
    evict(path)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while os.read(fd, 64 << 20):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def bench_ttft(model_path: str, threads: int, modes: list[str], reps: int, out=sys.stdout) -> dict:
    """Cold start: time to first token with the file evicted from the page cache, per memory
    mode (one fresh process per run), against the file's sequential read time measured in the
    same run (issue 19's goal: <= 1.3x)."""
    import subprocess
    code = ("import json, sys; from lowbit.bench import _ttft_child; "
            "print(json.dumps(_ttft_child(*json.loads(sys.argv[1]))))")
    runs: dict[str, list] = {m: [] for m in modes}
    reads = []
    for _ in range(reps):
        reads.append(_read_seconds(model_path))
        for mode in modes:
            evict(model_path)
            r = subprocess.run([sys.executable, "-c", code, json.dumps([model_path, threads, mode])],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"the cold-start run ({mode}) failed: {r.stderr.strip().splitlines()[-1:]}")
            runs[mode].append(json.loads(r.stdout.strip().splitlines()[-1]))
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    read_s = med(reads)
    size = os.path.getsize(model_path)
    print(f"# {os.path.basename(model_path)} ({size / 1e6:.0f} MB), {threads} threads, cold page cache before "
          f"every run, one process per run, median of {reps}; sequential read {read_s:.2f} s "
          f"({size / read_s / 1e9:.2f} GB/s)", file=out)
    print(f"{'memory':10} {'load s':>7} {'first token s':>13} {'vs read':>7}", file=out)
    res = dict(read_s=read_s, bytes=size)
    for mode in modes:
        ttft, load_s = med([r["ttft_s"] for r in runs[mode]]), med([r["load_s"] for r in runs[mode]])
        res[mode] = dict(ttft_s=ttft, load_s=load_s, ratio=ttft / read_s)
        print(f"{mode:10} {load_s:7.2f} {ttft:13.2f} {ttft / read_s:7.2f}", file=out)
    return res


def _timing_args(p, formats: list[str], n: int, reps: int) -> None:
    """The options `bench kernels` and `bench act` share: formats, row length, repetitions,
    pinning, JSON."""
    p.add_argument("--formats", default=",".join(formats), help="comma-separated formats (default: all)")
    p.add_argument("--n", type=int, default=n, help="values per row (a multiple of each format's block: 256 for "
                   "the k-quants, 32 for the legacy formats, 64 for their R8 layouts)")
    p.add_argument("--reps", type=int, default=reps, help="timed repetitions; the median is reported")
    p.add_argument("--cpu", type=int, default=None, help="pin this process to CPU N (with one thread)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _pin_and_formats(a) -> list[str]:
    """Apply --cpu, check --n; the --formats names, canonical."""
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    names = []
    for s in a.formats.split(","):
        if not s.strip():
            continue
        if s.strip().upper() in tuple(f"{f}_R8" for f in R8_FORMATS):  # a repacked layout (bench_kernels)
            base = s.strip().upper()[:-3]
            if base not in repacked_layouts():
                raise ValueError(f"{base}_R8: this level has no kernels for {base}'s R8 layout (avx512 has)")
            names.append(f"{base}_R8")
        else:
            names.append(get_format(s.strip()).name)
    for name in names:  # (an R8 layout's unit: a k-quant's super-block, a legacy format's pair of blocks)
        block = get_format(name.removesuffix("_R8")).block
        block = max(block, 64) if name.endswith("_R8") else block
        if a.n % block:
            from .cli import UsageError
            raise UsageError(f"--n {a.n}: {name}'s rows take a multiple of {block} values")
    return names


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="speed against ggml / llama.cpp in one run (kernels, membw, e2e)",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    bs = p.add_subparsers(dest="what", metavar="WHAT", required=True)
    k = bs.add_parser("kernels", help="row kernels vs ggml's vec_dot, per format and window size")
    _timing_args(k, DEFAULT_FORMATS, n=2560, reps=7)
    k.add_argument("--nt", default="1,2,4,8", help="window sizes, comma-separated (> 8: matmul's path for a "
                   "prompt chunk, windows of 8 or the GEMM)")
    k.add_argument("--threads", type=int, default=1, help="threads for both sides (default 1)")
    k.add_argument("--mb", type=float, default=64.0, help="MB of weights per format (use > L3 for DRAM-bound)")
    k.add_argument("--rows", type=int, default=None, help="rows per format (instead of --mb)")
    k.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time (default) or the thread's CPU time (with --threads 1: time the thread was "
                        "preempted by other jobs is not counted)")
    k.add_argument("--stat", choices=("median", "min"), default="median",
                   help="median of --reps runs per side (default), or min: the fastest of --reps single runs "
                        "taken alternately from each side (windows <= 8; for a machine shared with other jobs, "
                        "where a run that was preempted is not the kernel's speed)")
    plot.option(k)
    k.set_defaults(func=_run_kernels)
    q = bs.add_parser("act", help="activation quantizers (Q8_0, Q8_1, Q8_K, I8_S) vs ggml's from_float")
    _timing_args(q, ACT_FORMATS, n=2048, reps=51)
    q.add_argument("--rows", type=int, default=32, help="rows (tokens) per timed run")
    q.set_defaults(func=_run_act)
    m = bs.add_parser("membw", help="this machine's read bandwidth (the ceiling of decode)")
    m.add_argument("--mb", type=float, default=1024.0)
    m.add_argument("--threads", type=int, default=None)
    m.add_argument("--reps", type=int, default=5)
    m.set_defaults(func=_run_membw)
    pk = bs.add_parser("peak", help="this machine's multiply-add peak (int8, f32; at avx2 also int8 into int16 sums) per thread count")
    pk.add_argument("--threads", type=int, default=None, help="up to this many threads (default: all)")
    pk.add_argument("--reps", type=int, default=5)
    pk.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time (default) or, with --threads 1, the thread's CPU time (time preempted by "
                         "other jobs not counted)")
    pk.set_defaults(func=_run_peak)
    e = bs.add_parser("e2e", help="lowbit vs llama.cpp on the same model: prefill and decode tok/s")
    e.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    e.add_argument("-t", "--threads", type=int, default=2)
    e.add_argument("--prompt-tokens", type=int, default=512)
    e.add_argument("--gen-tokens", type=int, default=64)
    e.add_argument("--reps", type=int, default=3)
    e.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="no warm-up run before the measured ones (long prompts: it costs a whole prefill)")
    e.add_argument("--llama-model", default=None,
                   help="llama.cpp runs this GGUF instead of -m (the same model in a format it reads, e.g. "
                        "TQ2_0 for an I2_S file)")
    from .cli import _memory, _memory_args, kv_args, kv_kwargs
    kv_args(e)
    _memory_args(e)
    plot.option(e)
    e.set_defaults(func=lambda a: plot.after(a, "e2e", bench_e2e(a.model, a.threads, a.prompt_tokens, a.gen_tokens,
                                                                 a.reps, llama_model=a.llama_model,
                                                                 warmup=a.warmup, kv=kv_kwargs(a),
                                                                 memory=_memory(a))))
    kvp = bs.add_parser("kv", help="decode tok/s at a long context per KV cache format (f16, q8_0, q4_0) "
                                   "and llama.cpp's, in one run")
    kvp.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    kvp.add_argument("-t", "--threads", type=int, default=2)
    kvp.add_argument("--context", type=int, default=4096, help="tokens prefilled before decoding (default 4096)")
    kvp.add_argument("--gen-tokens", type=int, default=32)
    kvp.add_argument("--reps", type=int, default=3)
    kvp.add_argument("--kinds", default="f16,q8_0,q4_0", help="KV formats, the first the baseline")
    kvp.add_argument("--no-peer", action="store_true",
                     help="lowbit's formats only (llama.cpp's prefill of a long context is slow on a busy machine)")
    kvp.set_defaults(func=_run_kv)
    from .bench_spec import add_bench_parser
    add_bench_parser(bs)
    from .distributed.bench import add_parser as add_pipeline
    add_pipeline(bs)
    from .server.bench import add_parser as add_serve
    add_serve(bs)
    mm = bs.add_parser("memory", help="decode with the weights mapped, copied, or copied into huge pages (A/B)")
    mm.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    mm.add_argument("-t", "--threads", type=int, default=2)
    mm.add_argument("--modes", default="mmap,copy,hugepages", help="comma-separated: mmap, copy, hugepages")
    mm.add_argument("--gen-tokens", type=int, default=32)
    mm.add_argument("--reps", type=int, default=5)
    mm.set_defaults(func=_run_memory)
    tt = bs.add_parser("ttft", help="cold start: time to first token from a cold page cache vs the file's read time")
    tt.add_argument("-m", "--model", default=None, help="GGUF file (default: the default model)")
    tt.add_argument("-t", "--threads", type=int, default=2)
    tt.add_argument("--modes", default="mmap,copy", help="comma-separated: mmap, copy, hugepages")
    tt.add_argument("--reps", type=int, default=3)
    tt.set_defaults(func=_run_ttft)
    c = bs.add_parser("cold", help="MoE decode with the file evicted from the page cache: lookahead off vs on")
    c.add_argument("-m", "--model", required=True, help="GGUF file (an MoE model)")
    c.add_argument("-t", "--threads", type=int, default=2)
    c.add_argument("--gen-tokens", type=int, default=32)
    c.add_argument("--reps", type=int, default=3)
    c.set_defaults(func=lambda a: bench_cold(a.model, a.threads, a.gen_tokens, a.reps) and 0)


def _modes(a, cmd: str) -> list[str] | None:
    from . import gguf
    modes = [x.strip() for x in a.modes.split(",") if x.strip()]
    bad = [x for x in modes if x not in gguf.MEMORY_MODES]
    if bad or not modes or len(set(modes)) != len(modes):
        print(f"lowbit bench {cmd}: error: --modes takes distinct values of {', '.join(gguf.MEMORY_MODES)}, "
              f"got {a.modes!r}", file=sys.stderr)
        return None
    if a.threads < 1 or a.reps < 1 or getattr(a, "gen_tokens", 1) < 1:
        print(f"lowbit bench {cmd}: error: --threads, --reps (and --gen-tokens) must be >= 1", file=sys.stderr)
        return None
    return modes


def _run_memory(a) -> int:
    modes = _modes(a, "memory")
    if modes is None:
        return 2
    bench_memory(a.model, a.threads, modes, a.gen_tokens, a.reps)
    return 0


def _run_ttft(a) -> int:
    from .model import default_model_path
    modes = _modes(a, "ttft")
    if modes is None:
        return 2
    path = a.model or default_model_path()
    if not os.path.isfile(path):
        print(f"lowbit bench ttft: error: no such model file: {path}", file=sys.stderr)
        return 2
    bench_ttft(path, a.threads, modes, a.reps)
    return 0


def _run_kv(a) -> int:
    from .model import KV_TYPES
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KV_TYPES]
    if not kinds or bad:
        raise ValueError(f"--kinds must list KV formats of {', '.join(KV_TYPES)}, got {a.kinds!r}")
    if a.context < 8:
        raise ValueError("--context must be >= 8")
    bench_kv(a.model, a.threads, a.context, a.gen_tokens, a.reps, kinds, with_peer=not a.no_peer)
    return 0


def _run_act(a) -> int:
    fmts = _pin_and_formats(a)
    if a.rows <= 0:
        raise ValueError("--rows must be positive")
    bench_act(fmts, a.n, a.rows, a.reps, as_json=a.json)
    return 0


def _run_peak(a) -> int:
    threads = a.threads or lib.cpu_info()["threads"]
    if a.clock == "cpu" and threads != 1:
        raise ValueError("--clock cpu needs --threads 1 (it times the calling thread only)")
    lib.set_bench_thread_clock(a.clock == "cpu")
    try:
        bench_peak(threads, a.reps)
    finally:
        lib.set_bench_thread_clock(False)
    return 0


def _run_membw(a) -> int:
    top = a.threads or lib.cpu_info()["threads"]
    for t in range(1, top + 1):
        bench_membw(a.mb, t, a.reps)
    return 0


def _run_kernels(a) -> int:
    fmts = _pin_and_formats(a)
    nts = [int(v) for v in a.nt.split(",")]
    if any(v < 1 for v in nts):
        raise ValueError("--nt values must be >= 1")
    res = bench_kernels(fmts, nts, a.threads, a.reps, a.mb, a.n, as_json=a.json, nrows=a.rows, stat=a.stat,
                        clock=a.clock)
    return plot.after(a, "kernels", res)
