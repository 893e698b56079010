"""Seeds of the synthesis: the seed session storylines are written backwards from, or the lasting
constraints/preferences a seed session is to be written around.

The paper's seed session is a new user's first real interaction, so on a real dataset the seeds are the first
sessions of the episodes the online stage plays (`seeds_from_episodes`; never a final session: that one holds
the evaluation targets). The persona world draws constraints from its vocabulary instead (`draw_seeds`), and
a JSONL file can give either (`read_seeds_file`).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from collections.abc import Iterable

from icml_jax.data.schema import Episode, SchemaError, Session, Turn
from icml_jax.synthesis.config import SynthesisConfig


@dataclasses.dataclass(frozen=True)
class SeedSpec:
    """One seed: its id, the facts ("kind: value") its session relies on, and the session when already written."""

    seed_id: str
    facts: tuple[str, ...]
    session: Session | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (for the manifest)."""
        d: dict[str, Any] = {"seed_id": self.seed_id, "facts": list(self.facts)}
        if self.session is not None:
            d["session"] = self.session.to_dict()
        return d


def stable_hash(text: str) -> int:
    """A process-independent 32-bit hash (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode("utf-8"))


def draw_seeds(config: SynthesisConfig) -> list[SeedSpec]:
    """`num_seeds` seeds whose facts are drawn from the world's vocabulary; seed i depends only on (seed, i)."""
    world = config.world
    seeds = []
    for i in range(config.num_seeds):
        rng = np.random.default_rng([config.seed, i, 7])
        kinds = [str(k) for k in rng.choice(np.array(world.fact_kinds), size=config.facts_per_seed, replace=False)]
        facts = tuple(f"{k}: {world.values(k)[int(rng.integers(len(world.values(k))))]}" for k in kinds)
        seeds.append(SeedSpec(f"seed-{config.seed}-{i}", facts))
    return seeds


def read_seeds_file(path: str | Path) -> list[SeedSpec]:
    """Seeds from a JSONL file; a bad line raises naming the file and line number."""
    seeds, seen = [], set()
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"seeds file {path} does not exist")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                d = json.loads(line)
                if not isinstance(d, dict) or not isinstance(d.get("seed_id"), str):
                    raise ValueError("needs a string 'seed_id'")
                facts = d.get("facts", [])
                if not isinstance(facts, list) or not all(isinstance(x, str) for x in facts):
                    raise ValueError("'facts' must be a list of strings")
                unknown = set(d) - {"seed_id", "facts", "session"}
                if unknown:
                    raise ValueError(f"unknown keys {sorted(unknown)}")
                session = Session.from_dict(d["session"]) if d.get("session") is not None else None
            except (json.JSONDecodeError, ValueError, SchemaError) as e:
                raise ValueError(f"{where}: bad seed record: {e}") from e
            if d["seed_id"] in seen:
                raise ValueError(f"{where}: duplicate seed_id {d['seed_id']!r}")
            seen.add(d["seed_id"])
            seeds.append(SeedSpec(d["seed_id"], tuple(facts), session))
    if not seeds:
        raise ValueError(f"seeds file {path} holds no seeds")
    return seeds


def seeds_from_episodes(episodes: Iterable[Episode], num_seeds: int, *, user_speaker: str,
                        assistant_speaker: str) -> list[SeedSpec]:
    """Seeds from the first real session of up to `num_seeds` distinct episodes (in the order given).

    An episode with a single session is skipped: its only session is the final one, whose turns are the
    evaluation targets and must never reach a synthesis prompt. Speakers become the writers' two roles: the
    session's first speaker is the user, everyone else the assistant. Seed ids are "data:<episode_id>"; the
    seeds carry no constraint list (the prompts tell the writer to use what the session relies on).
    """
    if num_seeds < 1:
        raise ValueError(f"seeds_from_episodes: num_seeds must be >= 1, got {num_seeds}")
    seeds: list[SeedSpec] = []
    seen: set[str] = set()
    for episode in episodes:
        if len(seeds) == num_seeds:
            break
        if episode.episode_id in seen or len(episode.sessions) < 2:
            continue
        seen.add(episode.episode_id)
        first = episode.sessions[0]
        if not first.turns:
            continue
        opener = first.turns[0].speaker
        turns = tuple(Turn(user_speaker if t.speaker == opener else assistant_speaker, t.text) for t in first.turns)
        seeds.append(SeedSpec(f"data:{episode.episode_id}", (), Session(turns)))
    if not seeds:
        raise ValueError("seeds_from_episodes: no episode with at least two sessions (a first session that is not "
                         "the final, evaluated one) to seed the synthesis from")
    return seeds


def make_seeds(config: SynthesisConfig) -> list[SeedSpec]:
    """The seeds of a run: from `config.seeds_file` when set (first `num_seeds`), else drawn."""
    if config.seeds_file:
        return read_seeds_file(config.seeds_file)[: config.num_seeds]
    return draw_seeds(config)


def split_seeds(seeds: list[SeedSpec], heldout_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train ids, held-out ids): a seeded permutation; at least one held-out seed when the fraction is > 0."""
    ids = [s.seed_id for s in seeds]
    if heldout_fraction <= 0 or len(ids) < 2:
        return ids, []
    n_held = min(len(ids) - 1, max(1, int(round(heldout_fraction * len(ids)))))
    order = np.random.default_rng([seed, 11]).permutation(len(ids))
    held = {ids[int(i)] for i in order[:n_held]}
    return [i for i in ids if i not in held], [i for i in ids if i in held]
