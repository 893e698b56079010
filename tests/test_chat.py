"""The terminal chat: memories that survive a restart, /forget, /why, per-user isolation, determinism, clear
errors without a trained policy or with a damaged one, two chats of one user at once, input that is not UTF-8,
and `python -m icml_jax.chat` on piped stdin.

The workdir is built here, not trained: the tiny demo model with its Planner biased to always save and its
Trigger aimed (from the features of the exact observation) at the stored fact for the dinner question.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icml_jax import chat
from icml_jax.run import agent_loading as loading
from icml_jax.run import workdir as layout
from icml_jax.agents import observation as obs
from icml_jax.agents.policy import _features
from icml_jax.run.builders import build_models
from icml_jax.memory import MemoryStore
from icml_jax.textcheck import TextError, TextLimits
from icml_jax.checkpoint import save_warmup
from tests.memory import store_workers

ROOT = Path(__file__).resolve().parents[1]
FACT = "Just so you know, I only eat vegan food."
OTHER = "I've been eating keto for a while now."
QUERY = "Can you suggest something for dinner tonight?"


def tiny_config() -> ml_collections.ConfigDict:
    """configs/demo.py shrunk: a 16-wide one-layer backbone and a one-kind world (a small vocabulary)."""
    spec = importlib.util.spec_from_file_location("test_chat_demo_config", ROOT / "configs" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.model.hidden = 16
    config.policy.match_rank = 4
    config.data.world.fact_kinds = ["diet"]
    config.synthesis.world.fact_kinds = ["diet"]
    return config


def write_config(workdir: Path, config: ml_collections.ConfigDict) -> None:
    """config.json exactly as the main job writes it."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A finished run's workdir: config.json and policy/ (always saves; retrieves FACT for QUERY)."""
    root = tmp_path_factory.mktemp("chat_run")
    config = tiny_config()
    write_config(root, config)
    policies, tokenizer = build_models(config, root)
    policies.eval()
    policies.planner_actor.bias[...] = jnp.full((1,), 4.0)  # kernel is zero: p_save = sigmoid(4) for every turn
    ocfg = obs.ObservationConfig(**config.observation.to_dict())
    tokens, mask, _ = obs.encode_trigger(tokenizer, [obs.trigger_texts([], QUERY, [FACT], ocfg)], ocfg)
    h = _features(policies.trigger_backbone, jnp.asarray(tokens[0, :2]), jnp.asarray(mask[0, :2]), policies.pooling)
    direction = h[1] - h[0]  # memory option minus "none": FACT outscores "none" by 10 logits for QUERY
    policies.trigger_actor.kernel[...] = (10.0 * direction / jnp.sum(direction**2))[:, None]
    save_warmup(root / layout.POLICY_DIR, policies)
    return root


@pytest.fixture(scope="module")
def model(workdir) -> loading.ChatModel:
    loaded = loading.load_model(workdir)
    yield loaded
    loaded.close()


def memory_ids(session: chat.ChatSession) -> list[str]:
    return [f.fragment_id for f in session.store.fragments(session.user_id)]


def test_fact_survives_restart_and_is_retrieved(workdir, model):
    with chat.ChatSession.open(workdir, "alice", model=model) as first:
        assert first.session == 1 and first.command("/memories") == "no memories for 'alice'"
        first.send(FACT)
        saved = first.last_receipt.fragment
        assert saved is not None and saved.text == FACT and (saved.session, saved.turn) == (1, 0)
        assert f"{saved.fragment_id}  s1/t0  {FACT}" in first.command("/memories")
    assert (workdir / "chat" / "memory.sqlite").is_file()

    with chat.ChatSession.open(workdir, "alice", model=model) as second:  # a restart: a new session
        assert second.session == 2 and saved.fragment_id in second.command("/memories")
        reply = second.send(QUERY)
        receipt = second.last_receipt
        assert receipt.trigger.candidate_ids == (saved.fragment_id,)
        assert receipt.memory_used is not None and receipt.memory_used.fragment_id == saved.fragment_id
        assert receipt.trigger.prob > 0.99 and "vegan" in reply
        assert receipt.fragment.fragment_id != saved.fragment_id and (receipt.session, receipt.turn) == (2, 0)
        second.send(OTHER)  # turn index counts this session's dialogue (user + assistant)
        assert second.last_receipt.turn == 2 and second.history[0] == ("user", QUERY)
        assert len(second.history) == 4 and second.history[1][0] == "assistant"


