"""Erasure across a workdir (issue 18): after `forget_user` a canary the user said is in no file of the workdir;
other users keep everything, and the rewritten checkpoints still restore."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from icml_jax import erasure
from icml_jax.memory import MemoryStore, NewFragment
from icml_jax.checkpoint import RunCheckpointer, load_memory_state, memory_state
from icml_jax.rl.pending import PendingRewardBuffer

CANARY = "canary-7f3a-Quixotic-Zebra"


def _workdir(root: Path) -> dict[str, str]:
    """A run's workdir with carol's canary everywhere a run keeps text, and dave's memories beside it."""
    ids: dict[str, str] = {}
    with MemoryStore(root / erasure.CHAT_DB) as chat:
        ids["carol_chat"] = chat.append("carol", NewFragment("chat", 1, 0, f"my code is {CANARY}", CANARY, "0")).fragment_id
        ids["dave_chat"] = chat.append("dave", NewFragment("chat", 1, 0, "I like tea", "Likes tea.", "0")).fragment_id
    run = MemoryStore()
    old = run.append("carol", NewFragment("ep_c", 0, 0, f"I live at {CANARY}", f"Lives at {CANARY}.", "1"))
    new = run.append("carol", NewFragment("ep_c", 1, 0, "I moved to Oslo", "Lives in Oslo.", "1"))
    run.supersede("carol", [old.fragment_id], new.fragment_id, by="d")  # the canary also sits in the history
    tea, coffee = run.append_many("dave", [NewFragment("ep_d", 0, 0, "I like tea", "Likes tea.", "1"),
                                           NewFragment("ep_d", 0, 2, "I like coffee", "Likes coffee.", "1")])
    ids.update(dave_tea=tea.fragment_id, dave_coffee=coffee.fragment_id)
    buffer = PendingRewardBuffer()
    buffer.add(fragment_id=new.fragment_id, user_id="carol", decision_id="c1", r_proxy=0.5)
    buffer.add(fragment_id=tea.fragment_id, user_id="dave", decision_id="d1", r_proxy=0.5)
    with RunCheckpointer(root / "checkpoints", keep=2, async_save=False) as ckpt:
        for step in (2, 4):
            ckpt.save(step, {"w": np.arange(3)}, {"memory": memory_state(run), "buffer": buffer.state_dict()})
        ckpt.wait()
    aside = root / "checkpoints.unrestorable" / "6"
    aside.mkdir(parents=True)
    (aside / "junk").write_text(CANARY)
    (root / "eval").mkdir()
    rows = [{"episode_id": "carol", "utterance": f"is {CANARY} safe?", "memory_id": None, "memory": None},
            {"episode_id": "dave", "utterance": "tea?", "memory_id": tea.fragment_id, "memory": "Likes tea."}]
    (root / "eval" / "targets.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval" / "cache.sqlite").write_bytes(f"prompt quoting {CANARY}".encode())
    (root / "synthesis").mkdir()
    (root / "synthesis" / "requests.sqlite").write_bytes(CANARY.encode())
    (root / "metrics.jsonl").write_text('{"stage": "online", "episode": 1}\n')
    return ids


