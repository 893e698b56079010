"""RunSpec: every typed config of a run built once from the ConfigDict, and configs/base.py's blocks equal to
their dataclasses' defaults (each default is defined once, in its dataclass)."""

from __future__ import annotations

import dataclasses

import pytest

from icml_jax.agents.agent import LEARNER_KEYS, AgentConfig
from icml_jax.agents.observation import ObservationConfig
from icml_jax.configlib import ConfigError, field_default
from icml_jax.data.persona_world import PersonaWorldConfig
from icml_jax.models.backbone import BackboneConfig
from icml_jax.rl.config import PPOConfig, RewardConfig
from icml_jax.rl.divergence import DivergenceConfig
from icml_jax.rl.learner import LearnerConfig
from icml_jax.run.runspec import LEARNER_LOOP_KEYS, CheckpointConfig, EvalConfig, OnlineConfig, RunSpec
from icml_jax.synthesis.config import SynthesisConfig
from icml_jax.textcheck import TextLimits
from icml_jax.train.supervised import RUN_FIELDS, WarmupConfig
from tests.config_files import load_config


def test_the_base_config_blocks_are_the_dataclass_defaults():
    base = load_config("base")
    spec = RunSpec.from_config(base)
    assert dict(base.observation) == dataclasses.asdict(ObservationConfig()) and spec.observation == ObservationConfig()
    assert base.rl.ppo.to_dict() == PPOConfig().to_dict() and spec.ppo == PPOConfig()
    assert base.rl.reward.to_dict() == RewardConfig().to_dict() and spec.reward == RewardConfig()
    assert not set(RUN_FIELDS) & set(base.warmup)  # the warm-up sees the run's observation and rewards
    assert spec.warmup == WarmupConfig()
    assert spec.synthesis == SynthesisConfig() and spec.world == PersonaWorldConfig()
    assert {k: base.learner[k] for k in LEARNER_KEYS} == {k: getattr(AgentConfig(), k) for k in LEARNER_KEYS}
    assert {k: base.learner[k] for k in LEARNER_LOOP_KEYS} == {k: getattr(LearnerConfig(), k)
                                                              for k in LEARNER_LOOP_KEYS}
    assert base.learner.divergence.to_dict() == DivergenceConfig().to_dict()
    assert spec.agent == AgentConfig() and spec.learner == LearnerConfig()
    assert base.online.to_dict() == dataclasses.asdict(OnlineConfig()) and spec.online == OnlineConfig()
    assert base.checkpoint.to_dict() == dataclasses.asdict(CheckpointConfig()) and spec.checkpoint == CheckpointConfig()
    assert dict(base.limits) == dataclasses.asdict(TextLimits()) and spec.limits == TextLimits()
    assert base.eval.to_dict() == EvalConfig().to_dict() and spec.eval == EvalConfig()


def test_the_eval_block_is_typed_and_refuses_what_cannot_run():
    assert EvalConfig.from_config(None) == EvalConfig.from_config({}) == EvalConfig()  # no block: the defaults
    config = load_config("gc_smollm2")
    ev = RunSpec.from_config(config).eval
    assert (ev.episodes, ev.reply_temperature, ev.bertscore_layer) == (13, 0.0, 6) and ev.prices == {}
    for key, value, message in (("reply_temperature", 3.0, r"eval.reply_temperature must be a number in \[0, 2\]"),
                                ("selection", "random", "eval.selection must be one of"),
                                ("episodes", 0, "eval.episodes must be a positive int"),
                                ("max_failed_fraction", 1.5, r"eval.max_failed_fraction must be in \[0, 1\]")):
        with pytest.raises(ValueError, match=message):
            EvalConfig.from_config({"eval": {key: value}})
    with pytest.raises(ValueError, match=r"EvalConfig: unknown key\(s\) \['episode'\]"):
        EvalConfig.from_config({"eval": {"episode": 5}})


def test_each_block_is_built_once_and_missing_keys_take_the_dataclass_defaults():
    config = load_config("demo")
    with config.unlocked():
        for key in ("users_in_flight", "reply_max_tokens", "supersede_candidates"):
            del config.learner[key]
        del config["online"], config["checkpoint"]
    spec = RunSpec.from_config(config)
    assert spec.learner is spec.learner and spec.agent is spec.learner.agent  # built once, shared
    assert spec.learner.users_in_flight == field_default(LearnerConfig, "users_in_flight")
    assert spec.agent.reply_max_tokens == field_default(AgentConfig, "reply_max_tokens")
    assert spec.agent.supersede_candidates == field_default(AgentConfig, "supersede_candidates")
    assert spec.online == OnlineConfig() and spec.checkpoint == CheckpointConfig()
    assert spec.agent.observation is spec.observation and spec.warmup.observation is spec.observation
    assert spec.warmup.rewards is spec.reward and spec.learner.reward is spec.reward


def test_a_bad_block_fails_when_read_naming_the_class_and_a_typo_is_an_error():
    config = load_config("demo")
    config.checkpoint.keep = 2
    with config.unlocked():
        config.online.eval_befor = True
    spec = RunSpec.from_config(config)
    assert spec.checkpoint.keep == 2
    with pytest.raises(ValueError, match=r"OnlineConfig: unknown key\(s\) \['eval_befor'\]"):
        spec.online
    with pytest.raises(ValueError, match="field_default: AgentConfig has no field 'nope'"):
        field_default(AgentConfig, "nope")


def test_validate_fills_the_spec_the_run_reads(tmp_path):
    from icml_jax.run.validation import validate

    spec = RunSpec.from_config(load_config("demo"))
    assert validate(spec.config, tmp_path, spec) == ("synthesize", "warmup", "online")
    built = set(vars(spec))  # cached_property keeps each block in the instance's __dict__
    assert {"observation", "ppo", "reward", "world", "limits", "synthesis", "warmup", "learner", "agent", "online",
            "checkpoint"} <= built


