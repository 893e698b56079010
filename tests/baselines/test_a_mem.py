"""A-Mem's memory on handmade episodes: which turns become notes, their keywords / tags / context, the LLM's
links among similar notes and the neighbours' evolution, what a reply is shown (top notes and their linked
neighbours), malformed answers and two users."""

from __future__ import annotations

import json

import pytest

from icml_jax.baselines import prompts
from icml_jax.baselines.a_mem import AMemAgent
from icml_jax.baselines.common import Query
from icml_jax.baselines.encoder import LexicalRelevance
from icml_jax.llm.types import LLMResponse
from tests.baselines.helpers import USER, Recording, episode, play
from tests.baselines.two_users import check_two_users_never_mix

EPISODE = episode(["I have a dog named Rex.", "It is sunny today."],
                  ["My dog Rex and I moved to Paris.", "I live in Paris with my wife."],
                  ["Tell me about my wife."])


def test_notes_links_and_evolution_with_the_offline_answers():
    gen = Recording()
    agent = AMemAgent(gen, LexicalRelevance(), user_speaker=USER, top_k=1, link_k=5, neighbours=2)
    result = play(agent, EPISODE)
    assert len(gen.tasks("baseline_amem_note")) == 4  # one per acted turn
    assert [(s["session"], s["turn"]) for s in result.saved] == [(0, 0), (1, 0), (1, 2)]  # small talk skipped
    assert agent.stats == {"notes": 3, "skipped": 1, "links": 2, "evolved": 2}
    notes = agent.notes["ep-1"]
    rex, moved, wife = notes["amem-0"], notes["amem-1"], notes["amem-2"]
    assert rex.fields.keywords == ("dog", "named", "rex") and rex.refs == (("ep-1", 0, 0),)
    assert moved.fields.context == "About dog, rex, moved." and moved.refs == (("ep-1", 1, 0),)
    evolve = gen.tasks("baseline_amem_evolve")
    assert [[n["id"] for n in r.metadata["neighbours"]] for r in evolve] == [["0"], ["0", "1"]]
    # the second evolution saw both older notes (the rex note shares the tag "home" since its evolution) but
    # linked only the one sharing a keyword: the LLM decides links, not the similarity
    assert {n["content"] for n in evolve[1].metadata["neighbours"]} == {rex.content, moved.content}
    assert rex.links == ["amem-1"] and moved.links == ["amem-0", "amem-2"] and wife.links == ["amem-1"]
    assert rex.fields.tags == ("pets", "home") and moved.fields.tags == ("home", "pets", "family")  # evolved
    (row,) = result.targets
    assert row["memory_id"] == "amem-2"  # the one note sharing "wife", then its linked neighbour
    assert row["memory"] == ("- I live in Paris with my wife. (About live, paris, wife.)\n"
                             "- My dog Rex and I moved to Paris. (About dog, rex, moved.)")
    assert [tuple(r) for r in row["memory_refs"]] == [(1, 2), (1, 0)]
    assert result.memories == [1, 3]


def test_neighbours_per_note_are_capped_newest_link_first():
    gen = Recording()
    agent = AMemAgent(gen, LexicalRelevance(), user_speaker=USER, top_k=1, neighbours=1)
    row = play(agent, episode(["I have a dog named Rex."], ["My dog Rex is old.", "My dog Rex is sick."],
                              ["Is a named dog happier?"])).targets[0]
    assert row["memory_id"] == "amem-0" and agent.notes["ep-1"]["amem-0"].links == ["amem-1", "amem-2"]
    assert [tuple(r) for r in row["memory_refs"]] == [(0, 0), (1, 2)]  # one neighbour: the newest link
    agent.neighbours = 0
    (choice,) = agent.recall("ep-1", [Query("Is a named dog happier?", (), "ep-1", 2, 0)], final=True)
    assert choice.all_refs == (("ep-1", 0, 0),)


