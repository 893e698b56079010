"""scripts/compare_metrics.py: two runs' metrics.jsonl compared value for value, timings and paths aside."""

from __future__ import annotations

import json
import math

import pytest

from tests.scripts_loader import load_script

compare = load_script("compare_metrics")

ROW = {"stage": "online", "episode": 3, "rewards/planner": 0.25, "update/seconds": 1.5, "seconds": 9.0,
       "update/wall_since_last": 4.0, "retrieval_ms_p95": 12.0, "checkpoint": "/tmp/a/checkpoints/4",
       "final": {"planner_recall": 0.75, "time": 3.0, "curve": [0.1, 0.2]}, "loss": float("nan")}


def _write(path, rows):
    path.mkdir()
    (path / compare.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("key, timing", [("seconds", True), ("update/seconds", True), ("update/wall_since_last", True),
                                         ("retrieval_ms_p95", True), ("final.time", True), ("tokens_per_s", True),
                                         ("llm/tokens", False), ("rewards/planner", False), ("stale_recall_rate", False),
                                         ("update/update_norm", False), ("episode/sessions", False)])
def test_timing_keys_are_told_from_metrics(key, timing):
    assert compare.is_timing(key) is timing


def test_timings_and_paths_aside_two_runs_are_equal_and_exit_0(tmp_path, capsys):
    other = json.loads(json.dumps(ROW))  # NaN round-trips as NaN
    other.update({"update/seconds": 2.5, "seconds": 1.0, "update/wall_since_last": 0.1, "retrieval_ms_p95": 99.0,
                  "checkpoint": "/tmp/b/checkpoints/4"})
    other["final"]["time"] = 7.0
    old, new = _write(tmp_path / "old", [ROW, ROW]), _write(tmp_path / "new", [ROW, other])
    assert compare.differences(compare.read_rows(old), compare.read_rows(new)) == []
    assert compare.main([str(old), str(new)]) == 0
    assert "0 difference(s)" in capsys.readouterr().out


def test_every_changed_value_missing_key_and_row_is_reported_and_exit_1(tmp_path, capsys):
    changed = json.loads(json.dumps(ROW))
    changed["rewards/planner"] = 0.25000001
    changed["final"]["curve"][1] = 0.3
    del changed["episode"]
    changed["new_metric"] = 1
    changed["loss"] = 0.0
    diffs = compare.differences([ROW, ROW], [changed])
    assert diffs == ["row count: 2 != 1", "row 0: episode: only in old", "row 0: final.curve.1: 0.2 != 0.3",
                     "row 0: loss: nan != 0.0", "row 0: new_metric: only in new",
                     "row 0: rewards/planner: 0.25 != 0.25000001"]
    assert compare.differences([ROW], [changed], rtol=1e-6)[-1] != "row 0: rewards/planner: 0.25 != 0.25000001"
    assert compare.main([str(_write(tmp_path / "a", [ROW])), str(_write(tmp_path / "b", [changed]))]) == 1
    assert "5 difference(s)" in capsys.readouterr().out


def test_each_runs_own_workdir_reads_the_same_in_both(tmp_path):
    rows = {name: [{"checkpoint": f"{tmp_path / name}/warmup", "note": f"saved under {tmp_path / name}"}]
            for name in ("a", "b")}
    old, new = (compare.with_workdir(rows[n], tmp_path / n) for n in ("a", "b"))
    assert old == new == [{"checkpoint": "<workdir>/warmup", "note": "saved under <workdir>"}]
    assert compare.differences(rows["a"], rows["b"]) == [f"row 0: note: 'saved under {tmp_path / 'a'}' != "
                                                         f"'saved under {tmp_path / 'b'}'"]


def test_nan_equals_nan_and_bools_are_not_numbers():
    assert compare.same(math.nan, math.nan, 0.0)
    assert not compare.same(math.nan, 1.0, 0.5)
    assert not compare.same(True, 1.0000001, 1e-3)  # a bool compares exactly, never within a tolerance
    assert compare.same(1.0, 1.0000001, 1e-3)


def test_a_bad_line_is_named_with_its_file_and_line(tmp_path):
    run = _write(tmp_path / "run", [ROW])
    (run / compare.METRICS).write_text(json.dumps(ROW) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not JSON"):
        compare.read_rows(run)