def test_forget_removes_one_memory_of_that_user_only(workdir, model, tmp_path):
    db = tmp_path / "memory.sqlite"
    with chat.ChatSession.open(workdir, "erin", db, model=model) as erin, \
            chat.ChatSession.open(workdir, "frank", db, model=model) as frank:
        erin.send(FACT)
        erin.send(OTHER)
        frank.send(FACT)
        (kept_frank,) = memory_ids(frank)
        first, second = memory_ids(erin)
        assert erin.command(f"/forget {kept_frank}") == f"no memory {kept_frank} for 'erin'; nothing deleted"
        assert memory_ids(frank) == [kept_frank]
        assert erin.command(f"/forget {first}") == f"forgot {first}"
        assert memory_ids(erin) == [second] and memory_ids(frank) == [kept_frank]
        assert erin.command(f"/forget {first}").startswith("no memory") and memory_ids(erin) == [second]
        assert erin.command("/forget").startswith("usage: /forget ID")


def test_why_shows_the_last_receipt(workdir, model, tmp_path):
    with chat.ChatSession.open(workdir, "gina", tmp_path / "m.sqlite", model=model) as s:
        assert s.command("/why").startswith("nothing to explain yet")
        s.send(FACT)
        why = s.command("/why")
        assert why == s.last_receipt.summary()
        assert "used no memory" in why and f"saved this turn as {s.last_receipt.fragment.fragment_id}" in why
        assert "p_save 98%" in why  # sigmoid(4)
        s.send(QUERY)
        assert s.command("/why").startswith(f"used memory {s.last_receipt.memory_used.fragment_id} (100%)")


def test_users_are_isolated(workdir, model, tmp_path):
    db = tmp_path / "m.sqlite"
    with chat.ChatSession.open(workdir, "hana", db, model=model) as hana:
        hana.send(FACT)
        assert len(memory_ids(hana)) == 1
    with chat.ChatSession.open(workdir, "ivan", db, model=model) as ivan:
        assert ivan.session == 1 and ivan.command("/memories") == "no memories for 'ivan'"
        reply = ivan.send(QUERY)
        assert ivan.last_receipt.trigger.candidate_ids == () and ivan.last_receipt.memory_used is None
        assert "vegan" not in reply


def test_same_state_gives_the_same_chat(workdir, model, tmp_path):
    script = [FACT, "hello there", QUERY, OTHER]

    def transcript(db: Path) -> list[tuple[str, str, tuple[float, ...], float]]:
        with chat.ChatSession.open(workdir, "jo", db, model=model) as s:
            out = []
            for line in script:
                reply = s.send(line)
                r = s.last_receipt
                out.append((reply, r.summary(), r.trigger.probs, r.planner.prob_save))
            return out

    a, b = transcript(tmp_path / "a.sqlite"), transcript(tmp_path / "b.sqlite")
    assert a == b and a[2][0] != a[0][0]


def test_repl_commands_and_eof(workdir, model, tmp_path):
    with chat.ChatSession.open(workdir, "kim", tmp_path / "m.sqlite", model=model) as s:
        out = io.StringIO()
        assert chat.repl(s, io.StringIO(f"\n   \n{FACT}\n/bogus\n/help\n/memories\n"), out) == 0  # EOF ends it
        text = out.getvalue()
        assert text.startswith("chatting as 'kim' (session 1, 0 memories") and text.rstrip().endswith("bye")
        assert text.count("assistant: ") == 1 and "unknown command '/bogus'; /help lists" in text
        assert "/forget ID" in text and f"s1/t0  {FACT}" in text
        out = io.StringIO()
        chat.repl(s, io.StringIO("/quit\nnot read\n"), out)
        assert "assistant:" not in out.getvalue() and len(memory_ids(s)) == 1


