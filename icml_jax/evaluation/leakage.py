"""The train/test leak check: which episodes trained the evaluated policy, and whether any evaluated episode's
final session (the evaluation's target) was among what it trained on.

The online stage writes each played episode's id and number of sessions played on its row of
`<run>/metrics.jsonl` (`stages.online.training_record`); a policy saved after N online episodes trained on the
rows up to episode N. On real data the stream plays episodes without their final session by default, so the
check passes by construction; `config.data.train_final_sessions` True makes it fail for every evaluated episode
the run played.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from icml_jax.data.schema import Episode
from icml_jax.run.runlog import METRICS_FILE


class TrainTestLeak(ValueError):
    """An evaluated reply would come from a policy that trained on that episode's final session."""


def training_record(policy_dir: Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The episodes that trained the policy in `policy_dir` (metadata `meta`): {"verified": bool, "policy_stage",
    "online_episodes", "episodes": {episode id: most sessions played in any pass}, "why"}.

    A warm-up policy trained on no online episode. An online policy's record is read from the metrics of the
    run it was saved in (`policy_dir`'s parent); rows without ids (runs before the record existed) leave it
    unverified, saying why.
    """
    stage = meta.get("stage", "warmup")
    record: dict[str, Any] = {"verified": True, "policy_stage": stage, "online_episodes": 0, "episodes": {}}
    if stage != "online":
        return record
    seen = int(meta.get("episodes", 0))
    record["online_episodes"] = seen
    path = Path(policy_dir).parent / METRICS_FILE
    if not path.is_file():
        return {**record, "verified": False, "why": f"{path} does not exist"}
    played: dict[str, int] = {}
    rows = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("stage") != "online" or "episode" not in row or row.get("final"):
            continue
        if not isinstance(row["episode"], int) or row["episode"] > seen:
            continue
        if "episode/turns" not in row:  # an update's row after the last episode: no episode of its own
            continue
        rows += 1
        if "episode/id" not in row:
            return {**record, "verified": False,
                    "why": f"{path}: episode {row['episode']}'s row has no id (a run from before the record)"}
        played[str(row["episode/id"])] = max(played.get(str(row["episode/id"]), 0), int(row["episode/sessions"]))
    if rows < seen:
        return {**record, "verified": False, "why": f"{path} records {rows} of the policy's {seen} episodes"}
    record["episodes"] = played
    return record


def leaked_episodes(record: Mapping[str, Any], episodes: Sequence[Episode]) -> list[str]:
    """Ids of the evaluated `episodes` whose final session the recorded training played."""
    played = record.get("episodes", {})
    return [e.episode_id for e in episodes if played.get(e.episode_id, 0) >= len(e.sessions)]


def check_no_leak(record: Mapping[str, Any], episodes: Sequence[Episode], where: str) -> None:
    """Raises TrainTestLeak naming the evaluated episodes whose final session trained the policy at `where`."""
    leaked = leaked_episodes(record, episodes)
    if leaked:
        raise TrainTestLeak(
            f"{where} trained on the final session of {len(leaked)} of the {len(episodes)} evaluated episodes "
            f"({', '.join(leaked[:5])}{', ...' if len(leaked) > 5 else ''}): their scored replies would come from a "
            "policy updated on them. Train with config.data.train_final_sessions=False (the default: each episode "
            "is played without its final session) or evaluate episodes the run did not play")
