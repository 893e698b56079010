"""One process of the main job's online stage in a run of one or two local JAX processes (loopback coordinator,
gloo CPU collectives), for tests/test_main_multihost.py.

Usage: python tests/main_multihost_worker.py PROCESS_ID NUM_PROCESSES PORT DEVICES WORKDIR INIT_FROM.
Each process owns DEVICES fake CPU devices; the run is configs/demo.py's online stage from the warm-up in
INIT_FROM, with the mesh (data 4) spanning all processes. With KILL_AT_SAVE=N in the environment the process
SIGKILLs itself once its N-th checkpoint is on disk in every process (they save at the same steps). A process
that is still waiting on the coordination service when the leader (process 0) dies is aborted by XLA (SIGABRT)
before it reaches its own kill: the same end for the run.
"""

from __future__ import annotations

import os
import signal
import sys

PROCESS_ID, COUNT, PORT, DEVICES, WORKDIR, INIT_FROM = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                                        int(sys.argv[4]), sys.argv[5], sys.argv[6])
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}"

from pathlib import Path  # noqa: E402

from jax.experimental import multihost_utils  # noqa: E402

from icml_jax import main  # noqa: E402
from icml_jax.configlib import load_config  # noqa: E402
from icml_jax import checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# 4 episodes in updates of 2 (2 users in flight in one process, 1 on each of 2), a checkpoint after each update
OVERRIDES = {"mode": ("online",), "online.init_from": INIT_FROM, "data.train_episodes": 4, "data.eval_episodes": 2,
             "learner.update_every": 2, "learner.users_in_flight": 2 // COUNT,
             "checkpoint.every_episodes": 2, "checkpoint.keep": 3,
             "parallel.mesh.data": 4, "parallel.mesh.fsdp": 1, "parallel.mesh.tensor": 1}
KILL_AT_SAVE = int(os.environ.get("KILL_AT_SAVE", "0"))


def _die_after(save, n: int):
    count = 0

    def wrapped(self, step, arrays, state):
        nonlocal count
        save(self, step, arrays, state)
        count += 1
        if count == n:
            self.wait()  # on disk: the restart resumes from this step
            print(f"process {PROCESS_ID}: save {n} (step {step}) on disk", flush=True)
            if COUNT > 1:  # no process is killed before every process's part of the checkpoint is written
                multihost_utils.sync_global_devices(f"killed after save {n}")
            print(f"process {PROCESS_ID}: killed after save {n} (step {step})", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return wrapped


def run() -> None:
    overrides = dict(OVERRIDES)
    if COUNT > 1:
        overrides.update({"parallel.distributed.coordinator_address": f"127.0.0.1:{PORT}",
                          "parallel.distributed.num_processes": COUNT, "parallel.distributed.process_id": PROCESS_ID,
                          "parallel.distributed.cpu_collectives": "gloo",
                          "parallel.distributed.initialization_timeout": 60})
    if KILL_AT_SAVE:  # every process: they save at the same steps
        checkpoint.RunCheckpointer.save = _die_after(checkpoint.RunCheckpointer.save, KILL_AT_SAVE)
    config = load_config(ROOT / "configs" / "demo.py", overrides)
    main.run(config, WORKDIR)
    print(f"process {PROCESS_ID}: done", flush=True)


if __name__ == "__main__":
    run()
