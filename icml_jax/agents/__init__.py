"""The memory agent: Planner/Trigger policies on backbones, their observations, and the per-turn loop."""

from icml_jax.agents.agent import AgentConfig, MemoryAgent, PlannerDecision, Receipt, TriggerDecision
from icml_jax.agents.observation import ObservationConfig, encode_planner, encode_trigger, planner_text, trigger_texts
from icml_jax.agents.policy import (
    ActionStats,
    MemoryPolicies,
    param_labels,
    planner_act,
    planner_evaluate,
    trigger_act,
    trigger_evaluate,
)

__all__ = [
    "ActionStats",
    "AgentConfig",
    "MemoryAgent",
    "MemoryPolicies",
    "ObservationConfig",
    "PlannerDecision",
    "Receipt",
    "TriggerDecision",
    "encode_planner",
    "encode_trigger",
    "param_labels",
    "planner_act",
    "planner_evaluate",
    "planner_text",
    "trigger_act",
    "trigger_evaluate",
    "trigger_texts",
]
