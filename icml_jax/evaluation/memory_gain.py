"""Memory gain: how much more likely the generator finds the gold turn when the system's memory is in the reply
prompt. For each target, the teacher-forced log-likelihood of the reference (the human's real turn) after the
reply prompt the system's reply was written from, minus the same after that prompt without memory, in nats per
reference token; and the plain per-token NLL of the reference after the system's prompt. No sampling: one batched
pass of the generator (`LikelihoodBackend.loglik`) over every distinct prompt, so the metric carries none of
the replies' draw noise and a target without memory scores exactly 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.data.schema import Episode
from icml_jax.evaluation.protocol import gold_history
from icml_jax.llm.prompts import reply_request
from icml_jax.llm.types import LikelihoodBackend, LLMRequest, LoglikRequest

GAIN, NLL, NLL_NO_MEMORY = "memory_gain", "nll", "nll_no_memory"  # the target rows' keys


def can_score(backend: Any) -> bool:
    """Whether `backend` scores a given continuation (the local back end; hosted APIs return no such thing)."""
    return isinstance(backend, LikelihoodBackend) and callable(getattr(backend, "loglik", None))


def reply_prompt(row: Mapping[str, Any], episode: Episode, memory: str | None) -> LLMRequest:
    """The reply request a target row's reply was written from (its gold history and utterance) with `memory`."""
    history = gold_history(episode, int(row["session"]), int(row["turn"]))
    return reply_request(history, row["utterance"], memory)


def score_rows(backend: LikelihoodBackend, rows: Sequence[dict[str, Any]], episodes: Mapping[str, Episode]) -> None:
    """Adds GAIN, NLL and NLL_NO_MEMORY to each target row (in place), from one `loglik` call over the distinct
    (prompt, reference) pairs: each target's prompt without memory, and with the memory its reply used."""
    asks: dict[tuple[str, str, str | None], LoglikRequest] = {}
    keys = []
    for row in rows:
        episode = episodes.get(row["episode_id"])
        if episode is None:
            raise KeyError(f"memory gain: target row of episode {row['episode_id']!r} (session {row['session']}, "
                           f"turn {row['turn']}) has no episode among the {len(episodes)} evaluated")
        memory = row.get("memory") or None
        pair = []
        for mem in (None, memory):
            key = (row["episode_id"], f"{row['session']}/{row['turn']}", mem)
            if key not in asks:
                asks[key] = LoglikRequest(reply_prompt(row, episode, mem), row["reference"])
            pair.append(key)
        keys.append(pair)
    order = list(asks)
    answers = dict(zip(order, backend.loglik([asks[k] for k in order]), strict=True))
    for row, (without, with_memory) in zip(rows, keys, strict=True):
        a, b = answers[with_memory], answers[without]
        if a.tokens == 0:
            raise ValueError(f"memory gain: the reference of target {row['episode_id']} session {row['session']} "
                             f"turn {row['turn']} has no token")
        row[NLL], row[NLL_NO_MEMORY] = a.nll, b.nll
        row[GAIN] = 0.0 if with_memory == without else b.nll - a.nll


__all__ = ["GAIN", "NLL", "NLL_NO_MEMORY", "can_score", "reply_prompt", "score_rows"]
