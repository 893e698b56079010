"""Base config (paper defaults) for `python -m icml_jax.main`: every block is built from the `default_config()`
or the dataclass of the module that reads it (`icml_jax.run.runspec.RunSpec` builds the typed configs back), so each
default is defined once, next to the code, and tests/test_runspec.py checks that they agree.

Blocks: mode (stages in order), data, model, policy, lora, parallel, llm (generator and judge back ends),
synthesis, warmup, rl (PPO, rewards), learner, observation, online, checkpoint, limits (size caps on untrusted text:
read by the chat and the Memory API, not by training, so changing them never makes another run).
"""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections.config_dict import placeholder

from icml_jax import parallel
from icml_jax.agents import build as policy_build
from icml_jax.agents.agent import LEARNER_KEYS, AgentConfig
from icml_jax.agents.observation import ObservationConfig
from icml_jax.data import persona_world_config
from icml_jax.data.config import DATA_NULLABLE, DataConfig
from icml_jax.models import lora
from icml_jax.models.backbone import MODEL_NULLABLE, BackboneConfig
from icml_jax.llm.gemini import GeminiConfig
from icml_jax.llm.openai_compat import OPENAI_ONLY_KNOBS
from icml_jax.llm.registry import switchable_knobs
from icml_jax.rl.config import PPOConfig, RewardConfig
from icml_jax.rl.divergence import DivergenceConfig
from icml_jax.rl.learner import LearnerConfig
from icml_jax.run.baseline_defaults import baselines_block
from icml_jax.run.runspec import EVAL_NULLABLE, LEARNER_LOOP_KEYS, CheckpointConfig, EvalConfig, OnlineConfig
from icml_jax.synthesis import default_config as synthesis_config
from icml_jax.textcheck import TextLimits
from icml_jax.train import default_config as warmup_config


def gemini_backend(model: str = "gemini-2.5-flash") -> ml_collections.ConfigDict:
    """A Gemini back-end block with every GeminiConfig knob (timeout_s, max_attempts, base_url, ... settable from
    the command line); the API key is read from the environment (api_key_env, first one set wins), never from the
    config. Switching `kind` on the command line leaves these keys behind; the other kinds ignore them."""
    block = {f.name: getattr(GeminiConfig(model=model), f.name) for f in dataclasses.fields(GeminiConfig)}
    # api_key_env None: each kind's own variables, so --config.llm.<role>.kind=openai never sends a Gemini key;
    # context_tokens None: each kind's own model window (GeminiConfig / OpenAIConfig; long_context's budget);
    # structured_output None: each kind's own mode (Gemini json_schema, OpenAI-compatible auto, which finds what
    # the server takes); OPENAI_ONLY_KNOBS (None: OpenAI's defaults) keep every knob of that kind settable.
    block.update(api_key_env=None, context_tokens=None, structured_output=None, **dict.fromkeys(OPENAI_ONLY_KNOBS))
    typed = {"base_url": str, "api_version": str, "thinking_budget": int, "api_key_env": tuple,
             "context_tokens": int, "structured_output": str, **OPENAI_ONLY_KNOBS}  # None by default, settable
    return ml_collections.ConfigDict(dict(kind="gemini", **{k: placeholder(typed[k]) if v is None and k in typed
                                                            else v for k, v in block.items()}))


def backend_block(kind: str, **options: object) -> ml_collections.ConfigDict:
    """A back-end block of `kind` with `options` and every remote knob (llm.registry.switchable_knobs) held as None,
    which its kind ignores: `--config.llm.<role>.kind=openai` plus base_url, model and api_key_env=() on the
    command line turns a local or offline block into a served one."""
    knobs = {k: placeholder(t) for k, t in switchable_knobs().items() if k not in options}
    return ml_collections.ConfigDict(dict(kind=kind, **options, **knobs))


