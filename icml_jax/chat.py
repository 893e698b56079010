"""Interactive terminal chat with a trained agent: `python -m icml_jax.chat --workdir=DIR --user=alice`.

Loads the run config (`<workdir>/config.json`) and the trained policy (`<workdir>/policy`, else the warm-up
checkpoint `<workdir>/warmup`), and chats as one user whose memories persist across restarts in
`<workdir>/chat/memory.sqlite`. Each process continues the user's conversation as a new session (episode
"chat"), numbered by the store in one transaction (`MemoryStore.open_session`: one more than any session recorded
or stored for the user), so two chats of one user running at once get different sessions and the fragment ids
of different runs never collide. Decisions are greedy, so a given state always gives the same chat. Commands:
/memories, /history ID, /forget ID, /why, /help, /quit. A line that is not valid UTF-8 (or holds a lone surrogate), or
is longer than the run's `config.limits.max_text_chars` (32768 characters by default), is refused with one error line
and the chat goes on; a damaged checkpoint stops the chat before it starts with one `chat error:` line (status 2).

Piped input is read one line at a time, each answered before the next is read: a long backlog (a script of 10,000
lines) is played in full, in order, with no more than one line held in memory (the pipe holds the rest, its
writer waits). No backlog cap drops lines, since every line is a turn its user sent; the cost per line grows with
the user's memories (each saved turn is one more to rank), not with the backlog.
"""

from __future__ import annotations

import codecs
import dataclasses
import io
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from absl import app, flags

from icml_jax.llm.types import BackendError
from icml_jax.memory.store import MemoryStore, MemoryStoreError
from icml_jax.run import cli  # the shared --workdir / --debug flags, one-line errors
from icml_jax.run.agent_loading import ChatError, ChatModel, load_model
from icml_jax.textcheck import TextError, TextLimits, check_text

EPISODE_ID = "chat"
MEMORY_DB = Path("chat") / "memory.sqlite"
HELP = """commands:
  /memories   list your memories (id, session/turn, text; replaced ones marked)
  /history ID how one of your memories changed (added, updated, replaced by which memory, when)
  /forget ID  delete one of your memories (and its history)
  /why        explain the last reply (memory used, with what probability; whether the turn was saved)
  /help       this help
  /quit       leave (Ctrl-D works too)"""


ignoring_closed_event_loops = cli.ignoring_closed_event_loops  # (defined with the other CLIs' helpers)


