"""GapChat (Zhang et al. 2023, "Mind the Gap Between Conversations") -> Episodes.

Files ``{train,eval,test}/{3,4,5}_session.json`` of GitHub ``QZx7/MindTheTime``, each one JSON list of
episodes: ``sessions`` (lists of ``{"speaker", "text", "time"}``), ``gap`` (2*(n-1) strings; ``gap[2k]`` is
the simulated time between session k+1 and k+2, in identical pairs in test/eval), ``initial`` and
``subsequent`` (each speaker's state and events per later session).

The release contains header glitches: pseudo-utterances whose speaker is a truncated header ("initial s",
"session 2", "next sess", "speaker_") with text like "" or "sion:". They and empty sessions are dropped and
counted in the ParseReport. The ``time`` field is when a line was collected, not simulated time, and is
not kept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from icml_jax.data import timegap
from icml_jax.data.report import ParseReport
from icml_jax.data.schema import Episode, Turn
from icml_jax.data.sources._common import (
    BadRecord,
    RawSession,
    assemble_sessions,
    load_json_list,
    need,
    record_text,
    require_file,
)

DATASET = "gapchat"
GITHUB_URL = "https://github.com/QZx7/MindTheTime, folder mtt/chat/data/gap_chat/ (MIT)"
SPEAKERS = ("speaker_1", "speaker_2")
_FULL_HEADERS = ("initial session", "next session", "speaker_1", "speaker_2")
_SESSION_HEADER = re.compile(r"session(?: \d*)?")


def is_header_glitch(speaker: str) -> bool:
    """True for a truncated header posing as a speaker ("initial s", "session 2", "next sess", "speaker_")."""
    s = speaker.strip().lower()
    if not s or s in SPEAKERS:
        return False
    return bool(_SESSION_HEADER.fullmatch(s)) or any(h.startswith(s) for h in _FULL_HEADERS)


def default_id_prefix(path: str | os.PathLike[str]) -> str:
    """Episode id prefix from the file's place in the release: ``test/4_session.json`` -> ``gapchat-test-4-``.

    A sample such as ``4_session.first20.json`` gets the same ids as the full file it was cut from.
    """
    p = Path(path)
    n = p.name.split("_", 1)[0]
    return f"{DATASET}-{p.parent.name}-{n}-"


def parse_gapchat(
    path: str | os.PathLike[str],
    *,
    id_prefix: str | None = None,
    skip_malformed: bool = False,
    report: ParseReport | None = None,
    relpath: str = "test/5_session.json",
) -> Iterator[Episode]:
    """Streams Episodes from one GapChat JSON file, dropping (and counting) header glitches and empty sessions."""
    report = report if report is not None else ParseReport()
    p = require_file(
        path,
        dataset="GapChat",
        what=f"the GapChat file {relpath} (keep the train/eval/test folder layout)",
        where_from=GITHUB_URL,
    )
    prefix = default_id_prefix(p) if id_prefix is None else id_prefix
    records = load_json_list(p)

    def gen() -> Iterator[Episode]:
        for index, rec in enumerate(records):
            report.records_read += 1
            try:
                source = {"source_file": os.path.basename(p), "record_index": index}
                ep = gapchat_record_to_episode(rec, f"{prefix}{index}", report, source)
            except BadRecord as e:
                report.malformed(p, f"record {index}", str(e), skip=skip_malformed)
                continue
            report.episodes += 1
            yield ep

    return gen()


def gapchat_record_to_episode(
    rec: Any, episode_id: str, report: ParseReport, source: dict[str, Any] | None = None
) -> Episode:
    """Converts one GapChat episode; raises BadRecord with the reason when it is malformed.

    Glitch and empty-session counts go into ``report`` only once the whole record converted cleanly.
    """
    sessions = need(rec, "sessions", list)
    gaps = need(rec, "gap", list)
    n = len(sessions)
    if len(gaps) != 2 * max(n - 1, 0) or not all(isinstance(g, str) for g in gaps):
        raise BadRecord(f"'gap' must hold 2*(sessions-1) = {2 * max(n - 1, 0)} strings, got {len(gaps)}")
    for i, g in enumerate(gaps):
        record_text(g, f"'gap'[{i}]")
    subsequent = rec.get("subsequent")
    if subsequent is not None:
        if not isinstance(subsequent, dict):
            raise BadRecord("'subsequent' must be an object keyed by speaker")
        for sp, entries in subsequent.items():
            if not isinstance(entries, list) or len(entries) != n - 1:
                raise BadRecord(f"'subsequent'[{sp!r}] must list one entry per later session ({n - 1})")

    local = ParseReport()
    raw: list[RawSession] = []
    for j, session in enumerate(sessions):
        if not isinstance(session, list):
            raise BadRecord(f"sessions[{j}] must be a list of utterances")
        turns = []
        for k, utt in enumerate(session):
            what = f" in sessions[{j}][{k}]"
            speaker = need(utt, "speaker", str, what)
            text = need(utt, "text", str, what)
            if speaker in SPEAKERS:
                turns.append(Turn(speaker=speaker, text=text))
            elif is_header_glitch(speaker):
                local.glitch_turns_dropped += 1
            else:
                raise BadRecord(f"unknown speaker {speaker!r}{what}")
        rs = RawSession(turns)
        if j > 0:
            a, b = gaps[2 * (j - 1)], gaps[2 * (j - 1) + 1]
            rs.gap_text, rs.gap_seconds = a, timegap.gap_seconds(a)
            if rs.gap_seconds is None:
                local.unparsed_gaps += 1
            if b != a:
                rs.meta["gap_pair"] = [a, b]
            if subsequent is not None:
                rs.meta["subsequent"] = {sp: entries[j - 1] for sp, entries in subsequent.items()}
        raw.append(rs)

    assembled = assemble_sessions(raw, local)
    local.episodes_with_glitches = int(local.glitch_turns_dropped > 0)
    report.merge(local)
    meta: dict[str, Any] = dict(source or {})
    if "initial" in rec:
        meta["initial"] = rec["initial"]
    return Episode(DATASET, episode_id, assembled, meta=meta)
