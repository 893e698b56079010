"""Label counts of played sessions: what planner precision and the false-positive rate may be computed from."""

from __future__ import annotations

import math
from types import SimpleNamespace

from icml_jax.data.labels import pooled_metrics, session_counts
from icml_jax.data.schema import Episode, Session, Turn


def _receipt(session: int, turn: int, save: bool) -> SimpleNamespace:
    """The fields of an `agents.Receipt` that the counting reads."""
    return SimpleNamespace(session=session, turn=turn, planner=SimpleNamespace(save=save), memory_used=None)


def _counts(labels: list[bool | None], saves: list[bool]) -> dict[str, float]:
    turns = tuple(Turn("A", f"turn {i}", y_p=y) for i, y in enumerate(labels))
    episode = Episode("gapchat", "e", (Session(turns),))
    return pooled_metrics(session_counts(episode, [_receipt(0, i, s) for i, s in enumerate(saves)]), "m")


def test_unlabelled_turns_give_no_planner_precision_or_false_positive_rate() -> None:
    """Real data has no y_p: its saves are neither right nor wrong (NaN, not 0.0), while the save rate stands."""
    m = _counts([None] * 4, [True, True, False, True])
    assert math.isnan(m["m/planner_precision"]) and math.isnan(m["m/planner_false_positive_rate"])
    assert math.isnan(m["m/planner_recall"]) and m["m/save_rate"] == 0.75


def test_precision_and_false_positive_rate_count_labelled_decisions_only() -> None:
    # labelled: turn 0 (y 1, saved), turn 1 (y 0, saved), turn 2 (y 0, not saved); unlabelled: turns 3, 4 saved
    m = _counts([True, False, False, None, None], [True, True, False, True, True])
    assert m["m/planner_precision"] == 0.5  # 1 right of 2 labelled saves
    assert m["m/planner_false_positive_rate"] == 0.5  # 1 of the 2 labelled turns not worth saving
    assert m["m/planner_recall"] == 1.0 and m["m/save_rate"] == 0.8
