"""The offline persona world: seeded multi-session episodes of one simulated user, with ground-truth labels.

Each episode plants facts of several kinds (diet, health, pets, family, job, plans, dislikes) in early
sessions, mixes in chit-chat noise (weather, passing moods, deadlines), later asks things that need a
specific earlier fact, and sometimes updates a fact (the new value overwrites the old; later queries need
the new one). Optionally (``restatements``) the user says an already-known fact again, in the words of a first
statement: saving it again would store a duplicate. Labels are complete: every user turn has y_p (facts and updates are worth saving, nothing
else), y_t (a query needs the turn that last stated its fact before the query's session; other turns need
none) and, for queries, ``gold_facts`` ("kind: value") a good reply must use, with the overwritten values
in ``meta["stale_facts"]``. Assistant turns are reference replies (y_p False, y_t ()).

Episode ``i`` depends only on (config, i): ``np.random.default_rng([seed, i])``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from icml_jax.data.schema import Episode, Session, Turn, TurnRef

DATASET = "persona_world"
FACT_KINDS = ("diet", "health", "pet", "family", "job", "plan", "dislike")
NOISE_KINDS = ("weather", "mood", "deadline")


@dataclasses.dataclass(frozen=True)
class KindTemplates:
    """How a fact kind is said: values, statements, updates ({old}/{new}), (query, gold reply with {v}) pairs."""

    values: tuple[str, ...]
    statements: tuple[str, ...]
    updates: tuple[str, ...]
    queries: tuple[tuple[str, str], ...]


TEMPLATES: dict[str, KindTemplates] = {
    "diet": KindTemplates(
        values=("vegetarian", "vegan", "pescatarian", "gluten-free", "keto", "halal", "kosher"),
        statements=("I've been eating {v} for a while now.", "Just so you know, I only eat {v} food."),
        updates=("Diet news: I switched from {old} to {new}.", "I'm not eating {old} anymore, I'm {new} now."),
        queries=(
            ("Can you suggest something for dinner tonight?", "Since you eat {v}, how about a {v} stir-fry?"),
            ("Any snack ideas for my long train ride?", "Keeping it {v}: a {v} wrap would travel well."),
        ),
    ),
    "health": KindTemplates(
        values=(
            "a peanut allergy",
            "type 2 diabetes",
            "a bad knee",
            "high blood pressure",
            "a shellfish allergy",
            "asthma",
            "lactose intolerance",
        ),
        statements=("My doctor confirmed I have {v}.", "I should mention I live with {v}."),
        updates=("Health update: it turns out it's not {old} after all, it's {new}.",),
        queries=(
            (
                "Anything I should keep in mind for the company dinner on Friday?",
                "With {v}, check the menu and tell the organisers ahead.",
            ),
            ("What exercise could I start this week?", "Given {v}, start gently and ask your doctor."),
        ),
    ),
    "pet": KindTemplates(
        values=(
            "a dog named Max",
            "a cat named Luna",
            "a parrot named Kiwi",
            "two rabbits",
            "a golden retriever named Biscuit",
            "an old tabby cat named Tom",
        ),
        statements=("I have {v} at home.", "I share my place with {v}."),
        updates=("We rehomed {old}; now it's {new} at home.",),
        queries=(
            (
                "I'm away for three days next week, what should I sort out at home?",
                "Arrange for someone to look after {v} while you're away.",
            ),
            ("Our flat is getting messy, any tips?", "With {v} around, a lint roller helps."),
        ),
    ),
    "family": KindTemplates(
        values=(
            "married with two young kids",
            "a single dad of a teenage girl",
            "living with my elderly mother",
            "newly married, no kids yet",
            "sharing a flat with two roommates",
        ),
        statements=("A bit about me: I'm {v}.", "At home, I'm {v}."),
        updates=("Big change at home: I'm {new} now, not {old} anymore.",),
        queries=(
            (
                "We're planning the weekend, any ideas that suit my household?",
                "As someone {v}, a picnic could work for everyone.",
            ),
            ("Any advice for a calmer morning routine?", "Being {v}, prepare the night before."),
        ),
    ),
    "job": KindTemplates(
        values=(
            "a nurse",
            "a software engineer",
            "a high school teacher",
            "a chef",
            "an accountant",
            "a bus driver",
            "a graphic designer",
        ),
        statements=("I work as {v}.", "By day I'm {v}."),
        updates=("I changed careers: I'm {new} now, no longer {old}.",),
        queries=(
            ("How should I plan my week around work?", "As {v}, block your busiest days first."),
            ("Any tips to unwind after a long workday?", "Working as {v} is tiring; plan a real break."),
        ),
    ),
    "plan": KindTemplates(
        values=(
            "a trip to Japan in May",
            "running a marathon in October",
            "moving to Berlin next spring",
            "a kitchen renovation this summer",
            "learning to sail this year",
        ),
        statements=("I'm planning {v}.", "Big goal of mine: {v}."),
        updates=("Change of plans: no more {old}, I'm going for {new} instead.",),
        queries=(
            ("What should I be preparing for these days?", "Keep preparing for {v}: make a checklist."),
            ("Can you help me set goals for this month?", "Set this month's goals around {v}."),
        ),
    ),
    "dislike": KindTemplates(
        values=("loud music", "cilantro", "crowded places", "horror movies", "spicy food", "early mornings"),
        statements=("I really can't stand {v}.", "Honestly, {v} is the worst for me."),
        updates=("Funny, I've made peace with {old}, but now I can't stand {new}.",),
        queries=(
            (
                "Any idea for something fun to do on Saturday?",
                "Something away from {v}, maybe a quiet museum visit?",
            ),
            ("What should we do for my birthday?", "A party without {v}, of course."),
        ),
    ),
}

NOISE: dict[str, tuple[str, ...]] = {
    "weather": (
        "It's pouring rain here today.",
        "So sunny outside this morning!",
        "The wind is crazy today.",
        "It's freezing, I can barely feel my fingers.",
        "Such a muggy afternoon.",
    ),
    "mood": (
        "I'm a bit tired today.",
        "Feeling oddly cheerful this morning.",
        "Kind of grumpy, didn't sleep well.",
        "I'm in a great mood right now.",
    ),
    "deadline": (
        "I have a report due in an hour, so I'm rushing.",
        "Got to send an email before noon.",
        "My library books are due tomorrow.",
        "I need to finish these slides by 5pm.",
    ),
}
NOISE_REPLIES = ("Oh, I see.", "Hope the day goes well!", "Good luck with that!", "Thanks for sharing.")
FACT_REPLIES = ("Good to know, I'll keep that in mind.", "Thanks for telling me.", "Noted!")
GAPS = (("2 hours", 7200.0), ("1 day", 86400.0), ("3 days", 259200.0), ("1 week", 604800.0), ("2 weeks", 1209600.0))


@dataclasses.dataclass(frozen=True)
class PersonaWorldConfig:
    """Knobs of the persona world (sizes, noise ratio, vocabulary); defaults make ~5-session episodes.

    Attributes:
      seed: base seed; episode i uses ``default_rng([seed, i])``.
      num_sessions: sessions per episode (>= 2).
      facts_per_episode: distinct fact kinds planted per episode (capped by ``len(fact_kinds)``).
      num_updates: how many planted facts get overwritten in a later session (when there is room).
      queries_per_session: queries per session from the second on (the final one asks about updated facts first).
      noise_ratio: share of user turns that are chit-chat noise, in [0, 1).
      min_user_turns: each session is padded with noise to at least this many user turns (if noise_ratio > 0).
      fact_kinds: which fact kinds may appear.
      values_per_kind: vocabulary size: use only the first N values of each kind (0 = all).
      vocabulary: per-kind value lists replacing the built-in ones.
      noise_vocabulary: per-noise-kind utterance lists replacing the built-in ones.
      restatements: facts said again, with their current value and a statement template, in a later session
        (0 = none, the default). A restatement has y_p False (nothing new: saving it again stores a duplicate)
        and ``meta["kind"] == "restate"``; queries keep needing the first statement (or the update).
      assistant_turns: add a reference assistant reply after every user turn.
      user_speaker / assistant_speaker: speaker labels.
    """

    seed: int = 0
    num_sessions: int = 5
    facts_per_episode: int = 5
    num_updates: int = 2
    queries_per_session: int = 2
    noise_ratio: float = 0.5
    min_user_turns: int = 4
    fact_kinds: tuple[str, ...] = FACT_KINDS
    values_per_kind: int = 0
    vocabulary: Mapping[str, Sequence[str]] | None = None
    noise_vocabulary: Mapping[str, Sequence[str]] | None = None
    restatements: int = 0
    assistant_turns: bool = True
    user_speaker: str = "user"
    assistant_speaker: str = "assistant"

    def __post_init__(self) -> None:
        """Rejects knob values that cannot make a labelled episode."""
        if self.num_sessions < 2:
            raise ValueError(f"num_sessions must be >= 2 (facts before queries), got {self.num_sessions}")
        if not isinstance(self.restatements, int) or self.restatements < 0:
            raise ValueError(f"restatements must be an int >= 0, got {self.restatements!r}")
        if not 0.0 <= self.noise_ratio < 1.0:
            raise ValueError(f"noise_ratio must be in [0, 1), got {self.noise_ratio}")
        unknown = set(self.fact_kinds) - set(TEMPLATES)
        if unknown or not self.fact_kinds:
            raise ValueError(f"fact_kinds must be a non-empty subset of {FACT_KINDS}, got {self.fact_kinds}")
        for kind in self.fact_kinds:
            if len(self.values(kind)) < 2:
                raise ValueError(f"fact kind {kind!r} needs at least 2 values (updates change the value)")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | ml_collections.ConfigDict) -> PersonaWorldConfig:
        """From an ml_collections ConfigDict (or any mapping) with a subset of the fields."""
        d = cfg.to_dict() if isinstance(cfg, ml_collections.ConfigDict) else dict(cfg)
        if "fact_kinds" in d:
            d["fact_kinds"] = tuple(d["fact_kinds"])
        return cls(**d)

    def values(self, kind: str) -> tuple[str, ...]:
        """The value vocabulary of a kind after overrides and the size cap."""
        vals = tuple((self.vocabulary or {}).get(kind, TEMPLATES[kind].values))
        return vals[: self.values_per_kind] if self.values_per_kind > 0 else vals

    def noise(self, kind: str) -> tuple[str, ...]:
        """The utterances of a noise kind after overrides."""
        return tuple((self.noise_vocabulary or {}).get(kind, NOISE[kind]))


def default_config() -> ml_collections.ConfigDict:
    """The persona world's knobs as an ml_collections ConfigDict (for configs/*.py)."""
    d = dataclasses.asdict(PersonaWorldConfig())
    d["fact_kinds"] = list(d["fact_kinds"])
    d["vocabulary"] = ml_collections.config_dict.placeholder(dict)
    d["noise_vocabulary"] = ml_collections.config_dict.placeholder(dict)
    return ml_collections.ConfigDict(d)


