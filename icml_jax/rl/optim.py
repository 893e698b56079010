"""The trainer core of the warm-up and the PPO update: the one optimizer factory (actor / critic learning rates,
frozen weights, global or per-group norm clipping), the parameter labelling, and the NaN guard.

Labels: every parameter leaf is labelled "actor" (LoRA adapters, policy heads: lr `actor_lr`), "critic"
(value heads: lr `critic_lr`), "adapter" (LoRA adapters when they get a learning rate of their own,
`adapter_lr`) or "frozen" (backbone: never changes, no optimizer state). Frozen gradients are
zeroed *before* the global norm is taken, so a large backbone gradient cannot shrink the adapters' step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from icml_jax.rl.config import PPOConfig

ACTOR, CRITIC, ADAPTER, FROZEN = "actor", "critic", "adapter", "frozen"
LABELS: tuple[str, ...] = (ACTOR, CRITIC, ADAPTER, FROZEN)

PyTree = Any
LabelSpec = PyTree | Callable[[PyTree], PyTree]


CLIPS = ("global", "per_group")


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """What the one optimizer factory builds from (hashable, so equal settings share one transformation).

    clip: "global" (the PPO update) zeroes frozen gradients, then clips all of them by one global norm;
    "per_group" (the warm-up) clips the actor and the critic groups each by its own norm, so the value
    regression's large gradients cannot shrink the policies' steps. `max_grad_norm` None: no clipping.
    `adapter_lr`: the learning rate of leaves labelled "adapter" (None: `actor_lr`; Adam is per leaf, so an
    "adapter" leaf then moves exactly as an "actor" one would).
    """

    actor_lr: float
    critic_lr: float
    weight_decay: float = 0.0
    max_grad_norm: float | None = None
    clip: str = "global"
    adapter_lr: float | None = None

    def __post_init__(self) -> None:
        """Rejects an unknown clipping mode, naming it."""
        if self.clip not in CLIPS:
            raise ValueError(f"OptimizerSettings.clip must be one of {CLIPS}, got {self.clip!r}")

    @classmethod
    def of(cls, config: PPOConfig | OptimizerSettings) -> OptimizerSettings:
        """The settings of a PPO config (global clipping); settings pass through."""
        if isinstance(config, OptimizerSettings):
            return config
        return cls(config.actor_lr, config.critic_lr, config.weight_decay, config.max_grad_norm, "global",
                   config.lora_lr)


def make_optimizer(config: PPOConfig | OptimizerSettings, param_labels: LabelSpec) -> optax.GradientTransformation:
    """The one optimizer of the warm-up and the PPO update: Adam(W) per label (actor lr, critic lr; frozen never
    moves and holds no optimizer state), clipped as `OptimizerSettings.clip` says. A PPOConfig means its
    settings: zero frozen grads -> clip by global norm -> multi_transform(actor Adam(W), critic Adam(W)).

    `param_labels` is a pytree matching the parameters with leaves in `LABELS`, or a function params -> such a
    pytree (as `optax.multi_transform` accepts). Labels that never occur are fine.
    """
    c = OptimizerSettings.of(config)
    adapter_lr = c.actor_lr if c.adapter_lr is None else c.adapter_lr

    def adam(lr: float) -> optax.GradientTransformation:
        return optax.adamw(lr, weight_decay=c.weight_decay) if c.weight_decay else optax.adam(lr)

    if c.clip == "per_group":
        def group(lr: float) -> optax.GradientTransformation:
            return optax.chain(optax.clip_by_global_norm(c.max_grad_norm), adam(lr)) if c.max_grad_norm else adam(lr)

        return optax.multi_transform({ACTOR: group(c.actor_lr), CRITIC: group(c.critic_lr),
                                      ADAPTER: group(adapter_lr), FROZEN: optax.set_to_zero()}, param_labels)
    zero_frozen = optax.multi_transform(
        {ACTOR: optax.identity(), CRITIC: optax.identity(), ADAPTER: optax.identity(),
         FROZEN: optax.set_to_zero()}, param_labels
    )
    clip = optax.clip_by_global_norm(c.max_grad_norm) if c.max_grad_norm is not None else optax.identity()
    per_group = optax.multi_transform(
        {ACTOR: adam(c.actor_lr), CRITIC: adam(c.critic_lr), ADAPTER: adam(adapter_lr),
         FROZEN: optax.set_to_zero()}, param_labels
    )
    return optax.chain(zero_frozen, clip, per_group)


def label_params(params: PyTree, classify: Callable[[str], str]) -> PyTree:
    """Label each leaf by `classify(path)`, the leaf's key path as a '/'-joined string (e.g. 'planner/lora/lora_a')."""

    def one(path: tuple[Any, ...], _leaf: Any) -> str:
        label = classify(_path_str(path))
        if label not in LABELS:
            raise ValueError(f"label_params: {_path_str(path)!r} labelled {label!r}, expected one of {LABELS}")
        return label

    return jax.tree_util.tree_map_with_path(one, params)


