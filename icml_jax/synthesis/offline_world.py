"""The offline back end's storyline writer and annotator: persona-world templates, deterministic per request.

A storyline is fully determined by (world, seed id, seed facts, storyline index, number of prequels,
direction), so every request of one storyline (the prequels written backwards one at a time, then the forward
annotation) sees the same plan without any state in the back end: the seed session depends on the seed only
(all storylines of a seed share it); the prequels plant the seed facts (sometimes an older value first, changed
later), a few distractor facts, queries about earlier prequels and chit-chat noise. Answers are the JSON a real
model is asked for, so the synthesizer parses them exactly as it parses Gemini's.

Forward (the comparison of the paper's Table 12; `StorylineKey.direction`): the opening session states the
seed facts amid noise (depends on the seed only, so shared like the seed session); each later session may bring
up a new fact or a change of a seed fact and, with `prequel_query_prob`, asks about a fact stated earlier,
drawn from what is known at that point only: dependencies are incidental, nothing is planted for the end.

Ground truth, for the annotator and the tests (both directions, read off the plan's turn kinds): walking
forward, a fact/update turn has gain 1 when its value is new for its kind (else 0, a repeat); a query needs the
turn that last set its kind's current value in an earlier session; noise and assistant turns need nothing and
have gain 0.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from icml_jax.data.persona_world import FACT_REPLIES, GAPS, NOISE_KINDS, NOISE_REPLIES, TEMPLATES, PersonaWorldConfig
from icml_jax.data.schema import Session, Turn, TurnRef
from icml_jax.llm.offline import heuristic_information_value, register_offline_answers
from icml_jax.synthesis.prompts import (
    SYNTH_ROLES,
    SYNTHESIS_TASKS,
    TASK_SYNTH_ANNOTATE,
    TASK_SYNTH_OPENING,
    TASK_SYNTH_PREQUEL,
    TASK_SYNTH_SEED,
    TASK_SYNTH_SEQUEL,
)
from icml_jax.synthesis.config import DIRECTIONS, OfflineWorldConfig
from icml_jax.synthesis.seeds import stable_hash

USER, ASSISTANT = SYNTH_ROLES


@dataclasses.dataclass(frozen=True)
class StorylineKey:
    """Everything a storyline depends on; travels in request metadata (`to_metadata` / `from_metadata`).

    `num_prequels`: sessions besides the seed / opening one; `direction`: "backward" or "forward" storylines.
    """

    world: PersonaWorldConfig
    offline: OfflineWorldConfig
    seed_id: str
    facts: tuple[str, ...]
    storyline: int = 0
    num_prequels: int = 4
    direction: str = "backward"

    def __post_init__(self) -> None:
        """Rejects an unknown direction, naming it."""
        if self.direction not in DIRECTIONS:
            raise ValueError(f"StorylineKey.direction must be one of {DIRECTIONS}, got {self.direction!r}")

    def to_metadata(self) -> dict[str, Any]:
        """JSON-safe hints for the offline back end."""
        persona = dataclasses.asdict(self.world)
        persona["fact_kinds"] = list(self.world.fact_kinds)
        return {
            "world": {"persona": persona, "offline": dataclasses.asdict(self.offline)},
            "seed_id": self.seed_id,
            "facts": list(self.facts),
            "storyline": self.storyline,
            "num_prequels": self.num_prequels,
            # only when forward, so backward requests stay exactly as they were before the forward mode existed
            **({"direction": self.direction} if self.direction != "backward" else {}),
        }

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> StorylineKey:
        """Inverse of `to_metadata`; a missing key raises naming it."""
        missing = [k for k in ("world", "seed_id", "facts") if k not in md]
        if missing:
            raise ValueError(f"offline back end: synthesis request metadata lacks {missing}")
        world = md["world"]
        return cls(
            world=PersonaWorldConfig.from_config(world["persona"]),
            offline=OfflineWorldConfig(**world.get("offline", {})),
            seed_id=str(md["seed_id"]),
            facts=tuple(md["facts"]),
            storyline=int(md.get("storyline", 0)),
            num_prequels=int(md.get("num_prequels", 4)),
            direction=str(md.get("direction", "backward")),
        )


def split_fact(fact: str) -> tuple[str, str]:
    """'kind: value' -> (kind, value); raises naming the fact when it has no kind."""
    kind, sep, value = fact.partition(": ")
    if not sep or not kind or not value:
        raise ValueError(f"fact {fact!r} is not of the form 'kind: value'")
    return kind.strip(), value.strip()


def _pick(rng: np.random.Generator, seq: Sequence[str]) -> str:
    return seq[int(rng.integers(len(seq)))]


@dataclasses.dataclass
class _Item:
    kind: str  # "fact" | "update" | "query" | "noise"
    fact_kind: str = ""
    value: str = ""
    old: str = ""


def _check_kinds(key: StorylineKey) -> list[tuple[str, str]]:
    facts = [split_fact(f) for f in key.facts]
    for kind, _ in facts:
        if kind not in TEMPLATES:
            raise ValueError(f"offline back end: seed {key.seed_id!r} fact kind {kind!r} has no persona-world "
                             f"template (known: {sorted(TEMPLATES)})")
    return facts


def _noise_count(world: PersonaWorldConfig, n_signal: int) -> int:
    r = world.noise_ratio
    n = int(round(n_signal * r / (1.0 - r)))
    return max(n, world.min_user_turns - n_signal) if r > 0 else n


def _render(world: PersonaWorldConfig, rng: np.random.Generator, items: list[_Item], values: Mapping[str, str],
            gap: tuple[str, float] | None) -> Session:
    """Noise-padded, shuffled user turns with reference replies; `values` gives queries their current value."""
    items = items + [_Item("noise", _pick(rng, NOISE_KINDS)) for _ in range(_noise_count(world, len(items)))]
    items = [items[int(i)] for i in rng.permutation(len(items))]
    u, a = world.user_speaker, world.assistant_speaker
    turns: list[Turn] = []
    for it in items:
        if it.kind == "noise":
            turns.append(Turn(u, _pick(rng, world.noise(it.fact_kind)), meta={"kind": "noise"}))
            reply = _pick(rng, NOISE_REPLIES)
        elif it.kind in ("fact", "update"):
            tpl = TEMPLATES[it.fact_kind]
            text = (_pick(rng, tpl.statements).format(v=it.value) if it.kind == "fact"
                    else _pick(rng, tpl.updates).format(old=it.old, new=it.value))
            turns.append(Turn(u, text, meta={"kind": it.kind, "fact_kind": it.fact_kind,
                                             "fact": f"{it.fact_kind}: {it.value}"}))
            reply = _pick(rng, FACT_REPLIES)
        else:
            query, gold = TEMPLATES[it.fact_kind].queries[int(rng.integers(len(TEMPLATES[it.fact_kind].queries)))]
            fact = f"{it.fact_kind}: {values[it.fact_kind]}"
            turns.append(Turn(u, query, gold_facts=(fact,), meta={"kind": "query", "fact_kind": it.fact_kind}))
            reply = gold.format(v=values[it.fact_kind])
        if world.assistant_turns:
            turns.append(Turn(a, reply, meta={"kind": "reply"}))
    return Session(tuple(turns), None if gap is None else gap[1], None if gap is None else gap[0])


def seed_session(key: StorylineKey) -> Session:
    """The seed session: one query per seed fact (needing it from the past) amid noise; shared by all storylines."""
    facts = _check_kinds(key)
    rng = np.random.default_rng([stable_hash(key.seed_id), 0])
    return _render(key.world, rng, [_Item("query", k) for k, _ in facts], dict(facts), None)


def storyline_sessions(key: StorylineKey) -> list[Session]:
    """The P + 1 sessions of the key's storyline, oldest first, each (but the first) with the gap since the
    previous one: backward, prequels 0..P-1 then the seed session; forward, the opening session then P sequels."""
    return _forward_sessions(key) if key.direction == "forward" else _backward_sessions(key)


def _backward_sessions(key: StorylineKey) -> list[Session]:
    """Prequels 0..P-1 planting the seed facts (and distractors), then the seed session that queries them."""
    facts = _check_kinds(key)
    world, off, P = key.world, key.offline, key.num_prequels
    rng = np.random.default_rng([stable_hash(key.seed_id), key.storyline + 1])
    plan: list[list[_Item]] = [[] for _ in range(P)]
    for kind, value in facts:
        others = [v for v in world.values(kind) if v != value]
        if P >= 2 and others and rng.random() < off.update_prob:
            origin = int(rng.integers(0, P - 1))
            old = _pick(rng, others)
            plan[origin].append(_Item("fact", kind, old))
            plan[int(rng.integers(origin + 1, P))].append(_Item("update", kind, value, old=old))
        else:
            plan[int(rng.integers(0, P))].append(_Item("fact", kind, value))
    seed_kinds = {k for k, _ in facts}
    spare = [k for k in world.fact_kinds if k not in seed_kinds]
    n = min(off.distractor_facts, len(spare))
    for kind in ([str(k) for k in rng.choice(np.array(spare), size=n, replace=False)] if n else []):
        plan[int(rng.integers(0, P))].append(_Item("fact", kind, _pick(rng, world.values(kind))))

    sessions: list[Session] = []
    current: dict[str, str] = {}
    for s in range(P):
        if s >= 1 and rng.random() < off.prequel_query_prob:
            here = {it.fact_kind for it in plan[s]}
            askable = sorted(k for k in current if k not in here)
            if askable:
                plan[s].append(_Item("query", _pick(rng, askable)))
        gap = None if s == 0 else GAPS[int(rng.integers(len(GAPS)))]
        sessions.append(_render(world, rng, plan[s], dict(current), gap))
        for it in plan[s]:
            if it.kind in ("fact", "update"):
                current[it.fact_kind] = it.value
    seed = seed_session(key)
    gap = GAPS[int(rng.integers(len(GAPS)))]
    sessions.append(dataclasses.replace(seed, gap_text=gap[0], gap_seconds=gap[1]))
    return sessions


def opening_session(key: StorylineKey) -> Session:
    """Forward: the first session, stating every seed fact amid noise; depends on the seed only (shared by all
    storylines of a seed, as the backward seed session is)."""
    facts = _check_kinds(key)
    rng = np.random.default_rng([stable_hash(key.seed_id), 0, 1])
    return _render(key.world, rng, [_Item("fact", k, v) for k, v in facts], {}, None)


def _forward_sessions(key: StorylineKey) -> list[Session]:
    """Forward: the opening session, then P sessions in time order, each drawn from the facts known so far.

    When new facts come up and whether a seed fact changes (and when) are drawn first; what a session asks is
    drawn when it is written, from the facts stated before it, so no session is shaped by a later one.
    """
    facts = _check_kinds(key)
    world, off, P = key.world, key.offline, key.num_prequels
    rng = np.random.default_rng([stable_hash(key.seed_id), key.storyline + 1, 1])
    seed_kinds = {k for k, _ in facts}
    spare = [k for k in world.fact_kinds if k not in seed_kinds]
    n = min(off.distractor_facts, len(spare))
    arrivals = {str(k): int(rng.integers(1, P + 1))  # the session where each new fact comes up
                for k in (rng.choice(np.array(spare), size=n, replace=False) if n else [])}
    changes = {k: int(rng.integers(1, P + 1)) for k, v in facts  # the session where a seed fact changes
               if any(x != v for x in world.values(k)) and rng.random() < off.update_prob}

    sessions = [opening_session(key)]
    current = dict(facts)  # what the user has stated so far: kind -> latest value
    for s in range(1, P + 1):
        items = [_Item("fact", k, _pick(rng, world.values(k))) for k, at in arrivals.items() if at == s]
        items += [_Item("update", k, _pick(rng, [v for v in world.values(k) if v != current[k]]), old=current[k])
                  for k, at in changes.items() if at == s]
        if rng.random() < off.prequel_query_prob:
            here = {it.fact_kind for it in items}
            askable = sorted(k for k in current if k not in here)
            if askable:
                items.append(_Item("query", _pick(rng, askable)))
        gap = GAPS[int(rng.integers(len(GAPS)))]
        sessions.append(_render(world, rng, items, dict(current), gap))
        for it in items:
            if it.kind in ("fact", "update"):
                current[it.fact_kind] = it.value
    return sessions


@dataclasses.dataclass(frozen=True)
class TruthLabel:
    """Ground truth of one user turn: its information gain and the earlier turns it needs."""

    gain: float
    needs: tuple[TurnRef, ...]


def ground_truth(sessions: Sequence[Session | None], dialogues: Sequence[Sequence[tuple[str, str]]],
                 user_speaker: str) -> list[dict[int, TruthLabel]]:
    """Per session, user-turn index -> TruthLabel, walking forward in time.

    `sessions[i]` is the plan's session i when `dialogues[i]` (what the annotator was shown) matches its text
    exactly, else None: those turns fall back to the lexical heuristic gain and need nothing.
    """
    latest: dict[str, tuple[str, TurnRef]] = {}  # kind -> (current value, turn that set it)
    out: list[dict[int, TruthLabel]] = []
    for si, dialogue in enumerate(dialogues):
        plan = sessions[si]
        labels: dict[int, TruthLabel] = {}
        updates: list[tuple[str, str, TurnRef]] = []
        for ti, (speaker, text) in enumerate(dialogue):
            if speaker != user_speaker:
                continue
            meta = plan.turns[ti].meta if plan is not None else None
            if meta is None:
                labels[ti] = TruthLabel(heuristic_information_value(text), ())
                continue
            kind = meta.get("kind")
            if kind in ("fact", "update"):
                fact_kind, value = split_fact(meta["fact"])
                new = latest.get(fact_kind, ("",))[0] != value
                labels[ti] = TruthLabel(1.0 if new else 0.0, ())
                if new:
                    updates.append((fact_kind, value, TurnRef(si, ti)))
            elif kind == "query" and meta.get("fact_kind") in latest:
                labels[ti] = TruthLabel(0.0, (latest[meta["fact_kind"]][1],))
            else:
                labels[ti] = TruthLabel(0.0, ())
        for fact_kind, value, ref in updates:  # applied after the session: queries need earlier sessions
            latest[fact_kind] = (value, ref)
        out.append(labels)
    return out


def _dialogue(session: Session) -> list[tuple[str, str]]:
    return [(t.speaker, t.text) for t in session.turns]


def _session_json(session: Session, user_speaker: str, **extra: Any) -> str:
    turns = [{"speaker": USER if t.speaker == user_speaker else ASSISTANT, "text": t.text} for t in session.turns]
    return json.dumps({**extra, "turns": turns})


def answer(task: str, md: Mapping[str, Any]) -> str:
    """The offline back end's JSON answer to a synthesis request (see the module docstring)."""
    key = StorylineKey.from_metadata(md)
    if task == TASK_SYNTH_SEED:
        return _session_json(seed_session(key), key.world.user_speaker)
    if task == TASK_SYNTH_OPENING:
        return _session_json(opening_session(key), key.world.user_speaker)
    if task in (TASK_SYNTH_PREQUEL, TASK_SYNTH_SEQUEL):  # the writer's task says the direction
        key = dataclasses.replace(key, direction="forward" if task == TASK_SYNTH_SEQUEL else "backward")
    sessions = storyline_sessions(key)  # annotate: the direction the metadata names
    P = key.num_prequels
    if task == TASK_SYNTH_SEQUEL:
        index, shown = int(md["session"]), md.get("sessions")
        if not 1 <= index <= P:
            raise ValueError(f"offline back end: sequel session {index} not in 1..{P} (seed {key.seed_id!r})")
        if shown is not None and len(shown) != index:
            raise ValueError(f"offline back end: sequel session {index} shown {len(shown)} earlier sessions "
                             f"(seed {key.seed_id!r})")
        return _session_json(sessions[index], key.world.user_speaker, gap_since_previous=sessions[index].gap_text)
    if task == TASK_SYNTH_PREQUEL:
        k = int(md["prequel"])
        if not 0 <= k < P:
            raise ValueError(f"offline back end: prequel {k} not in 0..{P - 1} (seed {key.seed_id!r})")
        index = P - 1 - k
        return _session_json(sessions[index], key.world.user_speaker, gap_to_next=sessions[index + 1].gap_text)
    if task == TASK_SYNTH_ANNOTATE:
        shown = [[(str(s), str(t)) for s, t in d] for d in md["sessions"]]
        current = int(md["session"])
        matched = [sessions[i] if i < len(sessions) and _dialogue(sessions[i]) == d else None
                   for i, d in enumerate(shown)]
        truth = ground_truth(matched, shown, key.world.user_speaker)[current]
        labels = [{"turn": t, "gain": lab.gain, "needs": [{"session": r.session, "turn": r.turn} for r in lab.needs]}
                  for t, lab in sorted(truth.items())]
        return json.dumps({"labels": labels})
    raise ValueError(f"offline back end: {task!r} is not a synthesis task")


register_offline_answers(SYNTHESIS_TASKS, answer)  # the offline back end writes storylines with this module
