"""A run's workdir: where each stage's files go, atomic writes of the run's shared files, the progress record
(`progress.json`: finished stages, the metrics file's length then) and the point a restarted run continues from."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.checkpoint import RunCheckpointer
from icml_jax.checkpoint.files import write_text_atomic
from icml_jax.configlib import ConfigError
from icml_jax.run.runlog import json_safe

CONFIG_FILE = "config.json"  # the run's config, as `config_text` writes it
SYNTHESIS_DIR = "synthesis"
PROGRESS_FILE = "progress.json"
CHECKPOINT_DIR = "checkpoints"
POLICY_DIR = "policy"  # the latest trained policy (adapters + heads), what `icml_jax.chat` loads
WARMUP_DIR = "warmup"  # the warm-up's checkpoint (the chat's fallback policy)
PLOT_FILE = "learning_curves.png"


def config_text(config: ml_collections.ConfigDict) -> str:
    """The config as `<workdir>/config.json` holds it."""
    return config.to_json_best_effort(indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: Path, data: Any) -> None:
    """Writes `path` so that a kill leaves either the old or the new file, never half of one."""
    write_text_atomic(path, json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")


def read_progress(workdir: Path) -> dict[str, Any]:
    """`<workdir>/progress.json`: finished stages with their summaries and the metrics file's length then."""
    path = workdir / PROGRESS_FILE
    if not path.is_file():
        return {"done": {}, "metrics_bytes": 0, "finished": False}
    return json.loads(path.read_text(encoding="utf-8"))


def reopen_extended(progress: dict[str, Any], stages: Sequence[str], episodes: int) -> int | None:
    """Reopens a finished online stage that played fewer than `episodes` (the config's total over all processes):
    the run is extended, continuing from its newest checkpoint. Returns the episodes played when reopened, else
    None; `progress` is changed in place (the caller writes it). A finished stage that played more is refused: a
    run is not shortened after the fact."""
    done = progress["done"].get("online")
    if "online" not in stages or done is None:
        return None
    played = int(done["episodes"])
    if played > episodes:
        raise ConfigError(f"config.data.train_episodes asks for {episodes} online episodes, but this workdir's "
                          f"finished run played {played}; a finished run is extended, never shortened: use a new "
                          f"--workdir")
    if played == episodes:
        return None
    del progress["done"]["online"]
    progress["finished"] = False
    return played


@dataclasses.dataclass
class ResumePoint:
    """Where a run continues: metrics bytes to keep, TensorBoard purge step per stage, and the online checkpoint
    it restores (read once here, so the metrics are cut at exactly the state the online stage continues from)."""

    metrics_bytes: int
    purge: dict[str, int]
    checkpoint: tuple[int, dict[str, Any], dict[str, Any]] | None = None  # (step, arrays, state)
    skipped: list[str] = dataclasses.field(default_factory=list)  # newer checkpoints that did not restore, why


def resume_point(root: Path, progress: dict[str, Any], stages: Sequence[str]) -> ResumePoint:
    """Where the run held in `root` continues; the newest online checkpoint that restores is the point (damaged
    newer ones are moved aside with a warning that names them)."""
    done = progress["done"]
    point = ResumePoint(int(progress["metrics_bytes"]), {s: 0 for s in stages if s not in done})
    if "online" in stages and "online" not in done and (root / CHECKPOINT_DIR).is_dir():
        with RunCheckpointer(root / CHECKPOINT_DIR) as ckpt:
            point.checkpoint, point.skipped = ckpt.restore_newest(), ckpt.skipped
        if point.checkpoint is not None:
            step, _, state = point.checkpoint
            point.metrics_bytes = int(state["metrics_bytes"])
            point.purge.update(online=step + 1, eval=1 if step else 0)
    if "online" in point.purge:
        point.purge.setdefault("eval", point.purge["online"])
    return point
