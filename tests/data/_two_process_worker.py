"""One of two JAX processes (loopback coordinator): prints the episode ids its default shard streams."""

from __future__ import annotations

import json
import sys

import jax


def main(port: str, process_id: int) -> None:
    """Joins the 2-process job, then streams with the default (jax.process_index) sharding."""
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    from icml_jax.data.persona_world import PersonaWorldConfig, PersonaWorldSource
    from icml_jax.data.pipeline import eval_pipeline, train_pipeline

    src = PersonaWorldSource(PersonaWorldConfig(seed=0, num_sessions=2), 9)
    out = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "eval": [e.episode_id for e in eval_pipeline(src)],
        "train": [e.episode_id for e in train_pipeline(src, seed=1, num_epochs=1)],
    }
    print("RESULT " + json.dumps(out), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
