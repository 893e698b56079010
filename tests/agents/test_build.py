"""Policies from the config: backbones loaded from local HF directories, LoRA on them, shared or separate."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from icml_jax.agents.build import PolicyConfig, build_policies, default_config
from icml_jax.agents.policy import TRAINABLE
from icml_jax.models.lora import LoraConfig
from tests.models import hf_fixtures as F


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    out = {}
    for kind in ("qwen3", "llama"):
        out[kind] = tmp_path_factory.mktemp(kind)
        F.build(kind, out[kind])
    return out


def count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def test_shared_backbone_from_config(dirs):
    cfg = default_config()
    cfg.planner_model, cfg.dtype = str(dirs["qwen3"]), "float32"
    policies = build_policies(cfg, LoraConfig(rank=4))
    assert policies.shared_backbone
    lora = nnx.state(policies, nnx.LoRAParam)
    assert count(lora) > 0
    trainable = nnx.state(policies, TRAINABLE)
    heads = sum(count(nnx.state(getattr(policies, h))) for h in
                ("planner_actor", "planner_critic", "trigger_actor", "trigger_critic"))
    assert count(trainable) == count(lora) + heads  # adapters (once) and heads, nothing of the base


def test_two_backbones_of_different_families(dirs):
    cfg = default_config()
    cfg.planner_model, cfg.trigger_model, cfg.dtype = str(dirs["qwen3"]), str(dirs["llama"]), "float32"
    cfg.remat = "dots"
    policies = build_policies(cfg, {"rank": 2, "alpha": 4.0, "dropout": 0.0})
    assert not policies.shared_backbone
    assert policies.planner_backbone.config.family == "qwen3" and policies.trigger_backbone.config.family == "llama"
    assert policies.planner_backbone.remat == policies.trigger_backbone.remat == "dots"


def test_missing_planner_model_is_a_clear_error():
    with pytest.raises(ValueError, match="planner_model"):
        build_policies(default_config())


def test_an_unknown_remat_policy_is_an_error_before_any_weight_loads():
    cfg = default_config()
    cfg.planner_model, cfg.remat = "/nowhere", "everything"
    with pytest.raises(ValueError, match=r"policy.remat='everything' is not one of \['dots', 'full', 'none'\]"):
        build_policies(cfg)


def test_base_config_policy_block_follows_model_path():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("base_config", Path(__file__).parents[2] / "configs" / "base.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.model.path = "/models/Qwen3-1.7B"
    assert config.policy.planner_model == "/models/Qwen3-1.7B" and config.policy.trigger_model is None
    config.policy.trigger_model = "/models/Qwen3-8B"  # the mixed-size grid
    assert config.policy.planner_model == "/models/Qwen3-1.7B"


def test_policy_block_is_typed_once_and_refuses_bad_values():
    assert PolicyConfig.from_config(default_config()) == PolicyConfig()  # the block is the dataclass' defaults
    assert default_config().to_dict() == PolicyConfig().to_dict()
    with pytest.raises(ValueError, match=r"config.policy: unknown key\(s\) \['polling'\]"):
        PolicyConfig.from_config({"polling": "mean"})
    with pytest.raises(ValueError, match=r"config.policy.pooling='max' is not one of \('last', 'mean'\)"):
        PolicyConfig.from_config({"pooling": "max"})
    with pytest.raises(ValueError, match="config.policy.match_rank must be an int >= 0, got -1"):
        PolicyConfig(match_rank=-1)
    with pytest.raises(ValueError, match="config.policy.suffix_slots must be an int >= 1, got True"):
        PolicyConfig(suffix_slots=True)
    with pytest.raises(ValueError, match="config.policy.dtype='int8'"):
        PolicyConfig(dtype="int8")
    cfg = default_config()
    cfg.planner_model = "/models/x"  # a placeholder takes a str from flags; None stays None
    assert PolicyConfig.from_config(cfg).planner_model == "/models/x" and PolicyConfig().trigger_model is None
