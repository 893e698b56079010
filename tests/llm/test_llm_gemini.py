"""The real google-genai client against a loopback Gemini server: shape, retries, timeouts, key hygiene."""

from __future__ import annotations

import logging
import pickle
import random
import traceback

import pytest

from icml_jax.llm import (
    BackendError,
    GeminiBackend,
    GeminiConfig,
    LLMRequest,
    MissingAPIKeyError,
    ProxyInput,
    ProxyJudge,
    make_backend,
)

MODEL = "gemini-test-model"


def _backend(server, *, sleeps=None, **overrides) -> GeminiBackend:
    cfg = dict(
        model=MODEL,
        base_url=server.base_url,
        timeout_s=2.0,
        max_concurrency=4,
        max_attempts=4,
        initial_backoff_s=0.001,
        max_backoff_s=0.5,
        jitter=0.0,
    )
    cfg.update(overrides)
    record = sleeps if sleeps is not None else []
    return GeminiBackend(GeminiConfig(**cfg), sleep=record.append, rng=random.Random(0))


def test_request_shape_text_json_and_usage(fake_gemini, gemini_env):
    answers = {"say hi": fake_gemini.ok("hello there", 7, 3), "rate": fake_gemini.ok('{"score": 0.5, "reason": "x"}', 20, 9)}
    fake_gemini.responder = lambda body: answers[body["contents"][0]["parts"][0]["text"]]  # order-free: concurrent
    with _backend(fake_gemini) as be:
        plain, structured = be.generate(
            [
                LLMRequest(prompt="say hi", system="be nice", max_output_tokens=32, temperature=0.3),
                LLMRequest(prompt="rate", json_schema={"type": "object", "properties": {"score": {"type": "number"}}}),
            ]
        )
        usage = be.usage
    assert plain.text == "hello there" and plain.parsed is None and plain.attempts == 1
    assert structured.parsed == {"score": 0.5, "reason": "x"} and structured.ok_json
    assert (plain.prompt_tokens, plain.output_tokens) == (7, 3)
    assert usage.prompt_tokens == 27 and usage.output_tokens == 12 and usage.calls == 2 and usage.retries == 0
    reqs = sorted(fake_gemini.requests, key=lambda r: r["body"]["contents"][0]["parts"][0]["text"])
    assert all(r["model"] == MODEL and r["path"].endswith(f"/models/{MODEL}:generateContent") for r in reqs)
    assert all(r["api_key"] == gemini_env for r in reqs)  # sent as a header, never in the URL
    rate, hi = reqs
    assert hi["body"]["systemInstruction"]["parts"][0]["text"] == "be nice"
    assert hi["body"]["generationConfig"]["maxOutputTokens"] == 32
    assert "responseMimeType" not in hi["body"]["generationConfig"]
    gen = rate["body"]["generationConfig"]
    assert gen["responseMimeType"] == "application/json"
    assert gen["responseJsonSchema"]["properties"]["score"]["type"] == "number"
    assert "tools" not in rate["body"]


def test_retries_429_and_500_with_exponential_backoff(fake_gemini, gemini_env):
    fake_gemini.push(fake_gemini.status(429, "quota"), fake_gemini.status(500), fake_gemini.status(503), fake_gemini.ok("finally"))
    sleeps: list[float] = []
    with _backend(fake_gemini, sleeps=sleeps, initial_backoff_s=0.01) as be:
        (resp,) = be.generate([LLMRequest(prompt="x")])
        usage = be.usage
    assert resp.text == "finally" and resp.attempts == 4
    assert fake_gemini.hits == 4
    assert sleeps == pytest.approx([0.01, 0.02, 0.04])  # jitter 0: pure exponential
    assert usage.attempts == 4 and usage.retries == 3 and usage.failures == 0 and usage.calls == 1


def test_jitter_stays_within_bounds(fake_gemini, gemini_env):
    fake_gemini.push(*[fake_gemini.status(500)] * 3, fake_gemini.ok("ok"))
    sleeps: list[float] = []
    with _backend(fake_gemini, sleeps=sleeps, initial_backoff_s=0.1, jitter=0.5) as be:
        be.generate([LLMRequest(prompt="x")])
    for i, s in enumerate(sleeps):
        base = 0.1 * 2**i
        assert 0.5 * base <= s <= min(0.5, 1.5 * base)
    assert len(set(sleeps)) == len(sleeps)


