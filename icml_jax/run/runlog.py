"""Run logging of the main job: metric rows to `metrics.jsonl` and TensorBoard, learning-curve plots, and the
per-session table of the final summary.

Every row goes to both sinks: the JSONL file is the record (strict JSON, one line per row, resumable by byte
offset); TensorBoard (one event directory per stage) is for watching a run live.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from tensorboardX import SummaryWriter

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def json_safe(value: Any) -> Any:
    """NumPy scalars become Python ones and NaN / inf become null, so every line is strict JSON."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _scalar(value: Any) -> float | None:
    """The value as a TensorBoard scalar: finite ints / floats / bools (NumPy ones too), else None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, float)) and math.isfinite(value):
        return float(value)
    return None


class MetricsLog:
    """Writes metric rows to `<workdir>/metrics.jsonl` and to TensorBoard under `<workdir>/tensorboard/<stage>/`.

    To resume a run from a checkpoint, pass the checkpoint's `position()` as `truncate_to` (drops the lines
    written after it) and, per stage, the first TensorBoard step to rewrite as `purge_steps` (TensorBoard hides
    that stage's events at or after it; the stage's automatic step counter also starts there).
    """

    def __init__(self, workdir: str | os.PathLike[str], *, truncate_to: int | None = None,
                 purge_steps: Mapping[str, int] | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / METRICS_FILE
        if truncate_to is not None:
            _truncate(self.path, truncate_to)
        self._purge_steps = dict(purge_steps or {})
        self._steps = dict(self._purge_steps)
        self._writers: dict[str, SummaryWriter] = {}
        self._file: TextIO = self.path.open("a", encoding="utf-8")

    @property
    def steps(self) -> dict[str, int]:
        """The next automatic TensorBoard step per stage (stored with `position()` to resume)."""
        return dict(self._steps)

    def write(self, stage: str, row: Mapping[str, Any], step: int | None = None) -> None:
        """Appends `{"stage": stage, "time": now, **row}` as one line and logs its finite numbers as scalars
        (tag = key) at `step` (None: one past the stage's previous step, 0 or its purge step at first)."""
        now = time.time()
        line = json.dumps(json_safe({"stage": stage, "time": now, **row}), sort_keys=True, allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()
        if step is None:
            step = self._steps.get(stage, 0)
        self._steps[stage] = step + 1
        writer = self._writer(stage)
        for key, value in row.items():
            scalar = _scalar(value)
            if scalar is not None:
                writer.add_scalar(key, scalar, global_step=step, walltime=now)

    def _writer(self, stage: str) -> SummaryWriter:
        """The stage's SummaryWriter, created on first use (with the stage's purge step, if any)."""
        if stage not in self._writers:
            from tensorboardX import SummaryWriter

            self._writers[stage] = SummaryWriter(str(self.workdir / TENSORBOARD_DIR / stage),
                                                 purge_step=self._purge_steps.get(stage))
        return self._writers[stage]

    def position(self) -> int:
        """Flushes both sinks; returns the byte size of metrics.jsonl (the resume point for checkpoints)."""
        self._file.flush()
        for writer in self._writers.values():
            writer.flush()
        return self.path.stat().st_size

    def close(self) -> None:
        """Flushes and closes the file and every writer."""
        self._file.close()
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _truncate(path: Path, size: int) -> None:
    """Cuts `path` to `size` bytes; the cut must fall at the end of a line of an existing, long enough file."""
    actual = path.stat().st_size if path.exists() else 0
    if size == 0 and not path.exists():
        return  # a fresh run: nothing to cut
    if size < 0 or size > actual:
        raise ValueError(f"cannot resume {path} at byte {size}: the file has {actual} bytes; the checkpoint "
                         f"does not belong to this metrics file")
    if size:
        with path.open("rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                raise ValueError(f"cannot resume {path} at byte {size}: not the end of a line; the checkpoint "
                                 f"does not belong to this metrics file")
    os.truncate(path, size)


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl file (blank lines skipped); invalid JSON names the file and line."""
    rows = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: invalid JSON: {e}") from e
    return rows


# ----------------------------------------------------------------------------------------------- plots

LABEL_KEYS = ("planner_precision", "planner_recall", "trigger_recall")
REWARD_KEYS = ("rewards/trigger", "rewards/planner")


def _series(rows: Iterable[Mapping[str, Any]], x: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the rows that have both, finite y only, sorted by x."""
    points = sorted((float(r[x]), float(r[key])) for r in rows
                    if r.get(x) is not None and _scalar(r.get(key)) is not None)
    xs, ys = (np.array(v, dtype=float) for v in zip(*points)) if points else (np.zeros(0), np.zeros(0))
    return xs, ys


def _moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last `window` values (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def _panel(ax: Axes, title: str, xlabel: str, curves: Sequence[tuple[str, np.ndarray, np.ndarray]],
           window: int | None, style: str = "-") -> None:
    """One panel: a line per non-empty curve (moving average when `window`, raw points faint behind it)."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    drawn = [c for c in curves if len(c[1])]
    for label, xs, ys in drawn:
        if window:
            line, = ax.plot(xs, _moving_average(ys, window), label=label)
            ax.plot(xs, ys, ".", color=line.get_color(), alpha=0.25, markersize=3)
        else:
            ax.plot(xs, ys, style, label=label)
    if drawn:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    else:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="gray")


def plot_learning_curves(metrics_path: str | os.PathLike[str], png_path: str | os.PathLike[str], *,
                         window: int = 10) -> Path:
    """Writes a PNG of the run's curves: (a) online per-episode label metrics, (b) online update rewards (both
    moving averages over `window` episodes), (c) held-out evaluations vs episodes seen, (d) warm-up losses."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    rows = read_metrics(metrics_path)
    online = [r for r in rows if r.get("stage") == "online"]
    held_out = [r for r in rows if r.get("stage") == "eval"]
    warm = [r for r in rows if r.get("stage") == "warmup" and "step" in r]
    loss_keys = sorted({k for r in warm for k in r if "loss" in k})
    fig = Figure(figsize=(12, 8), layout="constrained")
    FigureCanvasAgg(fig)
    (a, b), (c, d) = fig.subplots(2, 2)
    _panel(a, f"(a) online episodes: labels (moving avg {window})", "episode",
           [(k, *_series(online, "episode", f"episode/{k}")) for k in LABEL_KEYS], window)
    _panel(b, f"(b) online updates: rewards (moving avg {window})", "episode",
           [(k, *_series(online, "episode", k)) for k in REWARD_KEYS], window)
    _panel(c, "(c) held-out evaluation", "episodes seen",
           [(k, *_series(held_out, "episodes_seen", f"eval/{k}")) for k in LABEL_KEYS], None, "o-")
    _panel(d, "(d) warm-up losses", "step", [(k, *_series(warm, "step", k)) for k in loss_keys], None)
    out = Path(png_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


# ----------------------------------------------------------------------------------------------- session table

PHASES = {  # phase -> (column header, row key, format) per column
    "before": (("prec", "planner_precision", ".3f"), ("rec", "planner_recall", ".3f"),
               ("trig", "trigger_recall", ".3f")),
    "after": (("prec", "planner_precision", ".3f"), ("rec", "planner_recall", ".3f"),
              ("trig", "trigger_recall", ".3f")),
    "online": (("r_trig", "reward_trigger", "+.3f"), ("r_proxy", "reward_proxy", "+.3f"),
               ("dec", "decisions", ".0f")),
}
CELL = 8  # characters per value column


def _cell(value: Any, fmt: str) -> str:
    """A value formatted right-aligned in CELL characters; "-" for None / NaN / missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-".rjust(CELL)
    return format(value, fmt).rjust(CELL)


def session_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """A fixed-width table, one line per session number, columns per phase present (before / after: planner
    precision, recall, trigger recall; online: mean rewards and decisions). Rows whose "table" is not
    "sessions" are ignored; a later row for the same phase and session replaces an earlier one."""
    cells: dict[tuple[str, int], Mapping[str, Any]] = {}
    for row in rows:
        if row.get("table", "sessions") != "sessions":
            continue
        if row["phase"] not in PHASES:
            raise ValueError(f"session row with unknown phase {row['phase']!r}; phases are {tuple(PHASES)}")
        cells[(row["phase"], int(row["session"]))] = row
    phases = [p for p in PHASES if any(q == p for q, _ in cells)]
    sessions = sorted({s for _, s in cells})
    groups = "session" + "".join(f" | {p:^{len(PHASES[p]) * CELL}}" for p in phases)
    header = " " * 7 + "".join(" | " + "".join(h.rjust(CELL) for h, _, _ in PHASES[p]) for p in phases)
    lines = [groups, header, "-" * len(header)]
    for s in sessions:
        line = f"{s:>7}"
        for p in phases:
            row = cells.get((p, s), {})
            line += " | " + "".join(_cell(row.get(key), fmt) for _, key, fmt in PHASES[p])
        lines.append(line)
    return "\n".join(line.rstrip() for line in lines)
