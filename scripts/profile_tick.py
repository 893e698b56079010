"""Where the time of one online tick and one PPO update goes on SmolLM2-135M: named phases, each beside its FLOP
floor (`icml_jax.models.flops`: the model FLOPs of the rows each call ran, padding included, at the float32 matmul peak
measured in the same run).

A tick is one lockstep step of the online stage (`OnlineLearner._play_turns`: B users' Trigger decision, reply,
Planner decision, save, both judges). The learner is the persona world's with the offline back ends (their judge
reads the world's labels: an oracle; speed only here) and SmolLM2 under LoRA rank 8 on both policies, as
`scripts/benchmark_online.py` builds it. Each phase's device work is waited for inside the phase, so device time
is not hidden in a later phase. The first ticks and the first update compile and are not counted.

Usage: python scripts/profile_tick.py [--users 1 16] [--ticks 6] [--update] [--shared-prefix 0|1]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

PHASES: dict[str, float] = collections.defaultdict(float)
FLOPS: dict[str, float] = collections.defaultdict(float)
_ACTIVE: list[str] = []


@contextlib.contextmanager
def phase(name: str):
    """Adds the wall time of the block to `name`, excluding nested phases (they count for themselves)."""
    start = time.perf_counter()
    _ACTIVE.append(name)
    inner_before = PHASES["__nested__" + name]
    try:
        yield
    finally:
        _ACTIVE.pop()
        spent = time.perf_counter() - start
        nested = PHASES["__nested__" + name] - inner_before
        PHASES[name] += spent - nested
        if _ACTIVE:
            PHASES["__nested__" + _ACTIVE[-1]] += spent


def timed(owner, attr: str, name: str, *, flops=None) -> None:
    """Wraps owner.attr in `phase(name)`; with `flops` (arguments -> model FLOPs) it also waits for the device
    result inside the phase and adds the call's model FLOPs to FLOPS[name]."""
    fn = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
            return fn(*args, **kwargs)  # traced inside another program (ppo_steps inlines ppo_step)
        with phase(name):
            out = fn(*args, **kwargs)
            if flops is not None:
                out = jax.block_until_ready(out)
                FLOPS[name] += flops(*args)
            return out

    setattr(owner, attr, wrapper)


MODEL: dict = {}  # "config", "rank": the backbone the FLOP counts are of (set when the learner is built)


def set_model(learner) -> None:
    """Records the learner's backbone config and LoRA rank for the FLOP counts."""
    backbone = learner.policies.trigger_backbone
    MODEL.update(config=backbone.config, rank=backbone.lora_config.rank)


def decision_flops(_graphdef, _state, tokens, *_rest) -> float:
    """Model FLOPs of one Trigger / Planner forward over the rows it ran (padding included: the work done)."""
    from icml_jax.models.flops import forward_flops

    *rows, length = tokens.shape
    return forward_flops(MODEL["config"], int(np.prod(rows)), length, lora_rank=MODEL["rank"])


def ppo_flops(*args) -> float:
    """Model FLOPs of forward + backward over one (or a stack of) joint minibatches."""
    from icml_jax.models.flops import train_flops
    from icml_jax.rl.batch import Minibatch

    batches = next(a for a in args if isinstance(a, Minibatch))
    total = 0.0
    for tokens in (batches.planner.tokens, batches.trigger.tokens):
        *rows, length = tokens.shape
        total += train_flops(MODEL["config"], int(np.prod(rows)), length, lora_rank=MODEL["rank"])
    return total


