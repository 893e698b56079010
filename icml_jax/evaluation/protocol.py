"""Playing the evaluation protocol (after THEANINE): per episode, the agent builds its memory over sessions
1..N-1, then answers every target turn t >= 1 of the final session from the gold turns 0..t-1 with the memory
its Trigger picks; the reference is the gold turn t.

An agent is anything with the `EvalAgent` methods, so the trained policies (`PolicyAgent`) and the baselines
plug in alike. Earlier sessions are played decision by decision: the Trigger's choice (for trigger recall per
session) and the Planner's save (memory construction) on every turn the agent acts on; their replies are not
scored and not generated. The final session changes no memory, so its replies are written in one back-end call
(a batch for the local back end, concurrent requests for Gemini). Timings are host wall time: per Trigger
call, per save decision, per reply as the batch's time over its size, and per session; the generator's tokens
are read per session too. An agent with `lockstep` > 1 (the learner of `eval.learn`) plays the history sessions of
that many episodes together (`play_group`), a tick's time and tokens shared by its turns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Protocol

from icml_jax.agents.agent import TurnInput
from icml_jax.data.labels import SessionCounts, memory_label, session_counts
from icml_jax.data.protocol import Target, final_session_targets
from icml_jax.data.schema import Episode
from icml_jax.llm.types import BackendError
from icml_jax.run.runspec import EvalConfig


@dataclasses.dataclass(frozen=True)
class MemoryChoice:
    """Which memory an agent grounds a reply in (None: no memory), with its provenance and probability."""

    memory_id: str | None
    text: str | None
    ref: tuple[str, int, int] | None  # (episode id, session, turn) of the turn the memory came from
    prob: float | None  # the policy's probability of this choice; None for agents without one
    refs: tuple[tuple[str, int, int], ...] = ()  # agents that put several memories (or whole sessions) in the
    # reply's prompt: the source turns of all of them; empty = just `ref`
    offered: tuple[tuple[str, int, int], ...] | None = None  # a policy that picks one of several memories (ours'
    # Trigger): the source turns of the memories it chose among; None for agents that do not choose

    @property
    def all_refs(self) -> tuple[tuple[str, int, int], ...]:
        """Every source turn whose memory reached the reply prompt."""
        return tuple(self.refs) or ((tuple(self.ref),) if self.ref else ())


@dataclasses.dataclass(frozen=True)
class AgentReply:
    """A target's generated reply, the memory it used and what it cost."""

    text: str
    memory: MemoryChoice
    prompt_tokens: int
    output_tokens: int
    retrieval_ms: float  # choosing the memory
    generation_ms: float  # writing the reply (back end)


class EvalAgent(Protocol):
    """What the protocol needs of a system under evaluation."""

    name: str

    def reset(self) -> None:
        """Forget every user's memory (each episode is a new user)."""

    def observe(self, user_id: str, episode: Episode, session: int, turn: int,
                history: Sequence[tuple[str, str]]) -> tuple[MemoryChoice, bool, float]:
        """One turn of an earlier session: the memory it would use for this turn, whether it saved the turn (None:
        the agent makes no save decision, e.g. long context), and the milliseconds its memory construction took."""

    def answer(self, user_id: str, episode: Episode, targets: Sequence[Target],
               histories: Sequence[Sequence[tuple[str, str]]]) -> list[AgentReply]:
        """For each target, the reply to the gold turn before it given the gold history before that turn; the
        memory does not change in between, so the replies may be generated together."""

    def memory_texts(self, user_id: str) -> list[str]:
        """The texts stored for `user_id` now (storage cost)."""


def reply_temperature(config: Any) -> float | None:
    """The temperature of the evaluation's target replies, `eval.reply_temperature` (0: greedy); None: each
    system's own reply temperature (`learner.reply_temperature`, sampled as the paper does)."""
    value = EvalConfig.from_config(config).reply_temperature
    return None if value is None else float(value)


