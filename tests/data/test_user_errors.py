"""Errors a user's files or command line cause: they name the file and place, hint at a skip only where it helps,
and the build command line ends them in one line on stderr with exit status 2 (issue 16, item 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from icml_jax.data import build_cli
from icml_jax.data.report import (
    DataError,
    MalformedFileError,
    MalformedRecordError,
    MissingManualDirError,
    MissingSourceFileError,
    ParseReport,
    UnknownDatasetError,
)
from icml_jax.data.schema import SchemaError
from icml_jax.data.sources import parse_cc, parse_gapchat

REPO_ROOT = Path(__file__).resolve().parents[2]


def _cc_lines(fixtures: Path) -> list[bytes]:
    return (fixtures / "cc/test.jsonl").read_bytes().splitlines()


def _latin1_line(line: bytes) -> bytes:
    """The record with one utterance re-encoded as Latin-1 (an "é" that is byte 0xe9, not UTF-8)."""
    rec = json.loads(line)
    rec["first_session_dialogue"][0] = "Caf\u00e9?"
    return json.dumps(rec, ensure_ascii=False).encode("latin-1")


# --- not UTF-8 -------------------------------------------------------------------------------------------------


def test_jsonl_line_not_utf8_names_file_line_and_byte_and_can_be_skipped(tmp_path: Path, fixtures: Path) -> None:
    """One Latin-1 line of a JSON Lines file is a malformed record: named, and skipped and counted on request."""
    a, b = _cc_lines(fixtures)[:2]
    f = tmp_path / "test.jsonl"
    bad = _latin1_line(b)
    f.write_bytes(a + b"\n" + bad + b"\n")
    offset = len(a) + 1 + bad.index(b"\xe9")
    with pytest.raises(MalformedRecordError) as info:
        list(parse_cc(f))
    msg = str(info.value)
    assert f"{f}, line 2: not valid UTF-8" in msg and f"byte 0xe9 at byte offset {offset}" in msg
    assert "skip_malformed=True" in msg
    report = ParseReport()
    assert [e.episode_id for e in parse_cc(f, skip_malformed=True, report=report)] == ["episode-7"]
    skipped = [(s.location, s.reason.startswith("not valid UTF-8")) for s in report.malformed_skipped]
    assert skipped == [("line 2", True)]


def test_jsonl_with_no_utf8_line_is_a_file_error_even_when_skipping(tmp_path: Path, fixtures: Path) -> None:
    """A file none of whose lines decodes is in another encoding: a file-level error, not N skipped records."""
    f = tmp_path / "test.jsonl"
    f.write_bytes(b"\n".join(_latin1_line(x) for x in _cc_lines(fixtures)[:2]) + b"\n")
    with pytest.raises(MalformedFileError, match=r"test\.jsonl, line 1: none of its 2 non-blank lines is UTF-8") as e:
        list(parse_cc(f, skip_malformed=True))
    assert "skip_malformed" not in str(e.value)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_utf16_or_utf32_file_is_a_file_error(tmp_path: Path, fixtures: Path, encoding: str) -> None:
    """A UTF-16/32 file (with or without a byte-order mark) has no record to skip: MalformedFileError, no hint."""
    f = tmp_path / "test.jsonl"
    f.write_bytes((fixtures / "cc/test.jsonl").read_text(encoding="utf-8").encode(encoding))
    with pytest.raises(MalformedFileError, match=rf"{f}, byte \d+: not UTF-8") as info:
        list(parse_cc(f, skip_malformed=True))
    assert "skip_malformed" not in str(info.value)


def test_json_list_not_utf8_is_a_file_error_naming_line_and_byte(tmp_path: Path, fixtures: Path) -> None:
    """A GapChat JSON list is one document: a Latin-1 byte in it is a file error with line and byte offset."""
    text = (fixtures / "gapchat/test/5_session.json").read_text(encoding="utf-8")
    i = text.index('"text": "') + len('"text": "')
    data = (text[:i] + "Caf\u00e9 " + text[i:]).encode("latin-1")
    f = tmp_path / "5_session.json"
    f.write_bytes(data)
    bad = data.index(b"\xe9")
    line = data[:bad].count(b"\n") + 1
    with pytest.raises(MalformedFileError, match=rf"5_session\.json, line {line}: not valid UTF-8") as info:
        list(parse_gapchat(f, skip_malformed=True))
    assert f"byte offset {bad}" in str(info.value) and "skip_malformed" not in str(info.value)


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path, fixtures: Path) -> None:
    """UTF-8 with a BOM (as some Windows editors save) is UTF-8: both JSON Lines and JSON list files parse."""
    f = tmp_path / "test.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + (fixtures / "cc/test.jsonl").read_bytes())
    assert [e.episode_id for e in parse_cc(f)] == [e.episode_id for e in parse_cc(fixtures / "cc/test.jsonl")]
    g = tmp_path / "test" / "5_session.json"
    g.parent.mkdir()
    g.write_bytes(b"\xef\xbb\xbf" + (fixtures / "gapchat/test/5_session.json").read_bytes())
    assert len(list(parse_gapchat(g))) == len(list(parse_gapchat(fixtures / "gapchat/test/5_session.json")))


# --- the skip hint ---------------------------------------------------------------------------------------------


def test_file_level_errors_do_not_suggest_skipping(tmp_path: Path) -> None:
    """Broken JSON list and a wrong top level cannot be skipped: their messages do not suggest it."""
    f = tmp_path / "5_session.json"
    f.write_text('[\n  {"sessions": [}\n]')
    with pytest.raises(MalformedFileError, match=r"5_session\.json, line 2 column \d+: not valid JSON") as info:
        parse_gapchat(f, skip_malformed=True)
    assert "skip" not in str(info.value)
    f.write_text('{"sessions": []}')
    with pytest.raises(MalformedFileError, match="top level: expected a JSON list") as info:
        parse_gapchat(f, skip_malformed=True)
    assert "skip" not in str(info.value)


def test_record_error_hint_can_name_another_spelling(tmp_path: Path, fixtures: Path) -> None:
    """A record error suggests skipping; ``describe`` lets a command line name its own flag instead."""
    f = tmp_path / "test.jsonl"
    f.write_bytes(_cc_lines(fixtures)[0] + b'\n{"dataID": "x"}\n')
    with pytest.raises(MalformedRecordError) as info:
        list(parse_cc(f))
    assert str(info.value).endswith("line 2: no first_session_dialogue (pass skip_malformed=True to skip and count it)")
    flag_hint = "pass --skip_malformed to skip and count it"
    assert info.value.describe(flag_hint).endswith(f"({flag_hint})")
    assert info.value.describe(None).endswith("no first_session_dialogue")


def test_user_error_classes_share_data_error(tmp_path: Path) -> None:
    """Every data user error is a DataError and keeps its builtin base (ValueError or FileNotFoundError)."""
    for cls, base in [(MalformedFileError, ValueError), (MalformedRecordError, ValueError),
                      (MissingSourceFileError, FileNotFoundError), (MissingManualDirError, FileNotFoundError),
                      (UnknownDatasetError, ValueError), (SchemaError, ValueError)]:
        assert issubclass(cls, DataError) and issubclass(cls, base), cls
    e = MissingSourceFileError(str(tmp_path / "x.json"), dataset="GapChat", what="the file", where_from="GitHub")
    assert "\n" not in str(e) and isinstance(e, OSError)


# --- the build command line ------------------------------------------------------------------------------------


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and the error line: stderr's one "error:" line, which is its last (tfds progress bars clear above)."""
    code = build_cli.main(argv)
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    last = err.rstrip("\n").split("\n")[-1].split("\r")[-1]
    assert last.startswith("icml_jax.data.build_cli: error: "), err
    return code, last


