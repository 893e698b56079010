"""Time gaps between sessions: the sources' strings ("5 days", "A few hours after") to seconds.

Exact counts ("5 days", time_num=5/time_unit="days") convert exactly. Vague counts follow one fixed
convention so that all datasets are comparable: "a"/"an"/"one" = 1, "a couple of" = 2, "a few" = 3,
"several" = 5. Months are 30 days and years 365 days. The original string always stays next to the number
(``Session.gap_text``), so nothing is lost by the approximation.
"""

from __future__ import annotations

import re

UNIT_SECONDS: dict[str, float] = {
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 7 * 86400.0,
    "month": 30 * 86400.0,
    "year": 365 * 86400.0,
}

VAGUE_COUNTS: dict[str, float] = {
    "a": 1,
    "an": 1,
    "one": 1,
    "a couple of": 2,
    "a couple": 2,
    "couple of": 2,
    "two": 2,
    "a few": 3,
    "few": 3,
    "three": 3,
    "four": 4,
    "five": 5,
    "several": 5,
    "six": 6,
    "seven": 7,
}

# Phrases that mean "no gap": the first session of an episode.
START_WORDS = frozenset({"start", ""})

_GAP_RE = re.compile(
    r"^\s*(?:about\s+|around\s+)?"
    r"(?P<count>\d+(?:\.\d+)?|" + "|".join(sorted((re.escape(k) for k in VAGUE_COUNTS), key=len, reverse=True)) + r")"
    r"\s+(?P<unit>second|minute|hour|day|week|month|year)s?"
    r"(?:\s+(?:after|later))?\s*\.?\s*$",
    re.IGNORECASE,
)


def unit_seconds(unit: str) -> float:
    """Seconds in one ``unit`` ("hours", "Day", ...); raises ValueError for an unknown unit."""
    key = unit.strip().lower()
    key = key[:-1] if key.endswith("s") else key
    if key not in UNIT_SECONDS:
        raise ValueError(f"unknown time unit {unit!r}; known: {sorted(UNIT_SECONDS)}")
    return UNIT_SECONDS[key]


def gap_seconds(text: str | None) -> float | None:
    """Seconds for a gap phrase, or None for the first session ("Start") or a phrase it cannot read.

    Accepts "5 days", "1 hour", "55 minutes", "A few hours after", "A couple of years after", "a day later".
    """
    if text is None:
        return None
    s = text.strip().lower()
    if s in START_WORDS:
        return None
    m = _GAP_RE.match(s)
    if m is None:
        return None
    count = m.group("count")
    n = float(count) if count[0].isdigit() else float(VAGUE_COUNTS[count])
    return n * UNIT_SECONDS[m.group("unit")]


def is_start(text: str | None) -> bool:
    """True when the phrase marks the first session ("Start") rather than a gap."""
    return text is None or text.strip().lower() in START_WORDS
