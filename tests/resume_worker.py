"""Runs `python -m icml_jax.main` in a subprocess for the kill-and-resume test.

With KILL_AT_SAVE=N in the environment, the process SIGKILLs itself while its N-th online checkpoint is being
written: when Orbax is about to commit that step (rename its temporary directory), wherever the commit runs
(the save is asynchronous), so the kill always lands on a half-written step. It first prints the checkpoint
directory's listing, so the test can see that step's temporary directory.
"""

from __future__ import annotations

import os
import signal
import sys

from absl import app
from orbax.checkpoint._src.path import atomicity  # test-only: the commit step of Orbax's atomic save

from icml_jax import main
from icml_jax import checkpoint

KILL_AT_SAVE = int(os.environ.get("KILL_AT_SAVE", "0"))
_saves = 0
_armed: tuple[int, str] | None = None  # (step, checkpoint directory) of the save to die in
_save = checkpoint.RunCheckpointer.save
_finalize = atomicity.AtomicRenameTemporaryPath.finalize


def _count_saves(self: checkpoint.RunCheckpointer, step: int, arrays, state) -> None:
    global _saves, _armed
    _saves += 1
    if _saves == KILL_AT_SAVE:
        _armed = (step, str(self.directory))
    _save(self, step, arrays, state)


async def _die_before_commit(self, *args, **kwargs):
    if _armed is not None and self.get_final().name == str(_armed[0]):  # that step's commit, not an earlier one's
        step, directory = _armed
        print(f"KILLED-WHILE-SAVING step={step} listing={sorted(os.listdir(directory))}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return await _finalize(self, *args, **kwargs)


if __name__ == "__main__":
    checkpoint.RunCheckpointer.save = _count_saves
    atomicity.AtomicRenameTemporaryPath.finalize = _die_before_commit
    app.run(main.main)
