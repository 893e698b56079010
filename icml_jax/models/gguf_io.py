"""GGUF (llama.cpp) checkpoints -> Hugging Face model directories that ours and `transformers` both load.

A GGUF file holds (possibly quantized) weights under llama.cpp's tensor names, the config under llama.cpp's
metadata keys, and the tokenizer as vocabulary arrays. `convert` undoes each of llama.cpp's conversion steps
(`convert_hf_to_gguf.py`): it dequantizes every tensor to float32 with the `gguf` package, un-permutes the
q/k rows of Llama-architecture files (llama.cpp interleaves the two rotary halves of each head), subtracts the
1 that llama.cpp adds to Gemma norm weights, renames tensors and config keys, turns a `rope_freqs` tensor
back into Llama-3 rope scaling, and rebuilds the tokenizer with transformers' GGUF tokenizer converter.
Supported architectures: llama, qwen2, qwen3, gemma3.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import transformers

from icml_jax.models import families
from icml_jax.models.families.base import GGUFSpec
from icml_jax.models.gguf_common import GGUFError, GGUFMeta, GGUFSource
from icml_jax.models.safetensors_io import TensorSpec, write_safetensors

__all__ = ["ARCHITECTURES", "GGUFError", "TensorPlan", "build_tokenizer", "convert", "dequantize", "hf_config",
           "open_gguf", "plan_tensors", "read_metadata", "write_safetensors_streamed"]

ARCHITECTURES = tuple(families.BY_GGUF_ARCH)  # llama.cpp's general.architecture values we convert
# Tokenizer pre-splits llama.cpp knows that transformers' GGUF converter does not: name -> backend pre-tokenizer.
_DIGIT_SPLIT_PRES = ("smollm",)  # `\p{N}` first (digits one by one), then GPT-2's byte-level regex

_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: its HF name and shape, where it comes from, and how it is fixed up."""

    hf_name: str
    shape: tuple[int, ...]
    source: Any  # gguf.ReaderTensor
    fix: Callable[[np.ndarray], np.ndarray] | None = None


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """Opens a GGUF file read-only; a missing or malformed file is a GGUFError naming it."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"GGUF file {path} does not exist")
    try:
        return gguf.GGUFReader(path, "r")
    except (ValueError, OSError, struct.error, IndexError) as e:
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from e


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every metadata value except the tokenizer's vocabulary-sized arrays (those are read by the tokenizer)."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and key.startswith("tokenizer.ggml."):
            out[key + ".count"] = len(field.data)
            continue
        out[key] = field.contents()
    return out


def dequantize(tensor: Any) -> np.ndarray:
    """A GGUF tensor as float32 in PyTorch orientation (GGUF lists dimensions innermost first)."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise GGUFError(f"tensor {tensor.name!r}: cannot dequantize {tensor.tensor_type.name} ({e})") from e
    return np.asarray(values, dtype=np.float32).reshape(shape)


def _round_f32(value: float) -> float:
    """The shortest decimal of a float32 metadata value (9.999999747378752e-06 -> 1e-05), as HF configs write it."""
    return float(str(np.float32(value)))


