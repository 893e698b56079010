"""BackboneConfig: the typed `model` block, its defaults those of configs/base.py, its keys and values checked."""

from __future__ import annotations

import pytest

from icml_jax.models.backbone import BackboneConfig, backbone_config
from tests.config_files import load_config


def test_the_base_model_block_is_the_dataclass_defaults_and_the_policy_follows_it():
    base = load_config("base")
    assert base.model.to_dict() == BackboneConfig().to_dict() and backbone_config(base) == BackboneConfig()
    base.model.path, base.model.trigger_hidden, base.model.dtype = "/models/x", 32, "float32"  # placeholders settable
    assert (base.policy.planner_model, base.policy.dtype) == ("/models/x", "float32")  # linked to the model block
    assert backbone_config(base) == BackboneConfig(path="/models/x", trigger_hidden=32, dtype="float32")


def test_a_partial_block_takes_the_defaults_and_an_unknown_key_is_named():
    model = BackboneConfig.from_config({"kind": "tiny", "hidden": 16})
    assert model == BackboneConfig(kind="tiny", hidden=16) and backbone_config(model) is model
    assert BackboneConfig.from_config(None) == BackboneConfig.from_config({}) == BackboneConfig()
    with pytest.raises(ValueError, match=r"BackboneConfig: unknown key\(s\) \['hiden'\]"):
        BackboneConfig.from_config({"hiden": 16})


@pytest.mark.parametrize("values, message", [
    (dict(kind="huge"), "config.model.kind='huge' is not 'pretrained' or 'tiny'"),
    (dict(path=3), "config.model.path must be None or a str"),
    (dict(dtype="float64"), r"config.model.dtype='float64' is not one of \('bfloat16', 'float32', 'float16'\)"),
    (dict(hidden=0), "config.model.hidden must be an int >= 1, got 0"),
    (dict(layers=True), "config.model.layers must be an int >= 1, got True"),
    (dict(tiny_lora="yes"), "config.model.tiny_lora must be a bool, got 'yes'"),
    (dict(trigger_hidden=0), "config.model.trigger_hidden must be None or an int >= 1, got 0"),
])
def test_each_bad_value_is_refused_naming_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        BackboneConfig.from_config(values)
