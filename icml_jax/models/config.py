"""ModelConfig: one frozen description of a Llama-3.x, Qwen2, Qwen3 or Gemma3 decoder, built from HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3")
_MODEL_TYPES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",  # Gemma3ForConditionalGeneration: we use its text tower
}


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one layer kind: base frequency plus optional `linear` or `llama3` scaling."""

    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def inv_freq(self, head_dim: int) -> np.ndarray:
        """Inverse frequencies [head_dim // 2] in float32, computed the way `transformers` does."""
        exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        inv = (np.float32(1.0) / (np.float32(self.theta) ** exponent)).astype(np.float32)
        if self.kind == "default":
            return inv
        if self.kind == "linear":
            return (inv / np.float32(self.factor)).astype(np.float32)
        if self.kind == "llama3":
            low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
            high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
            wavelen = 2 * math.pi / inv
            scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
            smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            return np.where(medium, smoothed, scaled).astype(np.float32)
        raise ValueError(f"unsupported rope scaling type {self.kind!r} (supported: default, linear, llama3)")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every architectural switch of the decoder; the family sets the defaults, HF config.json the values."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig  # global (full-attention) layers
    rope_local: RopeConfig | None = None  # sliding-window layers (Gemma3); None = same as `rope`
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()  # per layer: "full_attention" | "sliding_attention"
    tie_embeddings: bool = True
    qkv_bias: bool = False  # biases on the q, k and v projections (Llama `attention_bias`, Qwen2 always)
    o_bias: bool = False  # bias on the output projection (Llama `attention_bias`; never Qwen2)
    qk_norm: bool = False
    act: str = "silu"  # silu | gelu_tanh
    norm_plus_one: bool = False  # Gemma: x * (1 + w)
    sandwich_norm: bool = False  # Gemma: four norms per block
    embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (else head_dim ** -0.5)
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    max_position_embeddings: int = 8192
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = set(self.layer_types) - {"full_attention", "sliding_attention"}
        if bad:
            raise ValueError(f"unsupported layer types {sorted(bad)}")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need a sliding_window")

    @property
    def attn_scale(self) -> float:
        """Softmax scale of q.k."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends only within the sliding window."""
        return self.layer_types[layer] == "sliding_attention"

    def rope_for(self, layer: int) -> RopeConfig:
        """Rotary settings of layer `layer` (Gemma3 uses a separate base for its local layers)."""
        if self.is_sliding(layer) and self.rope_local is not None:
            return self.rope_local
        return self.rope

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Builds the config from a Hugging Face `config.json` dict (Llama, Qwen2, Qwen3, Gemma3 text or multimodal)."""
        model_type = hf.get("model_type")
        if model_type not in _MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {sorted(_MODEL_TYPES)} "
                "(Llama-3.x, Qwen2/Qwen2.5, Qwen3, Gemma3)"
            )
        family = _MODEL_TYPES[model_type]
        top = hf
        if model_type == "gemma3":
            if "text_config" not in hf:
                raise ValueError("gemma3 config.json has no text_config")
            hf = {**hf["text_config"]}
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                hf.setdefault(key, top.get(key))
            hf.setdefault("tie_word_embeddings", top.get("tie_word_embeddings", True))
        get = hf.get
        num_heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        head_dim = int(get("head_dim") or hidden // num_heads)
        num_layers = int(hf["num_hidden_layers"])
        eos = get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []))
        common: dict[str, Any] = dict(
            family=family,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            rms_norm_eps=float(get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(get("max_position_embeddings", 8192)),
            bos_token_id=get("bos_token_id"),
            eos_token_ids=eos_ids,
            pad_token_id=get("pad_token_id"),
            qkv_bias=bool(get("attention_bias", False)),
            o_bias=bool(get("attention_bias", False)),
        )
        if family == "gemma3":
            rope_params = get("rope_parameters") or {}
            full = _rope_from_hf(rope_params.get("full_attention") or get("rope_scaling"), get("rope_theta", 1e6))
            local = _rope_from_hf(rope_params.get("sliding_attention"), get("rope_local_base_freq", 1e4))
            pattern = int(get("sliding_window_pattern", 6))
            layer_types = get("layer_types") or [
                "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
            ]
            if get("use_bidirectional_attention"):
                raise ValueError("use_bidirectional_attention=True (embedding Gemma) is not a causal LM")
            act = get("hidden_activation") or get("hidden_act") or "gelu_pytorch_tanh"
            if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
                raise ValueError(f"unsupported Gemma3 activation {act!r}")
            return cls(
                **common,
                rope=full,
                rope_local=local,
                sliding_window=int(get("sliding_window") or 4096),
                layer_types=tuple(layer_types),
                tie_embeddings=bool(get("tie_word_embeddings", True)),
                qk_norm=True,
                act="gelu_tanh",
                norm_plus_one=True,
                sandwich_norm=True,
                embed_scale=True,
                query_pre_attn_scalar=float(get("query_pre_attn_scalar") or head_dim),
                attn_logit_softcap=get("attn_logit_softcapping"),
                final_logit_softcap=get("final_logit_softcapping"),
            )
        act = get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported activation {act!r} for {family}")
        if get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported")
        rope_params = get("rope_parameters") or get("rope_scaling")
        rope = _rope_from_hf(rope_params, get("rope_theta", 10000.0))
        layer_types = None
        window = None
        if family in ("qwen2", "qwen3") and get("use_sliding_window"):
            window = int(hf["sliding_window"])
            layer_types = tuple(get("layer_types") or ())
            if not layer_types:
                raise ValueError(f"{family} config with use_sliding_window but no layer_types")
        if family == "qwen2":  # Qwen2/Qwen2.5: q/k/v biases always, no output bias (the config has no flag)
            common.update(qkv_bias=True, o_bias=False)
        return cls(
            **common,
            rope=rope,
            sliding_window=window,
            layer_types=layer_types or (),
            tie_embeddings=bool(get("tie_word_embeddings", family == "qwen3")),
            qk_norm=family == "qwen3",
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ModelConfig":
        """Reads a `config.json` file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read model config {path}: {e}") from e
        try:
            return cls.from_hf(data)
        except (KeyError, ValueError) as e:
            raise ValueError(f"bad model config {path}: {e}") from e


def _rope_from_hf(params: dict[str, Any] | None, default_theta: float) -> RopeConfig:
    """Reads the `rope_parameters` (transformers 5) or `rope_scaling` (older files) dict."""
    params = dict(params or {})
    kind = params.get("rope_type") or params.get("type") or "default"
    theta = float(params.get("rope_theta", default_theta))
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=float(params["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3)")
