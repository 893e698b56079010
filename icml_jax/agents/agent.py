"""The per-turn agent: Trigger -> reply -> Planner -> (maybe) save, returning the reply and a receipt.

The receipt holds everything a user inspects ("which memory, with what probability") and everything the
learner consumes (the exact token arrays, actions, log-probabilities, values and entropies).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from icml_jax.agents import observation as obs
from icml_jax.agents.prefilter import Prefilter, memory_document
from icml_jax.agents.policy import MemoryPolicies, planner_act, trigger_act
from icml_jax.llm.generation import Reply, ReplyInput, generate_replies
from icml_jax.llm.types import LLMBackend, LLMResponse
from icml_jax.llm.verbatim import VerbatimNotes
from icml_jax.memory.fragment import Fragment
from icml_jax.memory.lexical import bm25_scores
from icml_jax.memory.store import MemoryStore
from icml_jax.memory.writer import TurnToSave, commit_saves, condense, note_counts, shown_for
from icml_jax.models.sampler import bucket


SAVE_PROB_BINS = 10  # histogram bins of width 0.1 over p(save)


def save_prob_counts(probs: Sequence[float], saves: Sequence[bool], counts: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """Adds Planner decisions to `counts` ({"decisions", "saved", "mean_prob", "histogram": SAVE_PROB_BINS counts of
    p(save) in [0, 0.1), ..., [0.9, 1]}, made when None) and returns it: where the save probabilities sit against
    the greedy line at 0.5, which the save rate alone does not show."""
    counts = counts if counts is not None else {"decisions": 0, "saved": 0, "mean_prob": 0.0,
                                                "histogram": [0] * SAVE_PROB_BINS}
    if len(probs) != len(saves):
        raise ValueError(f"save_prob_counts: {len(probs)} probabilities for {len(saves)} decisions")
    for p, saved in zip(probs, saves):
        n = counts["decisions"]
        counts["mean_prob"] = (counts["mean_prob"] * n + float(p)) / (n + 1)
        counts["decisions"] = n + 1
        counts["saved"] += int(bool(saved))
        counts["histogram"][min(SAVE_PROB_BINS - 1, max(0, int(float(p) * SAVE_PROB_BINS)))] += 1
    return counts


@dataclasses.dataclass(frozen=True)
class TriggerDecision:
    """Which memory grounded the reply: candidates offered, the index chosen (0 = none) and its statistics."""

    decision_id: str
    candidate_ids: tuple[str, ...]  # fragment ids of options 1..N
    action: int
    prob: float
    logp: float
    entropy: float
    value: float
    probs: tuple[float, ...]  # over options 0..N
    tokens: np.ndarray  # [C, L]: exactly what was scored, for teacher-forced recomputation
    mask: np.ndarray
    cand_mask: np.ndarray  # [C]

    @property
    def fragment_id(self) -> str | None:
        """The chosen memory's id, or None when the Trigger chose no memory."""
        return None if self.action == 0 else self.candidate_ids[self.action - 1]


@dataclasses.dataclass(frozen=True)
class PlannerDecision:
    """Whether the user turn was saved, with the probability of saving and the decision's statistics."""

    decision_id: str
    save: bool
    prob_save: float
    logp: float
    entropy: float
    value: float
    tokens: np.ndarray  # [L]
    mask: np.ndarray


