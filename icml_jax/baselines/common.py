"""What every baseline shares: its settings (`config.baselines` over the defaults), the protocol plumbing of
`EvalAgent` (session ends, one reply call per final session, timings) and how several memories become one
`MemoryChoice` and one memory block of the reply prompt."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import ml_collections

from icml_jax.agents.agent import AgentConfig
from icml_jax.configlib import field_default
from icml_jax.data.protocol import Target
from icml_jax.data.schema import Episode
from icml_jax.data.stream import user_speaker
from icml_jax.evaluation.protocol import AgentReply, MemoryChoice
from icml_jax.llm.generation import ReplyInput, generate_replies
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.fragment import Fragment
from icml_jax.memory.store import MemoryStore
from icml_jax.memory.writer import TurnToSave, commit_saves, condense, save_turns
from icml_jax.run.baseline_defaults import BASELINE_DEFAULTS, baseline_settings_of
from icml_jax.run.runspec import RunSpec

logger = logging.getLogger(__name__)

Ref = tuple[str, int, int]  # (episode id, session, turn) of a source turn

DEFAULTS = BASELINE_DEFAULTS  # the defaults of `config.baselines` (icml_jax.run.baseline_defaults)


def baseline_settings(config: Any) -> dict[str, Any]:
    """`config.baselines` over `DEFAULTS` as a plain dict (`RunSpec.baselines`; a mapping or None works too)."""
    if config is None:
        return baseline_settings_of(None)
    return (config if isinstance(config, RunSpec) else RunSpec.from_config(config)).baselines


@dataclasses.dataclass(frozen=True)
class ReplySettings:
    """How replies and notes are written: the same knobs as our agent's (`config.learner`, with AgentConfig's
    defaults)."""

    temperature: float = field_default(AgentConfig, "reply_temperature")
    max_tokens: int = field_default(AgentConfig, "reply_max_tokens")
    note_max_tokens: int = field_default(AgentConfig, "note_max_tokens")

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict | RunSpec | None) -> ReplySettings:
        """`learner.reply_temperature / reply_max_tokens / note_max_tokens`, read as our agent's are (`RunSpec.agent`:
        a missing key takes the dataclass default); `eval.reply_temperature`, when set, replaces the temperature (the
        target replies are the only replies a baseline writes). None: the defaults."""
        if config is None:
            return cls()
        spec = config if isinstance(config, RunSpec) else RunSpec.from_config(config)
        agent, temperature = spec.agent, spec.eval.reply_temperature
        return cls(float(agent.reply_temperature if temperature is None else temperature), int(agent.reply_max_tokens),
                   int(agent.note_max_tokens))


@dataclasses.dataclass(frozen=True)
class Recalled:
    """One memory a baseline shows: its id, text and source turns."""

    memory_id: str
    text: str
    refs: tuple[Ref, ...]


def memory_block(items: Sequence[Recalled]) -> str | None:
    """The reply prompt's memory text: one memory as is, several as '- ' lines (best first); None: no memory."""
    if not items:
        return None
    if len(items) == 1:
        return items[0].text
    return "\n".join(f"- {m.text}" for m in items)


def choice_of(items: Sequence[Recalled], text: str | None = None) -> MemoryChoice:
    """The `MemoryChoice` of memories shown together: `refs` = every source turn (deduplicated, in order),
    `ref` / `memory_id` = the top memory's; `text` defaults to `memory_block(items)`. No probability."""
    if not items:
        return MemoryChoice(None, None, None, None)
    refs = tuple(dict.fromkeys(r for m in items for r in m.refs))
    top = items[0]
    return MemoryChoice(top.memory_id, text if text is not None else memory_block(items),
                        top.refs[0] if top.refs else None, None, refs)


NO_MEMORY = MemoryChoice(None, None, None, None)


@dataclasses.dataclass(frozen=True)
class Query:
    """A turn a baseline recalls memory for: the utterance, its gold history and where it is."""

    utterance: str
    history: tuple[tuple[str, str], ...]
    episode_id: str
    session: int
    turn: int


