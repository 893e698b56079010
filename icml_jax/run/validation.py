"""Everything about a config that can be checked before any stage runs: one `ConfigError` naming the field (and
what to do), raised before the workdir is touched. `validate` is the entry; the checks below are its parts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax import parallel
from icml_jax.agents.prefilter import encoder_directory
from icml_jax.checkpoint import META_FILE
from icml_jax.configlib import ConfigError, config_differences
from icml_jax.data.config import PERSONA_WORLD
from icml_jax.data.stream import check_data_config
from icml_jax.llm.registry import api_key_variables
from icml_jax.llm.remote import read_api_key
from icml_jax.llm.types import MissingAPIKeyError
from icml_jax.models.backbone import PRETRAINED, TINY
from icml_jax.run.runspec import RunSpec
from icml_jax.run.stages import STAGES
from icml_jax.run.workdir import CONFIG_FILE, SYNTHESIS_DIR, config_text

# where this process joins its run (coordinator, process id): not part of which run a workdir holds
PER_START_KEYS = ("parallel.distributed.", "limits.")  # limits: the chat's and the API's, not the run's
EXTENDABLE_KEYS = ("data.train_episodes",)  # may grow between starts: the run goes on (workdir.reopen_extended)


def parse_stages(config: ml_collections.ConfigDict) -> tuple[str, ...]:
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


def validate(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str],
             spec: RunSpec | None = None) -> tuple[str, ...]:
    """Checks everything that can be checked before work starts; returns the stages to run. The typed configs
    it builds stay in `spec` (the run's, when given), so the stages read the very objects checked here."""
    if not str(workdir):
        raise ConfigError("--workdir is required: the directory that receives metrics.jsonl and stage outputs")
    stages = parse_stages(config)
    spec = spec if spec is not None else RunSpec.from_config(config)
    try:  # seed sessions drawn from the data read the same episodes as the online stage
        check_data_config(spec.data, (*stages, "online") if "synthesize" in stages and spec.data_seeds else stages)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if "warmup" in stages and "synthesize" not in stages:
        manifest = Path(workdir) / SYNTHESIS_DIR / "manifest.json"
        if not manifest.is_file():
            raise ConfigError(f"config.mode runs 'warmup' without 'synthesize' but {manifest} does not exist; "
                              f"add 'synthesize' to config.mode or synthesize into that directory first")
    check_model(spec)
    check_backends(spec, stages)
    check_blocks(spec, stages)
    if {"synthesize", "warmup"} & set(stages):
        check_candidates(spec)
    if "online" in stages:
        check_checkpoint(spec)
    init_from = spec.online.init_from if "online" in stages else None
    if init_from:
        if "warmup" in stages:
            raise ConfigError("config.online.init_from starts the online stage from a saved policy, but config.mode "
                              "also runs 'warmup', whose result it would replace; drop one of them")
        if not (Path(init_from).expanduser() / META_FILE).is_file():
            raise ConfigError(f"config.online.init_from={init_from!r}: no saved policy there ({META_FILE} missing)")
    check_same_run(config, workdir)
    import jax

    try:
        settings = spec.parallel
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    parallel.initialize(dict(settings.distributed))
    try:
        mesh, _ = parallel.process_meshes(dict(settings.mesh))
    except ValueError as exc:
        raise ConfigError(f"config.parallel.mesh: {exc}") from None
    size = int(spec.ppo.minibatch_size)
    if "online" in stages and size % mesh.shape["data"]:  # PPO minibatch rows are sharded over `data`
        raise ConfigError(f"config.rl.ppo.minibatch_size={size} cannot be sharded over config.parallel.mesh.data="
                          f"{mesh.shape['data']} devices: make it a multiple of {mesh.shape['data']}")
    if jax.process_count() > 1:
        check_processes(config, stages, jax.process_count(), spec)
    return stages


def check_model(spec: RunSpec) -> None:
    """The backbone: its typed blocks build, a pretrained one's local directories hold a config.json, and the
    tiny model runs on the persona world whose vocabulary it uses."""
    try:  # kind, dtype and sizes are checked as the typed blocks are built
        model, policy = spec.model, spec.policy
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if model.kind == PRETRAINED:
        path = model.path
        if not path:
            raise ConfigError("config.model.path is not set: point it at a local Hugging Face checkpoint "
                              "directory (config.json + *.safetensors), e.g. --config.model.path=/models/Qwen3-1.7B")
        if not (Path(path).expanduser() / "config.json").is_file():
            raise ConfigError(f"config.model.path={path!r}: no config.json there; expected a local Hugging Face "
                              f"checkpoint directory (nothing is downloaded)")
        trigger = policy.trigger_model
        if trigger and not (Path(trigger).expanduser() / "config.json").is_file():
            raise ConfigError(f"config.policy.trigger_model={trigger!r}: no config.json there; expected a local "
                              f"Hugging Face checkpoint directory")
    elif model.kind == TINY and spec.data.name != PERSONA_WORLD:
        raise ConfigError("config.model.kind='tiny' builds its tokenizer from the persona world's vocabulary; "
                          f"it needs config.data.name='persona_world', got {spec.data.name!r}")


def check_backends(spec: RunSpec, stages: tuple[str, ...]) -> None:
    """Every configured LLM block (used by these stages or not) reads whole; each role the stages use is
    configured and, where its back end needs one, has its API key in the environment."""
    try:  # the roles and each block's kind, keys and values are checked as they are read
        llm = spec.llm
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    roles = spec.backend_roles(stages)
    for role, block in llm.configured().items():
        if block is None and role not in roles:
            continue
        try:
            if block is None:
                raise ValueError(f"config.llm.{role}: no back end configured, but the stages {list(stages)} use it")
            values = llm.check(role)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        name, env = api_key_variables(values)
        if role in roles and env:
            try:
                read_api_key(env, f"{values['kind']} back end")  # the key itself is never kept, logged or written
            except MissingAPIKeyError as exc:
                raise ConfigError(f"config.llm.{role} is a{'n' if name[0] in 'AEIOU' else ''} {name} back end "
                                  f"({values.get('model')}): {exc}; or try it without a key: "
                                  f"--config.llm.{role}.kind=offline") from None


def check_processes(config: ml_collections.ConfigDict, stages: Sequence[str], count: int,
                    spec: RunSpec | None = None) -> None:
    """What a run of several JAX processes needs: the online stage alone (each process plays its users; the
    synthesis and the warm-up run in one process first), whole groups of users per update, equal shares. `spec`:
    the run's (default: one of `config`)."""
    if tuple(stages) != ("online",):
        raise ConfigError(f"config.mode={tuple(stages)!r} on {count} JAX processes: several processes run the online "
                          "stage only. Run synthesize and warmup in one process first (--config.mode=synthesize,warmup "
                          "--workdir=W0), then every process with --config.mode=online "
                          "--config.online.init_from=W0/warmup and a new --workdir (docs/scaling.md)")
    spec = spec if spec is not None else RunSpec.from_config(config)
    try:
        b, every = spec.learner.users_in_flight, spec.learner.update_every
    except ValueError as exc:
        raise ConfigError(f"config.learner: {exc}") from None
    if every % (count * b):
        raise ConfigError(f"config.learner.update_every={every} must be a multiple of the {count} processes x "
                          f"learner.users_in_flight={b} (an update follows a whole group of users on every process)")
    data = spec.data
    if data.name == PERSONA_WORLD and data.train_episodes % count:
        raise ConfigError(f"config.data.train_episodes={data.train_episodes} must be a multiple of the {count} "
                          "processes (each plays an equal share, in lockstep)")


def check_blocks(spec: RunSpec, stages: Sequence[str]) -> None:
    """Builds each typed config the stages use (kept in `spec`) so a bad value fails now, naming its block."""
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("observation", lambda: spec.observation),
        ("rl", lambda: (spec.ppo, spec.reward)),
        ("data.world", lambda: spec.world),
        ("limits", lambda: spec.limits),
    ]
    if "synthesize" in stages:
        checks.append(("synthesis", lambda: spec.synthesis))
    if "warmup" in stages:
        checks.append(("warmup", lambda: spec.warmup))
    if "online" in stages:
        checks += [("learner", lambda: spec.learner), ("online", lambda: spec.online),
                   ("checkpoint", lambda: spec.checkpoint)]
    if {"warmup", "online"} & set(stages):  # both rank memories with the prefilter: its encoder must be there
        checks.append(("observation", lambda: spec.observation.prefilter == "embedding"
                       and encoder_directory(spec.observation.prefilter_model)))
    for name, check in checks:
        try:
            check()
        except (ValueError, TypeError, FileNotFoundError) as exc:
            raise ConfigError(f"config.{name}: {exc}") from None


