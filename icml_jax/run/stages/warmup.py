"""The warm-up stage: supervised cold start of both policies on the synthesized expert data."""

from __future__ import annotations

from typing import Any

from icml_jax.run.stages.run import Run
from icml_jax.run.workdir import SYNTHESIS_DIR
from icml_jax.train import warmup


def stage_warmup(run: Run) -> dict[str, Any]:
    """Supervised warm-up of both policies on the synthesized expert data; Orbax state in `<workdir>/warmup`."""
    policies, tokenizer = run.models()
    result = warmup(run.spec.warmup, policies, tokenizer, run.workdir / SYNTHESIS_DIR, run.workdir)
    for row in result.history:
        run.metrics.write("warmup", dict(row))
    summary = {"steps": result.steps, "skipped_steps": result.skipped_steps, "rollbacks": result.rollbacks,
               "seconds": result.seconds,
               "checkpoint": result.checkpoint, **{f"before/{k}": v for k, v in result.before.items()},
               **{f"after/{k}": v for k, v in result.after.items()}}
    run.metrics.write("warmup", {"final": True, **summary})
    return summary
