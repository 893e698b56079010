"""Errors that say which file and record, and the report that counts whatever a parser skipped or dropped.

Nothing is dropped silently: a parser either raises ``MalformedRecordError`` (default) or, with
``skip_malformed=True``, skips the record and counts it here; expected clean-ups (GapChat header glitches,
empty sessions) are always counted. A problem no skip can get past (a file that is not UTF-8 or not JSON at
all) raises ``MalformedFileError`` whatever ``skip_malformed`` says.

Every error a user's files or arguments can cause here derives from ``DataError`` (and from ValueError or
FileNotFoundError), so a command line can catch exactly those and print one line instead of a traceback.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging

SKIP_HINT = "pass skip_malformed=True to skip and count it"


class DataError(Exception):
    """Base of the errors a user's data files or arguments cause in ``icml_jax.data``; each message is one line."""


class MissingSourceFileError(DataError, FileNotFoundError):
    """A raw dataset file is not in the manual directory; the message says what to get, from where, to where."""

    def __init__(self, path: str, *, dataset: str, what: str, where_from: str):
        self.path = str(path)
        super().__init__(
            f"{dataset}: missing file {self.path}; get: {what}; from: {where_from}; put it at: {self.path}"
        )


class MissingManualDirError(MissingSourceFileError):
    """The manual directory itself is not there (or is not a folder); the message says what belongs in it."""

    def __init__(self, path: str, *, dataset: str, instructions: str):
        self.path = str(path)
        FileNotFoundError.__init__(
            self, f"{dataset}: manual_dir {self.path} is not a folder; {' '.join(instructions.split())}"
        )


class UnknownDatasetError(DataError, ValueError):
    """A dataset name that no builder here provides; the message lists the names that exist."""


class SourceDataError(DataError, ValueError):
    """A raw dataset file holds something a parser cannot use; names the file, where in it, and why."""

    def __init__(self, path: str, location: str, reason: str):
        self.path = str(path)
        self.location = location
        self.reason = reason
        super().__init__(self.describe())

    def describe(self, skip_hint: str | None = SKIP_HINT) -> str:
        """The one-line message; ``skip_hint`` (how to skip, in the caller's spelling) is used where skipping helps."""
        return f"{self.path}, {self.location}: {self.reason}"


class MalformedFileError(SourceDataError):
    """A whole raw file is unusable (not UTF-8, not JSON, wrong top level): there is no record to skip."""


class MalformedRecordError(SourceDataError):
    """A record of a raw dataset file cannot be read; the message names the file and the line or index.

    Raised only where ``skip_malformed`` was off, so the message says how to skip and count it instead.
    """

    def describe(self, skip_hint: str | None = SKIP_HINT) -> str:
        """The one-line message, ending with ``skip_hint`` (e.g. the command line's flag) when one is given."""
        base = super().describe()
        return f"{base} ({skip_hint})" if skip_hint else base


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
    questions: int = 0  # LoCoMo QA items read
    evidence_normalised: int = 0  # LoCoMo evidence strings rewritten ("D8:6; D9:17" -> two ids) or dropped as repeats
    evidence_unresolved: int = 0  # LoCoMo evidence strings or parts naming no turn, kept as unresolved

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
        line = (
            f"{self.records_read} records read, {self.episodes} episodes kept, "
            f"{self.num_malformed_skipped} malformed skipped, {self.glitch_turns_dropped} glitch turns dropped "
            f"in {self.episodes_with_glitches} episodes, {self.empty_sessions_dropped} empty sessions dropped, "
            f"{self.unparsed_gaps} unparsed gaps, {self.inferred_speakers} inferred speakers"
        )
        if self.questions:
            line += (f", {self.questions} questions, {self.evidence_normalised} evidence ids normalised, "
                     f"{self.evidence_unresolved} unresolved")
        return line
