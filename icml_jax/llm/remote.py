"""What every HTTP back end (Gemini, OpenAI-compatible) shares: the transport knobs, the API-key lookup, and a
base class that runs each request on a bounded thread pool with per-attempt timeouts and its own retries.

A subclass says how one attempt is sent (`prepare`, `send`), how its exceptions read (`classify`,
`retry_hint_s`) and how a raw answer becomes an LLMResponse (`to_response`). The base counts every attempt,
retry and failure in the back end's UsageMeter, logs each retry, and removes the API key from every message it
logs or raises.
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import dataclasses
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from icml_jax.llm.retry import RetryPolicy
from icml_jax.llm.types import BackendError, LLMRequest, LLMResponse, MissingAPIKeyError, TokenUsage, UsageMeter

logger = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})  # and every other 5xx
REDACTED = "<redacted>"


@dataclasses.dataclass(frozen=True)
class RemoteConfig:
    """Transport knobs of an HTTP back end (timeouts, concurrency, retries); subclasses add model and endpoint.

    Retries: `max_attempts` tries with exponential backoff (initial_backoff_s x backoff_multiplier^k, capped at
    max_backoff_s, scaled by a uniform factor in [1 - jitter, 1 + jitter]); a server's Retry-After / RetryInfo
    is a floor (up to max_backoff_s). The defaults (RetryPolicy's) keep a request trying for at least 91.5 s (at
    most 214.5 s) of backoff, so a minute-long quota burst (429s) costs retries, not the request.

    Timeouts: one attempt waits `attempt_timeout_s(max_output_tokens)` = timeout_floor_s + max_output_tokens /
    timeout_tokens_per_s, never more than timeout_s, and twice as long after each timed-out attempt of the same
    request. A stalled connection on a short request (a 128-token note: ~15 s; a 512-token judge answer: ~30 s)
    is given up long before timeout_s, while a server that is slow but alive gets up to timeout_s on later
    attempts. timeout_tokens_per_s=None: every attempt waits timeout_s.
    """

    timeout_s: float = 60.0  # the longest an HTTP attempt may take
    timeout_floor_s: float = 10.0  # connection, prompt processing and first token of any attempt
    timeout_tokens_per_s: float | None = 25.0  # slowest output rate waited for (thoughts included); None: timeout_s
    max_concurrency: int = 8
    max_attempts: int = RetryPolicy.max_attempts
    initial_backoff_s: float = RetryPolicy.initial_backoff_s
    max_backoff_s: float = RetryPolicy.max_backoff_s
    backoff_multiplier: float = RetryPolicy.multiplier
    jitter: float = RetryPolicy.jitter

    def __post_init__(self) -> None:
        """Checks the transport knobs; messages start with the concrete class name (e.g. GeminiConfig)."""
        name = type(self).__name__
        if self.max_concurrency < 1:
            raise ValueError(f"{name}.max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.timeout_s <= 0:
            raise ValueError(f"{name}.timeout_s must be > 0, got {self.timeout_s}")
        if self.timeout_floor_s <= 0:
            raise ValueError(f"{name}.timeout_floor_s must be > 0, got {self.timeout_floor_s}")
        if self.timeout_tokens_per_s is not None and self.timeout_tokens_per_s <= 0:
            raise ValueError(f"{name}.timeout_tokens_per_s must be > 0 or None, got {self.timeout_tokens_per_s}")
        try:
            self.retry_policy  # noqa: B018 - the retry knobs are checked where they are used
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None

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


def read_api_key(env_names: Sequence[str], who: str) -> str:
    """The first non-empty value among the environment variables `env_names`; MissingAPIKeyError naming `who`
    (e.g. "gemini back end") and the variables otherwise. The key itself is never logged or raised."""
    for name in env_names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    raise MissingAPIKeyError(f"{who}: no API key found; set one of {', '.join(env_names)}")


def transient_transport_errors() -> tuple[type[BaseException], ...]:
    """Timeout / connection / protocol error classes of the HTTP libraries the SDKs may use."""
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


TRANSPORT_ERRORS = transient_transport_errors()


def is_timeout(exc: BaseException) -> bool:
    """Whether an attempt's exception is a client-side timeout (by class, across HTTP libraries)."""
    return isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower()


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """A response's Retry-After header in seconds (the numeric form), or None."""
    if headers is None:
        return None
    try:
        value = headers.get("retry-after")
        return float(value) if value is not None else None
    except (TypeError, ValueError, AttributeError):
        return None


