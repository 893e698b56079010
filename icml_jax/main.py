"""The main job: `python -m icml_jax.main --config=configs/demo.py --workdir=/tmp/icml_demo`.

Checks the whole config first (one `ConfigError` naming the field, before any stage runs), then runs the
stages of `config.mode` in order (synthesize -> warmup -> online), each with a progress bar; every metric row
goes to `<workdir>/metrics.jsonl` and TensorBoard event files under `<workdir>/tensorboard`, and a summary, a
per-session table and `<workdir>/learning_curves.png` come at the end.

Runs resume: a finished stage is recorded in `<workdir>/progress.json` (with the metrics file's length then),
and the online stage saves Orbax checkpoints of its whole state every `config.checkpoint.every_episodes`
episodes. Starting again with the same workdir (and the same config) skips finished stages, restores the latest
complete checkpoint, cuts the metrics back to that point and replays from there, so the run ends as an
uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags
from tqdm.auto import tqdm

from icml_jax.runlog import METRICS_FILE, json_safe
from icml_jax.textcheck import TextLimits

STAGES = ("synthesize", "warmup", "online")
SYNTHESIS_DIR = "synthesis"
PROGRESS_FILE = "progress.json"
CHECKPOINT_DIR = "checkpoints"
POLICY_DIR = "policy"  # the latest trained policy (adapters + heads), what `icml_jax.chat` loads
PLOT_FILE = "learning_curves.png"


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


def _synthesis_role(config: ml_collections.ConfigDict) -> str:
    """The `config.llm` block that writes the expert data: `synthesizer` when set, else the generator."""
    return "synthesizer" if config.llm.get("synthesizer") is not None else "generator"


def _backend_roles(config: ml_collections.ConfigDict, stages: Sequence[str]) -> list[str]:
    """The `config.llm` back ends the stages call: synthesis writes with the synthesizer (default: the
    generator) and condenses the expert memories with the generator (the online memory writer's back end);
    online needs the generator and the judge."""
    roles = []
    if "synthesize" in stages:
        roles.append(_synthesis_role(config))
        if config.synthesis.get("condense_memories", True):
            roles.append("generator")
    if "online" in stages:
        roles += ["generator", "judge"]
    return list(dict.fromkeys(roles))


def validate(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str]) -> tuple[str, ...]:
    """Checks everything that can be checked before work starts; returns the stages to run."""
    from icml_jax import parallel
    from icml_jax.data.stream import check_data_config
    from icml_jax.llm.gemini import read_api_key
    from icml_jax.llm.registry import check_backend
    from icml_jax.llm.types import MissingAPIKeyError

    if not str(workdir):
        raise ConfigError("--workdir is required: the directory that receives metrics.jsonl and stage outputs")
    stages = _stages(config)
    try:  # seed sessions drawn from the data read the same episodes as the online stage
        check_data_config(config, (*stages, "online") if "synthesize" in stages and _data_seeds(config) else stages)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
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
    roles = _backend_roles(config, stages)
    for role, block in config.llm.items():  # every block's kind, keys and values, used by these stages or not
        if block is None and role not in roles:
            continue
        try:
            if block is None:
                raise ValueError(f"config.llm.{role}: no back end configured, but the stages {list(stages)} use it")
            values = check_backend(block, f"config.llm.{role}")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if role in roles and values["kind"] == "gemini":
            env = tuple(values.get("api_key_env") or ("GEMINI_API_KEY", "GOOGLE_API_KEY"))
            try:
                read_api_key(env)  # the key itself is never kept, logged or written
            except MissingAPIKeyError as exc:
                raise ConfigError(f"config.llm.{role} is a Gemini back end ({values.get('model')}): {exc}; or try "
                                  f"it without a key: --config.llm.{role}.kind=offline") from None
    if {"synthesize", "warmup"} & set(stages):
        _check_candidates(config)
    _check_blocks(config, stages)
    _check_checkpoint(config)
    init_from = (config.get("online") or {}).get("init_from")
    if init_from and "online" in stages:
        from icml_jax.train.checkpoint import META_FILE

        if "warmup" in stages:
            raise ConfigError("config.online.init_from starts the online stage from a saved policy, but config.mode "
                              "also runs 'warmup', whose result it would replace; drop one of them")
        if not (Path(init_from).expanduser() / META_FILE).is_file():
            raise ConfigError(f"config.online.init_from={init_from!r}: no saved policy there ({META_FILE} missing)")
    _check_same_run(config, workdir)
    import jax

    parallel.initialize(config.parallel.distributed.to_dict())
    try:
        mesh, _ = parallel.process_meshes(dict(config.parallel.mesh))
    except ValueError as exc:
        raise ConfigError(f"config.parallel.mesh: {exc}") from None
    size = int(config.rl.ppo.minibatch_size)
    if "online" in stages and size % mesh.shape["data"]:  # PPO minibatch rows are sharded over `data`
        raise ConfigError(f"config.rl.ppo.minibatch_size={size} cannot be sharded over config.parallel.mesh.data="
                          f"{mesh.shape['data']} devices: make it a multiple of {mesh.shape['data']}")
    if jax.process_count() > 1:
        _check_processes(config, stages, jax.process_count())
    return stages


def _check_processes(config: ml_collections.ConfigDict, stages: Sequence[str], count: int) -> None:
    """What a run of several JAX processes needs: the online stage alone (each process plays its users; the
    synthesis and the warm-up run in one process first), whole groups of users per update, equal shares."""
    if tuple(stages) != ("online",):
        raise ConfigError(f"config.mode={tuple(stages)!r} on {count} JAX processes: several processes run the online "
                          "stage only. Run synthesize and warmup in one process first (--config.mode=synthesize,warmup "
                          "--workdir=W0), then every process with --config.mode=online "
                          "--config.online.init_from=W0/warmup and a new --workdir (README, Scaling out)")
    learner = config.learner
    b, every = int(learner.get("users_in_flight", 1)), int(learner.update_every)
    if every % (count * b):
        raise ConfigError(f"config.learner.update_every={every} must be a multiple of the {count} processes x "
                          f"learner.users_in_flight={b} (an update follows a whole group of users on every process)")
    if config.data.name == "persona_world" and int(config.data.train_episodes) % count:
        raise ConfigError(f"config.data.train_episodes={config.data.train_episodes} must be a multiple of the {count} "
                          "processes (each plays an equal share, in lockstep)")


def _check_blocks(config: ml_collections.ConfigDict, stages: Sequence[str]) -> None:
    """Builds each stage's typed config once so a bad value fails now, naming its block."""
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("observation", lambda: _observation(config)),
        ("rl", lambda: (_ppo(config), _reward(config))),
        ("data.world", lambda: _world(config)),
        ("limits", lambda: TextLimits.from_config(config.get("limits"))),
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


def _check_candidates(config: ml_collections.ConfigDict) -> None:
    """A synthesized Trigger example shows its positive and its negatives: they must fit the observation."""
    syn, limit = config.synthesis, config.observation.max_candidates
    shown = 1 + int(syn.hard_negatives) + int(syn.soft_negatives)
    if shown > limit:
        raise ConfigError(f"config.observation.max_candidates={limit} is smaller than the memories a synthesized "
                          f"Trigger example shows (1 + synthesis.hard_negatives={syn.hard_negatives} + "
                          f"synthesis.soft_negatives={syn.soft_negatives} = {shown}); raise max_candidates or lower "
                          "the negatives")


def _check_checkpoint(config: ml_collections.ConfigDict) -> None:
    """Checkpoints are taken right after a PPO update, so their interval is a multiple of the update interval."""
    every, keep, update_every = config.checkpoint.every_episodes, config.checkpoint.keep, config.learner.update_every
    if not isinstance(keep, int) or keep < 1:
        raise ConfigError(f"config.checkpoint.keep={keep!r}: must be a positive int (checkpoints kept)")
    if not isinstance(every, int) or every < 1 or every % update_every:
        raise ConfigError(f"config.checkpoint.every_episodes={every!r}: must be a positive multiple of "
                          f"config.learner.update_every={update_every} (a checkpoint follows a PPO update)")


def config_text(config: ml_collections.ConfigDict) -> str:
    """The config as `<workdir>/config.json` holds it."""
    return config.to_json_best_effort(indent=2, sort_keys=True) + "\n"


# where this process joins its run (coordinator, process id): not part of which run a workdir holds
PER_START_KEYS = ("parallel.distributed.", "limits.")  # limits: the chat's and the API's, not the run's


def _check_same_run(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str]) -> None:
    """A workdir resumes only the run it holds: another config there would mix two runs' state. How the processes
    find each other (`parallel.distributed`: each has its own id, a restart may get a new coordinator) is not
    compared; the number of processes is checked against the checkpoint on restore."""
    path = Path(workdir).expanduser() / "config.json"
    if path.is_file() and path.read_text(encoding="utf-8") != config_text(config):
        old, new = (_flatten(json.loads(text)) for text in (path.read_text(encoding="utf-8"), config_text(config)))
        diff = sorted(k for k in old.keys() | new.keys() if old.get(k, "<absent>") != new.get(k, "<absent>")
                      and not k.startswith(PER_START_KEYS))
        if not diff:
            return
        raise ConfigError(f"{workdir} holds a run with another config (differs at {diff[:6]}); resume it with "
                          "the same config or use a new --workdir")


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b.c': leaf} of a nested JSON object."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    return {k: v for key, sub in tree.items() for k, v in _flatten(sub, f"{prefix}.{key}" if prefix else key).items()}


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


