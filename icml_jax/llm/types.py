"""The LLM back-end protocol: requests, responses, token usage and errors shared by every back end."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from icml_jax.llm.jsonparse import parse_json_text

# Task names: what a request is for. Real back ends ignore them; the offline back end dispatches on them.
TASK_GENERIC = "generic"
TASK_CONDENSE = "condense"
TASK_REPLY = "reply"
TASK_PROXY_JUDGE = "proxy_judge"
TASK_QUALITY_JUDGE = "quality_judge"
TASK_PAIRWISE_JUDGE = "pairwise_judge"


@dataclasses.dataclass(frozen=True)
class LLMRequest:
    """One prompt for a back end; `json_schema` asks for structured (JSON) output that the back end parses."""

    prompt: str
    system: str | None = None
    json_schema: Mapping[str, Any] | None = None
    max_output_tokens: int = 512
    temperature: float = 0.0
    task: str = TASK_GENERIC
    # Free-form, JSON-able hints that never reach a real model (e.g. labels for the offline back end).
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LLMResponse:
    """A back end's answer: the text, the parsed JSON when a schema was asked for, and what it cost."""

    text: str
    parsed: Any | None = None
    parse_error: str | None = None  # set when a schema was asked for and the text is not valid JSON
    prompt_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 1
    latency_s: float = 0.0
    finish_reason: str | None = None

    @classmethod
    def answering(cls, request: "LLMRequest", text: str, **fields: Any) -> "LLMResponse":
        """The response to `request` with `text`, its JSON parsed when the request asked for a schema."""
        if request.json_schema is not None:
            fields["parsed"], fields["parse_error"] = parse_json_text(text)
        return cls(text=text, **fields)

    @property
    def ok_json(self) -> bool:
        """True when structured output was parsed successfully."""
        return self.parse_error is None and self.parsed is not None


@dataclasses.dataclass(frozen=True)
class TokenUsage:
    """Tokens and calls a back end has spent so far (successful calls carry the token counts)."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    thoughts_tokens: int = 0
    calls: int = 0  # requests answered
    attempts: int = 0  # HTTP (or model) attempts, retries included
    retries: int = 0
    failures: int = 0  # requests that failed after the last retry

    @property
    def total_tokens(self) -> int:
        """Prompt + output + thinking tokens."""
        return self.prompt_tokens + self.output_tokens + self.thoughts_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)})

    def __sub__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)})

    def to_dict(self) -> dict[str, int]:
        """Every count plus `total_tokens`, JSON-safe (for manifests and metrics rows)."""
        return {**dataclasses.asdict(self), "total_tokens": self.total_tokens}

    def as_metrics(self, prefix: str = "llm") -> dict[str, float]:
        """Flat metric dict, e.g. {'llm/prompt_tokens': 12.0, ...}."""
        out = {f"{prefix}/{f.name}": float(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out[f"{prefix}/total_tokens"] = float(self.total_tokens)
        return out


class UsageMeter:
    """Thread-safe accumulator of TokenUsage, shared by a back end's worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage = TokenUsage()

    def add(self, **counts: int) -> None:
        """Add counts (field names of TokenUsage)."""
        with self._lock:
            self._usage = self._usage + TokenUsage(**counts)

    @property
    def usage(self) -> TokenUsage:
        """Snapshot of the totals."""
        with self._lock:
            return self._usage

    def reset(self) -> TokenUsage:
        """Return the totals and start again from zero."""
        with self._lock:
            usage, self._usage = self._usage, TokenUsage()
            return usage


class BackendError(RuntimeError):
    """A request failed for good: names the back end, the attempts made and the last error."""

    def __init__(self, backend: str, attempts: int, max_attempts: int, last_error: str, retryable: bool) -> None:
        self.backend = backend
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.last_error = last_error
        self.retryable = retryable
        why = "retries exhausted" if retryable else "not retryable"
        super().__init__(
            f"{backend} back end: request failed after {attempts} attempt(s) of {max_attempts} ({why}); "
            f"last error: {last_error}"
        )


# How a judge asks a back end for a verdict: "json" (generate text, parse a JSON object; every back end) or
# "scores" (read the probabilities of the score tokens "1".."5" after a cue; back ends with `score`, e.g. local).
JUDGE_MODE_JSON = "json"
JUDGE_MODE_SCORES = "scores"
JUDGE_MODES = (JUDGE_MODE_SCORES, JUDGE_MODE_JSON)
SCORE_LEVELS = (1, 2, 3, 4, 5)


@dataclasses.dataclass(frozen=True)
class ScoreRequest:
    """A judge prompt scored by token probabilities: `request`'s system and prompt, then each cue in turn starts
    the assistant's answer, and the next token is read over the levels "1".."5" (one verdict per cue)."""

    request: LLMRequest
    cues: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.cues:
            raise ValueError(f"ScoreRequest (task {self.request.task!r}): needs at least one cue")


@dataclasses.dataclass(frozen=True)
class ScoreResponse:
    """Per cue: the distribution over levels 1..5 (normalised), its expected level, and the probability mass
    the model put on the level tokens before normalising (how much it wanted to answer with a digit)."""

    probs: tuple[tuple[float, ...], ...]
    expected: tuple[float, ...]
    mass: tuple[float, ...]
    prompt_tokens: int = 0
    latency_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class LoglikRequest:
    """A teacher-forced likelihood query: how probable `continuation` is as the assistant's answer to `request`."""

    request: LLMRequest
    continuation: str


@dataclasses.dataclass(frozen=True)
class LoglikResponse:
    """The summed log-probability (nats) of a continuation's `tokens` tokens after its prompt."""

    logprob: float
    tokens: int
    prompt_tokens: int = 0

    @property
    def nll(self) -> float | None:
        """Mean negative log-likelihood per continuation token (None for an empty continuation)."""
        return -self.logprob / self.tokens if self.tokens else None


@runtime_checkable
class LikelihoodBackend(Protocol):
    """A back end that can score a given continuation by teacher forcing (local models; hosted APIs cannot)."""

    def loglik(self, requests: Sequence[LoglikRequest]) -> list[LoglikResponse]:
        """One LoglikResponse per request, in order."""
        ...


@runtime_checkable
class ScoringBackend(Protocol):
    """A back end that can also judge by score-token probabilities (`judge_mode` says whether judges should)."""

    judge_mode: str

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResponse]:
        """One ScoreResponse per request, in order, each with one entry per cue."""
        ...


def judge_mode_of(backend: Any) -> str:
    """The judge mode a back end asks for: its `judge_mode`, or "json" for back ends without one (Gemini, offline)."""
    mode = getattr(backend, "judge_mode", JUDGE_MODE_JSON)
    if mode not in JUDGE_MODES:
        raise ValueError(f"{getattr(backend, 'name', type(backend).__name__)} back end: judge_mode must be one of "
                         f"{list(JUDGE_MODES)}, got {mode!r}")
    if mode == JUDGE_MODE_SCORES and not callable(getattr(backend, "score", None)):
        raise TypeError(f"{getattr(backend, 'name', type(backend).__name__)} back end: judge_mode 'scores' but no "
                        "score() method")
    return mode


class MissingAPIKeyError(RuntimeError):
    """No API key in the environment for a back end that needs one."""


@runtime_checkable
class LLMBackend(Protocol):
    """Batched requests in, responses (text or parsed JSON) out, token usage counted."""

    name: str

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        """Answer every request, in order; raises BackendError when one fails for good."""
        ...

    @property
    def usage(self) -> TokenUsage:
        """Totals spent since construction."""
        ...

    def close(self) -> None:
        """Release threads and connections."""
        ...
