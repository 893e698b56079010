"""The memory agent: Planner/Trigger policies on backbones, their observations, and the per-turn loop."""

from icml_jax.agents.agent import AgentConfig, MemoryAgent, PlannerDecision, Receipt, TriggerDecision, TurnInput
from icml_jax.agents.observation import ObservationConfig, encode_planner, encode_trigger, planner_text, trigger_texts
from icml_jax.agents.build import build_policies
from icml_jax.agents.policy import (
    TRAINABLE,
    ActionStats,
    MemoryPolicies,
    param_labels,
    planner_act,
    planner_evaluate,
    trigger_act,
    trainable_group,
    trigger_evaluate,
)

__all__ = [
    "TRAINABLE",
    "build_policies",
    "ActionStats",
    "AgentConfig",
    "MemoryAgent",
    "MemoryPolicies",
    "ObservationConfig",
    "PlannerDecision",
    "Receipt",
    "TriggerDecision",
    "TurnInput",
    "encode_planner",
    "encode_trigger",
    "param_labels",
    "planner_act",
    "planner_evaluate",
    "planner_text",
    "trainable_group",
    "trigger_act",
    "trigger_evaluate",
    "trigger_texts",
]
