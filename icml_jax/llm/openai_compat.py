"""OpenAI-compatible back end over the `openai` client (`POST {base_url}/chat/completions`): OpenAI itself, or
any server that speaks the API (vLLM, llama.cpp's server, llama-cpp-python, Ollama, TGI).

The SDK's own retries are off (`max_retries=0`): every attempt is counted, logged, timed out and retried by the
shared `RemoteBackend`, as for Gemini (408 / 429 / 5xx, timeouts, transport errors, malformed bodies; a 429's
Retry-After is a floor). An error answer that rejects a request field (a validation error in a 400, 422 or 500
body, see `rejections.rejected_field`) is not retried: its error names the field and the knob that avoids it.
`structured_output="auto"` (the default) finds, once per back end, the structured-output form the server takes.
The API key is read from the environment variables named by `api_key_env` and is sent only to `base_url` (None:
OpenAI's endpoint; the SDK's OPENAI_BASE_URL is not consulted); it never appears in repr, logs or errors.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from icml_jax.llm import remote
from icml_jax.llm.rejections import FieldRejection, rejected_field
from icml_jax.llm.remote import RETRYABLE_STATUS, TRANSPORT_ERRORS, RemoteBackend, RemoteConfig
from icml_jax.llm.types import LLMRequest, LLMResponse

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
OPENAI_KEY_ENV = ("OPENAI_API_KEY",)
NO_KEY = "no-key"  # what is sent when api_key_env names no variable (servers started without a key accept it)
# "auto" tries the others in this order (AUTO_LADDER), stepping down on a rejection of response_format
AUTO_LADDER = ("json_schema", "json_object", "prompt_only")
STRUCTURED_OUTPUT_MODES = ("auto", *AUTO_LADDER)
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")
_MAX_ERROR_CHARS = 300  # an error body (e.g. a proxy's HTML page) is cut to keep the failure one short line


@dataclasses.dataclass(frozen=True)
class OpenAIConfig(RemoteConfig):
    """Knobs of the OpenAI-compatible back end; the key only from the environment. Timeouts and retries: see
    RemoteConfig."""

    model: str = "gpt-4o-mini"
    base_url: str | None = None  # None = OpenAI's endpoint; a local server: e.g. "http://localhost:8000/v1"
    # The environment variables holding the key, first one set wins; () = the server needs none (sends NO_KEY).
    api_key_env: tuple[str, ...] = OPENAI_KEY_ENV
    # How a request's JSON schema is sent: "json_schema" (response_format json_schema: OpenAI, vLLM, llama.cpp's
    # llama-server, Ollama), "json_object" (response_format {"type": "json_object", "schema": ...}: JSON mode, the
    # schema where llama-cpp-python reads it), "prompt_only" (no response_format; the prompts describe the JSON),
    # or "auto": json_schema, and on the server's rejection of it json_object, then prompt_only, decided once per
    # back end (`OpenAIBackend.structured_mode`).
    structured_output: str = "auto"
    strict_schema: bool = False  # OpenAI's strict mode needs every property required and no min/max keywords
    # The length cap's field: "max_tokens" (every server) or "max_completion_tokens" (OpenAI's reasoning models)
    max_tokens_field: str = "max_tokens"
    # The model's input window in tokens (GPT-4o and 4o-mini: 128,000; a local server: its model's): the
    # long-context baseline's budget
    context_tokens: int = 128_000

    def __post_init__(self) -> None:
        """Checks the knobs (transport ones in RemoteConfig); a single variable name becomes a 1-tuple."""
        if not self.model:
            raise ValueError("OpenAIConfig.model must name a model, e.g. 'gpt-4o-mini'")
        if self.context_tokens < 1:
            raise ValueError(f"OpenAIConfig.context_tokens must be >= 1, got {self.context_tokens}")
        names = (self.api_key_env,) if isinstance(self.api_key_env, str) else tuple(self.api_key_env or ())
        object.__setattr__(self, "api_key_env", tuple(n for n in names if n))
        super().__post_init__()
        if self.structured_output not in STRUCTURED_OUTPUT_MODES:
            raise ValueError(f"OpenAIConfig.structured_output must be one of {list(STRUCTURED_OUTPUT_MODES)}, "
                             f"got {self.structured_output!r}")
        if self.max_tokens_field not in MAX_TOKENS_FIELDS:
            raise ValueError(f"OpenAIConfig.max_tokens_field must be one of {list(MAX_TOKENS_FIELDS)}, "
                             f"got {self.max_tokens_field!r}")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIConfig.base_url must be an http(s) URL such as http://localhost:8000/v1, "
                             f"got {self.base_url!r}")


# The knobs an OpenAI block has beyond a Gemini one, with their types: a shared config block holds them as None
# placeholders (None = the default above), so a block switched to kind=openai can set them on the command line.
OPENAI_ONLY_KNOBS: dict[str, type] = {"strict_schema": bool, "max_tokens_field": str}


class MalformedAnswer(ValueError):
    """A 200 answer without the chat-completion shape (no choices, no message): retried like a bad body."""


@dataclasses.dataclass(frozen=True)
class PreparedCall:
    """What every attempt of one request sends: the chat-completion arguments without response_format, and the
    JSON schema (with its name) that the structured-output mode in use turns into one."""

    kwargs: Mapping[str, Any]
    schema: Mapping[str, Any] | None = None
    schema_name: str = "answer"


def _error_text(exc: Any) -> str:
    """A failed call's message, one line: the server's `error.message` when its body has one, else the body."""
    body = getattr(exc, "body", None)
    message: Any = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message is None:
            message = json.dumps(body, ensure_ascii=False, default=str)  # e.g. FastAPI's {"detail": [...]}
    elif isinstance(body, str) and body.strip():
        message = body  # a plain-text error page (axum, a proxy)
    text = " ".join(str(message if message is not None else getattr(exc, "message", exc)).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "..."


def response_format(mode: str, schema: Mapping[str, Any], name: str, strict: bool) -> dict[str, Any] | None:
    """The `response_format` that structured-output `mode` sends for `schema` (None: prompt_only sends none)."""
    plain = json.loads(json.dumps(schema))  # a plain JSON copy (the request's mapping may be read-only)
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": plain, "strict": strict}}
    if mode == "json_object":
        return {"type": "json_object", "schema": plain}  # llama-cpp-python constrains decoding to `schema`
    return None


def avoiding_knob(rejection: FieldRejection, structured_mode: str, max_tokens_field: str,
                  auto: bool = False) -> str | None:
    """The config change that stops a server rejecting `rejection`'s field, as 'knob=value' alternatives, the
    first one the flag to use (None: no knob avoids it, e.g. a length cap over the server's limit).
    `structured_mode`: the mode that was sent; `auto`: whether the back end already runs structured_output=auto."""
    if rejection.field == "response_format" and structured_mode in AUTO_LADDER[:-1]:
        lower = AUTO_LADDER[AUTO_LADDER.index(structured_mode) + 1:]
        return " or ".join(f"structured_output={mode}" for mode in (lower if auto else ("auto", *lower)))
    if rejection.field in MAX_TOKENS_FIELDS and rejection.unsupported:
        other = next(f for f in MAX_TOKENS_FIELDS if f != rejection.field)
        if max_tokens_field == rejection.field:
            return f"max_tokens_field={other}"
    return None


class OpenAIBackend(RemoteBackend):
    """LLM back end calling `chat.completions.create` on an OpenAI-compatible server through `openai`."""

    name = "openai"

    def __init__(
        self,
        config: OpenAIConfig | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        import openai

        config = config or OpenAIConfig()
        self._openai = openai
        api_key = read_openai_key(config.api_key_env) if config.api_key_env else ""
        self._client = openai.OpenAI(
            api_key=api_key or NO_KEY,
            base_url=config.base_url or DEFAULT_BASE_URL,
            timeout=config.timeout_s,
            max_retries=0,  # retries are ours (counted, logged, jittered); the SDK makes one attempt
        )
        super().__init__(config, api_key, sleep=sleep, rng=rng)
        self.config: OpenAIConfig = config
        # structured output under "auto": one request at a time probes the ladder, the others wait for the answer
        self._mode_cond = threading.Condition()
        self._mode: str | None = None if config.structured_output == "auto" else config.structured_output
        self._rung = 0  # auto: the AUTO_LADDER mode the next probe sends
        self._probing = False
        self._rejections: list[str] = []  # auto: why each mode above the one in use was left

    def close_client(self) -> None:
        """Closes the openai client's connection pool."""
        self._client.close()

    def __enter__(self) -> OpenAIBackend:
        """The back end itself (typed as OpenAIBackend), closed when the block ends."""
        return self

    @property
    def endpoint(self) -> str:
        """The chat-completions root every request goes to."""
        return self.config.base_url or DEFAULT_BASE_URL

    @property
    def structured_mode(self) -> str:
        """The structured-output mode in use (json_schema, json_object or prompt_only), for a run's results;
        "auto" while an auto back end has answered no JSON request yet."""
        with self._mode_cond:
            return self._mode or "auto"

    # -- one attempt (RemoteBackend's hooks) -------------------------------------------------------

    def prepare(self, request: LLMRequest) -> PreparedCall:
        """The chat-completion arguments of `request` (messages, sampling, length cap) and its schema."""
        messages = [{"role": "system", "content": request.system}] if request.system else []
        messages.append({"role": "user", "content": request.prompt})
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": request.temperature,
            self.config.max_tokens_field: request.max_output_tokens,
        }
        return PreparedCall(kwargs, request.json_schema, f"{request.task}_answer")

    def _create(self, prepared: PreparedCall, mode: str, timeout_s: float) -> Any:
        """One chat-completion call with `prepared`'s schema sent as structured-output `mode` asks."""
        kwargs = dict(prepared.kwargs)
        if prepared.schema is not None:
            fmt = response_format(mode, prepared.schema, prepared.schema_name, self.config.strict_schema)
            if fmt is not None:
                kwargs["response_format"] = fmt
        return self._client.chat.completions.create(**kwargs, timeout=timeout_s)

    def send(self, prepared: PreparedCall, timeout_s: float) -> Any:
        """One chat-completion call with a `timeout_s` deadline (under "auto", a JSON request may also make the
        back end's one probe of a lower mode); MalformedAnswer when the answer has no message."""
        if prepared.schema is None or self.config.structured_output != "auto":
            raw = self._create(prepared, self.config.structured_output, timeout_s)
        else:
            raw = self._send_auto(prepared, timeout_s)
        choices = getattr(raw, "choices", None)
        if not isinstance(choices, list) or not choices or getattr(choices[0], "message", None) is None:
            raise MalformedAnswer(f"a 200 answer without choices[0].message ({type(raw).__name__})")
        return raw

    def _send_auto(self, prepared: PreparedCall, timeout_s: float) -> Any:
        """A JSON request under "auto": in the mode decided, or (one request of the back end at a time) as the
        probe of the next mode on the ladder; a rejection of response_format steps down and sends again."""
        while True:
            with self._mode_cond:
                while self._mode is None and self._probing:
                    self._mode_cond.wait()
                mode, probe = self._mode, self._mode is None
                if probe:
                    mode, self._probing = AUTO_LADDER[self._rung], True
            assert mode is not None
            if not probe:
                return self._create(prepared, mode, timeout_s)
            outcome, why = "failed", ""
            try:
                raw = self._create(prepared, mode, timeout_s)
                outcome = "answered"
            except self._openai.APIStatusError as exc:
                rejection = rejected_field(int(exc.status_code or 0), exc.body)
                if rejection is None or rejection.field != "response_format" or mode == AUTO_LADDER[-1]:
                    raise
                outcome, why = "rejected", self.scrub(f"{mode}: HTTP {exc.status_code}: {_error_text(exc)}")
            finally:
                with self._mode_cond:
                    if outcome == "answered":
                        self._settle(mode)
                    elif outcome == "rejected":
                        self._rung += 1
                        self._rejections.append(why)
                    self._probing = False
                    self._mode_cond.notify_all()
            if outcome == "answered":
                return raw
            self.meter.add(attempts=1)  # the rejected probe was an HTTP attempt; the request goes on, no retry

    def _settle(self, mode: str) -> None:
        """Fixes "auto"'s mode for the back end's life and logs it once (caller holds the mode lock)."""
        if self._mode is not None:
            return
        self._mode = mode
        if self._rejections:
            logger.warning("%s back end (model %s at %s): structured output uses %s for every JSON request; the "
                           "server rejected %s", self.name, self.model_name, self.endpoint, mode,
                           "; ".join(self._rejections))
        else:
            logger.info("%s back end (model %s at %s): structured output uses %s for every JSON request", self.name,
                        self.model_name, self.endpoint, mode)

    def retry_hint_s(self, exc: BaseException) -> float | None:
        """The server's retry-after-ms (OpenAI) or Retry-After header of a failed attempt."""
        headers = getattr(getattr(exc, "response", None), "headers", None)
        try:
            ms = headers.get("retry-after-ms") if headers is not None else None
            if ms is not None:
                return float(ms) / 1000.0
        except (TypeError, ValueError, AttributeError):
            pass
        return remote.retry_after_s(headers)

    def classify(self, exc: BaseException, timeout_s: float) -> tuple[bool, str]:
        """(retryable, short description) of an exception raised by an attempt that had `timeout_s`."""
        errors = self._openai
        if isinstance(exc, errors.APIStatusError):
            code = int(exc.status_code or 0)
            text = _error_text(exc)
            desc = f"HTTP {code} from {self.endpoint}: {text}"
            rejection = rejected_field(code, exc.body)
            if rejection is not None:  # the request's shape: the same request would fail the same way
                auto = self.config.structured_output == "auto"
                with self._mode_cond:
                    sent = self._mode or AUTO_LADDER[self._rung]
                knob = avoiding_knob(rejection, sent, self.config.max_tokens_field, auto)
                desc += f"; the server rejects the request field '{rejection.field}'"
                if knob:
                    desc += f": set {knob} (--config.llm.<role>.{knob.split(' or ')[0]})"
                return False, desc
            return (code in RETRYABLE_STATUS or code >= 500), desc
        if isinstance(exc, errors.APITimeoutError) or (isinstance(exc, TRANSPORT_ERRORS) and remote.is_timeout(exc)):
            return True, f"timeout error after {timeout_s:g}s ({type(exc).__name__})"
        if isinstance(exc, (errors.APIConnectionError, *TRANSPORT_ERRORS)):
            return True, f"transport error ({type(exc).__name__}: {_error_text(exc)})"
        if isinstance(exc, (json.JSONDecodeError, MalformedAnswer, errors.APIResponseValidationError)):
            return True, f"malformed response body ({type(exc).__name__}: {_error_text(exc)})"
        try:
            import pydantic

            if isinstance(exc, pydantic.ValidationError):
                return True, f"malformed response shape ({exc.error_count()} validation error(s))"
        except ImportError:  # pragma: no cover - pydantic is a dependency of openai
            pass
        return False, f"{type(exc).__name__}: {exc}"

    def to_response(self, request: LLMRequest, raw: Any, attempts: int, latency_s: float) -> LLMResponse:
        """The first choice's text and finish reason; completion tokens split into answer and reasoning tokens
        (OpenAI counts reasoning inside completion_tokens; Gemini's counters keep thoughts apart)."""
        choice = raw.choices[0]
        message = choice.message
        text = message.content if isinstance(message.content, str) else ""
        finish_reason = str(choice.finish_reason) if choice.finish_reason is not None else None
        refusal = getattr(message, "refusal", None)
        if not text and refusal:
            finish_reason = f"REFUSAL:{' '.join(str(refusal).split())[:200]}"
        if not text and finish_reason == "length":
            logger.warning("%s back end (model %s): empty answer cut at max_output_tokens=%d; raise it (reasoning "
                           "models spend it on reasoning first)", self.name, self.config.model,
                           request.max_output_tokens)
        usage = getattr(raw, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion = int(getattr(usage, "completion_tokens", 0) or 0)
        details = getattr(usage, "completion_tokens_details", None)
        reasoning = min(completion, int(getattr(details, "reasoning_tokens", 0) or 0))
        output_tokens = completion - reasoning
        self.meter.add(prompt_tokens=prompt_tokens, output_tokens=output_tokens, thoughts_tokens=reasoning, calls=1)
        return LLMResponse.answering(
            request,
            text,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            attempts=attempts,
            latency_s=latency_s,
            finish_reason=finish_reason,
        )


def structured_mode_of(backend: Any) -> str | None:
    """The structured-output mode a back end (or the one a CachedBackend wraps) uses, for a run's results; None
    for a back end without one (Gemini, local, offline)."""
    for candidate in (backend, getattr(backend, "backend", None)):
        mode = getattr(candidate, "structured_mode", None)
        if isinstance(mode, str):
            return mode
    return None


def read_openai_key(env_names: Sequence[str]) -> str:
    """The key among `env_names` (first set wins), or MissingAPIKeyError naming them; for up-front checks."""
    return remote.read_api_key(env_names, "openai back end")
