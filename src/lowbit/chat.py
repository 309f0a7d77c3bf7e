"""`lowbit chat`: an interactive conversation that survives its context and Ctrl-C.

- Each turn is the whole conversation rendered with the file's chat template, but only the
  tokens after what the KV cache already holds are prefilled (generate reuses the slot's
  cache: the previous turns, the reply included, are not read again).
- When the conversation no longer fits (its tokens plus room for a reply exceed the context),
  the oldest turns (a user message and the replies to it) are dropped, the system prompt
  stays, and one dim line says so. A single message too long for the context is refused and
  the conversation goes on; a reply that fills the context is cut, with a dim line.
- Ctrl-C during a reply stops it (the text so far stays in the conversation) and returns to
  the prompt; at the prompt, Ctrl-C clears the line and a second one in a row exits, as does
  Ctrl-D.
- Line editing and history come from the standard library's readline (when stdin is a
  terminal). Prompts ("> ") are shown only on a terminal, so piped output is the replies alone.
"""
from __future__ import annotations

import re
import sys

from .generate import Stats

HELP = """chat commands:
  /help          this text
  /clear         forget the conversation (the system prompt stays)
  /exit, /quit   leave (also Ctrl-D, or Ctrl-C twice at the prompt)
multi-line input: end a line with \\ to continue on the next, or type \"\"\" alone on a line
to start a block and again to end it.
Ctrl-C during a reply stops the reply and returns to the prompt."""

PROMPT, MORE = "> ", ". "
COMMAND = re.compile(r"/[A-Za-z]+")


class TooLong(ValueError):
    pass


class Chat:
    """One conversation with a model: the messages so far and the REPL around them."""

    def __init__(self, model, system: str | None = None, max_tokens: int = -1, sampling: dict | None = None,
                 verbose: bool = False, stdin=None, stdout=None, stderr=None):
        self.m = model
        self.system = [{"role": "system", "content": system}] if system else []
        self.turns: list[dict] = []  # user / assistant messages after the system prompt
        self.max_tokens = max_tokens
        self.sampling = sampling or {}
        self.verbose = verbose
        self.stdin, self.out, self.err = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
        self.tty = self.stdin.isatty()
        # room kept free for a reply when fitting the conversation into the context
        n = model.n_ctx
        self.reserve = min(max_tokens if max_tokens > 0 else n // 4, n // 2)
        ids = self._ids([])
        if len(ids) >= n:
            raise ValueError(f"the system prompt has {len(ids)} tokens; the context holds {n}")

    # -- output -----------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """One dim line on stderr (plain when stderr is not a terminal)."""
        dim = self.err.isatty()
        self.err.write(f"\033[2m[{text}]\033[0m\n" if dim else f"[{text}]\n")
        self.err.flush()

    # -- the conversation -------------------------------------------------------------------
    def _ids(self, turns: list[dict]) -> list[int]:
        prompt = self.m.tokenizer.apply_chat_template(self.system + turns, add_generation_prompt=True)
        return self.m.tokenize(prompt)

    def fit(self, message: str) -> list[int]:
        """The prompt's token ids with `message` as the new user turn, after dropping the oldest
        turns while the conversation and room for a reply exceed the context. TooLong when the
        message does not fit even alone (the conversation is then left as it was)."""
        n = self.m.n_ctx
        turns = self.turns + [{"role": "user", "content": message}]
        dropped = 0
        while True:
            ids = self._ids(turns)
            if len(ids) + self.reserve <= n:
                break
            users = [i for i, t in enumerate(turns) if t["role"] == "user"]
            if len(users) <= 1:  # only the new message is left
                if len(ids) < n:
                    break  # it fits, with less room for the reply
                raise TooLong(f"the message has {len(ids)} tokens with the template; the context holds {n}: "
                              f"not sent")
            turns = turns[users[1]:]  # the oldest user message and the replies to it go
            dropped += 1
        if dropped:
            self.turns = turns[:-1]
            self.note(f"the conversation outgrew the context ({n} tokens): dropped the {dropped} oldest "
                      f"turn{'s' if dropped > 1 else ''}; the system prompt stays")
        return ids

    def reply(self, message: str) -> None:
        """Send one user message and stream the reply. Ctrl-C stops the reply (kept so far)."""
        try:
            ids = self.fit(message)
        except TooLong as e:
            self.note(str(e))
            return
        st = Stats()
        text, stopped = "", False
        gen = self.m.generate(ids, max_tokens=self.max_tokens, stats=st, **self.sampling)
        try:
            for piece in gen:
                text += piece
                self.out.write(piece)
                self.out.flush()
        except KeyboardInterrupt:
            stopped = True
        finally:
            gen.close()
        self.out.write("\n")
        self.out.flush()
        if stopped:
            self.note("stopped")
        elif st.stop == "context":
            self.note(f"the reply filled the context ({self.m.n_ctx} tokens) and was cut; the oldest turns "
                      f"make room for the next one")
        if text or not stopped:
            self.turns += [{"role": "user", "content": message}, {"role": "assistant", "content": text}]
        if self.verbose:
            self.note(st.line())

    # -- the loop ---------------------------------------------------------------------------
    def _input(self, prompt: str) -> str:
        if self.tty and self.stdin is sys.stdin:
            return input(prompt)
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def read(self) -> str:
        """One message: a line, lines joined by a trailing backslash, or a \"\"\" block."""
        line = self._input(PROMPT)
        if line.strip() == '"""':
            lines = []
            while True:
                line = self._input(MORE)
                if line.strip() == '"""':
                    return "\n".join(lines)
                lines.append(line)
        lines = []
        while line.endswith("\\"):
            lines.append(line[:-1])
            line = self._input(MORE)
        lines.append(line)
        return "\n".join(lines)

    def command(self, cmd: str) -> bool:
        """Run a /command; False: leave."""
        cmd = cmd.lower()
        if cmd in ("/exit", "/quit"):
            return False
        if cmd == "/help":
            self.err.write(HELP + "\n")
        elif cmd == "/clear":
            self.turns = []
            self.note("conversation cleared")
        else:
            self.note(f"unknown command {cmd}: /help lists the commands")
        return True

    def repl(self) -> int:
        if self.tty:
            try:
                import readline  # noqa: F401 - line editing and history for input()
            except ImportError:
                pass
        self.note(f"lowbit chat: {self.m.path}; /help for commands, Ctrl-D or /exit to leave")
        interrupted = False  # the last thing at the prompt was a Ctrl-C
        while True:
            try:
                msg = self.read()
            except EOFError:
                if self.tty:
                    self.out.write("\n")
                return 0
            except KeyboardInterrupt:
                if interrupted:
                    self.out.write("\n")
                    return 0
                interrupted = True
                self.out.write("\n")
                self.note("Ctrl-C again or Ctrl-D to leave")
                continue
            interrupted = False
            if not msg.strip():
                continue
            if COMMAND.fullmatch(msg.strip()):
                if not self.command(msg.strip()):
                    return 0
                continue
            try:
                self.reply(msg)
            except KeyboardInterrupt:  # a second Ctrl-C while the first was being handled
                self.out.write("\n")
                self.note("stopped")
