"""scripts/benchmark_served_generator.py without a real model (a few seconds): its comparison on 2 targets with the
offline back end as the local arm and the OpenAI-compatible back end against the loopback fake server as the served
arm; and its server starter's error when the server exits before answering."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest

from tests.scripts_loader import load_script

from icml_jax.baselines.common import ReplySettings
from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.llm.offline import OfflineBackend
from icml_jax.llm.registry import make_backend
from icml_jax.llm.prompts import reply_request, unquote
from icml_jax.llm.types import TASK_REPLY, LLMRequest
from tests.llm.loopback import loopback_server
from tests.llm.test_llm_openai import FakeOpenAI, _handler, ok

UTTERANCES = ("I adopted a puppy last week.", "We went hiking on Sunday.", "My sister is visiting soon.")
SETTINGS = ReplySettings(temperature=0.0, max_tokens=32)  # greedy, gc_smollm2's reply cap


bench = load_script("benchmark_served_generator")


def _episode() -> Episode:
    """Two sessions; the final one is the user's UTTERANCES, so its targets (turns 1 and 2) reply to the first two."""
    first = Session((Turn("user", "Hello there."), Turn("assistant", "Hi!")))
    final = Session(tuple(Turn("user", u) for u in UTTERANCES), gap_seconds=86400.0, gap_text="1 day")
    return Episode("test", "ep-1", (first, final))


def _offline_reply(utterance: str) -> str:
    """The offline back end's reply to an utterance without memory."""
    return f'You said "{utterance}" - tell me more about that.'


def _responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake server: to UTTERANCES[0] the offline reply exactly, to [1] the offline reply and a newline (the raw
    strings differ, the stripped ones agree), to [2] another reply; 40 prompt tokens and 3 + index output tokens
    each. Anything else (the served warm-up) gets "warm"."""
    assert body["temperature"] == 0.0
    turns = unquote("user_turn", body["messages"][-1]["content"])
    said = turns[-1].removeprefix("User: ") if turns else None
    if said not in UTTERANCES:
        return ok("warm", 5, 1)
    assert body["max_tokens"] == 32
    i = UTTERANCES.index(said)
    text = (_offline_reply(said), _offline_reply(said) + "\n", "Something else entirely.")[i]
    return ok(text, 40, 3 + i)


@pytest.fixture
def server() -> Any:
    """A loopback fake OpenAI-compatible server, stopped after the test."""
    state = FakeOpenAI()
    state.responder = _responder
    with loopback_server(_handler(state)) as state.port:
        yield state


def _served(server: FakeOpenAI, concurrency: int = 2) -> Any:
    """The script's served back end on the fake server."""
    return make_backend(bench.served_block(server.base_url, "fake", concurrency=concurrency, n_ctx=None))


def test_the_comparison_on_two_targets(server):
    batches = bench.reply_batches([_episode()], targets=2)
    assert [(t.session, t.turn) for b in batches for t in b.targets] == [(1, 1), (1, 2)]
    assert batches[0].histories == ([], [("user", UTTERANCES[0])])  # the evaluation's gold histories
    with _served(server) as served:
        result = bench.compare(batches, OfflineBackend(), served, user_speaker="user", settings=SETTINGS)
    rows = result.targets
    assert [(r["turn"], r["local"], r["served"]) for r in rows] == [
        (1, _offline_reply(UTTERANCES[0]), _offline_reply(UTTERANCES[0])),
        (2, _offline_reply(UTTERANCES[1]), _offline_reply(UTTERANCES[1]) + "\n")]
    assert (result.n, result.identical, result.identical_stripped, result.common_prefix) == (2, 1, 2, 1.0)
    local, remote = result.local, result.served
    assert (local.requests, local.calls, remote.requests, remote.calls) == (2, 1, 2, 1)
    assert (remote.prompt_tokens, remote.output_tokens) == (40 + 40, 3 + 4)  # the server's counts, no warm-up
    assert local.output_tokens == sum(len(r["local"].split()) for r in rows)  # the offline back end counts words
    assert result.local_warmup_s is not None and result.local_warmup_s >= 0
    for arm in (local, remote):
        assert arm.wall_s > 0 and arm.retries == 0
        assert math.isclose(arm.requests_per_s, arm.requests / arm.wall_s)
        assert math.isclose(arm.output_tokens_per_s, arm.output_tokens / arm.wall_s)
    assert server.hits == 1 + 2  # the served warm-up, then each target once
    table = bench.markdown(result, local_note="offline", served_note="fake", machine="cpu", load_start="1.00",
                           load_end="2.00")
    assert "Identical greedy replies: 1/2 (50.0%) as raw strings, 2/2 (100.0%) after whitespace strip" in table
    assert f"| local: offline | 2 (1) | {local.wall_s:.2f} s | {local.requests_per_s:.3f} |" in table
    assert f"| served: fake | 2 (1) | {remote.wall_s:.2f} s |" in table
    assert "they share 100.0% of the local reply's words on average" in table
    assert "Prompt token counts equal (the chat templates agree): 0/2." in table
    assert "load average (1, 5, 15 min) 1.00 at start, 2.00 at the end" in table


