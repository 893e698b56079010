"""Builds one of the episode datasets from a manual directory, without TensorFlow (``tfds build`` needs it).

    python -m icml_jax.data.build_cli --dataset=gapchat_episodes/protocol \
        --manual_dir=/path/to/gap_chat --data_dir=~/tensorflow_datasets [--skip_malformed] [--debug]
    python -m icml_jax.data.build_cli --dataset=locomo_episodes/locomo7 \
        --manual_dir=../shared/data/locomo --data_dir=/tmp/tfds    # locomo_episodes/full: locomo10.json

Prints each split's parse report (what was read, kept, skipped and dropped). A user error (unknown dataset,
missing folder or file, a file that is not UTF-8 or not JSON, a malformed record) ends in one line on stderr
and exit status 2; ``--debug`` re-raises it with its traceback. Uses argparse rather than absl flags so that
importing it defines no process-wide flags.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from icml_jax.data.report import DataError, SourceDataError
from icml_jax.data.tfds_builders import build

SKIP_FLAG_HINT = "pass --skip_malformed to skip and count it"

# What this command treats as the user's doing: our data errors, and files or folders it cannot read or write.
USER_ERRORS: tuple[type[BaseException], ...] = (DataError, OSError)


def error_line(e: BaseException) -> str:
    """One line for a user error: a malformed record's hint names this command's flag; newlines are folded."""
    text = e.describe(SKIP_FLAG_HINT) if isinstance(e, SourceDataError) else str(e)
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Builds the dataset named on the command line and prints the per-split reports; 2 on a user error."""
    parser = argparse.ArgumentParser(prog="icml_jax.data.build_cli", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="builder/config, e.g. msc_episodes/parlai")
    parser.add_argument("--manual_dir", required=True, help="folder holding the downloaded raw files")
    parser.add_argument("--data_dir", required=True, help="TFDS data dir to write into")
    parser.add_argument("--skip_malformed", action="store_true", help="skip and count malformed records")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error")
    args = parser.parse_args(argv)
    try:
        builder = build(
            args.dataset, manual_dir=args.manual_dir, data_dir=args.data_dir, skip_malformed=args.skip_malformed
        )
    except USER_ERRORS as e:
        if args.debug:
            raise
        print(f"{parser.prog}: error: {error_line(e)}", file=sys.stderr)
        return 2
    if not builder.reports:  # already built earlier: show the reports saved with it
        for key, saved in builder.info.metadata.items():
            print(f"{builder.name}/{builder.builder_config.name} {key} (saved): {saved}")
    for split, report in builder.reports.items():
        print(f"{builder.name}/{builder.builder_config.name} {split}: {report.summary()}")
        for rec in report.malformed_skipped:
            print(f"  skipped {rec.path}, {rec.location}: {rec.reason}")
    print(f"written to {builder.data_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
