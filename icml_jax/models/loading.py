"""`from_pretrained`: a local Hugging Face directory -> our NNX decoder, streamed tensor by tensor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from icml_jax import parallel
from icml_jax.models import hf_layout
from icml_jax.models.config import ModelConfig
from icml_jax.models.decoder import Decoder
from icml_jax.models.safetensors_io import Checkpoint, CheckpointError, CheckpointNotFoundError


def abstract_model(config: ModelConfig, dtype=jnp.float32) -> Decoder:
    """The decoder with shapes and dtypes but no memory (nnx.eval_shape)."""
    return nnx.eval_shape(lambda: Decoder(config, dtype=dtype, rngs=nnx.Rngs(0)))


def from_pretrained(
    path: str | Path,
    *,
    dtype=jnp.float32,
    mesh: Mesh | None = None,
    rules: Sequence = parallel.DEFAULT_RULES,
) -> Decoder:
    """Loads `config.json` and the safetensors weights of a local HF model directory.

    The model is built abstractly and each parameter is read from the memory maps, rearranged, cast to `dtype`
    and put on its device(s) one at a time. A stacked block parameter gathers its layers' tensors: on one device
    through one stacked host copy; with `mesh` (logical axes -> mesh axes via `rules`) each device's shard is
    assembled from the layers' slices, so no device receives more than its shard and the host holds one layer's
    tensor plus one shard at a time. The returned model has its `config` attached. A damaged config.json raises
    ModelConfigError; a missing directory or file CheckpointNotFoundError; damaged safetensors files and missing,
    unexpected or mis-shaped tensors CheckpointError, naming tensor and file (all ValueError / FileNotFoundError).
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointNotFoundError(f"model directory {path} does not exist (or is not a folder)")
    config = ModelConfig.from_json_file(path / "config.json")
    ckpt = Checkpoint(path)
    try:
        prefix = hf_layout.find_prefix(ckpt.keys())
    except KeyError as e:
        raise CheckpointError(f"{path}: {e.args[0]}") from None
    graphdef, state = nnx.split(abstract_model(config, dtype))
    leaves, used = read_params(ckpt, state, hf_layout.layout(config), config.num_layers,
                               lambda n: hf_layout.full_name(n, prefix), dtype, mesh=mesh, rules=rules, where=path)
    tied_head = hf_layout.full_name("<lm_head>", prefix) if config.tie_embeddings else None
    unexpected = [n for n in ckpt.keys() if n not in used and n != tied_head and not hf_layout.is_ignored(n)]
    if unexpected:
        shown = ", ".join(f"{n!r} ({ckpt.file_of(n).name})" for n in unexpected[:8])
        raise CheckpointError(f"{path}: unexpected tensor(s) the {config.family} decoder does not use: {shown}"
                         + (" ..." if len(unexpected) > 8 else ""))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def read_params(ckpt: Checkpoint, state: nnx.State, table: dict, num_layers: int, full_name: Callable[[str], str],
                dtype, *, mesh: Mesh | None = None, rules: Sequence = parallel.DEFAULT_RULES, where: Path
                ) -> tuple[list[tuple[tuple, nnx.Variable]], set[str]]:
    """Every variable of the abstract `state` read from `ckpt` through the layout `table` (our path -> (HF suffix,
    kind)); stacked block parameters gather their `num_layers` tensors. Returns the filled (path, variable) leaves
    and the checkpoint names used; a missing or mis-shaped tensor is a CheckpointError naming it and its file.

    On one device a stacked parameter is one stacked host copy; with `mesh` each device's shard is assembled from
    the layers' slices, so no device receives more than its shard."""
    used: set[str] = set()
    missing: list[str] = []
    leaves = []
    for key, var in nnx.to_flat_state(state):
        hf_suffix, kind = table[key]
        stacked = hf_layout.is_stacked(key)
        suffixes = hf_layout.layer_names(hf_suffix, num_layers) if stacked else [hf_suffix]
        names = [full_name(n) for n in suffixes]
        absent = [n for n in names if n not in ckpt]
        if absent:
            missing.extend(absent)
            leaves.append((key, var))
            continue
        used.update(names)
        shape = tuple(var.shape[1:] if stacked else var.shape)
        for i, name in enumerate(names):
            expected = hf_layout.hf_shape(kind, shape)
            if ckpt.shape(name) != expected:
                at = "/".join(map(str, key)) + (f", layer {i}" if stacked else "")
                raise CheckpointError(f"tensor {name!r} in {ckpt.file_of(name)} has shape {ckpt.shape(name)}, "
                                      f"expected {expected} (parameter {at})")
        read = _reader(ckpt, kind, shape, jnp.dtype(dtype))
        sharding = None if mesh is None else parallel.variable_sharding(var, mesh, rules)
        if not stacked:
            value = jax.device_put(read(names[0])) if mesh is None else parallel.place(read(names[0]), sharding)
        elif mesh is None:
            value = jax.device_put(np.stack([read(n) for n in names]))
        else:  # each device's shard is assembled from the layers' memory maps: no full stacked copy on the host
            value = jax.make_array_from_callback(
                tuple(var.shape), sharding,
                lambda index, names=names, read=read: np.stack([read(n)[index[1:]] for n in names[index[0]]]))
        leaves.append((key, var.replace(value)))
    if missing:
        raise CheckpointError(f"{where}: checkpoint lacks {len(missing)} tensor(s): {', '.join(missing[:8])}"
                              + (" ..." if len(missing) > 8 else ""))
    return leaves, used


def _reader(ckpt: Checkpoint, kind: str, shape: tuple[int, ...], dtype) -> Callable[[str], np.ndarray]:
    """name -> that checkpoint tensor in our layout (`shape`) and `dtype`, read from its memory map."""
    def read(name: str) -> np.ndarray:
        return np.ascontiguousarray(hf_layout.hf_to_ours(kind, ckpt.get(name), shape), dtype=dtype)

    return read
