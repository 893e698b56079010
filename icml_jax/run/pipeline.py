"""The main job as a library function: `run(config, workdir)` validates the config, runs (or resumes) its stages
in order with a progress bar, and prints the end-of-run report (`format_summary`). `python -m icml_jax.main`,
the notebooks and the experiments call it; `icml_jax.main` adds the command line around it."""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import jax
import ml_collections
from tqdm.auto import tqdm

from icml_jax.checkpoint.files import write_text_atomic
from icml_jax.run.runlog import METRICS_FILE, MetricsLog, plot_learning_curves, read_metrics, session_table
from icml_jax.run.runspec import RunSpec
from icml_jax.run.stages.online import stage_online
from icml_jax.run.stages.run import NoMetrics, Run, is_primary
from icml_jax.run.stages.synthesize import stage_synthesize
from icml_jax.run.stages.warmup import stage_warmup
from icml_jax.run.validation import validate
from icml_jax.run.workdir import (CHECKPOINT_DIR, CONFIG_FILE, PLOT_FILE, PROGRESS_FILE, config_text, read_progress,
                                  reopen_extended, resume_point, write_json_atomic)

STAGE_FNS: dict[str, Callable[[Run], dict[str, Any]]] = {  # looked up when a stage runs (tests replace stages)
    "synthesize": stage_synthesize,
    "warmup": stage_warmup,
    "online": stage_online,
}


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str],
        out: TextIO | None = None) -> dict[str, dict[str, Any]]:
    """Validates `config`, then runs (or resumes) its stages in order; returns {stage: summary}, prints a report."""
    out = out or sys.stdout
    spec = RunSpec.from_config(config)
    stages = validate(config, workdir, spec)
    root = Path(workdir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    primary = is_primary()
    progress = read_progress(root)
    episodes = spec.data.train_episodes * jax.process_count()
    played = reopen_extended(progress, stages, episodes)  # before config.json: a refused shortening changes nothing
    if primary:
        write_text_atomic(root / CONFIG_FILE, config_text(config))
    if played is not None:
        print(f"extending {root}: its online stage played {played} episodes, config.data.train_episodes asks for "
              f"{episodes}", file=out)
        if primary:  # a restart goes on extending, from the newest checkpoint
            write_json_atomic(root / PROGRESS_FILE, progress)
    if "online" in stages and any(s not in progress["done"] for s in stages[:stages.index("online")]):
        shutil.rmtree(root / CHECKPOINT_DIR, ignore_errors=True)  # taken after a stage that runs again: stale
    point = resume_point(root, progress, stages)
    metrics = MetricsLog(root, truncate_to=point.metrics_bytes, purge_steps=point.purge) if primary else NoMetrics()
    state = Run(config, root, metrics, progress, resume=point.checkpoint, spec=spec)
    start = time.perf_counter()
    try:
        todo = [s for s in stages if s not in progress["done"]]
        for line in point.skipped:
            print(f"warning: {line}", file=out)
        if todo and (todo != list(stages) or point.checkpoint):  # a run that goes on where it stopped
            at = f" (online checkpoint step {point.checkpoint[0]})" if point.checkpoint else ""
            print(f"resuming {root}: finished {[s for s in stages if s in progress['done']]}, next {todo}{at}",
                  file=out)
        bar = tqdm(stages, desc="stages", unit="stage", disable=not primary)
        for i, stage in enumerate(bar):
            bar.set_postfix_str(stage)
            if stage in progress["done"]:
                state.summary[stage] = progress["done"][stage]
                continue
            t0 = time.perf_counter()
            try:
                summary = STAGE_FNS[stage](state)
            except Exception as exc:
                raise RuntimeError(f"stage {stage!r} failed (workdir {root}): {type(exc).__name__}: {exc}") from exc
            summary["seconds"] = time.perf_counter() - t0
            state.summary[stage] = summary
            if stage == "warmup" and "online" in stages[i + 1:]:
                state.deferred[stage] = summary  # committed with the online stage's first checkpoint
            else:
                state.commit(stage, summary)
        if not progress.get("finished"):
            state.metrics.write("summary", {"stages": list(stages), "seconds": time.perf_counter() - start})
            progress["finished"] = True
            state.commit()
    finally:
        state.metrics.close()
    if not primary:
        return state.summary
    rows = read_metrics(root / METRICS_FILE)
    plot = plot_learning_curves(root / METRICS_FILE, root / PLOT_FILE)
    table = session_table([r for r in rows if r.get("table") == "sessions"])
    print(format_summary(state.summary, root, time.perf_counter() - start, table=table, plot=plot), file=out)
    return state.summary


def _fmt(value: Any) -> str:
    """Short human form of a metric."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3f}"
    return "-" if value is None else str(value)


SUMMARY_KEYS = {
    "synthesize": ("storylines_accepted", "train_episodes", "heldout_episodes", "train_trigger_examples"),
    "warmup": ("steps", "skipped_steps", "rollbacks", "before/planner/accuracy", "after/planner/accuracy", "before/trigger/accuracy",
               "after/trigger/accuracy"),
    "online": ("episodes", "updates", "skipped_steps", "rollbacks", "before/eval/planner_precision", "after/eval/planner_precision",
               "before/eval/planner_recall", "after/eval/planner_recall", "before/eval/trigger_recall",
               "after/eval/trigger_recall"),
}


def format_summary(summary: dict[str, dict[str, Any]], workdir: Path, seconds: float, *, table: str = "",
                   plot: Path | None = None) -> str:
    """The end-of-run report: a line per stage with its headline numbers, the per-session table, the files."""
    lines = [f"icml_jax run finished in {seconds:.1f} s; metrics: {workdir / METRICS_FILE}"
             + (f", plot: {plot}" if plot else "")]
    for stage, values in summary.items():
        keys = [k for k in SUMMARY_KEYS.get(stage, ()) if k in values]
        if stage == "warmup" and not keys:
            keys = sorted(k for k in values if k.startswith(("before/", "after/")))[:6]
        parts = [f"{k} {_fmt(values[k])}" for k in keys]
        lines.append(f"  {stage:<10} ({_fmt(values.get('seconds'))} s): " + ", ".join(parts))
    if table:
        lines += ["", "per session (held-out evaluation before/after online learning; online rewards):", table]
    return "\n".join(lines)
