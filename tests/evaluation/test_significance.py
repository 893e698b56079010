"""Paired significance tests: the rescored BLEU equals sacrebleu's corpus BLEU, the Monte Carlo sign flip agrees
with exact enumeration, and identical, nearly identical and clearly different systems get the p-values they
must; the targets needed for 80% power match a hand computation and a simulation."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml_jax.evaluation.metrics import bleu4
from icml_jax.evaluation.report import read_targets
from icml_jax.evaluation.significance import (
    MIN_TARGETS,
    PAPER_EFFECT,
    Z_SUM,
    PairedTest,
    bleu_from_stats,
    bleu_test,
    compare_rows,
    format_p,
    main,
    markdown,
    needed_targets,
    power_line,
    power_markdown,
    sentence_bleu_stats,
    sign_flip_p_value,
)

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "vet", "how", "is", "Biscuit", "?", "!", "kitchen", "good"]
REFERENCES = ["How's Biscuit after his trip to the vet?", "Good luck with your kitchen renovation this summer!",
              "Since you're vegan now, how about the lentil place?", "Sounds good, talk soon.",
              "I finally finished the marathon last weekend.", "My sister is moving to Lisbon in May.",
              "We adopted a second cat, her name is Pepper.", "The new job starts on Monday, I'm nervous.",
              "Did you ever try the ramen place downtown?", "My knee is still sore from the hike."]
BLAND = ["That sounds nice.", "Okay, cool.", "I see.", "Tell me more.", "Interesting.", "Nice!", "Hmm, okay.",
         "Sure thing.", "Good to know.", "Right."]
sentence = st.lists(st.sampled_from(WORDS), min_size=0, max_size=12).map(" ".join)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(sentence, sentence), min_size=1, max_size=6))
def test_summed_sentence_statistics_rescore_to_sacrebleus_corpus_bleu(pairs):
    hyps, refs = [h for h, _ in pairs], [r for _, r in pairs]
    got = bleu_from_stats(sentence_bleu_stats(hyps, refs).sum(0))
    assert got == pytest.approx(bleu4(hyps, refs).value, abs=1e-9)


def test_monte_carlo_sign_flip_matches_exact_enumeration():
    d = np.array([3.0, -1.0, 2.5, 0.0, 4.0, -2.0, 1.0, 1.5, -0.5, 2.0])
    flipped = np.array([abs(np.dot(s, d)) for s in itertools.product([-1.0, 1.0], repeat=d.size)]) / d.size
    exact = np.mean(flipped >= abs(d.mean()) - 1e-12)
    assert sign_flip_p_value(d, samples=20_000, seed=3) == pytest.approx(exact, abs=0.01)
    assert 0.05 < exact < 0.5  # a case where the p-value is neither trivially 0 nor 1


def test_identical_systems_differ_by_nothing_with_p_one():
    t = bleu_test(BLAND, BLAND, REFERENCES, samples=200)
    assert t.delta == 0.0 and t.p_value == 1.0 and t.n == len(REFERENCES)
    assert sign_flip_p_value(np.zeros(7), samples=200) == 1.0


def test_systems_differing_on_one_target_are_not_significant():
    other = [*BLAND[:-1], REFERENCES[-1]]
    t = bleu_test(other, BLAND, REFERENCES, samples=500)
    assert t.delta > 0 and t.p_value == 1.0  # one swap of ten: every sample's difference is 0 or the observed one
    d = np.zeros(10)
    d[4] = 30.0
    assert sign_flip_p_value(d, samples=500) == 1.0


def test_a_clearly_better_system_gets_a_small_p_value():
    t = bleu_test(REFERENCES, BLAND, REFERENCES, samples=2000, seed=1)
    assert t.system == pytest.approx(100.0) and t.delta > 50
    assert t.p_value < 0.01  # exact: 2 / 2**10 of the swaps reach the observed difference


def _rows(replies, judge_scale=0.5):
    return [{"episode_id": "e", "session": 5, "turn": i, "history_sha256": f"h{i}", "utterance": f"u{i}",
             "reference": ref, "reply": reply, "rouge_l": 10.0 * i, "bertscore_f1": 50.0,
             "judge": {"consistency": judge_scale, "coherence": judge_scale, "memorability": judge_scale,
                       "engagingness": judge_scale, "humanness": judge_scale} if i else None}
            for i, (reply, ref) in enumerate(zip(replies, REFERENCES))]


def test_compare_rows_tests_every_metric_on_shared_targets_and_skips_missing_verdicts():
    tests = {t.metric: t for t in compare_rows(_rows(BLAND, 0.75), _rows(BLAND, 0.25), samples=2000)}
    assert {"BLEU-4", "ROUGE-L", "BERTScore", "Consistency", "Humanness"} <= tests.keys()
    assert tests["Consistency"].n == len(REFERENCES) - 1  # target 0 has no verdict on either side
    # nine equal differences: exactly 2 of the 2**9 sign patterns reach the observed mean
    assert tests["Consistency"].delta == pytest.approx(50.0) and tests["Consistency"].p_value < 0.01
    assert tests["ROUGE-L"].delta == 0.0 and tests["ROUGE-L"].p_value == 1.0


def test_misaligned_targets_raise():
    a, b = _rows(BLAND), _rows(BLAND)
    b[3]["reference"] = "something else"
    with pytest.raises(ValueError, match="reference"):
        compare_rows(a, b, samples=10)
    with pytest.raises(ValueError, match="different targets"):
        compare_rows(a[:-1], b, samples=10)


def test_read_targets_names_the_bad_line_and_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="targets.jsonl"):
        read_targets(tmp_path)
    (tmp_path / "targets.jsonl").write_text('{"a": 1}\n\n{"b": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"targets.jsonl:3: not JSON"):
        read_targets(tmp_path)


def test_cli_prints_one_row_per_system(tmp_path, capsys):
    for name, replies in (("base", BLAND), ("ours", REFERENCES)):
        (tmp_path / name / "eval").mkdir(parents=True)
        (tmp_path / name / "eval" / "targets.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in _rows(replies)), encoding="utf-8")
    main(["--baseline", str(tmp_path / "base" / "eval"), "--systems", str(tmp_path / "ours" / "eval"),
          "--samples", "200"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| system (minus ") and "BLEU-4" in out[0] and len(out) == 3 + 1 + 3
    assert out[2].startswith(f"| {tmp_path / 'ours'} | +")
    assert out[3] == "" and out[4].startswith("| targets needed for 80% power (minus ") and "BLEU-4" in out[4]
    assert out[6].startswith(f"| {tmp_path / 'ours'} | ") and "(n 10)" in out[6]


@pytest.mark.parametrize("p, shown", [(0.8765, "p 0.88"), (0.01, "p 0.01"), (0.0099, "p 0.0099"),
                                      (0.00042, "p 0.0004"), (1 / 10_001, "p 0.0001")])
def test_small_p_values_are_never_printed_as_zero(p, shown):
    assert format_p(p) == shown


def test_needed_targets_match_a_hand_computation():
    z = NormalDist()
    assert z.inv_cdf(0.975) == pytest.approx(1.959964, abs=1e-6) and z.inv_cdf(0.8) == pytest.approx(0.841621, abs=1e-6)
    assert Z_SUM == pytest.approx(2.801585, abs=1e-6)
    assert (2.8016 * 9.5 / 4) ** 2 == pytest.approx(44.27, abs=0.01)
    assert needed_targets(9.5, 4.0) == needed_targets(9.5, -4.0) == 45
    assert needed_targets(13.2, 4.0) == math.ceil((Z_SUM * 3.3) ** 2) == 86  # the "about 86 targets"
    assert needed_targets(0.0, 1.0) == MIN_TARGETS == 6  # no spread: the sign-flip test's floor, p >= 2 / 2^n
    assert needed_targets(0.1, 5.0) == 6 and 2 / 2**5 > 0.05 > 2 / 2**6


def test_a_zero_or_unknown_effect_needs_no_finite_number_of_targets():
    assert needed_targets(3.0, 0.0) is None and needed_targets(None, 1.0) is None and needed_targets(1.0, None) is None
    t = PairedTest("NLL", 2.0, 2.0, 28, 1.0, sd=0.5)
    assert t.needed_observed is None and t.needed_paper is None and t.powered is None
    assert "∞ at the observed 0.0000; the paper reports no effect" in power_line(t)  # nats: 4 decimals


def test_at_the_needed_number_of_targets_the_sign_flip_test_rejects_about_80_percent():
    n = needed_targets(1.0, 0.5)
    assert n == 32
    rng = np.random.default_rng(7)
    rejected = [sign_flip_p_value(rng.normal(0.5, 1.0, n), samples=500, seed=i) < 0.05 for i in range(300)]
    assert np.mean(rejected) == pytest.approx(0.80, abs=0.08)


def test_the_paper_effects_are_table_1s_gapchat_gaps():
    assert PAPER_EFFECT == {"BLEU-4": 0.50, "ROUGE-L": 0.59, "BERTScore": 4.44}
    t = PairedTest("BERTScore", 50.0, 46.0, 28, 0.2, sd=13.2)
    assert t.needed_observed == 86 and t.needed_paper == 70 and t.powered is False
    assert dataclasses.replace(t, n=70).powered is True and dataclasses.replace(t, metric="NLL").powered is None
    assert power_line(t) == ("BERTScore: n 28, sd 13.20; targets needed for 80% power at two-sided alpha 0.05: "
                             "86 at the observed 4.00, 70 at the paper's 4.44 (underpowered)")


def test_compare_rows_fills_sd_and_needed_targets_for_every_metric_including_memory_gain_and_nll():
    ours, base = _rows(BLAND, 0.75), _rows(BLAND, 0.25)
    for i, (a, b) in enumerate(zip(ours, base)):
        a["bertscore_f1"] = 50.0 + 3.0 * (i % 4)
        a["memory_gain"], b["memory_gain"] = float(i % 3), 0.0
        a["nll"], b["nll"] = 2.0 + 0.1 * i, 2.1 + 0.1 * i + 0.3 * (i % 2)
    tests = {t.metric: t for t in compare_rows(ours, base, samples=500)}
    for metric, diff in (("BERTScore", 3.0 * (np.arange(10) % 4)), ("Memory gain", np.arange(10) % 3.0),
                         ("NLL", -0.1 - 0.3 * (np.arange(10) % 2))):
        t = tests[metric]
        assert t.n == 10 and t.delta == pytest.approx(diff.mean())
        assert t.sd == pytest.approx(diff.std(ddof=1))
        assert t.needed_observed == max(MIN_TARGETS, math.ceil((Z_SUM * diff.std(ddof=1) / abs(diff.mean())) ** 2))
    assert tests["BERTScore"].needed_paper == max(MIN_TARGETS, math.ceil((Z_SUM * tests["BERTScore"].sd / 4.44) ** 2))
    assert tests["Memory gain"].needed_paper is None and tests["NLL"].powered is None
    assert tests["ROUGE-L"].sd == 0.0 and tests["ROUGE-L"].needed_observed is None  # identical: a zero effect
    assert tests["Consistency"].sd == 0.0 and tests["Consistency"].needed_observed == 6  # a constant difference
    bleu = tests["BLEU-4"]  # identical replies: every swap changes nothing
    # sd 0 from identical systems says nothing of the spread under the paper's effect: unknown, not "powered"
    assert bleu.sd == 0.0 and bleu.needed_observed is None and bleu.needed_paper is None and bleu.powered is None
    table = power_markdown({"ours": list(tests.values())}, "base").splitlines()
    assert table[0].startswith("| targets needed for 80% power (minus base): observed / paper (n) | BLEU-4 |")
    header, row = ([c.strip() for c in line.strip("|").split("|")][1:] for line in (table[0], table[2]))
    cells = dict(zip(header, row, strict=True))
    assert cells["BLEU-4"] == "∞ / - (n 10)" and cells["Consistency"] == "6 / - (n 9)"
    assert cells["NLL"] == f"{tests['NLL'].needed_observed} / - (n 10)"
    differences = markdown({"ours": list(tests.values())}, "base")  # nats per token in 4 decimals, the rest 2
    assert f"{tests['Memory gain'].delta:+.4f} (p " in differences and f"{tests['BERTScore'].delta:+.2f} (p " in differences


def test_bleus_sd_from_the_swaps_is_the_per_target_spread():
    t = bleu_test(REFERENCES, BLAND, REFERENCES, samples=2000, seed=1)
    assert t.sd > 0 and t.needed_observed is not None and t.needed_paper > t.needed_observed
    # for a mean of per-target differences the same estimate is their root mean square
    d = np.random.default_rng(0).normal(1.0, 3.0, 40)
    signs = np.random.default_rng(1).choice([-1.0, 1.0], size=(20_000, d.size))
    assert (signs @ d / d.size).std() * math.sqrt(d.size) == pytest.approx(np.sqrt(np.mean(d**2)), rel=0.02)
