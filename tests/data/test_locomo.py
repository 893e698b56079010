"""The LoCoMo source: every record of the shared file, a hand-written fixture, and one error per odd record."""

from __future__ import annotations

import collections
import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml_jax.data.report import MalformedFileError, MalformedRecordError, MissingSourceFileError, ParseReport
from icml_jax.data.schema import Episode, SchemaError, Session, Turn, TurnRef
from icml_jax.data.sources.locomo import (
    CATEGORIES,
    LocomoQuestion,
    evidence_refs,
    first_sessions,
    parse_locomo,
    questions,
    split_evidence,
    turn_ref,
    turn_refs,
    without_labels,
)

LOCOMO7 = Path(__file__).resolve().parents[2].parent / "shared/data/locomo/locomo7.json"
FIXTURE = Path(__file__).resolve().parent / "fixtures/locomo/locomo10.json"
DAY = 86400.0


@pytest.fixture(scope="module")
def locomo7() -> tuple[list[Episode], ParseReport, list[dict[str, Any]]]:
    """The shared 7-conversation file parsed once: (episodes, report, raw records)."""
    if not LOCOMO7.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{LOCOMO7} not found (CI must provide ../shared/data/locomo)")
        pytest.skip(f"the shared LoCoMo file is not at {LOCOMO7} (a clone without ../shared beside it)")
    report = ParseReport()
    episodes = list(parse_locomo(LOCOMO7, report=report))
    return episodes, report, json.loads(LOCOMO7.read_text(encoding="utf-8"))


# --- the shared file, every record --------------------------------------------------------------------------------


def test_locomo7_every_question_read_with_the_documented_category_counts(locomo7) -> None:
    """1,347 questions, per category as docs/locomo.md counts them; answers as text, category 5 apart."""
    episodes, report, raw = locomo7
    assert [e.episode_id for e in episodes] == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43", "conv-44",
                                                "conv-47"]
    assert report.records_read == report.episodes == 7 and report.num_malformed_skipped == 0
    qs = [q for e in episodes for q in questions(e)]
    assert len(qs) == report.questions == sum(len(r["qa"]) for r in raw) == 1347
    assert collections.Counter(q.category for q in qs) == {1: 192, 2: 214, 3: 66, 4: 563, 5: 312}
    for q, item in zip(qs, (item for r in raw for item in r["qa"]), strict=True):
        assert q.question == item["question"] and q.category == item["category"]
        assert q.answer == (str(item["answer"]) if "answer" in item else None)
        assert q.raw_evidence == tuple(item["evidence"])
    assert all(isinstance(q.answer, str) for q in qs if q.category != 5)
    assert sum(isinstance(item.get("answer"), int) for r in raw for item in r["qa"]) == 6  # 2022 (x4), 2, 3
    cat5 = [q for q in qs if q.category == 5]
    assert sum(q.answer is None for q in cat5) == 310 and all(q.adversarial_answer for q in cat5)
    assert len({q.question_id for q in qs}) == 1347 and qs[0].question_id == "conv-26/0"


def test_locomo7_evidence_resolved_or_marked_with_the_counts(locomo7) -> None:
    """Every evidence id names a turn or is kept as unresolved: 2 strings normalised, 3 unresolved (locomo.md)."""
    episodes, report, _ = locomo7
    assert (report.evidence_normalised, report.evidence_unresolved) == (2, 3)
    unresolved, rewritten = {}, {}
    for ep in episodes:
        refs = turn_refs(ep)
        for q in questions(ep):
            assert all(d in refs for d in q.evidence)
            assert evidence_refs(ep, q) == tuple(refs[d] for d in q.evidence)
            if q.unresolved_evidence:
                unresolved[q.question_id] = q.unresolved_evidence
            if q.evidence != q.raw_evidence:
                rewritten[q.question_id] = (q.raw_evidence, q.evidence)
    assert unresolved == {"conv-42/58": ("D10:19",), "conv-42/88": ("D",), "conv-47/38": ("D4:36",)}
    assert rewritten["conv-26/37"] == (("D8:6; D9:17",), ("D8:6", "D9:17"))
    assert rewritten["conv-43/18"][1][4] == "D11:26"  # "D:11:26"
    assert len(rewritten) == 5  # the two above and the three with an unresolved id left out
    assert sum(len(q.evidence) for e in episodes for q in questions(e)) == 1834 - 3 + 1  # +1: the split string
    assert sum(not q.evidence and not q.unresolved_evidence for e in episodes for q in questions(e)) == 2


