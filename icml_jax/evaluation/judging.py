"""The LLM judge on the evaluation's targets: the five quality dimensions (1-5, normalized) of each reply, given
the gold history, the utterance and the memory the agent used; never which system wrote it. A verdict that
stays invalid after the judge's re-ask is recorded as a failure and left out of the means, never scored 0."""

from __future__ import annotations

from collections.abc import Sequence

from icml_jax.data.schema import Episode
from icml_jax.evaluation.protocol import EpisodeResult
from icml_jax.llm.judges import QualityInput, QualityJudge


def judge_targets(judge: QualityJudge, results: Sequence[EpisodeResult], episodes: Sequence[Episode]) -> None:
    """Adds `judge` (dimension -> normalized score, or None) and `judge_failure` to every target row, in one
    batched call of the judge's back end."""
    by_id = {e.episode_id: e for e in episodes}
    rows = [row for r in results for row in r.targets]
    items = []
    for row in rows:
        turns = by_id[row["episode_id"]].sessions[row["session"]].turns
        history = tuple((t.speaker, t.text) for t in turns[: row["turn"] - 1])
        needed = [[row["episode_id"], s, t] for s, t in row["needed"]] if row["needed"] else None
        used = [row["episode_id"], *row["memory_ref"]] if row["memory_ref"] else None
        items.append(QualityInput(history, row["utterance"], row["reply"], row["memory"], label_needed=needed,
                                  used_ref=used))
    for row, verdict in zip(rows, judge.judge(items), strict=True):
        row["judge"] = dict(verdict.normalized) if verdict.ok else None
        row["judge_failure"] = None if verdict.ok else (verdict.failure or "no score")


__all__ = ["judge_targets"]
