"""Backbones: one NNX decoder for Llama-3.x / Qwen3 / Gemma3, HF loading, tokenizers and generation; a BERT sentence
encoder (`encoder`)."""

from icml_jax.models.config import ModelConfig, ModelConfigError, RopeConfig
from icml_jax.models.decoder import Decoder, KVCache, Output, init_cache
from icml_jax.models.encoder import SentenceEncoder, load_sentence_encoder
from icml_jax.models.loading import abstract_model, from_pretrained
from icml_jax.models.presets import PRESETS, preset
from icml_jax.models.safetensors_io import CheckpointError, CheckpointNotFoundError
from icml_jax.models.sampler import GenerationResult, SamplingConfig, generate, generate_tokens
from icml_jax.models.tokenizer import apply_chat_template, load_tokenizer

__all__ = [
    "PRESETS",
    "CheckpointError",
    "CheckpointNotFoundError",
    "Decoder",
    "GenerationResult",
    "KVCache",
    "ModelConfig",
    "ModelConfigError",
    "Output",
    "RopeConfig",
    "SamplingConfig",
    "SentenceEncoder",
    "abstract_model",
    "apply_chat_template",
    "from_pretrained",
    "generate",
    "generate_tokens",
    "init_cache",
    "load_sentence_encoder",
    "load_tokenizer",
    "preset",
]
