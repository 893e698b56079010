"""The likelihood reward: the squashing, the gold turns it reads (the next one; the most similar of later sessions,
never the evaluation's final session), both judges on a likelihood back end that favours a memory sharing the gold
turn's words, and the online learner rewarding from it: the truth reward carries the gain a save later gives."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.llm import OfflineBackend
from icml_jax.llm.judges import GoldTarget, ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.llm.prompts import TASK_CONDENSE, TASK_REPLY
from icml_jax.llm.types import LoglikResponse, TokenUsage
from icml_jax.rl.config import RewardConfig
from icml_jax.rl.likelihood import (NO_CONTROL, NO_LATER_TURN, NO_NEXT_TURN, LikelihoodProxyJudge,
                                    LikelihoodQualityJudge, control_texts, information_value, later_targets,
                                    likelihood_score, next_gold_turn, reward_judges)
from tests.baselines.helpers import Recording
from tests.rl.conftest import force_policies

NURSE, WEEK, NIGHTS = "I work as a nurse.", "How should I plan my week?", "Plan around your night shifts as a nurse."
TIRED, HELLO = "I'm a bit tired today.", "Hello there!"
EPISODE = Episode("test", "ep", (
    Session((Turn("A", NURSE), Turn("B", "Nice!"))),
    Session((Turn("A", TIRED), Turn("B", "Rest well."), Turn("A", WEEK), Turn("B", NIGHTS))),
    Session((Turn("A", HELLO), Turn("B", "Hi."))),
))


class MemoryOverlap:
    """A likelihood back end: each continuation token costs 1 nat, 0.8 when the prompt's <memory> block shares a
    word of 4+ letters with the continuation (a memory that helps predict the gold turn); records the calls."""

    name = "memory-overlap"
    usage = TokenUsage()

    def __init__(self) -> None:
        self.calls: list[list] = []

    def close(self) -> None:
        pass

    def loglik(self, requests):
        self.calls.append(list(requests))
        out = []
        for r in requests:
            memory = " ".join(re.findall(r"<memory>(.*?)</memory>", r.request.prompt, re.S)).lower()
            words = r.continuation.split()
            helps = bool(set(re.findall(r"[a-z]{4,}", memory)) & set(re.findall(r"[a-z]{4,}", r.continuation.lower())))
            out.append(LoglikResponse(-(0.8 if helps else 1.0) * len(words), len(words)))
        return out


def test_a_gain_becomes_a_reward_in_0_1_and_no_gain_is_one_half():
    assert likelihood_score(0.0, 0.1) == 0.5
    assert likelihood_score(0.1, 0.1) == pytest.approx(1 / (1 + math.exp(-1)))
    assert likelihood_score(-0.1, 0.1) == pytest.approx(1 - likelihood_score(0.1, 0.1))
    assert likelihood_score(1e9, 0.1) == pytest.approx(1.0) and likelihood_score(-1e9, 0.1) == pytest.approx(0.0)


def test_the_gold_turns_read_are_the_next_one_and_the_most_similar_of_later_sessions():
    assert next_gold_turn(EPISODE, 0, 0) == "Nice!" and next_gold_turn(EPISODE, 0, 1) is None
    (best,) = later_targets(EPISODE, 0, NURSE, 1)
    assert best == GoldTarget((("A", TIRED), ("B", "Rest well.")), WEEK, NIGHTS)  # shares "nurse"
    assert len(later_targets(EPISODE, 0, NURSE, 5)) == 1  # turns sharing no word are left out
    assert later_targets(EPISODE, 1, TIRED, 2) == []  # nothing later shares a word
    assert later_targets(EPISODE, 2, HELLO, 2) is None  # no later session
    # matched by the utterance alone (what a Trigger sees): "nurse" is only in the gold turn, so nothing matches
    assert later_targets(EPISODE, 0, NURSE, 5, match="utterance") == []
    assert later_targets(EPISODE, 0, "My week is busy.", 5, match="utterance") == [best]  # "week": WEEK's turn
    with pytest.raises(ValueError, match="match must be one of"):
        later_targets(EPISODE, 0, NURSE, 1, match="gold")


def test_the_quality_judge_scores_the_recalled_memorys_gain_for_the_gold_next_turn():
    backend = MemoryOverlap()
    judge = LikelihoodQualityJudge(backend, scale=0.1)
    items = [QualityInput((), WEEK, "reply", "The user works night shifts.", gold_next=NIGHTS),
             QualityInput((), WEEK, "reply", "The user likes tea.", gold_next=NIGHTS),
             QualityInput((), WEEK, "reply", None, gold_next=NIGHTS),
             QualityInput((), WEEK, "reply", "The user works night shifts.", gold_next=None)]
    helps, unrelated, none, no_next = judge.judge(items)
    assert helps.score == pytest.approx(likelihood_score(0.2, 0.1)) and unrelated.score == 0.5 and none.score == 0.5
    assert no_next.score is None and no_next.failure == NO_NEXT_TURN
    assert len(backend.calls) == 1 and len(backend.calls[0]) == 3  # two memories, one shared prompt without
    assert judge.stats.items == 4 and judge.stats.failures == 1


def test_the_proxy_judge_scores_a_turn_by_the_later_gold_turns_it_would_help_predict():
    backend = MemoryOverlap()
    judge = LikelihoodProxyJudge(backend, scale=0.1)
    nurse, tired, hello = (ProxyInput(t, later=later_targets(EPISODE, s, t, 2))
                           for s, t in ((0, NURSE), (1, TIRED), (2, HELLO)))
    out = judge.judge([nurse, tired, hello])
    assert out[0].score == pytest.approx(information_value(0.2, 0.1)) == 1.0  # "nurse" makes NIGHTS likelier
    assert out[1].ok and out[1].score == 0.0  # "tired" shares no word with session 2: worth nothing
    assert out[2].score is None and out[2].failure == NO_LATER_TURN  # the last session: unknown, masked
    assert len(backend.calls) == 1 and len(backend.calls[0]) == 2  # NIGHTS with the nurse turn, and without
    again = judge.judge([nurse, ProxyInput("I am a nurse too.", later=later_targets(EPISODE, 0, NURSE, 2))])
    assert [r.score for r in again] == [1.0, 1.0]
    assert len(backend.calls[1]) == 1  # only the new memory's prompt: the rest is cached
    small = judge.judge([ProxyInput("The user is a nurse.", later=[GoldTarget((), WEEK, "nurse " * 9 + "ok")])])
    assert small[0].score == pytest.approx(information_value(0.2 * 9 / 10, 0.1)) == 1.0
    assert information_value(0.03, 0.1) == pytest.approx(0.3) and information_value(-0.5, 0.1) == 0.0


def test_the_calibrated_proxy_subtracts_a_control_texts_gain_on_the_same_later_turns():
    backend = MemoryOverlap()
    judge = LikelihoodProxyJudge(backend, scale=0.1, control=True)
    later = later_targets(EPISODE, 0, NURSE, 2)
    out = judge.judge([ProxyInput(NURSE, later=later, control="I like green tea."),  # the control gains nothing
                       ProxyInput(NURSE, later=later, control="My sister is a nurse."),  # as much as the turn
                       ProxyInput(NURSE, later=later),  # no control: unknown, masked
                       ProxyInput(TIRED, later=later_targets(EPISODE, 1, TIRED, 2), control="x"),  # no word shared
                       ProxyInput(HELLO, later=None, control="x")])
    assert [r.score for r in out] == [1.0, 0.0, None, 0.0, None]
    assert out[2].failure == NO_CONTROL and out[4].failure == NO_LATER_TURN
    assert "less the control's +0.2000" in out[1].reason
    assert judge.stats.failures == 2
    plain = LikelihoodProxyJudge(MemoryOverlap(), scale=0.1).judge([ProxyInput(NURSE, later=later, control="nurse")])
    assert plain[0].score == 1.0  # without `control` the control text is not read


def test_a_control_is_the_closest_length_text_of_another_episode():
    texts = ["one two three", "a b", "w x y z", "p q r"]
    assert control_texts(texts, ["e1", "e1", "e2", "e2"]) == ["p q r", "p q r", "one two three", "one two three"]
    assert control_texts(texts, ["e1", "e2", "e3", "e4"]) == ["p q r", "one two three", "one two three",
                                                             "one two three"]  # ties: the first
    assert control_texts(["a", "b"], ["e", "e"]) == [None, None] and control_texts([], []) == []


def test_reward_judges_by_source_and_their_checks():
    offline = OfflineBackend()
    proxy, quality = reward_judges(RewardConfig(), judge=offline, generator=offline)
    assert isinstance(proxy, ProxyJudge) and isinstance(quality, QualityJudge)
    proxy, quality = reward_judges(RewardConfig(source="likelihood", likelihood_scale=0.2, likelihood_control=True),
                                   judge=offline, generator=MemoryOverlap())
    assert isinstance(proxy, LikelihoodProxyJudge) and isinstance(quality, LikelihoodQualityJudge)
    assert proxy.control and proxy.scale == quality.scale == 0.2
    assert not reward_judges(RewardConfig(source="likelihood"), judge=None, generator=MemoryOverlap())[0].control
    with pytest.raises(ValueError, match="the likelihood reward needs a back end that scores continuations"):
        reward_judges(RewardConfig(source="likelihood"), judge=offline, generator=offline)
    with pytest.raises(ValueError, match="RewardConfig.source must be one of"):
        RewardConfig(source="bleu")
    with pytest.raises(ValueError, match="likelihood_scale must be > 0"):
        RewardConfig(likelihood_scale=0.0)
    with pytest.raises(ValueError, match="RewardConfig.likelihood_match must be one of"):
        RewardConfig(likelihood_match="gold")
    with pytest.raises(ValueError, match="RewardConfig.likelihood_control must be a bool"):
        RewardConfig(likelihood_control=1)


def test_the_learner_rewards_from_likelihoods_and_the_truth_reward_carries_the_later_gain(tmp_path, monkeypatch):
    """Forced policy: save every turn, recall the oldest memory (the nurse turn, once saved). Recalled for the week
    question, it makes the gold next turn (NIGHTS) likelier, and with multi_trigger "max" its save's truth reward
    carries that gain's reward; the turns of the last session have no proxy (masked, counted)."""
    from icml_jax.experiments.persona_run import PersonaRunConfig, build_learner
    from icml_jax.rl.learner import OnlineLearner

    force_policies(monkeypatch, lambda cand_mask: np.where(cand_mask.sum(-1) >= 2, 1, 0))  # oldest; 0: none
    run = PersonaRunConfig()
    reward = dataclasses.replace(run.reward, source="likelihood", multi_trigger="max")
    base, tokenizer = build_learner(dataclasses.replace(run, reward=reward), tmp_path)
    proxy, quality = reward_judges(reward, judge=None, generator=MemoryOverlap())
    generator = Recording()
    learner = OnlineLearner(base.policies, tokenizer, base.store, generator, proxy_judge=proxy,
                            quality_judge=quality, config=base.config)
    episode = Episode("test", "ep", tuple(Session(tuple(Turn("user", t.text) for t in s.turns))
                                          for s in EPISODE.sessions))
    out = learner.run_episode(episode)
    # no judge reads a reply: none is written (the turns' notes still are), every receipt's reply is empty
    assert not learner.writes_replies and not generator.tasks(TASK_REPLY) and generator.tasks(TASK_CONDENSE)
    assert [r.reply for r in learner.last_receipts] == [""] * 8
    assert out["judge/proxy_failures"] == 2  # session 2's two turns
    assert out["judge/quality_failures"] == 3  # each session's last turn has no gold next turn
    rewards = {s.decision_id.split("/", 2)[2]: s for s in learner.last_finalized}
    nurse = rewards["0/0/planner"]
    assert nurse.r_proxy == 1.0 and nurse.triggered  # NURSE as memory makes NIGHTS likelier
    assert nurse.r_qual_future == pytest.approx(likelihood_score(0.2, 0.1))  # recalled for WEEK
    assert nurse.reward == pytest.approx(1.0 - reward.save_cost + reward.truth_lambda * likelihood_score(0.2, 0.1))
    assert rewards["0/1/planner"].r_proxy == 0.0 and rewards["1/0/planner"].r_proxy == 0.0


