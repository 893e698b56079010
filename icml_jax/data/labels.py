"""Reading the y_p / y_t labels of Episodes, planner precision / trigger recall against them, and the label
counts of played sessions (`SessionCounts`, `session_counts`, `pooled_metrics`).

The counting is pure bookkeeping over episodes and the agent's receipts, so it lives here, below both the online
learner (which counts at play time: `icml_jax.rl` may not import the evaluation layer) and `icml_jax.evaluation`
(which pools and reports the counts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from icml_jax.data.schema import Episode, TurnRef


def save_labels(episode: Episode, speaker: str | None = None) -> dict[TurnRef, bool]:
    """TurnRef -> y_p for every labelled turn (optionally one speaker's turns only)."""
    return {
        TurnRef(s, t): turn.y_p
        for s, session in enumerate(episode.sessions)
        for t, turn in enumerate(session.turns)
        if turn.y_p is not None and (speaker is None or turn.speaker == speaker)
    }


def need_labels(episode: Episode) -> dict[TurnRef, tuple[TurnRef, ...]]:
    """TurnRef -> the earlier turns it needs, for turns whose y_t is non-empty."""
    return {
        TurnRef(s, t): turn.y_t
        for s, session in enumerate(episode.sessions)
        for t, turn in enumerate(session.turns)
        if turn.y_t
    }


def precision_recall(predicted: Iterable[TurnRef], gold: Iterable[TurnRef]) -> tuple[float, float]:
    """Precision and recall of a predicted set against a gold set (1.0 for an empty denominator)."""
    p, g = set(predicted), set(gold)
    hit = len(p & g)
    return (hit / len(p) if p else 1.0), (hit / len(g) if g else 1.0)


def planner_precision_recall(episode: Episode, saved: Iterable[TurnRef]) -> tuple[float, float]:
    """Precision/recall of the turns a planner saved against the turns labelled y_p=True."""
    gold = [ref for ref, y in save_labels(episode).items() if y]
    return precision_recall(saved, gold)


def trigger_recall(episode: Episode, recalled: Mapping[TurnRef, Iterable[TurnRef]]) -> float:
    """Share of (turn, needed earlier turn) pairs that the trigger recalled at that turn."""
    need = need_labels(episode)
    total = sum(len(v) for v in need.values())
    if total == 0:
        return 1.0
    hit = sum(len(set(v) & set(recalled.get(ref, ()))) for ref, v in need.items())
    return hit / total


@dataclasses.dataclass
class SessionCounts:
    """Label counts of one session's decisions: what planner precision / recall and trigger recall pool."""

    episode_id: str
    session: int
    turns: int = 0  # decisions (turns the agent acted on)
    saves: int = 0
    correct_saves: int = 0  # saved turns with y_p True
    unlabelled: int = 0  # decisions on turns without a y_p label (real data): outside precision and the FP rate
    unlabelled_saves: int = 0  # ... of them saved
    gold_saves: int = 0  # turns with y_p True
    needed: int = 0  # (turn, needed earlier turn) pairs of y_t
    recalled: int = 0  # pairs whose needed turn was the memory the Trigger used
    quality_sum: float = 0.0  # judged reply quality (the Trigger's reward) summed over `quality_n` turns
    quality_n: int = 0
    proxy_sum: float = 0.0  # proxy value of the turns (the Planner's immediate reward signal)
    proxy_n: int = 0
    duplicate_saves: int = 0  # saves of a fact (turn meta "fact") the agent had already saved in this episode
    stale_queries: int = 0  # turns needing a fact whose older values were overwritten (meta "stale_facts")
    stale_recalls: int = 0  # ... where a memory that reached the reply states an overwritten value
    stale_queries_saved: int = 0  # stale queries whose current value the agent had saved (the update was kept)
    stale_recalls_saved: int = 0  # ... where the overwritten value still reached the reply
    updates: int = 0  # saved turns overwriting a fact (meta "supersedes") whose old value was saved before
    updates_superseding: int = 0  # ... whose save superseded a memory of the old value

    def add(self, other: SessionCounts) -> None:
        """Accumulate another session's counts (pooling): every field but the session's identity."""
        for f in dataclasses.fields(self)[2:]:
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data (checkpoints)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionCounts:
        """Inverse of `to_json`."""
        return cls(**data)


def pooled_metrics(counts: Iterable[SessionCounts], prefix: str = "labels") -> dict[str, float]:
    """Planner precision / recall / miss and false-positive rates and trigger recall over pooled counts (NaN where
    a denominator is 0)."""
    total = SessionCounts("*", -1)
    for c in counts:
        total.add(c)
    ratio = lambda a, b: a / b if b else float("nan")  # noqa: E731
    return {
        f"{prefix}/planner_precision": ratio(total.correct_saves, total.saves - total.unlabelled_saves),
        f"{prefix}/planner_recall": ratio(total.correct_saves, total.gold_saves),
        f"{prefix}/trigger_recall": ratio(total.recalled, total.needed),
        # Table 8: high-value turns (y_p) not saved, and other turns saved
        f"{prefix}/planner_miss_rate": ratio(total.gold_saves - total.correct_saves, total.gold_saves),
        f"{prefix}/planner_false_positive_rate": ratio(total.saves - total.unlabelled_saves - total.correct_saves,
                                                        total.turns - total.unlabelled - total.gold_saves),
        f"{prefix}/save_rate": ratio(total.saves, total.turns),
        f"{prefix}/needed_pairs": float(total.needed),
        f"{prefix}/reward_quality": ratio(total.quality_sum, total.quality_n),
        f"{prefix}/reward_proxy": ratio(total.proxy_sum, total.proxy_n),
        f"{prefix}/duplicate_saves": float(total.duplicate_saves),
        f"{prefix}/duplicate_save_rate": ratio(total.duplicate_saves, total.saves),
        # facts that change: recalling an overwritten value, and updates that retired the old memory
        f"{prefix}/stale_recall_rate": ratio(total.stale_recalls, total.stale_queries),
        # the same where the Planner kept the update: what superseding can fix (a missed update cannot be)
        f"{prefix}/stale_recall_rate_update_saved": ratio(total.stale_recalls_saved, total.stale_queries_saved),
        f"{prefix}/update_accuracy": ratio(total.updates_superseding, total.updates),
        f"{prefix}/stale_queries": float(total.stale_queries),
    }


LABEL_KEYS = ("fact", "supersedes")


def memory_label(turn: Any) -> dict[str, Any] | None:
    """The labels a saved memory keeps (persona world: the fact it states, the fact it overwrites), or None."""
    label = {k: turn.meta[k] for k in LABEL_KEYS if k in (turn.meta or {})}
    return label or None


def session_counts(episode: Episode, receipts: Sequence[Any]) -> list[SessionCounts]:
    """Per-session label counts of an episode's decisions (`agents.Receipt`s; the definitions above); a save
    of a turn stating a fact (`meta["fact"]`, the persona world) already saved earlier in the episode counts as
    a duplicate save."""
    out = [SessionCounts(episode.episode_id, s) for s in range(len(episode.sessions))]
    by_ref = {(r.session, r.turn): r for r in receipts}
    saved_facts: set[str] = set()

    def fact_at(ref: Sequence[Any]) -> str | None:  # the fact a memory's source turn states
        _, s_, t_ = ref
        return episode.sessions[s_].turns[t_].meta.get("fact")

    for s, session in enumerate(episode.sessions):
        c = out[s]
        for t, turn in enumerate(session.turns):
            receipt = by_ref.get((s, t))
            if turn.y_p:
                c.gold_saves += 1
            if receipt is not None and receipt.planner is not None:  # None: a Trigger decision only (evaluation)
                c.turns += 1
                c.unlabelled += turn.y_p is None
                if receipt.planner.save:
                    c.saves += 1
                    c.unlabelled_saves += turn.y_p is None
                    c.correct_saves += bool(turn.y_p)
                    fact = turn.meta.get("fact")
                    old = turn.meta.get("supersedes")
                    if old is not None and old in saved_facts:
                        c.updates += 1
                        c.updates_superseding += any(r[1] == episode.episode_id and fact_at(r[1:]) == old
                                                     for r in getattr(receipt, "replaced", ()))
                    if fact is not None:
                        c.duplicate_saves += fact in saved_facts
                        saved_facts.add(fact)
            used = receipt.memory_used if receipt is not None else None
            # the memories that reached the reply: one for our Trigger, several for some baselines (`refs`)
            refs = () if used is None else tuple(getattr(used, "refs", None) or (used.ref,))
            for need in turn.y_t or ():
                c.needed += 1
                c.recalled += (episode.episode_id, need.session, need.turn) in refs
            stale = turn.meta.get("stale_facts")
            if stale and turn.y_t and receipt is not None:
                recalled_stale = any(r[0] == episode.episode_id and fact_at(r) in stale for r in refs)
                c.stale_queries += 1
                c.stale_recalls += recalled_stale
                if any(f in saved_facts for f in turn.gold_facts or ()):
                    c.stale_queries_saved += 1
                    c.stale_recalls_saved += recalled_stale
    return out
