"""A loopback HTTP server that speaks Gemini's `models/{model}:generateContent` REST shape, with faults: scripted
(`push`), per request (`responder`), or drawn at a seeded rate (`inject_faults`: 429 with Retry-After, 500, stalls,
malformed bodies)."""

from __future__ import annotations

import collections
import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from tests.llm.loopback import loopback_server

TEST_KEY = "AIzaTEST-sekrit-0123456789abcdef"
_PATH = re.compile(r"^/(v1|v1beta|v1alpha)/models/([^/:]+):generateContent$")


def ok(text: str, prompt_tokens: int = 11, output_tokens: int = 5) -> dict[str, Any]:
    """A successful answer."""
    return {"kind": "ok", "text": text, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens}


def status(code: int, message: str = "fault", extra: dict[str, Any] | None = None,
           headers: dict[str, str] | None = None) -> dict[str, Any]:
    """An HTTP error with Google's error body (and extra response headers, e.g. Retry-After)."""
    return {"kind": "status", "code": code, "message": message, "extra": extra or {}, "headers": headers or {}}


def slow(seconds: float, then: dict[str, Any] | None = None) -> dict[str, Any]:
    """Wait before answering (past the client's timeout)."""
    return {"kind": "slow", "seconds": seconds, "then": then or ok("late")}


def bad_body() -> dict[str, Any]:
    """HTTP 200 with a body that is not JSON."""
    return {"kind": "bad_body"}


def fault_mix(stall_s: float = 1.0, retry_after_s: float = 0.0) -> tuple[dict[str, Any], ...]:
    """One of each fault a quota-limited, flaky endpoint gives: 429 with Retry-After, 500, 503, a stall of
    `stall_s` (past a short client timeout) and a malformed 200 body."""
    return (status(429, "quota", headers={"Retry-After": f"{retry_after_s:g}"}), status(500, "internal"),
            status(503, "unavailable"), slow(stall_s), bad_body())


class FakeGemini:
    """Scripted server state: a queue of actions (then a default / responder), and what it saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.script: collections.deque[dict[str, Any]] = collections.deque()
        self.responder: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        self.default: dict[str, Any] = ok("default answer")
        self.requests: list[dict[str, Any]] = []
        self.inflight = 0
        self.max_inflight = 0
        self.delay_s = 0.0
        self.port = 0
        self.fault_rate = 0.0
        self.fault_actions: tuple[dict[str, Any], ...] = ()
        self.fault_rng = random.Random(0)
        self.faults_injected = 0

    # Action builders, reachable from tests through the fixture (no imports from conftest needed).
    ok = staticmethod(ok)
    status = staticmethod(status)
    slow = staticmethod(slow)
    bad_body = staticmethod(bad_body)
    fault_mix = staticmethod(fault_mix)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hits(self) -> int:
        with self.lock:
            return len(self.requests)

    def push(self, *actions: dict[str, Any]) -> None:
        with self.lock:
            self.script.extend(actions)

    def inject_faults(self, rate: float, actions: tuple[dict[str, Any], ...] | None = None, seed: int = 0) -> None:
        """From now on answer each request not taken by the script with a fault drawn from `actions` (default
        `fault_mix()`) with probability `rate` (seeded; the draw order follows the arrival order)."""
        with self.lock:
            self.fault_rate, self.fault_actions = rate, tuple(actions or fault_mix())
            self.fault_rng = random.Random(seed)

    def next_action(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            if self.script:
                return self.script.popleft()
            if self.fault_rate and self.fault_rng.random() < self.fault_rate:
                self.faults_injected += 1
                return self.fault_rng.choice(self.fault_actions)
        if self.responder is not None:
            return self.responder(body)
        return self.default


def _handler(state: FakeGemini) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

        def _send(self, code: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            m = _PATH.match(self.path)
            if m is None:
                self._send(404, json.dumps({"error": {"code": 404, "message": "no route", "status": "NOT_FOUND"}}).encode())
                return
            body = json.loads(raw or b"{}")
            with state.lock:
                state.requests.append(
                    {"path": self.path, "model": m.group(2), "body": body,
                     "api_key": self.headers.get("x-goog-api-key"),
                     "server_timeout": self.headers.get("x-server-timeout")}  # the client's deadline, whole seconds
                )
                state.inflight += 1
                state.max_inflight = max(state.max_inflight, state.inflight)
            try:
                action = state.next_action(body)
                if state.delay_s:
                    time.sleep(state.delay_s)
                while action["kind"] == "slow":
                    time.sleep(action["seconds"])
                    action = action["then"]
                if action["kind"] == "ok":
                    payload = {
                        "candidates": [
                            {
                                "content": {"role": "model", "parts": [{"text": action["text"]}]},
                                "finishReason": "STOP",
                                "index": 0,
                            }
                        ],
                        "usageMetadata": {
                            "promptTokenCount": action["prompt_tokens"],
                            "candidatesTokenCount": action["output_tokens"],
                            "totalTokenCount": action["prompt_tokens"] + action["output_tokens"],
                        },
                        "modelVersion": m.group(2),
                    }
                    self._send(200, json.dumps(payload).encode())
                elif action["kind"] == "status":
                    code = action["code"]
                    names = {400: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
                    err = {"code": code, "message": action["message"], "status": names.get(code, "UNKNOWN")}
                    err.update(action["extra"])
                    self._send(code, json.dumps({"error": err}).encode(), action.get("headers"))
                elif action["kind"] == "bad_body":
                    self._send(200, b'{"candidates": [ {"content": ')
                else:  # pragma: no cover - test bug
                    raise AssertionError(action)
            finally:
                with state.lock:
                    state.inflight -= 1

    return Handler


@pytest.fixture
def fake_gemini() -> Iterator[FakeGemini]:
    """A running loopback Gemini server (127.0.0.1 only), stopped after the test."""
    state = FakeGemini()
    with loopback_server(_handler(state)) as state.port:
        yield state


@pytest.fixture
def gemini_env(monkeypatch: pytest.MonkeyPatch) -> str:
    """Only the test key in the environment."""
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_GENAI_USE_VERTEXAI", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", TEST_KEY)
    return TEST_KEY
