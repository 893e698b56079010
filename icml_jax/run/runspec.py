"""The typed configs of a run, built from its ml_collections ConfigDict in one place.

`RunSpec.from_config(config)` wraps the config; each typed block (model, observation, agent, learner, PPO, reward,
warm-up, synthesis, data, world, limits, online, checkpointing, evaluation, back ends) is built from it on first use
and kept, so every stage and tool (main, chat, evaluate, experiments, baselines) reads the same objects. A key a
block leaves out takes its dataclass's default: each default is defined once, in its dataclass. Blocks are built
lazily, so a tool that needs one block (the chat: observation and agent) never fails on another's value.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from icml_jax.agents.agent import AgentConfig
from icml_jax.agents.build import PolicyConfig
from icml_jax.agents.observation import ObservationConfig
from icml_jax.configlib import field_default, known_fields
from icml_jax.data.config import REAL_DATASETS, DataConfig
from icml_jax.data.persona_world import PersonaWorldConfig
from icml_jax.data.stream import user_speaker
from icml_jax.llm.config import GENERATOR, LLMConfig
from icml_jax.llm.types import LLMBackend
from icml_jax.models.backbone import BackboneConfig
from icml_jax.models.lora import LoraConfig
from icml_jax.parallel import ParallelConfig
from icml_jax.rl.config import PPOConfig, RewardConfig
from icml_jax.rl.divergence import DivergenceConfig
from icml_jax.rl.learner import LearnerConfig
from icml_jax.run.baseline_defaults import baseline_settings_of
from icml_jax.synthesis.config import SynthesisConfig
from icml_jax.textcheck import TextLimits
from icml_jax.train.supervised import WarmupConfig

# LearnerConfig fields a config's `learner` block sets (the agent's knobs are `agents.agent.LEARNER_KEYS`)
LEARNER_LOOP_KEYS = ("update_every", "fresh_memory", "users_in_flight")


@dataclasses.dataclass(frozen=True)
class OnlineConfig:
    """The online stage's `online` block: how the held-out evaluations run and which policy it starts from."""

    greedy_eval: bool = False  # evaluate the sampling policy the agent acts with online
    eval_before: bool = True  # held-out evaluation before and after online learning
    init_from: str | None = None  # a saved policy dir (e.g. another run's <workdir>/warmup) to start from instead
    # of this run's fresh or warmed-up policies (experiments share one warm-up across variants)

    @classmethod
    def from_config(cls, block: Any) -> OnlineConfig:
        """From the `online` block (None: the defaults); unknown keys are an error."""
        return cls(**known_fields(cls, block))


