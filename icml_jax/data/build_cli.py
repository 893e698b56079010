"""Builds one of the episode datasets from a manual directory, without TensorFlow (``tfds build`` needs it).

    python -m icml_jax.data.build_cli --dataset=gapchat_episodes/protocol \
        --manual_dir=/path/to/gap_chat --data_dir=~/tensorflow_datasets [--skip_malformed]

Prints each split's parse report (what was read, kept, skipped and dropped). Uses argparse rather than
absl flags so that importing it defines no process-wide flags.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from icml_jax.data.tfds_builders import build


def main(argv: Sequence[str] | None = None) -> int:
    """Builds the dataset named on the command line and prints the per-split reports."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="builder/config, e.g. msc_episodes/parlai")
    parser.add_argument("--manual_dir", required=True, help="folder holding the downloaded raw files")
    parser.add_argument("--data_dir", required=True, help="TFDS data dir to write into")
    parser.add_argument("--skip_malformed", action="store_true", help="skip and count malformed records")
    args = parser.parse_args(argv)
    builder = build(args.dataset, manual_dir=args.manual_dir, data_dir=args.data_dir, skip_malformed=args.skip_malformed)
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
