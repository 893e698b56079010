"""LoRA adapters on a frozen decoder, through qwix (`LoraProvider` + `apply_lora_to_model`).

qwix intercepts the `jnp.einsum` calls of the attention and MLP projections and adds `x @ A @ B * alpha/rank`.
On top of qwix this module
- restricts adapters to the configured projections (q, k, v, o, gate, up, down) by weight name;
- gives every adapter `logical_axes` that follow its base weight (A: the input axes + rank, B: rank + the output
  axes; rank replicated), so the sharding rules place adapters next to their weights;
- switches adapter dropout with flax's `model.train()` / `model.eval()` (train: dropout on; eval: off, used for
  rollouts and scoring);
- initialises the adapters directly onto their shards (qwix runs abstractly, under `nnx.eval_shape`), so a
  sharded base model never meets a single-device copy and multi-host runs work;
- stacks the adapters over layers like the decoder's block parameters (leading `layers` axis): qwix discovers
  one layer's adapters on an unstacked copy of the block, the stacked ones are attached to the decoder's block,
  and inside the decoder's layer scan qwix finds each layer's slice by name on the block it runs.

Only `TRAINABLE` variables (adapters, plus `TrainableParam`s such as policy heads) are trained; `FROZEN` selects
the base weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import string
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import qwix
from flax import nnx
from jax.sharding import Mesh
from ml_collections.config_dict import placeholder
from qwix._src.core import einsum_info
from qwix._src.providers import lora as qwix_lora
from qwix._src.providers import ptq
from qwix._src.utils import flax_util

from icml_jax import parallel
from icml_jax.models.decoder import LAYERS, Decoder

PROJECTIONS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
_HF_ALIASES = {f"{p}_proj": p for p in PROJECTIONS}
# Module paths (as qwix writes them, "/"-joined) whose einsums may carry adapters: the stacked block's attention
# and MLP ("layers/attn"); any prefix allowed so a decoder nested in an agent ("backbone/layers/attn") matches too.
MODULE_PATH = r"(.*/)?layers/(attn|mlp)"


class TrainableParam(nnx.Param):
    """A parameter trained together with the adapters (e.g. a policy or value head on the frozen backbone)."""


TRAINABLE = nnx.Any(nnx.LoRAParam, TrainableParam)
FROZEN = nnx.All(nnx.Param, nnx.Not(TRAINABLE))


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Adapter shape and regularisation; defaults are the paper's: rank 8, alpha 16, dropout 0.1, all projections.

    `layers`: train the adapters of the top `layers` layers only (None: every layer, the paper's; 0: none, heads
    only), as PEFT's `layers_to_transform` does for the last layers. Every layer keeps its adapters (the file
    layout does not change); below the top ones they stay at their zero start and no backward pass reaches them.
    """

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.1
    target_modules: tuple[str, ...] = PROJECTIONS
    layers: int | None = None

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout}")
        if self.layers is not None and (isinstance(self.layers, bool) or not isinstance(self.layers, int)
                                        or self.layers < 0):
            raise ValueError(f"LoRA layers must be None (all) or an int >= 0, got {self.layers!r}")
        names = tuple(_HF_ALIASES.get(t, t) for t in self.target_modules)
        bad = [t for t in names if t not in PROJECTIONS]
        if bad or not names:
            raise ValueError(f"unknown LoRA target modules {bad or list(self.target_modules)}; "
                             f"choose from {PROJECTIONS} (or their HF names q_proj, ...)")
        object.__setattr__(self, "target_modules", tuple(dict.fromkeys(names)))
        object.__setattr__(self, "alpha", float(self.alpha))

    @property
    def scale(self) -> float:
        """The factor alpha / rank applied to the adapter product."""
        return self.alpha / self.rank

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | None) -> "LoraConfig":
        """From a config block with fields rank, alpha, dropout, target_modules, layers (missing ones keep
        defaults: adapter files written before `layers` existed read as every layer)."""
        block = dict(block or {})
        unknown = set(block) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown LoRA settings {sorted(unknown)}")
        if "target_modules" in block:
            block["target_modules"] = tuple(block["target_modules"])
        return cls(**block)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (saved next to adapters)."""
        return {**dataclasses.asdict(self), "target_modules": list(self.target_modules)}


def default_config() -> ml_collections.ConfigDict:
    """The `lora` config block with the paper's defaults (`layers` an int placeholder: settable from a flag)."""
    block = ml_collections.ConfigDict(LoraConfig().to_dict())
    block.layers = placeholder(int)
    return block


