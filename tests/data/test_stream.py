"""Episode streams of online runs: persona world and built TFDS splits, resumable, with up-front data checks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import ml_collections
import pytest

from icml_jax.data import tfds_builders as tb
from icml_jax.data.persona_world import PersonaWorldConfig, default_config, generate_episodes
from icml_jax.data.stream import (
    EVAL_OFFSET,
    TfdsEpisodeStream,
    check_data_config,
    clip_sessions,
    held_out_episodes,
    online_stream,
    user_speaker,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE = "gapchat_episodes/sample"  # the real GapChat sample: test_4 has 20 episodes, test_5 40


@pytest.fixture(scope="module")
def built(tmp_path_factory, shared_data: Path) -> Path:
    """A TFDS data_dir holding the real GapChat sample, built once for this module."""
    data_dir = tmp_path_factory.mktemp("tfds")
    tb.build(SAMPLE, manual_dir=shared_data / "gapchat", data_dir=data_dir)
    return data_dir


def persona_config(train: int = 7, held_out: int = 3, **world) -> ml_collections.ConfigDict:
    """The slice of a run config the stream reads, for the persona world."""
    w = default_config()
    w.num_sessions = 2
    for key, value in world.items():
        w[key] = value
    return ml_collections.ConfigDict(dict(seed=0, data=dict(
        name="persona_world", tfds_name=None, split=None, data_dir=None, world=w,
        train_episodes=train, eval_episodes=held_out)))


def real_config(data_dir: Path | None, *, split: str = "test_4", train: int = 30, seed: int = 3,
                name: str = "gapchat", tfds_name: str = SAMPLE) -> ml_collections.ConfigDict:
    """The slice of a run config the stream reads, for a built real dataset."""
    config = persona_config(train=train)
    config.seed = seed
    config.data.name, config.data.tfds_name, config.data.split = name, tfds_name, split
    config.data.data_dir = None if data_dir is None else str(data_dir)
    return config


def _ids(episodes) -> list[str]:
    return [e.episode_id for e in episodes]


def _json(state):
    return json.loads(json.dumps(state))


# ------------------------------------------------------------------------------------------------ persona world


def test_persona_stream_is_generate_episodes_and_held_out_starts_at_offset() -> None:
    config = persona_config(train=7, held_out=3)
    world = PersonaWorldConfig.from_config(config.data.world)
    stream = online_stream(config)
    assert stream.total == 7
    assert list(stream) == generate_episodes(world, 7)
    with pytest.raises(StopIteration):
        next(stream)
    assert held_out_episodes(config) == generate_episodes(world, 3, start_index=EVAL_OFFSET)
    assert user_speaker(config) == world.user_speaker == "user"
    assert user_speaker(persona_config(user_speaker="me")) == "me"


def test_persona_state_round_trip_is_json_and_continues() -> None:
    config = persona_config(train=7)
    stream = online_stream(config)
    head = [next(stream) for _ in range(3)]
    state = stream.get_state()
    assert state["kind"] == "persona_world" and state["next"] == 3
    assert _json(state) == state and len(json.dumps(state)) < 2000
    fresh = online_stream(config)
    fresh.set_state(_json(state))
    assert head + list(fresh) == generate_episodes(PersonaWorldConfig.from_config(config.data.world), 7)
    # a longer run resumes at the same episode; a shorter one that ends before it cannot
    longer = online_stream(persona_config(train=9))
    longer.set_state(state)
    assert _ids(longer) == _ids(generate_episodes(PersonaWorldConfig.from_config(config.data.world), 9))[3:]
    shorter = online_stream(persona_config(train=2))
    with pytest.raises(ValueError, match="train_episodes"):
        shorter.set_state(state)


def test_persona_state_of_another_world_is_refused_naming_the_field() -> None:
    state = online_stream(persona_config()).get_state()
    other = online_stream(persona_config(seed=1))
    with pytest.raises(ValueError, match=r"world\.seed differs") as err:
        other.set_state(state)
    assert "num_sessions" not in str(err.value)
    with pytest.raises(ValueError, match="'gapchat' stream, this stream is 'persona_world'"):
        online_stream(persona_config()).set_state({**state, "kind": "gapchat"})


# ------------------------------------------------------------------------------------------------ real data


def test_real_stream_repeats_epochs_in_new_orders(built: Path) -> None:
    """30 episodes from a 20-episode split: one full permutation, then a new order of the next epoch."""
    config = real_config(built, train=30)
    stream = online_stream(config)
    assert stream.total == 30 and isinstance(stream, TfdsEpisodeStream) and stream.episodes_per_epoch == 20
    ids = _ids(stream)
    all_ids = _ids(tb.read_episodes(SAMPLE, "test_4", data_dir=built))
    assert len(ids) == 30 and sorted(ids[:20]) == sorted(all_ids)
    assert len(set(ids[20:])) == 10 and ids[20:] != ids[:10]
    assert _ids(online_stream(config))[:5] == ids[:5]  # seeded
    assert _ids(online_stream(real_config(built, train=30, seed=4)))[:20] != ids[:20]
    assert user_speaker(config) is None and held_out_episodes(config) == []


def test_real_state_round_trip_across_the_epoch_boundary(built: Path) -> None:
    config = real_config(built, train=30)
    expected = _ids(online_stream(config))
    stream = online_stream(config)
    head = [next(stream) for _ in range(15)]
    state = stream.get_state()
    assert _json(state) == state and len(json.dumps(state)) < 1000
    assert state["kind"] == "gapchat" and state["yielded"] == 15 and state["split"] == "test_4"
    fresh = online_stream(config)
    fresh.set_state(_json(state))
    rest = list(fresh)  # episodes 15..29: the last 5 of epoch one, then 10 of epoch two
    assert _ids(head) + _ids(rest) == expected
    assert fresh.get_state()["yielded"] == 30
    with pytest.raises(StopIteration):
        next(fresh)
    end = online_stream(config)
    end.set_state(fresh.get_state())
    assert list(end) == []


def test_real_state_of_another_config_is_refused_naming_what_differs(built: Path) -> None:
    stream = online_stream(real_config(built))
    next(stream)
    state = stream.get_state()
    with pytest.raises(ValueError, match="seed: state 3 != this stream 4"):
        online_stream(real_config(built, seed=4)).set_state(state)
    with pytest.raises(ValueError, match="split: state 'test_4'") as err:
        online_stream(real_config(built, split="test_5")).set_state(state)
    assert "split_size" in str(err.value)  # 20 vs 40 episodes
    with pytest.raises(ValueError, match="'gapchat' stream, this stream is 'persona_world'"):
        online_stream(persona_config()).set_state(state)
    with pytest.raises(ValueError, match="'persona_world' stream, this stream is 'gapchat'"):
        online_stream(real_config(built)).set_state(online_stream(persona_config()).get_state())
    with pytest.raises(ValueError, match="grain"):
        online_stream(real_config(built)).set_state({k: v for k, v in state.items() if k != "grain"})


def test_real_stream_shards_are_disjoint_per_epoch_and_checked(built: Path) -> None:
    """Two processes: each yields its own half of every epoch; a state of one shard does not load into the other."""
    kw = dict(data_dir=built, seed=3, total=10, shard_count=2)
    shards = [TfdsEpisodeStream("gapchat", SAMPLE, "test_4", shard_index=i, **kw) for i in range(2)]
    ids = [_ids(s) for s in shards]
    assert not set(ids[0]) & set(ids[1]) and len(set(ids[0] + ids[1])) == 20
    with pytest.raises(ValueError, match=r"shard: state \[0, 2\] != this stream \[1, 2\]"):
        TfdsEpisodeStream("gapchat", SAMPLE, "test_4", shard_index=1, **kw).set_state(shards[0].get_state())


def test_dataset_config_defaults_stream_the_protocol_pool(tmp_path: Path, fixtures: Path) -> None:
    """configs/gc.py: online by default, on the pooled 4- and 5-session test splits, every turn acted on."""
    spec = importlib.util.spec_from_file_location("icml_configs_gc", REPO_ROOT / "configs" / "gc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    assert tuple(config.mode) == ("synthesize", "warmup", "online") and config.data.split == "test_4+test_5"
    with pytest.raises(ValueError, match="config.data.data_dir is not set"):
        check_data_config(config, config.mode)
    tb.build(config.data.tfds_name, manual_dir=fixtures / "gapchat", data_dir=tmp_path)
    config.data.data_dir = str(tmp_path)
    config.data.train_episodes = 4
    check_data_config(config, config.mode)
    pool = _ids(tb.read_episodes(config.data.tfds_name, "test_4", data_dir=tmp_path))
    pool += _ids(tb.read_episodes(config.data.tfds_name, "test_5", data_dir=tmp_path))
    assert sorted(_ids(online_stream(config))) == sorted(pool)
    assert user_speaker(config) is None


# ------------------------------------------------------------------------------------------------ data checks


@pytest.mark.parametrize("change, message", [
    (dict(data_dir=None), "config.data.data_dir is not set"),
    (dict(data_dir="/nonexistent/tfds"), "config.data.data_dir='/nonexistent/tfds' is not a directory"),
    (dict(tfds_name="cc_episodes/test"), "config.data.tfds_name='cc_episodes/test' is not a gapchat builder"),
    (dict(tfds_name="gapchat_episodes/nope"), "config.data.tfds_name='gapchat_episodes/nope'"),
    (dict(tfds_name="gapchat_episodes/protocol"), "holds no built gapchat_episodes/protocol"),
    (dict(split="train_5"), r"config.data.split='train_5': \['train_5'\] not built"),
    (dict(split="test_4+test_9"), r"config.data.split='test_4\+test_9': \['test_9'\] not built"),
    (dict(split=None), "config.data.split is not set"),
    (dict(train_episodes=0), "config.data.train_episodes must be an int >= 1"),
    (dict(name="imdb"), "config.data.name='imdb' is not one of"),
    (dict(max_session_turns=1), "config.data.max_session_turns must be None or an int >= 2"),
    (dict(max_session_turns=True), "config.data.max_session_turns must be None or an int >= 2"),
])
def test_check_data_config_names_the_field(built: Path, change, message) -> None:
    config = real_config(built)
    for key, value in change.items():
        config.data[key] = value
    with pytest.raises(ValueError, match=message):
        check_data_config(config, ("synthesize", "warmup", "online"))


def test_check_data_config_passes_and_only_checks_data_for_online(built: Path) -> None:
    check_data_config(real_config(built), ("online",))
    check_data_config(real_config(built, split="test_4+test_5[:3]"), ("online",))
    check_data_config(real_config(None), ("synthesize", "warmup"))  # the dataset is read by the online stage only
    check_data_config(persona_config(), ("online",))
    with pytest.raises(ValueError, match="config.data.eval_episodes"):
        check_data_config(persona_config(held_out=-1), ("online",))
    with pytest.raises(ValueError, match="config.data.world"):
        check_data_config(persona_config(num_sessions=1), ("online",))
    with pytest.raises(ValueError, match="config.data.train_episodes"):
        online_stream(persona_config(train=0))


def test_locomo_stream_plays_the_conversations_without_questions_or_annotations(tmp_path: Path,
                                                                               fixtures: Path) -> None:
    """config.data.name="locomo": a real dataset whose online episodes never carry its QA labels (issue 49)."""
    tb.build("locomo_episodes/full", manual_dir=fixtures / "locomo", data_dir=tmp_path)
    config = real_config(tmp_path, split="test", train=4, name="locomo", tfds_name="locomo_episodes/full")
    check_data_config(config, ("online",))
    played = list(online_stream(config))
    full = {e.episode_id: e for e in tb.read_episodes("locomo_episodes/full", "test", data_dir=tmp_path)}
    assert sorted(_ids(played)) == ["conv-1", "conv-1", "conv-2", "conv-2"]
    for ep in played:
        assert "qa" not in ep.meta and "annotations" not in ep.meta and "qa" in full[ep.episode_id].meta
        assert ep.sessions == full[ep.episode_id].sessions[:-1]
        assert "evidence" not in ep.to_json() and "adversarial_answer" not in ep.to_json()
    assert user_speaker(config) is None and held_out_episodes(config) == []


def test_real_stream_plays_each_episode_without_its_final_session_unless_told(built: Path) -> None:
    """The final session is the evaluation's target: by default the online stream never yields it."""
    from icml_jax.data.tfds_builders import read_episodes

    full = {e.episode_id: e for e in read_episodes(SAMPLE, "test_4", data_dir=built)}
    history = list(online_stream(real_config(built, train=5)))
    config = real_config(built, train=5)
    config.data.train_final_sessions = True
    whole = list(online_stream(config))
    assert _ids(history) == _ids(whole)  # the same episodes in the same order
    for h, w in zip(history, whole, strict=True):
        assert w.sessions == full[w.episode_id].sessions
        assert h.sessions == full[h.episode_id].sessions[:-1] and h.meta == w.meta
    # a position saved by one protocol does not continue the other
    with pytest.raises(ValueError, match="final_sessions"):
        online_stream(real_config(built, train=5)).set_state(online_stream(config).get_state())


