"""MemoryOS's memory on handmade episodes: the short-term queue and its FIFO overflow into mid-term segments,
heat (visits, new pages, recency) and promotion to the long-term persona, eviction of the coldest segment, what
a reply is shown, malformed answers and two users."""

from __future__ import annotations

import math

import pytest

from icml_jax.baselines import prompts
from icml_jax.baselines.common import Query
from icml_jax.baselines.encoder import LexicalRelevance
from icml_jax.baselines.memoryos import MemoryOSAgent, Page, Segment, jaccard
from icml_jax.llm.types import LLMResponse
from icml_jax.memory.lexical import tokenize
from tests.baselines.helpers import USER, Recording, episode, play
from tests.baselines.two_users import check_two_users_never_mix

DOG, PARK, SICK, WIFE, NURSE, SLEEPS = ("I have a dog named Rex.", "My dog Rex loves the park.",
                                        "My dog Rex is sick today.", "I live in Paris with my wife.",
                                        "I work as a nurse in Paris.", "Rex the dog sleeps a lot.")
EPISODE = episode([DOG, PARK], [SICK, WIFE], [NURSE, SLEEPS], ["How is my dog Rex?"])


def small(gen, **kw) -> MemoryOSAgent:
    settings = dict(short_term_pages=2, heat_threshold=3.0, top_k=1, pages_per_segment=2, knowledge_shown=2)
    return MemoryOSAgent(gen, LexicalRelevance(), user_speaker=USER, **{**settings, **kw})


def test_pages_overflow_into_segments_and_hot_segments_are_promoted():
    gen = Recording()
    agent = small(gen)
    result = play(agent, EPISODE)
    assert len(result.saved) == 6  # every acted turn is a page
    mem = agent.users["ep-1"]
    assert [p.text for p in mem.short] == [NURSE, SLEEPS]  # the newest two; the older ones overflowed (FIFO)
    assert [[p.text for p in s.pages] for s in mem.mid] == [[DOG, PARK, SICK], [WIFE]]  # grouped by topic
    # promoted twice: when its second page landed (0 visits + 2 pages + recency 1 = 3), then once a recall had
    # visited it and a new page came (1 + 1 + 1); each promotion restarts its visits and page count
    promote = gen.tasks("baseline_memoryos_promote")
    assert [[p["text"] for p in r.metadata["pages"]] for r in promote] == [[DOG, PARK], [DOG, PARK, SICK]]
    assert [r.metadata["profile"] for r in promote] == ["", "Topics the user talks about: pets."]
    assert (mem.mid[0].visits, mem.mid[0].fresh_pages) == (0, 0)
    assert [(k.text, k.refs) for k in mem.persona.knowledge] == [(DOG, (("ep-1", 0, 0),)), (SICK, (("ep-1", 1, 0),))]
    assert mem.persona.profile == "Topics the user talks about: pets."
    assert agent.stats == {"pages": 6, "overflowed": 4, "segments": 2, "evicted": 0, "promotions": 2, "facts": 2}
    (row,) = result.targets
    # the top segment's best pages, the knowledge (its texts already shown once), the profile, then the STM
    # pages of earlier sessions
    assert row["memory"].split("\n") == [f"- {DOG}", f"- {SICK}", "- User profile: Topics the user talks about: pets.",
                                         f"- {NURSE}", f"- {SLEEPS}"]
    assert row["memory_id"] == "mos-p0" and [tuple(r) for r in row["memory_refs"]] == [(0, 0), (1, 0), (2, 0), (2, 2)]
    assert mem.mid[0].visits == 0  # the final session visits nothing


def test_similarity_is_relevance_plus_jaccard_and_decides_joining():
    agent = small(Recording())
    page = Page("p", PARK, ("e", 0, 2), 0)
    segments = [Segment("a", [Page("q", DOG, ("e", 0, 0), 0)], 0), Segment("b", [Page("r", WIFE, ("e", 1, 0), 1)], 1)]
    got = agent.similarity(page, segments)
    (bm25,) = LexicalRelevance().scores([PARK], [DOG, WIFE])
    for j, s in enumerate(segments):
        expected = bm25[j] / (1 + bm25[j]) + jaccard(set(tokenize(PARK)), set(tokenize(s.text())))
        assert got[j] == pytest.approx(expected)
    assert got[0] >= 0.6 > got[1] == 0.0
    apart = small(Recording(), segment_threshold=10.0, heat_threshold=100.0)
    play(apart, EPISODE)
    assert [len(s.pages) for s in apart.users["ep-1"].mid] == [1, 1, 1, 1]  # nothing is similar enough