def test_cli_unknown_dataset_and_missing_folder_end_in_one_line(tmp_path: Path, capsys) -> None:
    """Unknown dataset name and a manual_dir that is not there: exit 2, one line naming the names or the folder."""
    dirs = [f"--manual_dir={tmp_path}", f"--data_dir={tmp_path}"]
    code, err = _cli(["--dataset=gapchat_episode/protocol", *dirs], capsys)
    assert code == 2
    assert "unknown dataset 'gapchat_episode/protocol'; choose one of" in err and "gapchat_episodes/protocol" in err
    missing = tmp_path / "nope"
    code, err = _cli(["--dataset=gapchat_episodes/protocol", f"--manual_dir={missing}", dirs[1]], capsys)
    assert code == 2
    assert err.startswith(f"icml_jax.data.build_cli: error: gapchat_episodes/protocol: manual_dir {missing} is not")
    assert "MindTheTime" in err
    assert not (tmp_path / "gapchat_episodes").exists()


def test_cli_missing_file_not_utf8_and_malformed_record(tmp_path: Path, fixtures: Path, capsys) -> None:
    """Missing file, non-UTF-8 file and malformed record: exit 2, one line naming the file; the flag hint only helps."""
    manual = tmp_path / "manual"
    manual.mkdir()
    argv = ["--dataset=cc_episodes/test", f"--manual_dir={manual}", f"--data_dir={tmp_path / 'd'}"]
    code, err = _cli(argv, capsys)
    assert code == 2 and f"missing file {manual / 'test.jsonl'}" in err
    (manual / "test.jsonl").write_bytes(_cc_lines(fixtures)[0] + b'\n{"dataID": "x"}\n')
    code, err = _cli(argv, capsys)
    assert code == 2
    assert err.endswith("test.jsonl, line 2: no first_session_dialogue (pass --skip_malformed to skip and count it)")
    (manual / "test.jsonl").write_bytes((fixtures / "cc/test.jsonl").read_text().encode("utf-16"))
    code, err = _cli([*argv, "--skip_malformed"], capsys)
    assert code == 2 and "test.jsonl, byte 0: not UTF-8" in err and "skip" not in err


def test_cli_debug_reraises(tmp_path: Path, capsys) -> None:
    """--debug shows the real exception (and so its traceback) instead of the one line."""
    with pytest.raises(MissingManualDirError):
        build_cli.main(["--dataset=cc_episodes/test", f"--manual_dir={tmp_path / 'nope'}", f"--data_dir={tmp_path}",
                        "--debug"])
    with pytest.raises(UnknownDatasetError):
        build_cli.main(["--dataset=cc", f"--manual_dir={tmp_path}", f"--data_dir={tmp_path}", "--debug"])


def test_cli_process_prints_no_traceback(tmp_path: Path) -> None:
    """As a process: exit status 2 and a single stderr line, no traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "icml_jax.data.build_cli", "--dataset=msc_episodes/parlai",
         f"--manual_dir={tmp_path / 'nope'}", f"--data_dir={tmp_path}"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "manual_dir" in lines[0] and "msc_v0.1" in lines[0], proc.stderr
