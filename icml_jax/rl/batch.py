"""Training slots -> minibatches: collate (re-padding to the largest member bucket), the fixed partition of an
update, and the behaviour policy's statistics laid out as `collate` lays out the rows.

A minibatch holds `minibatch_size` turn slots; each slot carries one Planner and one Trigger decision, each
with its own `valid` flag (a judge failure masks one agent's decision only; padding slots mask both). Token
arrays are re-padded to the largest bucket of the slot members (extra *left* padding changes nothing: positions
come from the mask), and a short last minibatch is filled with invalid slots, so step shapes stay on the
observation buckets and the number of compilations is small and countable (`ppo.ppo_step._cache_size()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from icml_jax.agents.observation import left_pad
from icml_jax.rl.trajectory import Slot

Array = jax.Array


class PlannerBatch(NamedTuple):
    """Planner rows of a minibatch: observation tokens/mask [M, L], action (1 = save), targets, validity."""

    tokens: Array  # [M, L] int32
    mask: Array  # [M, L] bool
    actions: Array  # [M] int32
    advantages: Array  # [M] float32
    returns: Array  # [M] float32
    valid: Array  # [M] bool


class TriggerBatch(NamedTuple):
    """Trigger rows of a minibatch: option tokens/mask [M, C, L], cand_mask [M, C], chosen option, targets."""

    tokens: Array  # [M, C, L] int32
    mask: Array  # [M, C, L] bool
    cand_mask: Array  # [M, C] bool
    actions: Array  # [M] int32
    advantages: Array  # [M] float32
    returns: Array  # [M] float32
    valid: Array  # [M] bool


class Minibatch(NamedTuple):
    """One joint minibatch: M slots of (Planner decision, Trigger decision)."""

    planner: PlannerBatch
    trigger: TriggerBatch


class OldStats(NamedTuple):
    """Log-probabilities and values of the taken actions under the anchoring policy, per agent, [M] each."""

    planner_logp: Array
    planner_value: Array
    trigger_logp: Array
    trigger_value: Array

    @staticmethod
    def zeros(size: int) -> OldStats:
        """Placeholders for epoch 0 (where the step computes the real ones), on device like the step's outputs."""
        z = jnp.zeros((size,), jnp.float32)
        return OldStats(z, z, z, z)


def stack(trees: Sequence[Any]) -> Any:
    """Host pytrees (NumPy leaves) stacked on a new leading axis."""
    return jax.tree.map(lambda *xs: np.stack(xs), *trees)


def unstack(tree: Any, n: int) -> list[Any]:
    """The inverse of `stack` on host data: n pytrees."""
    return [jax.tree.map(lambda x: x[i], tree) for i in range(n)]



def _dummy_row(shape: tuple[int, ...], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens/mask of an invalid row: one real (pad) token at the end, so every computation stays finite."""
    tokens = np.full(shape, pad_id, np.int32)
    mask = np.zeros(shape, bool)
    mask[..., -1] = True
    return tokens, mask


def collate(slots: Sequence[Slot], size: int, pad_id: int = 0) -> Minibatch:
    """Stacks up to `size` slots into one Minibatch, re-padding to the largest member bucket; short = invalid rows."""
    if not 0 < len(slots) <= size:
        raise ValueError(f"collate: need 1..{size} slots, got {len(slots)}")
    p_items = [s.planner for s in slots if s.planner is not None]
    t_items = [s.trigger for s in slots if s.trigger is not None]
    lp = max((it.tokens.shape[-1] for it in p_items), default=1)
    ct = max((it.tokens.shape[0] for it in t_items), default=1)
    lt = max((it.tokens.shape[-1] for it in t_items), default=1)

    p_tok, p_mask = _dummy_row((size, lp), pad_id)
    p_act, p_adv, p_ret = np.zeros(size, np.int32), np.zeros(size, np.float32), np.zeros(size, np.float32)
    p_valid = np.zeros(size, bool)
    t_tok, t_mask = _dummy_row((size, ct, lt), pad_id)
    t_cand = np.zeros((size, ct), bool)
    t_cand[:, 0] = True
    t_act, t_adv, t_ret = np.zeros(size, np.int32), np.zeros(size, np.float32), np.zeros(size, np.float32)
    t_valid = np.zeros(size, bool)
    for i, slot in enumerate(slots):
        if (it := slot.planner) is not None:
            p_tok[i] = left_pad(it.tokens, lp, pad_id)
            p_mask[i] = left_pad(it.mask, lp, False)
            p_act[i], p_adv[i], p_ret[i], p_valid[i] = it.action, it.advantage, it.ret, True
        if (it := slot.trigger) is not None:
            c = it.tokens.shape[0]
            t_tok[i, :c] = left_pad(it.tokens, lt, pad_id)
            t_mask[i, :c] = left_pad(it.mask, lt, False)
            t_cand[i] = False
            t_cand[i, :c] = it.cand_mask
            t_act[i], t_adv[i], t_ret[i], t_valid[i] = it.action, it.advantage, it.ret, True
    return Minibatch(PlannerBatch(p_tok, p_mask, p_act, p_adv, p_ret, p_valid),
                     TriggerBatch(t_tok, t_mask, t_cand, t_act, t_adv, t_ret, t_valid))


def rollout_stats(slots: Sequence[Slot], size: int) -> OldStats:
    """The behaviour policy's log-probabilities and values of `slots`' decisions, rows as `collate` lays them out
    (0 for absent decisions and padding rows, which the step masks out)."""
    if not 0 < len(slots) <= size:
        raise ValueError(f"rollout_stats: need 1..{size} slots, got {len(slots)}")
    out = [np.zeros(size, np.float32) for _ in range(4)]
    for i, slot in enumerate(slots):
        for j, item in ((0, slot.planner), (2, slot.trigger)):
            if item is not None:
                out[j][i], out[j + 1][i] = item.rollout_logp, item.rollout_value
    return OldStats(*out)


def minibatch_shape(batch: Minibatch) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes that decide which compiled step runs: (planner tokens, trigger tokens)."""
    return tuple(batch.planner.tokens.shape), tuple(batch.trigger.tokens.shape)


def partition(slots: Sequence[Slot], size: int, rng: np.random.Generator) -> list[list[Slot]]:
    """Shuffles the slots once and cuts them into groups of `size` (the partition every epoch of an update reuses)."""
    order = rng.permutation(len(slots))
    return [[slots[j] for j in order[i: i + size]] for i in range(0, len(slots), size)]
