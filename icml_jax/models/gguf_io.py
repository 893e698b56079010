"""GGUF (llama.cpp) checkpoints -> Hugging Face model directories that ours and `transformers` both load.

A GGUF file holds (possibly quantized) weights under llama.cpp's tensor names, the config under llama.cpp's
metadata keys, and the tokenizer as vocabulary arrays. `convert` undoes each of llama.cpp's conversion steps
(`convert_hf_to_gguf.py`): it dequantizes every tensor to float32 with the `gguf` package, un-permutes the
q/k rows of Llama-architecture files (llama.cpp interleaves the two rotary halves of each head), subtracts the
1 that llama.cpp adds to Gemma norm weights, renames tensors and config keys, turns a `rope_freqs` tensor
back into Llama-3 rope scaling, and rebuilds the tokenizer with transformers' GGUF tokenizer converter.
Supported architectures: llama, qwen2, qwen3, gemma3.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import transformers

from icml_jax.models.safetensors_io import TensorSpec, write_safetensors

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "gemma3": "Gemma3ForCausalLM"}
# llama.cpp stores no layer pattern for Gemma3 and hard-codes it: every 6th layer is global (llama-model.cpp).
GEMMA3_SLIDING_PATTERN = 6
# ... and the base frequency of the sliding-window layers' rope.
GEMMA3_LOCAL_ROPE_THETA = 10000.0
# Tokenizer pre-splits llama.cpp knows that transformers' GGUF converter does not: name -> backend pre-tokenizer.
_DIGIT_SPLIT_PRES = ("smollm",)  # `\p{N}` first (digits one by one), then GPT-2's byte-level regex

_BLOCK_NAMES = {  # GGUF name inside `blk.N.` -> HF name inside `model.layers.N.`
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",  # Llama/Qwen: the norm before the MLP
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GEMMA3_BLOCK_NAMES = {  # Gemma3's four norms per block
    **_BLOCK_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


class GGUFError(ValueError):
    """A GGUF file that cannot be converted; the message names the file and the tensor or key."""


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: its HF name and shape, where it comes from, and how it is fixed up."""

    hf_name: str
    shape: tuple[int, ...]
    source: Any  # gguf.ReaderTensor
    fix: Callable[[np.ndarray], np.ndarray] | None = None


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """Opens a GGUF file read-only; a missing or malformed file is a GGUFError naming it."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"GGUF file {path} does not exist")
    try:
        return gguf.GGUFReader(path, "r")
    except (ValueError, OSError, struct.error, IndexError) as e:
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from e


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Every metadata value except the tokenizer's vocabulary-sized arrays (those are read by the tokenizer)."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and key.startswith("tokenizer.ggml."):
            out[key + ".count"] = len(field.data)
            continue
        out[key] = field.contents()
    return out


def dequantize(tensor: Any) -> np.ndarray:
    """A GGUF tensor as float32 in PyTorch orientation (GGUF lists dimensions innermost first)."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as e:
        raise GGUFError(f"tensor {tensor.name!r}: cannot dequantize {tensor.tensor_type.name} ({e})") from e
    return np.asarray(values, dtype=np.float32).reshape(shape)


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's q/k row permutation: per head it interleaves the two rotary halves, HF keeps them split."""
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise GGUFError(f"cannot un-permute {rows} rows over {num_heads} heads")
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _round_f32(value: float) -> float:
    """The shortest decimal of a float32 metadata value (9.999999747378752e-06 -> 1e-05), as HF configs write it."""
    return float(str(np.float32(value)))


class _Meta:
    """Typed access to one architecture's metadata keys; a missing required key names the file and key."""

    def __init__(self, meta: dict[str, Any], arch: str, path: Path):
        self.meta, self.arch, self.path = meta, arch, path

    def get(self, key: str, default: Any = None) -> Any:
        """`<arch>.<key>` or `default`."""
        return self.meta.get(f"{self.arch}.{key}", default)

    def need(self, key: str) -> Any:
        """`<arch>.<key>`, which the file must have."""
        full = f"{self.arch}.{key}"
        if full not in self.meta:
            raise GGUFError(f"{self.path}: metadata key {full!r} is missing")
        return self.meta[full]

    def uniform(self, key: str, default: Any = None) -> Any:
        """A per-model value that some files store per layer; differing per-layer values are unsupported."""
        value = self.get(key, default) if default is not None else self.need(key)
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise GGUFError(f"{self.path}: {self.arch}.{key} differs between layers ({value}); unsupported")
            value = value[0]
        return value


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


