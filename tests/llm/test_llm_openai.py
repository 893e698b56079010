"""The real `openai` client against a loopback OpenAI-compatible server (/v1/chat/completions): request shape,
JSON-schema answers, usage, retries under 30% injected faults, one-line failures, caching, key hygiene and the
command-line switch of a back-end block to kind=openai; the server also plays real servers' structured-output
behaviour (llama-cpp-python's 500 on json_schema, a server taking neither response_format type) for
structured_output=auto and for requests rejected for a field. No test waits for a backoff: sleeps are recorded."""

from __future__ import annotations

import collections
import json
import logging
import pickle
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from icml_jax.llm import BackendError, LLMRequest, MissingAPIKeyError, ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.llm.cache import CachedBackend, ResponseCache, answer_namespace
from icml_jax.llm.gemini import GeminiBackend, GeminiConfig
from icml_jax.llm.openai_compat import NO_KEY, OpenAIBackend, OpenAIConfig, structured_mode_of
from icml_jax.llm.registry import check_backend, make_backend
from tests.llm.loopback import loopback_server

MODEL = "gpt-test-model"
KEY = "sk-test-SEKRIT-0123456789abcdef"
SCHEMA = {"type": "object", "properties": {"score": {"type": "number"}, "reason": {"type": "string"}},
          "required": ["score"]}
FAULT_KINDS = ("429", "500", "stall", "bad_body", "no_choices", "bad_content")


# -- the fake server --------------------------------------------------------------------------------------------


def ok(text: str, prompt_tokens: int = 11, completion_tokens: int = 5, reasoning_tokens: int = 0,
       finish_reason: str = "stop") -> dict[str, Any]:
    """A successful chat completion."""
    return {"kind": "ok", "text": text, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "reasoning_tokens": reasoning_tokens, "finish_reason": finish_reason}


def status(code: int, message: str = "fault", headers: dict[str, str] | None = None) -> dict[str, Any]:
    """An HTTP error with OpenAI's error body (and extra headers, e.g. Retry-After)."""
    return {"kind": "status", "code": code, "message": message, "headers": headers or {}}


def error(code: int, body: dict[str, Any] | str) -> dict[str, Any]:
    """An HTTP error with exactly `body` (a dict as JSON, a str as plain text), as a given server words it."""
    return {"kind": "error", "code": code, "body": body}


def slow(seconds: float, then: dict[str, Any] | None = None) -> dict[str, Any]:
    """An answer (default: a late 200) that comes after `seconds`."""
    return {"kind": "slow", "seconds": seconds, "then": then or ok("late")}


FAULTS: dict[str, dict[str, Any]] = {
    "429": status(429, "Rate limit reached", {"Retry-After": "2"}),
    "500": status(500, "The server had an error"),
    "stall": slow(2.5),
    "bad_body": {"kind": "raw", "body": b'{"choices": [ {"message": '},  # 200, not JSON
    "no_choices": {"kind": "raw", "body": b'{"id": "x", "object": "chat.completion", "choices": []}'},
    "bad_content": ok("Sure! The score is high."),  # 200, valid body, content that is not the JSON asked for
}

# -- real servers' structured output (responders) -----------------------------------------------------------------

JSON_SYSTEM = 'Answer with a JSON object: {"score": a number, "reason": a short sentence}.'  # as the judges' prompts


def _prompt(body: dict[str, Any]) -> str:
    """The user message of a chat-completion body."""
    return body["messages"][-1]["content"]


def _schema_answer(body: dict[str, Any]) -> dict[str, Any]:
    """An answer in SCHEMA's shape (what a decoder constrained to it, or a model following the prompt, writes)."""
    return ok(json.dumps({"score": 0.5, "reason": _prompt(body)}), 20, 9)


def llama_cpp_python_500(got: str) -> dict[str, Any]:
    """llama-cpp-python 0.3.x on a response_format type other than 'text' / 'json_object': FastAPI's validation
    error, caught by the server's route handler and sent as an HTTP 500 with pydantic's error list."""
    message = (f"[{{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': \"Input should be "
               f"'text' or 'json_object'\", 'input': '{got}', 'ctx': {{'expected': \"'text' or 'json_object'\"}}}}]")
    return error(500, {"error": {"message": message, "type": "internal_server_error", "param": None, "code": None}})


def llama_cpp_python(body: dict[str, Any]) -> dict[str, Any]:
    """llama-cpp-python's server: response_format {"type": "text" | "json_object", "schema"?}. json_schema is a 500
    validation error; JSON mode constrains decoding to `schema` only when one is sent, else (as measured against
    0.3.36) the answer is cut mid-object at the token cap."""
    fmt = body.get("response_format")
    if fmt is None:
        return ok("echo:" + _prompt(body), 7, 3)
    if fmt.get("type") not in ("text", "json_object"):
        return llama_cpp_python_500(str(fmt.get("type")))
    if fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), dict):
        return _schema_answer(body)
    return ok('{"answer": "Sure! Here is what I think about', 20, int(body.get("max_tokens", 512)), 0, "length")


def tgi_422(variant: str) -> dict[str, Any]:
    """TGI (before it took OpenAI's types) on an unknown response_format type: axum's plain-text 422."""
    return error(422, "Failed to deserialize the JSON body into the target type: response_format: unknown variant "
                      f"`{variant}`, expected `json` or `regex` at line 1 column 310")


def grammar_only(body: dict[str, Any]) -> dict[str, Any]:
    """A server that takes neither response_format type (only its own `json` / `regex` grammars): 422 on both;
    without response_format the model follows the prompt, which describes the JSON."""
    fmt = body.get("response_format")
    if fmt is not None and fmt.get("type") not in ("json", "regex"):
        return tgi_422(str(fmt.get("type")))
    if any("JSON" in str(m["content"]) for m in body["messages"]):
        return _schema_answer(body)
    return ok("echo:" + _prompt(body), 7, 3)