class ChatSession:
    """One user's chat: a MemoryAgent on a file-backed store, this session's dialogue and the last receipt."""

    def __init__(self, model: ChatModel, store: Any, user_id: str, *, owns_store: bool = False,
                 limits: TextLimits | None = None) -> None:
        if not user_id:
            raise ChatError("--user is required: the chat keeps one memory per user")
        self.model, self.store, self.user_id = model, store, user_id
        if limits is None:  # a loaded run's own limits; a stand-in model (tests, notebooks) gets the defaults
            limits = model.limits if isinstance(model, ChatModel) else TextLimits()
        self.limits = limits
        self.agent = model.agent(store)
        self.session = store.open_session(user_id, EPISODE_ID)  # atomic: a parallel chat of this user gets another
        self.history: list[tuple[str, str]] = []  # this session's dialogue, (speaker, text), oldest first
        self.last_receipt: Any = None
        self._owns_store = owns_store

    @classmethod
    def open(cls, workdir: str | Path, user_id: str, memory_db: str | Path | None = None,
             model: ChatModel | None = None) -> ChatSession:
        """A session on `<workdir>/chat/memory.sqlite` (or `memory_db`); loads the model unless given."""
        model = model or load_model(workdir)
        db = Path(memory_db).expanduser() if memory_db else model.workdir / MEMORY_DB
        return cls(model, MemoryStore(db), user_id, owns_store=True)

    def close(self) -> None:
        """Stops the agent's request thread (a remote back end's) and closes the store if this session opened it."""
        close_agent = getattr(self.agent, "close", None)
        if close_agent is not None:
            close_agent()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def banner(self) -> str:
        """What the chat says first: who, which policy, how many memories, and how to get help."""
        lines = [self.model.note] if self.model.note else []
        lines.append(f"chatting as {self.user_id!r} (session {self.session}, {self.store.count(self.user_id)} "
                     f"memories; policy {self.model.checkpoint}). /help for commands, /quit to leave.")
        return "\n".join(lines)

    def send(self, text: str) -> str:
        """One user turn: the agent's reply. The turn index is the utterance's position in this session's dialogue
        (user and assistant lines, as in the datasets); whether it was saved, /why tells. TextError (nothing
        stored) when `text` is not valid Unicode or longer than `limits.max_text_chars`."""
        text = check_text(text, "ChatSession.send", "text", max_chars=self.limits.max_text_chars)
        user, assistant = self.model.speakers
        reply, receipt = self.agent.step(self.user_id, text, history=tuple(self.history), episode_id=EPISODE_ID,
                                         session=self.session, turn=len(self.history))
        self.history += [(user, text), (assistant, reply)]
        self.last_receipt = receipt
        return reply

    def command(self, line: str) -> str:
        """Runs a `/command` line and returns what to print."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if name == "/help":
            return HELP
        if name == "/memories":
            frags = self.store.fragments(self.user_id)
            if not frags:
                return f"no memories for {self.user_id!r}"
            return "\n".join(f"{f.fragment_id}  s{f.session}/t{f.turn}  {f.text}"
                             + (f"  [replaced by {f.superseded_by}]" if f.superseded_by else "") for f in frags)
        if name == "/history":
            if not arg:
                return "usage: /history ID (ids are listed by /memories)"
            events = self.store.history(self.user_id, arg)
            if not events:
                return f"no memory {arg} for {self.user_id!r}"
            return "\n".join(_event_line(e) for e in events)
        if name == "/forget":
            if not arg:
                return "usage: /forget ID (ids are listed by /memories)"
            if self.store.delete(self.user_id, arg):
                return f"forgot {arg}"
            return f"no memory {arg} for {self.user_id!r}; nothing deleted"
        if name == "/why":
            return self.last_receipt.summary() if self.last_receipt else "nothing to explain yet: say something first"
        return f"unknown command {name!r}; /help lists the commands"


def _event_line(event: Any) -> str:
    """One line of a memory's history: when, what happened, by which decision, the text then."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
    what = event.event
    if event.event == "supersede":
        what = f"replaced by {event.detail.get('superseded_by')}"
    by = f" ({event.by})" if event.by else ""
    return f"{when}  {what}{by}: {event.text}"


QUIT = ("/quit", "/exit")
MAX_FAILED_READS = 20  # consecutive undecodable reads from a stream that keeps failing: stop instead of spinning
_LINE_SLACK = 64  # characters read beyond limits.max_text_chars, so spaces and a line end around a full turn fit


def _tolerant(stream: TextIO) -> TextIO:
    """`stream`, decoding bytes that are not valid in its encoding as surrogates instead of raising.

    A strict text stream that meets one bad byte raises and loses its whole read-ahead buffer; with
    surrogateescape, the bad line arrives intact and the text validator rejects just that line.
    """
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="surrogateescape")
    return stream


def _encoding_name(stream: TextIO) -> str:
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name.upper()
    except LookupError:
        return "UTF-8"


def _refusal(exc: TextError, encoding: str) -> str:
    """The chat's one line for a line the text validator refused, e.g. '... (byte 0xff at column 5) ...'."""
    if exc.byte is not None:  # a byte its stream could not decode (a surrogate escape)
        return f"error: input is not valid {encoding} (byte 0x{exc.byte:02x} at column {exc.offset + 1}); turn ignored"
    return f"error: input is not valid text ({exc.reason} at column {(exc.offset or 0) + 1}); turn ignored"


@dataclasses.dataclass(frozen=True)
class _Overlong:
    """A line longer than the chat takes: how many characters it had (read and discarded, never stored)."""

    chars: int


def _too_long(chars: int, limit: int) -> str:
    """The chat's one line for a line over `limits.max_text_chars` (nothing of it is stored)."""
    return (f"error: line of {chars} characters is over the limit of {limit} (config limits.max_text_chars); "
            "turn ignored")


