"""Prompts, condensation and reply generation through the offline back end; JSON extraction; retry schedule."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from icml_jax.llm import (
    TASK_CONDENSE,
    TASK_REPLY,
    CondenseInput,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    OfflineBackend,
    RetryPolicy,
    TokenUsage,
    condense_turns,
    format_dialogue,
    generate_replies,
    generate_reply,
    make_backend,
    parse_json_text,
)
from icml_jax.llm import prompts
from icml_jax.llm.generation import drop_repeated_sentences


def test_condense_offline_keeps_turn_text():
    be = OfflineBackend()
    (c,) = condense_turns(be, [CondenseInput("I just adopted a cat named Luna.", [("User", "hi")])])
    assert c.text == "I just adopted a cat named Luna." and not c.fallback
    assert c.response.prompt_tokens > 0


class _Empty:
    name = "empty"
    usage = TokenUsage()

    def generate(self, requests):
        return [LLMResponse(text="  ", finish_reason="SAFETY") for _ in requests]

    def close(self):
        pass


def test_condense_empty_answer_falls_back_to_turn_text(caplog):
    (c,) = condense_turns(_Empty(), [CondenseInput("I moved to Oslo.")])
    assert c.text == "I moved to Oslo." and c.fallback and c.problem == "is empty" and c.rewritten
    assert "unusable note twice (the first note is empty; finish_reason=SAFETY)" in caplog.text


class _Looping:
    """A small model's greedy note: one sentence over and over until the token cap; records the requests."""

    name = "looping"
    usage = TokenUsage()

    def __init__(self) -> None:
        self.requests: list[LLMRequest] = []

    def generate(self, requests):
        self.requests += requests
        return [LLMResponse(text="The user is a chef.  the user is a chef.\nThe user is a chef. Likes\tfish")
                for _ in requests]

    def close(self):
        pass


def test_condense_caps_note_length_and_drops_repeated_sentences():
    backend = _Looping()
    (c,) = condense_turns(backend, [CondenseInput("I work as a chef.")], max_output_tokens=40)
    assert c.text == "The user is a chef. Likes fish" and not c.fallback
    assert [r.max_output_tokens for r in backend.requests] == [40]
    condense_turns(backend, [CondenseInput("I work as a chef.")])
    assert backend.requests[-1].max_output_tokens == 128  # the default cap


@given(st.lists(st.sampled_from(["A b.", "a B.", "C!", "d?", " e", "\n", "f g h."]), max_size=12))
def test_drop_repeated_sentences_keeps_each_sentence_once_in_order(parts):
    text = " ".join(parts)
    out = drop_repeated_sentences(text)
    assert drop_repeated_sentences(out) == out  # idempotent
    words = " ".join(text.split())
    kept = [m.strip() for m in out.replace("!", "!|").replace("?", "?|").replace(".", ".|").split("|") if m.strip()]
    assert len({k.lower() for k in kept}) == len(kept)  # no sentence twice (case-insensitive)
    assert set(" ".join(out.split()).lower().split()) == set(words.lower().split())  # no word lost or invented


def test_reply_uses_memory_and_prompt_contains_inputs():
    be = OfflineBackend()
    history, utterance, memory = [("User", "hey"), ("Assistant", "hi!")], "Guess what, I ran today", "The user trains for a marathon."
    with_mem = generate_reply(be, history, utterance, memory)
    without = generate_reply(be, [], utterance, None)
    assert "marathon" in with_mem and "marathon" not in without
    assert with_mem == generate_reply(be, history, utterance, memory)  # deterministic
    req = prompts.reply_request([("User", "hey")], "I ran", "The user trains.")
    assert req.task == TASK_REPLY and "The user trains." in req.prompt and "User: hey" in req.prompt
    assert "(none)" in prompts.reply_request([], "I ran", None).prompt
    out = generate_replies(be, [])
    assert out == []


def test_prompt_builders_carry_metadata_and_schemas():
    c = prompts.condense_request("I am vegan.", metadata={"speaker": "Ann"})
    assert c.task == TASK_CONDENSE and c.metadata == {"turn_text": "I am vegan.", "speaker": "Ann"}
    p = prompts.proxy_judge_request("I am vegan.", label=1)
    assert p.json_schema == prompts.PROXY_JUDGE_SCHEMA and p.metadata["label"] == 1.0
    q = prompts.quality_judge_request([], "u", "r", None, label_needed=[("e", 0, 1)], used_ref=None)
    assert set(prompts.QUALITY_DIMENSIONS) <= set(q.json_schema["required"])
    assert q.metadata["label_needed"] == [("e", 0, 1)] and "used_ref" in q.metadata
    assert format_dialogue([("A", "1"), ("B", "2"), ("A", "3")], max_turns=2) == "B: 2\nA: 3"
    assert format_dialogue([]) == "(no earlier dialogue)"


def test_offline_generic_json_follows_schema_and_counts_tokens():
    be = make_backend({"kind": "offline"})
    assert isinstance(be, LLMBackend) and be.name == "offline"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}, "s": {"type": "string"}}}
    (r, t) = be.generate([LLMRequest(prompt="a b c", json_schema=schema), LLMRequest(prompt="free text")])
    assert r.parsed == {"n": 3, "s": ""}
    assert t.text.startswith("offline answer") and t.parsed is None
    assert be.usage.calls == 2 and be.usage.prompt_tokens == 5
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['modle'\] for the 'offline' back end; it takes "
                                         "no options"):
        make_backend({"kind": "offline", "modle": "x"})  # a typo: no back end takes it


def test_a_block_switched_to_another_kind_drops_the_old_kinds_options_with_a_warning(caplog):
    """`--config.llm.judge.kind=offline` on a Gemini block: the Gemini knobs stay in the block; offline ignores
    them, saying which (issue 16: this failed when the stage started)."""
    from icml_jax.llm.offline import OfflineBackend
    from icml_jax.llm.registry import check_backend

    block = {"kind": "offline", "model": "gemini-2.5-flash", "timeout_s": 60.0, "thinking_budget": None}
    assert isinstance(make_backend(block), OfflineBackend)
    assert "kind 'offline' ignores the other back ends' option(s) ['model', 'timeout_s']" in caplog.text
    with pytest.raises(ValueError, match=r"config.llm.judge: GeminiConfig: RetryPolicy.max_attempts must be >= 1"):
        check_backend({"kind": "gemini", "model": "m", "max_attempts": 0}, "config.llm.judge")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 2}\n```', {"a": 2}),
        ('Here you go: {"a": 3} hope it helps', {"a": 3}),
        ("[1, 2]", [1, 2]),
    ],
)
def test_parse_json_text_lenient(text, value):
    assert parse_json_text(text) == (value, None)


@pytest.mark.parametrize("text", ["", None, "no json here", '{"a": '])
def test_parse_json_text_errors(text):
    value, err = parse_json_text(text)
    assert value is None and err


def test_retry_policy_schedule():
    p = RetryPolicy(max_attempts=6, initial_backoff_s=1.0, max_backoff_s=5.0, multiplier=2.0, jitter=0.0)
    rng = random.Random(0)
    assert [p.delay(i, rng) for i in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert p.delay(1, rng, hint_s=3.0) == 3.0 and p.delay(1, rng, hint_s=99.0) == 5.0
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