def test_the_learner_calibrates_the_proxy_with_another_episodes_turn_and_matches_as_configured(tmp_path, monkeypatch):
    """likelihood_control: two copies of one conversation played in lockstep as two episodes, so each turn's
    control is its copy's turn, which gains as much: every proxy is 0 (the nurse turn's is 1.0 uncalibrated).
    Alone, a turn has no control: masked and counted. likelihood_match reaches later_targets."""
    from icml_jax.experiments.persona_run import PersonaRunConfig, build_learner
    from icml_jax.rl import learner as learner_module
    from icml_jax.rl.learner import OnlineLearner

    force_policies(monkeypatch, lambda cand_mask: np.zeros(cand_mask.shape[:-1], np.int32))  # recall nothing
    matches = []
    monkeypatch.setattr(learner_module, "later_targets",
                        lambda *a, match: matches.append(match) or later_targets(*a, match=match))
    run = PersonaRunConfig()
    reward = dataclasses.replace(run.reward, source="likelihood", likelihood_control=True, likelihood_match="pair")
    base, tokenizer = build_learner(dataclasses.replace(run, reward=reward, update_every=2), tmp_path)
    proxy, quality = reward_judges(reward, judge=None, generator=MemoryOverlap())
    learner = OnlineLearner(base.policies, tokenizer, base.store, Recording(), proxy_judge=proxy,
                            quality_judge=quality, config=base.config)
    copies = [Episode("test", name, tuple(Session(tuple(Turn("user", t.text) for t in s.turns))
                                          for s in EPISODE.sessions)) for name in ("ep1", "ep2")]
    outs = learner.run_episodes(copies)
    assert sum(o.get("judge/proxy_failures", 0) for o in outs) == 4  # session 2 of each: no later turn
    assert set(matches) == {"pair"} and len(matches) == 16
    assert {s.r_proxy for s in learner.last_finalized if s.decision_id.endswith("planner")} == {0.0}
    learner.run_episode(dataclasses.replace(copies[0], episode_id="ep3"))  # no update: the counts stay
    # alone: the nurse turn (the one turn sharing a word with a later turn) has no control; the rest score 0
    assert learner.proxy_judge.stats.failures == 4 + 2 + 1


def test_the_evaluations_test_time_learner_never_sees_the_final_session():
    """eval.learn: the learner plays the history sessions of an evaluated episode, whose final session holds the
    scored targets; it gets the episode without that session, so no reward can read a target's gold turn."""
    from types import SimpleNamespace

    from icml_jax.evaluation.protocol import LearningAgent

    seen = []

    class Learner:
        agent = SimpleNamespace(config=None)

        def step_turns(self, turns):
            seen.extend(episode for episode, *_ in turns)
            return [SimpleNamespace(trigger=SimpleNamespace(prob=1.0), memory_used=None,
                                    planner=SimpleNamespace(save=False)) for _ in turns]

    LearningAgent(Learner()).observe("u", EPISODE, 1, 0, ())
    (played,) = seen
    assert played.sessions == EPISODE.sessions[:-1] and later_targets(played, 1, "Hello hi", 2) is None
