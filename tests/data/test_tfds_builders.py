"""TFDS builders: build from a manual dir into ArrayRecord and read back the exact Episodes, without TensorFlow."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import tensorflow_datasets as tfds

from icml_jax.data import tfds_builders as tb
from icml_jax.data.report import MalformedRecordError, MissingSourceFileError
from icml_jax.data.sources import parse_cc, parse_gapchat, parse_msc_cc_style, parse_msc_parlai


def _by_id(eps):
    return {e.episode_id: e for e in eps}


def test_msc_parlai_builds_and_reads_back_exactly(tmp_path: Path, fixtures: Path) -> None:
    """msc_episodes/parlai: both splits, read back via tfds.data_source equal the parser's Episodes."""
    manual = fixtures / "msc_parlai"
    b = tb.build("msc_episodes/parlai", manual_dir=manual, data_dir=tmp_path)
    assert b.info.splits["test"].num_examples == 2 and b.info.splits["validation"].num_examples == 1
    got = tb.read_episodes("msc_episodes/parlai", "test", data_dir=tmp_path)
    want = list(parse_msc_parlai(manual / "msc_dialogue/session_5/test.txt"))
    assert _by_id(got) == _by_id(want)
    assert "tensorflow" not in sys.modules


def test_cc_builds_and_reads_back_exactly(tmp_path: Path, fixtures: Path) -> None:
    """cc_episodes/test from a manual dir holding test.jsonl; the flat columns match the JSON."""
    b = tb.build("cc_episodes/test", manual_dir=fixtures / "cc", data_dir=tmp_path)
    src = b.as_data_source(split="test")
    assert len(src) == 2
    rec = src[0]
    ep = tb.episode_from_record(rec)
    assert rec["episode_id"].decode() == ep.episode_id
    assert int(rec["num_sessions"]) == len(ep.sessions) and int(rec["num_turns"]) == ep.num_turns
    assert _by_id(tb.read_episodes("cc_episodes/test", "test", data_dir=tmp_path)) == _by_id(parse_cc(fixtures / "cc/test.jsonl"))


def test_gapchat_fixture_build_reports_drops_in_metadata(tmp_path: Path, fixtures: Path) -> None:
    """gapchat_episodes/protocol: glitch and empty-session counts are in builder.reports and dataset_info."""
    b = tb.build("gapchat_episodes/protocol", manual_dir=fixtures / "gapchat", data_dir=tmp_path)
    assert b.reports["test_4"].glitch_turns_dropped == 4 and b.reports["test_4"].empty_sessions_dropped == 2
    reread = tfds.builder("gapchat_episodes/protocol", data_dir=tmp_path)
    assert reread.info.metadata["report_test_4"]["glitch_turns_dropped"] == 4
    assert reread.info.metadata["report_test_4"]["episodes_with_glitches"] == 1
    got = tb.read_episodes("gapchat_episodes/protocol", "test_4", data_dir=tmp_path)
    assert _by_id(got) == _by_id(parse_gapchat(fixtures / "gapchat/test/4_session.json"))


def test_real_samples_build(tmp_path: Path, shared_data: Path) -> None:
    """The real GapChat and MSC samples build straight from ../shared/data and read back exactly."""
    b = tb.build("gapchat_episodes/sample", manual_dir=shared_data / "gapchat", data_dir=tmp_path)
    assert b.info.splits["test_4"].num_examples == 20 and b.info.splits["test_5"].num_examples == 40
    assert b.reports["test_5"].episodes_with_glitches == 5 and b.reports["test_5"].empty_sessions_dropped == 1
    got = tb.read_episodes("gapchat_episodes/sample", "test_5", data_dir=tmp_path)
    assert _by_id(got) == _by_id(parse_gapchat(shared_data / "gapchat/test/5_session.json"))

    tb.build("msc_episodes/theanine_sample", manual_dir=shared_data / "msc", data_dir=tmp_path)
    (ep,) = tb.read_episodes("msc_episodes/theanine_sample", "test", data_dir=tmp_path)
    assert ep == next(iter(parse_msc_cc_style(shared_data / "msc/theanine_sample_dialogue.json")))
    assert "tensorflow" not in sys.modules


def test_missing_file_error_through_tfds(tmp_path: Path, fixtures: Path) -> None:
    """A manual dir without the file (or empty) fails with our message, before anything is written."""
    manual = tmp_path / "manual"
    shutil.copytree(fixtures / "gapchat", manual)
    (manual / "test/5_session.json").unlink()
    with pytest.raises(MissingSourceFileError, match=r"(?s)missing file .*test/5_session\.json.*MindTheTime"):
        tb.build("gapchat_episodes/protocol", manual_dir=manual, data_dir=tmp_path / "d")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MissingSourceFileError, match=r"(?s)msc_dialogue/session_5/valid\.txt.*msc_v0\.1"):
        tb.build("msc_episodes/parlai", manual_dir=empty, data_dir=tmp_path / "d")
    assert not list((tmp_path / "d").rglob("*.array_record*"))


