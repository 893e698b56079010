"""Gemini's retry window and timeouts: the defaults ride out a minute of 429s, Retry-After is a floor, a stall
is cut at a per-attempt timeout sized to the answer, and a flaky endpoint (30% faults) costs retries, not runs.
No test waits for a backoff: sleeps go to a fake clock."""

from __future__ import annotations

import random
import time

import pytest

from icml_jax.llm import GeminiBackend, GeminiConfig, LLMRequest, RetryPolicy
from icml_jax.llm.types import BackendError

MODEL = "gemini-test-model"


class LowestJitter(random.Random):
    """An rng whose every draw is 0.0: each backoff at the bottom of its jitter band (the shortest window)."""

    def random(self) -> float:
        return 0.0


class FakeClock:
    """Time that passes only when the back end sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _shortest_window(policy: RetryPolicy) -> float:
    """Total backoff before the last attempt with every delay at its lowest jitter, from `delay` itself."""
    return sum(policy.delay(k, LowestJitter()) for k in range(1, policy.max_attempts))


def test_default_retry_window_is_at_least_a_minute():
    for policy in (GeminiConfig().retry_policy, RetryPolicy()):
        assert _shortest_window(policy) >= 60.0
        assert policy.min_total_backoff_s() == pytest.approx(_shortest_window(policy))
        assert policy.min_total_backoff_s() <= policy.max_total_backoff_s()
    assert GeminiConfig().retry_policy == RetryPolicy()  # one default schedule, not two


def test_window_bounds_are_pure_and_respect_the_cap():
    p = RetryPolicy(max_attempts=4, initial_backoff_s=1.0, max_backoff_s=3.0, multiplier=2.0, jitter=0.5)
    # bases 1, 2, 3 (capped): lowest 0.5 + 1 + 1.5; highest 1.5 + 3 + 3 (1.5 x 3 capped at 3)
    assert p.min_total_backoff_s() == pytest.approx(3.0) and p.max_total_backoff_s() == pytest.approx(7.5)
    assert RetryPolicy(max_attempts=1).min_total_backoff_s() == 0.0


def test_a_minute_of_429s_then_success_with_the_default_config(fake_gemini, gemini_env):
    clock = FakeClock()
    fake_gemini.responder = lambda body: (fake_gemini.status(429, "quota exceeded") if clock.now < 60.0
                                          else fake_gemini.ok("through"))
    config = GeminiConfig(model=MODEL, base_url=fake_gemini.base_url)  # every retry knob at its default
    with GeminiBackend(config, sleep=clock.sleep, rng=LowestJitter()) as be:
        (resp,) = be.generate([LLMRequest(prompt="x")])
        usage = be.usage
    assert resp.text == "through" and clock.now >= 60.0
    assert resp.attempts == fake_gemini.hits == len(clock.sleeps) + 1 <= config.max_attempts
    assert usage.retries == len(clock.sleeps) and usage.failures == 0


def test_retry_after_header_is_a_floor(fake_gemini, gemini_env):
    fake_gemini.push(fake_gemini.status(429, "slow down", headers={"Retry-After": "7"}), fake_gemini.ok("ok"))
    clock = FakeClock()
    config = GeminiConfig(model=MODEL, base_url=fake_gemini.base_url, initial_backoff_s=0.001, jitter=0.0)
    with GeminiBackend(config, sleep=clock.sleep, rng=random.Random(0)) as be:
        (resp,) = be.generate([LLMRequest(prompt="x")])
    assert resp.text == "ok" and clock.sleeps == [pytest.approx(7.0)]


def test_attempt_timeout_follows_the_answer_length_and_doubles_after_each_timeout():
    c = GeminiConfig(timeout_s=60.0, timeout_floor_s=10.0, timeout_tokens_per_s=25.0)
    assert c.attempt_timeout_s(128) == pytest.approx(10.0 + 128 / 25)  # a memory note: ~15 s, not 60
    assert c.attempt_timeout_s(512) == pytest.approx(10.0 + 512 / 25)
    assert c.attempt_timeout_s(4096) == 60.0  # long answers: the cap
    assert [c.attempt_timeout_s(128, timeouts=k) for k in range(4)] == pytest.approx([15.12, 30.24, 60.0, 60.0])
    assert GeminiConfig(timeout_s=60.0, timeout_tokens_per_s=None).attempt_timeout_s(1) == 60.0
    for bad in (dict(timeout_floor_s=0.0), dict(timeout_tokens_per_s=0.0)):
        with pytest.raises(ValueError, match="GeminiConfig.timeout_"):
            GeminiConfig(**bad)


def test_a_stall_is_cut_at_the_short_attempt_timeout_not_timeout_s(fake_gemini, gemini_env):
    fake_gemini.push(fake_gemini.slow(2.0), fake_gemini.ok("quick"))
    config = GeminiConfig(model=MODEL, base_url=fake_gemini.base_url, timeout_s=5.0, timeout_floor_s=0.2,
                          timeout_tokens_per_s=1000.0, initial_backoff_s=0.001, jitter=0.0)
    t0 = time.monotonic()
    with GeminiBackend(config, sleep=lambda s: None) as be:
        (resp,) = be.generate([LLMRequest(prompt="x", max_output_tokens=10)])
    assert resp.text == "quick" and resp.attempts == 2  # the stalled attempt was given up after ~0.21 s
    assert time.monotonic() - t0 < 1.8
    # the deadline sent along follows each request's length (whole seconds, rounded up), capped by timeout_s
    with GeminiBackend(config, sleep=lambda s: None) as be:
        be.generate([LLMRequest(prompt="short", max_output_tokens=10)])
        be.generate([LLMRequest(prompt="long", max_output_tokens=100_000)])
    assert [r["server_timeout"] for r in fake_gemini.requests[-2:]] == ["1", "5"]


def test_a_slow_but_healthy_server_gets_longer_attempts(fake_gemini, gemini_env):
    fake_gemini.default = fake_gemini.slow(1.2, fake_gemini.ok("slow but fine"))
    config = GeminiConfig(model=MODEL, base_url=fake_gemini.base_url, timeout_s=5.0, timeout_floor_s=0.25,
                          timeout_tokens_per_s=1e9, initial_backoff_s=0.001, jitter=0.0)
    with GeminiBackend(config, sleep=lambda s: None) as be:
        (resp,) = be.generate([LLMRequest(prompt="x", max_output_tokens=1)])
    assert resp.text == "slow but fine" and resp.attempts == 4  # timeouts 0.25, 0.5, 1.0 s, then 2.0 s (0.8 s spare)


def test_thirty_percent_faults_cost_retries_not_requests(fake_gemini, gemini_env):
    """The demo's failure: at 30% faults one request in a long job eventually meets max_attempts faults in a row.
    With the default window that takes 9 in a row; the requests that do fail come back in place, the rest
    answered."""
    from icml_jax.llm.generation import generate_each

    fake_gemini.responder = lambda body: fake_gemini.ok("echo:" + body["contents"][0]["parts"][0]["text"])
    # A stall (10 s) always outlasts an attempt (at most 2 s); a healthy answer on a loaded host never nears 1 s.
    fake_gemini.inject_faults(0.3, fake_gemini.fault_mix(stall_s=10.0), seed=7)
    clock = FakeClock()
    config = GeminiConfig(model=MODEL, base_url=fake_gemini.base_url, max_concurrency=8, timeout_floor_s=1.0,
                          timeout_s=2.0, timeout_tokens_per_s=1e9)
    requests = [LLMRequest(prompt=f"p{i}", max_output_tokens=1) for i in range(40)]
    with GeminiBackend(config, sleep=clock.sleep, rng=random.Random(0)) as be:
        out = generate_each(be, requests)
        usage = be.usage
    assert [r.text for r in out] == [f"echo:p{i}" for i in range(40)]
    assert fake_gemini.faults_injected > 5 and usage.retries == fake_gemini.faults_injected
    assert usage.failures == 0 and usage.calls == 40

    fake_gemini.requests.clear()
    fake_gemini.inject_faults(0.5, (fake_gemini.status(500, "internal"),), seed=3)
    with GeminiBackend(GeminiConfig(model=MODEL, base_url=fake_gemini.base_url, max_attempts=2),
                       sleep=clock.sleep, rng=random.Random(0)) as be:
        out = generate_each(be, requests)
        usage = be.usage
    failed = [i for i, r in enumerate(out) if isinstance(r, BackendError)]
    assert failed and len(failed) < 40 and usage.failures == len(failed) and usage.calls == 40 - len(failed)
    assert all(out[i].text == f"echo:p{i}" for i in range(40) if i not in failed)
    assert all("500" in str(out[i]) and out[i].attempts == 2 for i in failed)
