"""The evaluation's answer cache: nothing is asked twice, across calls, crashes and processes; keys separate
everything that changes an answer."""

from __future__ import annotations

import collections
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icml_jax.evaluation.cache import CachedBackend, ResponseCache, request_key
from icml_jax.llm import OfflineBackend
from icml_jax.llm.types import TASK_REPLY, LLMRequest, LLMResponse, TokenUsage


class Counting:
    """Answers with a function of the request; counts how often each prompt is asked; may fail on call N."""

    name = "counting"
    usage = TokenUsage()

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.asked: collections.Counter[str] = collections.Counter()
        self.calls, self.fail_on_call = 0, fail_on_call

    def generate(self, requests):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("simulated crash")
        self.asked.update(r.prompt for r in requests)
        return [LLMResponse(text=f"{r.prompt}|{r.temperature}", prompt_tokens=len(r.prompt), output_tokens=3)
                for r in requests]

    def close(self):
        pass


def reqs(n: int, **kw) -> list[LLMRequest]:
    return [LLMRequest(prompt=f"p{i}", task=TASK_REPLY, **kw) for i in range(n)]


def test_second_pass_and_a_new_process_ask_nothing(tmp_path):
    backend = Counting()
    cache = ResponseCache(tmp_path / "cache.sqlite")
    first = CachedBackend(backend, cache, {"kind": "counting"}, chunk=4).generate(reqs(10))
    assert sum(backend.asked.values()) == 10 and len(cache) == 10
    again = CachedBackend(backend, cache, {"kind": "counting"}).generate(reqs(10))
    assert again == first and sum(backend.asked.values()) == 10
    cache.close()
    reopened = CachedBackend(Counting(), ResponseCache(tmp_path / "cache.sqlite"), {"kind": "counting"})
    assert reopened.generate(reqs(10)) == first and (reopened.hits, reopened.misses) == (10, 0)


def test_a_crash_loses_only_the_chunk_in_flight(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    crashing = Counting(fail_on_call=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        CachedBackend(crashing, cache, "ns", chunk=4).generate(reqs(16))
    assert len(cache) == 8  # chunks 1 and 2 were committed
    healthy = Counting()
    out = CachedBackend(healthy, cache, "ns", chunk=4).generate(reqs(16))
    assert [r.text for r in out] == [f"p{i}|0.0" for i in range(16)]
    assert set(healthy.asked) == {f"p{i}" for i in range(8, 16)}  # never a repeated request
    assert all((crashing.asked + healthy.asked)[p] == 1 for p in healthy.asked)


def test_keys_separate_namespace_and_every_request_field():
    base = LLMRequest(prompt="hi", system="s", max_output_tokens=8, temperature=0.0, task=TASK_REPLY,
                      metadata={"labels": [1]})
    variants = [LLMRequest(prompt="hi!", system="s", max_output_tokens=8, task=TASK_REPLY, metadata={"labels": [1]}),
                LLMRequest(prompt="hi", system=None, max_output_tokens=8, task=TASK_REPLY, metadata={"labels": [1]}),
                LLMRequest(prompt="hi", system="s", max_output_tokens=9, task=TASK_REPLY, metadata={"labels": [1]}),
                LLMRequest(prompt="hi", system="s", max_output_tokens=8, temperature=0.7, task=TASK_REPLY,
                           metadata={"labels": [1]}),
                LLMRequest(prompt="hi", system="s", max_output_tokens=8, task=TASK_REPLY, metadata={"labels": [2]}),
                LLMRequest(prompt="hi", system="s", max_output_tokens=8, task=TASK_REPLY, metadata={"labels": [1]},
                           json_schema={"type": "object"})]
    keys = {request_key("a", base)} | {request_key("a", v) for v in variants} | {request_key("b", base)}
    assert len(keys) == len(variants) + 2
    assert request_key("a", base) == request_key("a", LLMRequest(**{**base.__dict__}))
    with pytest.raises(TypeError, match="task 'reply'.*not JSON"):
        request_key("a", LLMRequest(prompt="x", task=TASK_REPLY, metadata={"obj": object()}))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 6), st.sampled_from([0.0, 0.7])), max_size=25), st.integers(1, 5))
