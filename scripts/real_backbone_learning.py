"""Does a pretrained backbone help the policies learn? `configs/demo_smollm2.py` on its arms (SmolLM2-135M-
Instruct with LoRA; the tiny random backbone with SmolLM2 writing; the tiny backbone with the offline writer),
the same episodes and back ends, over several seeds; prints the held-out metrics before/after the warm-up and
before/after online learning as a Markdown table, with each run's wall time.

The judge is the offline one: an oracle that reads the persona world's labels. Each run is an ordinary
`python -m icml_jax.main` in `<root>/<arm>-s<seed>` (a finished run is read, not repeated; an interrupted one
resumes). The seed sets `config.seed` (online sampling, evaluation) and `config.policy.seed` (heads and LoRA
initialisation); the episodes and the expert data stay the same across seeds and arms.

    python scripts/real_backbone_learning.py --seeds 0 1 2 --root /tmp/icml_real_backbone
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo_smollm2.py"
ARMS = ("smollm2", "tiny", "tiny_offline")
# (table column, stage, metric key before, metric key after)
COLUMNS = (
    ("warm-up: planner precision", "warmup", "before/planner/precision", "after/planner/precision"),
    ("warm-up: planner recall", "warmup", "before/planner/recall", "after/planner/recall"),
    ("warm-up: trigger accuracy", "warmup", "before/trigger/accuracy", "after/trigger/accuracy"),
    ("online: planner precision", "online", "before/eval/planner_precision", "after/eval/planner_precision"),
    ("online: planner recall", "online", "before/eval/planner_recall", "after/eval/planner_recall"),
    ("online: trigger recall", "online", "before/eval/trigger_recall", "after/eval/trigger_recall"),
    ("online: needed pairs (count)", "online", "before/eval/needed_pairs", "after/eval/needed_pairs"),
)


def finals(workdir: Path) -> dict[str, dict]:
    """The last `final` row of each stage in `<workdir>/metrics.jsonl`."""
    out: dict[str, dict] = {}
    for line in (workdir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row.get("final"):
            out[row["stage"]] = row
    return out


def run(arm: str, seed: int, root: Path) -> tuple[dict[str, dict], float | None]:
    """Runs (or reads) one arm and seed; returns its stages' final rows and the wall seconds of this call's
    run (None when it was already finished)."""
    workdir = root / f"{arm}-s{seed}"
    if (workdir / "metrics.jsonl").exists() and {"warmup", "online"} <= set(finals(workdir)):
        return finals(workdir), None
    cmd = [sys.executable, "-m", "icml_jax.main", f"--config={CONFIG}:{arm}", f"--workdir={workdir}",
           f"--config.seed={seed}", f"--config.policy.seed={seed}"]
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return finals(workdir), time.perf_counter() - start


def table(results: dict[tuple[str, int], dict[str, dict]], arms: list[str], seeds: list[int]) -> str:
    """Markdown: one row per (arm, metric): mean before -> after (change), and the per-seed after values."""
    lines = ["| arm | metric | before | after | change | after, per seed |", "|---|---|---:|---:|---:|---|"]
    for arm in arms:
        for name, stage, before_key, after_key in COLUMNS:
            before = [results[(arm, s)][stage].get(before_key) for s in seeds]
            after = [results[(arm, s)][stage].get(after_key) for s in seeds]
            if any(v is None for v in before + after):
                lines.append(f"| {arm} | {name} | - | - | - | (not measured) |")
                continue
            b, a = statistics.mean(before), statistics.mean(after)
            lines.append(f"| {arm} | {name} | {b:.3f} | {a:.3f} | {a - b:+.3f} | "
                         f"{' / '.join(f'{v:.3f}' for v in after)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--root", type=Path, default=Path("/tmp/icml_real_backbone"))
    args = parser.parse_args()
    results, seconds = {}, {}
    for arm in args.arms:
        for seed in args.seeds:
            results[(arm, seed)], seconds[(arm, seed)] = run(arm, seed, args.root)
    print(table(results, args.arms, args.seeds))
    print()
    for (arm, seed), s in seconds.items():
        stages = {k: round(v.get("seconds", float("nan")), 1) for k, v in results[(arm, seed)].items()
                  if "seconds" in v}
        wall = f"{s:.0f} s" if s is not None else "read from an earlier run"
        print(f"{arm} seed {seed}: wall {wall}; stage seconds {stages}")


if __name__ == "__main__":
    main()
