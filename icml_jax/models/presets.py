"""The paper's backbone sizes as HF-style config dicts, so presets and real checkpoints share one code path."""

from __future__ import annotations

from typing import Any

from icml_jax.models.config import ModelConfig

_LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
_LLAMA = dict(model_type="llama", vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
              bos_token_id=128000, eos_token_id=[128001, 128008, 128009], hidden_act="silu", rope_theta=500000.0)
_GEMMA3 = dict(model_type="gemma3_text", head_dim=256, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
               rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, sliding_window_pattern=6,
               hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0,
               tie_word_embeddings=True)
_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
              max_position_embeddings=40960, bos_token_id=151643, eos_token_id=[151645, 151643], hidden_act="silu")

PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {**_LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "tie_word_embeddings": True, "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}},
    "llama-3.2-3b": {**_LLAMA, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
                     "tie_word_embeddings": True, "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}},
    "llama-3.1-8b": {**_LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                     "tie_word_embeddings": False, "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}},
    "gemma3-1b": {**_GEMMA3, "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
                  "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
                  "sliding_window": 512, "max_position_embeddings": 32768, "rope_scaling": None},
    "gemma3-4b": {**_GEMMA3, "vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240,
                  "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "sliding_window": 1024, "max_position_embeddings": 131072,
                  "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "gemma3-12b": {**_GEMMA3, "vocab_size": 262208, "hidden_size": 3840, "intermediate_size": 15360,
                   "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "sliding_window": 1024, "max_position_embeddings": 131072,
                   "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "qwen3-1.7b": {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
}


def preset(name: str) -> ModelConfig:
    """ModelConfig of a named paper backbone (for abstract shapes, sharding plans and benchmarks)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; available: {sorted(PRESETS)}")
    return ModelConfig.from_hf(PRESETS[name])
