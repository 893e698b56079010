"""scripts/check_openai_server.py against the loopback fake server (no real server, a few seconds): every row ok on
a server that behaves like llama-cpp-python (500 on json_schema, JSON mode with the schema, a 400 naming the
context window), and each row's failure named on a server that truncates long prompts, answers JSON off the
schema, or is not there at all."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from tests.scripts_loader import load_script

from tests.llm.loopback import loopback_server
from tests.llm.test_llm_openai import FakeOpenAI, _handler, error, llama_cpp_python_500, ok

CONTEXT = 256  # the fake server's window, in its tokens (whitespace-separated words, 4 per message of template)
MODEL = "fake-llama"


check = load_script("check_openai_server")


def _tokens(body: dict[str, Any]) -> int:
    """The fake server's prompt-token count: words plus 4 template tokens per message."""
    return sum(len(m["content"].split()) + 4 for m in body["messages"])


def llama_like(body: dict[str, Any], *, window: int | None = CONTEXT, answer: dict[str, Any] | None = None,
               ) -> dict[str, Any]:
    """llama-cpp-python's server in miniature: a prompt over `window` is its 400 context_length_exceeded, a
    json_schema response_format its 500 validation error, JSON mode with a schema an `answer` in it."""
    n, cap = _tokens(body), int(body["max_tokens"])
    if window is not None and n >= window:
        return error(400, {"error": {
            "message": f"This model's maximum context length is {window} tokens. However, you requested {n + cap} "
                       f"tokens ({n} in the messages, {cap} in the completion). Please reduce the length of the "
                       "messages or completion.", "type": "invalid_request_error", "param": "messages",
            "code": "context_length_exceeded"}})
    fmt = body.get("response_format")
    if fmt is not None and fmt.get("type") not in ("text", "json_object"):
        return llama_cpp_python_500(str(fmt.get("type")))
    if fmt is not None and isinstance(fmt.get("schema"), dict):
        return ok(json.dumps(answer or {"capital": "Paris", "is_european": True}), n, 9)
    return ok("Hello there, my good friend.", n, min(cap, 6))


@pytest.fixture
def server() -> Any:
    """A loopback fake OpenAI-compatible server, stopped after the test."""
    state = FakeOpenAI()
    with loopback_server(_handler(state)) as state.port:
        yield state


def _rows(table: str) -> dict[str, tuple[str, str]]:
    """kind -> (result, detail) of a printed Markdown table."""
    lines = table[table.index("| kind |"):].strip().splitlines()[2:]
    cells = [line.strip("| ").split(" | ", 2) for line in lines]
    return {kind: (result, detail) for kind, result, detail in cells}


def test_every_row_passes_on_a_server_that_behaves_like_llama_cpp_python(server, capsys):
    server.responder = llama_like
    code = check.main([server.base_url, MODEL, "--context_tokens", str(CONTEXT)])
    rows = _rows(capsys.readouterr().out)
    assert code == 0 and list(rows) == list(check.KINDS)
    assert all(result == "ok" for result, _ in rows.values()), rows
    assert rows["json_schema"][1].startswith("structured_output=json_object: {'capital': 'Paris'")
    assert "left: json_schema: HTTP 500" in rows["json_schema"][1]  # why auto stepped down
    assert rows["concurrent"][1].startswith("8/8 answered") and rows["concurrent"][1].endswith(", 0 retries")
    near = int(rows["near_context"][1].split(" prompt")[0])
    assert CONTEXT - 16 - 2 * check.CONTEXT_MARGIN <= near < CONTEXT - 16  # measured from the server's counts
    assert rows["over_context"][1].startswith("refused at once: HTTP 400") and \
        "maximum context length is 256 tokens" in rows["over_context"][1]
    assert rows["cache"][1].startswith("misses 1, hits 1, server calls for the repeat 0")
    # sent: plain, json_schema (rejected, then json_object), 8 concurrent, 2 measuring, near, over, cache, 2 counts
    assert server.hits == 1 + 2 + 8 + 2 + 1 + 1 + 1 + 2
    assert all(r["authorization"] == "Bearer no-key" for r in server.requests)


def test_without_a_window_the_context_rows_are_skipped(server):
    server.responder = llama_like
    rows = check.check_server(server.base_url, MODEL, kinds=("plain", "near_context", "over_context"))
    assert [(r.kind, r.verdict) for r in rows] == [("plain", "ok"), ("near_context", "skipped"),
                                                   ("over_context", "skipped")]
    assert "--context_tokens" in rows[1].detail and server.hits == 1


def test_each_failure_is_named(server):
    server.responder = lambda body: llama_like(body, window=None, answer={"city": "Paris"})
    rows = {r.kind: r for r in check.check_server(server.base_url, MODEL, context_tokens=CONTEXT,
                                                  kinds=("json_schema", "over_context"))}
    assert not rows["json_schema"].ok and "(not the schema's shape)" in rows["json_schema"].detail
    assert not rows["over_context"].ok and "the server truncates" in rows["over_context"].detail
    server.responder = lambda body: error(500, {"error": {"message": "model crashed", "type": "server_error"}})
    (row,) = check.check_server(server.base_url, MODEL, kinds=("plain",), max_attempts=2)
    assert not row.ok and row.detail.startswith("HTTP 500 from") and "model crashed" in row.detail


def test_a_server_that_is_not_there_fails_every_row_in_one_line(capsys):
    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = check.main([f"http://127.0.0.1:{port}/v1", MODEL, "--max_attempts", "1", "--kinds", "plain", "cache"])
    rows = _rows(capsys.readouterr().out)
    assert code == 1 and [r for r, _ in rows.values()] == ["FAIL", "FAIL"]
    assert all(d.startswith("transport error (APIConnectionError") for _, d in rows.values()), rows
