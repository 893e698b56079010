"""LongMemEval (Wu et al., ICLR 2025, "Benchmarking Chat Assistants on Long-Term Interactive Memory") -> Episodes.

The release's ``longmemeval_s.json``, ``longmemeval_m.json`` and ``longmemeval_oracle.json`` are each one JSON list
of questions: ``question_id`` (ending in ``_abs`` for an abstention question), ``question_type`` (one of
``QUESTION_TYPES``), ``question``, ``answer``, ``question_date``, and the question's own chat history as three
parallel lists, ``haystack_session_ids``, ``haystack_dates`` and ``haystack_sessions`` (each session a list of
turns ``{"role": "user" | "assistant", "content": str}``, the evidence turns also ``"has_answer": true``), plus
``answer_session_ids``, the evidence sessions.

Each question is one Episode (dataset "longmemeval", ``episode_id`` = question_id), the same shape the LoCoMo
protocol (``evaluation.locomo_qa``) reads:

- Sessions in the order given (sorted by date in the s and m files, not in the oracle file), empty ones dropped
  and counted; ``Session.meta`` holds ``session`` (its 1-based number here), ``session_id`` and ``date`` (the
  source's strings); ``gap_seconds`` is the time since the previous session's date (None, counted as an unparsed
  gap, when a date does not parse or goes backwards).
- Turns: ``speaker`` = role, ``text`` = content; ``Turn.meta`` holds ``dia_id`` = "D<session>:<turn>" (both
  1-based, so ``locomo_scoring.session_number`` reads the session) and every other field of the turn verbatim
  (``has_answer`` included).
- The question: ``meta["qa"]``, one ``LocomoQuestion.to_dict()`` (sample_id = question_id, index 0, the answer as
  text, evidence = the dia_ids of the ``has_answer`` turns of either role, ``extra`` = question_type,
  question_date and answer_session_ids as given). ``questions(episode)`` of the locomo module reads it;
  ``evidence_sessions(episode)`` gives the answer sessions as session numbers.

The category only picks LoCoMo's scorer and prompt cue; LongMemEval itself judges every answer with GPT-4o
(its ``evaluate_qa.py``, a prompt per question type):

- abstention (question_id ends in ``_abs``) -> 5: the answer should say the history does not tell (scored as
  LoCoMo's adversarial category: "not mentioned" in the answer);
- temporal-reasoning -> 2: LoCoMo's date cue;
- every other type (single-session-user, single-session-assistant, single-session-preference,
  knowledge-update, multi-session) -> 4: plain token F1.

Labels an agent must not see (``without_labels``): the question (``meta["qa"]``), every turn's ``has_answer``
and every session's ``session_id`` (the release names evidence sessions ``answer_...``).

Differences from LongMemEval's own retrieval metrics (``src/retrieval``): those index user turns only and, at
session level, drop an answer session none of whose user turns has ``has_answer``; here evidence turns are the
``has_answer`` turns of both roles and the evidence sessions are ``answer_session_ids`` as given.

Any odd record is a MalformedRecordError naming the file, the record index, the question_id and the field: a
missing or ill-typed field, an unknown question_type or role, haystack lists of different lengths, a haystack
session id given twice, an answer_session_id that names no session of the haystack (the release builds each
haystack around its answer sessions, so a missing one means an edited file; counting it unresolved would shrink
session recall's denominator) or names an empty one, and a question_id seen before.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from collections.abc import Iterator
from typing import Any

from icml_jax.data.report import ParseReport
from icml_jax.data.schema import Episode, SchemaError, Session, Turn
from icml_jax.data.sources._common import BadRecord, load_json_list, need, require_file, str_list
from icml_jax.data.sources.locomo import QA_KEY, LocomoQuestion, questions

DATASET = "longmemeval"
GITHUB_URL = ("https://github.com/xiaowu0162/LongMemEval (data: longmemeval_s.json, longmemeval_m.json, "
              "longmemeval_oracle.json; MIT)")
QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference",
                  "temporal-reasoning", "knowledge-update", "multi-session")
ABSTENTION_SUFFIX = "_abs"
ROLES = ("user", "assistant")
TURN_LABELS = ("has_answer",)  # Turn.meta keys an agent must not see
SESSION_LABELS = ("session_id",)  # Session.meta keys an agent must not see
_FIELDS = ("question_id", "question_type", "question", "answer", "question_date", "haystack_session_ids",
           "haystack_dates", "haystack_sessions", "answer_session_ids")
_DATE = re.compile(r"\s*(\d{4})/(\d{1,2})/(\d{1,2})\s*(?:\([A-Za-z]+\))?\s*(\d{1,2}):(\d{2})\s*")


def category_of(question_id: str, question_type: str) -> int:
    """The LoCoMo category that picks the scorer and prompt cue: abstention 5, temporal-reasoning 2, else 4."""
    if question_id.endswith(ABSTENTION_SUFFIX):
        return 5
    return 2 if question_type == "temporal-reasoning" else 4


def parse_date(text: str) -> datetime.datetime | None:
    """A LongMemEval date ("2023/05/20 (Sat) 02:21") as a datetime; None when it has another shape."""
    m = _DATE.fullmatch(text)
    if not m:
        return None
    try:
        return datetime.datetime(*(int(g) for g in m.groups()))
    except ValueError:
        return None


def parse_longmemeval(
    path: str | os.PathLike[str],
    *,
    skip_malformed: bool = False,
    report: ParseReport | None = None,
    relpath: str = "longmemeval_s.json",
) -> Iterator[Episode]:
    """Streams one Episode per question of a LongMemEval JSON file (the s, m or oracle file, or a sample)."""
    report = report if report is not None else ParseReport()
    p = require_file(path, dataset="LongMemEval", what=f"the LongMemEval file {relpath}", where_from=GITHUB_URL)
    records = load_json_list(p)

    def gen() -> Iterator[Episode]:
        seen: dict[str, int] = {}
        for index, rec in enumerate(records):
            report.records_read += 1
            try:
                question_id = need(rec, "question_id", str)
            except BadRecord as e:
                qid = rec.get("question_id") if isinstance(rec, dict) else None
                report.malformed(p, f"record {index}", f"question_id {qid!r}: {e}", skip=skip_malformed)
                continue
            local = ParseReport()
            try:
                if not question_id.strip():
                    raise BadRecord("key 'question_id' is empty")
                if question_id in seen:
                    raise BadRecord(f"key 'question_id' repeats record {seen[question_id]}'s")
                source = {"source_file": os.path.basename(p), "record_index": index}
                episode = _convert(rec, question_id, local, source)
            except BadRecord as e:
                report.malformed(p, f"record {index}", f"question_id {question_id!r}: {e}", skip=skip_malformed)
                continue
            seen[question_id] = index
            report.merge(local)
            report.episodes += 1
            yield episode

    return gen()


def _answer_text(rec: dict[str, Any]) -> str:
    """The answer as text (a few are numbers in the release: str() as LoCoMo does); BadRecord otherwise."""
    value = need(rec, "answer", (str, int, float))
    if isinstance(value, bool):
        raise BadRecord("key 'answer' must be str/int/float, got bool")
    return value if isinstance(value, str) else str(value)


def _convert(rec: dict[str, Any], question_id: str, report: ParseReport, source: dict[str, Any]) -> Episode:
    """One question's record as an Episode (errors without the question_id, which the caller adds)."""
    question_type = need(rec, "question_type", str)
    if question_type not in QUESTION_TYPES:
        raise BadRecord(f"key 'question_type' must be one of {list(QUESTION_TYPES)}, got {question_type!r}")
    question = need(rec, "question", str)
    if not question.strip():
        raise BadRecord("key 'question' is empty")
    answer = _answer_text(rec)
    question_date = need(rec, "question_date", str)
    ids = str_list(need(rec, "haystack_session_ids", list), "key 'haystack_session_ids'")
    dates = str_list(need(rec, "haystack_dates", list), "key 'haystack_dates'")
    raw_sessions = need(rec, "haystack_sessions", list)
    answer_ids = str_list(need(rec, "answer_session_ids", list), "key 'answer_session_ids'")
    if not len(ids) == len(dates) == len(raw_sessions):
        raise BadRecord(f"haystack lists differ in length: haystack_session_ids {len(ids)}, haystack_dates "
                        f"{len(dates)}, haystack_sessions {len(raw_sessions)}")
    first: dict[str, int] = {}
    for k, sid in enumerate(ids):
        if sid in first:
            raise BadRecord(f"haystack_session_ids[{k}] {sid!r} repeats haystack_session_ids[{first[sid]}]")
        first[sid] = k

    built: list[Session] = []
    number: dict[str, int] = {}  # session id -> its 1-based number among the kept sessions
    evidence: list[str] = []
    prev: datetime.datetime | None = None
    for k, (sid, date, raw) in enumerate(zip(ids, dates, raw_sessions, strict=True)):
        n = len(built) + 1
        turns = _turns(raw, k, n)
        if not turns:
            report.empty_sessions_dropped += 1
            continue
        when = parse_date(date)
        gap = None
        if built:
            gap = (when - prev).total_seconds() if when and prev else None
            if gap is None or gap < 0:
                gap = None
                report.unparsed_gaps += 1
        prev = when
        number[sid] = n
        evidence += [t.meta["dia_id"] for t in turns if t.meta.get("has_answer") is True]
        built.append(Session(tuple(turns), gap_seconds=gap, meta={"session": n, "session_id": sid, "date": date}))
    for k, sid in enumerate(answer_ids):
        if sid not in first:
            raise BadRecord(f"answer_session_ids[{k}] {sid!r} names no session of haystack_session_ids")
        if sid not in number:
            raise BadRecord(f"answer_session_ids[{k}] {sid!r} names an empty session (haystack_sessions"
                            f"[{first[sid]}])")
    report.questions += 1
    q = LocomoQuestion(
        sample_id=question_id, index=0, question=question, answer=answer,
        category=category_of(question_id, question_type), evidence=tuple(evidence),
        extra={"question_type": question_type, "question_date": question_date,
               "answer_session_ids": list(answer_ids)},
    )
    meta: dict[str, Any] = {**source, QA_KEY: [q.to_dict()]}
    rest = {k: v for k, v in rec.items() if k not in _FIELDS}
    if rest:
        meta["source_extra"] = rest
    return Episode(DATASET, question_id, tuple(built), meta=meta)


