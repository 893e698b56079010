"""Errors that say which file and record, and the report that counts whatever a parser skipped or dropped.

Nothing is dropped silently: a parser either raises ``MalformedRecordError`` (default) or, with
``skip_malformed=True``, skips the record and counts it here; expected clean-ups (GapChat header glitches,
empty sessions) are always counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging


class MissingSourceFileError(FileNotFoundError):
    """A raw dataset file is not in the manual directory; the message says what to get, from where, to where."""

    def __init__(self, path: str, *, dataset: str, what: str, where_from: str):
        self.path = str(path)
        super().__init__(
            f"{dataset}: missing file {self.path}\n"
            f"  get: {what}\n"
            f"  from: {where_from}\n"
            f"  put it at: {self.path}"
        )


class MalformedRecordError(ValueError):
    """A record of a raw dataset file cannot be read; the message names the file and the line or index."""

    def __init__(self, path: str, location: str, reason: str):
        self.path = str(path)
        self.location = location
        self.reason = reason
        super().__init__(f"{self.path}, {location}: {reason} (pass skip_malformed=True to skip and count)")


@dataclasses.dataclass
class SkippedRecord:
    """One malformed record that was skipped: where it was and why."""

    path: str
    location: str
    reason: str


@dataclasses.dataclass
class ParseReport:
    """Counts of what a parser read, kept, skipped and dropped; one per file or split."""

    records_read: int = 0
    episodes: int = 0
    malformed_skipped: list[SkippedRecord] = dataclasses.field(default_factory=list)
    glitch_turns_dropped: int = 0
    episodes_with_glitches: int = 0
    empty_sessions_dropped: int = 0
    blank_lines: int = 0
    unparsed_gaps: int = 0
    inferred_speakers: int = 0

    def malformed(self, path: str, location: str, reason: str, *, skip: bool) -> None:
        """Raises MalformedRecordError, or records the skip when ``skip`` is true."""
        if not skip:
            raise MalformedRecordError(path, location, reason)
        logging.warning("skipping malformed record: %s, %s: %s", path, location, reason)
        self.malformed_skipped.append(SkippedRecord(str(path), location, reason))

    @property
    def num_malformed_skipped(self) -> int:
        """How many records were skipped as malformed."""
        return len(self.malformed_skipped)

    def merge(self, other: ParseReport) -> ParseReport:
        """Adds another report's counts into this one (returns self)."""
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, a + b)
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary (skipped records listed with file, location and reason)."""
        d = dataclasses.asdict(self)
        d["num_malformed_skipped"] = self.num_malformed_skipped
        return d

    def summary(self) -> str:
        """One line for logs."""
        return (
            f"{self.records_read} records read, {self.episodes} episodes kept, "
            f"{self.num_malformed_skipped} malformed skipped, {self.glitch_turns_dropped} glitch turns dropped "
            f"in {self.episodes_with_glitches} episodes, {self.empty_sessions_dropped} empty sessions dropped, "
            f"{self.unparsed_gaps} unparsed gaps, {self.inferred_speakers} inferred speakers"
        )