class FakeOpenAI:
    """Scripted server state: a queue of actions, then seeded faults, then a responder; what it saw and sent."""

    def __init__(self) -> None:
        """An idle server state: no script, no faults, the echo responder."""
        self.lock = threading.Lock()
        self.script: collections.deque[dict[str, Any]] = collections.deque()
        self.responder: Callable[[dict[str, Any]], dict[str, Any]] = self.echo
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self.fault_rate = 0.0
        self.arrivals = 0  # requests not taken by the script, the ones faults are drawn for
        self.faults: collections.Counter[str] = collections.Counter()
        self.delivered_tokens = collections.Counter()  # usage of the answers that reached the client in time

    @staticmethod
    def echo(body: dict[str, Any]) -> dict[str, Any]:
        """JSON for a schema request, else the prompt echoed."""
        prompt = body["messages"][-1]["content"]
        if "response_format" in body:
            return ok(json.dumps({"score": 0.5, "reason": prompt}), 20, 9)
        return ok("echo:" + prompt, 7, 3)

    @property
    def base_url(self) -> str:
        """The /v1 root the client is pointed at."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def hits(self) -> int:
        """Requests received so far (attempts, from the client's side)."""
        with self.lock:
            return len(self.requests)

    def push(self, *actions: dict[str, Any]) -> None:
        """Queues actions for the next requests, before any fault or responder."""
        with self.lock:
            self.script.extend(actions)

    def inject_faults(self, rate: float) -> None:
        """From now on answer a `rate` share of the requests not taken by the script with a fault, spread evenly
        over the arrivals (exactly floor(rate x arrivals) faults); the faults take the kinds of FAULT_KINDS in
        turn, so each kind is seen as often as the others."""
        with self.lock:
            self.fault_rate, self.arrivals = rate, 0

    def next_action(self, body: dict[str, Any]) -> dict[str, Any]:
        """The script's next action, else an injected fault (counted by kind), else the responder's answer."""
        with self.lock:
            if self.script:
                return self.script.popleft()
            self.arrivals += 1
            if int(self.arrivals * self.fault_rate) > int((self.arrivals - 1) * self.fault_rate):
                kind = FAULT_KINDS[sum(self.faults.values()) % len(FAULT_KINDS)]
                self.faults[kind] += 1
                return FAULTS[kind]
        return self.responder(body)


def _handler(state: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """Answers POST /v1/chat/completions with `state`'s next action."""

        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            """Silent, to keep pytest output clean."""

        def _send(self, code: int, payload: bytes, headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> bool:
            """Writes one response; False when the client already gave up (timed out)."""
            try:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
                return True
            except (BrokenPipeError, ConnectionResetError):
                return False  # the client gave up (timeout)

        def do_POST(self) -> None:
            """Records the request, then answers it as scripted, faulted or by the responder."""
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/chat/completions":
                self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}).encode())
                return
            body = json.loads(raw or b"{}")
            with state.lock:
                state.requests.append({"path": self.path, "body": body,
                                       "authorization": self.headers.get("Authorization")})
            action = state.next_action(body)
            late = action["kind"] == "slow"
            if late:
                time.sleep(action["seconds"])
                action = action["then"]
            if action["kind"] == "ok":
                usage = {"prompt_tokens": action["prompt_tokens"], "completion_tokens": action["completion_tokens"],
                         "total_tokens": action["prompt_tokens"] + action["completion_tokens"]}
                if action["reasoning_tokens"]:
                    usage["completion_tokens_details"] = {"reasoning_tokens": action["reasoning_tokens"]}
                payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model"),
                           "choices": [{"index": 0, "finish_reason": action["finish_reason"],
                                        "message": {"role": "assistant", "content": action["text"]}}],
                           "usage": usage}
                if self._send(200, json.dumps(payload).encode()) and not late:
                    with state.lock:
                        state.delivered_tokens.update(prompt=action["prompt_tokens"],
                                                      completion=action["completion_tokens"])
            elif action["kind"] == "status":
                err = {"error": {"message": action["message"], "type": "server_error", "code": None}}
                self._send(action["code"], json.dumps(err).encode(), action["headers"])
            elif action["kind"] == "raw":
                self._send(200, action["body"])
            elif action["kind"] == "hangup":  # a reset: the connection closes without an answer
                self.close_connection = True
            elif action["kind"] == "error":
                raw_body = action["body"]
                text = raw_body if isinstance(raw_body, str) else json.dumps(raw_body)
                self._send(action["code"], text.encode(), content_type="application/json" if
                           isinstance(raw_body, dict) else "text/plain; charset=utf-8")
            else:  # pragma: no cover - test bug
                raise AssertionError(action)

    return Handler


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A running loopback OpenAI-compatible server (127.0.0.1 only), stopped after the test."""
    state = FakeOpenAI()
    with loopback_server(_handler(state)) as state.port:
        yield state


@pytest.fixture
def openai_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """Only the test key in the environment (and no OPENAI_BASE_URL to send it elsewhere)."""
    for name in ("OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    return KEY


def _backend(server: FakeOpenAI, *, sleeps: list[float] | None = None, **overrides: Any) -> OpenAIBackend:
    """A back end on `server` with short timeouts and no real backoff (sleeps go to `sleeps`)."""
    cfg: dict[str, Any] = dict(model=MODEL, base_url=server.base_url, timeout_s=2.0, timeout_tokens_per_s=None,
                               max_concurrency=4, max_attempts=4, initial_backoff_s=0.001, max_backoff_s=5.0,
                               jitter=0.0)
    cfg.update(overrides)
    return OpenAIBackend(OpenAIConfig(**cfg), sleep=(sleeps if sleeps is not None else []).append,
                         rng=random.Random(0))


# -- shape, structured output, usage ------------------------------------------------------------------------------


def test_request_shape_text_json_and_usage(fake_openai, openai_env):
    with _backend(fake_openai) as be:
        plain, structured = be.generate([
            LLMRequest(prompt="say hi", system="be nice", max_output_tokens=32, temperature=0.3),
            LLMRequest(prompt="rate", json_schema=SCHEMA, task="proxy_judge"),
        ])
        usage = be.usage
    assert plain.text == "echo:say hi" and plain.parsed is None and plain.attempts == 1
    assert structured.parsed == {"score": 0.5, "reason": "rate"} and structured.ok_json
    assert (plain.prompt_tokens, plain.output_tokens, plain.finish_reason) == (7, 3, "stop")
    assert usage.prompt_tokens == 27 and usage.output_tokens == 12 and usage.calls == 2 and usage.retries == 0
    reqs = sorted(fake_openai.requests, key=lambda r: r["body"]["messages"][-1]["content"])
    rate, hi = reqs
    assert all(r["authorization"] == f"Bearer {KEY}" and r["body"]["model"] == MODEL for r in reqs)
    assert hi["body"]["messages"] == [{"role": "system", "content": "be nice"}, {"role": "user", "content": "say hi"}]
    assert hi["body"]["max_tokens"] == 32 and hi["body"]["temperature"] == 0.3 and "response_format" not in hi["body"]
    fmt = rate["body"]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == SCHEMA
    assert fmt["json_schema"]["name"] == "proxy_judge_answer" and fmt["json_schema"]["strict"] is False


def test_reasoning_tokens_are_counted_as_thoughts(fake_openai, openai_env):
    fake_openai.push(ok("done", prompt_tokens=10, completion_tokens=50, reasoning_tokens=40))
    with _backend(fake_openai, max_tokens_field="max_completion_tokens") as be:
        (r,) = be.generate([LLMRequest(prompt="x", max_output_tokens=64)])
        usage = be.usage
    assert (r.prompt_tokens, r.output_tokens) == (10, 10)
    assert (usage.output_tokens, usage.thoughts_tokens, usage.total_tokens) == (10, 40, 60)
    body = fake_openai.requests[-1]["body"]
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body


def _json_requests(n: int, tag: str = "rate") -> list[LLMRequest]:
    """`n` JSON requests whose prompts describe the JSON, as the judges' do."""
    return [LLMRequest(prompt=f"{tag} {i}", system=JSON_SYSTEM, json_schema=SCHEMA, task="proxy_judge")
            for i in range(n)]