def test_locomo7_sessions_turns_dia_ids_speakers_and_images(locomo7) -> None:
    """Sessions 1..N in numeric order with their dates, every turn in dia_id order, image captions shown."""
    episodes, _, raw = locomo7
    assert [len(e.sessions) for e in episodes] == [19, 19, 32, 29, 29, 28, 31]
    assert [e.num_turns for e in episodes] == [419, 369, 663, 629, 680, 675, 689]
    captions = 0
    for ep, rec in zip(episodes, raw, strict=True):
        conv = rec["conversation"]
        assert ep.meta["speakers"] == [conv["speaker_a"], conv["speaker_b"]]
        for si, session in enumerate(ep.sessions):
            n = si + 1
            assert session.meta == {"session": n, "date_time": conv[f"session_{n}_date_time"]}
            assert (session.gap_seconds is None) == (si == 0) and (si == 0 or session.gap_seconds > 0)
            source = conv[f"session_{n}"]
            assert [t.meta["dia_id"] for t in session.turns] == [f"D{n}:{k + 1}" for k in range(len(source))]
            assert [t.speaker for t in session.turns] == [u["speaker"] for u in source]
            for turn, utt in zip(session.turns, source, strict=True):
                if utt.get("blip_caption"):
                    captions += 1
                    assert turn.text == f"{utt['text']} [shares {utt['blip_caption']}]"
                    assert turn.meta["blip_caption"] == utt["blip_caption"]
                else:
                    assert turn.text == utt["text"]
        assert Episode.from_json(ep.to_json()) == ep
        ep.validate()
    assert captions == 867
    assert list(episodes[0].meta["unused_date_times"]) == [f"session_{n}_date_time" for n in range(20, 36)]
    assert all("unused_date_times" not in e.meta for e in episodes[1:])
    assert set(episodes[0].meta["annotations"]) == {"event_summary", "observation", "session_summary"}


# --- the hand-written fixture ------------------------------------------------------------------------------------


def test_fixture_numeric_session_order_images_and_dates() -> None:
    """Keys stored 10, 2, 1, 11, 3..9 come out 1..11; trailing date_times are kept; the caption is shown."""
    report = ParseReport()
    a, b = parse_locomo(FIXTURE, report=report)
    assert (a.episode_id, b.episode_id, a.dataset) == ("conv-1", "conv-2", "locomo")
    assert [s.meta["session"] for s in a.sessions] == list(range(1, 12))
    assert [len(s.turns) for s in a.sessions] == [2, 2, 3] + [2] * 8
    assert a.sessions[0].turns[0] == Turn("Ann", "I went to a pottery class yesterday.", meta={"dia_id": "D1:1"})
    img = a.sessions[1].turns[0]
    assert img.text == "I started hiking on weekends. [shares a photo of a mountain trail]"
    assert img.meta == {"dia_id": "D2:1", "img_url": ["https://example.org/trail.jpg"],
                        "blip_caption": "a photo of a mountain trail", "query": "mountain trail"}
    caption_only = a.sessions[9].turns[0]  # a caption without img_url (245 such turns in locomo7.json)
    assert caption_only.text.endswith("[shares a blue painted ceramic tile]") and caption_only.meta["re-download"]
    assert a.sessions[0].gap_seconds is None and a.sessions[1].gap_seconds == 12 * DAY - (13 * 3600 + 56 * 60 - 36000)
    assert a.sessions[1].gap_text is None
    assert a.meta["unused_date_times"] == {"session_12_date_time": "4:10 pm on 26 November, 2023",
                                           "session_13_date_time": "9:35 am on 3 December, 2023"}
    assert a.meta["speakers"] == ["Ann", "Ben"] and a.meta["source_file"] == "locomo10.json"
    assert a.meta["annotations"]["session_summary"] == {"session_1_summary": "Ann and Ben talked about pottery."}
    assert "annotations" not in b.meta
    assert (report.questions, report.evidence_normalised, report.evidence_unresolved) == (12, 4, 2)


