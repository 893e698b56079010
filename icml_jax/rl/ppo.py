"""The PPO step: pure and jitted, one guarded optimizer step per minibatch (`ppo_step`) or a run of them under
one `lax.scan` (`ppo_steps`).

`params` (the TRAINABLE state: adapters and heads), `frozen` (backbone weights, passed in, never closed over)
and `rest` (RNG state of LoRA dropout) go in; the optimizer state is donated; a non-finite loss or gradient
leaves parameters and optimizer state untouched and is counted (`rl.optim.guarded_apply`). In epoch 0 with
`first_epoch` true the old statistics are the step's own (stop-gradient) forward, so the ratio is exactly 1.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from icml_jax.agents.policy import MemoryPolicies, planner_evaluate, trainable_group, trigger_evaluate
from icml_jax.rl.batch import Minibatch, OldStats
from icml_jax.rl.config import PPOConfig
from icml_jax.rl.losses import combine_agent_losses, masked_mean, ppo_loss
from icml_jax.rl.optim import guarded_apply, label_params, make_optimizer

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Static description of the step (hashable): the train-mode graph of the policies and the PPO settings.

    Equal specs (same architecture, same config) share compiled programs, e.g. across seeds in one process.
    """

    graphdef: Any  # nnx.GraphDef of MemoryPolicies in train mode (LoRA dropout on)
    config: PPOConfig


def step_config(config: PPOConfig) -> PPOConfig:
    """The config with the fields the step never reads (GAE, whitening, epochs, minibatch size, where the old
    statistics come from, dropout: the graph carries it) at their defaults, so that runs differing only in those
    share one compiled step."""
    d = PPOConfig()
    return dataclasses.replace(config, gamma=d.gamma, gae_lambda=d.gae_lambda, whiten=d.whiten, epochs=1,
                               minibatch_size=1, old_logp=d.old_logp, update_dropout=d.update_dropout)


@functools.lru_cache(maxsize=None)
def joint_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """The optimizer of the TRAINABLE state: actor lr for adapters and policy heads (`lora_lr` for the adapters
    when set), critic lr for value heads.

    Cached per config so that equal configs give the identical transformation (and one compiled step).
    """
    group = functools.partial(trainable_group, split_adapters=config.lora_lr is not None)
    return make_optimizer(config, lambda params: label_params(params, group))


def joint_loss(
    policies: MemoryPolicies, batch: Minibatch, old: OldStats, first_epoch: Array, config: PPOConfig
) -> tuple[Array, tuple[dict[str, Array], OldStats]]:
    """Planner + Trigger PPO loss of one minibatch, its metrics, and this forward's statistics (stop-gradient).

    With `first_epoch` true the old statistics are the (stop-gradient) new ones, so the ratio is exactly 1.
    """
    p, t = batch.planner, batch.trigger
    ps = planner_evaluate(policies, p.tokens, p.mask, p.actions)
    ts = trigger_evaluate(policies, t.tokens, t.mask, t.cand_mask, t.actions)
    sg = jax.lax.stop_gradient
    pick = lambda new, given: jnp.where(first_epoch, sg(new), given)  # noqa: E731
    anchor = OldStats(pick(ps.logp, old.planner_logp), pick(ps.value, old.planner_value),
                      pick(ts.logp, old.trigger_logp), pick(ts.value, old.trigger_value))
    current = OldStats(sg(ps.logp), sg(ps.value), sg(ts.logp), sg(ts.value))
    per_agent = {
        "planner": ppo_loss(ps.logp, anchor.planner_logp, p.advantages, p.returns, ps.value, anchor.planner_value,
                            ps.entropy, p.valid, config),
        "trigger": ppo_loss(ts.logp, anchor.trigger_logp, t.advantages, t.returns, ts.value, anchor.trigger_value,
                            ts.entropy, t.valid, config),
    }
    loss, metrics = combine_agent_losses(per_agent)
    for agent, new_logp, old_logp, valid in (("planner", ps.logp, anchor.planner_logp, p.valid),
                                             ("trigger", ts.logp, anchor.trigger_logp, t.valid)):
        dev = jnp.where(valid, jnp.abs(jnp.exp(sg(new_logp) - old_logp) - 1.0), 0.0)
        metrics[f"{agent}/ratio_max_dev"] = jnp.max(dev)
    metrics["trigger/memory_prob"] = masked_mean(1.0 - sg(ts.probs[:, 0]), t.valid)  # p(use some memory)
    metrics["planner/save_prob"] = masked_mean(sg(ps.probs), p.valid)
    return loss, (metrics, current)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("opt_state",))
def ppo_step(
    spec: StepSpec,
    params: nnx.State,
    frozen: nnx.State,
    rest: nnx.State,
    opt_state: optax.OptState,
    num_skipped: Array,
    batch: Minibatch,
    old: OldStats,
    first_epoch: Array,
) -> tuple[nnx.State, optax.OptState, nnx.State, Array, OldStats, dict[str, Array]]:
    """One guarded optimizer step on one minibatch; returns (params, opt_state, rest, num_skipped, current,
    metrics), `current` being this forward's log-probabilities and values of the taken actions."""

    def loss_fn(trainable):
        # Fresh Variables for the RNG state at this trace level: LoRA dropout advances its counter in place,
        # and flax forbids mutating a Variable created at the outer (jit) level from inside the grad trace.
        local_rest = jax.tree.map(lambda x: x, rest)
        model = nnx.merge(spec.graphdef, trainable, frozen, local_rest)
        loss, (metrics, current) = joint_loss(model, batch, old, first_epoch, spec.config)
        return loss, (metrics, current, nnx.state(model, nnx.Not(nnx.Param)))

    (loss, (metrics, current, new_rest)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    step = guarded_apply(joint_optimizer(spec.config), loss, grads, params, opt_state, num_skipped)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), param_norm=step.param_norm,
                   update_norm=step.update_norm, skipped=step.skipped.astype(jnp.float32))
    return step.params, step.opt_state, new_rest, step.num_skipped, current, metrics


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("opt_state",))
def ppo_steps(
    spec: StepSpec,
    params: nnx.State,
    frozen: nnx.State,
    rest: nnx.State,
    opt_state: optax.OptState,
    num_skipped: Array,
    batches: Minibatch,
    olds: OldStats,
    first_epoch: Array,
) -> tuple[nnx.State, optax.OptState, nnx.State, Array, OldStats, dict[str, Array]]:
    """`ppo_step` on each minibatch of `batches` / `olds` (stacked on a leading axis) in turn, under one
    `lax.scan`: the same steps in one dispatch instead of one each (small steps are dispatch-bound); `current`
    and `metrics` come back stacked per step."""

    def body(carry, xs):
        params, opt_state, rest, num_skipped = carry
        batch, old = xs
        params, opt_state, rest, num_skipped, current, metrics = ppo_step(  # inlined into this program
            spec, params, frozen, rest, opt_state, num_skipped, batch, old, first_epoch)
        return (params, opt_state, rest, num_skipped), (current, metrics)

    (params, opt_state, rest, num_skipped), (current, metrics) = jax.lax.scan(
        body, (params, opt_state, rest, num_skipped), (batches, olds))
    return params, opt_state, rest, num_skipped, current, metrics
