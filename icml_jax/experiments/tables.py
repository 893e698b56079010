"""An experiment's numbers as files: `<name>.json` (every number per variant and seed, with its provenance),
`<name>.md` (the paper's table layout, mean and spread over seeds) and, where the paper has a figure, `<name>.png`
(or `<name>_<key>.png`, one per figure, where it has several).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icml_jax.evaluation.report import LIKELIHOOD, TABLE1, TABLE8

PERCENT = frozenset(TABLE8) | {"save_rate", "warmup_trigger_acc"}  # fractions shown as percent
JUDGE_COLUMNS = TABLE1[4:]
DIGITS = {name: 4 for name in LIKELIHOOD}  # decimals shown where two are too few (nats per token)


def metrics_of(content: Mapping[str, Any]) -> dict[str, float | None]:
    """The flat numbers of one evaluation's results.json that the experiment tables use."""
    gen, mem, eff = content["generation"], content["memory"], content["efficiency"]
    out: dict[str, float | None] = {c: gen.get(c) for c in (*TABLE1, *LIKELIHOOD)}
    out.update({k: mem.get(k) for k in (*TABLE8, "save_rate")})
    out["proxy_truth_r"] = (mem.get("proxy_truth") or {}).get("r")
    out["prompt_tokens"] = eff.get("inference_tokens_per_reply")
    out["memory_tokens"] = eff.get("memory_tokens_per_reply")
    storage = [s for s in eff.get("storage_tokens_per_session") or [] if s is not None]
    out["storage_tokens"] = storage[-1] if storage else None
    out["retrieval_ms"] = (eff.get("retrieval_ms") or {}).get("p50")
    out["construction_ms"] = (eff.get("construction_ms") or {}).get("p50")
    return out


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(float(v))]


def aggregate(per_seed: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    """{metric: {"mean", "sd" (sample, ddof 1; None for one seed), "n"}} over the seeds that have a number."""
    keys = dict.fromkeys(k for m in per_seed.values() for k in m)
    out = {}
    for k in keys:
        xs = _finite([m.get(k) for m in per_seed.values()])
        out[k] = {"mean": float(np.mean(xs)) if xs else None,
                  "sd": float(np.std(xs, ddof=1)) if len(xs) > 1 else None, "n": len(xs)}
    return out


@dataclasses.dataclass
class Report:
    """One experiment's result: rows (variant -> seed -> metrics) in the order shown, the columns of the table
    (metric key -> header), notes on what the setting can and cannot show, and an optional figure."""

    name: str
    title: str
    reproduces: str  # the paper's table or figure
    columns: dict[str, str]
    rows: dict[str, dict[int, dict[str, Any]]]
    notes: list[str] = dataclasses.field(default_factory=list)
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)  # variant -> files, configs, runs
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # experiment-specific numbers (JSON only)
    figure: Callable[[Path], None] | None = None
    row_header: str = "system"
    figures: dict[str, Callable[[Path], None]] = dataclasses.field(default_factory=dict)  # key -> draws
    # `<name>_<key>.png` (experiments reproducing several of the paper's figures)
    sections: list[str] = dataclasses.field(default_factory=list)  # markdown after the notes (e.g. the paper's
    # numbers, in tables of their own)


def cell(stats: Mapping[str, Any] | None, key: str, seeds: int = 1) -> str:
    """'mean ± sd' (percent for fractions), '(n=k)' when only k of the `seeds` runs have a number, '-' when none
    has."""
    if not stats or stats.get("mean") is None:
        return "-"
    scale, digits = (100.0 if key in PERCENT else 1.0), DIGITS.get(key, 2)
    text = f"{scale * stats['mean']:.{digits}f}"
    text += f" ± {scale * stats['sd']:.{digits}f}" if stats.get("sd") is not None else ""
    return text + (f" (n={stats['n']})" if stats.get("n", seeds) < seeds else "")


def markdown(report: Report, setting: Mapping[str, Any], command: str) -> str:
    """The table in the paper's layout with the command and setting that produced it."""
    seeds = sorted({s for per in report.rows.values() for s in per})
    lines = [f"# {report.title}", "", f"Reproduces the paper's {report.reproduces}.", "",
             f"Command: `{command}`", "",
             f"Setting: data {setting.get('data')}; model {setting.get('model')}; generator {setting.get('generator')}; "
             f"judge {setting.get('judge')}; seeds {seeds} (cells: mean ± sample sd over seeds, (n=k) when only k "
             "seeds have the number; percent where the metric is a rate).", "",
             f"| {report.row_header} | " + " | ".join(report.columns.values()) + " |",
             "|---|" + "---:|" * len(report.columns)]
    for variant, per_seed in report.rows.items():
        stats = aggregate(per_seed)
        lines.append(f"| {variant} | " + " | ".join(cell(stats.get(k), k, len(per_seed)) for k in report.columns)
                     + " |")
    if report.notes:
        lines += [""] + [f"- {n}" for n in report.notes]
    for section in report.sections:
        lines += ["", section.rstrip("\n")]
    lines.append("")
    return "\n".join(lines)


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return _json_safe(x.item())
    if isinstance(x, Path):
        return str(x)
    return x


def write(report: Report, out_dir: Path, setting: Mapping[str, Any], command: str) -> dict[str, Path]:
    """Writes `<name>.json`, `<name>.md` and the figure (`<name>.png`) into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": out_dir / f"{report.name}.json", "md": out_dir / f"{report.name}.md"}
    content = {"experiment": report.name, "reproduces": report.reproduces, "command": command,
               "setting": dict(setting), "columns": report.columns,
               "rows": {v: {"per_seed": per, "aggregate": aggregate(per)} for v, per in report.rows.items()},
               "notes": report.notes, "provenance": report.provenance, "extra": report.extra}
    files["json"].write_text(json.dumps(_json_safe(content), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    files["md"].write_text(markdown(report, setting, command), encoding="utf-8")
    if report.figure is not None or report.figures:
        import matplotlib

        matplotlib.use("Agg")
    if report.figure is not None:
        files["png"] = out_dir / f"{report.name}.png"
        report.figure(files["png"])
    for key, draw in report.figures.items():
        files[f"png_{key}"] = out_dir / f"{report.name}_{key}.png"
        draw(files[f"png_{key}"])
    return files


__all__ = ["DIGITS", "JUDGE_COLUMNS", "PERCENT", "Report", "aggregate", "cell", "markdown", "metrics_of", "write"]