@dataclasses.dataclass(frozen=True)
class Receipt:
    """One turn of the agent: the reply, both decisions, the memory used and the fragment created."""

    user_id: str
    episode_id: str
    session: int
    turn: int
    utterance: str
    reply: str
    trigger: TriggerDecision
    planner: PlannerDecision
    memory_used: Fragment | None
    fragment: Fragment | None
    policy_version: str

    @property
    def replaced(self) -> tuple[tuple[str, str, int, int], ...]:
        """(fragment id, episode, session, turn) of each memory this turn's save superseded."""
        items = self.fragment.extra.get("replaces", ()) if self.fragment is not None else ()
        return tuple((x["id"], *x["ref"]) for x in items)

    def summary(self) -> str:
        """A one-paragraph human explanation (the chat's `/why`)."""
        used = (f"used memory {self.memory_used.fragment_id} ({self.trigger.prob:.0%}): {self.memory_used.text!r}"
                if self.memory_used else f"used no memory ({self.trigger.prob:.0%} for 'none')")
        saved = (f"saved this turn as {self.fragment.fragment_id} (p_save {self.planner.prob_save:.0%})"
                 if self.fragment else f"did not save this turn (p_save {self.planner.prob_save:.0%})")
        if self.replaced:
            saved += f", replacing {', '.join(r[0] for r in self.replaced)} (kept in /history)"
        return f"{used}; {len(self.trigger.candidate_ids)} candidate(s) considered; {saved}."


@dataclasses.dataclass
class AgentConfig:
    """Knobs of the per-turn loop."""

    observation: obs.ObservationConfig = dataclasses.field(default_factory=obs.ObservationConfig)
    greedy: bool = False  # True: argmax decisions (evaluation); False: sample (online learning)
    reply_temperature: float = 0.7
    reply_max_tokens: int = 256
    note_max_tokens: int = 128  # length cap of a saved turn's memory note
    # ablations (Table 2): a rule instead of a learned policy; its decisions are never trained on
    planner_rule: str = "policy"  # policy | save_all (every turn the agent acts on is saved)
    trigger_rule: str = "policy"  # policy | lexical (the BM25-best memory when any word overlaps, else none)
    # a save shows the writer this many of the user's most similar current memories, which the new note may
    # replace (they leave the Trigger's candidates, kept in the history); 0: memories are only ever appended
    supersede_candidates: int = 3
    # model: the generator writes each saved turn's note (checked, llm.note_check); turn: the turn's own text is
    # its note and no model is asked (llm.verbatim), for writers whose notes fail the check anyway
    notes: str = "model"

    def __post_init__(self) -> None:
        t = self.reply_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 2.0:
            raise ValueError(f"AgentConfig.reply_temperature must be a number in [0, 2] (Gemini's range), got {t!r}")
        for name in ("reply_max_tokens", "note_max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"AgentConfig.{name} must be a positive int, got {v!r}")
        k = self.supersede_candidates
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"AgentConfig.supersede_candidates must be an int >= 0 (0: off), got {k!r}")
        if self.notes not in NOTE_SOURCES:
            raise ValueError(f"AgentConfig.notes must be one of {NOTE_SOURCES}, got {self.notes!r}")
        if self.planner_rule not in PLANNER_RULES or self.trigger_rule not in TRIGGER_RULES:
            raise ValueError(f"AgentConfig: planner_rule {self.planner_rule!r} not in {PLANNER_RULES} or "
                             f"trigger_rule {self.trigger_rule!r} not in {TRIGGER_RULES}")


    @classmethod
    def from_config(cls, learner: Any, observation: obs.ObservationConfig, **fields: Any) -> AgentConfig:
        """The knobs a config's `learner` block sets (`LEARNER_KEYS`; a missing or null key keeps this dataclass's
        default, so each default is defined here once) with `observation`; `fields` set the others (greedy)."""
        block = learner if learner is not None else {}
        picked = {k: block.get(k) for k in LEARNER_KEYS if block.get(k) is not None}
        return cls(observation=observation, **picked, **fields)


LEARNER_KEYS = ("reply_temperature", "reply_max_tokens", "note_max_tokens", "planner_rule", "trigger_rule",
                "supersede_candidates", "notes")  # AgentConfig fields a config's `learner` block sets
PLANNER_RULES = ("policy", "save_all")
TRIGGER_RULES = ("policy", "lexical")
NOTE_SOURCES = ("model", "turn")
_NO_TOKENS = np.zeros((0,), np.int32)
_NO_REPLY = Reply("", LLMResponse(""))  # step_many(reply=False): no reply written, no token spent