def check_candidates(spec: RunSpec) -> None:
    """A synthesized Trigger example shows its positive and its negatives: they must fit the observation."""
    try:
        syn = spec.synthesis
    except ValueError as exc:
        raise ConfigError(f"config.synthesis: {exc}") from None
    limit = spec.observation.max_candidates
    shown = 1 + int(syn.hard_negatives) + int(syn.soft_negatives)
    if shown > limit:
        raise ConfigError(f"config.observation.max_candidates={limit} is smaller than the memories a synthesized "
                          f"Trigger example shows (1 + synthesis.hard_negatives={syn.hard_negatives} + "
                          f"synthesis.soft_negatives={syn.soft_negatives} = {shown}); raise max_candidates or lower "
                          "the negatives")


def check_checkpoint(spec: RunSpec) -> None:
    """Checkpoints are taken right after a PPO update, so their interval is a multiple of the update interval (the
    blocks themselves were checked as they were built)."""
    every, update_every = spec.checkpoint.every_episodes, spec.learner.update_every
    if every % update_every:
        raise ConfigError(f"config.checkpoint.every_episodes={every!r}: must be a positive multiple of "
                          f"config.learner.update_every={update_every} (a checkpoint follows a PPO update)")


def check_same_run(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str]) -> None:
    """A workdir resumes only the run it holds: another config there would mix two runs' state. How the processes
    find each other (`parallel.distributed`: each has its own id, a restart may get a new coordinator) is not
    compared; the number of processes is checked against the checkpoint on restore. `data.train_episodes` may
    change: a finished online stage given more episodes goes on from its newest checkpoint."""
    path = Path(workdir).expanduser() / CONFIG_FILE
    if path.is_file() and path.read_text(encoding="utf-8") != config_text(config):
        old, new = (json.loads(text) for text in (path.read_text(encoding="utf-8"), config_text(config)))
        diff = config_differences(old, new, ignore=PER_START_KEYS + EXTENDABLE_KEYS)
        if not diff:
            return
        raise ConfigError(f"{workdir} holds a run with another config (differs at {diff[:6]}); resume it with "
                          "the same config or use a new --workdir")
