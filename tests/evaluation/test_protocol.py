"""The protocol's lockstep play (`play_group`): episodes of distinct users played together give each episode the
result it gets alone, in batched calls, with the agent's `end_histories` between the histories and the targets."""

from __future__ import annotations

import pytest

from icml_jax.evaluation.protocol import AgentReply, MemoryChoice, play
from tests.baselines.helpers import count_words, episode


class Recorder:
    """A deterministic agent with per-user memory: saves every turn holding "I", recalls its latest memory;
    logs its calls (batch sizes of `observe_many`, `end_histories`, `answer`)."""

    name = "recorder"

    def __init__(self, lockstep: int) -> None:
        self.lockstep, self.memory, self.log = lockstep, {}, []

    def reset(self) -> None:
        self.memory.clear()

    def _one(self, user, ep, session, turn, history):
        texts = self.memory.setdefault(user, [])
        choice = (MemoryChoice(f"{user}-{len(texts)}", texts[-1][0], texts[-1][1], 0.5) if texts
                  else MemoryChoice(None, None, None, 0.5))
        text = ep.sessions[session].turns[turn].text
        saved = "I" in text.split()
        if saved:
            texts.append((text, (ep.episode_id, session, turn)))
        return choice, saved, 1.0

    def observe(self, user, ep, session, turn, history):
        self.log.append(("observe", user))
        return self._one(user, ep, session, turn, history)

    def observe_many(self, items):
        self.log.append(("observe_many", tuple(user for user, *_ in items)))
        return [self._one(*item) for item in items]

    def end_histories(self, users):
        self.log.append(("end", tuple(users)))

    def answer(self, user, ep, targets, histories):
        self.log.append(("answer", user))
        texts = self.memory.get(user, [])
        choice = MemoryChoice("m", texts[-1][0], texts[-1][1], None) if texts else MemoryChoice(None, None, None, None)
        return [AgentReply(f"{user}:{t.turn}:{len(h)}", choice, 3, 1, 0.0, 0.0)
                for t, h in zip(targets, histories, strict=True)]

    def memory_texts(self, user):
        return [text for text, _ in self.memory.get(user, [])]


EPISODES = [
    episode(["hi", "I have a dog."], ["I like tea.", "bye"], ["Hello", "How is it?", "ok"], episode_id="a"),
    episode(["I run.", "x"], ["I swim daily.", "y", "I am tired."], episode_id="b"),
    episode(["no", "none"], ["still", "nothing"], ["I moved.", "z"], ["q", "w", "e"], episode_id="c"),
    episode(["I cook.", "ok"], ["done"], episode_id="d"),
]


def _plain(result):
    """An EpisodeResult without its wall times."""
    return (result.episode_id, result.targets, [vars(c) for c in result.counts], result.storage_tokens,
            result.memories, result.saved, result.observed_sessions, result.construction_ms,
            [{k: v for k, v in u.items()} for u in result.session_usage], len(result.session_ms))


@pytest.mark.parametrize("size", [2, 3, 4])
def test_lockstep_groups_give_each_episode_its_sequential_result(size):
    alone, together = Recorder(1), Recorder(size)
    one = play(alone, EPISODES, user_speaker="user", count_tokens=count_words)
    grouped = play(together, EPISODES, user_speaker="user", count_tokens=count_words)
    assert [_plain(r) for r in grouped] == [_plain(r) for r in one]
    groups = [tuple(e.episode_id for e in EPISODES[i:i + size]) for i in range(0, len(EPISODES), size)]
    assert [users for kind, users in together.log if kind == "end"] == groups
    # per group: ticks batch every episode still playing, then one end_histories, then the answers in order
    start = 0
    for group in groups:
        end = together.log.index(("end", group), start)
        ticks = [users for kind, users in together.log[start:end]]
        assert max(len(t) for t in ticks) == len(group) and set().union(*map(set, ticks)) == set(group)
        assert together.log[end + 1:end + 1 + len(group)] == [("answer", u) for u in group]
        start = end + 1 + len(group)


def test_a_tick_shares_its_time_and_tokens_and_a_repeated_user_starts_a_new_group():
    used = {"calls": 0, "prompt_tokens": 0, "output_tokens": 0}

    class Spender(Recorder):
        def observe_many(self, items):  # 6 prompt tokens per tick, whatever its size
            used["prompt_tokens"] += 6
            return super().observe_many(items)

    agent = Spender(2)
    results = play(agent, EPISODES[:2], user_speaker="user", count_tokens=count_words, usage=lambda: used)
    ticks = [users for kind, users in agent.log if kind == "observe_many"]
    assert [len(t) for t in ticks] == [2, 2, 1, 1]  # history sessions: a's 2 + 2 user turns, b's 2
    history = [u["prompt_tokens"] for r in results for u in r.session_usage[:-1]]
    assert history == [3 + 3, 6 + 6, 3 + 3]  # a 2-user tick: 3 tokens each; a 1-user tick: all 6
    assert all(len(r.construction_ms) == len(r.observed_sessions) for r in results)
    again = Recorder(2)
    twice = play(again, [EPISODES[0], EPISODES[0]], user_speaker="user", count_tokens=count_words)
    assert [users for kind, users in again.log if kind == "end"] == [("a",), ("a",)]  # never one user twice at once
    assert _plain(twice[0]) == _plain(twice[1])


def test_a_learning_agent_memorizes_in_lockstep_through_the_learner():
    """LoCoMo's ingestion in lockstep with `eval.learn` (ours_online): one learner step for the tick's users, each
    episode whole (its questions come after it), so the turns are turns of Algorithm 1, not plain saves."""
    from types import SimpleNamespace

    from icml_jax.evaluation.protocol import LearningAgent

    calls = []

    class Learner:
        agent = SimpleNamespace(config=None)

        def step_turns(self, turns):
            calls.append(turns)
            return [SimpleNamespace(planner=SimpleNamespace(save=t == 0)) for _, _, _, t, _ in turns]

    agent = LearningAgent(Learner(), lockstep=2)
    a, b = EPISODES[0], EPISODES[1]
    out = agent.memorize_many([("ua", a, 0, 0, ()), ("ub", b, 0, 1, [("user", "hi")])])
    assert [saved for saved, _ in out] == [True, False] and out[0][1] == out[1][1]
    assert calls == [[(a, "ua", 0, 0, ()), (b, "ub", 0, 1, (("user", "hi"),))]]
    assert agent.memorize("ua", a, 0, 0, ())[0] and len(calls) == 2