def _data_seeds(config: ml_collections.ConfigDict) -> bool:
    """Whether the synthesis seeds come from the episodes the online stage plays (`synthesis.seed_source`)."""
    from icml_jax.data.stream import REAL_DATASETS

    if config.synthesis.get("seeds_file"):
        return False
    source = config.synthesis.get("seed_source", "auto")
    return source == "data" or (source == "auto" and config.data.name in REAL_DATASETS)


def synthesis_seeds(config: ml_collections.ConfigDict):
    """The synthesis seeds of a run: with data seeds, the first sessions of the first `synthesis.num_seeds`
    distinct episodes of the online stream (the users the online stage will meet, in its order); else None
    (`synthesize` reads the seeds file or draws persona-world constraints)."""
    from icml_jax.data.stream import online_stream
    from icml_jax.synthesis import seeds_from_episodes

    if not _data_seeds(config):
        return None
    world = _synthesis(config).world
    return seeds_from_episodes(online_stream(config), int(config.synthesis.num_seeds),
                               user_speaker=world.user_speaker, assistant_speaker=world.assistant_speaker)


def _warmup(config: ml_collections.ConfigDict):
    from icml_jax.train import WarmupConfig

    return WarmupConfig.from_config(config.warmup, observation=_observation(config), rewards=_reward(config))