EVAL_SELECTIONS = ("auto", "seeded", "theanine")  # EvalConfig.selection
EVAL_NULLABLE = {"tfds_name": str, "bertscore_model": str, "mauve_model": str, "reply_temperature": float}  # None
# by default: the ml_collections block holds a typed placeholder


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """- `episodes`: the protocol's episode count (the paper: 50).
    - `tfds_name`: the built TFDS builder/config whose test splits the protocol reads; None: the dataset's own
      (gapchat_episodes/protocol, ...); e.g. gapchat_episodes/sample for shared/data's 60 episodes.
    - `selection`: auto (THEANINE's ids for MSC / CC when its ids file is there) | seeded | theanine; `seed`: the
      seeded draw.
    - `judge`: rate every reply on the five dimensions with `llm.judge`; `max_failed_fraction`: the share of
      judge requests (and episodes) that may fail after all retries (counted, left out of the means).
    - `learn`: learn online (PPO) on each episode's history sessions before answering its targets.
    - `bertscore_model` / `bertscore_layer`: a local encoder dir for BERTScore and the hidden state bert-score
      reads (the paper: roberta-large, layer 17; the fetched all-MiniLM-L6-v2 has 6, its magnitudes are not the
      paper's); None: skipped. A layer the encoder lacks fails before the evaluation plays.
    - `mauve_model` / `mauve_max_length`: a local Llama / Qwen2 / Qwen3 / Gemma3 dir whose last-token final hidden
      states feed MAUVE (GPT-2, the paper's featurizer, does not load: magnitudes are not the paper's), and the
      tokens per text; None: skipped.
    - `reply_temperature`: the target replies' temperature (0: greedy); None: each system's own
      `learner.reply_temperature` (sampled, as the paper).
    - `memory_gain`: score each target's memory gain and NLL with the generator where it can (local back end).
    - `prices`: an optional cost estimate, {"generator": {"input": USD, "output": USD} per 1M tokens, "judge": ...}.
    """

    episodes: int = 50
    tfds_name: str | None = None
    selection: str = "auto"
    seed: int = 0
    judge: bool = True
    max_failed_fraction: float = 0.1
    learn: bool = False
    bertscore_model: str | None = None
    bertscore_layer: int = 17
    mauve_model: str | None = None
    mauve_max_length: int = 256
    reply_temperature: float | None = None
    memory_gain: bool = True
    prices: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse a setting the evaluation cannot run, naming the key."""
        if self.selection not in EVAL_SELECTIONS:
            raise ValueError(f"eval.selection must be one of {EVAL_SELECTIONS}, got {self.selection!r}")
        for name in ("episodes", "bertscore_layer", "mauve_max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"eval.{name} must be a positive int, got {value!r}")
        if not 0.0 <= self.max_failed_fraction <= 1.0:
            raise ValueError(f"eval.max_failed_fraction must be in [0, 1], got {self.max_failed_fraction!r}")
        t = self.reply_temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= float(t) <= 2.0):
            raise ValueError(f"eval.reply_temperature must be a number in [0, 2] or None, got {t!r}")

    @classmethod
    def from_config(cls, config: Any) -> EvalConfig:
        """From a whole config's `eval` block (absent: the defaults); an unknown key is an error."""
        block = config.get("eval") if config is not None else None
        values = dict(block.to_dict() if hasattr(block, "to_dict") else block or {})
        values["prices"] = dict(values.get("prices") or {})
        return cls(**known_fields(cls, values))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (the block configs/base.py builds)."""
        return {f.name: (dict(getattr(self, f.name)) if f.name == "prices" else getattr(self, f.name))
                for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """The online stage's `checkpoint` block (checked by `validation`: a positive multiple of the update interval)."""

    every_episodes: int = 10  # online checkpoint interval (a multiple of learner.update_every); one more at the end
    keep: int = 3  # complete checkpoints kept in <workdir>/checkpoints
    async_save: bool = True  # write in the background while the next episodes play

    def __post_init__(self) -> None:
        """Refuse a count no checkpointer can keep, naming the key."""
        for name in ("every_episodes", "keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CheckpointConfig.{name} must be a positive int, got {value!r}")

    @classmethod
    def from_config(cls, block: Any) -> CheckpointConfig:
        """From the `checkpoint` block (None: the defaults); unknown keys are an error."""
        return cls(**known_fields(cls, block))


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A run's typed configs, each built once (on first use) from `config`, the ConfigDict the run was given."""

    config: ml_collections.ConfigDict

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> RunSpec:
        """The spec of `config` (nothing is built until a block is read; `validation` reads the ones a run uses)."""
        return cls(config)

    # ------------------------------------------------------------------------------------------- the backbone

    @functools.cached_property
    def model(self) -> BackboneConfig:
        """The policies' backbone (`config.model`): a local checkpoint or the tiny decoder, and its dtype."""
        return BackboneConfig.from_config(self.config.model)

    @functools.cached_property
    def lora(self) -> LoraConfig:
        """The LoRA adapters on the backbones (`config.lora`; absent: the defaults)."""
        return LoraConfig.from_config(self.config.get("lora"))

    @functools.cached_property
    def parallel(self) -> ParallelConfig:
        """The device mesh, sharding rules and multi-process start-up (`config.parallel`; absent: the defaults)."""
        return ParallelConfig.from_config(self.config.get("parallel"))

    @functools.cached_property
    def policy(self) -> PolicyConfig:
        """The two policies' backbones, heads and initialisation (`config.policy`)."""
        return PolicyConfig.from_config(self.config.get("policy"))

    # ---------------------------------------------------------------------------------------- the policies' view

    @functools.cached_property
    def observation(self) -> ObservationConfig:
        """What both policies see, in every stage (`config.observation`)."""
        return ObservationConfig(**known_fields(ObservationConfig, self.config.get("observation")))

    @functools.cached_property
    def agent(self) -> AgentConfig:
        """The per-turn agent's knobs (`config.learner`'s reply / note / rule keys) with the observation."""
        return AgentConfig.from_config(self.config.get("learner"), self.observation)

    # ----------------------------------------------------------------------------------------------------- rl

    @functools.cached_property
    def ppo(self) -> PPOConfig:
        """PPO settings (`config.rl.ppo`)."""
        return PPOConfig.from_dict(self.config.rl.ppo.to_dict())

    @functools.cached_property
    def reward(self) -> RewardConfig:
        """Reward settings (`config.rl.reward`), shared by the online stage and the warm-up's value targets."""
        return RewardConfig.from_dict(self.config.rl.reward.to_dict())

    @functools.cached_property
    def learner(self) -> LearnerConfig:
        """The online loop (`config.learner`, `config.rl`, `config.seed`, the data's user speaker)."""
        block = self.config.get("learner") or {}
        loop = {k: block.get(k) for k in LEARNER_LOOP_KEYS if block.get(k) is not None}
        if "users_in_flight" in loop:
            loop["users_in_flight"] = int(loop["users_in_flight"])
        return LearnerConfig(ppo=self.ppo, reward=self.reward, agent=self.agent, seed=self.config.seed,
                             user_speaker=user_speaker(self.data),
                             divergence=DivergenceConfig.from_config(block.get("divergence")), **loop)

    @functools.cached_property
    def online(self) -> OnlineConfig:
        """The online stage's evaluation and start settings (`config.online`)."""
        return OnlineConfig.from_config(self.config.get("online"))

    @functools.cached_property
    def checkpoint(self) -> CheckpointConfig:
        """The online checkpoints' interval and retention (`config.checkpoint`)."""
        return CheckpointConfig.from_config(self.config.get("checkpoint"))

    @functools.cached_property
    def baselines(self) -> dict[str, Any]:
        """Table 1's and Table 6's other systems' settings (`config.baselines` over `BASELINE_DEFAULTS`)."""
        return baseline_settings_of(self.config.get("baselines"))

    @functools.cached_property
    def eval(self) -> EvalConfig:
        """How a system is evaluated on a real dataset's protocol (`config.eval`)."""
        return EvalConfig.from_config(self.config)

    # ------------------------------------------------------------------------------------------------ the data

    @functools.cached_property
    def data(self) -> DataConfig:
        """The episodes the run plays online and is evaluated on (`config.data`)."""
        return DataConfig.from_config(self.config.data)

    @functools.cached_property
    def world(self) -> PersonaWorldConfig:
        """The persona world of the data (`config.data.world`)."""
        return self.data.world

    # ----------------------------------------------------------------------------------- synthesis and warm-up

    @functools.cached_property
    def synthesis(self) -> SynthesisConfig:
        """Retrospective Session Synthesis (`config.synthesis`)."""
        return SynthesisConfig.from_config(self.config.synthesis)

    @functools.cached_property
    def warmup(self) -> WarmupConfig:
        """The supervised warm-up (`config.warmup`); its observation and value-target rewards are the run's own
        (`config.observation`, `config.rl.reward`: `train.supervised.RUN_FIELDS` are not keys of the block)."""
        return WarmupConfig.from_config(self.config.warmup, observation=self.observation, rewards=self.reward)

    @property
    def data_seeds(self) -> bool:
        """Whether the synthesis seeds come from the episodes the online stage plays (`synthesis.seed_source`);
        read from the raw synthesis block, so validation can ask before the synthesis block is built."""
        syn = self.config.synthesis
        if syn.get("seeds_file"):
            return False
        source = syn.get("seed_source", field_default(SynthesisConfig, "seed_source"))
        return source == "data" or (source == "auto" and self.data.name in REAL_DATASETS)

    # ------------------------------------------------------------------------------------------ the back ends

    @functools.cached_property
    def llm(self) -> LLMConfig:
        """The back end of each role (`config.llm`: generator, judge, synthesizer)."""
        return LLMConfig.from_config(self.config.llm)

    @property
    def synthesis_role(self) -> str:
        """The `config.llm` block that writes the expert data: `synthesizer` when set, else the generator."""
        return self.llm.synthesis_role

    @property
    def condense_memories(self) -> bool:
        """Whether the synthesis condenses the expert memories (with the generator), from the raw block."""
        return bool(self.config.synthesis.get("condense_memories",
                                              field_default(SynthesisConfig, "condense_memories")))

    def backend_roles(self, stages: Sequence[str]) -> list[str]:
        """The `config.llm` back ends the stages call: synthesis writes with the synthesizer (default: the
        generator) and condenses the expert memories with the generator (the online memory writer's back end);
        online needs the generator and the judge."""
        roles = []
        if "synthesize" in stages:
            roles.append(self.synthesis_role)
            if self.condense_memories:
                roles.append("generator")
        if "online" in stages:
            roles += ["generator", "judge"]
        return list(dict.fromkeys(roles))

    def make_backend(self, role: str) -> LLMBackend:
        """A new client of the `config.llm.<role>` back end (the caller closes it)."""
        return self.llm.make_backend(role)

    @property
    def generator_context_tokens(self) -> int | None:
        """The remote generator's input window (`config.llm.generator.context_tokens`, else its kind's default),
        None when the generator runs locally (offline, local: the backbone's context bounds a prompt)."""
        return self.llm.context_tokens(GENERATOR)

    @property
    def judge_is_generator(self) -> bool:
        """Whether the judge and the generator are one back end (then one client serves both roles)."""
        return self.llm.judge_is_generator

    # ---------------------------------------------------------------------------------------------- the chat

    @functools.cached_property
    def limits(self) -> TextLimits:
        """Size caps on untrusted text (`config.limits`; a run written before the block existed: the defaults)."""
        return TextLimits.from_config(self.config.get("limits"))