def matmul_peak(n: int = 2048, repeats: int = 7) -> float:
    """FLOP/s of a jitted float32 n^3 matmul: the compute limit XLA reaches on this machine."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times)


def instrument() -> None:
    """Phase timers around the pieces a tick and an update are made of."""
    import icml_jax.agents.agent as agent_mod
    import icml_jax.agents.observation as obs
    import icml_jax.rl.learner as learner_mod
    import icml_jax.rl.updater as updater_mod
    from icml_jax.llm.judges import ProxyJudge, QualityJudge
    from icml_jax.memory.store import MemoryStore

    timed(agent_mod, "trigger_act", "trigger forward (device)", flops=decision_flops)
    timed(agent_mod, "planner_act", "planner forward (device)", flops=decision_flops)
    for attr in ("encode_trigger", "encode_planner", "trigger_texts", "planner_text", "stack_trigger",
                 "stack_planner", "planner_memory_indices"):
        timed(obs, attr, "observations: texts, tokenizer, padding (host)")
    for attr in ("candidates", "fragments"):
        timed(MemoryStore, attr, "memory store reads (SQLite, BM25 prefilter)")
    timed(agent_mod, "generate_replies", "reply (offline back end)")
    for attr in ("condense", "commit_saves", "shown_for"):
        timed(agent_mod, attr, "save: note, supersede, store write")
    timed(ProxyJudge, "judge", "judges (offline)")
    timed(QualityJudge, "judge", "judges (offline)")
    timed(learner_mod, "decision_keys", "decision keys")
    timed(updater_mod, "ppo_step", "PPO minibatch step (device)", flops=ppo_flops)
    timed(updater_mod, "ppo_steps", "PPO minibatch step (device)", flops=ppo_flops)
    timed(learner_mod, "collate", "update: collate minibatches (host)")
    timed(learner_mod, "rollout_stats", "update: collate minibatches (host)")


def report(title: str, wall: float, count: int, peak: float) -> None:
    """The phases per tick (or update) with their share of the wall time and their FLOP floor."""
    rows = sorted(((k, v) for k, v in PHASES.items() if not k.startswith("__")), key=lambda kv: -kv[1])
    named = sum(v for _, v in rows)
    print(f"\n{title}: {wall / count * 1e3:.0f} ms each over {count} (phases named: {named / wall:.1%} of wall)")
    print(f"  {'phase':48} {'ms':>9} {'share':>6} {'GFLOP':>8} {'floor ms':>9} {'x floor':>8}")
    for name, seconds in rows:
        flops = FLOPS.get(name, 0.0) / count
        floor = flops / peak
        ratio = f"{seconds / count / floor:7.2f}x" if floor else "       -"
        print(f"  {name:48} {seconds / count * 1e3:9.1f} {seconds / wall:6.1%} {flops / 1e9:8.2f} "
              f"{floor * 1e3:9.1f} {ratio}")
    print(f"  {'other (unnamed)':48} {(wall - named) / count * 1e3:9.1f} {(wall - named) / wall:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--ticks", type=int, default=6, help="timed ticks per B (after the compiling ones)")
    parser.add_argument("--update", action="store_true", help="also profile one PPO update (after a first one)")
    parser.add_argument("--shared-prefix", type=int, default=None, choices=[0, 1],
                        help="override policy.shared_prefix of the Trigger (default: the policies' default)")
    args = parser.parse_args()
    import benchmark_online
    from icml_jax.data.persona_world import generate_episodes

    instrument()
    peak = matmul_peak()
    print(f"float32 matmul peak (2048^3, jitted): {peak / 1e9:.1f} GFLOP/s; {jax.device_count()} device(s), "
          f"{jax.devices()[0].platform}")
    for users in args.users:
        with tempfile.TemporaryDirectory() as tmp:
            learner, run = benchmark_online.build("smollm2", users, Path(tmp), update_every=10**6)
        set_model(learner)
        if args.shared_prefix is not None:
            learner.policies.shared_prefix = bool(args.shared_prefix)
        print(f"\nB = {users}: shared_prefix={learner.policies.shared_prefix}")
        episodes = [dataclasses.replace(e, sessions=e.sessions[:2]) for e in generate_episodes(run.world, users)]
        original = learner._play_turns
        ticks: list[float] = []

        def play(turns, *a, _orig=original, **kw):
            start = time.perf_counter()
            out = _orig(turns, *a, **kw)
            ticks.append(time.perf_counter() - start)
            return out

        learner._play_turns = play
        warm = 3
        seen = {"n": 0}

        def limited(turns, *a, **kw):
            seen["n"] += 1
            if seen["n"] == warm + 1:
                PHASES.clear(), FLOPS.clear()
                ticks.clear()
            if seen["n"] > warm + args.ticks:
                raise StopIteration
            return play(turns, *a, **kw)

        learner._play_turns = limited
        try:
            learner.run_episodes(episodes)
        except StopIteration:
            pass
        report(f"tick, B = {users}", sum(ticks), len(ticks), peak)
        print(f"  ticks (ms): {[round(t * 1e3) for t in ticks]}")
    if args.update:
        profile_update(peak)


def profile_update(peak: float) -> None:
    """One PPO update (PersonaRunConfig's: 4 epochs, minibatches of 4 turn slots) after a 2-session episode
    of one user; the first update compiles, the second is profiled."""
    import benchmark_online
    from icml_jax.data.persona_world import generate_episodes

    with tempfile.TemporaryDirectory() as tmp:
        learner, run = benchmark_online.build("smollm2", 1, Path(tmp), update_every=1)
    set_model(learner)
    episodes = [dataclasses.replace(e, sessions=e.sessions[:2]) for e in generate_episodes(run.world, 2)]
    original = learner.update
    walls: list[tuple[float, dict, dict]] = []

    def update():
        PHASES.clear(), FLOPS.clear()
        start = time.perf_counter()
        out = original()
        walls.append((time.perf_counter() - start, dict(PHASES), dict(FLOPS)))
        return out

    learner.update = update
    for episode in episodes:
        learner.run_episodes([episode])
    wall, phases, flops = walls[-1]
    PHASES.clear(), FLOPS.clear()
    PHASES.update(phases), FLOPS.update(flops)
    report(f"PPO update ({learner.config.ppo.epochs} epochs, minibatches of {learner.config.ppo.minibatch_size} "
           f"slots; first update {walls[0][0]:.1f} s with compilation)", wall, 1, peak)




if __name__ == "__main__":
    main()
