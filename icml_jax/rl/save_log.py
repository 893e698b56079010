"""What Table 8's proxy / truth correlation needs of each save the online stage finalized (the session it was
made in, its proxy reward, the future reply quality that reached it), and that correlation per session."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class SaveLogEntry:
    """One finalized save: its session in the episode (0-based), r_proxy, and r_qual(future) (None: never
    triggered, so no reply used it)."""

    session: int
    r_proxy: float
    r_qual_future: float | None


def pearson_or_none(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson r of the pairs, None with fewer than 3 of them or a constant side (r is undefined there)."""
    from scipy.stats import pearsonr

    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return float(pearsonr(xs, ys).statistic)


def proxy_truth_per_session(entries: Sequence[SaveLogEntry]) -> dict[int, dict[str, Any]]:
    """{session (1-based): saves, saves_used (triggered), r}: Pearson r between r_proxy and r_qual(future) over
    the session's saves that a later reply used, as the evaluation's proxy / truth correlation defines it."""
    out = {}
    for n in sorted({e.session for e in entries}):
        mine = [e for e in entries if e.session == n]
        used = [e for e in mine if e.r_qual_future is not None]
        out[n + 1] = {"saves": len(mine), "saves_used": len(used),
                      "r": pearson_or_none([e.r_proxy for e in used], [float(e.r_qual_future) for e in used])}
    return out


__all__ = ["SaveLogEntry", "pearson_or_none", "proxy_truth_per_session"]
