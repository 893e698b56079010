"""The run checkpoint: Orbax checkpoints of an online run, so a killed run resumes where its last complete
checkpoint left it.

A checkpoint is one step directory `<dir>/<step>` (step = episodes seen) with two Orbax items: `arrays` (every
array, flat as `checkpoint.arrays` lays them out: policy parameters and RNG streams, optimizer state, the
agent's key) and `state` (JSON: pending reward
buffer, NumPy RNG state, counters, session log, every user's memory store, the data stream's position and the
metrics file's length). Saves are asynchronous; Orbax writes into a temporary directory and renames it only
once every item is on disk, so a kill mid-write leaves the previous checkpoint as the latest one.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from icml_jax import parallel
from icml_jax.checkpoint.arrays import CheckpointError
from icml_jax.memory.store import MemoryStore

ARRAYS, STATE = "arrays", "state"
logger = logging.getLogger(__name__)


def memory_state(store: MemoryStore) -> dict[str, str]:
    """Every user's memory as its JSON Lines export (user id -> text), for a checkpoint's JSON item: each fragment
    with its version (`superseded_by`, `valid_to`) and its events, so a resumed run has the same history."""
    out = {}
    for user in store.user_ids():
        buf = io.StringIO()
        store.export_jsonl(user, buf)
        out[user] = buf.getvalue()
    return out


def load_memory_state(store: MemoryStore, state: Mapping[str, str]) -> None:
    """Replaces the store's contents with `memory_state` output (every user, all or nothing per user); events keep
    their order (renumbered by the store). Checkpoints written before versions (export format "/1") load too."""
    for user in store.user_ids():
        store.delete_user(user)
    for user, text in state.items():
        store.import_jsonl(user, io.StringIO(text))


class RunCheckpointer:
    """Saves and restores run checkpoints under one directory, keeping the last `keep`."""

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3, async_save: bool = True) -> None:
        if not isinstance(keep, int) or keep < 1:
            raise ValueError(f"RunCheckpointer: keep must be a positive int, got {keep!r}")
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
                                               cleanup_tmp_directories=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(ARRAYS, STATE))
        self.skipped: list[str] = []  # what the last restore_newest skipped, and why

    def save(self, step: int, arrays: Mapping[str, Any], state: Mapping[str, Any]) -> None:
        """Starts writing checkpoint `step` (returns before it is on disk when async); arrays must be host copies."""
        self._manager.save(step, args=ocp.args.Composite(**{ARRAYS: ocp.args.StandardSave(dict(arrays)),
                                                             STATE: ocp.args.JsonSave(dict(state))}), force=True)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step (a half-written one is never listed)."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints kept, oldest first."""
        return sorted(self._manager.all_steps())

    def restore(self, step: int | None = None) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, arrays as NumPy, state) of checkpoint `step` (default: the latest); None when there is none."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        out = self._manager.restore(step, args=ocp.args.Composite(**{ARRAYS: ocp.args.StandardRestore(),
                                                                     STATE: ocp.args.JsonRestore()}))
        return step, jax.tree.map(np.asarray, dict(out[ARRAYS])), dict(out[STATE])

    def restore_newest(self, *, arrays: bool = True) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """(step, arrays, state) of the newest checkpoint that restores; None when there is none at all.

        A newer one that fails to restore (a damaged file, a half-copied directory) is moved aside to
        `<directory>.unrestorable/<step>` (kept for inspection; the resumed run saves that step again) with a
        warning naming it and the error. When none restores, CheckpointError lists every step and its error:
        a run is never silently restarted from scratch. `arrays=False` reads only the JSON state.
        """
        failures: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            try:
                if arrays:
                    found = self.restore(step)
                else:
                    got = self.restore_state(step)
                    found = None if got is None else (got[0], {}, got[1])
            except Exception as exc:  # any failure to read a checkpoint makes it unusable; each is reported
                text = str(exc).strip().splitlines()
                failures.append((step, f"{type(exc).__name__}: {text[0] if text else ''}"[:300]))
                continue
            self.skipped = []
            for bad, reason in failures:  # newer than the one that restores: out of the way, said out loud
                aside = self._move_aside(bad)
                self.skipped.append(f"checkpoint step {bad} does not restore ({reason}); moved to {aside}")
                logger.warning("%s", self.skipped[-1])
            return found
        if failures:
            raise CheckpointError(f"no checkpoint in {self.directory} restores ("
                                  + "; ".join(f"step {step}: {reason}" for step, reason in failures)
                                  + "); move the directory away to start this run over, or repair it")
        return None

    def _move_aside(self, step: int) -> Path:
        """Moves step directory `step` out of the manager's sight (the run will write that step again)."""
        dest_root = self.directory.with_name(self.directory.name + ".unrestorable")
        dest_root.mkdir(parents=True, exist_ok=True)
        dest = dest_root / str(step)
        n = 1
        while dest.exists():
            dest, n = dest_root / f"{step}.{n}", n + 1
        if parallel.is_primary():  # the run's files are the first process's to move
            os.replace(self.directory / str(step), dest)
        parallel.barrier(f"checkpoint {step} moved aside")
        self._manager.reload()
        return dest

    def restore_state(self, step: int | None = None) -> tuple[int, dict[str, Any]] | None:
        """(step, JSON state) of checkpoint `step` (default: the latest) without reading its arrays."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        out = self._manager.restore(step, args=ocp.args.Composite(**{STATE: ocp.args.JsonRestore()}))
        return step, dict(out[STATE])

    def wait(self) -> None:
        """Blocks until the last save is complete on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finishes pending saves and releases the manager."""
        self._manager.close()

    def __enter__(self) -> RunCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
