"""Tiny random Hugging Face checkpoints of each family, written with `save_pretrained` (torch CPU)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        **TINY, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=32),
        bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "llama_tied": lambda: transformers.LlamaConfig(
        **TINY, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "llama_bias": lambda: transformers.LlamaConfig(  # attention_bias: q, k, v and o biases
        **TINY, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True, bos_token_id=1, eos_token_id=2,
        pad_token_id=0),
    "qwen2": lambda: transformers.Qwen2Config(  # q/k/v biases, no o bias, untied head
        **TINY, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e6), bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "qwen2_tied_swa": lambda: transformers.Qwen2Config(  # tied, sliding window on the layers from the second on
        **TINY, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=True, sliding_window=5,
        max_window_layers=1, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "qwen3": lambda: transformers.Qwen3Config(
        **TINY, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        pad_token_id=0),
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **TINY, head_dim=16, query_pre_attn_scalar=24, sliding_window=5, sliding_window_pattern=2,
        rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
                         "sliding_attention": dict(rope_type="default", rope_theta=1e4)},
        bos_token_id=1, eos_token_id=2, pad_token_id=0),
}
MODEL_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "llama_tied": transformers.LlamaForCausalLM,
    "llama_bias": transformers.LlamaForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "qwen2_tied_swa": transformers.Qwen2ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
    "gemma3": transformers.Gemma3ForCausalLM,
}


def randomize_(model: torch.nn.Module, seed: int = 0) -> None:
    """Replaces HF's tiny init with weights large enough that a layout or math error shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "norm." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (0.0 if p.mean().abs() < 0.5 else 1.0))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5))


def build(kind: str, directory: Path, seed: int = 0, **save_kwargs) -> torch.nn.Module:
    """Saves a tiny random model of `kind` to `directory` and returns the torch model (eval mode, float32)."""
    torch.manual_seed(seed)
    model = MODEL_CLASSES[kind](CONFIGS[kind]()).float().eval()
    randomize_(model, seed)
    model.save_pretrained(directory, **save_kwargs)
    return model


def build_gemma3_multimodal(directory: Path, seed: int = 0) -> torch.nn.Module:
    """A tiny Gemma3ForConditionalGeneration (text tower + small vision tower) saved to `directory`."""
    torch.manual_seed(seed)
    text = CONFIGS["gemma3"]().to_dict()
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    model = transformers.Gemma3ForConditionalGeneration(config).float().eval()
    randomize_(model, seed)
    model.save_pretrained(directory)
    return model


def torch_logits(model: torch.nn.Module, ids, mask=None, positions=None):
    """float32 logits of the torch model as NumPy."""
    with torch.no_grad():
        kwargs = {}
        if mask is not None:
            kwargs["attention_mask"] = torch.as_tensor(mask, dtype=torch.long)
        if positions is not None:
            kwargs["position_ids"] = torch.as_tensor(positions, dtype=torch.long)
        out = model(input_ids=torch.as_tensor(ids, dtype=torch.long), **kwargs)
    return out.logits.float().numpy()
