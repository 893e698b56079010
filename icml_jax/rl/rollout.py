"""Lockstep play of several users: which turns the agent acts on, the ticks of batched play, the groups of
episodes played together, and each decision's keys (a function of the run's key and the decision's place only).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from icml_jax.data.schema import Episode
from icml_jax.models.sampler import bucket


def agent_turns(episode: Episode, user_speaker: str | None) -> list[tuple[int, int, tuple[tuple[str, str], ...]]]:
    """(session, turn, dialogue before it) of each turn the agent acts on (`user_speaker`'s; None: every turn),
    in order; the dialogue is the session's gold one (the evaluation protocol)."""
    out = []
    for s, session in enumerate(episode.sessions):
        history: list[tuple[str, str]] = []
        for t, turn in enumerate(session.turns):
            if user_speaker is None or turn.speaker == user_speaker:
                out.append((s, t, tuple(history)))
            history.append((turn.speaker, turn.text))
    return out


def lockstep(schedules: Sequence[Sequence[tuple[Any, ...]]]) -> Iterator[list[tuple[Any, ...]]]:
    """Batched play's ticks: per tick, (episode index, *entry) of the next entry of each schedule not yet done."""
    for k in range(max((len(x) for x in schedules), default=0)):
        yield [(i, *x[k]) for i, x in enumerate(schedules) if k < len(x)]


def user_groups(episodes: Iterable[Episode], size: int, update_every: int, seen: int = 0
                ) -> Iterator[list[Episode]]:
    """Consecutive episodes in groups for `OnlineLearner.run_episodes`: at most `size`, distinct users (episode
    ids), never across an update (the count `seen` + played reaching a multiple of `update_every`), so every
    update and checkpoint falls between groups."""
    group: list[Episode] = []
    for episode in episodes:
        if any(e.episode_id == episode.episode_id for e in group):  # the same user twice: its turns are ordered
            yield group
            seen, group = seen + len(group), []
        group.append(episode)
        if len(group) == size or (seen + len(group)) % update_every == 0:
            yield group
            seen, group = seen + len(group), []
    if group:
        yield group


def decision_keys(key: jax.Array, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Trigger and Planner keys (raw key data [N, ...]) of the decisions at `where` [N, 3] = (episode ordinal,
    session, turn): each draw depends on the run's key and its place only, not on which other users share its
    batch or process. One compiled program per power-of-two N."""
    n = len(where)
    padded = np.zeros((bucket(n, 1), 3), np.int32)
    padded[:n] = where
    pairs = np.asarray(_decision_keys(key, padded))[:n]
    return pairs[:, 0], pairs[:, 1]


@jax.jit
def _decision_keys(key: jax.Array, where: jax.Array) -> jax.Array:
    """The raw (Trigger, Planner) key pair of each row of `where` (jitted; `decision_keys` pads and unpads)."""
    def one(w: jax.Array) -> jax.Array:
        k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, w[0]), w[1]), w[2])
        return jax.random.key_data(jax.random.split(k))
    return jax.vmap(one)(where)