def _formats(server: FakeOpenAI) -> list[str | None]:
    """The response_format type of every request the server received, in arrival order (None: none sent)."""
    return [(r["body"].get("response_format") or {}).get("type") for r in server.requests]


def _in_shape(response: Any) -> bool:
    """Whether an answer parsed to SCHEMA's shape (a number score, a string reason)."""
    return response.ok_json and isinstance(response.parsed.get("score"), float) and \
        isinstance(response.parsed.get("reason"), str)


def test_explicit_structured_output_modes_are_kept(fake_openai, openai_env):
    fake_openai.responder = lambda body: ok('{"score": 0.25}')
    for mode, expected in (("json_schema", {"type": "json_schema", "json_schema": {
            "name": "generic_answer", "schema": SCHEMA, "strict": False}}),
            ("json_object", {"type": "json_object", "schema": SCHEMA}),  # the schema rides along, always
            ("prompt_only", None)):
        with _backend(fake_openai, structured_output=mode) as be:
            assert be.structured_mode == mode  # decided by the config, before any request
            (r,) = be.generate([LLMRequest(prompt="x", json_schema=SCHEMA)])
        assert r.parsed == {"score": 0.25}
        assert fake_openai.requests[-1]["body"].get("response_format") == expected, mode
    assert OpenAIConfig().structured_output == "auto"
    with pytest.raises(ValueError, match="structured_output"):
        OpenAIConfig(structured_output="xml")


def test_an_explicit_json_schema_rejected_by_llama_cpp_python_is_not_retried(fake_openai, openai_env):
    fake_openai.responder = llama_cpp_python
    with _backend(fake_openai, structured_output="json_schema") as be:
        with pytest.raises(BackendError, match=r"1 attempt\(s\) of 4 \(not retryable\)") as ei:
            be.generate(_json_requests(1))
        usage = be.usage
    msg = str(ei.value)
    assert fake_openai.hits == 1 and usage.retries == 0 and not ei.value.retryable
    assert msg.startswith(f"openai (model {MODEL}) back end") and f"HTTP 500 from {fake_openai.base_url}" in msg
    assert "Input should be 'text' or 'json_object'" in msg and "request field 'response_format'" in msg
    assert "set structured_output=auto or structured_output=json_object or structured_output=prompt_only" in msg
    assert "--config.llm.<role>.structured_output=auto" in msg


@pytest.mark.parametrize("server, mode, rejected", [
    ("openai", "json_schema", []),
    ("llama_cpp_python", "json_object", ["json_schema"]),
    ("grammar_only", "prompt_only", ["json_schema", "json_object"]),
])
def test_auto_finds_the_mode_each_server_takes(fake_openai, openai_env, caplog, server, mode, rejected):
    fake_openai.responder = {"openai": fake_openai.echo, "llama_cpp_python": llama_cpp_python,
                             "grammar_only": grammar_only}[server]
    caplog.set_level(logging.INFO, logger="icml_jax.llm.openai_compat")
    with _backend(fake_openai) as be:
        (plain,) = be.generate([LLMRequest(prompt="hi")])  # no schema: nothing probed, nothing decided
        assert be.structured_mode == "auto" and plain.text == "echo:hi"
        first = be.generate(_json_requests(1, "first"))
        rest = be.generate(_json_requests(4))
        usage = be.usage
        assert be.structured_mode == mode and structured_mode_of(be) == mode
    assert all(_in_shape(r) for r in first + rest) and first[0].parsed["reason"] == "first 0"
    sent = [mode if mode != "prompt_only" else None] * 5
    assert _formats(fake_openai) == [None, *rejected, *sent]  # one rejection per mode left, no retry
    assert usage.retries == 0 and usage.attempts == fake_openai.hits == 1 + len(rejected) + 5
    if mode == "json_object":
        assert all(r["body"]["response_format"]["schema"] == SCHEMA for r in fake_openai.requests[2:])
    (decided,) = [r for r in caplog.records if "structured output uses" in r.getMessage()]  # logged once
    assert f"uses {mode} for every JSON request" in decided.getMessage()
    assert all(f"{m}: HTTP" in decided.getMessage() for m in rejected)  # and why each mode above it was left
    assert decided.levelno == (logging.WARNING if rejected else logging.INFO)


