"""The experiments' building blocks: a variant is a config derived from the experiment's config, trained by the
main job in its own workdir and scored by the evaluation protocol. What variants share runs once per seed (the
synthesis and the warm-up, in `<root>/seed<k>/base`), and all evaluations share one back-end answer cache.

Every step resumes: the main job resumes its workdir (and refuses one holding another config), and an
evaluation whose `results.json` was written for the same config and system is read back instead of rerun.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.configlib import apply_overrides, config_differences
from icml_jax.evaluate import EVAL_DIR, evaluate_agent, evaluate_workdir
from icml_jax.evaluation.report import RESULTS_JSON
from icml_jax.run.pipeline import run
from icml_jax.run.workdir import SYNTHESIS_DIR, WARMUP_DIR

EVAL_CACHE = "eval_cache.sqlite"
BASE = "base"


def derive(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted-path `overrides` ({"rl.reward.truth_lambda": 0.0, ...}); an unknown path is
    an error naming it (a typo would otherwise run the unchanged config)."""
    out = copy.deepcopy(config)
    apply_overrides(out, overrides, "experiment override", KeyError)
    return out


def seed_config(config: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
    """The config of one seed: the run's seed, the policy's initialization and the synthesis' draws."""
    return derive(config, {"seed": seed, "policy.seed": seed, "synthesis.seed": seed})


NOT_TRAINING = ("experiments", "baselines", "eval")  # blocks the main job never reads


def training_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` without the blocks only evaluations and experiments read, so that changing them (another
    baseline, another list of lambdas) leaves the trained runs resumable and shared."""
    out = copy.deepcopy(config)
    with out.unlocked():
        for key in NOT_TRAINING:
            if key in out:
                del out[key]
    return out


def run_job(config: ml_collections.ConfigDict, workdir: Path) -> dict[str, Any]:
    """`python -m icml_jax.main` in-process on `workdir` (resuming it) with `training_config(config)`; its report
    is appended to `<workdir>/run.txt`."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):  # progress bars: the experiment prints its own progress
        summary = run(training_config(config), workdir, out=report)
    with open(workdir / "run.txt", "a", encoding="utf-8") as f:  # one report per start (a resume appends)
        f.write(report.getvalue() + "\n")
    return summary


def base_run(config: ml_collections.ConfigDict, root: Path, *, name: str = BASE,
             overrides: Mapping[str, Any] | None = None) -> Path:
    """Synthesis and warm-up once, in `<root>/<name>`; returns the warm-up checkpoint dir the variants start from."""
    cfg = derive(config, {"mode": ("synthesize", "warmup"), **(overrides or {})})
    workdir = root / name
    run_job(cfg, workdir)
    return workdir / WARMUP_DIR


def online_run(config: ml_collections.ConfigDict, workdir: Path, *, init_from: Path | None,
               overrides: Mapping[str, Any] | None = None) -> Path:
    """The online stage alone in `workdir`, from the policy in `init_from` (None: untrained heads, no warm-up);
    returns the workdir (its `policy/` is the learned policy)."""
    cfg = derive(config, {"mode": ("online",), "online.init_from": str(init_from) if init_from else None,
                          **(overrides or {})})
    run_job(cfg, workdir)
    return workdir


def full_run(config: ml_collections.ConfigDict, workdir: Path, *, synthesis_from: Path | None = None,
             overrides: Mapping[str, Any] | None = None) -> Path:
    """Synthesis (or a copy of `synthesis_from`, another run's synthesis dir), warm-up and online in `workdir`."""
    mode: tuple[str, ...] = ("synthesize", "warmup", "online")
    if synthesis_from is not None:
        target = workdir / SYNTHESIS_DIR
        if not (target / "manifest.json").is_file():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(synthesis_from, target)
        mode = ("warmup", "online")
    run_job(derive(config, {"mode": mode, **(overrides or {})}), workdir)
    return workdir


def read_back(config: ml_collections.ConfigDict, workdir: Path, system: str) -> dict[str, Any] | None:
    """The `<workdir>/eval/results.json` content when it was written for `system` under `config` (the experiments
    block aside), else None."""
    done = workdir / EVAL_DIR / RESULTS_JSON
    if not done.is_file():
        return None
    content = json.loads(done.read_text(encoding="utf-8"))
    setting = content["setting"].get("config") or {}
    same = not config_differences(setting, config.to_dict(), ignore=("experiments",))
    return content if content.get("system") == system and same else None


def evaluate(config: ml_collections.ConfigDict, workdir: Path, root: Path, *, system: str,
             checkpoint: Path | None = None, factory: Callable | None = None) -> dict[str, Any]:
    """The evaluation protocol on `workdir` (its `<workdir>/eval/`): the policy there or in `checkpoint`, or the
    agent `factory` builds (a baseline); read back when it already ran with the same config and system."""
    done = read_back(config, workdir, system)
    if done is not None:
        return done
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stderr(io.StringIO()):
        if factory is not None:
            return evaluate_agent(config, workdir, factory, system=system, cache_path=root / EVAL_CACHE)
        return evaluate_workdir(config, workdir, checkpoint=checkpoint, system=system, cache_path=root / EVAL_CACHE)


__all__ = ["BASE", "EVAL_CACHE", "base_run", "derive", "evaluate", "full_run", "online_run", "read_back",
           "run_job", "seed_config", "training_config"]