def test_clear_errors_without_a_trained_policy(workdir, tmp_path, monkeypatch):
    with pytest.raises(loading.ChatError, match=r"config.json does not exist.*python -m icml_jax.main --config="):
        loading.load_model(tmp_path / "never_ran")
    empty = tmp_path / "no_policy"
    shutil.copy(workdir / "config.json", empty.mkdir() or empty / "config.json")
    with pytest.raises(loading.ChatError) as err:
        loading.load_model(empty)
    assert f"no trained policy in {empty}" in str(err.value) and f"--workdir={empty}" in str(err.value)

    gemini = tmp_path / "gemini"  # a Gemini generator without a key: the clear error, the key never shown
    config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
    config.llm.generator = ml_collections.ConfigDict(dict(kind="gemini", model="gemini-2.5-flash"))
    write_config(gemini, config)
    shutil.copytree(workdir / layout.POLICY_DIR, gemini / layout.POLICY_DIR)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(loading.ChatError, match="Gemini back end: gemini back end: no API key found; set one of"):
        loading.load_model(gemini)


def test_falls_back_to_the_warmup_checkpoint(workdir, tmp_path):
    warm = tmp_path / "warm"
    write_config(warm, tiny_config())
    shutil.copytree(workdir / layout.POLICY_DIR, warm / layout.WARMUP_DIR)
    loaded = loading.load_model(warm)
    assert loaded.checkpoint == warm / "warmup" and "using the warm-up checkpoint" in loaded.note
    with chat.ChatSession.open(warm, "lee", model=loaded) as s:
        assert s.banner().startswith(f"note: {warm / 'policy'} does not exist")
        assert "vegan" in s.send(FACT)
    loaded.close()


