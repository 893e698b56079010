"""The main job's online stage on two JAX processes (2 fake CPU devices each, loopback coordinator, gloo): each
process plays its own users, every PPO update is one global step over both processes' decisions on a (data 4)
mesh, and Orbax checkpoints hold both processes' state.

Checks: a 2-process run, SIGKILLed once its checkpoint after the first update is on disk and started again,
ends where a 1-process run on 4 devices ends: the same decisions, memories and metrics, the parameters and
optimizer state within 1e-6 (float32 reductions in another order), its metrics cut back at the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import portpicker
import pytest

from icml_jax import main as job
from icml_jax import parallel
from icml_jax.run import workdir as layout
from icml_jax.run.builders import build_models
from icml_jax.configlib import load_config
from icml_jax.checkpoint import CheckpointError, RunCheckpointer
from icml_jax.run.runlog import METRICS_FILE
from icml_jax.checkpoint.online import own_state
from icml_jax.checkpoint import save_warmup
from icml_jax.run.validation import check_processes

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300
TIMING_KEYS = ("time", "seconds", "wall")  # wall-clock fields differ between any two runs
NORMS = ("param_norm", "update_norm")  # of every parameter


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    for proxy in [k for k in env if "proxy" in k.lower()]:
        env.pop(proxy)  # loopback only
    return env


def _start(count: int, workdir: Path, warm: Path, **extra: str) -> list[subprocess.Popen]:
    """The run's processes (each with 4 / count devices); output to files beside the workdir."""
    port = portpicker.pick_unused_port()
    procs = []
    for i in range(count):
        log = open(workdir.parent / f"{workdir.name}.{i}.log", "a")  # noqa: SIM115
        with log:
            procs.append(subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "main_multihost_worker.py"), str(i), str(count), str(port),
                 str(4 // count), str(workdir), str(warm)], cwd=ROOT, env={**_env(), **extra},
                stdout=log, stderr=subprocess.STDOUT))
    return procs


def _wait(procs: list[subprocess.Popen], workdir: Path, codes: tuple[int, ...] = (0,),
          others: tuple[int, ...] | None = None) -> None:
    """Waits for the run's processes; process 0 must exit with one of `codes`, the others with one of `others`
    (default: `codes`)."""
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"process {i} of {workdir.name} did not finish within {TIMEOUT_S} s")
    for i, p in enumerate(procs):
        log = (workdir.parent / f"{workdir.name}.{i}.log").read_text()
        allowed = codes if i == 0 or others is None else others
        assert p.returncode in allowed, f"process {i} of {workdir.name} exited {p.returncode}:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The online stage from one saved policy: one process on 4 devices, and two processes on 2 devices each
    that are SIGKILLed once their second checkpoint (step 2 of 4 episodes) is on disk, then started again."""
    root = tmp_path_factory.mktemp("multihost_main")
    config = load_config(ROOT / "configs" / "demo.py")
    policies, _ = build_models(config, root / "start")
    warm = save_warmup(root / "start" / "policy", policies)  # what `online.init_from` reads (every process)
    one, two = root / "one", root / "two"
    started = [(_start(1, one, warm), one), (_start(2, two, warm, KILL_AT_SAVE="2"), two)]
    _wait(*started[0])
    _wait(*started[1], codes=(-9,), others=(-9, -6))  # the other process: killed too, or aborted on the leader's death
    assert "killed after save 2 (step 2)" in (root / "two.0.log").read_text()
    assert "save 2 (step 2) on disk" in (root / "two.1.log").read_text()
    _wait(_start(2, two, warm), two)
    log = (root / "two.0.log").read_text()
    assert "next ['online'] (online checkpoint step 2)" in log, log[-2000:]  # resumed where it was killed
    return one, two


def _final(workdir: Path) -> tuple[int, dict, dict]:
    with RunCheckpointer(workdir / layout.CHECKPOINT_DIR) as ckpt:
        return ckpt.restore()


def _flat(arrays: dict) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(arrays)[0]}


def _rows(workdir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (workdir / METRICS_FILE).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING_KEYS)} for r in rows]


def test_two_processes_killed_and_resumed_end_where_one_process_on_four_devices_ends(runs):
    one, two = runs
    (s1, a1, _), (s2, a2, _) = _final(one), _final(two)
    assert s1 == s2 == 4
    f1, f2 = _flat(a1), _flat(a2)
    assert f1.keys() == f2.keys()
    compared = list(f1)  # every parameter and optimizer leaf (the Trigger actor's unused bias included)
    assert any("planner_actor" in k for k in compared) and any("optimizer" in k for k in compared)
    worst = max(float(np.max(np.abs(f1[k].astype(np.float64) - f2[k].astype(np.float64)), initial=0.0))
                for k in compared)
    print(f"2 processes (killed, resumed) vs 1 process on 4 devices: max |parameter / optimizer difference| "
          f"{worst:.2e}")
    assert worst <= 1e-6
    r1, r2 = _rows(one), _rows(two)  # the resumed run cut its metrics back to step 2: no row twice
    assert [(r["stage"], r.get("episode")) for r in r1] == [(r["stage"], r.get("episode")) for r in r2]
    assert [r["episode"] for r in r2 if r["stage"] == "online" and "episode/turns" in r] == [1, 2, 3, 4]
    assert sum("update/index" in r for r in r2) == 2
    for x, y in zip(r1, r2, strict=True):  # the same decisions, counts and rewards; PPO figures to float noise
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], float):
                rtol = 1e-4 if key.endswith(NORMS) else 1e-5
                np.testing.assert_allclose(y[key], x[key], rtol=rtol, atol=1e-6, err_msg=key)
            else:
                assert x[key] == y[key], key


def test_checkpoint_holds_each_process_users(runs):
    one, two = runs
    (_, _, state1), (_, _, state2) = _final(one), _final(two)
    assert state2["process_count"] == 2 and len(state2["processes"]) == 2
    users = [_memories(p) for p in state2["processes"]]
    assert users[0] and users[1] and not users[0].keys() & users[1].keys()
    assert {**users[0], **users[1]} == _memories(state1)  # the same memories, each with the process of its user
    assert [p["data"]["next"] for p in state2["processes"]] == [2, 2]
    assert state2["metrics_bytes"] == state2["processes"][0]["metrics_bytes"] > 0


def _memories(state: dict) -> dict[str, list[dict]]:
    """The users' memories a checkpoint's state holds, without the wall-clock times of their events and the
    events' store-wide sequence numbers (one store holds users of both processes there: each user's events keep
    their order, the lists below)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("created_at", "at", "valid_to", "seq")}
        return [strip(v) for v in x] if isinstance(x, list) else x

    return {user: [strip(json.loads(line)) for line in text.splitlines()] for user, text in state["memory"].items()}


