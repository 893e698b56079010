"""The Llama-3.x family: its config.json, the paper's Llama presets, and the GGUF mapping (llama.cpp permutes the
q/k rows and may store Llama-3 rope scaling as a `rope_freqs` tensor). Qwen reuses the SiLU parsing here."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from icml_jax.models.config_keys import ConfigKeys, ModelConfigError
from icml_jax.models.families.base import Family, Fields, Fix, GGUFSpec, layer_types
from icml_jax.models.gguf_common import BLOCK_NAMES, GGUFError, GGUFSource
from icml_jax.models.rope import rope_from_hf

_LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
_LLAMA = dict(model_type="llama", vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
              bos_token_id=128000, eos_token_id=[128001, 128008, 128009], hidden_act="silu", rope_theta=500000.0)
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
}


def silu_fields(keys: ConfigKeys, common: Fields, *, tie_default: bool, qk_norm: bool, sliding: bool) -> Fields:
    """The ModelConfig of a Llama-shaped config.json (SiLU MLP without bias, one rope): Llama itself, and Qwen
    with `sliding` (Qwen's optional sliding-window layers) and its own tie and q/k-norm defaults."""
    get, family = keys.hf.get, common["family"]
    act = get("hidden_act", "silu")
    if act != "silu":
        raise keys.error("hidden_act", act, f"is not supported for {family} (silu)")
    if get("mlp_bias"):
        raise ModelConfigError(f"{keys.source}: mlp_bias=True is not supported")
    rope = rope_from_hf(keys.section("rope_parameters") or keys.section("rope_scaling"),
                        keys.pos_float("rope_theta", 10000.0))
    types = None
    window = None
    if sliding and get("use_sliding_window"):
        window = keys.pos_int("sliding_window")
        types = get("layer_types")
        if not types:
            raise ModelConfigError(f"{keys.source}: {family} config with use_sliding_window but no layer_types")
    return dict(
        **common,
        rope=rope,
        sliding_window=window,
        layer_types=layer_types(keys, types or ()),
        tie_embeddings=bool(get("tie_word_embeddings", tie_default)),
        qk_norm=qk_norm,
    )


def parse(keys: ConfigKeys, common: Fields) -> Fields:
    """Llama-3.x: an untied head unless the file says otherwise, q/k/v/o biases from `attention_bias`."""
    return silu_fields(keys, common, tie_default=False, qk_norm=False, sliding=False)


# --- GGUF: undoing llama.cpp's Llama conversion steps -------------------------------------------------------------


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row permutation: per head it interleaves the two rotary halves, HF keeps them split."""
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise GGUFError(f"cannot un-permute {rows} rows over {num_heads} heads")
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def llama3_rope_from_factors(factors: np.ndarray, theta: float, head_dim: int) -> dict[str, Any]:
    """Llama-3 rope scaling parameters that reproduce llama.cpp's `rope_freqs` factors (inverse of its formula).

    Each factor divides one rotary frequency: 1 for short wavelengths, `factor` for long ones, a smooth blend
    between. Only the ratios of (original context, low, high) matter, so low_freq_factor is taken as 1; where
    too few frequencies fall in the blend to pin the rest down, any parameters giving the same factors do.
    """
    factors = np.asarray(factors, np.float64)
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if factors.shape != inv.shape:
        raise GGUFError(f"rope_freqs has {factors.size} factors for head_dim {head_dim} (expected {inv.size})")
    factor = float(factors.max())
    wavelen = 2 * math.pi / inv
    unscaled, scaled = factors <= 1 + 1e-6, factors >= factor * (1 - 1e-6)
    blend = ~unscaled & ~scaled
    # s = (orig/wavelen - low)/(high - low) from 1/f = (1 - s)/factor + s; s is linear in 1/wavelen.
    s = (1.0 / factors[blend] - 1.0 / factor) / (1.0 - 1.0 / factor)
    candidates = [(8192.0, 1.0, 4.0)]  # Meta's published values
    if blend.sum() >= 2:
        slope, intercept = np.polyfit(1.0 / wavelen[blend], s, 1)
        if intercept < 0 < slope:
            span = -1.0 / intercept  # high - low, with low = 1
            candidates.append((float(slope * span), 1.0, float(1.0 + span)))
    else:  # 0 or 1 blend points leave a degree of freedom: try common high/low ratios
        for high in (4.0, 2.0, 8.0, 3.0, 6.0, 1.5, 16.0):
            if blend.any():
                candidates.append((float(wavelen[blend][0] * (1 + s[0] * (high - 1))), 1.0, high))
            elif scaled.any():  # no blend: the boundary just below the shortest scaled wavelength
                candidates.append((float(math.floor(wavelen[scaled].min() - 1e-9)), 1.0, high))
    for orig, low, high in candidates:
        params = dict(rope_type="llama3", rope_theta=theta, factor=factor, low_freq_factor=low,
                      high_freq_factor=high, original_max_position_embeddings=int(round(orig)))
        if np.allclose(_llama3_factors(params, wavelen), factors, rtol=1e-5, atol=1e-6):
            return params
    raise GGUFError("rope_freqs factors do not follow Llama-3 rope scaling; unsupported")


def _llama3_factors(params: dict[str, Any], wavelen: np.ndarray) -> np.ndarray:
    """The per-frequency divisors llama.cpp writes for Llama-3 rope scaling."""
    orig = params["original_max_position_embeddings"]
    low, high, factor = params["low_freq_factor"], params["high_freq_factor"], params["factor"]
    smooth = (orig / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, blended))


def silu_gguf_config(src: GGUFSource, config: dict[str, Any], rope: dict[str, Any], *, rope_freqs: bool
                     ) -> dict[str, Any]:
    """The SiLU keys and the rope of a Llama-shaped GGUF file; a `rope_freqs` tensor (Llama-3 rope scaling, only
    where `rope_freqs`) becomes its llama3 rope parameters."""
    if "rope_freqs.weight" in src.tensors:
        if not rope_freqs or src.meta.get("rope.scaling.type", "none") != "none":
            raise GGUFError(f"{src.path}: rope_freqs.weight is only supported as Llama-3 rope scaling")
        rope = llama3_rope_from_factors(src.read("rope_freqs.weight"), rope["rope_theta"], config["head_dim"])
    return {**config, "hidden_act": "silu", "rope_parameters": rope}


def gguf_config(src: GGUFSource, config: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """Llama's keys: SiLU, rope (Llama-3 scaling from `rope_freqs`), attention_bias from the tensors present."""
    config = silu_gguf_config(src, config, rope, rope_freqs=True)
    bias = "blk.0.attn_q.bias" in src.tensors
    if bias != ("blk.0.attn_output.bias" in src.tensors):
        raise GGUFError(f"{src.path}: llama file with q/k/v biases but no output bias (or the reverse)")
    return {**config, "attention_bias": bias, "mlp_bias": False}


def gguf_fix(suffix: str, config: Mapping[str, Any]) -> Fix | None:
    """llama.cpp's LlamaModel.permute of the q and k rows, undone."""
    if not suffix.startswith(("attn_q.", "attn_k.")):
        return None
    n = config["num_attention_heads"] if suffix.startswith("attn_q.") else config["num_key_value_heads"]
    return lambda w: unpermute_rotary_rows(w, n)


FAMILY = Family(
    name="llama",
    label="Llama-3.x",
    model_types=("llama",),
    parse=parse,
    presets=PRESETS,
    gguf=GGUFSpec(arch="llama", model_type="llama", hf_class="LlamaForCausalLM", config=gguf_config,
                  block_names=BLOCK_NAMES, fix=gguf_fix),
)
