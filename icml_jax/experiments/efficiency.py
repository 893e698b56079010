"""The paper's efficiency figures from evaluations already run: per session, the generator's tokens and the
stored tokens (Figure 9), memory construction and retrieval latency (Figure 10) and the total processing time
(Figure 15), for ours and every baseline; the three PNGs in the paper's layout, and the paper's own numbers in
tables of their own beside ours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icml_jax.experiments.tables import Report, aggregate, cell

COLUMNS = {"inference_tokens": "inference tok", "storage_tokens": "stored tok",
           "construction_ms": "construction ms / session", "construction_ms_per_turn": "construction ms / turn",
           "retrieval_ms": "retrieval ms / call", "processing_ms": "processing ms"}
PAPER_SYSTEMS = {"ICML": "ours", "THEANINE": "theanine", "MemoryOS": "memoryos"}  # the paper's name -> ours
PAPER_SOURCE = ("the paper (arXiv 2609.17088v1) as transcribed in shared/docs/paper_numbers.md; these figures "
                "compare ICML with THEANINE and MemoryOS only, and the transcription does not name their dataset "
                "or generator")
# Figure 10's "~x ms" annotations: assigned to panels by where they are printed and to methods by size ("?")
PAPER_FIGURE10 = {"ICML": ("~63?", "~13?"), "THEANINE": ("~10820?", "~893?"), "MemoryOS": ("~3921?", "~53?")}
# Figure 15, seconds per session: (ICML, THEANINE, MemoryOS); "a or b ?" where the grouping is not recoverable
PAPER_FIGURE15 = (("52.74", "9.95 or 6.82 ?", "9.95 or 6.82 ?"),
                  ("14.14?", "51.88 or 20.45 ?", "51.88 or 20.45 ?"),
                  ("13.93?", "85.39 or 62.82 ?", "85.39 or 62.82 ?"),
                  ("13.47?", "116.26?", "57.56?"),
                  ("10.22", "181.79?", "826.61"))
PAPER_FIGURE15_NOTE = "80.88x reduction (826.61 / 10.22: MemoryOS against ICML at session 5)"
PAPER_FIGURE9 = ("no values recoverable: the transcribed text holds only the axis ticks (1000 to 10000) and the "
                 "legend (THEANINE, MemoryOS, ICML)")


def per_session_of(content: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """The per-session efficiency rows of one results.json content; a file written before the evaluation recorded
    them is an error naming it and what to do."""
    rows = (content.get("efficiency") or {}).get("per_session")
    if not rows:
        raise ValueError(f"{where}: no per-session efficiency (efficiency.per_session); it was written before the "
                         "evaluation recorded it. Delete that results.json and rerun: the evaluation is redone "
                         "from its trained run and the cached back-end answers")
    return list(rows)


def _row(system: str, session: int) -> str:
    return f"{system}, session {session}"


def _series(report: Report, system: str, sessions: Sequence[int], key: str) -> list[float]:
    """A system's per-session means over seeds (NaN where no seed has the number)."""
    out = []
    for n in sessions:
        m = aggregate(report.rows.get(_row(system, n), {})).get(key, {}).get("mean")
        out.append(np.nan if m is None else float(m))
    return out


TOTALS = {"history_tokens": "inference tok, history sessions", "final_tokens": "inference tok, final session",
          "stored_tokens": "stored tok, last history session", "construction_ms": "construction ms / session",
          "retrieval_ms": "retrieval ms / call", "processing_ms": "processing ms / episode"}


def _totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """One seed's per-episode figures from its per-session rows: tokens and processing time summed over sessions,
    construction and retrieval averaged over the sessions that have them, the stored tokens at the end."""
    def values(key: str, which: Sequence[Mapping[str, Any]]) -> list[float]:
        return [float(r[key]) for r in which if r.get(key) is not None]

    history, final = list(rows[:-1]), list(rows[-1:])
    stored, seconds = values("storage_tokens", history), values("processing_s", rows)
    out = {"history_tokens": sum(values("inference_tokens", history)) if values("inference_tokens", history)
           else None, "final_tokens": (values("inference_tokens", final) or [None])[0],
           "stored_tokens": stored[-1] if stored else None,
           "processing_ms": 1e3 * sum(seconds) if seconds else None}
    for key in ("construction_ms", "retrieval_ms"):
        xs = values(key, rows)
        out[key] = float(np.mean(xs)) if xs else None
    return out


