"""The note check: SmolLM2's prompt echo, a looped phrase, an empty note and a note about nothing in the turn are
each named; a note with content and the turn's own text pass; condense_turns asks a failed note again once, told
why, and falls back to the turn text, counted, when the second note fails too."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icml_jax.llm import CondenseInput, LLMResponse, TokenUsage, condense_turns
from icml_jax.llm.note_check import note_problem
from icml_jax.memory.writer import note_counts

TURN = "I just adopted a puppy named Max and he chews everything."
# what SmolLM2-135M wrote in docs/runs/gc_smollm2 (the 32-token cap cut it)
SMOLLM2_ECHO = "The user's turn: The user's turn: The user's turn: The user's turn: The user's turn: The"


@pytest.mark.parametrize("note, problem", [
    ("", "is empty"),
    ("   \n", "is empty"),
    (SMOLLM2_ECHO, 'echoes the prompt ("the user\'s turn")'),
    ("Recent dialogue: the user has a puppy.", 'echoes the prompt ("recent dialogue")'),
    ("<user_turn>User: I adopted a puppy</user_turn>", 'echoes the prompt ("<user_turn")'),
    ("Max chews shoes, Max chews shoes, Max chews shoes, Max chews shoes", 'repeats "max chews shoes" 4 times'),
    ("The user enjoys sunny weather.", "shares no word with the turn"),
])
def test_defective_notes_are_named(note, problem):
    assert note_problem(note, TURN) == problem


@pytest.mark.parametrize("note", ["The user adopted a puppy named Max.", "The user's dog chews everything.",
                                  "The user has puppies."])
def test_notes_with_content_pass(note):
    assert note_problem(note, TURN) is None


def test_a_turn_that_holds_the_framing_or_the_repeat_itself_does_not_fail_its_note():
    turn = "Recent dialogue: ha ha ha ha ha, my sister said that."
    assert note_problem(turn, turn) is None
    assert note_problem("The user laughed at a sister: ha ha ha ha ha.", turn) is None
    assert note_problem("Ok.", "Hi!") is None  # a turn without content words leaves nothing to share


@given(st.text(min_size=1, max_size=120).filter(lambda t: t.strip()))
def test_the_turn_text_itself_always_passes(text):
    assert note_problem(text, text) is None  # the offline writer's note and the fallback are never rejected


class _Scripted:
    """Answers each condense request with the next scripted text; records the requests."""

    name = "scripted"
    usage = TokenUsage()

    def __init__(self, *answers: str) -> None:
        self.answers, self.requests = list(answers), []

    def generate(self, requests):
        self.requests.append(list(requests))
        return [LLMResponse(text=self.answers.pop(0)) for _ in requests]

    def close(self):
        pass


def test_a_failed_note_is_asked_again_once_and_then_kept():
    backend = _Scripted(SMOLLM2_ECHO, "The user adopted a puppy named Max.")
    (c,) = condense_turns(backend, [CondenseInput(TURN)])
    assert c.text == "The user adopted a puppy named Max." and not c.fallback and c.rewritten
    assert c.problem == 'echoes the prompt ("the user\'s turn")'
    first, again = (calls[0] for calls in backend.requests)
    assert again.prompt.startswith(first.prompt)
    assert "Your previous note was rejected: it echoes the prompt" in again.prompt
    assert again.max_output_tokens == first.max_output_tokens


def test_a_second_failure_falls_back_to_the_turn_text_and_is_counted(caplog):
    backend = _Scripted("", "The user likes sunny weather.")
    (c,) = condense_turns(backend, [CondenseInput(f"  {TURN} ")])
    assert c.text == TURN and c.fallback and c.rewritten and c.problem == "is empty"
    assert "unusable note twice" in caplog.text and len(backend.requests) == 2


def test_good_notes_cost_one_call_and_only_failed_ones_are_asked_again():
    backend = _Scripted("The user adopted a puppy named Max.", SMOLLM2_ECHO, "Greets.", "The user works as a nurse.")
    turns = [CondenseInput(TURN), CondenseInput("I work nights as a nurse."), CondenseInput("Hi there!")]
    out = condense_turns(backend, turns)
    assert [len(calls) for calls in backend.requests] == [3, 1]  # only the echo was asked again
    assert [c.text for c in out] == ["The user adopted a puppy named Max.", "The user works as a nurse.", "Greets."]
    assert [c.rewritten for c in out] == [False, True, False]
    counts = note_counts(out)
    assert counts == {"notes": 3, "rewritten": 1, "fallback": 0, "problems": {"echoes the prompt": 1}}
    note_counts([c for c in condense_turns(_Scripted("", "", ""), [CondenseInput(TURN)])], counts)
    assert counts == {"notes": 4, "rewritten": 2, "fallback": 1, "problems": {"echoes the prompt": 1, "is empty": 1}}
