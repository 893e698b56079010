"""A BERT sentence encoder in Flax NNX: all-MiniLM-L6-v2 and other sentence-transformers BERT directories.

    from icml_jax.models import encoder, fetch
    embed = encoder.load_sentence_encoder(fetch.model_dir("all-minilm-l6-v2"))
    vectors = embed(["I adopted a dog.", "We went to Paris."])   # [2, 384] float32, unit length

`BertEncoder` is the BERT body (`BertModel` without its pooler): word + absolute position + token type
embeddings and a LayerNorm, then post-LN layers (attention with biases, residual, LayerNorm; GELU feed-forward
with the exact erf GELU, residual, LayerNorm). Parameters keep heads explicit and carry logical axis names, and
the layers are stored stacked and run under one `lax.scan`, as in `decoder.Decoder`. `load_bert` reads a local
HF directory (`config.json` + safetensors) through `safetensors_io.Checkpoint` and `hf_layout`'s layout kinds;
a missing, unexpected or mis-shaped tensor is a CheckpointError naming the tensor and its file.

`SentenceEncoder` adds what sentence-transformers does on top, read from the directory: the pooling of
`1_Pooling/config.json` over real tokens (mean for all-MiniLM-L6-v2), the L2 normalisation when `modules.json`
lists a `Normalize` module, and `max_seq_length` from `sentence_bert_config.json`. Texts are right-padded to
power-of-two lengths and batches to power-of-two rows, so it compiles once per (rows, length) bucket; the model
state is passed to the jitted function, not closed over. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from icml_jax.models import hf_layout
from icml_jax.models.config_keys import ConfigKeys, ModelConfigError
from icml_jax.models.decoder import EMBED, HEAD_DIM, HEADS, MLP_AXIS, VOCAB, stack_blocks
from icml_jax.models.loading import read_params
from icml_jax.models.safetensors_io import Checkpoint, CheckpointError, CheckpointNotFoundError
from icml_jax.models.sampler import bucket
from icml_jax.models.tokenizer import load_tokenizer

Array = jax.Array

ACTIVATIONS = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}  # name -> tanh approximation?
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len")
_ST_POOLING_KEYS = {  # sentence-transformers' Pooling config flags -> our mode (None: not supported here)
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": None,
    "pooling_mode_lasttoken": None,
}
# Checkpoint tensors the encoder body leaves unread: BERT's pooler (sentence embeddings pool themselves), the
# position / token-type id buffers older transformers saved, and the heads of pretraining checkpoints.
_IGNORED = ("pooler.", "embeddings.position_ids", "embeddings.token_type_ids", "cls.")
_PREFIXES = ("", "bert.")  # BertModel saves its body at the root, BertFor* models under "bert."


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder, read from a HF `config.json` of `model_type` "bert"."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        """Checks what the forward pass relies on."""
        if self.hidden_size % self.num_heads:
            raise ModelConfigError(f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                                   f"{self.num_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ModelConfigError(f"hidden_act = {self.hidden_act!r} is not supported (supported: "
                                   f"{', '.join(ACTIVATIONS)})")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, hf: dict[str, Any], *, source: str = "model config") -> "BertConfig":
        """Builds the config from a HF config dict; ModelConfigError names `source`, the key and the value."""
        keys = ConfigKeys(hf, source)
        if hf.get("model_type") != "bert":
            raise keys.error("model_type", hf.get("model_type"), "is not 'bert' (the encoder reads BERT models)")
        position_type = hf.get("position_embedding_type") or "absolute"
        if position_type != "absolute":
            raise keys.error("position_embedding_type", position_type, "is not supported (only 'absolute')")
        act = hf.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise keys.error("hidden_act", act, f"is not supported (supported: {', '.join(ACTIVATIONS)})")
        pad = hf.get("pad_token_id", 0)
        try:
            return cls(vocab_size=keys.pos_int("vocab_size"), hidden_size=keys.pos_int("hidden_size"),
                       num_layers=keys.pos_int("num_hidden_layers"), num_heads=keys.pos_int("num_attention_heads"),
                       intermediate_size=keys.pos_int("intermediate_size"),
                       max_position_embeddings=keys.pos_int("max_position_embeddings", 512),
                       type_vocab_size=keys.pos_int("type_vocab_size", 2),
                       layer_norm_eps=keys.pos_float("layer_norm_eps", 1e-12), hidden_act=act,
                       pad_token_id=int(pad) if isinstance(pad, int) and not isinstance(pad, bool) else 0)
        except ModelConfigError as e:
            message = str(e)
            raise ModelConfigError(message if message.startswith(source) else f"{source}: {message}") from None

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        """Reads a `config.json` file; ModelConfigError names the file (and the key and value at fault)."""
        return cls.from_hf(_read_json(Path(path), ModelConfigError), source=str(path))


@dataclasses.dataclass(frozen=True)
class Pooling:
    """How token states become one sentence vector: a pooling mode over real tokens, then optional L2 norm."""

    mode: str = "mean"
    normalize: bool = False

    def __post_init__(self) -> None:
        """Checks the mode name."""
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode {self.mode!r} is not one of {', '.join(POOLING_MODES)}")

    @classmethod
    def from_st_config(cls, config: dict[str, Any], *, normalize: bool, source: str) -> "Pooling":
        """From sentence-transformers' `1_Pooling/config.json`: exactly one supported pooling flag must be set."""
        chosen = [key for key in _ST_POOLING_KEYS if config.get(key) is True]
        if len(chosen) != 1 or _ST_POOLING_KEYS[chosen[0]] is None:
            what = ", ".join(chosen) if chosen else "no pooling_mode_* flag"
            raise ModelConfigError(f"{source}: {what} set; the encoder supports exactly one of "
                                   + ", ".join(k for k, v in _ST_POOLING_KEYS.items() if v is not None))
        return cls(mode=_ST_POOLING_KEYS[chosen[0]], normalize=normalize)


