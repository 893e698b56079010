"""Shared helpers of the raw-file parsers: reading JSON Lines / JSON lists with locations, session assembly."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

from icml_jax.data.report import MalformedRecordError, MissingSourceFileError, ParseReport
from icml_jax.data.schema import Session, Turn


class BadRecord(Exception):
    """Raised inside a record converter; the caller turns it into a MalformedRecordError with the location."""


def require_file(path: str | os.PathLike[str], *, dataset: str, what: str, where_from: str) -> str:
    """Returns ``path`` as str, or raises MissingSourceFileError saying what to get and where to put it."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise MissingSourceFileError(p, dataset=dataset, what=what, where_from=where_from)
    return p


def iter_json_records(path: str, report: ParseReport, *, skip_malformed: bool) -> Iterator[tuple[int, str, Any]]:
    """Yields (record_index, location, obj) from a JSON Lines file or a file holding one JSON list.

    The format is detected from the first non-blank character ('[' = JSON list). JSON Lines locations are
    "line N" (1-based); JSON list locations are "record i" (0-based index in the list). A JSON Lines line
    that is not valid JSON is malformed; a JSON list file that does not parse is always an error (there is
    no record to skip), naming the line and column.
    """
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if head.startswith("["):
            try:
                records = json.load(f)
            except json.JSONDecodeError as e:
                raise MalformedRecordError(path, f"line {e.lineno} column {e.colno}", f"not valid JSON: {e.msg}")
            for i, rec in enumerate(records):
                report.records_read += 1
                yield i, f"record {i}", rec
            return
        index = 0
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                report.blank_lines += 1
                continue
            report.records_read += 1
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                report.malformed(path, f"line {lineno}", f"not valid JSON: {e.msg}", skip=skip_malformed)
                index += 1
                continue
            yield index, f"line {lineno}", rec
            index += 1


def load_json_list(path: str) -> list[Any]:
    """Loads a file that must hold one JSON list; errors name the file and the line/column."""
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise MalformedRecordError(path, f"line {e.lineno} column {e.colno}", f"not valid JSON: {e.msg}")
    if not isinstance(data, list):
        raise MalformedRecordError(path, "top level", f"expected a JSON list of episodes, got {type(data).__name__}")
    return data


@dataclasses.dataclass
class RawSession:
    """A session before empty sessions are dropped and gaps merged."""

    turns: list[Turn]
    gap_seconds: float | None = None
    gap_text: str | None = None
    summary: str | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def assemble_sessions(raw: list[RawSession], report: ParseReport) -> tuple[Session, ...]:
    """Drops empty sessions (counted) and folds a dropped session's gap into the next one's.

    When session k is empty, the time between k-1 and k+1 is gap(k) + gap(k+1); the texts are joined with
    " + " so the original strings survive. A dropped last session takes its gap with it.
    """
    out: list[Session] = []
    carry_s: float | None = 0.0
    carry_t: list[str] = []
    for rs in raw:
        if not rs.turns:
            report.empty_sessions_dropped += 1
            if out or carry_t:  # a dropped first session has no gap worth carrying
                carry_s = None if (carry_s is None or rs.gap_seconds is None) else carry_s + rs.gap_seconds
                if rs.gap_text is not None:
                    carry_t.append(rs.gap_text)
            continue
        gap_s, gap_t = rs.gap_seconds, rs.gap_text
        if carry_t:
            gap_s = None if (carry_s is None or gap_s is None) else carry_s + gap_s
            gap_t = " + ".join(carry_t + ([gap_t] if gap_t is not None else []))
        carry_s, carry_t = 0.0, []
        out.append(Session(tuple(rs.turns), gap_s, gap_t, rs.summary, rs.meta))
    return tuple(out)


def need(rec: Any, key: str, kind: type | tuple[type, ...], what: str = "") -> Any:
    """Returns rec[key] checked against ``kind``; raises BadRecord naming the key otherwise."""
    if not isinstance(rec, dict):
        raise BadRecord(f"expected a JSON object{what}, got {type(rec).__name__}")
    if key not in rec:
        raise BadRecord(f"missing key {key!r}{what}")
    val = rec[key]
    if not isinstance(val, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise BadRecord(f"key {key!r}{what} must be {names}, got {type(val).__name__}")
    return val


def str_list(val: Any, what: str) -> list[str]:
    """Checks that ``val`` is a list of strings; raises BadRecord naming ``what`` otherwise."""
    if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
        raise BadRecord(f"{what} must be a list of strings")
    return val