def test_command_line_chat(workdir, tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "icml_jax.chat", f"--workdir={workdir}", "--user=max",
           f"--memory_db={tmp_path / 'cli.sqlite'}"]
    typed = f"{FACT}\n".encode() + b"caf\xe9 au lait\n" + b"hello there\n/memories\n/quit\n"  # a Latin-1 line
    done = subprocess.run(cmd, input=typed, capture_output=True, cwd=ROOT, env=env, timeout=300)
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, stderr[-3000:]
    assert stdout.count("assistant: ") == 2 and f"s1/t0  {FACT}" in stdout and "bye" in stdout
    assert "error: input is not valid UTF-8 (byte 0xe9 at column 4); turn ignored\n" in stdout
    assert "Traceback" not in stderr and (tmp_path / "cli.sqlite").is_file()

    missing = subprocess.run([*cmd[:3], f"--workdir={tmp_path / 'nothing'}", "--user=max"], input="",
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("chat error: ") and "python -m icml_jax.main" in missing.stderr


def _halve_every_file(policy: Path) -> None:
    for f in filter(Path.is_file, policy.rglob("*")):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _garble_array_files(policy: Path) -> None:
    for f in filter(Path.is_file, (policy / "state" / "d").rglob("*")):
        f.write_bytes(b"\x00not an array\xff" * 8)


DAMAGES = {  # the first two escaped load_model as KeyError tracebacks; the last left a traceback per tensor behind
    "orbax metadata of the wrong shape": lambda policy: (policy / "state" / "_METADATA").write_text("{}"),
    "warmup.json without params": lambda policy: (policy / "warmup.json").write_text('{"format_version": 1}'),
    "every file truncated": _halve_every_file,  # JSONDecodeError
    "array files overwritten": _garble_array_files,  # TensorStore's ValueError, then "Event loop is closed" reports
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_checkpoint_is_one_clear_error(workdir, tmp_path, monkeypatch, damage):
    """Issue 16: a damaged policy/ gave a long traceback. Now one ChatError line (main prints it, status 2), and
    the chat's unraisable hook drops the "Event loop is closed" reports the failed restore leaves behind."""
    broken = tmp_path / "broken"
    shutil.copy(workdir / "config.json", broken.mkdir() or broken / "config.json")
    shutil.copytree(workdir / layout.POLICY_DIR, broken / layout.POLICY_DIR)
    shutil.copytree(workdir / layout.POLICY_DIR, broken / layout.WARMUP_DIR)
    DAMAGES[damage](broken / layout.POLICY_DIR)
    shown: list[object] = []  # what the chat's hook lets through to the default one
    monkeypatch.setattr(sys, "unraisablehook", chat.ignoring_closed_event_loops(shown.append))
    with pytest.raises(loading.ChatError) as err:
        loading.load_model(broken)
    if damage == "array files overwritten":
        time.sleep(1.0)  # the stray reports arrive from TensorStore's threads after the restore has failed
    assert shown == []
    message, policy = str(err.value), broken / layout.POLICY_DIR
    assert "\n" not in message and message.startswith(f"cannot restore the policy checkpoint {policy} (")
    assert "damaged or incomplete" in message and f"--workdir={broken}" in message
    assert f"or move {policy} away to chat with the warm-up checkpoint {broken / 'warmup'}" in message
    policy.rename(broken / "policy.damaged")  # the advice works
    loading.load_model(broken).close()


def test_the_unraisable_filter_passes_every_other_report():
    shown: list[object] = []
    hook = chat.ignoring_closed_event_loops(shown.append)
    closed, other = (types.SimpleNamespace(exc_value=e, object=None) for e in
                     (RuntimeError("Event loop is closed"), RuntimeError("something else")))
    hook(closed)
    hook(other)
    assert shown == [other]


def stub_session(tmp_path: Path, user: str = "nina") -> chat.ChatSession:
    """A chat whose agent saves every turn verbatim (no model): for the REPL's own behaviour."""
    return chat.ChatSession(store_workers.StubChatModel(), MemoryStore(tmp_path / "stub.sqlite"), user,
                            owns_store=True)


@pytest.mark.parametrize("errors", ["strict", "surrogateescape"])  # stdin's handler differs with the locale
def test_a_line_that_is_not_utf8_is_rejected_and_the_chat_goes_on(tmp_path, errors):
    """Issue 16: a Latin-1 line killed the chat (UnicodeDecodeError, or a TypeError in the tokenizer)."""
    typed = io.TextIOWrapper(io.BytesIO(b"hello\ncaf\xe9 au lait\n/forget \xff\nbye now\n"), encoding="utf-8",
                             errors=errors)
    out = io.StringIO()
    with stub_session(tmp_path) as s:
        assert chat.repl(s, typed, out) == 0
        assert [f.text for f in s.store.fragments("nina")] == ["hello", "bye now"]
    lines = out.getvalue().splitlines()
    assert lines[1:] == ["assistant: noted: hello",
                         "error: input is not valid UTF-8 (byte 0xe9 at column 4); turn ignored",
                         "error: input is not valid UTF-8 (byte 0xff at column 9); turn ignored",
                         "assistant: noted: bye now", "bye"]


class _UndecodableReads:
    """A text stream (not an io.TextIOWrapper) whose reads raise UnicodeDecodeError where a line holds None."""

    def __init__(self, lines: list[str | None]) -> None:
        self.lines = lines

    def readline(self) -> str:
        if not self.lines:
            return ""
        line = self.lines.pop(0)
        if line is None:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return line


def test_reads_that_fail_to_decode_are_skipped_and_a_stream_that_keeps_failing_ends_the_chat(tmp_path):
    out = io.StringIO()
    with stub_session(tmp_path) as s:
        chat.repl(s, _UndecodableReads(["hi\n", None, "again\n"]), out)
        assert out.getvalue().splitlines()[1:] == [
            "assistant: noted: hi", "error: input is not valid UTF-8 (invalid start byte at byte 0); turn ignored",
            "assistant: noted: again", "bye"]
        out = io.StringIO()
        chat.repl(s, _UndecodableReads([None] * 1000), out)
    lines = out.getvalue().splitlines()
    assert len(lines) == chat.MAX_FAILED_READS + 3 and lines[-2:] == [
        f"error: {chat.MAX_FAILED_READS} reads in a row failed to decode; leaving", "bye"]


def test_two_chats_of_one_user_keep_every_turn(tmp_path):
    """Issue 16: two chat processes of one user, started together, were both session 1, so their turns got the
    same memory ids and the second chat's memories were dropped (10 + 10 turns left 10)."""
    path, turns = str(tmp_path / "chat.sqlite"), 10
    reports = store_workers.run_processes([(store_workers.chat_turns, (path, p, turns)) for p in range(2)])
    assert sorted([reports["chat0"], reports["chat1"]]) == [1, 2]
    with MemoryStore(path) as store:
        frags = store.fragments(store_workers.CHAT_USER)
    assert sorted(f.text for f in frags) == sorted(f"process {p} says {n}" for p in range(2) for n in range(turns))
    for session in (reports["chat0"], reports["chat1"]):  # each process's turns, in order, in its own session
        process = 0 if session == reports["chat0"] else 1
        assert [f.text for f in frags if f.session == session] == [f"process {process} says {n}" for n in range(turns)]
        assert [f.turn for f in frags if f.session == session] == list(range(0, 2 * turns, 2))


def test_a_session_is_allocated_by_the_store(tmp_path):
    """The session number comes from the store's record, not from stored memories: a session that saved nothing,
    or whose memories were all forgotten, is not handed out again."""
    with stub_session(tmp_path, "olga") as first:
        assert first.session == 1
        first.send("one")
        first.command(f"/forget {first.last_receipt.fragment.fragment_id}")
    with stub_session(tmp_path, "olga") as second, stub_session(tmp_path, "olga") as third:
        assert (second.session, third.session) == (2, 3) and second.store.count("olga") == 0


def test_the_memory_api_on_a_trained_policy_saves_and_its_trigger_leads_search(workdir):
    """`icml_jax.memory_api.Memory(workdir=...)` on this module's trained run: the Planner's saves, the Trigger's
    pick first in search (issue 18)."""
    from icml_jax.memory_api import Memory

    with Memory(":memory:", workdir=workdir) as m:
        out = m.add([{"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."},
                     {"role": "user", "content": OTHER}], user_id="alice")
        assert [(r["memory"], r["event"]) for r in out["results"]] == [(FACT, "ADD"), (OTHER, "ADD")]
        fact, other = m.store.fragments("alice")
        assert (fact.decision_id, other.decision_id) == ("alice/api/1/0/planner", "alice/api/1/2/planner")
        assert m.store.history("alice", fact.fragment_id)[0].by == "alice/api/1/0/planner"
        hits = m.search(QUERY, "alice")["results"]
        assert hits[0]["id"] == fact.fragment_id and hits[0]["trigger_prob"] > 0.5
        assert [h["score"] for h in hits] == [0.0, 0.0]  # no word in common: BM25 alone would put OTHER first
        assert m.search(QUERY, "bob") == {"results": []} and m.get(fact.fragment_id, user_id="bob") is None


def test_history_and_memories_show_a_superseded_memory_and_its_replacement(tmp_path):
    """Issue 18: `/history ID` lists a memory's versions (added, replaced by which memory, by which decision);
    `/memories` marks a replaced one; the receipt of the save that replaced it says so."""
    from icml_jax.memory import NewFragment

    session = stub_session(tmp_path, "alice")
    old, new = session.store.append_many("alice", [
        NewFragment("chat", 1, 0, "I live in Paris.", "Lives in Paris.", "0"),
        NewFragment("chat", 2, 0, "I moved to Berlin.", "Lives in Berlin.", "0", decision_id="alice/chat/2/0/planner")])
    session.store.supersede("alice", [old.fragment_id], new.fragment_id, by=new.decision_id)
    lines = session.command(f"/history {old.fragment_id}").splitlines()
    assert len(lines) == 2 and lines[0].endswith("add: Lives in Paris.")
    assert f"replaced by {new.fragment_id} (alice/chat/2/0/planner): Lives in Paris." in lines[1]
    assert f"[replaced by {new.fragment_id}]" in session.command("/memories")
    assert session.command("/history m_nope") == "no memory m_nope for 'alice'"
    assert stub_session(tmp_path, "bob").command(f"/history {old.fragment_id}").startswith("no memory")


# -- issue 31: untrusted text at the chat's and the policy API's doors ---------------------------------------


def test_an_over_long_line_is_refused_in_one_line_at_the_boundary(tmp_path):
    """A 1 MB line was accepted and stored whole with the memory; now one error line, nothing stored."""
    limits = TextLimits(max_text_chars=10)
    typed = io.StringIO("a" * 10 + "\n" + "b" * 11 + "\n" + "c" * 1_048_575 + "\n" + "  " + "d" * 10 + "  \nok\n")
    out = io.StringIO()
    with chat.ChatSession(store_workers.StubChatModel(), MemoryStore(tmp_path / "s.sqlite"), "nina", owns_store=True,
                          limits=limits) as s:
        assert chat.repl(s, typed, out) == 0
        assert [f.text for f in s.store.fragments("nina")] == ["a" * 10, "d" * 10, "ok"]
        with pytest.raises(TextError, match=r"^ChatSession.send: text is 11 characters long, over the limit of 10"):
            s.send("e" * 11)
    too_long = "error: line of {} characters is over the limit of 10 (config limits.max_text_chars); turn ignored"
    assert out.getvalue().splitlines()[1:] == [
        "assistant: noted: " + "a" * 10, too_long.format(11), too_long.format(1_048_575),
        "assistant: noted: " + "d" * 10, "assistant: noted: ok", "bye"]


def test_the_default_cap_takes_a_full_turn_and_refuses_a_megabyte(tmp_path):
    cap = TextLimits().max_text_chars
    out = io.StringIO()
    with stub_session(tmp_path) as s:
        assert s.limits == TextLimits() and cap == 32_768
        chat.repl(s, io.StringIO("x" * cap + "\n" + "y" * 1_048_575 + "\n"), out)
        assert [len(f.text) for f in s.store.fragments("nina")] == [cap]
    assert out.getvalue().splitlines()[2] == (
        "error: line of 1048575 characters is over the limit of 32768 (config limits.max_text_chars); turn ignored")


def test_a_lone_surrogate_line_is_refused_and_the_chat_goes_on(tmp_path):
    out = io.StringIO()
    with stub_session(tmp_path) as s:
        chat.repl(s, io.StringIO("hi \ud800 there\n/forget \udbff\nfine\n"), out)
        assert [f.text for f in s.store.fragments("nina")] == ["fine"]
    assert out.getvalue().splitlines()[1:] == [
        "error: input is not valid text (holds a lone surrogate U+D800 (not valid Unicode text) at column 4); "
        "turn ignored",
        "error: input is not valid text (holds a lone surrogate U+DBFF (not valid Unicode text) at column 9); "
        "turn ignored",
        "assistant: noted: fine", "bye"]


def test_the_run_config_sets_the_chat_limits(workdir, tmp_path):
    """`config.limits` of the run (config.json) sets the chat's caps; a run written before the block has the
    defaults; a bad value there is one ChatError."""
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    config = json.loads((run / "config.json").read_text())
    assert config["limits"] == dataclasses.asdict(TextLimits())  # the main job writes the block
    del config["limits"]
    (run / "config.json").write_text(json.dumps(config))
    assert loading.load_model(run).limits == TextLimits()
    config["limits"] = {"max_text_chars": 20}
    (run / "config.json").write_text(json.dumps(config))
    loaded = loading.load_model(run)
    with chat.ChatSession.open(run, "una", model=loaded) as s:
        assert s.limits.max_text_chars == 20
    loaded.close()
    config["limits"] = {"max_text_chars": 0}
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(loading.ChatError, match=r"config.limits of .*: TextLimits.max_text_chars must be a positive"):
        loading.load_model(run)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(exclude_categories=()), max_size=30))
