"""`from_pretrained`: a local Hugging Face directory -> our NNX decoder, streamed tensor by tensor."""

from __future__ import annotations

from collections.abc import Sequence
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
from icml_jax.models.safetensors_io import Checkpoint


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

    The model is built abstractly and each tensor is read from its memory map, rearranged, cast to `dtype` and
    put on its device(s) one at a time, so host memory stays near one copy of the weights. With `mesh`, each
    tensor goes straight to its shards (logical axes -> mesh axes via `rules`). The returned model has its
    `config` attached. Missing, unexpected or mis-shaped tensors raise ValueError naming tensor and file.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    config = ModelConfig.from_json_file(path / "config.json")
    ckpt = Checkpoint(path)
    try:
        prefix = hf_layout.find_prefix(ckpt.keys())
    except KeyError as e:
        raise ValueError(f"{path}: {e.args[0]}") from None
    graphdef, state = nnx.split(abstract_model(config, dtype))
    table = hf_layout.layout(config)
    np_dtype = jnp.dtype(dtype)
    used: set[str] = set()
    missing: list[str] = []
    leaves = []
    for key, var in nnx.to_flat_state(state):
        hf_suffix, kind = table[key]
        name = hf_layout.full_name(hf_suffix, prefix)
        if name not in ckpt:
            missing.append(name)
            leaves.append((key, var))
            continue
        used.add(name)
        try:
            array = hf_layout.hf_to_ours(kind, ckpt.get(name), var.shape)
        except ValueError as e:
            raise ValueError(f"tensor {name!r} in {ckpt.file_of(name)} {e} (parameter {'/'.join(map(str, key))})") from None
        array = np.ascontiguousarray(array, dtype=np_dtype)
        if mesh is None:
            value = jax.device_put(array)
        else:  # each device receives only its shard, also when the mesh spans several processes
            value = parallel.place(array, parallel.variable_sharding(var, mesh, rules))
        leaves.append((key, var.replace(value)))
    if missing:
        raise ValueError(f"{path}: checkpoint lacks {len(missing)} tensor(s): {', '.join(missing[:8])}"
                         + (" ..." if len(missing) > 8 else ""))
    tied_head = hf_layout.full_name("<lm_head>", prefix) if config.tie_embeddings else None
    unexpected = [n for n in ckpt.keys() if n not in used and n != tied_head and not hf_layout.is_ignored(n)]
    if unexpected:
        shown = ", ".join(f"{n!r} ({ckpt.file_of(n).name})" for n in unexpected[:8])
        raise ValueError(f"{path}: unexpected tensor(s) the {config.family} decoder does not use: {shown}"
                         + (" ..." if len(unexpected) > 8 else ""))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))
