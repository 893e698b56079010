"""Supervised examples from labelled episodes: Planner turns (y_p) and Trigger choices (y_t) with negatives.

Trigger example: a user turn that needs an earlier turn, the needed turn's text as the positive memory, hard
negatives (other user turns of the positive's session) and soft negatives (memories, i.e. y_p turns, of
storylines of *other* seeds whose constraints are of other kinds: storylines of the same seed, or of a seed
with a constraint of the same kind ("diet: vegan" / "diet: keto"), hold memories that would answer the query
as well as the positive, which would make the label wrong). A candidate never equals a positive by reference
or by (normalised) text. Turns of the seed session that need nothing also become examples whose answer is
"none" (index 0). Candidates are built from the turn texts; the synthesis then condenses them into notes as
the online memory writer does (`icml_jax.synthesis.memories`), keeping the turn text as `source_text`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from icml_jax.data.schema import Episode, TurnRef
from icml_jax.memory.lexical import most_similar
from icml_jax.synthesis.seeds import stable_hash

Dialogue = tuple[tuple[str, str], ...]
# (queries, documents per query, k) -> per query the indices of the k most similar documents, best first: the
# online agent's Planner view (`agents.prefilter.Prefilter.similar`)
Similar = Callable[[Sequence[str], Sequence[Sequence[str]], int], list[list[int]]]
SOURCES = ("positive", "hard", "soft")


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A memory offered to the Trigger: its text, why it is there, and where it comes from."""

    text: str  # what the Trigger reads: the condensed note (or the turn text, uncondensed)
    source: str  # "positive" | "hard" | "soft"
    episode_id: str
    ref: TurnRef
    source_text: str | None = None  # the turn text the note was condensed from (None: not condensed)


@dataclasses.dataclass(frozen=True)
class TriggerExample:
    """One Trigger decision: context, utterance, candidate memories and the expert's choice (0 = none)."""

    example_id: str
    episode_id: str
    seed_id: str
    query: TurnRef
    history: Dialogue
    utterance: str
    candidates: tuple[Candidate, ...]
    target: int

    def to_json(self) -> str:
        """Deterministic JSON (for ArrayRecord)."""
        d = dataclasses.asdict(self)
        d["query"] = list(self.query)
        d["history"] = [list(h) for h in self.history]
        d["candidates"] = [{**dataclasses.asdict(c), "ref": list(c.ref)} for c in self.candidates]
        return json.dumps(d, ensure_ascii=False, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, s: str | bytes) -> TriggerExample:
        """Inverse of `to_json`; raises ValueError naming the example when the target is out of range."""
        d = json.loads(s)
        ex = cls(
            example_id=d["example_id"], episode_id=d["episode_id"], seed_id=d["seed_id"],
            query=TurnRef(*d["query"]), history=tuple((a, b) for a, b in d["history"]), utterance=d["utterance"],
            candidates=tuple(Candidate(c["text"], c["source"], c["episode_id"], TurnRef(*c["ref"]),
                                       c.get("source_text")) for c in d["candidates"]),
            target=int(d["target"]),
        )
        if not 0 <= ex.target <= len(ex.candidates):
            raise ValueError(f"trigger example {ex.example_id}: target {ex.target} out of 0..{len(ex.candidates)}")
        return ex


@dataclasses.dataclass(frozen=True)
class PlannerExample:
    """One Planner decision: context, the user turn, y_p, its annotated gain, whether a later turn needs it, and
    the expert's memories shown with it (most similar first; see `planner_examples`)."""

    episode_id: str
    ref: TurnRef
    history: Dialogue
    utterance: str
    label: bool
    gain: float
    needed_later: bool
    memories: tuple[str, ...] = ()


def _user_turns(ep: Episode, user_speaker: str) -> list[TurnRef]:
    return [TurnRef(s, t) for s, sess in enumerate(ep.sessions) for t, turn in enumerate(sess.turns)
            if turn.speaker == user_speaker]


def _history(ep: Episode, ref: TurnRef) -> Dialogue:
    return tuple((t.speaker, t.text) for t in ep.sessions[ref.session].turns[: ref.turn])


def _bm25_similar(queries: Sequence[str], documents: Sequence[Sequence[str]], k: int) -> list[list[int]]:
    return [most_similar(q, d, k) for q, d in zip(queries, documents, strict=True)]


def planner_examples(episodes: Sequence[Episode], user_speaker: str, memories: int = 0,
                     similar: Similar | None = None) -> list[PlannerExample]:
    """Every labelled user turn of every episode, in order. With `memories` > 0 each example carries the
    memories the expert holds at that turn (its earlier y_p turns, as notes: `meta["memory"]` where the
    synthesis condensed them, else the text), the `memories` most similar to the utterance, most similar first,
    picked as the online agent picks them: by `similar` over note and turn text (the agent's prefilter,
    `observation.prefilter`; None: BM25, `memory.lexical.most_similar`), every turn ranked in one call."""
    rows = []  # (episode, ref, turn, needed, note and turn text of the expert's saves before it)
    for ep in episodes:
        needed = {r for s in ep.sessions for t in s.turns for r in (t.y_t or ())}
        held: list[tuple[str, str]] = []  # (note, turn text) of the expert's saves so far
        for ref in _user_turns(ep, user_speaker):
            turn = ep.turn(ref)
            if turn.y_p is None:
                continue
            rows.append((ep, ref, turn, ref in needed, tuple(held)))
            if turn.y_p:
                held.append((str(turn.meta.get("memory", turn.text)), turn.text))
    picked = (similar or _bm25_similar)([turn.text for _, _, turn, _, _ in rows],
                                        [[f"{n} {t}" for n, t in held] for *_, held in rows], memories) \
        if memories > 0 and rows else [[] for _ in rows]
    return [PlannerExample(ep.episode_id, ref, _history(ep, ref), turn.text, bool(turn.y_p),
                           float(turn.meta.get("gain", 1.0 if turn.y_p else 0.0)), needed,
                           tuple(held[i][0] for i in idx))
            for (ep, ref, turn, needed, held), idx in zip(rows, picked, strict=True)]


