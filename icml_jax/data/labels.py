"""Reading the y_p / y_t labels of Episodes, and planner precision / trigger recall against them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