class BaselineAgent:
    """The `EvalAgent` plumbing shared by the baselines. Subclasses implement `recall` (the memory shown for
    some queries), `construct` (memory construction at a turn the agent acts on; returns `saved`), and may
    implement `end_session` (memory construction once a session is over), `start_session` and `forget_all`.

    A session is over at the last turn of it the agent acts on (`user_speaker`'s turns; None: all): its later
    turns are the other speaker's, in a deployment the agent's own replies. Sessions never closed that way
    (e.g. none of their turns was acted on) are closed when a later session begins. Memory changes only in
    the earlier sessions: the final session's replies read the memory as it stands (recall has `final=True`).
    """

    kind = "baseline"  # which baseline (the evaluation renames `name` to its system label)

    def __init__(self, generator: LLMBackend, *, user_speaker: str | None,
                 reply: ReplySettings | None = None) -> None:
        self.name = self.kind
        self.generator = generator
        self.user_speaker = user_speaker
        self.reply = reply or ReplySettings()
        self.malformed: dict[str, int] = {}  # task -> malformed answers (provenance reads this dict live)
        self._closed: dict[str, set[int]] = {}
        self._current: dict[str, int] = {}

    # -- hooks -------------------------------------------------------------------------------------

    def recall(self, user_id: str, queries: Sequence[Query], *, final: bool) -> list[MemoryChoice]:
        """The memory each query's reply would get (no memory change when `final`)."""
        raise NotImplementedError

    def construct(self, user_id: str, episode: Episode, session: int, turn: int,
                  history: Sequence[tuple[str, str]]) -> bool | None:
        """Memory construction at an acted turn; returns whether the turn was saved (None, the default: the
        agent makes no per-turn save decision, and the protocol then counts no saves)."""
        return None

    def end_session(self, user_id: str, episode: Episode, session: int) -> None:
        """Memory construction once `session` is over."""

    def start_session(self, user_id: str, session: int) -> None:
        """Called once when `session` begins for `user_id` (before its first recall)."""

    def forget_all(self) -> None:
        """Drop every user's memory."""

    def memory_texts(self, user_id: str) -> list[str]:
        """The texts stored for `user_id` now."""
        return []

    # -- the protocol ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every user's memory and session bookkeeping."""
        self._closed.clear()
        self._current.clear()
        self.forget_all()

    def acts_on(self, episode: Episode, session: int, turn: int) -> bool:
        """Whether the agent acts on this turn (the protocol's user speaker; None: every turn)."""
        return self.user_speaker is None or episode.sessions[session].turns[turn].speaker == self.user_speaker

    def count_malformed(self, task: str, detail: str) -> None:
        """Counts a malformed back-end answer of `task` and says so (the caller then falls back visibly)."""
        self.malformed[task] = self.malformed.get(task, 0) + 1
        logger.warning("%s: malformed %s answer (%s); falling back", self.name, task, detail)

    def _enter(self, user_id: str, episode: Episode, session: int) -> None:
        """Closes every earlier session not closed yet, then starts `session` if it is new for this user."""
        closed = self._closed.setdefault(user_id, set())
        for s in range(session):
            if s not in closed:
                closed.add(s)
                self.end_session(user_id, episode, s)
        if self._current.get(user_id) != session:
            self._current[user_id] = session
            self.start_session(user_id, session)

    def observe(self, user_id: str, episode: Episode, session: int, turn: int,
                history: Sequence[tuple[str, str]]) -> tuple[MemoryChoice, bool | None, float]:
        """The memory this turn would get (chosen before the turn changes anything), then memory construction:
        its milliseconds include the session's end when this is the last acted turn of it."""
        start = time.perf_counter()
        self._enter(user_id, episode, session)
        catch_up = time.perf_counter() - start
        text = episode.sessions[session].turns[turn].text
        (choice,) = self.recall(user_id, [Query(text, tuple(map(tuple, history)), episode.episode_id, session,
                                                turn)], final=False)
        start = time.perf_counter()
        saved = self._construct_turn(user_id, episode, session, turn, history)
        ms = 1e3 * (time.perf_counter() - start + catch_up)
        return choice, saved, ms

    def memorize(self, user_id: str, episode: Episode, session: int, turn: int,
                 history: Sequence[tuple[str, str]]) -> tuple[bool | None, float]:
        """Memory construction alone, without the recall `observe` also makes: (saved, milliseconds)."""
        start = time.perf_counter()
        self._enter(user_id, episode, session)
        saved = self._construct_turn(user_id, episode, session, turn, history)
        return saved, 1e3 * (time.perf_counter() - start)

    def _construct_turn(self, user_id: str, episode: Episode, session: int, turn: int,
                        history: Sequence[tuple[str, str]]) -> bool | None:
        """`construct` at an acted turn, then the session's end when no later turn of it is acted on."""
        saved = self.construct(user_id, episode, session, turn, history)
        self._close_after(user_id, episode, session, turn)
        return saved

    def _close_after(self, user_id: str, episode: Episode, session: int, turn: int) -> None:
        """The session's end once `turn` was its last acted turn (and the session is not closed yet)."""
        n = len(episode.sessions[session].turns)
        if not any(self.acts_on(episode, session, t) for t in range(turn + 1, n)):
            closed = self._closed.setdefault(user_id, set())
            if session not in closed:
                closed.add(session)
                self.end_session(user_id, episode, session)

    def recall_questions(self, user_id: str, episode: Episode, questions: Sequence[str]) -> list[MemoryChoice]:
        """The memory shown for each question asked after the episode's last session (a session of its own, the
        question as its utterance, no dialogue); every earlier session is closed first, no memory changes."""
        after = len(episode.sessions)
        self._enter(user_id, episode, after)
        return self.recall(user_id, [Query(q, (), episode.episode_id, after, i) for i, q in enumerate(questions)],
                           final=True)

    def answer(self, user_id: str, episode: Episode, targets: Sequence[Target],
               histories: Sequence[Sequence[tuple[str, str]]]) -> list[AgentReply]:
        """Every target's reply in one back-end call, each from its gold history and the memory recalled for the
        utterance before it; retrieval time is the batch's over its size, as generation time."""
        if not targets:
            return []
        self._enter(user_id, episode, targets[0].session)
        queries = [Query(episode.sessions[t.session].turns[t.turn - 1].text, tuple(map(tuple, h)), t.episode_id,
                         t.session, t.turn - 1) for t, h in zip(targets, histories, strict=True)]
        start = time.perf_counter()
        choices = self.recall(user_id, queries, final=True)
        retrieval_ms = 1e3 * (time.perf_counter() - start) / len(queries)
        items = []
        for target, query, choice in zip(targets, queries, choices, strict=True):
            md: dict[str, Any] = {"target": [target.episode_id, target.session, target.turn]}
            if choice.ref is not None:
                md["used_ref"] = list(choice.ref)
            items.append(ReplyInput(query.history, query.utterance, choice.text, md))
        start = time.perf_counter()
        replies = generate_replies(self.generator, items, temperature=self.reply.temperature,
                                   max_output_tokens=self.reply.max_tokens)
        per_reply = 1e3 * (time.perf_counter() - start) / len(items)
        return [AgentReply(r.text, c, r.response.prompt_tokens, r.response.output_tokens, retrieval_ms, per_reply)
                for r, c in zip(replies, choices, strict=True)]

    def provenance(self) -> dict[str, Any]:
        """What the evaluation's setting records about this baseline; `malformed_answers` is the agent's live
        counter, so the setting written after the run holds the run's counts."""
        return {"baseline": self.kind, "user_speaker": self.user_speaker, "reply": dataclasses.asdict(self.reply),
                "malformed_answers": self.malformed}