def test_every_target_without_warm_ups(server):
    batches = bench.reply_batches([_episode(), _episode()], targets=None)
    assert [len(b.targets) for b in batches] == [2, 2]  # one call per episode's final session
    with _served(server, concurrency=4) as served:
        result = bench.compare(batches, OfflineBackend(), served, user_speaker="user", settings=SETTINGS,
                               warmup=False, served_warmup=False)
    assert (result.n, result.identical, result.identical_stripped) == (4, 2, 4)
    assert result.common_prefix == 1.0  # whitespace apart, the same words
    assert result.local_warmup_s is None and result.local.calls == result.served.calls == 2
    assert result.served.output_tokens == 2 * (3 + 4) and server.hits == 4


def _requests(batches: list[Any], settings: ReplySettings) -> list[LLMRequest]:
    """The requests the script's no-memory agent sends for `batches` at `settings`."""
    rec = bench.Recorder(OfflineBackend())
    agent = bench.NoMemoryAgent(rec, user_speaker="user", reply=settings)
    for b in batches:
        bench._answer(agent, b)
    return rec.requests


def test_the_requests_are_the_evaluations_and_a_difference_is_named():
    batches = bench.reply_batches([_episode()], targets=2)
    sent = _requests(batches, SETTINGS)
    assert [r.task for r in sent] == [TASK_REPLY] * 2 and all(r.temperature == 0.0 for r in sent)
    assert sent[1].prompt == reply_request([("user", UTTERANCES[0])], UTTERANCES[1], None).prompt
    assert bench._first_difference(sent, _requests(batches, SETTINGS)) is None
    other = _requests(batches, ReplySettings(temperature=0.0, max_tokens=16))
    assert bench._first_difference(sent, other) == "request 0 differs in ['max_output_tokens']"
    assert bench._first_difference(sent, sent[:1]) == "2 requests against 1"


def test_the_common_prefix_of_near_misses():
    rows = [{"local": "a b c d", "served": "a b x d"}, {"local": "a b", "served": "z"},
            {"local": "a  b", "served": "a b"}, {"local": "a b c d", "served": "a b"}]
    result = bench.Comparison(*[bench.Arm("x", 4, 1, 1.0, 0, 0)] * 2, None, rows)
    assert (result.identical, result.identical_stripped) == (0, 0)
    assert math.isclose(result.common_prefix, (2 / 4 + 0 + 1 + 2 / 4) / 4)


def test_a_server_that_exits_is_named_with_its_log(tmp_path):
    command = [sys.executable, "-c", "import sys; print('cannot load model: no such file'); sys.exit(3)"]
    with pytest.raises(bench.ServerError) as ei:
        with bench.running_server(command, f"http://127.0.0.1:{bench.free_port()}/v1", tmp_path / "log",
                                  timeout_s=30):
            pass
    assert "exited with 3 before answering" in str(ei.value) and "cannot load model: no such file" in str(ei.value)
