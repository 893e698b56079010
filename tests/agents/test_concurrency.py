"""A remote back end's reply and condense requests of one agent turn are in flight together; results unchanged."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from icml_jax.agents import AgentConfig, MemoryAgent, ObservationConfig
from icml_jax.llm import OfflineBackend
from icml_jax.llm.types import TASK_CONDENSE, TASK_REPLY, LLMRequest, LLMResponse
from icml_jax.memory import MemoryStore

CFG = AgentConfig(observation=ObservationConfig(max_length=64, min_length_bucket=16, max_candidates=3),
                  reply_max_tokens=8)


class SlowBackend:
    """The offline back end's answers after `delay_s` per call, recording (task, start, end) per request;
    `remote` says whether the agent may overlap its calls."""

    name = "slow"

    def __init__(self, delay_s: float = 0.2, remote: bool = True) -> None:
        self.inner, self.delay_s, self.remote = OfflineBackend(), delay_s, remote
        self.intervals: list[tuple[str, float, float]] = []
        self.threads: dict[str, str] = {}  # task -> the thread that sent it
        self._lock = threading.Lock()

    @property
    def usage(self):
        return self.inner.usage

    def close(self) -> None:
        """Nothing to release."""

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        start = time.perf_counter()
        time.sleep(self.delay_s)
        out = self.inner.generate(requests)
        end = time.perf_counter()
        with self._lock:
            self.intervals += [(r.task, start, end) for r in requests]
            self.threads.update({r.task: threading.current_thread().name for r in requests})
        return out

    def spans(self, task: str) -> list[tuple[float, float]]:
        return [(s, e) for t, s, e in self.intervals if t == task]


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def run_turns(agent: MemoryAgent) -> list:
    history, receipts = [], []
    for turn, utterance in enumerate(["i like my dog", "no meat please i am vegan", "what do we eat tonight"]):
        reply, receipt = agent.step("alice", utterance, history=history, episode_id="e1", session=0, turn=turn)
        history += [("User", utterance), ("Assistant", reply)]
        receipts.append(receipt)
    return receipts


def comparable(receipts) -> list:
    return [(r.reply, r.trigger.action, r.trigger.probs, r.planner.save, r.planner.prob_save,
             r.fragment and (r.fragment.fragment_id, r.fragment.text, r.fragment.extra), r.replaced)
            for r in receipts]


def test_remote_turn_overlaps_reply_and_condense(policies, tokenizer):
    backend = SlowBackend(0.2, remote=True)
    agent = MemoryAgent(policies, tokenizer, MemoryStore(), backend,
                        config=AgentConfig(observation=CFG.observation, reply_max_tokens=8, planner_rule="save_all"))
    _, receipt = agent.step("alice", "i like my dog", episode_id="e1")
    agent.close()
    (reply,), (cond,) = backend.spans(TASK_REPLY), backend.spans(TASK_CONDENSE)
    assert receipt.fragment is not None and overlaps(reply, cond)
    assert backend.threads[TASK_CONDENSE] == threading.main_thread().name  # the reply went to the pool
    assert max(reply[1], cond[1]) - min(reply[0], cond[0]) < 0.35  # together, not one 0.2 s after the other


def test_local_generator_stays_on_calling_thread(policies, tokenizer):
    """A local generator beside a remote condenser: the condense goes out on the pool, the reply runs here."""
    local, remote = SlowBackend(0.2, remote=False), SlowBackend(0.2, remote=True)
    agent = MemoryAgent(policies, tokenizer, MemoryStore(), local, condenser=remote,
                        config=AgentConfig(observation=CFG.observation, reply_max_tokens=8, planner_rule="save_all"))
    agent.step("alice", "i like my dog", episode_id="e1")
    agent.close()
    (reply,), (cond,) = local.spans(TASK_REPLY), remote.spans(TASK_CONDENSE)
    assert overlaps(reply, cond)
    assert local.threads[TASK_REPLY] == threading.main_thread().name != remote.threads[TASK_CONDENSE]


def test_local_turn_stays_sequential(policies, tokenizer):
    backend = SlowBackend(0.05, remote=False)
    agent = MemoryAgent(policies, tokenizer, MemoryStore(), backend,
                        config=AgentConfig(observation=CFG.observation, reply_max_tokens=8, planner_rule="save_all"))
    agent.step("alice", "i like my dog", episode_id="e1")
    (reply,), (cond,) = backend.spans(TASK_REPLY), backend.spans(TASK_CONDENSE)
    assert reply[1] <= cond[0] and agent._pool is None  # reply, then condense; no thread made


def test_remote_turns_equal_sequential(policies, tokenizer):
    """Same seed and answers: decisions, replies and stored memories (supersedes included) are identical."""
    results, stores = [], []
    for remote in (False, True):
        store = MemoryStore()
        agent = MemoryAgent(policies, tokenizer, store, SlowBackend(0.01, remote=remote), config=CFG, seed=3)
        results.append(comparable(run_turns(agent)))
        stores.append([(f.fragment_id, f.text, f.superseded_by) for f in store.fragments("alice")])
        agent.close()
    assert results[0] == results[1] and stores[0] == stores[1]
    assert any(r[3] for r in results[0])  # at least one turn saved, so the condense path was compared
