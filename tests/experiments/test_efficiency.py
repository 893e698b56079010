"""The efficiency report from results.json contents with known per-session numbers: the table's means, the three
figures, and the paper's numbers in columns of their own."""

from __future__ import annotations

import pytest

from icml_jax.experiments.efficiency import PAPER_FIGURE10, PAPER_FIGURE15, efficiency_report, per_session_of
from icml_jax.experiments.tables import aggregate, write


def _content(scale: float) -> dict:
    """A results.json's content with two history sessions and a final one; every number x `scale`."""
    rows = [{"session": n, "inference_tokens": 10.0 * n * scale, "storage_tokens": None if n == 3 else 100.0 * n,
             "construction_ms": None if n == 3 else 7.0 * scale, "construction_ms_per_turn": None if n == 3 else 1.0,
             "retrieval_ms": 3.0 * scale, "processing_s": 0.5 * n * scale} for n in (1, 2, 3)]
    return {"system": "x", "efficiency": {"inference_tokens_per_reply": 1.0, "per_session": rows}}


def _report(systems=("ours", "theanine", "memoryos", "rsum")):
    contents = {s: {seed: per_session_of(_content((i + 1) * (seed + 1)), f"{s}/{seed}") for seed in (0, 1)}
                for i, s in enumerate(systems)}
    return efficiency_report(contents)


def test_rows_are_the_results_per_session_numbers_averaged_over_seeds():
    report = _report()
    assert list(report.rows)[:3] == ["ours, session 1", "ours, session 2", "ours, session 3"]
    assert len(report.rows) == 4 * 3
    stats = aggregate(report.rows["theanine, session 2"])  # scale 2 (seed 0) and 4 (seed 1)
    assert stats["inference_tokens"]["mean"] == pytest.approx(60.0)
    assert stats["storage_tokens"]["mean"] == pytest.approx(200.0) and stats["storage_tokens"]["sd"] == 0.0
    assert stats["construction_ms"]["mean"] == pytest.approx(21.0)
    assert stats["processing_ms"]["mean"] == pytest.approx(3000.0)  # shown in ms
    assert aggregate(report.rows["ours, session 3"])["construction_ms"]["mean"] is None  # the final session
    totals = next(x for x in report.sections if x.startswith("### Per episode")).splitlines()
    theanine = [c.strip() for c in next(x for x in totals if x.startswith("| theanine")).strip("|").split("|")]
    # scale 2 and 4: history tokens (10 + 20) x 3, final 30 x 3, stored 200, construction 7 x 3, retrieval 3 x 3,
    # processing (0.5 + 1 + 1.5) s x 3
    assert theanine[1:] == ["90.00 ± 42.43", "90.00 ± 42.43", "200.00 ± 0.00", "21.00 ± 9.90", "9.00 ± 4.24",
                            "9000.00 ± 4242.64"]


def test_writes_three_pngs_and_keeps_the_papers_numbers_in_their_own_columns(tmp_path):
    files = write(_report(), tmp_path, {"data": "persona_world"}, "python -m icml_jax.experiments ...")
    for key in ("png_tokens", "png_latency", "png_time"):
        assert files[key].name == f"efficiency_{key[4:]}.png" and files[key].read_bytes()[:4] == b"\x89PNG"
    md = files["md"].read_text(encoding="utf-8")
    fig15 = md[md.index("Figure 15 (total"):].splitlines()
    header = next(line for line in fig15 if line.startswith("| session"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols == ["session", "paper: ICML (s)", "paper: THEANINE (s)", "paper: MemoryOS (s)", "ours: `ours` (ms)",
                    "ours: `theanine` (ms)", "ours: `memoryos` (ms)"]
    first = next(line for line in fig15 if line.startswith("| 1 |"))
    cells = [c.strip() for c in first.strip("|").split("|")]
    assert cells[1:4] == list(PAPER_FIGURE15[0])  # the paper's session 1, as transcribed
    assert cells[4:] == ["750.00", "1500.00", "2250.00"]  # ours: 0.5 s x scale, mean over seeds (x1, x2 / ...)
    fig10 = md[md.index("Figure 10 (latency)"):md.index("Figure 15 (total")]
    theanine = next(line for line in fig10.splitlines() if line.startswith("| THEANINE"))
    cells = [c.strip() for c in theanine.strip("|").split("|")]
    assert cells[1:3] == list(PAPER_FIGURE10["THEANINE"]) and cells[3] == "21.00"  # 7 x (2 + 4) / 2
    assert "paper_numbers.md" in md and "Figure 9" in md
    table = md[:md.index("### Beside the paper")]  # our table holds none of the paper's numbers
    assert "52.74" not in table and "10820" not in table


def test_missing_systems_show_a_dash_in_our_columns():
    md_sections = _report(systems=("ours", "rsum")).sections
    fig10 = next(s for s in md_sections if "Figure 10" in s)
    assert next(x for x in fig10.splitlines() if x.startswith("| MemoryOS")).rstrip(" |").endswith("-")


def test_results_written_before_per_session_efficiency_are_a_clear_error():
    old = {"system": "rsum", "efficiency": {"inference_tokens_per_reply": 1.0, "storage_tokens_per_session": [3]}}
    with pytest.raises(ValueError, match="seed0/baseline_rsum/eval/results.json: no per-session efficiency.*Delete"):
        per_session_of(old, "seed0/baseline_rsum/eval/results.json")