def _seed_of(ep: Episode) -> str:
    return str(ep.meta.get("seed_id", ep.episode_id))


def _seed_kinds(ep: Episode) -> frozenset[str]:
    """Kinds of the seed's constraints ("diet" of "diet: vegan"; a fact without a kind counts as its own kind)."""
    return frozenset(str(f).partition(":")[0].strip().lower() for f in ep.meta.get("facts", ()))


def _sample(rng: np.random.Generator, pool: list, n: int, banned: set[str]) -> list:
    """Up to n (episode, ref) items of `pool` whose normalised text is not banned, in random order."""
    pool = [x for x in pool if _norm(x[0].turn(x[1]).text) not in banned]
    return [pool[int(i)] for i in rng.permutation(len(pool))[:n]]


def _example(rng: np.random.Generator, ep: Episode, seed_id: str, name: str, query: TurnRef,
             positive: TurnRef | None, negatives: list) -> TriggerExample:
    """The example of `query` with the positive (if any) and negatives shuffled; target 0 = none."""
    cands = [Candidate(e.turn(r).text, src, e.episode_id, r) for src, e, r in negatives]
    if positive is not None:
        cands.append(Candidate(ep.turn(positive).text, "positive", ep.episode_id, positive))
    cands = [cands[int(i)] for i in rng.permutation(len(cands))]
    target = 0 if positive is None else 1 + next(i for i, c in enumerate(cands) if c.source == "positive")
    return TriggerExample(f"{ep.episode_id}/{query.session}.{query.turn}/{name}", ep.episode_id, seed_id,
                          query, _history(ep, query), ep.turn(query).text, tuple(cands), target)


def trigger_examples(
    episodes: Sequence[Episode],
    *,
    user_speaker: str,
    hard_negatives: int,
    soft_negatives: int,
    none_per_episode: int,
    seed: int,
) -> list[TriggerExample]:
    """Trigger examples of `episodes` (one per needed turn, plus "none" ones); soft negatives come from these
    episodes too, so build each split separately. Deterministic in (episodes, knobs, seed)."""
    memories = [(ep, ref) for ep in episodes for ref in _user_turns(ep, user_speaker) if ep.turn(ref).y_p]
    out: list[TriggerExample] = []
    for ep in episodes:
        rng = np.random.default_rng([seed, stable_hash(ep.episode_id), 3])
        seed_id = _seed_of(ep)
        kinds = _seed_kinds(ep)
        soft_pool = [(e, r) for e, r in memories if _seed_of(e) != seed_id and not (_seed_kinds(e) & kinds)]

        for query in _user_turns(ep, user_speaker):
            needs = ep.turn(query).y_t or ()
            banned = {_norm(ep.turn(r).text) for r in needs}
            for k, pos in enumerate(needs):
                same = [(ep, TurnRef(pos.session, t)) for t, turn in enumerate(ep.sessions[pos.session].turns)
                        if turn.speaker == user_speaker and TurnRef(pos.session, t) not in needs]
                negs = [("hard", e, r) for e, r in _sample(rng, same, hard_negatives, banned)]
                negs += [("soft", e, r) for e, r in _sample(rng, soft_pool, soft_negatives, banned)]
                out.append(_example(rng, ep, seed_id, f"need{k}", query, pos, negs))

        last = len(ep.sessions) - 1
        quiet = [q for q in _user_turns(ep, user_speaker) if q.session == last and not ep.turn(q).y_t]
        for q in [quiet[int(i)] for i in rng.permutation(len(quiet))[:none_per_episode]] if last > 0 else []:
            s = int(rng.integers(0, last))
            same = [(ep, TurnRef(s, t)) for t, turn in enumerate(ep.sessions[s].turns) if turn.speaker == user_speaker]
            negs = [("hard", e, r) for e, r in _sample(rng, same, hard_negatives, set())]
            negs += [("soft", e, r) for e, r in _sample(rng, soft_pool, soft_negatives, set())]
            out.append(_example(rng, ep, seed_id, "none", q, None, negs))
    return out


def example_stats(examples: Sequence[TriggerExample]) -> dict[str, Any]:
    """Counts for the manifest: examples, with a positive, "none" ones, candidates per source."""
    by_source = {s: sum(c.source == s for e in examples for c in e.candidates) for s in SOURCES}
    return {"examples": len(examples), "with_positive": sum(e.target > 0 for e in examples),
            "none": sum(e.target == 0 for e in examples), "candidates": by_source}