@dataclasses.dataclass(frozen=True)
class SentenceSettings:
    """What a sentence-transformers directory says beyond the BERT body: pooling, normalisation, input length."""

    pooling: Pooling
    max_seq_length: int | None = None  # tokens read per text, specials included (None: the position table)
    do_lower_case: bool = False
    embedding_dim: int | None = None  # the pooling config's word_embedding_dimension, checked against the model

    @classmethod
    def from_directory(cls, path: str | Path) -> "SentenceSettings":
        """Reads `modules.json` and the configs it points to; a plain HF directory means mean pooling, no norm.

        Only a Transformer module at the directory's root, one Pooling and an optional Normalize are
        understood; any other module (Dense, ...) is a ModelConfigError naming modules.json, since skipping it
        would give different vectors than sentence-transformers does.
        """
        path = Path(path)
        modules_file = path / "modules.json"
        pooling_dir: Path | None = path / "1_Pooling" if (path / "1_Pooling" / "config.json").is_file() else None
        normalize = False
        if modules_file.is_file():
            modules = _read_json(modules_file, ModelConfigError)
            if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
                raise ModelConfigError(f"{modules_file}: not a list of module objects")
            pooling_dir = None
            for m in modules:
                kind = str(m.get("type", "")).rsplit(".", 1)[-1]
                where = f"{modules_file}: module {m.get('name', m.get('idx'))!r} ({m.get('type')!r})"
                if kind == "Transformer":
                    if m.get("path", "") not in ("", "."):
                        raise ModelConfigError(f"{where}: the transformer must sit at the directory's root")
                elif kind == "Pooling":
                    pooling_dir = path / str(m.get("path", ""))
                elif kind == "Normalize":
                    normalize = True
                else:
                    raise ModelConfigError(f"{where} is not supported (only Transformer, Pooling, Normalize)")
        pooling, dim = Pooling(normalize=normalize), None
        if pooling_dir is not None:
            config_file = pooling_dir / "config.json"
            config = _read_json(config_file, ModelConfigError)
            if not isinstance(config, dict):
                raise ModelConfigError(f"{config_file}: not a JSON object")
            pooling = Pooling.from_st_config(config, normalize=normalize, source=str(config_file))
            dim = config.get("word_embedding_dimension")
        max_len, lower = None, False
        st_file = path / "sentence_bert_config.json"
        if st_file.is_file():
            st = _read_json(st_file, ModelConfigError)
            if not isinstance(st, dict):
                raise ModelConfigError(f"{st_file}: not a JSON object")
            keys = ConfigKeys(st, str(st_file))
            max_len = keys.pos_int("max_seq_length", None)
            lower = bool(st.get("do_lower_case", False))
        return cls(pooling=pooling, max_seq_length=max_len, do_lower_case=lower,
                   embedding_dim=int(dim) if isinstance(dim, int) else None)


