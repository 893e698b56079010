"""Does the Trigger's candidate prefilter change what online learning reaches? The persona-world experiment
(`icml_jax.experiments.persona_run`: tiny random backbone, offline back ends, the offline judge reads the world's
labels: an oracle) with `observation.prefilter` = bm25 or embedding (all-MiniLM-L6-v2) at a candidate cap the
stores exceed; prints held-out trigger recall / planner precision before and after online learning per seed.

    python scripts/prefilter_learning.py --seeds 0 1 2 --max_candidates 3
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Sequence

from icml_jax.experiments.persona_run import PersonaRunConfig, run_persona_world

KEYS = ("eval/trigger_recall", "eval/planner_precision", "eval/planner_recall")


def main(argv: Sequence[str] | None = None) -> None:
    """Runs each (prefilter, seed) and prints one Markdown row per prefilter (mean +- sd over the seeds)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max_candidates", type=int, default=3)
    parser.add_argument("--prefilters", nargs="+", default=["bm25", "embedding"])
    args = parser.parse_args(argv)
    base = PersonaRunConfig()
    print(f"| prefilter | max_candidates | seeds | {' | '.join(f'{k} before -> after' for k in KEYS)} | s per run |")
    print("|---|---:|---|" + "---|" * len(KEYS) + "---:|")
    for prefilter in args.prefilters:
        observation = dataclasses.replace(base.observation, prefilter=prefilter, max_candidates=args.max_candidates,
                                          min_candidate_bucket=args.max_candidates + 1)
        before, after, seconds = {k: [] for k in KEYS}, {k: [] for k in KEYS}, []
        for seed in args.seeds:
            start = time.perf_counter()
            config = dataclasses.replace(base, seed=seed, observation=observation, eval_every=base.train_episodes)
            result = run_persona_world(config)
            seconds.append(time.perf_counter() - start)
            for k in KEYS:
                before[k].append(result.before[k])
                after[k].append(result.after[k])
            print(f"<!-- {prefilter} seed {seed}: " + ", ".join(f"{k} {result.before[k]:.3f} -> {result.after[k]:.3f}"
                                                            for k in KEYS) + " -->", flush=True)

        def cell(k: str) -> str:
            sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
            return (f"{statistics.mean(before[k]):.3f} ± {sd(before[k]):.3f} -> "
                    f"{statistics.mean(after[k]):.3f} ± {sd(after[k]):.3f}")

        print(f"| {prefilter} | {args.max_candidates} | {' '.join(map(str, args.seeds))} | "
              f"{' | '.join(cell(k) for k in KEYS)} | {statistics.mean(seconds):.0f} |", flush=True)


if __name__ == "__main__":
    main()