def test_fixture_questions_answers_and_evidence() -> None:
    """Integer answers as text, category 5 without an answer, every odd evidence shape normalised or marked."""
    a, _ = parse_locomo(FIXTURE)
    q = questions(a)
    assert [x.category for x in q] == [2, 2, 1, 3, 4, 5, 5, 1, 4, 4, 4]
    assert q[1].answer == "2023" and q[7].answer == "2"
    assert (q[5].answer, q[5].adversarial_answer, q[5].category_name) == (None, "Rex", "adversarial")
    assert (q[6].answer, q[6].adversarial_answer) == ("No", "Yes")
    assert [(x.evidence, x.unresolved_evidence) for x in q[2:5]] == [
        (("D2:1", "D2:2"), ()), (("D3:2",), ()), (("D3:3",), ("D",))]
    assert (q[7].evidence, q[7].unresolved_evidence) == (("D2:1", "D9:1"), ("D2:9",))  # session 2 has 2 turns
    assert q[8].evidence == ("D10:1", "D10:2") and q[8].raw_evidence == ("D10:1 D10:02",)
    assert q[9].evidence == () and q[10].evidence == ("D3:1",)
    assert turn_ref(a, "D10:1") == TurnRef(9, 0) and a.turn(turn_ref(a, "D3:3")).text == "Rex is a beagle."
    assert evidence_refs(a, q[7]) == (TurnRef(1, 0), TurnRef(8, 0))
    with pytest.raises(KeyError, match="conv-1.*'D2:9'"):
        turn_ref(a, "D2:9")
    assert [LocomoQuestion.from_dict(json.loads(json.dumps(x.to_dict()))) for x in q] == q


def test_first_sessions_keeps_the_questions_whose_evidence_it_keeps() -> None:
    """A cut to n sessions keeps those sessions and exactly the questions answerable from them, ids unchanged."""
    a, _ = parse_locomo(FIXTURE)
    cut = first_sessions(a, 3)
    assert cut.sessions == a.sessions[:3] and cut.episode_id == a.episode_id
    kept = questions(cut)
    # out: q[1] and q[8] (session 10), q[4] (an unresolved id), q[7] (session 9, and unresolved), q[9] (none)
    assert [q.question_id for q in kept] == [f"conv-1/{i}" for i in (0, 2, 3, 5, 6, 10)]
    every = questions(a)
    expected = [q for q in every if q.evidence and not q.unresolved_evidence
                and all(turn_ref(a, d).session < 3 for d in q.evidence)]
    assert kept == expected and 0 < len(kept) < len(every)
    assert first_sessions(a, len(a.sessions) + 5).sessions == a.sessions
    assert questions(first_sessions(a, 10)) == [q for q in every if q.evidence and not q.unresolved_evidence]
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="positive integer"):
            first_sessions(a, bad)


@pytest.mark.parametrize(
    "raw, ids, bad",
    [
        ("D1:3", ("D1:3",), ()),
        ("D8:6; D9:17", ("D8:6", "D9:17"), ()),
        ("D:11:26", ("D11:26",), ()),
        ("D9:1 D4:4 D4:6", ("D9:1", "D4:4", "D4:6"), ()),
        ("D30:05", ("D30:5",), ()),
        ("D1:2,D1:3", ("D1:2", "D1:3"), ()),
        ("D", (), ("D",)),
        ("D1:2; see D3", ("D1:2",), ("see D3",)),
        ("D10:1:9", (), ("D10:1:9",)),
        ("  ", (), ("  ",)),
    ],
)
def test_split_evidence(raw: str, ids: tuple[str, ...], bad: tuple[str, ...]) -> None:
    """Well-formed ids come out canonical; whatever is not one is kept as written, never dropped."""
    assert split_evidence(raw) == (ids, bad)


def test_labels_travel_in_meta_and_can_be_dropped() -> None:
    """questions() reads meta["qa"]; without_labels drops qa and annotations; a stripped episode has none."""
    a, _ = parse_locomo(FIXTURE)
    bare = without_labels(a)
    assert bare.sessions == a.sessions and "qa" not in bare.meta and "annotations" not in bare.meta
    assert bare.meta["speakers"] == ["Ann", "Ben"]
    with pytest.raises(SchemaError, match="'conv-1' \\(locomo\\) carries no LoCoMo questions"):
        questions(bare)
    other = Episode("gapchat", "g", (Session((Turn("A", "hi"),)),))
    assert without_labels(other) is other
    with pytest.raises(SchemaError, match="no LoCoMo questions"):
        questions(other)
    bad = dict(a.meta, qa=[dict(a.meta["qa"][0], category=9)])
    with pytest.raises(SchemaError, match="category must be one of 1..5, got 9"):
        questions(Episode("locomo", "conv-1", a.sessions, meta=bad))


