"""The one flat-array format of trainable state and its one compatibility check.

Every checkpoint of this package (the warm-up's policy file, the online run's checkpoint, the optimizer state
inside it) stores arrays as a flat {"a/b/c": array} dict; `check_compatible` compares what a checkpoint holds
with what the live model expects and names every missing, unexpected or mis-shaped entry before anything is
written, so a checkpoint of another backbone, LoRA or head configuration fails loudly instead of half-loading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# TRAINABLE, the one trainable filter (re-exported): LoRA adapters and TrainableParams (the policy heads), what
# the warm-up and the PPO update train and what the policy file and a run checkpoint's `params` hold.
from icml_jax.models.lora import TRAINABLE
from icml_jax.models.safetensors_io import CheckpointError as ModelCheckpointError

__all__ = ["TRAINABLE", "CheckpointError", "check_compatible", "flat_arrays", "flat_variables", "index_of",
           "key_of", "leaves_index", "restore_arrays", "state_index"]
Index = dict[str, dict[str, Any]]  # 'a/b/c' -> {"shape": [..], "dtype": ".."}
SHOWN = 8  # problems spelled out in a compatibility error


class CheckpointError(ModelCheckpointError, RuntimeError):
    """A checkpoint of this package (a run's, a policy file) does not restore; the message names what and where.

    One hierarchy with the backbone loader's `models.CheckpointError` (a ValueError); still a RuntimeError, as
    the run checkpointer's error always was."""


def key_of(path: tuple[Any, ...]) -> str:
    """A variable's path as the format's '/'-joined key."""
    return "/".join(str(p) for p in path)


def _is_key(x: Any) -> bool:
    """Whether `x` is a typed PRNG key array (stored as its raw uint32 data)."""
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def flat_variables(state: nnx.State) -> dict[str, nnx.Variable]:
    """'a/b/c' -> Variable of every variable in `state`."""
    return {key_of(path): var for path, var in nnx.to_flat_state(state)}


def flat_arrays(state: nnx.State) -> dict[str, np.ndarray]:
    """{'a/b/c': host array} of a state; typed PRNG keys (LoRA dropout streams) as their raw uint32 data."""
    out = {}
    for key, var in flat_variables(state).items():
        value = var.get_value()
        if _is_key(value):
            value = jax.random.key_data(value)
        out[key] = np.asarray(jax.device_get(value))
    return out


def index_of(arrays: Mapping[str, Any]) -> Index:
    """'a/b/c' -> {shape, dtype} of flat arrays (what a checkpoint holds or a model expects)."""
    return {k: {"shape": list(np.shape(v)), "dtype": str(getattr(v, "dtype", np.asarray(v).dtype))}
            for k, v in arrays.items()}


def leaves_index(leaves: Sequence[Any]) -> Index:
    """The `index_of` a list of leaves (an optimizer state's), keyed '0', '1', ... in order."""
    return index_of({str(i): leaf for i, leaf in enumerate(leaves)})


def state_index(state: nnx.State) -> Index:
    """The `index_of` a state's variables (PRNG keys as their raw data's shape and dtype)."""
    out = {}
    for key, var in flat_variables(state).items():
        value = var.get_value()
        value = jax.random.key_data(value) if _is_key(value) else value
        out[key] = {"shape": list(np.shape(value)), "dtype": str(value.dtype)}
    return out


def check_compatible(saved: Index, expected: Index, where: str, *, dtypes: bool = True) -> None:
    """Raises ValueError naming every missing, unexpected or mis-shaped entry (and mis-typed with `dtypes`)."""
    missing, unexpected = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    common = [k for k in expected if k in saved]  # in the model's order
    bad = [k for k in common if list(saved[k]["shape"]) != list(expected[k]["shape"])
           or (dtypes and saved[k]["dtype"] != expected[k]["dtype"])]
    if not (missing or unexpected or bad):
        return
    problems = [f"{k}: checkpoint {list(saved[k]['shape'])} {saved[k]['dtype']}, policies "
                f"{list(expected[k]['shape'])} {expected[k]['dtype']}" for k in sorted(bad)]
    problems += [f"missing {k} {list(expected[k]['shape'])}" for k in missing]
    problems += [f"unexpected {k} {list(saved[k]['shape'])}" for k in unexpected]
    shown = "; ".join(problems[:SHOWN]) + (f"; ... {len(problems) - SHOWN} more" if len(problems) > SHOWN else "")
    raise ValueError(f"{where}: missing {missing[:5]}, unexpected {unexpected[:5]}, mis-shaped {bad[:5]}: "
                     f"it does not fit these policies ({len(problems)} tensor(s)): {shown} "
                     "(another backbone, LoRA or head configuration?)")


def restore_arrays(state: nnx.State, arrays: Mapping[str, Any], where: str, *, check_only: bool = False) -> None:
    """Writes `flat_arrays` output back into the variables of `state` (each cast to its variable's dtype, on its
    sharding); raises naming any missing, unexpected or mis-shaped array before writing anything."""
    check_compatible(index_of(arrays), state_index(state), where, dtypes=False)
    if check_only:
        return
    for key, var in flat_variables(state).items():
        current = var.get_value()
        sharding = getattr(current, "sharding", None)
        if _is_key(current):
            value = jax.random.wrap_key_data(jnp.asarray(arrays[key]), impl=jax.random.key_impl(current))
        else:
            value = jnp.asarray(arrays[key], dtype=current.dtype)
        var.set_value(jax.device_put(value, sharding) if sharding is not None else value)