def _turns(raw: Any, k: int, n: int) -> list[Turn]:
    """The turns of ``haystack_sessions[k]``, numbered as session ``n``; BadRecord naming the turn's field."""
    if not isinstance(raw, list):
        raise BadRecord(f"haystack_sessions[{k}] must be a list of turns, got {type(raw).__name__}")
    turns = []
    for t, utt in enumerate(raw):
        what = f" in haystack_sessions[{k}][{t}]"
        role = need(utt, "role", str, what)
        if role not in ROLES:
            raise BadRecord(f"key 'role'{what} must be 'user' or 'assistant', got {role!r}")
        content = need(utt, "content", str, what)
        if "has_answer" in utt and not isinstance(utt["has_answer"], bool):
            raise BadRecord(f"key 'has_answer'{what} must be bool, got {type(utt['has_answer']).__name__}")
        if "dia_id" in utt:
            raise BadRecord(f"key 'dia_id'{what} is not a LongMemEval field (this reader writes it)")
        meta = {"dia_id": f"D{n}:{t + 1}", **{key: v for key, v in utt.items() if key not in ("role", "content")}}
        turns.append(Turn(speaker=role, text=content, meta=meta))
    return turns


def question(episode: Episode) -> LocomoQuestion:
    """The one question a LongMemEval Episode carries; SchemaError when it carries none or several."""
    qs = questions(episode)
    if len(qs) != 1:
        raise SchemaError(f"LongMemEval episode {episode.episode_id!r} must carry one question, got {len(qs)}")
    return qs[0]


