"""Whether two runs wrote the same metrics, value for value: each row of one `metrics.jsonl` against the same row
of the other, timings and paths aside. The check that a refactor left behaviour unchanged (issue 55): run the
demo at the old commit and at the new one into two workdirs, then

    python scripts/compare_metrics.py /tmp/demo_old /tmp/demo_new

Prints every difference (row, key, both values) and exits 1 if there is one, 0 if none. A key is a timing when
its last part names a duration or a rate (`TIMING_WORDS`); each run's own workdir in a string reads as "<workdir>",
and any other string starting with "/" or "~" is a path and left out. Numbers must be equal exactly unless `--rtol` allows more (bitwise equality is what an unchanged
program on the same host gives).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from icml_jax.evaluation.report import read_jsonl

METRICS = "metrics.jsonl"
TIMING_WORDS = ("seconds", "second", "time", "wall", "ms", "latency", "per_s", "throughput", "elapsed",
                "duration")


def is_timing(key: str) -> bool:
    """Whether a flattened key (dotted / slashed) names a duration or a rate: its last part holds a timing word
    as one of its `_`-separated words."""
    last = key.replace("/", ".").split(".")[-1].lower()
    words = last.split("_")
    return any(w in words for w in TIMING_WORDS) or last.endswith("per_s")


def is_path(value: Any) -> bool:
    """A string that names a file-system location (differs between two workdirs by construction)."""
    return isinstance(value, str) and value.startswith(("/", "~"))


def with_workdir(rows: list[dict[str, Any]], workdir: Path) -> list[dict[str, Any]]:
    """The rows with the run's workdir (as given and absolute) written "<workdir>" in every string."""
    names = sorted({str(workdir), str(workdir.resolve())}, key=len, reverse=True)

    def fix(x: Any) -> Any:
        if isinstance(x, str):
            for name in names:
                x = x.replace(name, "<workdir>")
            return x
        if isinstance(x, Mapping):
            return {k: fix(v) for k, v in x.items()}
        return [fix(v) for v in x] if isinstance(x, list) else x

    return [fix(row) for row in rows]


def flatten(row: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf value) of a JSON row; lists are indexed ("a.0")."""
    if isinstance(row, Mapping):
        for k, v in row.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(row, list):
        for i, v in enumerate(row):
            yield from flatten(v, f"{prefix}.{i}")
    else:
        yield prefix, row


def same(a: Any, b: Any, rtol: float) -> bool:
    """Equal leaves: numbers within `rtol` (NaN equals NaN), anything else exactly."""
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if numbers:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=rtol, abs_tol=0.0)
    return a == b


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl (`path` is the file or the run's workdir), naming a bad line."""
    return read_jsonl(path / METRICS if path.is_dir() else path)


def differences(old: list[dict[str, Any]], new: list[dict[str, Any]], rtol: float = 0.0) -> list[str]:
    """Every difference between two runs' rows, timings and paths aside, one line each."""
    out = []
    if len(old) != len(new):
        out.append(f"row count: {len(old)} != {len(new)}")
    for i, (a, b) in enumerate(zip(old, new)):
        fa = {k: v for k, v in flatten(a) if not is_timing(k) and not is_path(v)}
        fb = {k: v for k, v in flatten(b) if not is_timing(k) and not is_path(v)}
        for key in sorted(fa.keys() | fb.keys()):
            if key not in fa or key not in fb:
                out.append(f"row {i}: {key}: only in {'old' if key in fa else 'new'}")
            elif not same(fa[key], fb[key], rtol):
                out.append(f"row {i}: {key}: {fa[key]!r} != {fb[key]!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Compare two runs; print the differences; 1 if any."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="a run's workdir (or its metrics.jsonl)")
    parser.add_argument("new", type=Path, help="the other run's workdir (or its metrics.jsonl)")
    parser.add_argument("--rtol", type=float, default=0.0, help="relative tolerance on numbers (default: exact)")
    args = parser.parse_args(argv)
    roots = [p.parent if p.name == METRICS else p for p in (args.old, args.new)]
    old, new = (with_workdir(read_rows(p), root) for p, root in zip((args.old, args.new), roots))
    diffs = differences(old, new, args.rtol)
    for line in diffs:
        print(line)
    compared = sum(1 for row in old for k, v in flatten(row) if not is_timing(k) and not is_path(v))
    print(f"{len(old)} / {len(new)} rows, {compared} values compared (timings and paths aside): "
          f"{len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
