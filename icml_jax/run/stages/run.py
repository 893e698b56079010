"""What the stages of one run share: its config and typed spec, workdir, metrics sink, progress record, and the
policies and tokenizer once built; `commit` records a finished stage in `<workdir>/progress.json`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax import parallel
from icml_jax.checkpoint import save_warmup
from icml_jax.run.builders import build_models
from icml_jax.run.runlog import json_safe
from icml_jax.run.runspec import RunSpec
from icml_jax.run.workdir import POLICY_DIR, PROGRESS_FILE, write_json_atomic


def is_primary() -> bool:
    """`parallel.is_primary()`: whether this process writes the run's shared files (metrics, progress)."""
    return parallel.is_primary()


@dataclasses.dataclass
class Run:
    """What the stages share: config (and its typed spec), workdir, metrics, progress, and the policies/tokenizer
    once built."""

    config: ml_collections.ConfigDict
    workdir: Path
    metrics: Any  # icml_jax.run.runlog.MetricsLog
    progress: dict[str, Any]
    policies: Any = None
    tokenizer: Any = None
    summary: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    deferred: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # done, not yet committed
    resume: tuple[int, dict[str, Any], dict[str, Any]] | None = None  # the online checkpoint to continue from
    spec: RunSpec | None = None  # the typed configs of `config` (built from it when not given)

    def __post_init__(self) -> None:
        if self.spec is None:
            self.spec = RunSpec.from_config(self.config)

    def models(self) -> tuple[Any, Any]:
        """The policies and tokenizer, built on first use (tiny random backbone or local HF checkpoint)."""
        if self.policies is None:
            self.policies, self.tokenizer = build_models(self.config, self.workdir, self.spec)
        return self.policies, self.tokenizer

    def commit(self, stage: str | None = None, summary: dict[str, Any] | None = None) -> None:
        """Records `stage` (and any deferred stage) as finished, with the metrics written so far."""
        done = dict(self.deferred)
        if stage is not None:
            done[stage] = summary or {}
        self.deferred = {}
        self.progress["done"].update(done)
        self.progress["metrics_bytes"] = self.metrics.position()
        if is_primary():  # the run's shared files are the first process's to write
            write_json_atomic(self.workdir / PROGRESS_FILE, self.progress)

    def save_policy(self, metadata: dict[str, Any]) -> Path:
        """The trained policy's adapters and heads to `<workdir>/policy` (what `icml_jax.chat` loads)."""
        return save_warmup(self.workdir / POLICY_DIR, self.policies, json_safe(metadata))  # every process calls


class NoMetrics:
    """The metrics sink of every process but the first (which writes all processes' rows)."""

    steps: dict[str, int] = {}

    def write(self, stage: str, row: Any, step: int | None = None) -> None:
        """Drops the row: the first process writes it."""

    def position(self) -> int:
        """Bytes written: none."""
        return 0

    def close(self) -> None:
        """Nothing to close."""