def test_the_model_block_is_built_once_and_validate_names_a_bad_value(tmp_path):
    from icml_jax.run.validation import validate

    spec = RunSpec.from_config(load_config("base"))
    assert spec.model == BackboneConfig() and spec.model is spec.model
    config = load_config("demo")
    assert RunSpec.from_config(config).model == BackboneConfig(kind="tiny", dtype="float32")
    for key, value, message in (("kind", "huge", "config.model.kind='huge' is not 'pretrained' or 'tiny'"),
                                ("dtype", "float64", "config.model.dtype='float64' is not one of")):
        bad = load_config("demo")
        bad.model[key] = value
        with pytest.raises(ConfigError, match=message):
            validate(bad, tmp_path)


def test_the_llm_block_is_built_once_and_validate_names_a_bad_role(tmp_path):
    from icml_jax.run.validation import validate

    spec = RunSpec.from_config(load_config("demo"))
    assert spec.llm is spec.llm and spec.llm.kind("judge") == "offline"
    bad = load_config("demo")
    with bad.unlocked():
        bad.llm.judges = {"kind": "offline"}
    with pytest.raises(ConfigError, match=r"config.llm: unknown role\(s\) \['judges'\]"):
        validate(bad, tmp_path)
    bad = load_config("demo")
    bad.llm.judge.kind = "gpt"
    with pytest.raises(ConfigError, match="config.llm.judge: unknown LLM back end kind 'gpt'"):
        validate(bad, tmp_path)


def test_the_parallel_lora_and_baselines_blocks_are_typed_once(tmp_path):
    from icml_jax import parallel
    from icml_jax.models.lora import LoraConfig
    from icml_jax.run.baseline_defaults import BASELINE_DEFAULTS
    from icml_jax.run.validation import validate

    base = load_config("base")
    spec = RunSpec.from_config(base)
    assert spec.parallel.mesh == {"data": 1, "fsdp": -1, "tensor": 1} and spec.parallel is spec.parallel
    assert spec.parallel.rules == parallel.DEFAULT_RULES and spec.parallel.distributed["initialization_timeout"] == 300
    assert spec.lora == LoraConfig.from_config(base.lora) and spec.baselines == BASELINE_DEFAULTS
    assert parallel.ParallelConfig.from_config(None) == spec.parallel  # no block: default_config()'s values
    partial = parallel.ParallelConfig.from_config({"mesh": {"data": 2, "fsdp": 1, "tensor": 1}})
    assert partial.mesh["data"] == 2 and partial.rules == parallel.DEFAULT_RULES
    assert parallel.ParallelConfig.from_config({"mesh": {"tensor": 2}}).mesh == {"data": 1, "fsdp": -1, "tensor": 2}
    with pytest.raises(ValueError, match=r"config.parallel: unknown key\(s\) \['meshes'\]"):
        parallel.ParallelConfig.from_config({"meshes": {}})
    config = load_config("demo")
    config.baselines.top_k = 7
    config.baselines.mem0.similar = 2
    got = RunSpec.from_config(config).baselines
    assert got["top_k"] == 7 and got["mem0"]["similar"] == 2 and got["mem0"]["max_facts"] == 5
    assert BASELINE_DEFAULTS["top_k"] == 3  # the defaults stay untouched
    bad = load_config("demo")
    with bad.unlocked():
        bad.parallel.meshh = {"data": 1}
    with pytest.raises(ConfigError, match=r"config.parallel: unknown key\(s\) \['meshh'\]"):
        validate(bad, tmp_path)


@pytest.mark.parametrize("key, value", [("keep", 0), ("every_episodes", True), ("every_episodes", -2)])
def test_the_checkpoint_block_refuses_a_count_it_cannot_keep(tmp_path, key, value):
    from icml_jax.run.validation import validate

    bad = load_config("demo")
    bad.checkpoint[key] = value
    with pytest.raises(ConfigError, match=rf"config.checkpoint: CheckpointConfig.{key} must be a positive int"):
        validate(bad, tmp_path)


# files whose `config` names a typed dataclass (or that build the typed block they are named for), not a ConfigDict
TYPED_CONFIG_FILES = ("run/runspec.py", "data/config.py", "models/backbone.py", "agents/agent.py",
                      "experiments/persona_run.py", "train/supervised.py", "synthesis/__init__.py")
RUN_BLOCKS = {"data", "model", "llm", "eval", "baselines", "learner", "parallel", "synthesis", "rl", "lora",
              "checkpoint", "online", "observation", "policy", "warmup", "limits"}


def test_no_raw_block_read_outside_the_typed_layer():
    """A run config's blocks are read through `RunSpec` (each built once, from one set of defaults): no
    `config.<block>` (nor `ctx.config.` / `run.config.`) and no `<config>.get("<block>")` outside the files that
    build the typed blocks."""
    import ast
    from pathlib import Path

    import icml_jax

    root = Path(icml_jax.__file__).parent
    bad = []
    for f in sorted(root.rglob("*.py")):
        name = f.relative_to(root).as_posix()
        if name in TYPED_CONFIG_FILES:
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in RUN_BLOCKS
                    and ast.unparse(node.value) in ("config", "ctx.config", "run.config")):
                bad.append(f"{name}:{node.lineno} config.{node.attr}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in RUN_BLOCKS
                    and "config" in ast.unparse(node.func.value)):
                bad.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert not bad, f"raw config block reads outside the typed layer: {bad}"
