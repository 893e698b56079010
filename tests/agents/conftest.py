"""A tiny backbone, its tokenizer and policies with non-zero heads, shared by the agent tests."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from icml_jax.agents import MemoryPolicies
from icml_jax.models import Decoder, ModelConfig, load_tokenizer
from tests.models import hf_fixtures as F
from tests.models.tokenizer_fixtures import build_tokenizer


def tiny_backbone(seed: int = 0, kind: str = "qwen3") -> Decoder:
    config = ModelConfig.from_hf(json.loads(F.CONFIGS[kind]().to_json_string()))
    return Decoder(config, rngs=nnx.Rngs(seed))


def randomize_heads(policies: MemoryPolicies, seed: int = 0, scale: float = 0.5) -> None:
    """Non-zero heads, so probabilities are not all uniform."""
    keys = iter(jax.random.split(jax.random.key(seed), 8))
    for head in (policies.planner_actor, policies.trigger_actor, policies.planner_critic, policies.trigger_critic):
        k = head.kernel[...]
        head.kernel[...] = scale * k.shape[0] ** -0.5 * jax.random.normal(next(keys), k.shape, jnp.float32)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    d = tmp_path_factory.mktemp("agent_tok")
    build_tokenizer(d)
    return load_tokenizer(d)


@pytest.fixture
def policies():
    p = MemoryPolicies(tiny_backbone(0), rngs=nnx.Rngs(1))
    randomize_heads(p)
    return p
