"""Online interactive memory learning on the offline persona world: prints the learning curve.

A tiny random backbone with Planner/Trigger heads learns online (Algorithm 1, joint PPO) from the offline
judges, which score with the world's labels. Before training and every `--eval_every` episodes the policies
play held-out episodes (fresh memory, sampled decisions as online, fixed seed) and the script prints planner
precision / recall and trigger recall, pooled over those episodes, then the same numbers per session index
before and after training, the online (training-time) curve per window of sessions, and the margins that
`tests/rl/test_learning.py` checks. Everything is local and seeded; about a minute per seed on 2 CPU cores.

    python scripts/persona_world_learning.py                 # seed 0, the test's configuration
    python scripts/persona_world_learning.py --seeds 0 1 2   # what the test runs
    python scripts/persona_world_learning.py --lora_rank 8 --actor_lr 2e-3   # also train LoRA (slower)
    # duplicate saves with and without stored memories in the Planner's observation (docs/fidelity.md)
    python scripts/persona_world_learning.py --seeds 0 1 2 --restatements 4 --planner_memories 0
    python scripts/persona_world_learning.py --seeds 0 1 2 --restatements 4 --planner_memories 2
    # facts that change: stale recall and update accuracy without / with supersede (docs/memory_truth.md)
    python scripts/persona_world_learning.py --seeds 0 1 2 --supersede_candidates 0
    python scripts/persona_world_learning.py --seeds 0 1 2 --supersede_candidates 3

The offline judges read the world's labels: they are oracles, so these numbers show that the learner can learn
from its rewards, not how well a real judge would teach it.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from icml_jax.models.lora import LoraConfig
from icml_jax.experiments import persona_run as P


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--episodes", type=int, default=P.PersonaRunConfig.train_episodes)
    parser.add_argument("--eval_episodes", type=int, default=P.PersonaRunConfig.eval_episodes)
    parser.add_argument("--eval_every", type=int, default=10)
    parser.add_argument("--lora_rank", type=int, default=0, help="0 = heads only (the test's setting)")
    parser.add_argument("--actor_lr", type=float, default=None, help="default: the test's (too high with LoRA)")
    parser.add_argument("--greedy_eval", action="store_true", help="evaluate argmax decisions instead")
    parser.add_argument("--window", type=int, default=60, help="sessions per point of the online curve")
    parser.add_argument("--restatements", type=int, default=0,
                        help="facts said again per episode (saving one again is a duplicate save)")
    parser.add_argument("--planner_memories", type=int, default=None,
                        help="stored memories shown to the Planner (default: the observation's, 2)")
    parser.add_argument("--supersede_candidates", type=int, default=None,
                        help="similar memories a save may replace (default: the learner's, 3; 0: append only)")
    args = parser.parse_args()

    all_margins = []
    base = P.PersonaRunConfig()
    ppo = base.ppo if args.actor_lr is None else dataclasses.replace(base.ppo, actor_lr=args.actor_lr)
    world = dataclasses.replace(base.world, restatements=args.restatements)
    observation = base.observation if args.planner_memories is None else dataclasses.replace(
        base.observation, planner_memories=args.planner_memories)
    duplicates, truth = [], []
    supersede = base.supersede_candidates if args.supersede_candidates is None else args.supersede_candidates
    for seed in args.seeds:
        config = dataclasses.replace(
            base, ppo=ppo, seed=seed, supersede_candidates=supersede, world=world, observation=observation, train_episodes=args.episodes,
            eval_episodes=args.eval_episodes,
            eval_every=args.eval_every, greedy_eval=args.greedy_eval,
            lora=LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank) if args.lora_rank else None)
        print(f"=== seed {seed}: {args.episodes} training episodes, held-out curve "
              f"({args.eval_episodes} episodes, {'greedy' if args.greedy_eval else 'sampled'} decisions)")
        result = P.run_persona_world(config, log=print)
        n = config.world.num_sessions
        print("per session (held-out):   before -> after")
        before = P.per_session_table(result.eval_sessions[0][1], n)
        after = P.per_session_table(result.eval_sessions[-1][1], n)
        for s in range(n):
            b, a = before[s], after[s]
            print(f"  session {s}: planner precision {b['eval/planner_precision']:.3f} -> "
                  f"{a['eval/planner_precision']:.3f} | trigger recall {b['eval/trigger_recall']:.3f} -> "
                  f"{a['eval/trigger_recall']:.3f} ({int(a['eval/needed_pairs'])} needed pairs)")
        print(f"online curve (sampled decisions while training, {args.window} sessions per point):")
        for i, w in enumerate(P.online_windows(result.online_sessions, args.window)):
            print(f"  sessions {i * args.window:4d}+: planner precision {w['online/planner_precision']:.3f} "
                  f"recall {w['online/planner_recall']:.3f} | trigger recall {w['online/trigger_recall']:.3f}")
        last = result.update_metrics[-1]
        print(f"last update: trigger reward {last['rewards/trigger']:.3f}, planner reward "
              f"{last['rewards/planner']:.3f}, skipped steps {last['update/total_skipped_steps']:.0f}, "
              f"judge failures {last['judge/proxy_failures'] + last['judge/quality_failures']:.0f}")
        b, a = result.before, result.after
        online = P.online_windows(result.online_sessions, len(result.online_sessions))[0]
        duplicates.append((b["eval/duplicate_saves"], a["eval/duplicate_saves"], online["online/duplicate_saves"],
                           a["eval/duplicate_save_rate"]))
        print(f"duplicate saves: held-out before {b['eval/duplicate_saves']:.0f} "
              f"({b['eval/duplicate_save_rate']:.3f} of saves) -> after {a['eval/duplicate_saves']:.0f} "
              f"({a['eval/duplicate_save_rate']:.3f}); online {online['online/duplicate_saves']:.0f} "
              f"({online['online/duplicate_save_rate']:.3f})")
        truth.append([b["eval/stale_recall_rate"], a["eval/stale_recall_rate"],
                      b["eval/stale_recall_rate_update_saved"], a["eval/stale_recall_rate_update_saved"],
                      b["eval/update_accuracy"], a["eval/update_accuracy"], b["eval/trigger_recall"],
                      a["eval/trigger_recall"]])
        print(f"facts that change (supersede_candidates {supersede}): stale recall {truth[-1][0]:.3f} -> "
              f"{truth[-1][1]:.3f} of {a['eval/stale_queries']:.0f} queries with an overwritten value ("
              f"{truth[-1][2]:.3f} -> {truth[-1][3]:.3f} where the update was saved); update accuracy "
              f"{truth[-1][4]:.3f} -> {truth[-1][5]:.3f}")
        m = P.margins(result)
        all_margins.append(m)
        print("margins (after - before): " + ", ".join(f"{k.split('/')[1]} {v:+.3f}" for k, v in m.items())
              + f"  [{result.seconds:.0f}s]")
    if len(args.seeds) > 1:
        d = np.array(duplicates)
        print(f"duplicate saves over seeds {args.seeds}: held-out after {d[:, 1].tolist()} (mean {d[:, 1].mean():.1f}, "
              f"rate {d[:, 3].mean():.3f}), online {d[:, 2].tolist()} (mean {d[:, 2].mean():.1f})")
        t = np.array(truth, dtype=float)
        names = ("stale recall before", "stale recall after", "stale recall (update saved) before",
                 "stale recall (update saved) after", "update accuracy before", "update accuracy after",
                 "trigger recall before", "trigger recall after")
        print(f"facts that change, supersede_candidates {supersede}, mean +- sd over seeds {args.seeds}: "
              + "; ".join(f"{n} {np.nanmean(t[:, i]):.3f} +- {np.nanstd(t[:, i], ddof=1):.3f}"
                          for i, n in enumerate(names)))
        for key in all_margins[0]:
            values = [m[key] for m in all_margins]
            print(f"{key.split('/')[1]}: min {min(values):+.3f} mean {np.mean(values):+.3f} over seeds {args.seeds}")


if __name__ == "__main__":
    main()
