"""Per-session efficiency (Figures 9, 10, 15): what the protocol records per session, and the summary's means
from known numbers."""

from __future__ import annotations

import pytest

from icml_jax.evaluation.protocol import AgentReply, EpisodeResult, MemoryChoice, play_episode
from icml_jax.evaluation.report import per_session_efficiency
from tests.baselines.helpers import count_words, episode

NONE = MemoryChoice(None, None, None, None)


class Spender:
    """An agent that spends known generator tokens: 10 prompt + 2 output per observed turn of session s (s + 1
    times), 7 prompt per reply; reports 5 ms of construction per observed turn."""

    name = "spender"

    def __init__(self) -> None:
        self.used = {"calls": 0, "prompt_tokens": 0, "output_tokens": 0}

    def reset(self) -> None:
        pass

    def observe(self, user_id, ep, session, turn, history):
        self.used["calls"] += session + 1
        self.used["prompt_tokens"] += 10 * (session + 1)
        self.used["output_tokens"] += 2 * (session + 1)
        return NONE, False, 5.0

    def answer(self, user_id, ep, targets, histories):
        self.used["calls"] += len(targets)
        self.used["prompt_tokens"] += 7 * len(targets)
        return [AgentReply("ok", NONE, 7, 0, 1.5, 2.0) for _ in targets]

    def memory_texts(self, user_id):
        return ["a b c"]


def test_play_records_each_sessions_tokens_turns_and_time():
    agent = Spender()
    ep = episode(["hi", "I have a dog."], ["I like tea.", "bye"], ["Hello", "How is it?", "ok"])
    result = play_episode(agent, ep, user_speaker="user", count_tokens=count_words, usage=lambda: agent.used)
    assert result.observed_sessions == [0, 0, 1, 1]  # the user's turns of the two history sessions
    assert result.session_usage == [{"calls": 2, "prompt_tokens": 20, "output_tokens": 4},
                                    {"calls": 4, "prompt_tokens": 40, "output_tokens": 8},
                                    {"calls": 5, "prompt_tokens": 35, "output_tokens": 0}]  # 5 targets
    assert len(result.session_ms) == 3 and all(ms >= 0 for ms in result.session_ms)
    assert len(result.observe_retrieval_ms) == 4 and all(ms >= 0 for ms in result.observe_retrieval_ms)
    unmeasured = play_episode(agent, ep, user_speaker="user", count_tokens=count_words)
    assert unmeasured.session_usage == [] and len(unmeasured.session_ms) == 3


def _result(eid: str, scale: float) -> EpisodeResult:
    """Two history sessions (2 observed turns, then 1) and a final one with two targets; latencies x `scale`."""
    targets = [{"retrieval_ms": 4.0 * scale}, {"retrieval_ms": 6.0 * scale}]
    return EpisodeResult(eid, targets, [], storage_tokens=[10, 30], memories=[1, 3],
                         construction_ms=[1.0 * scale, 3.0 * scale, 8.0 * scale],
                         observed_sessions=[0, 0, 1], observe_retrieval_ms=[2.0 * scale, 2.0 * scale, 5.0 * scale],
                         session_ms=[100.0 * scale, 200.0 * scale, 300.0 * scale],
                         session_usage=[{"calls": 1, "prompt_tokens": 10, "output_tokens": 1},
                                        {"calls": 0, "prompt_tokens": 0, "output_tokens": 0},
                                        {"calls": 2, "prompt_tokens": 50, "output_tokens": 9}])


def test_per_session_means_leave_the_first_episode_out_of_latencies_only():
    first, second, third = _result("a", 1000.0), _result("b", 1.0), _result("c", 3.0)
    rows = per_session_efficiency([first, second, third])
    assert [r["session"] for r in rows] == [1, 2, 3] and [r["final_in"] for r in rows] == [0, 0, 3]
    assert [r["inference_tokens"] for r in rows] == [11.0, 0.0, 59.0]  # prompt + output, every episode
    assert [r["storage_tokens"] for r in rows] == [10.0, 30.0, None]
    # latencies: episodes b (x1) and c (x3) only, mean scale 2
    assert [r["construction_ms"] for r in rows] == pytest.approx([8.0, 16.0, None])  # session totals
    assert rows[0]["construction_ms_per_turn"] == pytest.approx(4.0)  # (1 + 3) x 2 / 2
    assert [r["retrieval_ms"] for r in rows] == pytest.approx([4.0, 10.0, 10.0])  # final: the targets'
    assert [r["processing_s"] for r in rows] == pytest.approx([0.2, 0.4, 0.6])
    assert [r["timed_episodes"] for r in rows] == [2, 2, 2]


def test_results_without_session_timings_give_empty_latencies():
    old = EpisodeResult("a", [{"retrieval_ms": 1.0}], [], [5], [1], [2.0])
    (hist, final) = per_session_efficiency([old])
    assert hist["storage_tokens"] == 5.0 and hist["inference_tokens"] is None
    assert hist["construction_ms"] is None and hist["processing_s"] is None
    assert final["retrieval_ms"] == 1.0
