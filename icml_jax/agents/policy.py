"""Planner and Trigger as shared actor-critic heads on backbone hidden states, and their jitted scoring.

The Planner reads one observation sequence and gives Bernoulli(save); the Trigger reads one sequence per
candidate (context + that memory, candidate 0 = context + "no memory") and gives a categorical over them.
Each agent has an actor head and a value head. Planner and Trigger may share one backbone or use two.
Heads are `TrainableParam`s and LoRA adapters `nnx.LoRAParam`s, so `TRAINABLE` selects exactly what the PPO
update trains and everything else (the backbone) stays frozen.
Optionally (`match_rank > 0`, `MatchHead`) the Trigger adds a bilinear score between the context-only encoding
(option 0) and each option's encoding, and a context-only score of "no memory": a linear head on pooled
features scores memories one by one and can express neither "this memory answers this utterance" nor "this
utterance needs a memory" unless the backbone itself mixes context and memory (an LLM does; a tiny random
backbone does not).
With `shared_prefix=True` the Trigger runs the options' common token prefix (the context) once into a KV cache
and only each option's remaining tokens against it (`split_shared_prefix`, `_shared_prefix_features`): the same
values up to float rounding, on the same token rows, with an on-device fallback to the full pass.
Every function that samples also returns the log-probability, entropy and value it sampled with, computed
by the same program that evaluates given actions, so receipts and training agree.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from icml_jax.models.decoder import Decoder, init_cache, repeat_cache
from icml_jax.models.lora import TRAINABLE, TrainableParam

Array = jax.Array
NEG = -1e30  # score of padded candidates (finite, so masked rows never produce NaN)
HEADS: tuple[str, ...] = ("planner_actor", "planner_critic", "trigger_actor", "trigger_critic", "trigger_match")
CRITIC_HEADS = ("planner_critic", "trigger_critic")  # value heads: the critic learning rate
# TRAINABLE (re-exported from models.lora) = LoRA adapters + TrainableParams: what the PPO update trains.


class ScalarHead(nnx.Module):
    """A zero-initialised affine map [..., H] -> [..., 1] on backbone features, trained with the adapters.

    `use_bias=False` (the Trigger's actor) keeps the bias parameter, so saved policies and checkpoints keep their
    layout, but never adds it: one constant on every option's score cannot change a softmax, so its gradient is
    zero up to rounding, which Adam would turn into steps of +-lr that depend on the batch's shapes.
    """

    def __init__(self, features: int, *, use_bias: bool = True):
        self.use_bias = use_bias
        self.kernel = TrainableParam(jnp.zeros((features, 1), jnp.float32))
        self.bias = TrainableParam(jnp.zeros((1,), jnp.float32))

    def __call__(self, h: Array) -> Array:
        out = h @ self.kernel[...]
        return out + self.bias[...] if self.use_bias else out


class MatchHead(nnx.Module):
    """Context-memory interaction terms of the Trigger's option scores.

    score_i += (h_0 U) . (h_i V) / sqrt(rank) compares the context (option 0, context only) with option i;
    score_0 += h_0 . n says from the context alone whether any memory is needed. A linear head on per-option
    features can express neither (with additive features both reduce to per-memory constants). V and n start
    at zero (the policy starts uniform) and U random, so the bilinear term receives gradients at once.
    """

    def __init__(self, features: int, rank: int, rngs: nnx.Rngs):
        self.rank = rank
        scale = features**-0.5
        self.context = TrainableParam(scale * jax.random.normal(rngs.params(), (features, rank), jnp.float32))
        self.memory = TrainableParam(jnp.zeros((features, rank), jnp.float32))
        self.none = TrainableParam(jnp.zeros((features,), jnp.float32))

    def __call__(self, h: Array) -> Array:
        """h [B, C, H] -> score offsets [B, C]."""
        q = h[:, 0] @ self.context[...]
        k = h @ self.memory[...]
        scores = jnp.einsum("br,bcr->bc", q, k) * self.rank**-0.5
        return scores.at[:, 0].add(h[:, 0] @ self.none[...])


POOLINGS = ("last", "mean")  # how a sequence's hidden states become the heads' input


class MemoryPolicies(nnx.Module):
    """Both agents: backbones (shared when the same object is passed twice), four scalar heads (actor and value
    of each agent) and, with `match_rank > 0`, the Trigger's `MatchHead`."""

    def __init__(self, planner_backbone: Decoder, trigger_backbone: Decoder | None = None, *,
                 pooling: str = "last", match_rank: int = 0, shared_prefix: bool = False, suffix_slots: int = 32,
                 rngs: nnx.Rngs):
        if suffix_slots < 1:
            raise ValueError(f"suffix_slots must be >= 1, got {suffix_slots}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be 'last' or 'mean', got {pooling!r}")
        if match_rank < 0:
            raise ValueError(f"match_rank must be >= 0 (0 = no bilinear Trigger term), got {match_rank}")
        self.pooling = pooling  # how a sequence's hidden states become the heads' input
        # Trigger: run the options' common token prefix once (KV cache) and only each option's last
        # <= suffix_slots tokens per option (`_shared_prefix_features`); exact, falls back to the full pass
        self.shared_prefix = shared_prefix
        self.suffix_slots = suffix_slots
        self.planner_backbone = planner_backbone
        self.trigger_backbone = planner_backbone if trigger_backbone is None else trigger_backbone
        planner_h, trigger_h = self.planner_backbone.config.hidden_size, self.trigger_backbone.config.hidden_size
        # zero init: uniform policies and zero values at the start
        self.planner_actor = ScalarHead(planner_h)
        self.planner_critic = ScalarHead(planner_h)
        self.trigger_actor = ScalarHead(trigger_h, use_bias=False)  # shift-invariant softmax: no bias
        self.trigger_critic = ScalarHead(trigger_h)
        self.trigger_match = MatchHead(trigger_h, match_rank, rngs) if match_rank else None

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


class PrefixSplit(NamedTuple):
    """Trigger rows [B, C, L] (left-padded) as one common prefix per decision and a suffix per option."""

    prefix: Array  # [B, L] int32: the common prefix's k tokens, left-padded
    prefix_mask: Array  # [B, L] bool
    suffix: Array  # [B, C, S] int32: each option's remaining tokens, right-padded (contiguous after the prefix)
    suffix_mask: Array  # [B, C, S] bool
    fits: Array  # [] bool: every real option's remainder fits in S slots (else the full pass must run)


def split_shared_prefix(tokens: Array, mask: Array, cand_mask: Array, suffix_slots: int) -> PrefixSplit:
    """Finds, on device, the longest token prefix common to the real options of each decision (at most each
    option's length - 1, so every option keeps a last token of its own) and splits the rows there.

    Rows are left-padded to different lengths, so tokens are compared at the same real index, not column.
    """
    b, c, length = tokens.shape
    n = jnp.sum(mask, axis=-1, dtype=jnp.int32)  # [B, C] real tokens per option
    real = cand_mask.astype(bool) & (n > 0)
    j = jnp.arange(length)
    aligned = jnp.take_along_axis(tokens, jnp.clip(length - n[..., None] + j, 0, length - 1), axis=-1)
    inside = j < n[..., None]  # aligned (right-padded) rows: real token index j
    first = jnp.argmax(real, axis=1)  # the first real option supplies the prefix's tokens
    ref = jnp.take_along_axis(aligned, first[:, None, None], axis=1)  # [B, 1, L]
    ref_in = jnp.take_along_axis(inside, first[:, None, None], axis=1)
    same = ((aligned == ref) & inside & ref_in) | ~real[..., None]
    common = jnp.sum(jnp.cumprod(jnp.all(same, axis=1), axis=-1), axis=-1)  # [B]
    shortest = jnp.min(jnp.where(real, n, length), axis=1)
    k = jnp.where(jnp.any(real, axis=1), jnp.clip(jnp.minimum(common, shortest - 1), 0), 0)  # [B]
    m = jnp.where(real, n - k[:, None], 0)  # [B, C] suffix lengths
    ref_row = ref[:, 0]
    prefix = jnp.take_along_axis(ref_row, jnp.clip(j[None] - (length - k[:, None]), 0, length - 1), axis=-1)
    prefix_mask = j[None] >= length - k[:, None]
    s = jnp.arange(suffix_slots)
    suffix = jnp.take_along_axis(aligned, jnp.clip(k[:, None, None] + s, 0, length - 1), axis=-1)
    suffix_mask = s < m[..., None]
    return PrefixSplit(prefix, prefix_mask, suffix, suffix_mask, jnp.all(m <= suffix_slots))


def _shared_prefix_features(backbone: Decoder, split: PrefixSplit, pooling: str) -> Array:
    """Heads' input [B * C, embed] float32 from one prefix pass into a KV cache [B] and one suffix pass [B * C]
    that attends to it: the same causal computation as `_features` on the full rows (the prefix's hidden
    states do not depend on what follows), the prefix run once instead of C times."""
    b, c, slots = split.suffix.shape
    length = split.prefix.shape[1]
    cache = init_cache(backbone.config, b, length + slots, backbone.dtype)
    pre = backbone(split.prefix, attention_mask=split.prefix_mask, cache=cache, compute_logits=False)
    cache = repeat_cache(pre.cache, c)
    smask = split.suffix_mask.reshape(b * c, slots)
    hidden = backbone(split.suffix.reshape(b * c, slots), attention_mask=smask, cache=cache,
                      compute_logits=False).hidden.astype(jnp.float32)
    m = jnp.sum(smask, axis=-1, dtype=jnp.int32)
    if pooling == "last":
        return jnp.take_along_axis(hidden, jnp.clip(m - 1, 0)[:, None, None], axis=1)[:, 0]
    pw = split.prefix_mask.astype(jnp.float32)[..., None]
    prefix_sum = jnp.sum(pre.hidden.astype(jnp.float32) * pw, axis=1)  # [B, embed]
    suffix_sum = jnp.sum(hidden * smask.astype(jnp.float32)[..., None], axis=1)
    count = jnp.repeat(jnp.sum(pw, axis=1), c, axis=0) + m[:, None].astype(jnp.float32)
    return (jnp.repeat(prefix_sum, c, axis=0) + suffix_sum) / jnp.maximum(count, 1.0)


def prefix_pays(suffix_slots: int, candidates: int, length: int) -> bool:
    """Whether the shared-prefix pass is traced for [*, candidates, length] rows: only with several options and
    suffix slots at most half the row (otherwise it cannot save work)."""
    return candidates > 1 and 2 * suffix_slots <= length


def trigger_features(policies: MemoryPolicies, tokens: Array, mask: Array, cand_mask: Array,
                     shared_prefix: bool | None = None) -> Array:
    """The Trigger heads' input [B, C, embed]; `shared_prefix` (None: the policies' flag) selects the shared-
    prefix pass, with an on-device fallback (`lax.cond`: one branch runs) to the full pass when an option's
    remainder does not fit in `suffix_slots` (e.g. rows truncated at max_length share only BOS)."""
    b, c, length = tokens.shape
    backbone, pooling = policies.trigger_backbone, policies.pooling

    def full(backbone: Decoder) -> Array:
        return _features(backbone, tokens.reshape(b * c, length), mask.reshape(b * c, length), pooling)

    enabled = policies.shared_prefix if shared_prefix is None else shared_prefix
    if not (enabled and prefix_pays(policies.suffix_slots, c, length)):
        return full(backbone).reshape(b, c, -1)
    split = split_shared_prefix(tokens, mask, cand_mask, policies.suffix_slots)
    graphdef, params, rest = nnx.split(backbone, nnx.Param, ...)

    mutated = []  # set while tracing when a branch changes non-parameter state (train-mode LoRA dropout RNG)

    def branch(features):  # pure in the backbone's state; its non-parameter state comes back
        def run(params, rest):
            before = jax.tree.leaves(rest)  # merge shares rest's Variables with the module: compare values after
            module = nnx.merge(graphdef, params, rest)
            out = features(module), nnx.state(module, nnx.Not(nnx.Param))
            if any(a is not b for a, b in zip(jax.tree.leaves(out[1]), before, strict=True)):
                mutated.append(True)
            return out
        return run

    h, rest = jax.lax.cond(split.fits, branch(lambda m: _shared_prefix_features(m, split, pooling)),
                           branch(full), params, rest)
    if mutated:  # only then (like the decoder's layer scan): a caller may hold the state at another trace level
        nnx.update(backbone, rest)
    return h.reshape(b, c, -1)


def trigger_forward(policies: MemoryPolicies, tokens: Array, mask: Array, cand_mask: Array,
                    shared_prefix: bool | None = None) -> tuple[Array, Array]:
    """Candidate logits [B, C] (padding = NEG) and values [B] for tokens/mask [B, C, L], cand_mask [B, C].

    `shared_prefix` (None: `policies.shared_prefix`) computes the options' common prefix once (same values)."""
    h = trigger_features(policies, tokens, mask, cand_mask, shared_prefix)
    scores = policies.trigger_actor(h)[..., 0]
    if policies.trigger_match is not None:
        scores = scores + policies.trigger_match(h)
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


def as_keys(key: Array) -> Array:
    """Typed PRNG keys from typed keys or raw key data (uint32 [..., 2] for the default threefry keys)."""
    return key if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(key)


@functools.partial(jax.jit, static_argnames=("graphdef", "greedy"))
def planner_act(graphdef, state, tokens, mask, key, *, greedy: bool = False) -> tuple[Array, ActionStats]:
    """Samples (or, greedy, thresholds at 0.5) save decisions [B] and returns their statistics. `key`: one key
    for the batch, or one per row [B] (batched play: each row's draw then depends on its own key only), typed
    or as raw key data (uint32, `jax.random.key_data`; host-side padding then needs no device op)."""
    policies = nnx.merge(graphdef, state)
    key = as_keys(key)
    logit, value = planner_forward(policies, tokens, mask)
    p = jax.nn.sigmoid(logit)
    sample = jax.vmap(jax.random.bernoulli) if key.ndim else jax.random.bernoulli
    action = (logit > 0) if greedy else sample(key, p)
    action = action.astype(jnp.int32)
    return action, bernoulli_stats(logit, action, value)


@functools.partial(jax.jit, static_argnames=("graphdef", "greedy"))
def trigger_act(graphdef, state, tokens, mask, cand_mask, key, *, greedy: bool = False) -> tuple[Array, ActionStats]:
    """Samples (or takes the argmax of) a candidate index [B] (0 = no memory) and returns its statistics. `key`:
    one key for the batch, or one per row [B] (as `planner_act`)."""
    policies = nnx.merge(graphdef, state)
    key = as_keys(key)
    logits, value = trigger_forward(policies, tokens, mask, cand_mask)
    if greedy:
        action = jnp.argmax(logits, -1)
    elif key.ndim:
        action = jax.vmap(jax.random.categorical)(key, logits)
    else:
        action = jax.random.categorical(key, logits, axis=-1)
    action = action.astype(jnp.int32)
    return action, categorical_stats(logits, action, cand_mask, value)


def trainable_group(path: str, split_adapters: bool = False) -> str:
    """'critic' for a value head's parameter, 'actor' for any other trainable one, by its '/'-joined path;
    with `split_adapters` LoRA adapters are 'adapter' (their own learning rate, `PPOConfig.lora_lr`)."""
    if path.split("/", 1)[0] in CRITIC_HEADS:
        return "critic"
    return "adapter" if split_adapters and "_lora_" in path.rsplit("/", 1)[-1] else "actor"


def param_labels(policies: MemoryPolicies) -> nnx.State:
    """'actor' for LoRA adapters and actor heads, 'critic' for value heads, 'frozen' for backbone weights.

    Same structure as `nnx.state(policies, nnx.Param)`, for `optax.multi_transform`.
    """
    state = nnx.state(policies, nnx.Param)
    is_trainable = nnx.filterlib.to_predicate(TRAINABLE)

    def label(path, variable) -> str:
        if not is_trainable(path, variable):
            return "frozen"
        return trainable_group("/".join(str(p) for p in path))

    return nnx.map_state(lambda path, v: v.replace(label(path, v)), state)
