"""LoCoMo's question answering (Maharana et al., ACL 2024) for every system behind the evaluation's agent interface.

Per conversation (one Episode, one user): the system builds its memory from every session in order (`memorize`:
memory construction alone, on the turns of `user_speaker`, None: both speakers), then, with no memory change,
recalls for each question asked after the last session (`recall_questions`: ours, the Trigger over its stored
memories with the question as the user turn; a baseline, its own retrieval). The generator then answers each
question from that memory in a few words (one batched call, greedy), as LoCoMo's release asks: temporal questions
(category 2) are told to use the sessions' dates, and adversarial ones (category 5) become a choice between "Not
mentioned in the conversation" and the distractor answer, in a seeded order. The memory shown carries the dates
of the sessions its source turns come from. The evidence oracle shows the question's evidence turns themselves
(the generator's ceiling); it needs no system.

Each question is one row (`QA_JSONL`): its ids, category, gold answer, evidence ids, the prediction, the dia_ids
and sessions that reached the prompt and every metric (`locomo_scoring`), so each number recomputes from the rows.

LongMemEval episodes (`data.sources.longmemeval`, one question each) go through the same protocol: their
question's category picks the scorer and cue (abstention 5, asked openly to answer `NOT_MENTIONED` when the memory
does not say; temporal-reasoning 2; the rest 4), the prompt carries the question's date, session recall counts
the answer sessions (`evidence_sessions`), and the agent sees no `has_answer` or session id.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from icml_jax.data.schema import Episode, TurnRef
from icml_jax.data.sources import longmemeval
from icml_jax.data.sources.locomo import DATASET as LOCOMO, LocomoQuestion, questions, turn_refs, without_labels
from icml_jax.evaluation import locomo_scoring as scoring
from icml_jax.evaluation.protocol import MemoryChoice
from icml_jax.llm.offline import register_offline_answers
from icml_jax.llm.types import LLMBackend, LLMRequest
from icml_jax.rl.rollout import agent_turns, lockstep

QA_JSONL = "qa.jsonl"
TASK_LOCOMO_ANSWER = "locomo_answer"
NOT_MENTIONED = "Not mentioned in the conversation"
ANSWER_MAX_TOKENS = 32
ANSWER_SYSTEM = ("You answer questions about a long conversation between two people, using the memories of it "
                 "that you are given. Answer with a short phrase, in the memories' own words where you can.")
TEMPORAL_HINT = "Use the dates of the sessions to answer with an approximate date."
ABSTAIN_HINT = f'If the memories do not tell, answer "{NOT_MENTIONED}".'  # LongMemEval's abstention questions


@dataclasses.dataclass(frozen=True)
class QAItem:
    """A question as the protocol needs it: ids, text, gold answer, category and its evidence turns."""

    question_id: str
    question: str
    answer: str | None
    category: int
    evidence_ids: tuple[str, ...]  # the dataset's ids of the evidence turns (LoCoMo dia_ids)
    evidence: tuple[TurnRef, ...]  # the same turns as (session, turn)
    unresolved_evidence: tuple[str, ...] = ()
    adversarial_answer: str | None = None
    evidence_sessions: tuple[int, ...] = ()  # 1-based evidence sessions named apart (LongMemEval's answer sessions)
    question_date: str | None = None  # when the question is asked (LongMemEval), shown in the prompt
    dataset: str = LOCOMO


def qa_items(episode: Episode) -> list[QAItem]:
    """An episode's questions as QAItems (evidence resolved to its turns): LoCoMo's, or a LongMemEval episode's
    one question with its answer sessions as `evidence_sessions` and its date."""
    refs = turn_refs(episode)
    lme = episode.dataset == longmemeval.DATASET

    def item(q: LocomoQuestion) -> QAItem:
        base = QAItem(q.question_id, q.question, q.answer, q.category, tuple(q.evidence),
                      tuple(refs[d] for d in q.evidence), tuple(q.unresolved_evidence), q.adversarial_answer)
        if not lme:
            return base
        return dataclasses.replace(base, question_id=q.sample_id, evidence_sessions=longmemeval.evidence_sessions(
            episode, q), question_date=q.extra.get("question_date"), dataset=longmemeval.DATASET)

    return [item(q) for q in questions(episode)]


locomo_items = qa_items  # the name the LoCoMo code and tests use


@dataclasses.dataclass
class Ingested:
    """What building one conversation's memory cost and left: acted turns, saves, stored memories and tokens."""

    turns: int
    saved: int
    memories: int
    storage_tokens: int
    construction_ms: float


