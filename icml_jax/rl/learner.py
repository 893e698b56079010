"""The online learner (Algorithm 1): play labelled or unlabelled episodes turn by turn, reward both agents,
send future reply quality back to past saves, and run the joint PPO update every N episodes.

Per user turn: Trigger -> reply -> quality reward (Trigger) -> truth-reward propagation to the chosen memory's
save -> Planner -> proxy reward -> miss penalty (discard) or Pending Reward Buffer (save). The agent acts on
the turns of `user_speaker`; its history is the gold dialogue of the session so far (the evaluation
protocol). A judge failure masks that one decision out of the update and is counted. At an update the buffer
is finalized (the episode's user is closed: all of its sessions have been played), rewards become GAE
advantages per agent (one trajectory per episode, rollout values), and `JointUpdater` runs the PPO epochs
with the ratio anchored on the log-probabilities recorded when each decision was sampled (the behaviour
policy; `PPOConfig.old_logp`).

Everything the run needs to resume (trainable parameters, optimizer state, buffer, RNGs, counters) is in
`state_dict()`, as plain data and arrays, taken between updates.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from icml_jax import parallel
from icml_jax.agents.agent import AgentConfig, MemoryAgent, Receipt, TurnInput
from icml_jax.agents.policy import TRAINABLE, MemoryPolicies
from icml_jax.checkpoint import flat_arrays, restore_arrays
from icml_jax.data.labels import SessionCounts, memory_label, pooled_metrics, session_counts
from icml_jax.data.schema import Episode
from icml_jax.llm.judges import ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.llm.types import LLMBackend, TokenUsage
from icml_jax.memory.store import MemoryStore
from icml_jax.rl.batch import collate, partition, rollout_stats
from icml_jax.rl.config import PPOConfig, RewardConfig
from icml_jax.rl.divergence import DivergenceConfig
from icml_jax.rl.likelihood import control_texts, later_targets, next_gold_turn
from icml_jax.rl.pending import PendingRewardBuffer, SaveReward
from icml_jax.rl.rewards import planner_reward
from icml_jax.rl.rollout import agent_turns, decision_keys, lockstep
from icml_jax.rl.save_log import SaveLogEntry
from icml_jax.rl.trajectory import TurnRecord, build_slots
from icml_jax.rl.updater import JointUpdater, UpdateResult

STATE_FORMAT = "icml_jax.rl.OnlineLearner"
STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Knobs of the online loop; PPO and reward settings keep the paper's defaults."""

    ppo: PPOConfig = PPOConfig()
    reward: RewardConfig = RewardConfig()
    agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)
    update_every: int = 1  # episodes per PPO update
    seed: int = 0
    user_speaker: str | None = "user"  # the agent acts on this speaker's turns; None: on every turn (real data)
    fresh_memory: bool = True  # wipe the user's memory when one of its episodes starts (replays start clean)
    users_in_flight: int = 1  # episodes (users) played in lockstep, their decisions batched (divides update_every)
    divergence: DivergenceConfig = DivergenceConfig()  # when an update counts as diverged, and what then

    def __post_init__(self) -> None:
        if not isinstance(self.update_every, int) or self.update_every < 1:
            raise ValueError(f"LearnerConfig.update_every must be a positive int, got {self.update_every!r}")
        b = self.users_in_flight
        if isinstance(b, bool) or not isinstance(b, int) or b < 1 or self.update_every % b:
            raise ValueError(f"LearnerConfig.users_in_flight must be a positive int dividing update_every="
                             f"{self.update_every} (an update falls between groups of users), got {b!r}")
        if self.agent.greedy:
            raise ValueError("LearnerConfig.agent.greedy must be False: PPO needs sampled decisions")
        if self.agent.planner_rule != "policy" and self.agent.trigger_rule != "policy":
            raise ValueError("LearnerConfig.agent: both the Planner and the Trigger are rules; nothing would learn")


@dataclasses.dataclass
class _UpdateView:
    """What an update trains on and reports: one process's, or every process's merged (`OnlineLearner._gather`)."""

    records: list[Any]  # TurnRecord of the turns played since the last update
    ready: list[Any]  # TurnRecord of earlier saves whose reward arrived now
    saves: list[SaveReward]  # the save rewards finalized now
    proxy_failures: int
    quality_failures: int
    usage: TokenUsage
    counts: list[SessionCounts]  # label counts since the last update
    waiting: int  # saves still in the pending buffer
    holdover: int


