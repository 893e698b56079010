"""The LongMemEval source on a small sample in the release's format, one error per odd record, and the LoCoMo QA
protocol on it: turn-level recall over the has_answer turns, session-level recall over answer_session_ids."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import ml_collections
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml_jax.data.report import MalformedRecordError, ParseReport
from icml_jax.data.schema import Episode
from icml_jax.data.sources.locomo import questions
from icml_jax.data.sources.longmemeval import (
    QUESTION_TYPES,
    category_of,
    evidence_sessions,
    parse_date,
    parse_longmemeval,
    without_labels,
)
from icml_jax.evaluation import locomo_scoring as scoring
from icml_jax.evaluation.locomo_qa import ABSTAIN_HINT, NOT_MENTIONED, TEMPORAL_HINT, answer_request, play_qa, qa_items
from icml_jax.llm.offline import OfflineBackend
from tests.baselines.helpers import Recording, WordRecall, count_words

D = ["2023/05/20 (Sat) 02:21", "2023/05/22 (Mon) 10:00", "2023/05/25 (Thu) 18:30", "2023/06/01 (Thu) 09:15",
     "2023/06/03 (Sat) 11:45"]


def u(text: str, has_answer: bool | None = None) -> dict[str, Any]:
    """A user turn (``has_answer`` only when given, as the release writes it)."""
    return {"role": "user", "content": text} | ({} if has_answer is None else {"has_answer": has_answer})


def a(text: str) -> dict[str, Any]:
    """An assistant turn."""
    return {"role": "assistant", "content": text}


def sample() -> list[dict[str, Any]]:
    """Three questions: a single-session-user one, a temporal-reasoning one (an empty noise session, a number as
    answer, an answer session without a has_answer turn) and an abstention one."""
    return [
        {"question_id": "u1", "question_type": "single-session-user", "question": "What is the name of my bicycle?",
         "answer": "Comet", "question_date": "2023/05/30 (Tue) 08:00",
         "haystack_session_ids": ["sharegpt_x1", "answer_u1", "ultrachat_x2"], "haystack_dates": D[:3],
         "haystack_sessions": [
             [u("Can you suggest a pasta recipe?"), a("Try a simple carbonara.")],
             [u("I bought a red bicycle and named it Comet.", True), a("Lovely choice!", ), u("Thanks.", False)],
             [u("My bicycle needs a new chain."), a("A bike shop can fit one.")]],
         "answer_session_ids": ["answer_u1"]},
        {"question_id": "t1", "question_type": "temporal-reasoning",
         "question": "How many days before the marathon did I buy new running shoes?", "answer": 10,
         "question_date": "2023/06/10 (Sat) 12:00",
         "haystack_session_ids": ["answer_t1", "empty_x", "sharegpt_x3", "answer_t2", "answer_t3"],
         "haystack_dates": D,
         "haystack_sessions": [
             [u("I bought new running shoes today.", True), a("Enjoy them!")],
             [],
             [u("Can you suggest a soup recipe?"), a("Try a lentil soup.")],
             [u("I finished the city race today!", True), a("Congratulations!")],
             [u("The marathon was exhausting, any stretching tips?"), a("Stretch your calves gently.")]],
         "answer_session_ids": ["answer_t1", "answer_t2", "answer_t3"]},
        {"question_id": "u2_abs", "question_type": "single-session-user", "question": "What is the name of my cat?",
         "answer": "You did not mention a cat; you mentioned your bicycle Comet.",
         "question_date": "2023/05/30 (Tue) 08:00",
         "haystack_session_ids": ["answer_a1", "sharegpt_x4"], "haystack_dates": D[:2],
         "haystack_sessions": [[u("I ride my bicycle to work."), a("Good exercise!")],
                               [u("Can you suggest a salad recipe?"), a("Greek salad.")]],
         "answer_session_ids": ["answer_a1"]},
    ]


def write(tmp_path: Path, records: Any, name: str = "longmemeval_s.json") -> Path:
    """Writes ``records`` as a LongMemEval JSON file and returns its path."""
    path = tmp_path / name
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


@pytest.fixture
def episodes(tmp_path: Path) -> list[Episode]:
    """The sample, parsed."""
    return list(parse_longmemeval(write(tmp_path, sample())))


# --- the reader ---------------------------------------------------------------------------------------------------


def test_each_question_is_an_episode_with_its_sessions_dia_ids_and_dates(tmp_path: Path) -> None:
    report = ParseReport()
    u1, t1, abs1 = parse_longmemeval(write(tmp_path, sample()), report=report)
    assert [(e.dataset, e.episode_id) for e in (u1, t1, abs1)] == [("longmemeval", "u1"), ("longmemeval", "t1"),
                                                                   ("longmemeval", "u2_abs")]
    assert (report.records_read, report.episodes, report.questions, report.empty_sessions_dropped) == (3, 3, 3, 1)
    assert [s.meta for s in u1.sessions] == [{"session": n + 1, "session_id": sid, "date": d} for n, (sid, d) in
                                             enumerate(zip(["sharegpt_x1", "answer_u1", "ultrachat_x2"], D))]
    assert [t.speaker for t in u1.sessions[1].turns] == ["user", "assistant", "user"]
    assert [t.meta for t in u1.sessions[1].turns] == [{"dia_id": "D2:1", "has_answer": True}, {"dia_id": "D2:2"},
                                                     {"dia_id": "D2:3", "has_answer": False}]
    assert u1.sessions[1].turns[0].text == "I bought a red bicycle and named it Comet."
    assert [s.gap_seconds for s in u1.sessions] == [None, 2 * 86400 + 7 * 3600 + 39 * 60, 3 * 86400 + 8.5 * 3600]
    # the empty session is dropped; the sessions after it are numbered as kept, so dia_ids name episode sessions
    assert [s.meta["session_id"] for s in t1.sessions] == ["answer_t1", "sharegpt_x3", "answer_t2", "answer_t3"]
    assert [s.meta["date"] for s in t1.sessions] == [D[0], D[2], D[3], D[4]]
    assert [[t.meta["dia_id"] for t in s.turns] for s in t1.sessions][2] == ["D3:1", "D3:2"]
    assert u1.meta["source_file"] == "longmemeval_s.json" and t1.meta["record_index"] == 1
    for ep in (u1, t1, abs1):
        assert Episode.from_json(ep.to_json()) == ep


def test_the_question_its_category_evidence_and_answer_sessions(episodes: list[Episode]) -> None:
    (q1,), (q2,), (q3,) = (questions(e) for e in episodes)
    assert (q1.sample_id, q1.index, q1.question, q1.answer, q1.category) == (
        "u1", 0, "What is the name of my bicycle?", "Comet", 4)
    assert q1.evidence == ("D2:1",) and q1.unresolved_evidence == () and q1.adversarial_answer is None
    assert dict(q1.extra) == {"question_type": "single-session-user", "question_date": "2023/05/30 (Tue) 08:00",
                              "answer_session_ids": ["answer_u1"]}
    assert (q2.answer, q2.category, q2.evidence) == ("10", 2, ("D1:1", "D3:1"))  # a number answer as text
    assert (q3.category, q3.evidence) == (5, ())  # abstention
    assert [evidence_sessions(e) for e in episodes] == [(2,), (1, 3, 4), (1,)]  # answer_t3: no has_answer turn
    items = [i for e in episodes for i in qa_items(e)]
    assert [(i.question_id, i.category, i.evidence_ids, i.evidence_sessions, i.dataset) for i in items] == [
        ("u1", 4, ("D2:1",), (2,), "longmemeval"), ("t1", 2, ("D1:1", "D3:1"), (1, 3, 4), "longmemeval"),
        ("u2_abs", 5, (), (1,), "longmemeval")]
    assert [tuple(r) for r in items[1].evidence] == [(0, 0), (2, 0)]
    assert items[0].question_date == "2023/05/30 (Tue) 08:00"


def test_the_category_mapping_and_dates() -> None:
    assert {t: category_of("q", t) for t in QUESTION_TYPES} == {
        "single-session-user": 4, "single-session-assistant": 4, "single-session-preference": 4,
        "temporal-reasoning": 2, "knowledge-update": 4, "multi-session": 4}
    assert {category_of("q_abs", t) for t in QUESTION_TYPES} == {5}
    assert parse_date("2023/05/20 (Sat) 02:21").isoformat() == "2023-05-20T02:21:00"
    assert parse_date("20 May 2023") is None and parse_date("2023/13/01 (Sat) 02:21") is None


def test_without_labels_drops_the_question_has_answer_and_session_ids(episodes: list[Episode]) -> None:
    seen = without_labels(episodes[1])
    assert "qa" not in seen.meta and seen.meta["record_index"] == 1
    assert all("session_id" not in s.meta and s.meta["date"] for s in seen.sessions)
    assert all(set(t.meta) == {"dia_id"} for s in seen.sessions for t in s.turns)
    assert [t.text for s in seen.sessions for t in s.turns] == [t.text for s in episodes[1].sessions for t in s.turns]


# --- odd records: one error each, naming the file, the record, the question_id and the field ----------------------


def _drop(key: str):
    return lambda r: r.pop(key)


def _set(key: str, value: Any):
    return lambda r: r.__setitem__(key, value)


ODD = {
    **{f"missing {k}": (_drop(k), f"missing key '{k}'") for k in
       ("question_type", "question", "answer", "question_date", "haystack_session_ids", "haystack_dates",
        "haystack_sessions", "answer_session_ids")},
    "answer is a bool": (_set("answer", True), "key 'answer' must be str/int/float, got bool"),
    "answer is a list": (_set("answer", ["a"]), "key 'answer' must be str/int/float"),
    "empty question": (_set("question", "  "), "key 'question' is empty"),
    "unknown question_type": (_set("question_type", "abstention"), "key 'question_type' must be one of"),
    "dates shorter": (lambda r: r["haystack_dates"].pop(), "haystack lists differ in length: haystack_session_ids "
                                                           "3, haystack_dates 2, haystack_sessions 3"),
    "sessions longer": (lambda r: r["haystack_sessions"].append([]), "haystack_sessions 4"),
    "ids not strings": (_set("haystack_session_ids", ["a", 1, "b"]), "key 'haystack_session_ids' must be a list"),
    "repeated session id": (_set("haystack_session_ids", ["answer_u1", "answer_u1", "x"]),
                            "haystack_session_ids[1] 'answer_u1' repeats haystack_session_ids[0]"),
    "answer session not in haystack": (_set("answer_session_ids", ["answer_u1", "answer_zz"]),
                                       "answer_session_ids[1] 'answer_zz' names no session of haystack_session_ids"),
    "answer session empty": (lambda r: r["haystack_sessions"].__setitem__(1, []),
                             "answer_session_ids[0] 'answer_u1' names an empty session (haystack_sessions[1])"),
    "session not a list": (lambda r: r["haystack_sessions"].__setitem__(0, {"role": "user"}),
                           "haystack_sessions[0] must be a list of turns, got dict"),
    "turn not an object": (lambda r: r["haystack_sessions"][0].__setitem__(1, "hi"),
                           "expected a JSON object in haystack_sessions[0][1], got str"),
    "system role": (lambda r: r["haystack_sessions"][2][0].__setitem__("role", "system"),
                    "key 'role' in haystack_sessions[2][0] must be 'user' or 'assistant', got 'system'"),
    "content missing": (lambda r: r["haystack_sessions"][1][1].pop("content"),
                        "missing key 'content' in haystack_sessions[1][1]"),
    "has_answer not a bool": (lambda r: r["haystack_sessions"][1][0].__setitem__("has_answer", "yes"),
                              "key 'has_answer' in haystack_sessions[1][0] must be bool, got str"),
    "a dia_id in the source": (lambda r: r["haystack_sessions"][1][0].__setitem__("dia_id", "D9:9"),
                               "key 'dia_id' in haystack_sessions[1][0]"),
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_an_odd_record_is_refused_naming_the_file_record_question_and_field(tmp_path: Path, name: str) -> None:
    change, message = ODD[name]
    records = sample()
    odd = records[1] = copy.deepcopy(records[0]) | {"question_id": "odd1"}
    change(odd)
    path = write(tmp_path, records)
    with pytest.raises(MalformedRecordError) as e:
        list(parse_longmemeval(path))
    assert str(e.value).startswith(f"{path}, record 1: question_id 'odd1': ")
    assert message in str(e.value)
    report = ParseReport()
    kept = list(parse_longmemeval(path, skip_malformed=True, report=report))
    assert [ep.episode_id for ep in kept] == ["u1", "u2_abs"] and report.num_malformed_skipped == 1
    assert report.questions == 2  # nothing of the skipped record counted


@pytest.mark.parametrize("record, message", [
    ("not a record", "question_id None: expected a JSON object, got str"),
    ({"question": "q?"}, "question_id None: missing key 'question_id'"),
    ({"question_id": 7}, "question_id 7: key 'question_id' must be str, got int"),
    ({"question_id": " "}, "question_id ' ': key 'question_id' is empty"),
    ({"question_id": "u1"}, "question_id 'u1': key 'question_id' repeats record 0's"),
])
def test_a_record_without_a_usable_question_id_is_refused(tmp_path: Path, record: Any, message: str) -> None:
    path = write(tmp_path, [sample()[0], record])
    with pytest.raises(MalformedRecordError, match="record 1: ") as e:
        list(parse_longmemeval(path))
    assert message in str(e.value)


_TURNS = st.lists(st.tuples(st.sampled_from(["user", "assistant"]), st.sampled_from([None, False, True])),
                  min_size=1, max_size=3)


@settings(max_examples=40, deadline=None)
@given(st.lists(_TURNS, min_size=1, max_size=6), st.randoms(use_true_random=False), st.data())
def test_any_session_order_round_trips(tmp_path_factory, sessions, rng, data) -> None:
    """Sessions keep the given order (shuffled ids and dates too); dia_ids, evidence and answer sessions follow."""
    order = list(range(len(sessions)))
    rng.shuffle(order)
    ids = [f"s{k}" for k in order]
    dates = [f"2023/0{1 + k % 9}/1{k % 9} (Mon) 1{k % 9}:00" for k in order]
    raw = [[{"role": r, "content": f"{k}-{t}"} | ({} if h is None else {"has_answer": h})
            for t, (r, h) in enumerate(sessions[k])] for k in order]
    answers = data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids)))
    record = {"question_id": "p", "question_type": "multi-session", "question": "Which?", "answer": "that",
              "question_date": "2024/01/01 (Mon) 00:00", "haystack_session_ids": ids, "haystack_dates": dates,
              "haystack_sessions": raw, "answer_session_ids": answers}
    (ep,) = parse_longmemeval(write(tmp_path_factory.mktemp("p"), [record]))
    assert [s.meta["session_id"] for s in ep.sessions] == ids and [s.meta["date"] for s in ep.sessions] == dates
    assert [[t.text for t in s.turns] for s in ep.sessions] == [[u["content"] for u in s] for s in raw]
    expected = [f"D{n + 1}:{t + 1}" for n, s in enumerate(raw) for t, x in enumerate(s) if x.get("has_answer")]
    (q,) = questions(ep)
    assert list(q.evidence) == expected and q.category == 4
    assert evidence_sessions(ep) == tuple(ids.index(x) + 1 for x in answers)
    assert all(scoring.session_number(d) == n + 1 for n, s in enumerate(ep.sessions) for d in
               (t.meta["dia_id"] for t in s.turns))
    assert Episode.from_json(ep.to_json()) == ep


# --- the QA protocol on LongMemEval episodes ---------------------------------------------------------------------


def test_the_oracle_reaches_every_has_answer_turn_and_session_recall_counts_answer_sessions(episodes) -> None:
    rows, ingested = play_qa(None, episodes, OfflineBackend(), user_speaker=None, count_tokens=count_words)
    assert ingested == [] and [r["question_id"] for r in rows] == ["u1", "t1", "u2_abs"]
    u1, t1, abs1 = rows
    assert (u1["reached"], u1["reached_sessions"], u1["evidence_sessions"]) == (["D2:1"], [2], [2])
    assert (u1["evidence_recall"], u1["session_recall"]) == (1.0, 1.0)
    # answer_t3 (session 4) has no has_answer turn: the oracle shows the evidence turns, so it misses that session
    assert (t1["reached"], t1["reached_sessions"], t1["evidence_sessions"]) == (["D1:1", "D3:1"], [1, 3], [1, 3, 4])
    assert t1["evidence_recall"] == 1.0 and t1["session_recall"] == pytest.approx(2 / 3)
    assert scoring.session_recall(t1["evidence"], t1["reached_sessions"]) == 1.0  # what dia_ids alone would say
    assert (abs1["evidence_recall"], abs1["session_recall"], abs1["memory"]) == (None, 0.0, None)
    assert abs1["prediction"] == NOT_MENTIONED and abs1["f1"] == 1.0 and abs1["bleu1"] is None  # abstained
    for row in rows:
        assert row["dataset"] == "longmemeval" and row["sample_id"] == row["question_id"]
        assert row["session_recall"] == scoring.evidence_session_recall(row["evidence_sessions"],
                                                                        row["reached_sessions"])
        assert row["f1"] == scoring.locomo_f1(row["prediction"], row["answer"], row["category"])
    assert t1["answer"] == "10" and t1["question_date"] == "2023/06/10 (Sat) 12:00"


def test_an_agent_sees_no_label_and_recall_counts_turns_and_answer_sessions(episodes) -> None:
    agent, generator = WordRecall(), Recording()
    rows, ingested = play_qa(agent, episodes, generator, user_speaker=None, count_tokens=count_words)
    assert [i["turns"] for i in ingested] == [7, 8, 4]
    for ep in agent.seen:
        assert "qa" not in ep.meta and all("session_id" not in s.meta for s in ep.sessions)
        assert all("has_answer" not in t.meta for s in ep.sessions for t in s.turns)
    u1, t1, abs1 = rows
    assert u1["reached"] == ["D2:1", "D3:1"] and (u1["evidence_recall"], u1["session_recall"]) == (1.0, 1.0)
    # "marathon" finds the answer session without a has_answer turn, "running shoes" the first; the race is missed
    assert t1["reached"] == ["D1:1", "D4:1"] and t1["reached_sessions"] == [1, 4]
    assert t1["evidence_recall"] == 0.5 and t1["session_recall"] == pytest.approx(2 / 3)
    assert abs1["reached"] == [] and (abs1["evidence_recall"], abs1["session_recall"]) == (None, 0.0)
    prompts = {r.metadata["question_id"]: r.prompt for r in generator.requests}
    assert "Current date: 2023/06/10 (Sat) 12:00" in prompts["t1"] and TEMPORAL_HINT in prompts["t1"]
    assert "session 1: 2023/05/20 (Sat) 02:21; session 4: 2023/06/03 (Sat) 11:45" in prompts["t1"]
    assert ABSTAIN_HINT in prompts["u2_abs"] and "Select the correct answer" not in prompts["u2_abs"]
    assert "cat;" not in prompts["u2_abs"] and "Comet" not in prompts["u2_abs"]  # the gold explanation stays out
    assert ABSTAIN_HINT not in prompts["u1"] and TEMPORAL_HINT not in prompts["u1"]


def test_the_abstention_cue_is_locomos_choice_only_for_locomo(episodes) -> None:
    item = qa_items(episodes[2])[0]
    assert ABSTAIN_HINT in answer_request(item, None, None).prompt
    locomo_like = type(item)(item.question_id, item.question, None, 5, (), (), adversarial_answer="Tom")
    prompt = answer_request(locomo_like, None, None).prompt
    assert "Select the correct answer" in prompt and ABSTAIN_HINT not in prompt and "Current date" not in prompt


def test_the_experiment_reads_a_longmemeval_file_by_format(tmp_path: Path) -> None:
    from icml_jax.experiments.locomo import LocomoSettings, conversations

    path = write(tmp_path, sample())
    config = ml_collections.ConfigDict({"experiments": {"locomo": {"file": str(path), "format": "longmemeval",
                                                                   "conversations": 2}}})
    got = LocomoSettings.from_config(config)
    assert [e.episode_id for e in conversations(got)] == ["u1", "t1"]
    assert got.record()["format"] == "longmemeval" and "format" not in LocomoSettings(file="x").record()
    config.experiments.locomo.format = "lme"
    with pytest.raises(ValueError, match=r"format must be one of \['locomo', 'longmemeval'\].*'lme'"):
        LocomoSettings.from_config(config)