def _files_with(root: Path, needle: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_forget_user_leaves_no_trace_of_the_canary_and_keeps_everyone_else(tmp_path):
    ids = _workdir(tmp_path)
    assert len(_files_with(tmp_path, CANARY)) >= 6  # chat db, 2 checkpoints, aside, targets, caches
    report = erasure.forget_user(tmp_path, "carol")
    assert _files_with(tmp_path, CANARY) == []
    assert report.memories_removed == 1 and any("checkpoints.unrestorable" in p for p in report.dropped)
    assert any("trained weights" in p for p in report.not_reached)
    with MemoryStore(tmp_path / erasure.CHAT_DB) as chat:
        assert chat.count("carol") == 0 and chat.get("dave", ids["dave_chat"]) is not None
    with RunCheckpointer(tmp_path / "checkpoints") as ckpt:  # still restores, dave intact, carol gone
        step, arrays, state = ckpt.restore()
    assert step == 4 and set(state["memory"]) == {"dave"}
    with MemoryStore() as store:
        load_memory_state(store, state["memory"])
        assert store.count("dave") == 2
    buffer = PendingRewardBuffer.from_state_dict(state["buffer"])
    assert [e["user_id"] for e in buffer.state_dict()["entries"]] == ["dave"]
    rows = [json.loads(x) for x in (tmp_path / "eval" / "targets.jsonl").read_text().splitlines()]
    assert [r["episode_id"] for r in rows] == ["dave"]


def test_forget_one_memory_everywhere(tmp_path, capsys):
    ids = _workdir(tmp_path)
    assert erasure.main(["--workdir", str(tmp_path), "--user", "dave", "--memory_id", ids["dave_tea"]]) == 0
    assert "erased memory" in capsys.readouterr().out
    with RunCheckpointer(tmp_path / "checkpoints") as ckpt:
        _, _, state = ckpt.restore()
    with MemoryStore() as store:
        store.import_jsonl("dave", io.StringIO(state["memory"]["dave"]))
        assert [f.fragment_id for f in store.fragments("dave")] == [ids["dave_coffee"]]
    assert all(e["fragment_id"] != ids["dave_tea"] for e in state["buffer"]["entries"])
    (dave,) = [json.loads(x) for x in (tmp_path / "eval" / "targets.jsonl").read_text().splitlines()
               if json.loads(x)["episode_id"] == "dave"]
    assert dave["memory"] is None  # the forgotten memory's text is gone from the evaluation rows
    assert "Likes tea." not in (tmp_path / "checkpoints" / "4" / "state" / "metadata").read_text()
    assert erasure.main(["--workdir", str(tmp_path / "nope"), "--user", "dave"]) == 2


# -- issue 31: an erasure does what it says, and says what it did ---------------------------------------------


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_empty_memory_id_is_an_error_and_removes_nothing(tmp_path, capsys):
    """`--memory_id=` erased the whole user (`if args.memory_id` let "" fall through to forget_user)."""
    _workdir(tmp_path)
    before = _snapshot(tmp_path)
    assert erasure.main(["--workdir", str(tmp_path), "--user", "carol", "--memory_id="]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("erasure error: forget: fragment_id must name a memory")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("user, memory_id", [("dave", "m_doesnotexist"), ("dave", "carol_chat")])
def test_an_id_that_matches_nothing_says_so_exits_1_and_changes_nothing(tmp_path, capsys, user, memory_id):
    """An unknown id, or another user's, printed `erased memory ...: 0 ... removed, 1 file(s) rewritten` and
    exited 0 (dropping the caches on the way)."""
    ids = _workdir(tmp_path)
    memory_id = ids.get(memory_id, memory_id)
    before = _snapshot(tmp_path)
    assert erasure.main(["--workdir", str(tmp_path), "--user", user, "--memory_id", memory_id]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[0] == (
        f"found no record of memory {memory_id} of {user!r} in 1 memory store(s), 2 checkpoint(s), 1 evaluation "
        "file(s): nothing was changed")
    assert _snapshot(tmp_path) == before


def test_the_report_counts_what_was_removed_where(tmp_path):
    """Cutting a user out of checkpoints printed `0 stored memory record(s) removed`: now each place is counted."""
    ids = _workdir(tmp_path)
    one = erasure.forget(tmp_path, "dave", ids["dave_tea"])
    assert (one.found, one.memories_removed, one.checkpoint_memories_removed, one.pending_removed,
            one.checkpoints_rewritten, one.eval_rows_removed, one.eval_rows_blanked, one.caches_dropped,
            one.unrestorable_dropped) == (True, 0, 2, 2, 2, 0, 1, 2, 1)
    assert one.summary().splitlines()[0] == (
        f"erased memory {ids['dave_tea']} of 'dave': memory stores 0 memory row(s), 0 session record(s); checkpoints "
        "2 memory record(s), 2 pending reward(s) in 2 file(s); evaluation 0 row(s) removed, 1 blanked; dropped 2 "
        "answer cache(s), 1 unrestorable checkpoint folder(s)")
    with MemoryStore(tmp_path / erasure.CHAT_DB) as chat:
        chat.open_session("carol", "chat")  # a chat that saved nothing still recorded its session
    everything = erasure.forget_user(tmp_path, "carol")  # 2 memories (one superseded) in each of 2 checkpoints
    assert (everything.memories_removed, everything.sessions_removed, everything.checkpoint_memories_removed,
            everything.pending_removed, everything.checkpoints_rewritten, everything.eval_rows_removed) == (
        1, 1, 4, 2, 2, 1)
    assert str(tmp_path / erasure.CHAT_DB) in everything.rewritten


def test_a_user_whose_only_record_is_a_chat_session_is_found_and_erased(tmp_path):
    _workdir(tmp_path)
    with MemoryStore(tmp_path / erasure.CHAT_DB) as chat:
        chat.open_session("erin", "chat")
    report = erasure.forget_user(tmp_path, "erin")
    assert report.found and (report.memories_removed, report.sessions_removed) == (0, 1)
    with MemoryStore(tmp_path / erasure.CHAT_DB) as chat:
        assert chat.session_count("erin") == 0 and chat.open_session("erin", "chat") == 1


def test_a_user_with_no_record_exits_1_and_the_unsearchable_caches_still_go(tmp_path, capsys):
    ids = _workdir(tmp_path)
    assert erasure.main(["--workdir", str(tmp_path), "--user", "nobody"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        "found no record of 'nobody' in 1 memory store(s), 2 checkpoint(s), 1 evaluation file(s); 2 answer cache(s) "
        "and 1 unrestorable checkpoint folder(s), which cannot be searched, were dropped all the same")
    with MemoryStore(tmp_path / erasure.CHAT_DB) as chat:
        assert chat.get("dave", ids["dave_chat"]) is not None and chat.count("carol") == 1


def test_an_id_that_is_not_valid_text_is_one_error_line(tmp_path, capsys):
    _workdir(tmp_path)
    before = _snapshot(tmp_path)
    assert erasure.main(["--workdir", str(tmp_path), "--user", "car\udcffol"]) == 2  # argv's surrogate escape
    assert capsys.readouterr().err.startswith("erasure error: erasure: user_id is not valid UTF-8 (byte 0xff")
    assert erasure.main(["--workdir", str(tmp_path), "--user", "carol", "--memory_id", "m_\ud800"]) == 2
    assert "memory_id holds a lone surrogate U+D800" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before
