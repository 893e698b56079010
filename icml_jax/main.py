"""The main job: `python -m icml_jax.main --config=configs/demo.py --workdir=/tmp/icml_demo`.

Checks the whole config first (one `ConfigError` naming the field, before any stage runs), then runs the
stages of `config.mode` in order (synthesize -> warmup -> online), each with a progress bar, appends every
metric row to `<workdir>/metrics.jsonl` ({"stage": ..., ...}) and prints a summary at the end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import ml_collections
from absl import app, flags
from ml_collections import config_flags
from tqdm.auto import tqdm

STAGES = ("synthesize", "warmup", "online")
DATASETS = ("persona_world", "msc", "cc", "gapchat")
METRICS_FILE = "metrics.jsonl"
SYNTHESIS_DIR = "synthesis"
EVAL_OFFSET = 1_000_000  # held-out persona-world episodes are generated from this index on


class ConfigError(ValueError):
    """A config that cannot run; raised before any stage starts, naming the field and what to do."""


# ------------------------------------------------------------------------------------------------ validation


def _stages(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """`config.mode` as a tuple of stage names (a comma-separated string from the command line works too)."""
    mode = config.mode
    parts = [mode] if isinstance(mode, str) else list(mode)
    names = tuple(s.strip() for part in parts for s in str(part).split(",") if s.strip())
    unknown = [s for s in names if s not in STAGES]
    if not names or unknown:
        raise ConfigError(f"config.mode={names!r}: unknown or no stage(s) {unknown}; stages are {STAGES}")
    if len(set(names)) != len(names) or list(names) != sorted(names, key=STAGES.index):
        raise ConfigError(f"config.mode={names!r}: each stage at most once, in the order {STAGES}")
    return names


def _backend_roles(stages: Sequence[str]) -> list[str]:
    """The `config.llm` back ends the stages call: synthesis writes with the generator; online needs both."""
    roles = []
    if "synthesize" in stages:
        roles.append("generator")
    if "online" in stages:
        roles += ["generator", "judge"]
    return list(dict.fromkeys(roles))


def validate(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str]) -> tuple[str, ...]:
    """Checks everything that can be checked before work starts; returns the stages to run."""
    from icml_jax import parallel
    from icml_jax.llm.gemini import read_api_key
    from icml_jax.llm.registry import available_backends
    from icml_jax.llm.types import MissingAPIKeyError

    if not str(workdir):
        raise ConfigError("--workdir is required: the directory that receives metrics.jsonl and stage outputs")
    stages = _stages(config)
    if config.data.name not in DATASETS:
        raise ConfigError(f"config.data.name={config.data.name!r} is not one of {DATASETS}")
    if "online" in stages and config.data.name != "persona_world":
        raise ConfigError(f"config.mode includes 'online' but online runs on real datasets (config.data.name="
                          f"{config.data.name!r}) are not wired yet; only 'persona_world' is. Run "
                          f"--config.mode=synthesize,warmup for now")
    if "warmup" in stages and "synthesize" not in stages:
        manifest = Path(workdir) / SYNTHESIS_DIR / "manifest.json"
        if not manifest.is_file():
            raise ConfigError(f"config.mode runs 'warmup' without 'synthesize' but {manifest} does not exist; "
                              f"add 'synthesize' to config.mode or synthesize into that directory first")
    if config.model.kind == "pretrained":
        path = config.model.path
        if not path:
            raise ConfigError("config.model.path is not set: point it at a local Hugging Face checkpoint "
                              "directory (config.json + *.safetensors), e.g. --config.model.path=/models/Qwen3-1.7B")
        if not (Path(path).expanduser() / "config.json").is_file():
            raise ConfigError(f"config.model.path={path!r}: no config.json there; expected a local Hugging Face "
                              f"checkpoint directory (nothing is downloaded)")
        trigger = config.policy.trigger_model
        if trigger and not (Path(trigger).expanduser() / "config.json").is_file():
            raise ConfigError(f"config.policy.trigger_model={trigger!r}: no config.json there; expected a local "
                              f"Hugging Face checkpoint directory")
    elif config.model.kind == "tiny":
        if config.data.name != "persona_world":
            raise ConfigError("config.model.kind='tiny' builds its tokenizer from the persona world's vocabulary; "
                              f"it needs config.data.name='persona_world', got {config.data.name!r}")
    else:
        raise ConfigError(f"config.model.kind={config.model.kind!r} is not 'pretrained' or 'tiny'")
    for role in _backend_roles(stages):
        block = config.llm.get(role)
        kind = block.get("kind") if block is not None else None
        if kind not in available_backends():
            raise ConfigError(f"config.llm.{role}.kind={kind!r} is not one of {available_backends()}")
        if kind == "gemini":
            env = tuple(block.get("api_key_env") or ("GEMINI_API_KEY", "GOOGLE_API_KEY"))
            try:
                read_api_key(env)  # the key itself is never kept, logged or written
            except MissingAPIKeyError as exc:
                raise ConfigError(f"config.llm.{role} is a Gemini back end ({block.get('model')}): {exc}") from None
    _check_blocks(config, stages)
    import jax

    parallel.initialize(config.parallel.distributed.to_dict())
    try:
        parallel.resolve_mesh_shape(dict(config.parallel.mesh), jax.device_count())
    except ValueError as exc:
        raise ConfigError(f"config.parallel.mesh: {exc}") from None
    return stages


def _check_blocks(config: ml_collections.ConfigDict, stages: Sequence[str]) -> None:
    """Builds each stage's typed config once so a bad value fails now, naming its block."""
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("observation", lambda: _observation(config)),
        ("rl", lambda: (_ppo(config), _reward(config))),
        ("data.world", lambda: _world(config)),
    ]
    if "synthesize" in stages:
        checks.append(("synthesis", lambda: _synthesis(config)))
    if "warmup" in stages:
        checks.append(("warmup", lambda: _warmup(config)))
    if "online" in stages:
        checks.append(("learner", lambda: _learner(config)))
    for name, check in checks:
        try:
            check()
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"config.{name}: {exc}") from None


