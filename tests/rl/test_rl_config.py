"""RewardConfig / PPOConfig: paper defaults, dict construction, validation that names the field."""

import dataclasses

import pytest

from icml_jax.rl import PPOConfig, RewardConfig


def test_paper_defaults():
    p, r = PPOConfig(), RewardConfig()
    assert (p.clip_eps, p.gamma, p.gae_lambda, p.actor_lr, p.critic_lr, p.minibatch_size) == (
        0.2, 0.99, 0.95, 1e-6, 1e-5, 4,
    )
    assert p.value_clip is None
    assert r.truth_lambda == 0.5 and r.untriggered == "proxy" and r.multi_trigger == "first"
    assert r.user_mismatch == "raise" and r.save_cost == 0.0


def test_from_dict_merges_overrides_and_round_trips():
    p = PPOConfig.from_dict({"clip_eps": 0.1, "epochs": 2}, value_clip=0.3)
    assert (p.clip_eps, p.epochs, p.value_clip) == (0.1, 2, 0.3)
    assert PPOConfig.from_dict(p.to_dict()) == p
    r = RewardConfig.from_dict(None, untriggered="defer")
    assert RewardConfig.from_dict(r.to_dict()) == r


def test_configs_are_hashable_and_frozen():
    hash(PPOConfig())
    hash(RewardConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        PPOConfig().clip_eps = 0.3  # type: ignore[misc]


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (PPOConfig, {"clip_eps": 0.0}, "clip_eps"),
        (PPOConfig, {"gamma": 1.5}, "gamma"),
        (PPOConfig, {"actor_lr": float("nan")}, "actor_lr"),
        (PPOConfig, {"minibatch_size": 0}, "minibatch_size"),
        (PPOConfig, {"value_clip": -1.0}, "value_clip"),
        (PPOConfig, {"max_grad_norm": 0.0}, "max_grad_norm"),
        (PPOConfig, {"clipp_eps": 0.2}, "clipp_eps"),
        (RewardConfig, {"untriggered": "never"}, "untriggered"),
        (RewardConfig, {"multi_trigger": "sum"}, "multi_trigger"),
        (RewardConfig, {"user_mismatch": "warn"}, "user_mismatch"),
        (RewardConfig, {"alpha": -1.0}, "alpha"),
        (RewardConfig, {"truth_lambda": float("inf")}, "truth_lambda"),
    ],
)
def test_bad_settings_name_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=field):
        cls.from_dict(kwargs)
