"""Runs `python -m icml_jax.main` in a subprocess for the kill-and-resume test.

With KILL_AT_SAVE=N in the environment, the process SIGKILLs itself right after its N-th online checkpoint
save has started (the save is asynchronous, so the kill lands while that checkpoint is being written) and
first prints the checkpoint directory's listing, so the test can see the half-written step.
"""

from __future__ import annotations

import os
import signal
import sys

from absl import app

from icml_jax import main
from icml_jax import checkpoint

KILL_AT_SAVE = int(os.environ.get("KILL_AT_SAVE", "0"))
_saves = 0
_save = checkpoint.RunCheckpointer.save


def _save_then_die(self: checkpoint.RunCheckpointer, step: int, arrays, state) -> None:
    global _saves
    _save(self, step, arrays, state)
    _saves += 1
    if _saves == KILL_AT_SAVE:
        print(f"KILLED-WHILE-SAVING step={step} listing={sorted(os.listdir(self.directory))}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    checkpoint.RunCheckpointer.save = _save_then_die
    app.run(main.main)
