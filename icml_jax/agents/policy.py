"""Planner and Trigger as shared actor-critic heads on backbone hidden states, and their jitted scoring.

The Planner reads one observation sequence and gives Bernoulli(save); the Trigger reads one sequence per
candidate (context + that memory, candidate 0 = context + "no memory") and gives a categorical over them.
Each agent has an actor head and a value head. Planner and Trigger may share one backbone or use two.
Every function that samples also returns the log-probability, entropy and value it sampled with, computed
by the same program that evaluates given actions, so receipts and training agree.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from icml_jax.models.decoder import Decoder

Array = jax.Array
NEG = -1e30  # score of padded candidates (finite, so masked rows never produce NaN)


class MemoryPolicies(nnx.Module):
    """Both agents: backbones (shared when the same object is passed twice) and four scalar heads."""

    def __init__(self, planner_backbone: Decoder, trigger_backbone: Decoder | None = None, *,
                 pooling: str = "last", rngs: nnx.Rngs):
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean', got {pooling!r}")
        self.pooling = pooling  # how a sequence's hidden states become the heads' input
        self.planner_backbone = planner_backbone
        self.trigger_backbone = planner_backbone if trigger_backbone is None else trigger_backbone
        zeros = nnx.initializers.zeros_init()
        head = lambda backbone: nnx.Linear(  # noqa: E731 - zero init: uniform policies and zero values at start
            backbone.config.hidden_size, 1, kernel_init=zeros, param_dtype=jnp.float32, rngs=rngs)
        self.planner_actor = head(self.planner_backbone)
        self.planner_critic = head(self.planner_backbone)
        self.trigger_actor = head(self.trigger_backbone)
        self.trigger_critic = head(self.trigger_backbone)

    @property
    def shared_backbone(self) -> bool:
        return self.planner_backbone is self.trigger_backbone


def _features(backbone: Decoder, tokens: Array, mask: Array, pooling: str) -> Array:
    """Heads' input [rows, embed] float32: the last (real, since left-padded) position's final hidden state,
    or the mean over real positions (a stronger signal for small or untrained backbones)."""
    hidden = backbone(tokens, attention_mask=mask, compute_logits=False).hidden.astype(jnp.float32)
    if pooling == "last":
        return hidden[:, -1]
    weights = mask.astype(jnp.float32)[..., None]
    return jnp.sum(hidden * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)


def planner_forward(policies: MemoryPolicies, tokens: Array, mask: Array) -> tuple[Array, Array]:
    """Save logits [B] and values [B] for observations tokens/mask [B, L]."""
    h = _features(policies.planner_backbone, tokens, mask, policies.pooling)
    return policies.planner_actor(h)[:, 0], policies.planner_critic(h)[:, 0]


def trigger_forward(policies: MemoryPolicies, tokens: Array, mask: Array, cand_mask: Array) -> tuple[Array, Array]:
    """Candidate logits [B, C] (padding = NEG) and values [B] for tokens/mask [B, C, L], cand_mask [B, C]."""
    b, c, length = tokens.shape
    h = _features(policies.trigger_backbone, tokens.reshape(b * c, length), mask.reshape(b * c, length),
                  policies.pooling)
    h = h.reshape(b, c, -1)
    scores = policies.trigger_actor(h)[..., 0]
    value = policies.trigger_critic(h[:, 0])[:, 0]  # the context-only sequence carries the state value
    return jnp.where(cand_mask, scores, NEG), value


class ActionStats(NamedTuple):
    """What PPO needs of a batch of decisions."""

    logp: Array  # [B] log-probability of the action
    entropy: Array  # [B]
    value: Array  # [B]
    probs: Array  # [B] (planner: p(save)) or [B, C] (trigger)


def bernoulli_stats(logit: Array, action: Array, value: Array) -> ActionStats:
    """Log-prob of save (1) / discard (0) actions under Bernoulli(sigmoid(logit)), and its entropy."""
    log_p, log_q = jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit)
    p = jnp.exp(log_p)
    logp = jnp.where(action.astype(bool), log_p, log_q)
    entropy = -(p * log_p + (1.0 - p) * log_q)
    return ActionStats(logp, entropy, value, p)


def categorical_stats(logits: Array, action: Array, cand_mask: Array, value: Array) -> ActionStats:
    """Log-prob of chosen candidates and the entropy over the real candidates only."""
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    probs = jnp.exp(log_probs)
    logp = jnp.take_along_axis(log_probs, action[:, None].astype(jnp.int32), axis=-1)[:, 0]
    entropy = -jnp.sum(jnp.where(cand_mask, probs * log_probs, 0.0), axis=-1)
    return ActionStats(logp, entropy, value, probs)


def planner_evaluate(policies: MemoryPolicies, tokens: Array, mask: Array, actions: Array) -> ActionStats:
    """Teacher-forced statistics of given Planner actions (training and old-log-prob recomputation)."""
    logit, value = planner_forward(policies, tokens, mask)
    return bernoulli_stats(logit, actions, value)


def trigger_evaluate(policies: MemoryPolicies, tokens: Array, mask: Array, cand_mask: Array,
                     actions: Array) -> ActionStats:
    """Teacher-forced statistics of given Trigger actions."""
    logits, value = trigger_forward(policies, tokens, mask, cand_mask)
    return categorical_stats(logits, actions, cand_mask, value)


@functools.partial(jax.jit, static_argnames=("graphdef", "greedy"))
def planner_act(graphdef, state, tokens, mask, key, *, greedy: bool = False) -> tuple[Array, ActionStats]:
    """Samples (or, greedy, thresholds at 0.5) save decisions [B] and returns their statistics."""
    policies = nnx.merge(graphdef, state)
    logit, value = planner_forward(policies, tokens, mask)
    action = (logit > 0) if greedy else jax.random.bernoulli(key, jax.nn.sigmoid(logit))
    action = action.astype(jnp.int32)
    return action, bernoulli_stats(logit, action, value)


@functools.partial(jax.jit, static_argnames=("graphdef", "greedy"))
def trigger_act(graphdef, state, tokens, mask, cand_mask, key, *, greedy: bool = False) -> tuple[Array, ActionStats]:
    """Samples (or takes the argmax of) a candidate index [B] (0 = no memory) and returns its statistics."""
    policies = nnx.merge(graphdef, state)
    logits, value = trigger_forward(policies, tokens, mask, cand_mask)
    action = jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits, axis=-1)
    action = action.astype(jnp.int32)
    return action, categorical_stats(logits, action, cand_mask, value)


def param_labels(policies: MemoryPolicies) -> nnx.State:
    """'actor' for LoRA adapters and actor heads, 'critic' for value heads, 'frozen' for backbone weights.

    Same structure as `nnx.state(policies, nnx.Param)`, for `optax.multi_transform`.
    """
    state = nnx.state(policies, nnx.Param)

    def label(path, variable) -> str:
        names = [str(p) for p in path]
        if names[0] in ("planner_critic", "trigger_critic"):
            return "critic"
        if names[0] in ("planner_actor", "trigger_actor") or isinstance(variable, nnx.LoRAParam):
            return "actor"
        return "frozen"

    return nnx.map_state(lambda path, v: v.replace(label(path, v)), state)