def _read(input_stream: TextIO, prompt: str, max_chars: int) -> str | _Overlong | None:
    """One line (None at EOF); prompts only when a person is typing. A stream's line longer than `max_chars`
    (plus a little room for surrounding spaces) is read in bounded pieces to its end and comes back as _Overlong."""
    if input_stream is sys.stdin and sys.stdin.isatty():
        try:
            return input(prompt)
        except EOFError:
            return None
    if not isinstance(input_stream, io.TextIOBase):  # a duck-typed stream: its readline takes no size
        line = input_stream.readline()
        return line if line else None
    size = max_chars + _LINE_SLACK
    line = input_stream.readline(size)
    if not line:
        return None
    if len(line) < size or line.endswith("\n"):
        return line
    chars = len(line)
    while not line.endswith("\n"):  # the rest of the line, a piece at a time, to keep memory bounded
        line = input_stream.readline(size)
        if not line:
            break
        chars += len(line)
    return _Overlong(chars - 1 if line.endswith("\n") else chars)


def repl(session: ChatSession, input_stream: TextIO, output_stream: TextIO) -> int:
    """Reads lines until /quit or EOF: `/commands` are run, other non-empty lines go to the agent; returns 0.

    A line that is not valid in the input's encoding (or not valid text), or longer than the session's
    `limits.max_text_chars`, is answered with one error line and skipped (a strict `io.TextIOWrapper` input is
    switched to errors="surrogateescape" for this).
    """
    def say(text: str) -> None:
        output_stream.write(text + "\n")
        output_stream.flush()

    say(session.banner())
    prompt = f"{session.user_id}> "
    input_stream, encoding = _tolerant(input_stream), _encoding_name(input_stream)
    failed_reads, max_chars = 0, session.limits.max_text_chars
    try:
        while True:
            try:
                line = _read(input_stream, prompt, max_chars)
            except UnicodeDecodeError as exc:  # a stream that cannot be made tolerant
                say(f"error: input is not valid {encoding} ({exc.reason} at byte {exc.start}); turn ignored")
                failed_reads += 1
                if failed_reads >= MAX_FAILED_READS:
                    say(f"error: {failed_reads} reads in a row failed to decode; leaving")
                    break
                continue
            failed_reads = 0
            if line is None:
                break
            if isinstance(line, _Overlong):
                say(_too_long(line.chars, max_chars))
                continue
            try:
                check_text(line, "chat", "line")  # the offsets are the raw line's columns
            except TextError as exc:
                say(_refusal(exc, encoding))
                continue
            line = line.strip()
            if not line:
                continue
            if len(line) > max_chars:
                say(_too_long(len(line), max_chars))
                continue
            if line.split()[0] in QUIT:
                break
            try:
                say(session.command(line) if line.startswith("/") else f"assistant: {session.send(line)}")
            except (BackendError, MemoryStoreError) as exc:  # one failed turn does not end the chat
                say(f"error: {exc}")
    except KeyboardInterrupt:
        say("")
    say("bye")
    return 0


flags.declare_key_flag(cli.WORKDIR.name)  # defined by icml_jax.run.cli; listed by --help
_USER = flags.DEFINE_string("user", None, "who is chatting: the chat keeps one memory per user")
_MEMORY_DB = flags.DEFINE_string("memory_db", None, "SQLite memory store (default <workdir>/chat/memory.sqlite)")


def main(argv: Sequence[str]) -> None:
    """absl entry point: a chat that cannot start exits with one `chat error: ...` line and status 2."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    workdir = cli.WORKDIR.value
    if not workdir or not _USER.value:
        raise app.UsageError("--workdir and --user are required, e.g. --workdir=/tmp/icml_demo --user=alice")

    cli.quiet_info_logs()  # keep Orbax's INFO lines out of the conversation
    sys.unraisablehook = ignoring_closed_event_loops(sys.unraisablehook)  # a damaged checkpoint: one line, no tail
    try:
        session = ChatSession.open(workdir, _USER.value, _MEMORY_DB.value)
    except (ChatError, MemoryStoreError, ValueError) as exc:
        cli.fail("chat", exc, cli.DEBUG.value)
    try:
        code = repl(session, sys.stdin, sys.stdout)
    finally:
        session.close()
        session.model.close()
    sys.exit(code)


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: cli.parse_flags(argv, "chat"))
