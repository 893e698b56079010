"""checkpoint.online.export_policy: a step of an online run's checkpoints becomes a policy file that restores, in
`load_warmup`, exactly the parameters that step saved."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx

from icml_jax.checkpoint import TRAINABLE, CheckpointError, RunCheckpointer, flat_arrays, load_warmup
from icml_jax.checkpoint.online import export_policy
from tests.checkpoint.test_policy_file import _policies
from tests.scripts_loader import load_script


def _params(policies) -> dict[str, np.ndarray]:
    return flat_arrays(nnx.state(policies, TRAINABLE))


def _run_checkpoints(directory, steps) -> None:
    """Checkpoints as OnlineCheckpoint.save writes them (the learner's array keys and counters)."""
    with RunCheckpointer(directory, async_save=False) as ckpt:
        for step, policies in steps.items():
            arrays = {"params": _params(policies), "rest": {"x": np.zeros(2)}, "optimizer": {"0": np.ones(3)},
                      "agent_key": np.arange(2, dtype=np.uint32)}
            ckpt.save(step, arrays, {"counters": {"episodes_seen": step, "updates": 10 * step}})


def test_an_exported_step_restores_that_steps_parameters_and_counts(tmp_path):
    steps = {1: _policies(1), 2: _policies(2)}
    _run_checkpoints(tmp_path / "checkpoints", steps)
    out = export_policy(tmp_path / "checkpoints", 1, tmp_path / "policy1")
    fresh = _policies(3)
    meta = load_warmup(out, fresh)
    want, got = _params(steps[1]), _params(fresh)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    assert not all(np.array_equal(got[k], _params(steps[2])[k]) for k in want)  # step 1's, not the newest
    assert (meta["stage"], meta["episodes"], meta["updates"]) == ("online", 1, 10)
    assert meta["exported_from"] == str((tmp_path / "checkpoints" / "1").absolute())
    assert json.loads((out / "warmup.json").read_text())["params"].keys() == want.keys()
    with pytest.raises(CheckpointError, match=r"no complete checkpoint at step 5; steps kept: \[1, 2\]"):
        export_policy(tmp_path / "checkpoints", 5, tmp_path / "policy5")
    assert not (tmp_path / "policy5").exists()


def test_the_script_lists_the_steps_and_writes_one(tmp_path, capsys):
    script = load_script("export_policy")
    _run_checkpoints(tmp_path / "run" / "checkpoints", {3: _policies(1), 4: _policies(2)})
    assert script.main(["--run", str(tmp_path / "run")]) == 0
    listed = capsys.readouterr().out
    assert "steps kept in" in listed and listed.strip().endswith("[3, 4]")
    assert script.main(["--run", str(tmp_path / "run"), "--step", "3"]) == 0
    fresh = _policies(5)
    assert load_warmup(tmp_path / "run" / "policy_3", fresh)["episodes"] == 3
    assert all(np.array_equal(v, _params(_policies(1))[k]) for k, v in _params(fresh).items())
    assert script.main(["--run", str(tmp_path / "run"), "--step", "9"]) == 2
    assert "no complete checkpoint at step 9" in capsys.readouterr().err
    assert script.main(["--run", str(tmp_path / "nowhere")]) == 2