def ingest(agent: Any, episode: Episode, *, user_speaker: str | None,
           count_tokens: Callable[[str], int]) -> Ingested:
    """Builds `agent`'s memory of `episode` (user id: its episode_id) from every session in order, through
    `memorize` (construction without per-turn recall), on `user_speaker`'s turns (None: every turn)."""
    user, turns, saved, ms = episode.episode_id, 0, 0, 0.0
    for s, t, history in agent_turns(episode, user_speaker):
        did, spent = agent.memorize(user, episode, s, t, history)
        turns, saved, ms = turns + 1, saved + bool(did), ms + spent
    texts = agent.memory_texts(user)
    return Ingested(turns, saved, len(texts), sum(count_tokens(x) for x in texts), ms)


def ingest_together(agent: Any, episodes: Sequence[Episode], *, user_speaker: str | None,
                    count_tokens: Callable[[str], int]) -> list[Ingested]:
    """`ingest` for several episodes (distinct users) in lockstep: per tick, the next acted turn of each episode
    still going, in one `memorize_many` call. Each user's memory is what `ingest` builds (the agent decides per
    user, greedily); a tick's time is shared by its turns."""
    if len({e.episode_id for e in episodes}) != len(episodes):
        raise ValueError(f"ingest_together: one episode per user, got {[e.episode_id for e in episodes]}")
    counts = [[0, 0, 0.0] for _ in episodes]  # turns, saved, ms
    for tick in lockstep([agent_turns(e, user_speaker) for e in episodes]):
        done = agent.memorize_many([(episodes[i].episode_id, episodes[i], s, t, hist) for i, s, t, hist in tick])
        for (i, *_), (did, spent) in zip(tick, done, strict=True):
            counts[i] = [counts[i][0] + 1, counts[i][1] + bool(did), counts[i][2] + spent]
    out = []
    for episode, (turns, saved, ms) in zip(episodes, counts, strict=True):
        texts = agent.memory_texts(episode.episode_id)
        out.append(Ingested(turns, saved, len(texts), sum(count_tokens(x) for x in texts), ms))
    return out


def with_speakers(episode: Episode) -> Episode:
    """The episode with each turn's text as "speaker: text": what every system reads, so a memory kept from a
    turn says who said it (both speakers are remembered; LoCoMo's own retrieval baselines index turns so)."""
    sessions = tuple(dataclasses.replace(s, turns=tuple(dataclasses.replace(t, text=f"{t.speaker}: {t.text}")
                                                        for t in s.turns)) for s in episode.sessions)
    return dataclasses.replace(episode, sessions=sessions)


def oracle_choice(episode: Episode, item: QAItem) -> MemoryChoice:
    """The evidence oracle's memory: the question's evidence turns themselves, as "speaker: text" lines."""
    if not item.evidence:
        return MemoryChoice(None, None, None, None)
    lines = [f"{episode.sessions[s].turns[t].speaker}: {episode.sessions[s].turns[t].text}" for s, t in item.evidence]
    refs = tuple((episode.episode_id, s, t) for s, t in item.evidence)
    return MemoryChoice("evidence", "\n".join(lines), refs[0], None, refs)


def reached(episode: Episode, choice: MemoryChoice) -> tuple[list[str], list[int]]:
    """The dia_ids (in order, deduplicated) and 1-based session numbers of the turns whose memory reached the
    prompt (a memory counts through its source turns)."""
    return _dia_ids(episode, choice.all_refs)


def _dia_ids(episode: Episode, refs: Sequence[tuple[str, int, int]]) -> tuple[list[str], list[int]]:
    """The dia_ids (in order, deduplicated) and 1-based session numbers of the turns `refs` point at."""
    ids: dict[str, None] = {}
    sessions: dict[int, None] = {}
    for _, s, t in refs:
        dia_id = episode.sessions[s].turns[t].meta.get("dia_id", f"D{s + 1}:{t + 1}")
        ids[str(dia_id)] = None
        sessions[s + 1] = None
    return list(ids), sorted(sessions)


def session_dates(episode: Episode, sessions: Sequence[int]) -> str | None:
    """'session N: <date_time>' for the given 1-based sessions that carry a date; None when none does."""
    dated = [(n, episode.sessions[n - 1].meta.get("date_time") or episode.sessions[n - 1].meta.get("date"))
             for n in sessions]
    lines = [f"session {n}: {d}" for n, d in dated if d]
    return "; ".join(lines) or None