@contextlib.contextmanager
def _quiet_qwix() -> Iterator[None]:
    """Silences the flax deprecation warnings qwix 0.1.8 triggers on every intercepted op (thousands per trace)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"qwix\.")
        yield


class _Provider(qwix.LoraProvider):
    """qwix's LoRA provider limited to named weights, with eval-mode dropout off and sharding-aware metadata."""

    def __init__(self, lora: LoraConfig):
        self.rule = qwix.LoraRule(module_path=MODULE_PATH, rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout)
        super().__init__([self.rule])
        self.lora = lora
        self.targets = frozenset(lora.target_modules)

    def _target(self, operands: Sequence[Any]) -> str | None:
        """The weight name of the einsum's right operand when it is a targeted projection."""
        if len(operands) != 2:
            return None
        try:
            name = flax_util.find_param(operands[1])
        except ValueError:
            return None
        return name if name in self.targets else None

    def einsum(self, einsum_str: str, *operands: Any, **kwargs: Any) -> jax.Array:
        with _quiet_qwix():
            return self._einsum(einsum_str, *operands, **kwargs)

    def _einsum(self, einsum_str: str, *operands: Any, **kwargs: Any) -> jax.Array:
        # qwix's LoraProvider.einsum, minus its per-call `setattr(module, ...)`: that write breaks when the
        # model runs inside lax control flow (the sampler's while_loop decode) because flax forbids mutating
        # a module from an inner trace level.
        out = ptq.PtqProvider.einsum(self, einsum_str, *operands, **kwargs)
        name = self._target(operands)
        if name is None:
            return out
        rule, _ = self._get_current_rule_and_op_id("einsum", repeated_call=True)
        if not isinstance(rule, qwix.LoraRule):
            return out
        lhs, rhs = operands
        a_shape, b_shape, lora_str, a_t, b_t = qwix_lora._parse_einsum_str_for_lora(
            lhs.shape, rhs.shape, einsum_str, rule.rank)
        lora_a, lora_b = qwix_lora._get_or_create_lora_params(
            name=name, rule=rule, a_shape=a_shape, b_shape=b_shape, a_sharding_transpose=a_t,
            b_sharding_transpose=b_t)
        _annotate(name, einsum_str, operands, self.lora)
        if rule.dropout > 0:
            lhs = nnx.Dropout(rule.dropout, deterministic=False)(lhs, rngs=flax_util.make_rng("dropout"))
        return out + low_rank_product(lora_str, lhs, lora_a[...], lora_b[...], **kwargs) * (rule.alpha / rule.rank)

    def process_model_inputs(self, model, model_args, model_kwargs):
        with _quiet_qwix():
            return super().process_model_inputs(model, model_args, model_kwargs)

    def dot_general(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                    out_sharding=None):
        # Adapters are placed on einsums only (their logical axes are derived from the einsum string).
        return ptq.PtqProvider.dot_general(self, lhs, rhs, dimension_numbers, precision, preferred_element_type,
                                           out_sharding=out_sharding)

    def _get_current_rule_and_op_id(self, op_name, *, only_rule=False, repeated_call=False):
        rule, op_id = super()._get_current_rule_and_op_id(op_name, only_rule=only_rule, repeated_call=repeated_call)
        if isinstance(rule, qwix.LoraRule) and rule.dropout > 0:
            if getattr(flax_util.get_current_module(), "deterministic", True):
                rule = dataclasses.replace(rule, dropout=0.0)
        return rule, op_id


def low_rank_product(lora_str: str, x: jax.Array, a: jax.Array, b: jax.Array, **kwargs: Any) -> jax.Array:
    """x A B for qwix's three-operand adapter einsum ("bte,er,rhd->bthd"): two einsums whose rank axis comes last
    then first, so rows stay rows (the single three-operand einsum made XLA:CPU copy x transposed), with a
    hand-written VJP (`_low_rank_vjp`); extra einsum keywords take the plain two-einsum path."""
    if kwargs:
        x_str, a_str, b_str, out, mid = _low_rank_strings(lora_str)
        xa = jnp.einsum(f"{x_str},{a_str}->{mid}", x, a, **kwargs)
        return jnp.einsum(f"{mid},{b_str}->{out}", xa, b, **kwargs)
    return _low_rank_vjp(lora_str, x, a, b)