# ----------------------------------------------------------------------------------------- typed sub-configs


def _observation(config: ml_collections.ConfigDict):
    from icml_jax.agents.observation import ObservationConfig

    return ObservationConfig(**config.observation.to_dict())


def _ppo(config: ml_collections.ConfigDict):
    from icml_jax.rl.config import PPOConfig

    return PPOConfig.from_dict(config.rl.ppo.to_dict())


def _reward(config: ml_collections.ConfigDict):
    from icml_jax.rl.config import RewardConfig

    return RewardConfig.from_dict(config.rl.reward.to_dict())


def _world(config: ml_collections.ConfigDict):
    from icml_jax.data import PersonaWorldConfig

    return PersonaWorldConfig.from_config(config.data.world)


def _synthesis(config: ml_collections.ConfigDict):
    from icml_jax.synthesis import SynthesisConfig

    return SynthesisConfig.from_config(config.synthesis)


def _warmup(config: ml_collections.ConfigDict):
    from icml_jax.train import WarmupConfig

    return WarmupConfig.from_config(config.warmup, observation=_observation(config), rewards=_reward(config))


def _learner(config: ml_collections.ConfigDict):
    from icml_jax.agents.agent import AgentConfig
    from icml_jax.rl.learner import LearnerConfig

    agent = AgentConfig(observation=_observation(config), reply_temperature=config.learner.reply_temperature,
                        reply_max_tokens=config.learner.reply_max_tokens)
    return LearnerConfig(ppo=_ppo(config), reward=_reward(config), agent=agent,
                         update_every=config.learner.update_every, seed=config.seed,
                         user_speaker=_world(config).user_speaker, fresh_memory=config.learner.fresh_memory)


# ------------------------------------------------------------------------------------------------ the run