@dataclasses.dataclass
class _Item:
    """A planned user turn before it gets its place in the session."""

    kind: str  # "fact" | "update" | "query" | "noise" | "restate"
    fact_kind: str = ""
    value: str = ""
    old: str = ""


def _fact(kind: str, value: str) -> str:
    """Canonical fact string, as used in gold_facts and personas."""
    return f"{kind}: {value}"


def _pick(rng: np.random.Generator, seq: Sequence[str]) -> str:
    """One element of seq."""
    return seq[int(rng.integers(len(seq)))]


def generate_episode(config: PersonaWorldConfig, index: int) -> Episode:
    """Episode ``index`` of the world defined by ``config`` (deterministic in (config, index))."""
    rng = np.random.default_rng([config.seed, index])
    S = config.num_sessions
    n_kinds = min(config.facts_per_episode, len(config.fact_kinds))
    kinds = [str(k) for k in rng.choice(np.array(config.fact_kinds), size=n_kinds, replace=False)]

    plan: list[list[_Item]] = [[] for _ in range(S)]
    planted: dict[str, int] = {}
    value: dict[str, str] = {}
    for k in kinds:
        planted[k] = int(rng.integers(0, S - 1))
        value[k] = _pick(rng, config.values(k))
        plan[planted[k]].append(_Item("fact", k, value[k]))

    updatable = [k for k in kinds if planted[k] <= S - 3]
    n_upd = min(config.num_updates, len(updatable))
    updated: dict[str, int] = {}
    new_value: dict[str, str] = {}
    for k in [updatable[int(i)] for i in rng.permutation(len(updatable))[:n_upd]]:
        updated[k] = int(rng.integers(planted[k] + 1, S - 1))
        new_value[k] = _pick(rng, [v for v in config.values(k) if v != value[k]])
        plan[updated[k]].append(_Item("update", k, new_value[k], old=value[k]))

    for s in range(1, S):
        candidates = [k for k in kinds if planted[k] < s and updated.get(k) != s]
        order = [candidates[int(i)] for i in rng.permutation(len(candidates))]
        if s == S - 1:  # the final session asks about overwritten facts first
            order = [k for k in order if k in updated] + [k for k in order if k not in updated]
        for k in order[: config.queries_per_session]:
            plan[s].append(_Item("query", k))

    if config.restatements:  # drawn only when asked for, so worlds without them keep their episodes
        slots = [(k, s) for k in kinds for s in range(planted[k] + 1, S) if updated.get(k) != s]
        for i in rng.permutation(len(slots))[: config.restatements]:
            k, s = slots[int(i)]
            current = new_value[k] if k in updated and updated[k] < s else value[k]
            plan[s].append(_Item("restate", k, current))

    sessions: list[Session] = []
    stated_at: dict[str, list[tuple[TurnRef, str]]] = {k: [] for k in kinds}
    fact_rows: list[dict[str, Any]] = []
    for s in range(S):
        items = plan[s]
        n_signal = len(items)
        r = config.noise_ratio
        n_noise = int(round(n_signal * r / (1.0 - r)))
        if r > 0:
            n_noise = max(n_noise, config.min_user_turns - n_signal)
        for _ in range(n_noise):
            items.append(_Item("noise", _pick(rng, NOISE_KINDS)))
        items = [items[int(i)] for i in rng.permutation(len(items))]
        turns: list[Turn] = []
        for item in items:
            ref = TurnRef(s, len(turns))
            user, reply = _render(config, rng, item, ref, stated_at, fact_rows)
            turns.append(user)
            if config.assistant_turns:
                turns.append(reply)
        if s == 0:
            gap_text, gap_s = None, None
        else:
            gap_text, gap_s = GAPS[int(rng.integers(len(GAPS)))]
        sessions.append(Session(tuple(turns), gap_s, gap_text))

    final = {k: new_value.get(k, value[k]) for k in kinds}
    return Episode(
        dataset=DATASET,
        episode_id=f"pw-{config.seed}-{index}",
        sessions=tuple(sessions),
        personas={config.user_speaker: tuple(_fact(k, final[k]) for k in kinds)},
        meta={"seed": config.seed, "index": index, "facts": fact_rows},
    )


