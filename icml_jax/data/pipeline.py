"""Grain pipelines that stream Episodes, sharded over JAX processes, with checkpointable iterators.

Order of operations: source -> (shuffle with a seed) -> shard -> repeat -> decode -> IterDataset. Every
process shuffles with the same seed and takes a strided slice, so shards are disjoint and together cover
the data in every epoch; each epoch is reshuffled deterministically. ``iter(ds).get_state()`` is a small
JSON-safe dict; ``set_state`` on a fresh iterator of the same pipeline continues at the same episode. For
Orbax, wrap the iterator in ``grain.checkpoint.CheckpointSave`` / ``CheckpointRestore``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any, Protocol

import grain

from icml_jax.data.schema import Episode
from icml_jax.data.tfds_builders import data_source, episode_from_record


class RandomAccessSource(Protocol):
    """What Grain reads: ``len`` and integer indexing (TFDS data sources, lists, PersonaWorldSource)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """Which shard this process reads; defaults to ``jax.process_index()`` of ``jax.process_count()``."""

    index: int
    count: int
    drop_remainder: bool = False

    @classmethod
    def resolve(cls, index: int | None = None, count: int | None = None, drop_remainder: bool = False) -> ShardSpec:
        """Explicit shard, or the JAX process's one when ``index``/``count`` are None."""
        if index is None or count is None:
            opts = grain.sharding.ShardByJaxProcess(drop_remainder=drop_remainder)
            index = opts.shard_index if index is None else index
            count = opts.shard_count if count is None else count
        opts = grain.sharding.ShardOptions(shard_index=index, shard_count=count, drop_remainder=drop_remainder)
        return cls(opts.shard_index, opts.shard_count, opts.drop_remainder)


def episode_map_dataset(
    source: RandomAccessSource | grain.MapDataset,
    *,
    shuffle: bool = False,
    seed: int = 0,
    num_epochs: int | None = 1,
    shard_index: int | None = None,
    shard_count: int | None = None,
    drop_remainder: bool = False,
) -> grain.MapDataset:
    """A MapDataset of Episodes from any random-access source of Episodes or TFDS records.

    ``num_epochs=None`` repeats forever. ``drop_remainder`` trims the data to a multiple of the shard count
    so every process sees the same number of episodes (needed when processes step in lockstep).
    """
    spec = ShardSpec.resolve(shard_index, shard_count, drop_remainder)
    ds = source if isinstance(source, grain.MapDataset) else grain.MapDataset.source(source)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    if spec.drop_remainder:
        ds = ds[: len(ds) - len(ds) % spec.count]
    ds = ds[spec.index :: spec.count]
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    return ds.map(episode_from_record)


def episode_pipeline(
    source: RandomAccessSource | grain.MapDataset,
    *,
    shuffle: bool = False,
    seed: int = 0,
    num_epochs: int | None = 1,
    shard_index: int | None = None,
    shard_count: int | None = None,
    drop_remainder: bool = False,
    num_threads: int = 2,
    prefetch_buffer_size: int = 8,
) -> grain.IterDataset:
    """An IterDataset of Episodes (see ``episode_map_dataset``), prefetched by ``num_threads`` threads."""
    ds = episode_map_dataset(
        source,
        shuffle=shuffle,
        seed=seed,
        num_epochs=num_epochs,
        shard_index=shard_index,
        shard_count=shard_count,
        drop_remainder=drop_remainder,
    )
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch_buffer_size))


def train_pipeline(
    source: RandomAccessSource | grain.MapDataset, *, seed: int, num_epochs: int | None = None, **kw: Any
) -> grain.IterDataset:
    """Shuffled, repeated (forever by default), sharded, equal-sized shards: for training."""
    kw.setdefault("drop_remainder", True)
    return episode_pipeline(source, shuffle=True, seed=seed, num_epochs=num_epochs, **kw)


def eval_pipeline(source: RandomAccessSource | grain.MapDataset, **kw: Any) -> grain.IterDataset:
    """One pass in stored order, sharded, no episode dropped: for evaluation."""
    return episode_pipeline(source, shuffle=False, num_epochs=1, **kw)


def tfds_source(name: str, split: str, *, data_dir: str | os.PathLike[str]) -> RandomAccessSource:
    """The TF-free ArrayRecord source of a built TFDS split (records decode to Episodes in the pipeline)."""
    return data_source(name, split, data_dir=data_dir)


def episodes_source(episodes: Sequence[Episode]) -> grain.MapDataset:
    """An in-memory list of Episodes as a Grain source."""
    return grain.MapDataset.source(list(episodes))
