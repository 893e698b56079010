"""The synthesis writes its own prompts (`icml_jax.synthesis.prompts`); the agent's prompt module keeps none of them."""

from __future__ import annotations

from icml_jax.llm import prompts as llm_prompts
from icml_jax.synthesis import prompts


def test_the_synthesis_prompts_live_in_the_synthesis():
    left = [n for n in vars(llm_prompts) if "SYNTH" in n or n.startswith(("synthesis_", "_facts", "_NO_FACTS"))]
    assert not left, left
    for name in ("SYNTHESIS_TASKS", "SYNTH_ROLES", "SYNTH_SYSTEM", "synthesis_seed_request", "synthesis_prequel_request",
                 "synthesis_opening_request", "synthesis_sequel_request", "synthesis_annotate_request",
                 "synthesis_retry_request"):
        assert hasattr(prompts, name), name
    assert prompts.SYNTH_SYSTEM.endswith(llm_prompts.DATA_NOTE)
