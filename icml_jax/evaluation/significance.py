"""Whether two evaluations of the same targets differ beyond chance, metric by metric: paired approximate
randomization (each target's two replies swapped with probability 1/2, `samples` times). Corpus BLEU-4 is
rescored from each sentence's sacrebleu statistics; ROUGE-L, BERTScore and the judge's dimensions are per-target
means, whose test flips the sign of each target's difference. MAUVE (a corpus-level clustering) is not tested.
Each test also states its power: the targets a paired test needs to detect the observed and the paper's effect.

    python -m icml_jax.evaluation.significance --baseline=RUN_A/eval --systems RUN_B/eval RUN_C/eval
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from icml_jax.evaluation.metrics import JUDGE_DIMENSIONS
from icml_jax.evaluation.pairwise import align
from icml_jax.evaluation.report import LIKELIHOOD, read_targets

DEFAULT_SAMPLES = 10_000
Row = Mapping[str, Any]
ALPHA, POWER = 0.05, 0.80  # two-sided level and the power the needed target counts are for
Z_SUM = NormalDist().inv_cdf(1 - ALPHA / 2) + NormalDist().inv_cdf(POWER)  # 1.95996 + 0.84162 = 2.80159

# metric -> the paper's effect in the same units: its Table 1 (shared/docs/paper_numbers.md), GapChat columns (the
# data set of these runs), backbone Gemini2.5, Qwen3 ICML-8B (the paper's main row: Table 2's full model) minus
# "Long Context (1M)" (its baseline without a memory module, as no_memory is here; the notes there say that row
# equals Table 6's MemoChat row). Judge dimensions (Figure 3) have no values in the text, MAUVE is not tested.
PAPER_EFFECT: dict[str, float] = {
    "BLEU-4": round(1.28 - 0.78, 2),  # GC B-4
    "ROUGE-L": round(10.64 - 10.05, 2),  # GC R-L
    "BERTScore": round(40.20 - 35.76, 2),  # GC Bert
}


def _judge(dim: str) -> Callable[[Row], float | None]:
    return lambda row: 100.0 * float(row["judge"][dim]) if row.get("judge") else None


# metric -> a target row's value (None: the row has none, e.g. a failed verdict): in percent, except NLL (nats per
# token) and Memory gain (in the evaluation's own unit)
PER_TARGET: dict[str, Callable[[Row], float | None]] = {
    "ROUGE-L": lambda row: row.get("rouge_l"),
    "BERTScore": lambda row: row.get("bertscore_f1"),
    **{dim.capitalize(): _judge(dim) for dim in JUDGE_DIMENSIONS},
    "Memory gain": lambda row: row.get("memory_gain"),
    "NLL": lambda row: row.get("nll"),
}


MIN_TARGETS = math.ceil(math.log2(2 / ALPHA))  # 6: below it no sign-flip test reaches p < ALPHA (p >= 2 / 2^n)


def needed_targets(sd: float | None, effect: float | None) -> int | None:
    """Targets a paired two-sided test at ALPHA needs for POWER against a true mean difference `effect` (normal
    approximation): ceil((Z_SUM * sd / |effect|)^2), at least MIN_TARGETS (the permutation test's floor); None
    where sd or effect is unknown or the effect is 0 (no number of targets detects it)."""
    if sd is None or effect is None or effect == 0 or not math.isfinite(sd):
        return None
    return max(MIN_TARGETS, math.ceil((Z_SUM * sd / abs(effect)) ** 2))


@dataclasses.dataclass(frozen=True)
class PairedTest:
    """System minus baseline on one metric over `n` shared targets, and the two-sided p-value of that
    difference under random swaps of each target's pair (small: unlikely to be chance); `sd` is the per-target
    differences' sample sd (None: unknown, e.g. one target), which sizes the test's power."""

    metric: str
    system: float
    baseline: float
    n: int
    p_value: float
    sd: float | None = None

    @property
    def delta(self) -> float:
        return self.system - self.baseline

    @property
    def paper_effect(self) -> float | None:
        """The paper's effect on this metric (PAPER_EFFECT; None: the paper reports none)."""
        return PAPER_EFFECT.get(self.metric)

    @property
    def needed_observed(self) -> int | None:
        """Targets needed for POWER if the true difference were the observed one (None: it is 0, or no sd)."""
        return needed_targets(self.sd, self.delta)

    @property
    def needed_paper(self) -> int | None:
        """Targets needed for POWER to detect the paper's effect (None: no paper effect, or no sd to size it:
        identical systems have sd 0, which says nothing of the spread under an effect)."""
        if self.sd == 0 and self.delta == 0:
            return None
        return needed_targets(self.sd, self.paper_effect)

    @property
    def powered(self) -> bool | None:
        """Whether the `n` targets reach POWER at the paper's effect (None: it cannot be said)."""
        needed = self.needed_paper
        return None if needed is None else self.n >= needed


def sign_flip_p_value(differences: Sequence[float], *, samples: int = DEFAULT_SAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of the mean of paired `differences` under random sign flips (swapping a target's pair
    flips its difference): (1 + #{|flipped mean| >= |observed mean|}) / (1 + samples)."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or not d.size:
        raise ValueError(f"sign_flip_p_value: needs a non-empty vector of differences, got shape {d.shape}")
    signs = np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), size=(samples, d.size))
    observed = abs(d.mean())
    flipped = np.abs(signs @ d) / d.size
    return float((1 + np.count_nonzero(flipped >= observed - 1e-12 * max(1.0, observed))) / (1 + samples))


def sentence_bleu_stats(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """Each sentence's BLEU sufficient statistics [n, 10] (matches and totals of orders 1-4, hypothesis and
    reference lengths), read from sacrebleu's score of that sentence alone: a corpus's are their sums."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU()
    out = []
    for hyp, ref in zip(hypotheses, references, strict=True):
        s = bleu.corpus_score([hyp], [[ref]])
        out.append([*s.counts, *s.totals, s.sys_len, s.ref_len])
    return np.asarray(out, dtype=np.int64)


def bleu_from_stats(stats: np.ndarray) -> float:
    """Corpus BLEU-4 in percent from summed sufficient statistics, as `metrics.bleu4` scores (sacrebleu's
    defaults: exponential smoothing)."""
    from sacrebleu.metrics import BLEU

    s = [int(v) for v in stats]
    return float(BLEU.compute_bleu(s[:4], s[4:8], s[8], s[9], smooth_method="exp").score)


def bleu_test(system: Sequence[str], baseline: Sequence[str], references: Sequence[str], *,
              samples: int = DEFAULT_SAMPLES, seed: int = 0) -> PairedTest:
    """Corpus BLEU-4 of both and the two-sided approximate-randomization p-value of their difference: each
    sample swaps every target's pair of replies with probability 1/2 and rescores both pseudo-systems from the
    sentences' sufficient statistics. A swap that changes nothing counts as a difference as large as the
    observed one (sacrebleu's own test counts only larger ones, so two nearly identical systems get p ~ 0).
    Its `sd` is estimated from the swaps: a mean of n per-target differences swaps to an sd of rms(d) / sqrt(n),
    so the swapped differences' sd times sqrt(n) stands in for the per-target sd (approximate: corpus BLEU is no
    mean, and rms(d) includes the mean difference); per-sentence BLEU differences would size another statistic."""
    a, b = sentence_bleu_stats(system, references), sentence_bleu_stats(baseline, references)
    total_a, total_b = a.sum(0), b.sum(0)
    bleu_a, bleu_b = bleu_from_stats(total_a), bleu_from_stats(total_b)
    swap = np.random.default_rng(seed).random((samples, len(references))) < 0.5
    moved = swap.astype(np.int64) @ (b - a)  # each sample's statistics moved from a's side to b's
    swapped = np.array([bleu_from_stats(total_a + m) - bleu_from_stats(total_b - m) for m in moved])
    at_least = int(np.count_nonzero(np.abs(swapped) >= abs(bleu_a - bleu_b) - 1e-9))
    return PairedTest("BLEU-4", bleu_a, bleu_b, len(references), (1 + at_least) / (1 + samples),
                      float(swapped.std() * math.sqrt(len(references))))


def compare_rows(system: Sequence[Row], baseline: Sequence[Row], *, samples: int = DEFAULT_SAMPLES,
                 seed: int = 0) -> list[PairedTest]:
    """Every testable metric of `system` against `baseline` on their shared targets (both must hold the same
    targets: `pairwise.align`); a per-target metric uses the targets where both rows have a value."""
    pairs = align(system, baseline)
    out = [bleu_test([a["reply"] for a, _ in pairs], [b["reply"] for _, b in pairs],
                     [a["reference"] for a, _ in pairs], samples=samples, seed=seed)]
    for metric, value in PER_TARGET.items():
        both = [(value(a), value(b)) for a, b in pairs]
        both = [(x, y) for x, y in both if x is not None and y is not None]
        if not both:
            continue
        x, y = np.array(both, dtype=np.float64).T
        out.append(PairedTest(metric, float(x.mean()), float(y.mean()), len(both),
                              sign_flip_p_value(x - y, samples=samples, seed=seed),
                              float(np.std(x - y, ddof=1)) if len(both) > 1 else None))
    return out


def format_p(p: float) -> str:
    """A p-value as the tables print it: two decimals, four below 0.01 (DEFAULT_SAMPLES swaps resolve 0.0001; a
    rounded "0.00" would claim a certainty no finite number of swaps gives)."""
    return f"p {p:.2f}" if p >= 0.01 else f"p {p:.4f}"


def markdown(tests: Mapping[str, Sequence[PairedTest]], baseline: str) -> str:
    """One row per system: each metric's difference from `baseline` and its p-value."""
    metrics = list(dict.fromkeys(t.metric for ts in tests.values() for t in ts))
    lines = [f"| system (minus {baseline}) | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
    for name, ts in tests.items():
        by = {t.metric: t for t in ts}
        lines.append(f"| {name} | " + " | ".join(
            f"{by[m].delta:+.{_digits(m)}f} ({format_p(by[m].p_value)})" if m in by else "-" for m in metrics) + " |")
    return "\n".join(lines)


def _digits(metric: str) -> int:
    """Decimals a difference is printed with: 4 for nats per token (LIKELIHOOD's gaps are hundredths), else 2."""
    return 4 if metric in LIKELIHOOD else 2


def _needed(test: PairedTest, effect: float | None) -> str:
    """A needed target count as printed: "-" where unknown (no sd or no effect to size, or identical systems at
    the paper's effect), "∞" at a zero observed effect."""
    if test.sd is None or effect is None:
        return "-"
    if effect is test.paper_effect:
        return "-" if test.needed_paper is None else str(test.needed_paper)
    needed = needed_targets(test.sd, effect)
    return "∞" if needed is None else str(needed)


def power_line(test: PairedTest) -> str:
    """One test's power in a sentence, for the docs: its targets, sd and the targets needed at both effects."""
    sd = "unknown" if test.sd is None else f"{test.sd:.2f}"
    paper = ("; the paper reports no effect" if test.paper_effect is None else
             f", {_needed(test, test.paper_effect)} at the paper's {test.paper_effect:.2f}"
             + {True: " (powered)", False: " (underpowered)", None: ""}[test.powered])
    return (f"{test.metric}: n {test.n}, sd {sd}; targets needed for {POWER:.0%} power at two-sided alpha {ALPHA}: "
            f"{_needed(test, test.delta)} at the observed {abs(test.delta):.{_digits(test.metric)}f}{paper}")


def power_markdown(tests: Mapping[str, Sequence[PairedTest]], baseline: str) -> str:
    """One row per system: each metric's targets needed for POWER at the observed and the paper's effect, and the
    targets it has (n): a test with n below the paper's count could miss the paper's effect."""
    metrics = list(dict.fromkeys(t.metric for ts in tests.values() for t in ts))
    lines = [f"| targets needed for {POWER:.0%} power (minus {baseline}): observed / paper (n) | " + " | ".join(metrics)
             + " |", "|---|" + "---:|" * len(metrics)]
    for name, ts in tests.items():
        by = {t.metric: t for t in ts}
        lines.append(f"| {name} | " + " | ".join(
            f"{_needed(by[m], by[m].delta)} / {_needed(by[m], by[m].paper_effect)} (n {by[m].n})" if m in by else "-"
            for m in metrics) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Prints the Markdown tables of every system against the baseline: differences, then power."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="an evaluation directory (<workdir>/eval)")
    parser.add_argument("--systems", nargs="+", required=True, help="evaluation directories to test against it")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES)
    parser.add_argument("--seed", type=int, default=0, help="the random swaps' seed")
    args = parser.parse_args(argv)
    base = read_targets(args.baseline)
    name = lambda d: str(d).rstrip("/").removesuffix("/eval") or str(d)  # noqa: E731 (the workdir)
    tests = {name(d): compare_rows(read_targets(d), base, samples=args.samples, seed=args.seed) for d in args.systems}
    print(markdown(tests, name(args.baseline)))
    print()
    print(power_markdown(tests, name(args.baseline)))


__all__ = ["ALPHA", "DEFAULT_SAMPLES", "MIN_TARGETS", "PAPER_EFFECT", "PER_TARGET", "POWER", "Z_SUM", "PairedTest",
           "bleu_from_stats",
           "bleu_test", "compare_rows", "format_p", "markdown", "needed_targets", "power_line", "power_markdown",
           "sentence_bleu_stats", "sign_flip_p_value"]


if __name__ == "__main__":
    main()