def _totals_table(contents: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]]) -> str:
    """Per system, the per-episode figures of `_totals` (mean ± sd over seeds)."""
    lines = ["### Per episode", "", "Tokens and processing time summed over the sessions, construction (history "
             "sessions) and retrieval (all sessions) averaged over them; mean ± sample sd over seeds.", "",
             "| system | " + " | ".join(TOTALS.values()) + " |", "|---|" + "---:|" * len(TOTALS)]
    for system, per_seed in contents.items():
        stats = aggregate({seed: _totals(rows) for seed, rows in per_seed.items()})
        lines.append(f"| {system} | " + " | ".join(cell(stats.get(k), k, len(per_seed)) for k in TOTALS) + " |")
    return "\n".join(lines)


def _paper_tables(report: Report, systems: Sequence[str], sessions: Sequence[int]) -> list[str]:
    """The paper's Figure 10 and 15 numbers and ours, each in columns of their own."""
    def ours(system: str, key: str, only: Sequence[int]) -> str:
        if system not in systems:
            return "-"
        values = [v for v in _series(report, system, only, key) if np.isfinite(v)]
        return f"{np.mean(values):.2f}" if values else "-"

    history = sessions[:-1]
    fig10 = ["### Beside the paper: Figure 10 (latency)", "",
             f"Paper columns: {PAPER_SOURCE}; its annotations (ms, log-scale panels over sessions, no per-session "
             "values printed), attributed to methods by size. Our columns: this run, mean over sessions (history "
             "sessions for construction) and seeds.", "",
             "| system | paper: construction (ms) | paper: retrieval (ms) | ours: construction ms / session | "
             "ours: construction ms / turn | ours: retrieval ms / call |", "|---|---:|---:|---:|---:|---:|"]
    for paper_name, (construction, retrieval) in PAPER_FIGURE10.items():
        mine = PAPER_SYSTEMS[paper_name]
        fig10.append(f"| {paper_name} (ours: `{mine}`) | {construction} | {retrieval} | "
                     f"{ours(mine, 'construction_ms', history)} | {ours(mine, 'construction_ms_per_turn', history)} "
                     f"| {ours(mine, 'retrieval_ms', sessions)} |")
    names = list(PAPER_SYSTEMS)
    fig15 = ["### Beside the paper: Figure 15 (total processing time per session)", "",
             f"Paper columns: {PAPER_SOURCE}; seconds; {PAPER_FIGURE15_NOTE}. Our columns: this run, milliseconds "
             "per episode, mean over seeds.", "",
             "| session | " + " | ".join(f"paper: {n} (s)" for n in names) + " | "
             + " | ".join(f"ours: `{PAPER_SYSTEMS[n]}` (ms)" for n in names) + " |",
             "|---|" + "---:|" * (2 * len(names))]
    for n in sorted(set(sessions) | set(range(1, len(PAPER_FIGURE15) + 1))):
        paper = PAPER_FIGURE15[n - 1] if n <= len(PAPER_FIGURE15) else ("-",) * len(names)
        fig15.append(f"| {n} | " + " | ".join(paper) + " | "
                     + " | ".join(ours(PAPER_SYSTEMS[m], "processing_ms", [n]) if n in sessions
                                  else "-" for m in names) + " |")
    fig9 = ["### Beside the paper: Figure 9 (tokens)", "", f"The paper's Figure 9: {PAPER_FIGURE9}. Ours: the "
            "inference tok and stored tok columns above and `efficiency_tokens.png`."]
    return ["\n".join(fig9), "\n".join(fig10), "\n".join(fig15)]


def _colors(systems: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return {s: cmap(i % 20) for i, s in enumerate(systems)}


def _legend(fig: Any, ax: Any) -> None:
    """One legend of every system under the plot, then the layout around it."""
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=7, fontsize=7)
    fig.tight_layout(rect=(0, 0.1, 1, 1))


