"""Seed sessions from the data: on cc / msc / gc the synthesis writes its storylines backwards from the first
real session of the episodes the online stage plays, and no evaluation target turn reaches a synthesis prompt;
the persona world keeps its drawn constraints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from icml_jax import main as job
from icml_jax.run import workdir as layout
from icml_jax.data import tfds_builders as tb
from icml_jax.data.protocol import eval_targets
from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.data.stream import _split_names, online_stream
from icml_jax.llm import OfflineBackend
from icml_jax.run.stages.run import Run
from icml_jax.run.stages.synthesize import stage_synthesize, synthesis_seeds
from icml_jax.synthesis import prompts, read_manifest, seeds_from_episodes
from tests.config_files import load_config
from tests.test_main import ROOT, tiny_demo

FIXTURES = ROOT / "tests" / "data" / "fixtures"
DATASETS = {"cc": "cc", "msc": "msc_parlai", "gc": "gapchat"}  # config -> fixture folder


class _Metrics:
    """The metrics sink a stage writes to (rows kept, nothing on disk)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, stage: str, row: dict[str, Any], step: int | None = None) -> None:
        self.rows.append({"stage": stage, **row})


def _prompt_text(request) -> str:
    """Everything of a request a model could read: system, prompt and metadata."""
    return "\n".join([request.system or "", request.prompt, json.dumps(request.metadata or {}, ensure_ascii=False)])


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_real_first_sessions_seed_the_synthesis_and_no_eval_target_reaches_a_prompt(name, tmp_path, monkeypatch):
    config = load_config(name)
    tb.build(config.data.tfds_name, manual_dir=FIXTURES / DATASETS[name], data_dir=tmp_path / "tfds")
    config.mode = ("synthesize",)
    config.data.data_dir, config.data.train_episodes = str(tmp_path / "tfds"), 3
    config.llm.generator = config.llm.judge = {"kind": "offline"}
    config.synthesis.num_seeds, config.synthesis.storylines_per_seed = 2, 2
    config.synthesis.prequels_per_storyline, config.synthesis.heldout_fraction = 2, 0.0
    seen: list[Any] = []
    real_generate = OfflineBackend.generate
    monkeypatch.setattr(OfflineBackend, "generate", lambda self, requests: (seen.extend(requests),
                                                                           real_generate(self, requests))[1])
    row = stage_synthesize(Run(config, tmp_path / "work", _Metrics(), {"done": {}}))
    assert row["storylines_accepted"] == 4 and seen

    # the seeds are the first sessions of the first episodes the online stage plays, in its order
    played = list(dict.fromkeys(e.episode_id for e in online_stream(config)))
    manifest = read_manifest(tmp_path / "work" / layout.SYNTHESIS_DIR)
    assert [s["seed_id"] for s in manifest["seeds"]] == [f"data:{i}" for i in played[:2]]
    episodes = {e.episode_id: e for split in _split_names(config.data.split)
                for e in tb.read_episodes(config.data.tfds_name, split, data_dir=config.data.data_dir)}
    texts = [_prompt_text(r) for r in seen]
    assert not [r for r in seen if r.task == prompts.TASK_SYNTH_SEED]  # the seed session is given, not written
    for episode_id in played[:2]:
        writers = [r.prompt for r in seen if r.task == prompts.TASK_SYNTH_PREQUEL
                   and r.metadata["seed_id"] == f"data:{episode_id}"]
        assert len(writers) == 2 * 2  # storylines x prequels of this seed
        for turn in episodes[episode_id].sessions[0].turns:  # the real first session, in every writer's prompt
            assert all(turn.text in w for w in writers), (episode_id, turn.text)

    # no turn of a final session (the evaluation targets and their opening turn) ever reaches a synthesis prompt
    earlier = {t.text for e in episodes.values() for s in e.sessions[:-1] for t in s.turns}
    finals = [t.text for e in episodes.values() for t in e.sessions[-1].turns if t.text not in earlier]
    assert {t.reference for t in eval_targets(episodes.values())} <= set(finals) and len(finals) >= 6
    leaked = [t for t in finals if any(t in text for text in texts)]
    assert not leaked, leaked[:3]


def test_a_final_session_never_becomes_a_seed():
    """A one-session episode's only session is its final one: skipped; speakers map onto the writers' roles."""
    one = Episode("x", "solo", (Session((Turn("A", "only session, evaluated"),)),))
    two = Episode("x", "pair", (Session((Turn("B", "hi there"), Turn("A", "hello"), Turn("B", "I paint"))),
                                Session((Turn("A", "final session, evaluated"),))))
    seeds = seeds_from_episodes([one, two, two], 5, user_speaker="user", assistant_speaker="assistant")
    assert [s.seed_id for s in seeds] == ["data:pair"] and seeds[0].facts == ()
    assert [(t.speaker, t.text) for t in seeds[0].session.turns] == [
        ("user", "hi there"), ("assistant", "hello"), ("user", "I paint")]
    with pytest.raises(ValueError, match="no episode with at least two sessions"):
        seeds_from_episodes([one], 3, user_speaker="user", assistant_speaker="assistant")


def test_the_persona_world_keeps_drawn_constraints_and_data_seeds_need_built_data(tmp_path):
    demo = tiny_demo()
    assert demo.synthesis.seed_source == "auto" and synthesis_seeds(demo) is None
    demo.synthesis.seed_source = "data"  # the persona world's own first sessions, on request
    seeds = synthesis_seeds(demo)
    assert len(seeds) == min(demo.synthesis.num_seeds, demo.data.train_episodes)
    assert all(s.seed_id.startswith("data:pw-") and s.session.turns for s in seeds)
    config = load_config("cc")
    config.mode = ("synthesize",)
    with pytest.raises(job.ConfigError, match="config.data.data_dir is not set"):
        job.validate(config, tmp_path)
    config.synthesis.seed_source = "world"  # drawn constraints on a real dataset, on request: no data needed
    with pytest.raises(job.ConfigError, match="config.model.path is not set"):
        job.validate(config, tmp_path)
