"""The evaluation protocol (after THEANINE, as the paper uses it): which episodes, which turns are targets.

Per dataset 50 test episodes are chosen with a fixed seed (or THEANINE's own MSC/CC choice from
``shared/data/{msc,cc}/theanine_eval_ids.json``). In each, the final session is the target: every turn
t >= 1 is generated as that turn's speaker given the gold turns 0..t-1 of the session; the earlier sessions
are the history the memory is built from. GapChat pools its 4- and 5-session test files before choosing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.data.tfds_builders import read_episodes

EVAL_SEED = 0
NUM_EVAL_EPISODES = 50
THEANINE_KEYS = ("evaluated_50", "sampled_200")
# dataset -> (TFDS builder/config, the test splits the protocol reads)
PROTOCOL_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "msc": ("msc_episodes/parlai", ("test",)),
    "cc": ("cc_episodes/test", ("test",)),
    "gapchat": ("gapchat_episodes/protocol", ("test_4", "test_5")),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """One turn to generate: ``episode.sessions[session].turns[turn]``, spoken by ``speaker``."""

    episode_id: str
    session: int
    turn: int
    speaker: str
    reference: str


def shared_data_dir() -> Path:
    """``<repo>/../shared/data``: where the project's real data samples live (may not exist)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def natural_key(episode_id: str) -> tuple[Any, ...]:
    """Sort key that orders "ep-2" before "ep-10", so selection does not depend on storage order."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", episode_id))


def select_eval_episodes(
    episodes: Iterable[Episode], n: int = NUM_EVAL_EPISODES, seed: int = EVAL_SEED
) -> list[Episode]:
    """``n`` episodes drawn without replacement with ``seed``, independent of the input order.

    Episodes are first sorted by ``natural_key(episode_id)`` (TFDS stores them in hashed order), then
    ``np.random.default_rng(seed).choice`` picks the indices; the result keeps the draw order.
    """
    pool = sorted(episodes, key=lambda e: natural_key(e.episode_id))
    ids = [e.episode_id for e in pool]
    if len(set(ids)) != len(ids):
        raise ValueError("episode ids are not unique; selection by seed would be ambiguous")
    if len(pool) < n:
        raise ValueError(f"asked for {n} evaluation episodes but only {len(pool)} are available")
    idx = np.random.default_rng(seed).choice(len(pool), size=n, replace=False)
    return [pool[int(i)] for i in idx]


def load_theanine_ids(path: str | os.PathLike[str], key: str = "evaluated_50") -> list[str]:
    """THEANINE's episode ids from ``theanine_eval_ids.json`` (``evaluated_50`` or ``sampled_200``)."""
    if key not in THEANINE_KEYS:
        raise ValueError(f"key must be one of {THEANINE_KEYS}, got {key!r}")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    ids = data.get(key)
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{path}: {key!r} is not a list of episode ids")
    return ids


def select_by_ids(episodes: Iterable[Episode], ids: Sequence[str]) -> list[Episode]:
    """The episodes with these ids, in the ids' order; raises KeyError listing ids that are missing."""
    by_id = {e.episode_id: e for e in episodes}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise KeyError(f"{len(missing)} of {len(ids)} requested episodes are missing, e.g. {missing[:5]}")
    return [by_id[i] for i in ids]


def theanine_selection(
    dataset: str, episodes: Iterable[Episode], ids_dir: str | os.PathLike[str] | None = None
) -> list[Episode]:
    """THEANINE's own 50 MSC or CC evaluation episodes (ids from ``<ids_dir>/<dataset>/theanine_eval_ids.json``).

    ``ids_dir`` defaults to ``shared_data_dir()``.
    """
    if dataset not in ("msc", "cc"):
        raise ValueError(f"THEANINE chose episodes for 'msc' and 'cc' only, not {dataset!r}")
    root = Path(ids_dir) if ids_dir is not None else shared_data_dir()
    return select_by_ids(episodes, load_theanine_ids(root / dataset / "theanine_eval_ids.json"))


