"""`load_config`: a config file by path (FILE.py[:ARG]) with dotted overrides, as the command line gives it."""

from __future__ import annotations

import json

import pytest

from icml_jax.configlib import ADDED_KEYS, config_differences, load_config


def test_loads_by_path_with_arg_and_overrides(tmp_path, monkeypatch):
    config = load_config("configs/demo_smollm2.py:tiny_offline", {"learner.update_every": 4, "seed": 7})
    assert config.learner.update_every == 4 and config.seed == 7
    assert config.model.kind == "tiny"  # the ":tiny_offline" argument reached get_config
    monkeypatch.chdir(tmp_path)  # a notebook's folder: relative paths fall back to the package's checkout
    from icml_jax.configlib import CHECKOUT

    assert load_config("configs/demo.py").to_dict() == load_config(CHECKOUT / "configs" / "demo.py").to_dict()
    (tmp_path / "mine.py").write_text("import ml_collections\n\ndef get_config(arg='a'):\n"
                                      "    return ml_collections.ConfigDict({'arg': arg, 'block': {'x': 1}})\n")
    assert load_config("mine.py:b").arg == "b" and load_config(tmp_path / "mine.py").arg == "a"


def test_a_missing_file_or_override_key_names_it(tmp_path):
    with pytest.raises(ValueError, match="no config file 'configs/nope.py'"):
        load_config("configs/nope.py")
    with pytest.raises(ValueError, match="override 'learner.update_evry': config has no field 'update_evry'"):
        load_config("configs/demo.py", {"learner.update_evry": 2})
    with pytest.raises(ValueError, match="override 'lerner.x': config has no field 'lerner'"):
        load_config("configs/demo.py", {"lerner.x": 2})


def test_config_differences_compare_as_json_and_read_added_keys_as_their_defaults():
    stored = {"a": {"b": (1, 2), "c": "x"}, "policy": {"seed": 0}, "limits": {"n": 1}}
    current = {"a": {"b": [1, 2], "c": "x"}, "policy": {"seed": 0}, "limits": {"n": 2}}
    for key, value in ADDED_KEYS.items():  # a current config holds every added key, at its default here
        *parents, leaf = key.split(".")
        node = current
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    assert config_differences(stored, current) == ["limits.n"]
    assert config_differences(stored, current, ignore=("limits.",)) == []
    current["policy"]["remat"] = "full"
    current["a"]["d"] = 3
    assert config_differences(stored, current, ignore=("limits.",)) == ["a.d", "policy.remat"]
    # a block that neither holds (a run's stored config has no `eval`): its added keys are not compared
    run_stored, run_current = {"policy": {"seed": 0}}, {"policy": {"seed": 0, "remat": "none"}}
    assert config_differences(run_stored, run_current) == []
    assert config_differences(run_stored, {"policy": {"seed": 0, "remat": "full"}}) == ["policy.remat"]
    assert config_differences(run_stored, {**run_current, "eval": {"memory_gain": True}}) == ["eval.memory_gain"]


def test_a_back_end_blocks_structured_output_left_to_its_kind_equals_the_kinds_mode_spelt_out():
    base = load_config("configs/base.py").to_dict()
    assert base["llm"]["judge"]["structured_output"] is None  # each kind's own mode
    stored = json.loads(json.dumps(base))
    stored["llm"]["judge"]["structured_output"] = "json_schema"  # what the block held before: Gemini's mode
    assert config_differences(stored, base) == []  # a run stored then still resumes
    for kind, other in (("gemini", "mime_only"), ("openai", "json_schema")):  # anything else is a difference
        stored["llm"]["judge"].update(kind=kind, structured_output=other)
        current = json.loads(json.dumps(base))
        current["llm"]["judge"]["kind"] = kind
        assert config_differences(stored, current) == ["llm.judge.structured_output"]


def test_a_back_end_blocks_switchable_knobs_left_none_equal_their_absence():
    """A block that gained the remote knobs as None placeholders (base.backend_block) still equals the block
    stored without them: None there is the kind's default, as absence is; a set knob is a difference."""
    current = load_config("configs/demo.py").to_dict()
    stored = json.loads(json.dumps(current))
    stored["llm"]["judge"] = {"kind": "offline"}
    assert current["llm"]["judge"]["base_url"] is None and config_differences(stored, current) == []
    current["llm"]["judge"]["base_url"] = "http://127.0.0.1:8000/v1"
    assert config_differences(stored, current) == ["llm.judge.base_url"]
