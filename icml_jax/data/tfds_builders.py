"""TFDS builders for MSC, Conversation Chronicles, GapChat and LoCoMo, writing ArrayRecord files, without TensorFlow.

Each example is one Episode stored as its exact JSON (``Episode.to_json``) plus a few flat columns for
browsing; reading back gives the internal schema exactly (``episode_from_record``). The raw files come
from a ``manual_dir`` the user fills (see each builder's ``MANUAL_DOWNLOAD_INSTRUCTIONS``).

TF-free path: building with ``builder.download_and_prepare(download_config=DownloadConfig(manual_dir=...))``
and reading with ``tfds.data_source`` / ``builder.as_data_source()`` need no TensorFlow when
``file_format='array_record'`` (the default here). ``tfds.load``/``as_dataset`` (tf.data) and the ``tfds``
command line (tfds 4.9.10 imports TensorFlow at start-up) do need it; use ``python -m
icml_jax.data.build_cli`` instead of ``tfds build``.

Builder names (register on import of this module): ``msc_episodes`` (configs ``parlai``, ``cc_style``,
``theanine_sample``), ``cc_episodes`` (``test``, ``full``), ``gapchat_episodes`` (``protocol``, ``full``,
``sample``), ``locomo_episodes`` (``locomo7``, ``full``; each Episode carries its questions in
``meta["qa"]``, see ``icml_jax.data.sources.locomo``).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from icml_jax.data.report import MissingManualDirError, ParseReport, UnknownDatasetError
from icml_jax.data.schema import Episode
from icml_jax.data.sources import cc, gapchat, locomo, msc

FILE_FORMAT = "array_record"

ParseFn = Callable[..., Iterator[Episode]]


@dataclasses.dataclass(eq=False)
class EpisodeConfig(tfds.core.BuilderConfig):
    """A builder config: which raw file (relative to ``manual_dir``) feeds which split, in which layout."""

    split_files: tuple[tuple[str, str], ...] = ()
    layout: str = ""


def _parse_fn(layout: str, relpath: str) -> ParseFn:
    """The parser for a layout, with the relative path bound in (for messages and GapChat ids)."""
    if layout == "parlai":
        return lambda p, **kw: msc.parse_msc_parlai(p, relpath=relpath, **kw)
    if layout == "msc_cc_style":
        return lambda p, **kw: msc.parse_msc_cc_style(p, relpath=relpath, **kw)
    if layout == "cc":
        return lambda p, **kw: cc.parse_cc(p, relpath=relpath, **kw)
    if layout == "gapchat":
        prefix = gapchat.default_id_prefix(relpath)
        return lambda p, **kw: gapchat.parse_gapchat(p, relpath=relpath, id_prefix=prefix, **kw)
    if layout == "locomo":
        return lambda p, **kw: locomo.parse_locomo(p, relpath=relpath, **kw)
    raise ValueError(f"unknown layout {layout!r}")


def episode_features(episode: Episode) -> dict[str, Any]:
    """The TFDS example of one Episode: its exact JSON plus flat columns for browsing."""
    return {
        "episode_id": episode.episode_id,
        "dataset": episode.dataset,
        "num_sessions": len(episode.sessions),
        "num_turns": episode.num_turns,
        "episode": episode.to_json(),
    }


def episode_from_record(record: Any) -> Episode:
    """An Episode from what a TFDS data source returns (dict with JSON bytes), JSON bytes/str, or an Episode."""
    if isinstance(record, Episode):
        return record
    if isinstance(record, Mapping):
        record = record["episode"]
    if isinstance(record, np.ndarray):
        record = record.item()
    return Episode.from_json(record)


class _EpisodeBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared machinery: manual-dir files per split -> Episodes -> ArrayRecord, with a counted report."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Episodes as exact JSON of icml_jax.data.schema v1."}
    HOMEPAGE = ""
    CITATION = ""
    DESCRIPTION = ""

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        """This module's file; TFDS's own lookup imports ``importlib_resources``, which it does not declare."""
        return epath.Path(inspect.getfile(cls))

    def __init__(self, *, skip_malformed: bool = False, **kwargs: Any):
        """``skip_malformed``: skip and count malformed records instead of raising (counts in ``reports``)."""
        kwargs.setdefault("file_format", FILE_FORMAT)
        self.skip_malformed = skip_malformed
        self.reports: dict[str, ParseReport] = {}
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        """Features: the episode JSON and flat columns; per-split parse reports go into the metadata."""
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.DESCRIPTION,
            features=tfds.features.FeaturesDict(
                {
                    "episode_id": tfds.features.Text(),
                    "dataset": tfds.features.Text(),
                    "num_sessions": np.int32,
                    "num_turns": np.int32,
                    "episode": tfds.features.Text(),
                }
            ),
            homepage=self.HOMEPAGE,
            citation=self.CITATION,
            metadata=tfds.core.MetadataDict(),
        )

    def _manual_dir(self, dl_manager: tfds.download.DownloadManager) -> Path:
        """The manual dir; an empty or missing one is reported per file below rather than by TFDS's assert."""
        try:
            return Path(dl_manager.manual_dir)
        except AssertionError:
            return Path(getattr(dl_manager, "_manual_dir", None) or "<manual_dir>")

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        """Checks every raw file first (a missing one says what to get), then one generator per split."""
        manual = self._manual_dir(dl_manager)
        layout = self.builder_config.layout
        parsed = {}
        for split, rel in self.builder_config.split_files:
            self.reports[split] = report = ParseReport()
            # Calling a parser checks its file exists (MissingSourceFileError) before anything is written.
            path = manual / rel
            parsed[split] = (_parse_fn(layout, rel)(path, skip_malformed=self.skip_malformed, report=report), path)
        return {
            split: self._generate_examples(split=split, episodes=episodes, path=str(path))
            for split, (episodes, path) in parsed.items()
        }

    def _generate_examples(
        self, split: str, episodes: Iterator[Episode], path: str
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yields (episode_id, features); a duplicate id is a malformed record. Stores the split's report."""
        report = self.reports[split]
        seen: set[str] = set()
        for ep in episodes:
            if ep.episode_id in seen:
                report.episodes -= 1
                report.malformed(path, f"episode {ep.episode_id}", "duplicate episode id", skip=self.skip_malformed)
                continue
            seen.add(ep.episode_id)
            yield ep.episode_id, episode_features(ep)
        logging.info("%s/%s: %s", self.name, split, report.summary())
        self.info.metadata[f"report_{split}"] = report.to_dict()


class MscEpisodes(_EpisodeBuilder):
    """Multi-Session Chat episodes (ParlAI release or THEANINE's CC-style conversion)."""

    DESCRIPTION = "Multi-Session Chat (Xu et al. 2022) as icml_jax Episodes."
    HOMEPAGE = "https://parl.ai/projects/msc/"
    BUILDER_CONFIGS = [
        EpisodeConfig(
            name="parlai",
            description="ParlAI msc_v0.1: manual_dir is the unpacked msc/ folder; 5-session valid and test.",
            split_files=(
                ("validation", "msc_dialogue/session_5/valid.txt"),
                ("test", "msc_dialogue/session_5/test.txt"),
            ),
            layout="parlai",
        ),
        EpisodeConfig(
            name="cc_style",
            description="THEANINE's CC-style conversion of the MSC test split, saved as manual_dir/test.json.",
            split_files=(("test", "test.json"),),
            layout="msc_cc_style",
        ),
        EpisodeConfig(
            name="theanine_sample",
            description="THEANINE's one-episode sample, manual_dir/theanine_sample_dialogue.json.",
            split_files=(("test", "theanine_sample_dialogue.json"),),
            layout="msc_cc_style",
        ),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"""
    Config `parlai`: download {msc.PARLAI_URL}, unpack it, and pass the unpacked `msc/` folder as manual_dir
    (it must contain msc_dialogue/session_5/valid.txt and msc_dialogue/session_5/test.txt).
    Config `cc_style`: put THEANINE's CC-style MSC test file at manual_dir/test.json.
    Config `theanine_sample`: manual_dir holds theanine_sample_dialogue.json (shared/data/msc has it).
    """


class CcEpisodes(_EpisodeBuilder):
    """Conversation Chronicles episodes from the Hugging Face JSON Lines files."""

    DESCRIPTION = "Conversation Chronicles (Jang et al. 2023) as icml_jax Episodes."
    HOMEPAGE = "https://huggingface.co/datasets/jihyoung/ConversationChronicles"
    BUILDER_CONFIGS = [
        EpisodeConfig(
            name="test",
            description="The test split only (manual_dir/test.jsonl), all the evaluation protocol needs.",
            split_files=(("test", "test.jsonl"),),
            layout="cc",
        ),
        EpisodeConfig(
            name="full",
            description="train.jsonl, valid.jsonl and test.jsonl from manual_dir.",
            split_files=(("train", "train.jsonl"), ("validation", "valid.jsonl"), ("test", "test.jsonl")),
            layout="cc",
        ),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"""
    Download test.jsonl (config `test`) or train.jsonl, valid.jsonl and test.jsonl (config `full`) from
    {cc.HF_URL} and put them directly in manual_dir.
    """


class GapchatEpisodes(_EpisodeBuilder):
    """GapChat episodes from the MindTheTime JSON lists, header glitches and empty sessions dropped and counted."""

    DESCRIPTION = "GapChat (Zhang et al. 2023) as icml_jax Episodes."
    HOMEPAGE = "https://github.com/QZx7/MindTheTime"
    BUILDER_CONFIGS = [
        EpisodeConfig(
            name="protocol",
            description="The 4- and 5-session test files the evaluation protocol pools.",
            split_files=(("test_4", "test/4_session.json"), ("test_5", "test/5_session.json")),
            layout="gapchat",
        ),
        EpisodeConfig(
            name="full",
            description="All nine files: {train,eval,test}/{3,4,5}_session.json (eval -> validation_N).",
            split_files=tuple(
                (f"{split}_{n}", f"{folder}/{n}_session.json")
                for split, folder in (("train", "train"), ("validation", "eval"), ("test", "test"))
                for n in (3, 4, 5)
            ),
            layout="gapchat",
        ),
        EpisodeConfig(
            name="sample",
            description="The samples in shared/data/gapchat: test/4_session.first20.json and test/5_session.json.",
            split_files=(("test_4", "test/4_session.first20.json"), ("test_5", "test/5_session.json")),
            layout="gapchat",
        ),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"""
    Copy the folders of {gapchat.GITHUB_URL} into manual_dir, keeping the layout
    manual_dir/{{train,eval,test}}/{{3,4,5}}_session.json (config `protocol` needs only test/4_session.json
    and test/5_session.json).
    """


class LocomoEpisodes(_EpisodeBuilder):
    """LoCoMo conversations, one Episode each, with their questions in ``meta["qa"]`` (``locomo.questions``)."""

    DESCRIPTION = "LoCoMo (Maharana et al. 2024) as icml_jax Episodes, QA items in meta['qa']."
    HOMEPAGE = "https://github.com/snap-research/locomo"
    BUILDER_CONFIGS = [
        EpisodeConfig(
            name="locomo7",
            description="The 7 of 10 conversations in shared/data/locomo: manual_dir/locomo7.json.",
            split_files=(("test", "locomo7.json"),),
            layout="locomo",
        ),
        EpisodeConfig(
            name="full",
            description="The whole release, read unchanged: manual_dir/locomo10.json.",
            split_files=(("test", "locomo10.json"),),
            layout="locomo",
        ),
    ]
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"""
    Config `full`: put data/locomo10.json of {locomo.GITHUB_URL} directly in manual_dir.
    Config `locomo7`: manual_dir holds locomo7.json (shared/data/locomo has it).
    """


BUILDERS: dict[str, type[_EpisodeBuilder]] = {
    "msc": MscEpisodes,
    "cc": CcEpisodes,
    "gapchat": GapchatEpisodes,
    "locomo": LocomoEpisodes,
}


def build(
    name: str,
    *,
    manual_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    skip_malformed: bool = False,
) -> _EpisodeBuilder:
    """Builds ``name`` ("gapchat_episodes/sample", ...) from ``manual_dir`` into ``data_dir``; returns the builder.

    The builder's ``reports`` holds each split's ParseReport (also saved in dataset_info.json metadata). A name
    no builder provides (UnknownDatasetError) or a ``manual_dir`` that is not a folder (MissingManualDirError)
    fails before anything is written; so does a missing raw file (MissingSourceFileError).
    """
    cls = builder_class(name)
    if not os.path.isdir(manual_dir):
        raise MissingManualDirError(os.fspath(manual_dir), dataset=name, instructions=cls.MANUAL_DOWNLOAD_INSTRUCTIONS)
    builder = tfds.builder(name, data_dir=os.fspath(data_dir), file_format=FILE_FORMAT, skip_malformed=skip_malformed)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=os.fspath(manual_dir)))
    return builder


def dataset_names() -> list[str]:
    """Every "builder/config" name these builders provide, e.g. "gapchat_episodes/protocol"."""
    return [f"{cls.name}/{c.name}" for cls in BUILDERS.values() for c in cls.BUILDER_CONFIGS]


def builder_class(name: str) -> type[_EpisodeBuilder]:
    """The builder class of "builder[/config][:version]"; UnknownDatasetError lists the valid names otherwise."""
    builder, _, config = name.partition(":")[0].partition("/")
    for cls in BUILDERS.values():
        if cls.name == builder and (not config or config in {c.name for c in cls.BUILDER_CONFIGS}):
            return cls
    raise UnknownDatasetError(f"unknown dataset {name!r}; choose one of {', '.join(dataset_names())}")


def data_source(name: str, split: str, *, data_dir: str | os.PathLike[str]) -> Any:
    """The TF-free random-access source of a built split (items: dicts with the episode JSON)."""
    return tfds.data_source(name, split=split, data_dir=os.fspath(data_dir))


def read_episodes(name: str, split: str, *, data_dir: str | os.PathLike[str]) -> list[Episode]:
    """All Episodes of a built split, in the stored order."""
    src = data_source(name, split, data_dir=data_dir)
    return [episode_from_record(src[i]) for i in range(len(src))]


__all__ = [
    "BUILDERS",
    "CcEpisodes",
    "EpisodeConfig",
    "GapchatEpisodes",
    "LocomoEpisodes",
    "MscEpisodes",
    "build",
    "builder_class",
    "data_source",
    "dataset_names",
    "episode_features",
    "episode_from_record",
    "read_episodes",
]
