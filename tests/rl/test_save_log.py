"""Table 8 over training: the online stage's per-session rows carry the miss and false-positive rates and the
proxy / truth correlation of the saves made in each session (from the learner's save log)."""

from __future__ import annotations

import numpy as np
import pytest

from icml_jax.data.labels import SessionCounts
from icml_jax.rl.save_log import SaveLogEntry, proxy_truth_per_session
from icml_jax.run.stages.online import session_rows

USED = [(0.2, 0.3), (0.5, 0.4), (0.9, 0.95), (0.7, 0.6)]  # (r_proxy, r_qual(future)) of session 0's used saves


def test_proxy_truth_r_per_session_of_the_save_over_the_used_saves():
    entries = [SaveLogEntry(0, p, q) for p, q in USED] + [SaveLogEntry(0, 0.1, None)]  # never triggered: left out
    entries += [SaveLogEntry(1, 0.5, 0.2), SaveLogEntry(1, 0.6, 0.9)]  # 2 used saves: too few for an r
    entries += [SaveLogEntry(2, 0.5, q) for q in (0.1, 0.5, 0.9)]  # a constant proxy side: r undefined
    out = proxy_truth_per_session(entries)
    assert sorted(out) == [1, 2, 3]  # 1-based session numbers
    expected = np.corrcoef(*zip(*USED, strict=True))[0, 1]
    assert out[1] == {"saves": 5, "saves_used": 4, "r": pytest.approx(expected)}
    assert out[2] == {"saves": 2, "saves_used": 2, "r": None} and out[3]["r"] is None


def test_online_session_rows_hold_miss_rate_fpr_and_r():
    counts = [SessionCounts("e1", 0, turns=10, saves=4, correct_saves=3, gold_saves=5),
              SessionCounts("e2", 0, turns=10, saves=2, correct_saves=1, gold_saves=3),
              SessionCounts("e1", 1, turns=4, saves=1, correct_saves=1, gold_saves=1)]
    saves = [SaveLogEntry(0, p, q) for p, q in USED]
    first, second = session_rows("online", counts, saves)
    assert first["session"] == 1 and first["planner_miss_rate"] == pytest.approx((8 - 4) / 8)
    assert first["planner_false_positive_rate"] == pytest.approx((6 - 4) / (20 - 8))
    assert first["proxy_truth_r"] == pytest.approx(np.corrcoef(*zip(*USED, strict=True))[0, 1])
    assert (first["saves_finalized"], first["saves_used"]) == (4, 4)
    assert second["planner_miss_rate"] == 0.0 and second["proxy_truth_r"] is None and second["saves_used"] == 0
    assert "proxy_truth_r" not in session_rows("after", counts)[0]  # held-out rows: no save log
