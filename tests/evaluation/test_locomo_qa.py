"""LoCoMo's QA protocol (`evaluation.locomo_qa`) on the fixture conversations: what reaches the answer prompt,
evidence recall through a memory's source turns, the answered subset, the release's category cues, the evidence
oracle, and that no system sees a question, answer or evidence."""

from __future__ import annotations

from pathlib import Path

import pytest

from icml_jax.baselines.dense import DenseAgent
from icml_jax.data.sources.locomo import parse_locomo
from icml_jax.evaluation import locomo_scoring as scoring
from icml_jax.evaluation.locomo_qa import (NOT_MENTIONED, TEMPORAL_HINT, answer_request, locomo_items, play_qa)
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.prompts import condense_request
from icml_jax.llm.types import TASK_CONDENSE, LLMRequest
from icml_jax.llm.verbatim import VerbatimNotes
from icml_jax.memory.store import MemoryStore
from tests.baselines.helpers import KeywordEncoder, Recording, WordRecall, count_words

FIXTURE = Path(__file__).parents[1] / "data" / "fixtures" / "locomo" / "locomo10.json"


@pytest.fixture(scope="module")
def conversations():
    return list(parse_locomo(FIXTURE))


def test_the_oracle_reaches_every_evidence_turn_and_each_row_recomputes(conversations):
    rows, ingested = play_qa(None, conversations, OfflineBackend(), user_speaker=None, count_tokens=count_words)
    assert ingested == [] and len(rows) == sum(len(locomo_items(e)) for e in conversations) == 12
    for row in rows:
        assert row["reached"] == list(dict.fromkeys(row["evidence"]))
        assert row["evidence_recall"] == (1.0 if row["evidence"] else None)
        assert row["f1"] == scoring.locomo_f1(row["prediction"], row["answer"] or "", row["category"])
    no_evidence = next(r for r in rows if r["question"] == "What does Ann do at work?")
    assert no_evidence["prediction"] == NOT_MENTIONED and no_evidence["memory"] is None


def test_an_agent_sees_no_label_and_its_memorys_source_turns_are_what_reached(conversations):
    agent, generator = WordRecall(), Recording()
    rows, ingested = play_qa(agent, conversations, generator, user_speaker=None, count_tokens=count_words)
    assert all("qa" not in e.meta and "annotations" not in e.meta for e in agent.seen)
    assert [x for _, _, x in agent.turns] == [f"{t.speaker}: {t.text}" for s in conversations[-1].sessions
                                              for t in s.turns]  # who said it is part of what is remembered
    assert [i["turns"] for i in ingested] == [sum(len(s.turns) for s in e.sessions) for e in conversations]
    pottery = next(r for r in rows if r["question"] == "When did Ann go to a pottery class?")
    assert pottery["reached"] == ["D1:1"] and pottery["reached_sessions"] == [1]
    assert all(r["offered"] is None and r["offered_recall"] is None for r in rows)  # it does not choose
    assert pottery["evidence_recall"] == 1.0 and pottery["session_recall"] == 1.0
    (request,) = [r for r in generator.requests if r.metadata["question_id"] == pottery["question_id"]]
    assert "session 1: 1:56 pm on 8 May, 2023" in request.prompt and TEMPORAL_HINT in request.prompt
    assert "pottery" in request.prompt  # the recalled turn itself
    breed = next(r for r in rows if r["question"] == "What breed is Rex?")
    assert breed["evidence"] == ["D3:3"] and breed["unresolved_evidence"] == ["D"]
    assert breed["evidence_recall"] == (1.0 if "D3:3" in breed["reached"] else 0.0)


def test_only_the_answered_questions_reach_the_generator_and_every_one_is_recalled_for(conversations):
    generator = Recording()
    pick = lambda episode, items: [i % 2 == 0 for i in range(len(items))]  # noqa: E731
    rows, _ = play_qa(WordRecall(), conversations, generator, user_speaker=None, count_tokens=count_words,
                      answered=pick)
    answered = [r for r in rows if r["answered"]]
    assert len(generator.requests) == len(answered) == 6 + 1
    for row in rows:
        if not row["answered"]:
            assert row["prediction"] is None and row["f1"] is None and row["prompt_tokens"] is None
        assert (row["evidence_recall"] is None) == (not row["evidence"])
    summary = scoring.summarize(rows)
    assert summary["overall"]["count"] == sum(r["category"] != 5 for r in rows)


class PerUserRecall(WordRecall):
    """WordRecall with one memory per user and a batched `memorize_many` (logged): an agent that ingests in
    lockstep when `lockstep` > 1."""

    def __init__(self, lockstep: int) -> None:
        super().__init__()
        self.lockstep, self.by_user, self.ticks = lockstep, {}, []

    def reset(self) -> None:
        self.by_user = {}

    def memorize(self, user, episode, session, turn, history):
        self.seen.append(episode)
        self.by_user.setdefault(user, []).append((session, turn, episode.sessions[session].turns[turn].text))
        return "I" in episode.sessions[session].turns[turn].text, 2.0

    def memorize_many(self, items):
        self.ticks.append(tuple(user for user, *_ in items))
        return [self.memorize(*item) for item in items]

    def recall_questions(self, user, episode, asked):
        self.turns = self.by_user.get(user, [])
        return super().recall_questions(user, episode, asked)

    def memory_texts(self, user):
        return [x for _, _, x in self.by_user.get(user, [])]