def _low_rank_strings(lora_str: str) -> tuple[str, str, str, str, str]:
    """(x, A, B, output, x A) einsum subscripts of a qwix adapter einsum; x A keeps x's free axes, then the rank."""
    inputs, out = lora_str.split("->")
    x_str, a_str, b_str = inputs.split(",")
    return x_str, a_str, b_str, out, "".join(c for c in x_str if c in out) + a_str[-1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _low_rank_vjp(lora_str: str, x: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    """x A B with a backward pass that computes the adapters' weight gradients rank axis first: a contraction over
    the token axis written [rank, features] runs ~11x faster on XLA:CPU than [features, rank] (which it computes
    over a transposed copy of the activations), 1.5x for a whole SmolLM2 LoRA forward + backward."""
    return _low_rank_fwd(lora_str, x, a, b)[0]


def _low_rank_fwd(lora_str: str, x: jax.Array, a: jax.Array, b: jax.Array):
    x_str, a_str, b_str, out, mid = _low_rank_strings(lora_str)
    xa = jnp.einsum(f"{x_str},{a_str}->{mid}", x, a)
    return jnp.einsum(f"{mid},{b_str}->{out}", xa, b), (x, a, b, xa)


def _low_rank_bwd(lora_str: str, residuals, g: jax.Array):
    x, a, b, xa = residuals
    x_str, a_str, b_str, out, mid = _low_rank_strings(lora_str)
    rank = a_str[-1]
    g_mid = jnp.einsum(f"{out},{b_str}->{mid}", g, b)
    dx = jnp.einsum(f"{mid},{a_str}->{x_str}", g_mid, a)
    da = jnp.moveaxis(jnp.einsum(f"{mid},{x_str}->{rank}{a_str[:-1]}", g_mid, x), 0, -1)  # rank first, then A's
    db = jnp.einsum(f"{mid},{out}->{b_str}", xa, g)  # B's subscripts start with the rank
    return dx.astype(x.dtype), da.astype(a.dtype), db.astype(b.dtype)


_low_rank_vjp.defvjp(_low_rank_fwd, _low_rank_bwd)


def _annotate(name: str, einsum_str: str, operands: Sequence[Any], lora: LoraConfig) -> None:
    """Gives freshly created adapters of weight `name` logical axes that follow the weight, and merge info."""
    module = flax_util.get_current_module()
    a, b = getattr(module, name + "_lora_a"), getattr(module, name + "_lora_b")
    if "lora_merge" in b.get_metadata():
        return
    lhs, rhs = operands
    info = einsum_info.EinsumInfo.parse(einsum_str, ndims=(len(lhs.shape), len(rhs.shape)))
    base_axes = getattr(module, name).get_metadata().get("logical_axes") or (None,) * len(info.rhs)
    shared = [i for i, c in enumerate(info.rhs) if c in info.lhs]  # contracting (and batch) dims: qwix's A
    free = [i for i in range(len(info.rhs)) if i not in shared]
    r = sorted(set(string.ascii_letters) - set(info.rhs))[0]
    a_str = "".join(info.rhs[i] for i in shared) + r
    b_str = r + "".join(info.rhs[i] for i in free)
    a.set_metadata("logical_axes", tuple(base_axes[i] for i in shared) + (None,))
    b.set_metadata("logical_axes", (None,) + tuple(base_axes[i] for i in free))
    b.set_metadata("lora_merge", f"{a_str},{b_str}->{info.rhs}")
    b.set_metadata("lora_scale", lora.scale)


class _OneLayer(nnx.Module):
    """One unstacked block at the path `layers`, so qwix discovers (and names) the adapters of one layer."""

    def __init__(self, block: nnx.Module):
        self.layers = block

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
        return self.layers(x, (cos, sin), mask, None, None)[0]


def _layer_adapters(model: Decoder, provider: _Provider) -> list[tuple[tuple, nnx.Variable]]:
    """(path inside the block, abstract variable) of the adapters qwix gives one layer, with their metadata."""
    c = model.config

    def discover(m: Decoder) -> nnx.Module:
        graphdef, params, rest = nnx.split(m.layers, nnx.Param, ...)

        def first_layer(v: nnx.Variable) -> nnx.Variable:
            axes = v.get_metadata().get("logical_axes")
            value = v.get_raw_value()[0]
            return v.replace(value) if axes is None else v.replace(value, logical_axes=tuple(axes)[1:])

        one = jax.tree.map(first_layer, params, is_leaf=lambda x: isinstance(x, nnx.Variable))
        x = jnp.zeros((1, 1, c.hidden_size), m.dtype)
        rope = jnp.zeros((1, 1, c.head_dim), jnp.float32)
        return qwix.apply_lora_to_model(_OneLayer(nnx.merge(graphdef, one, rest)), provider, x, rope, rope,
                                        jnp.ones((1, 1, 1), bool), rngs=nnx.Rngs(0))

    with _quiet_qwix():
        holder = nnx.eval_shape(discover, model)
    return list(nnx.to_flat_state(nnx.state(holder.layers, nnx.LoRAParam)))


def apply_lora(
    model: Decoder,
    lora: LoraConfig | None = None,
    *,
    seed: int = 0,
    mesh: Mesh | None = None,
    rules: parallel.Rules = parallel.DEFAULT_RULES,
) -> Decoder:
    """A copy of the decoder `model` with LoRA adapters on the target projections of every layer.

    A is He-uniform and B zero (qwix's defaults), so the adapted model starts equal to the base. Adapters are
    stacked over layers like the block's weights and created on `mesh` (default: the mesh the base parameters
    live on) following their base weights; base arrays are shared with `model`, not copied. The result is in
    eval mode (dropout off): call `.train()` before an update step and `.eval()` for rollouts and scoring.
    `seed` drives adapter init and dropout. With `lora.layers` set, the layers below the top ones pass no gradient.
    """
    lora = lora or LoraConfig()
    provider = _Provider(lora)
    mesh = mesh or parallel.model_mesh(model)
    per_layer = _layer_adapters(model, provider)
    num_layers = model.config.num_layers
    if lora.layers is not None and lora.layers > num_layers:
        raise ValueError(f"apply_lora: LoRA layers {lora.layers} exceeds the model's {num_layers} layers")

    def build(m):
        out = qwix.apply_lora_to_model(m, provider, jnp.zeros((1, 1), jnp.int32), rngs=nnx.Rngs(0),
                                       skip_nnx_init=True)
        out.__class__ = _adapted_class(type(out), lora)
        for path, var in per_layer:
            owner = out.layers
            for name in path[:-1]:
                owner = getattr(owner, name)
            axes = tuple(var.get_metadata()["logical_axes"])
            setattr(owner, path[-1], var.replace(jnp.zeros((num_layers, *var.shape), var.dtype),
                                                 logical_axes=(LAYERS, *axes)))
        for _, sub in nnx.iter_modules(out):
            sub.deterministic = True
        out.lora_config = lora  # static: read by save_adapters / load_adapters
        out.frozen_layers = 0 if lora.layers is None else num_layers - lora.layers
        return out

    with _quiet_qwix():
        abstract = nnx.eval_shape(build, model)
    graphdef, abstract_state = nnx.split(abstract)
    adapters = [(path, var) for path, var in nnx.to_flat_state(abstract_state) if isinstance(var, nnx.LoRAParam)]
    _check_targets(adapters, lora, model)
    values = _init_adapters(adapters, provider.rule, seed, mesh, rules)
    base = dict(nnx.to_flat_state(nnx.state(model)))
    leaves = []
    for path, var in nnx.to_flat_state(abstract_state):
        if path in values:
            leaves.append((path, var.replace(values[path])))
        elif path in base:
            leaves.append((path, var.replace(base[path].get_raw_value())))
        else:
            raise ValueError(f"apply_lora: no value for {'/'.join(map(str, path))} ({type(var).__name__})")
    out = nnx.merge(graphdef, nnx.from_flat_state(leaves))
    dropout_key = jax.random.fold_in(jax.random.key(seed), 1)
    rngs = nnx.Rngs(dropout=dropout_key)
    if mesh is not None:
        parallel.shard_model(rngs, mesh, rules)
    out.set_attributes(qwix_rngs=rngs, raise_if_not_found=False)
    return out


_ADAPTED_CLASSES: dict[tuple[type, LoraConfig], type] = {}


def _adapted_class(cls: type, lora: LoraConfig) -> type:
    """One qwix-intercepted class per (decoder class, LoRA config): qwix makes a new class on every call, and a new
    class is a new graphdef, so equal models built twice would never share a compiled program. The providers the
    classes close over differ only in qwix's logging counters, so the first class serves every later build."""
    return _ADAPTED_CLASSES.setdefault((cls._unquantized_type, lora), cls)


def _check_targets(adapters: list, lora: LoraConfig, model: nnx.Module) -> None:
    """Every layer must have adapters on every target projection (a silently missed one would not train)."""
    got = {(path[:-1], str(path[-1]).rsplit("_lora_", 1)[0]) for path, _ in adapters}
    missing = []
    for path, _ in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if str(path[-1]) in lora.target_modules and len(path) >= 2 and path[-2] in ("attn", "mlp"):
            if (path[:-1], str(path[-1])) not in got:
                missing.append("/".join(map(str, path)))
    if missing:
        raise ValueError(f"qwix placed no LoRA adapter on {len(missing)} target weight(s): {missing[:6]} "
                         "(the projection must be a jnp.einsum on an nnx.Param of its module)")


def _init_adapters(adapters: list, rule: qwix.LoraRule, seed: int, mesh: Mesh | None,
                   rules: parallel.Rules) -> dict:
    """Initial values of the stacked adapters, each made by a small jitted program whose output lands directly
    on its shards. Layer l of the j-th adapter gets key fold_in(key(seed), l * len(adapters) + j): adapter by
    adapter, layer by layer, the keys a per-layer numbering would give."""
    values = {}
    for j, (path, var) in enumerate(adapters):
        init_fn = rule.lora_a_initializer if str(path[-1]).endswith("_lora_a") else rule.lora_b_initializer
        sharding = None if mesh is None else parallel.variable_sharding(var, mesh, rules)
        values[path] = _jitted_init(init_fn, tuple(var.shape), jnp.dtype(var.dtype), sharding)(seed, j, len(adapters))
    return values


@functools.lru_cache(maxsize=256)
def _jitted_init(init_fn, shape: tuple[int, ...], dtype, sharding) -> Any:
    """Stacked [layers, ...] init: layer l from init_fn(fold_in(key(seed), l * stride + index), shape[1:], dtype),
    compiled once per shape, dtype and placement."""

    def init(seed, index, stride):
        def layer(l):
            return init_fn(jax.random.fold_in(jax.random.key(seed), l * stride + index), shape[1:], dtype)

        return jax.vmap(layer)(jnp.arange(shape[0]))

    return jax.jit(init) if sharding is None else jax.jit(init, out_shardings=sharding)


def adapters_by_weight(model: nnx.Module) -> dict[tuple, dict[str, Any]]:
    """Per adapted weight path: its adapter variables and merge metadata (empty when no LoRA is applied)."""
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
    out = {}
    for path, var in flat.items():
        if str(path[-1]).endswith("_lora_b"):
            base = path[:-1] + (str(path[-1])[: -len("_lora_b")],)
            a = flat[path[:-1] + (str(path[-1])[: -len("_b")] + "_a",)]
            meta = var.get_metadata()
            out[base] = dict(a=a, b=var, merge=meta["lora_merge"], scale=meta["lora_scale"])
    return out


def merged_weight(weight: jax.Array, a: jax.Array, b: jax.Array, merge: str, scale: float) -> jax.Array:
    """W + scale * A.B in W's layout and dtype (computed in float32); stacked weights layer by layer."""
    if a.ndim == len(merge.split(",")[0]) + 1:  # a leading layers axis
        return jax.vmap(lambda w, x, y: merged_weight(w, x, y, merge, scale))(weight, a, b)
    delta = jnp.einsum(merge, a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return (weight.astype(jnp.float32) + scale * delta).astype(weight.dtype)


def iter_merged_params(model: nnx.Module) -> Iterator[tuple[tuple, jax.Array]]:
    """Every base parameter by path, with adapters folded into the weights they adapt; one at a time (export)."""
    adapters = adapters_by_weight(model)
    for path, var in nnx.to_flat_state(nnx.state(model, FROZEN)):
        value = var.get_raw_value()
        if path in adapters:
            ad = adapters[path]
            value = merged_weight(value, ad["a"].get_raw_value(), ad["b"].get_raw_value(), ad["merge"], ad["scale"])
        yield path, value
