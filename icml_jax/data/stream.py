"""The episodes of an online run, from the run config: a resumable stream, the held-out set, whose turns count.

``online_stream(config)`` is what the online stage plays, one Episode at a time, for ``config.data.name``:

- ``persona_world``: ``generate_episode(world, i)`` for i = 0 .. ``config.data.train_episodes`` - 1 (the world
  from ``config.data.world``; with P JAX processes, process p plays i = p, p + P, ...); held-out: ``config.data.eval_episodes`` episodes from index ``EVAL_OFFSET`` on.
  The agent acts on the world's ``user_speaker`` turns.
- ``msc`` / ``cc`` / ``gapchat`` / ``locomo``: the built TFDS split ``config.data.split`` of
  ``config.data.tfds_name`` under ``config.data.data_dir`` through the Grain ``train_pipeline`` (shuffled with ``config.seed``, sharded over
  JAX processes with equal shards, reshuffled every epoch), cut at ``config.data.train_episodes`` episodes
  per process. A split smaller than that repeats: epoch after epoch, each a new permutation. The agent acts
  at every turn (``user_speaker`` None), as the evaluation protocol has it for online learning
  (shared/docs/datasets.md). Each episode is played without its final session (``history_sessions``): the final
  session is the evaluation's target, so no policy ever learns from a reply the evaluation scores (test-time
  adaptation; ``config.data.train_final_sessions`` True plays it too, and the evaluation then refuses a policy
  that trained on an evaluated episode's final session). ``config.data.max_session_turns`` cuts every session to
  its first N turns, here and in the evaluation alike (``clip_sessions``). Every episode is played without its
  labels (``locomo.without_labels``: LoCoMo's questions, answers, evidence and annotations never reach the
  learner). Held-out: none, see ``held_out_episodes``.

Each function takes the whole run config or its typed data block (``icml_jax.data.config.DataConfig``, what
``icml_jax.run.runspec.RunSpec.data`` holds), so a caller with a RunSpec passes the object it already checked.

``get_state()`` is a small JSON-safe dict taken between episodes; ``set_state`` on a fresh stream built from
the same config continues at the same episode. It checks the state belongs to this stream (kind, world,
TFDS name, split, seed, shards, split size, final sessions) and raises ValueError naming the field that differs.
``train_episodes`` may change between the two (a run extended or shortened) as long as the saved position
is not past the new end.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.data.config import DATASETS, PERSONA_WORLD, REAL_DATASETS, DataConfig, data_config
from icml_jax.data.persona_world import PersonaWorldConfig, generate_episode, generate_episodes
from icml_jax.data.pipeline import ShardSpec, tfds_source, train_pipeline
from icml_jax.data.schema import Episode
from icml_jax.data.sources.locomo import without_labels
from icml_jax.data.tfds_builders import BUILDERS

EVAL_OFFSET = 1_000_000  # held-out persona-world episodes are generated from this index on
BUILD_HINT = ("build it with `python -m icml_jax.data.build_cli --dataset=<tfds_name> --manual_dir=<raw files> "
              "--data_dir=<data_dir>` (docs/data.md)")


def _check_state(state: Mapping[str, Any], expected: Mapping[str, Any], where: str) -> None:
    """Raises ValueError naming every identity field of ``state`` that differs from ``expected``."""
    if not isinstance(state, Mapping):
        raise ValueError(f"{where}.set_state: expected a dict from get_state(), got {type(state).__name__}")
    if state.get("kind") != expected["kind"]:
        raise ValueError(f"{where}.set_state: the state is of a {state.get('kind')!r} stream, this stream is "
                         f"{expected['kind']!r} (config.data.name)")
    diffs = []
    for key, value in expected.items():
        got = state.get(key)
        if key == "kind" or _jsonable(got) == _jsonable(value):
            continue
        if isinstance(value, Mapping) and isinstance(got, Mapping):  # name the fields inside (world.seed, ...)
            diffs += [f"{key}.{k} differs" for k in sorted(set(value) | set(got)) if got.get(k) != value.get(k)]
        else:
            diffs.append(f"{key}: state {got!r} != this stream {value!r}")
    if diffs:
        raise ValueError(f"{where}.set_state: the state belongs to another configuration; " + "; ".join(diffs))


def _jsonable(value: Any) -> Any:
    """The value as it reads back from JSON (tuples become lists), for comparisons."""
    return json.loads(json.dumps(value))


def _position(state: Mapping[str, Any], key: str, total: int, where: str) -> int:
    """The saved position, checked against this stream's length."""
    pos = state.get(key)
    if not isinstance(pos, int) or isinstance(pos, bool) or pos < 0:
        raise ValueError(f"{where}.set_state: {key!r} must be a non-negative int, got {pos!r}")
    if pos > total:
        raise ValueError(f"{where}.set_state: the state is at episode {pos} but this stream yields only {total} "
                         f"(config.data.train_episodes)")
    return pos