def hf_config(meta: dict[str, Any], tensors: dict[str, Any], path: Path) -> dict[str, Any]:
    """The transformers config dict of a GGUF file, from its metadata and tensor shapes (the keys every
    architecture shares here, its family's in `GGUFSpec.config`)."""
    arch = meta.get("general.architecture")
    spec = _spec(arch, path)
    m = GGUFMeta(meta, arch, path)
    hidden = int(m.need("embedding_length"))
    heads = int(m.uniform("attention.head_count"))
    kv_heads = int(m.uniform("attention.head_count_kv", heads))
    head_dim = int(m.get("attention.key_length") or m.get("rope.dimension_count") or hidden // heads)
    if "token_embd.weight" not in tensors:
        raise GGUFError(f"{path}: no token_embd.weight tensor")
    vocab = int(tensors["token_embd.weight"].shape[1])
    theta = float(m.get("rope.freq_base", 10000.0))
    scaling = m.get("rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{path}: {arch}.rope.scaling.type {scaling!r} is not supported (none, linear)")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if scaling == "linear":
        rope = {"rope_type": "linear", "rope_theta": theta, "factor": float(m.need("rope.scaling.factor"))}
    eos = meta.get("tokenizer.ggml.eos_token_id")
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "architectures": [spec.hf_class],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(m.uniform("feed_forward_length")),
        "num_hidden_layers": int(m.need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _round_f32(m.need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(m.get("context_length", 8192)),
        "tie_word_embeddings": "output.weight" not in tensors,  # llama.cpp drops a head equal to the embedding
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "dtype": "float32",
    }
    return spec.config(GGUFSource(m, tensors, lambda name: dequantize(tensors[name])), config, rope)


def _spec(arch: Any, path: Path) -> GGUFSpec:
    """The GGUF mapping of architecture `arch`; GGUFError naming the file and the supported ones if none has it."""
    family = families.BY_GGUF_ARCH.get(arch) if arch in ARCHITECTURES else None
    if family is None or family.gguf is None:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    return family.gguf


def plan_tensors(reader: gguf.GGUFReader, config: dict[str, Any], arch: str, path: Path) -> list[TensorPlan]:
    """Maps every GGUF tensor to its HF name and fix-up; an unknown tensor is a GGUFError naming it."""
    spec = _spec(arch, path)
    block_names = spec.block_names
    plans, seen = [], {}
    for tensor in reader.tensors:
        name = tensor.name
        if name == "rope_freqs.weight":  # folded into the config's rope scaling
            continue
        if name in _TOP_NAMES:
            hf_name = _TOP_NAMES[name]
            suffix = name
        else:
            match = _BLOCK_RE.fullmatch(name)
            if not match or match.group(2) not in block_names:
                raise GGUFError(f"{path}: tensor {name!r} has no Hugging Face counterpart for {arch}")
            suffix = match.group(2)
            hf_name = f"model.layers.{match.group(1)}.{block_names[suffix]}"
        if hf_name in seen:
            raise GGUFError(f"{path}: tensors {seen[hf_name]!r} and {name!r} both map to {hf_name!r}")
        seen[hf_name] = name
        fix = spec.fix(suffix, config)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        plans.append(TensorPlan(hf_name, shape, tensor, fix))
    return plans


def write_safetensors_streamed(path: Path, plans: Sequence[TensorPlan], metadata: dict[str, str]) -> None:
    """Writes the planned tensors as float32, dequantizing and fixing one at a time, so memory holds one tensor."""
    def arrays() -> Iterator[np.ndarray]:
        for plan in plans:
            array = dequantize(plan.source)
            if plan.fix is not None:
                array = plan.fix(array)
            if array.shape != plan.shape:
                raise GGUFError(f"tensor {plan.source.name!r}: got shape {array.shape}, expected {plan.shape}")
            yield array

    write_safetensors(path, [TensorSpec(p.hf_name, np.float32, p.shape) for p in plans], arrays(), metadata)


def build_tokenizer(path: Path, chat_template: str | None) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer described by the GGUF metadata, via transformers' GGUF tokenizer converter."""
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    from tokenizers import Regex, pre_tokenizers

    try:
        arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
        backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
    except (KeyError, ValueError) as e:
        raise GGUFError(f"{path}: cannot rebuild the tokenizer ({e})") from e
    if tokenizer_dict.get("pre_tokenizer_type") in _DIGIT_SPLIT_PRES:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    kwargs = {**tokenizer_config, **extra}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def convert(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    chat_template: str | None = None,
    extra_eos_tokens: Sequence[str] = (),
) -> Path:
    """Writes a HF directory (config.json, model.safetensors, tokenizer files, generation_config.json).

    `chat_template` replaces the file's template (or supplies one where the file has none); `extra_eos_tokens`
    (e.g. a chat template's end-of-turn token) join the file's EOS id in config.json and generation_config.json.
    """
    path, out = Path(gguf_path), Path(out_dir)
    reader = open_gguf(path)
    meta = read_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    config = hf_config(meta, tensors, path)
    plans = plan_tensors(reader, config, meta["general.architecture"], path)
    tokenizer = build_tokenizer(path, chat_template)
    vocab = tokenizer.get_vocab()
    eos = [config["eos_token_id"]] if config["eos_token_id"] is not None else []
    eot = meta.get("tokenizer.ggml.eot_token_id")
    for token in extra_eos_tokens:
        if token not in vocab:
            raise GGUFError(f"{path}: end-of-turn token {token!r} is not in the vocabulary")
    for token_id in ([eot] if eot is not None else []) + [vocab[t] for t in extra_eos_tokens]:
        if token_id not in eos:
            eos.append(token_id)
    config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    out.mkdir(parents=True, exist_ok=True)
    hf = transformers.AutoConfig.for_model(**config)
    hf.save_pretrained(out)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(out)
    write_safetensors_streamed(out / "model.safetensors", plans,
                               {"format": "pt", "source": path.name, "converted_by": "icml_jax.models.gguf_io"})
    return out
