"""Played turns -> training slots, in one pure function (`build_slots`): each agent's rewards and rollout values
per trajectory (one per episode; holdover saves alone), GAE advantages and returns, and one slot per turn
holding the Planner and the Trigger decision ready for training (a judge failure masks that one decision).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from icml_jax.agents.agent import Receipt
from icml_jax.models.sampler import bucket
from icml_jax.rl.advantages import compute_advantages
from icml_jax.rl.config import PPOConfig, RewardConfig
from icml_jax.rl.rewards import planner_training_reward


@dataclasses.dataclass
class TurnRecord:
    """One turn waiting for the next update: the receipt and the rewards known so far."""

    receipt: Receipt
    episode_key: int  # learner-wide episode ordinal: trajectories end at episode boundaries
    r_qual: float | None  # None = quality judge failed (Trigger decision masked)
    r_proxy: float | None  # None = proxy judge failed (Planner decision masked)
    planner_reward: float | None  # discards: set at once; saves: set when the buffer finalizes them


@dataclasses.dataclass(frozen=True)
class PlannerItem:
    """One Planner decision ready for training (arrays exactly as scored in the rollout)."""

    tokens: np.ndarray  # [L]
    mask: np.ndarray  # [L]
    action: int
    advantage: float
    ret: float
    rollout_logp: float  # log-probability of `action` when it was sampled (the behaviour policy)
    rollout_value: float = 0.0  # the value head's estimate then


@dataclasses.dataclass(frozen=True)
class TriggerItem:
    """One Trigger decision ready for training."""

    tokens: np.ndarray  # [C, L]
    mask: np.ndarray  # [C, L]
    cand_mask: np.ndarray  # [C]
    action: int
    advantage: float
    ret: float
    rollout_logp: float
    rollout_value: float = 0.0


@dataclasses.dataclass(frozen=True)
class Slot:
    """One turn slot of a joint minibatch; either decision may be absent (masked out)."""

    planner: PlannerItem | None
    trigger: TriggerItem | None


def build_slots(records: Sequence[TurnRecord], ready: Sequence[TurnRecord], *, reward: RewardConfig, ppo: PPOConfig,
                planner_rule: str = "policy", trigger_rule: str = "policy") -> list[Slot]:
    """Training slots with GAE advantages per agent (one trajectory per episode; holdovers alone): `records` are
    the turns played since the last update, `ready` earlier saves whose reward arrived now; an agent decided by
    a rule (an ablation's `planner_rule` / `trigger_rule` other than "policy") contributes no decisions."""
    entries = [(rec, rec.episode_key) for rec in records] + [(rec, -1 - i) for i, rec in enumerate(ready)]
    n = len(entries)
    n_current = len(records)  # entries after these are holdovers: Planner saves without a Trigger decision
    adv_ret = {}
    for agent in ("planner", "trigger"):
        length = bucket(max(n, 1), 64)
        rewards, values = np.zeros(length, np.float32), np.zeros(length, np.float32)
        mask, dones = np.zeros(length, bool), np.zeros(length, bool)
        last_of: dict[int, int] = {}
        ruled = trigger_rule if agent == "trigger" else planner_rule
        for i, (rec, key) in enumerate(entries):
            if ruled != "policy":  # an ablation's rule decides for this agent: nothing to train
                continue
            if agent == "trigger":
                ok, r, v = i < n_current and rec.r_qual is not None, rec.r_qual, rec.receipt.trigger.value
            else:  # raw r_truth / miss penalty, onto [0, 1] when config.reward.normalize
                ok, v = rec.planner_reward is not None, rec.receipt.planner.value
                r = float(planner_training_reward(rec.planner_reward, reward)) if ok else None
            if ok:
                rewards[i], values[i], mask[i] = r, v, True
                last_of[key] = i
        dones[list(last_of.values())] = True  # the last real step of each trajectory: nothing bootstraps
        adv, ret = compute_advantages(rewards, values, dones, mask, None, ppo)
        adv_ret[agent] = (np.asarray(adv), np.asarray(ret), mask)
    slots = []
    for i, (rec, _) in enumerate(entries):
        p_adv, p_ret, p_mask = adv_ret["planner"]
        t_adv, t_ret, t_mask = adv_ret["trigger"]
        pd, td = rec.receipt.planner, rec.receipt.trigger
        p = PlannerItem(pd.tokens, pd.mask, int(pd.save), float(p_adv[i]), float(p_ret[i]), pd.logp,
                        pd.value) if p_mask[i] else None
        t = TriggerItem(td.tokens, td.mask, td.cand_mask, td.action, float(t_adv[i]), float(t_ret[i]), td.logp,
                        td.value) if t_mask[i] else None
        if p is not None or t is not None:
            slots.append(Slot(p, t))
    return slots
