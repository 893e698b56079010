"""`rejected_field` on error answers as real OpenAI-compatible servers send them (llama-cpp-python, llama.cpp's
llama-server, vLLM, Ollama, TGI, stock FastAPI, OpenAI): a rejected request field is named, a transient fault is
not; and `avoiding_knob` names the config change that avoids each rejection."""

from __future__ import annotations

import json

import pytest

from icml_jax.llm.openai_compat import avoiding_knob
from icml_jax.llm.rejections import FieldRejection, rejected_field

LLAMA_CPP_PYTHON_500 = (  # 0.3.x: FastAPI's RequestValidationError caught by its route handler, as an HTTP 500
    '{"error": {"message": "[{\'type\': \'literal_error\', \'loc\': (\'body\', \'response_format\', \'type\'), '
    '\'msg\': \\"Input should be \'text\' or \'json_object\'\\", \'input\': \'json_schema\', \'ctx\': '
    '{\'expected\': \\"\'text\' or \'json_object\'\\"}}]", "type": "internal_server_error", "param": null, '
    '"code": null}}')

# (server, status, body as the server sends it, the rejection or None)
CASES = [
    ("llama-cpp-python json_schema", 500, LLAMA_CPP_PYTHON_500, FieldRejection("response_format", True)),
    ("llama-cpp-python decode fault", 500,
     '{"error": {"message": "llama_decode returned -1", "type": "internal_server_error", "param": null, '
     '"code": null}}', None),
    ("llama-cpp-python context", 400,
     '{"error": {"message": "This model\'s maximum context length is 2048 tokens. However, you requested 2100 '
     'tokens (1588 in the messages, 512 in the completion). Please reduce the length of the messages or '
     'completion.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}',
     FieldRejection("messages", False)),
    ("llama-server (C++, older) json_schema", 500,
     '{"error": {"code": 500, "message": "response_format type must be one of \\"text\\" or \\"json_object\\", '
     'but got: json_schema", "type": "server_error"}}', FieldRejection("response_format", True)),
    ("vLLM length cap", 400,
     '{"error": {"message": "\'max_tokens\' or \'max_completion_tokens\' is too large: 4096. This model\'s '
     'maximum context length is 2048 tokens and your request has 120 input tokens (4096 > 2048 - 120). '
     '(parameter=max_tokens, value=4096)", "type": "BadRequestError", "param": "max_tokens", "code": 400}}',
     FieldRejection("max_tokens", False)),
    ("vLLM (older) pydantic", 400,
     '{"object": "error", "message": "[{\'type\': \'missing\', \'loc\': (\'body\', \'response_format\', '
     '\'json_schema\'), \'msg\': \'Field required\', \'input\': {\'type\': \'json_schema\'}}]", '
     '"type": "BadRequestError", "param": null, "code": 400}', FieldRejection("response_format", True)),
    ("vLLM grammar backend", 400,
     '{"error": {"message": "The provided JSON schema contains features not supported by xgrammar.", '
     '"type": "BadRequestError", "param": null, "code": 400}}', FieldRejection("response_format", True)),
    ("Ollama unmarshal", 400,
     '{"error": {"message": "json: cannot unmarshal string into Go struct field ChatCompletionRequest.'
     'response_format of type openai.ResponseFormat", "type": "invalid_request_error", "param": null, '
     '"code": null}}', FieldRejection("response_format", True)),
    ("Ollama no field of ours", 400,
     '{"error": {"message": "invalid reasoning value: \'max\' (must be \\"high\\", \\"medium\\", \\"low\\", or '
     '\\"none\\")", "type": "invalid_request_error", "param": null, "code": null}}', None),
    ("TGI validation", 422,
     '{"error": "Input validation error: `max_new_tokens` must be <= 2048. Given: 4096", '
     '"error_type": "validation"}', FieldRejection("max_tokens", False)),
    ("TGI axum plain text", 422,
     "Failed to deserialize the JSON body into the target type: response_format: unknown variant `json_schema`, "
     "expected `json` or `regex` at line 1 column 310", FieldRejection("response_format", True)),
    ("FastAPI extra field", 422,
     '{"detail": [{"type": "extra_forbidden", "loc": ["body", "max_completion_tokens"], '
     '"msg": "Extra inputs are not permitted", "input": 64}]}', FieldRejection("max_completion_tokens", True)),
    ("OpenAI reasoning model", 400,
     '{"error": {"message": "Unsupported parameter: \'max_tokens\' is not supported with this model. Use '
     '\'max_completion_tokens\' instead.", "type": "invalid_request_error", "param": "max_tokens", '
     '"code": "unsupported_parameter"}}', FieldRejection("max_tokens", True)),
    ("OpenAI old model", 400,
     '{"error": {"message": "Invalid parameter: \'response_format\' of type \'json_schema\' is not supported '
     'with this model.", "type": "invalid_request_error", "param": "response_format", "code": null}}',
     FieldRejection("response_format", True)),
    # transient: the status can carry no rejection, or the body reads as no validation error
    ("OpenAI quota", 429,
     '{"error": {"message": "Rate limit reached for gpt-4o-mini on max_tokens per min", "type": "tokens", '
     '"param": null, "code": "rate_limit_exceeded"}}', None),
    ("busy with a validation-looking body", 503, LLAMA_CPP_PYTHON_500, None),
    ("OpenAI server error", 500,
     '{"error": {"message": "The server had an error while processing your request.", "type": "server_error", '
     '"param": null, "code": null}}', None),
    ("a fault that mentions the field", 500,
     '{"error": {"message": "CUDA out of memory while compiling the response_format grammar", '
     '"type": "internal_server_error", "param": null, "code": null}}', None),
    ("proxy page", 502, "<html><body>502 Bad Gateway</body></html>", None),
    ("bare 500", 500, "Internal Server Error", None),
    ("no body", 500, None, None),
]


@pytest.mark.parametrize("server, status, body, expected", CASES, ids=[c[0] for c in CASES])
def test_rejected_field_reads_each_servers_words(server, status, body, expected):
    assert rejected_field(status, body) == expected
    if isinstance(body, str) and body.startswith("{"):
        parsed = json.loads(body)
        assert rejected_field(status, parsed) == expected  # parsed JSON
        inner = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
        assert rejected_field(status, inner) == expected  # what the openai SDK keeps as APIStatusError.body
        assert rejected_field(status, body.encode()) == expected


@pytest.mark.parametrize("rejection, sent, field, auto, knob", [
    (FieldRejection("response_format", True), "json_schema", "max_tokens", False,
     "structured_output=auto or structured_output=json_object or structured_output=prompt_only"),
    (FieldRejection("response_format", True), "json_object", "max_tokens", False,
     "structured_output=auto or structured_output=prompt_only"),
    (FieldRejection("response_format", True), "json_schema", "max_tokens", True,
     "structured_output=json_object or structured_output=prompt_only"),
    (FieldRejection("response_format", True), "prompt_only", "max_tokens", False, None),  # none was sent
    (FieldRejection("max_tokens", True), "auto", "max_tokens", True, "max_tokens_field=max_completion_tokens"),
    (FieldRejection("max_completion_tokens", True), "auto", "max_completion_tokens", True,
     "max_tokens_field=max_tokens"),
    (FieldRejection("max_tokens", False), "auto", "max_tokens", True, None),  # over the server's limit: no knob
    (FieldRejection("messages", False), "auto", "max_tokens", True, None),
])
def test_avoiding_knob(rejection, sent, field, auto, knob):
    assert avoiding_knob(rejection, sent, field, auto) == knob
