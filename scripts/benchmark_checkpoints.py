"""What checkpointing costs the online stage: the demo's online learning with a checkpoint after every
episode (asynchronous and synchronous) against one at the start and one at the end, side by side in one
process (a first, unmeasured run pays the compilations).

    python scripts/benchmark_checkpoints.py            # 60 episodes of configs/demo.py, online stage only
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import tempfile
import time
from pathlib import Path

from icml_jax import main as job

ROOT = Path(__file__).resolve().parents[1]


def demo_config(episodes: int, every: int, async_save: bool):
    """configs/demo.py, online stage only (random heads), checkpoints every `every` episodes."""
    spec = importlib.util.spec_from_file_location("demo_config", ROOT / "configs" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.mode = ("online",)
    config.data.train_episodes, config.data.eval_episodes = episodes, 0
    config.checkpoint.every_episodes, config.checkpoint.async_save = every, async_save
    return config


def timed(config, root: Path) -> float:
    """Seconds of the online stage (what the summary reports), in a fresh workdir."""
    summary = job.run(config, root, out=io.StringIO())
    return summary["online"]["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    n = args.episodes
    cases = {"start + end only": (n, True), "every episode, async": (1, True), "every episode, sync": (1, False)}
    with tempfile.TemporaryDirectory() as tmp:
        timed(demo_config(n, n, True), Path(tmp) / "warm")  # compilations
        results = {name: [] for name in cases}
        for r in range(args.repeats):
            for name, (every, async_save) in cases.items():
                t0 = time.perf_counter()
                seconds = timed(demo_config(n, every, async_save), Path(tmp) / f"{name}-{r}".replace(" ", "_"))
                results[name].append((seconds, time.perf_counter() - t0))
    base = min(s for s, _ in results["start + end only"])
    print(f"online stage, {n} episodes of configs/demo.py (best of {args.repeats}):")
    for name, runs in results.items():
        best = min(s for s, _ in runs)
        saves = 2 if name.startswith("start") else n + 1
        print(f"  {name:<22} {saves:>3} checkpoints  {best:6.2f} s  x{best / base:.2f}  "
              f"(+{(best - base) / max(saves - 2, 1) * 1e3:.1f} ms per extra checkpoint)")


if __name__ == "__main__":
    main()
