"""Shared by the warm-up tests: the persona-world tokenizer and LoRA policies on a tiny backbone sized to it."""

from __future__ import annotations

import pytest
from flax import nnx

from icml_jax.agents import MemoryPolicies
from icml_jax.models import lora
from tests.train.world_fixtures import build_world_tokenizer, world_backbone

LORA = lora.LoraConfig(rank=8, alpha=16.0, dropout=0.1)  # the paper's adapter settings


def make_policies(vocab_size: int, *, backbone_seed: int, seed: int, template: MemoryPolicies | None = None,
                  lora_config: lora.LoraConfig = LORA, pooling: str = "last") -> MemoryPolicies:
    """LoRA policies (one adapter shared by both agents) on a tiny random backbone.

    qwix gives every adapted model its own class, so two models never share a graphdef and every new model
    compiles its programs again; passing `template` (same structure) reuses its graphdef with this model's
    values, so runs over several seeds compile once.
    """
    backbone = lora.apply_lora(world_backbone(vocab_size, seed=backbone_seed), lora_config, seed=seed)
    policies = MemoryPolicies(backbone, pooling=pooling, rngs=nnx.Rngs(seed))
    if template is not None:
        policies = nnx.merge(nnx.graphdef(template), nnx.state(policies))
    return policies


@pytest.fixture(scope="session")
def world_tokenizer(tmp_path_factory):
    return build_world_tokenizer(tmp_path_factory.mktemp("world_tok"))
