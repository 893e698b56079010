"""Grain pipelines: Episodes out, disjoint covering shards, seeded shuffles, resumable iterators."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from icml_jax.data import tfds_builders as tb
from icml_jax.data.persona_world import PersonaWorldConfig, PersonaWorldSource
from icml_jax.data.pipeline import ShardSpec, episode_pipeline, episodes_source, eval_pipeline, tfds_source, train_pipeline
from icml_jax.data.schema import Episode, Session, Turn


def _eps(n: int) -> list[Episode]:
    return [Episode("toy", f"ep-{i}", (Session((Turn("a", str(i)),)),)) for i in range(n)]


def _ids(ds) -> list[str]:
    return [e.episode_id for e in ds]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n", [10, 11])
def test_two_process_shards_are_disjoint_and_cover(shuffle: bool, n: int) -> None:
    """Process 0 and 1 of 2 see disjoint episodes that together are all of them, shuffled or not."""
    src = _eps(n)
    shards = [_ids(episode_pipeline(src, shuffle=shuffle, seed=7, shard_index=i, shard_count=2)) for i in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(e.episode_id for e in src)
    if shuffle:
        assert shards[0] + shards[1] != [e.episode_id for e in src][::2] + [e.episode_id for e in src][1::2]


def test_multi_epoch_shards_stay_disjoint_and_reshuffle() -> None:
    """Every epoch, the two shards partition the data; epochs come in different orders."""
    src = _eps(12)
    a = _ids(train_pipeline(src, seed=3, num_epochs=2, shard_index=0, shard_count=2))
    b = _ids(train_pipeline(src, seed=3, num_epochs=2, shard_index=1, shard_count=2))
    assert len(a) == len(b) == 12
    for epoch in range(2):
        ea, eb = a[epoch * 6 : (epoch + 1) * 6], b[epoch * 6 : (epoch + 1) * 6]
        assert sorted(ea + eb) == sorted(e.episode_id for e in src)
    assert a[:6] != a[6:]


def test_drop_remainder_gives_equal_shards() -> None:
    """Training shards are trimmed to equal sizes so processes step in lockstep."""
    src = _eps(11)
    sizes = [len(_ids(train_pipeline(src, seed=0, num_epochs=1, shard_index=i, shard_count=3))) for i in range(3)]
    assert sizes == [3, 3, 3]
    assert [len(_ids(eval_pipeline(src, shard_index=i, shard_count=3))) for i in range(3)] == [4, 4, 3]


def test_default_shard_is_the_jax_process() -> None:
    """Without explicit arguments the shard is jax.process_index() of jax.process_count() (0 of 1 here)."""
    import jax

    assert ShardSpec.resolve() == ShardSpec(jax.process_index(), jax.process_count())
    assert _ids(eval_pipeline(_eps(5))) == [f"ep-{i}" for i in range(5)]
    with pytest.raises(ValueError, match="shard_index"):
        ShardSpec.resolve(2, 2)


def test_restored_iterator_yields_the_same_next_episodes() -> None:
    """Checkpoint mid-stream (state through JSON), restore into a fresh iterator, get the same continuation."""
    src = PersonaWorldSource(PersonaWorldConfig(seed=5, num_sessions=3), num_episodes=16)
    ds = train_pipeline(src, seed=11, num_epochs=None, shard_index=1, shard_count=2)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = [next(it) for _ in range(6)]  # crosses the epoch boundary (8 per shard per epoch)
    fresh = iter(train_pipeline(src, seed=11, num_epochs=None, shard_index=1, shard_count=2))
    fresh.set_state(state)
    assert [next(fresh) for _ in range(6)] == expected
    assert all(isinstance(e, Episode) for e in expected)


def test_pipeline_over_a_built_tfds_split(tmp_path: Path, fixtures: Path) -> None:
    """ArrayRecord records from TFDS decode to Episodes; shards of a TFDS source also partition it."""
    tb.build("gapchat_episodes/protocol", manual_dir=fixtures / "gapchat", data_dir=tmp_path)
    src = tfds_source("gapchat_episodes/protocol", "test_4", data_dir=tmp_path)
    shards = [list(episode_pipeline(src, shuffle=True, seed=1, shard_index=i, shard_count=2)) for i in range(2)]
    got = {e.episode_id: e for e in itertools.chain(*shards)}
    assert sum(len(s) for s in shards) == len(got) == 3
    from icml_jax.data.sources import parse_gapchat

    assert got == {e.episode_id: e for e in parse_gapchat(fixtures / "gapchat/test/4_session.json")}
    it = iter(eval_pipeline(src))
    first = next(it)
    state = it.get_state()
    rest = list(it)
    again = iter(eval_pipeline(src))
    again.set_state(state)
    assert list(again) == rest and first not in rest


def test_in_memory_source_helper() -> None:
    """episodes_source wraps a list for Grain."""
    assert _ids(eval_pipeline(episodes_source(_eps(3)))) == ["ep-0", "ep-1", "ep-2"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_real_jax_processes_get_disjoint_covering_shards() -> None:
    """Two JAX processes on a loopback coordinator: default shards partition the data (eval) / equal halves (train)."""
    import os
    import subprocess
    import sys

    worker = Path(__file__).with_name("_two_process_worker.py")
    port = str(_free_port())
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen([sys.executable, str(worker), port, str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for i in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    assert [(r["process_index"], r["process_count"]) for r in results] == [(0, 2), (1, 2)]
    everything = [f"pw-0-{i}" for i in range(9)]
    e0, e1 = results[0]["eval"], results[1]["eval"]
    assert not set(e0) & set(e1) and sorted(e0 + e1) == sorted(everything)
    t0, t1 = results[0]["train"], results[1]["train"]
    assert len(t0) == len(t1) == 4 and not set(t0) & set(t1)


def test_iterator_state_checkpoints_with_orbax(tmp_path: Path) -> None:
    """The iterator saves and restores through Orbax (grain.checkpoint.CheckpointSave/Restore)."""
    import grain
    import orbax.checkpoint as ocp

    src = PersonaWorldSource(PersonaWorldConfig(seed=0, num_sessions=2), 9)
    it = iter(train_pipeline(src, seed=1, shard_index=0, shard_count=1))
    for _ in range(3):
        next(it)
    mgr = ocp.CheckpointManager(tmp_path / "ckpt", item_names=("data",))
    mgr.save(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mgr.wait_until_finished()
    expected = [next(it) for _ in range(4)]
    fresh = iter(train_pipeline(src, seed=1, shard_index=0, shard_count=1))
    mgr.restore(3, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
    assert [next(fresh) for _ in range(4)] == expected
    mgr.close()