def _render(
    config: PersonaWorldConfig,
    rng: np.random.Generator,
    item: _Item,
    ref: TurnRef,
    stated_at: dict[str, list[tuple[TurnRef, str]]],
    fact_rows: list[dict[str, Any]],
) -> tuple[Turn, Turn]:
    """The user turn of a planned item (with labels) and its reference assistant reply."""
    u, a = config.user_speaker, config.assistant_speaker
    if item.kind == "noise":
        text = _pick(rng, config.noise(item.fact_kind))
        user = Turn(u, text, y_p=False, y_t=(), meta={"kind": "noise", "noise_kind": item.fact_kind})
        return user, Turn(a, _pick(rng, NOISE_REPLIES), y_p=False, y_t=(), meta={"kind": "reply"})
    tpl = TEMPLATES[item.fact_kind]
    if item.kind == "restate":  # an already-known fact, said again: nothing new to save
        fact = _fact(item.fact_kind, item.value)
        user = Turn(u, _pick(rng, tpl.statements).format(v=item.value), y_p=False, y_t=(),
                    meta={"kind": "restate", "fact_kind": item.fact_kind, "fact": fact})
        return user, Turn(a, _pick(rng, FACT_REPLIES), y_p=False, y_t=(), meta={"kind": "reply"})
    if item.kind in ("fact", "update"):
        if item.kind == "fact":
            text = _pick(rng, tpl.statements).format(v=item.value)
            supersedes = None
        else:
            text = _pick(rng, tpl.updates).format(old=item.old, new=item.value)
            supersedes = _fact(item.fact_kind, item.old)
            for row in fact_rows:
                if row["fact"] == supersedes and row["superseded_by"] is None:
                    row["superseded_by"] = _fact(item.fact_kind, item.value)
        fact = _fact(item.fact_kind, item.value)
        stated_at[item.fact_kind].append((ref, fact))
        fact_rows.append(
            {
                "fact": fact,
                "kind": item.fact_kind,
                "value": item.value,
                "session": ref.session,
                "turn": ref.turn,
                "supersedes": supersedes,
                "superseded_by": None,
            }
        )
        meta = {"kind": item.kind, "fact_kind": item.fact_kind, "fact": fact}
        if supersedes is not None:
            meta["supersedes"] = supersedes
        user = Turn(u, text, y_p=True, y_t=(), meta=meta)
        return user, Turn(a, _pick(rng, FACT_REPLIES), y_p=False, y_t=(), meta={"kind": "reply"})
    # A query needs the latest statement of its fact made before this session.
    before = [(r, f) for r, f in stated_at[item.fact_kind] if r.session < ref.session]
    need_ref, fact = before[-1]
    stale = [f for _, f in before[:-1] if f != fact]
    value = fact.split(": ", 1)[1]
    meta: dict[str, Any] = {"kind": "query", "fact_kind": item.fact_kind}
    if stale:
        meta["stale_facts"] = stale
    query, gold_reply = tpl.queries[int(rng.integers(len(tpl.queries)))]
    user = Turn(u, query, y_p=False, y_t=(need_ref,), gold_facts=(fact,), meta=meta)
    reply = Turn(a, gold_reply.format(v=value), y_p=False, y_t=(), meta={"kind": "reply", "uses": [fact]})
    return user, reply


def generate_episodes(config: PersonaWorldConfig, num_episodes: int, start_index: int = 0) -> list[Episode]:
    """Episodes ``start_index .. start_index + num_episodes - 1``."""
    return [generate_episode(config, i) for i in range(start_index, start_index + num_episodes)]


@dataclasses.dataclass(frozen=True)
class PersonaWorldSource:
    """A Grain random-access source of persona-world episodes, generated on demand (picklable)."""

    config: PersonaWorldConfig
    num_episodes: int
    start_index: int = 0

    def __len__(self) -> int:
        """Number of episodes."""
        return self.num_episodes

    def __getitem__(self, index: int) -> Episode:
        """Episode ``start_index + index``."""
        if not 0 <= index < self.num_episodes:
            raise IndexError(f"persona world index {index} out of range [0, {self.num_episodes})")
        return generate_episode(self.config, self.start_index + int(index))

    def __iter__(self) -> Iterator[Episode]:
        """All episodes in order."""
        return (self[i] for i in range(self.num_episodes))
