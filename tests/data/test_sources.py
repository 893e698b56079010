"""Raw-file parsers on hand-written fixtures and the real samples: content, counts, and promised errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml_jax.data.report import MalformedFileError, MalformedRecordError, MissingSourceFileError, ParseReport
from icml_jax.data.schema import Episode
from icml_jax.data.sources import is_header_glitch, parse_cc, parse_gapchat, parse_msc_cc_style, parse_msc_parlai

H, D = 3600.0, 86400.0


# --- MSC, ParlAI layout -----------------------------------------------------------------------------------------


def test_msc_parlai_fixture(fixtures: Path) -> None:
    """previous_dialogs then dialog, gaps from time_num/time_unit, personas per speaker, ids by record index."""
    report = ParseReport()
    eps = list(parse_msc_parlai(fixtures / "msc_parlai/msc_dialogue/session_5/test.txt", report=report))
    assert [e.episode_id for e in eps] == ["msc-episode-0", "msc-episode-1"]
    ep = eps[0]
    assert ep.dataset == "msc"
    assert [len(s.turns) for s in ep.sessions] == [4, 3, 2, 3, 4]
    assert [s.gap_text for s in ep.sessions] == [None, "3 hours", "2 days", "1 days", "7 hours"]
    assert [s.gap_seconds for s in ep.sessions] == [None, 3 * H, 2 * D, D, 7 * H]
    assert ep.sessions[0].turns[0].speaker == "Speaker 1" and ep.sessions[0].turns[1].speaker == "Speaker 2"
    assert ep.sessions[-1].turns[-1].text == "Bring treats then."
    assert ep.personas["Speaker 1"] == ("I have a dog named Rex.", "I work night shifts.")
    assert ep.meta["metadata"]["initial_data_id"] == "train:ordered_101"
    assert ep.sessions[0].meta["time_back"] == "3 hours ago"
    assert report.records_read == 2 and report.episodes == 2 and report.num_malformed_skipped == 0


def test_msc_parlai_missing_speaker_id_is_inferred_and_counted(tmp_path: Path) -> None:
    """Speaker ids are unconfirmed in the docs: a missing one is inferred by alternation and counted."""
    rec = {"dialog": [{"text": "hi"}, {"text": "hello"}], "previous_dialogs": []}
    f = tmp_path / "test.txt"
    f.write_text(json.dumps(rec) + "\n")
    report = ParseReport()
    (ep,) = parse_msc_parlai(f, report=report)
    assert [t.speaker for t in ep.sessions[0].turns] == ["Speaker 1", "Speaker 2"]
    assert report.inferred_speakers == 2


def test_msc_parlai_malformed_line_names_file_and_line(tmp_path: Path, fixtures: Path) -> None:
    """A bad JSON line and a record without 'dialog' both name the file and the 1-based line."""
    good = (fixtures / "msc_parlai/msc_dialogue/session_5/test.txt").read_text().splitlines()
    f = tmp_path / "test.txt"
    f.write_text("\n".join([good[0], "{not json", json.dumps({"previous_dialogs": []}), good[1]]) + "\n")
    with pytest.raises(MalformedRecordError, match=r"test\.txt, line 2: not valid JSON"):
        list(parse_msc_parlai(f))
    report = ParseReport()
    eps = list(parse_msc_parlai(f, skip_malformed=True, report=report))
    assert [e.episode_id for e in eps] == ["msc-episode-0", "msc-episode-3"]  # ids keep the line positions
    assert [(s.location, s.reason) for s in report.malformed_skipped] == [
        ("line 2", "not valid JSON: Expecting property name enclosed in double quotes"),
        ("line 3", "missing key 'dialog'"),
    ]
    f.write_text(good[0] + "\n" + json.dumps({"dialog": [{"id": "Speaker 1"}]}) + "\n")
    with pytest.raises(MalformedRecordError, match=r"line 2: missing key 'text' in dialog\[0\]"):
        list(parse_msc_parlai(f))


def test_msc_missing_file_says_what_where_from_and_where_to(tmp_path: Path) -> None:
    """The error names the file, the archive to get, the URL, and the target path."""
    target = tmp_path / "msc_dialogue/session_5/test.txt"
    with pytest.raises(MissingSourceFileError) as e:
        parse_msc_parlai(target)
    msg = str(e.value)
    assert str(target) in msg and "msc_v0.1.tar.gz" in msg and "parl.ai" in msg and "put it at" in msg


# --- MSC, THEANINE's CC-style conversion (real sample) ------------------------------------------------------------


def test_msc_cc_style_real_sample(shared_data: Path) -> None:
    """The real THEANINE sample: one 5-session episode, speakers A/B, no gaps or personas."""
    report = ParseReport()
    (ep,) = parse_msc_cc_style(shared_data / "msc/theanine_sample_dialogue.json", report=report)
    raw = json.loads((shared_data / "msc/theanine_sample_dialogue.json").read_text())[0]
    assert ep.episode_id == "msc-episode-30" and ep.dataset == "msc"
    assert [len(s.turns) for s in ep.sessions] == [14, 10, 12, 12, 12]
    assert [t.text for t in ep.sessions[4].turns] == raw["fifth_session_dialogue"]
    assert {t.speaker for s in ep.sessions for t in s.turns} == {"Speaker A", "Speaker B"}
    assert all(s.gap_seconds is None and s.gap_text is None for s in ep.sessions)
    assert ep.personas == {} and ep.relationship is None
    assert report.episodes == 1 and report.num_malformed_skipped == 0


# --- Conversation Chronicles ------------------------------------------------------------------------------------------


def test_cc_fixture(fixtures: Path) -> None:
    """Sessions, speakers (not always alternating), vague gaps, summaries and relationship."""
    eps = list(parse_cc(fixtures / "cc/test.jsonl"))
    assert [e.episode_id for e in eps] == ["episode-7", "episode-12"]
    ep = eps[0]
    assert ep.dataset == "cc" and ep.relationship == "Classmates"
    assert [len(s.turns) for s in ep.sessions] == [3, 2, 3, 2, 4]
    assert [s.gap_text for s in ep.sessions] == [
        "Start", "A few hours after", "A few weeks after", "A few months after", "A couple of years after"
    ]
    assert [s.gap_seconds for s in ep.sessions] == [None, 3 * H, 21 * D, 90 * D, 730 * D]
    assert ep.sessions[2].summary == "Debate club."
    assert ep.sessions[0].turns[1].speaker == "Classmates B"
    assert [t.speaker for t in eps[1].sessions[4].turns] == ["Wife", "Wife"]


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda r: r.pop("dataID"), "missing key 'dataID'"),
        (lambda r: r["third_session_speakers"].pop(), "third_session_dialogue has 3 utterances but third_session_speakers has 2"),
        (lambda r: (r.pop("fourth_session_dialogue"), r.pop("fourth_session_speakers")), "has fifth_session_dialogue but no fourth"),
        (lambda r: r["time_interval"].pop(), "time_interval has 4 entries for 5 sessions"),
        (lambda r: r.update(summary="x"), "summary must be a list of strings"),
    ],
)
def test_cc_malformed_record_names_line(tmp_path: Path, fixtures: Path, mutate, reason: str) -> None:
    """Each structural fault is an error naming file and line, or a counted skip."""
    lines = (fixtures / "cc/test.jsonl").read_text().splitlines()
    bad = json.loads(lines[0])
    mutate(bad)
    f = tmp_path / "test.jsonl"
    f.write_text("\n".join([lines[1], json.dumps(bad)]) + "\n\n")
    with pytest.raises(MalformedRecordError, match=rf"test\.jsonl, line 2: {reason}"):
        list(parse_cc(f))
    report = ParseReport()
    assert [e.episode_id for e in parse_cc(f, skip_malformed=True, report=report)] == ["episode-12"]
    assert report.num_malformed_skipped == 1 and report.blank_lines == 1 and report.records_read == 2


def test_cc_missing_file_points_at_hugging_face(tmp_path: Path) -> None:
    """Missing CC file: names the HF dataset and the target path."""
    with pytest.raises(MissingSourceFileError, match="jihyoung/ConversationChronicles"):
        parse_cc(tmp_path / "test.jsonl")


def test_cc_unreadable_gap_is_kept_and_counted(tmp_path: Path, fixtures: Path) -> None:
    """An unknown gap phrase keeps its text, gets no seconds, and is counted."""
    rec = json.loads((fixtures / "cc/test.jsonl").read_text().splitlines()[0])
    rec["time_interval"][2] = "After the summer break"
    f = tmp_path / "test.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    report = ParseReport()
    (ep,) = parse_cc(f, report=report)
    assert ep.sessions[2].gap_text == "After the summer break" and ep.sessions[2].gap_seconds is None
    assert report.unparsed_gaps == 1


# --- GapChat ------------------------------------------------------------------------------------------------------------


def test_gapchat_fixture_drops_and_counts_glitches_and_empty_sessions(fixtures: Path) -> None:
    """Header glitches and empty sessions go, counted; a dropped middle session's gap folds into the next."""
    report = ParseReport()
    eps = list(parse_gapchat(fixtures / "gapchat/test/4_session.json", report=report))
    assert [e.episode_id for e in eps] == ["gapchat-test-4-0", "gapchat-test-4-1", "gapchat-test-4-2"]
    assert report.glitch_turns_dropped == 4 and report.episodes_with_glitches == 1
    assert report.empty_sessions_dropped == 2
    g0, g1, g2 = eps
    assert [len(s.turns) for s in g0.sessions] == [2, 2, 2, 2]
    assert all(t.speaker in ("speaker_1", "speaker_2") for s in g0.sessions for t in s.turns)
    assert [s.gap_text for s in g0.sessions] == [None, "2 days", "3 weeks", "1 hour"]
    assert g0.sessions[1].meta["subsequent"]["speaker_1"]["progress"] == ["speaker_1 progress 0"]
    assert g0.meta["initial"]["speaker_2"]["progress"] == "You just adopted a puppy."
    assert [s.gap_text for s in g1.sessions] == [None, "5 days + 1 year", "16 hours"]
    assert g1.sessions[1].gap_seconds == 5 * D + 365 * D
    assert len(g2.sessions) == 3