def test_malformed_record_error_and_skip_through_tfds(tmp_path: Path, fixtures: Path) -> None:
    """A malformed CC line fails the build naming file and line; skip_malformed builds and counts it."""
    manual = tmp_path / "manual"
    manual.mkdir()
    lines = (fixtures / "cc/test.jsonl").read_text().splitlines()
    (manual / "test.jsonl").write_text("\n".join([lines[0], '{"dataID": "episode-99"}', lines[1]]) + "\n")
    with pytest.raises(MalformedRecordError, match=r"test\.jsonl, line 2: no first_session_dialogue"):
        tb.build("cc_episodes/test", manual_dir=manual, data_dir=tmp_path / "a")
    b = tb.build("cc_episodes/test", manual_dir=manual, data_dir=tmp_path / "b", skip_malformed=True)
    assert b.info.splits["test"].num_examples == 2
    assert b.reports["test"].num_malformed_skipped == 1
    meta = tfds.builder("cc_episodes/test", data_dir=tmp_path / "b").info.metadata["report_test"]
    assert meta["malformed_skipped"][0]["location"] == "line 2"


def test_duplicate_episode_ids_are_an_error(tmp_path: Path, fixtures: Path) -> None:
    """Two records with one id would make the protocol ambiguous: an error, or a counted skip."""
    manual = tmp_path / "manual"
    manual.mkdir()
    line = (fixtures / "cc/test.jsonl").read_text().splitlines()[0]
    (manual / "test.jsonl").write_text(line + "\n" + line + "\n")
    with pytest.raises(MalformedRecordError, match="duplicate episode id"):
        tb.build("cc_episodes/test", manual_dir=manual, data_dir=tmp_path / "a")
    b = tb.build("cc_episodes/test", manual_dir=manual, data_dir=tmp_path / "b", skip_malformed=True)
    assert b.info.splits["test"].num_examples == 1 and b.reports["test"].num_malformed_skipped == 1


def test_build_cli(tmp_path: Path, fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """python -m icml_jax.data.build_cli builds without TensorFlow and prints the reports."""
    from icml_jax.data import build_cli

    argv = ["--dataset=gapchat_episodes/protocol", f"--manual_dir={fixtures / 'gapchat'}", f"--data_dir={tmp_path}"]
    assert build_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "test_4: 3 records read, 3 episodes kept" in out and "4 glitch turns dropped" in out
    info = json.loads((tmp_path / "gapchat_episodes/protocol/1.0.0/dataset_info.json").read_text())
    assert info["name"] == "gapchat_episodes"
    assert build_cli.main(argv) == 0  # a second run reuses the data and shows the saved reports
    assert "report_test_4 (saved)" in capsys.readouterr().out


def test_locomo_fixture_builds_and_reads_back_with_its_questions(tmp_path: Path, fixtures: Path) -> None:
    """locomo_episodes/full on the tiny fixture: the Episodes, their questions (meta["qa"]) and the counts."""
    from icml_jax.data.sources.locomo import parse_locomo, questions

    b = tb.build("locomo_episodes/full", manual_dir=fixtures / "locomo", data_dir=tmp_path)
    assert b.info.splits["test"].num_examples == 2
    assert (b.reports["test"].questions, b.reports["test"].evidence_unresolved) == (12, 2)
    got = _by_id(tb.read_episodes("locomo_episodes/full", "test", data_dir=tmp_path))
    want = _by_id(parse_locomo(fixtures / "locomo/locomo10.json"))
    assert got == want and questions(got["conv-1"]) == questions(want["conv-1"])
    meta = tfds.builder("locomo_episodes/full", data_dir=tmp_path).info.metadata["report_test"]
    assert (meta["questions"], meta["evidence_normalised"]) == (12, 4)
    assert "tensorflow" not in sys.modules


def test_locomo7_build_cli_on_the_shared_file(tmp_path: Path, shared_data: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """python -m icml_jax.data.build_cli --dataset=locomo_episodes/locomo7 --manual_dir=../shared/data/locomo."""
    from icml_jax.data import build_cli

    argv = ["--dataset=locomo_episodes/locomo7", f"--manual_dir={shared_data / 'locomo'}", f"--data_dir={tmp_path}"]
    assert build_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "test: 7 records read, 7 episodes kept" in out
    assert "1347 questions, 2 evidence ids normalised, 3 unresolved" in out
    assert len(tb.read_episodes("locomo_episodes/locomo7", "test", data_dir=tmp_path)) == 7
    assert build_cli.main(["--dataset=locomo_episodes/full", f"--manual_dir={shared_data / 'locomo'}",
                           f"--data_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "missing file" in err and "locomo10.json" in err and "snap-research/locomo" in err
