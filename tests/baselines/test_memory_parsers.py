"""The LD-Agent, A-Mem, MemoryOS and THEANINE requests and answers: their parsers never raise on any JSON an LLM
might write and return only what the request showed (ids, relations, speakers); each request carries its inputs,
not labels, and the offline back end answers it in a form its parser takes without a problem."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml_jax.baselines import prompts
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.types import LLMResponse

IDS = ["0", "1", "2"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.text(max_size=8),
                    st.sampled_from(IDS + ["causal", "temporal", "user", "agent", "keep"]))
keys = st.sampled_from(["id", "page", "turn", "fact", "trait", "relation", "links", "updates", "tags", "context",
                        "keywords", "keep", "profile", "knowledge", "user", "agent"])
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=5)), max_leaves=20)
answers = st.one_of(values.map(json.dumps), st.text(max_size=40))


@settings(max_examples=200, deadline=None)
@given(answers)
def test_parsers_never_raise_and_name_only_what_was_shown(text):
    response = LLMResponse(text)
    personas, why = prompts.parse_personas(response)
    assert personas is None and why or set(personas) == set(prompts.PERSONA_SPEAKERS)
    if personas is not None:
        assert all(isinstance(t, str) and t and (turn is None or isinstance(turn, int))
                   for traits in personas.values() for turn, t in traits)
    note, why = prompts.parse_note(response)
    assert note is None and why or isinstance(note[0], bool) and all(note[1].keywords + note[1].tags)
    evolution, why = prompts.parse_evolution(response, IDS)
    if evolution is None:
        assert why
    else:
        links, updates = evolution
        assert set(links) <= set(IDS) and len(links) == len(set(links)) and set(updates) <= set(IDS)
    promotion, why = prompts.parse_promotion(response)
    assert promotion is None and why or isinstance(promotion[0], str) and all(f for _, f in promotion[1])
    links, why = prompts.parse_links(response, IDS)
    if links is None:
        assert why
    else:
        assert all(i in IDS and r in prompts.THEANINE_RELATIONS for i, r in links)
        assert len({i for i, _ in links}) == len(links)


TURNS = [(0, "user", "I have a dog named Max at home. Do you like dogs?", True),
         (1, "bot", "I work as a nurse in Paris.", False), (2, "user", "It's raining, so dull.", True)]
FIELDS = prompts.NoteFields(("dog",), ("pets",), "About dog.")
REQUESTS = {
    "ld_persona": (prompts.ld_persona_request(TURNS), prompts.parse_personas),
    "amem_note": (prompts.amem_note_request("I have a dog named Max.", context=[("bot", "hi")]), prompts.parse_note),
    "amem_evolve": (prompts.amem_evolve_request("My dog Max is sick.", FIELDS, [("0", "I have a dog.", FIELDS)]),
                    lambda r: prompts.parse_evolution(r, ["0"])),
    "memoryos_promote": (prompts.memoryos_promote_request(["I have a dog named Max.", "Hi."], "Likes pets."),
                         prompts.parse_promotion),
    "theanine_link": (prompts.theanine_link_request("My dog Max is sick.", [("0", "I have a dog.")]),
                      lambda r: prompts.parse_links(r, ["0"])),
    "theanine_refine": (prompts.theanine_refine_request("How is Max?", [[(0, "I have a dog named Max.", None)]]),
                        None),
}


def test_new_tasks_are_registered_once_each():
    tasks = [r.task for r, _ in REQUESTS.values()]
    assert len(set(tasks)) == len(tasks) and set(tasks) <= set(prompts.BASELINE_TASKS)
    assert len(set(prompts.BASELINE_TASKS)) == len(prompts.BASELINE_TASKS)


@pytest.mark.parametrize("name", list(REQUESTS))
def test_requests_carry_inputs_not_labels_and_offline_answers_parse_cleanly(name):
    request, parse = REQUESTS[name]
    json.dumps(dict(request.metadata))  # the evaluation's cache key needs JSON
    assert not {"y_p", "y_t", "label", "label_needed", "needed"} & set(request.metadata)
    (response,) = OfflineBackend().generate([request])
    if parse is None:
        assert response.text.strip() and "Max" in response.text
    else:
        value, problem = parse(response)
        assert value is not None and problem is None
