"""Reply metrics against their references: sacrebleu itself, hand-computed ROUGE-L, scipy's Wilson interval and
exact binomial sign tests."""

from __future__ import annotations

import math

import pytest
import sacrebleu
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import binomtest

from icml_jax.evaluation.metrics import (
    bleu4,
    normalize_judge_score,
    pairwise_preference,
    rouge_l,
    wilson_interval,
)

REPLIES = ["How is Biscuit doing after the vet visit?", "Good luck with the kitchen renovation!",
           "I remember you're vegan now.", "ok"]
REFERENCES = ["How's Biscuit after his trip to the vet?", "Good luck with your kitchen renovation this summer!",
              "Since you're vegan now, how about the lentil place?", "Sounds good, talk soon."]


def test_bleu4_is_sacrebleus_corpus_bleu_with_its_signature():
    got = bleu4(REPLIES, REFERENCES)
    want = sacrebleu.corpus_bleu(REPLIES, [REFERENCES])
    assert got.value == pytest.approx(want.score, abs=1e-9) and got.count == 4
    assert "nrefs:1" in got.signature and "tok:13a" in got.signature and "smooth:exp" in got.signature
    assert bleu4(REFERENCES, REFERENCES).value == pytest.approx(100.0)


def test_rouge_l_is_the_mean_lcs_f_measure_in_percent():
    # LCS("the cat sat on the mat", "the cat on the mat") = 5 tokens: P = 5/5, R = 5/6
    f1 = 2 * 1.0 * (5 / 6) / (1.0 + 5 / 6)
    got = rouge_l(["the cat on the mat", "nothing shared"], ["the cat sat on the mat", "at all"])
    assert got.value == pytest.approx(100 * (f1 + 0.0) / 2) and got.count == 2
    assert rouge_l(["A b C"], ["a B c"]).value == pytest.approx(100.0)  # lower-cased tokens


@pytest.mark.parametrize("metric", [bleu4, rouge_l])
def test_metrics_refuse_mismatched_or_empty_inputs(metric):
    with pytest.raises(ValueError, match="2 replies but 1 references"):
        metric(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no targets"):
        metric([], [])
    with pytest.raises(TypeError, match="target 1"):
        metric(["a", None], ["a", "b"])


def test_judge_scores_map_one_to_five_onto_unit_interval():
    assert [normalize_judge_score(s) for s in (1, 2, 3, 4, 5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for bad in (0, 5.5, float("nan")):
        with pytest.raises(ValueError, match="outside"):
            normalize_judge_score(bad)


def test_sign_test_and_wilson_interval_match_scipy():
    pref = pairwise_preference([1] * 9 + [-1] + [0] * 5)
    assert (pref.wins, pref.ties, pref.losses, pref.n) == (9, 5, 1, 15)
    assert pref.p_value == pytest.approx(2 * 11 / 1024)  # exact two-sided binomial, ties dropped
    ci = binomtest(9, 15).proportion_ci(confidence_level=0.95, method="wilson")
    assert pref.win_ci == pytest.approx((ci.low, ci.high))
    assert pairwise_preference([0, 0]).p_value == 1.0
    with pytest.raises(ValueError, match="-1, 0 or 1"):
        pairwise_preference([1, 2])


@given(st.lists(st.sampled_from([-1, 0, 1]), min_size=1, max_size=60))
def test_preference_rates_sum_to_one_and_lie_in_their_intervals(outcomes):
    pref = pairwise_preference(outcomes)
    assert math.isclose(pref.win_rate + pref.tie_rate + pref.loss_rate, 1.0)
    for rate, (lo, hi) in ((pref.win_rate, pref.win_ci), (pref.tie_rate, pref.tie_ci),
                           (pref.loss_rate, pref.loss_ci)):
        assert 0.0 <= lo <= rate <= hi <= 1.0
    assert 0.0 <= pref.p_value <= 1.0
    assert pairwise_preference([-o for o in outcomes]).p_value == pytest.approx(pref.p_value)  # symmetric


@given(st.integers(0, 200), st.integers(1, 200))
def test_wilson_interval_against_scipy(k, n):
    k = min(k, n)
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
