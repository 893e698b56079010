"""Reward and PPO settings as frozen, hashable dataclasses (paper defaults), buildable from plain dicts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from icml_jax.configlib import known_fields

_C = TypeVar("_C")

UNTRIGGERED_POLICIES: tuple[str, ...] = ("proxy", "defer")
MULTI_TRIGGER_POLICIES: tuple[str, ...] = ("first", "max", "mean")
REWARD_SOURCES: tuple[str, ...] = ("judge", "likelihood")  # RewardConfig.source
LIKELIHOOD_MATCHES: tuple[str, ...] = ("pair", "utterance")  # RewardConfig.likelihood_match
LIKELIHOOD_KEYS: tuple[str, ...] = ("likelihood_scale", "likelihood_later_turns", "likelihood_match",
                                    "likelihood_control")  # the likelihood reward's settings (provenance)
USER_MISMATCH_POLICIES: tuple[str, ...] = ("raise", "count")
OLD_LOGP_SOURCES: tuple[str, ...] = ("rollout", "recompute")


def _from_dict(cls: type[_C], values: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> _C:
    """Build `cls` from a mapping plus keyword overrides, naming any unknown key (a typo must not pass silently)."""
    return cls(**known_fields(cls, values, **overrides))


def _check_finite(owner: str, **values: float) -> None:
    """Raise naming the field when a numeric setting is not a finite number."""
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{owner}.{name} must be a finite number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """How per-turn judge scores become rewards for the Planner and Trigger, and how pending saves resolve.

    Scales: the judges' r_proxy and r_qual are in [0, 1], so the Trigger's reward (r_qual) is too; a save earns
    r_truth = r_proxy - save_cost + truth_lambda * r_qual(future) * 1[triggered], in [-save_cost,
    1 - save_cost + truth_lambda] (up to 1.5 with the defaults); a discard earns 0 or the miss penalty, down to
    -alpha. `normalize` (default, as the paper normalises rewards to [0, 1]) maps the Planner's reward affinely
    from those bounds (`rewards.planner_reward_bounds`) onto [0, 1] before advantages are computed (online and
    for the warm-up's value targets); ordering and differences keep their meaning, metrics stay in raw units.

    - `alpha`: miss-penalty weight; discarding a turn with r_proxy >= `high_value_threshold` earns -alpha * r_proxy.
    - `save_cost`: a constant subtracted from every save's reward (0 = the paper's reward; > 0 discourages
      hoarding).
    - `truth_lambda`: weight of the future reply quality in r_truth = r_proxy + lambda * r_qual(future).
    - `untriggered`: what `PendingRewardBuffer.finalize` does with a save that was never triggered:
      "proxy" = it is finalized with its proxy reward (r_truth with 1[triggered] = 0) at every update, so every
      save is trained on in the update that follows it; "defer" = it stays pending (and the learner leaves it
      out of the update) until it is triggered or its user is closed (episode / user ended) or `force=True`.
    - `multi_trigger`: how several triggers of one fragment before its finalization combine into r_qual(future):
      "first" (default: the first retrieval is the one the save caused; later ones are counted, not used),
      "max" or "mean" of all triggers so far.
    - `user_mismatch`: a trigger whose user differs from the fragment's owner means memory isolation broke:
      "raise" (default) raises `UserMismatchError` and changes nothing; "count" ignores it and counts it.
    - `normalize`: train on Planner rewards mapped onto [0, 1] (see Scales); False = the raw scale.
    - `source`: where r_proxy and r_qual come from: "judge" (the LLM judges, the paper's) or "likelihood" (the
      generator's likelihood of the episode's own gold turns, `rl.likelihood`; local back ends only), whose
      memory gains (nats per token) become sigmoid(gain / `likelihood_scale`) and whose proxy reads the
      `likelihood_later_turns` most similar gold turns of later sessions: similar by the gold turn and its
      utterance together (`likelihood_match` "pair") or by the utterance alone ("utterance", as a Trigger
      sees it, so a later turn is not picked for repeating the memory's words). `likelihood_control`: the
      proxy is the turn's gain less a control text's on the same later turns (a turn of another episode
      played in the same tick, of the closest length), so any text's gain in the memory slot earns nothing.
    """

    alpha: float = 1.0
    high_value_threshold: float = 0.5
    save_cost: float = 0.0
    truth_lambda: float = 0.5
    untriggered: str = "proxy"
    multi_trigger: str = "first"
    user_mismatch: str = "raise"
    normalize: bool = True
    source: str = "judge"
    likelihood_scale: float = 0.1
    likelihood_later_turns: int = 2
    likelihood_match: str = "pair"
    likelihood_control: bool = False

    def __post_init__(self) -> None:
        """Reject settings that would make rewards meaningless, naming the field."""
        _check_finite(
            "RewardConfig",
            alpha=self.alpha,
            high_value_threshold=self.high_value_threshold,
            save_cost=self.save_cost,
            truth_lambda=self.truth_lambda,
            likelihood_scale=self.likelihood_scale,
        )
        if self.source not in REWARD_SOURCES:
            raise ValueError(f"RewardConfig.source must be one of {REWARD_SOURCES}, got {self.source!r}")
        if not self.likelihood_scale > 0 or isinstance(self.likelihood_later_turns, bool) \
                or not isinstance(self.likelihood_later_turns, int) or self.likelihood_later_turns < 1:
            raise ValueError(f"RewardConfig: likelihood_scale must be > 0 and likelihood_later_turns an int >= 1, got "
                             f"{self.likelihood_scale!r}, {self.likelihood_later_turns!r}")
        if self.alpha < 0 or self.save_cost < 0 or self.truth_lambda < 0:
            raise ValueError(
                f"RewardConfig: alpha, save_cost and truth_lambda must be >= 0, got "
                f"{self.alpha}, {self.save_cost}, {self.truth_lambda}"
            )
        for name in ("normalize", "likelihood_control"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RewardConfig.{name} must be a bool, got {getattr(self, name)!r}")
        for name, allowed in (
            ("untriggered", UNTRIGGERED_POLICIES),
            ("multi_trigger", MULTI_TRIGGER_POLICIES),
            ("user_mismatch", USER_MISMATCH_POLICIES),
            ("likelihood_match", LIKELIHOOD_MATCHES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"RewardConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None = None, **overrides: Any) -> RewardConfig:
        """Build from a mapping (e.g. an ml_collections ConfigDict's `to_dict()`) plus keyword overrides."""
        return _from_dict(cls, values, overrides)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for logging and checkpoint metadata)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters (paper: eps 0.2, gamma 0.99, GAE lambda 0.95, actor lr 1e-6, critic lr 1e-5, batch 4).

    Hashable, so a jitted function can take it as a static argument. `value_clip` None = plain squared error;
    a float c = PPO2-style clipping of the new value to old_value +/- c. `max_grad_norm` None = no clipping.
    `whiten`: normalise advantages to zero mean and unit variance per agent and update (as tunix does; the
    paper does not say).
    `old_logp`: the anchor of the importance ratio. "rollout" (default, PPO as published): the log-probabilities
    and values recorded when each action was sampled, i.e. under the behaviour policy, which for a decision
    whose reward arrived episodes later is an older policy; "recompute": each minibatch's own first-epoch
    forward (ratio exactly 1 in epoch 0, so nothing is clipped until epoch 1).
    `lora_lr`: the LoRA adapters' learning rate when it should differ from the heads' (None: `actor_lr` for both,
    the paper's one actor learning rate; the heads are ours, new and randomly initialised).
    `update_dropout`: LoRA dropout in the update's forward. Off by default: rollouts score with dropout off,
    so the update's log-probabilities are then comparable with the recorded ones (with it on, dropout noise
    enters the "rollout" ratio).
    """

    clip_eps: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    gamma: float = 0.99
    gae_lambda: float = 0.95
    whiten: bool = True
    actor_lr: float = 1e-6
    critic_lr: float = 1e-5
    max_grad_norm: float | None = 1.0
    weight_decay: float = 0.0
    epochs: int = 4
    minibatch_size: int = 4
    value_clip: float | None = None
    old_logp: str = "rollout"
    update_dropout: bool = False
    lora_lr: float | None = None

    def __post_init__(self) -> None:
        """Reject out-of-range settings, naming the field."""
        _check_finite(
            "PPOConfig",
            clip_eps=self.clip_eps,
            value_coef=self.value_coef,
            entropy_coef=self.entropy_coef,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            actor_lr=self.actor_lr,
            critic_lr=self.critic_lr,
            weight_decay=self.weight_decay,
        )
        if not self.clip_eps > 0:
            raise ValueError(f"PPOConfig.clip_eps must be > 0, got {self.clip_eps}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PPOConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("value_coef", "entropy_coef", "actor_lr", "critic_lr", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"PPOConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.lora_lr is not None:
            _check_finite("PPOConfig", lora_lr=self.lora_lr)
            if self.lora_lr < 0:
                raise ValueError(f"PPOConfig.lora_lr must be >= 0 or None, got {self.lora_lr}")
        for name in ("max_grad_norm", "value_clip"):
            value = getattr(self, name)
            if value is not None:
                _check_finite("PPOConfig", **{name: value})
                if not value > 0:
                    raise ValueError(f"PPOConfig.{name} must be > 0 or None, got {value}")
        for name in ("epochs", "minibatch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PPOConfig.{name} must be a positive int, got {value!r}")
        for name in ("whiten", "update_dropout"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PPOConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.old_logp not in OLD_LOGP_SOURCES:
            raise ValueError(f"PPOConfig.old_logp must be one of {OLD_LOGP_SOURCES}, got {self.old_logp!r}")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None = None, **overrides: Any) -> PPOConfig:
        """Build from a mapping (e.g. an ml_collections ConfigDict's `to_dict()`) plus keyword overrides."""
        return _from_dict(cls, values, overrides)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for logging and checkpoint metadata)."""
        return dataclasses.asdict(self)