def test_the_memory_api_on_a_trained_policy_takes_any_text_or_refuses_it_with_one_error(workdir, text):
    """The issue's probe: a lone surrogate reached the tokenizer (`TypeError: TextEncodeInput must be ...` ten
    frames deep); now one TextError naming the method, the argument and the offset, and no session is left."""
    from icml_jax.memory_api import API_EPISODE, Memory

    with Memory(":memory:", workdir=workdir) as m:
        for call in (lambda: m.add(text, "alice"), lambda: m.search(text, "alice")):
            try:
                call()
            except TextError as e:
                assert e.where in ("Memory.add", "Memory.search") and e.offset is not None
                assert e.argument in ("messages", "query")
        # an add of valid text opens one session (saved or not); a refused one opens none
        assert m.store.open_session("alice", API_EPISODE) == 1 + int(bool(text.strip()) and _is_text(text))


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_the_memory_api_on_a_trained_policy_refuses_a_lone_surrogate_naming_the_call(workdir):
    from icml_jax.memory_api import Memory

    with Memory(":memory:", workdir=workdir) as m:
        assert m.limits == TextLimits()
        with pytest.raises(TextError, match=r"^Memory.add: messages holds a lone surrogate U\+D800 \(not valid "
                                            r"Unicode text\) at character 3$"):
            m.add("I'm\ud800 vegan", "alice")
        with pytest.raises(TextError, match=r"^Memory.search: query holds a lone surrogate U\+DFFF .* at character "
                                            r"0$"):
            m.search("\udfff dinner?", "alice")
        assert m.get_all("alice") == {"results": []}
