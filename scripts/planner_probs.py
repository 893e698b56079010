"""Where a trained Planner's save probabilities sit against the greedy line (0.5) on the evaluation's history turns.

For each run directory: its own config.json and trained policy (`<run>/policy`, else its warm-up checkpoint),
evaluated greedily as `python -m icml_jax.evaluate` does with the `eval` block of `--config` (a run's config.json
does not store one), but without the judge, the memory gain, BERTScore and MAUVE (only the play, whose decisions
those never change). With `--cache` the notes and replies come from an
earlier evaluation's answer cache, so nothing is generated twice. Prints, per run, the decisions, the saves, the
mean p(save), the share within 0.1 below the line and the ten-bin histogram (results.json `setting.planner`).

    python scripts/planner_probs.py workdir/gc48/seed1/ours workdir/gc48/seed1/base --config=configs/gc_smollm2.py \
        --cache workdir/gc48/eval_cache.sqlite --out /tmp/planner_probs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.configlib import load_config
from icml_jax.evaluate import evaluate_workdir
from icml_jax.run.agent_loading import find_checkpoint, load_run_config

PLAY_ONLY = {"judge": False, "memory_gain": False, "bertscore_model": None, "mauve_model": None}


def measure(run: Path, eval_block: ml_collections.ConfigDict, out: Path, cache: Path | None = None
            ) -> dict[str, Any]:
    """The Planner's counts (`setting.planner`) and the save rate of `run`'s policy replayed with `eval_block` into
    `out` (its `eval/` there; the run's own files are not touched)."""
    config = load_run_config(run)
    config.eval = ml_collections.ConfigDict(eval_block.to_dict())
    for key, value in PLAY_ONLY.items():
        config.eval[key] = value
    checkpoint, _ = find_checkpoint(run)
    content = evaluate_workdir(config, out, checkpoint=checkpoint, cache_path=cache)
    return {"run": str(run), "checkpoint": str(checkpoint), **content["setting"]["planner"],
            "save_rate": content["memory"]["save_rate"]}


def row(counts: dict[str, Any]) -> str:
    """One markdown row: run, decisions, saved, mean p(save), share in [0.4, 0.5), histogram."""
    n = counts["decisions"]
    near = counts["histogram"][4] / n if n else float("nan")
    return (f"| {counts['run']} | {n} | {counts['saved']} ({counts['saved'] / max(n, 1):.1%}) | "
            f"{counts['mean_prob']:.3f} | {near:.1%} | {' '.join(map(str, counts['histogram']))} |")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Measures every run given and prints the table (and, with --json, the counts)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="trained run directories (each with config.json)")
    parser.add_argument("--config", required=True, help="the config file whose eval block the runs were evaluated "
                        "with (e.g. configs/gc_smollm2.py)")
    parser.add_argument("--out", type=Path, required=True, help="where each run's replay writes its eval/")
    parser.add_argument("--cache", type=Path, default=None, help="an earlier evaluation's answer cache (sqlite)")
    parser.add_argument("--json", type=Path, default=None, help="also write the counts here")
    args = parser.parse_args(argv)
    names = [f"{r.parent.name}_{r.name}" for r in args.runs]
    if len(set(names)) != len(names):
        raise SystemExit(f"planner_probs: two runs map to one output directory: {names}")
    eval_block, out = load_config(args.config).eval, []
    print("| run | decisions | saved | mean p(save) | p in [0.4, 0.5) | histogram of p(save), bins of 0.1 |")
    print("|---|---:|---:|---:|---:|---|")
    for run, name in zip(args.runs, names, strict=True):
        counts = measure(run, eval_block, args.out / name, args.cache)
        print(row(counts), flush=True)
        out.append(counts)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    main()