def test_llama_cpp_python_honours_json_object_only_with_the_schema(fake_openai, openai_env):
    import openai

    fake_openai.responder = llama_cpp_python
    with _backend(fake_openai, structured_output="json_object") as be:
        (r,) = be.generate(_json_requests(1))
    assert _in_shape(r) and fake_openai.requests[-1]["body"]["response_format"]["schema"] == SCHEMA
    # the same server asked for JSON mode without the schema (what json_object sent before): cut at the cap
    with openai.OpenAI(api_key="k", base_url=fake_openai.base_url, max_retries=0) as client:
        raw = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                             response_format={"type": "json_object"}, max_tokens=64)
    assert raw.choices[0].finish_reason == "length" and raw.usage.completion_tokens == 64
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw.choices[0].message.content)


def test_the_settled_mode_reaches_the_evaluations_usage_record(fake_openai, openai_env, tmp_path):
    from types import SimpleNamespace

    from icml_jax.evaluate import backend_usage

    fake_openai.responder = llama_cpp_python
    block = {"kind": "openai", "model": MODEL, "base_url": fake_openai.base_url}
    cache = ResponseCache(tmp_path / "c.sqlite")
    with _backend(fake_openai) as be:
        cached = CachedBackend(be, cache, answer_namespace(block), per_request=True)
        assert backend_usage(cached, 2, None)["structured_output"] == "auto"  # nothing asked for JSON yet
        cached.generate(_json_requests(2))
        usage = backend_usage(cached, 2, None)
    cache.close()
    assert usage["structured_output"] == "json_object" and usage["calls"] == 2  # the mode a run's results name
    local = SimpleNamespace(answered={"calls": 1, "prompt_tokens": 3, "output_tokens": 2})  # no modes (local)
    assert "structured_output" not in backend_usage(local, 1, None)


@pytest.mark.parametrize("server, rejections", [("llama_cpp_python", 1), ("grammar_only", 2)])
def test_auto_decides_once_across_concurrent_requests(fake_openai, openai_env, caplog, server, rejections):
    responder = {"llama_cpp_python": llama_cpp_python, "grammar_only": grammar_only}[server]

    def slow_rejections(body: dict[str, Any]) -> dict[str, Any]:
        """`responder`'s answer, a rejection 0.2 s late: the other requests arrive while a probe is out."""
        action = responder(body)
        return slow(0.2, action) if action["kind"] == "error" else action

    fake_openai.responder = slow_rejections
    caplog.set_level(logging.INFO, logger="icml_jax.llm.openai_compat")
    with _backend(fake_openai, max_concurrency=8) as be:
        out = be.generate(_json_requests(8))
        usage = be.usage
        mode = be.structured_mode
    assert all(_in_shape(r) for r in out) and [r.parsed["reason"] for r in out] == [f"rate {i}" for i in range(8)]
    assert fake_openai.hits == 8 + rejections and usage.attempts == fake_openai.hits and usage.retries == 0
    formats = _formats(fake_openai)
    assert formats[:rejections] == ["json_schema", "json_object"][:rejections]  # one probe per mode, in order
    assert formats[rejections:] == [{"llama_cpp_python": "json_object", "grammar_only": None}[server]] * 8
    (decided,) = [r.getMessage() for r in caplog.records if "structured output uses" in r.getMessage()]
    assert f"uses {mode} for every JSON request" in decided  # decided and logged once


def test_transient_faults_while_probing_are_retried(fake_openai, openai_env):
    # quota, a bare 500, a connection closed without an answer: no rejection, the probe is retried
    fake_openai.push(FAULTS["429"], FAULTS["500"], {"kind": "hangup"})
    fake_openai.responder = llama_cpp_python
    sleeps: list[float] = []
    with _backend(fake_openai, sleeps=sleeps) as be:
        (r,) = be.generate(_json_requests(1))
        usage = be.usage
        assert be.structured_mode == "json_object"
    assert _in_shape(r) and r.attempts == 4 and usage.retries == 3 and len(sleeps) == 3 and sleeps[0] >= 2.0
    # three faults on json_schema probes (retried), then json_schema rejected once, then json_object answered
    assert _formats(fake_openai) == ["json_schema"] * 4 + ["json_object"] and usage.attempts == 5


