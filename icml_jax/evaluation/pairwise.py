"""Pairwise preference between two systems' replies on the same targets (the paper's Table 9): the judge sees
the gold history, the utterance and both (reply, memory) pairs as "1" and "2" in a seeded random order, which
is recorded; verdicts map back to win / tie / loss of system A, with 95% intervals and a sign test."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icml_jax.data.schema import Episode
from icml_jax.evaluation.metrics import Preference, pairwise_preference
from icml_jax.evaluation.protocol import gold_history, judged_ref
from icml_jax.llm import prompts
from icml_jax.llm.judges import PairwiseJudge

Key = tuple[str, int, int]


def _key(row: Mapping[str, Any]) -> Key:
    return row["episode_id"], int(row["session"]), int(row["turn"])


def align(rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping, Mapping]]:
    """The two systems' rows target by target; both must hold the same targets with the same gold history and
    reference (else ValueError naming the first difference)."""
    a, b = {_key(r): r for r in rows_a}, {_key(r): r for r in rows_b}
    if a.keys() != b.keys():
        only = sorted(a.keys() ^ b.keys())
        raise ValueError(f"the two evaluations hold different targets ({len(only)} differ, e.g. {only[0]}); "
                         "evaluate both on the same episodes")
    pairs = []
    for key in sorted(a):
        ra, rb = a[key], b[key]
        for field in ("history_sha256", "reference", "utterance"):
            if ra[field] != rb[field]:
                raise ValueError(f"target {key}: the two evaluations differ in {field!r}")
        pairs.append((ra, rb))
    return pairs


@dataclasses.dataclass
class PairwiseResult:
    """Per-target verdicts (from A's side) and their statistics; `failures` are left out of them."""

    rows: list[dict[str, Any]]
    preference: Preference | None
    failures: int


def compare(rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]], judge: PairwiseJudge,
            episodes: Sequence[Episode], *, seed: int = 0) -> PairwiseResult:
    """Judges every aligned target once, in one batched call of the judge's back end."""
    by_id = {e.episode_id: e for e in episodes}
    pairs = align(rows_a, rows_b)
    flips = np.random.default_rng(seed).random(len(pairs)) < 0.5  # True: B is shown first
    requests = []
    for (ra, rb), flip in zip(pairs, flips, strict=True):
        history = gold_history(by_id[ra["episode_id"]], ra["session"], ra["turn"])
        shown = (rb, ra) if flip else (ra, rb)
        md: dict[str, Any] = {}
        if ra.get("needed") is not None:
            md["label_needed"] = [[ra["episode_id"], s, t] for s, t in ra["needed"]]
            md["used_refs"] = [judged_ref(r) for r in shown]
        requests.append(prompts.pairwise_judge_request(history, ra["utterance"], (shown[0]["reply"], shown[0]["memory"]),
                                                       (shown[1]["reply"], shown[1]["memory"]), metadata=md))
    verdicts = judge.judge_requests(requests)
    rows, outcomes = [], []
    for (ra, _), flip, v in zip(pairs, flips, verdicts, strict=True):
        outcome = None
        if v.ok:
            first_wins = {1.0: 1, 0.0: -1, 0.5: 0}[v.score]
            outcome = -first_wins if flip else first_wins
            outcomes.append(outcome)
        rows.append({"episode_id": ra["episode_id"], "session": ra["session"], "turn": ra["turn"],
                     "order": "BA" if flip else "AB", "outcome_for_a": outcome, "reason": v.reason,
                     "failure": v.failure})
    return PairwiseResult(rows, pairwise_preference(outcomes) if outcomes else None, len(pairs) - len(outcomes))


def write_pairwise(out_dir: Path, result: PairwiseResult, name_a: str, name_b: str,
                   setting: Mapping[str, Any]) -> dict[str, Any]:
    """`pairwise_<A>_vs_<B>.json` (every verdict and the statistics) and `.md`; returns the JSON content."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"pairwise_{name_a}_vs_{name_b}"
    pref = dataclasses.asdict(result.preference) if result.preference else None
    content = {"a": name_a, "b": name_b, "setting": dict(setting), "failures": result.failures,
               "preference": pref, "targets": result.rows}
    (out_dir / f"{stem}.json").write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = [f"# {name_a} vs {name_b}: pairwise preference", ""]
    if pref is None:
        lines.append(f"No valid verdicts ({result.failures} failures).")
    else:
        p = result.preference
        ci = lambda c: f"[{100 * c[0]:.1f}, {100 * c[1]:.1f}]"  # noqa: E731
        lines += ["| | win | tie | lose | targets | p (sign test) |", "|---|---:|---:|---:|---:|---:|",
                  f"| {name_a} | {100 * p.win_rate:.1f} {ci(p.win_ci)} | {100 * p.tie_rate:.1f} {ci(p.tie_ci)} | "
                  f"{100 * p.loss_rate:.1f} {ci(p.loss_ci)} | {p.n} | {p.p_value:.3g} |", "",
                  f"Percent of targets with 95% Wilson intervals; judge: {setting.get('judge')}; reply order "
                  f"randomized per target (seed {setting.get('seed')}), recorded in the JSON; "
                  f"{result.failures} failed verdicts left out."]
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return content


__all__ = ["PairwiseResult", "align", "compare", "write_pairwise"]
