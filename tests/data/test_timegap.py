"""Gap strings of all three datasets normalise to seconds; unknown phrases give None, not a guess."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icml_jax.data.timegap import UNIT_SECONDS, gap_seconds, is_start, unit_seconds

H, D = 3600.0, 86400.0


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("5 days", 5 * D),
        ("1 hour", H),
        ("55 minutes", 55 * 60.0),
        ("3 weeks", 21 * D),
        ("1 year", 365 * D),
        ("10 months", 300 * D),
        ("A few hours after", 3 * H),
        ("A few weeks after", 21 * D),
        ("A few months after", 90 * D),
        ("A couple of years after", 2 * 365 * D),
        ("A day after", D),
        ("a week later", 7 * D),
        ("Start", None),
        ("", None),
        (None, None),
        ("sometime", None),
    ],
)
def test_gap_phrases(text: str | None, seconds: float | None) -> None:
    """GapChat, CC and MSC phrases convert with the documented convention."""
    assert gap_seconds(text) == seconds


@given(st.integers(0, 10_000), st.sampled_from(sorted(UNIT_SECONDS)), st.booleans())
def test_exact_counts_round_trip(n: int, unit: str, plural: bool) -> None:
    """'<n> <unit>[s]' is n * unit seconds, and unit_seconds agrees."""
    text = f"{n} {unit}{'s' if plural else ''}"
    assert gap_seconds(text) == n * UNIT_SECONDS[unit]
    assert unit_seconds(unit + ("s" if plural else "")) == UNIT_SECONDS[unit]


def test_unknown_unit_and_start() -> None:
    """An unknown unit is an error for the structured MSC fields; 'Start' marks the first session."""
    with pytest.raises(ValueError, match="unknown time unit"):
        unit_seconds("fortnights")
    assert is_start("Start") and is_start(None) and not is_start("1 day")
