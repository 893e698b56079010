"""Run checkpoints: what is kept, what comes back bit for bit, and that a half-written step is never listed."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from icml_jax.memory.fragment import NewFragment, fragment_id_for
from icml_jax.memory.store import MemoryStore
from icml_jax.checkpoint import (
    CheckpointError,
    RunCheckpointer,
    load_memory_state,
    memory_state,
    flat_arrays,
    restore_arrays,
)


def _arrays(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"params": {"head/kernel": rng.standard_normal((3, 2)).astype(np.float32)},
            "rest": {},  # a model without RNG streams: an empty subtree must survive
            "optimizer": {"opt_state": [rng.standard_normal(4), np.int32(step)]},
            "agent_key": np.array([step, 7], np.uint32)}


def test_keeps_the_last_k_and_restores_bit_for_bit(tmp_path):
    state = {"rng": {"state": 2**127 + 5}, "none": None, "floats": [0.1, 1e-300]}
    with RunCheckpointer(tmp_path, keep=2) as ckpt:
        for step in (0, 2, 4):
            ckpt.save(step, _arrays(step), {**state, "step": step})
        ckpt.wait()
        assert ckpt.all_steps() == [2, 4] and ckpt.latest_step() == 4
    with RunCheckpointer(tmp_path, keep=2) as ckpt:  # a fresh process's view
        step, arrays, restored = ckpt.restore()
        assert step == 4 and restored == {**state, "step": 4}
        assert ckpt.restore_state(2) == (2, {**state, "step": 2})
    want = _arrays(4)
    assert arrays["rest"] == {}
    for got, exp in ((arrays["params"]["head/kernel"], want["params"]["head/kernel"]),
                     (arrays["optimizer"]["opt_state"][0], want["optimizer"]["opt_state"][0]),
                     (arrays["optimizer"]["opt_state"][1], want["optimizer"]["opt_state"][1]),
                     (arrays["agent_key"], want["agent_key"])):
        assert got.dtype == np.asarray(exp).dtype and np.array_equal(got, exp)


def test_a_half_written_step_is_never_listed(tmp_path):
    with RunCheckpointer(tmp_path, keep=3) as ckpt:
        ckpt.save(1, _arrays(1), {"step": 1})
    junk = tmp_path / "3.orbax-checkpoint-tmp"  # what a kill mid-write leaves behind
    (junk / "arrays").mkdir(parents=True)
    (junk / "arrays" / "partial").write_bytes(b"\0" * 10)
    with RunCheckpointer(tmp_path, keep=3) as ckpt:
        assert ckpt.latest_step() == 1 and ckpt.all_steps() == [1]
        assert ckpt.restore()[2] == {"step": 1}
    assert not junk.exists()  # cleaned up when the run opens its checkpoints again
    with RunCheckpointer(tmp_path / "empty") as ckpt:
        assert ckpt.restore() is None and ckpt.restore_state() is None
    with pytest.raises(ValueError, match="keep must be a positive int"):
        RunCheckpointer(tmp_path / "x", keep=0)


@pytest.mark.parametrize("damage", ["state_json", "arrays_missing"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one_saying_so(tmp_path, damage, caplog):
    """Before: a bare JSONDecodeError on every resume. Now: the newest step that restores, the damaged one moved
    aside with a warning naming it and the error, and the run can save that step again."""
    directory = tmp_path / "checkpoints"
    with RunCheckpointer(directory, keep=3, async_save=False) as ckpt:
        for step in (2, 4, 6):
            ckpt.save(step, _arrays(step), {"step": step})
        ckpt.wait()
    if damage == "state_json":
        (directory / "6" / "state" / "metadata").write_text('{"step": 6, "trunc')
    else:
        for f in (directory / "6" / "arrays").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.unlink()
    with RunCheckpointer(directory, keep=3, async_save=False) as ckpt:
        step, arrays, state = ckpt.restore_newest()
        assert (step, state) == (4, {"step": 4})
        np.testing.assert_array_equal(arrays["params"]["head/kernel"], _arrays(4)["params"]["head/kernel"])
        assert len(ckpt.skipped) == 1 and "checkpoint step 6 does not restore" in ckpt.skipped[0]
        assert ckpt.skipped[0] in caplog.text
        assert ckpt.all_steps() == [2, 4] and (tmp_path / "checkpoints.unrestorable" / "6").is_dir()
        ckpt.save(6, _arrays(6), {"step": 6})  # the resumed run writes that step again
        ckpt.wait()
        assert ckpt.restore_newest(arrays=False)[::2] == (6, {"step": 6}) and ckpt.skipped == []


def test_when_no_checkpoint_restores_the_error_lists_each_and_nothing_is_moved(tmp_path):
    directory = tmp_path / "checkpoints"
    with RunCheckpointer(directory, keep=2, async_save=False) as ckpt:
        for step in (1, 2):
            ckpt.save(step, _arrays(step), {"step": step})
        ckpt.wait()
    for step in (1, 2):
        (directory / str(step) / "state" / "metadata").write_text("not json")
    with RunCheckpointer(directory, keep=2) as ckpt:
        with pytest.raises(CheckpointError, match=r"no checkpoint in .* restores \(step 2: .*; step 1: .*\); move"):
            ckpt.restore_newest()
        assert ckpt.all_steps() == [1, 2]
    with RunCheckpointer(tmp_path / "empty") as ckpt:
        assert ckpt.restore_newest() is None


def test_memory_state_round_trip_replaces_the_store():
    with MemoryStore(clock=lambda: 123.5) as a, MemoryStore() as b:
        for user, turns in (("alice", (0, 2)), ("bob", (1,))):
            for t in turns:
                a.append(user, NewFragment(episode_id="e", session=0, turn=t, source_text=f"{user} {t}",
                                           text=f"note {t}", policy_version="3", decision_id=f"{user}/{t}"))
        b.append("carol", NewFragment(episode_id="e", session=0, turn=0, source_text="x", text="x",
                                      policy_version="0"))
        load_memory_state(b, memory_state(a))
        assert b.user_ids() == ["alice", "bob"]  # carol, not in the checkpoint, is gone
        for user in ("alice", "bob"):
            assert b.fragments(user) == a.fragments(user)


def _versioned_store(clock: float = 50.0) -> MemoryStore:
    """A store whose users have updated, superseded and deleted memories (every kind of event)."""
    store = MemoryStore(clock=lambda: clock)
    for user in ("alice", "bob"):
        old, new, gone = store.append_many(user, [
            NewFragment("e", 0, t, f"{user} says {t}", f"{user} note {t}", "3", decision_id=f"{user}/{t}")
            for t in range(3)])
        store.update(user, old.fragment_id, f"{user} note 0, edited", by="api")
        store.supersede(user, [old.fragment_id], new.fragment_id, by=new.decision_id)
        store.delete(user, gone.fragment_id)
    return store


def test_memory_state_round_trip_keeps_versions_and_history(tmp_path):
    """A resumed run has the same memories, versions and events (in order) as the one checkpointed, through the
    JSON item Orbax writes."""
    with _versioned_store() as a, MemoryStore() as b:
        b.append("alice", NewFragment("e", 0, 9, "stale", "stale", "0"))  # replaced by the checkpoint's alice
        with RunCheckpointer(tmp_path / "ckpt", async_save=False) as ckpt:
            ckpt.save(1, _arrays(1), {"memory": memory_state(a)})
            _, state = ckpt.restore_state()
        load_memory_state(b, state["memory"])
        assert b.user_ids() == ["alice", "bob"]
        for user in ("alice", "bob"):
            assert b.fragments(user) == a.fragments(user)
            assert b.fragments(user)[0].superseded_by == b.fragments(user)[1].fragment_id
            unnumbered = [[(e.fragment_id, e.event, e.at, e.text, e.by, dict(e.detail)) for e in s.timeline(user)]
                          for s in (a, b)]
            assert unnumbered[0] == unnumbered[1]
            assert [e.event for e in b.timeline(user)] == ["add", "add", "update", "supersede"]


def test_a_checkpoint_written_before_versions_loads():
    old_format = {"alice": '{"format": "icml_jax.memory.fragment/1", "fragment_id": "%s", "user_id": "alice", '
                           '"episode_id": "e", "session": 0, "turn": 1, "source_text": "s", "text": "note", '
                           '"created_at": 3.0, "policy_version": "2", "decision_id": "alice/1", "extra": {}}\n'
                           % fragment_id_for("alice", "e", 0, 1)}
    with MemoryStore() as store:
        load_memory_state(store, old_format)
        (frag,) = store.fragments("alice")
        assert frag.current and frag.text == "note" and frag.created_at == 3.0
        assert [(e.event, e.at, e.by) for e in store.history("alice", frag.fragment_id)] == [("add", 3.0, "alice/1")]


class _Tiny(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.dense = nnx.Linear(3, 2, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, rngs=rngs)


def test_policy_arrays_round_trip_and_refuse_another_structure():
    src, dst = _Tiny(nnx.Rngs(0)), _Tiny(nnx.Rngs(1))
    src.dropout.rngs()  # advance the RNG stream: its count must travel too
    params, rest = flat_arrays(nnx.state(src, nnx.Param)), flat_arrays(nnx.state(src, nnx.Not(nnx.Param)))
    assert any(v.dtype == np.uint32 for v in rest.values())  # typed keys travel as their raw data
    for filt, arrays in ((nnx.Param, params), (nnx.Not(nnx.Param), rest)):
        target = nnx.state(dst, filt)
        restore_arrays(target, arrays, "test")
        nnx.update(dst, target)
    for filt in (nnx.Param, nnx.Not(nnx.Param)):
        a, b = flat_arrays(nnx.state(src, filt)), flat_arrays(nnx.state(dst, filt))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    bad = dict(params, **{"dense/kernel": np.zeros((2, 2), np.float32)})
    before = flat_arrays(nnx.state(dst, nnx.Param))
    with pytest.raises(ValueError, match=r"test: missing \[\], unexpected \[\], mis-shaped \['dense/kernel'\]"):
        restore_arrays(nnx.state(dst, nnx.Param), bad, "test")
    with pytest.raises(ValueError, match=r"missing \['dense/bias'\]"):
        restore_arrays(nnx.state(dst, nnx.Param), {"dense/kernel": params["dense/kernel"]}, "test")
    after = flat_arrays(nnx.state(dst, nnx.Param))
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing written on a mismatch
