"""Issue 31: untrusted text at the Memory API and MemoryStore doors. Any text and any ids either work or raise one
TextError naming the method, the argument and the offset (never a raw UnicodeEncodeError from SQLite), a refused
`add` leaves no session behind, and the size caps hold at their boundary."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icml_jax.llm import OfflineBackend
from icml_jax.memory import MemoryStore, NewFragment
from icml_jax.memory_api import API_EPISODE, Memory
from icml_jax.textcheck import TextError, TextLimits

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=40)  # lone surrogates included
IDS = st.one_of(ANY_TEXT, st.sampled_from(["alice", "bob", "m_doesnotexist"]))
LIMITS = TextLimits(max_text_chars=64, source_excerpt_chars=10, max_metadata_chars=40)


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _calls(m: Memory, text: str, user: str, memory_id: str) -> list:
    return [
        lambda: m.add(text, user),
        lambda: m.add([{"role": "assistant", "content": "Hi."}, {"role": "user", "content": text}], user),
        lambda: m.add("I like tea.", user, metadata={"note": text}),
        lambda: m.search(text, user),
        lambda: m.update(memory_id, text, user_id=user),
        lambda: m.get(memory_id, user_id=user),
        lambda: m.history(memory_id, user_id=user),
        lambda: m.delete(memory_id, user_id=user),
        lambda: m.get_all(user),
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=ANY_TEXT, user=IDS, memory_id=IDS)
def test_every_api_call_succeeds_or_raises_one_text_error(text, user, memory_id):
    with Memory(":memory:", generator=OfflineBackend(), limits=LIMITS) as m:
        m.add("I live in Paris.", "alice")
        opened = int(user == "alice")  # sessions of `user` so far
        for i, call in enumerate(_calls(m, text, user, memory_id)):
            try:
                out = call()
            except TextError as e:
                assert str(e).startswith("Memory.") and e.argument
                assert e.offset is None or e.offset >= 0
                continue
            opened += int(i < 3 and bool(out["results"]))
        if user and _valid(user):  # every add that was refused (or had nothing to save) opened no session
            assert m.store.open_session(user, API_EPISODE) == opened + 1


@settings(max_examples=150, deadline=None)
@given(text=ANY_TEXT, user=IDS, other=IDS)
def test_every_store_writer_succeeds_or_raises_one_text_error(text, user, other):
    calls = [
        lambda s: s.append(user or "u", NewFragment("e", 0, 0, text or "x", (text or "x") + "!", "1")),
        lambda s: s.append("u", NewFragment(other or "e", 0, 1, "source", "note", "1", decision_id=text)),
        lambda s: s.open_session(user or "u", other or "e"),
        lambda s: s.update(user or "u", other, (text or "x") + "!", by=text),
        lambda s: s.supersede(user or "u", [other, text], other or "m", by=text),
        lambda s: s.get(user or "u", other),
        lambda s: s.history(user or "u", other),
        lambda s: s.delete(user or "u", other),
        lambda s: s.delete_user(user or "u"),
    ]
    with MemoryStore() as store:
        for call in calls:
            try:
                call(store)
            except TextError as e:
                assert str(e).startswith(("MemoryStore.", "memory fragment"))
            except ValueError as e:  # supersede by a memory the user does not have: the store's own rule
                assert "to supersede with" in str(e)


def test_a_lone_surrogate_names_the_method_the_argument_and_the_offset_and_stores_nothing(tmp_path):
    with Memory(tmp_path / "m.sqlite") as m:
        with pytest.raises(TextError, match=r"^Memory.add: messages\[2\].content holds a lone surrogate U\+D800 "
                                            r"\(not valid Unicode text\) at character 4$"):
            m.add([{"role": "user", "content": "ok"}, {"role": "assistant", "content": "yes"},
                   {"role": "user", "content": "café\ud800"}], "alice")
        with pytest.raises(TextError, match=r"^Memory.search: query is not valid UTF-8 \(byte 0xff"):
            m.search("where \udcff", "alice")
        with pytest.raises(TextError, match=r"^Memory.update: text .* at character 0$"):
            m.update("m_1", "\ud83d", user_id="alice")
        with pytest.raises(TextError, match=r"^Memory.get: user_id .* at character 1$"):
            m.get("m_1", user_id="a\udc80")
        with pytest.raises(TextError, match=r"^Memory.add: messages is not valid UTF-8 \(invalid start byte: "
                                            r"byte 0xff\) at byte 2$"):
            m.add(b"hi\xff", "alice")
        assert m.get_all("alice") == {"results": []}
        assert m.store.open_session("alice", API_EPISODE) == 1  # the refused adds opened no session
        assert m.add("tea".encode(), "alice")["results"][0]["memory"] == "tea"  # valid UTF-8 bytes are text


def test_the_store_refuses_invalid_text_before_sqlite_sees_it():
    with MemoryStore() as store:
        with pytest.raises(TextError, match=r"^MemoryStore.append_many \(drafts\[0\]\): source_text holds a lone "
                                            r"surrogate U\+D800 \(not valid Unicode text\) at character 1$"):
            store.append("u", NewFragment("e", 1, 0, "a\ud800", "note", "1"))
        with pytest.raises(TextError, match=r"^MemoryStore.open_session: user_id"):
            store.open_session("\udc80", "api")
        (f,) = store.append_many("u", [NewFragment("e", 1, 0, "source", "note", "1")])
        with pytest.raises(TextError, match=r"^MemoryStore.update: text .* at character 3$"):
            store.update("u", f.fragment_id, "new\udcff")
        assert store.fragments("u") == [f] and [e.event for e in store.timeline("u")] == ["add"]


def test_text_caps_hold_at_the_boundary():
    cap = LIMITS.max_text_chars
    with Memory(":memory:", limits=LIMITS) as m:
        (ok,) = m.add("x" * cap, "alice")["results"]
        with pytest.raises(TextError, match=rf"^Memory.add: messages is {cap + 1} characters long, over the limit of "
                                            rf"{cap} \(config limits.max_text_chars\) at character {cap}$"):
            m.add("y" * (cap + 1), "alice")
        with pytest.raises(TextError, match=r"^Memory.add: messages\[0\].content is"):
            m.add([{"role": "user", "content": "y" * (cap + 1)}], "alice")
        assert m.update(ok["id"], "z" * cap, user_id="alice")["memory"] == "z" * cap
        with pytest.raises(TextError, match=r"^Memory.update: text is"):
            m.update(ok["id"], "z" * (cap + 1), user_id="alice")
        assert m.search("q" * cap, "alice")["results"]
        with pytest.raises(TextError, match=r"^Memory.search: query is"):
            m.search("q" * (cap + 1), "alice")
        with pytest.raises(TextError, match=r"^Memory.add: metadata \(as JSON\) is 41 characters long, over the "
                                            r"limit of 40 \(config limits.max_metadata_chars\)"):
            m.add("hi", "alice", metadata={"k": "v" * 32})  # {"k": "vvv..."} is 41 characters
        assert m.add("hi", "alice", metadata={"k": "v" * 31})["results"]
        assert [r["memory"] for r in m.get_all("alice")["results"]] == ["z" * cap, "hi"]  # nothing else stored


def test_the_default_cap_refuses_a_5_mb_add_and_update():
    """The issue's probe: a 5 MB add and update were stored whole (the database reached 33.3 MB)."""
    big = "x" * 5_000_000
    with Memory(":memory:") as m:
        (tea,) = m.add("I like tea.", "alice")["results"]
        with pytest.raises(TextError, match=r"^Memory.add: messages is 5000000 characters long, over the limit of "
                                            r"32768"):
            m.add(big, "alice")
        with pytest.raises(TextError, match=r"^Memory.update: text is 5000000 characters long"):
            m.update(tea["id"], big, user_id="alice")
        assert m.get(tea["id"], user_id="alice")["memory"] == "I like tea." and len(m.get_all("alice")["results"]) == 1


def test_search_returns_the_memory_and_a_bounded_source_excerpt():
    source = "I live in Paris " + "and more " * 100
    with Memory(":memory:", limits=TextLimits(source_excerpt_chars=10)) as m:
        (added,) = m.add(source, "alice")["results"]
        (hit,) = m.search("Paris", "alice")["results"]
        assert hit["memory"] == source.strip() and hit["source"] == source[:9] + "…"
        assert len(hit["source"]) == 10
        assert m.get(added["id"], user_id="alice")["source"] == source  # the whole source is one `get` away
        m.add("short one", "alice")
        assert [h["source"] for h in m.search("short", "alice")["results"]][0] == "short one"  # not cut: no "…"
