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
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import ml_collections
from absl import app, flags

from icml_jax.run import cli  # the shared --workdir / --debug flags, one-line errors
from icml_jax.textcheck import TextError, TextLimits, check_text
from icml_jax.run.workdir import CONFIG_FILE, POLICY_DIR, WARMUP_DIR

EPISODE_ID = "chat"
MEMORY_DB = Path("chat") / "memory.sqlite"
HELP = """commands:
  /memories   list your memories (id, session/turn, text; replaced ones marked)
  /history ID how one of your memories changed (added, updated, replaced by which memory, when)
  /forget ID  delete one of your memories (and its history)
  /why        explain the last reply (memory used, with what probability; whether the turn was saved)
  /help       this help
  /quit       leave (Ctrl-D works too)"""


class ChatError(RuntimeError):
    """The chat cannot start; the message says what is missing and what to run."""


def _train_command(workdir: Path) -> str:
    return f"python -m icml_jax.main --config=configs/demo.py --workdir={workdir}"


def _run_hint(workdir: Path) -> str:
    return f"train an agent first: {_train_command(workdir)}"


def load_run_config(workdir: Path) -> ml_collections.ConfigDict:
    """The run's config as the main job wrote it (`<workdir>/config.json`; lists stand where tuples were)."""
    path = workdir / CONFIG_FILE
    if not path.is_file():
        raise ChatError(f"{path} does not exist: {workdir} holds no finished run; {_run_hint(workdir)}")
    return ml_collections.ConfigDict(json.loads(path.read_text(encoding="utf-8")))


# What restoring a damaged checkpoint raises (truncated, garbage, missing or wrongly shaped files): OSError for
# missing files; ValueError for bad JSON, bad UTF-8 and TensorStore's DATA_LOSS / OUT_OF_RANGE / NOT_FOUND on
# array files; KeyError, TypeError and AttributeError from the metadata readers (ours and Orbax's) on JSON of the
# wrong shape. The message keeps the type, so a programming error caught here still shows what it was.
RESTORE_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, LookupError, TypeError, AttributeError)


def restore_failure(workdir: Path, checkpoint: Path, exc: Exception) -> str:
    """One line for a checkpoint that cannot be restored: which, why (first line of the error) and what to do."""
    first = (str(exc).strip().splitlines() or [""])[0]
    reason = f"{type(exc).__name__}: {first[:300]}{'...' if len(first) > 300 else ''}"
    warm = workdir / WARMUP_DIR
    fallback = (f", or move {checkpoint} away to chat with the warm-up checkpoint {warm}"
                if checkpoint != warm and warm.is_dir() else "")
    return (f"cannot restore the policy checkpoint {checkpoint} ({reason}); it is damaged or incomplete: restore it "
            f"from a backup or train again ({_train_command(workdir)}){fallback}")


ignoring_closed_event_loops = cli.ignoring_closed_event_loops  # (defined with the other CLIs' helpers)


def find_checkpoint(workdir: Path) -> tuple[Path, str]:
    """(checkpoint dir, note): the final policy, else the warm-up checkpoint with a note saying so."""
    from icml_jax.checkpoint import META_FILE

    policy, warm = workdir / POLICY_DIR, workdir / WARMUP_DIR
    if (policy / META_FILE).is_file():
        return policy, ""
    if (warm / META_FILE).is_file():
        return warm, f"note: {policy} does not exist; using the warm-up checkpoint {warm} (no online learning)"
    raise ChatError(f"no trained policy in {workdir}: neither {policy} nor a warm-up checkpoint {warm} exists; "
                    f"{_run_hint(workdir)}")


@dataclasses.dataclass
class ChatModel:
    """A trained agent's parts, loaded once from a workdir and shared by the chat sessions built on it."""

    workdir: Path
    checkpoint: Path
    note: str  # empty, or why a fallback checkpoint is used
    policies: Any
    tokenizer: Any
    generator: Any  # LLMBackend: replies and memory notes
    agent_config: Any  # AgentConfig (greedy)
    speakers: tuple[str, str]  # (user, assistant) labels of the history the policies were trained on
    limits: TextLimits = dataclasses.field(default_factory=TextLimits)  # the run's config.limits
    policy_version: str = "0"  # the loaded policy's (its metadata's, else the checkpoint dir's name)

    def agent(self, store: Any) -> Any:
        """A MemoryAgent on `store` (greedy: deterministic for a given policy and memory)."""
        from icml_jax.agents.agent import MemoryAgent

        return MemoryAgent(self.policies, self.tokenizer, store, self.generator, config=self.agent_config,
                           policy_version=self.policy_version)

    def close(self) -> None:
        """Releases the back end (e.g. Gemini's connection pool)."""
        self.generator.close()


def load_model(workdir: str | Path) -> ChatModel:
    """Rebuilds the run's policies and tokenizer, restores the trained state and builds the reply back end."""
    from icml_jax.run.builders import build_models
    from icml_jax.configlib import field_default
    from icml_jax.data.persona_world import PersonaWorldConfig
    from icml_jax.llm.registry import make_backend
    from icml_jax.llm.types import MissingAPIKeyError
    from icml_jax.run.runspec import RunSpec
    from icml_jax.checkpoint import load_warmup

    workdir = Path(workdir).expanduser().absolute()
    config = load_run_config(workdir)
    spec = RunSpec.from_config(config)
    checkpoint, note = find_checkpoint(workdir)
    try:
        generator = make_backend(config.llm.generator)
    except MissingAPIKeyError as exc:  # the key is read from the environment only; never printed
        raise ChatError(f"config.llm.generator of {workdir} is a Gemini back end: {exc}") from None
    try:
        policies, tokenizer = build_models(config, workdir, spec)
    except (OSError, ValueError) as exc:
        generator.close()
        raise ChatError(f"cannot build the policies of {workdir}: {exc}") from None
    try:
        meta = load_warmup(checkpoint, policies)
    except RESTORE_ERRORS as exc:
        generator.close()
        raise ChatError(restore_failure(workdir, checkpoint, exc)) from exc
    policies.eval()  # adapter dropout off
    world = config.data.get("world") or {}
    agent_config = dataclasses.replace(  # the chat's own rules: the learned policies always decide
        spec.agent, planner_rule="policy", trigger_rule="policy", greedy=True)
    speakers = tuple(str(world.get(k, field_default(PersonaWorldConfig, k))) for k in ("user_speaker",
                                                                                       "assistant_speaker"))
    try:  # a run written before config.limits existed gets the defaults
        limits = spec.limits
    except (TypeError, ValueError) as exc:
        generator.close()
        raise ChatError(f"config.limits of {workdir}/{CONFIG_FILE}: {exc}") from None
    return ChatModel(workdir, checkpoint, note, policies, tokenizer, generator, agent_config, speakers, limits,
                     policy_version=str(meta.get("policy_version", checkpoint.name)))


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
        from icml_jax.memory.store import MemoryStore

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
    from icml_jax.llm.types import BackendError
    from icml_jax.memory.store import MemoryStoreError

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
    from icml_jax.memory.store import MemoryStoreError

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