def get_config() -> ml_collections.ConfigDict:
    """The config tree; override fields with --config.<path>=value."""
    config = ml_collections.ConfigDict()
    config.mode = ("synthesize", "warmup", "online")  # stages, run in this order
    config.seed = 0
    # the episodes played online and evaluated on: persona_world | msc | cc | gapchat | locomo, a real dataset's
    # built TFDS split, sizes, the final sessions and the session cut (icml_jax.data.config.DataConfig says each key)
    data = dict(DataConfig().to_dict(), world=persona_world_config())
    config.data = ml_collections.ConfigDict({k: placeholder(DATA_NULLABLE[k]) if v is None and k in DATA_NULLABLE
                                             else v for k, v in data.items()})
    # the policies' backbone: kind pretrained (a local HF directory at `path`, nothing is downloaded) | tiny (a
    # random decoder: demo, tests), its dtype, the tiny decoder's sizes (icml_jax.models.backbone says each key)
    config.model = ml_collections.ConfigDict({k: placeholder(MODEL_NULLABLE[k]) if v is None and k in MODEL_NULLABLE
                                              else v for k, v in BackboneConfig().to_dict().items()})
    config.policy = policy_build.default_config()
    config.policy.planner_model = config.model.get_ref("path")  # the Planner's backbone is the model by default
    config.policy.dtype = config.model.get_ref("dtype")
    config.lora = lora.default_config()
    config.parallel = parallel.default_config()
    config.llm = ml_collections.ConfigDict(dict(
        generator=gemini_backend(),  # writes storylines, replies and memory notes
        judge=gemini_backend(),  # proxy value and reply quality
        synthesizer=None,  # writes the expert storylines; None: the generator does
    ))
    config.observation = ml_collections.ConfigDict(dataclasses.asdict(ObservationConfig()))
    config.synthesis = synthesis_config()  # max_failed_fraction: requests that may fail after all retries (skipped)
    config.warmup = warmup_config()  # its observation and rewards: `config.observation` and `config.rl.reward`
    config.rl = ml_collections.ConfigDict(dict(
        ppo=PPOConfig().to_dict(),
        reward=RewardConfig().to_dict(),
    ))
    config.rl.ppo.max_grad_norm = placeholder(float)
    config.rl.ppo.max_grad_norm = PPOConfig().max_grad_norm
    config.rl.ppo.value_clip = placeholder(float)
    config.rl.ppo.lora_lr = placeholder(float)
    config.warmup.gamma = config.rl.ppo.get_ref("gamma")
    # the online loop: update_every (episodes per PPO update), users_in_flight (episodes played in lockstep, their
    # decisions batched; divides update_every), fresh_memory (LearnerConfig); the agent's reply_temperature,
    # reply_max_tokens, note_max_tokens (also the expert data's notes, via the synthesis), planner_rule /
    # trigger_rule (ablations: save_all / lexical) and supersede_candidates (AgentConfig documents each)
    loop, agent = LearnerConfig(), AgentConfig()
    config.learner = ml_collections.ConfigDict(dict(
        **{k: getattr(loop, k) for k in LEARNER_LOOP_KEYS},
        **{k: getattr(agent, k) for k in LEARNER_KEYS},
        divergence=DivergenceConfig().to_dict(),  # when a PPO update counts as diverged (rl.divergence)
    ))
    config.synthesis.note_max_tokens = config.learner.get_ref("note_max_tokens")
    # greedy_eval, eval_before (held-out evaluations), init_from (a saved policy dir to start from: runspec)
    config.online = ml_collections.ConfigDict(dataclasses.asdict(OnlineConfig()))
    config.online.init_from = placeholder(str)
    # python -m icml_jax.evaluate (real datasets' protocol): icml_jax.run.runspec.EvalConfig says each key
    config.eval = ml_collections.ConfigDict({k: placeholder(EVAL_NULLABLE[k]) if v is None and k in EVAL_NULLABLE
                                             else v for k, v in EvalConfig().to_dict().items()})
    config.baselines = baselines_block()  # icml_jax.baselines (Table 1's other systems): run.baseline_defaults
    config.experiments = ml_collections.ConfigDict(dict(  # python -m icml_jax.experiments (sizes per experiment)
        baselines=("no_memory", "long_context", "dense", "heuristic", "memorybank", "mem0",
                   "ld_agent", "a_mem", "memoryos", "theanine"),  # Table 1's rows
        table6_baselines=("memochat", "rsum", "comedy"),  # Table 6's rows (memory methods; not in Table 1)
        synthetic_scale=(0, 100, 250, 500, 1000),  # synthesized training episodes (Table 3)
        ablations=(),  # Table 2's variants to run besides the full method (e.g. ("w/o evolution",)); empty: all
        lambdas=(0.3, 0.5, 0.7),  # truth-reward weights (Table 10)
        judges=("offline",),  # reward models for Tables 7 / 11 (`judges` trains with each, `rejudge` re-judges main's
        # replies): "offline", "generator", "judge" (the config's blocks) or a local model directory (a small local
        # LLM judges, its answers capped at:)
        local_judge_max_tokens=128,
        size_grid=(),  # local model dirs for Figure 6 (Planner backbone x Trigger backbone); empty: config.model
        sessions=10,  # Figure 7: sessions per episode
        policy_map_episode=0,  # Figure 5: which held-out episode's turns are plotted
    ))
    # every_episodes (a multiple of learner.update_every), keep, async_save: icml_jax.run.runspec.CheckpointConfig
    config.checkpoint = ml_collections.ConfigDict(dataclasses.asdict(CheckpointConfig()))
    # a chat line / Memory API text, a search result's source excerpt, Memory.add metadata (longer: refused)
    config.limits = ml_collections.ConfigDict(dataclasses.asdict(TextLimits()))
    return config