def test_a_rejected_field_names_its_knob_and_is_not_retried(fake_openai, openai_env):
    fake_openai.push(error(400, {"error": {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                   "'max_completion_tokens' instead.", "type": "invalid_request_error", "param": "max_tokens",
        "code": "unsupported_parameter"}}))
    with _backend(fake_openai) as be:
        with pytest.raises(BackendError) as ei:
            be.generate([LLMRequest(prompt="x")])
    assert fake_openai.hits == 1 and "HTTP 400" in str(ei.value) and "request field 'max_tokens'" in str(ei.value)
    assert "set max_tokens_field=max_completion_tokens" in str(ei.value)
    # a server validating with pydantic that knows no max_completion_tokens, answering (like llama-cpp-python) 500
    fake_openai.responder = lambda body: error(500, {"error": {
        "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'max_completion_tokens'), 'msg': 'Extra inputs "
                   "are not permitted', 'input': 64}]", "type": "internal_server_error", "param": None, "code": None}})
    with _backend(fake_openai, max_tokens_field="max_completion_tokens") as be:
        (failed,) = be.generate_each([LLMRequest(prompt="y")])
        with pytest.raises(BackendError, match=r"1 attempt\(s\) of 4 \(not retryable\).*HTTP 500") as ei:
            be.generate(_json_requests(1))  # under auto: not taken for a response_format rejection either
        assert be.structured_mode == "auto"
    assert isinstance(failed, BackendError) and fake_openai.hits == 3  # one each: neither request retried
    for err in (failed, ei.value):
        assert "request field 'max_completion_tokens': set max_tokens_field=max_tokens" in str(err)
    # a length cap over the server's limit: not retried, no knob to offer
    fake_openai.responder = lambda body: error(422, {"error": "Input validation error: `max_new_tokens` must be "
                                                              "<= 2048. Given: 4096", "error_type": "validation"})
    with _backend(fake_openai) as be:
        with pytest.raises(BackendError) as ei:
            be.generate([LLMRequest(prompt="z", max_output_tokens=4096)])
    assert fake_openai.hits == 4 and "HTTP 422" in str(ei.value) and "must be <= 2048" in str(ei.value)
    assert "request field 'max_tokens'" in str(ei.value) and "set " not in str(ei.value)


def _judged(backend: Any) -> tuple[list[Any], list[Any]]:
    """Proxy and quality verdicts of one item each through `backend`."""
    proxy = ProxyJudge(backend).judge([ProxyInput("I am a nurse.")])
    quality = QualityJudge(backend).judge([QualityInput(history=(), utterance="hi", reply="hello", memory=None)])
    return proxy, quality


def test_structured_answers_parse_into_the_same_types_as_gemini(fake_openai, openai_env, fake_gemini, gemini_env):
    quality = {"reason": "fine", "engagingness": 4, "humanness": 5, "memorability": 3, "coherence": 4,
               "consistency": 5}

    def answer(prompt_is_quality: bool) -> str:
        """The same JSON verdict for either back end."""
        return json.dumps(quality if prompt_is_quality else {"reason": "a job", "score": 0.75})

    fake_openai.responder = lambda body: ok(answer("engagingness" in body["messages"][-1]["content"]))
    fake_gemini.responder = lambda body: fake_gemini.ok(answer("engagingness" in body["contents"][0]["parts"][0]["text"]))
    with _backend(fake_openai) as oa:
        from_openai = _judged(oa)
    gemini = GeminiBackend(GeminiConfig(model="gemini-test", base_url=fake_gemini.base_url, max_attempts=2))
    with gemini:
        from_gemini = _judged(gemini)
    assert from_openai == from_gemini
    (proxy,), (qual,) = from_openai
    assert proxy.ok and proxy.score == 0.75 and qual.ok and qual.dimensions["humanness"] == 5


# -- faults ---------------------------------------------------------------------------------------------------------


# What the client logs for each injected fault kind when it retries (bad content is an answer, not retried).
RETRY_CAUSES = {"429": "HTTP 429 from", "500": "HTTP 500 from", "stall": "timeout error after",
                "bad_body": "malformed response body (JSONDecodeError", "no_choices": "malformed response body "
                "(MalformedAnswer", "transport": "transport error"}


def test_thirty_percent_faults_complete_with_every_fault_counted(fake_openai, openai_env, caplog):
    n = 100
    caplog.set_level(logging.WARNING, logger="icml_jax.llm.remote")
    fake_openai.inject_faults(0.3)
    sleeps: list[float] = []
    t0 = time.monotonic()
    # timeout 2.0 s, under the 2.5 s stalls: an answer the server sent at once may reach the client late on a loaded
    # machine (1.0 s once timed out a plain answer, a retry no injected fault explains, during the parallel suite)
    with _backend(fake_openai, sleeps=sleeps, timeout_s=2.0, max_attempts=8, max_concurrency=8) as be:
        out = be.generate_each([LLMRequest(prompt=f"item {i}", json_schema=SCHEMA) for i in range(n)])
        usage = be.usage
    seconds = time.monotonic() - t0
    faults = fake_openai.faults
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    by_cause = {kind: sum(cause in m for m in retries) for kind, cause in RETRY_CAUSES.items()}
    print(f"\nopenai 30% faults: {n} requests, {fake_openai.hits} attempts, faults {dict(sorted(faults.items()))}, "
          f"{usage.retries} retries {by_cause}, {seconds:.2f}s")
    assert all(not isinstance(r, BackendError) for r in out)  # every request answered
    assert sum(faults.values()) == int(0.3 * fake_openai.hits) and all(faults[k] >= 5 for k in FAULT_KINDS)
    assert usage.calls == n and usage.failures == 0
    for kind in FAULT_KINDS[:-1]:  # every retryable fault the server injected is one retry, logged with its cause
        assert by_cause[kind] == faults[kind], kind
    # a retry the server never saw can only be a transport error (e.g. a pooled connection the server closed)
    assert usage.retries == len(retries) == sum(by_cause.values())
    assert usage.attempts == n + usage.retries == fake_openai.hits + by_cause["transport"]
    assert sum(r.parse_error is not None for r in out) == faults["bad_content"]  # judges re-ask these
    assert [r.parsed["reason"] for r in out if r.ok_json] == [f"item {i}" for i, r in enumerate(out) if r.ok_json]
    assert sum(s >= 2.0 for s in sleeps) == faults["429"]  # Retry-After: 2 is a floor of that wait
    assert usage.prompt_tokens == fake_openai.delivered_tokens["prompt"]  # late (stalled) answers are not counted
    assert usage.output_tokens == fake_openai.delivered_tokens["completion"]
    assert seconds < 15.0


