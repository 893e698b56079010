"""The OpenAI-compatible back end against a real server: llama-cpp-python's (`python -m llama_cpp.server`, the
test extra's pin) on loopback with the fetched SmolLM2-135M-Instruct GGUF, one server for the module, short
answers. Every request kind a run sends: plain, JSON with a schema under structured_output=auto (the server's
500 on json_schema, then JSON mode with the schema), 8 at once, prompts one token under and at the context
window (answered; refused at once, not retried, with the server's reason), the answer cache and the token counts;
then scripts/check_openai_server.py's table. Outside CI a missing llama_cpp or model is skipped with the fix in
the reason; in CI (CI=true, where `.ci/run` installs and fetches both) it is a failure.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

from icml_jax.llm import BackendError, LLMRequest
from icml_jax.llm.cache import CachedBackend, ResponseCache, answer_namespace
from icml_jax.llm.openai_compat import OpenAIBackend, structured_mode_of
from icml_jax.llm.registry import make_backend
from icml_jax.models import fetch
from tests.fetched import fetched_dir
from tests.scripts_loader import load_script

bench = load_script("benchmark_served_generator")  # starts and stops the server
check = load_script("check_openai_server")

NAME = "smollm2-135m-instruct"  # the fetched model, also the name the server answers to (--model_alias)
N_CTX = 512  # the server's window: small, so a prompt at the limit is quick to read
CAP = 8  # max_output_tokens of every answer
START_TIMEOUT_S = 120.0
FILLER = " apple"  # one token in SmolLM2's vocabulary (checked against the server's counts below)
SCHEMA, JSON_SYSTEM = check.SCHEMA, check.JSON_SYSTEM  # the live-server check's JSON request


def _missing(reason: str) -> None:
    """Skips the module outside CI; fails it in CI, where a missing piece is a broken install."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """llama-cpp-python's server on a free loopback port with the fetched GGUF; yields its /v1 root, stopped after
    the module."""
    if importlib.util.find_spec("llama_cpp") is None:
        _missing('llama_cpp is not installed; run `pip install -e ".[test]"` (on an AVX-512/AMX host with the '
                 "CMAKE_ARGS of .ci/run, docs/install.md)")
    gguf = fetch.gguf_path(fetched_dir(NAME), NAME)  # fetched_dir skips / fails the same way
    port = bench.free_port()
    log_path = tmp_path_factory.mktemp("llama_cpp_server") / "server.log"
    command = bench.server_command(gguf, port, alias=NAME, n_ctx=N_CTX, n_threads=2)
    try:  # started, waited for, and checked for a crash while serving (`ServerError`, the log's tail)
        with bench.running_server(command, f"http://127.0.0.1:{port}/v1", log_path,
                                  timeout_s=START_TIMEOUT_S) as base_url:
            yield base_url
    except bench.ServerError as exc:
        pytest.fail(f"llama_cpp.server: {exc}")


def _block(base_url: str) -> dict[str, Any]:
    """The back-end block as a user writes it for a local keyless server. The server answers one request at a
    time, so the last of 8 waits for the other 7: every attempt may take a minute (timeout_floor_s; the default
    10 s plus 25 tokens/s is sized for a server that runs requests side by side)."""
    return {"kind": "openai", "base_url": base_url, "model": NAME, "api_key_env": (), "timeout_s": 60.0,
            "timeout_floor_s": 60.0, "max_attempts": 2, "initial_backoff_s": 0.5}


def _backend(base_url: str) -> OpenAIBackend:
    """A fresh back end on the server (structured_output=auto undecided)."""
    backend = make_backend(_block(base_url))
    assert isinstance(backend, OpenAIBackend)
    return backend


def _ask(backend: OpenAIBackend, prompt: str, **fields: Any) -> Any:
    """One answer (of at most CAP tokens unless `fields` sets max_output_tokens)."""
    (answer,) = backend.generate([LLMRequest(prompt=prompt, **{"max_output_tokens": CAP, **fields})])
    return answer


def test_a_plain_request(server):
    with _backend(server) as be:
        answer = _ask(be, "Say hello in five words.")
        usage = be.usage
    assert answer.text.strip() and answer.finish_reason in ("stop", "length") and answer.attempts == 1
    assert answer.parsed is None and usage.calls == 1 and usage.retries == 0 and usage.failures == 0


def test_json_with_a_schema_under_auto_settles_on_json_object(server):
    with _backend(server) as be:
        assert be.config.structured_output == "auto"
        first, second = (_ask(be, "What is the capital of France?", system=JSON_SYSTEM, json_schema=SCHEMA,
                              task="check", max_output_tokens=48) for _ in range(2))
        usage = be.usage
        mode = structured_mode_of(be)
    assert mode == "json_object"  # json_schema rejected (HTTP 500, a validation error), then JSON mode + schema
    assert usage.attempts == 3 and usage.retries == 0 and usage.failures == 0  # one rejected probe, no retry
    for answer in (first, second):
        assert answer.ok_json, answer.text
        assert set(answer.parsed) == {"capital", "is_european"}
        assert isinstance(answer.parsed["capital"], str) and len(answer.parsed["capital"]) <= 24
        assert isinstance(answer.parsed["is_european"], bool)


def test_eight_requests_at_once(server):
    with _backend(server) as be:
        assert be.config.max_concurrency >= 8
        out = be.generate_each([LLMRequest(prompt=f"Name a colour. ({i})", max_output_tokens=CAP) for i in range(8)])
        usage = be.usage
    assert all(not isinstance(r, BackendError) and r.text.strip() for r in out), out
    assert usage.calls == 8 and usage.failures == 0 and usage.retries == 0


def test_the_context_window_one_token_under_and_at_it(server):
    with _backend(server) as be:
        base = _ask(be, "Reply with one word.", max_output_tokens=1).prompt_tokens
        ten = _ask(be, "Reply with one word." + FILLER * 10, max_output_tokens=1).prompt_tokens
        assert ten == base + 10  # the server counts one token per filler unit, so sizes below are exact
        under = _ask(be, "Reply with one word." + FILLER * (N_CTX - 1 - base))
        assert under.prompt_tokens == N_CTX - 1 and under.output_tokens <= 1  # the server shortens the cap to fit
        with pytest.raises(BackendError) as ei:
            _ask(be, "Reply with one word." + FILLER * (N_CTX - base))
        usage = be.usage
    err = ei.value
    assert err.attempts == 1 and not err.retryable and usage.retries == 0  # refused at once
    msg = str(err)
    assert "\n" not in msg and f"HTTP 400 from {server}" in msg
    assert f"maximum context length is {N_CTX} tokens" in msg and f"{N_CTX} in the messages" in msg


def test_the_answer_cache_serves_a_repeat_without_the_server(server, tmp_path):
    request = LLMRequest(prompt="Say one word.", max_output_tokens=CAP, task="cache_check")
    block = _block(server)
    for run in range(2):  # a second run (new back end, same cache file) sends nothing
        cache = ResponseCache(tmp_path / "cache.sqlite")
        with _backend(server) as be:
            cached = CachedBackend(be, cache, answer_namespace(block), per_request=True)
            answers = cached.generate([request]) + cached.generate([request])
            calls = be.usage.calls
        cache.close()
        if run == 0:
            first = answers[0]
        assert answers == [first, first] and calls == (1 if run == 0 else 0), f"run {run}"
        assert (cached.misses, cached.hits) == ((1, 1) if run == 0 else (0, 2))


def test_token_counts(server):
    with _backend(server) as be:
        short, long = be.generate([
            LLMRequest(prompt="Count to three.", max_output_tokens=CAP),
            LLMRequest(prompt="Count to three." + FILLER * 40, max_output_tokens=CAP)])
        usage = be.usage
    assert long.prompt_tokens == short.prompt_tokens + 40  # the same template around a 40-token longer prompt
    assert all(0 < r.output_tokens <= CAP for r in (short, long))
    assert usage.prompt_tokens == short.prompt_tokens + long.prompt_tokens
    assert usage.output_tokens == short.output_tokens + long.output_tokens and usage.thoughts_tokens == 0
    assert usage.calls == 2 and usage.retries == 0


def test_the_check_script_passes_every_row(server):
    from tests.llm.test_check_openai_server import check

    rows = check.check_server(server, NAME, context_tokens=N_CTX, max_output_tokens=CAP)
    table = check.format_table(rows)
    print(f"\n{table}")
    assert [r.kind for r in rows] == list(check.KINDS) and all(r.ok for r in rows), table
