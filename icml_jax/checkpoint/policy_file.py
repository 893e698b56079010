"""The policy file: the trainable state of both policies (LoRA adapters + heads) with JSON metadata.

Layout of `<path>` (what the warm-up writes to `<workdir>/warmup`, unchanged): `state/` (an Orbax
StandardCheckpointer item: the flat {"a/b/c": array} dict of `checkpoint.arrays`) and `warmup.json` (metadata,
plus every tensor's path, shape and dtype, written atomically). `load_warmup` checks the file's tensors against
the policies it restores into (`check_compatible`) before reading anything.
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
from icml_jax.checkpoint.arrays import (TRAINABLE, Index, check_compatible, flat_variables, index_of, key_of,
                                       state_index)
from icml_jax.checkpoint.files import write_text_atomic

META_FILE = "warmup.json"
STATE_DIR = "state"
FORMAT_VERSION = 1


def flat_trainable(policies: nnx.Module) -> dict[str, nnx.Variable]:
    """'a/b/c' -> Variable for every trainable parameter of the policies."""
    return flat_variables(nnx.state(policies, TRAINABLE))


def param_index(policies: nnx.Module) -> Index:
    """'a/b/c' -> {shape, dtype} of the trainable parameters (what a policy file must hold)."""
    return state_index(nnx.state(policies, TRAINABLE))


def save_warmup(path: str | os.PathLike[str], policies: nnx.Module, metadata: dict[str, Any] | None = None) -> Path:
    """Saves the trainable state of `policies` to `path` (overwriting it) with JSON metadata; returns the path."""
    arrays = {k: v.get_raw_value() for k, v in flat_trainable(policies).items()}
    if not arrays:
        raise ValueError("save_warmup: the policies have no trainable parameters (no LoRA adapters and no heads?)")
    several = jax.process_count() > 1
    if several:  # each process holds the same policy on its own devices: host copies, the first process writes
        arrays = {k: np.asarray(jax.device_get(v)) for k, v in arrays.items()}
    return _write(path, arrays, param_index(policies), metadata)


def save_policy_arrays(path: str | os.PathLike[str], arrays: dict[str, Any], metadata: dict[str, Any] | None = None
                       ) -> Path:
    """Writes a policy file from flat trainable arrays ('a/b/c' -> array, as a run checkpoint's `params` holds
    them), overwriting `path`; returns the path. One process (an export, not a run)."""
    if not arrays:
        raise ValueError(f"save_policy_arrays {path}: no arrays to write")
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    return _write(path, arrays, index_of(arrays), metadata)


def _write(path: str | os.PathLike[str], arrays: dict[str, Any], index: Index, metadata: dict[str, Any] | None
           ) -> Path:
    """The policy file's two parts at `path` (made if absent): the arrays (Orbax, every process) and the metadata
    (the first process)."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:  # every process of a run calls this
        ckptr.save(path / STATE_DIR, arrays, force=True)
        ckptr.wait_until_finished()
    if parallel.is_primary():
        meta = {"format_version": FORMAT_VERSION, "params": index, **(metadata or {})}
        write_text_atomic(path / META_FILE, json.dumps(meta, indent=2, sort_keys=True, default=_json_default) + "\n")
    parallel.barrier(f"policy file {path}")
    return path


def _json_default(x: Any) -> Any:
    """JSON for the NumPy / JAX values metadata may hold (json.dumps `default`)."""
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


def load_warmup(path: str | os.PathLike[str], policies: nnx.Module) -> dict[str, Any]:
    """Restores a warm-up checkpoint into `policies` in place (same backbone, LoRA config and heads); returns its
    metadata. Arrays land with the shardings of the policies' current values."""
    path = Path(path).absolute()
    meta = read_warmup_metadata(path)
    current = flat_trainable(policies)
    check_compatible(meta["params"], param_index(policies), f"warm-up checkpoint {path}")
    target = {k: jax.ShapeDtypeStruct(v.get_raw_value().shape, v.get_raw_value().dtype,
                                      sharding=getattr(v.get_raw_value(), "sharding", None))
              for k, v in current.items()}
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore(path / STATE_DIR, target)
    flat = nnx.to_flat_state(nnx.state(policies, TRAINABLE))
    nnx.update(policies, nnx.from_flat_state([(p, v.replace(restored[key_of(p)])) for p, v in flat]))
    return meta
