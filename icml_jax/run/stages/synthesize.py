"""The synthesize stage: Retrospective Session Synthesis of the expert data into `<workdir>/synthesis`, from seed
sessions drawn from the online stream (real data) or the persona world."""

from __future__ import annotations

from typing import Any

import ml_collections

from icml_jax.data.stream import online_stream
from icml_jax.run.runspec import RunSpec
from icml_jax.run.stages.run import Run
from icml_jax.run.workdir import SYNTHESIS_DIR
from icml_jax.synthesis import seeds_from_episodes, synthesize


def synthesis_seeds(config: ml_collections.ConfigDict, spec: RunSpec | None = None):
    """The synthesis seeds of a run: with data seeds, the first sessions of the first `synthesis.num_seeds`
    distinct episodes of the online stream (the users the online stage will meet, in its order); else None
    (`synthesize` reads the seeds file or draws persona-world constraints)."""
    spec = spec if spec is not None else RunSpec.from_config(config)
    if not spec.data_seeds:
        return None
    world = spec.synthesis.world
    return seeds_from_episodes(online_stream(spec.data, seed=config.seed), int(spec.synthesis.num_seeds),
                               user_speaker=world.user_speaker, assistant_speaker=world.assistant_speaker)


def stage_synthesize(run: Run) -> dict[str, Any]:
    """Retrospective Session Synthesis with the synthesizer (default: generator) back end into
    `<workdir>/synthesis`, from the seeds of `synthesis_seeds` (real data: the played episodes' first sessions),
    memories condensed by the generator as the online agent's are."""
    spec = run.spec
    role = spec.synthesis_role
    backend = spec.make_backend(role)
    # the expert data's memories are condensed as online ones: by the generator (the agent's condenser)
    condenser = spec.make_backend("generator") if spec.condense_memories and role != "generator" else backend
    try:
        manifest = synthesize(spec.synthesis, backend, run.workdir / SYNTHESIS_DIR,
                              seeds=synthesis_seeds(run.config, spec), condenser=condenser)
    finally:  # Gemini's threads and connections
        for b in {id(backend): backend, id(condenser): condenser}.values():
            b.close()
    counts, usage = manifest["counts"], manifest["usage"]
    row = {"storylines_accepted": counts["storylines_accepted"], "storylines_rejected": counts["storylines_rejected"],
           "train_episodes": counts["train"]["episodes"], "heldout_episodes": counts["heldout"]["episodes"],
           "train_trigger_examples": counts["train"]["trigger"].get("examples"),
           "malformed_answers": counts["malformed_answers"], "failed_requests": counts.get("failed_requests"),
           "requests_from_cache": (manifest.get("cache") or {}).get("hits"),
           **{f"llm/{k}": usage.get(k) for k in ("total_tokens", "calls", "attempts", "retries", "failures")}}
    if (manifest.get("memories") or {}).get("usage"):  # the condenser is a back end of its own
        row.update({f"condenser/{k}": v for k, v in manifest["memories"]["usage"].items()
                    if k in ("total_tokens", "attempts", "retries", "failures")})
    run.metrics.write("synthesize", row)
    return row