def _unique_backends(backends: Iterable[Any]) -> list[Any]:
    """The distinct back ends among `backends` (None skipped), in order: whose token usage the learner sums."""
    seen, out = set(), []
    for b in backends:
        if b is not None and id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out


class OnlineLearner:
    """Algorithm 1: the memory agent plays episodes, earns rewards and is updated by joint PPO."""

    def __init__(
        self,
        policies: MemoryPolicies,
        tokenizer,
        store: MemoryStore,
        generator: LLMBackend,
        *,
        proxy_judge: ProxyJudge,
        quality_judge: QualityJudge,
        condenser: LLMBackend | None = None,
        config: LearnerConfig | None = None,
        update_mesh: Mesh | None = None,
    ) -> None:
        """`update_mesh`: where the PPO update runs (default: the policies' mesh). In a run of several JAX
        processes each learner plays its own users on its process's devices, and every update is one global
        step over all processes' decisions on this mesh (`parallel.process_meshes`)."""
        self.config = config or LearnerConfig()
        self.processes = jax.process_count()  # each plays every P-th episode; episodes_seen counts them all
        self.policies, self.store = policies, store
        self.proxy_judge, self.quality_judge = proxy_judge, quality_judge
        self.agent = MemoryAgent(policies, tokenizer, store, generator, condenser=condenser,
                                 config=dataclasses.replace(self.config.agent), seed=self.config.seed)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.updater = JointUpdater(policies, self.config.ppo, self.config.divergence, mesh=update_mesh)
        self.buffer = PendingRewardBuffer(self.config.reward)
        self.rng = np.random.default_rng(self.config.seed)
        self._backends = _unique_backends([generator, condenser, proxy_judge.backend, quality_judge.backend])
        self._turns: list[TurnRecord] = []
        self._holdover: dict[str, TurnRecord] = {}  # saves whose reward is still pending ("defer")
        self._closed: set[str] = set()
        self._counts: list[SessionCounts] = []  # label counts since the last update
        self.session_log: list[SessionCounts] = []  # every session played, in order (the learning curve)
        self.save_log: list[SaveLogEntry] = []  # every finalized save's session and rewards (Table 8's r)
        self.last_finalized: list[SaveReward] = []  # save rewards emitted by the last update (inspection, logs)
        self.last_receipts: list[Receipt] = []  # the receipts of the last episode played (inspection, `/why`)
        self.last_records: list[TurnRecord] = []  # the turns the last update trained on, with their rewards
        self.episodes_seen = 0
        self.updates = 0
        self.turns_seen = 0
        self._since = self._fresh_since()
        self._pool: cf.ThreadPoolExecutor | None = None  # made by the first turn with a remote back end

    # ------------------------------------------------------------------ the turn loop
    def _fresh_since(self) -> dict[str, Any]:
        """Counters reset at every update: judge failures and back-end token totals."""
        return {"proxy_failures": 0, "quality_failures": 0, "usage": self._usage(), "time": time.perf_counter()}

    def _usage(self) -> TokenUsage:
        """Tokens, attempts, retries and failures of every back end so far."""
        return sum((b.usage for b in self._backends), TokenUsage())

    def run_episode(self, episode: Episode, user_id: str | None = None) -> dict[str, float]:
        """Plays every session of `episode` as one user; updates when `update_every` episodes are done.

        Returns the episode's metrics, plus the update's metrics when one ran.
        """
        return self.run_episodes([episode], None if user_id is None else [user_id])[0]

    def run_episodes(self, episodes: Sequence[Episode], user_ids: Sequence[str] | None = None,
                     ordinals: Sequence[int] | None = None) -> list[dict[str, float]]:
        """Plays `episodes` (distinct users) in lockstep: per tick, every episode still playing takes its next
        turn, decided in one Trigger and one Planner forward pass over all of them (`MemoryAgent.step_many`);
        memories and pending rewards stay per user. Each decision's key depends only on (episode ordinal, session,
        turn), and the turns join the update in episode order, so the result is the one of playing the episodes
        one by one (`users_in_flight=1`) up to float rounding of the batched forward passes.

        Returns each episode's metrics, in order; an update runs when the count of episodes reaches a multiple of
        `update_every` (its metrics join that episode's).

        `ordinals`: each episode's place in the run's stream (its decisions' keys and its order in the update);
        by default the next ones. With P processes, process p plays the episodes of ordinals p, p + P, ... (the
        default is `episodes_seen + i * P + p`): every process calls this with the same number of episodes, and
        each episode counts P towards `episodes_seen` (all processes played one), so the updates, a collective
        over all processes' decisions, fall at the same calls everywhere.
        """
        users = list(user_ids) if user_ids is not None else [e.episode_id for e in episodes]
        if len(users) != len(episodes) or len(set(users)) != len(users):
            raise ValueError(f"OnlineLearner.run_episodes: one distinct user per episode, got {users} for "
                             f"{[e.episode_id for e in episodes]}")
        schedules = [agent_turns(e, self.config.user_speaker) for e in episodes]
        for e, sched in zip(episodes, schedules, strict=True):
            if not sched:
                whose = ("any speaker" if self.config.user_speaker is None
                         else f"speaker {self.config.user_speaker!r}")
                raise ValueError(f"episode {e.episode_id!r} has no turn of {whose} (LearnerConfig.user_speaker)")
        if self.config.fresh_memory:
            for user in users:
                self.store.delete_user(user)
        keys = (list(ordinals) if ordinals is not None else
                [self.episodes_seen + i * self.processes + jax.process_index() for i in range(len(episodes))])
        if len(keys) != len(episodes):
            raise ValueError(f"OnlineLearner.run_episodes: {len(keys)} ordinals for {len(episodes)} episodes")
        records: list[list[TurnRecord]] = [[] for _ in episodes]
        for tick in lockstep(schedules):
            played = self._play_turns([(episodes[i], users[i], s, t, hist, keys[i]) for i, s, t, hist in tick])
            for (i, *_), rec in zip(tick, played, strict=True):
                records[i].append(rec)
        return [self._finish_episode(e, u, recs) for e, u, recs in zip(episodes, users, records, strict=True)]

    def _finish_episode(self, episode: Episode, user: str, records: list[TurnRecord]) -> dict[str, float]:
        """An episode's bookkeeping once played: its turns join the next update, its label counts the curve."""
        self._turns += records
        receipts = [rec.receipt for rec in records]
        self._closed.add(user)
        self.last_receipts = receipts
        self.episodes_seen += self.processes
        counts = session_counts(episode, receipts)
        for rec in records:  # the judged rewards
            c = counts[rec.receipt.session]
            if rec.r_qual is not None:
                c.quality_sum, c.quality_n = c.quality_sum + rec.r_qual, c.quality_n + 1
            if rec.r_proxy is not None:
                c.proxy_sum, c.proxy_n = c.proxy_sum + rec.r_proxy, c.proxy_n + 1
        self._counts += counts
        self.session_log += counts
        out = pooled_metrics(counts, "episode")
        out["episode/turns"] = float(len(receipts))
        if self.update_due:
            out.update(self.update())
        return out

    @property
    def update_due(self) -> bool:
        """Whether the episodes seen reach a multiple of `update_every`: the update cadence, here alone (the
        stage's row writing and `rollout.user_groups`' grouping follow it)."""
        return self.episodes_seen % self.config.update_every == 0

    def step_turn(self, episode: Episode, user: str, session: int, turn: int,
                  history: Sequence[tuple[str, str]], episode_key: int | None = None) -> Receipt:
        """One user turn of Algorithm 1; the decision waits for the next update with its rewards."""
        (receipt,) = self.step_turns([(episode, user, session, turn, tuple(history))], episode_key)
        return receipt

    def step_turns(self, turns: Sequence[tuple[Episode, str, int, int, Sequence[tuple[str, str]]]],
                   episode_key: int | None = None) -> list[Receipt]:
        """One turn of each of several distinct users, (episode, user, session, turn, history) each, decided in
        one batched step (as `run_episodes` plays a tick); the decisions wait for the next update."""
        if len({user for _, user, *_ in turns}) != len(turns):
            raise ValueError(f"OnlineLearner.step_turns: one turn per user, got users {[t[1] for t in turns]}")
        key = self.episodes_seen if episode_key is None else episode_key
        records = self._play_turns([(e, u, s, t, tuple(h), key) for e, u, s, t, h in turns])
        self._turns += records
        return [record.receipt for record in records]

    def _play_turns(self, turns: Sequence[tuple[Episode, str, int, int, tuple[tuple[str, str], ...], int]]
                    ) -> list[TurnRecord]:
        """One turn of each of several users, (episode, user, session, turn, history, episode key) each: the
        agent's step, both judges and the rewards known at once (the truth reward of a used memory's save, a
        discard's reward); the records come back in order."""
        items = [episode.sessions[s].turns[t] for episode, _, s, t, _, _ in turns]
        inputs = [TurnInput(user, item.text, hist, episode.episode_id, s, t, label=memory_label(item))
                  for (episode, user, s, t, hist, _), item in zip(turns, items, strict=True)]
        reward = self.config.reward
        likelihood = reward.source == "likelihood"  # only the likelihood proxy reads later turns and controls
        later = ([later_targets(episode, s, item.text, reward.likelihood_later_turns, match=reward.likelihood_match)
                  for (episode, _, s, _, _, _), item in zip(turns, items, strict=True)]
                 if likelihood else [()] * len(turns))
        controls = (control_texts([item.text for item in items], [episode.episode_id for episode, *_ in turns])
                    if likelihood and reward.likelihood_control else [None] * len(turns))
        proxy_inputs = [ProxyInput(item.text, hist, label=None if item.y_p is None else float(item.y_p), later=ahead,
                                   control=control)
                        for (_, _, _, _, hist, _), item, ahead, control in zip(turns, items, later, controls,
                                                                               strict=True)]
        keys = decision_keys(self.agent.key, np.asarray([(k, s, t) for _, _, s, t, _, k in turns], np.int32))
        pool = self._request_pool() if self.is_remote else None
        remote_proxy = pool is not None and getattr(self.proxy_judge.backend, "remote", False)
        proxy_f = pool.submit(self.proxy_judge.judge, proxy_inputs) if remote_proxy else None
        try:  # the proxy judge needs only the turns: with remote back ends it is in flight during the agent's step
            steps = self.agent.step_many(inputs, keys=keys, pool=pool, reply=self.writes_replies)
            qualities = self.quality_judge.judge([
                QualityInput(hist, item.text, reply, r.memory_used.text if r.memory_used else None,
                             label_needed=None if item.y_t is None else
                             [[episode.episode_id, n.session, n.turn] for n in item.y_t],
                             used_ref=list(r.memory_used.ref) if r.memory_used else None,
                             gold_next=next_gold_turn(episode, s, t))
                for (episode, _, s, t, hist, _), item, (reply, r) in zip(turns, items, steps, strict=True)])
        except BaseException:
            if proxy_f is not None:
                cf.wait([proxy_f])
            raise
        proxies = proxy_f.result() if proxy_f is not None else self.proxy_judge.judge(proxy_inputs)
        records = []
        for (episode, user, s, t, _, key), (_, receipt), quality, proxy in zip(turns, steps, qualities, proxies,
                                                                               strict=True):
            ref = [episode.episode_id, s, t]
            r_qual = quality.score if quality.ok else None
            if r_qual is None:
                self._since["quality_failures"] += 1
            elif receipt.trigger.fragment_id is not None:  # the cross-session truth reward of the save behind it
                self.buffer.on_trigger(user, receipt.trigger.fragment_id, r_qual, turn_ref=ref)
            r_proxy = proxy.score if proxy.ok else None
            reward = None
            if r_proxy is None:
                self._since["proxy_failures"] += 1
            elif receipt.fragment is not None:
                self.buffer.add(fragment_id=receipt.fragment.fragment_id, user_id=user,
                                decision_id=receipt.planner.decision_id, r_proxy=r_proxy, created_ref=ref)
            else:
                reward = float(planner_reward(False, r_proxy, self.config.reward))
            records.append(TurnRecord(receipt, key, r_qual, r_proxy, reward))
        self.turns_seen += len(records)
        return records

    @property
    def writes_replies(self) -> bool:
        """Whether a turn's reply is written: only when the quality judge reads it (the likelihood judge scores
        the gold next turn, never the reply, so a replayed turn needs none)."""
        return bool(getattr(self.quality_judge, "reads_reply", True))

    @property
    def is_remote(self) -> bool:
        """Whether any back end is remote: then a turn's independent requests go out concurrently."""
        return any(getattr(b, "remote", False) for b in self._backends)

    def _request_pool(self) -> cf.Executor:
        """The learner's two-thread pool (proxy judge and reply in flight beside the calling thread's condense)."""
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="turn")
        return self._pool

    def close(self) -> None:
        """Shuts down the turn request pool, if one was made (a later remote turn makes a new one)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.agent.close()

    def __enter__(self) -> OnlineLearner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ the update
    def update(self) -> dict[str, float]:
        """Finalize pending rewards, compute advantages, run the joint PPO update; returns the update's metrics."""
        start = time.perf_counter()
        self.last_finalized = self.buffer.finalize(closed_users=self._closed)
        self.save_log += [SaveLogEntry(int(r.created_ref[1]), r.r_proxy, r.r_qual_future)
                          for r in self.last_finalized if r.created_ref is not None]
        finalized = {r.decision_id: r for r in self.last_finalized}
        self._closed.clear()
        records, self._turns = self._turns, []
        for rec in records:
            if rec.receipt.fragment is not None and rec.r_proxy is not None:
                save = finalized.get(rec.receipt.planner.decision_id)
                if save is None:
                    self._holdover[rec.receipt.planner.decision_id] = rec
                else:
                    rec.planner_reward = save.reward
        ready = [self._holdover.pop(d) for d in list(self._holdover) if d in finalized]
        for rec in ready:
            rec.planner_reward = finalized[rec.receipt.planner.decision_id].reward
        self.last_records = records + ready
        view = self._gather(_UpdateView(
            records, ready, list(finalized.values()), self._since["proxy_failures"], self._since["quality_failures"],
            self._usage() - self._since["usage"], list(self._counts), len(self.buffer), len(self._holdover)))
        records, ready = view.records, view.ready
        slots = build_slots(records, ready, reward=self.config.reward, ppo=self.config.ppo,
                            planner_rule=self.config.agent.planner_rule, trigger_rule=self.config.agent.trigger_rule)
        size = self.config.ppo.minibatch_size
        cuts = partition(slots, size, self.rng)  # one partition for all epochs (see rl.updater)
        minibatches = [collate(cut, size, self.pad_id) for cut in cuts]
        rollout = [rollout_stats(cut, size) for cut in cuts]  # the behaviour policy's numbers (the ratio's anchor)
        result = self.updater.run(minibatches, self.rng, rollout)
        self.updates += 1
        self.agent.policy_version = str(self.updates)
        metrics = self._metrics(view, result)
        metrics["update/decisions/planner"] = float(sum(x.planner is not None for x in slots))
        metrics["update/decisions/trigger"] = float(sum(x.trigger is not None for x in slots))
        metrics["update/seconds"] = time.perf_counter() - start
        self._since = self._fresh_since()
        self._counts = []
        return metrics

    def _gather(self, view: _UpdateView) -> _UpdateView:
        """This process's view of an update, or with several processes all of theirs merged (a collective):
        turns and holdovers in the order one process playing every episode would have them (episode ordinal,
        session, turn), counts summed, so every process trains on the same global batch."""
        if self.processes == 1:
            return view
        views = parallel.allgather_objects(view)
        order = lambda rec: (rec.episode_key, rec.receipt.session, rec.receipt.turn)  # noqa: E731
        return _UpdateView(sorted((r for v in views for r in v.records), key=order),
                           sorted((r for v in views for r in v.ready), key=order),
                           [x for v in views for x in v.saves], sum(v.proxy_failures for v in views),
                           sum(v.quality_failures for v in views), sum((v.usage for v in views), TokenUsage()),
                           [c for v in views for c in v.counts], sum(v.waiting for v in views),
                           sum(v.holdover for v in views))

    def _metrics(self, view: _UpdateView, result: UpdateResult) -> dict[str, float]:
        """The plain metrics dict of one update (rewards, PPO, judges, tokens, labels), over every process's
        decisions."""
        records, ready = view.records, view.ready
        mean = lambda xs: float(np.mean(xs)) if len(xs) else float("nan")  # noqa: E731
        planned = [r for r in list(records) + list(ready) if r.planner_reward is not None]
        saves = [r.planner_reward for r in planned if r.receipt.fragment is not None]
        discards = [r.planner_reward for r in planned if r.receipt.fragment is None]
        trig = [r.r_qual for r in records if r.r_qual is not None]
        triggered = [s for s in view.saves if s.triggered]
        used = view.usage
        out = {
            "rewards/trigger": mean(trig),
            "rewards/planner": mean([r.planner_reward for r in planned]),
            "rewards/planner_save": mean(saves),
            "rewards/planner_discard": mean(discards),
            "rewards/truth_triggered_saves": float(len(triggered)),
            "rewards/truth_bonus": mean([s.reward - s.r_proxy + self.config.reward.save_cost for s in triggered]),
            "agent/save_rate": mean([float(r.receipt.planner.save) for r in records]),
            "agent/memory_use_rate": mean([float(r.receipt.trigger.action > 0) for r in records]),
            "agent/turns": float(len(records)),
            # the note check (llm.note_check): saves whose first note was rejected, and those that kept the turn text
            "notes/rewritten": float(sum("note_problem" in r.receipt.fragment.extra for r in records
                                         if r.receipt.fragment is not None)),
            "notes/fallback": float(sum(bool(r.receipt.fragment.extra.get("condense_fallback")) for r in records
                                        if r.receipt.fragment is not None)),
            "judge/proxy_failures": float(view.proxy_failures),
            "judge/quality_failures": float(view.quality_failures),
            "llm/tokens": float(used.total_tokens),
            "llm/attempts": float(used.attempts),  # retries included; failures: requests that exhausted them
            "llm/retries": float(used.retries),
            "llm/failures": float(used.failures),
            "buffer/waiting": float(view.waiting),
            "buffer/holdover": float(view.holdover),
            "update/index": float(self.updates),
            "update/total_skipped_steps": float(int(parallel.to_host(self.updater.num_skipped))),
            "update/total_rollbacks": float(self.updater.monitor.rollbacks),
            "update/programs": float(len(result.shapes)),
            "update/wall_since_last": time.perf_counter() - self._since["time"],
        }
        out.update(result.metrics("update"))
        if any(c.needed or c.gold_saves for c in view.counts):
            out.update(pooled_metrics(view.counts, "labels"))
        return out

    def close_user(self, user_id: str) -> None:
        """Marks `user_id`'s play as over: its saves still waiting for a later use get their final reward at the
        next update (as at the end of `run_episode`)."""
        self._closed.add(user_id)

    def has_pending(self) -> bool:
        """Whether decisions wait for an update (a checkpoint can only be taken when none do), on any process
        (a collective with several)."""
        mine = bool(self._turns or self._holdover)
        return mine if self.processes == 1 else any(parallel.allgather_objects(mine))

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Everything to resume between updates: trainable params, optimizer, buffer, RNGs, counters."""
        if self._turns or self._holdover:
            raise RuntimeError(
                f"OnlineLearner.state_dict: {len(self._turns)} turn(s) wait for an update and "
                f"{len(self._holdover)} save(s) for their reward; checkpoint right after an update")
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "params": flat_arrays(nnx.state(self.policies, TRAINABLE)),
            "rest": flat_arrays(nnx.state(self.policies, nnx.Not(nnx.Param))),
            "optimizer": self.updater.state_dict(),  # host copies: the live state is donated
            "buffer": self.buffer.state_dict(),
            "divergence": self.updater.monitor.state_dict(),
            "agent_key": np.asarray(jax.random.key_data(self.agent.key)),
            "rng": self.rng.bit_generator.state,
            "counters": {"episodes_seen": self.episodes_seen, "updates": self.updates,
                         "turns_seen": self.turns_seen, "closed_users": sorted(self._closed)},
            "session_log": [c.to_json() for c in self.session_log],
            "save_log": [dataclasses.astuple(x) for x in self.save_log],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores `state_dict()` output into this learner (same architecture and config)."""
        if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
            raise ValueError(f"OnlineLearner.load_state_dict: not a {STATE_FORMAT} v{STATE_VERSION} state")
        targets = {name: nnx.state(self.policies, filt) for name, filt in (("params", TRAINABLE),
                                                                           ("rest", nnx.Not(nnx.Param)))}
        for name, target in targets.items():  # check everything before changing anything
            restore_arrays(target, state[name], f"OnlineLearner.load_state_dict: {name}", check_only=True)
        for name, target in targets.items():
            restore_arrays(target, state[name], f"OnlineLearner.load_state_dict: {name}")
            nnx.update(self.policies, target)
        self.updater.load_state_dict(state["optimizer"])
        self.buffer = PendingRewardBuffer.from_state_dict(state["buffer"], self.config.reward)
        if "divergence" in state:  # absent from checkpoints written before the divergence checks
            self.updater.monitor.load_state_dict(state["divergence"])
        self.agent.key = jax.random.wrap_key_data(jnp.asarray(state["agent_key"]))
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        c = state["counters"]
        self.episodes_seen, self.updates, self.turns_seen = c["episodes_seen"], c["updates"], c["turns_seen"]
        self._closed = set(c["closed_users"])
        self.session_log = [SessionCounts.from_json(x) for x in state.get("session_log", [])]
        self.save_log = [SaveLogEntry(int(s), float(p), None if q is None else float(q))
                         for s, p, q in state.get("save_log", [])]  # absent from checkpoints written before it
        self._counts = []
        self.agent.policy_version = str(self.updates)