def test_server_retry_hint_is_a_floor(fake_gemini, gemini_env):
    info = {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.25s"}]}
    fake_gemini.push(fake_gemini.status(429, "slow down", info), fake_gemini.ok("ok"))
    sleeps: list[float] = []
    with _backend(fake_gemini, sleeps=sleeps) as be:
        be.generate([LLMRequest(prompt="x")])
    assert sleeps == [pytest.approx(0.25)]


def test_final_error_names_backend_and_attempts(fake_gemini, gemini_env):
    fake_gemini.default = fake_gemini.status(500, "boom")
    with _backend(fake_gemini, max_attempts=3) as be:
        with pytest.raises(BackendError) as ei:
            be.generate([LLMRequest(prompt="x")])
        usage = be.usage
    err = ei.value
    assert fake_gemini.hits == 3
    assert err.backend.startswith("gemini") and err.attempts == 3 and err.retryable
    msg = str(err)
    assert "gemini" in msg and MODEL in msg and "3 attempt(s)" in msg and "500" in msg and "boom" in msg
    assert usage.failures == 1 and usage.attempts == 3


def test_client_errors_are_not_retried(fake_gemini, gemini_env):
    fake_gemini.default = fake_gemini.status(400, "bad request")
    with _backend(fake_gemini) as be:
        with pytest.raises(BackendError, match=r"1 attempt\(s\) of 4 \(not retryable\)") as ei:
            be.generate([LLMRequest(prompt="x")])
    assert fake_gemini.hits == 1 and not ei.value.retryable


def test_slow_answer_past_timeout_is_retried(fake_gemini, gemini_env):
    # the healthy answer has a whole second on a loaded host (0.1 s was once too little in CI); the stall outlasts it
    fake_gemini.push(fake_gemini.slow(3.0), fake_gemini.ok("quick"))
    with _backend(fake_gemini, timeout_s=1.0) as be:
        (resp,) = be.generate([LLMRequest(prompt="x")])
    assert resp.text == "quick" and resp.attempts == 2 and fake_gemini.hits == 2


def test_timeouts_until_the_last_attempt_raise(fake_gemini, gemini_env):
    fake_gemini.default = fake_gemini.slow(0.8)
    with _backend(fake_gemini, timeout_s=0.2, max_attempts=2) as be:
        with pytest.raises(BackendError, match=r"2 attempt\(s\).*timeout"):
            be.generate([LLMRequest(prompt="x")])
    assert fake_gemini.hits == 2


def test_malformed_response_body_is_retried(fake_gemini, gemini_env):
    fake_gemini.push(fake_gemini.bad_body(), fake_gemini.ok("fine"))
    with _backend(fake_gemini) as be:
        (resp,) = be.generate([LLMRequest(prompt="x")])
    assert resp.text == "fine" and resp.attempts == 2


def test_malformed_body_every_time_names_the_problem(fake_gemini, gemini_env):
    fake_gemini.default = fake_gemini.bad_body()
    with _backend(fake_gemini, max_attempts=2) as be:
        with pytest.raises(BackendError, match="malformed response"):
            be.generate([LLMRequest(prompt="x")])


def test_malformed_model_json_is_a_parse_error_not_an_exception(fake_gemini, gemini_env):
    fake_gemini.push(fake_gemini.ok("Sure! score is high"), fake_gemini.ok('```json\n{"score": 1}\n```'))
    with _backend(fake_gemini, max_concurrency=1) as be:
        bad, fenced = be.generate([LLMRequest(prompt="a", json_schema={"type": "object"})] * 2)
    assert bad.parsed is None and bad.parse_error and not bad.ok_json
    assert fenced.parsed == {"score": 1}


def test_judge_records_failure_after_one_reask_through_gemini(fake_gemini, gemini_env):
    fake_gemini.default = fake_gemini.ok("not json at all")
    with _backend(fake_gemini) as be:
        judge = ProxyJudge(be)
        (result,) = judge.judge([ProxyInput("I am a nurse.")])
    assert not result.ok and result.score is None and result.attempts == 2
    assert fake_gemini.hits == 2  # asked once, re-asked once, then recorded
    assert judge.metrics()["judge/proxy/failures"] == 1.0


def test_bounded_concurrency_and_order(fake_gemini, gemini_env):
    fake_gemini.delay_s = 0.05
    fake_gemini.responder = lambda body: fake_gemini.ok("echo:" + body["contents"][0]["parts"][0]["text"])
    with _backend(fake_gemini, max_concurrency=3) as be:
        out = be.generate([LLMRequest(prompt=f"p{i}") for i in range(12)])
    assert [r.text for r in out] == [f"echo:p{i}" for i in range(12)]
    assert 2 <= fake_gemini.max_inflight <= 3


def test_batch_with_a_failing_request_raises(fake_gemini, gemini_env):
    fake_gemini.responder = lambda body: (
        fake_gemini.status(400, "nope") if body["contents"][0]["parts"][0]["text"] == "bad" else fake_gemini.ok("ok")
    )
    with _backend(fake_gemini, max_concurrency=2) as be:
        with pytest.raises(BackendError, match="nope"):
            be.generate([LLMRequest(prompt=p) for p in ("a", "bad", "c", "d")])
        assert be.generate([LLMRequest(prompt="a")])[0].text == "ok"  # still usable afterwards


def test_key_never_in_logs_errors_or_repr(fake_gemini, gemini_env, caplog):
    key = gemini_env
    caplog.set_level(logging.DEBUG)  # every logger, including google_genai and httpx2
    fake_gemini.push(
        fake_gemini.status(429), fake_gemini.status(500), fake_gemini.bad_body(), fake_gemini.slow(3.0), fake_gemini.ok("ok")
    )
    be = _backend(fake_gemini, timeout_s=1.0, max_attempts=5)  # 5 attempts exactly: no healthy answer may time out
    seen: list[str] = [repr(be), str(be), repr(be.config)]
    be.generate([LLMRequest(prompt="x")])
    fake_gemini.push(fake_gemini.status(400, f"API key not valid: {key}"))  # a server echoing the key
    with pytest.raises(BackendError) as ei:
        be.generate([LLMRequest(prompt="y")])
    fake_gemini.default = fake_gemini.status(503)
    with pytest.raises(BackendError) as ei2:
        be.generate([LLMRequest(prompt="z")])
    be.close()
    for e in (ei.value, ei2.value):
        seen += [str(e), repr(e), "".join(traceback.format_exception(e))]
    assert "<redacted>" in str(ei.value)
    with pytest.raises(TypeError):
        pickle.dumps(be)
    assert caplog.records, "expected retry warnings in the log"
    blob = "\n".join(seen) + caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert key not in blob


def test_key_from_environment(fake_gemini, monkeypatch):
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError, match="GEMINI_API_KEY, GOOGLE_API_KEY"):
        _backend(fake_gemini)
    monkeypatch.setenv("GOOGLE_API_KEY", "google-key")
    with _backend(fake_gemini) as be:
        be.generate([LLMRequest(prompt="x")])
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-key")
    with _backend(fake_gemini) as be:
        be.generate([LLMRequest(prompt="x")])
    assert [r["api_key"] for r in fake_gemini.requests] == ["google-key", "gemini-key"]


