"""Helpers for the server tests: start `lowbit serve` on a free local port, reference outputs."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

import lowbit
from lowbit.generate import Stats, generate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`lowbit serve ARGS` in a subprocess on 127.0.0.1:<free port>; ready() waits for /health."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "lowbit.cli", "serve", "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=os.environ.copy())

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, limit_s: float = 300.0) -> list[int]:
        """Poll /health until 200 (a guard against a hung start, not a timing check); returns the
        status codes seen."""
        seen = []
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lowbit serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                r = httpx.get(self.url + "/health", timeout=5)
                seen.append(r.status_code)
                if r.status_code == 200:
                    return seen
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"lowbit serve did not become ready:\n{self.output()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def alone(model, prompt, max_tokens: int, **sampling) -> tuple[str, list[str], int]:
    """What lowbit.generate gives the request alone (single-sequence forward, its own loop):
    (text, pieces, tokens generated)."""
    st = Stats()
    pieces = list(generate(model, prompt, max_tokens=max_tokens, stats=st, **sampling))
    return "".join(pieces), pieces, st.generated


def chat_prompt(model, messages) -> str:
    return model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "templates")


def synth_model(path, template: str | None = None) -> str:
    """The small synthetic server model; template: a file in tests/data/templates whose chat
    template replaces the default vocabulary's (SmolLM2's ChatML)."""
    from lowbit.synth import default_vocab, synth_dense
    vocab = None
    if template is not None:
        with open(os.path.join(TEMPLATES, template), encoding="utf-8") as f:
            vocab = {**default_vocab(), "tokenizer.chat_template": f.read()}
    return synth_dense(path, layers=2, dim=128, ffn=256, heads=4, kv_heads=2, ctx=4096, wtype="Q8_0", seed=11,
                       vocab=vocab)


__all__ = ["Server", "alone", "chat_prompt", "free_port", "synth_model", "lowbit"]


@contextlib.contextmanager
def running(*args: str):
    """A started `lowbit serve ARGS` (ready), stopped on exit: the server fixtures' body."""
    s = Server(*args)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def openai_client(url: str, key: str = "unused", timeout: float = 120):
    """The openai client of a server at `url` (no retries: a failure shows at once)."""
    import openai
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=timeout)
