"""Atomic writes of a run's small files: a JSON or text file written whole or not at all. Here, below the run
layer, because the checkpoints (the policy file's metadata), the warm-up (its metrics) and the run's workdir
(`icml_jax.run.workdir`: config and progress) all write them."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Writes `path` whole or not at all (other processes of the run may be reading it)."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
