"""LLM judges: the proxy judge (information value of a turn) and the quality judge (five 1-5 dimensions).

An answer that does not parse or validate is asked again once; if it still fails, the item is returned as a
judge failure (score None, `failure` says why) and counted in the judge's stats. It never becomes a score and
never raises. Back-end errors (retries exhausted, bad key) are not judge failures: by default they propagate as
BackendError, so a broken back end stops the run loudly; a judge made with `backend_failures="record"` (the
evaluation's) records such an item as a failure too (`failure` starts with "back end:"), counted apart, so one
unlucky request does not lose a whole evaluation (the caller decides how many it tolerates).

A back end whose `judge_mode` is "scores" (the local back end's default) is not asked for JSON by the proxy and
quality judges: each dimension's verdict is the expected level under the model's next-token probabilities of
"1".."5" after a cue (G-Eval style), mapped to [0, 1] as (E - 1) / 4 like a JSON score, so every item gets a
verdict (`reason` and `raw_text` carry the distribution). The pairwise judge and `judge_requests` stay on JSON.
Neither path puts labels into what the model reads: the JSON requests carry them in metadata for the offline
back end only, and the score requests carry none.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from icml_jax.llm import prompts
from icml_jax.llm.generation import generate_each
from icml_jax.llm.types import (
    JUDGE_MODE_SCORES,
    BackendError,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    ScoreRequest,
    ScoreResponse,
    judge_mode_of,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JudgeResult:
    """One verdict: `score` in [0, 1] (None on failure), per-dimension raw and normalised scores, provenance."""

    score: float | None
    # raw 1-5 (quality judge only); judged by score tokens: the level nearest the expected score
    dimensions: Mapping[str, int] = dataclasses.field(default_factory=dict)
    normalized: Mapping[str, float] = dataclasses.field(default_factory=dict)  # (raw or expected score - 1) / 4
    reason: str = ""
    attempts: int = 1
    failure: str | None = None
    raw_text: str = ""

    @property
    def ok(self) -> bool:
        """True when the judge produced a valid score."""
        return self.failure is None and self.score is not None


@dataclasses.dataclass(frozen=True)
class JudgeStats:
    """Counters of one judge: items judged, re-asks after an unparseable answer, final failures."""

    items: int = 0
    reasks: int = 0
    failures: int = 0  # every item without a score, back-end failures included
    backend_failures: int = 0  # items whose request failed for good in the back end ("record" mode)

    def as_metrics(self, prefix: str) -> dict[str, float]:
        """Flat metric dict, e.g. {'judge/quality/failures': 0.0, ...}."""
        rate = self.failures / self.items if self.items else 0.0
        return {
            f"{prefix}/items": float(self.items),
            f"{prefix}/reasks": float(self.reasks),
            f"{prefix}/failures": float(self.failures),
            f"{prefix}/failure_rate": rate,
            f"{prefix}/backend_failures": float(self.backend_failures),
        }


@dataclasses.dataclass(frozen=True)
class GoldTarget:
    """A gold turn to predict: the dialogue before its utterance, the utterance, and the gold turn itself."""

    history: prompts.Dialogue
    utterance: str
    gold: str


@dataclasses.dataclass(frozen=True)
class ProxyInput:
    """A user turn to rate for information value; `label` is the data's y_p when known (offline back end);
    `later`: gold turns of the episode's later sessions it may help predict, None when there is no later session
    (the likelihood reward reads them); `control`: a text of another episode scored on the same turns (the
    calibrated likelihood proxy subtracts its gain)."""

    turn_text: str
    history: prompts.Dialogue = ()
    label: float | None = None
    metadata: Mapping[str, Any] | None = None
    later: Sequence[GoldTarget] | None = ()
    control: str | None = None


@dataclasses.dataclass(frozen=True)
class QualityInput:
    """A reply to rate; `label_needed` / `used_ref` are the y_t refs and the chosen memory's ref, when known."""

    history: prompts.Dialogue
    utterance: str
    reply: str
    memory: str | None
    label_needed: Sequence[Any] | None = None
    used_ref: Any = None
    metadata: Mapping[str, Any] | None = None
    gold_next: str | None = None  # the gold turn the reply stands in for (the likelihood reward reads it)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


