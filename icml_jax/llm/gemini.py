"""Gemini back end over the `google-genai` client: bounded concurrency, per-attempt timeouts, own retries.

The SDK's own retries are off (no `retry_options`), so every attempt is counted and logged here (by the shared
`RemoteBackend`), with exponential backoff and jitter on 408 / 429 / 5xx, timeouts, transport errors and
malformed response bodies. `generate` raises the first request that fails for good; `generate_each` hands every
request's outcome back (answer or BackendError) so batch callers can skip failures. The API key is read from the
environment at construction and never appears in repr, logs or errors.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from icml_jax.llm import remote
from icml_jax.llm.remote import RETRYABLE_STATUS, TRANSPORT_ERRORS, RemoteBackend, RemoteConfig
from icml_jax.llm.types import LLMRequest, LLMResponse

logger = logging.getLogger(__name__)

GEMINI_KEY_ENV = ("GEMINI_API_KEY", "GOOGLE_API_KEY")  # first one set wins


@dataclasses.dataclass(frozen=True)
class GeminiConfig(RemoteConfig):
    """Knobs of the Gemini back end; `model` comes from the run config, the key only from the environment.
    Timeouts and retries: see RemoteConfig."""

    model: str = "gemini-2.5-flash"
    base_url: str | None = None  # None = Google's endpoint; tests point it at a loopback server
    api_version: str | None = None  # None = the SDK's default
    # None = model default. On thinking models the thoughts count against max_output_tokens, so a small budget
    # (0 where the model allows it) keeps short answers (notes, judge JSON) from being cut off.
    thinking_budget: int | None = None
    # How a judge's JSON schema is sent: "json_schema" (responseJsonSchema, Gemini 2.5+), "response_schema"
    # (the OpenAPI-subset responseSchema, older models too) or "mime_only" (JSON mode without a schema).
    structured_output: str = "json_schema"
    api_key_env: tuple[str, ...] = GEMINI_KEY_ENV
    # The model's input window in tokens (Gemini 2.5's 1,048,576): the long-context baseline's budget
    context_tokens: int = 1_048_576

    def __post_init__(self) -> None:
        """Checks the knobs (transport ones in RemoteConfig)."""
        if not self.model:
            raise ValueError("GeminiConfig.model must name a model, e.g. 'gemini-2.5-flash'")
        if self.context_tokens < 1:
            raise ValueError(f"GeminiConfig.context_tokens must be >= 1, got {self.context_tokens}")
        super().__post_init__()
        if self.structured_output not in ("json_schema", "response_schema", "mime_only"):
            raise ValueError(
                "GeminiConfig.structured_output must be 'json_schema', 'response_schema' or 'mime_only', "
                f"got {self.structured_output!r}"
            )


def read_api_key(env_names: Sequence[str]) -> str:
    """Return the first non-empty key among `env_names`; raise MissingAPIKeyError naming them otherwise."""
    return remote.read_api_key(env_names, "gemini back end")


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)s\s*$")


def _retry_hint_s(exc: BaseException) -> float | None:
    """Server-suggested wait: a Retry-After header or a google.rpc.RetryInfo retryDelay, if present."""
    hint = remote.retry_after_s(getattr(getattr(exc, "response", None), "headers", None))
    if hint is not None:
        return hint
    details = getattr(exc, "details", None)
    try:
        for item in details.get("error", {}).get("details", []) or []:  # type: ignore[union-attr]
            m = _DURATION.match(str(item.get("retryDelay", "")))
            if m:
                return float(m.group(1))
    except AttributeError:
        pass
    return None


class GeminiBackend(RemoteBackend):
    """LLM back end calling Gemini's `models/{model}:generateContent` through `google-genai`."""

    name = "gemini"

    def __init__(
        self,
        config: GeminiConfig | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        from google import genai
        from google.genai import errors as genai_errors
        from google.genai import types as genai_types

        config = config or GeminiConfig()
        self._types = genai_types
        self._errors = genai_errors
        api_key = read_api_key(config.api_key_env)
        http_options = genai_types.HttpOptions(
            base_url=config.base_url,
            api_version=config.api_version,
            timeout=max(1, int(round(config.timeout_s * 1000))),
            retry_options=None,  # retries are ours (counted, logged, jittered); the SDK makes one attempt
        )
        self._client = genai.Client(api_key=api_key, vertexai=False, http_options=http_options)
        super().__init__(config, api_key, sleep=sleep, rng=rng)
        self.config: GeminiConfig = config

    def close_client(self) -> None:
        """Closes the google-genai client."""
        self._client.close()

    def __enter__(self) -> GeminiBackend:
        """The back end itself (typed as GeminiBackend), closed when the block ends."""
        return self

    # -- one attempt (RemoteBackend's hooks) -------------------------------------------------------

    def prepare(self, request: LLMRequest) -> tuple[str, Any]:
        """(contents, GenerateContentConfig) of `request`: system instruction, sampling, JSON schema."""
        t = self._types
        kwargs: dict[str, Any] = dict(
            temperature=request.temperature,
            max_output_tokens=request.max_output_tokens,
            automatic_function_calling=t.AutomaticFunctionCallingConfig(disable=True),
        )
        if request.system:
            kwargs["system_instruction"] = request.system
        if request.json_schema is not None:
            kwargs["response_mime_type"] = "application/json"
            schema = json.loads(json.dumps(request.json_schema))
            if self.config.structured_output == "json_schema":
                kwargs["response_json_schema"] = schema
            elif self.config.structured_output == "response_schema":
                kwargs["response_schema"] = schema
        if self.config.thinking_budget is not None:
            kwargs["thinking_config"] = t.ThinkingConfig(thinking_budget=self.config.thinking_budget)
        return request.prompt, t.GenerateContentConfig(**kwargs)

    def send(self, prepared: tuple[str, Any], timeout_s: float) -> Any:
        """One generateContent call with a per-request HTTP timeout (patched over the client's options)."""
        contents, config = prepared
        ms = max(1, int(round(timeout_s * 1000)))
        config = config.model_copy(update={"http_options": self._types.HttpOptions(timeout=ms)})
        return self._client.models.generate_content(model=self.config.model, contents=contents, config=config)

    def retry_hint_s(self, exc: BaseException) -> float | None:
        """Retry-After or google.rpc.RetryInfo of a failed attempt."""
        return _retry_hint_s(exc)

    def classify(self, exc: BaseException, timeout_s: float) -> tuple[bool, str]:
        """(retryable, short description) of an exception raised by an attempt that had `timeout_s`."""
        if isinstance(exc, self._errors.APIError):
            code = int(exc.code or 0)
            desc = f"HTTP {code} {exc.status or ''}: {exc.message or ''}".strip()
            return (code in RETRYABLE_STATUS or code >= 500), desc
        if isinstance(exc, TRANSPORT_ERRORS):
            kind = "timeout" if remote.is_timeout(exc) else "transport"
            extra = f" after {timeout_s:g}s" if kind == "timeout" else ""
            return True, f"{kind} error{extra} ({type(exc).__name__}: {exc})"
        unknown = getattr(self._errors, "UnknownApiResponseError", None)
        if isinstance(exc, json.JSONDecodeError) or (unknown is not None and isinstance(exc, unknown)):
            return True, f"malformed response body ({type(exc).__name__}: {exc})"
        try:
            import pydantic

            if isinstance(exc, pydantic.ValidationError):
                return True, f"malformed response shape ({exc.error_count()} validation error(s))"
        except ImportError:  # pragma: no cover - pydantic is a dependency of google-genai
            pass
        return False, f"{type(exc).__name__}: {exc}"

    def to_response(self, request: LLMRequest, raw: Any, attempts: int, latency_s: float) -> LLMResponse:
        """The answer's text (thoughts left out), finish reason and token counts."""
        text_parts: list[str] = []
        finish_reason: str | None = None
        candidates = getattr(raw, "candidates", None) or []
        if candidates:
            cand = candidates[0]
            finish_reason = str(cand.finish_reason.value) if getattr(cand, "finish_reason", None) else None
            parts = getattr(getattr(cand, "content", None), "parts", None) or []
            text_parts = [p.text for p in parts if getattr(p, "text", None) and not getattr(p, "thought", False)]
        else:
            feedback = getattr(raw, "prompt_feedback", None)
            block = getattr(feedback, "block_reason", None)
            finish_reason = f"BLOCKED:{getattr(block, 'value', block)}" if block else "NO_CANDIDATES"
        text = "".join(text_parts)
        if not text and finish_reason == "MAX_TOKENS":
            logger.warning(
                "%s back end (model %s): empty answer cut at max_output_tokens=%d; on thinking models lower "
                "thinking_budget or raise max_output_tokens", self.name, self.config.model, request.max_output_tokens,
            )
        um = getattr(raw, "usage_metadata", None)
        prompt_tokens = int(getattr(um, "prompt_token_count", 0) or 0)
        output_tokens = int(getattr(um, "candidates_token_count", 0) or 0)
        thoughts = int(getattr(um, "thoughts_token_count", 0) or 0)
        self.meter.add(prompt_tokens=prompt_tokens, output_tokens=output_tokens, thoughts_tokens=thoughts, calls=1)
        return LLMResponse.answering(
            request,
            text,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            attempts=attempts,
            latency_s=latency_s,
            finish_reason=finish_reason,
        )
