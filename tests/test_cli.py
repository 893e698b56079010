"""icml_jax.run.cli: `--config.KEY=None` overrides, split from the rest and applied as None (the command line's
end-to-end check is tests/test_main.py::test_cli_overrides)."""

from __future__ import annotations

import ml_collections
import pytest
from ml_collections import config_dict

from icml_jax.configlib import ConfigError
from icml_jax.run.cli import set_to_none, split_none_overrides


def test_only_config_overrides_whose_value_is_exactly_none_are_split_off():
    argv = ["prog", "--config=configs/demo.py", "--config.eval.mauve_model=None", "--workdir=None",
            "--config.eval.tfds_name=none", "--config.a.b=None2", "--config.=None", "--config.x.y=None", "--debug"]
    rest, keys = split_none_overrides(argv)
    assert keys == ["eval.mauve_model", "x.y"]
    assert rest == ["prog", "--config=configs/demo.py", "--workdir=None", "--config.eval.tfds_name=none",
                    "--config.a.b=None2", "--config.=None", "--debug"]


def test_set_to_none_sets_strings_numbers_and_placeholders_on_a_locked_config():
    config = ml_collections.ConfigDict({"eval": {"mauve_model": "/models/x", "reply_temperature": 0.7,
                                                 "tfds_name": config_dict.placeholder(str)}})
    config.lock()
    set_to_none(config, ["eval.mauve_model", "eval.reply_temperature", "eval.tfds_name"])
    assert config.eval.to_dict() == {"mauve_model": None, "reply_temperature": None, "tfds_name": None}


@pytest.mark.parametrize("key", ["eval.nokey", "nokey.x", "eval.mauve_model.deeper"])
def test_set_to_none_names_the_flag_of_a_key_the_config_lacks(key):
    config = ml_collections.ConfigDict({"eval": {"mauve_model": "/models/x"}})
    with pytest.raises(ConfigError, match=rf"--config\.{key}=None: no such key"):
        set_to_none(config, [key])
    assert config.eval.mauve_model == "/models/x"