class _Judge(abc.ABC):
    """Shared machinery: batch through the back end, validate, re-ask failures once, count."""

    kind = "judge"

    def __init__(self, backend: LLMBackend, *, max_attempts: int = 2, backend_failures: str = "raise") -> None:
        if max_attempts < 1:
            raise ValueError(f"{type(self).__name__}: max_attempts must be >= 1, got {max_attempts}")
        if backend_failures not in ("raise", "record"):
            raise ValueError(f"{type(self).__name__}: backend_failures must be 'raise' or 'record', "
                             f"got {backend_failures!r}")
        self.backend = backend
        self.max_attempts = max_attempts
        self.backend_failures = backend_failures
        self._lock = threading.Lock()
        self._stats = JudgeStats()

    @property
    def stats(self) -> JudgeStats:
        """Counters since construction (or the last reset_stats)."""
        with self._lock:
            return self._stats

    def reset_stats(self) -> JudgeStats:
        """Return the counters and start again from zero (e.g. once per logging step)."""
        with self._lock:
            stats, self._stats = self._stats, JudgeStats()
            return stats

    def metrics(self) -> dict[str, float]:
        """The stats as flat metrics under 'judge/<kind>'."""
        return self.stats.as_metrics(f"judge/{self.kind}")

    @abc.abstractmethod
    def _validate(self, response: LLMResponse) -> tuple[JudgeResult | None, str]:
        """Turns a response into a result, or (None, reason) when the answer is invalid; each judge defines it."""

    @property
    def by_scores(self) -> bool:
        """True when the back end asks judges to read score-token probabilities instead of JSON."""
        return judge_mode_of(self.backend) == JUDGE_MODE_SCORES

    def _from_scores(self, request: ScoreRequest, response: ScoreResponse) -> JudgeResult:
        """Turns one score-token response into a verdict; the proxy and quality judges define it."""
        raise NotImplementedError(f"{type(self).__name__} does not judge by score tokens")

    def judge_scores(self, requests: Sequence[ScoreRequest]) -> list[JudgeResult]:
        """Judge by score-token probabilities: one verdict per request (a back-end error is raised, or recorded
        for every item in "record" mode; a response with the wrong number of scores is a counted failure)."""
        try:
            responses = self.backend.score(requests)  # type: ignore[attr-defined]
        except BackendError as exc:
            if self.backend_failures != "record":
                raise
            responses = [exc] * len(requests)
        if len(responses) != len(requests):
            raise RuntimeError(f"{self.kind} judge: the {self.backend.name} back end scored {len(responses)} of "
                               f"{len(requests)} requests")
        results, failed, backend_failed = [], 0, 0
        for request, resp in zip(requests, responses, strict=True):
            if isinstance(resp, BackendError):
                results.append(JudgeResult(score=None, failure=f"back end: {resp}"))
                failed, backend_failed = failed + 1, backend_failed + 1
            elif len(resp.expected) != len(request.cues) or len(resp.probs) != len(request.cues):
                why = (f"the {self.backend.name} back end gave {len(resp.expected)} score(s) for "
                       f"{len(request.cues)} cue(s) (task {request.request.task!r})")
                logger.warning("%s judge: %s; recorded as a judge failure", self.kind, why)
                results.append(JudgeResult(score=None, failure=why))
                failed += 1
            else:
                raw = json.dumps({"cues": list(request.cues), "probs": [list(p) for p in resp.probs],
                                  "expected": list(resp.expected), "mass": list(resp.mass)})
                results.append(dataclasses.replace(self._from_scores(request, resp), raw_text=raw))
        with self._lock:
            s = self._stats
            self._stats = JudgeStats(s.items + len(requests), s.reasks, s.failures + failed,
                                     s.backend_failures + backend_failed)
        return results

    def judge_requests(self, requests: Sequence[LLMRequest]) -> list[JudgeResult]:
        """Judge prepared requests (built by the prompts module); see the module docstring for failures."""
        results: list[JudgeResult | None] = [None] * len(requests)
        errors: list[str] = [""] * len(requests)
        texts: list[str] = [""] * len(requests)
        pending = list(range(len(requests)))
        reasks, failed = 0, 0
        for attempt in range(1, self.max_attempts + 1):
            if not pending:
                break
            batch = [requests[i] if attempt == 1 else _reask(requests[i], errors[i]) for i in pending]
            if attempt > 1:
                reasks += len(batch)
            record = self.backend_failures == "record"
            responses = generate_each(self.backend, batch) if record else self.backend.generate(batch)
            still: list[int] = []
            for i, resp in zip(pending, responses, strict=True):
                if isinstance(resp, BackendError):  # retries exhausted: not asked again, recorded
                    results[i] = JudgeResult(score=None, attempts=attempt, failure=f"back end: {resp}")
                    failed += 1
                    continue
                texts[i] = resp.text
                result, err = self._validate(resp)
                if result is None:
                    errors[i] = err
                    still.append(i)
                else:
                    results[i] = dataclasses.replace(result, attempts=attempt, raw_text=resp.text)
            pending = still
        for i in pending:
            logger.warning(
                "%s judge: no valid answer after %d attempt(s) (%s); recorded as a judge failure",
                self.kind, self.max_attempts, errors[i],
            )
            results[i] = JudgeResult(
                score=None, attempts=self.max_attempts, failure=errors[i], raw_text=texts[i][:2000]
            )
        with self._lock:
            s = self._stats
            self._stats = JudgeStats(s.items + len(requests), s.reasks + reasks, s.failures + len(pending) + failed,
                                     s.backend_failures + failed)
        return [r for r in results if r is not None]


