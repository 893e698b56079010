"""The train/test leak check: the training record read from a run's metrics, and the refusal of a policy that
trained on an evaluated episode's final session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from icml_jax.data.persona_world import PersonaWorldConfig, generate_episodes
from icml_jax.evaluation.leakage import TrainTestLeak, check_no_leak, leaked_episodes, training_record
from icml_jax.run.runlog import METRICS_FILE


def write_rows(workdir: Path, rows: list[dict]) -> Path:
    """A run's metrics.jsonl with these rows (and its policy directory beside it)."""
    (workdir / "policy").mkdir(parents=True)
    (workdir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir / "policy"


def episode_row(n: int, episode_id: str, sessions: int, **extra) -> dict:
    return {"stage": "online", "episode": n, "episode/id": episode_id, "episode/sessions": sessions,
            "episode/turns": 4.0, **extra}


def test_the_record_keeps_the_most_sessions_each_episode_played_up_to_the_policys_step(tmp_path):
    rows = [{"stage": "warmup", "step": 1}, episode_row(1, "a", 2), episode_row(2, "b", 1, **{"update/loss": 0.1}),
            episode_row(3, "a", 3), {"stage": "online", "episode": 3, "update/loss": 0.2},  # a last update's row
            episode_row(4, "c", 2), {"stage": "online", "final": True, "episode": 4}]
    policy = write_rows(tmp_path, rows)
    record = training_record(policy, {"stage": "online", "episodes": 3})
    assert record == {"verified": True, "policy_stage": "online", "online_episodes": 3,
                      "episodes": {"a": 3, "b": 1}}  # episode 4 came after the policy
    assert training_record(policy, {"stage": "warmup"})["episodes"] == {}


@pytest.mark.parametrize("rows, why", [
    ([{"stage": "online", "episode": 1, "episode/turns": 3.0}], "has no id"),
    ([episode_row(1, "a", 2)], "records 1 of the policy's 2 episodes"),
])
def test_a_record_that_cannot_be_read_is_unverified_and_says_why(tmp_path, rows, why):
    record = training_record(write_rows(tmp_path, rows), {"stage": "online", "episodes": 2})
    assert record["verified"] is False and why in record["why"]
    assert not training_record(tmp_path / "elsewhere" / "policy", {"stage": "online", "episodes": 1})["verified"]


def test_an_evaluated_episode_whose_final_session_trained_the_policy_is_refused():
    episodes = generate_episodes(PersonaWorldConfig(num_sessions=3), 3)
    ids = [e.episode_id for e in episodes]
    history = {"episodes": {ids[0]: 2, ids[1]: 2}}  # history sessions only: no leak
    assert leaked_episodes(history, episodes) == []
    check_no_leak(history, episodes, "policy")
    leaky = {"episodes": {ids[0]: 2, ids[1]: 3}}  # the second episode's final session was played
    assert leaked_episodes(leaky, episodes) == [ids[1]]
    with pytest.raises(TrainTestLeak, match=rf"run/policy trained on the final session of 1 of the 3 .*{ids[1]}"):
        check_no_leak(leaky, episodes, "run/policy")