def test_gapchat_real_5_session_glitch_counts(shared_data: Path) -> None:
    """The real 5-session test file: glitches in exactly 5 of 40 episodes, exactly one empty session."""
    report = ParseReport()
    eps = list(parse_gapchat(shared_data / "gapchat/test/5_session.json", report=report))
    assert len(eps) == 40 and report.records_read == 40 and report.episodes == 40
    assert report.episodes_with_glitches == 5
    assert report.glitch_turns_dropped == 21
    assert report.empty_sessions_dropped == 1
    assert report.num_malformed_skipped == 0 and report.unparsed_gaps == 0
    assert sorted(len(e.sessions) for e in eps) == [4] + [5] * 39
    assert len(eps[16].sessions) == 4  # its fifth session is the empty one
    raw = json.loads((shared_data / "gapchat/test/5_session.json").read_text())
    kept = sum(1 for r in raw for s in r["sessions"] for u in s if u["speaker"] in ("speaker_1", "speaker_2"))
    assert sum(e.num_turns for e in eps) == kept  # nothing else was dropped
    assert eps[0].sessions[1].gap_text == raw[0]["gap"][0]


def test_gapchat_real_4_session_sample(shared_data: Path) -> None:
    """The real first-20 sample parses cleanly with the full file's ids."""
    report = ParseReport()
    eps = list(parse_gapchat(shared_data / "gapchat/test/4_session.first20.json", report=report))
    assert len(eps) == 20 and eps[0].episode_id == "gapchat-test-4-0" and eps[-1].episode_id == "gapchat-test-4-19"
    assert all(len(e.sessions) == 4 for e in eps)
    assert report.glitch_turns_dropped == 0 and report.empty_sessions_dropped == 0
    assert eps[0].sessions[0].turns[0].text == "Hey there! How's it going?"
    assert [s.gap_text for s in eps[0].sessions] == [None, "2 weeks", "55 minutes", "5 days"]


