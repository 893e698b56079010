"""Reads an HTTP error answer of an OpenAI-compatible server for a rejected request field: a pure function of the
status and the body, so that a request a server refuses for its shape is not retried like a transient fault.

Servers word the same refusal differently (shapes in tests/llm/test_llm_rejections.py):
- llama-cpp-python answers a request-validation error with HTTP 500 and pydantic's error list as the message
  (`'loc': ('body', 'response_format', 'type'), 'msg': "Input should be 'text' or 'json_object'"`);
- llama.cpp's C++ server (older builds) HTTP 500 `response_format type must be one of "text" or "json_object"`;
- vLLM HTTP 400 with OpenAI's error body, `param` set or `(parameter=...)` in the message;
- Ollama HTTP 400 `invalid_request_error` with Go's `cannot unmarshal ... Go struct field ChatCompletionRequest.x`;
- TGI HTTP 422, as `{"error": "Input validation error: ...", "error_type": "validation"}` or axum's plain-text
  `Failed to deserialize the JSON body into the target type: response_format: unknown variant ...`;
- stock FastAPI HTTP 422 `{"detail": [{"type": "extra_forbidden", "loc": ["body", "x"], ...}]}`;
- OpenAI HTTP 400 `Unsupported parameter: 'max_tokens' ...` with `param`.

Rules: only a 400, 422 or 500 can carry a rejection; its body must name the field (structurally: `param`, a
pydantic `loc`, `parameter=`, a Go struct field, a serde path, a pydantic title; or by one of the fields this
client sends appearing in the text), and a 500 must also read as a validation error (a 400 / 422 is one by its
status). Anything else (429, 503, a 500 without such a body) is None: the caller's usual retry rules apply.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

VALIDATION_STATUS = frozenset({400, 422, 500})

# Fields this client sends that a server may refuse, as found in free text, and the request field each stands for
# (TGI calls the length cap max_new_tokens; a bare json_schema in a refusal is the response_format's type).
KNOWN_FIELDS: dict[str, str] = {
    "max_completion_tokens": "max_completion_tokens",
    "max_new_tokens": "max_tokens",
    "max_tokens": "max_tokens",
    "response_format": "response_format",
    "json_schema": "response_format",
    "temperature": "temperature",
}
_KNOWN = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(KNOWN_FIELDS) + r")(?![A-Za-z0-9_])")
# a rejection in words, e.g. vLLM's "The provided JSON schema contains features not supported by xgrammar."
_SCHEMA_PHRASE = re.compile(r"\bjson schema\b|\bresponse format\b", re.IGNORECASE)
_Q = r"""\\?['"`]"""  # a quote, possibly JSON-escaped
_STRUCTURAL = (
    re.compile(_Q + r"loc" + _Q + r"\s*:\s*[(\[]\s*(?:" + _Q + r"body" + _Q + r"\s*,\s*)?" + _Q + r"(\w+)" + _Q),
    re.compile(r"\bparameter=(\w+)"),  # vLLM's VLLMValidationError
    re.compile(r"Go struct field \w+\.(\w+)"),  # Ollama (Go's encoding/json)
    re.compile(r"into the target type: (\w+)[.:\[]"),  # axum / serde (TGI)
    re.compile(r"validation errors? for \w+\s+(\w+)"),  # str(pydantic.ValidationError)
)
_VALIDATION = re.compile(
    r"validation error|literal_error|input should be|extra_forbidden|extra inputs are not permitted|must be one of|"
    r"unknown variant|cannot unmarshal|unsupported|not supported|invalid|unrecognized|unknown (?:field|parameter)|"
    r"not (?:allowed|permitted)|must be|expected", re.IGNORECASE)
_UNSUPPORTED = re.compile(
    r"unsupported|not supported|extra_forbidden|extra inputs|unrecognized|unknown (?:field|parameter|variant)|"
    r"not (?:allowed|permitted)|instead|literal_error|must be one of|input should be '", re.IGNORECASE)
_VALUE_ONLY = re.compile(
    r"too large|too long|too big|exceed|must be [<>]=?|must be (?:less|greater|at most|at least)|less than|"
    r"greater than|maximum context length|out of range", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class FieldRejection:
    """A server's refusal of one request field. `unsupported`: the field (or its kind, e.g. a response_format
    type) is refused, so a knob that stops sending it avoids the error; False: only its value is out of range."""

    field: str
    unsupported: bool


def _parsed(body: object) -> tuple[str, Mapping[str, Any] | None]:
    """(the body as one line of text, its OpenAI-style error object if any) of a raw or parsed error body."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return " ".join(body.split()), None
    if isinstance(body, Mapping):
        inner = body.get("error")
        obj = inner if isinstance(inner, Mapping) else body
        return json.dumps(body, ensure_ascii=False, default=str), obj
    if isinstance(body, (list, tuple)):
        return json.dumps(body, ensure_ascii=False, default=str), None
    return ("" if body is None else " ".join(str(body).split())), None


def _named_field(text: str, obj: Mapping[str, Any] | None) -> tuple[str | None, bool]:
    """(the request field the body names, whether it was named structurally) or (None, False)."""
    param = obj.get("param") if obj is not None else None
    if isinstance(param, str) and param.strip():
        parts = [p for p in re.split(r"[.\[\]]", param.strip()) if p]
        if parts and parts[0] == "body":
            parts = parts[1:]
        if parts:
            return KNOWN_FIELDS.get(parts[0], parts[0]), True
    for pattern in _STRUCTURAL:
        match = pattern.search(text)
        if match:
            return KNOWN_FIELDS.get(match.group(1), match.group(1)), True
    match = _KNOWN.search(text)
    if match:
        return KNOWN_FIELDS[match.group(1)], False
    return ("response_format", False) if _SCHEMA_PHRASE.search(text) else (None, False)


def rejected_field(status: int, body: object) -> FieldRejection | None:
    """The request field an error answer rejects, or None when the answer is no such validation error.

    `body`: the raw response text (or bytes), its parsed JSON, or the `error` member the openai SDK keeps as
    `APIStatusError.body`."""
    if status not in VALIDATION_STATUS:
        return None
    text, obj = _parsed(body)
    field, structural = _named_field(text, obj)
    if field is None:
        return None
    if status == 500 and not structural and not _VALIDATION.search(text):
        return None  # a 500 that mentions a field without reading as a validation error: a server fault
    unsupported = bool(_UNSUPPORTED.search(text)) or not _VALUE_ONLY.search(text)
    return FieldRejection(field=field, unsupported=unsupported)
