"""The Gemma3 family: its config.json (text-only, or the text tower of the multimodal Gemma3ForConditionalGeneration),
the paper's Gemma3 presets, the GGUF mapping, and the checkpoint names only Gemma3 uses (four norms per block, the
multimodal tensor prefixes, the vision tower left unread)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from icml_jax.models.config_keys import ConfigKeys, ModelConfigError
from icml_jax.models.families.base import Family, Fields, Fix, GGUFSpec, layer_types
from icml_jax.models.gguf_common import BLOCK_NAMES, GGUFSource, GGUFMeta
from icml_jax.models.rope import rope_from_hf

MULTIMODAL = "gemma3"  # Gemma3ForConditionalGeneration: we use its text tower
# Every 6th layer is global: transformers' default, and what llama.cpp hard-codes (GGUF files store no pattern).
SLIDING_WINDOW_PATTERN = 6
LOCAL_ROPE_THETA = 10_000.0  # base frequency of the sliding-window layers' rope (transformers' and llama.cpp's)

_GEMMA3 = dict(model_type="gemma3_text", head_dim=256, query_pre_attn_scalar=256, rms_norm_eps=1e-6,
               rope_theta=1_000_000.0, rope_local_base_freq=LOCAL_ROPE_THETA,
               sliding_window_pattern=SLIDING_WINDOW_PATTERN, hidden_activation="gelu_pytorch_tanh", bos_token_id=2,
               eos_token_id=[1, 106], pad_token_id=0, tie_word_embeddings=True)
PRESETS: dict[str, dict[str, Any]] = {
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
}

# The text tower of Gemma3ForConditionalGeneration as saved by transformers 5 and as published on the Hub: tensor
# prefix -> the head's name; its vision tower and projector are left unread.
BODY_PREFIXES = {"model.language_model.": "lm_head.weight", "language_model.model.": "language_model.lm_head.weight"}
IGNORED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")
SANDWICH_NORMS = {"pre_mlp_norm": "pre_feedforward_layernorm", "post_mlp_norm": "post_feedforward_layernorm"}
GGUF_BLOCK_NAMES = {  # four norms per block
    **BLOCK_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}


def text_keys(top: ConfigKeys) -> ConfigKeys:
    """The keys of the text decoder: a multimodal config's `text_config`, which takes the token ids and the tie
    flag from the outer config where it has none; a text config as it is."""
    if top.hf.get("model_type") != MULTIMODAL:
        return top
    text = top.section("text_config")
    if text is None:
        raise ModelConfigError(f"{top.source}: gemma3 config has no text_config")
    hf = {**text.hf}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        hf.setdefault(key, top.hf.get(key))
    hf.setdefault("tie_word_embeddings", top.hf.get("tie_word_embeddings", True))
    return ConfigKeys(hf, top.source, "text_config.")


def parse(keys: ConfigKeys, common: Fields) -> Fields:
    """Gemma3: sliding-window and global layers with their own ropes, GELU-tanh, (1 + w) sandwich norms, q/k
    norms, scaled embeddings, optional logit soft-capping."""
    get, source = keys.hf.get, keys.source
    rope_params = keys.section("rope_parameters")
    full_params = rope_params.section("full_attention") if rope_params else None
    local_params = rope_params.section("sliding_attention") if rope_params else None
    full = rope_from_hf(full_params or keys.section("rope_scaling"), keys.pos_float("rope_theta", 1e6))
    local = rope_from_hf(local_params, keys.pos_float("rope_local_base_freq", LOCAL_ROPE_THETA))
    pattern = keys.pos_int("sliding_window_pattern", SLIDING_WINDOW_PATTERN)
    types = get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(common["num_layers"])
    ]
    if get("use_bidirectional_attention"):
        raise ModelConfigError(f"{source}: use_bidirectional_attention=True (embedding Gemma) is not a causal LM")
    act = get("hidden_activation") or get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise keys.error("hidden_activation", act, "is not supported (gelu_pytorch_tanh)")
    return dict(
        **common,
        rope=full,
        rope_local=local,
        sliding_window=keys.pos_int("sliding_window", 4096),
        layer_types=layer_types(keys, types),
        tie_embeddings=bool(get("tie_word_embeddings", True)),
        qk_norm=True,
        act="gelu_tanh",
        norm_plus_one=True,
        sandwich_norm=True,
        embed_scale=True,
        query_pre_attn_scalar=keys.pos_float("query_pre_attn_scalar", float(common["head_dim"])),
        attn_logit_softcap=keys.pos_float("attn_logit_softcapping", None),
        final_logit_softcap=keys.pos_float("final_logit_softcapping", None),
    )


def export_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The config.json of the exported causal LM: a multimodal config becomes its text tower (we export the text
    decoder only), filling in the token ids and the tie flag from the outer config; a text config stays."""
    if hf.get("model_type") != MULTIMODAL:
        return hf
    text = dict(hf["text_config"])
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if text.get(key) is None and hf.get(key) is not None:
            text[key] = hf[key]
    text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", True))
    return {**text, "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]}


def gguf_config(src: GGUFSource, config: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """Gemma3's keys: the layer pattern (per-layer flags in newer files, else every 6th layer global), the local
    rope, the q.k scale (not stored: llama.cpp uses hidden/heads for the 27B model, 62 layers, else head_dim)."""
    m: GGUFMeta = src.meta
    layers = config["num_hidden_layers"]
    pattern = m.get("attention.sliding_window_pattern")
    if isinstance(pattern, list):  # newer files: one flag per layer
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        every = int(pattern or SLIDING_WINDOW_PATTERN)
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    local = {"rope_type": "default", "rope_theta": float(m.get("rope.freq_base_swa", LOCAL_ROPE_THETA))}
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    scalar = hidden // heads if layers == 62 else config["head_dim"]
    return {
        **config,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": int(m.need("attention.sliding_window")),
        "layer_types": types,
        "rope_parameters": {"full_attention": rope, "sliding_attention": local},
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": m.get("final_logit_softcapping"),
        "attn_logit_softcapping": m.get("attn_logit_softcapping"),
        "use_bidirectional_attention": False,
    }


def gguf_fix(suffix: str, config: Mapping[str, Any]) -> Fix | None:
    """llama.cpp stores Gemma's norm weights as (1 + w); HF stores w."""
    if not suffix.endswith("norm.weight"):
        return None
    return lambda w: w - np.float32(1.0)


FAMILY = Family(
    name="gemma3",
    label="Gemma3",
    model_types=("gemma3_text", MULTIMODAL),
    parse=parse,
    text_keys=text_keys,
    export_config=export_config,
    presets=PRESETS,
    gguf=GGUFSpec(arch="gemma3", model_type="gemma3_text", hf_class="Gemma3ForCausalLM", config=gguf_config,
                  block_names=GGUF_BLOCK_NAMES, fix=gguf_fix),
    body_prefixes=BODY_PREFIXES,
    ignored_prefixes=IGNORED_PREFIXES,
    sandwich_norms=SANDWICH_NORMS,
)