def nnx_param_labels(state: nnx.State, actor: nnx.filterlib.Filter, critic: nnx.filterlib.Filter) -> nnx.State:
    """Labels for an NNX state holding Variables, from NNX filters (e.g. actor=nnx.LoRAParam); the rest is frozen.

    A variable matching both filters is an error: its learning rate would be ambiguous.
    """
    is_actor = nnx.filterlib.to_predicate(actor)
    is_critic = nnx.filterlib.to_predicate(critic)

    def one(path: tuple[Any, ...], variable: Any) -> Any:
        if not isinstance(variable, nnx.Variable):
            raise ValueError(f"nnx_param_labels: {_path_str(path)!r} is not an nnx.Variable; pass nnx.state(model)")
        names = tuple(_key_name(k) for k in path)
        a, c = is_actor(names, variable), is_critic(names, variable)
        if a and c:
            raise ValueError(f"nnx_param_labels: {_path_str(path)!r} matches both the actor and the critic filter")
        label = ACTOR if a else CRITIC if c else FROZEN
        return jax.tree.map(lambda _: label, variable)

    return jax.tree_util.tree_map_with_path(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _key_name(key: Any) -> Any:
    """The plain name of one key-path entry (dict key, attribute or index)."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return str(key)


def _path_str(path: tuple[Any, ...]) -> str:
    """A key path as 'a/b/c', without NNX's trailing 'value' attribute."""
    names = [str(_key_name(k)) for k in path]
    if names and names[-1] == "value" and isinstance(path[-1], jax.tree_util.GetAttrKey):
        names = names[:-1]
    return "/".join(names)


def all_finite(*trees: PyTree) -> jnp.ndarray:
    """True iff every floating-point leaf of every tree is free of NaN and inf (a scalar bool array)."""
    ok = jnp.bool_(True)
    for leaf in jax.tree.leaves(trees):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            ok = ok & jnp.all(jnp.isfinite(leaf))
    return ok


class GuardedStep(NamedTuple):
    """Outcome of `skip_nonfinite`: the parameters and optimizer state to keep, and the skip bookkeeping."""

    params: PyTree
    opt_state: PyTree
    skipped: jnp.ndarray  # bool scalar: this step was dropped
    num_skipped: jnp.ndarray  # int32 scalar: running count of dropped steps
    param_norm: jnp.ndarray  # float32 scalar: global norm of the parameters before the step
    update_norm: jnp.ndarray  # float32 scalar: global norm of the proposed change (new - old), kept or not


def tree_norm(tree: PyTree) -> jnp.ndarray:
    """Global L2 norm of the floating-point leaves, accumulated in float32 (bfloat16 adapters too)."""
    sq = [jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in jax.tree.leaves(tree)
          if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.sqrt(sum(sq, jnp.float32(0.0)))


def skip_nonfinite(
    loss: jnp.ndarray,
    grads: PyTree,
    params: PyTree,
    opt_state: PyTree,
    new_params: PyTree,
    new_opt_state: PyTree,
    num_skipped: jnp.ndarray | int = 0,
) -> GuardedStep:
    """Keep (params, opt_state) when the loss, any grad or any new param is non-finite; else take the new ones.

    Jittable, so a bad minibatch costs one step, never the run: parameters and Adam moments never become NaN,
    and `num_skipped` counts the dropped steps; the norms feed the host's divergence checks
    (`rl.divergence`). One `lax.cond` picks the whole state (as optax's
    `apply_if_finite` does) rather than a `jnp.where` per leaf: XLA fuses the scalar `ok` (an `and` over every
    leaf) into each leaf's select, so per-leaf selects cost compile time quadratic in the number of leaves
    (minutes for a 30-layer backbone's adapters).
    """
    ok = all_finite(loss, grads, new_params)
    keep_params, keep_state = jax.lax.cond(ok, lambda: (new_params, new_opt_state), lambda: (params, opt_state))
    skipped = jnp.logical_not(ok)
    update = jax.tree.map(lambda new, old: jnp.asarray(new, jnp.float32) - jnp.asarray(old, jnp.float32),
                          new_params, params)
    return GuardedStep(keep_params, keep_state, skipped, jnp.asarray(num_skipped, jnp.int32) + skipped.astype(jnp.int32),
                       tree_norm(params), tree_norm(update))


def guarded_apply(
    tx: optax.GradientTransformation,
    loss: jnp.ndarray,
    grads: PyTree,
    params: PyTree,
    opt_state: PyTree,
    num_skipped: jnp.ndarray | int = 0,
) -> GuardedStep:
    """One optimizer step of `tx` guarded by `skip_nonfinite` (the call the joint update makes)."""
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    return skip_nonfinite(loss, grads, params, opt_state, new_params, new_opt_state, num_skipped)
