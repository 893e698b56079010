"""ModelConfig: one frozen description of a Llama-3.x, Qwen2, Qwen3 or Gemma3 decoder, built from HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
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


class ModelConfigError(ValueError):
    """A model config (HF `config.json`) that cannot describe a decoder here; names the file, the key and the value."""


_REQUIRED = object()


class ConfigKeys:
    """Checked reads of one HF config dict; errors name the source file, the key (with its path) and the value."""

    def __init__(self, hf: dict[str, Any], source: str, prefix: str = ""):
        self.hf, self.source, self.prefix = hf, source, prefix

    def error(self, key: str, value: Any, what: str) -> ModelConfigError:
        """The error for `key` = `value`, which `what` (e.g. "must be a positive integer")."""
        return ModelConfigError(f"{self.source}: {self.prefix}{key} = {value!r} {what}; fix the file or get the "
                                "checkpoint's original config.json")

    def _value(self, key: str, default: Any) -> Any:
        value = self.hf.get(key)
        if value is None and default is _REQUIRED:
            raise ModelConfigError(f"{self.source}: missing key {self.prefix}{key} (or it is null)")
        return value

    def pos_int(self, key: str, default: Any = _REQUIRED) -> Any:
        """`key` as a positive int (an integral float is accepted); `default` when absent or null."""
        value = self._value(key, default)
        if value is None:
            return default
        integral = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
        if not integral or value < 1:
            raise self.error(key, value, "must be a positive integer")
        return int(value)

    def pos_float(self, key: str, default: Any = _REQUIRED) -> Any:
        """`key` as a finite positive float; `default` when absent or null."""
        value = self._value(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise self.error(key, value, "must be a finite positive number")
        return float(value)

    def section(self, key: str) -> "ConfigKeys | None":
        """The nested dict under `key` (None when absent, null or empty) as its own checked reader."""
        value = self.hf.get(key)
        if value is None or value == {}:
            return None
        if not isinstance(value, dict):
            raise self.error(key, value, "must be an object")
        return ConfigKeys(value, self.source, f"{self.prefix}{key}.")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one layer kind: base frequency plus optional `linear` or `llama3` scaling."""

    theta: float
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        """Rejects a base or scale that is not finite and positive (ModelConfigError), before any power or log."""
        for name in ("theta", "factor", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
                raise ModelConfigError(f"rope {name} = {value!r} must be a finite positive number")

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
        """Checks the sizes and switches (ModelConfigError), so no later division or shape meets a zero."""
        if self.family not in FAMILIES:
            raise ModelConfigError(f"unknown model family {self.family!r}; expected one of {FAMILIES}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ModelConfigError(f"{name} = {value!r} must be a positive integer")
        if not (isinstance(self.rms_norm_eps, numbers.Real) and math.isfinite(self.rms_norm_eps)
                and self.rms_norm_eps > 0):
            raise ModelConfigError(f"rms_norm_eps = {self.rms_norm_eps!r} must be a finite positive number")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ModelConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = set(self.layer_types) - {"full_attention", "sliding_attention"}
        if bad:
            raise ModelConfigError(f"unsupported layer types {sorted(bad)}")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ModelConfigError("sliding_attention layers need a sliding_window")

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
    def from_hf(cls, hf: dict[str, Any], *, source: str = "model config") -> "ModelConfig":
        """Builds the config from a Hugging Face `config.json` dict (Llama, Qwen2, Qwen3, Gemma3 text or multimodal).

        Every field the port uses is checked first; ModelConfigError names `source` (the file), the key and value.
        """
        if not isinstance(hf, dict):
            raise ModelConfigError(f"{source}: expected a JSON object, got {type(hf).__name__}")
        model_type = hf.get("model_type")
        if model_type not in _MODEL_TYPES:
            raise ModelConfigError(
                f"{source}: unsupported model_type {model_type!r}; supported: {sorted(_MODEL_TYPES)} "
                "(Llama-3.x, Qwen2/Qwen2.5, Qwen3, Gemma3)"
            )
        family = _MODEL_TYPES[model_type]
        top = ConfigKeys(hf, source)
        keys = top
        if model_type == "gemma3":
            text = top.section("text_config")
            if text is None:
                raise ModelConfigError(f"{source}: gemma3 config has no text_config")
            hf = {**text.hf}
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                hf.setdefault(key, top.hf.get(key))
            hf.setdefault("tie_word_embeddings", top.hf.get("tie_word_embeddings", True))
            keys = ConfigKeys(hf, source, "text_config.")
        get = hf.get
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
        common: dict[str, Any] = dict(
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
        if family == "gemma3":
            rope_params = keys.section("rope_parameters")
            full_params = rope_params.section("full_attention") if rope_params else None
            local_params = rope_params.section("sliding_attention") if rope_params else None
            full = _rope_from_hf(full_params or keys.section("rope_scaling"), keys.pos_float("rope_theta", 1e6))
            local = _rope_from_hf(local_params, keys.pos_float("rope_local_base_freq", 1e4))
            pattern = keys.pos_int("sliding_window_pattern", 6)
            layer_types = get("layer_types") or [
                "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
            ]
            if get("use_bidirectional_attention"):
                raise ModelConfigError(f"{source}: use_bidirectional_attention=True (embedding Gemma) is not a "
                                       "causal LM")
            act = get("hidden_activation") or get("hidden_act") or "gelu_pytorch_tanh"
            if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
                raise keys.error("hidden_activation", act, "is not supported (gelu_pytorch_tanh)")
            return _build(
                cls, source,
                **common,
                rope=full,
                rope_local=local,
                sliding_window=keys.pos_int("sliding_window", 4096),
                layer_types=_layer_types(keys, layer_types),
                tie_embeddings=bool(get("tie_word_embeddings", True)),
                qk_norm=True,
                act="gelu_tanh",
                norm_plus_one=True,
                sandwich_norm=True,
                embed_scale=True,
                query_pre_attn_scalar=keys.pos_float("query_pre_attn_scalar", float(head_dim)),
                attn_logit_softcap=keys.pos_float("attn_logit_softcapping", None),
                final_logit_softcap=keys.pos_float("final_logit_softcapping", None),
            )
        act = get("hidden_act", "silu")
        if act != "silu":
            raise keys.error("hidden_act", act, f"is not supported for {family} (silu)")
        if get("mlp_bias"):
            raise ModelConfigError(f"{source}: mlp_bias=True is not supported")
        rope = _rope_from_hf(keys.section("rope_parameters") or keys.section("rope_scaling"),
                             keys.pos_float("rope_theta", 10000.0))
        layer_types = None
        window = None
        if family in ("qwen2", "qwen3") and get("use_sliding_window"):
            window = keys.pos_int("sliding_window")
            layer_types = get("layer_types")
            if not layer_types:
                raise ModelConfigError(f"{source}: {family} config with use_sliding_window but no layer_types")
        if family == "qwen2":  # Qwen2/Qwen2.5: q/k/v biases always, no output bias (the config has no flag)
            common.update(qkv_bias=True, o_bias=False)
        return _build(
            cls, source,
            **common,
            rope=rope,
            sliding_window=window,
            layer_types=_layer_types(keys, layer_types or ()),
            tie_embeddings=bool(get("tie_word_embeddings", family == "qwen3")),
            qk_norm=family == "qwen3",
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ModelConfig":
        """Reads a `config.json` file; ModelConfigError names the file (and the key and value at fault)."""
        path = Path(path)
        try:
            data = json.loads(path.read_bytes())
        except OSError as e:
            raise ModelConfigError(f"cannot read model config {path}: {e.strerror or e}") from e
        except ValueError as e:  # not JSON, or not UTF-8/16/32 text
            raise ModelConfigError(f"{path} is not a JSON config ({e}); get the checkpoint's original config.json") \
                from None
        return cls.from_hf(data, source=str(path))


def _build(cls: type[ModelConfig], source: str, **fields: Any) -> ModelConfig:
    """`cls(**fields)`, with the source file put in front of a ModelConfigError from its own checks."""
    try:
        return cls(**fields)
    except ModelConfigError as e:
        raise ModelConfigError(f"{source}: {e}") from None


def _layer_types(keys: ConfigKeys, value: Any) -> tuple[str, ...]:
    """`layer_types` as a tuple of strings (the dataclass checks the names and the count)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise keys.error("layer_types", value, "must be a list of strings")
    return tuple(value)


def _rope_from_hf(params: ConfigKeys | None, default_theta: float) -> RopeConfig:
    """Reads the `rope_parameters` (transformers 5) or `rope_scaling` (older files) dict, checking its numbers."""
    if params is None:
        return RopeConfig(theta=default_theta)
    get = params.hf.get
    kind = get("rope_type") or get("type") or "default"
    theta = params.pos_float("rope_theta", default_theta)
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=params.pos_float("factor"))
    if kind == "llama3":
        low, high = params.pos_float("low_freq_factor"), params.pos_float("high_freq_factor")
        if high <= low:
            raise params.error("high_freq_factor", high, f"must exceed low_freq_factor = {low}")
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=params.pos_float("factor"),
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position_embeddings=params.pos_int("original_max_position_embeddings"),
        )
    raise params.error("rope_type", kind, "is not supported (default, linear, llama3)")