def test_gapchat_unknown_speaker_is_malformed_not_a_glitch(tmp_path: Path, fixtures: Path) -> None:
    """Only truncated headers count as glitches; any other speaker is a malformed record."""
    data = json.loads((fixtures / "gapchat/test/4_session.json").read_text())
    data[1]["sessions"][0][0]["speaker"] = "speaker_3"
    f = tmp_path / "test" / "4_session.json"
    f.parent.mkdir()
    f.write_text(json.dumps(data))
    with pytest.raises(MalformedRecordError, match=r"4_session\.json, record 1: unknown speaker 'speaker_3'"):
        list(parse_gapchat(f))
    report = ParseReport()
    eps = list(parse_gapchat(f, skip_malformed=True, report=report))
    assert [e.episode_id for e in eps] == ["gapchat-test-4-0", "gapchat-test-4-2"]
    assert report.num_malformed_skipped == 1 and report.malformed_skipped[0].location == "record 1"
    assert report.glitch_turns_dropped == 4  # the skipped record contributes nothing


def test_gapchat_bad_gap_count_and_broken_json(tmp_path: Path, fixtures: Path) -> None:
    """Wrong number of gaps is malformed; a file that is not JSON names line and column."""
    data = json.loads((fixtures / "gapchat/test/5_session.json").read_text())
    data[0]["gap"].pop()
    f = tmp_path / "5_session.json"
    f.write_text(json.dumps(data))
    with pytest.raises(MalformedRecordError, match=r"record 0: 'gap' must hold 2\*\(sessions-1\) = 8 strings, got 7"):
        list(parse_gapchat(f))
    f.write_text('[\n  {"sessions": [}\n]')
    with pytest.raises(MalformedFileError, match=r"5_session\.json, line 2 column"):
        parse_gapchat(f)