@pytest.mark.parametrize("kind, cause", [("429", "HTTP 429 from http://127.0.0.1"), ("500", "HTTP 500 from"),
                                         ("stall", "timeout error after 0.2s"),
                                         ("bad_body", "malformed response body"),
                                         ("no_choices", "malformed response body (MalformedAnswer")])
def test_every_request_faulting_ends_in_one_line(fake_openai, openai_env, caplog, kind, cause):
    fake_openai.responder = lambda body: FAULTS[kind]
    caplog.set_level(logging.WARNING)
    with _backend(fake_openai, timeout_s=0.2, max_attempts=2) as be:
        with pytest.raises(BackendError) as ei:
            be.generate([LLMRequest(prompt="x")])
        usage = be.usage
    err = ei.value
    msg = str(err)
    assert "\n" not in msg and msg.startswith(f"openai (model {MODEL}) back end: request failed after 2 attempt(s)")
    assert cause in msg and err.retryable and fake_openai.hits == 2
    assert err.__cause__ is None and err.__suppress_context__  # no chained SDK traceback under it
    shown = "".join(traceback.format_exception(err))
    assert "During handling" not in shown and "direct cause" not in shown and "openai._exceptions" not in shown
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [msg] and errors[0].exc_info is None
    assert usage.failures == 1 and usage.attempts == 2 and usage.calls == 0


def test_a_dead_server_ends_the_cli_in_one_line(fake_openai, openai_env, capsys):
    from icml_jax.run import cli

    fake_openai.responder = lambda body: FAULTS["500"]
    with _backend(fake_openai, max_attempts=3) as be:
        (each,) = be.generate_each([LLMRequest(prompt="x")])  # batch callers get the failure in its place
        with pytest.raises(BackendError) as ei:
            be.generate([LLMRequest(prompt="x")])
    assert isinstance(each, BackendError) and str(each) == str(ei.value) and fake_openai.hits == 6
    assert cli.user_error(ei.value) is ei.value  # a user error: the CLIs print it, no traceback
    with pytest.raises(SystemExit) as code:
        cli.fail("main", ei.value, debug=False)
    lines = capsys.readouterr().err.splitlines()
    assert code.value.code == 2 and len(lines) == 1
    assert lines[0].startswith(f"main error: openai (model {MODEL}) back end: request failed after 3 attempt(s)")
    assert "HTTP 500" in lines[0] and "The server had an error" in lines[0]


def test_client_errors_are_not_retried_and_name_the_server(fake_openai, openai_env):
    fake_openai.responder = lambda body: status(404, f"The model '{MODEL}' does not exist")
    with _backend(fake_openai) as be:
        with pytest.raises(BackendError, match=r"1 attempt\(s\) of 4 \(not retryable\).*HTTP 404.*does not exist"):
            be.generate([LLMRequest(prompt="x")])
    assert fake_openai.hits == 1


def test_retry_after_ms_and_exponential_backoff(fake_openai, openai_env):
    fake_openai.push(status(429, "slow", {"retry-after-ms": "1500"}), status(503), status(502), ok("finally"))
    sleeps: list[float] = []
    with _backend(fake_openai, sleeps=sleeps, initial_backoff_s=0.01) as be:
        (r,) = be.generate([LLMRequest(prompt="x")])
    assert r.text == "finally" and r.attempts == 4 and sleeps == pytest.approx([1.5, 0.02, 0.04])


# -- caching, keys, config ------------------------------------------------------------------------------------------


def test_cached_answers_are_not_requested_twice(fake_openai, openai_env, tmp_path):
    block = {"kind": "openai", "model": MODEL, "base_url": fake_openai.base_url, "api_key_env": ["OPENAI_API_KEY"]}
    requests = [LLMRequest(prompt=f"p{i}", json_schema=SCHEMA if i % 2 else None) for i in range(6)]
    for run in range(2):  # a second run (new back end, same cache file) sends nothing
        cache = ResponseCache(tmp_path / "cache.sqlite")
        with make_backend(block) as be:
            cached = CachedBackend(be, cache, answer_namespace(block), per_request=True)
            first = cached.generate(requests + requests[:2])
            again = cached.generate_each(requests)
        cache.close()
        assert first[:6] == again and [r.parsed for r in first[6:]] == [r.parsed for r in first[:2]]
        assert fake_openai.hits == 6, f"run {run}"
        assert cached.misses == (6 if run == 0 else 0) and cached.answered["calls"] == 14


