"""Writes one step of an online run's checkpoints as a policy file, so that `python -m icml_jax.evaluate
--checkpoint=OUT` evaluates the policy as it stood after that step's updates (a held-out curve update by update,
separating the policy from the episodes it played).

    python scripts/export_policy.py --run /runs/w --step 2 --out /runs/w/policy_after_2
    python scripts/export_policy.py --run /runs/w          # lists the steps kept (config.checkpoint.keep)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from icml_jax.checkpoint import CheckpointError, RunCheckpointer
from icml_jax.checkpoint.online import export_policy
from icml_jax.run.workdir import CHECKPOINT_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the online run's workdir (its checkpoints/ directory)")
    parser.add_argument("--step", type=int, default=None, help="the checkpoint step (episodes seen)")
    parser.add_argument("--out", default=None, help="the policy directory to write (default: <run>/policy_<step>)")
    args = parser.parse_args(argv)
    directory = Path(args.run) / CHECKPOINT_DIR
    if not directory.is_dir():
        print(f"export error: {directory} does not exist (not an online run's workdir?)", file=sys.stderr)
        return 2
    if args.step is None:
        with RunCheckpointer(directory, async_save=False) as ckpt:
            print(f"steps kept in {directory}: {ckpt.all_steps()}")
        return 0
    out = Path(args.out) if args.out else Path(args.run) / f"policy_{args.step}"
    try:
        print(export_policy(directory, args.step, out))
    except CheckpointError as exc:
        print(f"export error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
