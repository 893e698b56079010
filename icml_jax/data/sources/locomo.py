"""LoCoMo (Maharana et al., ACL 2024, "Evaluating Very Long-Term Conversational Memory of LLM Agents") -> Episodes.

The release's ``data/locomo10.json`` (and ``shared/data/locomo/locomo7.json``, 7 of its 10 conversations, read
unchanged) is one JSON list of conversations: ``sample_id``; ``conversation`` with ``speaker_a``, ``speaker_b``,
``session_N`` (turns ``{"speaker", "dia_id", "text"}``, image turns also ``img_url``, ``blip_caption``,
``query``, ``re-download``) and ``session_N_date_time``; ``qa`` (question, answer, category 1-5, evidence
dia_ids; category 5 has ``adversarial_answer`` and mostly no ``answer``); and the model-written or annotated
``event_summary``, ``observation`` and ``session_summary``.

Each conversation is one Episode (``episode_id`` = sample_id, ``meta["speakers"]`` = [speaker_a, speaker_b]):

- Sessions in numeric order (the keys are not sorted and numbers pass 9), both speakers' turns, each
  ``Session.meta`` holding ``session`` (N) and ``date_time`` (the source's string); ``gap_seconds`` is the time
  from the previous session's date_time (None, counted as an unparsed gap, when a date does not parse or goes
  backwards); ``gap_text`` stays None (the source writes dates, not gaps). Sessions must run 1..N, each with its
  date_time; date_times with no session (conv-26 has 16 after its 19 sessions) are kept in
  ``meta["unused_date_times"]``. Empty sessions are dropped and counted (their date_time kept there too).
- ``Turn.meta`` holds every field of the turn but speaker and text, verbatim (``dia_id`` always).
- Image turns: ``Turn.text`` is the text as LoCoMo's own QA scripts show it (``task_eval/evaluate_claude.py``,
  ``evaluate_gemini.py``, ``evaluate_llama2.py``): ``<text> [shares <blip_caption>]``. Those scripts test for
  an ``img_file`` field the release spells ``img_url`` (or drops), so here every turn with a non-empty
  ``blip_caption`` gets it; the caption itself stays in ``Turn.meta["blip_caption"]``.
- QA: ``meta["qa"]``, one JSON-safe ``LocomoQuestion.to_dict()`` per question in file order, so the Episode
  round-trips through ``Episode.to_json`` and TFDS unchanged; read them with ``questions(episode)``.
- ``event_summary``, ``observation``, ``session_summary``: ``meta["annotations"]``, verbatim (labels of
  LoCoMo's other tasks, never ``Session.summary``). ``without_labels(episode)`` drops qa and annotations: the
  episode an agent may learn from (the online stream applies it).

Evidence strings are not always one id. Each is split on ';' and ',' and read as ``D<session>:<turn>`` ids
(spaces, a stray ':' after the D and leading zeros tolerated: "D8:6; D9:17", "D:11:26", "D9:1 D4:4",
"D30:05"); every id that names a turn goes into ``evidence`` as that turn's dia_id, anything else ("D", an id
past its session) into ``unresolved_evidence``, and ``raw_evidence`` keeps the strings as written. The
ParseReport counts rewritten strings and dropped repeats (``evidence_normalised``) and unresolved parts
(``evidence_unresolved``); each conversation with unresolved ones is logged. Any other odd record (a missing
or ill-typed field, a category outside 1..5, a session without its date_time) is a MalformedRecordError naming
the file, the record, the sample_id and the field.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from absl import logging

from icml_jax.data.report import ParseReport
from icml_jax.data.schema import Episode, SchemaError, Session, Turn, TurnRef
from icml_jax.data.sources._common import BadRecord, load_json_list, need, record_text, require_file, str_list

DATASET = "locomo"
GITHUB_URL = "https://github.com/snap-research/locomo, data/locomo10.json (CC BY-NC 4.0)"
CATEGORIES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
QA_KEY = "qa"
ANNOTATIONS_KEY = "annotations"
LABEL_KEYS = (QA_KEY, ANNOTATIONS_KEY)
ANNOTATION_FIELDS = ("event_summary", "observation", "session_summary")
DATE_FORMAT = "%I:%M %p on %d %B, %Y"  # "1:56 pm on 8 May, 2023"
_SESSION_KEY = re.compile(r"session_([1-9]\d*)")
_DATE_KEY = re.compile(r"session_([1-9]\d*)_date_time")
_DIA_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_QA_FIELDS = {"question", "answer", "category", "evidence", "adversarial_answer"}


@dataclasses.dataclass(frozen=True)
class LocomoQuestion:
    """One LoCoMo question with its gold answer as text and its evidence turns (see the module docstring).

    Attributes:
      sample_id: the conversation (= the Episode's episode_id).
      index: the question's position in the conversation's ``qa`` list (``question_id`` = "<sample_id>/<index>").
      question: the question.
      answer: the gold answer as text (integers such as 2022 become "2022"); None where the source has none
        (most category-5 questions).
      category: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial (``CATEGORIES``).
      evidence: the dia_ids of the evidence turns, each naming a turn of the episode, in source order.
      unresolved_evidence: evidence strings (or parts of them) that name no turn, as written.
      raw_evidence: the evidence strings exactly as the source writes them.
      adversarial_answer: category 5's distractor answer, as text; None where absent.
      extra: any other fields of the source item, verbatim.
    """

    sample_id: str
    index: int
    question: str
    answer: str | None
    category: int
    evidence: tuple[str, ...] = ()
    unresolved_evidence: tuple[str, ...] = ()
    raw_evidence: tuple[str, ...] = ()
    adversarial_answer: str | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    @property
    def question_id(self) -> str:
        """A stable id for per-question rows: "<sample_id>/<index>"."""
        return f"{self.sample_id}/{self.index}"

    @property
    def category_name(self) -> str:
        """The category's name as LoCoMo's code uses it (the Mem0 paper names them differently; docs/locomo.md)."""
        return CATEGORIES[self.category]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (what ``Episode.meta["qa"]`` stores)."""
        d: dict[str, Any] = {
            "sample_id": self.sample_id,
            "index": self.index,
            "question": self.question,
            "answer": self.answer,
            "category": self.category,
            "evidence": list(self.evidence),
            "unresolved_evidence": list(self.unresolved_evidence),
            "raw_evidence": list(self.raw_evidence),
            "adversarial_answer": self.adversarial_answer,
        }
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> LocomoQuestion:
        """Inverse of ``to_dict``; SchemaError naming the field when ``d`` is not one."""
        if not isinstance(d, Mapping):
            raise SchemaError(f"a LoCoMo question must be a mapping, got {type(d).__name__}")
        where = f"LoCoMo question {d.get('sample_id')!r}/{d.get('index')!r}"

        def value_of(key: str, kinds: tuple[type, ...], optional: bool = False) -> Any:
            """d[key] checked against ``kinds`` (None allowed when ``optional``)."""
            value = d.get(key)
            if (value is None and optional) or (isinstance(value, kinds) and not isinstance(value, bool)):
                return value
            raise SchemaError(f"{where}: {key} must be {'/'.join(k.__name__ for k in kinds)}, got {value!r}")

        def strings(key: str) -> tuple[str, ...]:
            """d[key] as a tuple of strings (absent: empty)."""
            value = d.get(key, [])
            if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
                raise SchemaError(f"{where}: {key} must be a list of strings, got {value!r}")
            return tuple(value)

        category = value_of("category", (int,))
        if category not in CATEGORIES:
            raise SchemaError(f"{where}: category must be one of 1..5, got {category!r}")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise SchemaError(f"{where}: unknown keys {sorted(unknown)}")
        return cls(
            sample_id=value_of("sample_id", (str,)),
            index=value_of("index", (int,)),
            question=value_of("question", (str,)),
            answer=value_of("answer", (str,), optional=True),
            category=category,
            evidence=strings("evidence"),
            unresolved_evidence=strings("unresolved_evidence"),
            raw_evidence=strings("raw_evidence"),
            adversarial_answer=value_of("adversarial_answer", (str,), optional=True),
            extra=dict(value_of("extra", (Mapping,), optional=True) or {}),
        )


def questions(episode: Episode) -> list[LocomoQuestion]:
    """The LoCoMo questions an Episode carries (``meta["qa"]``), in source order.

    SchemaError when it carries none: not a LoCoMo episode, or one whose labels ``without_labels`` dropped.
    """
    qa = episode.meta.get(QA_KEY)
    if qa is None:
        raise SchemaError(f"episode {episode.episode_id!r} ({episode.dataset}) carries no LoCoMo questions "
                          f"(no meta[{QA_KEY!r}]: not built by the locomo source, or its labels were dropped)")
    if not isinstance(qa, (list, tuple)):
        raise SchemaError(f"episode {episode.episode_id!r}: meta[{QA_KEY!r}] must be a list, got {type(qa).__name__}")
    return [LocomoQuestion.from_dict(q) for q in qa]


def without_labels(episode: Episode) -> Episode:
    """The episode without its questions and annotations (``LABEL_KEYS``): what anything that learns may see."""
    if not any(k in episode.meta for k in LABEL_KEYS):
        return episode
    meta = {k: v for k, v in episode.meta.items() if k not in LABEL_KEYS}
    return dataclasses.replace(episode, meta=meta)


def first_sessions(episode: Episode, n: int) -> Episode:
    """The episode cut to its first `n` sessions, with the questions whose evidence lies wholly in them (at least
    one evidence turn, every id naming a kept turn, none unresolved): a shorter conversation none of whose
    questions asks about what was cut. Questions keep their ids (``question_id``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"first_sessions: n must be a positive integer, got {n!r}")
    kept = dataclasses.replace(episode, sessions=episode.sessions[:n])
    refs = turn_refs(kept)
    inside = [q for q in questions(episode)
              if q.evidence and not q.unresolved_evidence and all(d in refs for d in q.evidence)]
    return dataclasses.replace(kept, meta={**episode.meta, QA_KEY: [q.to_dict() for q in inside]})


def turn_refs(episode: Episode) -> dict[str, TurnRef]:
    """dia_id -> TurnRef (session index, turn index) for every turn of an episode that has a dia_id."""
    refs: dict[str, TurnRef] = {}
    for si, session in enumerate(episode.sessions):
        for ti, turn in enumerate(session.turns):
            dia_id = turn.meta.get("dia_id")
            if isinstance(dia_id, str):
                refs.setdefault(dia_id, TurnRef(si, ti))
    return refs


def turn_ref(episode: Episode, dia_id: str) -> TurnRef:
    """The TurnRef of one dia_id; KeyError naming the episode and the id when no turn has it."""
    refs = turn_refs(episode)
    if dia_id not in refs:
        raise KeyError(f"episode {episode.episode_id!r} has no turn with dia_id {dia_id!r}")
    return refs[dia_id]


def evidence_refs(episode: Episode, question: LocomoQuestion) -> tuple[TurnRef, ...]:
    """The TurnRefs of a question's (resolved) evidence turns, in the question's order."""
    refs = turn_refs(episode)
    return tuple(refs[d] for d in question.evidence)


def split_evidence(raw: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(well-formed ids "D<s>:<t>", parts that are none) of one evidence string, e.g. "D8:6; D9:17" -> two ids.

    Parts are split on ';' and ','; a part is read when it is nothing but ids (spaces between them allowed).
    """
    ids: list[str] = []
    bad: list[str] = []
    for part in re.split(r"[;,]", raw):
        part = part.strip()
        if not part:
            continue
        found = list(_DIA_ID.finditer(part))
        if found and not _DIA_ID.sub("", part).strip():
            ids += [f"D{int(m[1])}:{int(m[2])}" for m in found]
        else:
            bad.append(part)
    if not ids and not bad:  # a blank string: keep it visible rather than let it vanish
        bad.append(raw)
    return tuple(ids), tuple(bad)


def parse_date_time(text: str) -> datetime.datetime | None:
    """A session's date_time ("1:56 pm on 8 May, 2023") as a datetime; None when it has another shape."""
    try:
        return datetime.datetime.strptime(" ".join(text.split()), DATE_FORMAT)
    except ValueError:
        return None


def parse_locomo(
    path: str | os.PathLike[str],
    *,
    skip_malformed: bool = False,
    report: ParseReport | None = None,
    relpath: str = "locomo10.json",
) -> Iterator[Episode]:
    """Streams one Episode per conversation of a LoCoMo JSON file (the release's locomo10.json or a subset)."""
    report = report if report is not None else ParseReport()
    p = require_file(
        path, dataset="LoCoMo", what=f"the LoCoMo file {relpath} (the release's data/locomo10.json)",
        where_from=GITHUB_URL,
    )
    records = load_json_list(p)

    def gen() -> Iterator[Episode]:
        for index, rec in enumerate(records):
            report.records_read += 1
            try:
                source = {"source_file": os.path.basename(p), "record_index": index}
                ep = locomo_record_to_episode(rec, report, source)
            except BadRecord as e:
                report.malformed(p, f"record {index}", str(e), skip=skip_malformed)
                continue
            report.episodes += 1
            yield ep

    return gen()


def locomo_record_to_episode(rec: Any, report: ParseReport, source: dict[str, Any] | None = None) -> Episode:
    """Converts one conversation; BadRecord naming the sample_id and the field when it is malformed.

    Counts go into ``report`` only once the whole record converted cleanly.
    """
    sample_id = need(rec, "sample_id", str)
    local = ParseReport()
    try:
        episode = _convert(rec, sample_id, local, source or {})
    except BadRecord as e:
        raise BadRecord(f"sample_id {sample_id!r}: {e}") from None
    report.merge(local)
    return episode


def _convert(rec: dict[str, Any], sample_id: str, report: ParseReport, source: dict[str, Any]) -> Episode:
    """The body of ``locomo_record_to_episode`` (errors without the sample_id, which the caller adds)."""
    conv = need(rec, "conversation", dict)
    speakers = (need(conv, "speaker_a", str, " in conversation"), need(conv, "speaker_b", str, " in conversation"))
    if speakers[0] == speakers[1]:
        raise BadRecord(f"conversation.speaker_a and speaker_b are both {speakers[0]!r}")
    sessions: dict[int, Any] = {}
    dates: dict[int, str] = {}
    extra: dict[str, Any] = {}
    for key, value in conv.items():
        if m := _SESSION_KEY.fullmatch(key):
            sessions[int(m[1])] = value
        elif m := _DATE_KEY.fullmatch(key):
            dates[int(m[1])] = need(conv, key, str, " in conversation")
        elif key not in ("speaker_a", "speaker_b"):
            extra[key] = value
    if not sessions:
        raise BadRecord("conversation has no session_N")
    last = max(sessions)
    missing = [n for n in range(1, last + 1) if n not in sessions]
    if missing:
        raise BadRecord(f"conversation has session_{last} but no session_{missing[0]}")
    undated = [n for n in range(1, last + 1) if n not in dates]
    if undated:
        raise BadRecord(f"conversation.session_{undated[0]} has no session_{undated[0]}_date_time")
    unused = {f"session_{n}_date_time": dates[n] for n in sorted(dates) if n > last}

    built: list[Session] = []
    seen: dict[str, str] = {}  # dia_id -> where it was first seen
    prev_time: datetime.datetime | None = None
    for n in range(1, last + 1):
        turns = _session_turns(sessions[n], n, speakers, seen)
        if not turns:
            report.empty_sessions_dropped += 1
            unused[f"session_{n}_date_time"] = dates[n]
            continue
        when = parse_date_time(dates[n])
        gap = None
        if built:
            gap = (when - prev_time).total_seconds() if when and prev_time else None
            if gap is None or gap < 0:
                gap = None
                report.unparsed_gaps += 1
        prev_time = when
        built.append(Session(tuple(turns), gap_seconds=gap, meta={"session": n, "date_time": dates[n]}))

    qa = _questions(need(rec, "qa", list), sample_id, built, report)
    annotations = {}
    for key in ANNOTATION_FIELDS:
        if key in rec:
            annotations[key] = need(rec, key, dict)
    meta: dict[str, Any] = {**source, "speakers": list(speakers), QA_KEY: [q.to_dict() for q in qa]}
    if annotations:
        meta[ANNOTATIONS_KEY] = annotations
    if unused:
        meta["unused_date_times"] = unused
    if extra:
        meta["conversation_extra"] = extra
    rest = {k: v for k, v in rec.items() if k not in {"sample_id", "conversation", "qa", *ANNOTATION_FIELDS}}
    if rest:
        meta["source_extra"] = rest
    return Episode(DATASET, sample_id, tuple(built), meta=meta)


def _session_turns(raw: Any, n: int, speakers: tuple[str, str], seen: dict[str, str]) -> list[Turn]:
    """The turns of ``session_<n>``, image captions shown the LoCoMo way; ``seen`` catches duplicate dia_ids."""
    if not isinstance(raw, list):
        raise BadRecord(f"conversation.session_{n} must be a list of turns, got {type(raw).__name__}")
    turns = []
    for k, utt in enumerate(raw):
        what = f" in conversation.session_{n}[{k}]"
        speaker = need(utt, "speaker", str, what)
        if speaker not in speakers:
            raise BadRecord(f"speaker {speaker!r}{what} is neither speaker_a {speakers[0]!r} nor speaker_b "
                            f"{speakers[1]!r}")
        text = need(utt, "text", str, what)
        dia_id = need(utt, "dia_id", str, what)
        if dia_id in seen:
            raise BadRecord(f"dia_id {dia_id!r}{what} repeats the one in {seen[dia_id]}")
        seen[dia_id] = what.removeprefix(" in ")
        caption = utt.get("blip_caption")
        if caption is not None:
            caption = need(utt, "blip_caption", str, what)
            if caption.strip():
                text = f"{text} [shares {caption}]" if text else f"[shares {caption}]"
        meta = {key: value for key, value in utt.items() if key not in ("speaker", "text")}
        turns.append(Turn(speaker=speaker, text=text, meta=meta))
    return turns


def _answer_text(item: dict[str, Any], key: str, what: str) -> str | None:
    """An answer field as text (LoCoMo casts with str(): 2022 -> "2022"); None when absent or null."""
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadRecord(f"key {key!r}{what} must be a string or a number, got {type(value).__name__}")
    return record_text(value, f"key {key!r}{what}") if isinstance(value, str) else str(value)


def _questions(items: list[Any], sample_id: str, sessions: list[Session], report: ParseReport) -> list[LocomoQuestion]:
    """The conversation's questions, evidence resolved against its turns; counts into ``report``."""
    episode = Episode(DATASET, sample_id, tuple(sessions))
    refs = turn_refs(episode)
    canonical = {f"D{int(m[1])}:{int(m[2])}": d for d in refs if (m := _DIA_ID.fullmatch(d))}
    out = []
    for i, item in enumerate(items):
        what = f" in qa[{i}]"
        question = need(item, "question", str, what)
        if not question.strip():
            raise BadRecord(f"key 'question'{what} is empty")
        category = need(item, "category", int, what)
        if isinstance(category, bool) or category not in CATEGORIES:
            raise BadRecord(f"key 'category'{what} must be one of 1..5, got {category!r}")
        answer = _answer_text(item, "answer", what)
        if answer is None and category != 5:
            raise BadRecord(f"missing key 'answer'{what} (category {category}; only category 5 may lack one)")
        raw = tuple(str_list(need(item, "evidence", list, what), f"key 'evidence'{what}"))
        evidence: list[str] = []
        unresolved: list[str] = []
        for entry in raw:
            ids, bad = split_evidence(entry)
            if ids and ids != (entry,):
                report.evidence_normalised += 1
            unresolved += bad
            for dia in ids:
                turn_id = canonical.get(dia, dia if dia in refs else None)
                if turn_id is None:
                    unresolved.append(dia)
                elif turn_id in evidence:  # a repeat ("D4:5", "D4:5" in the release's conv-50)
                    report.evidence_normalised += 1
                else:
                    evidence.append(turn_id)
        report.evidence_unresolved += len(unresolved)
        report.questions += 1
        out.append(LocomoQuestion(
            sample_id=sample_id, index=i, question=question, answer=answer, category=category,
            evidence=tuple(evidence), unresolved_evidence=tuple(unresolved), raw_evidence=raw,
            adversarial_answer=_answer_text(item, "adversarial_answer", what),
            extra={k: v for k, v in item.items() if k not in _QA_FIELDS},
        ))
    bad_ids = [(q.index, u) for q in out for u in q.unresolved_evidence]
    if bad_ids:
        logging.warning("LoCoMo %s: %d evidence id(s) name no turn and are kept as unresolved: %s", sample_id,
                        len(bad_ids), ", ".join(f"qa[{i}] {u!r}" for i, u in bad_ids))
    return out


__all__ = [
    "ANNOTATIONS_KEY",
    "CATEGORIES",
    "DATASET",
    "LABEL_KEYS",
    "QA_KEY",
    "LocomoQuestion",
    "evidence_refs",
    "first_sessions",
    "locomo_record_to_episode",
    "parse_date_time",
    "parse_locomo",
    "questions",
    "split_evidence",
    "turn_ref",
    "turn_refs",
    "without_labels",
]