def _tokens_figure(report: Report, systems: Sequence[str], sessions: Sequence[int], path: Path) -> None:
    """Figure 9's layout: inference tokens per session as bars, stored tokens as areas, one color per system."""
    import matplotlib.pyplot as plt

    colors, width = _colors(systems), 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(min(14.0, max(8.0, 0.2 * len(systems) * len(sessions))), 5.0))
    xs = np.arange(len(sessions), dtype=float)
    area = ax.twinx()
    for i, system in enumerate(systems):
        ax.bar(xs - 0.4 + (i + 0.5) * width, _series(report, system, sessions, "inference_tokens"), width,
               color=colors[system], label=system)
        stored = np.array(_series(report, system, sessions, "storage_tokens"))
        kept = np.isfinite(stored)
        area.fill_between(xs[kept], stored[kept], color=colors[system], alpha=0.06)
        area.plot(xs[kept], stored[kept], color=colors[system], lw=1.2)
    ax.set_xticks(xs, [str(n) for n in sessions])
    ax.set_xlabel("session")
    ax.set_ylabel("inference tokens per episode (bars)")
    area.set_ylabel("stored tokens after the session (areas)")
    ax.set_title("Figure 9 (this run): inference and storage tokens per session")
    _legend(fig, ax)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _latency_figure(report: Report, systems: Sequence[str], sessions: Sequence[int], path: Path) -> None:
    """Figure 10's layout: (a) memory construction latency, (b) memory retrieval latency, log scale, per session."""
    import matplotlib.pyplot as plt

    colors = _colors(systems)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    panels = (("construction_ms", "(a) memory construction latency (ms per session)", sessions[:-1]),
              ("retrieval_ms", "(b) memory retrieval latency (ms per call)", sessions))
    for ax, (key, title, xs) in zip(axes, panels, strict=True):
        for system in systems:
            ys = _series(report, system, xs, key)
            ax.plot(xs, [y if y > 0 else np.nan for y in ys], marker="o", color=colors[system], label=system)
        ax.set_yscale("log")
        ax.set_xticks(list(xs))
        ax.set_xlabel("session")
        ax.set_ylabel("ms")
        ax.set_title(title, fontsize=10)
    fig.suptitle("Figure 10 (this run)")
    _legend(fig, axes[0])
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _time_figure(report: Report, systems: Sequence[str], sessions: Sequence[int], path: Path) -> None:
    """Figure 15's layout: total processing time per session as grouped bars (s, log scale), ours annotated."""
    import matplotlib.pyplot as plt

    colors, width = _colors(systems), 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(min(14.0, max(8.0, 0.2 * len(systems) * len(sessions))), 5.0))
    xs = np.arange(len(sessions), dtype=float)
    for i, system in enumerate(systems):
        ys = [y / 1e3 for y in _series(report, system, sessions, "processing_ms")]
        bars = ax.bar(xs - 0.4 + (i + 0.5) * width, ys, width, color=colors[system], label=system)
        if system == "ours":
            ax.bar_label(bars, labels=[f"{y:.3g}" if np.isfinite(y) else "" for y in ys], fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(n) for n in sessions])
    ax.set_xlabel("session")
    ax.set_ylabel("total processing time per episode (s)")
    ax.set_title("Figure 15 (this run): total processing time per session")
    _legend(fig, ax)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def efficiency_report(contents: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> Report:
    """The report of per-session efficiency rows `{system: {seed: per_session rows}}` (results.json's
    efficiency.per_session, as `per_session_of` returns them): one table row per system and session, the three
    figures, and the paper's numbers beside ours."""
    systems = list(contents)
    report = Report("efficiency", "Efficiency per session", "Figures 9, 10 and 15", dict(COLUMNS), {},
                    row_header="system, session")
    sessions: set[int] = set()
    for system, per_seed in contents.items():
        for seed, rows in per_seed.items():
            for row in rows:
                sessions.add(int(row["session"]))
                seconds = row.get("processing_s")
                metrics = {k: row.get(k) for k in COLUMNS} | {
                    "processing_ms": None if seconds is None else 1e3 * float(seconds)}
                report.rows.setdefault(_row(system, int(row["session"])), {})[seed] = metrics
    order = sorted(sessions)
    report.rows = {_row(s, n): report.rows[_row(s, n)] for s in systems for n in order if _row(s, n) in report.rows}
    report.figures = {
        "tokens": lambda path: _tokens_figure(report, systems, order, path),
        "latency": lambda path: _latency_figure(report, systems, order, path),
        "time": lambda path: _time_figure(report, systems, order, path)}
    report.sections = [_totals_table(contents), *_paper_tables(report, systems, order)]
    report.extra["paper"] = {"source": PAPER_SOURCE, "figure9": PAPER_FIGURE9,
                             "figure10_ms": {k: {"construction": c, "retrieval": r}
                                             for k, (c, r) in PAPER_FIGURE10.items()},
                             "figure15_s": [dict(zip(PAPER_SYSTEMS, row, strict=True)) for row in PAPER_FIGURE15],
                             "figure15_note": PAPER_FIGURE15_NOTE}
    report.notes += [
        "Per session, means per episode: inference tok = the generator's prompt + output tokens spent in that "
        "session (memory construction calls in the history sessions, whose replies the protocol does not "
        "generate; the replies and any retrieval calls in the final one; the judge's tokens are not counted); "
        "stored tok = tokens of the stored memories after the session (none after the final session, which "
        "changes no memory); construction = the session's memory construction time (all its observed turns and "
        "its end), also per observed turn; retrieval = time per memory choice (one per observed turn, one per "
        "target in the final session); processing = the session's wall time in the protocol (Figure 15's total "
        "processing time, here in ms).",
        "Latencies are host wall time, leaving out each evaluation's first episode (it compiles); answers the "
        "shared cache already held cost no back-end time."]
    return report


__all__ = ["COLUMNS", "PAPER_FIGURE10", "PAPER_FIGURE15", "PAPER_SYSTEMS", "efficiency_report", "per_session_of"]