def test_gapchat_missing_file(tmp_path: Path) -> None:
    """Missing GapChat file: names the GitHub folder and the target path."""
    with pytest.raises(MissingSourceFileError, match=r"QZx7/MindTheTime(.|\n)*put it at: .*5_session\.json"):
        parse_gapchat(tmp_path / "test/5_session.json")


@pytest.mark.parametrize("speaker", ["initial s", "session 2", "session 5", "next sess", "speaker_", "Initial Session"])
def test_header_glitch_patterns(speaker: str) -> None:
    """The truncated headers seen in the release are glitches."""
    assert is_header_glitch(speaker)


@pytest.mark.parametrize("speaker", ["speaker_1", "speaker_2", "speaker_3", "bob", ""])
def test_real_or_unknown_speakers_are_not_glitches(speaker: str) -> None:
    """Real speakers and unknown names are not silently dropped."""
    assert not is_header_glitch(speaker)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["initial s", "session 2", "next sess", "speaker_"])), max_size=8))
def test_gapchat_glitch_count_property(tmp_path_factory: pytest.TempPathFactory, inserts: list[tuple[int, str]]) -> None:
    """Inserting k glitch lines anywhere drops exactly k lines and leaves the real turns unchanged."""
    src = Path(__file__).parent / "fixtures/gapchat/test/5_session.json"
    data = json.loads(src.read_text())
    clean = list(parse_gapchat(src))
    for session, speaker in inserts:
        data[0]["sessions"][session].insert(0, {"speaker": speaker, "text": "", "time": "20230101-000000"})
    d = tmp_path_factory.mktemp("g") / "test"
    d.mkdir()
    (d / "5_session.json").write_text(json.dumps(data))
    report = ParseReport()
    eps = list(parse_gapchat(d / "5_session.json", report=report))
    assert report.glitch_turns_dropped == len(inserts)
    assert report.episodes_with_glitches == int(bool(inserts))
    assert [(e.sessions, e.episode_id) for e in eps] == [(e.sessions, e.episode_id) for e in clean]


def test_parsed_episodes_round_trip_through_json(fixtures: Path, shared_data: Path) -> None:
    """Every parsed episode (fixtures and real samples) survives the JSON the builders store."""
    eps: list[Episode] = []
    eps += parse_msc_parlai(fixtures / "msc_parlai/msc_dialogue/session_5/test.txt")
    eps += parse_cc(fixtures / "cc/test.jsonl")
    eps += parse_gapchat(fixtures / "gapchat/test/4_session.json")
    eps += parse_gapchat(shared_data / "gapchat/test/5_session.json")
    eps += parse_msc_cc_style(shared_data / "msc/theanine_sample_dialogue.json")
    for ep in eps:
        assert Episode.from_json(ep.to_json()) == ep
        ep.validate()



