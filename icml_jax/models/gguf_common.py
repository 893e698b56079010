"""What every GGUF (llama.cpp) architecture shares: the error, checked reads of its metadata keys, llama.cpp's
tensor names inside a block, and the view of one file that a family's GGUF mapping reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_NAMES = {  # GGUF name inside `blk.N.` -> HF name inside `model.layers.N.` (Llama, Qwen; Gemma3 adds norms)
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",  # Llama/Qwen: the norm before the MLP
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


class GGUFError(ValueError):
    """A GGUF file that cannot be converted; the message names the file and the tensor or key."""


class GGUFMeta:
    """Typed access to one architecture's metadata keys; a missing required key names the file and key."""

    def __init__(self, meta: dict[str, Any], arch: str, path: Path):
        self.meta, self.arch, self.path = meta, arch, path

    def get(self, key: str, default: Any = None) -> Any:
        """`<arch>.<key>` or `default`."""
        return self.meta.get(f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        """`<arch>.<key>`, which the file must have."""
        full = f"{self.arch}.{key}"
        if full not in self.meta:
            raise GGUFError(f"{self.path}: metadata key {full!r} is missing")
        return self.meta[full]

    def uniform(self, key: str, default: Any = None) -> Any:
        """A per-model value that some files store per layer; differing per-layer values are unsupported."""
        value = self.get(key, default) if default is not None else self.need(key)
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise GGUFError(f"{self.path}: {self.arch}.{key} differs between layers ({value}); unsupported")
            value = value[0]
        return value


@dataclasses.dataclass(frozen=True)
class GGUFSource:
    """One GGUF file as a family's mapping sees it: its metadata, its tensors by name, and a float32 reader."""

    meta: GGUFMeta
    tensors: Mapping[str, Any]  # name -> gguf.ReaderTensor (or anything with a GGUF-ordered `shape`)
    read: Callable[[str], np.ndarray]  # tensor name -> float32 array in PyTorch orientation

    @property
    def path(self) -> Path:
        """The file, for error messages."""
        return self.meta.path