# --- odd records: one error each, naming file, record, sample_id and field ---------------------------------------


def _conv(r: dict[str, Any]) -> dict[str, Any]:
    return r["conversation"]


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda r: r["qa"][0].pop("question"), r"missing key 'question' in qa\[0\]"),
        (lambda r: r["qa"][1].update(question=7), r"key 'question' in qa\[1\] must be str, got int"),
        (lambda r: r["qa"][2].update(question=" "), r"key 'question' in qa\[2\] is empty"),
        (lambda r: r["qa"][0].update(category=6), r"key 'category' in qa\[0\] must be one of 1..5, got 6"),
        (lambda r: r["qa"][0].update(category=0), r"key 'category' in qa\[0\] must be one of 1..5, got 0"),
        (lambda r: r["qa"][0].update(category=True), r"key 'category' in qa\[0\] must be one of 1..5, got True"),
        (lambda r: r["qa"][0].update(category="2"), r"key 'category' in qa\[0\] must be int, got str"),
        (lambda r: r["qa"][0].pop("category"), r"missing key 'category' in qa\[0\]"),
        (lambda r: r["qa"][4].pop("answer"), r"missing key 'answer' in qa\[4\] \(category 4; only category 5"),
        (lambda r: r["qa"][4].update(answer=["beagle"]), r"key 'answer' in qa\[4\] must be a string or a number"),
        (lambda r: r["qa"][5].update(adversarial_answer={}), r"key 'adversarial_answer' in qa\[5\] must be a string"),
        (lambda r: r["qa"][0].update(evidence="D1:1"), r"key 'evidence' in qa\[0\] must be list, got str"),
        (lambda r: r["qa"][0].update(evidence=["D1:1", 2]), r"key 'evidence' in qa\[0\] must be a list of strings"),
        (lambda r: r["qa"][0].pop("evidence"), r"missing key 'evidence' in qa\[0\]"),
        (lambda r: r["qa"].__setitem__(3, "what?"), r"expected a JSON object in qa\[3\], got str"),
        (lambda r: r.update(qa={}), r"key 'qa' must be list, got dict"),
        (lambda r: r.pop("conversation"), r"missing key 'conversation'"),
        (lambda r: _conv(r).pop("speaker_b"), r"missing key 'speaker_b' in conversation"),
        (lambda r: _conv(r).pop("session_3_date_time"), r"conversation\.session_3 has no session_3_date_time"),
        (lambda r: _conv(r).pop("session_5"), r"conversation has session_11 but no session_5"),
        (lambda r: _conv(r).update(session_4_date_time=4), r"key 'session_4_date_time' in conversation must be str"),
        (lambda r: _conv(r).update(session_2="hi"), r"conversation\.session_2 must be a list of turns, got str"),
        (lambda r: _conv(r)["session_10"][1].update(speaker="Cat"),
         r"speaker 'Cat' in conversation\.session_10\[1\] is neither speaker_a 'Ann' nor speaker_b 'Ben'"),
        (lambda r: _conv(r)["session_3"][2].pop("dia_id"), r"missing key 'dia_id' in conversation\.session_3\[2\]"),
        (lambda r: _conv(r)["session_3"][2].update(dia_id="D3:1"),
         r"dia_id 'D3:1' in conversation\.session_3\[2\] repeats the one in conversation\.session_3\[0\]"),
        (lambda r: _conv(r)["session_3"][0].pop("text"), r"missing key 'text' in conversation\.session_3\[0\]"),
        (lambda r: _conv(r)["session_2"][0].update(blip_caption=["a trail"]),
         r"key 'blip_caption' in conversation\.session_2\[0\] must be str, got list"),
        (lambda r: r.update(observation=[]), r"key 'observation' must be dict, got list"),
        (lambda r: r["qa"][0].update(question="caf\udce9"), r"record: key 'question' in qa\[0\] is not valid UTF-8"),
    ],
)
def test_odd_record_is_one_error_naming_sample_id_and_field(tmp_path: Path, mutate, reason: str) -> None:
    """Each fault fails naming file, record, sample_id and field; skip_malformed skips and counts it instead."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    mutate(data[0])
    f = tmp_path / "locomo10.json"
    f.write_text(json.dumps(data))
    with pytest.raises(MalformedRecordError, match=rf"locomo10\.json, record 0: sample_id 'conv-1': {reason}"):
        list(parse_locomo(f))
    report = ParseReport()
    assert [e.episode_id for e in parse_locomo(f, skip_malformed=True, report=report)] == ["conv-2"]
    assert report.num_malformed_skipped == 1 and report.questions == 1  # the skipped record counts nothing


def test_missing_sample_id_and_a_top_level_that_is_no_list(tmp_path: Path) -> None:
    """Without a sample_id the error names the record; a file that is no JSON list is a file error."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    del data[1]["sample_id"]
    f = tmp_path / "locomo10.json"
    f.write_text(json.dumps(data))
    with pytest.raises(MalformedRecordError, match=r"record 1: missing key 'sample_id'"):
        list(parse_locomo(f))
    f.write_text(json.dumps(data[0]))
    with pytest.raises(MalformedFileError, match=r"locomo10\.json, top level: expected a JSON list"):
        parse_locomo(f)


