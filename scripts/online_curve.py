"""The online reward curve of finished runs: per episode mean r_trig, r_proxy, save rate and the Trigger's memory
rate, with each curve's least-squares slope and a one-sided permutation p-value for "rises over the episodes"
(every order of the episodes, or random orders past 8), and the same pooled over several runs (seeds).

    python scripts/online_curve.py workdir/e8/seed0/ours workdir/e8/seed1/ours workdir/e8/seed2/ours
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from icml_jax.run.runlog import METRICS_FILE, read_metrics

EXACT_UP_TO = 8  # curves this long are tested over all n! orders (8! = 40,320)
KEYS = {"r_trig": "episode/reward_quality", "r_proxy": "episode/reward_proxy", "save": "episode/save_rate",
        "memory": "agent/memory_use_rate"}


def episode_rows(run: str | Path) -> list[dict]:
    """The online stage's episode rows of `<run>/metrics.jsonl`, in episode order; an error names a run without."""
    path = Path(run) / METRICS_FILE
    rows = read_metrics(path)
    episodes = sorted((r for r in rows if r.get("stage") == "online" and "episode/id" in r), key=lambda r: r["episode"])
    if not episodes:
        raise ValueError(f"{path}: no online episode rows (is it a finished run's workdir?)")
    return episodes


def slopes(y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of the rows of `y` (along its last axis) against 1, 2, ..., n."""
    x = np.arange(1, y.shape[-1] + 1, dtype=np.float64)
    x -= x.mean()
    return (y - y.mean(axis=-1, keepdims=True)) @ x / (x @ x)


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of `values` against 1, 2, ..., n (per episode)."""
    return float(slopes(np.asarray(values, np.float64)))


def _orders(n: int, samples: int, rng: np.random.Generator) -> np.ndarray:
    """Every permutation of range(n) when n <= EXACT_UP_TO, else `samples` random ones."""
    if n <= EXACT_UP_TO:
        return np.array(list(itertools.permutations(range(n))))
    return np.array([rng.permutation(n) for _ in range(samples)])


def rise_p_value(values: Sequence[float], *, samples: int = 20_000, seed: int = 0) -> float:
    """One-sided p of the observed slope under random orders of the episodes: the share of orders whose slope is
    at least the observed one (exact over all orders up to EXACT_UP_TO points)."""
    y = np.asarray(values, np.float64)
    if y.size < 3:
        raise ValueError(f"rise_p_value: needs at least 3 episodes, got {y.size}")
    orders = _orders(y.size, samples, np.random.default_rng(seed))
    return float(np.mean(slopes(y[orders]) >= slope(y) - 1e-12))


def pooled_rise_p_value(curves: Sequence[Sequence[float]], *, samples: int = 20_000, seed: int = 0) -> float:
    """One-sided p of the summed slopes of several curves (seeds), each curve's episodes reordered independently:
    (1 + #{draws at least the observed sum}) / (1 + samples)."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(c, np.float64) for c in curves]
    observed = sum(slope(y) for y in arrays)
    orders = [[rng.permutation(y.size) for y in arrays] for _ in range(samples)]  # draw by draw, curve by curve
    drawn = sum(slopes(y[np.array([draw[i] for draw in orders])]) for i, y in enumerate(arrays))
    return (1 + int(np.sum(drawn >= observed - 1e-12))) / (1 + samples)


def _fmt(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def report(runs: Sequence[str | Path], *, samples: int = 20_000) -> str:
    """Markdown: a row per run (each key's values over the episodes, slope and p) and the pooled line."""
    lines = ["| run | episodes | " + " | ".join(KEYS) + " | r_trig slope (one-sided p) |",
             "|---|---:|" + "---|" * len(KEYS) + "---:|"]
    curves = []
    for run in runs:
        rows = episode_rows(run)
        r_trig = [float(r[KEYS["r_trig"]]) for r in rows]
        curves.append(r_trig)
        cells = [" ".join(_fmt(r.get(key)) for r in rows) for key in KEYS.values()]
        p = rise_p_value(r_trig, samples=samples) if len(r_trig) >= 3 else None
        lines.append(f"| {run} | {len(rows)} | " + " | ".join(cells) + f" | {slope(r_trig):+.4f} ({_fmt(p)}) |")
    if len(curves) > 1:
        mean = sum(slope(c) for c in curves) / len(curves)
        lines.append(f"\npooled over {len(curves)} runs: mean slope {mean:+.4f} per episode, one-sided p "
                     f"{pooled_rise_p_value(curves, samples=samples):.4f} ({samples} joint random orders)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="finished run workdirs (each with metrics.jsonl)")
    parser.add_argument("--samples", type=int, default=20_000, help="random orders past 8 episodes and pooled")
    args = parser.parse_args(argv)
    print(report(args.runs, samples=args.samples))


if __name__ == "__main__":
    main()
