"""Shared helpers of the raw-file parsers: reading JSON Lines / JSON lists with locations, session assembly."""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

from icml_jax.data.report import MalformedFileError, MissingSourceFileError, ParseReport
from icml_jax.data.schema import Session, Turn
from icml_jax.textcheck import TextError, check_text


class BadRecord(Exception):
    """Raised inside a record converter; the caller turns it into a MalformedRecordError with the location."""


def require_file(path: str | os.PathLike[str], *, dataset: str, what: str, where_from: str) -> str:
    """Returns ``path`` as str, or raises MissingSourceFileError saying what to get and where to put it."""
    p = os.fspath(path)
    if not os.path.isfile(p):
        raise MissingSourceFileError(p, dataset=dataset, what=what, where_from=where_from)
    return p


_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)
_RESAVE = "re-save the file as UTF-8"


def check_utf8_start(path: str, head: bytes) -> None:
    """Raises MalformedFileError when a file starts like UTF-16/32 or binary (a wide BOM or a NUL byte).

    No JSON text in UTF-8 holds a raw NUL byte, so such a file has no record that could be read or skipped.
    """
    for bom, name in _WIDE_BOMS:  # UTF-32 first: its little-endian BOM begins with UTF-16's
        if head.startswith(bom):
            raise MalformedFileError(path, "byte 0", f"not UTF-8: starts with a {name} byte-order mark; {_RESAVE}")
    nul = head.find(b"\0")
    if nul >= 0:
        raise MalformedFileError(
            path, f"byte {nul}", f"not UTF-8 text: has a NUL byte (UTF-16 without a byte-order mark, or binary); "
            f"{_RESAVE}"
        )


def _utf8_reason(e: UnicodeDecodeError, data: bytes, offset: int) -> str:
    """Why ``data`` is not UTF-8, with the bad byte and its byte offset in the file (``offset`` = data's start)."""
    return (
        f"not valid UTF-8 ({e.reason}: byte 0x{data[e.start]:02x} at byte offset {offset + e.start} of the file); "
        f"{_RESAVE}"
    )


def read_utf8(path: str) -> str:
    """The whole file as text (a leading UTF-8 BOM dropped); MalformedFileError names the line and byte if not UTF-8."""
    with open(path, "rb") as f:
        data = f.read()
    check_utf8_start(path, data[:4096])
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, bom + e.start) + 1
        raise MalformedFileError(path, f"line {line}", _utf8_reason(e, data[bom:], bom)) from None


def _load_json_text(path: str) -> Any:
    """Parses a file holding one JSON value; not UTF-8 or not JSON is a MalformedFileError (nothing to skip)."""
    text = read_utf8(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise MalformedFileError(path, f"line {e.lineno} column {e.colno}", f"not valid JSON: {e.msg}") from None


def iter_json_records(path: str, report: ParseReport, *, skip_malformed: bool) -> Iterator[tuple[int, str, Any]]:
    """Yields (record_index, location, obj) from a JSON Lines file or a file holding one JSON list.

    The format is detected from the first non-blank character ('[' = JSON list). JSON Lines locations are
    "line N" (1-based); JSON list locations are "record i" (0-based index in the list). A JSON Lines line
    that is not valid JSON or not UTF-8 is malformed (skipped and counted with ``skip_malformed``); a file
    that is not UTF-8 at all (a UTF-16/32 byte-order mark, NUL bytes, or no line that decodes) and a JSON
    list file that does not parse are always errors (MalformedFileError), naming the line and byte.
    """
    with open(path, "rb") as f:
        head = f.read(4096)
    check_utf8_start(path, head)
    if head.removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"["):
        records = _load_json_text(path)
        for i, rec in enumerate(records):
            report.records_read += 1
            yield i, f"record {i}", rec
        return
    index = 0
    offset = 0  # byte offset of the current line in the file
    first_bad: tuple[str, str] | None = None  # (location, reason) of the first line that is not UTF-8
    bad_lines, decoded_any = 0, False
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line_offset, offset = offset, offset + len(raw)
            if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
                raw, line_offset = raw[len(codecs.BOM_UTF8) :], line_offset + len(codecs.BOM_UTF8)
            if not raw.strip():
                report.blank_lines += 1
                continue
            report.records_read += 1
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                reason = _utf8_reason(e, raw, line_offset)
                bad_lines += 1
                first_bad = first_bad or (f"line {lineno}", reason)
                report.malformed(path, f"line {lineno}", reason, skip=skip_malformed)
                index += 1
                continue
            decoded_any = True
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                report.malformed(path, f"line {lineno}", f"not valid JSON: {e.msg}", skip=skip_malformed)
                index += 1
                continue
            yield index, f"line {lineno}", rec
            index += 1
    if first_bad is not None and not decoded_any:  # only reached when skipping: every line was skipped
        location, reason = first_bad
        raise MalformedFileError(path, location, f"none of its {bad_lines} non-blank lines is UTF-8; first: {reason}")


def load_json_list(path: str) -> list[Any]:
    """Loads a file that must hold one JSON list; errors name the file and the line/column or byte."""
    data = _load_json_text(path)
    if not isinstance(data, list):
        raise MalformedFileError(path, "top level", f"expected a JSON list of episodes, got {type(data).__name__}")
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


def record_text(value: str, what: str) -> str:
    """``value`` when it is valid Unicode text (no lone surrogate, e.g. a JSON escape "\\udc80"); BadRecord naming
    ``what`` and the offset otherwise (the caller adds the file and line)."""
    try:
        return check_text(value, "record", what)
    except TextError as e:
        raise BadRecord(str(e)) from None


def need(rec: Any, key: str, kind: type | tuple[type, ...], what: str = "") -> Any:
    """Returns rec[key] checked against ``kind`` (a string also as valid text); raises BadRecord naming the key
    otherwise."""
    if not isinstance(rec, dict):
        raise BadRecord(f"expected a JSON object{what}, got {type(rec).__name__}")
    if key not in rec:
        raise BadRecord(f"missing key {key!r}{what}")
    val = rec[key]
    if not isinstance(val, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise BadRecord(f"key {key!r}{what} must be {names}, got {type(val).__name__}")
    return record_text(val, f"key {key!r}{what}") if isinstance(val, str) else val


def str_list(val: Any, what: str) -> list[str]:
    """Checks that ``val`` is a list of strings of valid text; raises BadRecord naming ``what`` otherwise."""
    if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
        raise BadRecord(f"{what} must be a list of strings")
    for i, x in enumerate(val):
        record_text(x, f"{what}[{i}]")
    return val
