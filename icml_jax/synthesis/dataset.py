"""The expert dataset on disk: ArrayRecord files of episodes and Trigger examples per split, plus a manifest.

Layout of a synthesis directory::

    manifest.json                     seeds, back end, model, config, counts, rejected outputs, file checksums
    episodes-train.array_record       one Episode JSON per record (Episode.to_json)
    episodes-heldout.array_record
    trigger-train.array_record        one TriggerExample JSON per record
    trigger-heldout.array_record
    requests.sqlite                   every back-end answer, stored as it arrives: a rerun asks only what is missing

Files are read with Grain's ArrayRecordDataSource (random access), so the warm-up streams them like any source.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grain
from array_record.python.array_record_module import ArrayRecordWriter

from icml_jax.data.schema import Episode
from icml_jax.synthesis.examples import TriggerExample

MANIFEST = "manifest.json"
REQUESTS_CACHE = "requests.sqlite"
SPLITS = ("train", "heldout")
FORMAT_VERSION = 1


def episodes_path(directory: str | os.PathLike[str], split: str) -> Path:
    """Where a split's episodes live."""
    return Path(directory) / f"episodes-{split}.array_record"


def trigger_path(directory: str | os.PathLike[str], split: str) -> Path:
    """Where a split's Trigger examples live."""
    return Path(directory) / f"trigger-{split}.array_record"


def write_records(path: Path, records: Sequence[str]) -> dict[str, Any]:
    """Writes UTF-8 records to an ArrayRecord file; returns {records, sha256} of the payload for the manifest."""
    digest = hashlib.sha256()
    writer = ArrayRecordWriter(os.fspath(path), "group_size:1")
    try:
        for r in records:
            data = r.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
            writer.write(data)
    finally:
        writer.close()
    return {"records": len(records), "sha256": digest.hexdigest()}


def record_source(path: str | os.PathLike[str]) -> grain.sources.ArrayRecordDataSource:
    """A Grain random-access source of the raw records of one file (raises naming a missing file)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"expert dataset file {path} does not exist (run the synthesis first)")
    return grain.sources.ArrayRecordDataSource([os.fspath(path)])


def read_episodes(directory: str | os.PathLike[str], split: str) -> list[Episode]:
    """All episodes of a split; a bad record raises naming the file and record index."""
    path = episodes_path(directory, split)
    src = record_source(path)
    out = []
    for i in range(len(src)):
        try:
            out.append(Episode.from_json(src[i]))
        except (ValueError, KeyError) as e:
            raise ValueError(f"{path}: record {i} is not a valid Episode: {e}") from e
    return out


def read_trigger_examples(directory: str | os.PathLike[str], split: str) -> list[TriggerExample]:
    """All Trigger examples of a split; a bad record raises naming the file and record index."""
    path = trigger_path(directory, split)
    src = record_source(path)
    out = []
    for i in range(len(src)):
        try:
            out.append(TriggerExample.from_json(src[i]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: record {i} is not a valid Trigger example: {e}") from e
    return out


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a synthesis directory."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {directory} is not a synthesis output directory")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {manifest.get('format_version')!r}, this code reads {FORMAT_VERSION}")
    return manifest


@dataclasses.dataclass(frozen=True)
class ExpertData:
    """The expert dataset in memory: labelled episodes and Trigger examples per split, and the manifest."""

    train_episodes: tuple[Episode, ...]
    train_trigger: tuple[TriggerExample, ...]
    heldout_episodes: tuple[Episode, ...] = ()
    heldout_trigger: tuple[TriggerExample, ...] = ()
    manifest: dict[str, Any] = dataclasses.field(default_factory=dict)
    user_speaker: str = "user"


def load_expert_data(directory: str | os.PathLike[str]) -> ExpertData:
    """Reads a synthesis directory written by `synthesize`."""
    manifest = read_manifest(directory)
    return ExpertData(
        train_episodes=tuple(read_episodes(directory, "train")),
        train_trigger=tuple(read_trigger_examples(directory, "train")),
        heldout_episodes=tuple(read_episodes(directory, "heldout")),
        heldout_trigger=tuple(read_trigger_examples(directory, "heldout")),
        manifest=manifest,
        user_speaker=manifest["config"]["world"]["user_speaker"],
    )
