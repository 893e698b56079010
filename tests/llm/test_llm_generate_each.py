"""`generate_each`: per-request outcomes for batch callers, with every back end; a request that failed for good
comes back as its BackendError in its place, the others answered, nothing cancelled."""

from __future__ import annotations

import random

import pytest

from icml_jax.llm import GeminiBackend, GeminiConfig, LLMRequest, LLMResponse, OfflineBackend, TokenUsage, prompts
from icml_jax.llm.types import BackendError

MODEL = "gemini-test-model"


def _generate_each():
    from icml_jax.llm.generation import generate_each

    return generate_each


class Picky:
    """A back end without `generate_each` (as the local one): a batch holding "bad" fails for good as a whole;
    `boom` raises a bug (not a back-end failure)."""

    name = "picky"
    usage = TokenUsage()

    def __init__(self, boom: bool = False, short: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.boom, self.short = boom, short

    def generate(self, requests):
        self.batches.append([r.prompt for r in requests])
        if self.boom:
            raise KeyError("a bug, not a back-end failure")
        if any(r.prompt == "bad" for r in requests):
            raise BackendError("picky", 3, 3, "HTTP 500 INTERNAL", True)
        out = [LLMResponse(text=r.prompt.upper()) for r in requests]
        return out[:-1] if self.short else out

    def close(self):
        pass


def _reqs(*prompts_: str) -> list[LLMRequest]:
    return [LLMRequest(prompt=p) for p in prompts_]


def test_offline_outcomes_equal_generate():
    generate_each = _generate_each()
    requests = [prompts.condense_request(f"I adopted a cat named Luna {i}.", ()) for i in range(3)]
    assert generate_each(OfflineBackend(), requests) == OfflineBackend().generate(requests)
    assert generate_each(OfflineBackend(), []) == []


def test_a_back_end_without_generate_each_gets_each_failure_in_place():
    generate_each = _generate_each()
    backend = Picky()
    out = generate_each(backend, _reqs("a", "bad", "c"))
    assert [o.text for o in (out[0], out[2])] == ["A", "C"]
    assert isinstance(out[1], BackendError) and "HTTP 500" in str(out[1])
    assert backend.batches == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]  # the batch, then one by one
    assert generate_each(backend, _reqs("x", "y")) == [LLMResponse(text="X"), LLMResponse(text="Y")]
    assert backend.batches[-1] == ["x", "y"]  # a healthy batch is one call


def test_bugs_propagate_and_a_short_answer_names_the_back_end():
    generate_each = _generate_each()
    with pytest.raises(KeyError, match="a bug"):
        generate_each(Picky(boom=True), _reqs("a"))
    with pytest.raises(RuntimeError, match="picky back end answered 1 of 2 requests"):
        generate_each(Picky(short=True), _reqs("a", "b"))


def test_gemini_runs_every_request_to_its_end(fake_gemini, gemini_env):
    generate_each = _generate_each()
    fake_gemini.responder = lambda body: (
        fake_gemini.status(400, "nope") if body["contents"][0]["parts"][0]["text"] == "bad"
        else fake_gemini.ok("echo:" + body["contents"][0]["parts"][0]["text"]))
    config = GeminiConfig(model=MODEL, base_url=fake_gemini.base_url, max_concurrency=2)
    with GeminiBackend(config, sleep=lambda s: None, rng=random.Random(0)) as be:
        out = generate_each(be, _reqs("a", "bad", "c", "d", "e"))
        with pytest.raises(BackendError, match="nope"):  # generate keeps raising for its callers
            be.generate(_reqs("bad"))
        usage = be.usage
    assert [o.text for i, o in enumerate(out) if i != 1] == ["echo:a", "echo:c", "echo:d", "echo:e"]
    assert isinstance(out[1], BackendError) and not out[1].retryable and "400" in str(out[1])
    assert fake_gemini.hits == 6  # nothing cancelled: 5 + the raising call
    assert usage.calls == 4 and usage.failures == 2


def test_condense_turns_can_skip_a_failed_request():
    from icml_jax.llm import CondenseInput, condense_turns

    class FailsOnLuna(OfflineBackend):
        name = "fails-on-luna"

        def generate(self, requests):
            if any("Luna" in r.prompt for r in requests):
                raise BackendError("fails-on-luna", 2, 2, "HTTP 503 UNAVAILABLE", True)
            return super().generate(requests)

    items = [CondenseInput("I adopted a cat named Luna."), CondenseInput("I am a nurse.")]
    with pytest.raises(BackendError, match="HTTP 503"):
        condense_turns(FailsOnLuna(), items)
    luna, nurse = condense_turns(FailsOnLuna(), items, skip_failures=True)
    assert (luna.text, luna.fallback) == ("I adopted a cat named Luna.", True) and "HTTP 503" in luna.error
    assert (nurse.text, nurse.fallback, nurse.error) == ("I am a nurse.", False, None)


def test_token_usage_dict_carries_total_tokens():
    usage = TokenUsage(prompt_tokens=3, output_tokens=4, thoughts_tokens=5, calls=1, attempts=3, retries=2,
                       failures=0)
    assert usage.to_dict() == {"prompt_tokens": 3, "output_tokens": 4, "thoughts_tokens": 5, "calls": 1,
                               "attempts": 3, "retries": 2, "failures": 0, "total_tokens": 12}