def test_conversations_ingested_in_lockstep_give_the_rows_of_one_by_one(conversations):
    alone, together = PerUserRecall(1), PerUserRecall(2)
    rows, ingested = play_qa(alone, conversations, Recording(), user_speaker=None, count_tokens=count_words)
    rows2, ingested2 = play_qa(together, conversations, Recording(), user_speaker=None, count_tokens=count_words)
    assert rows2 == [dict(r, retrieval_ms=r2["retrieval_ms"], answer_ms=r2["answer_ms"])
                     for r, r2 in zip(rows, rows2, strict=True)]
    assert ingested2 == ingested and not alone.ticks
    lengths = {e.episode_id: sum(len(s.turns) for s in e.sessions) for e in conversations}
    assert len(lengths) == 2 and together.ticks == [tuple(u for u, n in lengths.items() if k < n)
                                                    for k in range(max(lengths.values()))]  # each tick: all going


def test_adversarial_questions_are_a_seeded_choice_against_not_mentioned(conversations):
    items = [i for i in locomo_items(conversations[0]) if i.category == 5]
    for item in items:
        prompt = answer_request(item, None, None, seed=3).prompt
        assert NOT_MENTIONED in prompt and (item.adversarial_answer or "") in prompt
        assert prompt == answer_request(item, None, None, seed=3).prompt  # the same order every time
    orders = {answer_request(items[0], None, None, seed=s).prompt.index(NOT_MENTIONED) for s in range(8)}
    assert len(orders) == 2  # both orders occur over seeds


@pytest.mark.parametrize("k", [1, 3])
def test_dense_recall_for_questions_shows_its_top_k_verbatim_turns(conversations, k):
    encoder = KeywordEncoder(["pottery", "hiking", "piano", "lisbon", "dog", "beagle", "rex"])
    writer = VerbatimNotes(OfflineBackend())
    with MemoryStore() as store:
        agent = DenseAgent(writer, store, encoder, user_speaker=None, top_k=k)
        rows, ingested = play_qa(agent, conversations[:1], writer, user_speaker=None, count_tokens=count_words)
    turns = sum(len(s.turns) for s in conversations[0].sessions)
    assert writer.notes == turns and ingested[0]["memories"] == turns  # every turn stored as its own text
    assert all(len(r["reached"]) == min(k, turns) for r in rows)
    pottery = next(r for r in rows if r["question"] == "When did Ann go to a pottery class?")
    assert pottery["reached"][0] == "D1:1"
    assert pottery["memory"].splitlines()[0].endswith("I went to a pottery class yesterday.")


def test_verbatim_notes_answer_condense_requests_with_the_turn_and_pass_the_rest():
    inner = Recording()
    writer = VerbatimNotes(inner)
    note, other = writer.generate([condense_request("I adopted a beagle."), LLMRequest("hello")])
    assert note.text == "I adopted a beagle." and [r.prompt for r in inner.requests] == ["hello"]
    assert other.text == inner.inner.generate([LLMRequest("hello")])[0].text
    with pytest.raises(ValueError, match="turn_text"):
        writer.generate([LLMRequest("note?", task=TASK_CONDENSE)])


def test_judge_rows_fills_j_for_answered_categories_1_to_4_and_counts_unusable_verdicts():
    """J: one judge call over the answered rows of categories 1-4; CORRECT / WRONG become True / False, a verdict
    that parses as neither stays None and is counted; category 5 and unanswered rows are never sent."""
    from icml_jax.evaluation.locomo_qa import judge_rows
    from icml_jax.llm.types import LLMResponse

    def row(category, answer, prediction, answered=True):
        return dict(category=category, question="Where did Ann move?", answer=answer, prediction=prediction,
                    answered=answered, judge=None)

    rows = [row(1, "Paris, France", "She moved to Paris"), row(4, "Paris, France", "Berlin"),
            row(2, "2022", "unsure", answered=False), row(5, None, "Not mentioned"), row(3, "a beagle", "x")]
    sent = []

    class Judge(OfflineBackend):
        def generate(self, requests):
            sent.extend(requests)
            out = super().generate(requests)
            return out[:-1] + [LLMResponse.answering(requests[-1], "no verdict here")]

    assert judge_rows(rows, Judge()) == 1
    assert [r["judge"] for r in rows] == [True, False, None, None, None]
    assert len(sent) == 3 and all(r.task == scoring.TASK_LOCOMO_JUDGE for r in sent)
    assert judge_rows([row(5, None, "x"), row(1, "y", "y", answered=False)], Judge()) == 0 and len(sent) == 3
