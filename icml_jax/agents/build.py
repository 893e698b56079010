"""Builds the two policies from the config: backbones from local HF directories, LoRA, heads, shared or not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import Mesh
from ml_collections.config_dict import placeholder

from icml_jax import parallel
from icml_jax.agents.policy import HEADS, MemoryPolicies
from icml_jax.models.decoder import remat_policy
from icml_jax.models.loading import from_pretrained
from icml_jax.models.lora import LoraConfig, apply_lora


def default_config() -> ml_collections.ConfigDict:
    """The `policy` block: one backbone directory per agent (trigger None = share the planner's), LoRA, heads."""
    return ml_collections.ConfigDict(dict(
        planner_model=placeholder(str),  # local HF directory of the Planner's backbone
        trigger_model=placeholder(str),  # None: the Trigger shares the Planner's backbone and adapters
        dtype="bfloat16",
        pooling="last",  # last | mean: how hidden states become the heads' input
        match_rank=0,  # > 0 adds the bilinear context x memory Trigger score
        shared_prefix=False,  # score the Trigger's candidates against one pass over their shared context (exact;
        suffix_slots=32,  # 2.4-2.8x per decision on CPU, docs/benchmarks.md) with up to this many tokens each
        remat="none",  # none | dots | full: what an update's backward pass keeps of each layer (less: recomputed)
        seed=0,
    ))


def build_policies(
    policy: Mapping[str, Any] | ml_collections.ConfigDict,
    lora: LoraConfig | Mapping[str, Any] | None = None,
    *,
    mesh: Mesh | None = None,
    rules: parallel.Rules = parallel.DEFAULT_RULES,
) -> MemoryPolicies:
    """Loads each backbone (once when shared), puts LoRA adapters on it and adds the heads.

    Two different directories give the paper's mixed-size grid (e.g. a 1B Planner with an 8B Trigger).
    """
    cfg = dict(policy.to_dict() if hasattr(policy, "to_dict") else policy)
    if not cfg.get("planner_model"):
        raise ValueError("policy.planner_model must name a local Hugging Face model directory")
    lora_cfg = lora if isinstance(lora, LoraConfig) else LoraConfig.from_config(lora)
    dtype = jnp.dtype(cfg.get("dtype", "bfloat16"))
    seed = int(cfg.get("seed", 0))
    remat = cfg.get("remat", "none")
    remat_policy(remat)  # an unknown name fails before any weight loads

    def backbone(path: str, offset: int):
        model = apply_lora(from_pretrained(path, dtype=dtype, mesh=mesh, rules=rules), lora_cfg, seed=seed + offset,
                           mesh=mesh, rules=rules)
        model.remat = remat
        return model

    planner = backbone(cfg["planner_model"], 0)
    shared = not cfg.get("trigger_model") or cfg["trigger_model"] == cfg["planner_model"]
    trigger = planner if shared else backbone(cfg["trigger_model"], 1)
    policies = MemoryPolicies(planner, trigger, pooling=cfg.get("pooling", "last"),
                              match_rank=int(cfg.get("match_rank", 0)),
                              shared_prefix=bool(cfg.get("shared_prefix", False)),
                              suffix_slots=int(cfg.get("suffix_slots", 32)), rngs=nnx.Rngs(seed))
    if mesh is not None:  # the heads join the backbones' mesh (replicated): steps keep one sharding throughout
        for head in HEADS:
            if getattr(policies, head, None) is not None:
                parallel.shard_model(getattr(policies, head), mesh, rules)
    return policies