def test_cached_answers_equal_the_back_ends_and_each_distinct_request_is_asked_once(tmp_path, items, chunk):
    requests = [LLMRequest(prompt=f"q{i}", temperature=t) for i, t in items]
    backend = Counting()
    with_cache = CachedBackend(backend, ResponseCache(tmp_path / f"{uuid.uuid4().hex}.db"),
                               "ns", chunk=chunk)
    for _ in range(2):
        assert with_cache.generate(requests) == Counting().generate(requests)
    distinct = {(r.prompt, r.temperature) for r in requests}
    assert backend.calls == -(-len(distinct) // chunk) and with_cache.misses == len(distinct)
    assert with_cache.hits == 2 * len(requests) - len(distinct)


def test_offline_back_end_through_the_cache_answers_as_before(tmp_path):
    from icml_jax.llm.prompts import condense_request

    requests = [condense_request(f"I adopted a cat named Luna {i}.", ()) for i in range(3)]
    cached = CachedBackend(OfflineBackend(), ResponseCache(tmp_path / "c.sqlite"), {"kind": "offline"})
    assert [r.text for r in cached.generate(requests)] == [r.text for r in OfflineBackend().generate(requests)]


def test_per_request_mode_keeps_every_answer_that_came_back_before_a_failure(tmp_path):
    class FailsOn(Counting):
        def generate(self, requests):
            if any(r.prompt == "p4" for r in requests):
                raise RuntimeError("simulated outage")
            return super().generate(requests)

    cache = ResponseCache(tmp_path / "c.sqlite")
    failing = FailsOn()
    with pytest.raises(RuntimeError, match="simulated outage"):
        CachedBackend(failing, cache, "ns", per_request=True, in_flight=1).generate(reqs(10))
    # in order on one thread: p0-p3 answered before the failure (a request already taken may finish too)
    assert {"p0", "p1", "p2", "p3"} <= set(failing.asked) and "p4" not in failing.asked
    assert len(cache) == len(failing.asked)  # every answer that came back is stored
    healthy = Counting()
    concurrent = CachedBackend(healthy, cache, "ns", per_request=True, in_flight=4)
    assert [r.text for r in concurrent.generate(reqs(10))] == [f"p{i}|0.0" for i in range(10)]
    assert set(healthy.asked) == {f"p{i}" for i in range(10)} - set(failing.asked)  # nothing asked twice
    assert healthy.calls == len(healthy.asked)  # one request a call


def test_the_cache_lives_in_the_llm_layer():
    """The synthesis caches its requests too: the cache is `icml_jax.llm.cache`, re-exported here unchanged."""
    import inspect

    from icml_jax.evaluation import cache as eval_cache
    from icml_jax.llm import cache as llm_cache

    assert (eval_cache.CachedBackend, eval_cache.ResponseCache, eval_cache.request_key) == \
        (llm_cache.CachedBackend, llm_cache.ResponseCache, llm_cache.request_key)
    assert "icml_jax.evaluation" not in inspect.getsource(llm_cache)  # the llm layer imports nothing above it


@pytest.mark.parametrize("per_request", [False, True])
def test_generate_each_stores_the_answers_and_hands_back_the_failures(tmp_path, per_request):
    from icml_jax.llm.cache import CachedBackend as LLMCachedBackend
    from icml_jax.llm.types import BackendError

    class FailsP3(Counting):
        def generate(self, requests):
            if any(r.prompt == "p3" for r in requests):
                raise BackendError("counting", 4, 4, "HTTP 503 UNAVAILABLE", True)
            return super().generate(requests)

    cache = ResponseCache(tmp_path / "c.sqlite")
    failing = FailsP3()
    cached = LLMCachedBackend(failing, cache, "ns", chunk=4, per_request=per_request, in_flight=3)
    out = cached.generate_each(reqs(10) + reqs(4))  # p0-p3 twice: asked once, the failure shared
    assert isinstance(out[3], BackendError) and out[13] is out[3] and "HTTP 503" in str(out[3])
    assert [o.text for i, o in enumerate(out[:10]) if i != 3] == [f"p{i}|0.0" for i in range(10) if i != 3]
    assert len(cache) == 9 and cached.failures == 1 and (cached.hits, cached.misses) == (4, 10)
    assert cached.answered["calls"] == 12  # the answers handed out (the failure costs nothing)
    healthy = Counting()
    again = LLMCachedBackend(healthy, cache, "ns", chunk=4, per_request=per_request).generate_each(reqs(10))
    assert [o.text for o in again] == [f"p{i}|0.0" for i in range(10)] and set(healthy.asked) == {"p3"}
