"""Export: LoRA merged into the base weights as a Hugging Face directory, and adapters saved/loaded alone.

Tensor names and layouts come from `hf_layout` (the table loading uses), so export and loading cannot disagree.
Stacked block parameters and adapters (leading `layers` axis) are written layer by layer under per-layer names
(`model.layers.3.self_attn.q_proj.weight`, `layers.3.attn.q_lora_a`), the names a per-layer model would have.
Every process of a multi-host run calls these functions (arrays are gathered collectively); process 0 writes.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from icml_jax import parallel
from icml_jax.models import families, hf_layout, lora
from icml_jax.models.decoder import LAYERS
from icml_jax.models.safetensors_io import SafetensorsFile, TensorSpec, write_safetensors, write_tensors

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
_HF_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16",
                   np.dtype(np.float16): "float16"}
ADAPTER_FILE = "adapters.safetensors"
ADAPTER_FORMAT = "icml_jax-lora-1"


def to_host(x: jax.Array) -> np.ndarray:
    """A full NumPy copy of `x`, gathered across processes when it is sharded over several hosts."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def hf_config_for_export(hf: dict[str, Any], dtype_name: str) -> dict[str, Any]:
    """The config.json of the exported causal LM: the base one with `dtype` set, as its family exports it (Gemma3
    multimodal -> its text tower)."""
    hf = families.export_config(json.loads(json.dumps(hf)))
    hf["dtype"] = dtype_name
    if "torch_dtype" in hf:
        hf["torch_dtype"] = dtype_name
    return hf


