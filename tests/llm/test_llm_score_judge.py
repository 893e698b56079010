"""Judging by score-token probabilities (G-Eval style) on the local back end: every item gets a verdict, equal
to a NumPy reference from the model's own logits, whatever the batch; bounded compilations; no labels read; the
JSON path unchanged for back ends without a score mode."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from icml_jax.llm import LLMRequest, LLMResponse, LocalBackend, OfflineBackend, TokenUsage, make_backend, prompts
from icml_jax.llm.cache import CachedBackend, ResponseCache
from icml_jax.llm.judges import ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.llm import local as local_module
from icml_jax.llm.local import score_token_ids
from icml_jax.llm.registry import check_backend
from icml_jax.llm.types import ScoreRequest, ScoreResponse, judge_mode_of
from icml_jax.models import from_pretrained, load_tokenizer
from icml_jax.models.tokenizer import apply_chat_template
from tests.llm.score_fixtures import DIGITS, build_digit_tokenizer
from tests.models import hf_fixtures as F

HISTORY = (("User", "hi how are you"), ("Assistant", "fine thanks and you"))
QUALITY_ITEMS = [
    QualityInput(HISTORY, "what do i eat for dinner", "pasta you said", "no meat please"),
    QualityInput((), "hello", "hi", None),
    QualityInput(HISTORY * 3, "remember my sister", "your sister is a doctor in paris", "sister is a doctor"),
]
PROXY_ITEMS = [ProxyInput("my sister is a doctor", HISTORY), ProxyInput("hi"), ProxyInput("i like rain", HISTORY)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("score_judge")
    F.build("qwen3", d)
    build_digit_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def parts(model_dir):
    return from_pretrained(model_dir), load_tokenizer(model_dir)


def local(parts, **kw) -> LocalBackend:
    model, tok = parts
    return LocalBackend(model, tok, **kw)


REFERENCE_LENGTH = 512  # every reference prompt is right-padded to this length: one compiled forward pass for all


@functools.cache
def _reference_forward(model):
    """The model's logits for one row (right padding cannot reach earlier positions of a causal model)."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda s, tokens: nnx.merge(graphdef, s)(tokens).logits[0])
    return lambda tokens: forward(state, tokens)


def reference_expected(parts, request: ScoreRequest) -> list[float]:
    """Per cue, the expected level from the model's own float64-softmaxed logits at the cue's last token."""
    model, tok = parts
    messages = [{"role": "system", "content": request.request.system},
                {"role": "user", "content": request.request.prompt}]
    digits = tok.convert_tokens_to_ids(list(DIGITS))
    out = []
    for cue in request.cues:
        ids = tok(apply_chat_template(tok, messages) + cue, add_special_tokens=False)["input_ids"]
        assert len(ids) <= REFERENCE_LENGTH, len(ids)
        row = np.full((1, REFERENCE_LENGTH), tok.pad_token_id, np.int32)
        row[0, :len(ids)] = ids
        logits = np.asarray(_reference_forward(model)(jnp.asarray(row))[len(ids) - 1], np.float64)
        p = np.exp(logits - logits.max())
        q = p[digits] / p[digits].sum()
        out.append(float(q @ np.arange(1, 6)))
    return out


def test_every_item_gets_a_verdict_equal_to_the_numpy_reference(parts):
    backend = local(parts)
    assert backend.judge_mode == "scores"
    quality = QualityJudge(backend)
    verdicts = quality.judge(QUALITY_ITEMS)
    assert all(v.ok for v in verdicts) and quality.stats.failures == 0 and quality.stats.items == 3
    for item, verdict in zip(QUALITY_ITEMS, verdicts):
        ref = reference_expected(parts, prompts.quality_score_request(item.history, item.utterance, item.reply,
                                                                       item.memory))
        got = [verdict.normalized[d] * 4 + 1 for d in prompts.QUALITY_DIMENSIONS]
        np.testing.assert_allclose(got, ref, atol=1e-5)
        assert verdict.score == pytest.approx(np.mean([(r - 1) / 4 for r in ref]), abs=1e-5)
        assert verdict.dimensions == {d: int(r + 0.5) for d, r in zip(prompts.QUALITY_DIMENSIONS, ref)}
    proxy = ProxyJudge(backend)
    for item, verdict in zip(PROXY_ITEMS, proxy.judge(PROXY_ITEMS)):
        (ref,) = reference_expected(parts, prompts.proxy_score_request(item.turn_text, item.history))
        assert verdict.ok and 0.0 <= verdict.score <= 1.0
        assert verdict.score == pytest.approx((ref - 1) / 4, abs=1e-5)


