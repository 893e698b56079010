"""The Mem0-shaped API `icml_jax.memory_api.Memory`: message shapes, each method, the default path, condensation by a
back end (the offline one, and a writer that supersedes), and the policy path with a stand-in for a trained run.

A trained tiny policy is tested in tests/memory/test_api_policy.py."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

import icml_jax.run
from icml_jax.llm import LLMResponse, OfflineBackend, TokenUsage
from icml_jax.memory import MemoryStore
from icml_jax.memory_api import API_EPISODE, Memory, default_path, parse_messages
from icml_jax.textcheck import TextLimits


@pytest.fixture
def mem():
    m = Memory(":memory:")
    yield m
    m.close()


def _ids(result: dict) -> list[str]:
    return [r["id"] for r in result["results"]]


# -- messages ------------------------------------------------------------------------------------------


def test_messages_as_mem0_takes_them():
    assert parse_messages("I like tea.") == [("user", "I like tea.")]
    assert parse_messages({"role": "user", "content": "hi"}) == [("user", "hi")]
    chat = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b", "name": "bot"}]
    assert parse_messages(chat) == [("system", "be nice"), ("user", "a"), ("assistant", "b")]
    assert parse_messages([]) == []
    with pytest.raises(TypeError, match=r"messages\[1\] must be a dict with string 'role' and 'content'"):
        parse_messages([{"role": "user", "content": "ok"}, {"role": "user"}])
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        parse_messages([{"role": "user", "content": 3}])
    with pytest.raises(TypeError, match="must be a string or a list"):
        parse_messages(42)


def test_add_stores_every_user_message_verbatim_in_its_own_session(mem):
    out = mem.add([{"role": "system", "content": "You are helpful."},
                   {"role": "user", "content": "  I have a dog named Max. "},
                   {"role": "assistant", "content": "Nice!"},
                   {"role": "user", "content": "   "},  # nothing to remember
                   {"role": "user", "content": "I work as a nurse."}], user_id="alice")
    assert [(r["memory"], r["event"]) for r in out["results"]] == [("I have a dog named Max.", "ADD"),
                                                                    ("I work as a nurse.", "ADD")]
    first, second = (mem.store.get("alice", i) for i in _ids(out))
    assert (first.episode_id, first.session, first.turn, second.turn) == (API_EPISODE, 1, 1, 4)
    assert first.source_text == "  I have a dog named Max. " and first.decision_id == "api"
    assert [e.by for e in mem.store.history("alice", first.fragment_id)] == ["api"]
    again = mem.add("I have a dog named Max.", user_id="alice")  # a second call: session 2, a new id
    assert mem.store.get("alice", _ids(again)[0]).session == 2 and not set(_ids(again)) & set(_ids(out))
    assert mem.add([{"role": "assistant", "content": "hello"}], user_id="alice") == {"results": []}
    assert mem.store.open_session("alice", API_EPISODE) == 3  # a call without user messages opened none


def test_metadata_is_kept_and_must_be_json(mem):
    (item,) = mem.add("I like jazz.", "alice", metadata={"source": "app", "tags": ["music"]})["results"]
    assert item["metadata"] == {"source": "app", "tags": ["music"]}
    assert mem.get(item["id"], user_id="alice")["metadata"] == {"source": "app", "tags": ["music"]}
    assert mem.add("no metadata", "alice")["results"][0]["metadata"] is None
    with pytest.raises(TypeError, match="metadata must be JSON-serialisable"):
        mem.add("x", "alice", metadata={"bad": object()})
    with pytest.raises(TypeError, match="metadata must be a dict"):
        mem.add("x", "alice", metadata=["a"])
    assert len(mem.get_all("alice")["results"]) == 2  # the refused calls stored nothing


def test_get_get_all_update_delete_and_history(mem):
    dog, nurse = _ids(mem.add([{"role": "user", "content": "I have a dog."},
                               {"role": "user", "content": "I am a nurse."}], user_id="alice"))
    (bobs,) = _ids(mem.add("I have a cat.", user_id="bob"))
    item = mem.get(dog, user_id="alice")
    assert item["id"] == dog and item["memory"] == "I have a dog." and item["user_id"] == "alice"
    assert item["created_at"].endswith("+00:00") and item["superseded_by"] is None
    assert [r["memory"] for r in mem.get_all("alice")["results"]] == ["I have a dog.", "I am a nurse."]

    updated = mem.update(dog, "I have two dogs.", user_id="alice")
    assert (updated["id"], updated["memory"], updated["event"]) == (dog, "I have two dogs.", "UPDATE")
    add, upd = mem.history(dog, user_id="alice")
    assert (add["event"], add["old_memory"], add["new_memory"], add["by"]) == ("ADD", None, "I have a dog.", "api")
    assert (upd["event"], upd["old_memory"], upd["new_memory"], upd["id"]) == ("UPDATE", "I have a dog.",
                                                                               "I have two dogs.", dog)
    with pytest.raises(ValueError, match="non-empty string"):
        mem.update(dog, "", user_id="alice")

    assert mem.delete(nurse, user_id="alice") is True and mem.delete(nurse, user_id="alice") is False
    assert mem.get(nurse, user_id="alice") is None and mem.history(nurse, user_id="alice") == []
    assert mem.delete_all("alice") == 1 and mem.get_all("alice") == {"results": []}
    assert mem.get(bobs, user_id="bob")["memory"] == "I have a cat."  # bob's memory is untouched


def test_another_users_id_looks_missing_everywhere(mem):
    (bobs,) = _ids(mem.add("I have a cat.", "bob"))
    mem.add("I have a dog.", "alice")
    assert mem.get(bobs, user_id="alice") is None
    assert mem.update(bobs, "hijacked", user_id="alice") is None
    assert mem.delete(bobs, user_id="alice") is False
    assert mem.history(bobs, user_id="alice") == []
    assert bobs not in _ids(mem.search("cat", "alice")) and bobs not in _ids(mem.get_all("alice"))
    assert mem.get(bobs, user_id="bob")["memory"] == "I have a cat." and len(mem.history(bobs, user_id="bob")) == 1


def test_search_ranks_current_memories_by_bm25(mem):
    paris, dog, berlin = _ids(mem.add([{"role": "user", "content": c} for c in
                                       ("I live in Paris.", "My dog is called Rex.", "I live in Berlin now.")],
                                      "alice"))
    mem.store.supersede("alice", [paris], berlin)
    hits = mem.search("Where do I live, Berlin or Paris?", user_id="alice")["results"]
    assert _ids({"results": hits}) == [berlin, dog] and hits[0]["score"] > 0 == hits[1]["score"]
    assert _ids(mem.search("Rex", "alice", limit=1)) == [dog] and mem.search("Rex", "alice", limit=0) == {
        "results": []}
    assert _ids(mem.get_all("alice")) == [dog, berlin]
    assert _ids(mem.get_all("alice", include_superseded=True)) == [paris, dog, berlin]
    assert mem.get(paris, user_id="alice")["superseded_by"] == berlin
    assert mem.history(paris, user_id="alice")[-1]["event"] == "SUPERSEDE"
    assert mem.search("Paris", "bob") == {"results": []}
    with pytest.raises(ValueError, match="limit must be an int >= 0"):
        mem.search("x", "alice", limit=-1)
    with pytest.raises(TypeError, match="query must be a string"):
        mem.search(None, "alice")


@pytest.mark.parametrize("call", [
    lambda m: m.add("hi", None), lambda m: m.search("hi", None), lambda m: m.get_all(None),
    lambda m: m.get("m_1", user_id=None), lambda m: m.update("m_1", "x", user_id=None),
    lambda m: m.delete("m_1", user_id=None), lambda m: m.delete_all(None), lambda m: m.history("m_1", user_id=None),
    lambda m: m.get("m_1"), lambda m: m.update("m_1", "x"), lambda m: m.delete("m_1"), lambda m: m.history("m_1"),
])
def test_every_call_requires_a_user(mem, call):
    with pytest.raises(TypeError, match="user_id"):
        call(mem)


def test_an_empty_user_is_refused(mem):
    with pytest.raises(ValueError, match=r"Memory.add: user_id must be a non-empty string"):
        mem.add("hi", "")
    with pytest.raises(ValueError, match=r"Memory.get: user_id"):
        mem.get("m_1", user_id="")
    with pytest.raises(TypeError, match=r"Memory.get: memory_id must be a string"):
        mem.get(3, user_id="alice")


def test_the_default_path_is_in_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "icml_jax" / "memory.sqlite"
    with Memory() as m:
        m.add("I like tea.", "alice")
    with Memory() as m:  # persisted there
        assert m.store.path == str(tmp_path / "xdg" / "icml_jax" / "memory.sqlite")
        assert [r["memory"] for r in m.get_all("alice")["results"]] == ["I like tea."]
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".cache" / "icml_jax" / "memory.sqlite"


def test_importing_the_memory_package_loads_no_chat_or_agent():
    code = ("import sys, icml_jax.memory; "
            "print(sorted(m for m in sys.modules if m.startswith(('icml_jax.chat', 'icml_jax.agents'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- condensation by a back end ------------------------------------------------------------------------


def test_the_offline_back_end_condenses_each_user_message(tmp_path):
    with Memory(tmp_path / "m.sqlite", generator=OfflineBackend()) as m:
        out = m.add([{"role": "user", "content": "I just moved to Lisbon."},
                     {"role": "assistant", "content": "How exciting!"},
                     {"role": "user", "content": "My cat is called Pixel."}], user_id="alice", metadata={"k": 1})
        assert [(r["memory"], r["event"]) for r in out["results"]] == [("I just moved to Lisbon.", "ADD"),
                                                                        ("My cat is called Pixel.", "ADD")]
        frags = m.store.fragments("alice")
        assert [f.turn for f in frags] == [0, 2] and all(f.extra == {"metadata": {"k": 1}} for f in frags)
        assert all(f.decision_id == "api" and f.policy_version == "api" for f in frags)
        assert _ids(m.search("What is my cat called?", "alice", limit=1)) == [frags[1].fragment_id]


class _Writer:
    """Condenses like an LLM: a third-person note; a move to Berlin replaces the Paris memory it is shown."""

    name = "fake-writer"
    usage = TokenUsage()

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, requests):
        self.prompts += [r.prompt for r in requests]
        out = []
        for r in requests:
            if "Berlin" in r.prompt:
                note = "The user moved to Berlin." + ("\nREPLACES: 1" if "lives in Paris" in r.prompt else "")
            else:
                note = "The user lives in Paris."
            out.append(LLMResponse(text=note))
        return out

    def close(self):
        pass


def test_a_writer_condenses_and_supersedes_what_a_new_message_makes_out_of_date():
    writer = _Writer()
    with Memory(":memory:", generator=writer) as m:
        (paris,) = m.add("I live in Paris, in a small flat.", "alice")["results"]
        assert paris["memory"] == "The user lives in Paris."
        m.add("I live in Paris.", "bob")
        out = m.add([{"role": "assistant", "content": "Any news?"},
                     {"role": "user", "content": "I moved to Berlin last week."}], "alice")["results"]
        assert "Any news?" in writer.prompts[-1]  # the dialogue before the message goes with it
        assert [(r["memory"], r["event"]) for r in out] == [("The user moved to Berlin.", "ADD"),
                                                            ("The user lives in Paris.", "SUPERSEDE")]
        berlin = out[0]["id"]
        assert out[1]["id"] == paris["id"] and out[1]["superseded_by"] == berlin
        assert _ids(m.get_all("alice")) == [berlin]
        assert _ids(m.search("where do I live", "alice")) == [berlin]
        assert [h["event"] for h in m.history(paris["id"], user_id="alice")] == ["ADD", "SUPERSEDE"]
        assert m.history(paris["id"], user_id="alice")[-1]["by"] == "api"
        assert len(m.get_all("bob")["results"]) == 1  # bob's Paris memory is his own, still current


# -- the policy path, with a stand-in for a trained run ------------------------------------------------


class _Trigger:
    prob = 0.8


class _Agent:
    """Saves only messages mentioning "fact"; its Trigger always picks the oldest current memory."""

    def __init__(self, store: MemoryStore) -> None:
        self.store, self.condenser, self.calls = store, "model's generator", []

    def remember(self, user_id, utterance, *, history, episode_id, session, turn):
        self.calls.append((user_id, utterance, history, episode_id, session, turn))
        if "fact" not in utterance:
            return None, None
        from icml_jax.memory import NewFragment

        decision = f"{user_id}/{episode_id}/{session}/{turn}/planner"
        return None, self.store.append(user_id, NewFragment(episode_id, session, turn, utterance, utterance, "7",
                                                            decision))

    def choose_memory(self, user_id, utterance, *, episode_id):
        frags = self.store.candidates(user_id, utterance, 8)
        return _Trigger(), (frags[0] if frags else None)


class _Model:
    speakers = ("Speaker 1", "Speaker 2")
    limits = TextLimits()

    def __init__(self, workdir) -> None:
        self.workdir, self.closed, self.agents = Path(workdir), False, []

    def agent(self, store):
        self.agents.append(_Agent(store))
        return self.agents[-1]

    def close(self):
        self.closed = True


@pytest.fixture
def fake_chat(monkeypatch):
    """`icml_jax.run.agent_loading` replaced by a module whose load_model returns a stand-in for a trained run."""
    module = types.ModuleType("icml_jax.run.agent_loading")
    module.loaded = []
    module.load_model = lambda workdir: module.loaded.append(_Model(workdir)) or module.loaded[-1]
    monkeypatch.setitem(sys.modules, "icml_jax.run.agent_loading", module)
    monkeypatch.setattr(icml_jax.run, "agent_loading", module, raising=False)
    return module


def test_with_a_policy_the_planner_decides_and_the_trigger_leads_search(fake_chat, caplog, tmp_path):
    writer = OfflineBackend()
    with Memory(":memory:", workdir=tmp_path / "run", generator=writer) as m:
        (model,) = fake_chat.loaded
        agent = model.agents[0]
        assert model.workdir == tmp_path / "run" and agent.store is m.store and agent.condenser is writer
        with caplog.at_level(logging.WARNING, logger="icml_jax.memory_api"):
            out = m.add([{"role": "user", "content": "a fact: I love tea"},
                         {"role": "assistant", "content": "noted"},
                         {"role": "user", "content": "just chatting about tea"},
                         {"role": "user", "content": "another fact: tea at noon"}], "alice", metadata={"x": 1})
        assert "metadata is not kept" in caplog.text
        assert [r["memory"] for r in out["results"]] == ["a fact: I love tea", "another fact: tea at noon"]
        assert [c[5] for c in agent.calls] == [0, 2, 3] and {c[3:5] for c in agent.calls} == {(API_EPISODE, 1)}
        assert agent.calls[1][2] == (("Speaker 1", "a fact: I love tea"), ("Speaker 2", "noted"))
        assert m.store.history("alice", out["results"][0]["id"])[0].by == "alice/api/1/0/planner"
        hits = m.search("noon", "alice")["results"]  # BM25 prefers the newer; the Trigger picks the older
        assert [h["memory"] for h in hits] == ["a fact: I love tea", "another fact: tea at noon"]
        assert hits[0]["trigger_prob"] == 0.8 and "trigger_prob" not in hits[1]
        assert m.search("noon", "bob") == {"results": []}
    assert model.closed


def test_a_missing_run_is_an_error_and_closes_the_store(monkeypatch, tmp_path):
    module = types.ModuleType("icml_jax.run.agent_loading")

    def load_model(workdir):
        raise RuntimeError(f"no trained policy in {workdir}")

    module.load_model = load_model
    monkeypatch.setitem(sys.modules, "icml_jax.run.agent_loading", module)
    monkeypatch.setattr(icml_jax.run, "agent_loading", module, raising=False)
    closed, close = [], MemoryStore.close
    monkeypatch.setattr(MemoryStore, "close", lambda self: (closed.append(self.path), close(self)))
    with pytest.raises(RuntimeError, match="no trained policy in"):
        Memory(tmp_path / "m.sqlite", workdir=tmp_path / "nothing")
    assert closed == [str(tmp_path / "m.sqlite")]