_utt = st.text(min_size=0, max_size=15)


@settings(max_examples=40, deadline=None)
@given(
    sessions=st.lists(st.lists(st.tuples(st.sampled_from(["Mentee", "Mentor"]), _utt), min_size=1, max_size=4), min_size=1, max_size=5),
    gaps=st.lists(st.sampled_from(["A few hours after", "A few days after", "A week after", "3 months after"]), min_size=4, max_size=4),
)
def test_cc_parser_keeps_every_utterance_property(tmp_path_factory: pytest.TempPathFactory, sessions, gaps) -> None:
    """Any well-formed CC record parses to exactly its utterances, speakers and gaps."""
    from icml_jax.data.sources.cc import ORDINALS

    rec = {"dataID": "episode-1", "relationship": "Mentee and Mentor", "time_interval": ["Start"] + gaps[: len(sessions) - 1]}
    for o, sess in zip(ORDINALS, sessions):
        rec[f"{o}_session_speakers"] = [s for s, _ in sess]
        rec[f"{o}_session_dialogue"] = [t for _, t in sess]
    f = tmp_path_factory.mktemp("cc") / "test.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    (ep,) = parse_cc(f)
    assert [[(t.speaker, t.text) for t in s.turns] for s in ep.sessions] == [list(s) for s in sessions]
    assert [s.gap_text for s in ep.sessions] == rec["time_interval"]
    assert all(s.gap_seconds and s.gap_seconds > 0 for s in ep.sessions[1:])


# --- issue 31: text that is not valid Unicode ------------------------------------------------------------------


def test_a_lone_surrogate_in_a_record_is_malformed_naming_file_line_key_and_offset(tmp_path: Path,
                                                                                   fixtures: Path) -> None:
    """JSON can spell a lone surrogate ("\\udc80"); it used to reach the tokenizer. Now a malformed record (an error
    or a counted skip) naming the file, the line, the key and the offset, whatever the source."""
    rec = {"dialog": [{"id": "Speaker 1", "text": "hi"}, {"id": "Speaker 2", "text": "caf\udce9 au lait"}]}
    f = tmp_path / "test.txt"
    f.write_text(json.dumps({"dialog": [{"text": "fine"}]}) + "\n" + json.dumps(rec) + "\n")
    assert "\\udce9" in f.read_text()  # the escape, as a file would hold it
    with pytest.raises(MalformedRecordError, match=r"test\.txt, line 2: record: key 'text' in dialog\[1\] is not "
                                                   r"valid UTF-8 \(byte 0xe9, or a lone surrogate U\+DCE9\) at "
                                                   r"character 3"):
        list(parse_msc_parlai(f))
    report = ParseReport()
    assert [e.episode_id for e in parse_msc_parlai(f, skip_malformed=True, report=report)] == ["msc-episode-0"]
    assert report.num_malformed_skipped == 1

    lines = (fixtures / "cc/test.jsonl").read_text().splitlines()
    bad = json.loads(lines[0])
    bad["second_session_dialogue"][1] = "x\ud800"
    f = tmp_path / "test.jsonl"
    f.write_text(json.dumps(bad) + "\n")
    with pytest.raises(MalformedRecordError, match=r"line 1: record: second_session_dialogue\[1\] holds a lone "
                                                   r"surrogate U\+D800 \(not valid Unicode text\) at character 1"):
        list(parse_cc(f))

    data = json.loads((fixtures / "gapchat/test/4_session.json").read_text())
    data[0]["sessions"][1][0]["text"] = "\udfff"
    f = tmp_path / "test" / "4_session.json"
    f.parent.mkdir()
    f.write_text(json.dumps(data))
    with pytest.raises(MalformedRecordError, match=r"record 0: record: key 'text' in sessions\[1\]\[0\] holds a "
                                                   r"lone surrogate U\+DFFF"):
        list(parse_gapchat(f))
