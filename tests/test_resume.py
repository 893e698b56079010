"""Kill-and-resume: a run SIGKILLed at random points (in warm-up, in online learning, and while an online
checkpoint is being written), whose newest checkpoint is then damaged, and restarted in the same workdir ends
bitwise equal to an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp

from icml_jax.run import workdir as layout
from icml_jax.run.runlog import METRICS_FILE
from icml_jax.checkpoint import RunCheckpointer

ROOT = Path(__file__).resolve().parents[1]
# 8 online episodes, a checkpoint every 2 (kept: 2), a small synthesis; everything else is configs/demo.py.
OVERRIDES = ("--config.data.train_episodes=8", "--config.data.eval_episodes=2", "--config.synthesis.num_seeds=4",
             "--config.checkpoint.every_episodes=2", "--config.checkpoint.keep=2")
TIMING_KEYS = ("time", "seconds", "wall")  # wall-clock fields differ between any two runs


def _start(workdir: Path, **env: str) -> subprocess.Popen:
    """The run in a subprocess; its output goes to files beside the workdir (a full pipe would stall it)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    environ.update(JAX_PLATFORMS="cpu", **env)
    workdir.parent.mkdir(parents=True, exist_ok=True)
    out, err = (open(workdir.parent / f"{workdir.name}.{s}", "a") for s in ("out", "err"))  # noqa: SIM115
    with out, err:
        return subprocess.Popen([sys.executable, str(ROOT / "tests" / "resume_worker.py"),
                                 f"--config={ROOT / 'configs' / 'demo.py'}", f"--workdir={workdir}", *OVERRIDES],
                                cwd=ROOT, env=environ, stdout=out, stderr=err)


def _logs(workdir: Path, stream: str) -> str:
    return (workdir.parent / f"{workdir.name}.{stream}").read_text()


def _finish(proc: subprocess.Popen, workdir: Path) -> str:
    proc.wait(timeout=300)
    assert proc.returncode == 0, _logs(workdir, "err")[-3000:]
    return _logs(workdir, "out")


def _rows(workdir: Path) -> list[dict]:
    """metrics.jsonl's rows, with the workdir's own path written as <workdir> (the two runs' paths differ)."""
    path = workdir / METRICS_FILE
    text = path.read_text().replace(str(workdir), "<workdir>") if path.exists() else ""
    return [json.loads(line) for line in text.splitlines()]


def _kill_when(proc: subprocess.Popen, workdir: Path, ready) -> list[dict]:
    """Polls metrics.jsonl and SIGKILLs `proc` as soon as `ready(rows)`; the process must still be running."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            rows = _rows(workdir)
            hit = ready(rows)
        except json.JSONDecodeError:  # a line being written right now
            hit = False
        if hit:
            assert proc.poll() is None, f"the run ended before the kill point: {_logs(workdir, 'err')[-2000:]}"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert proc.returncode == -signal.SIGKILL
            return rows
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before the kill point (rc {proc.returncode}): "
                                 f"{_logs(workdir, 'err')[-2000:]}")
        time.sleep(0.01)
    raise AssertionError("kill point never reached")


def _strip(value):
    """A metrics row / summary without its wall-clock fields."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if not any(t in k for t in TIMING_KEYS)}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _final_state(workdir: Path) -> tuple[dict, dict]:
    """(arrays, JSON state) of the run's last checkpoint, memory stores without their wall-clock times (creation,
    supersede, each history event's)."""
    with RunCheckpointer(workdir / layout.CHECKPOINT_DIR) as ckpt:
        step, arrays, state = ckpt.restore()

    def timeless(record: dict) -> dict:
        events = [{k: v for k, v in e.items() if k != "at"} for e in record.get("events", [])]
        return {**{k: v for k, v in record.items() if k not in ("created_at", "valid_to")}, "events": events}

    memory = {user: [timeless(json.loads(line)) for line in text.splitlines()]
              for user, text in state["memory"].items()}
    return arrays, {**state, "memory": memory, "step": step, "metrics_bytes": None}