def answer_request(item: QAItem, memory: str | None, dates: str | None, *, seed: int = 0,
                   max_output_tokens: int = ANSWER_MAX_TOKENS) -> LLMRequest:
    """The generator's request for one question: the memory (with its sessions' dates), the question, and the
    release's category cues (a date hint for category 2; category 5 a choice against `NOT_MENTIONED`, or for a
    LongMemEval abstention, which has no distractor, `ABSTAIN_HINT`); a question's own date when it has one."""
    sections = [f"Memories of the conversation:\n{memory}" if memory else "Memories of the conversation: none."]
    if dates:
        sections.append(f"Dates of the sessions they come from: {dates}")
    if item.question_date:
        sections.append(f"Current date: {item.question_date}")
    question = item.question
    if item.category == 2:
        question = f"{question} {TEMPORAL_HINT}"
    if item.category == 5 and item.dataset == longmemeval.DATASET:
        question = f"{question} {ABSTAIN_HINT}"
    elif item.category == 5:
        options = [NOT_MENTIONED, item.adversarial_answer or item.answer or "Yes"]
        random.Random(f"{seed}/{item.question_id}").shuffle(options)
        question = f"{question} Select the correct answer: (a) {options[0]} (b) {options[1]}."
    sections.append(f"Question: {question}\nShort answer:")
    return LLMRequest(prompt="\n\n".join(sections), system=ANSWER_SYSTEM, max_output_tokens=max_output_tokens,
                      temperature=0.0, task=TASK_LOCOMO_ANSWER,
                      metadata={"question_id": item.question_id, "memory": memory})


def _offline_answer(task: str, metadata: Mapping[str, Any]) -> str:
    """The offline back end's stand-in answer: the memory's first line (its first 12 words), else
    `NOT_MENTIONED`. A rule over what the prompt shows, never the gold answer."""
    memory = metadata.get("memory")
    if not memory:
        return NOT_MENTIONED
    return " ".join(str(memory).strip().splitlines()[0].split()[:12])


register_offline_answers([TASK_LOCOMO_ANSWER], _offline_answer)


@dataclasses.dataclass(frozen=True)
class Recalled:
    """A question's recalled memory and the milliseconds its recall took (the batch's over its size)."""

    choice: MemoryChoice
    ms: float


def recall(agent: Any, episode: Episode, items: Sequence[QAItem]) -> list[Recalled]:
    """`agent`'s memory for each question (one `recall_questions` call for the conversation)."""
    if not items:
        return []
    start = time.perf_counter()
    choices = agent.recall_questions(episode.episode_id, episode, [item.question for item in items])
    ms = 1e3 * (time.perf_counter() - start) / len(items)
    if len(choices) != len(items):
        raise ValueError(f"{getattr(agent, 'name', agent)!r}: recall_questions gave {len(choices)} memories for "
                         f"{len(items)} questions of {episode.episode_id}")
    return [Recalled(c, ms) for c in choices]


def answer_rows(episode: Episode, items: Sequence[QAItem], recalled: Sequence[Recalled], generator: LLMBackend,
                *, answered: Sequence[bool] | None = None, seed: int = 0,
                max_output_tokens: int = ANSWER_MAX_TOKENS) -> list[dict[str, Any]]:
    """Every question's row: what its recall reached (evidence recall) and, for the `answered` ones (default:
    all), the generator's answer (one call) scored; the others keep prediction and answer metrics None. The judge
    is apart (`judge_rows`)."""
    answered = [True] * len(items) if answered is None else list(answered)
    reach = [reached(episode, r.choice) for r in recalled]
    asked = [i for i, yes in enumerate(answered) if yes]
    requests = [answer_request(items[i], recalled[i].choice.text, session_dates(episode, reach[i][1]), seed=seed,
                               max_output_tokens=max_output_tokens) for i in asked]
    start = time.perf_counter()
    answers = dict(zip(asked, generator.generate(requests) if requests else [], strict=True))
    answer_ms = 1e3 * (time.perf_counter() - start) / max(1, len(requests))
    rows = []
    for i, (item, r, (ids, sessions)) in enumerate(zip(items, recalled, reach, strict=True)):
        offered = None if r.choice.offered is None else _dia_ids(episode, r.choice.offered)[0]
        answer = answers.get(i)
        prediction = answer.text.strip() if answer is not None else None
        gold = item.answer if item.answer is not None else ""
        scored = prediction is not None
        rows.append({
            "sample_id": episode.episode_id, "question_id": item.question_id, "question": item.question,
            "category": item.category, "answer": item.answer, "adversarial_answer": item.adversarial_answer,
            "evidence": list(item.evidence_ids), "unresolved_evidence": list(item.unresolved_evidence),
            "answered": scored, "prediction": prediction, "reached": ids, "reached_sessions": sessions,
            "memory": r.choice.text,
            "f1": scoring.locomo_f1(prediction, gold, item.category) if scored else None,
            "bleu1": scoring.bleu1(prediction, gold) if scored and item.category != 5 else None,
            "mem0_f1": scoring.mem0_f1(prediction, gold) if scored and item.category != 5 else None,
            "evidence_recall": scoring.evidence_recall(item.evidence_ids, ids),
            "offered": offered,  # the memories a choosing policy picked among (None: the agent does not choose)
            "offered_recall": None if offered is None else scoring.evidence_recall(item.evidence_ids, offered),
            "session_recall": (scoring.evidence_session_recall(item.evidence_sessions, sessions)
                               if item.evidence_sessions else scoring.session_recall(item.evidence_ids, sessions)),
            "judge": None,
            "prompt_tokens": answer.prompt_tokens if scored else None,
            "output_tokens": answer.output_tokens if scored else None,
            "retrieval_ms": r.ms, "answer_ms": answer_ms if scored else None,
        })
        if item.dataset != LOCOMO:  # LoCoMo rows keep their keys; these recompute session recall
            rows[-1].update(dataset=item.dataset, evidence_sessions=list(item.evidence_sessions),
                            question_date=item.question_date)
    return rows


