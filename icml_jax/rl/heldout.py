"""The held-out evaluation of the policies: labelled episodes played in lockstep with fresh memory and no
learning, as per-session label counts.

It sits in `rl/` beside the online play it shares (`rollout`), not in `icml_jax.evaluation`: the online stage
(`icml_jax.run.stages.online`, below the evaluation layer) runs it before and after learning.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from icml_jax import parallel
from icml_jax.agents.agent import AgentConfig, MemoryAgent, Receipt, TurnInput
from icml_jax.agents.policy import MemoryPolicies
from icml_jax.data.labels import SessionCounts, memory_label, session_counts
from icml_jax.data.schema import Episode
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.types import LLMBackend
from icml_jax.memory.store import MemoryStore
from icml_jax.rl.rollout import agent_turns, decision_keys, lockstep


def evaluate(
    policies: MemoryPolicies,
    tokenizer,
    episodes: Sequence[Episode],
    *,
    agent_config: AgentConfig | None = None,
    backend: LLMBackend | None = None,
    user_speaker: str | None = "user",
    greedy: bool = False,
    seed: int = 0,
    users_in_flight: int = 1,
) -> list[SessionCounts]:
    """Per-session label counts of the policies on labelled episodes, fresh memory per episode, no learning.

    The agent acts on `user_speaker`'s turns (None: on every turn, as online on real data).
    `greedy=False` samples decisions as the online agent does (seeded: each draw depends on `seed` and the
    decision's place, so the same probabilities give the same draws); `greedy=True` takes the most likely ones.
    `users_in_flight` episodes are played in lockstep, their decisions batched (same counts). With several JAX
    processes, process p plays episodes p, p + P, ... and the counts of all come back to every process in the
    order of `episodes` (a collective: every process calls it with the same episodes).
    """
    if isinstance(users_in_flight, bool) or not isinstance(users_in_flight, int) or users_in_flight < 1:
        raise ValueError(f"evaluate: users_in_flight must be a positive int, got {users_in_flight!r}")
    cfg = dataclasses.replace(agent_config or AgentConfig(), greedy=greedy)
    backend = backend or OfflineBackend()
    count, index = jax.process_count(), jax.process_index()
    mine = list(range(index, len(episodes), count))  # the ordinals this process plays
    with MemoryStore() as store:
        agent = MemoryAgent(policies, tokenizer, store, backend, config=cfg, seed=seed)
        try:
            out: list[list[SessionCounts]] = []
            for start in range(0, len(mine), users_in_flight):
                ordinals = mine[start: start + users_in_flight]
                out += _evaluate_group(agent, [episodes[j] for j in ordinals], ordinals, user_speaker)
        finally:
            agent.close()  # its request pool, made when the back end is remote
    if count > 1:
        parts = parallel.allgather_objects(out)  # process p's k-th episode is ordinal k * P + p
        out = [parts[j % count][j // count] for j in range(len(episodes))]
    return [c for counts in out for c in counts]


def _evaluate_group(agent: MemoryAgent, episodes: Sequence[Episode], ordinals: Sequence[int],
                    user_speaker: str | None) -> list[list[SessionCounts]]:
    """`evaluate`'s play of episodes (numbers `ordinals`: their decisions' keys) in lockstep; each one's label
    counts."""
    receipts: list[list[Receipt]] = [[] for _ in episodes]
    for tick in lockstep([agent_turns(e, user_speaker) for e in episodes]):
        inputs = [TurnInput(episodes[i].episode_id, episodes[i].sessions[s].turns[t].text, hist,
                            episodes[i].episode_id, s, t, label=memory_label(episodes[i].sessions[s].turns[t]))
                  for i, s, t, hist in tick]
        keys = decision_keys(agent.key, np.asarray([(ordinals[i], s, t) for i, s, t, _ in tick], np.int32))
        for (i, *_), (_, receipt) in zip(tick, agent.step_many(inputs, keys=keys), strict=True):
            receipts[i].append(receipt)
    return [session_counts(e, r) for e, r in zip(episodes, receipts, strict=True)]