def test_missing_file_points_at_the_release(tmp_path: Path) -> None:
    """A missing file says what to get (locomo10.json), from where and where to put it."""
    with pytest.raises(MissingSourceFileError, match=r"(?s)locomo10\.json.*snap-research/locomo.*put it at"):
        parse_locomo(tmp_path / "locomo10.json")


def test_empty_session_dropped_and_counted_and_bad_dates_counted(tmp_path: Path) -> None:
    """An empty session goes (counted, its date kept); an unreadable or backward date leaves that gap None."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    conv = data[0]["conversation"]
    conv["session_4"] = []
    conv["session_7_date_time"] = "sometime in summer"
    conv["session_9_date_time"] = "1:00 am on 1 January, 2020"
    for q in data[0]["qa"]:  # keep evidence off the dropped session
        q["evidence"] = [e for e in q["evidence"] if not e.startswith("D4:")]
    f = tmp_path / "locomo10.json"
    f.write_text(json.dumps(data))
    report = ParseReport()
    a, _ = parse_locomo(f, report=report)
    assert [s.meta["session"] for s in a.sessions] == [1, 2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert report.empty_sessions_dropped == 1 and a.meta["unused_date_times"]["session_4_date_time"]
    gaps = {s.meta["session"]: s.gap_seconds for s in a.sessions}
    assert gaps[5] == pytest.approx((30 - 1) * DAY + 2 * 3600 + 50 * 60)  # from session 3, the one before
    assert gaps[7] is None and gaps[8] is None and gaps[9] is None and gaps[10] is not None
    assert report.unparsed_gaps == 3
    assert turn_ref(a, "D5:1") == TurnRef(3, 0)


_SHUFFLE = st.randoms(use_true_random=False)


@settings(max_examples=30, deadline=None)
@given(answers=st.lists(st.integers(-10**6, 10**9), min_size=11, max_size=11), rnd=_SHUFFLE)
def test_integer_answers_become_text_and_key_order_does_not_matter(tmp_path_factory: pytest.TempPathFactory,
                                                                    answers: list[int], rnd) -> None:
    """Any integer answer reads as its str(); any order of the record's, conversation's and turns' keys gives
    the same Episode as the sorted one."""
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    for item, n in zip(data[0]["qa"], answers, strict=True):
        if item["category"] != 5:
            item["answer"] = n
    as_text = copy.deepcopy(data)
    for item in as_text[0]["qa"]:
        if item["category"] != 5:
            item["answer"] = str(item["answer"])

    def shuffled(x: Any) -> Any:
        if isinstance(x, dict):
            keys = list(x)
            rnd.shuffle(keys)
            return {k: shuffled(x[k]) for k in keys}
        return [shuffled(v) for v in x] if isinstance(x, list) else x

    d = tmp_path_factory.mktemp("locomo")
    (d / "a").mkdir()
    (d / "b").mkdir()
    (d / "a/locomo10.json").write_text(json.dumps(shuffled(data)))
    (d / "b/locomo10.json").write_text(json.dumps(as_text, sort_keys=True))
    got, want = list(parse_locomo(d / "a/locomo10.json")), list(parse_locomo(d / "b/locomo10.json"))
    assert got == want
    assert [q.answer for q in questions(got[0]) if q.category != 5] == [
        str(n) for n, item in zip(answers, data[0]["qa"]) if item["category"] != 5]
    assert [s.meta["session"] for s in got[0].sessions] == list(range(1, 12))
    assert set(CATEGORIES) == {1, 2, 3, 4, 5} and re.fullmatch(r"conv-\d+", got[0].episode_id)
