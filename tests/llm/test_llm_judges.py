"""Judges: validation, one re-ask, failures recorded (never raised, never a score), normalisation."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from icml_jax.llm import (
    QUALITY_DIMENSIONS,
    BackendError,
    LLMRequest,
    LLMResponse,
    OfflineBackend,
    ProxyInput,
    ProxyJudge,
    QualityInput,
    QualityJudge,
    TokenUsage,
    parse_json_text,
)


class ScriptedBackend:
    """Answers from a list of texts, in order; records the requests it saw."""

    name = "scripted"

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)
        self.seen: list[LLMRequest] = []

    @property
    def usage(self) -> TokenUsage:
        return TokenUsage(calls=len(self.seen))

    def close(self) -> None:
        pass

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        out = []
        for r in requests:
            self.seen.append(r)
            text = self.texts.pop(0)
            parsed, err = parse_json_text(text) if r.json_schema is not None else (None, None)
            out.append(LLMResponse(text=text, parsed=parsed, parse_error=err))
        return out


class FailingBackend(ScriptedBackend):
    def generate(self, requests):
        raise BackendError("scripted", 5, 5, "HTTP 503", True)


def _quality(**scores: int) -> str:
    return json.dumps({"reason": "r", **scores})


ALL4 = {d: 4 for d in QUALITY_DIMENSIONS}


def test_proxy_valid_answer():
    judge = ProxyJudge(ScriptedBackend(['{"reason": "job", "score": 0.8}']))
    (r,) = judge.judge([ProxyInput("I work at a bakery.")])
    assert r.ok and r.score == 0.8 and r.reason == "job" and r.attempts == 1
    assert judge.stats.items == 1 and judge.stats.reasks == 0 and judge.stats.failures == 0


def test_proxy_unparseable_then_valid_is_reasked_once():
    backend = ScriptedBackend(["I think 0.8", '{"score": 0.3, "reason": "meh"}'])
    judge = ProxyJudge(backend)
    (r,) = judge.judge([ProxyInput("hello")])
    assert r.ok and r.score == 0.3 and r.attempts == 2
    assert "previous answer was rejected" in backend.seen[1].prompt
    assert backend.seen[1].metadata == backend.seen[0].metadata
    assert judge.stats.reasks == 1 and judge.stats.failures == 0


@pytest.mark.parametrize(
    "answer",
    ["garbage", '{"score": 1.5}', '{"score": -0.1}', '{"score": "0.5"}', '{"score": true}', "[0.5]", '{"reason": "x"}'],
)
def test_proxy_invalid_twice_is_a_recorded_failure(answer):
    judge = ProxyJudge(ScriptedBackend([answer, answer]))
    (r,) = judge.judge([ProxyInput("hello")])
    assert not r.ok and r.score is None and r.failure and r.attempts == 2
    assert judge.stats.failures == 1
    m = judge.metrics()
    assert m["judge/proxy/failures"] == 1.0 and m["judge/proxy/failure_rate"] == 1.0


def test_batch_only_reasks_the_failures():
    backend = ScriptedBackend(['{"score": 0.1}', "oops", '{"score": 0.9}', '{"score": 0.7}'])
    judge = ProxyJudge(backend)
    out = judge.judge([ProxyInput("a"), ProxyInput("b"), ProxyInput("c")])
    assert [r.score for r in out] == [0.1, 0.7, 0.9]
    assert [r.attempts for r in out] == [1, 2, 1]
    assert len(backend.seen) == 4 and judge.stats.reasks == 1
    assert judge.reset_stats().items == 3 and judge.stats.items == 0


def test_quality_normalisation_and_dimensions_kept():
    scores = dict(engagingness=5, humanness=1, coherence=3, consistency=4, memorability=2)
    judge = QualityJudge(ScriptedBackend([_quality(**scores)]))
    (r,) = judge.judge([QualityInput([("User", "hi")], "how are you", "good, you?", None)])
    assert r.ok and dict(r.dimensions) == scores
    assert r.normalized == {"engagingness": 1.0, "humanness": 0.0, "coherence": 0.5, "consistency": 0.75, "memorability": 0.25}
    assert r.score == pytest.approx(sum(r.normalized.values()) / 5)


@pytest.mark.parametrize(
    "bad",
    [
        {**ALL4, "memorability": 3.5},
        {**ALL4, "coherence": 6},
        {**ALL4, "humanness": 0},
        {k: v for k, v in ALL4.items() if k != "consistency"},
        {**ALL4, "engagingness": "4"},
    ],
)
def test_quality_invalid_never_becomes_a_score(bad):
    judge = QualityJudge(ScriptedBackend([_quality(**bad)] * 2))
    (r,) = judge.judge([QualityInput([], "u", "r", None)])
    assert r.score is None and not r.ok and judge.stats.failures == 1


def test_quality_accepts_integral_floats_and_weights():
    judge = QualityJudge(
        ScriptedBackend([_quality(**{**ALL4, "memorability": 5.0})]),
        weights={d: (1.0 if d == "memorability" else 0.0) for d in QUALITY_DIMENSIONS},
    )
    (r,) = judge.judge([QualityInput([], "u", "r", "m")])
    assert r.score == 1.0 and r.dimensions["memorability"] == 5
    with pytest.raises(ValueError, match="weights"):
        QualityJudge(OfflineBackend(), weights={"coherence": 1.0})


def test_backend_errors_propagate_from_judges():
    with pytest.raises(BackendError, match="scripted back end"):
        ProxyJudge(FailingBackend([])).judge([ProxyInput("x")])


class FlakyBackend(ScriptedBackend):
    """Fails for good (a BackendError) every request whose prompt mentions FAIL; answers the others in order."""

    def generate(self, requests):
        if any("FAIL" in r.prompt for r in requests):
            raise BackendError("flaky", 9, 9, "HTTP 429 after a minute of retries", True)
        return super().generate(requests)


def test_a_judge_in_record_mode_counts_a_failed_request_and_skips_it():
    """The evaluation's judges: a request that exhausted its retries is a recorded judge failure (not asked again,
    never a score); the other items of the batch keep their verdicts. The default mode still raises."""
    items = [QualityInput([], "hi", "reply one", None), QualityInput([], "hi", "FAIL reply", None),
             QualityInput([], "hi", "reply three", None)]
    judge = QualityJudge(FlakyBackend([_quality(**ALL4), _quality(**ALL4)]), backend_failures="record")
    ok1, bad, ok3 = judge.judge(items)
    assert ok1.ok and ok3.ok and ok1.dimensions == ALL4
    assert bad.score is None and bad.failure.startswith("back end: flaky back end") and "HTTP 429" in bad.failure
    assert judge.stats.backend_failures == 1 and judge.stats.failures == 1 and judge.stats.items == 3
    assert judge.metrics()["judge/quality/backend_failures"] == 1.0
    with pytest.raises(BackendError, match="HTTP 429"):
        QualityJudge(FlakyBackend([_quality(**ALL4)] * 3)).judge(items)
    with pytest.raises(ValueError, match="backend_failures must be 'raise' or 'record'"):
        ProxyJudge(FlakyBackend([]), backend_failures="ignore")


def test_offline_judges_use_labels():
    be = OfflineBackend()
    proxy = ProxyJudge(be)
    out = proxy.judge([ProxyInput("whatever", label=1), ProxyInput("My sister lives in Rome.", label=0)])
    assert [r.score for r in out] == [1.0, 0.0]
    quality = QualityJudge(be)
    needed = [["ep", 1, 3]]
    hit, miss, wrong, none_needed = quality.judge(
        [
            QualityInput([], "how is Max?", "r", "The user has a dog named Max.", label_needed=needed, used_ref=("ep", 1, 3)),
            QualityInput([], "how is Max?", "r", None, label_needed=needed, used_ref=None),
            QualityInput([], "how is Max?", "r", "The user likes jazz.", label_needed=needed, used_ref=("ep", 0, 1)),
            QualityInput([], "nice weather", "r", None, label_needed=[], used_ref=None),
        ]
    )
    assert hit.dimensions["memorability"] == 5 and miss.dimensions["memorability"] == 1
    assert hit.score > none_needed.score > miss.score and hit.score > wrong.score
    assert quality.stats.failures == 0


def test_offline_heuristics_are_deterministic_and_ordered():
    be = OfflineBackend()
    proxy = ProxyJudge(be)
    texts = ["hi!", "what time is it?", "My daughter Emma was born in 2019 and I work as a nurse."]
    a = [r.score for r in proxy.judge([ProxyInput(t) for t in texts])]
    b = [r.score for r in proxy.judge([ProxyInput(t) for t in texts])]
    assert a == b and all(0.0 <= s <= 1.0 for s in a)
    assert a[2] > 0.7 > 0.3 > max(a[0], a[1])
    q = QualityJudge(be)
    rel, irrel = q.judge(
        [
            QualityInput([], "I walked my dog Max today", "Max must love walks", "The user has a dog named Max."),
            QualityInput([], "I walked my dog Max today", "Nice", "The user plays the violin in an orchestra."),
        ]
    )
    assert rel.dimensions["memorability"] > irrel.dimensions["memorability"]
