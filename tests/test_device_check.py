"""scripts/device_check.sh runs every row of the GPU check at toy sizes on CPU and prints the whole table (the
figures of a smoke run mean nothing; this keeps the script working between the sessions that have a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_device_check_runs_every_row_at_toy_sizes():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--smoke", "--dtype", "float32"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout[out.stdout.index("| measure |"):].splitlines()[2:]
    measures = [line.split(" | ")[0].lstrip("| ") for line in table]
    assert measures == ["float32 matmul peak (jitted n^3)", "toy prefill b1 x 32", "toy decode b1, 8 + 8 new",
                        "toy PPO update, 2 slots x (1 + 4) rows x 32", "toy Trigger decision, 4 options x 32",
                        "toy Planner decision, 1 x 32"]
    assert all("MFU" in line for line in table if "PPO" in line)
