"""The LLM judge on the evaluation's targets: the five quality dimensions (1-5, normalized) of each reply, given
the gold history, the utterance and the memory the agent used; never which system wrote it. A verdict that
stays invalid after the judge's re-ask is recorded as a failure and left out of the means, never scored 0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icml_jax.data.schema import Episode
from icml_jax.evaluation.protocol import EpisodeResult, gold_history, judged_ref
from icml_jax.llm.judges import ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.rl.save_log import pearson_or_none


def judge_targets(judge: QualityJudge, results: Sequence[EpisodeResult], episodes: Sequence[Episode]) -> None:
    """Adds `judge` (dimension -> normalized score, or None) and `judge_failure` to every target row, in one
    batched call of the judge's back end."""
    by_id = {e.episode_id: e for e in episodes}
    rows = [row for r in results for row in r.targets]
    items = []
    for row in rows:
        history = gold_history(by_id[row["episode_id"]], row["session"], row["turn"])
        # [] is a label too ("needs no memory"): the oracle scores a memory there as a distraction
        needed = None if row["needed"] is None else [[row["episode_id"], s, t] for s, t in row["needed"]]
        used = judged_ref(row)
        items.append(QualityInput(history, row["utterance"], row["reply"], row["memory"], label_needed=needed,
                                  used_ref=used))
    for row, verdict in zip(rows, judge.judge(items), strict=True):
        row["judge"] = dict(verdict.normalized) if verdict.ok else None
        row["judge_failure"] = None if verdict.ok else (verdict.failure or "no score")


def proxy_truth_correlation(judge: ProxyJudge, results: Sequence[EpisodeResult],
                            episodes: Sequence[Episode]) -> dict[str, Any]:
    """Pearson r between the proxy reward of each save (the judge's information value of the saved turn) and
    its truth reward (the mean judged quality of the final-session replies that used that memory), over the
    saves that some reply used (overall and per session of the save); r is None with fewer than 3 such saves or a
    constant side. Only the used saves are judged (no other save enters r; `proxy_failures` counts among them).
    Needs `judge_targets` first."""
    by_id = {e.episode_id: e for e in episodes}
    quality: dict[tuple[str, int, int], list[float]] = {}
    for r in results:
        for row in r.targets:
            if row.get("memory_ref") and row.get("judge"):
                key = (row["episode_id"], *row["memory_ref"])
                quality.setdefault(key, []).append(sum(row["judge"].values()) / len(row["judge"]))
    saves = [(r.episode_id, s) for r in results for s in r.saved]
    used = [(eid, s) for eid, s in saves if (eid, s["session"], s["turn"]) in quality]
    items = []
    for episode_id, s in used:
        turn = by_id[episode_id].sessions[s["session"]].turns[s["turn"]]
        items.append(ProxyInput(turn.text, tuple(map(tuple, s["history"])),
                                label=None if turn.y_p is None else float(turn.y_p)))
    proxies = judge.judge(items) if items else []
    pairs = [(s["session"], p.score, sum(quality[k]) / len(quality[k]))
             for (eid, s), p in zip(used, proxies, strict=True)
             if p.ok and (k := (eid, s["session"], s["turn"])) in quality]

    def r_of(xy: Sequence[tuple[int, float, float]]) -> float | None:
        return pearson_or_none([p[1] for p in xy], [p[2] for p in xy])

    out: dict[str, Any] = {"saves": len(saves), "saves_used": len(pairs),
                           "proxy_failures": sum(not p.ok for p in proxies), "r": r_of(pairs)}
    out["per_session"] = [  # Table 8's row per session of the save (1-based)
        {"session": n + 1, "saves": sum(s["session"] == n for _, s in saves),
         "saves_used": sum(p[0] == n for p in pairs), "r": r_of([p for p in pairs if p[0] == n])}
        for n in sorted({s["session"] for _, s in saves})]
    return out


__all__ = ["judge_targets", "proxy_truth_correlation"]