class RemoteBackend(abc.ABC):
    """Base of the HTTP back ends: bounded concurrency, counted and logged retries, per-attempt timeouts.

    Subclasses set `name`, build their client, call `__init__` with the key (to scrub it from messages) and
    implement the hooks `prepare`, `send`, `classify`, `retry_hint_s`, `to_response` and `close_client`.
    """

    name = "remote"
    remote = True  # every request is its own HTTP call: sending them one at a time loses no batching

    def __init__(self, config: RemoteConfig, secret: str, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.meter = UsageMeter()
        self._secret = secret
        self._policy = config.retry_policy
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._rng_lock = threading.Lock()
        self._pool = cf.ThreadPoolExecutor(max_workers=config.max_concurrency, thread_name_prefix=self.name)
        self._closed = False

    def __getstate__(self) -> Any:
        """Refuses pickling: the back end holds an API key, threads and connections."""
        raise TypeError(f"{type(self).__name__} cannot be pickled (it holds an API key, threads and connections)")

    @property
    def model_name(self) -> str:
        """The model every request names (the subclass config's `model`)."""
        return str(getattr(self.config, "model", "?"))

    @property
    def usage(self) -> TokenUsage:
        """Totals spent since construction."""
        return self.meter.usage

    def close(self) -> None:
        """Stop the worker threads and close the HTTP client."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.close_client()
        except Exception:  # closing is best effort
            pass

    def __repr__(self) -> str:
        """The back end's class, model, endpoint and concurrency; never the key."""
        c = self.config
        return (f"{type(self).__name__}(model={c.model!r}, base_url={c.base_url!r}, "
                f"max_concurrency={c.max_concurrency})")

    __str__ = __repr__

    def __enter__(self) -> RemoteBackend:
        """The back end itself, closed when the block ends."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Closes the back end (threads, connections)."""
        self.close()

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """Answer `requests` concurrently (at most max_concurrency in flight), in order; BackendError on failure."""
        if self._closed:
            raise RuntimeError(f"{self.name} back end: generate() called after close()")
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
            raise RuntimeError(f"{self.name} back end: generate_each() called after close()")
        futures = [self._pool.submit(self._generate_one, r) for r in requests]
        cf.wait(futures)
        out: list[LLMResponse | BackendError] = []
        for fut in futures:
            err = fut.exception()
            if err is not None and not isinstance(err, BackendError):
                raise err
            out.append(err if err is not None else fut.result())
        return out

    def scrub(self, text: str) -> str:
        """`text` with the API key removed, in case a library or server echoed it."""
        return text.replace(self._secret, REDACTED) if self._secret else text

    # -- hooks -------------------------------------------------------------------------------------

    @abc.abstractmethod
    def prepare(self, request: LLMRequest) -> Any:
        """What every attempt of `request` sends (built once per request)."""

    @abc.abstractmethod
    def send(self, prepared: Any, timeout_s: float) -> Any:
        """One HTTP attempt with a `timeout_s` deadline: the raw answer, or an exception (a malformed answer
        raises here too, so that `classify` can have it retried)."""

    @abc.abstractmethod
    def classify(self, exc: BaseException, timeout_s: float) -> tuple[bool, str]:
        """(retryable, short description) of an exception raised by an attempt that had `timeout_s`."""

    def retry_hint_s(self, exc: BaseException) -> float | None:
        """The wait a failed attempt's server suggested (Retry-After), if any."""
        return None

    @abc.abstractmethod
    def to_response(self, request: LLMRequest, raw: Any, attempts: int, latency_s: float) -> LLMResponse:
        """The LLMResponse of a raw answer that `send` returned, its tokens counted in `meter`."""

    def close_client(self) -> None:
        """Closes the SDK client."""

    # -- one request -------------------------------------------------------------------------------

    def _generate_one(self, request: LLMRequest) -> LLMResponse:
        """Runs `request`'s attempts until one answers, a failure is not retryable or the attempts run out."""
        prepared = self.prepare(request)
        max_attempts = self._policy.max_attempts
        timeouts = 0  # timed-out attempts so far: each one doubles the next attempt's timeout
        t0 = time.monotonic()
        for attempt in range(1, max_attempts + 1):
            self.meter.add(attempts=1, retries=1 if attempt > 1 else 0)
            timeout_s = self.config.attempt_timeout_s(request.max_output_tokens, timeouts)
            try:
                raw = self.send(prepared, timeout_s)
            except Exception as exc:  # classified below; nothing is swallowed
                retryable, desc = self.classify(exc, timeout_s)
                desc = self.scrub(desc)
                timeouts += is_timeout(exc)
                if not retryable or attempt == max_attempts:
                    self.meter.add(failures=1)
                    err = BackendError(f"{self.name} (model {self.model_name})", attempt, max_attempts, desc, retryable)
                    logger.error("%s", err)
                    raise err from None
                with self._rng_lock:
                    delay = self._policy.delay(attempt, self._rng, self.retry_hint_s(exc))
                logger.warning(
                    "%s back end (model %s): attempt %d/%d failed: %s; retrying in %.3fs",
                    self.name, self.model_name, attempt, max_attempts, desc, delay,
                )
                self._sleep(delay)
                continue
            return self.to_response(request, raw, attempt, time.monotonic() - t0)
        raise AssertionError("unreachable")  # pragma: no cover