class PolicyAgent:
    """The trained Planner and Trigger (a `MemoryAgent`) behind the `EvalAgent` interface; `temperature`: the
    target replies' (None: the agent's own `reply_temperature`); `lockstep`: episodes whose history sessions are
    played together, each tick's decisions and notes batched (`observe_many`)."""

    def __init__(self, agent, name: str = "icml", temperature: float | None = None, lockstep: int = 1) -> None:
        self.agent, self.name, self.temperature, self.lockstep = agent, name, temperature, int(lockstep)

    def reset(self) -> None:
        for user in self.agent.store.user_ids():
            self.agent.store.delete_user(user)

    @staticmethod
    def _choice(decision, used) -> MemoryChoice:
        if used is None:
            return MemoryChoice(None, None, None, decision.prob)
        return MemoryChoice(used.fragment_id, used.text, tuple(used.ref), decision.prob)

    def observe(self, user_id, episode, session, turn, history):
        utterance = episode.sessions[session].turns[turn].text
        where = dict(history=tuple(history), episode_id=episode.episode_id, session=session, turn=turn)
        decision, used = self.agent.choose_memory(user_id, utterance, **where)
        start = time.perf_counter()
        label = memory_label(episode.sessions[session].turns[turn])
        planner, _ = self.agent.remember(user_id, utterance, label=label, **where)
        return self._choice(decision, used), planner.save, 1e3 * (time.perf_counter() - start)

    def observe_many(self, items):
        """`observe` for one history turn of each of several users in one batched step (Trigger, Planner and
        notes, no reply; `MemoryAgent.step_many`); each turn's construction time is the step's share."""
        start = time.perf_counter()
        turns = [TurnInput(user, episode.sessions[s].turns[t].text, tuple(history), episode.episode_id, s, t,
                           label=memory_label(episode.sessions[s].turns[t])) for user, episode, s, t, history in items]
        steps = self.agent.step_many(turns, reply=False)
        ms = 1e3 * (time.perf_counter() - start) / max(1, len(items))
        return [(self._choice(r.trigger, r.memory_used), r.planner.save, ms) for _, r in steps]

    def memorize(self, user_id, episode, session, turn, history):
        """Memory construction alone (the Planner's save), without the Trigger's choice `observe` also makes:
        (saved, milliseconds)."""
        return self.memorize_many([(user_id, episode, session, turn, history)])[0]

    def memorize_many(self, items):
        """`memorize` for one turn of each of several users (user, episode, session, turn, history) in one batched
        Planner step (`MemoryAgent.remember_many`); each turn's time is the step's share."""
        start = time.perf_counter()
        turns = [TurnInput(user, episode.sessions[s].turns[t].text, tuple(history), episode.episode_id, s, t,
                           label=memory_label(episode.sessions[s].turns[t])) for user, episode, s, t, history in items]
        saved = [planner.save for planner, _ in self.agent.remember_many(turns)]
        ms = 1e3 * (time.perf_counter() - start) / max(1, len(items))
        return [(did, ms) for did in saved]

    def recall_questions(self, user_id, episode, questions):
        """The memory the Trigger picks for each question asked after the episode's last session (the question
        as the user turn, no dialogue), in one forward pass, with the memories it chose among (`offered`); no
        memory changes."""
        after = len(episode.sessions)
        turns = [TurnInput(user_id, q, (), episode.episode_id, after, i) for i, q in enumerate(questions)]
        store = self.agent.store
        return [dataclasses.replace(self._choice(decision, used),
                                    offered=tuple(store.get(user_id, fid).ref for fid in decision.candidate_ids))
                for decision, used in self.agent.choose_memories(turns)]

    def answer(self, user_id, episode, targets, histories):
        chosen, items = [], []
        for target, history in zip(targets, histories, strict=True):
            utterance = episode.sessions[target.session].turns[target.turn - 1].text
            start = time.perf_counter()
            decision, used = self.agent.choose_memory(user_id, utterance, history=tuple(history),
                                                      episode_id=episode.episode_id, session=target.session,
                                                      turn=target.turn - 1)
            chosen.append((self._choice(decision, used), 1e3 * (time.perf_counter() - start)))
            items.append((utterance, used, history, {"target": [target.episode_id, target.session, target.turn]}))
        start = time.perf_counter()
        own = self.agent.config
        if self.temperature is not None:
            self.agent.config = dataclasses.replace(own, reply_temperature=self.temperature)
        try:
            replies = self.agent.write_replies(items)  # one back-end call for the whole session
        finally:
            self.agent.config = own
        per_reply = 1e3 * (time.perf_counter() - start) / max(1, len(items))
        return [AgentReply(r.text, choice, r.response.prompt_tokens, r.response.output_tokens, ms, per_reply)
                for r, (choice, ms) in zip(replies, chosen, strict=True)]

    def memory_texts(self, user_id):
        return [f.text for f in self.agent.store.fragments(user_id, current_only=True)]


