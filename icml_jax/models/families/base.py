"""What a decoder family is (`Family`, with its GGUF mapping `GGUFSpec`) and the config.json fields every family
reads the same way; the family modules fill these in, `families/__init__.py` registers them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from icml_jax.models.config_keys import ConfigKeys
from icml_jax.models.gguf_common import GGUFSource

Fields = dict[str, Any]  # keyword arguments of ModelConfig
Fix = Callable[[np.ndarray], np.ndarray]


def _same_keys(keys: ConfigKeys) -> ConfigKeys:
    """The config itself (families without a wrapper config)."""
    return keys


def _same_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The config itself (families whose checkpoints export as they are)."""
    return hf


def _no_fix(suffix: str, config: Mapping[str, Any]) -> Fix | None:
    """No tensor needs fixing up."""
    return None


@dataclasses.dataclass(frozen=True)
class GGUFSpec:
    """How one llama.cpp architecture maps back onto this family's HF checkpoint.

    `config(source, config, rope)` returns the HF config dict with this family's keys added to the generic ones
    (`rope` is the file's global rope dict); `fix(suffix, config)` gives the fix-up of the tensor whose name inside
    its block (or whole name, outside the blocks) is `suffix`, or None."""

    arch: str  # general.architecture
    model_type: str  # the config.json model_type written
    hf_class: str  # its `architectures` entry
    config: Callable[[GGUFSource, dict[str, Any], dict[str, Any]], dict[str, Any]]
    block_names: Mapping[str, str]  # GGUF name inside `blk.N.` -> HF name inside `model.layers.N.`
    fix: Callable[[str, Mapping[str, Any]], Fix | None] = _no_fix


@dataclasses.dataclass(frozen=True)
class Family:
    """One decoder family: the config.json model types it reads and how, its paper presets, its GGUF mapping, and
    the checkpoint names only it uses. The decoder is one for all; the family only sets its switches."""

    name: str  # ModelConfig.family
    label: str  # how error messages name it, e.g. "Qwen2/Qwen2.5"
    model_types: tuple[str, ...]  # config.json model_type values
    parse: Callable[[ConfigKeys, Fields], Fields]  # (text config keys, common_fields) -> every ModelConfig field
    text_keys: Callable[[ConfigKeys], ConfigKeys] = _same_keys  # a wrapper config -> its text decoder's keys
    export_config: Callable[[dict[str, Any]], dict[str, Any]] = _same_config  # base config -> a causal LM's
    presets: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # name -> HF config dict
    gguf: GGUFSpec | None = None
    body_prefixes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # extra tensor prefix -> head name
    ignored_prefixes: tuple[str, ...] = ()  # checkpoint tensors a text decoder leaves unread
    sandwich_norms: Mapping[str, str] = dataclasses.field(default_factory=dict)  # our extra block norm -> HF name


def common_fields(keys: ConfigKeys, family: str) -> Fields:
    """The ModelConfig fields every family reads the same way (sizes, token ids, Llama-style attention_bias),
    checked in the order the errors have always come in."""
    get = keys.hf.get
    num_heads = keys.pos_int("num_attention_heads")
    hidden = keys.pos_int("hidden_size")
    head_dim = keys.pos_int("head_dim", None)
    if head_dim is None:
        if hidden % num_heads:
            raise keys.error("hidden_size", hidden, f"is not divisible by num_attention_heads = {num_heads} "
                             "(and there is no head_dim)")
        head_dim = hidden // num_heads
    num_kv_heads = keys.pos_int("num_key_value_heads", num_heads)
    if num_heads % num_kv_heads:
        raise keys.error("num_key_value_heads", num_kv_heads,
                         f"does not divide num_attention_heads = {num_heads}")
    num_layers = keys.pos_int("num_hidden_layers")
    eos = get("eos_token_id")
    eos_list = eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in eos_list):
        raise keys.error("eos_token_id", eos, "must be a token id or a list of token ids")
    return dict(
        family=family,
        vocab_size=keys.pos_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=keys.pos_int("intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=keys.pos_float("rms_norm_eps", 1e-6),
        max_position_embeddings=keys.pos_int("max_position_embeddings", 8192),
        bos_token_id=get("bos_token_id"),
        eos_token_ids=tuple(eos_list),
        pad_token_id=get("pad_token_id"),
        qkv_bias=bool(get("attention_bias", False)),
        o_bias=bool(get("attention_bias", False)),
    )


def layer_types(keys: ConfigKeys, value: Any) -> tuple[str, ...]:
    """`layer_types` as a tuple of strings (the dataclass checks the names and the count)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise keys.error("layer_types", value, "must be a list of strings")
    return tuple(value)