def hf_config(meta: dict[str, Any], tensors: dict[str, Any], path: Path) -> dict[str, Any]:
    """The transformers config dict of a GGUF file, from its metadata and tensor shapes."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
    m = _Meta(meta, arch, path)
    hidden = int(m.need("embedding_length"))
    heads = int(m.uniform("attention.head_count"))
    kv_heads = int(m.uniform("attention.head_count_kv", heads))
    head_dim = int(m.get("attention.key_length") or m.get("rope.dimension_count") or hidden // heads)
    if "token_embd.weight" not in tensors:
        raise GGUFError(f"{path}: no token_embd.weight tensor")
    vocab = int(tensors["token_embd.weight"].shape[1])
    theta = float(m.get("rope.freq_base", 10000.0))
    scaling = m.get("rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFError(f"{path}: {arch}.rope.scaling.type {scaling!r} is not supported (none, linear)")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if scaling == "linear":
        rope = {"rope_type": "linear", "rope_theta": theta, "factor": float(m.need("rope.scaling.factor"))}
    eos = meta.get("tokenizer.ggml.eos_token_id")
    config: dict[str, Any] = {
        "model_type": _MODEL_TYPES[arch],
        "architectures": [_HF_CLASSES[arch]],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(m.uniform("feed_forward_length")),
        "num_hidden_layers": int(m.need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _round_f32(m.need("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(m.get("context_length", 8192)),
        "tie_word_embeddings": "output.weight" not in tensors,  # llama.cpp drops a head equal to the embedding
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "dtype": "float32",
    }
    if arch in ("llama", "qwen2", "qwen3"):
        if "rope_freqs.weight" in tensors:
            if arch != "llama" or scaling != "none":
                raise GGUFError(f"{path}: rope_freqs.weight is only supported as Llama-3 rope scaling")
            rope = llama3_rope_from_factors(dequantize(tensors["rope_freqs.weight"]), theta, head_dim)
        config.update(hidden_act="silu", rope_parameters=rope)
        if arch == "llama":
            bias = "blk.0.attn_q.bias" in tensors
            if bias != ("blk.0.attn_output.bias" in tensors):
                raise GGUFError(f"{path}: llama file with q/k/v biases but no output bias (or the reverse)")
            config.update(attention_bias=bias, mlp_bias=False)
        if arch == "qwen3":
            config.update(attention_bias="blk.0.attn_q.bias" in tensors)
        if arch == "qwen2":
            config.pop("head_dim")  # Qwen2 derives it from hidden_size / heads
            if head_dim != hidden // heads:
                raise GGUFError(f"{path}: qwen2 head_dim {head_dim} != hidden_size / heads")
    if arch == "gemma3":
        layers = config["num_hidden_layers"]
        pattern = m.get("attention.sliding_window_pattern")
        if isinstance(pattern, list):  # newer files: one flag per layer
            layer_types = ["sliding_attention" if p else "full_attention" for p in pattern]
        else:
            every = int(pattern or GEMMA3_SLIDING_PATTERN)
            layer_types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
        local = {"rope_type": "default", "rope_theta": float(m.get("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_THETA))}
        # The scale of q.k is not stored; llama.cpp uses hidden/heads for the 27B model (62 layers), else head_dim.
        scalar = hidden // heads if layers == 62 else head_dim
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=int(m.need("attention.sliding_window")),
            layer_types=layer_types,
            rope_parameters={"full_attention": rope, "sliding_attention": local},
            query_pre_attn_scalar=scalar,
            final_logit_softcapping=m.get("final_logit_softcapping"),
            attn_logit_softcapping=m.get("attn_logit_softcapping"),
            use_bidirectional_attention=False,
        )
    return config


def plan_tensors(reader: gguf.GGUFReader, config: dict[str, Any], arch: str, path: Path) -> list[TensorPlan]:
    """Maps every GGUF tensor to its HF name and fix-up; an unknown tensor is a GGUFError naming it."""
    block_names = _GEMMA3_BLOCK_NAMES if arch == "gemma3" else _BLOCK_NAMES
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    plans, seen = [], {}
    for tensor in reader.tensors:
        name = tensor.name
        if name == "rope_freqs.weight":  # folded into the config's rope scaling
            continue
        if name in _TOP_NAMES:
            hf_name = _TOP_NAMES[name]
            suffix = name
        else:
            match = _BLOCK_RE.fullmatch(name)
            if not match or match.group(2) not in block_names:
                raise GGUFError(f"{path}: tensor {name!r} has no Hugging Face counterpart for {arch}")
            suffix = match.group(2)
            hf_name = f"model.layers.{match.group(1)}.{block_names[suffix]}"
        if hf_name in seen:
            raise GGUFError(f"{path}: tensors {seen[hf_name]!r} and {name!r} both map to {hf_name!r}")
        seen[hf_name] = name
        fix = None
        if arch == "llama" and suffix.startswith(("attn_q.", "attn_k.")):  # llama.cpp's LlamaModel.permute
            n = heads if suffix.startswith("attn_q.") else kv_heads
            fix = lambda w, n=n: unpermute_rotary_rows(w, n)  # noqa: E731
        elif arch == "gemma3" and name.endswith("norm.weight"):  # llama.cpp stores Gemma's (1 + w) as is
            fix = lambda w: w - np.float32(1.0)  # noqa: E731
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        plans.append(TensorPlan(hf_name, shape, tensor, fix))
    return plans


def write_safetensors_streamed(path: Path, plans: Sequence[TensorPlan], metadata: dict[str, str]) -> None:
    """Writes the planned tensors as float32, dequantizing and fixing one at a time, so memory holds one tensor."""
    def arrays() -> Iterator[np.ndarray]:
        for plan in plans:
            array = dequantize(plan.source)
            if plan.fix is not None:
                array = plan.fix(array)
            if array.shape != plan.shape:
                raise GGUFError(f"tensor {plan.source.name!r}: got shape {array.shape}, expected {plan.shape}")
            yield array

    write_safetensors(path, [TensorSpec(p.hf_name, np.float32, p.shape) for p in plans], arrays(), metadata)


def build_tokenizer(path: Path, chat_template: str | None) -> transformers.PreTrainedTokenizerFast:
    """The tokenizer described by the GGUF metadata, via transformers' GGUF tokenizer converter."""
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    from tokenizers import Regex, pre_tokenizers

    try:
        arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
        backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
    except (KeyError, ValueError) as e:
        raise GGUFError(f"{path}: cannot rebuild the tokenizer ({e})") from e
    if tokenizer_dict.get("pre_tokenizer_type") in _DIGIT_SPLIT_PRES:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    kwargs = {**tokenizer_config, **extra}
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def convert(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    chat_template: str | None = None,
    extra_eos_tokens: Sequence[str] = (),
) -> Path:
    """Writes a HF directory (config.json, model.safetensors, tokenizer files, generation_config.json).

    `chat_template` replaces the file's template (or supplies one where the file has none); `extra_eos_tokens`
    (e.g. a chat template's end-of-turn token) join the file's EOS id in config.json and generation_config.json.
    """
    path, out = Path(gguf_path), Path(out_dir)
    reader = open_gguf(path)
    meta = read_metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    config = hf_config(meta, tensors, path)
    plans = plan_tensors(reader, config, meta["general.architecture"], path)
    tokenizer = build_tokenizer(path, chat_template)
    vocab = tokenizer.get_vocab()
    eos = [config["eos_token_id"]] if config["eos_token_id"] is not None else []
    eot = meta.get("tokenizer.ggml.eot_token_id")
    for token in extra_eos_tokens:
        if token not in vocab:
            raise GGUFError(f"{path}: end-of-turn token {token!r} is not in the vocabulary")
    for token_id in ([eot] if eot is not None else []) + [vocab[t] for t in extra_eos_tokens]:
        if token_id not in eos:
            eos.append(token_id)
    config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    out.mkdir(parents=True, exist_ok=True)
    hf = transformers.AutoConfig.for_model(**config)
    hf.save_pretrained(out)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(out)
    write_safetensors_streamed(out / "model.safetensors", plans,
                               {"format": "pt", "source": path.name, "converted_by": "icml_jax.models.gguf_io"})
    return out
