"""Throughput of the online stage with B users in flight (`learner.users_in_flight`): decisions/s and episodes/s
for B = 1, 4, 16 on the tiny and the SmolLM2-135M backbone, XLA compilations, peak host memory.

Each (backbone, B) arm runs in its own process (a clean peak RSS and compilation count): the persona world's
episodes with the offline back ends (its judge reads the world's labels: an oracle; speed only here), PPO every
16 episodes in every arm (the same update schedule, so only the play differs), one warm-up group and update
first (compilation), then `--episodes` timed episodes. `--smollm2-ppo-epochs -1` runs the SmolLM2 arms without
any update (play alone, after a warm-up group of B episodes): on a CPU one SmolLM2 update outlasts the play. A decision is one Trigger or one Planner choice (two per
turn). "play" excludes the PPO updates' time; "all" includes it.

Usage: python scripts/benchmark_online.py [--backbones tiny smollm2] [--users 1 4 16] [--episodes 32]
       [--smollm2-episodes 16] [--smollm2-sessions 2] [--smollm2-ppo-epochs 0] [--repeats 3]

Tiny arms run `--repeats` times, interleaved, and the run with the median decisions/s is shown (single runs
vary by up to ~30% on a shared 2-core machine); SmolLM2 arms run once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

UPDATE_EVERY = 16  # episodes per PPO update in every arm (a multiple of each B)
NEVER = 10**6  # "update every" of arms that measure play alone (a multiple of every B)


def build(backbone: str, users: int, tmp: Path, epochs: int | None = None, update_every: int = UPDATE_EVERY):
    """The persona-world learner on `backbone` ("tiny": `persona_run`'s 64-wide random model; "smollm2": the
    fetched SmolLM2-135M-Instruct with LoRA rank 8 on both policies), B = `users` in flight."""
    from flax import nnx

    from icml_jax.experiments.persona_run import PersonaRunConfig, build_learner
    from icml_jax.rl import OnlineLearner

    run = PersonaRunConfig(users_in_flight=users, update_every=update_every)
    if epochs is not None:  # fewer PPO epochs: the same play, a cheaper update (SmolLM2 on a CPU)
        run = dataclasses.replace(run, ppo=dataclasses.replace(run.ppo, epochs=epochs))
    learner, tokenizer = build_learner(run, tmp)
    if backbone == "tiny":
        return learner, run
    from icml_jax.agents.policy import MemoryPolicies
    from icml_jax.models import fetch, from_pretrained, load_tokenizer
    from icml_jax.models.lora import LoraConfig, apply_lora

    path = fetch.model_dir("smollm2-135m-instruct")
    tokenizer = load_tokenizer(path)
    model = apply_lora(from_pretrained(path), LoraConfig(rank=8, alpha=16.0), seed=0)
    policies = MemoryPolicies(model, pooling="mean", match_rank=16, rngs=nnx.Rngs(1))
    old = learner
    learner = OnlineLearner(policies, tokenizer, old.store, old.agent.generator, proxy_judge=old.proxy_judge,
                            quality_judge=old.quality_judge, config=old.config)
    return learner, run


def worker(backbone: str, users: int, episodes: int, sessions: int | None, epochs: int | None = None) -> dict:
    """One arm: warm up (compile), then time `episodes` episodes; the figures as a dict. `epochs` < 0: no PPO
    update at all (play alone; the warm-up is one group of B episodes)."""
    import jax

    from icml_jax.data.persona_world import generate_episodes
    from icml_jax.rl.rollout import user_groups

    compiles = [0]
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _s, **_: compiles.__setitem__(0, compiles[0] + (event == "/jax/core/compile/backend_compile_duration")))
    every = NEVER if epochs is not None and epochs < 0 else UPDATE_EVERY
    with tempfile.TemporaryDirectory() as tmp:
        learner, run = build(backbone, users, Path(tmp), epochs if epochs and epochs > 0 else None, every)
    cut = (lambda e: dataclasses.replace(e, sessions=e.sessions[:sessions])) if sessions else (lambda e: e)
    first = users if every == NEVER else UPDATE_EVERY
    all_eps = [cut(e) for e in generate_episodes(run.world, first + episodes)]
    warm, timed = all_eps[:first], all_eps[first:]
    start = time.perf_counter()
    for group in user_groups(warm, users, every):
        learner.run_episodes(group)
    warm_s, warm_compiles = time.perf_counter() - start, compiles[0]
    turns0, update_s = learner.turns_seen, 0.0
    start = time.perf_counter()
    for group in user_groups(timed, users, every, seen=learner.episodes_seen):
        for out in learner.run_episodes(group):
            update_s += out.get("update/seconds", 0.0)
    wall = time.perf_counter() - start
    turns = learner.turns_seen - turns0
    return {"backbone": backbone, "users": users, "episodes": len(timed), "turns": turns, "wall_s": wall,
            "ppo_epochs": learner.config.ppo.epochs if every != NEVER else 0,
            "update_s": update_s, "decisions_per_s": 2 * turns / wall,
            "play_decisions_per_s": 2 * turns / (wall - update_s), "episodes_per_s": len(timed) / wall,
            "warmup_s": warm_s, "compiles_warmup": warm_compiles, "compiles_timed": compiles[0] - warm_compiles,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backbones", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--users", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--episodes", type=int, default=32, help="timed episodes per arm (tiny)")
    parser.add_argument("--smollm2-episodes", type=int, default=16, help="timed episodes per arm (SmolLM2)")
    parser.add_argument("--smollm2-sessions", type=int, default=2, help="sessions kept per SmolLM2 episode")
    parser.add_argument("--smollm2-ppo-epochs", type=int, default=0,
                        help="PPO epochs of the SmolLM2 arms (0: the run's 4; -1: no update, play alone); play "
                        "is unchanged, updates cheaper")
    parser.add_argument("--repeats", type=int, default=3, help="runs per tiny arm; the median run is shown")
    parser.add_argument("--worker", nargs=5, metavar=("BACKBONE", "B", "EPISODES", "SESSIONS", "EPOCHS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        backbone, b, n, s, e = args.worker
        print(json.dumps(worker(backbone, int(b), int(n), int(s) or None, int(e) or None)))
        return
    if any(UPDATE_EVERY % b for b in args.users):
        parser.error(f"every --users value must divide {UPDATE_EVERY}")
    print(f"{'backbone':8} {'B':>3} {'episodes':>8} {'dec/s all':>9} {'dec/s play':>10} {'ep/s':>7} {'x B=1':>6} "
          f"{'compiles':>12} {'peak GB':>7}")
    for backbone in args.backbones:
        n, s, e = ((args.episodes, 0, 0) if backbone == "tiny"
                   else (args.smollm2_episodes, args.smollm2_sessions, args.smollm2_ppo_epochs))
        repeats = args.repeats if backbone == "tiny" else 1
        runs: dict[int, list[dict]] = {b: [] for b in args.users}
        for _ in range(repeats):  # arms interleaved, so a drift of the machine's load hits every B alike
            for b in args.users:
                cmd = [sys.executable, __file__, "--worker", backbone, str(b), str(n), str(s), str(e)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
                runs[b].append(json.loads(out))
        base = None
        for b in args.users:
            r = sorted(runs[b], key=lambda x: x["decisions_per_s"])[len(runs[b]) // 2]  # the median run
            base = base or r
            print(f"{backbone:8} {b:3d} {r['episodes']:8d} {r['decisions_per_s']:9.1f} {r['play_decisions_per_s']:10.1f} "
                  f"{r['episodes_per_s']:7.3f} {r['decisions_per_s'] / base['decisions_per_s']:5.2f}x "
                  f"{r['compiles_warmup']:5d}+{r['compiles_timed']:<6d} {r['peak_rss_gb']:7.2f}", flush=True)


if __name__ == "__main__":
    main()
