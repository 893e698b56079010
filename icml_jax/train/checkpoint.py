"""Orbax checkpoint of the warm-up: the trainable policy state (LoRA adapters + the heads) and metadata.

Layout of `<path>`: `state/` (an Orbax StandardCheckpointer item: a flat {"a/b/c": array} dict) and
`warmup.json` (metadata, plus every tensor's path, shape and dtype). `load_warmup` checks the checkpoint's
tensors against the policies it restores into and names every missing, unexpected or mis-shaped tensor before
reading anything, so a checkpoint of another backbone or LoRA config fails loudly instead of half-loading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from icml_jax import parallel
from icml_jax.models.lora import TRAINABLE

HEADS: tuple[str, ...] = ("planner_actor", "planner_critic", "trigger_actor", "trigger_critic", "trigger_match")
# What the warm-up trains and saves: what the PPO update trains (`lora.TRAINABLE`: adapters and TrainableParams,
# which the policy heads are), plus the heads by name should they be plain Params.
WARMUP_TRAINABLE = nnx.Any(TRAINABLE, nnx.All(nnx.Param, nnx.Any(*(nnx.PathContains(h) for h in HEADS))))
META_FILE = "warmup.json"
STATE_DIR = "state"
FORMAT_VERSION = 1


def _key(path: tuple[Any, ...]) -> str:
    return "/".join(str(p) for p in path)


def flat_trainable(policies: nnx.Module) -> dict[str, nnx.Variable]:
    """'a/b/c' -> Variable for every trainable (warm-up) parameter of the policies."""
    return {_key(path): var for path, var in nnx.to_flat_state(nnx.state(policies, WARMUP_TRAINABLE))}


def param_index(policies: nnx.Module) -> dict[str, dict[str, Any]]:
    """'a/b/c' -> {shape, dtype} of the trainable parameters (what a checkpoint must hold)."""
    return {k: {"shape": list(v.get_raw_value().shape), "dtype": str(v.get_raw_value().dtype)}
            for k, v in flat_trainable(policies).items()}


def save_warmup(path: str | os.PathLike[str], policies: nnx.Module, metadata: dict[str, Any] | None = None) -> Path:
    """Saves the trainable state of `policies` to `path` (overwriting it) with JSON metadata; returns the path."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    arrays = {k: v.get_raw_value() for k, v in flat_trainable(policies).items()}
    if not arrays:
        raise ValueError("save_warmup: the policies have no trainable parameters (no LoRA adapters and no heads?)")
    several = jax.process_count() > 1
    if several:  # each process holds the same policy on its own devices: host copies, the first process writes
        arrays = {k: np.asarray(jax.device_get(v)) for k, v in arrays.items()}
    with ocp.StandardCheckpointer() as ckptr:  # every process of a run calls this
        ckptr.save(path / STATE_DIR, arrays, force=True)
        ckptr.wait_until_finished()
    if parallel.is_primary():
        meta = {"format_version": FORMAT_VERSION, "params": param_index(policies), **(metadata or {})}
        (path / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n")
    parallel.barrier(f"save_warmup {path}")
    return path


def _json_default(x: Any) -> Any:
    if isinstance(x, (np.generic, jax.Array)):
        return np.asarray(x).tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def read_warmup_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The metadata of a warm-up checkpoint (raises naming the path when it is not one)."""
    meta_path = Path(path) / META_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path} does not exist: {path} is not a warm-up checkpoint")
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{meta_path}: format_version {meta.get('format_version')!r}, "
                         f"this code reads {FORMAT_VERSION}")
    return meta


def check_compatible(saved: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]], where: str) -> None:
    """Raises ValueError naming every missing, unexpected or mis-shaped tensor."""
    problems = [f"{k}: checkpoint {saved[k]['shape']} {saved[k]['dtype']}, policies {expected[k]['shape']} "
                f"{expected[k]['dtype']}" for k in sorted(set(saved) & set(expected))
                if saved[k]["shape"] != expected[k]["shape"] or saved[k]["dtype"] != expected[k]["dtype"]]
    problems += [f"missing {k} {expected[k]['shape']}" for k in sorted(set(expected) - set(saved))]
    problems += [f"unexpected {k} {saved[k]['shape']}" for k in sorted(set(saved) - set(expected))]
    if problems:
        shown = "; ".join(problems[:8]) + (f"; ... {len(problems) - 8} more" if len(problems) > 8 else "")
        raise ValueError(f"warm-up checkpoint {where} does not fit these policies ({len(problems)} tensor(s)): {shown}")


def load_warmup(path: str | os.PathLike[str], policies: nnx.Module) -> dict[str, Any]:
    """Restores a warm-up checkpoint into `policies` in place (same backbone, LoRA config and heads); returns its
    metadata. Arrays land with the shardings of the policies' current values."""
    path = Path(path).absolute()
    meta = read_warmup_metadata(path)
    current = flat_trainable(policies)
    check_compatible(meta["params"], param_index(policies), str(path))
    target = {k: jax.ShapeDtypeStruct(v.get_raw_value().shape, v.get_raw_value().dtype,
                                      sharding=getattr(v.get_raw_value(), "sharding", None))
              for k, v in current.items()}
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore(path / STATE_DIR, target)
    flat = nnx.to_flat_state(nnx.state(policies, WARMUP_TRAINABLE))
    nnx.update(policies, nnx.from_flat_state([(p, v.replace(restored[_key(p)])) for p, v in flat]))
    return meta