def evidence_sessions(episode: Episode, q: LocomoQuestion | None = None) -> tuple[int, ...]:
    """The question's answer_session_ids as 1-based session numbers, in the source's order without repeats."""
    q = q if q is not None else question(episode)
    ids = q.extra.get("answer_session_ids", [])
    number = {s.meta.get("session_id"): i + 1 for i, s in enumerate(episode.sessions)}
    missing = [sid for sid in ids if sid not in number]
    if missing:
        raise SchemaError(f"LongMemEval episode {episode.episode_id!r}: answer sessions {missing} are not among "
                          f"its sessions' session_id (labels dropped?)")
    return tuple(dict.fromkeys(number[sid] for sid in ids))


def without_labels(episode: Episode) -> Episode:
    """The episode an agent may see: no question, no turn's ``has_answer``, no session's ``session_id``."""
    sessions = tuple(
        dataclasses.replace(
            s, meta={k: v for k, v in s.meta.items() if k not in SESSION_LABELS},
            turns=tuple(dataclasses.replace(t, meta={k: v for k, v in t.meta.items() if k not in TURN_LABELS})
                        for t in s.turns))
        for s in episode.sessions)
    meta = {k: v for k, v in episode.meta.items() if k != QA_KEY}
    return dataclasses.replace(episode, sessions=sessions, meta=meta)


__all__ = [
    "ABSTENTION_SUFFIX",
    "DATASET",
    "QUESTION_TYPES",
    "category_of",
    "evidence_sessions",
    "parse_date",
    "parse_longmemeval",
    "question",
    "without_labels",
]
