"""The online stage: PPO (Algorithm 1) on the data stream with held-out evaluations before and after, Orbax
checkpoints of the whole state every `checkpoint.every_episodes` episodes, and the gathering of several JAX
processes' rows and states."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
from tqdm.auto import tqdm

from icml_jax import parallel
from icml_jax.checkpoint import RunCheckpointer, load_warmup
from icml_jax.checkpoint.online import OnlineCheckpoint
from icml_jax.data.labels import pooled_metrics
from icml_jax.data.stream import EVAL_OFFSET, held_out_episodes, online_stream
from icml_jax.memory.store import MemoryStore
from icml_jax.rl import heldout  # heldout.evaluate read when called (tests wrap it)
from icml_jax.rl.learner import OnlineLearner
from icml_jax.rl.likelihood import reward_judges
from icml_jax.rl.rollout import user_groups
from icml_jax.rl.save_log import proxy_truth_per_session
from icml_jax.run.stages.run import Run, is_primary
from icml_jax.run.workdir import CHECKPOINT_DIR


def session_rows(phase: str, sessions: Sequence[Any], saves: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """Per-session-number rows of the per-session table (labels pooled over episodes, mean judged rewards; Table
    8's miss and false-positive rates); with `saves` (`SaveLogEntry`s) also the proxy / truth correlation of the
    saves made in each session."""
    correlation = proxy_truth_per_session(saves) if saves is not None else {}
    rows = []
    for number in sorted({c.session for c in sessions}):
        m = pooled_metrics([c for c in sessions if c.session == number], "m")
        row = {"table": "sessions", "phase": phase, "session": number + 1,
               "planner_precision": m["m/planner_precision"], "planner_recall": m["m/planner_recall"],
               "trigger_recall": m["m/trigger_recall"], "reward_trigger": m["m/reward_quality"],
               "reward_proxy": m["m/reward_proxy"], "planner_miss_rate": m["m/planner_miss_rate"],
               "planner_false_positive_rate": m["m/planner_false_positive_rate"],
               "decisions": sum(c.turns for c in sessions if c.session == number)}
        if saves is not None:
            r = correlation.get(number + 1, {"saves": 0, "saves_used": 0, "r": None})
            row.update({"proxy_truth_r": r["r"], "saves_finalized": r["saves"], "saves_used": r["saves_used"]})
        rows.append(row)
    return rows


def stage_online(run: Run) -> dict[str, Any]:
    """Online PPO (Algorithm 1) with held-out evaluations before and after, checkpointed every N episodes.

    Resumes from the checkpoint `run` chose (the newest in `<workdir>/checkpoints` that restores): learner state,
    every user's memory, the data stream's position and the before-evaluation come back; metrics written after
    that checkpoint were already cut by `run`.

    With P JAX processes each plays every P-th episode (its users, memories and pending rewards its own), every
    update is one global PPO step over all of their decisions, the first process writes the metrics of all, and
    a checkpoint holds each process's state (`checkpoint.online.gather_state`).
    """
    config, spec = run.config, run.spec
    policies, tokenizer = run.models()
    stream, held_out = online_stream(spec.data, seed=config.seed), held_out_episodes(spec.data)
    generator = spec.make_backend("generator")
    # one client when both roles are one back end
    judge = generator if spec.judge_is_generator else spec.make_backend("judge")
    learner_cfg = spec.learner
    held_out_eval = lambda seen: _held_out_eval(run, policies, tokenizer, held_out, generator, seen)  # noqa: E731
    update_mesh, _ = parallel.process_meshes(dict(spec.parallel.mesh))
    with MemoryStore() as store, RunCheckpointer(run.workdir / CHECKPOINT_DIR, keep=int(spec.checkpoint.keep),
                                                 async_save=bool(spec.checkpoint.async_save)) as ckpt:
        reward = learner_cfg.reward
        proxy_judge, quality_judge = reward_judges(reward, judge=judge, generator=generator)
        learner = OnlineLearner(policies, tokenizer, store, generator, proxy_judge=proxy_judge,
                                quality_judge=quality_judge, config=learner_cfg,
                                update_mesh=update_mesh if parallel.model_mesh(policies) is not None else None)

        state_ckpt = OnlineCheckpoint(ckpt, learner, store, stream, run.metrics)
        restored, run.resume = run.resume, None  # read by workdir.resume_point, so the metrics were cut at its step
        if restored is not None:
            state = state_ckpt.restore(restored, run.workdir / CHECKPOINT_DIR)
        else:  # the warmed-up start is resume point 0; the warm-up, deferred until now, is recoverable from it
            if spec.online.init_from:
                load_warmup(Path(spec.online.init_from).expanduser(), policies)
            state_ckpt.save({"before": {}, "before_rows": []})
            ckpt.wait()
            run.commit()
        if learner.episodes_seen == 0:
            before, before_rows = held_out_eval(0) if spec.online.eval_before else ({}, [])
        else:
            before, before_rows = state["before"], state["before_rows"]
        extra = {"before": before, "before_rows": before_rows}
        _play_stream(run, learner, stream, state_ckpt, extra, every=int(spec.checkpoint.every_episodes))
        if learner.has_pending():  # the episodes after the last update still teach: one last update
            out = learner.update()
            run.metrics.write("online", {"episode": learner.episodes_seen, **out}, step=learner.episodes_seen)
        if state_ckpt.saved != learner.episodes_seen:
            state_ckpt.save(extra)
        ckpt.wait()
        learner.close()  # the turn request threads of remote back ends
        session_log = [c for part in parallel.allgather_objects(learner.session_log) for c in part]
        save_log = [s for part in parallel.allgather_objects(learner.save_log) for s in part]
        online = pooled_metrics(session_log, "online")
        online_rows = session_rows("online", session_log, save_log)
        after, after_rows = held_out_eval(learner.episodes_seen)
    for row in before_rows + online_rows + after_rows:
        run.metrics.write("online", row)
    summary = {"episodes": learner.episodes_seen, "updates": learner.updates,
               "skipped_steps": int(parallel.to_host(learner.updater.num_skipped)),
               "rollbacks": learner.updater.monitor.rollbacks,
               **online,
               **{f"after/{k}": v for k, v in after.items()}, **{f"before/{k}": v for k, v in before.items()}}
    run.save_policy({"stage": "online", "episodes": learner.episodes_seen, "updates": learner.updates})
    run.metrics.write("online", {"final": True, **summary})
    return summary


def _held_out_eval(run: Run, policies: Any, tokenizer: Any, held_out: Sequence[Any], generator: Any, seen: int
                   ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The held-out episodes played greedily by the current policies (the agent writing replies and notes as the
    online one does): their pooled metrics, written at step `seen`, and per-session rows."""
    if not held_out:
        return {}, []
    spec, learner_cfg = run.spec, run.spec.learner
    sessions = heldout.evaluate(policies, tokenizer, held_out, agent_config=learner_cfg.agent, backend=generator,
                                user_speaker=learner_cfg.user_speaker, greedy=spec.online.greedy_eval,
                                seed=run.config.seed + EVAL_OFFSET, users_in_flight=learner_cfg.users_in_flight)
    metrics = pooled_metrics(sessions, "eval")
    run.metrics.write("eval", {"episodes_seen": seen, **metrics}, step=seen)
    return metrics, session_rows("before" if seen == 0 else "after", sessions)


def _play_stream(run: Run, learner: OnlineLearner, stream: Any, state_ckpt: OnlineCheckpoint,
                 extra: dict[str, Any], *, every: int) -> None:
    """Plays the rest of `stream` in groups of users (never across an update), writing each group's episode rows
    (several processes: at each update, all processes' rows together) and a checkpoint every `every` episodes."""
    count, cfg = jax.process_count(), learner.config
    bar = tqdm(stream, desc="online episodes", unit="ep", total=stream.total,
               initial=learner.episodes_seen // count, leave=False, disable=not is_primary())
    rows: list[dict[str, Any]] = []  # episode rows not yet written (several processes: until an update)
    for group in user_groups(bar, cfg.users_in_flight, cfg.update_every // count, learner.episodes_seen // count):
        first = learner.episodes_seen + 1 + jax.process_index()  # this process plays every count-th
        rows += [{"episode": first + i * count, **training_record(e), **out}
                 for i, (e, out) in enumerate(zip(group, learner.run_episodes(group), strict=True))]
        if count == 1 or learner.update_due:  # the same call on every process
            write_episode_rows(run.metrics, rows)
            rows = []
        if learner.episodes_seen % every == 0:
            state_ckpt.save(extra)
    if count > 1:
        write_episode_rows(run.metrics, rows)


def training_record(episode: Any) -> dict[str, Any]:
    """What an episode row records of the episode that trained the policy: its id and the sessions played
    (read back by the evaluation's leak check, `icml_jax.evaluation.leakage`)."""
    return {"episode/id": episode.episode_id, "episode/sessions": len(episode.sessions)}


def write_episode_rows(metrics: Any, rows: list[dict[str, Any]]) -> None:
    """Writes the online rows of the episodes played since the last update, from every process, in episode
    order (a collective with several processes). An update's figures (every key that is not `episode/...`) sit
    on every process's last row: they stay on the last episode only, as one process playing all writes them."""
    parts = parallel.allgather_objects(rows)
    merged = sorted((r for part in parts for r in part), key=lambda r: r["episode"])
    if len(parts) > 1:
        for row in merged[:-1]:
            for key in [k for k in row if k != "episode" and not k.startswith("episode/")]:
                row.pop(key)
    for row in merged:
        metrics.write("online", row, step=row["episode"])