def _plan_shards(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Groups tensor names (in order) into files of at most `max_shard_bytes` (a larger tensor gets its own)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def export_hf(
    model: nnx.Module,
    out_dir: str | Path,
    *,
    base_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: Any = None,
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Writes `model` (adapters merged into their weights) as a HF directory `transformers` loads.

    config.json comes from the base checkpoint `base_dir` (dtype updated); generation_config.json and the
    tokenizer files of `tokenizer_dir` (default: `base_dir`) are copied. Weights are merged, gathered and
    written one tensor at a time, into several files with an index once they exceed `max_shard_bytes`.
    """
    out_dir, base_dir = Path(out_dir), Path(base_dir)
    config_file = base_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"export needs the base model's config.json; {config_file} does not exist")
    if tokenizer_dir is not None and not any((Path(tokenizer_dir) / f).is_file() for f in TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...) in {tokenizer_dir}")
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else base_dir
    table = hf_layout.layout(model.config)
    specs, np_dtype = _tensor_specs(model, table, dtype)
    hf = hf_config_for_export(json.loads(config_file.read_text()), _HF_DTYPE_NAMES[np_dtype])
    sizes = [(spec.name, spec.nbytes) for spec in specs]
    shards = _plan_shards(sizes, max_shard_bytes)
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    writer = jax.process_index() == 0
    if writer:
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in list(out_dir.glob("model*.safetensors")) + list(out_dir.glob("model.safetensors.index.json")):
            stale.unlink()
    _write_shards(out_dir, files, shards, specs, _hf_tensors(model, table, np_dtype), writer=writer)
    if writer:
        if len(files) > 1:
            file_of = {name: files[i] for i, shard in enumerate(shards) for name in shard}
            index = {"metadata": {"total_size": sum(s for _, s in sizes)},
                     "weight_map": {name: file_of[name] for name, _ in sizes}}
            (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (out_dir / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
        extra = [base_dir / "generation_config.json"] + [tokenizer_dir / f for f in TOKENIZER_FILES]
        for src in extra:
            if src.is_file():
                shutil.copyfile(src, out_dir / src.name)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("icml_jax.export_hf")
    return out_dir


def _tensor_specs(model: nnx.Module, table: Mapping[Any, Any], dtype: Any) -> tuple[list[TensorSpec], np.dtype]:
    """The HF tensors `model` exports to (names, dtype, HF shapes; a stacked layer parameter gives one per layer),
    in the order `_hf_tensors` yields them, and their numpy dtype (`dtype`, else the first parameter's)."""
    params = dict(nnx.to_flat_state(nnx.state(model, lora.FROZEN)))
    unknown = [p for p in params if p not in table]
    if unknown:
        shown = ["/".join(map(str, p)) for p in unknown[:6]]
        raise ValueError(f"export: parameters with no Hugging Face name: {shown}")
    first = next(iter(params.values())).get_raw_value()
    np_dtype = np.dtype(jnp.dtype(dtype if dtype is not None else first.dtype))
    if np_dtype not in _HF_DTYPE_NAMES:
        raise ValueError(f"export dtype must be float32, bfloat16 or float16, got {np_dtype}")
    layers = model.config.num_layers
    names = {path: [hf_layout.full_name(n, "model.") for n in (
        hf_layout.layer_names(table[path][0], layers) if hf_layout.is_stacked(path) else [table[path][0]])]
        for path in params}
    specs = [TensorSpec(name, np_dtype, hf_layout.hf_shape(table[p][1], v.shape[1:] if hf_layout.is_stacked(p)
                                                           else v.shape))
             for p, v in params.items() for name in names[p]]
    return specs, np_dtype


def _hf_tensors(model: nnx.Module, table: Mapping[Any, Any], np_dtype: np.dtype) -> Iterator[np.ndarray]:
    """Each HF tensor in `_tensor_specs` order, merged, gathered (on every process) and laid out one at a time."""
    for path, value in lora.iter_merged_params(model):
        array = to_host(value).astype(np_dtype)
        for piece in (list(array) if hf_layout.is_stacked(path) else [array]):
            yield hf_layout.ours_to_hf(table[path][1], piece)


def _write_shards(out_dir: Path, files: Sequence[str], shards: Sequence[Sequence[str]], specs: Sequence[TensorSpec],
                  tensors: Iterator[np.ndarray], *, writer: bool) -> None:
    """Streams `tensors` into the shard files; a process that is not the writer only takes part in the gathers."""
    start = 0
    for file, shard in zip(files, shards, strict=True):
        pieces = itertools.islice(tensors, len(shard))
        if writer:
            write_safetensors(out_dir / file, specs[start:start + len(shard)], pieces, {"format": "pt"})
        else:
            for _ in pieces:
                pass
        start += len(shard)


def _adapter_items(model: nnx.Module) -> list[tuple[str, nnx.Variable, int | None]]:
    """(file name, variable, layer) of every LoRA adapter in state order; a stacked adapter gives one item per
    layer, named as a per-layer model would name it (`layers.3.attn.q_lora_a`), layer None otherwise."""
    items = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        axes = var.get_metadata().get("logical_axes") or (None,)
        if axes[0] == LAYERS and LAYERS in path:
            at = path.index(LAYERS) + 1
            for layer in range(var.get_raw_value().shape[0]):
                items.append((".".join(map(str, (*path[:at], layer, *path[at:]))), var, layer))
        else:
            items.append((".".join(map(str, path)), var, None))
    return items


def save_adapters(model: nnx.Module, directory: str | Path) -> Path:
    """Writes only the adapters (and their LoRA config) to `directory/adapters.safetensors`; process 0 writes."""
    items = _adapter_items(model)
    if not items:
        raise ValueError("save_adapters: the model has no LoRA adapters (apply_lora first)")
    config: lora.LoraConfig = getattr(model, "lora_config", None) or lora.LoraConfig()
    hosts = {id(var): to_host(var.get_raw_value()) for _, var, _ in items}
    tensors = {name: hosts[id(var)] if layer is None else hosts[id(var)][layer] for name, var, layer in items}
    directory = Path(directory)
    if jax.process_index() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        write_tensors(directory / ADAPTER_FILE, tensors,
                      {"format": ADAPTER_FORMAT, "lora_config": json.dumps(config.to_dict())})
    return directory / ADAPTER_FILE


def read_adapter_config(directory: str | Path) -> lora.LoraConfig:
    """The LoRA config saved with the adapters (to `apply_lora` before `load_adapters`)."""
    path = _adapter_path(directory)
    meta = _read_metadata(path)
    return lora.LoraConfig.from_config(json.loads(meta["lora_config"]))


def _adapter_path(directory: str | Path) -> Path:
    path = Path(directory)
    path = path / ADAPTER_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"no saved adapters at {path}")
    return path


def _read_metadata(path: Path) -> dict[str, str]:
    """The adapter file's safetensors metadata (its header checked against the file first: a damaged length
    field is an error naming the file, not a huge allocation)."""
    meta = SafetensorsFile(path).metadata
    if meta.get("format") != ADAPTER_FORMAT:
        raise ValueError(f"{path} is not an icml_jax adapter file (format {meta.get('format')!r})")
    return meta


def load_adapters(model: nnx.Module, directory: str | Path) -> nnx.Module:
    """Loads saved adapters into a model that already has LoRA applied (same rank and targets); in place.

    Each adapter lands on the sharding its current value has, so a sharded model stays sharded.
    """
    path = _adapter_path(directory)
    saved = lora.LoraConfig.from_config(json.loads(_read_metadata(path)["lora_config"]))
    ours: lora.LoraConfig | None = getattr(model, "lora_config", None)
    if ours is None or not _adapter_items(model):
        raise ValueError(f"load_adapters: the model has no LoRA adapters; apply_lora(model, "
                         f"read_adapter_config({str(path.parent)!r})) first")
    if (ours.rank, ours.alpha) != (saved.rank, saved.alpha):
        raise ValueError(f"{path}: adapters have rank {saved.rank}, alpha {saved.alpha}; the model has rank "
                         f"{ours.rank}, alpha {ours.alpha}")
    file = SafetensorsFile(path)
    names = set(file.keys())
    items = _adapter_items(model)
    missing = [n for n, _, _ in items if n not in names]
    extra = sorted(names - {n for n, _, _ in items})
    if missing or extra:
        raise ValueError(f"{path}: adapters do not match the model: missing {missing[:6]}, unexpected {extra[:6]}")
    arrays: dict[int, list[np.ndarray]] = {}
    for name, var, layer in items:
        current = var.get_raw_value()
        expected = tuple(current.shape if layer is None else current.shape[1:])
        array = file.get(name)
        if tuple(array.shape) != expected:
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(array.shape)}, the model expects {expected}")
        arrays.setdefault(id(var), []).append(np.asarray(array, dtype=current.dtype))
    leaves = []
    for _, var, layer in items:
        if layer is None or layer == 0:  # one value per variable: a stacked adapter's layers in order
            pieces = arrays[id(var)]
            array = pieces[0] if layer is None else np.stack(pieces)
            leaves.append((var, parallel.place(array, var.get_raw_value().sharding)))
    for var, value in leaves:
        var.set_value(value)
    return model
