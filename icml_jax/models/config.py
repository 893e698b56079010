"""ModelConfig: one frozen description of a Llama-3.x, Qwen2, Qwen3 or Gemma3 decoder, built from HF `config.json`
by its family (`icml_jax.models.families`)."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path
from typing import Any

from icml_jax.models.config_keys import ModelConfigError
from icml_jax.models.families import FAMILIES, hf_fields
from icml_jax.models.rope import RopeConfig

__all__ = ["FAMILIES", "ModelConfig", "ModelConfigError", "RopeConfig"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every architectural switch of the decoder; the family sets the defaults, HF config.json the values."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig  # global (full-attention) layers
    rope_local: RopeConfig | None = None  # sliding-window layers (Gemma3); None = same as `rope`
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # per layer: "full_attention" | "sliding_attention"
    tie_embeddings: bool = True
    qkv_bias: bool = False  # biases on the q, k and v projections (Llama `attention_bias`, Qwen2 always)
    o_bias: bool = False  # bias on the output projection (Llama `attention_bias`; never Qwen2)
    qk_norm: bool = False
    act: str = "silu"  # silu | gelu_tanh
    norm_plus_one: bool = False  # Gemma: x * (1 + w)
    sandwich_norm: bool = False  # Gemma: four norms per block
    embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim ** -0.5)
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    max_position_embeddings: int = 8192
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        """Checks the sizes and switches (ModelConfigError), so no later division or shape meets a zero."""
        if self.family not in FAMILIES:
            raise ModelConfigError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ModelConfigError(f"{name} = {value!r} must be a positive integer")
        if not (isinstance(self.rms_norm_eps, numbers.Real) and math.isfinite(self.rms_norm_eps)
                and self.rms_norm_eps > 0):
            raise ModelConfigError(f"rms_norm_eps = {self.rms_norm_eps!r} must be a finite positive number")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ModelConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = set(self.layer_types) - {"full_attention", "sliding_attention"}
        if bad:
            raise ModelConfigError(f"unsupported layer types {sorted(bad)}")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ModelConfigError("sliding_attention layers need a sliding_window")

    @property
    def attn_scale(self) -> float:
        """Softmax scale of q.k."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends only within the sliding window."""
        return self.layer_types[layer] == "sliding_attention"

    def rope_for(self, layer: int) -> RopeConfig:
        """Rotary settings of layer `layer` (Gemma3 uses a separate base for its local layers)."""
        if self.is_sliding(layer) and self.rope_local is not None:
            return self.rope_local
        return self.rope

    @classmethod
    def from_hf(cls, hf: dict[str, Any], *, source: str = "model config") -> "ModelConfig":
        """Builds the config from a Hugging Face `config.json` dict (Llama, Qwen2, Qwen3, Gemma3 text or multimodal).

        The family registered for its `model_type` reads it; every field the port uses is checked first, and
        ModelConfigError names `source` (the file), the key and value.
        """
        return _build(cls, source, **hf_fields(hf, source))

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ModelConfig":
        """Reads a `config.json` file; ModelConfigError names the file (and the key and value at fault)."""
        path = Path(path)
        try:
            data = json.loads(path.read_bytes())
        except OSError as e:
            raise ModelConfigError(f"cannot read model config {path}: {e.strerror or e}") from e
        except ValueError as e:  # not JSON, or not UTF-8/16/32 text
            raise ModelConfigError(f"{path} is not a JSON config ({e}); get the checkpoint's original config.json") \
                from None
        return cls.from_hf(data, source=str(path))


def _build(cls: type[ModelConfig], source: str, **fields: Any) -> ModelConfig:
    """`cls(**fields)`, with the source file put in front of a ModelConfigError from its own checks."""
    try:
        return cls(**fields)
    except ModelConfigError as e:
        raise ModelConfigError(f"{source}: {e}") from None
