"""Shared by the update / learner / learning tests: the persona world's tokenizer and a tiny LoRA policy kit.

Compiled programs are keyed by the policies' graph, and two LoRA models built separately never share one, so
tests clone one session-wide LoRA model (`lora_kit.clone()`) instead of building new ones.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from icml_jax.agents.policy import TRAINABLE, MemoryPolicies
from icml_jax.models.decoder import Decoder
from icml_jax.models.lora import LoraConfig, apply_lora
from icml_jax.agents.tiny import (
    build_tokenizer,
    learning_observation,
    learning_world,
    tiny_model_config,
    world_vocabulary,
)
from icml_jax.rl.trajectory import PlannerItem, TriggerItem


def randomize_trainable(policies: MemoryPolicies, seed: int = 0, scale: float = 0.3) -> None:
    """Non-zero heads and adapters (LoRA B included), so every trainable leaf has a gradient."""
    for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(policies, TRAINABLE))):
        value = var.get_value()
        fan = value.shape[0] if value.ndim > 1 else 1
        noise = jax.random.normal(jax.random.fold_in(jax.random.key(seed), i), value.shape, jnp.float32)
        var.set_value((scale * fan**-0.5 * noise).astype(value.dtype))


@dataclasses.dataclass
class LoraKit:
    """A tiny LoRA-adapted backbone (hidden 32, 1 layer, rank 4, dropout 0.1) under policies with random heads."""

    policies: MemoryPolicies
    vocab: int

    def clone(self) -> MemoryPolicies:
        """A private copy sharing the compiled programs of the original."""
        return nnx.clone(self.policies)


@pytest.fixture(scope="session")
def persona_tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("persona_tok"),
                           world_vocabulary(learning_world(), learning_observation()))


@pytest.fixture(scope="session")
def lora_kit(persona_tokenizer) -> LoraKit:
    vocab = len(persona_tokenizer)
    backbone = apply_lora(Decoder(tiny_model_config(vocab, hidden=32, layers=1), rngs=nnx.Rngs(0)),
                          LoraConfig(rank=4, alpha=8.0, dropout=0.1), seed=0)
    policies = MemoryPolicies(backbone, pooling="mean", match_rank=4, rngs=nnx.Rngs(1))
    randomize_trainable(policies, seed=2)
    return LoraKit(policies, vocab)


def random_items(n: int, vocab: int, *, seed: int = 0, length: int = 64, cands: int = 8, short: bool = False):
    """n synthetic (PlannerItem, TriggerItem) pairs with left padding; `short` halves lengths and candidates."""
    rng = np.random.default_rng(seed)
    length, cands = (length // 2, cands // 2) if short else (length, cands)
    out = []
    for _ in range(n):
        real = int(rng.integers(5, length - 2))
        p_tok = np.zeros(length, np.int32)
        p_tok[-real:] = rng.integers(4, vocab, real)
        p_mask = p_tok != 0
        n_opt = int(rng.integers(1, cands + 1))
        t_tok = np.zeros((cands, length), np.int32)
        for c in range(n_opt):
            r = int(rng.integers(5, length - 2))
            t_tok[c, -r:] = rng.integers(4, vocab, r)
        t_mask = t_tok != 0
        cand = np.arange(cands) < n_opt
        out.append((PlannerItem(p_tok, p_mask, int(rng.integers(0, 2)), float(rng.normal()), float(rng.normal()), 0.0),
                    TriggerItem(t_tok, t_mask, cand, int(rng.integers(0, n_opt)), float(rng.normal()),
                                float(rng.normal()), 0.0)))
    return out


def force_policies(monkeypatch, choose) -> None:
    """Forces every Planner decision to save and every Trigger decision to `choose(cand_mask)` ([rows] actions from
    the [rows, options] candidate mask); the real policies still run, so their statistics are recorded as usual."""
    from icml_jax.agents import agent as agent_module

    real_planner, real_trigger = agent_module.planner_act, agent_module.trigger_act

    def always_save(graphdef, state, tokens, mask, key, *, greedy=False):
        action, stats = real_planner(graphdef, state, tokens, mask, key, greedy=greedy)
        return jnp.ones_like(action), stats

    def chosen(graphdef, state, tokens, mask, cand_mask, key, *, greedy=False):
        _, stats = real_trigger(graphdef, state, tokens, mask, cand_mask, key, greedy=greedy)
        return jnp.asarray(choose(np.asarray(cand_mask)), jnp.int32), stats

    monkeypatch.setattr(agent_module, "planner_act", always_save)
    monkeypatch.setattr(agent_module, "trigger_act", chosen)