class LearningAgent(PolicyAgent):
    """The policies learning online during the evaluation (`eval.learn`): every history-session turn is a turn
    of Algorithm 1 (`OnlineLearner.step_turns`: Trigger, reply, Planner, both judges), and before the final
    session the user is closed and the joint PPO update runs; the targets are then answered greedily by the
    updated policy. The learning carries over from episode to episode, as online. `lockstep`: episodes whose
    history sessions are played together, their decisions batched, with one update before their targets (the
    learner's `users_in_flight`, as online)."""

    def __init__(self, learner, name: str = "icml-online", temperature: float | None = None,
                 lockstep: int = 1) -> None:
        super().__init__(learner.agent, name, temperature)
        self.learner, self.lockstep = learner, int(lockstep)
        self.updates: list[dict[str, float]] = []

    def observe(self, user_id, episode, session, turn, history):
        return self.observe_many([(user_id, episode, session, turn, history)])[0]

    def observe_many(self, items):
        """One history turn of each of several users, played in one batched learner step; each turn's time is
        the step's share."""
        start = time.perf_counter()
        # the learner sees each episode without its final session: its turns are the scored targets, and a
        # reward that reads later gold turns (rl.likelihood) must never read them
        receipts = self.learner.step_turns([
            (dataclasses.replace(episode, sessions=episode.sessions[:-1]), user, session, turn, tuple(history))
            for user, episode, session, turn, history in items])
        ms = 1e3 * (time.perf_counter() - start) / max(1, len(items))
        return [(self._choice(r.trigger, r.memory_used), r.planner.save, ms) for r in receipts]

    def end_histories(self, user_ids):
        """The users' history sessions are over: close them and run the update their decisions wait for."""
        for user in user_ids:
            self.learner.close_user(user)
        if self.learner.has_pending():
            self.updates.append(self.learner.update())

    def answer(self, user_id, episode, targets, histories):
        self.end_histories([user_id])
        with self._greedy():
            return super().answer(user_id, episode, targets, histories)

    def memorize(self, user_id, episode, session, turn, history):
        """A turn of a conversation whose questions come after it (no session is scored): a turn of Algorithm 1
        on `episode` as given, whole (the caller gives it without questions or answers): (saved, milliseconds)."""
        return self.memorize_many([(user_id, episode, session, turn, history)])[0]

    def memorize_many(self, items):
        """`memorize` for one turn of each of several users (user, episode, session, turn, history) in one batched
        learner step (Algorithm 1, as `observe_many` but on the whole episode); each turn's time is the step's
        share."""
        start = time.perf_counter()
        receipts = self.learner.step_turns([(episode, user, s, t, tuple(history))
                                            for user, episode, s, t, history in items])
        ms = 1e3 * (time.perf_counter() - start) / max(1, len(items))
        return [(r.planner.save, ms) for r in receipts]

    def recall_questions(self, user_id, episode, questions):
        """The conversation is over: the update its decisions wait for, then the greedy Trigger's recall."""
        self.end_histories([user_id])
        with self._greedy():
            return super().recall_questions(user_id, episode, questions)

    @contextlib.contextmanager
    def _greedy(self) -> Iterator[None]:
        """The agent's decisions greedy inside (the evaluation's), sampled again after (the learner's)."""
        sampling = self.agent.config
        self.agent.config = dataclasses.replace(sampling, greedy=True)
        try:
            yield
        finally:
            self.agent.config = sampling


@dataclasses.dataclass
class EpisodeResult:
    """One episode under the protocol: target rows, per-session label counts, storage and timings."""

    episode_id: str
    targets: list[dict[str, Any]]
    counts: list[SessionCounts]
    storage_tokens: list[int]  # tokens of the stored memories after each earlier session
    memories: list[int]  # memories stored after each earlier session
    construction_ms: list[float]  # per observed turn
    saved: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # saved turns: session, turn, history
    observed_sessions: list[int] = dataclasses.field(default_factory=list)  # the session of each observed turn
    observe_retrieval_ms: list[float] = dataclasses.field(default_factory=list)  # per observed turn: the observe
    # call's time outside memory construction (choosing the memory the turn would get)
    session_ms: list[float] = dataclasses.field(default_factory=list)  # wall time of each session, final included
    session_usage: list[dict[str, int]] = dataclasses.field(default_factory=list)  # generator calls / prompt /
    # output tokens spent in each session, final included (empty: not measured)