def _learner(config: ml_collections.ConfigDict):
    from icml_jax.agents.agent import AgentConfig
    from icml_jax.data.stream import user_speaker
    from icml_jax.rl.divergence import DivergenceConfig
    from icml_jax.rl.learner import LearnerConfig

    agent = AgentConfig.from_config(config.learner, _observation(config))
    return LearnerConfig(ppo=_ppo(config), reward=_reward(config), agent=agent,
                         update_every=config.learner.update_every, seed=config.seed,
                         user_speaker=user_speaker(config), fresh_memory=config.learner.fresh_memory,
                         divergence=DivergenceConfig.from_config(config.learner.get("divergence")),
                         users_in_flight=int(config.learner.get("users_in_flight", 1)))


# ------------------------------------------------------------------------------------------------ the run


def _write_json_atomic(path: Path, data: Any) -> None:
    """Writes `path` so that a kill leaves either the old or the new file, never half of one."""
    _write_text_atomic(path, json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")


def _write_text_atomic(path: Path, text: str) -> None:
    """Writes `path` whole or not at all (other processes of the run may be reading it)."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_progress(workdir: Path) -> dict[str, Any]:
    """`<workdir>/progress.json`: finished stages with their summaries and the metrics file's length then."""
    path = workdir / PROGRESS_FILE
    if not path.is_file():
        return {"done": {}, "metrics_bytes": 0, "finished": False}
    return json.loads(path.read_text(encoding="utf-8"))


@dataclasses.dataclass
class Run:
    """What the stages share: config, workdir, metrics, progress, and the policies/tokenizer once built."""

    config: ml_collections.ConfigDict
    workdir: Path
    metrics: Any  # icml_jax.runlog.MetricsLog
    progress: dict[str, Any]
    policies: Any = None
    tokenizer: Any = None
    summary: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    deferred: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # done, not yet committed
    resume: tuple[int, dict[str, Any], dict[str, Any]] | None = None  # the online checkpoint to continue from

    def models(self) -> tuple[Any, Any]:
        """The policies and tokenizer, built on first use (tiny random backbone or local HF checkpoint)."""
        if self.policies is None:
            self.policies, self.tokenizer = build_models(self.config, self.workdir)
        return self.policies, self.tokenizer

    def commit(self, stage: str | None = None, summary: dict[str, Any] | None = None) -> None:
        """Records `stage` (and any deferred stage) as finished, with the metrics written so far."""
        done = dict(self.deferred)
        if stage is not None:
            done[stage] = summary or {}
        self.deferred = {}
        self.progress["done"].update(done)
        self.progress["metrics_bytes"] = self.metrics.position()
        if _is_primary():  # the run's shared files are the first process's to write
            _write_json_atomic(self.workdir / PROGRESS_FILE, self.progress)

    def save_policy(self, metadata: dict[str, Any]) -> Path:
        """The trained policy's adapters and heads to `<workdir>/policy` (what `icml_jax.chat` loads)."""
        from icml_jax.train.checkpoint import save_warmup

        return save_warmup(self.workdir / POLICY_DIR, self.policies, json_safe(metadata))  # every process calls


def _is_primary() -> bool:
    """`parallel.is_primary()`, imported late as main's other heavy modules are."""
    from icml_jax import parallel

    return parallel.is_primary()


class _NoMetrics:
    """The metrics sink of every process but the first (which writes all processes' rows)."""

    steps: dict[str, int] = {}

    def write(self, stage: str, row: Any, step: int | None = None) -> None:
        """Drops the row: the first process writes it."""

    def position(self) -> int:
        return 0

    def close(self) -> None:
        pass


def build_tiny_tokenizer(config: ml_collections.ConfigDict, workdir: Path):
    """The tiny backbone's word tokenizer over the run's worlds (the data's and the synthesis'), saved under
    `<workdir>/tokenizer`: the same words whatever stages run, so a run that starts online from another run's
    warm-up (`online.init_from`) has the same vocabulary and the same random backbone."""
    import tempfile

    from icml_jax import parallel
    from icml_jax.agents import tiny

    observation = _observation(config)
    words = set(tiny.world_vocabulary(_world(config), observation))
    words |= set(tiny.world_vocabulary(_synthesis(config).world, observation))
    # the other processes of a run build the same tokenizer where they do not race the first one's files
    where = Path(workdir) / "tokenizer" if parallel.is_primary() else Path(tempfile.mkdtemp(prefix="icml_tokenizer_"))
    return tiny.build_tokenizer(where, sorted(words))


def build_models(config: ml_collections.ConfigDict, workdir: Path) -> tuple[Any, Any]:
    """Policies and tokenizer: `tiny` as in the persona-world experiment (tokenizer from the world's words,
    saved under `<workdir>/tokenizer`), `pretrained` from config.model.path with LoRA on the configured mesh."""
    from flax import nnx

    from icml_jax import parallel
    from icml_jax.agents.policy import MemoryPolicies
    from icml_jax.models.decoder import Decoder
    from icml_jax.models.lora import LoraConfig, apply_lora
    from icml_jax.agents import tiny

    _, local_mesh = parallel.process_meshes(dict(config.parallel.mesh))
    if config.model.kind == "tiny":
        tokenizer = build_tiny_tokenizer(config, workdir)
        seed = int(config.policy.seed)
        backbone = Decoder(tiny.tiny_model_config(len(tokenizer), config.model.hidden, config.model.layers),
                           rngs=nnx.Rngs(seed))
        if config.model.tiny_lora:
            backbone = apply_lora(backbone, LoraConfig.from_config(config.lora), seed=seed)
        trigger = None  # model.trigger_hidden: a Trigger backbone of another width (the size grid, Figure 6)
        width = config.model.get("trigger_hidden")
        if width and int(width) != int(config.model.hidden):
            trigger = Decoder(tiny.tiny_model_config(len(tokenizer), int(width), config.model.layers),
                              rngs=nnx.Rngs(seed + 2))
            if config.model.tiny_lora:
                trigger = apply_lora(trigger, LoraConfig.from_config(config.lora), seed=seed + 2)
        policies = MemoryPolicies(backbone, trigger, pooling=config.policy.pooling,
                                  match_rank=int(config.policy.match_rank),
                                  shared_prefix=bool(config.policy.get("shared_prefix", False)),
                                  suffix_slots=int(config.policy.get("suffix_slots", 32)), rngs=nnx.Rngs(seed + 1))
        if local_mesh.size > 1:  # several devices: the policies live on them (replicated), as a real model does
            parallel.shard_model(policies, local_mesh, parallel.rules_from(config.parallel.rules))
        return policies, tokenizer
    from icml_jax.agents.build import build_policies
    from icml_jax.models.tokenizer import load_tokenizer

    # each process holds its own copy on its devices (with one process: the whole mesh)
    policies = build_policies(config.policy, config.lora, mesh=local_mesh,
                              rules=parallel.rules_from(config.parallel.rules))
    return policies, load_tokenizer(config.model.path)

def stage_synthesize(run: Run) -> dict[str, Any]:
    """Retrospective Session Synthesis with the synthesizer (default: generator) back end into
    `<workdir>/synthesis`, from the seeds of `synthesis_seeds` (real data: the played episodes' first sessions),
    memories condensed by the generator as the online agent's are."""
    from icml_jax.llm.registry import make_backend
    from icml_jax.synthesis import synthesize

    role = _synthesis_role(run.config)
    backend = make_backend(run.config.llm[role])
    # the expert data's memories are condensed as online ones: by the generator (the agent's condenser)
    condense = bool(run.config.synthesis.get("condense_memories", True))
    condenser = make_backend(run.config.llm.generator) if condense and role != "generator" else backend
    try:
        manifest = synthesize(_synthesis(run.config), backend, run.workdir / SYNTHESIS_DIR,
                              seeds=synthesis_seeds(run.config), condenser=condenser)
    finally:  # Gemini's threads and connections
        for b in {id(backend): backend, id(condenser): condenser}.values():
            b.close()
    counts, usage = manifest["counts"], manifest["usage"]
    row = {"storylines_accepted": counts["storylines_accepted"], "storylines_rejected": counts["storylines_rejected"],
           "train_episodes": counts["train"]["episodes"], "heldout_episodes": counts["heldout"]["episodes"],
           "train_trigger_examples": counts["train"]["trigger"].get("examples"),
           "malformed_answers": counts["malformed_answers"], "failed_requests": counts.get("failed_requests"),
           "requests_from_cache": (manifest.get("cache") or {}).get("hits"),
           **{f"llm/{k}": usage.get(k) for k in ("total_tokens", "calls", "attempts", "retries", "failures")}}
    if (manifest.get("memories") or {}).get("usage"):  # the condenser is a back end of its own
        row.update({f"condenser/{k}": v for k, v in manifest["memories"]["usage"].items()
                    if k in ("total_tokens", "attempts", "retries", "failures")})
    run.metrics.write("synthesize", row)
    return row


def stage_warmup(run: Run) -> dict[str, Any]:
    """Supervised warm-up of both policies on the synthesized expert data; Orbax state in `<workdir>/warmup`."""
    from icml_jax.train import warmup

    policies, tokenizer = run.models()
    result = warmup(_warmup(run.config), policies, tokenizer, run.workdir / SYNTHESIS_DIR, run.workdir)
    for row in result.history:
        run.metrics.write("warmup", dict(row))
    summary = {"steps": result.steps, "skipped_steps": result.skipped_steps, "rollbacks": result.rollbacks,
               "seconds": result.seconds,
               "checkpoint": result.checkpoint, **{f"before/{k}": v for k, v in result.before.items()},
               **{f"after/{k}": v for k, v in result.after.items()}}
    run.metrics.write("warmup", {"final": True, **summary})
    return summary


def _session_rows(phase: str, sessions: Sequence[Any]) -> list[dict[str, Any]]:
    """Per-session-number rows of the per-session table (labels pooled over episodes, mean judged rewards)."""
    from icml_jax.rl.learner import pooled_metrics

    rows = []
    for number in sorted({c.session for c in sessions}):
        m = pooled_metrics([c for c in sessions if c.session == number], "m")
        rows.append({"table": "sessions", "phase": phase, "session": number + 1,
                     "planner_precision": m["m/planner_precision"], "planner_recall": m["m/planner_recall"],
                     "trigger_recall": m["m/trigger_recall"], "reward_trigger": m["m/reward_quality"],
                     "reward_proxy": m["m/reward_proxy"],
                     "decisions": sum(c.turns for c in sessions if c.session == number)})
    return rows


def stage_online(run: Run) -> dict[str, Any]:
    """Online PPO (Algorithm 1) with held-out evaluations before and after, checkpointed every N episodes.

    Resumes from the checkpoint `run` chose (the newest in `<workdir>/checkpoints` that restores): learner state,
    every user's memory, the data stream's position and the before-evaluation come back; metrics written after
    that checkpoint were already cut by `run`.

    With P JAX processes each plays every P-th episode (its users, memories and pending rewards its own), every
    update is one global PPO step over all of their decisions, the first process writes the metrics of all, and
    a checkpoint holds each process's state (`_gather_state`).
    """
    import jax

    from icml_jax import parallel
    from icml_jax.data.stream import EVAL_OFFSET, held_out_episodes, online_stream
    from icml_jax.llm.judges import ProxyJudge, QualityJudge
    from icml_jax.llm.registry import make_backend
    from icml_jax.memory.store import MemoryStore
    from icml_jax.rl.checkpoint import RunCheckpointer, load_memory_state, memory_state
    from icml_jax.rl.learner import OnlineLearner, evaluate, pooled_metrics, user_groups

    config = run.config
    policies, tokenizer = run.models()
    stream, held_out = online_stream(config), held_out_episodes(config)
    generator = make_backend(config.llm.generator)
    same = config.llm.judge.to_dict() == config.llm.generator.to_dict()
    judge = generator if same else make_backend(config.llm.judge)  # one client when both roles are one back end
    learner_cfg = _learner(config)
    agent_cfg = learner_cfg.agent  # the held-out agent writes replies and notes as the online one does

    def held_out_eval(seen: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
        if not held_out:
            return {}, []
        sessions = evaluate(policies, tokenizer, held_out, agent_config=agent_cfg, backend=generator,
                            user_speaker=learner_cfg.user_speaker, greedy=config.online.greedy_eval,
                            seed=config.seed + EVAL_OFFSET, users_in_flight=learner_cfg.users_in_flight)
        metrics = pooled_metrics(sessions, "eval")
        run.metrics.write("eval", {"episodes_seen": seen, **metrics}, step=seen)
        return metrics, _session_rows("before" if seen == 0 else "after", sessions)

    every = int(config.checkpoint.every_episodes)
    count = jax.process_count()
    update_mesh, _ = parallel.process_meshes(dict(config.parallel.mesh))
    with MemoryStore() as store, RunCheckpointer(run.workdir / CHECKPOINT_DIR, keep=int(config.checkpoint.keep),
                                                 async_save=bool(config.checkpoint.async_save)) as ckpt:
        learner = OnlineLearner(policies, tokenizer, store, generator, proxy_judge=ProxyJudge(judge),
                                quality_judge=QualityJudge(judge), config=learner_cfg,
                                update_mesh=update_mesh if parallel.model_mesh(policies) is not None else None)

        saved: int | None = None  # the last step saved or restored (an async save may not be listed yet)

        def save(extra: dict[str, Any]) -> None:
            nonlocal saved
            state = learner.state_dict()
            arrays = {k: state.pop(k) for k in ("params", "rest", "optimizer", "agent_key")}
            ckpt.save(learner.episodes_seen, arrays, _gather_state({**state, **extra, "memory": memory_state(store),
                                                                    "data": stream.get_state(),
                                                                    "metrics_bytes": run.metrics.position()}))
            saved = learner.episodes_seen

        restored, run.resume = run.resume, None  # read by _resume_point, so the metrics were cut at its step
        if restored is not None:
            saved, arrays, state = restored
            state = _own_state(state, run.workdir / CHECKPOINT_DIR / str(saved))
            learner.load_state_dict({**state, **arrays})
            load_memory_state(store, state["memory"])
            stream.set_state(state["data"])
        else:  # the warmed-up start is resume point 0; the warm-up, deferred until now, is recoverable from it
            if config.online.get("init_from"):
                from icml_jax.train.checkpoint import load_warmup

                load_warmup(Path(config.online.init_from).expanduser(), policies)
            save({"before": {}, "before_rows": []})
            ckpt.wait()
            run.commit()
        if learner.episodes_seen == 0:
            before, before_rows = held_out_eval(0) if config.online.eval_before else ({}, [])
        else:
            before, before_rows = state["before"], state["before_rows"]
        extra = {"before": before, "before_rows": before_rows}
        bar = tqdm(stream, desc="online episodes", unit="ep", total=stream.total,
                   initial=learner.episodes_seen // count, leave=False, disable=not _is_primary())
        rows: list[dict[str, Any]] = []  # episode rows not yet written (several processes: until an update)
        for group in user_groups(bar, learner_cfg.users_in_flight, learner_cfg.update_every // count,
                                 learner.episodes_seen // count):
            first = learner.episodes_seen + 1 + jax.process_index()  # this process plays every count-th
            rows += [{"episode": first + i * count, **out} for i, out in enumerate(learner.run_episodes(group))]
            if count == 1 or learner.episodes_seen % learner_cfg.update_every == 0:  # the same call everywhere
                _write_episode_rows(run.metrics, rows)
                rows = []
            if learner.episodes_seen % every == 0:
                save(extra)
        if count > 1:
            _write_episode_rows(run.metrics, rows)
        if learner.has_pending():  # the episodes after the last update still teach: one last update
            out = learner.update()
            run.metrics.write("online", {"episode": learner.episodes_seen, **out}, step=learner.episodes_seen)
        if saved != learner.episodes_seen:
            save(extra)
        ckpt.wait()
        learner.close()  # the turn request threads of remote back ends
        session_log = [c for part in parallel.allgather_objects(learner.session_log) for c in part]
        online = pooled_metrics(session_log, "online")
        online_rows = _session_rows("online", session_log)
        after, after_rows = held_out_eval(learner.episodes_seen)
    for row in before_rows + online_rows + after_rows:
        run.metrics.write("online", row)
    summary = {"episodes": learner.episodes_seen, "updates": learner.updates,
               "skipped_steps": int(parallel.to_host(learner.updater.num_skipped)),
               "rollbacks": learner.updater.monitor.rollbacks,
               **online,
               **{f"after/{k}": v for k, v in after.items()}, **{f"before/{k}": v for k, v in before.items()}}
    run.save_policy({"stage": "online", "episodes": learner.episodes_seen, "updates": learner.updates})
    run.metrics.write("online", {"final": True, **summary})
    return summary


def _write_episode_rows(metrics: Any, rows: list[dict[str, Any]]) -> None:
    """Writes the online rows of the episodes played since the last update, from every process, in episode
    order (a collective with several processes). An update's figures (every key that is not `episode/...`) sit
    on every process's last row: they stay on the last episode only, as one process playing all writes them."""
    from icml_jax import parallel

    parts = parallel.allgather_objects(rows)
    merged = sorted((r for part in parts for r in part), key=lambda r: r["episode"])
    if len(parts) > 1:
        for row in merged[:-1]:
            for key in [k for k in row if k != "episode" and not k.startswith("episode/")]:
                row.pop(key)
    for row in merged:
        metrics.write("online", row, step=row["episode"])


def _gather_state(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's JSON state: this process's, or with several processes every process's (they differ in
    their users' memories, pending rewards, data position) under "processes", the first one's metrics length
    on top (a collective)."""
    from icml_jax import parallel

    parts = parallel.allgather_objects(state)
    if len(parts) == 1:
        return state
    return {"process_count": len(parts), "metrics_bytes": parts[0]["metrics_bytes"], "processes": parts}


def _own_state(state: dict[str, Any], where: Path) -> dict[str, Any]:
    """This process's part of a checkpoint's JSON state (`_gather_state`); a checkpoint of another number of
    processes is an error naming both."""
    import jax

    from icml_jax.rl.checkpoint import CheckpointError

    saved = int(state.get("process_count", 1))
    if saved != jax.process_count():
        raise CheckpointError(f"{where} is a checkpoint of a run of {saved} JAX process(es); this run has "
                              f"{jax.process_count()}: resume it with {saved} (each process holds its own users)")
    return state["processes"][jax.process_index()] if saved > 1 else state


STAGE_FNS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "synthesize": stage_synthesize,
    "warmup": stage_warmup,
    "online": stage_online,
}


@dataclasses.dataclass
class ResumePoint:
    """Where a run continues: metrics bytes to keep, TensorBoard purge step per stage, and the online checkpoint
    it restores (read once here, so the metrics are cut at exactly the state the online stage continues from)."""

    metrics_bytes: int
    purge: dict[str, int]
    checkpoint: tuple[int, dict[str, Any], dict[str, Any]] | None = None  # (step, arrays, state)
    skipped: list[str] = dataclasses.field(default_factory=list)  # newer checkpoints that did not restore, why


def _resume_point(root: Path, progress: dict[str, Any], stages: Sequence[str]) -> ResumePoint:
    """Where the run held in `root` continues; the newest online checkpoint that restores is the point (damaged
    newer ones are moved aside with a warning that names them)."""
    done = progress["done"]
    point = ResumePoint(int(progress["metrics_bytes"]), {s: 0 for s in stages if s not in done})
    if "online" in stages and "online" not in done and (root / CHECKPOINT_DIR).is_dir():
        from icml_jax.rl.checkpoint import RunCheckpointer

        with RunCheckpointer(root / CHECKPOINT_DIR) as ckpt:
            point.checkpoint, point.skipped = ckpt.restore_newest(), ckpt.skipped
        if point.checkpoint is not None:
            step, _, state = point.checkpoint
            point.metrics_bytes = int(state["metrics_bytes"])
            point.purge.update(online=step + 1, eval=1 if step else 0)
    if "online" in point.purge:
        point.purge.setdefault("eval", point.purge["online"])
    return point


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str],
        out: TextIO | None = None) -> dict[str, dict[str, Any]]:
    """Validates `config`, then runs (or resumes) its stages in order; returns {stage: summary}, prints a report."""
    from icml_jax.runlog import MetricsLog, plot_learning_curves, read_metrics, session_table

    out = out or sys.stdout
    stages = validate(config, workdir)
    root = Path(workdir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    primary = _is_primary()
    if primary:
        _write_text_atomic(root / "config.json", config_text(config))
    progress = read_progress(root)
    if "online" in stages and any(s not in progress["done"] for s in stages[:stages.index("online")]):
        shutil.rmtree(root / CHECKPOINT_DIR, ignore_errors=True)  # taken after a stage that runs again: stale
    point = _resume_point(root, progress, stages)
    metrics = MetricsLog(root, truncate_to=point.metrics_bytes, purge_steps=point.purge) if primary else _NoMetrics()
    state = Run(config, root, metrics, progress, resume=point.checkpoint)
    start = time.perf_counter()
    try:
        todo = [s for s in stages if s not in progress["done"]]
        for line in point.skipped:
            print(f"warning: {line}", file=out)
        if todo and (todo != list(stages) or point.checkpoint):  # a run that goes on where it stopped
            at = f" (online checkpoint step {point.checkpoint[0]})" if point.checkpoint else ""
            print(f"resuming {root}: finished {[s for s in stages if s in progress['done']]}, next {todo}{at}",
                  file=out)
        bar = tqdm(stages, desc="stages", unit="stage", disable=not primary)
        for i, stage in enumerate(bar):
            bar.set_postfix_str(stage)
            if stage in progress["done"]:
                state.summary[stage] = progress["done"][stage]
                continue
            t0 = time.perf_counter()
            try:
                summary = STAGE_FNS[stage](state)
            except Exception as exc:
                raise RuntimeError(f"stage {stage!r} failed (workdir {root}): {type(exc).__name__}: {exc}") from exc
            summary["seconds"] = time.perf_counter() - t0
            state.summary[stage] = summary
            if stage == "warmup" and "online" in stages[i + 1:]:
                state.deferred[stage] = summary  # committed with the online stage's first checkpoint
            else:
                state.commit(stage, summary)
        if not progress.get("finished"):
            state.metrics.write("summary", {"stages": list(stages), "seconds": time.perf_counter() - start})
            progress["finished"] = True
            state.commit()
    finally:
        state.metrics.close()
    if not primary:
        return state.summary
    rows = read_metrics(root / METRICS_FILE)
    plot = plot_learning_curves(root / METRICS_FILE, root / PLOT_FILE)
    table = session_table([r for r in rows if r.get("table") == "sessions"])
    print(format_summary(state.summary, root, time.perf_counter() - start, table=table, plot=plot), file=out)
    return state.summary


def _fmt(value: Any) -> str:
    """Short human form of a metric."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3f}"
    return "-" if value is None else str(value)


SUMMARY_KEYS = {
    "synthesize": ("storylines_accepted", "train_episodes", "heldout_episodes", "train_trigger_examples"),
    "warmup": ("steps", "skipped_steps", "rollbacks", "before/planner/accuracy", "after/planner/accuracy", "before/trigger/accuracy",
               "after/trigger/accuracy"),
    "online": ("episodes", "updates", "skipped_steps", "rollbacks", "before/eval/planner_precision", "after/eval/planner_precision",
               "before/eval/planner_recall", "after/eval/planner_recall", "before/eval/trigger_recall",
               "after/eval/trigger_recall"),
}


def format_summary(summary: dict[str, dict[str, Any]], workdir: Path, seconds: float, *, table: str = "",
                   plot: Path | None = None) -> str:
    """The end-of-run report: a line per stage with its headline numbers, the per-session table, the files."""
    lines = [f"icml_jax run finished in {seconds:.1f} s; metrics: {workdir / METRICS_FILE}"
             + (f", plot: {plot}" if plot else "")]
    for stage, values in summary.items():
        keys = [k for k in SUMMARY_KEYS.get(stage, ()) if k in values]
        if stage == "warmup" and not keys:
            keys = sorted(k for k in values if k.startswith(("before/", "after/")))[:6]
        parts = [f"{k} {_fmt(values[k])}" for k in keys]
        lines.append(f"  {stage:<10} ({_fmt(values.get('seconds'))} s): " + ", ".join(parts))
    if table:
        lines += ["", "per session (held-out evaluation before/after online learning; online rewards):", table]
    return "\n".join(lines)


def quiet_info_logs() -> None:
    """absl logging at WARNING unless --verbosity was given: Orbax logs every save and restore at INFO."""
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file, e.g. configs/demo.py",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "directory for metrics.jsonl and the stages' outputs")
_DEBUG = flags.DEFINE_bool("debug", False, "show the traceback of an error a user can cause (a config, data, "
                           "checkpoint or back-end problem) instead of its one-line message")


def ignoring_closed_event_loops(hook: Callable[[Any], object]) -> Callable[[Any], None]:
    """`hook` (a sys.unraisablehook) minus the "Event loop is closed" reports a failed Orbax restore leaves behind.

    When one array of a checkpoint cannot be read, the restore's other TensorStore reads finish after Orbax closed
    its event loop, and each reports that as an unraisable RuntimeError: a traceback per tensor after the one-line
    error. Every other report goes to `hook`.
    """

    def filtered(unraisable: Any) -> None:
        exc = getattr(unraisable, "exc_value", None)
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        hook(unraisable)

    return filtered


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions a user causes (a config, data file, checkpoint, back end or diverging setting) and fixes from
    the message alone: the CLIs print them as one line and exit with status 2; anything else is a bug."""
    from icml_jax.llm.types import BackendError, MissingAPIKeyError
    from icml_jax.memory.store import MemoryStoreError
    from icml_jax.rl.checkpoint import CheckpointError
    from icml_jax.rl.divergence import DivergenceError

    return (ConfigError, CheckpointError, DivergenceError, BackendError, MissingAPIKeyError, MemoryStoreError,
            *_extra_user_errors())


def _extra_user_errors() -> tuple[type[BaseException], ...]:
    """Data and model-file errors (their modules name what failed: file, record, tensor)."""
    from icml_jax.data.report import DataError
    from icml_jax.models.config import ModelConfigError
    from icml_jax.models.safetensors_io import CheckpointError as WeightsError

    return (DataError, ModelConfigError, WeightsError)


def user_error(exc: BaseException) -> BaseException | None:
    """The user error behind `exc` (itself or a cause it was raised from), or None for a bug."""
    errors = user_errors()
    while exc is not None:
        if isinstance(exc, errors):
            return exc
        exc = exc.__cause__
    return None


def fail(tool: str, exc: BaseException, debug: bool) -> None:
    """Ends a CLI on a user error: one `<tool> error: ...` line on stderr and status 2 (--debug: the traceback)."""
    if debug:
        raise exc
    print(f"{tool} error: {' '.join(str(exc).split())}", file=sys.stderr)
    sys.exit(2)


def _override_path(argv: Sequence[str], exc: BaseException) -> str:
    """The `--config.a.b` override of `argv` that names the key `exc` complains about (or all of them)."""
    text = " ".join(str(e) for e in (exc, exc.__context__, exc.__cause__) if e is not None)
    overrides = [a.split("=", 1)[0] for a in argv if a.startswith("--config.")]
    named = [o for o in overrides if any(f"'{part}'" in text for part in o.split(".")[1:])]
    return ", ".join(named or overrides) or "the --config flag"


def parse_flags(argv: Sequence[str], tool: str = "config") -> list[str]:
    """absl's flag parsing, with a command-line override of a key the config lacks (or of a wrong type) ending
    in one line naming the flag instead of a traceback from ml_collections."""
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as exc:
        fail(tool, ConfigError(f"{exc}; --helpfull lists the flags"), "--debug" in argv)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        where = _override_path(argv, exc)
        fail(tool, ConfigError(f"{where}: no such key in the config file, or a value of the wrong type "
                               f"({type(exc).__name__}: {exc}); the config file's keys are the ones to override"),
             "--debug" in argv)
    raise AssertionError("unreachable")  # pragma: no cover


def main(argv: Sequence[str]) -> None:
    """absl entry point: a user error (config, data, checkpoint, back end, divergence) exits with one line and
    status 2; `--debug` shows its traceback."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/demo.py")
    quiet_info_logs()
    sys.unraisablehook = ignoring_closed_event_loops(sys.unraisablehook)  # a damaged checkpoint: one line, no tail
    try:
        run(_CONFIG.value, _WORKDIR.value or "")
    except Exception as exc:
        cause = user_error(exc)
        if cause is None:
            raise
        fail("config" if isinstance(cause, ConfigError) else "run", exc, _DEBUG.value)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