def test_several_processes_need_the_online_stage_alone_and_whole_groups():
    config = load_config(ROOT / "configs" / "demo.py")
    with pytest.raises(job.ConfigError, match="several processes run the online stage only"):
        check_processes(config, ("synthesize", "warmup", "online"), 2)
    config = load_config(ROOT / "configs" / "demo.py", {"learner.update_every": 2, "learner.users_in_flight": 2})
    with pytest.raises(job.ConfigError, match="multiple of the 2 processes x learner.users_in_flight=2"):
        check_processes(config, ("online",), 2)
    config = load_config(ROOT / "configs" / "demo.py", {"learner.update_every": 4, "data.train_episodes": 9})
    with pytest.raises(job.ConfigError, match="train_episodes=9 must be a multiple of the 2"):
        check_processes(config, ("online",), 2)
    check_processes(load_config(ROOT / "configs" / "demo.py", {"learner.update_every": 4}), ("online",), 2)


def test_mesh_of_several_processes_needs_whole_data_rows(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match="data=1, which is not a multiple of the 2 JAX processes"):
        parallel.process_meshes({"data": 1, "fsdp": -1, "tensor": 1})


def test_checkpoint_of_two_processes_does_not_resume_in_one(tmp_path):
    state = {"process_count": 2, "metrics_bytes": 10, "processes": [{}, {}]}
    with pytest.raises(CheckpointError, match="run of 2 JAX process.*this run has 1"):
        own_state(state, tmp_path / "8")
    assert own_state({"metrics_bytes": 3}, tmp_path) == {"metrics_bytes": 3}
    assert parallel.allgather_objects({"a": 1}) == [{"a": 1}]


def test_minibatch_rows_must_split_over_the_data_axis(tmp_path, monkeypatch):
    class Mesh8:  # what process_meshes would give on 8 devices with data=8
        shape = {"data": 8, "fsdp": 1, "tensor": 1}

    monkeypatch.setattr(parallel, "process_meshes", lambda spec: (Mesh8(), Mesh8()))
    config = load_config(ROOT / "configs" / "demo.py", {"mode": ("online",)})
    with pytest.raises(job.ConfigError, match="minibatch_size=4 cannot be sharded over config.parallel.mesh.data=8"):
        job.validate(config, tmp_path)
    config.rl.ppo.minibatch_size = 16
    assert job.validate(config, tmp_path) == ("online",)