def _read_json(path: Path, error: type[Exception]) -> Any:
    """A JSON file's content; `error` names the file when it is missing, unreadable or not JSON."""
    try:
        return json.loads(path.read_bytes())
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from e
    except ValueError as e:
        raise error(f"{path} is not JSON ({e})") from None


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], dtype, scale: float) -> nnx.Param:
    """A normally initialised parameter tagged with its logical axes."""
    return nnx.Param((scale * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype), logical_axes=axes)


def _zeros(shape: tuple[int, ...], axes: tuple[str | None, ...], dtype) -> nnx.Param:
    """A zero parameter (biases) tagged with its logical axes."""
    return nnx.Param(jnp.zeros(shape, dtype), logical_axes=axes)


class LayerNorm(nnx.Module):
    """LayerNorm with scale and bias, computed in float32 (BERT's eps is 1e-12)."""

    def __init__(self, dim: int, eps: float, dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((dim,), dtype), logical_axes=(EMBED,))
        self.bias = _zeros((dim,), (EMBED,), dtype)

    def __call__(self, x: Array) -> Array:
        """Normalises the last axis."""
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (normed * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)).astype(x.dtype)


class BertLayer(nnx.Module):
    """One post-LN BERT layer: x = LN(x + attn(x)); x = LN(x + down(gelu(up(x))))."""

    def __init__(self, config: BertConfig, dtype, rngs: nnx.Rngs):
        c = config
        e, h, d, m = c.hidden_size, c.num_heads, c.head_dim, c.intermediate_size
        self.approximate = ACTIVATIONS[c.hidden_act]
        for name in ("q", "k", "v"):
            setattr(self, name, _param(rngs, (e, h, d), (EMBED, HEADS, HEAD_DIM), dtype, e**-0.5))
            setattr(self, f"{name}_bias", _zeros((h, d), (HEADS, HEAD_DIM), dtype))
        self.o = _param(rngs, (h, d, e), (HEADS, HEAD_DIM, EMBED), dtype, e**-0.5)
        self.o_bias = _zeros((e,), (EMBED,), dtype)
        self.attn_norm = LayerNorm(e, c.layer_norm_eps, dtype)
        self.up = _param(rngs, (e, m), (EMBED, MLP_AXIS), dtype, e**-0.5)
        self.up_bias = _zeros((m,), (MLP_AXIS,), dtype)
        self.down = _param(rngs, (m, e), (MLP_AXIS, EMBED), dtype, m**-0.5)
        self.down_bias = _zeros((e,), (EMBED,), dtype)
        self.mlp_norm = LayerNorm(e, c.layer_norm_eps, dtype)

    def __call__(self, x: Array, mask: Array) -> Array:
        """x [B, T, E]; mask [B, T] bool marks the real tokens every query may attend to."""
        q = jnp.einsum("bte,ehd->bthd", x, self.q[...]) + self.q_bias[...]
        k = jnp.einsum("bte,ehd->bthd", x, self.k[...]) + self.k_bias[...]
        v = jnp.einsum("bte,ehd->bthd", x, self.v[...]) + self.v_bias[...]
        scores = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)
        scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        ctx = jnp.einsum("bhts,bshd->bthd", probs, v)
        x = self.attn_norm(x + jnp.einsum("bthd,hde->bte", ctx, self.o[...]) + self.o_bias[...])
        h = jax.nn.gelu(jnp.einsum("bte,em->btm", x, self.up[...]) + self.up_bias[...], approximate=self.approximate)
        return self.mlp_norm(x + jnp.einsum("btm,me->bte", h, self.down[...]) + self.down_bias[...])


