"""The online stage's checkpoint: the learner's arrays and JSON state, every user's memory, the data stream's
position and the metrics file's length in one Orbax step, gathered over JAX processes (each holds its own
users), and restored the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

from icml_jax import parallel
from icml_jax.checkpoint.arrays import CheckpointError
from icml_jax.checkpoint.policy_file import save_policy_arrays
from icml_jax.checkpoint.run import RunCheckpointer, load_memory_state, memory_state
from icml_jax.memory.store import MemoryStore

ARRAY_KEYS = ("params", "rest", "optimizer", "agent_key")  # the learner's state that Orbax saves as arrays


def gather_state(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's JSON state: this process's, or with several processes every process's (they differ in
    their users' memories, pending rewards, data position) under "processes", the first one's metrics length
    on top (a collective)."""
    parts = parallel.allgather_objects(state)
    if len(parts) == 1:
        return state
    return {"process_count": len(parts), "metrics_bytes": parts[0]["metrics_bytes"], "processes": parts}


def own_state(state: dict[str, Any], where: Path) -> dict[str, Any]:
    """This process's part of a checkpoint's JSON state (`gather_state`); a checkpoint of another number of
    processes is an error naming both."""
    saved = int(state.get("process_count", 1))
    if saved != jax.process_count():
        raise CheckpointError(f"{where} is a checkpoint of a run of {saved} JAX process(es); this run has "
                              f"{jax.process_count()}: resume it with {saved} (each process holds its own users)")
    return state["processes"][jax.process_index()] if saved > 1 else state


def export_policy(directory: str | Path, step: int, out: str | Path) -> Path:
    """Checkpoint `step` of an online run's checkpoint directory written as a policy file in `out` (what
    `python -m icml_jax.evaluate --checkpoint` and the chat load): the policies after that step's updates, so a
    held-out evaluation can follow the policy update by update. Returns `out`."""
    directory = Path(directory)
    with RunCheckpointer(directory, async_save=False) as ckpt:
        steps = ckpt.all_steps()
        if step not in steps:
            raise CheckpointError(f"{directory}: no complete checkpoint at step {step}; steps kept: {steps} "
                                  "(config.checkpoint.keep sets how many)")
        _, arrays, state = ckpt.restore(step)
    first = state["processes"][0] if int(state.get("process_count", 1)) > 1 else state  # the same policy on each
    counters = first.get("counters", {})
    return save_policy_arrays(out, arrays["params"], {
        "stage": "online", "episodes": counters.get("episodes_seen", step), "updates": counters.get("updates"),
        "exported_from": str(directory.absolute() / str(step))})


class OnlineCheckpoint:
    """Saves and restores an online run's whole state through `ckpt`: `learner` (`state_dict` /
    `load_state_dict`, `episodes_seen`), the users' memories in `store`, `stream`'s position (`get_state` /
    `set_state`) and `metrics`' length (`position`). `saved`: the last step saved or restored."""

    def __init__(self, ckpt: RunCheckpointer, learner: Any, store: MemoryStore, stream: Any, metrics: Any) -> None:
        self.ckpt, self.learner, self.store, self.stream, self.metrics = ckpt, learner, store, stream, metrics
        self.saved: int | None = None

    def save(self, extra: dict[str, Any]) -> None:
        """A checkpoint at the learner's episode count, with `extra` JSON state (e.g. the before-evaluation)."""
        state = self.learner.state_dict()
        arrays = {k: state.pop(k) for k in ARRAY_KEYS}
        self.ckpt.save(self.learner.episodes_seen, arrays,
                       gather_state({**state, **extra, "memory": memory_state(self.store),
                                     "data": self.stream.get_state(), "metrics_bytes": self.metrics.position()}))
        self.saved = self.learner.episodes_seen

    def restore(self, restored: tuple[int, dict[str, Any], dict[str, Any]], directory: Path) -> dict[str, Any]:
        """Loads a `RunCheckpointer.restore` result (step, arrays, state) from `directory` into the learner, the
        store and the stream; returns this process's JSON state (its `extra` keys included)."""
        self.saved, arrays, state = restored
        state = own_state(state, directory / str(self.saved))
        self.learner.load_state_dict({**state, **arrays})
        load_memory_state(self.store, state["memory"])
        self.stream.set_state(state["data"])
        return state


__all__ = ["ARRAY_KEYS", "OnlineCheckpoint", "export_policy", "gather_state", "own_state"]
