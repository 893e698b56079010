"""LD-Agent's memory on handmade episodes: one event summary per earlier session, both speakers' accumulated
personas, the topic-aware event score, what a reply is shown, malformed answers and two users."""

from __future__ import annotations

import math

import numpy as np
import pytest

from icml_jax.baselines.common import Query
from icml_jax.baselines.encoder import DenseRelevance, LexicalRelevance
from icml_jax.baselines.ld_agent import Event, LDAgent, topic_overlap
from icml_jax.memory.lexical import tokenize
from tests.baselines.helpers import USER, KeywordEncoder, Recording, episode, play
from tests.baselines.two_users import check_two_users_never_mix

EPISODE = episode(["I have a dog named Rex.", "It is sunny today."], ["I live in Paris with my wife."],
                  ["Where should Rex and I walk?"], reply="I work as a nurse in Paris.")


def test_events_per_session_and_personas_of_both_speakers():
    gen = Recording()
    agent = LDAgent(gen, LexicalRelevance(), user_speaker=USER, top_k=3)
    result = play(agent, EPISODE)
    assert [r.metadata["session"] for r in gen.tasks("baseline_summarize")] == [0, 1]
    assert len(gen.tasks("baseline_ld_persona")) == 2 and gen.calls == 3  # two session ends, one reply batch
    events = agent.events["ep-1"]
    assert [(e.memory_id, e.session) for e in events] == [("ld-s0-event", 0), ("ld-s1-event", 1)]
    assert events[0].text == "The user said: I have a dog named Rex; It is sunny today."
    assert events[0].refs == (("ep-1", 0, 0), ("ep-1", 0, 2)) and events[1].refs == (("ep-1", 1, 0),)
    assert events[0].topics == frozenset(tokenize(events[0].text))
    persona = agent.personas["ep-1"]
    assert [(t.text, t.refs) for t in persona["user"]] == [
        ("I have a dog named Rex.", (("ep-1", 0, 0),)), ("I live in Paris with my wife.", (("ep-1", 1, 0),))]
    # the assistant said the same trait in both sessions: kept once, its newest source first
    (nurse,) = persona["agent"]
    assert nurse.text == "I work as a nurse in Paris." and nurse.refs[0] == ("ep-1", 1, 1)
    assert set(nurse.refs) == {("ep-1", 0, 1), ("ep-1", 0, 3), ("ep-1", 1, 1)}
    assert result.saved == [] and result.memories == [3, 5]  # events + traits after each session
    row = result.targets[0]
    assert row["utterance"] == "Where should Rex and I walk?"
    # only session 0's event shares a word (Rex); then the user's and the assistant's persona
    assert row["memory_id"] == "ld-s0-event" and row["memory"] == (
        "- The user said: I have a dog named Rex; It is sunny today.\n"
        "- User persona: I have a dog named Rex. I live in Paris with my wife.\n"
        "- Assistant persona: I work as a nurse in Paris.")
    refs = [tuple(r) for r in row["memory_refs"]]
    assert refs[:2] == [(0, 0), (0, 2)] and set(refs) == {(0, 0), (0, 2), (1, 0), (0, 1), (0, 3), (1, 1)}


def test_event_score_is_relevance_plus_topic_overlap_with_recency_decay():
    encoder = KeywordEncoder(["dog", "paris", "wife"])
    agent = LDAgent(Recording(), DenseRelevance(encoder), user_speaker=USER, topic_weight=0.5, recency_tau=2.0)
    events = [Event("a", "my dog in Paris", frozenset({"dog", "paris"}), (), 0),
              Event("b", "my wife", frozenset({"wife"}), (), 2)]
    query = Query("dog and wife", (), "e", 3, 0)
    got = agent.scores([query], events)[0]
    for j, e in enumerate(events):
        rel = (1 + encoder.cosine(query.utterance, e.text)) / 2
        expected = (rel + 0.5 * topic_overlap(query.utterance, e.topics)) * math.exp(-(3 - e.session) / 2.0)
        assert got[j] == pytest.approx(expected)
    assert topic_overlap("dog and wife", frozenset({"wife"})) == pytest.approx(1 / 2)  # "and" is a stop word
    assert topic_overlap("and the", frozenset({"wife"})) == 0.0
    bm25 = LDAgent(Recording(), LexicalRelevance(), user_speaker=USER).scores([query], events)[0]
    assert bm25.max() > 0 and np.all(bm25 > 0)  # both share a word; BM25 is divided by the row's best
    far = LDAgent(Recording(), LexicalRelevance(), user_speaker=USER).scores([Query("tea", (), "e", 3, 0)], events)
    assert np.all(far == 0)  # nothing shared: never shown


def test_top_k_events_and_persona_shown_limit():
    sessions = [[f"I have a dog named Rex number {i}."] for i in range(4)] + [["Is Rex a good dog?"]]
    agent = LDAgent(Recording(), LexicalRelevance(), user_speaker=USER, top_k=2, persona_shown=1)
    row = play(agent, episode(*sessions)).targets[0]
    lines = row["memory"].split("\n")
    assert len(lines) == 3 and lines[-1] == "- User persona: I have a dog named Rex number 3."
    assert row["memory_id"] == "ld-s3-event"  # equal relevance and topics: recency decides
    assert sum(1 for line in lines if line.startswith("- The user said")) == 2


def test_malformed_answers_are_counted_and_fall_back_visibly():
    gen = Recording({"baseline_summarize": lambda r: "", "baseline_ld_persona": lambda r: "no JSON"})
    agent = LDAgent(gen, LexicalRelevance(), user_speaker=USER)
    play(agent, episode(["I have a dog.", "I like tea."], ["bye"]))
    assert agent.malformed == {"baseline_summarize": 1, "baseline_ld_persona": 1}
    (event,) = agent.events["ep-1"]
    assert event.text == "I have a dog. I like tea." and agent.personas.get("ep-1") is None
    wrong = Recording({"baseline_ld_persona": lambda r: '{"user": [{"turn": 1, "trait": "X"}], "agent": "none"}'})
    agent = LDAgent(wrong, LexicalRelevance(), user_speaker=USER)
    play(agent, episode(["I have a dog."], ["bye"]))
    assert [(t.text, t.refs) for t in agent.personas["ep-1"]["user"]] == [("X", ())]  # turn 1 is the assistant's
    assert agent.personas["ep-1"]["agent"] == [] and agent.malformed == {"baseline_ld_persona": 2}
    assert agent.provenance()["malformed_answers"] is agent.malformed


def test_settings_are_checked():
    with pytest.raises(ValueError, match="ld_agent"):
        LDAgent(Recording(), LexicalRelevance(), user_speaker=USER, recency_tau=0.0)


def test_two_users_memories_never_mix():
    check_two_users_never_mix(LDAgent(Recording(), LexicalRelevance(), user_speaker=USER))