def judge_rows(rows: list[dict[str, Any]], judge: LLMBackend) -> int:
    """Fills each category 1-4 row's `judge` (True: CORRECT) from one judge call; returns the unusable verdicts
    (left None, counted by the caller)."""
    todo = [row for row in rows if row["category"] != 5 and row["answered"]]
    if not todo:
        return 0
    answers = judge.generate([scoring.judge_request(row["question"], row["answer"] or "", row["prediction"])
                              for row in todo])
    bad = 0
    for row, answer in zip(todo, answers, strict=True):
        row["judge"] = scoring.parse_verdict(answer)
        bad += row["judge"] is None
    return bad


def _groups(episodes: Sequence[Episode], size: int) -> list[list[Episode]]:
    """Consecutive episodes in groups of at most `size` distinct users (a repeated user starts a new group)."""
    groups: list[list[Episode]] = []
    for episode in episodes:
        if not groups or len(groups[-1]) >= size or any(e.episode_id == episode.episode_id for e in groups[-1]):
            groups.append([])
        groups[-1].append(episode)
    return groups


def play_qa(agent: Any, episodes: Sequence[Episode], generator: LLMBackend, *, user_speaker: str | None,
            count_tokens: Callable[[str], int],
            answered: Callable[[Episode, list[QAItem]], Sequence[bool]] | None = None,
            seed: int = 0, progress: Callable[[Sequence[Episode]], Any] = iter
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The protocol over `episodes` (see the module docstring) for `agent` (None: the evidence oracle, which
    ingests nothing): (question rows, per-conversation ingestion records). An agent with `memorize_many` and
    `lockstep` > 1 builds the memories of that many conversations together (`ingest_together`; `progress` then
    counts groups), then answers each in order. Every question is recalled for;
    `answered(episode, items)` marks the ones the generator answers (default: all). The agent sees each episode
    without its questions, answers, evidence and annotations (`without_labels`; a LongMemEval episode also without
    its turns' `has_answer` and its sessions' ids), each turn as "speaker: text" (`with_speakers`)."""
    rows, ingested = [], []
    size = int(getattr(agent, "lockstep", 1)) if hasattr(agent, "memorize_many") else 1
    for group in progress(_groups(episodes, size)):
        seen = [with_speakers(longmemeval.without_labels(e) if e.dataset == longmemeval.DATASET
                              else without_labels(e)) for e in group]
        if agent is not None:
            agent.reset()
            built = (ingest_together(agent, seen, user_speaker=user_speaker, count_tokens=count_tokens)
                     if size > 1 else [ingest(agent, seen[0], user_speaker=user_speaker, count_tokens=count_tokens)])
            ingested += [{"sample_id": e.episode_id, **dataclasses.asdict(b)} for e, b in zip(group, built,
                                                                                          strict=True)]
        for episode, shown in zip(group, seen, strict=True):
            items = qa_items(episode)
            recalled = ([Recalled(oracle_choice(episode, item), 0.0) for item in items] if agent is None
                        else recall(agent, shown, items))
            marks = answered(episode, items) if answered is not None else None
            rows += answer_rows(episode, items, recalled, generator, answered=marks, seed=seed)
    for row in rows:
        row["memory_tokens_shown"] = count_tokens(row["memory"]) if row["memory"] else 0
    return rows, ingested


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-category and overall numbers of `locomo_scoring.summarize` over the rows."""
    return scoring.summarize(rows)


__all__ = ["ABSTAIN_HINT", "ANSWER_SYSTEM", "NOT_MENTIONED", "QA_JSONL", "TASK_LOCOMO_ANSWER", "Ingested", "QAItem",
           "Recalled", "answer_request", "answer_rows", "ingest", "ingest_together", "judge_rows", "locomo_items", "oracle_choice",
           "play_qa", "qa_items", "reached", "recall", "session_dates", "summary", "with_speakers"]