@dataclasses.dataclass(frozen=True)
class TurnInput:
    """One user turn for `MemoryAgent.step_many`: who, what, the dialogue before it and where it sits."""

    user_id: str
    utterance: str
    history: tuple[tuple[str, str], ...] = ()
    episode_id: str = "chat"
    session: int = 0
    turn: int = 0
    metadata: Mapping[str, Any] | None = None  # travels with the back-end requests (offline back end: labels)
    label: Mapping[str, Any] | None = None  # kept with a saved memory (see `MemoryAgent.remember`)

    @property
    def base(self) -> str:
        """The prefix of this turn's decision ids."""
        return f"{self.user_id}/{self.episode_id}/{self.session}/{self.turn}"


def _pad_batch(arrays: tuple[np.ndarray, ...], keys: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Pads a decision batch (and its raw key data) to the power of two at or above its row count (1, 2, 4, ...)
    by repeating its first row, so batched play compiles one program per row bucket, not per number of users
    still playing, and a single user's decision runs one row; extra rows are ignored."""
    n = arrays[0].shape[0]
    if keys.shape[0] != n:
        raise ValueError(f"need one key per decision: {n} decision(s), keys of shape {keys.shape}")
    extra = bucket(n, 1) - n
    if not extra:
        return arrays, keys
    pad = lambda a: np.concatenate([a, np.repeat(a[:1], extra, axis=0)])  # noqa: E731
    return tuple(pad(a) for a in arrays), pad(keys)


class PolicyStateError(RuntimeError):
    """The policy produced non-finite probabilities: its parameters hold NaN or inf (a diverged training)."""


def _check_probs(probs: np.ndarray, where: str) -> None:
    """Raises PolicyStateError naming the decision when `probs` are not finite (a sample from them is garbage)."""
    if not np.all(np.isfinite(probs)):
        raise PolicyStateError(f"{where}: the policy's probabilities are not finite ({probs.tolist()[:4]}...): its "
                               "parameters hold NaN or inf, e.g. after a diverged warm-up or update; retrain with "
                               "a lower learning rate (config.divergence stops a diverging stage early)")


class MemoryAgent:
    """A chat agent with a per-user long-term memory whose reads and writes are learned policies."""

    def __init__(
        self,
        policies: MemoryPolicies,
        tokenizer,
        store: MemoryStore,
        generator: LLMBackend,
        *,
        condenser: LLMBackend | None = None,
        config: AgentConfig | None = None,
        seed: int = 0,
        prefilter: Prefilter | None = None,
        policy_version: str = "0",
    ) -> None:
        self.policies, self.tokenizer, self.store = policies, tokenizer, store
        self.generator = generator
        self.config = config or AgentConfig()
        self.condenser = condenser or generator
        if self.config.notes == "turn":  # each note is the saved turn's text: no condense request leaves the agent
            self.condenser = VerbatimNotes(self.condenser)
        # which memories the policies read (`config.observation.prefilter`): built once here, shared per process
        self.prefilter = prefilter or self.config.observation.make_prefilter()
        self.policy_version = policy_version  # runtime state, not a knob: which policy acted (the learner bumps it)
        self.key = jax.random.key(seed)
        self._pool: cf.ThreadPoolExecutor | None = None  # made by the first remote `step` without a pool
        self.note_stats = note_counts([])  # the note check's outcomes over every save (`writer.note_counts`)
        self.save_stats = save_prob_counts([], [])  # the Planner's p(save) over every scored decision

    def _next_keys(self, n: int) -> np.ndarray:
        """`n` keys from the agent's own stream as raw key data [n, ...] (the chat; the learner passes
        per-decision keys instead)."""
        keys = jax.random.split(self.key, n + 1)
        self.key = keys[0]
        return np.asarray(jax.random.key_data(keys))[1:]

    def choose_memory(
        self,
        user_id: str,
        utterance: str,
        *,
        history: Sequence[tuple[str, str]] = (),
        episode_id: str = "chat",
        session: int = 0,
        turn: int = 0,
    ) -> tuple[TriggerDecision, Fragment | None]:
        """The Trigger's choice among `user_id`'s memories (the prefilter's candidates) for `utterance`."""
        return self.choose_memories([TurnInput(user_id, utterance, tuple(history), episode_id, session, turn)])[0]

    def choose_memories(self, turns: Sequence[TurnInput], keys: np.ndarray | None = None
                        ) -> list[tuple[TriggerDecision, Fragment | None]]:
        """`choose_memory` for several turns (of different users) in one Trigger forward pass; `keys` [len(turns)]
        (raw key data; None: the agent's stream) make each draw depend on its own key only. Each receipt keeps its rows as
        scored alone (`encode_trigger` of one turn), so the update sees the same arrays whatever the batch."""
        cfg = self.config
        candidates = self.candidates(turns)
        if cfg.trigger_rule == "lexical":
            return [self._lexical_choice(t.base, t.utterance, c) for t, c in zip(turns, candidates, strict=True)]
        rows = []
        for t, cands in zip(turns, candidates, strict=True):
            options = obs.trigger_texts(t.history, t.utterance, [f.text for f in cands], cfg.observation)
            tokens, mask, cand_mask = obs.encode_trigger(self.tokenizer, [options], cfg.observation)
            rows.append((tokens[0], mask[0], cand_mask[0]))
        keys = self._next_keys(len(turns)) if keys is None else keys
        arrays, keys = _pad_batch(obs.stack_trigger(rows, obs.pad_token(self.tokenizer)), keys)
        graphdef, state = nnx.split(self.policies)
        action, stats = trigger_act(graphdef, state, *arrays, keys, greedy=cfg.greedy)
        action, stats = jax.device_get((action, stats))
        out = []
        for i, (t, cands, (tokens, mask, cand_mask)) in enumerate(zip(turns, candidates, rows, strict=True)):
            a, probs = int(action[i]), np.asarray(stats.probs[i, : len(cands) + 1])
            _check_probs(probs, f"Trigger decision {t.base}")
            trigger = TriggerDecision(
                decision_id=t.base + "/trigger", candidate_ids=tuple(f.fragment_id for f in cands), action=a,
                prob=float(probs[a]), logp=float(stats.logp[i]), entropy=float(stats.entropy[i]),
                value=float(stats.value[i]), probs=tuple(float(p) for p in probs), tokens=tokens, mask=mask,
                cand_mask=cand_mask)
            out.append((trigger, cands[a - 1] if a else None))
        return out

    def candidates(self, turns: Sequence[TurnInput]) -> list[list[Fragment]]:
        """Each turn's Trigger candidates: all of its user's current memories while they fit under
        `observation.max_candidates`, else the prefilter's best that many, in creation order (one prefilter call
        for all turns: one encoder batch for the embedding prefilter)."""
        frags = [self.store.fragments(t.user_id, current_only=True) for t in turns]
        documents = [[memory_document(f) for f in fs] for fs in frags]
        picked = self.prefilter.capped([t.utterance for t in turns], documents, self.config.observation.max_candidates)
        return [[fs[i] for i in idx] for fs, idx in zip(frags, picked, strict=True)]

    @staticmethod
    def _lexical_choice(base: str, utterance: str, candidates: Sequence[Fragment]
                        ) -> tuple[TriggerDecision, Fragment | None]:
        """The "without Trigger" rule: the candidate with the highest BM25 score (> 0) against the utterance."""
        scores = bm25_scores(utterance, [f"{f.text} {f.source_text}" for f in candidates]) if candidates else []
        best = max(range(len(candidates)), key=lambda i: (scores[i], i), default=None)
        a = 0 if best is None or scores[best] <= 0 else best + 1
        probs = tuple(float(i == a) for i in range(len(candidates) + 1))
        trigger = TriggerDecision(base + "/trigger", tuple(f.fragment_id for f in candidates), a, 1.0, 0.0, 0.0,
                                  0.0, probs, _NO_TOKENS, _NO_TOKENS.astype(bool), _NO_TOKENS.astype(bool))
        return trigger, (candidates[a - 1] if a else None)

    def write_reply(self, utterance: str, memory: Fragment | None, *, history: Sequence[tuple[str, str]] = (),
                    metadata: Mapping[str, Any] | None = None) -> Reply:
        """The generator's reply to `utterance` grounded in `memory` (None: no memory)."""
        return self.write_replies([(utterance, memory, history, metadata)])[0]

    def write_replies(self, items: Sequence[tuple[str, Fragment | None, Sequence[tuple[str, str]],
                                                  Mapping[str, Any] | None]]) -> list[Reply]:
        """`write_reply` for several (utterance, memory, history, metadata) in one back-end call (a batch for the
        local back end, requests in flight for Gemini)."""
        inputs = []
        for utterance, memory, history, metadata in items:
            md = dict(metadata or {})
            if memory is not None:
                md.setdefault("used_ref", list(memory.ref))
            inputs.append(ReplyInput(tuple(history), utterance, memory.text if memory else None, md))
        cfg = self.config
        return generate_replies(self.generator, inputs, temperature=cfg.reply_temperature,
                                max_output_tokens=cfg.reply_max_tokens)

    def respond(
        self,
        user_id: str,
        utterance: str,
        *,
        history: Sequence[tuple[str, str]] = (),
        episode_id: str = "chat",
        session: int = 0,
        turn: int = 0,
        metadata: Mapping[str, Any] | None = None,
    ) -> tuple[TriggerDecision, Fragment | None, Reply]:
        """`choose_memory` then `write_reply`; changes no memory.

        `metadata` travels with the back-end requests (the offline back end reads labels from it).
        """
        trigger, used = self.choose_memory(user_id, utterance, history=history, episode_id=episode_id,
                                           session=session, turn=turn)
        return trigger, used, self.write_reply(utterance, used, history=history, metadata=metadata)

    def remember(
        self,
        user_id: str,
        utterance: str,
        *,
        history: Sequence[tuple[str, str]] = (),
        episode_id: str = "chat",
        session: int = 0,
        turn: int = 0,
        label: Mapping[str, Any] | None = None,
    ) -> tuple[PlannerDecision, Fragment | None]:
        """The Planner's save decision for `utterance` and, when it saves, the stored memory. `label`: the turn's
        labels where the data has them (persona world: `fact`, `supersedes`), kept with the memory; only the
        offline back end reads them (to answer as a labelled writer would)."""
        return self.remember_many([TurnInput(user_id, utterance, tuple(history), episode_id, session, turn,
                                             label=label)])[0]

    def remember_many(self, turns: Sequence[TurnInput]) -> list[tuple[PlannerDecision, Fragment | None]]:
        """`remember` for one turn of each of several users: one Planner forward pass, one back-end call for the
        notes; the same decisions as one by one with greedy decisions (the keys are drawn per turn otherwise)."""
        if len({t.user_id for t in turns}) != len(turns):
            raise ValueError(f"MemoryAgent.remember_many: one turn per user, got users {[t.user_id for t in turns]}")
        planners = self.decide_saves(turns)
        return list(zip(planners, self._save(turns, planners), strict=True))

    def _saves(self, turns: Sequence[TurnInput], planners: Sequence[PlannerDecision]
               ) -> list[tuple[int, TurnToSave]]:
        """(index, save request) of each turn the Planner chose to save."""
        return [(i, TurnToSave(t.episode_id, t.session, t.turn, t.utterance, t.history, p.decision_id,
                               {"label": dict(t.label)} if t.label else {}))
                for i, (t, p) in enumerate(zip(turns, planners, strict=True)) if p.save]

    def _save(self, turns: Sequence[TurnInput], planners: Sequence[PlannerDecision]) -> list[Fragment | None]:
        """Condenses the saved turns (one back-end call for all users) and commits each to its user's memory."""
        saves = self._saves(turns, planners)
        shown = [shown_for(self.store, turns[i].user_id, [save], self.config.supersede_candidates)[0]
                 for i, save in saves]
        condensed = condense(self.condenser, [save for _, save in saves],
                             max_output_tokens=self.config.note_max_tokens, shown=shown) if saves else []
        return self._commit(turns, saves, condensed, shown)

    def _commit(self, turns: Sequence[TurnInput], saves: Sequence[tuple[int, TurnToSave]],
                condensed: Sequence[Any], shown: Sequence[Sequence[Fragment]]) -> list[Fragment | None]:
        """Stores each condensed note in its user's memory (one transaction per user turn); None where not saved."""
        out: list[Fragment | None] = [None] * len(turns)
        note_counts(condensed, self.note_stats)
        for (i, save), note, mems in zip(saves, condensed, shown, strict=True):
            out[i] = commit_saves(self.store, turns[i].user_id, [save], [note], [mems],
                                  policy_version=self.policy_version)[0]
        return out

    def decide_save(
        self,
        user_id: str,
        utterance: str,
        *,
        history: Sequence[tuple[str, str]] = (),
        episode_id: str = "chat",
        session: int = 0,
        turn: int = 0,
    ) -> PlannerDecision:
        """The Planner's save decision alone (no back-end request, no store write)."""
        return self.decide_saves([TurnInput(user_id, utterance, tuple(history), episode_id, session, turn)])[0]

    def decide_saves(self, turns: Sequence[TurnInput], keys: np.ndarray | None = None) -> list[PlannerDecision]:
        """`decide_save` for several turns (of different users) in one Planner forward pass (`keys` and the
        receipts' rows as in `choose_memories`)."""
        cfg = self.config
        if cfg.planner_rule == "save_all":  # the "without Planner" rule: nothing is scored
            return [PlannerDecision(t.base + "/planner", True, 1.0, 0.0, 0.0, 0.0, _NO_TOKENS,
                                    _NO_TOKENS.astype(bool)) for t in turns]
        rows = []
        for t, shown in zip(turns, self._planner_memories(turns), strict=True):
            text = obs.planner_text(t.history, t.utterance, cfg.observation, shown)
            tokens, mask = obs.encode_planner(self.tokenizer, [text], cfg.observation)
            rows.append((tokens[0], mask[0]))
        keys = self._next_keys(len(turns)) if keys is None else keys
        arrays, keys = _pad_batch(obs.stack_planner(rows, obs.pad_token(self.tokenizer)), keys)
        graphdef, state = nnx.split(self.policies)
        save, stats = jax.device_get(planner_act(graphdef, state, *arrays, keys, greedy=cfg.greedy))
        out = []
        for i, (t, (tokens, mask)) in enumerate(zip(turns, rows, strict=True)):
            _check_probs(np.asarray(stats.probs[i: i + 1]), f"Planner decision {t.base}")
            out.append(PlannerDecision(
                decision_id=t.base + "/planner", save=bool(save[i]), prob_save=float(stats.probs[i]),
                logp=float(stats.logp[i]), entropy=float(stats.entropy[i]), value=float(stats.value[i]),
                tokens=tokens, mask=mask))
        save_prob_counts([d.prob_save for d in out], [d.save for d in out], self.save_stats)  # checked above
        return out

    def _planner_memories(self, turns: Sequence[TurnInput]) -> list[list[str]]:
        """M_k before each turn's save: the notes of the `observation.planner_memories` memories most similar to
        the utterance, most similar first (one prefilter call for all turns)."""
        k = self.config.observation.planner_memories
        if not k:
            return [[] for _ in turns]
        frags = [self.store.fragments(t.user_id, current_only=True) for t in turns]
        documents = [[memory_document(f) for f in fs] for fs in frags]
        picked = self.prefilter.similar([t.utterance for t in turns], documents, k)
        return [[fs[i].text for i in idx] for fs, idx in zip(frags, picked, strict=True)]

    def step(
        self,
        user_id: str,
        utterance: str,
        *,
        history: Sequence[tuple[str, str]] = (),
        episode_id: str = "chat",
        session: int = 0,
        turn: int = 0,
        metadata: Mapping[str, Any] | None = None,
        label: Mapping[str, Any] | None = None,
        pool: cf.Executor | None = None,
    ) -> tuple[str, Receipt]:
        """Runs one turn for `user_id` (`respond`, then `remember`) and returns (reply, receipt); see
        `step_many`."""
        turn_input = TurnInput(user_id, utterance, tuple(history), episode_id, session, turn, metadata, label)
        return self.step_many([turn_input], pool=pool)[0]

    def step_many(self, turns: Sequence[TurnInput], *, keys: tuple[np.ndarray, np.ndarray] | None = None,
                  pool: cf.Executor | None = None, reply: bool = True) -> list[tuple[str, Receipt]]:
        """One turn each for several users (at most one turn per user: each sees its own memory as left by its
        previous turn): one Trigger and one Planner forward pass over all of them, one back-end call per kind of
        request. `keys`: (Trigger keys, Planner keys), raw key data, one per turn (None: the agent's stream).
        `reply=False`: no reply is written (each comes back ""), for replayed dialogue whose rewards never read
        one (rl.likelihood); the decisions and memories are the same.

        With a remote generator or condenser the reply and condense requests go out together on `pool` (the
        agent's own one-thread pool when None); decisions, store reads and writes stay on this thread, in the
        sequential order, so each receipt is the one `step` alone would give for the same answers and keys.
        """
        users = [t.user_id for t in turns]
        if len(set(users)) != len(users):
            raise ValueError(f"MemoryAgent.step_many: one turn per user, got users {users}")
        t_keys, p_keys = keys if keys is not None else (None, None)
        chosen = self.choose_memories(turns, t_keys)
        write = (functools.partial(self.write_replies, [(t.utterance, used, t.history, t.metadata)
                                                        for t, (_, used) in zip(turns, chosen, strict=True)])
                 if reply else lambda: [_NO_REPLY] * len(turns))
        if not self.is_remote:
            replies = write()
            planners = self.decide_saves(turns, p_keys)
            fragments = self._save(turns, planners)
        else:
            planners = self.decide_saves(turns, p_keys)
            replies, fragments = self._reply_and_save_concurrent(turns, planners, write, pool or self._own_pool())
        return [(reply.text, Receipt(t.user_id, t.episode_id, t.session, t.turn, t.utterance, reply.text, trigger,
                                     planner, used, fragment, self.policy_version))
                for t, (trigger, used), reply, planner, fragment
                in zip(turns, chosen, replies, planners, fragments, strict=True)]

    @property
    def is_remote(self) -> bool:
        """Whether a back end sends each request over the network (then overlapping requests saves wall time)."""
        return bool(getattr(self.generator, "remote", False) or getattr(self.condenser, "remote", False))

    def _reply_and_save_concurrent(self, turns: Sequence[TurnInput], planners: Sequence[PlannerDecision],
                                   write: Callable[[], list[Reply]], pool: cf.Executor
                                   ) -> tuple[list[Reply], list[Fragment | None]]:
        """`step_many`'s remote path after both decisions: replies and notes in flight together (the remote one of
        them on `pool`, a local one here), then the store writes here."""
        cfg = self.config
        saves = self._saves(turns, planners)
        if not saves:  # nothing to overlap with
            return write(), [None] * len(turns)
        shown = [shown_for(self.store, turns[i].user_id, [save], cfg.supersede_candidates)[0] for i, save in saves]
        note = functools.partial(condense, self.condenser, [save for _, save in saves],
                                 max_output_tokens=cfg.note_max_tokens, shown=shown)
        # the remote request goes out on `pool`; the other one runs here meanwhile (a local back end's model
        # stays on this thread)
        here, there = (note, write) if getattr(self.generator, "remote", False) else (write, note)
        future = pool.submit(there)
        try:
            done_here = here()
        except BaseException:
            cf.wait([future])  # nothing left in flight behind a failure
            raise
        done_there = future.result()
        condensed, replies = (done_here, done_there) if here is note else (done_there, done_here)
        return replies, self._commit(turns, saves, condensed, shown)

    def _own_pool(self) -> cf.Executor:
        """The agent's lazily created pool for `step` calls that pass none (closed by `close`)."""
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent")
        return self._pool

    def close(self) -> None:
        """Shuts down the agent's own request pool, if it made one."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
