"""Gemini back end over the `google-genai` client: bounded concurrency, per-attempt timeouts, own retries.

The SDK's own retries are off (no `retry_options`), so every attempt is counted and logged here, with
exponential backoff and jitter on 408 / 429 / 5xx, timeouts, transport errors and malformed response bodies.
`generate` raises the first request that fails for good; `generate_each` hands every request's outcome back
(answer or BackendError) so batch callers can skip failures. The API key is read from the environment at
construction and never appears in repr, logs or errors.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from icml_jax.llm.retry import RetryPolicy
from icml_jax.llm.types import BackendError, LLMRequest, LLMResponse, MissingAPIKeyError, TokenUsage, UsageMeter

logger = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_REDACTED = "<redacted>"


@dataclasses.dataclass(frozen=True)
class GeminiConfig:
    """Knobs of the Gemini back end; `model` comes from the run config, the key only from the environment.

    Retries: `max_attempts` tries with exponential backoff (initial_backoff_s x backoff_multiplier^k, capped at
    max_backoff_s, scaled by a uniform factor in [1 - jitter, 1 + jitter]); a server's Retry-After / RetryInfo
    is a floor (up to max_backoff_s). The defaults keep a request trying for at least 91.5 s (at most 214.5 s)
    of backoff, so a minute-long quota burst (429s) costs retries, not the request.

    Timeouts: one attempt waits `attempt_timeout_s(max_output_tokens)` = timeout_floor_s + max_output_tokens /
    timeout_tokens_per_s, never more than timeout_s, and twice as long after each timed-out attempt of the same
    request. A stalled connection on a short request (a 128-token note: ~15 s; a 512-token judge answer: ~30 s)
    is given up long before timeout_s, while a server that is slow but alive gets up to timeout_s on later
    attempts. timeout_tokens_per_s=None: every attempt waits timeout_s.
    """

    model: str = "gemini-2.5-flash"
    base_url: str | None = None  # None = Google's endpoint; tests point it at a loopback server
    api_version: str | None = None  # None = the SDK's default
    timeout_s: float = 60.0  # the longest an HTTP attempt may take
    timeout_floor_s: float = 10.0  # connection, prompt processing and first token of any attempt
    timeout_tokens_per_s: float | None = 25.0  # slowest output rate waited for (thoughts included); None: timeout_s
    max_concurrency: int = 8
    max_attempts: int = 9
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.5
    # None = model default. On thinking models the thoughts count against max_output_tokens, so a small budget
    # (0 where the model allows it) keeps short answers (notes, judge JSON) from being cut off.
    thinking_budget: int | None = None
    # How a judge's JSON schema is sent: "json_schema" (responseJsonSchema, Gemini 2.5+), "response_schema"
    # (the OpenAPI-subset responseSchema, older models too) or "mime_only" (JSON mode without a schema).
    structured_output: str = "json_schema"
    api_key_env: tuple[str, ...] = ("GEMINI_API_KEY", "GOOGLE_API_KEY")  # first one set wins

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("GeminiConfig.model must name a model, e.g. 'gemini-2.5-flash'")
        if self.max_concurrency < 1:
            raise ValueError(f"GeminiConfig.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ValueError(f"GeminiConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.timeout_floor_s <= 0:
            raise ValueError(f"GeminiConfig.timeout_floor_s must be > 0, got {self.timeout_floor_s}")
        if self.timeout_tokens_per_s is not None and self.timeout_tokens_per_s <= 0:
            raise ValueError(f"GeminiConfig.timeout_tokens_per_s must be > 0 or None, got {self.timeout_tokens_per_s}")
        if self.structured_output not in ("json_schema", "response_schema", "mime_only"):
            raise ValueError(
                "GeminiConfig.structured_output must be 'json_schema', 'response_schema' or 'mime_only', "
                f"got {self.structured_output!r}"
            )
        try:
            self.retry_policy  # noqa: B018 - the retry knobs are checked where they are used
        except ValueError as exc:
            raise ValueError(f"GeminiConfig: {exc}") from None

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry schedule these knobs describe."""
        return RetryPolicy(
            max_attempts=self.max_attempts,
            initial_backoff_s=self.initial_backoff_s,
            max_backoff_s=self.max_backoff_s,
            multiplier=self.backoff_multiplier,
            jitter=self.jitter,
        )

    def attempt_timeout_s(self, max_output_tokens: int, timeouts: int = 0) -> float:
        """The HTTP timeout of one attempt of a request allowed `max_output_tokens`, after `timeouts` timed-out
        attempts of it (see the class docstring)."""
        if self.timeout_tokens_per_s is None:
            return self.timeout_s
        sized = self.timeout_floor_s + max(0, max_output_tokens) / self.timeout_tokens_per_s
        return min(self.timeout_s, sized * 2.0 ** timeouts)


