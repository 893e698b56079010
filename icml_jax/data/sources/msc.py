"""Multi-Session Chat (MSC, Xu et al. 2022): ParlAI release and THEANINE's CC-style conversion -> Episodes.

ParlAI layout: ``msc/msc_dialogue/session_5/{valid,test}.txt``, JSON Lines, one whole episode per line:
the current session in ``dialog``, earlier sessions oldest first in ``previous_dialogs`` with the gap after
each in ``time_num``/``time_unit``. Episode ids are ``msc-episode-<record index>`` (0-based over the
file's non-blank lines), which is how THEANINE's ids appear to be formed (*unconfirmed*: check against
``theanine_eval_session5_prefixes.jsonl`` once the full test file is at hand).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from icml_jax.data import timegap
from icml_jax.data.report import ParseReport
from icml_jax.data.schema import Episode, Turn
from icml_jax.data.sources import cc
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

DATASET = "msc"
PARLAI_URL = "http://parl.ai/downloads/msc/msc_v0.1.tar.gz (ParlAI task 'msc'; research use only)"
PERSONA_SPEAKERS = ("Speaker 1", "Speaker 2")


def parlai_file_hint(relpath: str) -> str:
    """What to get for a missing ParlAI file."""
    return f"the MSC release archive msc_v0.1.tar.gz; unpack it and keep its file msc/{relpath}"


def parse_msc_parlai(
    path: str | os.PathLike[str],
    *,
    id_prefix: str = "msc-episode-",
    skip_malformed: bool = False,
    report: ParseReport | None = None,
    relpath: str = "msc_dialogue/session_5/test.txt",
) -> Iterator[Episode]:
    """Streams Episodes from a ParlAI ``msc_dialogue/session_N/*.txt`` JSON Lines file."""
    report = report if report is not None else ParseReport()
    p = require_file(path, dataset="MSC", what=parlai_file_hint(relpath), where_from=PARLAI_URL)

    def gen() -> Iterator[Episode]:
        for index, location, rec in iter_json_records(p, report, skip_malformed=skip_malformed):
            try:
                source = {"source_file": os.path.basename(p), "record_index": index}
                ep = parlai_record_to_episode(rec, f"{id_prefix}{index}", report, source)
            except BadRecord as e:
                report.malformed(p, location, str(e), skip=skip_malformed)
                continue
            report.episodes += 1
            yield ep

    return gen()


def _dialog_turns(dialog: Any, what: str, report: ParseReport) -> list[Turn]:
    """Turns of one ParlAI dialog list; a missing speaker id is inferred by alternation (and counted)."""
    if not isinstance(dialog, list):
        raise BadRecord(f"{what} must be a list of utterances")
    turns = []
    for i, utt in enumerate(dialog):
        text = need(utt, "text", str, f" in {what}[{i}]")
        speaker = utt.get("id")
        if speaker is None:
            speaker = PERSONA_SPEAKERS[i % 2]
            report.inferred_speakers += 1
        elif not isinstance(speaker, str):
            raise BadRecord(f"{what}[{i}].id must be a string")
        else:
            speaker = record_text(speaker, f"{what}[{i}].id")
        turns.append(Turn(speaker=speaker, text=text))
    return turns


def parlai_record_to_episode(
    rec: Any, episode_id: str, report: ParseReport, source: dict[str, Any] | None = None
) -> Episode:
    """Converts one ParlAI MSC record; raises BadRecord with the reason when it is malformed."""
    dialog = need(rec, "dialog", list)
    previous = rec.get("previous_dialogs", [])
    if not isinstance(previous, list):
        raise BadRecord("key 'previous_dialogs' must be a list")
    raw: list[RawSession] = []
    gap_s: float | None = None
    gap_t: str | None = None
    for k, prev in enumerate(previous):
        what = f"previous_dialogs[{k}]"
        turns = _dialog_turns(need(prev, "dialog", list, f" in {what}"), f"{what}.dialog", report)
        meta = {key: prev[key] for key in ("personas", "time_back") if key in prev}
        raw.append(RawSession(turns, gap_s, gap_t, meta=meta))
        gap_s, gap_t = _gap_after(prev, what, report)
    raw.append(RawSession(_dialog_turns(dialog, "dialog", report), gap_s, gap_t))

    personas: dict[str, tuple[str, ...]] = {}
    if "personas" in rec:
        pers = rec["personas"]
        if not isinstance(pers, list) or len(pers) != 2:
            raise BadRecord("key 'personas' must be a list of two lists of strings")
        for label, lines in zip(PERSONA_SPEAKERS, pers):
            personas[label] = tuple(str_list(lines, "personas[]"))
    meta: dict[str, Any] = dict(source or {})
    for key in ("init_personas", "metadata"):
        if key in rec:
            meta[key] = rec[key]
    return Episode(DATASET, episode_id, assemble_sessions(raw, report), personas=personas, meta=meta)


def _gap_after(prev: dict[str, Any], what: str, report: ParseReport) -> tuple[float | None, str | None]:
    """The gap after a previous session from ``time_num``/``time_unit`` (None, counted, if absent)."""
    num, unit = prev.get("time_num"), prev.get("time_unit")
    if num is None or unit is None:
        report.unparsed_gaps += 1
        return None, None
    if isinstance(num, bool) or not isinstance(num, (int, float)) or not isinstance(unit, str):
        raise BadRecord(f"{what}.time_num must be a number and time_unit a string")
    text = f"{num} {unit}"
    try:
        return float(num) * timegap.unit_seconds(unit), text
    except ValueError:
        report.unparsed_gaps += 1
        return None, text


def parse_msc_cc_style(
    path: str | os.PathLike[str],
    *,
    skip_malformed: bool = False,
    report: ParseReport | None = None,
    relpath: str = "test.json",
) -> Iterator[Episode]:
    """Streams Episodes from THEANINE's CC-style MSC conversion (a JSON list or JSON Lines; no gaps)."""
    return cc.parse_cc_style(
        path,
        dataset=DATASET,
        skip_malformed=skip_malformed,
        report=report,
        what=f"THEANINE's CC-style conversion of the MSC test split, saved as {relpath}",
        where_from="GitHub kimnamssya/Theanine (resources/data/), converted from ParlAI msc_v0.1",
    )
