"""The paper's baselines behind the evaluation's agent interface (`icml_jax.evaluation.protocol.EvalAgent`):
each plays the protocol exactly as our trained agent does, its LLM calls through the evaluation's cached
generator. `baseline_factory(name)` gives the `AgentFactory` that `icml_jax.evaluate.evaluate_agent` takes:

    from icml_jax.baselines import baseline_factory
    evaluate_agent(config, workdir, baseline_factory("mem0"), system="mem0")

- no_memory: the current session's gold history only;
- long_context: every earlier session's turns in the prompt, cut from the oldest to the backbone's context;
- dense: every acted turn stored (our condensed note), top-k by embedding cosine;
- heuristic: every user turn saved, BM25 top-1 recalled when any word matches (rules for Planner and Trigger);
- memorybank: session summaries and facts with Ebbinghaus forgetting (after MemoryBank, AAAI 2024);
- mem0: per-turn facts merged by LLM ADD / UPDATE / DELETE / NOOP decisions (after Mem0, 2025);
- memochat: topic memos per session, picked for each reply by an LLM retrieval call (after MemoChat, 2023);
- rsum: one running summary, rewritten from itself and each finished session (after Rsum, 2025);
- comedy: session memories compressed into one profile / relationship / events memory (after COMEDY, 2025).
- ld_agent: per-session event summaries by topic-aware retrieval, both speakers' personas (after LD-Agent,
  2025);
- a_mem: notes with keywords, tags and context, linked and evolved by LLM calls (after A-Mem, 2025);
- memoryos: short-term pages, mid-term topic segments with heat, a promoted user persona (after MemoryOS,
  2025);
- theanine: never-deleted memories linked by causal / temporal relations into timelines, refined per reply
  (after THEANINE, 2025).

Settings: `config.baselines` (configs/base.py; missing keys take `DEFAULTS`). Importing this package registers
the offline back end's answers to the baselines' LLM tasks (`offline_answers`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from icml_jax.baselines import dense, heuristic, long_context, mem0, memorybank, no_memory
from icml_jax.baselines import comedy, memochat, rsum
from icml_jax.baselines import a_mem, ld_agent, memoryos, theanine
from icml_jax.baselines import offline_answers as _offline_answers  # noqa: F401  (registers the offline answers)
from icml_jax.baselines.common import DEFAULTS, BaselineAgent, baseline_settings

AgentFactory = Callable[[Any], tuple[Any, dict[str, Any]]]  # EvalContext -> (EvalAgent, provenance)

BASELINES: dict[str, AgentFactory] = {
    "no_memory": no_memory.build,
    "long_context": long_context.build,
    "dense": dense.build,
    "heuristic": heuristic.build,
    "memorybank": memorybank.build,
    "mem0": mem0.build,
    "memochat": memochat.build,
    "rsum": rsum.build,
    "comedy": comedy.build,
    "ld_agent": ld_agent.build,
    "a_mem": a_mem.build,
    "memoryos": memoryos.build,
    "theanine": theanine.build,
}


def baseline_factory(name: str) -> AgentFactory:
    """The `AgentFactory` of baseline `name` (one of `BASELINES`)."""
    try:
        return BASELINES[name]
    except KeyError:
        raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}") from None


def default_config() -> dict[str, Any]:
    """A copy of the defaults of `config.baselines` (`run.baseline_defaults`, which configs/base.py builds from)."""
    return baseline_settings(None)


__all__ = ["BASELINES", "DEFAULTS", "AgentFactory", "BaselineAgent", "baseline_factory", "baseline_settings",
           "default_config"]
