"""The paper's reply metrics as pure functions of (replies, references): BLEU-4 and ROUGE-L in percent, the LLM
judge's 1-5 scores normalized, and the statistics of a pairwise preference (win / tie / lose, 95% confidence
intervals, a two-sided sign test), as in the paper's Tables 1 and 9.

BLEU-4 is sacrebleu's corpus BLEU with its defaults (13a tokenizer, exponential smoothing, mixed case); the
signature it prints goes into every result. ROUGE-L is rouge-score's `rougeL` F-measure (no stemming: the
reference implementation's default), averaged over targets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

JUDGE_DIMENSIONS = ("engagingness", "humanness", "coherence", "consistency", "memorability")
JUDGE_MIN, JUDGE_MAX = 1, 5


@dataclasses.dataclass(frozen=True)
class CorpusScore:
    """A corpus-level score in percent, with what it was computed by (a sacrebleu signature, a scorer name)."""

    value: float
    signature: str
    count: int


def _check_pairs(replies: Sequence[str], references: Sequence[str], metric: str) -> None:
    if len(replies) != len(references):
        raise ValueError(f"{metric}: {len(replies)} replies but {len(references)} references")
    if not replies:
        raise ValueError(f"{metric}: no targets to score")
    for i, (r, g) in enumerate(zip(replies, references, strict=True)):
        if not isinstance(r, str) or not isinstance(g, str):
            raise TypeError(f"{metric}: target {i} has a non-string reply or reference ({type(r).__name__}, "
                            f"{type(g).__name__})")


def bleu4(replies: Sequence[str], references: Sequence[str]) -> CorpusScore:
    """Corpus BLEU-4 of `replies` against one reference each (sacrebleu defaults), in percent."""
    from sacrebleu.metrics import BLEU

    _check_pairs(replies, references, "BLEU-4")
    bleu = BLEU()
    score = bleu.corpus_score(list(replies), [list(references)])
    return CorpusScore(float(score.score), str(bleu.get_signature()), len(replies))


def rouge_l_per_target(replies: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F-measure of each reply against its reference (rouge-score, no stemmer), in percent."""
    from rouge_score import rouge_scorer

    _check_pairs(replies, references, "ROUGE-L")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    # rouge-score's argument order is (target, prediction)
    return [100.0 * scorer.score(ref, reply)["rougeL"].fmeasure for reply, ref in zip(replies, references, strict=True)]


def rouge_l(replies: Sequence[str], references: Sequence[str]) -> CorpusScore:
    """Mean ROUGE-L F-measure of each reply against its reference (rouge-score, no stemmer), in percent."""
    f = rouge_l_per_target(replies, references)
    return CorpusScore(math.fsum(f) / len(f), "rouge-score rougeL F, use_stemmer=False, mean", len(f))


def normalize_judge_score(score: float) -> float:
    """A 1-5 judge score mapped to [0, 1] ((s - 1) / 4); out-of-range scores are refused, not clipped."""
    if not JUDGE_MIN <= score <= JUDGE_MAX or math.isnan(score):
        raise ValueError(f"judge score {score!r} outside [{JUDGE_MIN}, {JUDGE_MAX}]")
    return (score - JUDGE_MIN) / (JUDGE_MAX - JUDGE_MIN)


@dataclasses.dataclass(frozen=True)
class Preference:
    """System A vs B on the same targets: shares of wins / ties / losses of A, each with a 95% Wilson interval;
    the two-sided sign-test p-value of wins vs losses (ties dropped), and the counts."""

    wins: int
    ties: int
    losses: int
    win_rate: float
    tie_rate: float
    loss_rate: float
    win_ci: tuple[float, float]
    tie_ci: tuple[float, float]
    loss_ci: tuple[float, float]
    p_value: float

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95% by default); (0, 1) when n == 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # exactly 0 / 1 at k = 0 / n (the closed form gives it up to rounding)
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def pairwise_preference(outcomes: Sequence[int]) -> Preference:
    """Statistics of per-target verdicts +1 (A better), 0 (tie), -1 (B better)."""
    from scipy.stats import binomtest

    bad = [o for o in outcomes if o not in (-1, 0, 1)]
    if bad:
        raise ValueError(f"pairwise verdicts must be -1, 0 or 1; got {bad[:5]}")
    wins, ties, losses = (sum(1 for o in outcomes if o == v) for v in (1, 0, -1))
    n = wins + ties + losses
    if n == 0:
        raise ValueError("pairwise_preference: no verdicts")
    decided = wins + losses
    p_value = float(binomtest(wins, decided, 0.5).pvalue) if decided else 1.0
    return Preference(wins, ties, losses, wins / n, ties / n, losses / n, wilson_interval(wins, n),
                      wilson_interval(ties, n), wilson_interval(losses, n), p_value)


__all__ = ["JUDGE_DIMENSIONS", "CorpusScore", "Preference", "bleu4", "normalize_judge_score", "pairwise_preference",
           "rouge_l", "rouge_l_per_target", "wilson_interval"]