def gapchat_eval_pool(test_4: Iterable[Episode], test_5: Iterable[Episode]) -> list[Episode]:
    """GapChat's pool: the 4- and 5-session test files together (60 + 40 = 100 episodes in the release)."""
    pool = list(test_4) + list(test_5)
    if len({e.episode_id for e in pool}) != len(pool):
        raise ValueError("GapChat 4- and 5-session episode ids collide; build both with their default ids")
    return pool


def final_session_targets(episode: Episode) -> list[Target]:
    """The targets of one episode: every turn t >= 1 of its final session."""
    if not episode.sessions:
        return []
    s = len(episode.sessions) - 1
    return [
        Target(episode.episode_id, s, t, turn.speaker, turn.text)
        for t, turn in enumerate(episode.sessions[s].turns)
        if t >= 1
    ]


def eval_targets(episodes: Iterable[Episode]) -> list[Target]:
    """All final-session targets of the given episodes, episode by episode."""
    return [t for e in episodes for t in final_session_targets(e)]


def target_context(episode: Episode, target: Target) -> tuple[tuple[Session, ...], tuple[Turn, ...]]:
    """What the agent may see for a target: the earlier sessions, and the gold turns 0..t-1 of its session."""
    if episode.episode_id != target.episode_id:
        raise ValueError(f"target of {target.episode_id} does not belong to {episode.episode_id}")
    return episode.sessions[: target.session], episode.sessions[target.session].turns[: target.turn]


def compare_with_theanine_prefixes(episodes: Iterable[Episode], prefixes_path: str | os.PathLike[str]) -> list[str]:
    """Differences between our final sessions and THEANINE's session-5 prefixes; [] when they agree.

    Use it once the full MSC/CC test file is built, to confirm the episode-id convention and the targets.
    """
    by_id = {e.episode_id: e for e in episodes}
    problems = []
    with open(prefixes_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            rec = json.loads(line)
            ep = by_id.get(rec["dataID"])
            if ep is None:
                problems.append(f"{rec['dataID']}: not among the episodes")
                continue
            turns = ep.sessions[-1].turns
            if len(turns) != rec["fifth_session_length"]:
                n = rec["fifth_session_length"]
                problems.append(f"{ep.episode_id}: final session has {len(turns)} turns, THEANINE {n}")
                continue
            prefix = rec["fifth_session_dialogue_prefix"]
            speakers = rec["fifth_session_speakers_prefix"]
            texts = [t.text for t in turns[: len(prefix)]]
            if texts != prefix or [t.speaker for t in turns[: len(speakers)]] != speakers:
                problems.append(f"{ep.episode_id}: final-session text or speakers differ (prefixes line {lineno})")
            ours = [t.turn for t in final_session_targets(ep)]
            if ours != rec["target_turn_indices"]:
                problems.append(f"{ep.episode_id}: target turns {ours} != THEANINE's {rec['target_turn_indices']}")
    return problems


def load_eval_episodes(
    dataset: str,
    *,
    data_dir: str | os.PathLike[str],
    builder: str | None = None,
    selection: str = "seeded",
    seed: int = EVAL_SEED,
    n: int = NUM_EVAL_EPISODES,
    ids_dir: str | os.PathLike[str] | None = None,
) -> list[Episode]:
    """The protocol's evaluation episodes of a built dataset: "seeded" (n with ``seed``) or "theanine" (its 50).

    ``builder`` overrides the TFDS builder/config (e.g. "msc_episodes/cc_style", "gapchat_episodes/sample");
    GapChat always pools its 4- and 5-session test splits.
    """
    if dataset not in PROTOCOL_SOURCES:
        raise ValueError(f"dataset must be one of {sorted(PROTOCOL_SOURCES)}, got {dataset!r}")
    name, splits = PROTOCOL_SOURCES[dataset]
    parts = [read_episodes(builder or name, split, data_dir=data_dir) for split in splits]
    episodes = gapchat_eval_pool(*parts) if dataset == "gapchat" else parts[0]
    if selection == "theanine":
        return theanine_selection(dataset, episodes, ids_dir)
    if selection != "seeded":
        raise ValueError(f"selection must be 'seeded' or 'theanine', got {selection!r}")
    return select_eval_episodes(episodes, n, seed)