def test_key_never_reaches_a_file_or_a_log(fake_openai, openai_env, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, the SDK's and httpx2's included
    log_file = tmp_path / "run.log"
    handler = logging.FileHandler(log_file)
    handler.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    seen: list[str] = []
    try:
        block = {"kind": "openai", "model": MODEL, "base_url": fake_openai.base_url, "timeout_s": 0.2,
                 "timeout_tokens_per_s": None, "max_attempts": 6, "initial_backoff_s": 0.0, "jitter": 0.0}
        cache = ResponseCache(tmp_path / "eval" / "cache.sqlite")
        be = make_backend(block, sleep=lambda s: None)
        seen += [repr(be), str(be), repr(be.config)]
        cached = CachedBackend(be, cache, answer_namespace(block), per_request=True)
        fake_openai.push(FAULTS["429"], FAULTS["500"], FAULTS["stall"], FAULTS["bad_body"], ok("fine"))
        cached.generate([LLMRequest(prompt="x")])
        fake_openai.push(status(401, f"Incorrect API key provided: {KEY}"))  # a server echoing the key
        (failed,) = cached.generate_each([LLMRequest(prompt="y")])
        fake_openai.responder = lambda body: status(500, f"boom for key {KEY}")
        with pytest.raises(BackendError) as ei:
            cached.generate([LLMRequest(prompt="z")])
        (tmp_path / "metrics.jsonl").write_text(json.dumps({**be.usage.as_metrics(), "backend": repr(be),
                                                            "namespace": cached.namespace}) + "\n")
        cached.close()
        cache.close()
        with pytest.raises(TypeError):
            pickle.dumps(be)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert isinstance(failed, BackendError) and "<redacted>" in str(failed) and "<redacted>" in str(ei.value)
    for e in (failed, ei.value):
        seen += [str(e), repr(e), "".join(traceback.format_exception(e))]
    assert caplog.records and log_file.stat().st_size > 0
    blob = "\n".join(seen) + caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert KEY not in blob
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {"cache.sqlite", "run.log", "metrics.jsonl"} <= {p.name for p in files}
    for path in files:  # the SQLite file and its WAL included
        assert KEY.encode() not in path.read_bytes(), path


def test_key_from_the_named_variable_and_no_key_for_local_servers(fake_openai, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(MissingAPIKeyError, match="openai back end: no API key found; set one of OPENAI_API_KEY"):
        _backend(fake_openai)
    monkeypatch.setenv("VLLM_KEY", "vllm-key")
    with _backend(fake_openai, api_key_env="VLLM_KEY") as be:  # one name, as a string or a 1-tuple
        be.generate([LLMRequest(prompt="x")])
    with _backend(fake_openai, api_key_env=()) as be:  # a server without a key
        be.generate([LLMRequest(prompt="x")])
    assert [r["authorization"] for r in fake_openai.requests] == ["Bearer vllm-key", f"Bearer {NO_KEY}"]


def test_config_checks_and_registry(fake_openai, openai_env):
    assert check_backend({"kind": "openai", "model": "gpt-4o", "api_key_env": None})["model"] == "gpt-4o"
    for bad, match in (({"model": ""}, "model"), ({"max_concurrency": 0}, "max_concurrency"),
                       ({"base_url": "localhost:8000"}, "http"), ({"max_tokens_field": "n"}, "max_tokens_field"),
                       ({"jitter": 2.0}, "jitter")):
        with pytest.raises(ValueError, match=match):
            check_backend({"kind": "openai", **bad}, "config.llm.judge")
    with pytest.raises(ValueError, match="unknown config key"):
        check_backend({"kind": "openai", "modle": MODEL})


def _command_line(*overrides: str, file: str = "base.py") -> Any:
    """configs/<file> with `overrides` parsed as `python -m icml_jax.main` parses them (absl config flags)."""
    from absl import flags
    from ml_collections import config_flags

    from icml_jax.configlib import CHECKOUT

    argv = ["main", f"--config={CHECKOUT / 'configs' / file}", *overrides]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=fv, lock_config=True, sys_argv=argv)
    fv(argv)
    return fv.config


def test_a_gemini_block_switched_to_openai_on_the_command_line(fake_openai, openai_env, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-key-must-stay-home")
    config = _command_line("--config.llm.judge.kind=openai", "--config.llm.judge.model=gpt-4o-mini",
                           f"--config.llm.judge.base_url={fake_openai.base_url}", "--config.llm.judge.max_attempts=2",
                           "--config.llm.judge.strict_schema=True")
    values = check_backend(config.llm.judge, "config.llm.judge")
    assert values["kind"] == "openai" and values["model"] == "gpt-4o-mini" and values["strict_schema"] is True
    with make_backend(config.llm.judge) as be:
        assert be.config.api_key_env == ("OPENAI_API_KEY",) and be.config.max_attempts == 2
        (r,) = be.generate([LLMRequest(prompt="hi", json_schema=SCHEMA)])
    assert r.ok_json and fake_openai.requests[-1]["authorization"] == f"Bearer {KEY}"  # not the Gemini key
    assert fake_openai.requests[-1]["body"]["response_format"]["json_schema"]["strict"] is True
    config = _command_line("--config.llm.generator.kind=openai", "--config.llm.generator.api_key_env=VLLM_KEY",
                           "--config.llm.generator.base_url=http://localhost:8000/v1",
                           "--config.llm.generator.max_tokens_field=max_completion_tokens")
    gen = check_backend(config.llm.generator, "config.llm.generator")
    assert gen["api_key_env"] == ("VLLM_KEY",) and gen["max_tokens_field"] == "max_completion_tokens"
    assert gen["base_url"] == "http://localhost:8000/v1"
    local = _command_line("--config.llm.generator.kind=openai", "--config.llm.generator.api_key_env=()")
    with make_backend(local.llm.generator) as be:  # docs/backends.md's flag for a server without a key
        assert be.config.api_key_env == ()
        assert be.structured_mode == "auto"  # the shared block leaves structured_output to the kind
    assert answer_namespace(local.llm.generator.to_dict())["structured_output"] == "auto"
    # a Gemini block's answers keep their cache keys: None names Gemini's own mode, as the block once spelt out
    gemini = _command_line().llm.generator.to_dict()
    assert gemini["structured_output"] is None and answer_namespace(gemini) == answer_namespace(
        {**gemini, "structured_output": "json_schema"})
    assert make_backend(gemini).config.structured_output == "json_schema"
    auto = _command_line("--config.llm.generator.kind=openai", "--config.llm.generator.structured_output=auto")
    with make_backend(auto.llm.generator) as be:
        assert be.structured_mode == "auto"
    for kind, default in (("openai", "auto"), ("gemini", "json_schema")):  # None: each kind's own default
        block = {"kind": kind, "model": "m", "structured_output": None}
        with make_backend(block) as be:
            assert be.config.structured_output == default
    judge = check_backend(config.llm.judge, "config.llm.judge")  # untouched: still Gemini, with Gemini's key names
    with pytest.raises(AttributeError, match="strict"):  # a misspelt knob fails on the command line
        _command_line("--config.llm.judge.kind=openai", "--config.llm.judge.strict=True")
    assert judge["kind"] == "gemini"
    with make_backend(judge) as be:
        assert be.config.api_key_env == ("GEMINI_API_KEY", "GOOGLE_API_KEY")


def test_a_local_or_offline_block_switches_to_a_keyless_server_with_kind_base_url_model_and_no_key(
        fake_openai, openai_env, caplog):
    """configs/demo.py's and gc_smollm2.py's blocks (base.backend_block) hold every remote knob as None: the
    kind ignores them silently, and kind=openai with base_url, model and api_key_env=() on the command line gives
    a keyless OpenAI-compatible back end with that kind's defaults; the local block's answers keep their keys."""
    from icml_jax.llm.remote import RemoteConfig

    demo = _command_line(file="demo.py")
    with caplog.at_level("WARNING"):
        assert check_backend(demo.llm.judge) == {"kind": "offline"}
    assert not caplog.records  # the placeholders are no option anyone set
    served = _command_line("--config.llm.judge.kind=openai", f"--config.llm.judge.base_url={fake_openai.base_url}",
                           "--config.llm.judge.model=smollm2", "--config.llm.judge.api_key_env=()", file="demo.py")
    with make_backend(served.llm.judge) as be:
        assert be.config.api_key_env == () and be.config.model == "smollm2"
        assert be.config.timeout_s == RemoteConfig.timeout_s and be.config.max_attempts == RemoteConfig.max_attempts
        assert be.structured_mode == "auto"
        (r,) = be.generate([LLMRequest(prompt="hi", json_schema=SCHEMA)])
    assert r.ok_json and fake_openai.requests[-1]["authorization"] != f"Bearer {KEY}"  # no key sent
    gc = _command_line(file="gc_smollm2.py").llm.generator.to_dict()
    plain = {k: gc[k] for k in ("kind", "model_dir", "dtype", "max_output_tokens")}
    assert answer_namespace(gc) == answer_namespace(plain)  # gc48's answer caches stay valid
    with caplog.at_level("WARNING"):
        switched = _command_line("--config.llm.generator.kind=openai", "--config.llm.generator.model=m",
                                 "--config.llm.generator.base_url=http://127.0.0.1:1/v1",
                                 "--config.llm.generator.api_key_env=()", file="gc_smollm2.py")
        assert check_backend(switched.llm.generator)["base_url"] == "http://127.0.0.1:1/v1"
    assert "ignores the other back ends' option(s) ['dtype', 'max_output_tokens', 'model_dir']" in caplog.text


def _instance(schema: dict[str, Any]) -> Any:
    """A value of `schema`'s shape (objects, numbers in their bounds, strings, booleans, arrays, enums): what a
    decoder constrained to the schema writes."""
    kind = schema.get("type")
    kind = next((k for k in kind if k != "null"), "null") if isinstance(kind, list) else kind
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        return {k: _instance(v) for k, v in (schema.get("properties") or {}).items()}
    if kind in ("number", "integer"):
        lo = schema.get("minimum", 0)
        return lo + (1 if kind == "integer" else 0.5) * (schema.get("maximum", lo + 1) > lo)
    if kind == "array":
        return [_instance(schema.get("items") or {"type": "string"}) for _ in range(schema.get("minItems", 1))]
    return {"string": "a short answer", "boolean": True}.get(kind)


def test_a_demo_run_served_by_a_llama_cpp_python_shaped_server_completes_with_every_json_answer_parsed(
        fake_openai, openai_env, tmp_path):
    """Issue 54's target on the fake server's llama-cpp-python shape: configs/demo.py with its generator and judge
    switched to kind=openai by base_url, model and api_key_env=() alone; json_schema is rejected once per back
    end (a 500 validation body, never retried), every later JSON request goes as json_object with the schema,
    and the run finishes with no retry, no failed request and no judge failure."""
    import io

    from icml_jax.run import pipeline
    from icml_jax.run.runlog import read_metrics

    def served(body: dict[str, Any]) -> dict[str, Any]:
        fmt = body.get("response_format")
        if fmt is not None and fmt.get("type") == "json_object" and isinstance(fmt.get("schema"), dict):
            return ok(json.dumps(_instance(fmt["schema"])), 30, 12)
        return llama_cpp_python(body)

    fake_openai.responder = served
    overrides = [f"--config.llm.{role}.{k}={v}" for role in ("generator", "judge") for k, v in (
        ("kind", "openai"), ("base_url", fake_openai.base_url), ("model", "smollm2"), ("api_key_env", "()"))]
    config = _command_line(*overrides, "--config.synthesis.num_seeds=2", "--config.synthesis.storylines_per_seed=1",
                           "--config.data.train_episodes=2", "--config.data.eval_episodes=1", file="demo.py")
    summary = pipeline.run(config, tmp_path / "work", out=io.StringIO())
    assert summary["online"]["episodes"] == 2 and summary["online"]["updates"] == 2
    formats = [r["body"].get("response_format") for r in fake_openai.requests]
    rejected = [i for i, f in enumerate(formats) if f and f["type"] == "json_schema"]
    assert len(rejected) == 1  # equal blocks: one back end serves both roles and probes once
    later = [f for f in formats[max(rejected) + 1:] if f is not None]
    assert later and all(f["type"] == "json_object" and isinstance(f.get("schema"), dict) for f in later)
    episodes = [r for r in read_metrics(tmp_path / "work" / "metrics.jsonl")
                if r.get("stage") == "online" and "episode" in r]
    assert len(episodes) == 2 and all(r["llm/attempts"] > 0 for r in episodes)
    assert all(r["llm/retries"] == r["llm/failures"] == 0 for r in episodes)
    assert all(r[f"judge/{j}_failures"] == 0 for r in episodes for j in ("proxy", "quality"))
    assert all(r["authorization"] != f"Bearer {KEY}" for r in fake_openai.requests)  # a keyless server
