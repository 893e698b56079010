"""How far one evaluation row moves when only the replies' sampling draw changes: a system evaluated (run seed 0)
under several `llm.generator.seed` values of the local back end, whose sampled replies are keyed by that seed and
the request. Prompts, memories and the judge are the same in every run, so the spread is the reply-sampling noise
of a row: gaps between systems smaller than it are not evidence. `--reply_temperature` sets the target replies'
temperature (`eval.reply_temperature`; default: the config's, e.g. 0 = greedy in configs/gc_smollm2.py, where
every draw must be the same). Prints each draw's metrics and their mean, sample sd and range.

    python scripts/reply_sampling_noise.py --config=configs/gc_smollm2.py --data_dir=/tmp/tfds \
        --workdir=/tmp/sampling_noise --system=no_memory --generator_seeds 0 1 2 3 4 --reply_temperature=0.7
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from icml_jax.configlib import load_config
from icml_jax.evaluation.report import TABLE1 as COLUMNS  # the automatic metrics and the judge's dimensions
from icml_jax.experiments import catalog
from icml_jax.experiments.tables import metrics_of


def draw(config_path: str, data_dir: str, root: Path, system: str, generator_seed: int,
         reply_temperature: float | None = None) -> dict[str, float]:
    """The system's metrics at run seed 0 with the generator's sampling seed `generator_seed` (and the target
    replies at `reply_temperature`, when given)."""
    overrides = {"data.data_dir": data_dir}
    if reply_temperature is not None:
        overrides["eval.reply_temperature"] = reply_temperature
    config = load_config(config_path, overrides)
    if config.llm.generator.kind != "local":
        raise SystemExit(f"{config_path}: llm.generator.kind is {config.llm.generator.kind!r}; only the local back "
                         "end takes a sampling seed")
    with config.unlocked():
        config.llm.generator.seed = generator_seed
    content = catalog.baseline(catalog.Context(config, root / f"gen{generator_seed}", [0], print), 0, system)
    return {k: float(v) for k, v in metrics_of(content).items() if k in COLUMNS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--system", default="no_memory", help="a baseline name of the experiments' catalog")
    parser.add_argument("--generator_seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--reply_temperature", type=float, default=None,
                        help="eval.reply_temperature for the target replies (default: the config's)")
    args = parser.parse_args()
    if len(args.generator_seeds) < 2:
        parser.error("--generator_seeds needs at least two seeds for a spread")
    rows = {s: draw(args.config, args.data_dir, args.workdir / f"t{args.reply_temperature}", args.system, s,
                    args.reply_temperature) for s in args.generator_seeds}
    print("| generator seed | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for seed, m in rows.items():
        print(f"| {seed} | " + " | ".join(f"{m[c]:.2f}" for c in COLUMNS) + " |")
    values = {c: [m[c] for m in rows.values()] for c in COLUMNS}
    print("| mean ± sd | " + " | ".join(f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}"
                                       for v in values.values()) + " |")
    print("| range | " + " | ".join(f"{max(v) - min(v):.2f}" for v in values.values()) + " |")


if __name__ == "__main__":
    main()