def test_verdict_does_not_depend_on_the_batch(parts):
    alone = [QualityJudge(local(parts)).judge([x])[0] for x in QUALITY_ITEMS]
    for max_batch in (2, 16):
        together = QualityJudge(local(parts, max_batch=max_batch)).judge(QUALITY_ITEMS[::-1])[::-1]
        for a, b in zip(alone, together):
            np.testing.assert_allclose(list(a.normalized.values()), list(b.normalized.values()), atol=1e-5)


def test_compilations_bounded_by_buckets(parts):
    compiled: list[str] = []
    listener = lambda event, secs, fun_name="", **kw: (  # noqa: E731
        compiled.append(fun_name) if event == "/jax/core/compile/backend_compile_duration" else None)
    backend = local(parts, max_batch=4)
    short = ScoreRequest(LLMRequest("hi", system="rate"), ("score:",) * 3)  # 3 rows, length bucket 16
    long = ScoreRequest(LLMRequest(" ".join(["my dog"] * 20)), ("score:", "value score:"))  # 2 rows, bucket 64
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        backend.score([short, long])
        programs = ("score_next_token", "score_after_prefix")
        # several cues each: one request per chunk (4 rows // 3 cues), prefixes in buckets 16 and 64, 3 cue slots
        first = [n for n in compiled if any(p in n for p in programs)]
        backend.score([long, short])  # the same shapes: nothing new
        second = [n for n in compiled if any(p in n for p in programs)]
    finally:
        jax._src.monitoring.unregister_event_duration_listener(listener)
    assert len(first) <= 2 and len(second) == len(first)


def test_cues_on_a_shared_prompt_score_as_each_cue_alone(parts, monkeypatch):
    """The shared-prefix pass (a request's prompt once, each cue against its cache) gives what scoring every
    (prompt, cue) row on its own gives, for mixed requests in one call and chunks of several requests."""
    items = [*QUALITY_ITEMS, QualityInput(HISTORY * 5, "and my brother", "he lives in rome", None)]
    requests = [prompts.quality_score_request(x.history, x.utterance, x.reply, x.memory) for x in items]
    requests.insert(1, prompts.proxy_score_request(PROXY_ITEMS[0].turn_text, PROXY_ITEMS[0].history))
    singles = [ScoreRequest(r.request, (cue,)) for r in requests for cue in r.cues]
    program, runs = local_module._shared_prefix_score_program(), []  # suffix shapes of the shared passes
    monkeypatch.setattr(local_module, "_shared_prefix_score_program",
                        lambda: lambda *args: runs.append(args[4].shape) or program(*args))
    for max_batch, chunks in ((8, [1] * 4), (32, [4])):  # one quality request per chunk; all four in one chunk
        backend = local(parts, max_batch=max_batch)
        runs.clear()
        together = backend.score(requests)
        assert [shape[:2] for shape in runs] == [(n, 5) for n in chunks]
        alone = backend.score(singles)
        assert len(runs) == len(chunks)  # one cue per request: every row on its own
        np.testing.assert_allclose([p for x in together for p in x.probs], [p for x in alone for p in x.probs],
                                   atol=1e-5)
        np.testing.assert_allclose([m for x in together for m in x.mass], [m for x in alone for m in x.mass],
                                   rtol=1e-4)


class Recorder:
    """A back end that records what it is sent: score requests (judge_mode 'scores') or JSON requests."""

    name = "recorder"

    def __init__(self, judge_mode: str | None) -> None:
        if judge_mode is not None:
            self.judge_mode = judge_mode
        self.scored: list[ScoreRequest] = []
        self.sent: list[LLMRequest] = []

    def score(self, requests):
        self.scored.extend(requests)
        return [ScoreResponse(probs=((0.2,) * 5,) * len(r.cues), expected=(3.0,) * len(r.cues),
                              mass=(1.0,) * len(r.cues)) for r in requests]

    def generate(self, requests):
        self.sent.extend(requests)
        return [LLMResponse.answering(r, '{"reason": "ok", "score": 0.5, "engagingness": 4, "humanness": 4, '
                                         '"coherence": 4, "consistency": 4, "memorability": 4}') for r in requests]

    @property
    def usage(self):
        return TokenUsage()

    def close(self):
        pass


