"""Conversation Chronicles (CC, Jang et al. 2023) and CC-style files -> Episodes.

One JSON object per episode (JSON Lines in the Hugging Face release, a JSON list in THEANINE's MSC
conversion): ``dataID``, ``first_session_dialogue``/``first_session_speakers`` .. ``fifth_...``, and, in
CC itself, ``relationship``, ``time_interval`` (entry k = time between session k-1 and k, entry 0 "Start")
and ``summary`` (one per session).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from icml_jax.data import timegap
from icml_jax.data.report import ParseReport
from icml_jax.data.schema import Episode, Turn
from icml_jax.data.sources._common import (
    BadRecord,
    RawSession,
    assemble_sessions,
    iter_json_records,
    need,
    record_text,
    require_file,
    str_list,
)

DATASET = "cc"
HF_URL = "https://huggingface.co/datasets/jihyoung/ConversationChronicles (CC-BY-4.0)"
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
_KNOWN_KEYS = {"dataID", "relationship", "time_interval", "summary"} | {
    f"{o}_session_{part}" for o in ORDINALS for part in ("dialogue", "speakers")
}


def parse_cc(
    path: str | os.PathLike[str],
    *,
    skip_malformed: bool = False,
    report: ParseReport | None = None,
    relpath: str = "test.jsonl",
) -> Iterator[Episode]:
    """Streams Episodes from a Conversation Chronicles JSON Lines file of the Hugging Face release."""
    return parse_cc_style(
        path,
        dataset=DATASET,
        skip_malformed=skip_malformed,
        report=report,
        what=f"the Conversation Chronicles file {relpath} (Files and versions tab of the dataset page)",
        where_from=HF_URL,
    )


def parse_cc_style(
    path: str | os.PathLike[str],
    *,
    dataset: str,
    what: str,
    where_from: str,
    skip_malformed: bool = False,
    report: ParseReport | None = None,
) -> Iterator[Episode]:
    """Streams Episodes from any file of CC-style records (JSON Lines or one JSON list)."""
    report = report if report is not None else ParseReport()
    p = require_file(path, dataset=dataset.upper(), what=what, where_from=where_from)

    def gen() -> Iterator[Episode]:
        for index, location, rec in iter_json_records(p, report, skip_malformed=skip_malformed):
            try:
                source = {"source_file": os.path.basename(p), "record_index": index}
                ep = cc_record_to_episode(rec, dataset, report, source)
            except BadRecord as e:
                report.malformed(p, location, str(e), skip=skip_malformed)
                continue
            report.episodes += 1
            yield ep

    return gen()


def cc_record_to_episode(
    rec: Any, dataset: str, report: ParseReport, source: dict[str, Any] | None = None
) -> Episode:
    """Converts one CC-style record; raises BadRecord with the reason when it is malformed."""
    episode_id = need(rec, "dataID", str)
    raw: list[RawSession] = []
    for k, ordinal in enumerate(ORDINALS):
        dkey, skey = f"{ordinal}_session_dialogue", f"{ordinal}_session_speakers"
        if dkey not in rec and skey not in rec:
            later = [o for o in ORDINALS[k + 1 :] if f"{o}_session_dialogue" in rec]
            if later:
                raise BadRecord(f"has {later[0]}_session_dialogue but no {dkey}")
            break
        texts = str_list(need(rec, dkey, list), dkey)
        speakers = str_list(need(rec, skey, list), skey)
        if len(texts) != len(speakers):
            raise BadRecord(f"{dkey} has {len(texts)} utterances but {skey} has {len(speakers)} labels")
        raw.append(RawSession([Turn(speaker=s, text=t) for s, t in zip(speakers, texts)]))
    if not raw:
        raise BadRecord("no first_session_dialogue")

    intervals = rec.get("time_interval")
    if intervals is not None:
        intervals = str_list(intervals, "time_interval")
        if len(intervals) != len(raw):
            raise BadRecord(f"time_interval has {len(intervals)} entries for {len(raw)} sessions")
        for k, (rs, text) in enumerate(zip(raw, intervals)):
            rs.gap_text = text
            rs.gap_seconds = timegap.gap_seconds(text)
            if k > 0 and rs.gap_seconds is None:
                report.unparsed_gaps += 1
    summaries = rec.get("summary")
    if summaries is not None:
        summaries = str_list(summaries, "summary")
        if len(summaries) != len(raw):
            raise BadRecord(f"summary has {len(summaries)} entries for {len(raw)} sessions")
        for rs, text in zip(raw, summaries):
            rs.summary = text
    relationship = rec.get("relationship")
    if relationship is not None and not isinstance(relationship, str):
        raise BadRecord("key 'relationship' must be a string")
    if relationship is not None:
        record_text(relationship, "key 'relationship'")

    meta: dict[str, Any] = dict(source or {})
    extra = {k: v for k, v in rec.items() if k not in _KNOWN_KEYS}
    if extra:
        meta["source_extra"] = extra
    return Episode(dataset, episode_id, assemble_sessions(raw, report), relationship=relationship, meta=meta)
