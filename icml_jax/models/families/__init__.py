"""The decoder families in one table keyed by config.json `model_type` (and by GGUF architecture): Llama-3.x,
Qwen2/Qwen2.5, Qwen3, Gemma3. Each family module holds its config parsing, presets, GGUF mapping and checkpoint
names; this registry is what `ModelConfig.from_hf`, the presets, `gguf_io`, `hf_layout` and export look up."""

from __future__ import annotations

from typing import Any

from icml_jax.models.config_keys import ConfigKeys, ModelConfigError
from icml_jax.models.families import gemma3, llama, qwen
from icml_jax.models.families.base import Family, Fields, GGUFSpec, common_fields

REGISTRY: tuple[Family, ...] = (llama.FAMILY, qwen.QWEN2, qwen.QWEN3, gemma3.FAMILY)
FAMILIES: tuple[str, ...] = tuple(f.name for f in REGISTRY)  # ModelConfig.family values
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in REGISTRY for t in f.model_types}
BY_GGUF_ARCH: dict[str, Family] = {f.gguf.arch: f for f in REGISTRY if f.gguf is not None}
PRESETS: dict[str, dict[str, Any]] = {name: hf for f in REGISTRY for name, hf in f.presets.items()}

__all__ = ["BY_GGUF_ARCH", "BY_MODEL_TYPE", "FAMILIES", "PRESETS", "REGISTRY", "Family", "GGUFSpec", "export_config",
           "for_model_type", "hf_fields"]


def for_model_type(model_type: Any, source: str) -> Family:
    """The family reading config.json files of `model_type`; ModelConfigError naming `source` and the known ones."""
    if model_type not in BY_MODEL_TYPE:
        raise ModelConfigError(
            f"{source}: unsupported model_type {model_type!r}; supported: {sorted(BY_MODEL_TYPE)} "
            f"({', '.join(f.label for f in REGISTRY)})"
        )
    return BY_MODEL_TYPE[model_type]


def hf_fields(hf: Any, source: str) -> Fields:
    """Every ModelConfig field of a Hugging Face config.json dict, read by its family (checked, errors naming
    `source`, the key and the value)."""
    if not isinstance(hf, dict):
        raise ModelConfigError(f"{source}: expected a JSON object, got {type(hf).__name__}")
    family = for_model_type(hf.get("model_type"), source)
    keys = family.text_keys(ConfigKeys(hf, source))
    return family.parse(keys, common_fields(keys, family.name))


def export_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The config.json a causal LM exported from a checkpoint with config `hf` has (its family's say; a model
    type no family knows passes unchanged)."""
    model_type = hf.get("model_type")
    family = BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    return hf if family is None else family.export_config(hf)