def gold_history(episode: Episode, session: int, turn: int) -> tuple[tuple[str, str], ...]:
    """The gold (speaker, text) turns before the utterance a target replies to: turns 0..turn-2 of `session`
    (target `turn` answers turn-1)."""
    return tuple((t.speaker, t.text) for t in episode.sessions[session].turns[: turn - 1])


def judged_ref(row: dict[str, Any]) -> list[Any] | None:
    """The (episode, session, turn) ref an oracle judge takes as the memory a target row's reply used: a needed
    one when it reached the prompt among `memory_refs` (agents showing several memories), else the chosen one."""
    refs = [list(r) for r in row.get("memory_refs") or ([row["memory_ref"]] if row.get("memory_ref") else [])]
    needed = [list(n) for n in row.get("needed") or ()]
    hit = next((r for r in refs if r in needed), None)
    ref = hit or (list(row["memory_ref"]) if row.get("memory_ref") else (refs[0] if refs else None))
    return [row["episode_id"], *ref] if ref else None


def history_hash(history: Sequence[tuple[str, str]]) -> str:
    """A short SHA-256 of a gold history, to tell targets with the same turn index apart in targets.jsonl."""
    return hashlib.sha256(json.dumps(list(history), ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _usage_now(usage: Callable[[], Mapping[str, int]] | None) -> dict[str, int]:
    """A snapshot of the generator's cumulative usage; {} when usage is not measured."""
    return dict(usage()) if usage is not None else {}


def _usage_delta(usage: Callable[[], Mapping[str, int]] | None, before: Mapping[str, int]) -> dict[str, int]:
    """What the generator spent since `before` (a snapshot of `usage()`); {} when usage is not measured."""
    if usage is None:
        return {}
    now = usage()
    return {k: int(now.get(k, 0)) - int(before.get(k, 0)) for k in ("calls", "prompt_tokens", "output_tokens")}


def play_episode(agent: EvalAgent, episode: Episode, *, user_speaker: str | None,
                 count_tokens: Callable[[str], int],
                 usage: Callable[[], Mapping[str, int]] | None = None) -> EpisodeResult:
    """Runs the protocol on one episode (see the module docstring); `user_speaker` = whose turns the agent acts
    on in the earlier sessions (None: every turn); `usage`: the generator's cumulative {"calls", "prompt_tokens",
    "output_tokens"}, read at session boundaries for the per-session token cost."""
    (result,) = play_group(agent, [episode], user_speaker=user_speaker, count_tokens=count_tokens, usage=usage)
    return result


@dataclasses.dataclass
class _Play:
    """One episode's history sessions while they are played: its schedule and what is measured of it."""

    schedule: list[tuple[int, int, tuple[tuple[str, str], ...]]]  # (session, turn, history) of each acted turn
    receipts: list[SimpleNamespace] = dataclasses.field(default_factory=list)
    storage: list[int] = dataclasses.field(default_factory=list)
    memories: list[int] = dataclasses.field(default_factory=list)
    construction: list[float] = dataclasses.field(default_factory=list)
    saved: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    observed: list[int] = dataclasses.field(default_factory=list)
    observe_retrieval: list[float] = dataclasses.field(default_factory=list)
    session_ms: list[float] = dataclasses.field(default_factory=list)
    session_usage: list[dict[str, int]] = dataclasses.field(default_factory=list)
    done: int = 0  # entries of `schedule` played

    def session_now(self, history_sessions: int) -> int:
        """The session of the next turn to play (`history_sessions` once every one is played)."""
        return self.schedule[self.done][0] if self.done < len(self.schedule) else history_sessions


def _history_schedule(episode: Episode, user_speaker: str | None) -> list[tuple[int, int, tuple[tuple[str, str], ...]]]:
    """(session, turn, gold history before it) of each history-session turn the agent acts on, in order."""
    out = []
    for s, session in enumerate(episode.sessions[:-1]):
        history: list[tuple[str, str]] = []
        for t, turn in enumerate(session.turns):
            if user_speaker is None or turn.speaker == user_speaker:
                out.append((s, t, tuple(history)))
            history.append((turn.speaker, turn.text))
    return out


def _observe_tick(agent: EvalAgent, items: list[tuple[str, Episode, int, int, list[tuple[str, str]]]]
                  ) -> list[tuple[MemoryChoice, bool | None, float]]:
    """One turn of each of several users: in one batched call where the agent plays in lockstep (`lockstep` > 1,
    `observe_many`), else one `observe` after another."""
    many = getattr(agent, "observe_many", None)
    if many is not None and int(getattr(agent, "lockstep", 1)) > 1:
        return list(many(items))
    return [agent.observe(*item) for item in items]


def play_group(agent: EvalAgent, episodes: Sequence[Episode], *, user_speaker: str | None,
               count_tokens: Callable[[str], int],
               usage: Callable[[], Mapping[str, int]] | None = None) -> list[EpisodeResult]:
    """The protocol on episodes of distinct users played together: their history sessions in lockstep (per
    tick, each episode's next acted turn; one batched call where the agent has `observe_many`), then, after the
    agent's `end_histories` (a learner's update), each episode's final session in order. A tick's wall time and
    generator usage are shared equally by its turns; one episode alone is played exactly as sequential play.
    """
    users = [e.episode_id for e in episodes]
    if len(set(users)) != len(users):
        raise ValueError(f"play_group: the episodes of a group must be distinct users, got {users}")
    for episode in episodes:
        if len(episode.sessions) < 2:
            raise ValueError(f"evaluation episode {episode.episode_id} has {len(episode.sessions)} session(s); "
                             "the protocol needs history sessions before the final one")
    agent.reset()
    plays = [_Play(_history_schedule(e, user_speaker)) for e in episodes]
    sums = [[[0.0, {}] for _ in e.sessions[:-1]] for e in episodes]  # per history session: ms, usage

    def close_sessions(i: int) -> None:  # snapshot storage for every session episode i has finished
        play, history_sessions = plays[i], len(episodes[i].sessions) - 1
        while len(play.storage) < min(play.session_now(history_sessions), history_sessions):
            texts = agent.memory_texts(users[i])
            play.storage.append(sum(count_tokens(x) for x in texts))
            play.memories.append(len(texts))

    for i in range(len(episodes)):
        close_sessions(i)
    while any(p.done < len(p.schedule) for p in plays):
        tick = [i for i, p in enumerate(plays) if p.done < len(p.schedule)]
        items = [(users[i], episodes[i], *plays[i].schedule[plays[i].done][:2],
                  list(plays[i].schedule[plays[i].done][2])) for i in tick]
        before, start = _usage_now(usage), time.perf_counter()
        outcomes = _observe_tick(agent, items)
        share = 1e3 * (time.perf_counter() - start) / len(tick)
        spent = _usage_delta(usage, before)
        for i, (_, _, s, t, history), (choice, saved, ms) in zip(tick, items, outcomes, strict=True):
            play = plays[i]
            play.observe_retrieval.append(max(0.0, share - ms))
            play.observed.append(s)
            play.construction.append(ms)
            play.receipts.append(_receipt(s, t, choice, saved))
            if saved:
                play.saved.append({"session": s, "turn": t, "history": history})
            sums[i][s][0] += share
            for k, v in spent.items():
                sums[i][s][1][k] = sums[i][s][1].get(k, 0) + v / len(tick)
            play.done += 1
        for i in tick:
            close_sessions(i)
    for i, play in enumerate(plays):
        play.session_ms = [ms for ms, _ in sums[i]]
        play.session_usage = [{k: round(v) for k, v in spent.items()} if usage is not None else {}
                              for _, spent in sums[i]]
    end = getattr(agent, "end_histories", None)
    if end is not None:
        end(users)
    return [_answer_final(agent, e, p, count_tokens=count_tokens, usage=usage) for e, p in zip(episodes, plays)]


def _answer_final(agent: EvalAgent, episode: Episode, play: _Play, *, count_tokens: Callable[[str], int],
                  usage: Callable[[], Mapping[str, int]] | None) -> EpisodeResult:
    """An episode's final session, once its history is played: every target's reply and its row."""
    user = episode.episode_id
    final = len(episode.sessions) - 1
    turns = episode.sessions[final].turns
    rows, receipts = [], list(play.receipts)
    targets = final_session_targets(episode)
    histories = [list(gold_history(episode, target.session, target.turn)) for target in targets]
    before, session_start = _usage_now(usage), time.perf_counter()
    replies = agent.answer(user, episode, targets, histories)
    session_ms = play.session_ms + [1e3 * (time.perf_counter() - session_start)]
    session_usage = play.session_usage + [_usage_delta(usage, before)]
    for target, history, reply in zip(targets, histories, replies, strict=True):
        receipts.append(_receipt(final, target.turn - 1, reply.memory, None))
        y_t = turns[target.turn - 1].y_t  # None: unlabelled (real data); (): labelled, needs no memory
        needed = None if y_t is None else [[n.session, n.turn] for n in y_t]
        used_ref = list(reply.memory.ref[1:]) if reply.memory.ref else None
        used_refs = [list(r[1:]) for r in reply.memory.all_refs]
        rows.append({
            "episode_id": target.episode_id, "session": target.session, "turn": target.turn,
            "speaker": target.speaker, "history_sha256": history_hash(history + [(turns[target.turn - 1].speaker,
                                                                                  turns[target.turn - 1].text)]),
            "utterance": turns[target.turn - 1].text, "memory_id": reply.memory.memory_id,
            "memory": reply.memory.text, "memory_prob": reply.memory.prob, "memory_ref": used_ref,
            "memory_refs": used_refs,
            "needed": needed, "recalled": any(r in needed for r in used_refs) if needed else None,
            "reply": reply.text, "reference": target.reference,
            "prompt_tokens": reply.prompt_tokens, "output_tokens": reply.output_tokens,
            "memory_tokens": count_tokens(reply.memory.text) if reply.memory.text else 0,
            "retrieval_ms": reply.retrieval_ms, "generation_ms": reply.generation_ms,
        })
    return EpisodeResult(episode.episode_id, rows, session_counts(episode, receipts), play.storage, play.memories,
                         play.construction, play.saved, play.observed, play.observe_retrieval, session_ms,
                         session_usage if usage is not None else [])


def _receipt(session: int, turn: int, choice: MemoryChoice, saved: bool | None) -> SimpleNamespace:
    """What `session_counts` reads of a decision: where, whether the turn was saved, which memory was used."""
    refs = choice.all_refs
    used = SimpleNamespace(ref=refs[0], refs=refs) if refs else None
    planner = None if saved is None else SimpleNamespace(save=saved)
    return SimpleNamespace(session=session, turn=turn, planner=planner, memory_used=used)


def play(agent: EvalAgent, episodes: Iterable[Episode], *, user_speaker: str | None,
         count_tokens: Callable[[str], int], progress: Callable[[Iterable], Iterable] = iter,
         failures: list[dict[str, str]] | None = None,
         usage: Callable[[], Mapping[str, int]] | None = None) -> list[EpisodeResult]:
    """`play_episode` over `episodes`, in order (`progress` wraps the iteration, e.g. a tqdm bar); an agent with
    `lockstep` > 1 plays consecutive groups of that many episodes together (`play_group`).

    With a `failures` list, an episode during which a back-end request fails for good (BackendError: retries
    exhausted) is skipped and recorded there ({"episode_id", "error"}) instead of ending the evaluation (every
    episode of its group, in lockstep); the requests answered before the failure stay in the answer cache, so a
    rerun asks only for the rest.
    """
    size = int(getattr(agent, "lockstep", 1))
    if size < 1:
        raise ValueError(f"{getattr(agent, 'name', agent)!r}: lockstep must be a positive int, got {size}")
    out: list[EpisodeResult] = []
    group: list[Episode] = []

    def flush() -> None:
        try:
            out.extend(play_group(agent, group, user_speaker=user_speaker, count_tokens=count_tokens, usage=usage))
        except BackendError as exc:
            if failures is None:
                raise
            failures.extend({"episode_id": e.episode_id, "error": str(exc)} for e in group)
        group.clear()

    for episode in progress(episodes):
        if any(e.episode_id == episode.episode_id for e in group):  # the same user twice: one after the other
            flush()
        group.append(episode)
        if len(group) == size:
            flush()
    if group:
        flush()
    return out


__all__ = ["AgentReply", "EpisodeResult", "EvalAgent", "LearningAgent", "MemoryChoice", "PolicyAgent",
           "gold_history", "history_hash", "judged_ref", "play", "play_episode", "play_group",
           "reply_temperature"]
