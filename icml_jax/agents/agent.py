"""The per-turn agent: Trigger -> reply -> Planner -> (maybe) save, returning the reply and a receipt.

The receipt holds everything a user inspects ("which memory, with what probability") and everything the
learner consumes (the exact token arrays, actions, log-probabilities, values and entropies).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from icml_jax.agents import observation as obs
from icml_jax.agents.policy import MemoryPolicies, planner_act, trigger_act
from icml_jax.llm.generation import Reply, ReplyInput, generate_replies
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.fragment import Fragment
from icml_jax.memory.lexical import bm25_scores
from icml_jax.memory.store import MemoryStore
from icml_jax.memory.writer import TurnToSave, commit_saves, condense, save_turns, shown_for


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
    policy_version: str = "0"
    # ablations (Table 2): a rule instead of a learned policy; its decisions are never trained on
    planner_rule: str = "policy"  # policy | save_all (every turn the agent acts on is saved)
    trigger_rule: str = "policy"  # policy | lexical (the BM25-best memory when any word overlaps, else none)
    # a save shows the writer this many of the user's most similar current memories, which the new note may
    # replace (they leave the Trigger's candidates, kept in the history); 0: memories are only ever appended
    supersede_candidates: int = 3

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
        if self.planner_rule not in PLANNER_RULES or self.trigger_rule not in TRIGGER_RULES:
            raise ValueError(f"AgentConfig: planner_rule {self.planner_rule!r} not in {PLANNER_RULES} or "
                             f"trigger_rule {self.trigger_rule!r} not in {TRIGGER_RULES}")


PLANNER_RULES = ("policy", "save_all")
TRIGGER_RULES = ("policy", "lexical")
_NO_TOKENS = np.zeros((0,), np.int32)


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
    ) -> None:
        self.policies, self.tokenizer, self.store = policies, tokenizer, store
        self.generator = generator
        self.condenser = condenser or generator
        self.config = config or AgentConfig()
        self.key = jax.random.key(seed)
        self._pool: cf.ThreadPoolExecutor | None = None  # made by the first remote `step` without a pool

    def _next_key(self) -> jax.Array:
        self.key, key = jax.random.split(self.key)
        return key

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
        """The Trigger's choice among `user_id`'s memories (the lexical prefilter's candidates) for `utterance`."""
        cfg = self.config
        base = f"{user_id}/{episode_id}/{session}/{turn}"
        candidates = self.store.candidates(user_id, utterance, cfg.observation.max_candidates)
        if cfg.trigger_rule == "lexical":
            return self._lexical_choice(base, utterance, candidates)
        graphdef, state = nnx.split(self.policies)
        options = obs.trigger_texts(history, utterance, [f.text for f in candidates], cfg.observation)
        t_tokens, t_mask, t_cand = obs.encode_trigger(self.tokenizer, [options], cfg.observation)
        action, stats = trigger_act(graphdef, state, t_tokens, t_mask, t_cand, self._next_key(), greedy=cfg.greedy)
        a = int(action[0])
        probs = np.asarray(stats.probs[0])
        _check_probs(probs[: len(options)], f"Trigger decision {base}")
        trigger = TriggerDecision(
            decision_id=base + "/trigger", candidate_ids=tuple(f.fragment_id for f in candidates), action=a,
            prob=float(probs[a]), logp=float(stats.logp[0]), entropy=float(stats.entropy[0]),
            value=float(stats.value[0]), probs=tuple(float(p) for p in probs[: len(options)]),
            tokens=t_tokens[0], mask=t_mask[0], cand_mask=t_cand[0])
        return trigger, (candidates[a - 1] if a else None)

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
        planner = self.decide_save(user_id, utterance, history=history, episode_id=episode_id, session=session,
                                   turn=turn)
        fragment = None
        if planner.save:
            (fragment,) = save_turns(
                self.store, self.condenser, user_id,
                [self._turn_to_save(planner, utterance, history, (episode_id, session, turn), label)],
                policy_version=self.config.policy_version, note_max_tokens=self.config.note_max_tokens,
                supersede=self.config.supersede_candidates)
        return planner, fragment

    @staticmethod
    def _turn_to_save(planner: PlannerDecision, utterance: str, history: Sequence[tuple[str, str]],
                      where: tuple[str, int, int], label: Mapping[str, Any] | None) -> TurnToSave:
        """The save request of a turn the Planner chose to save; `where`: (episode_id, session, turn)."""
        extra = {"label": dict(label)} if label else {}
        return TurnToSave(*where, utterance, tuple(history), planner.decision_id, extra)

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
        cfg = self.config
        graphdef, state = nnx.split(self.policies)
        base = f"{user_id}/{episode_id}/{session}/{turn}"
        shown: list[str] = []
        if cfg.observation.planner_memories:  # M_k before this turn's save, the most similar few
            frags = self.store.fragments(user_id, current_only=True)
            shown = [frags[i].text for i in obs.planner_memory_indices(
                utterance, [f"{f.text} {f.source_text}" for f in frags], cfg.observation)]
        if cfg.planner_rule == "save_all":  # the "without Planner" rule: nothing is scored
            planner = PlannerDecision(base + "/planner", True, 1.0, 0.0, 0.0, 0.0, _NO_TOKENS,
                                      _NO_TOKENS.astype(bool))
        else:
            p_text = obs.planner_text(history, utterance, cfg.observation, shown)
            p_tokens, p_mask = obs.encode_planner(self.tokenizer, [p_text], cfg.observation)
            save, pstats = planner_act(graphdef, state, p_tokens, p_mask, self._next_key(), greedy=cfg.greedy)
            _check_probs(np.asarray(pstats.probs[:1]), f"Planner decision {base}")
            planner = PlannerDecision(
                decision_id=base + "/planner", save=bool(save[0]), prob_save=float(pstats.probs[0]),
                logp=float(pstats.logp[0]), entropy=float(pstats.entropy[0]), value=float(pstats.value[0]),
                tokens=p_tokens[0], mask=p_mask[0])
        return planner

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
        """Runs one turn for `user_id` (`respond`, then `remember`) and returns (reply, receipt).

        With a remote generator or condenser the reply and condense requests go out together on `pool` (the
        agent's own one-thread pool when None); decisions, store reads and writes stay on this thread, in the
        sequential order, so the receipt is the same as the sequential path's for the same answers.
        """
        where = dict(history=history, episode_id=episode_id, session=session, turn=turn)
        if not self.is_remote:
            trigger, used, reply = self.respond(user_id, utterance, metadata=metadata, **where)
            planner, fragment = self.remember(user_id, utterance, label=label, **where)
        else:
            trigger, used, reply, planner, fragment = self._step_concurrent(
                user_id, utterance, where, metadata, label, pool or self._own_pool())
        receipt = Receipt(user_id, episode_id, session, turn, utterance, reply.text, trigger, planner, used,
                          fragment, self.config.policy_version)
        return reply.text, receipt

    @property
    def is_remote(self) -> bool:
        """Whether a back end sends each request over the network (then overlapping requests saves wall time)."""
        return bool(getattr(self.generator, "remote", False) or getattr(self.condenser, "remote", False))

    def _step_concurrent(self, user_id: str, utterance: str, where: dict[str, Any],
                         metadata: Mapping[str, Any] | None, label: Mapping[str, Any] | None, pool: cf.Executor
                         ) -> tuple[TriggerDecision, Fragment | None, Reply, PlannerDecision, Fragment | None]:
        """`step`'s remote path: both decisions (Trigger first, as sequentially), then reply and condense in
        flight together (the remote one of them on `pool`, a local one here), then the store writes here."""
        cfg = self.config
        trigger, used = self.choose_memory(user_id, utterance, **where)
        planner = self.decide_save(user_id, utterance, **where)
        history = where["history"]
        write = functools.partial(self.write_reply, utterance, used, history=history, metadata=metadata)
        if not planner.save:  # nothing to overlap with
            return trigger, used, write(), planner, None
        save = [self._turn_to_save(planner, utterance, history,
                                   (where["episode_id"], where["session"], where["turn"]), label)]
        shown = shown_for(self.store, user_id, save, cfg.supersede_candidates)
        note = functools.partial(condense, self.condenser, save, max_output_tokens=cfg.note_max_tokens, shown=shown)
        # the remote request goes out on `pool`; the other one runs here meanwhile (a local back end's model
        # stays on this thread)
        if getattr(self.generator, "remote", False):
            here, there = note, write
        else:
            here, there = write, note
        future = pool.submit(there)
        try:
            done_here = here()
        except BaseException:
            cf.wait([future])  # nothing left in flight behind a failure
            raise
        done_there = future.result()
        condensed, reply = (done_here, done_there) if here is note else (done_there, done_here)
        fragment = commit_saves(self.store, user_id, save, condensed, shown, policy_version=cfg.policy_version)[0]
        return trigger, used, reply, planner, fragment

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
