"""Backbones: one NNX decoder for Llama-3.x / Qwen3 / Gemma3, HF loading, tokenizers and generation."""

from icml_jax.models.config import ModelConfig, RopeConfig
from icml_jax.models.decoder import Decoder, KVCache, Output, init_cache
from icml_jax.models.loading import abstract_model, from_pretrained

__all__ = [
    "Decoder",
    "KVCache",
    "ModelConfig",
    "Output",
    "RopeConfig",
    "abstract_model",
    "from_pretrained",
    "init_cache",
]
