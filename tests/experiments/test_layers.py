"""The package's layering: the experiments, the evaluation and the baselines sit on top; nothing below them
imports them, no library module imports the `icml_jax.main` entry point, and the LLM back ends know nothing of
the synthesis that uses them."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import icml_jax

ROOT = Path(icml_jax.__file__).parent
TOP = ("icml_jax.experiments", "icml_jax.evaluation", "icml_jax.evaluate", "icml_jax.baselines",
       "icml_jax.memory_api")
BELOW = ("agents", "rl", "train", "synthesis", "llm", "models", "data", "memory", "parallel.py", "run", "main.py",
         "chat.py", "configlib.py")
ENTRY = "icml_jax.main"  # only entry points import it: `python -m icml_jax.main`, notebooks, scripts


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-local imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out


def _files(part: str) -> list[Path]:
    path = ROOT / part
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


@pytest.mark.parametrize("part", BELOW)
def test_nothing_below_imports_the_top_layer(part):
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files(part) for m in _imports(f) if m.startswith(TOP)}
    assert not bad, f"modules below the experiments layer import it: {sorted(bad)}"


def test_no_library_module_imports_the_main_entry_point():
    files = [f for f in sorted(ROOT.rglob("*.py")) if f != ROOT / "main.py"]
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in files for m in _imports(f)
           if m == ENTRY or m.startswith(f"{ENTRY}.")}
    assert not bad, f"library modules import the entry point {ENTRY}: {sorted(bad)}"


def test_the_memory_package_imports_nothing_above_it():
    """The stores know nothing of the agents, the chat, the learner or the Memory facade built on them."""
    above = ("icml_jax.chat", "icml_jax.agents", "icml_jax.memory_api", "icml_jax.rl", "icml_jax.train",
             "icml_jax.run.stages", "icml_jax.run.pipeline", ENTRY)
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files("memory") for m in _imports(f) if m.startswith(above)}
    assert not bad, sorted(bad)


def test_the_models_import_only_the_models_and_the_process_helpers():
    """The backbone package stands alone: it may use `icml_jax.parallel`, nothing else of the package."""
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files("models") for m in _imports(f)
           if m.startswith("icml_jax") and not m.startswith(("icml_jax.models", "icml_jax.parallel"))
           and m != "icml_jax"}
    assert not bad, sorted(bad)


def test_the_llm_back_ends_do_not_import_the_synthesis():
    bad = {f"{f.relative_to(ROOT)}: {m}" for f in _files("llm") for m in _imports(f)
           if m.startswith("icml_jax.synthesis")}
    assert not bad, sorted(bad)


def test_configs_do_not_import_the_experiments():
    configs = Path(__file__).parents[2] / "configs"
    bad = {f"{f.name}: {m}" for f in configs.glob("*.py") for m in _imports(f) if m.startswith(TOP)}
    assert not bad, sorted(bad)


def test_the_demo_config_trains_as_the_persona_world_experiment():
    """configs/demo.py spells out the experiment's model and PPO settings; they must not drift apart."""
    from icml_jax.experiments.persona_run import PersonaRunConfig
    from tests.config_files import load_config

    config, run = load_config("demo"), PersonaRunConfig()
    assert (config.model.hidden, config.model.layers) == (run.hidden, run.layers)
    assert (config.policy.pooling, config.policy.match_rank) == (run.pooling, run.match_rank)
    for key, value in dataclasses.asdict(run.ppo).items():
        if key in ("actor_lr", "critic_lr", "gamma", "entropy_coef", "epochs", "minibatch_size"):
            assert config.rl.ppo[key] == value, key
    assert config.rl.reward.save_cost == run.reward.save_cost
    assert dict(config.observation) == dataclasses.asdict(run.observation)


def test_an_unregistered_offline_task_is_an_error_not_a_default_answer():
    from icml_jax.llm import offline
    from icml_jax.llm.offline import OfflineBackend, register_offline_answers
    from icml_jax.llm.types import LLMRequest

    backend = OfflineBackend()
    with pytest.raises(ValueError, match="no answer for task 'made_up_task'"):
        backend.generate([LLMRequest(prompt="x", task="made_up_task")])
    register_offline_answers(["made_up_task"], lambda task, md: f"{task}:{md['x']}")
    try:
        assert backend.generate([LLMRequest(prompt="x", task="made_up_task", metadata={"x": 1})])[0].text == \
            "made_up_task:1"
        with pytest.raises(ValueError, match="already answered"):
            register_offline_answers(["made_up_task"], lambda task, md: "other")
    finally:
        offline._ANSWERS.pop("made_up_task")