class SavesEveryTurnAgent(BaselineAgent):
    """A baseline whose memory is our store of condensed notes and that saves every turn it acts on, written by
    the generator's condense call exactly as our Planner's saves (`icml_jax.memory.writer.save_turns`), so the
    memories differ from ours only in which turns are kept."""

    def __init__(self, generator: LLMBackend, store: MemoryStore, *, user_speaker: str | None,
                 reply: ReplySettings | None = None, lockstep: int = 1) -> None:
        super().__init__(generator, user_speaker=user_speaker, reply=reply)
        self.store = store
        self.lockstep = int(lockstep)  # users whose history turns the protocol plays together (`observe_many`)

    def forget_all(self) -> None:
        for user in self.store.user_ids():
            self.store.delete_user(user)

    def _to_save(self, user_id: str, episode: Episode, session: int, turn: int,
                 history: Sequence[tuple[str, str]]) -> TurnToSave:
        text = episode.sessions[session].turns[turn].text
        return TurnToSave(episode.episode_id, session, turn, text, tuple(map(tuple, history)),
                          f"{user_id}/{episode.episode_id}/{session}/{turn}/{self.kind}")

    def construct(self, user_id: str, episode: Episode, session: int, turn: int,
                  history: Sequence[tuple[str, str]]) -> bool:
        """Saves the turn (one condense call)."""
        save_turns(self.store, self.generator, user_id, [self._to_save(user_id, episode, session, turn, history)],
                   policy_version=self.kind, note_max_tokens=self.reply.note_max_tokens)
        return True

    def observe_many(self, items: Sequence[tuple[str, Episode, int, int, Sequence[tuple[str, str]]]]
                     ) -> list[tuple[MemoryChoice, bool, float]]:
        """`observe` for one acted turn of each of several distinct users: each memory chosen first, then every
        turn's note in one batched condense call (what `observe` does one call at a time; the notes and choices
        are the same); each turn's construction time is an equal share of the batch's."""
        users = [item[0] for item in items]
        if len(set(users)) != len(users):
            raise ValueError(f"{self.name}.observe_many: the turns of one tick must be distinct users, got {users}")
        choices, catch_up = [], 0.0
        for user_id, episode, session, turn, history in items:
            start = time.perf_counter()
            self._enter(user_id, episode, session)
            catch_up += time.perf_counter() - start
            text = episode.sessions[session].turns[turn].text
            (choice,) = self.recall(user_id, [Query(text, tuple(map(tuple, history)), episode.episode_id, session,
                                                    turn)], final=False)
            choices.append(choice)
        start = time.perf_counter()
        saves = [self._to_save(*item) for item in items]
        notes = condense(self.generator, saves, max_output_tokens=self.reply.note_max_tokens)
        for (user_id, episode, session, turn, _), save, note in zip(items, saves, notes, strict=True):
            commit_saves(self.store, user_id, [save], [note], [[]], policy_version=self.kind)
            self._close_after(user_id, episode, session, turn)
        ms = 1e3 * (time.perf_counter() - start + catch_up) / len(items)
        return [(choice, True, ms) for choice in choices]

    def fragments(self, user_id: str) -> list[Fragment]:
        """The user's memories, oldest first."""
        return self.store.fragments(user_id)

    def memory_texts(self, user_id: str) -> list[str]:
        return [f.text for f in self.store.fragments(user_id)]


def recalled_fragment(fragment: Fragment) -> Recalled:
    """A stored fragment as a shown memory."""
    return Recalled(fragment.fragment_id, fragment.text, (tuple(fragment.ref),))


def session_turns(agent: BaselineAgent, episode: Episode, session: int) -> list[tuple[int, str, str, bool]]:
    """A session's turns as the baselines' prompts show them: (turn index, speaker, text, whether the agent acts
    on it)."""
    return [(t, turn.speaker, turn.text, agent.acts_on(episode, session, t))
            for t, turn in enumerate(episode.sessions[session].turns)]


def user_speaker_of(config: Any) -> str | None:
    """Whose turns the agent acts on, as the evaluation plays them (`icml_jax.data.stream.user_speaker`)."""
    return user_speaker(config)


__all__ = ["BaselineAgent", "DEFAULTS", "NO_MEMORY", "Query", "Recalled", "Ref", "ReplySettings",
           "SavesEveryTurnAgent", "baseline_settings", "choice_of", "memory_block", "recalled_fragment",
           "user_speaker_of"]
__all__ += ["session_turns"]
