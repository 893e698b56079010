"""scripts/online_curve.py: the online reward curve's slope and its permutation tests, on made-up runs."""

from __future__ import annotations

import json
import math

import pytest

from tests.scripts_loader import load_script

curve = load_script("online_curve")


def _run(tmp_path, name, r_trig):
    """A workdir whose metrics.jsonl holds a warm-up row, the episode rows (out of order) and an update row."""
    run = tmp_path / name
    run.mkdir()
    rows = [{"stage": "warmup", "step": 1}]
    rows += [{"stage": "online", "episode": i + 1, "episode/id": f"u{i}", "episode/reward_quality": r,
              "episode/reward_proxy": None, "episode/save_rate": 0.5, "agent/memory_use_rate": 0.25}
             for i, r in reversed(list(enumerate(r_trig)))]
    rows.append({"stage": "online", "update/loss": 1.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_slope_and_exact_permutation_p():
    assert curve.slope([1, 2, 3, 4]) == pytest.approx(1.0) and curve.slope([3, 3, 3]) == 0.0
    assert curve.rise_p_value([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == pytest.approx(1 / math.factorial(6))  # only itself
    assert curve.rise_p_value([0.6, 0.5, 0.4, 0.3, 0.2, 0.1]) == 1.0  # every order has a slope at least this
    assert curve.rise_p_value([0.5] * 5) == 1.0
    with pytest.raises(ValueError, match="at least 3 episodes"):
        curve.rise_p_value([0.1, 0.2])
    # past 8 points the orders are drawn: a rising 10-point curve is still rare among them
    assert curve.rise_p_value(list(range(10)), samples=2000) < 0.01


def test_pooled_p_is_smaller_for_two_rising_curves_than_for_one_with_a_flat_one():
    up = [0.50, 0.52, 0.51, 0.55, 0.56]
    flat = [0.53, 0.50, 0.55, 0.51, 0.53]
    both_up = curve.pooled_rise_p_value([up, up], samples=4000)
    with_flat = curve.pooled_rise_p_value([up, flat], samples=4000)
    assert both_up < with_flat and both_up < curve.rise_p_value(up)


def test_report_reads_finished_runs_in_episode_order(tmp_path, capsys):
    a = _run(tmp_path, "a", [0.50, 0.51, 0.52, 0.53])
    b = _run(tmp_path, "b", [0.53, 0.52, 0.51, 0.50])
    curve.main([str(a), str(b), "--samples", "500"])
    out = capsys.readouterr().out
    assert f"| {a} | 4 | 0.500 0.510 0.520 0.530 | - - - - | 0.500 0.500 0.500 0.500 | 0.250 0.250 0.250 0.250 | " \
           f"+0.0100 (0.042) |" in out  # 1 of the 4! = 24 orders rises this much
    assert f"| {b} | 4 |" in out and "-0.0100 (1.000)" in out and "pooled over 2 runs: mean slope +0.0000" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text(json.dumps({"stage": "warmup"}) + "\n")
    with pytest.raises(ValueError, match="no online episode rows"):
        curve.episode_rows(empty)