def test_heat_and_eviction_of_the_coldest_segment():
    s = Segment("s", [], last_visit=1, visits=2, fresh_pages=3)
    assert s.heat(1, 10.0) == pytest.approx(6.0) and s.heat(4, 2.0) == pytest.approx(5 + math.exp(-1.5))
    agent = small(Recording(), segment_threshold=10.0, heat_threshold=100.0, mid_term_segments=2)
    agent.reset()
    history: list[tuple[str, str]] = []
    texts = [DOG, WIFE, NURSE, SICK, SLEEPS]
    ep = episode(texts, ["bye"])
    for t in range(0, 2 * len(texts), 2):
        agent.observe("u", ep, 0, t, history)
    mem = agent.users["u"]
    # three pages overflowed, each its own segment; the dog one was visited by the recalls of SICK and SLEEPS,
    # the other two are equally cold (0 visits + 1 page + recency 1): the older one went
    assert [[p.text for p in s.pages] for s in mem.mid] == [[DOG], [NURSE]] and agent.stats["evicted"] == 1
    assert [s.visits for s in mem.mid] == [2, 0]


def test_recall_outside_the_final_session_visits_the_segments_shown():
    agent = small(Recording(), heat_threshold=100.0)
    agent.reset()
    ep = episode([DOG, WIFE, NURSE], ["bye"])
    for t in (0, 2, 4):
        agent.observe("u", ep, 0, t, [])
    (segment,) = agent.users["u"].mid
    (choice,) = agent.recall("u", [Query("Is my dog Rex ok?", (), "u", 1, 0)], final=False)
    assert choice.memory_id == "mos-p0" and (segment.visits, segment.last_visit) == (1, 1)
    agent.recall("u", [Query("Is my dog Rex ok?", (), "u", 2, 0)], final=True)
    assert (segment.visits, segment.last_visit) == (1, 1)
    (choice,) = agent.recall("u", [Query("Tea?", (), "u", 2, 0)], final=False)
    assert segment.visits == 1 and choice.text == f"- {WIFE}\n- {NURSE}"  # no shared word: STM pages only


def test_malformed_promotions_are_counted_and_fall_back_visibly():
    gen = Recording({"baseline_memoryos_promote": lambda r: "oops"})
    agent = small(gen)
    play(agent, EPISODE)
    mem = agent.users["ep-1"]
    assert mem.persona.profile == "" and mem.persona.knowledge == []
    assert agent.malformed == {"baseline_memoryos_promote": 2} == {"baseline_memoryos_promote": len(
        gen.tasks("baseline_memoryos_promote"))}  # heat restarts anyway: not re-sent at every turn
    wrong = Recording({"baseline_memoryos_promote": lambda r: '{"profile": 3, "knowledge": [{"page": 9, '
                                                               '"fact": "X"}, {"page": 0, "fact": "Y"}]}'})
    agent = small(wrong)
    play(agent, EPISODE)
    knowledge = agent.users["ep-1"].persona.knowledge
    assert [(k.text, k.refs) for k in knowledge] == [("X", ()), ("Y", (("ep-1", 0, 0),))]
    assert agent.users["ep-1"].persona.profile == "" and agent.malformed == {"baseline_memoryos_promote": 4}


@pytest.mark.parametrize("text, expected, problem", [
    ('{"profile": " A  user. ", "knowledge": [{"page": 1, "fact": "F"}]}', ("A user.", [(1, "F")]), None),
    ('{"profile": "P", "knowledge": ["G"]}', ("P", [(None, "G")]), "without a page id"),
    ('{"profile": "P", "knowledge": "none"}', ("P", []), "expected a list"),
    ("[]", None, "expected a JSON object"),
])
def test_promotion_answers_are_parsed_leniently(text, expected, problem):
    got, why = prompts.parse_promotion(LLMResponse(text))
    assert got == expected
    assert (why is None) if problem is None else (problem in why)


def test_knowledge_is_capped_fifo_and_settings_checked():
    agent = small(Recording(), max_knowledge=1)
    play(agent, EPISODE)
    assert [k.text for k in agent.users["ep-1"].persona.knowledge] == [SICK]  # the newest one
    with pytest.raises(ValueError, match="memoryos"):
        small(Recording(), short_term_pages=0)


def test_two_users_memories_never_mix():
    check_two_users_never_mix(MemoryOSAgent(Recording(), LexicalRelevance(), user_speaker=USER))
