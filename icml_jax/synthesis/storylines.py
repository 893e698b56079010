"""Backward storyline generation and forward dependency annotation, batched over storylines, with re-asks.

Backward: every seed gets a seed session (written by the back end unless the seed brings one); every storyline
then grows one prequel per round, newest first, each request showing the seed and all prequels written so far,
so a prequel must stay consistent with everything later. Forward annotation: each storyline is walked oldest
session first and every user turn is labelled with its information gain (y_p = gain >= threshold) and the
earlier turns it needs (y_t).

`config.direction == "forward"` swaps the writing for the generation the paper compares with (Table 12): every
seed gets an opening session (the seed's own session, else written from its constraints), then every storyline
grows one sequel per round, oldest first, each request showing only the sessions so far. Annotation, episodes
and request counts are the same in both directions.

One round = one batched pass over all live storylines. An unusable answer is re-asked (told why) up to
`max_attempts` tries; then the storyline (or, for a seed / opening session, all its storylines) is dropped and
recorded as a Rejection. A request that fails for good at the back end (BackendError: its retries exhausted) is
not re-asked: it is counted (`RequestStats.failed`) and its storyline dropped the same way, with
`backend_failure=True`; whether too many failed is the caller's call (`synthesize`, `max_failed_fraction`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from absl import logging
from tqdm.auto import tqdm

from icml_jax.data import timegap
from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.synthesis import prompts
from icml_jax.llm.generation import generate_each
from icml_jax.llm.types import BackendError, LLMBackend, LLMRequest, LLMResponse
from icml_jax.synthesis.config import SynthesisConfig
from icml_jax.synthesis.offline_world import StorylineKey
from icml_jax.synthesis.parsing import MalformedOutput, TurnLabel, WrittenSession, parse_labels, parse_session
from icml_jax.synthesis.seeds import SeedSpec

T = TypeVar("T")
DATASET = "synthesis"
RAW_CHARS = 400  # how much of a rejected answer the manifest keeps


@dataclasses.dataclass
class RequestStats:
    """What asking cost: distinct requests, back-end calls (batches), tries, re-asks, malformed answers, and
    requests that failed for good at the back end (with the first such error, for the stage's message)."""

    requests: int = 0
    calls: int = 0
    attempts: int = 0
    reasks: int = 0
    malformed: int = 0
    failed: int = 0
    first_failure: str | None = None

    def to_dict(self) -> dict[str, int]:
        """The counts as a plain dict (for the manifest)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "first_failure"}


class SynthesisFailedError(RuntimeError):
    """Too many of the synthesis's requests failed for good at the back end (`max_failed_fraction`)."""


def check_failures(asked: Sequence[RequestStats], max_fraction: float, cache_path: str) -> None:
    """Raises SynthesisFailedError (one line: how many of how many, the first error, the setting to change)
    when the requests in `asked` that failed for good are more than `max_fraction` of them."""
    failed, total = sum(s.failed for s in asked), sum(s.requests for s in asked)
    if not total or failed / total <= max_fraction:
        return
    first = next((s.first_failure for s in asked if s.first_failure), "?")
    raise SynthesisFailedError(
        f"synthesis: {failed} of {total} back-end requests failed after all retries ({failed / total:.1%} > "
        f"synthesis.max_failed_fraction={max_fraction:g}); first error: {' '.join(first.split())}. The "
        f"{total - failed} answered ones are kept in {cache_path}: rerun to ask only what is missing, or raise "
        "synthesis.max_failed_fraction to skip the failed storylines")


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A storyline (or a seed's storylines) dropped after its last try: where, why and what the model said."""

    seed_id: str
    storyline: int | None  # None: the seed / opening session failed, so every storyline of the seed is dropped
    # "seed" / "opening", "prequel_<k>" (k-th written backwards), "sequel_<s>" / "annotate_<s>" (s: time order)
    stage: str
    attempts: int
    errors: tuple[str, ...]
    raw: str
    backend_failure: bool = False  # the last try failed at the back end (retries exhausted), not in parsing

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (for the manifest)."""
        return {**dataclasses.asdict(self), "errors": list(self.errors)}


@dataclasses.dataclass
class Outcome(Generic[T]):
    """One request's fate: the parsed value (None if every try failed), tries made, errors, last raw answer, and
    whether the back end failed it for good."""

    value: T | None = None
    attempts: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    raw: str = ""
    backend_failure: bool = False


def ask(
    backend: LLMBackend,
    requests: Sequence[LLMRequest],
    parse: Callable[[int, LLMResponse], T],
    *,
    max_attempts: int,
    batch_size: int,
    stats: RequestStats,
    progress: tqdm | None = None,
) -> list[Outcome[T]]:
    """Sends `requests` in batches, parses each answer with `parse(i, response)`, re-asks the malformed ones;
    a request the back end fails for good is counted and left without a value (not re-asked). `progress`
    advances by each batch of first tries (re-asks are not new work)."""
    outcomes: list[Outcome[T]] = [Outcome() for _ in requests]
    pending = list(range(len(requests)))
    stats.requests += len(requests)
    for attempt in range(1, max_attempts + 1):
        if not pending:
            break
        batch = [requests[i] if attempt == 1 else
                 prompts.synthesis_retry_request(requests[i], outcomes[i].errors[-1], attempt) for i in pending]
        responses: list[LLMResponse | BackendError] = []
        for start in range(0, len(batch), batch_size):
            chunk = batch[start:start + batch_size]
            responses.extend(generate_each(backend, chunk))  # checks one outcome per request
            stats.calls += 1
            if attempt == 1:
                _advance(progress, len(chunk))
        stats.attempts += len(batch)
        stats.reasks += len(batch) if attempt > 1 else 0
        still = []
        for i, response in zip(pending, responses, strict=True):
            out = outcomes[i]
            if isinstance(response, BackendError):
                out.attempts, out.raw, out.backend_failure = attempt, "", True
                out.errors.append(f"back-end failure: {response}")
                stats.failed += 1
                stats.first_failure = stats.first_failure or str(response)
                continue
            out.attempts, out.raw = attempt, response.text or ""
            try:
                out.value = parse(i, response)
            except MalformedOutput as e:
                stats.malformed += 1
                out.errors.append(str(e))
                still.append(i)
        pending = still
    return outcomes


@dataclasses.dataclass
class Storyline:
    """A storyline being built: its seed, index, sessions (oldest first; the seed session last when backward,
    first when forward) and, later, their labels."""

    seed: SeedSpec
    index: int
    sessions: list[WrittenSession]
    labels: list[dict[int, TurnLabel]] = dataclasses.field(default_factory=list)

    def key(self, config: SynthesisConfig) -> StorylineKey:
        """The hints the offline back end reads for this storyline."""
        return StorylineKey(config.world, config.offline, self.seed.seed_id, self.seed.facts, self.index,
                            config.prequels_per_storyline, config.direction)

    def dialogues(self, upto: int | None = None) -> list[tuple[str | None, list[tuple[str, str]]]]:
        """(gap since the previous session, [(speaker, text)]) of sessions 0..upto-1 (all by default)."""
        out = []
        for i, w in enumerate(self.sessions[:upto]):
            gap = self.sessions[i - 1].gap_to_next if i else None
            out.append((gap, [(t.speaker, t.text) for t in w.session.turns]))
        return out


def _advance(progress: tqdm | None, n: int) -> None:
    """Counts `n` requests as done on the progress bar, if any."""
    if progress is not None:
        progress.update(n)


def _rejection(seed_id: str, storyline: int | None, stage: str, outcome: Outcome[Any]) -> Rejection:
    logging.warning("synthesis: dropping seed %s storyline %s at %s after %d tries: %s", seed_id, storyline, stage,
                    outcome.attempts, outcome.errors[-1] if outcome.errors else "?")
    return Rejection(seed_id, storyline, stage, outcome.attempts, tuple(outcome.errors), outcome.raw[:RAW_CHARS],
                     outcome.backend_failure)


def write_seed_sessions(backend: LLMBackend, seeds: Sequence[SeedSpec], config: SynthesisConfig,
                        stats: RequestStats, rejections: list[Rejection], *,
                        progress: tqdm | None = None) -> list[SeedSpec]:
    """Seeds with their session: given ones as they are, the rest written by the back end; failures rejected.

    Backward the written session is the seed session the prequels lead up to; forward it is the opening one.
    """
    todo = [s for s in seeds if s.session is None]
    world = config.world
    forward = config.direction == "forward"
    build = prompts.synthesis_opening_request if forward else prompts.synthesis_seed_request
    requests = [
        build(s.facts, turns=config.turns_per_session, temperature=config.temperature,
              max_output_tokens=config.max_output_tokens,
              metadata=StorylineKey(world, config.offline, s.seed_id, s.facts, 0, config.prequels_per_storyline,
                                    config.direction).to_metadata())
        for s in todo
    ]
    parse = lambda i, r: parse_session(r, user_speaker=world.user_speaker,  # noqa: E731
                                       assistant_speaker=world.assistant_speaker,
                                       max_turns=config.max_turns_per_session, want_gap=False)
    outcomes = ask(backend, requests, parse, max_attempts=config.max_attempts, batch_size=config.batch_size,
                   stats=stats, progress=progress)
    written = {}
    for seed, out in zip(todo, outcomes, strict=True):
        if out.value is None:
            rejections.append(_rejection(seed.seed_id, None, "opening" if forward else "seed", out))
            _advance(progress, config.storylines_per_seed * (2 * config.prequels_per_storyline + 1))
        else:
            written[seed.seed_id] = dataclasses.replace(seed, session=out.value.session)
    return [s if s.session is not None else written[s.seed_id] for s in seeds
            if s.session is not None or s.seed_id in written]


def _grow(backend: LLMBackend, storylines: list[Storyline], config: SynthesisConfig, stats: RequestStats,
          rejections: list[Rejection], progress: tqdm | None, *, request, attach, stage, later: int,
          gap_key: str) -> list[Storyline]:
    """`prequels_per_storyline` rounds, each asking one new session per live storyline: `request(st, k)` builds
    round k's request (k = 1..P), `attach(st, parsed)` adds the answer; a storyline whose answer stays malformed is
    dropped and counted under `stage(k)`, and the progress bar skips its `later - k` remaining requests."""
    world, P = config.world, config.prequels_per_storyline
    parse = lambda i, r: parse_session(r, user_speaker=world.user_speaker,  # noqa: E731
                                       assistant_speaker=world.assistant_speaker,
                                       max_turns=config.max_turns_per_session, want_gap=True, gap_key=gap_key)
    alive = storylines
    for k in range(1, P + 1):
        outcomes = ask(backend, [request(st, k) for st in alive], parse, max_attempts=config.max_attempts,
                       batch_size=config.batch_size, stats=stats, progress=progress)
        survivors = []
        for st, out in zip(alive, outcomes, strict=True):
            if out.value is None:
                rejections.append(_rejection(st.seed.seed_id, st.index, stage(k), out))
                _advance(progress, later - k)  # its later sessions and all its annotations
            else:
                attach(st, out.value)
                survivors.append(st)
        alive = survivors
    return alive


def write_prequels(backend: LLMBackend, storylines: list[Storyline], config: SynthesisConfig,
                   stats: RequestStats, rejections: list[Rejection], *,
                   progress: tqdm | None = None) -> list[Storyline]:
    """Grows every storyline backwards by `prequels_per_storyline` sessions; returns the ones that made it."""
    P = config.prequels_per_storyline

    def request(st: Storyline, k: int):
        return prompts.synthesis_prequel_request(
            st.seed.facts, st.dialogues(), number=k, total=P, turns=config.turns_per_session,
            temperature=config.temperature, max_output_tokens=config.max_output_tokens,
            metadata=st.key(config).to_metadata())

    return _grow(backend, storylines, config, stats, rejections, progress, request=request,
                 attach=lambda st, parsed: st.sessions.insert(0, parsed), stage=lambda k: f"prequel_{k - 1}",
                 later=2 * P + 1, gap_key="gap_to_next")


def write_sequels(backend: LLMBackend, storylines: list[Storyline], config: SynthesisConfig,
                  stats: RequestStats, rejections: list[Rejection], *,
                  progress: tqdm | None = None) -> list[Storyline]:
    """Grows every storyline forwards by `prequels_per_storyline` sessions, each written from the sessions so far
    only (oldest first); returns the ones that made it."""
    P = config.prequels_per_storyline

    def request(st: Storyline, k: int):
        return prompts.synthesis_sequel_request(
            st.seed.facts, st.dialogues(), total=P + 1, turns=config.turns_per_session,
            temperature=config.temperature, max_output_tokens=config.max_output_tokens,
            metadata=st.key(config).to_metadata())

    def attach(st: Storyline, parsed) -> None:
        # the time since the previous session is that session's time until the next one
        st.sessions[-1] = dataclasses.replace(st.sessions[-1], gap_to_next=parsed.gap_to_next)
        st.sessions.append(WrittenSession(parsed.session, None))

    return _grow(backend, storylines, config, stats, rejections, progress, request=request, attach=attach,
                 stage=lambda k: f"sequel_{k}", later=2 * P + 1, gap_key="gap_since_previous")


def _parse_labels(sessions: list[list[Session]], current: int, user_speaker: str, i: int,
                  response: LLMResponse) -> dict[int, TurnLabel]:
    """parse_labels for request i of an annotation round."""
    return parse_labels(response, sessions[i], current, user_speaker=user_speaker)


def annotate(backend: LLMBackend, storylines: list[Storyline], config: SynthesisConfig,
             stats: RequestStats, rejections: list[Rejection], *,
             progress: tqdm | None = None) -> list[Storyline]:
    """Labels every user turn of every session, oldest session first; returns the storylines fully labelled."""
    alive = storylines
    num_sessions = config.prequels_per_storyline + 1
    for s in range(num_sessions):
        requests = [
            prompts.synthesis_annotate_request(st.dialogues(), s, max_output_tokens=config.max_output_tokens,
                                               metadata=st.key(config).to_metadata())
            for st in alive
        ]
        parse = functools.partial(_parse_labels, [[w.session for w in st.sessions] for st in alive], s,
                                  config.world.user_speaker)
        outcomes = ask(backend, requests, parse, max_attempts=config.max_attempts, batch_size=config.batch_size,
                       stats=stats, progress=progress)
        survivors = []
        for st, out in zip(alive, outcomes, strict=True):
            if out.value is None:
                rejections.append(_rejection(st.seed.seed_id, st.index, f"annotate_{s}", out))
                _advance(progress, num_sessions - 1 - s)  # its later annotations
            else:
                st.labels.append(out.value)
                survivors.append(st)
        alive = survivors
    return alive


def to_episode(st: Storyline, config: SynthesisConfig, backend_name: str) -> Episode:
    """The labelled Episode of a finished storyline (assistant turns: y_p False, y_t ()); session roles: "seed"
    and "prequel" (backward, seed last) or "seed" and "sequel" (forward, seed first)."""
    sessions = []
    forward = config.direction == "forward"
    seed_at = 0 if forward else len(st.sessions) - 1
    other = "sequel" if forward else "prequel"
    for si, (written, labels) in enumerate(zip(st.sessions, st.labels, strict=True)):
        turns = []
        for ti, turn in enumerate(written.session.turns):
            label = labels.get(ti)
            if label is None:
                turns.append(Turn(turn.speaker, turn.text, y_p=False, y_t=()))
            else:
                turns.append(Turn(turn.speaker, turn.text, y_p=label.gain >= config.save_threshold,
                                  y_t=label.needs, meta={"gain": label.gain}))
        gap = st.sessions[si - 1].gap_to_next if si else None
        sessions.append(Session(tuple(turns), timegap.gap_seconds(gap), gap,
                                meta={"role": "seed" if si == seed_at else other}))
    return Episode(
        dataset=DATASET,
        episode_id=f"{st.seed.seed_id}/story{st.index}",
        sessions=tuple(sessions),
        personas={config.world.user_speaker: st.seed.facts},
        meta={"seed_id": st.seed.seed_id, "storyline": st.index, "facts": list(st.seed.facts),
              "seed_session": seed_at, "backend": backend_name},
    ).validate()


@dataclasses.dataclass(frozen=True)
class SynthesisResult:
    """Episodes in seed / storyline order, what was dropped, and what asking cost."""

    episodes: tuple[Episode, ...]
    rejections: tuple[Rejection, ...]
    stats: RequestStats


def synthesize_episodes(config: SynthesisConfig, backend: LLMBackend, seeds: Sequence[SeedSpec]) -> SynthesisResult:
    """Seeds -> seed sessions -> storylines written backwards -> annotated forwards -> labelled Episodes
    (`config.direction == "forward"`: seeds -> opening sessions -> storylines written forwards -> the same).

    A progress bar (stderr) counts the first tries of every request the storylines need (seed / opening
    sessions, prequels / sequels, annotations: the same numbers in both directions); a dropped storyline's
    remaining requests count as done, so its total and ETA hold.
    """
    stats, rejections = RequestStats(), []
    per_storyline = 2 * config.prequels_per_storyline + 1
    total = sum(s.session is None for s in seeds) + len(seeds) * config.storylines_per_seed * per_storyline
    with tqdm(total=total, desc="synthesis storylines", unit="request", leave=False) as progress:
        ready = write_seed_sessions(backend, seeds, config, stats, rejections, progress=progress)
        storylines = [Storyline(seed, j, [WrittenSession(seed.session, None)])
                      for seed in ready for j in range(config.storylines_per_seed)]
        grow = write_sequels if config.direction == "forward" else write_prequels
        storylines = grow(backend, storylines, config, stats, rejections, progress=progress)
        storylines = annotate(backend, storylines, config, stats, rejections, progress=progress)
    episodes = tuple(to_episode(st, config, backend.name) for st in storylines)
    logging.info("synthesis (%s): %d episodes from %d seeds, %d rejections, %s", config.direction, len(episodes),
                 len(seeds), len(rejections), stats)
    return SynthesisResult(episodes, tuple(rejections), stats)
