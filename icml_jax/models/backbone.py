"""The run config's `model` block, typed: which backbone the policies run on (a local Hugging Face checkpoint or the
tiny random decoder) and in which dtype. Each default is written once, here (configs/base.py builds its block from
`BackboneConfig().to_dict()`); `BackboneConfig.from_config` is the one place that reads the ml_collections block.

Named BackboneConfig, not ModelConfig: `icml_jax.models.config.ModelConfig` is a decoder's architecture (HF
config.json), which this block's `path` points at."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

PRETRAINED = "pretrained"
TINY = "tiny"
MODEL_KINDS = (PRETRAINED, TINY)
MODEL_DTYPES = ("bfloat16", "float32", "float16")  # what a backbone's weights are cast to (jnp.dtype names)
# None by default: the ml_collections block holds a typed placeholder, so `--config.model.<key>=...` can set it
MODEL_NULLABLE = {"path": str, "trigger_hidden": int}


def _is_int(value: Any) -> bool:
    """An int that is not a bool (True would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class BackboneConfig:
    """- `kind`: pretrained (a local Hugging Face directory at `path`) | tiny (a random decoder: the demo, tests).
    - `path`: the local Hugging Face directory (config.json + safetensors); nothing is downloaded. The policy
      block's planner_model follows it by default (configs/base.py links the two).
    - `dtype`: the backbone's weights' dtype (the policy block's dtype follows it).
    - `hidden` / `layers` / `tiny_lora`: tiny only: the decoder's width, its layers, and whether LoRA adapters are
      added; `trigger_hidden`: tiny only: the Trigger's own backbone of this width (None: shared).
    """

    kind: str = PRETRAINED
    path: str | None = None
    dtype: str = "bfloat16"
    hidden: int = 64
    layers: int = 1
    tiny_lora: bool = False
    trigger_hidden: int | None = None

    def __post_init__(self) -> None:
        """Refuse a value no stage can run with, naming the key (`config.model.<key>`, as the user sets it)."""
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"config.model.kind={self.kind!r} is not 'pretrained' or 'tiny'")
        if self.path is not None and not isinstance(self.path, str):
            raise ValueError(f"config.model.path must be None or a str (a local directory), got {self.path!r}")
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"config.model.dtype={self.dtype!r} is not one of {MODEL_DTYPES}")
        for name in ("hidden", "layers"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"config.model.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.tiny_lora, bool):
            raise ValueError(f"config.model.tiny_lora must be a bool, got {self.tiny_lora!r}")
        width = self.trigger_hidden
        if width is not None and (not _is_int(width) or width < 1):
            raise ValueError(f"config.model.trigger_hidden must be None or an int >= 1, got {width!r}")

    @classmethod
    def from_config(cls, block: ml_collections.ConfigDict | Any | None) -> BackboneConfig:
        """From the `model` block (a ConfigDict, a mapping or None: the defaults); an unknown key is an error.
        (Checked here, not with configlib.known_fields: the models package imports nothing above it.)"""
        values = dict(block.to_dict() if hasattr(block, "to_dict") else block or {})
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields, in their order (the block configs/base.py builds)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def backbone_config(config: ml_collections.ConfigDict | BackboneConfig) -> BackboneConfig:
    """`config` itself when it is a BackboneConfig, else the typed `model` block of `config`, a whole run config:
    the entry of code below the run layer (the baselines) that is handed only the ConfigDict."""
    return config if isinstance(config, BackboneConfig) else BackboneConfig.from_config(config.model)


__all__ = ["MODEL_DTYPES", "MODEL_KINDS", "MODEL_NULLABLE", "PRETRAINED", "TINY", "BackboneConfig",
           "backbone_config"]
