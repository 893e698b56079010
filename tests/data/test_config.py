"""DataConfig: the typed `data` block, its defaults those of configs/base.py, its keys and values checked."""

from __future__ import annotations

import pytest

from icml_jax.data.config import DataConfig, data_config
from icml_jax.data.persona_world import PersonaWorldConfig
from icml_jax.run.runspec import RunSpec
from tests.config_files import load_config


def test_the_base_data_block_is_the_dataclass_defaults_and_the_runspec_builds_it_once():
    base = load_config("base")
    assert base.data.to_dict() == DataConfig().to_dict()
    spec = RunSpec.from_config(base)
    assert spec.data == DataConfig() == data_config(base) and spec.data is spec.data
    assert spec.world is spec.data.world and spec.world == PersonaWorldConfig()
    base.data.data_dir, base.data.max_session_turns = "/tmp/tfds", 4  # the placeholders stay settable
    assert (base.data.data_dir, base.data.max_session_turns) == ("/tmp/tfds", 4)


def test_a_partial_block_takes_the_defaults_and_an_unknown_key_is_named():
    data = DataConfig.from_config({"name": "msc", "world": {"num_sessions": 3}})
    assert data == DataConfig(name="msc", world=PersonaWorldConfig(num_sessions=3))
    assert DataConfig.from_config(None) == DataConfig.from_config({"world": None}) == DataConfig()
    assert data_config(data) is data
    with pytest.raises(ValueError, match=r"DataConfig: unknown key\(s\) \['train_episode'\]"):
        DataConfig.from_config({"train_episode": 3})


@pytest.mark.parametrize("values, message", [
    (dict(name="imdb"), "config.data.name='imdb' is not one of"),
    (dict(train_episodes=0), "config.data.train_episodes must be an int >= 1, got 0"),
    (dict(train_episodes=True), "config.data.train_episodes must be an int >= 1, got True"),
    (dict(eval_episodes=-1), "config.data.eval_episodes must be an int >= 0, got -1"),
    (dict(name="msc", max_session_turns=1), "config.data.max_session_turns must be None or an int >= 2"),
    (dict(name="msc", max_session_turns=True), "config.data.max_session_turns must be None or an int >= 2"),
    (dict(max_session_turns=4), "config.data.name='persona_world' sizes its sessions in config.data.world"),
    (dict(train_final_sessions="yes"), "config.data.train_final_sessions must be a bool, got 'yes'"),
    (dict(world={"num_sessions": 1}), "config.data.world: num_sessions must be >= 2"),
    (dict(world={"sessions": 3}), "config.data.world: .*sessions"),
])
def test_each_bad_value_is_refused_naming_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        DataConfig.from_config(values)
