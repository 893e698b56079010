"""The Qwen2/Qwen2.5 and Qwen3 families: Llama-shaped config.json with optional sliding-window layers (Qwen2: q/k/v
biases always; Qwen3: q/k norms, tied head by default), the paper's Qwen3 presets, and their GGUF mappings."""

from __future__ import annotations

from typing import Any

from icml_jax.models.config_keys import ConfigKeys
from icml_jax.models.families.base import Family, Fields, GGUFSpec
from icml_jax.models.families.llama import silu_fields, silu_gguf_config
from icml_jax.models.gguf_common import BLOCK_NAMES, GGUFError, GGUFSource

_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
              max_position_embeddings=40960, bos_token_id=151643, eos_token_id=[151645, 151643], hidden_act="silu")
QWEN3_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-1.7b": {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
}


def parse_qwen2(keys: ConfigKeys, common: Fields) -> Fields:
    """Qwen2/Qwen2.5: q/k/v biases always and no output bias (the config has no flag), an untied head by default."""
    return silu_fields(keys, {**common, "qkv_bias": True, "o_bias": False}, tie_default=False, qk_norm=False,
                       sliding=True)


def parse_qwen3(keys: ConfigKeys, common: Fields) -> Fields:
    """Qwen3: q/k norms, a tied head by default."""
    return silu_fields(keys, common, tie_default=True, qk_norm=True, sliding=True)


def gguf_config_qwen2(src: GGUFSource, config: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """Qwen2's keys: SiLU and rope; no head_dim (Qwen2 derives it from hidden_size / heads, so it must match)."""
    config = silu_gguf_config(src, config, rope, rope_freqs=False)
    head_dim = config.pop("head_dim")
    if head_dim != config["hidden_size"] // config["num_attention_heads"]:
        raise GGUFError(f"{src.path}: qwen2 head_dim {head_dim} != hidden_size / heads")
    return config


def gguf_config_qwen3(src: GGUFSource, config: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """Qwen3's keys: SiLU, rope, attention_bias from the tensors present."""
    config = silu_gguf_config(src, config, rope, rope_freqs=False)
    return {**config, "attention_bias": "blk.0.attn_q.bias" in src.tensors}


QWEN2 = Family(
    name="qwen2",
    label="Qwen2/Qwen2.5",
    model_types=("qwen2",),
    parse=parse_qwen2,
    gguf=GGUFSpec(arch="qwen2", model_type="qwen2", hf_class="Qwen2ForCausalLM", config=gguf_config_qwen2,
                  block_names=BLOCK_NAMES),
)
QWEN3 = Family(
    name="qwen3",
    label="Qwen3",
    model_types=("qwen3",),
    parse=parse_qwen3,
    presets=QWEN3_PRESETS,
    gguf=GGUFSpec(arch="qwen3", model_type="qwen3", hf_class="Qwen3ForCausalLM", config=gguf_config_qwen3,
                  block_names=BLOCK_NAMES),
)
