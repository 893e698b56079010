"""With remote back ends one online turn's proxy judge overlaps the agent's requests, the reply overlaps the
condense, and the decisions, memories and rewards equal the sequential turn's."""

from __future__ import annotations

import dataclasses
import threading

from icml_jax.agents.agent import AgentConfig
from icml_jax.data.persona_world import generate_episodes
from icml_jax.experiments.persona_run import PersonaRunConfig, build_learner
from icml_jax.llm.judges import ProxyJudge, QualityJudge
from icml_jax.llm.types import TASK_CONDENSE, TASK_PROXY_JUDGE, TASK_QUALITY_JUDGE, TASK_REPLY
from icml_jax.memory.store import MemoryStore
from icml_jax.rl import OnlineLearner, evaluate
from tests.agents.test_concurrency import SlowBackend, overlaps

RUN = PersonaRunConfig()  # the learning test's settings: compiled programs are shared with it


def learner_with(base: OnlineLearner, tokenizer, backend: SlowBackend, agent: AgentConfig) -> OnlineLearner:
    """A learner on `base`'s policies whose every back end is `backend`."""
    config = dataclasses.replace(base.config, agent=agent)
    return OnlineLearner(base.policies, tokenizer, MemoryStore(), backend, proxy_judge=ProxyJudge(backend),
                         quality_judge=QualityJudge(backend), config=config)


def play(learner: OnlineLearner, episode, turns: int) -> list[tuple]:
    """The first `turns` user turns of `episode`'s first session: (decisions, reply, memory, rewards) each."""
    out, history = [], []
    session = episode.sessions[0]
    for t, item in enumerate(session.turns[: turns]):
        r = learner.step_turn(episode, "u", 0, t, history)
        rec = learner._turns[-1]
        out.append((r.trigger.action, r.trigger.probs, r.planner.save, r.planner.prob_save, r.reply,
                    r.fragment and (r.fragment.fragment_id, r.fragment.text, r.fragment.extra),
                    rec.r_qual, rec.r_proxy, rec.planner_reward))
        history.append((item.speaker, item.text))
    return out


def test_turn_requests_overlap_and_results_equal(tmp_path):
    base, tokenizer = build_learner(RUN, tmp_path)
    episode = generate_episodes(RUN.world, 1)[0]
    agent = dataclasses.replace(base.config.agent, planner_rule="save_all")  # every turn condenses
    results = []
    for remote in (False, True):
        backend = SlowBackend(0.2, remote=remote)
        with learner_with(base, tokenizer, backend, agent) as learner:
            results.append(play(learner, episode, 1))
            assert (learner._pool is not None) == remote
        (proxy,), (reply,), (cond,), (qual,) = (backend.spans(t) for t in (
            TASK_PROXY_JUDGE, TASK_REPLY, TASK_CONDENSE, TASK_QUALITY_JUDGE))
        if remote:
            assert overlaps(proxy, reply) and overlaps(proxy, cond) and overlaps(reply, cond)
            assert qual[0] >= reply[1]  # the quality judge reads the reply
        else:
            assert reply[1] <= cond[0] <= cond[1] <= qual[0] <= qual[1] <= proxy[0]  # today's order
    assert results[0] == results[1]


def test_policy_turns_equal_sequential(tmp_path):
    """Sampled Trigger and Planner decisions (RNG order), memories and rewards match over several turns."""
    base, tokenizer = build_learner(RUN, tmp_path)
    episode = generate_episodes(RUN.world, 1)[0]
    results = []
    for remote in (False, True):
        with learner_with(base, tokenizer, SlowBackend(0.005, remote=remote), base.config.agent) as learner:
            results.append(play(learner, episode, 4))
    assert results[0] == results[1]
    assert any(r[0] for r in results[0]) and any(r[2] for r in results[0])  # memories used and saved


def test_local_proxy_judge_stays_on_calling_thread(tmp_path):
    """Only remote back ends' requests leave the calling thread: a local proxy judge runs last, as before."""
    base, tokenizer = build_learner(RUN, tmp_path)
    episode = generate_episodes(RUN.world, 1)[0]
    remote, local = SlowBackend(0.05, remote=True), SlowBackend(0.05, remote=False)
    config = dataclasses.replace(base.config, agent=dataclasses.replace(base.config.agent, planner_rule="save_all"))
    with OnlineLearner(base.policies, tokenizer, MemoryStore(), remote, proxy_judge=ProxyJudge(local),
                       quality_judge=QualityJudge(remote), config=config) as learner:
        play(learner, episode, 1)
    (proxy,), (qual,) = local.spans(TASK_PROXY_JUDGE), remote.spans(TASK_QUALITY_JUDGE)
    assert qual[1] <= proxy[0] and local.threads[TASK_PROXY_JUDGE] == threading.main_thread().name


def test_evaluate_closes_the_agents_pool(tmp_path):
    """`evaluate` with a remote back end leaves no request thread behind."""
    base, tokenizer = build_learner(RUN, tmp_path)
    episode = generate_episodes(RUN.world, 1)[0]
    backend = SlowBackend(0.0, remote=True)
    agent = dataclasses.replace(base.config.agent, planner_rule="save_all")  # every turn uses the pool
    counts = evaluate(base.policies, tokenizer, [episode], agent_config=agent, backend=backend)
    assert counts and "agent_0" in backend.threads.values()  # the pool was made (the reply went there)
    assert not [t for t in threading.enumerate() if t.name.startswith("agent")]
