"""`python -m icml_jax.experiments --experiment=NAME --config=FILE --workdir=DIR [--seeds 0 1 2]`: one paper
result per NAME (see `catalog.EXPERIMENTS`), written as `<workdir>/<NAME>.md` (the paper's layout, mean and
spread over seeds), `<NAME>.json` (every number with its provenance) and `<NAME>.png` where the paper has a
figure. Runs live under `<workdir>/seed<k>/`; experiments on one workdir share them, and a rerun resumes.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.configlib import ConfigError
from icml_jax.experiments.catalog import EXPERIMENTS, Context
from icml_jax.experiments.tables import write
from icml_jax.llm.config import GENERATOR, JUDGE
from icml_jax.models.backbone import TINY
from icml_jax.run.runspec import RunSpec


def setting_of(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """What the tables say they were measured on: data, model, back ends (the offline judge named an oracle)."""
    spec = RunSpec.from_config(config)
    backbone = spec.model
    model = (f"tiny random decoder (hidden {backbone.hidden}, {backbone.layers} layer(s))"
             if backbone.kind == TINY else str(backbone.path))
    judge = spec.llm.options(JUDGE)
    return {"data": spec.data.name, "model": model, "generator": spec.llm.options(GENERATOR),
            "judge": ("offline (an oracle: it reads the data's labels)" if judge.get("kind") == "offline"
                      else judge)}


def run_experiment(name: str, config: ml_collections.ConfigDict, workdir: str | Path, seeds: Sequence[int], *,
                   command: str | None = None, log: Callable[[str], None] = print) -> dict[str, Path]:
    """Runs experiment `name` for `seeds` in `workdir`; returns the paths of the files it wrote."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; experiments: {sorted(EXPERIMENTS)}")
    if not seeds:
        raise ValueError("no seeds given")
    root = Path(workdir).expanduser().absolute()
    report = EXPERIMENTS[name](Context(config, root, list(seeds), log))
    command = command or (f"python -m icml_jax.experiments --experiment={name} --workdir={root} "
                          f"--seeds {' '.join(map(str, seeds))}")
    return write(report, root, setting_of(config), command)


def _seeds_argv(argv: Sequence[str]) -> list[str]:
    """`--seeds 0 1 2` (space-separated, as documented) rewritten to absl's `--seeds=0,1,2`."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--seeds":
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            out.append("--seeds=" + ",".join(argv[i + 1: j]))
            i = j
        else:
            out.append(argv[i])
            i += 1
    return out


def cli() -> None:
    """absl entry point with the shared --config / --workdir flags (`icml_jax.run.cli`), --experiment and --seeds."""
    from absl import app, flags

    from icml_jax.run import cli as shared  # local: it defines the absl flags; importing this module defines none

    experiment = flags.DEFINE_enum("experiment", None, sorted(EXPERIMENTS), "the paper result to reproduce")
    seeds = flags.DEFINE_list("seeds", ["0"], "seeds: --seeds 0 1 2 (or 0,1,2); tables report mean and spread")
    command = "python -m icml_jax.experiments " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    def main(argv: Sequence[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments {argv[1:]}")
        if experiment.value is None or shared.CONFIG.value is None or not shared.WORKDIR.value:
            raise app.UsageError("--experiment, --config and --workdir are required")
        shared.quiet_info_logs()
        try:
            values = [int(s) for s in seeds.value]
        except ValueError:
            raise app.UsageError(f"--seeds must be integers, got {seeds.value}") from None
        try:
            files = run_experiment(experiment.value, shared.CONFIG.value, shared.WORKDIR.value, values, command=command,
                                   log=lambda line: print(line, file=sys.stderr))
        except (ValueError, KeyError, FileNotFoundError, ConfigError) as exc:
            print(f"experiment error: {exc}", file=sys.stderr)
            sys.exit(2)
        print(files["md"].read_text(encoding="utf-8"))
        print("files: " + ", ".join(str(p) for p in files.values()))

    app.run(main, argv=_seeds_argv(sys.argv), flags_parser=lambda argv: shared.parse_flags(argv, "experiment"))


__all__ = ["cli", "run_experiment", "setting_of"]
