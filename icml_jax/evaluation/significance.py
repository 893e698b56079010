"""Whether two evaluations of the same targets differ beyond chance, metric by metric: paired approximate
randomization (each target's two replies swapped with probability 1/2, `samples` times). Corpus BLEU-4 is
rescored from each sentence's sacrebleu statistics; ROUGE-L, BERTScore and the judge's dimensions are per-target
means, whose test flips the sign of each target's difference. MAUVE (a corpus-level clustering) is not tested.

    python -m icml_jax.evaluation.significance --baseline=RUN_A/eval --systems RUN_B/eval RUN_C/eval
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from icml_jax.evaluation.metrics import JUDGE_DIMENSIONS
from icml_jax.evaluation.pairwise import align
from icml_jax.evaluation.report import read_targets

DEFAULT_SAMPLES = 10_000
Row = Mapping[str, Any]


def _judge(dim: str) -> Callable[[Row], float | None]:
    return lambda row: 100.0 * float(row["judge"][dim]) if row.get("judge") else None


# metric -> a target row's value in percent (None: the row has none, e.g. a failed verdict)
PER_TARGET: dict[str, Callable[[Row], float | None]] = {
    "ROUGE-L": lambda row: row.get("rouge_l"),
    "BERTScore": lambda row: row.get("bertscore_f1"),
    **{dim.capitalize(): _judge(dim) for dim in JUDGE_DIMENSIONS},
}


@dataclasses.dataclass(frozen=True)
class PairedTest:
    """System minus baseline on one metric over `n` shared targets, and the two-sided p-value of that
    difference under random swaps of each target's pair (small: unlikely to be chance)."""

    metric: str
    system: float
    baseline: float
    n: int
    p_value: float

    @property
    def delta(self) -> float:
        return self.system - self.baseline


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
    observed one (sacrebleu's own test counts only larger ones, so two nearly identical systems get p ~ 0)."""
    a, b = sentence_bleu_stats(system, references), sentence_bleu_stats(baseline, references)
    total_a, total_b = a.sum(0), b.sum(0)
    bleu_a, bleu_b = bleu_from_stats(total_a), bleu_from_stats(total_b)
    swap = np.random.default_rng(seed).random((samples, len(references))) < 0.5
    moved = swap.astype(np.int64) @ (b - a)  # each sample's statistics moved from a's side to b's
    at_least = sum(abs(bleu_from_stats(total_a + m) - bleu_from_stats(total_b - m)) >= abs(bleu_a - bleu_b) - 1e-9
                   for m in moved)
    return PairedTest("BLEU-4", bleu_a, bleu_b, len(references), (1 + at_least) / (1 + samples))


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
                              sign_flip_p_value(x - y, samples=samples, seed=seed)))
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
        lines.append(f"| {name} | " + " | ".join(f"{by[m].delta:+.2f} ({format_p(by[m].p_value)})" if m in by else "-"
                                                 for m in metrics) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Prints the Markdown table of every system against the baseline."""
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


__all__ = ["DEFAULT_SAMPLES", "PER_TARGET", "PairedTest", "bleu_from_stats", "bleu_test", "compare_rows", "format_p",
           "markdown", "sentence_bleu_stats", "sign_flip_p_value"]


if __name__ == "__main__":
    main()

