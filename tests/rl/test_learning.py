"""Learning: on the offline persona world, online PPO raises planner precision and trigger recall, on 3 seeds.

The same experiment `scripts/persona_world_learning.py --seeds 0 1 2` prints (its first and last curve rows are
the `before` / `after` checked here). Held-out episodes, fresh memory each, decisions sampled as online with a
fixed seed. Margins measured when this test was written (after - before, seeds 0/1/2): planner precision
+0.290 / +0.485 / +0.363, trigger recall +0.495 / +0.358 / +0.515, planner recall +0.275 / +0.275 / +0.425;
seeds 3-7 gave precision +0.285..+0.425 and trigger recall +0.390..+0.648. The thresholds below are about
half of the smallest margin seen. Re-measured with the ratio anchored on the behaviour policy, Planner rewards
on [0, 1] and two stored memories in the Planner's observation (docs/fidelity.md): precision +0.253 / +0.358 /
+0.305, trigger recall +0.453 / +0.333 / +0.574, planner recall +0.225 / +0.350 / +0.400. With per-decision
random keys (batched play) and supersede on: precision +0.266 / +0.317 / +0.228, trigger recall +0.432 /
+0.383 / +0.584, planner recall +0.450 / +0.325 / +0.325. The offline judge reads the world's labels (an
oracle).
"""

from __future__ import annotations

import dataclasses

import pytest

from icml_jax.experiments.persona_run import PersonaRunConfig, margins, run_persona_world

SEEDS = (0, 1, 2)
MIN_PRECISION_GAIN = 0.15
MIN_TRIGGER_RECALL_GAIN = 0.2


@pytest.fixture(scope="module")
def runs():
    config = PersonaRunConfig()
    # evaluations do not touch the learner, so evaluating only before and after gives the script's numbers
    return {seed: run_persona_world(dataclasses.replace(config, seed=seed, eval_every=config.train_episodes))
            for seed in SEEDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_planner_precision_and_trigger_recall_rise_by_a_clear_margin(runs, seed):
    result = runs[seed]
    gain = margins(result)
    report = f"seed {seed}: before {result.before}, after {result.after}"
    assert gain["eval/planner_precision"] >= MIN_PRECISION_GAIN, report
    assert gain["eval/trigger_recall"] >= MIN_TRIGGER_RECALL_GAIN, report
    # precision is not bought by saving nothing: the facts still get saved
    assert result.after["eval/planner_recall"] >= max(0.6, result.before["eval/planner_recall"]), report
    assert result.after["eval/needed_pairs"] > 50  # enough (query, needed fact) pairs to measure recall
    last = result.update_metrics[-1]
    assert last["update/total_skipped_steps"] == 0 and last["judge/quality_failures"] == 0
