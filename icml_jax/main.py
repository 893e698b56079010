"""The main job: `python -m icml_jax.main --config=configs/demo.py --workdir=/tmp/icml_demo`.

Checks the whole config first (one `ConfigError` naming the field, before any stage runs), then runs the
stages of `config.mode` in order (synthesize -> warmup -> online), each with a progress bar; every metric row
goes to `<workdir>/metrics.jsonl` and TensorBoard event files under `<workdir>/tensorboard`, and a summary, a
per-session table and `<workdir>/learning_curves.png` come at the end.

Runs resume: a finished stage is recorded in `<workdir>/progress.json` (with the metrics file's length then),
and the online stage saves Orbax checkpoints of its whole state every `config.checkpoint.every_episodes`
episodes. Starting again with the same workdir (and the same config) skips finished stages, restores the latest
complete checkpoint, cuts the metrics back to that point and replays from there, so the run ends as an
uninterrupted one would.
"""

# An entry point only (this command, notebooks' `from icml_jax.main import run`, scripts): no library module
# imports it. `run` and the report are `icml_jax.run.pipeline`'s (the experiments call it in-process); the other
# parts are in `icml_jax.run` too: `cli` (flags, one-line errors), `runspec` (typed configs), `validation`,
# `workdir` (files, progress, resume points), `builders` (models) and `stages/` (one module per stage). The
# docstring above is `--help`'s text.

from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import app, flags

from icml_jax.run import cli
from icml_jax.configlib import ConfigError
from icml_jax.run.pipeline import run
from icml_jax.run.stages import STAGES
from icml_jax.run.validation import validate

__all__ = ["ConfigError", "STAGES", "main", "run", "validate"]

flags.adopt_module_key_flags(cli)  # --help lists --config / --workdir / --debug (defined in icml_jax.run.cli)


def main(argv: Sequence[str]) -> None:
    """absl entry point: a user error (config, data, checkpoint, back end, divergence) exits with one line and
    status 2; `--debug` shows its traceback."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if cli.CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/demo.py")
    cli.quiet_info_logs()
    sys.unraisablehook = cli.ignoring_closed_event_loops(sys.unraisablehook)  # a damaged checkpoint: one line, no tail
    try:
        run(cli.CONFIG.value, cli.WORKDIR.value or "")
    except Exception as exc:
        cause = cli.user_error(exc)
        if cause is None:
            raise
        cli.fail("config" if isinstance(cause, ConfigError) else "run", exc, cli.DEBUG.value)


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