def _reask(request: LLMRequest, error: str) -> LLMRequest:
    """The same request, told why the previous answer was rejected."""
    note = (
        f"\n\nYour previous answer was rejected ({prompts.neutralise(error)}). "
        "Answer again with only the JSON object described above."
    )
    return dataclasses.replace(request, prompt=request.prompt + note)


class ProxyJudge(_Judge):
    """Information value of a user turn in [0, 1]: the proxy reward r_proxy of a save decision."""

    kind = "proxy"

    def judge(self, items: Sequence[ProxyInput]) -> list[JudgeResult]:
        """Rate each turn; failures come back with score None (see module docstring)."""
        if self.by_scores:  # labels stay out: the score request takes none
            return self.judge_scores(
                [prompts.proxy_score_request(x.turn_text, x.history, metadata=x.metadata) for x in items])
        return self.judge_requests(
            [prompts.proxy_judge_request(x.turn_text, x.history, label=x.label, metadata=x.metadata) for x in items]
        )

    def _from_scores(self, request: ScoreRequest, response: ScoreResponse) -> JudgeResult:
        expected = response.expected[0]
        return JudgeResult(score=(expected - 1.0) / 4.0,
                           reason=f"expected information value {expected:.3f} on 1-5 ({_levels(response.probs[0])})")

    def _validate(self, response: LLMResponse) -> tuple[JudgeResult | None, str]:
        if response.parse_error is not None:
            return None, response.parse_error
        obj = response.parsed
        if not isinstance(obj, dict):
            return None, f"expected a JSON object, got {type(obj).__name__}"
        score = obj.get("score")
        if not _is_number(score):
            return None, f"'score' missing or not a number: {score!r}"
        if not 0.0 <= float(score) <= 1.0:
            return None, f"'score' out of [0, 1]: {score!r}"
        return JudgeResult(score=float(score), reason=str(obj.get("reason", ""))), ""