class BertEncoder(nnx.Module):
    """The BERT body: embeddings (word + absolute position + token type, LayerNorm), then the stacked layers."""

    def __init__(self, config: BertConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.word_embeddings = _param(rngs, (c.vocab_size, c.hidden_size), (VOCAB, EMBED), dtype, 0.02)
        self.position_embeddings = _param(rngs, (c.max_position_embeddings, c.hidden_size), (None, EMBED), dtype,
                                          0.02)
        self.token_type_embeddings = _param(rngs, (c.type_vocab_size, c.hidden_size), (None, EMBED), dtype, 0.02)
        self.embed_norm = LayerNorm(c.hidden_size, c.layer_norm_eps, dtype)
        self.layers = stack_blocks([BertLayer(c, dtype, rngs) for _ in range(c.num_layers)])

    def __call__(self, tokens: Array, attention_mask: Array | None = None, token_types: Array | None = None) -> Array:
        """Last hidden states [B, T, E] of token ids [B, T] (right-padded: position i is the i-th token).

        attention_mask [B, T] marks real tokens (1) and padding (0); token_types default to 0 (one segment).
        """
        b, t = tokens.shape
        mask = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        types = jnp.zeros((b, t), jnp.int32) if token_types is None else token_types
        x = (jnp.take(self.word_embeddings[...], tokens, axis=0) + self.position_embeddings[...][:t][None]
             + jnp.take(self.token_type_embeddings[...], types, axis=0))
        x = self.embed_norm(x)
        graphdef, params = nnx.split(self.layers)

        def body(x, layer_params):
            return nnx.merge(graphdef, layer_params)(x, mask), None

        x, _ = jax.lax.scan(body, x, params)
        return x


def pool(hidden: Array, mask: Array, pooling: Pooling) -> Array:
    """Sentence vectors [B, E] float32 from hidden states [B, T, E] over the real tokens of `mask` [B, T].

    As sentence-transformers computes them: mean = sum / max(count, 1e-9), mean_sqrt_len = sum / sqrt(count),
    max over real tokens (padding at -1e9), cls = the first token; then x / max(|x|, 1e-12) when normalising.
    """
    h = hidden.astype(jnp.float32)
    real = mask.astype(bool)[..., None]
    count = jnp.maximum(real.sum(1).astype(jnp.float32), 1e-9)
    if pooling.mode == "cls":
        out = h[:, 0]
    elif pooling.mode == "max":
        out = jnp.where(real, h, -1e9).max(1)
    else:
        total = jnp.where(real, h, 0.0).sum(1)
        out = total / (count if pooling.mode == "mean" else jnp.sqrt(count))
    if pooling.normalize:
        out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


def abstract_bert(config: BertConfig, dtype=jnp.float32) -> BertEncoder:
    """The encoder with shapes and dtypes but no memory (nnx.eval_shape)."""
    return nnx.eval_shape(lambda: BertEncoder(config, dtype=dtype, rngs=nnx.Rngs(0)))


def layout(config: BertConfig) -> dict[tuple, tuple[str, str]]:
    """Maps each parameter path to (HF name without the body prefix, `hf_layout` layout kind); layer parameters
    (under "layers", stacked) map to names with a "{layer}" field."""
    v, lin = hf_layout.VECTOR, hf_layout.LINEAR
    table: dict[tuple, tuple[str, str]] = {
        ("word_embeddings",): ("embeddings.word_embeddings.weight", v),
        ("position_embeddings",): ("embeddings.position_embeddings.weight", v),
        ("token_type_embeddings",): ("embeddings.token_type_embeddings.weight", v),
        ("embed_norm", "scale"): ("embeddings.LayerNorm.weight", v),
        ("embed_norm", "bias"): ("embeddings.LayerNorm.bias", v),
    }
    s, p = hf_layout.STACKED, "encoder.layer.{layer}."
    for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value")):
        table[(s, ours)] = (p + f"attention.self.{theirs}.weight", hf_layout.IN_HEADS)
        table[(s, f"{ours}_bias")] = (p + f"attention.self.{theirs}.bias", hf_layout.BIAS_HEADS)
    table[(s, "o")] = (p + "attention.output.dense.weight", hf_layout.OUT_HEADS)
    table[(s, "o_bias")] = (p + "attention.output.dense.bias", v)
    table[(s, "attn_norm", "scale")] = (p + "attention.output.LayerNorm.weight", v)
    table[(s, "attn_norm", "bias")] = (p + "attention.output.LayerNorm.bias", v)
    table[(s, "up")] = (p + "intermediate.dense.weight", lin)
    table[(s, "up_bias")] = (p + "intermediate.dense.bias", v)
    table[(s, "down")] = (p + "output.dense.weight", lin)
    table[(s, "down_bias")] = (p + "output.dense.bias", v)
    table[(s, "mlp_norm", "scale")] = (p + "output.LayerNorm.weight", v)
    table[(s, "mlp_norm", "bias")] = (p + "output.LayerNorm.bias", v)
    return table


def load_bert(path: str | Path, *, dtype=jnp.float32) -> BertEncoder:
    """Loads `config.json` and the safetensors weights of a local HF BERT directory into a BertEncoder.

    A missing directory or file is CheckpointNotFoundError; a damaged config.json ModelConfigError; damaged
    safetensors files and missing, unexpected or mis-shaped tensors CheckpointError naming tensor and file.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointNotFoundError(f"encoder directory {path} does not exist (or is not a folder)")
    config = BertConfig.from_json_file(path / "config.json")
    ckpt = Checkpoint(path)
    names_in = set(ckpt.keys())
    prefix = next((p for p in _PREFIXES if p + "embeddings.word_embeddings.weight" in names_in), None)
    if prefix is None:
        raise CheckpointError(f"{path}: no BERT word embedding found (looked for "
                              + ", ".join(p + "embeddings.word_embeddings.weight" for p in _PREFIXES) + ")")
    graphdef, state = nnx.split(abstract_bert(config, dtype))
    leaves, used = read_params(ckpt, state, layout(config), config.num_layers, lambda n: prefix + n, dtype,
                               where=path)
    unexpected = [n for n in ckpt.keys() if n not in used and not n[len(prefix):].startswith(_IGNORED)
                  and n.startswith(prefix)]
    if unexpected:
        shown = ", ".join(f"{n!r} ({ckpt.file_of(n).name})" for n in unexpected[:8])
        raise CheckpointError(f"{path}: unexpected tensor(s) the BERT encoder does not use: {shown}"
                              + (" ..." if len(unexpected) > 8 else ""))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


class SentenceEncoder:
    """texts -> [N, hidden] float32 sentence embeddings, computed as sentence-transformers computes them."""

    def __init__(self, model: BertEncoder, tokenizer, settings: SentenceSettings, *, max_length: int | None = None,
                 batch_size: int = 32, label: str = "") -> None:
        c = model.config
        limit = min(settings.max_seq_length or c.max_position_embeddings, c.max_position_embeddings)
        self.max_length = limit if max_length is None else min(int(max_length), limit)
        if self.max_length < 2 or batch_size < 1:
            raise ValueError(f"SentenceEncoder: max_length must be >= 2 ([CLS] and [SEP]) and batch_size >= 1, got "
                             f"{self.max_length}, {batch_size}")
        if settings.embedding_dim is not None and settings.embedding_dim != c.hidden_size:
            raise ModelConfigError(f"the pooling config's word_embedding_dimension {settings.embedding_dim} is not "
                                   f"the model's hidden_size {c.hidden_size}")
        self.tokenizer, self.settings, self.batch_size, self.label = tokenizer, settings, batch_size, label
        self.config, self.dim = c, c.hidden_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else c.pad_token_id
        graphdef, self._state = nnx.split(model)
        self.shapes: set[tuple[int, int]] = set()  # (rows, tokens) buckets run so far: one compilation each
        pooling = settings.pooling

        @jax.jit
        def run(state, tokens, mask, token_types):
            hidden = nnx.merge(graphdef, state)(tokens, mask, token_types)
            return hidden, pool(hidden, mask, pooling)

        self._run = run

    def encode_tokens(self, tokens: np.ndarray, mask: np.ndarray,
                      token_types: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(last hidden states [B, T, E], sentence vectors [B, E]) of right-padded token ids, unbucketed."""
        tokens = np.asarray(tokens, np.int32)
        types = np.zeros_like(tokens) if token_types is None else np.asarray(token_types, np.int32)
        self._check_ids(tokens, types)
        hidden, pooled = self._run(self._state, jnp.asarray(tokens), jnp.asarray(np.asarray(mask, bool)),
                                   jnp.asarray(types))
        return np.asarray(hidden, np.float32), np.asarray(pooled, np.float32)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text with [CLS] / [SEP], truncated to `max_length` as sentence-transformers does."""
        if self.settings.do_lower_case:
            texts = [t.lower() for t in texts]
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """[N, hidden] float32 embeddings; batches of `batch_size` rows padded to power-of-two buckets."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        rows = self.tokenize(texts)
        out = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start:start + self.batch_size]
            length = min(bucket(max(len(r) for r in chunk), 16), self.config.max_position_embeddings)
            n = bucket(len(chunk), 1)
            tokens = np.full((n, length), self.pad_id, np.int32)
            mask = np.zeros((n, length), bool)
            for i, r in enumerate(chunk):  # right-padded, as BERT's absolute positions expect
                tokens[i, :len(r)], mask[i, :len(r)] = r, True
            mask[len(chunk):, 0] = True  # filler rows read one pad token (dropped below)
            types = np.zeros_like(tokens)
            self._check_ids(tokens, types)
            self.shapes.add((n, length))
            _, pooled = self._run(self._state, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(types))
            out.append(np.asarray(pooled, np.float32)[: len(chunk)])
        return np.concatenate(out, axis=0)

    def _check_ids(self, tokens: np.ndarray, types: np.ndarray) -> None:
        """Raises ValueError for ids outside the embedding tables (a gather would clamp them silently)."""
        c = self.config
        if tokens.size and (tokens.min() < 0 or tokens.max() >= c.vocab_size):
            raise ValueError(f"token id {int(tokens.max() if tokens.max() >= c.vocab_size else tokens.min())} is "
                             f"outside the encoder's vocabulary of {c.vocab_size}: the tokenizer does not match "
                             f"the model")
        if types.size and (types.min() < 0 or types.max() >= c.type_vocab_size):
            raise ValueError(f"token type id outside [0, {c.type_vocab_size})")
        if tokens.shape[-1] > c.max_position_embeddings:
            raise ValueError(f"{tokens.shape[-1]} tokens exceed the encoder's {c.max_position_embeddings} positions")


