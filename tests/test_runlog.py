"""Run logging: strict-JSON metrics lines, TensorBoard scalars per stage, resuming (truncation and purge steps),
learning-curve plots with and without data, and the per-session table."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from icml_jax.run.runlog import MetricsLog, plot_learning_curves, read_metrics, session_table


def events(directory: Path) -> list[event_pb2.Event]:
    """Every event of the TFRecord event files in `directory` (length, crc, payload, crc per frame)."""
    out = []
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[i + 12:i + 12 + n])
            out.append(event)
            i += 12 + n + 4
    return out


def scalars(directory: Path) -> dict[tuple[str, int], float]:
    """(tag, step) -> value of the scalar summaries in `directory`."""
    return {(v.tag, e.step): v.simple_value for e in events(directory) for v in e.summary.value}


def test_rows_round_trip_as_strict_json_with_nan_as_null(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.write("online", {"episode": 1, "rewards/trigger": float("nan"), "x": np.float32(0.5),
                             "nested": {"a": float("inf"), "b": [1.0, float("-inf")]}, "note": "ok"})
        log.write("warmup", {"step": 2.0, "planner/loss": 0.25})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2

    def reject(name):
        raise AssertionError(f"non-strict JSON constant {name}")

    first = json.loads(lines[0], parse_constant=reject)
    assert list(first) == sorted(first)
    assert first["stage"] == "online" and abs(first["time"] - time.time()) < 60
    assert first["rewards/trigger"] is None and first["x"] == 0.5 and first["note"] == "ok"
    assert first["nested"] == {"a": None, "b": [1.0, None]}
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0] == first and rows[1]["stage"] == "warmup" and rows[1]["planner/loss"] == 0.25


def test_invalid_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"stage": "online"}\n\n{"stage": \n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:3: invalid JSON"):
        read_metrics(path)


def test_finite_numbers_become_scalars_per_stage_at_their_steps(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.write("online", {"episode": 3, "rewards/trigger": 0.5, "rewards/planner": float("nan"),
                             "note": "text", "none": None, "flag": True}, step=3)
        log.write("online", {"rewards/trigger": -1.25}, step=7)
        for loss in (2.0, 1.5):
            log.write("warmup", {"planner/loss": loss})  # automatic steps 0, 1
    online = scalars(tmp_path / "tensorboard" / "online")
    assert online == {("episode", 3): 3.0, ("rewards/trigger", 3): 0.5, ("flag", 3): 1.0,
                      ("rewards/trigger", 7): -1.25}
    assert scalars(tmp_path / "tensorboard" / "warmup") == {("planner/loss", 0): 2.0, ("planner/loss", 1): 1.5}
    assert sorted(p.name for p in (tmp_path / "tensorboard").iterdir()) == ["online", "warmup"]


def test_resuming_truncates_the_file_and_purges_later_tensorboard_steps(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.write("online", {"episode": 1})
        log.write("online", {"episode": 2})
        resume_at, steps = log.position(), log.steps
        log.write("online", {"episode": 3})  # written after the checkpoint: dropped on resume
    lines = (tmp_path / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert resume_at == len(lines[0]) + len(lines[1])
    assert steps == {"online": 2}
    with MetricsLog(tmp_path, truncate_to=resume_at, purge_steps=steps) as log:
        assert log.position() == resume_at
        log.write("online", {"episode": 3, "again": 1})
    assert [r["episode"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert read_metrics(tmp_path / "metrics.jsonl")[-1]["again"] == 1
    evs = [e for e in events(tmp_path / "tensorboard" / "online") if e.file_version or e.HasField("session_log")]
    assert any(e.file_version == "brain.Event:2" and e.step == 2 for e in evs)
    assert any(e.session_log.status == event_pb2.SessionLog.START and e.step == 2 for e in evs)
    assert ("again", 2) in scalars(tmp_path / "tensorboard" / "online")


def test_a_checkpoint_that_does_not_match_the_file_is_refused(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.write("online", {"episode": 1})
        size = log.position()
    with pytest.raises(ValueError, match=f"has {size} bytes.*does not belong"):
        MetricsLog(tmp_path, truncate_to=size + 1)
    with pytest.raises(ValueError, match="not the end of a line"):
        MetricsLog(tmp_path, truncate_to=size - 2)
    with pytest.raises(ValueError, match="has 0 bytes"):
        MetricsLog(tmp_path / "fresh", truncate_to=10)
    MetricsLog(tmp_path, truncate_to=0).close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == b""


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_learning_curves_plot_full_and_empty_data(tmp_path):
    rng = np.random.default_rng(0)
    with MetricsLog(tmp_path) as log:
        for step in (50, 100):
            log.write("warmup", {"step": float(step), "planner/loss": 1.0 / step, "trigger/value_loss": 0.1})
        log.write("warmup", {"final": True, "steps": 100})
        log.write("eval", {"episodes_seen": 0, "eval/planner_precision": 0.5, "eval/planner_recall": 0.4,
                             "eval/trigger_recall": float("nan")})
        for ep in range(1, 31):
            row = {"episode": ep, "episode/planner_precision": rng.random(), "episode/planner_recall": None,
                   "episode/trigger_recall": rng.random()}
            if ep % 5 == 0:
                row |= {"rewards/trigger": rng.normal(), "rewards/planner": rng.normal()}
            log.write("online", row)
        log.write("eval", {"episodes_seen": 30, "eval/planner_precision": 0.7, "eval/planner_recall": 0.6,
                             "eval/trigger_recall": 0.3})
    out = plot_learning_curves(tmp_path / "metrics.jsonl", tmp_path / "plots" / "curves.png", window=5)
    assert out == tmp_path / "plots" / "curves.png"
    _assert_png(out)
    (tmp_path / "empty.jsonl").write_text("")
    _assert_png(plot_learning_curves(tmp_path / "empty.jsonl", tmp_path / "empty.png"))


def test_session_table_puts_numbers_in_their_rows_and_dashes_for_missing():
    rows = [
        {"table": "sessions", "phase": "before", "session": 1, "planner_precision": 0.25, "planner_recall": 0.5,
         "trigger_recall": None, "reward_trigger": None, "reward_proxy": None, "decisions": 12},
        {"table": "sessions", "phase": "after", "session": 1, "planner_precision": 0.875, "planner_recall": 0.625,
         "trigger_recall": 0.75, "reward_trigger": None, "reward_proxy": None, "decisions": 12},
        {"table": "sessions", "phase": "after", "session": 2, "planner_precision": float("nan"),
         "planner_recall": 0.125, "trigger_recall": 0.5, "reward_trigger": None, "reward_proxy": None,
         "decisions": 9},
        {"table": "sessions", "phase": "online", "session": 2, "planner_precision": None, "planner_recall": None,
         "trigger_recall": None, "reward_trigger": 1.5, "reward_proxy": -0.25, "decisions": 40},
        {"table": "other", "phase": "bogus", "session": 9},
    ]
    text = session_table(rows)
    lines = text.splitlines()
    assert all(len(line) <= 110 for line in lines)
    assert lines[0].split() == ["session", "|", "before", "|", "after", "|", "online"]
    assert lines[1].split() == ["|", "prec", "rec", "trig", "|", "prec", "rec", "trig", "|", "r_trig", "r_proxy",
                                "dec"]
    one = [c for c in lines[3].split() if c != "|"]
    two = [c for c in lines[4].split() if c != "|"]
    assert one == ["1", "0.250", "0.500", "-", "0.875", "0.625", "0.750", "-", "-", "-"]
    assert two == ["2", "-", "-", "-", "-", "0.125", "0.500", "+1.500", "-0.250", "40"]
    assert len(lines) == 5
    assert session_table([r for r in rows if r["phase"] == "online"]).splitlines()[0].split() == \
        ["session", "|", "online"]
    with pytest.raises(ValueError, match="unknown phase 'bogus'"):
        session_table([{"table": "sessions", "phase": "bogus", "session": 1}])