class QualityJudge(_Judge):
    """Reply quality on five 1-5 dimensions, normalised to [0, 1]; the mean is the quality reward r_qual."""

    kind = "quality"
    reads_reply = True  # the learner writes each turn's reply for it (OnlineLearner.writes_replies)

    def __init__(
        self,
        backend: LLMBackend,
        *,
        max_attempts: int = 2,
        dimensions: Sequence[str] = prompts.QUALITY_DIMENSIONS,
        weights: Mapping[str, float] | None = None,
        backend_failures: str = "raise",
    ) -> None:
        super().__init__(backend, max_attempts=max_attempts, backend_failures=backend_failures)
        self.dimensions = tuple(dimensions)
        unknown = set(self.dimensions) - set(prompts.QUALITY_DIMENSIONS)
        if unknown:
            raise ValueError(f"QualityJudge: unknown dimensions {sorted(unknown)}")
        w = dict(weights) if weights else {d: 1.0 for d in self.dimensions}
        if set(w) != set(self.dimensions) or sum(w.values()) <= 0:
            raise ValueError(f"QualityJudge: weights must cover exactly {self.dimensions} and sum to > 0")
        total = sum(w.values())
        self.weights = {d: w[d] / total for d in self.dimensions}

    def judge(self, items: Sequence[QualityInput]) -> list[JudgeResult]:
        """Rate each reply; failures come back with score None (see module docstring)."""
        if self.by_scores:  # labels stay out: the score request takes none
            return self.judge_scores([
                prompts.quality_score_request(x.history, x.utterance, x.reply, x.memory, dimensions=self.dimensions,
                                              metadata=x.metadata)
                for x in items
            ])
        return self.judge_requests(
            [
                prompts.quality_judge_request(
                    x.history, x.utterance, x.reply, x.memory,
                    label_needed=x.label_needed, used_ref=x.used_ref, metadata=x.metadata,
                )
                for x in items
            ]
        )

    def _validate(self, response: LLMResponse) -> tuple[JudgeResult | None, str]:
        if response.parse_error is not None:
            return None, response.parse_error
        obj = response.parsed
        if not isinstance(obj, dict):
            return None, f"expected a JSON object, got {type(obj).__name__}"
        raw: dict[str, int] = {}
        for d in self.dimensions:
            v = obj.get(d)
            if not _is_number(v) or float(v) != int(v):
                return None, f"{d!r} missing or not an integer: {v!r}"
            if not 1 <= int(v) <= 5:
                return None, f"{d!r} out of 1-5: {v!r}"
            raw[d] = int(v)
        normalized = {d: (raw[d] - 1) / 4.0 for d in self.dimensions}
        score = sum(self.weights[d] * normalized[d] for d in self.dimensions)
        return JudgeResult(score=score, dimensions=raw, normalized=normalized, reason=str(obj.get("reason", ""))), ""

    def _from_scores(self, request: ScoreRequest, response: ScoreResponse) -> JudgeResult:
        expected = dict(zip(self.dimensions, response.expected, strict=True))
        normalized = {d: (expected[d] - 1.0) / 4.0 for d in self.dimensions}
        return JudgeResult(
            score=sum(self.weights[d] * normalized[d] for d in self.dimensions),
            dimensions={d: min(5, max(1, int(expected[d] + 0.5))) for d in self.dimensions}, normalized=normalized,
            reason="expected scores on 1-5: " + ", ".join(f"{d} {expected[d]:.3f}" for d in self.dimensions),
        )


def _levels(probs: Sequence[float]) -> str:
    """A distribution over levels 1..5 as 'p(1)=.. p(5)=..' for a verdict's reason."""
    return " ".join(f"p({i})={p:.3f}" for i, p in enumerate(probs, start=1))


class PairwiseJudge(_Judge):
    """Which of two replies is better: score 1.0 = the first shown, 0.0 = the second, 0.5 = a tie."""

    kind = "pairwise"

    def _validate(self, response: LLMResponse) -> tuple[JudgeResult | None, str]:
        if response.parse_error is not None:
            return None, response.parse_error
        obj = response.parsed
        better = obj.get("better") if isinstance(obj, dict) else None
        if better not in ("1", "2", "tie"):
            return None, f"'better' must be \"1\", \"2\" or \"tie\", got {better!r}"
        return JudgeResult(score={"1": 1.0, "2": 0.0, "tie": 0.5}[better], reason=str(obj.get("reason", ""))), ""
