"""The tiny setting of the demo, the tests and the persona-world experiment: a word-level tokenizer over the
persona world's own vocabulary, a tiny random Qwen3-style decoder, and the small world and observation sizes
that let such a backbone learn in a minute of CPU. No weights, no network.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from icml_jax.agents.observation import ObservationConfig, planner_text, trigger_texts
from icml_jax.data.persona_world import (
    FACT_REPLIES,
    NOISE_KINDS,
    NOISE_REPLIES,
    TEMPLATES,
    PersonaWorldConfig,
)
from icml_jax.models.config import ModelConfig, RopeConfig
from icml_jax.models.tokenizer import load_tokenizer

_WORD = re.compile(r"\w+|[^\w\s]+")  # what the `Whitespace` pre-tokenizer splits on
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


def world_vocabulary(world: PersonaWorldConfig, observation: ObservationConfig) -> list[str]:
    """Every word the policies can see in this world: templates, values, noise, replies and prompt frames."""
    texts: list[str] = list(FACT_REPLIES) + list(NOISE_REPLIES) + [world.user_speaker, world.assistant_speaker]
    for kind in world.fact_kinds:
        tpl, values = TEMPLATES[kind], world.values(kind)
        texts += [*values, *tpl.statements, *tpl.updates]
        texts += [q for pair in tpl.queries for q in pair]
    for kind in NOISE_KINDS:
        texts += list(world.noise(kind))
    texts += trigger_texts([], "", ["(none)"], observation) + [planner_text([], "", observation)]
    words = {w for text in texts for w in _WORD.findall(text)}
    return sorted(words)


def build_tokenizer(directory: Path, words: Sequence[str]) -> transformers.PreTrainedTokenizerBase:
    """A word-level tokenizer (specials 0..3, then `words`) saved to `directory` and loaded back."""
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *dict.fromkeys(words)])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                               pad_token="<pad>", unk_token="<unk>")
    tok.save_pretrained(directory)
    return load_tokenizer(directory)


def tiny_model_config(vocab_size: int, hidden: int = 64, layers: int = 2) -> ModelConfig:
    """A tiny Qwen3-style decoder config (random weights are all the experiment needs)."""
    return ModelConfig(family="qwen3", vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4, rms_norm_eps=1e-6,
                       rope=RopeConfig(theta=10000.0), qk_norm=True, max_position_embeddings=512,
                       bos_token_id=1, eos_token_ids=(2,), pad_token_id=0)


def learning_world() -> PersonaWorldConfig:
    """The persona world of the learning test: four fact kinds, six sessions, many queries per episode.

    Smaller than the default world so that a tiny random backbone sees enough (query, needed fact) pairs in
    a minute of CPU: ~24 user turns, ~5 facts (one update) and ~11 queries per episode.
    """
    return PersonaWorldConfig(num_sessions=6, facts_per_episode=4, num_updates=1, queries_per_session=4,
                              noise_ratio=0.25, min_user_turns=3, fact_kinds=("diet", "pet", "job", "plan"))


def learning_observation() -> ObservationConfig:
    """One length bucket and one candidate bucket: a single compiled program per jitted function."""
    return ObservationConfig(context_turns=0, max_length=64, min_length_bucket=64, max_candidates=7,
                             min_candidate_bucket=8)

# PPO and reward settings for heads on a tiny random backbone (the demo and the persona-world experiment; why
# each departs from the paper: `experiments.persona_run.PersonaRunConfig`)
LEARNING_PPO = dict(actor_lr=1e-2, critic_lr=1e-2, gamma=0.0, entropy_coef=0.05, epochs=4, minibatch_size=4)
LEARNING_SAVE_COST = 0.5

__all__ = ["LEARNING_PPO", "LEARNING_SAVE_COST", "SPECIALS", "build_tokenizer", "learning_observation",
           "learning_world", "tiny_model_config", "world_vocabulary"]