def _json_safe(value: Any) -> Any:
    """NaN / inf become null so every line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class MetricsWriter:
    """Appends one JSON object per line to `<workdir>/metrics.jsonl`, each tagged with its stage."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO = path.open("a", encoding="utf-8")

    def write(self, stage: str, row: dict[str, Any]) -> None:
        """One line: {"stage": stage, "time": unix seconds, **row}."""
        self._file.write(json.dumps(_json_safe({"stage": stage, "time": time.time(), **row}), sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Closes the file."""
        self._file.close()


@dataclasses.dataclass
class Run:
    """What the stages share: config, workdir, the metrics file, and the policies/tokenizer once built."""

    config: ml_collections.ConfigDict
    workdir: Path
    metrics: MetricsWriter
    policies: Any = None
    tokenizer: Any = None
    summary: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def models(self) -> tuple[Any, Any]:
        """The policies and tokenizer, built on first use (tiny random backbone or local HF checkpoint)."""
        if self.policies is None:
            self.policies, self.tokenizer = build_models(self.config, self.workdir)
        return self.policies, self.tokenizer


def build_models(config: ml_collections.ConfigDict, workdir: Path) -> tuple[Any, Any]:
    """Policies and tokenizer: `tiny` as in the persona-world experiment (tokenizer from the world's words,
    saved under `<workdir>/tokenizer`), `pretrained` from config.model.path with LoRA on the configured mesh."""
    from flax import nnx

    from icml_jax import parallel
    from icml_jax.agents.policy import MemoryPolicies
    from icml_jax.models.decoder import Decoder
    from icml_jax.models.lora import LoraConfig, apply_lora
    from icml_jax.rl import persona_run

    if config.model.kind == "tiny":
        observation = _observation(config)
        words = set(persona_run.world_vocabulary(_world(config), observation))
        if "synthesize" in _stages(config) or "warmup" in _stages(config):
            words |= set(persona_run.world_vocabulary(_synthesis(config).world, observation))
        tokenizer = persona_run.build_tokenizer(workdir / "tokenizer", sorted(words))
        seed = int(config.policy.seed)
        backbone = Decoder(persona_run.tiny_model_config(len(tokenizer), config.model.hidden, config.model.layers),
                           rngs=nnx.Rngs(seed))
        if config.model.tiny_lora:
            backbone = apply_lora(backbone, LoraConfig.from_config(config.lora), seed=seed)
        policies = MemoryPolicies(backbone, pooling=config.policy.pooling, match_rank=int(config.policy.match_rank),
                                  rngs=nnx.Rngs(seed + 1))
        return policies, tokenizer
    from icml_jax.agents.build import build_policies
    from icml_jax.models.tokenizer import load_tokenizer

    mesh = parallel.make_mesh(dict(config.parallel.mesh))
    policies = build_policies(config.policy, config.lora, mesh=mesh, rules=parallel.rules_from(config.parallel.rules))
    return policies, load_tokenizer(config.model.path)


def stage_synthesize(run: Run) -> dict[str, Any]:
    """Retrospective Session Synthesis with the generator back end into `<workdir>/synthesis`."""
    from icml_jax.llm.registry import make_backend
    from icml_jax.synthesis import synthesize

    backend = make_backend(run.config.llm.generator)
    manifest = synthesize(_synthesis(run.config), backend, run.workdir / SYNTHESIS_DIR)
    counts = manifest["counts"]
    row = {"storylines_accepted": counts["storylines_accepted"], "storylines_rejected": counts["storylines_rejected"],
           "train_episodes": counts["train"]["episodes"], "heldout_episodes": counts["heldout"]["episodes"],
           "train_trigger_examples": counts["train"]["trigger"].get("examples"),
           "malformed_answers": counts["malformed_answers"], "tokens": manifest["usage"].get("total_tokens")}
    run.metrics.write("synthesize", row)
    return row


def stage_warmup(run: Run) -> dict[str, Any]:
    """Supervised warm-up of both policies on the synthesized expert data; Orbax state in `<workdir>/warmup`."""
    from icml_jax.train import warmup

    policies, tokenizer = run.models()
    result = warmup(_warmup(run.config), policies, tokenizer, run.workdir / SYNTHESIS_DIR, run.workdir)
    for row in result.history:
        run.metrics.write("warmup", dict(row))
    summary = {"steps": result.steps, "skipped_steps": result.skipped_steps, "seconds": result.seconds,
               "checkpoint": result.checkpoint, **{f"before/{k}": v for k, v in result.before.items()},
               **{f"after/{k}": v for k, v in result.after.items()}}
    run.metrics.write("warmup", {"final": True, **summary})
    return summary


def stage_online(run: Run) -> dict[str, Any]:
    """Online PPO (Algorithm 1) on persona-world episodes, with held-out evaluations before and after."""
    from icml_jax.agents.agent import AgentConfig
    from icml_jax.data import generate_episodes
    from icml_jax.llm.judges import ProxyJudge, QualityJudge
    from icml_jax.llm.registry import make_backend
    from icml_jax.memory.store import MemoryStore
    from icml_jax.rl.learner import OnlineLearner, evaluate, pooled_metrics

    config = run.config
    policies, tokenizer = run.models()
    world = _world(config)
    train = generate_episodes(world, int(config.data.train_episodes))
    held_out = generate_episodes(world, int(config.data.eval_episodes), start_index=EVAL_OFFSET)
    generator = make_backend(config.llm.generator)
    same = config.llm.judge.to_dict() == config.llm.generator.to_dict()
    judge = generator if same else make_backend(config.llm.judge)  # one client when both roles are one back end
    learner_cfg = _learner(config)
    agent_cfg = AgentConfig(observation=learner_cfg.agent.observation)

    def held_out_eval(seen: int) -> dict[str, float]:
        if not held_out:
            return {}
        sessions = evaluate(policies, tokenizer, held_out, agent_config=agent_cfg, backend=generator,
                            user_speaker=world.user_speaker, greedy=config.online.greedy_eval,
                            seed=config.seed + EVAL_OFFSET)
        metrics = pooled_metrics(sessions, "eval")
        run.metrics.write("online", {"episodes_seen": seen, **metrics})
        return metrics

    before = held_out_eval(0) if config.online.eval_before else {}
    updates = 0
    with MemoryStore() as store:
        learner = OnlineLearner(policies, tokenizer, store, generator, proxy_judge=ProxyJudge(judge),
                                quality_judge=QualityJudge(judge), config=learner_cfg)
        for i, episode in enumerate(tqdm(train, desc="online episodes", unit="ep", leave=False), start=1):
            out = learner.run_episode(episode)
            updates += "update/index" in out
            run.metrics.write("online", {"episode": i, **out})
        online = pooled_metrics(learner.session_log, "online")
    after = held_out_eval(len(train))
    summary = {"episodes": len(train), "updates": updates, **online, **{f"after/{k}": v for k, v in after.items()},
               **{f"before/{k}": v for k, v in before.items()}}
    run.metrics.write("online", {"final": True, **summary})
    return summary


STAGE_FNS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "synthesize": stage_synthesize,
    "warmup": stage_warmup,
    "online": stage_online,
}


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str],
        out: TextIO | None = None) -> dict[str, dict[str, Any]]:
    """Validates `config`, then runs its stages in order; returns {stage: summary} and prints the summary."""
    out = out or sys.stdout
    stages = validate(config, workdir)
    root = Path(workdir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True) + "\n", encoding="utf-8")
    state = Run(config, root, MetricsWriter(root / METRICS_FILE))
    start = time.perf_counter()
    try:
        bar = tqdm(stages, desc="stages", unit="stage")
        for stage in bar:
            bar.set_postfix_str(stage)
            t0 = time.perf_counter()
            try:
                summary = STAGE_FNS[stage](state)
            except Exception as exc:
                raise RuntimeError(f"stage {stage!r} failed (workdir {root}): {type(exc).__name__}: {exc}") from exc
            summary["seconds"] = time.perf_counter() - t0
            state.summary[stage] = summary
        state.metrics.write("summary", {"stages": list(stages), "seconds": time.perf_counter() - start})
    finally:
        state.metrics.close()
    print(format_summary(state.summary, root, time.perf_counter() - start), file=out)
    return state.summary


def _fmt(value: Any) -> str:
    """Short human form of a metric."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3f}"
    return str(value)


SUMMARY_KEYS = {
    "synthesize": ("storylines_accepted", "train_episodes", "heldout_episodes", "train_trigger_examples"),
    "warmup": ("steps", "before/planner/accuracy", "after/planner/accuracy", "before/trigger/accuracy",
               "after/trigger/accuracy"),
    "online": ("episodes", "updates", "before/eval/planner_precision", "after/eval/planner_precision",
               "before/eval/planner_recall", "after/eval/planner_recall", "before/eval/trigger_recall",
               "after/eval/trigger_recall"),
}


def format_summary(summary: dict[str, dict[str, Any]], workdir: Path, seconds: float) -> str:
    """The end-of-run report: a line per stage with its headline numbers, and where the metrics are."""
    lines = [f"icml_jax run finished in {seconds:.1f} s; metrics: {workdir / METRICS_FILE}"]
    for stage, values in summary.items():
        keys = [k for k in SUMMARY_KEYS.get(stage, ()) if k in values]
        if stage == "warmup" and not keys:
            keys = sorted(k for k in values if k.startswith(("before/", "after/")))[:6]
        parts = [f"{k} {_fmt(values[k])}" for k in keys]
        lines.append(f"  {stage:<10} ({values['seconds']:.1f} s): " + ", ".join(parts))
    return "\n".join(lines)


_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file, e.g. configs/demo.py",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory for metrics.jsonl and the stages' outputs")


def main(argv: Sequence[str]) -> None:
    """absl entry point: a config error exits with its message and status 2 before any stage runs."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/demo.py")
    try:
        run(_CONFIG.value, _WORKDIR.value or "")
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main)