def test_max_session_turns_cuts_every_session_of_the_stream_and_is_part_of_its_state(built: Path) -> None:
    """A smaller real-data run: every session keeps its first N turns (and its gap and meta), the final session is
    still left out, and a position saved under one cut does not continue another."""
    from icml_jax.data.tfds_builders import read_episodes

    full = {e.episode_id: e for e in read_episodes(SAMPLE, "test_4", data_dir=built)}
    config = real_config(built, train=5)
    config.data.max_session_turns = 3
    cut = list(online_stream(config))
    assert _ids(cut) == _ids(online_stream(real_config(built, train=5)))
    for episode in cut:
        source = full[episode.episode_id].sessions[:-1]
        assert len(episode.sessions) == len(source)
        for mine, theirs in zip(episode.sessions, source, strict=True):
            assert mine.turns == theirs.turns[:3] and len(theirs.turns) > 3
            assert (mine.gap_seconds, mine.gap_text, mine.meta) == (theirs.gap_seconds, theirs.gap_text, theirs.meta)
    with pytest.raises(ValueError, match="max_session_turns"):
        online_stream(real_config(built, train=5)).set_state(online_stream(config).get_state())
    assert clip_sessions(cut[0], None) is cut[0]
    persona = persona_config()
    persona.data.max_session_turns = 4  # the persona world's labels address turns a cut would remove
    with pytest.raises(ValueError, match="config.data.name='persona_world' sizes its sessions"):
        check_data_config(persona, ("online",))


def test_an_episode_of_one_session_has_no_history_to_learn_from() -> None:
    from icml_jax.data.schema import Episode
    from icml_jax.data.stream import history_sessions

    (two,) = generate_episodes(PersonaWorldConfig(num_sessions=2), 1)
    assert isinstance(history_sessions(two), Episode) and history_sessions(two).sessions == two.sessions[:1]
    with pytest.raises(ValueError, match=r"episode '.*' has 1 session\(s\).*at least 2"):
        history_sessions(history_sessions(two))