def load_sentence_encoder(path: str | Path, *, dtype=jnp.float32, max_length: int | None = None,
                          batch_size: int = 32) -> SentenceEncoder:
    """The sentence encoder of a local directory (BERT body, tokenizer, sentence-transformers settings).

    `max_length` (tokens per text, [CLS] and [SEP] included) defaults to `max_seq_length` of
    sentence_bert_config.json, else the position table's size, and never exceeds either.
    """
    path = Path(path)
    model = load_bert(path, dtype=dtype)
    settings = SentenceSettings.from_directory(path)
    tokenizer = load_tokenizer(path)
    mode = settings.pooling.mode + (" + L2 norm" if settings.pooling.normalize else "")
    return SentenceEncoder(model, tokenizer, settings, max_length=max_length, batch_size=batch_size,
                           label=f"{path.name} (BERT, {mode} pooling)")


def is_bert_directory(path: str | Path) -> bool:
    """Whether `path` holds a HF config.json of model_type "bert" (what `load_sentence_encoder` reads)."""
    try:
        return json.loads((Path(path) / "config.json").read_bytes()).get("model_type") == "bert"
    except (OSError, ValueError, AttributeError):
        return False


__all__ = ["BertConfig", "BertEncoder", "Pooling", "SentenceEncoder", "SentenceSettings", "abstract_bert",
           "is_bert_directory", "layout", "load_bert", "load_sentence_encoder", "pool"]
