"""Where each of our parameters lives in a Hugging Face checkpoint, and how its layout differs.

One table serves loading (HF -> ours) and export (ours -> HF), so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from icml_jax.models import families
from icml_jax.models.config import ModelConfig

Path = tuple  # an nnx state path such as ("layers", "attn", "q")
STACKED = "layers"  # paths under it hold all layers on a leading axis; their HF names have a "{layer}" field

# Layout kinds: how a HF tensor maps onto ours.
VECTOR = "vector"  # same array (norm scales, embeddings)
LINEAR = "linear"  # torch [out, in] -> ours [in, out]
IN_HEADS = "in_heads"  # torch [heads*head_dim, embed] -> ours [embed, heads, head_dim]
OUT_HEADS = "out_heads"  # torch [embed, heads*head_dim] -> ours [heads, head_dim, embed]
BIAS_HEADS = "bias_heads"  # torch [heads*head_dim] -> ours [heads, head_dim]

# Prefixes under which the decoder's tensors are stored, tried in order (then those of the families' wrapper
# checkpoints, e.g. Gemma3's multimodal text tower), each with the name of its untied head.
BODY_PREFIXES = ("model.", "") + tuple(p for f in families.REGISTRY for p in f.body_prefixes)
HEAD_NAMES = {"model.": "lm_head.weight", "": "lm_head.weight",
              **{p: head for f in families.REGISTRY for p, head in f.body_prefixes.items()}}
# Tensors a text-only decoder legitimately leaves unread: the families' other towers (Gemma3's vision tower and
# projector), old rotary buffers.
IGNORED_PREFIXES = tuple(p for f in families.REGISTRY for p in f.ignored_prefixes)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

_BLOCK_NORMS = {"input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm"}
# The two extra norms of a block with `sandwich_norm` (our name -> HF name), as the families that have them call them.
SANDWICH_NORMS = {ours: hf for f in families.REGISTRY for ours, hf in f.sandwich_norms.items()}


def layout(config: ModelConfig) -> dict[Path, tuple[str, str]]:
    """Maps each parameter path to (HF name without the body prefix, layout kind); the head uses '<lm_head>'.

    A stacked block parameter (path under STACKED, leading axis = layers) maps to a name with a "{layer}" field:
    layer i of it is the HF tensor `name.format(layer=i)` (see `layer_names`)."""
    c = config
    table: dict[Path, tuple[str, str]] = {
        ("embedding",): ("embed_tokens.weight", VECTOR),
        ("final_norm", "scale"): ("norm.weight", VECTOR),
    }
    if not c.tie_embeddings:
        table[("lm_head",)] = ("<lm_head>", LINEAR)
    p, s = "layers.{layer}.", STACKED
    norms = {**_BLOCK_NORMS, **(SANDWICH_NORMS if c.sandwich_norm else {})}
    for ours, hf_name in norms.items():
        table[(s, ours, "scale")] = (p + hf_name + ".weight", VECTOR)
    for proj in "qkv":
        table[(s, "attn", proj)] = (p + f"self_attn.{proj}_proj.weight", IN_HEADS)
    table[(s, "attn", "o")] = (p + "self_attn.o_proj.weight", OUT_HEADS)
    if c.qkv_bias:
        for proj in "qkv":
            table[(s, "attn", f"{proj}_bias")] = (p + f"self_attn.{proj}_proj.bias", BIAS_HEADS)
    if c.o_bias:
        table[(s, "attn", "o_bias")] = (p + "self_attn.o_proj.bias", VECTOR)
    if c.qk_norm:
        table[(s, "attn", "q_norm", "scale")] = (p + "self_attn.q_norm.weight", VECTOR)
        table[(s, "attn", "k_norm", "scale")] = (p + "self_attn.k_norm.weight", VECTOR)
    for proj in ("gate", "up", "down"):
        table[(s, "mlp", proj)] = (p + f"mlp.{proj}_proj.weight", LINEAR)
    return table


def is_stacked(path: Path) -> bool:
    """Whether the parameter at `path` holds every layer on its leading axis."""
    return bool(path) and path[0] == STACKED


def layer_names(hf_suffix: str, num_layers: int) -> list[str]:
    """The per-layer HF names of a stacked parameter's name template, layer 0 first."""
    return [hf_suffix.format(layer=i) for i in range(num_layers)]


def find_prefix(names: Iterable[str]) -> str:
    """The body prefix of a checkpoint, found from where its token embedding is stored."""
    names = set(names)
    for prefix in BODY_PREFIXES:
        if prefix + "embed_tokens.weight" in names:
            return prefix
    raise KeyError("no token embedding found (looked for " + ", ".join(p + "embed_tokens.weight" for p in BODY_PREFIXES) + ")")


def full_name(hf_suffix: str, prefix: str) -> str:
    """The complete HF tensor name."""
    return HEAD_NAMES[prefix] if hf_suffix == "<lm_head>" else prefix + hf_suffix


def is_ignored(name: str) -> bool:
    """Whether a checkpoint tensor is expected to be unused by the text decoder."""
    return name.startswith(IGNORED_PREFIXES) or name.endswith(IGNORED_SUFFIXES)


def hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a HF tensor must have to become our parameter of `shape`."""
    if kind == VECTOR:
        return tuple(shape)
    if kind == LINEAR:
        return tuple(shape[::-1])
    if kind == IN_HEADS:
        return (shape[1] * shape[2], shape[0])
    if kind == OUT_HEADS:
        return (shape[2], shape[0] * shape[1])
    if kind == BIAS_HEADS:
        return (shape[0] * shape[1],)
    raise ValueError(f"unknown layout kind {kind!r}")


def hf_to_ours(kind: str, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Rearranges a HF tensor into our layout with target `shape`; raises ValueError if it does not fit."""
    expected = hf_shape(kind, shape)
    if tuple(array.shape) != expected:
        raise ValueError(f"has shape {tuple(array.shape)}, expected {expected}")
    if kind in (LINEAR, IN_HEADS, OUT_HEADS):
        array = array.T
    return array.reshape(shape)


def ours_to_hf(kind: str, array: np.ndarray) -> np.ndarray:
    """Our layout back to the HF tensor (inverse of hf_to_ours)."""
    if kind == VECTOR:
        return array
    if kind == LINEAR:
        return array.T
    if kind == IN_HEADS:
        return array.reshape(array.shape[0], -1).T
    if kind == OUT_HEADS:
        return array.reshape(-1, array.shape[-1]).T
    if kind == BIAS_HEADS:
        return array.reshape(-1)
    raise ValueError(f"unknown layout kind {kind!r}")
