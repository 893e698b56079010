"""Knobs of Retrospective Session Synthesis (paper defaults: 3 storylines x 4 prequels, about 250 episodes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from icml_jax.configlib import known_fields
from icml_jax.data import persona_world
from icml_jax.data.persona_world import PersonaWorldConfig


SEED_SOURCES: tuple[str, ...] = ("auto", "data", "world")
DIRECTIONS: tuple[str, ...] = ("backward", "forward")


@dataclasses.dataclass(frozen=True)
class OfflineWorldConfig:
    """How the offline back end writes storylines from the persona world's templates (ignored by real models).

    Attributes:
      distractor_facts: other lasting facts per storyline, stated in prequels but not needed by the seed
        (forward: new facts the user brings up in later sessions as the story goes).
      update_prob: chance that a seed fact first had another value and changed in a later prequel (forward: that
        a seed fact stated in the opening session changes in a later one).
      prequel_query_prob: chance that a prequel (from the second on) asks something an earlier one answers
        (forward: that a session after the opening asks about an earlier fact; the only dependencies there).
    """

    distractor_facts: int = 2
    update_prob: float = 0.3
    prequel_query_prob: float = 0.5

    def __post_init__(self) -> None:
        """Rejects probabilities outside [0, 1] and negative counts, naming the field."""
        for name in ("update_prob", "prequel_query_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"OfflineWorldConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.distractor_facts < 0:
            raise ValueError(f"OfflineWorldConfig.distractor_facts must be >= 0, got {self.distractor_facts}")


@dataclasses.dataclass(frozen=True)
class SynthesisConfig:
    """What to synthesize and how hard to try.

    Attributes:
      seed: base seed (seed constraints, the held-out split, negative sampling).
      num_seeds: seed sessions; each gives `storylines_per_seed` episodes (84 x 3 = 252, the paper's ~250).
      storylines_per_seed / prequels_per_storyline: the paper's 3 and 4 (forward: 4 sessions after the opening).
      direction: how storylines are written (the paper's Table 12 compares the two). "backward" (default, the
        paper's method): the seed session first, then prequels newest first, each written knowing every later
        session, so they plant exactly the facts the later sessions depend on. "forward": an opening session
        (the seed session when the seed brings one, else written from the seed's constraints), then each next
        session in time order, written from the sessions so far only, so dependencies are incidental. Both are
        annotated forwards and give the same episodes / examples layout.
      facts_per_seed: lasting constraints/preferences a seed session depends on (drawn from the world's vocabulary).
      seed_source: where seed sessions come from. "data": the first session of the episodes the online stage
        plays (the paper's seed is the new user's first real interaction; `seeds.seeds_from_episodes`, never a
        final session); "world": constraints drawn from the persona world's vocabulary, the seed session
        written by the back end; "auto" (default): "data" on a real dataset (msc, cc, gapchat, locomo), "world"
        on the persona world. Resolved by the main job, which knows the dataset
        (`icml_jax.run.stages.synthesize.synthesis_seeds`).
      seeds_file: optional JSONL of seeds ({"seed_id", "facts": [...], "session": optional Session dict}) used
        instead of any other source; a given session skips the seed-writing request.
      turns_per_session: how many turns the writers are asked for; max_turns_per_session: longer answers are
        malformed.
      max_attempts: tries per request (first + re-asks) before the storyline is skipped and counted.
      max_failed_fraction: share of the synthesis's requests (storylines' and condensations') that may fail
        for good at the back end (after its own retries) before the stage fails; below it a failed request is
        counted (`failed_requests`) and its storyline skipped (a condensation keeps the turn text). Answers are
        kept in `<out_dir>/requests.sqlite`, so a rerun of a failed stage asks only what is missing.
      batch_size: requests per back-end call.
      temperature / max_output_tokens: for the writers (the annotator always uses temperature 0).
      save_threshold: y_p = (annotated information gain >= save_threshold).
      hard_negatives / soft_negatives: Trigger negatives per example: other turns of the positive's session /
        memories of storylines of other seeds.
      none_examples_per_episode: seed-session turns that need no memory, added as Trigger examples with target
        "none".
      condense_memories: turn the expert data's memories (Trigger candidates, expert saves) into notes with the
        online memory writer and back end, as the Trigger sees them online (`icml_jax.synthesis.memories`);
        False: raw turn texts.
      note_max_tokens: length cap of a condensed note (the online agent's `learner.note_max_tokens`).
      heldout_fraction: share of seeds (all their storylines) kept out of training for the warm-up's metrics.
      world: the persona world whose vocabulary and speaker labels are used (and whose templates the offline
        back end writes with).
      offline: how the offline back end composes storylines.
    """

    seed: int = 0
    num_seeds: int = 84
    storylines_per_seed: int = 3
    prequels_per_storyline: int = 4
    direction: str = "backward"
    facts_per_seed: int = 1
    seed_source: str = "auto"
    seeds_file: str | None = None
    turns_per_session: int = 8
    max_turns_per_session: int = 40
    max_attempts: int = 2
    max_failed_fraction: float = 0.1
    batch_size: int = 32
    temperature: float = 0.7
    max_output_tokens: int = 2048
    save_threshold: float = 0.5
    hard_negatives: int = 3
    soft_negatives: int = 3
    none_examples_per_episode: int = 1
    condense_memories: bool = True
    note_max_tokens: int = 128
    heldout_fraction: float = 0.2
    world: PersonaWorldConfig = dataclasses.field(default_factory=PersonaWorldConfig)
    offline: OfflineWorldConfig = dataclasses.field(default_factory=OfflineWorldConfig)

    def __post_init__(self) -> None:
        """Rejects settings that cannot produce a labelled storyline, naming the field."""
        for name in ("num_seeds", "storylines_per_seed", "prequels_per_storyline", "facts_per_seed",
                     "turns_per_session", "max_turns_per_session", "max_attempts", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SynthesisConfig.{name} must be a positive int, got {value!r}")
        for name in ("hard_negatives", "soft_negatives", "none_examples_per_episode"):
            if getattr(self, name) < 0:
                raise ValueError(f"SynthesisConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"SynthesisConfig.direction must be one of {DIRECTIONS}, got {self.direction!r}")
        if self.seed_source not in SEED_SOURCES:
            raise ValueError(f"SynthesisConfig.seed_source must be one of {SEED_SOURCES}, got {self.seed_source!r}")
        if not 0.0 <= self.max_failed_fraction <= 1.0:
            raise ValueError(f"SynthesisConfig.max_failed_fraction must be in [0, 1], got {self.max_failed_fraction}")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"SynthesisConfig.heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if not 0.0 < self.save_threshold <= 1.0:
            raise ValueError(f"SynthesisConfig.save_threshold must be in (0, 1], got {self.save_threshold}")
        if self.facts_per_seed > len(self.world.fact_kinds):
            raise ValueError(f"SynthesisConfig.facts_per_seed={self.facts_per_seed} exceeds the world's "
                             f"{len(self.world.fact_kinds)} fact kinds")

    @property
    def num_storylines(self) -> int:
        """Storylines (= episodes) requested."""
        return self.num_seeds * self.storylines_per_seed

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | ml_collections.ConfigDict | None = None,
                    **overrides: Any) -> SynthesisConfig:
        """From a ConfigDict / mapping (e.g. `config.synthesis`) plus overrides; unknown keys are an error."""
        d = known_fields(cls, cfg, **overrides)
        if isinstance(d.get("world"), (Mapping, ml_collections.ConfigDict)):
            d["world"] = PersonaWorldConfig.from_config(d["world"])
        if isinstance(d.get("offline"), (Mapping, ml_collections.ConfigDict)):
            d["offline"] = OfflineWorldConfig(**dict(d["offline"]))
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (for the manifest)."""
        d = dataclasses.asdict(self)
        d["world"]["fact_kinds"] = list(self.world.fact_kinds)
        return d


def default_config() -> ml_collections.ConfigDict:
    """The `synthesis` config block with the paper's defaults (for configs/*.py)."""
    d = dataclasses.asdict(SynthesisConfig())
    d.pop("world")
    cfg = ml_collections.ConfigDict(d)
    cfg.seeds_file = ml_collections.config_dict.placeholder(str)
    cfg.world = persona_world.default_config()
    return cfg
