"""THEANINE's memory on handmade episodes: memories per earlier session that are never deleted, relation links
to related earlier memories (the LLM's choice among relevant candidates), the timelines a reply retrieves and
their refinement into one context, malformed answers and two users."""

from __future__ import annotations

import pytest

from icml_jax.baselines import prompts
from icml_jax.baselines.encoder import LexicalRelevance
from icml_jax.baselines.theanine import TheanineAgent
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.types import LLMResponse
from tests.baselines.helpers import USER, Recording, episode, play
from tests.baselines.two_users import check_two_users_never_mix

DOG, PARIS, SICK, VET = ("I have a dog named Rex.", "I live in Paris with my wife.",
                         "My dog Rex is sick because he ate chocolate.", "I took my dog Rex to the vet in Paris.")
EPISODE = episode([DOG, PARIS], [SICK], [VET], ["How is Rex doing?"])


def test_memories_are_linked_by_relations_and_a_reply_gets_the_refined_timeline():
    gen = Recording()
    agent = TheanineAgent(gen, LexicalRelevance(), user_speaker=USER, top_k=1)
    result = play(agent, EPISODE)
    bank = agent.memories["ep-1"]
    assert [(m.memory_id, m.text, m.refs) for m in bank.values()] == [
        ("th-s0-m0", DOG, (("ep-1", 0, 0),)), ("th-s0-m1", PARIS, (("ep-1", 0, 2),)),
        ("th-s1-m0", SICK, (("ep-1", 1, 0),)), ("th-s2-m0", VET, (("ep-1", 2, 0),))]
    assert result.memories == [2, 3, 4] and result.saved == []  # never deleted, no per-turn save
    links = gen.tasks("baseline_theanine_link")
    # candidates: earlier sessions' memories sharing a word (BM25); the same session's are never candidates
    assert [{c["text"] for c in r.metadata["candidates"]} for r in links] == [{DOG}, {DOG, PARIS, SICK}]
    assert bank["th-s1-m0"].earlier == {"th-s0-m0": "causal"}  # "because"
    assert bank["th-s2-m0"].earlier == {"th-s0-m0": "temporal", "th-s0-m1": "temporal", "th-s1-m0": "temporal"}
    assert bank["th-s0-m0"].later == {"th-s1-m0": "causal", "th-s2-m0": "temporal"}
    assert agent.stats["links"] == 4 and agent.stats["causal"] == 1
    (row,) = result.targets
    refine = gen.tasks("baseline_theanine_refine")[-1]
    # the anchor (the best match of "Rex") and what descends from it; the Paris memory is the vet memory's
    # ancestor, not the anchor's, so it is not on this timeline
    assert refine.metadata["timelines"] == [[{"session": 0, "text": DOG, "relation": None},
                                             {"session": 1, "text": SICK, "relation": "causal"},
                                             {"session": 2, "text": VET, "relation": "temporal"}]]
    assert "-> (causal) [session 2] " + SICK in refine.prompt
    assert row["memory"] == ("In session 1, I have a dog named Rex. As a result, in session 2, My dog Rex is sick "
                             "because he ate chocolate. In session 3, I took my dog Rex to the vet in Paris.")
    assert row["memory_id"] == "th-s0-m0" and [tuple(r) for r in row["memory_refs"]] == [(0, 0), (1, 0), (2, 0)]
    # a refinement at every recall that had memory: sessions 1 and 2's acted turns, then the final batch
    assert len(gen.tasks("baseline_theanine_refine")) == agent.stats["refinements"] == 3


def test_timelines_are_capped_nearest_first_and_identical_ones_shown_once():
    agent = TheanineAgent(Recording(), LexicalRelevance(), user_speaker=USER, top_k=2, timeline_length=2)
    play(agent, EPISODE)
    bank = agent.memories["ep-1"]
    # depth 1 on both sides of the anchor: the later session wins the tie
    assert [m.memory_id for m in agent.timeline(bank, bank["th-s0-m0"])] == ["th-s0-m0", "th-s2-m0"]
    agent.timeline_length = 5
    line = agent.timeline(bank, bank["th-s2-m0"])  # only ancestors
    assert [m.memory_id for m in line] == ["th-s0-m0", "th-s0-m1", "th-s1-m0", "th-s2-m0"]
    assert [r for _, _, r in agent.steps(line)] == [None, None, None, "temporal"]  # a relation only to its link
    gen = Recording()
    pair = TheanineAgent(gen, LexicalRelevance(), user_speaker=USER, top_k=2)
    row = play(pair, episode([DOG], ["My dog Rex is old."], ["Is my dog Rex ok?"])).targets[0]
    assert len(gen.tasks("baseline_theanine_refine")[-1].metadata["timelines"]) == 1  # both anchors: one line
    assert len(row["memory_refs"]) == 2


def test_malformed_answers_are_counted_and_fall_back_visibly():
    gen = Recording({"baseline_extract_facts": lambda r: "no JSON", "baseline_theanine_link": lambda r: "oops",
                     "baseline_theanine_refine": lambda r: ""})
    agent = TheanineAgent(gen, LexicalRelevance(), user_speaker=USER)
    result = play(agent, episode([DOG, "It is sunny."], ["My dog Rex is old."], ["Is Rex ok?"]))
    assert [m.text for m in agent.memories["ep-1"].values()] == [DOG, "It is sunny.", "My dog Rex is old."]
    assert all(not m.earlier and not m.later for m in agent.memories["ep-1"].values())
    assert agent.malformed == {"baseline_extract_facts": 2, "baseline_theanine_link": 1,
                               "baseline_theanine_refine": 2}
    (row,) = result.targets
    assert row["memory"].startswith("[session 2] My dog Rex is old.")  # the timelines as rendered
    wrong = Recording({"baseline_theanine_link": lambda r: '{"links": [{"id": "0", "relation": "vibes"}, '
                                                           '{"id": "4", "relation": "causal"}]}'})
    agent = TheanineAgent(wrong, LexicalRelevance(), user_speaker=USER)
    play(agent, episode([DOG], ["My dog Rex is old."], ["Is Rex ok?"]))
    assert agent.stats["links"] == 0 and agent.malformed == {"baseline_theanine_link": 1}


@pytest.mark.parametrize("text, links, problem", [
    ('{"links": [{"id": "1", "relation": "Causal"}, {"id": "1", "relation": "temporal"}]}', [("1", "causal")],
     None),
    ('[{"id": 0, "relation": "temporal"}]', [("0", "temporal")], None),
    ('{"links": [{"id": "0", "relation": "same"}]}', [], "relations"),
    ('{"links": "none"}', None, "expected a list"),
])
def test_link_answers_are_parsed_leniently(text, links, problem):
    got, why = prompts.parse_links(LLMResponse(text), ["0", "1"])
    assert got == links
    assert (why is None) if problem is None else (problem in why)


def test_offline_link_relation_rule_and_settings():
    link = lambda memory, *texts: prompts.theanine_link_request(  # noqa: E731
        memory, [(str(i), t) for i, t in enumerate(texts)])
    (causal, temporal) = OfflineBackend().generate([link(SICK, DOG, PARIS), link(VET, DOG)])
    assert causal.parsed == {"links": [{"id": "0", "relation": "causal"}]}
    assert temporal.parsed == {"links": [{"id": "0", "relation": "temporal"}]}
    with pytest.raises(ValueError, match="theanine"):
        TheanineAgent(Recording(), LexicalRelevance(), user_speaker=USER, timeline_length=0)


def test_two_users_memories_never_mix():
    check_two_users_never_mix(TheanineAgent(Recording(), LexicalRelevance(), user_speaker=USER))
