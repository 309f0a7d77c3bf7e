"""`lowbit chat`: survives a full context and Ctrl-C, reuses the KV cache of earlier turns,
knows its commands and multi-line input. Piped runs check the conversation; a pseudo-terminal
run checks Ctrl-C and Ctrl-D as a user types them (the terminal turns ^C into SIGINT)."""
import io
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest

import lowbit
from lowbit.chat import Chat

CHAT = [sys.executable, "-m", "lowbit.cli", "chat"]


def chat_cli(*args, input="", timeout=300):
    return subprocess.run(CHAT + [str(a) for a in args], input=input, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def model():
    return lowbit.load(n_ctx=512, threads=2)


def in_process(model, lines, **kw):
    out, err = io.StringIO(), io.StringIO()
    c = Chat(model, stdin=io.StringIO("".join(s + "\n" for s in lines)), stdout=out, stderr=err, **kw)
    assert c.repl() == 0
    return c, out.getvalue(), err.getvalue()


def test_later_turns_prefill_only_their_new_tokens_and_answer_as_from_scratch(model):
    """Turn 2 reuses turn 1's cache (prompt and reply) and gives the reply a fresh model gives
    to the whole conversation (greedy)."""
    c, out, err = in_process(model, ["What is the capital of France?", "And of Italy?"],
                             max_tokens=24, sampling=dict(temperature=0), verbose=True)
    stats = [l for l in err.splitlines() if l.startswith("[prefill")]
    assert len(stats) == 2 and "reused from the cache" not in stats[0], err
    m = re.search(r"prefill (\d+) tokens .*\((\d+) reused from the cache\)", stats[1])
    assert m, stats[1]
    new, reused = int(m[1]), int(m[2])
    first_prompt = model.tokenize(model.tokenizer.apply_chat_template(c.turns[:1], add_generation_prompt=True))
    assert reused >= len(first_prompt) and new < 30, stats[1]
    fresh = lowbit.load(n_ctx=512, threads=2)
    want = "".join(fresh.chat(c.turns[:3], max_tokens=24))
    assert c.turns[3]["content"] == want and out.endswith(want + "\n")


def test_a_full_context_drops_the_oldest_turns_and_goes_on():
    msg = "Tell me something interesting about the history of the city number {} in Europe, please."
    lines = [msg.format(i) for i in range(4)] + ["word " * 400, "Thanks!"]
    r = chat_cli("-c", 128, "-n", 24, "--temp", 0, "--system", "You are brief.", input="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "error" not in r.stderr
    assert "the conversation outgrew the context (128 tokens): dropped the" in r.stderr
    assert "system prompt stays" in r.stderr
    assert re.search(r"the message has \d+ tokens with the template; the context holds 128: not sent", r.stderr)
    assert r.stdout.count("\n") >= 5  # every sent message got a reply line


def test_drop_keeps_the_system_prompt_and_the_newest_turns(model):
    small = lowbit.load(n_ctx=96, threads=2)
    c, out, err = in_process(small, [f"Question number {i}: what is {i} plus {i}?" for i in range(5)],
                             system="You are a calculator.", max_tokens=12, sampling=dict(temperature=0))
    assert "dropped the" in err
    assert c.system == [{"role": "system", "content": "You are a calculator."}]
    assert c.turns[-2]["content"] == "Question number 4: what is 4 plus 4?"
    assert "Question number 0" not in str(c.turns)
    # the last turn's prompt left room for its reply
    last = small.tokenizer.apply_chat_template(c.system + c.turns[:-1], add_generation_prompt=True)
    assert len(small.tokenize(last)) + c.reserve <= 96


def test_commands_and_multi_line_input(model):
    c, out, err = in_process(model, ["/help", '"""', "line one", "line two", '"""', "/clear",
                                     "first \\", "second", "/nonsense", "/exit", "never sent"],
                             max_tokens=4, sampling=dict(temperature=0))
    assert "/clear" in err and "multi-line" in err  # /help
    assert "conversation cleared" in err and "unknown command /nonsense" in err
    # the block was one message, then /clear forgot it; the backslash joined two lines
    assert [t["content"] for t in c.turns if t["role"] == "user"] == ["first \nsecond"]
    r = chat_cli("-n", 4, input="/help\n")
    assert r.returncode == 0 and "/exit" in r.stderr


# ---- a terminal: Ctrl-C and Ctrl-D as typed ------------------------------------------------------
class Term:
    """lowbit chat on a pseudo-terminal (pty.fork makes it the child's controlling terminal)."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            # (a runner started in the background of a shell without job control ignores SIGINT, and
            # an ignored signal stays ignored across exec: Python would then never raise KeyboardInterrupt)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(sys.executable, CHAT + [str(a) for a in args], dict(os.environ, TERM="xterm"))
        self.buf = b""

    def expect(self, pattern: bytes, timeout=120) -> bytes:
        end = time.time() + timeout
        while not re.search(pattern, self.buf):
            left = end - time.time()
            assert left > 0, f"no {pattern!r} in {self.buf[-2000:]!r}"
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:  # the child is gone
                    data = b""
                assert data, f"the chat ended; no {pattern!r} in {self.buf[-2000:]!r}"
                self.buf += data
        m = re.search(pattern, self.buf)
        seen, self.buf = self.buf[:m.end()], self.buf[m.end():]
        return seen

    def send(self, b: bytes) -> None:
        os.write(self.fd, b)

    def at_prompt(self) -> None:
        """Wait for the "> " prompt and give readline a moment to be reading."""
        self.expect(rb"> ")
        time.sleep(0.3)

    def ctrl_c_at_prompt(self, pattern: bytes | None) -> int | None:
        """Ctrl-C at the prompt until `pattern` shows (None: until the chat exits; its exit code).
        A Ctrl-C that lands between the prompt's text and readline's wait for input is only seen
        at the next key (CPython's readline checks for signals when its read is interrupted), so
        it is sent again; signals do not queue, so a repeat never counts twice."""
        for _ in range(5):
            self.send(b"\x03")
            if pattern is None:
                code = self.exit_code(timeout=10, kill=False)
                if code is not None:
                    return code
                continue
            try:
                self.expect(pattern, timeout=10)
                return None
            except AssertionError:
                if b"Ctrl-C again" in self.buf and pattern != rb"Ctrl-C again":
                    raise
        raise AssertionError(f"Ctrl-C at the prompt: no {pattern!r} in {self.buf[-2000:]!r}")

    def exit_code(self, timeout=60, kill=True) -> int | None:
        end = time.time() + timeout
        while time.time() < end:
            # drain, so the child never blocks on output (select first: a read of a quiet pty blocks)
            if select.select([self.fd], [], [], 0.05)[0]:
                try:
                    os.read(self.fd, 4096)
                except OSError:
                    pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        if not kill:
            return None
        os.kill(self.pid, 9)
        raise AssertionError("the chat did not exit")


def test_ctrl_c_stops_the_reply_and_a_second_at_the_prompt_exits():
    t = Term("-c", 512, "-n", 120, "--temp", 0)
    t.expect(rb"> ")
    t.send(b"Write a very long story about a dragon and a knight.\r")
    t.expect(rb"knight\.\r\n")  # the echo of the line
    t.expect(rb"\w{3}")  # the reply has started
    t.send(b"\x03")
    t.expect(rb"stopped")
    t.expect(rb"> ")  # back at the prompt: the session goes on
    t.send(b"Say hi.\r")
    t.expect(rb"Say hi\.\r\n")
    t.expect(rb"\w+.*\r\n")  # a reply, then the prompt again (at_prompt)
    t.at_prompt()
    t.ctrl_c_at_prompt(rb"Ctrl-C again")
    t.at_prompt()
    assert t.ctrl_c_at_prompt(None) == 0


def test_ctrl_d_exits_and_readline_edits_the_line():
    t = Term("-c", 256, "-n", 8, "--temp", 0, "-v")
    t.expect(rb"> ")
    # "Hx", left arrow, delete the x with backspace after moving: type "Hi", then up-arrow history later
    t.send(b"Hix\x7f.\r")  # backspace edits the line: the message is "Hi."
    t.expect(rb"\[prefill")
    t.expect(rb"> ")
    t.send(b"\x1b[A\r")  # up arrow: the previous line again, not the text "^[[A"
    t.expect(rb"reused from the cache")
    t.expect(rb"> ")
    t.send(b"\x04")
    assert t.exit_code() == 0