def test_make_backend_from_config(fake_gemini, gemini_env):
    be = make_backend({"kind": "gemini", "model": MODEL, "base_url": fake_gemini.base_url, "max_attempts": 1})
    try:
        assert isinstance(be, GeminiBackend) and be.config.max_attempts == 1
        assert be.generate([LLMRequest(prompt="x")])[0].text == "default answer"
    finally:
        be.close()
    with pytest.raises(ValueError, match="unknown config key"):
        make_backend({"kind": "gemini", "modle": MODEL})
    with pytest.raises(ValueError, match="unknown LLM back end kind 'nonesuch'"):
        make_backend({"kind": "nonesuch"})


def test_structured_output_modes(fake_gemini, gemini_env):
    schema = {"type": "object", "properties": {"score": {"type": "number"}}, "required": ["score"]}
    fake_gemini.default = fake_gemini.ok('{"score": 0.25}')
    for mode, field in (("response_schema", "responseSchema"), ("mime_only", None)):
        with _backend(fake_gemini, structured_output=mode) as be:
            (r,) = be.generate([LLMRequest(prompt="x", json_schema=schema)])
        gen = fake_gemini.requests[-1]["body"]["generationConfig"]
        assert r.parsed == {"score": 0.25} and gen["responseMimeType"] == "application/json"
        assert "responseJsonSchema" not in gen
        assert (field in gen) if field else ("responseSchema" not in gen)
    with pytest.raises(ValueError, match="structured_output"):
        GeminiConfig(structured_output="xml")