def read_api_key(env_names: Sequence[str]) -> str:
    """Return the first non-empty key among `env_names`; raise MissingAPIKeyError naming them otherwise."""
    for name in env_names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    raise MissingAPIKeyError(f"gemini back end: no API key found; set one of {', '.join(env_names)}")


def _transient_transport_errors() -> tuple[type[BaseException], ...]:
    """Timeout / connection / protocol error classes of the HTTP libraries the SDK may use."""
    classes: list[type[BaseException]] = [TimeoutError, ConnectionError]
    for mod_name in ("httpx2", "httpx"):
        try:
            mod = __import__(mod_name)
        except ImportError:
            continue
        for cls_name in ("TimeoutException", "TransportError"):
            cls = getattr(mod, cls_name, None)
            if isinstance(cls, type):
                classes.append(cls)
    return tuple(classes)


_TRANSPORT_ERRORS = _transient_transport_errors()
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)s\s*$")


def _retry_hint_s(exc: BaseException) -> float | None:
    """Server-suggested wait: a Retry-After header or a google.rpc.RetryInfo retryDelay, if present."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is not None:
        try:
            value = headers.get("retry-after")
            if value is not None:
                return float(value)
        except (TypeError, ValueError):
            pass
    details = getattr(exc, "details", None)
    try:
        for item in details.get("error", {}).get("details", []) or []:  # type: ignore[union-attr]
            m = _DURATION.match(str(item.get("retryDelay", "")))
            if m:
                return float(m.group(1))
    except AttributeError:
        pass
    return None


class GeminiBackend:
    """LLM back end calling Gemini's `models/{model}:generateContent` through `google-genai`."""

    name = "gemini"
    remote = True  # every request is its own HTTP call: sending them one at a time loses no batching

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

        self.config = config or GeminiConfig()
        self._policy = self.config.retry_policy
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._types = genai_types
        self._errors = genai_errors
        self._api_key = read_api_key(self.config.api_key_env)
        http_options = genai_types.HttpOptions(
            base_url=self.config.base_url,
            api_version=self.config.api_version,
            timeout=max(1, int(round(self.config.timeout_s * 1000))),
            retry_options=None,  # retries are ours (counted, logged, jittered); the SDK makes one attempt
        )
        self._client = genai.Client(api_key=self._api_key, vertexai=False, http_options=http_options)
        self._pool = cf.ThreadPoolExecutor(max_workers=self.config.max_concurrency, thread_name_prefix="gemini")
        self._meter = UsageMeter()
        self._closed = False

    def __repr__(self) -> str:
        c = self.config
        return f"GeminiBackend(model={c.model!r}, base_url={c.base_url!r}, max_concurrency={c.max_concurrency})"

    __str__ = __repr__

    def __getstate__(self) -> Any:
        raise TypeError("GeminiBackend cannot be pickled (it holds an API key, threads and connections)")

    @property
    def usage(self) -> TokenUsage:
        """Totals spent since construction."""
        return self._meter.usage

    def close(self) -> None:
        """Stop the worker threads and close the HTTP client."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        try:
            self._client.close()
        except Exception:  # closing is best effort
            pass

    def __enter__(self) -> GeminiBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """Answer `requests` concurrently (at most max_concurrency in flight), in order; BackendError on failure."""
        if self._closed:
            raise RuntimeError("gemini back end: generate() called after close()")
        if not requests:
            return []
        futures = [self._pool.submit(self._generate_one, r) for r in requests]
        first_error: BaseException | None = None
        for fut in cf.as_completed(futures):
            if fut.cancelled():
                continue
            err = fut.exception()
            if err is not None and first_error is None:
                first_error = err
                for other in futures:  # do not start requests whose batch already failed
                    other.cancel()
        if first_error is not None:
            raise first_error
        return [f.result() for f in futures]

    def generate_each(self, requests: Sequence[LLMRequest]) -> list[LLMResponse | BackendError]:
        """Answer `requests` concurrently, in order, each to its end: a request that fails for good comes back as
        its BackendError in its place and cancels nothing. Other exceptions (bugs) are raised."""
        if self._closed:
            raise RuntimeError("gemini back end: generate_each() called after close()")
        futures = [self._pool.submit(self._generate_one, r) for r in requests]
        cf.wait(futures)
        out: list[LLMResponse | BackendError] = []
        for fut in futures:
            err = fut.exception()
            if err is not None and not isinstance(err, BackendError):
                raise err
            out.append(err if err is not None else fut.result())
        return out

    # -- one request -------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        """Remove the API key from a message, in case a library echoed it."""
        return text.replace(self._api_key, _REDACTED) if self._api_key else text

    def _content_config(self, request: LLMRequest) -> Any:
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
        return t.GenerateContentConfig(**kwargs)

    def _with_timeout(self, config: Any, timeout_s: float) -> Any:
        """`config` carrying a per-request HTTP timeout (the SDK patches it over the client's options)."""
        ms = max(1, int(round(timeout_s * 1000)))
        return config.model_copy(update={"http_options": self._types.HttpOptions(timeout=ms)})

    @staticmethod
    def _is_timeout(exc: BaseException) -> bool:
        """Whether an attempt's exception is a client-side timeout."""
        return isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower()

    def _classify(self, exc: BaseException, timeout_s: float) -> tuple[bool, str]:
        """(retryable, short description) of an exception raised by an attempt that had `timeout_s`."""
        if isinstance(exc, self._errors.APIError):
            code = int(exc.code or 0)
            desc = f"HTTP {code} {exc.status or ''}: {exc.message or ''}".strip()
            return (code in _RETRYABLE_STATUS or code >= 500), desc
        if isinstance(exc, _TRANSPORT_ERRORS):
            kind = "timeout" if self._is_timeout(exc) else "transport"
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

    def _generate_one(self, request: LLMRequest) -> LLMResponse:
        config = self._content_config(request)
        max_attempts = self._policy.max_attempts
        timeouts = 0  # timed-out attempts so far: each one doubles the next attempt's timeout
        t0 = time.monotonic()
        for attempt in range(1, max_attempts + 1):
            self._meter.add(attempts=1, retries=1 if attempt > 1 else 0)
            timeout_s = self.config.attempt_timeout_s(request.max_output_tokens, timeouts)
            try:
                raw = self._client.models.generate_content(
                    model=self.config.model, contents=request.prompt, config=self._with_timeout(config, timeout_s)
                )
            except Exception as exc:  # classified below; nothing is swallowed
                retryable, desc = self._classify(exc, timeout_s)
                desc = self._scrub(desc)
                timeouts += self._is_timeout(exc)
                if not retryable or attempt == max_attempts:
                    self._meter.add(failures=1)
                    err = BackendError(
                        f"{self.name} (model {self.config.model})", attempt, max_attempts, desc, retryable
                    )
                    logger.error("%s", err)
                    raise err from None
                with self._rng_lock:
                    delay = self._policy.delay(attempt, self._rng, _retry_hint_s(exc))
                logger.warning(
                    "%s back end (model %s): attempt %d/%d failed: %s; retrying in %.3fs",
                    self.name, self.config.model, attempt, max_attempts, desc, delay,
                )
                self._sleep(delay)
                continue
            return self._to_response(request, raw, attempt, time.monotonic() - t0)
        raise AssertionError("unreachable")  # pragma: no cover

    def _to_response(self, request: LLMRequest, raw: Any, attempts: int, latency_s: float) -> LLMResponse:
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
        self._meter.add(prompt_tokens=prompt_tokens, output_tokens=output_tokens, thoughts_tokens=thoughts, calls=1)
        return LLMResponse.answering(
            request,
            text,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            attempts=attempts,
            latency_s=latency_s,
            finish_reason=finish_reason,
        )
