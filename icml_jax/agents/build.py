"""Builds the two policies from the config: backbones from local HF directories, LoRA, heads, shared or not."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import Mesh
from ml_collections.config_dict import placeholder

from icml_jax import parallel
from icml_jax.agents.policy import HEADS, POOLINGS, MemoryPolicies
from icml_jax.configlib import known_fields
from icml_jax.models.backbone import MODEL_DTYPES
from icml_jax.models.decoder import Decoder, remat_policy
from icml_jax.models.loading import from_pretrained
from icml_jax.models.lora import LoraConfig, apply_lora


POLICY_NULLABLE = {"planner_model": str, "trigger_model": str}  # None by default: typed placeholders in the block


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """The run config's `policy` block, typed (each default written once, here; `default_config` builds the
    ml_collections block from it).

    - `planner_model`: local HF directory of the Planner's backbone (configs/base.py links it to model.path);
      `trigger_model`: the Trigger's own backbone (None: it shares the Planner's backbone and adapters).
    - `dtype`: the backbones' weights (configs/base.py links it to model.dtype).
    - `pooling`: last | mean; `match_rank` > 0 adds the bilinear context x memory Trigger score.
    - `shared_prefix`: score the Trigger's candidates against one pass over their shared context (exact; faster on
      CPU, docs/benchmarks.md), with up to `suffix_slots` tokens each.
    - `remat`: none | dots | full: what an update's backward pass keeps of each layer (less: recomputed).
    - `seed`: the heads' and adapters' initialisation.
    """

    planner_model: str | None = None
    trigger_model: str | None = None
    dtype: str = "bfloat16"
    pooling: str = "last"
    match_rank: int = 0
    shared_prefix: bool = False
    suffix_slots: int = 32
    remat: str = "none"
    seed: int = 0

    def __post_init__(self) -> None:
        """Refuse a value no stage can build, naming the key (`config.policy.<key>`)."""
        for name in POLICY_NULLABLE:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"config.policy.{name} must be None or a str (a local directory), got {value!r}")
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"config.policy.dtype={self.dtype!r} is not one of {MODEL_DTYPES}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"config.policy.pooling={self.pooling!r} is not one of {POOLINGS}")
        for name, low in (("match_rank", 0), ("suffix_slots", 1), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"config.policy.{name} must be an int >= {low}, got {value!r}")
        if not isinstance(self.shared_prefix, bool):
            raise ValueError(f"config.policy.shared_prefix must be a bool, got {self.shared_prefix!r}")
        remat_policy(self.remat)  # an unknown name fails here, before any weight loads

    @classmethod
    def from_config(cls, block: ml_collections.ConfigDict | Mapping[str, Any] | None) -> PolicyConfig:
        """From the `policy` block (a ConfigDict, a mapping or None: the defaults); an unknown key is an error."""
        return cls(**known_fields(cls, block, where="config.policy"))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields, in their order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def default_config() -> ml_collections.ConfigDict:
    """The `policy` block of `PolicyConfig`'s defaults (None keys as typed placeholders, settable from flags)."""
    return ml_collections.ConfigDict({k: placeholder(POLICY_NULLABLE[k]) if v is None and k in POLICY_NULLABLE
                                      else v for k, v in PolicyConfig().to_dict().items()})


def policies_on(planner: Decoder, trigger: Decoder | None, cfg: PolicyConfig, *, rngs: nnx.Rngs) -> MemoryPolicies:
    """The heads on given backbones (trigger None: shared with the Planner), with the block's head settings."""
    return MemoryPolicies(planner, trigger, pooling=cfg.pooling, match_rank=cfg.match_rank,
                          shared_prefix=cfg.shared_prefix, suffix_slots=cfg.suffix_slots, rngs=rngs)


def build_policies(
    policy: PolicyConfig | Mapping[str, Any] | ml_collections.ConfigDict,
    lora: LoraConfig | Mapping[str, Any] | None = None,
    *,
    mesh: Mesh | None = None,
    rules: parallel.Rules = parallel.DEFAULT_RULES,
) -> MemoryPolicies:
    """Loads each backbone (once when shared), puts LoRA adapters on it and adds the heads.

    Two different directories give the paper's mixed-size grid (e.g. a 1B Planner with an 8B Trigger).
    """
    cfg = policy if isinstance(policy, PolicyConfig) else PolicyConfig.from_config(policy)
    if not cfg.planner_model:
        raise ValueError("policy.planner_model must name a local Hugging Face model directory")
    lora_cfg = lora if isinstance(lora, LoraConfig) else LoraConfig.from_config(lora)
    dtype = jnp.dtype(cfg.dtype)

    def backbone(path: str, offset: int):
        model = apply_lora(from_pretrained(path, dtype=dtype, mesh=mesh, rules=rules), lora_cfg,
                           seed=cfg.seed + offset, mesh=mesh, rules=rules)
        model.remat = cfg.remat
        return model

    planner = backbone(cfg.planner_model, 0)
    shared = not cfg.trigger_model or cfg.trigger_model == cfg.planner_model
    trigger = planner if shared else backbone(cfg.trigger_model, 1)
    policies = policies_on(planner, None if shared else trigger, cfg, rngs=nnx.Rngs(cfg.seed))
    if mesh is not None:  # the heads join the backbones' mesh (replicated): steps keep one sharding throughout
        for head in HEADS:
            if getattr(policies, head, None) is not None:
                parallel.shard_model(getattr(policies, head), mesh, rules)
    return policies