def _policy(workdir: Path) -> dict:
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(workdir / layout.POLICY_DIR / "state")


def _assert_trees_equal(a, b, where: str) -> None:
    import jax

    la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb], where
    for (path, x), (_, y) in zip(la, lb):
        assert np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(np.asarray(x), np.asarray(y)), \
            f"{where}: {jax.tree_util.keystr(path)} differs"


def test_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    note = f"(kill points drawn with seed {seed})"
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    # the uninterrupted run first, to its end: it writes every program the killed run compiles to the shared
    # persistent compilation cache (tests/conftest.py), so the killed run's four starts load them instead of
    # compiling them again (started side by side, both would compile each program)
    _finish(_start(reference), reference)

    # kill 1: in the warm-up, a random number of its logged steps in
    warm = rng.randint(1, 2)
    _kill_when(_start(killed), killed, lambda rows: sum(r["stage"] == "warmup" for r in rows) >= warm)
    # kill 2: in online learning, after a random number of episodes (counted from any restart); at most 4 of the
    # 8, so that the restarted run still has saves left to be killed in (checkpoints every 2 episodes)
    episodes = rng.randint(1, 4)
    _kill_when(_start(killed), killed,
               lambda rows: sum(r["stage"] == "online" and "episode" in r for r in rows) >= episodes)
    # kill 3: while a checkpoint is being written (its temporary directory is there, unfinished)
    # the n-th save after the restart: it resumes from step <= episodes, so >= (8 - episodes) // 2 saves remain
    nth = rng.randint(2, max(2, (8 - episodes) // 2))
    proc = _start(killed, KILL_AT_SAVE=str(nth))
    proc.wait(timeout=300)
    err = _logs(killed, "err")
    assert proc.returncode == -signal.SIGKILL, f"{note} {err[-3000:]}"
    marker = re.search(r"KILLED-WHILE-SAVING step=\d+ listing=\[[^\]]*\]", err)  # progress bars share the line
    assert marker, f"{note} {err[-3000:]}"
    line = marker.group(0)
    step = int(line.split("step=")[1].split()[0])
    assert f"'{step}.orbax-checkpoint-tmp'" in line, line  # the kill landed mid-write
    with RunCheckpointer(killed / layout.CHECKPOINT_DIR) as ckpt:  # the half-written step is not a checkpoint
        assert step not in ckpt.all_steps() and ckpt.latest_step() < step, (note, ckpt.all_steps(), step)
        kept = ckpt.all_steps()
    # damage 4: the newest complete checkpoint rots (its JSON state cut short); resume falls back to the one before
    assert len(kept) == 2, (note, kept)
    (killed / layout.CHECKPOINT_DIR / str(kept[-1]) / "state" / "metadata").write_text('{"truncated": ')
    out = _finish(_start(killed), killed)
    assert "resuming" in out and f"(online checkpoint step {kept[0]})" in out, out
    assert f"warning: checkpoint step {kept[-1]} does not restore (JSONDecodeError" in out, out

    ref_rows, got_rows = _rows(reference), _rows(killed)
    assert [r["stage"] for r in got_rows] == [r["stage"] for r in ref_rows], note
    assert _strip(got_rows) == _strip(ref_rows), note
    ref_arrays, ref_state = _final_state(reference)
    got_arrays, got_state = _final_state(killed)
    _assert_trees_equal(got_arrays, ref_arrays, f"final checkpoint arrays {note}")
    assert got_state == ref_state, note
    assert got_state["memory"], "no memories were saved: the comparison would be empty"
    _assert_trees_equal(_policy(killed), _policy(reference), f"final policy {note}")
    progress = [json.loads((d / layout.PROGRESS_FILE).read_text().replace(str(d), "<workdir>"))
                for d in (reference, killed)]
    for p in progress:  # file lengths differ with the workdir path and the timestamps' digits
        assert p.pop("metrics_bytes") == len((reference if p is progress[0] else killed).joinpath(
            METRICS_FILE).read_bytes())
    assert _strip(progress[0]) == _strip(progress[1]) and progress[1]["finished"]
