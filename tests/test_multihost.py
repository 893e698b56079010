"""Two local processes (2 fake CPU devices each) joined by jax.distributed on a loopback coordinator with gloo.

They load one checkpoint onto a mesh spanning both, run a sharded forward and one LoRA step, and must agree with
each other, with their own single-device runs, and with `transformers`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import portpicker
import pytest

from tests.models import hf_fixtures as F

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Builds the checkpoint, runs both workers, returns (results per process, torch model, output dir)."""
    ckpt, out = tmp_path_factory.mktemp("ckpt"), tmp_path_factory.mktemp("out")
    torch_model = F.build("llama", ckpt)
    port = portpicker.pick_unused_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    for proxy in [k for k in env if "proxy" in k.lower()]:
        env.pop(proxy)  # loopback only
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "multihost_worker.py"), str(i), str(port),
                               str(ckpt), str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"multi-host workers did not finish within {TIMEOUT_S} s")
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {i} failed (exit {p.returncode}):\n{log[-4000:]}"
    results = [dict(np.load(out / f"result_{i}.npz")) for i in range(2)]
    return results, torch_model, out


def test_processes_share_one_mesh(run):
    results, _, _ = run
    for r in results:
        assert list(r["spans"]) == [0, 1]  # the q kernel's shards live on devices of both processes


def test_sharded_forward_agrees_across_processes_and_with_single_device(run):
    (r0, r1), torch_model, _ = run
    np.testing.assert_array_equal(r0["logits"], r1["logits"])
    from tests.lora_helpers import token_batch

    ids, mask = token_batch(batch=4, vocab=97)
    real = mask.astype(bool)
    diff = np.abs(r0["logits"] - r0["ref/logits"])[real].max()
    print(f"multi-host logits vs single device: {diff:.2e}")
    assert diff <= 1e-5
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ref = F.torch_logits(torch_model, ids, mask, positions)
    assert np.abs(ref - r0["logits"])[real].max() <= 1e-4


def test_lora_step_agrees_across_processes_and_with_single_device(run):
    (r0, r1), _, out = run
    keys = [k for k in r0 if k.startswith("adapter/")]
    assert len(keys) == 2 * 7  # A and B of 7 projections, stacked over the 3 layers
    worst = 0.0
    for k in keys + ["loss"]:
        np.testing.assert_array_equal(r0[k], r1[k])
        worst = max(worst, float(np.abs(r0[k] - r0["ref/" + k]).max()))
    print(f"multi-host LoRA step vs single device: {worst:.2e}")
    assert worst <= 1e-5
    from icml_jax.models.safetensors_io import SafetensorsFile

    saved = SafetensorsFile(out / "adapters" / "adapters.safetensors")
    assert len(saved.keys()) == 3 * len(keys)  # the file names adapters per layer
    np.testing.assert_array_equal(saved.get("layers.2.mlp.down_lora_b"), r0["adapter/layers.mlp.down_lora_b"][2])