def test_score_judges_never_see_labels():
    backend = Recorder("scores")
    ProxyJudge(backend).judge([ProxyInput("my sister is a doctor", HISTORY, label=0.987654)])
    QualityJudge(backend).judge([QualityInput(HISTORY, "what do i eat", "pasta", "no meat",
                                              label_needed=["GOLD-REF-s0t7"], used_ref="USED-REF-s1t2")])
    assert len(backend.scored) == 2 and not backend.sent
    for r in backend.scored:
        seen = " ".join([r.request.prompt, r.request.system or "", *r.cues, repr(dict(r.request.metadata))])
        for leak in ("0.987654", "GOLD-REF", "USED-REF", "label", "used_ref"):
            assert leak not in seen, (leak, r.request.task)


def test_json_path_unchanged_for_backends_without_a_score_mode():
    backend = Recorder(None)
    assert judge_mode_of(backend) == "json"
    item = QualityInput(HISTORY, "what do i eat", "pasta", "no meat", label_needed=["s0:t1"], used_ref="s0:t1")
    (v,) = QualityJudge(backend).judge([item])
    (p,) = ProxyJudge(backend).judge([ProxyInput("my sister is a doctor", HISTORY, label=1.0)])
    assert backend.sent == [
        prompts.quality_judge_request(HISTORY, "what do i eat", "pasta", "no meat", label_needed=["s0:t1"],
                                      used_ref="s0:t1"),
        prompts.proxy_judge_request("my sister is a doctor", HISTORY, label=1.0),
    ]
    assert v.dimensions == dict.fromkeys(prompts.QUALITY_DIMENSIONS, 4) and v.score == pytest.approx(0.75) and p.score == 0.5
    assert judge_mode_of(OfflineBackend()) == "json"
    assert ProxyJudge(OfflineBackend()).judge([ProxyInput("my sister is a doctor", label=1.0)])[0].ok


def test_local_json_mode_generates_and_cached_local_still_scores(parts, tmp_path, monkeypatch):
    json_backend = local(parts, judge_mode="json")
    monkeypatch.setattr(json_backend, "score", lambda *a: pytest.fail("json mode must not score"))
    sent = []
    real = json_backend.generate
    monkeypatch.setattr(json_backend, "generate", lambda rs: sent.extend(rs) or real(rs))
    verdict = ProxyJudge(json_backend, max_attempts=1).judge([ProxyInput("hi")])[0]
    assert sent and sent[0].json_schema is not None and verdict.attempts == 1
    cached = CachedBackend(local(parts), ResponseCache(tmp_path / "c.sqlite"), "ns")
    assert judge_mode_of(cached) == "scores"
    direct = ProxyJudge(local(parts)).judge(PROXY_ITEMS)
    via_cache = ProxyJudge(cached).judge(PROXY_ITEMS)
    assert [v.score for v in via_cache] == pytest.approx([v.score for v in direct], abs=1e-6)


def test_judge_mode_config_default_and_validation(model_dir):
    block = {"kind": "local", "model_dir": str(model_dir), "dtype": "float32"}
    assert make_backend(block).judge_mode == "scores"
    assert make_backend({**block, "judge_mode": "json"}).judge_mode == "json"
    with pytest.raises(ValueError, match=r"config.llm.judge: local back end: judge_mode must be one of"):
        check_backend({**block, "judge_mode": "logits"}, "config.llm.judge")
    with pytest.raises(ValueError, match="judge_mode must be one of"):
        make_backend({**block, "judge_mode": "logits"})


class StubTokenizer:
    """Encodes from a fixed table (what a BPE / SentencePiece tokenizer does with digits)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.table[text]}


def test_score_tokens_handle_leading_space_variants():
    # SmolLM2 / Gemma: " 4" is a space token then "4": the cue ends with the space, the bare digit is read
    split = StubTokenizer({**{str(k): [10 + k] for k in range(1, 6)}, **{f" {k}": [3, 10 + k] for k in range(1, 6)}})
    tokens = score_token_ids(split)
    assert tokens.trailing_space and tokens.ids[:, 0].tolist() == [11, 12, 13, 14, 15] and tokens.mask.all()
    # a single-token " 4" variant counts with "4"
    merged = StubTokenizer({**{str(k): [10 + k] for k in range(1, 6)}, **{f" {k}": [20 + k] for k in range(1, 6)}})
    tokens = score_token_ids(merged)
    assert not tokens.trailing_space and tokens.ids.tolist() == [[10 + k, 20 + k] for k in range(1, 6)]
    with pytest.raises(ValueError, match="'3' is not one token"):
        score_token_ids(StubTokenizer({**split.table, "3": [1, 2]}))