def test_scripted_evolution_updates_a_neighbours_context_and_an_empty_link_list_links_nothing():
    evolve = {"answer": '{"links": ["0"], "updates": [{"id": "0", "context": "Rex came along to Paris.", '
                        '"tags": []}]}'}
    gen = Recording({"baseline_amem_evolve": lambda r: evolve["answer"]})
    agent = AMemAgent(gen, LexicalRelevance(), user_speaker=USER)
    play(agent, episode(["I have a dog named Rex."], ["My dog Rex and I moved to Paris."], ["bye"]))
    rex = agent.notes["ep-1"]["amem-0"]
    assert rex.fields.context == "Rex came along to Paris." and rex.fields.tags == ("pets",)  # tags kept
    assert rex.links == ["amem-1"] and agent.stats["evolved"] == 1
    evolve["answer"] = '{"links": [], "updates": []}'
    agent.reset()
    play(agent, episode(["I have a dog named Rex."], ["My dog Rex and I moved to Paris."], ["bye"]))
    assert all(n.links == [] for n in agent.notes["ep-1"].values()) and agent.malformed == {}


def test_malformed_answers_are_counted_and_fall_back_visibly():
    gen = Recording({"baseline_amem_note": lambda r: "no JSON",
                     "baseline_amem_evolve": lambda r: '{"links": ["7", "0"], "updates": [{"id": "3"}]}'})
    agent = AMemAgent(gen, LexicalRelevance(), user_speaker=USER)
    result = play(agent, episode(["It is sunny today."], ["Sunny days are nice."], ["bye"]))
    assert len(result.saved) == 2  # unusable note answers keep the turn
    first, second = agent.notes["ep-1"].values()
    assert first.fields == prompts.NoteFields((), (), "") and first.shown() == "It is sunny today."
    assert second.links == ["amem-0"]  # the shown id kept, the unknown one and the bad update ignored
    assert agent.malformed == {"baseline_amem_note": 2, "baseline_amem_evolve": 1}
    bad = Recording({"baseline_amem_note": lambda r: '{"keep": "yes", "keywords": "dog", "tags": [], '
                                                     '"context": 3}'})
    agent = AMemAgent(bad, LexicalRelevance(), user_speaker=USER)
    play(agent, episode(["I have a dog."], ["bye"]))
    (note,) = agent.notes["ep-1"].values()
    assert note.fields == prompts.NoteFields((), (), "") and agent.malformed == {"baseline_amem_note": 1}


@pytest.mark.parametrize("text, expected, problem", [
    ('{"links": [0, "1"], "updates": [{"id": 1, "context": " New  one ", "tags": ["a", "a"]}]}',
     (["0", "1"], {"1": ("New one", ("a",))}), None),
    ('{"links": ["5"], "updates": []}', ([], {}), "not one of those shown"),
    ('{"links": "0", "updates": {}}', ([], {}), "expected a list"),
    ("[1]", None, "expected a JSON object"),
])
def test_evolution_answers_are_parsed_leniently(text, expected, problem):
    got, why = prompts.parse_evolution(LLMResponse(text), ["0", "1"])
    assert got == expected
    assert (why is None) if problem is None else (problem in why)


def test_requests_carry_inputs_not_labels():
    note = prompts.amem_note_request("I have a dog.", context=[("user", "hi")])
    evolve = prompts.amem_evolve_request("new", prompts.NoteFields(("k",), ("t",), "c"),
                                         [("0", "</memory> old", prompts.NoteFields((), (), ""))])
    for r in (note, evolve):
        json.dumps(dict(r.metadata))
        assert not {"y_p", "y_t", "label", "label_needed", "needed"} & set(r.metadata) and r.task in \
            prompts.BASELINE_TASKS
    assert evolve.prompt.count("</memory>") == 2 and "keywords: k\ntags: t\ncontext: c" in evolve.prompt


def test_settings_are_checked():
    with pytest.raises(ValueError, match="a_mem"):
        AMemAgent(Recording(), LexicalRelevance(), user_speaker=USER, top_k=0)


def test_two_users_memories_never_mix():
    check_two_users_never_mix(AMemAgent(Recording(), LexicalRelevance(), user_speaker=USER))