class EpisodeStream(abc.ABC):
    """An iterator of Episodes that can be checkpointed between episodes.

    ``total``: how many episodes it yields in all (None = unknown). ``get_state()``: a small JSON-safe dict;
    ``set_state(state)`` on a fresh stream of the same config continues at the same episode.
    """

    total: int | None = None

    def __iter__(self) -> Iterator[Episode]:
        return self

    @abc.abstractmethod
    def __next__(self) -> Episode:
        """The next episode; StopIteration after ``total``."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """Where the stream is, as a JSON-safe dict."""

    @abc.abstractmethod
    def set_state(self, state: Mapping[str, Any]) -> None:
        """Moves to the position of ``get_state()`` output; ValueError naming what differs if it is not ours."""


def _digest(value: Any) -> str:
    """A short digest of a JSON-able value (the world's fields in a state, without their full text)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


class PersonaWorldStream(EpisodeStream):
    """Persona-world episodes ``0 .. total-1``, generated on demand; state ``{"kind", "next", "world", ...}``.

    Sharded over ``shard_count`` processes (default: the JAX processes), shard i plays episodes i, i + count,
    ... (``total`` a multiple of the count, so every process plays as many); ``next`` counts this shard's
    episodes and ``total`` is its share.
    """

    def __init__(self, world: PersonaWorldConfig, total: int, *, shard_index: int | None = None,
                 shard_count: int | None = None) -> None:
        import jax

        index = jax.process_index() if shard_index is None else int(shard_index)
        count = jax.process_count() if shard_count is None else int(shard_count)
        if count < 1 or not 0 <= index < count or int(total) % count:
            raise ValueError(f"config.data.train_episodes={total} cannot be shared equally by {count} processes "
                             f"(shard {index}): make it a multiple of {count}")
        self.world, self.total, self.next = world, int(total) // count, 0
        self._index, self._count = index, count
        # one digest per field, so a mismatch names the field without storing (possibly long) vocabularies
        self._identity = {"kind": PERSONA_WORLD,
                          "world": {k: _digest(v) for k, v in sorted(dataclasses.asdict(world).items())}}
        if count > 1:
            self._identity["shard"] = [index, count]

    def __next__(self) -> Episode:
        if self.next >= self.total:
            raise StopIteration
        episode = generate_episode(self.world, self._index + self.next * self._count)
        self.next += 1
        return episode

    def get_state(self) -> dict[str, Any]:
        return {**self._identity, "next": self.next, "total": self.total}

    def set_state(self, state: Mapping[str, Any]) -> None:
        where = type(self).__name__
        _check_state(state, self._identity, where)
        self.next = _position(state, "next", self.total, where)


class TfdsEpisodeStream(EpisodeStream):
    """A built TFDS split through the Grain ``train_pipeline``: ``total`` episodes of this process's shard.

    Shuffled with ``seed``, sharded over JAX processes (equal shards, remainder dropped), repeated forever and
    cut at ``total``: a split (shard) smaller than ``total`` is played epoch after epoch, each epoch in a new
    order. State: the Grain iterator's state, the count yielded, and what identifies the stream.
    """

    def __init__(self, kind: str, tfds_name: str, split: str, *, data_dir: str | os.PathLike[str], seed: int,
                 total: int, shard_index: int | None = None, shard_count: int | None = None,
                 final_sessions: bool = False, max_session_turns: int | None = None) -> None:
        source = tfds_source(tfds_name, split, data_dir=data_dir)
        spec = ShardSpec.resolve(shard_index, shard_count, drop_remainder=True)
        size = len(source)
        if size // spec.count == 0:
            raise ValueError(f"config.data.split={split!r} of {tfds_name} has {size} episode(s), fewer than the "
                             f"{spec.count} JAX processes that share it: every shard would be empty")
        self.total, self.yielded = int(total), 0
        self._identity = {"kind": kind, "tfds_name": tfds_name, "split": split, "seed": int(seed),
                          "shard": [spec.index, spec.count], "split_size": size,
                          "final_sessions": bool(final_sessions),  # a run cannot switch protocols mid-way
                          "max_session_turns": max_session_turns}
        self.final_sessions, self.max_session_turns = bool(final_sessions), max_session_turns
        self._dataset = train_pipeline(source, seed=int(seed), num_epochs=None, shard_index=spec.index,
                                       shard_count=spec.count)
        self._it = iter(self._dataset)

    @property
    def episodes_per_epoch(self) -> int:
        """Episodes of this process's shard in one pass over the split."""
        size, (_, count) = self._identity["split_size"], self._identity["shard"]
        return size // count

    def __next__(self) -> Episode:
        if self.yielded >= self.total:
            raise StopIteration
        episode = next(self._it)
        self.yielded += 1
        episode = clip_sessions(without_labels(episode), self.max_session_turns)
        return episode if self.final_sessions else history_sessions(episode)

    def get_state(self) -> dict[str, Any]:
        return {**self._identity, "yielded": self.yielded, "total": self.total,
                "grain": _jsonable(self._it.get_state())}

    def set_state(self, state: Mapping[str, Any]) -> None:
        where = type(self).__name__
        _check_state(state, self._identity, where)
        yielded = _position(state, "yielded", self.total, where)
        grain_state = state.get("grain")
        if not isinstance(grain_state, Mapping):
            raise ValueError(f"{where}.set_state: 'grain' must be the Grain iterator's state dict, got {grain_state!r}")
        self._it.set_state(dict(grain_state))
        self.yielded = yielded


def history_sessions(episode: Episode) -> Episode:
    """The episode without its final session (the evaluation's target): what an agent may learn from before
    that session is scored. An episode of one session has no history: an error naming it."""
    if len(episode.sessions) < 2:
        raise ValueError(f"episode {episode.episode_id!r} has {len(episode.sessions)} session(s): online learning "
                         "plays the sessions before the final one, so it needs at least 2")
    return dataclasses.replace(episode, sessions=tuple(episode.sessions[:-1]))


def clip_sessions(episode: Episode, max_turns: int | None) -> Episode:
    """The episode with every session cut to its first ``max_turns`` turns (None: unchanged): a smaller run on
    real data that keeps every session, so memory still has to bridge each gap. The same cut applies to the
    online stream and to the evaluation protocol (``config.data.max_session_turns``)."""
    if max_turns is None:
        return episode
    sessions = tuple(dataclasses.replace(s, turns=s.turns[:max_turns]) for s in episode.sessions)
    return dataclasses.replace(episode, sessions=sessions)


def online_stream(config: ml_collections.ConfigDict | DataConfig, seed: int | None = None) -> EpisodeStream:
    """The episodes the online stage plays (see the module docstring): ``config`` is the whole run config, or its
    typed data block with the run's ``seed`` (real data shuffles with it; default: ``config.seed``)."""
    data = data_config(config)
    if data.name == PERSONA_WORLD:
        return PersonaWorldStream(data.world, data.train_episodes)
    if seed is None:
        if isinstance(config, DataConfig):
            raise TypeError("online_stream: a DataConfig needs the run's seed (seed=config.seed)")
        seed = config.seed
    return TfdsEpisodeStream(data.name, data.tfds_name, data.split, data_dir=data.data_dir, seed=int(seed),
                             total=data.train_episodes, final_sessions=data.train_final_sessions,
                             max_session_turns=data.max_session_turns)


def held_out_episodes(config: ml_collections.ConfigDict | DataConfig) -> list[Episode]:
    """Labelled episodes for the before/after evaluation; [] when the dataset has none. ``config``: the whole run
    config or its DataConfig.

    Persona world: ``config.data.eval_episodes`` episodes from ``EVAL_OFFSET`` on (never played online).
    MSC / CC / GapChat / LoCoMo: []. The held-out evaluation reports label metrics (planner precision / recall,
    trigger recall from ``y_p`` / ``y_t``); the builders store no labels for real data (the sources have
    none), so those metrics would all be NaN. Real-data runs are judged by the online stage's own per-session
    and final-session numbers instead.
    """
    data = data_config(config)
    if data.name == PERSONA_WORLD:
        return generate_episodes(data.world, data.eval_episodes, start_index=EVAL_OFFSET)
    return []


def user_speaker(config: ml_collections.ConfigDict | DataConfig) -> str | None:
    """Whose turns the agent acts on: the persona world's user; None (every turn) for the real datasets.
    ``config``: the whole run config or its DataConfig."""
    data = data_config(config)
    return data.world.user_speaker if data.name == PERSONA_WORLD else None


def _split_names(split: str) -> list[str]:
    """The split names of a TFDS split string: "test_4+test_5" -> both, "test[:10]" -> "test"."""
    return [re.sub(r"\[.*\]$", "", part.strip()) for part in split.split("+")]


def check_data_config(config: ml_collections.ConfigDict | DataConfig, stages: Sequence[str]) -> None:
    """Checks ``config.data`` for the stages about to run; raises ValueError naming the field, before any work.
    ``config``: the whole run config or its DataConfig.

    Every value is checked as the DataConfig is built (a known name, ``train_episodes`` >= 1, ``eval_episodes``
    >= 0, the cut, the world). Only the online stage reads the episodes (synthesis and warm-up use their own
    blocks), so the built dataset is checked when "online" is among ``stages``: for real data ``tfds_name`` (a
    builder of that dataset), ``data_dir`` (an existing directory holding the built ``tfds_name``) and ``split``
    (built there, non-empty). Touches no JAX backend (safe before ``jax.distributed.initialize``).
    """
    data = data_config(config)
    if "online" in stages and data.name in REAL_DATASETS:
        _check_tfds(data)


def _check_tfds(data: DataConfig) -> None:
    """The built TFDS split of a real dataset exists (see ``check_data_config``)."""
    name, tfds_name, split, data_dir = data.name, data.tfds_name, data.split, data.data_dir
    builder_cls = BUILDERS[name]
    configs = [c.name for c in builder_cls.BUILDER_CONFIGS]
    family, _, variant = (tfds_name or "").partition("/")
    if not tfds_name or family != builder_cls.name or variant not in configs:
        choices = ", ".join(f"{builder_cls.name}/{c}" for c in configs)
        raise ValueError(f"config.data.tfds_name={tfds_name!r} is not a {name} builder; one of: {choices}")
    if not data_dir:
        raise ValueError(f"config.data.data_dir is not set: point it at the TFDS data_dir holding the built "
                         f"{tfds_name} (ArrayRecord); {BUILD_HINT}")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise ValueError(f"config.data.data_dir={data_dir!r} is not a directory; {BUILD_HINT}")
    version = str(builder_cls.VERSION)
    built = root / family / variant / version
    if not (built / "dataset_info.json").is_file():
        raise ValueError(f"config.data.data_dir={data_dir!r} holds no built {tfds_name} (no {built}/"
                         f"dataset_info.json; config.data.tfds_name={tfds_name!r}); {BUILD_HINT}")
    if not split:
        raise ValueError(f"config.data.split is not set: a split of {tfds_name}, e.g. "
                         f"{'+'.join(s for s, _ in _builder_config(builder_cls, variant).split_files)!r}")
    import tensorflow_datasets as tfds

    info = tfds.builder(tfds_name, data_dir=os.fspath(root)).info
    available = list(info.splits)
    missing = [s for s in _split_names(split) if s not in available]
    if missing:
        raise ValueError(f"config.data.split={split!r}: {missing} not built for {tfds_name} in {data_dir} "
                         f"(built: {available})")
    if sum(info.splits[s].num_examples for s in set(_split_names(split))) == 0:
        raise ValueError(f"config.data.split={split!r} of {tfds_name} in {data_dir} has no episodes")


def _builder_config(builder_cls: Any, variant: str) -> Any:
    return next(c for c in builder_cls.BUILDER_CONFIGS if c.name == variant)


__all__ = [
    "DATASETS",
    "EVAL_OFFSET",
    "EpisodeStream",
    "PersonaWorldStream",
    "TfdsEpisodeStream",
    "check_data_config",
    "held_out_episodes",
    "online_stream",
    "user_speaker",
]
