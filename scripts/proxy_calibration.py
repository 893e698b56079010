"""How much of the `likelihood` proxy (rl.likelihood.LikelihoodProxyJudge) is the turn's own information and how
much any text in the memory slot would earn: for each turn of the given training episodes' history sessions, the
best memory gain over its `k` BM25-most-similar later gold turns (what r_proxy reads) with (a) the turn's text,
(b) a control text of about the same length (a turn of another GapChat episode, fixed by --seed) on the same
targets, and (c) the turn's text on `k` later gold turns drawn at random (no similarity selection). Prints the
means, the share of turns whose proxy reaches the Planner's high-value threshold 0.5, and the proxy that the
difference (a) - (b) would give. `--match utterance` picks the later turns by their utterance alone (what a
Trigger sees; `rl.likelihood.later_targets`), `pair` (the default, what r_proxy reads) by the utterance and the
gold turn together.

    python scripts/proxy_calibration.py --config=configs/gc_smollm2.py --data_dir=/tmp/tfds \
        --episodes gapchat-test-5-26 gapchat-test-4-15 gapchat-test-4-16 gapchat-test-5-36
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Sequence

from icml_jax.configlib import load_config
from icml_jax.data.protocol import PROTOCOL_SOURCES, gapchat_eval_pool
from icml_jax.data.schema import Episode
from icml_jax.data.stream import clip_sessions, history_sessions
from icml_jax.data.tfds_builders import read_episodes
from icml_jax.llm.judges import GoldTarget
from icml_jax.rl.config import LIKELIHOOD_MATCHES
from icml_jax.rl.likelihood import LikelihoodProxyJudge, information_value, later_targets
from icml_jax.run.runspec import RunSpec


def random_later(episode: Episode, session: int, k: int, rng: random.Random) -> list[GoldTarget]:
    """`k` gold turns of sessions after `session` drawn at random, shaped as `later_targets` shapes them."""
    pool = []
    for s in episode.sessions[session + 1:]:
        turns = [(t.speaker, t.text) for t in s.turns]
        pool += [GoldTarget(tuple(turns[:j - 1]), turns[j - 1][1], turns[j][1]) for j in range(1, len(turns))]
    return rng.sample(pool, min(k, len(pool)))


def control_text(text: str, others: Sequence[str], rng: random.Random) -> str:
    """A turn of another episode whose word count is closest to `text`'s (ties drawn by `rng`)."""
    n = len(text.split())
    best = min(abs(len(o.split()) - n) for o in others)
    return rng.choice([o for o in others if abs(len(o.split()) - n) == best])


def best_gains(judge: LikelihoodProxyJudge, asks: Sequence[tuple[str, Sequence[GoldTarget]]]) -> list[float | None]:
    """For each (memory text, targets), the largest memory gain (nats per token) of the text over the targets
    (None without targets); every pair goes to the generator in one batched call."""
    pairs = [(i, t) for i, (_, targets) in enumerate(asks) for t in targets]
    gains = judge.gains([t for _, t in pairs], [asks[i][0] for i, _ in pairs]) if pairs else []
    best: list[float | None] = [None] * len(asks)
    for (i, _), gain in zip(pairs, gains, strict=True):
        best[i] = gain if best[i] is None else max(best[i], gain)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--episodes", nargs="+", required=True, help="training episode ids (history sessions)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--match", choices=LIKELIHOOD_MATCHES, default="pair", help="how later gold turns are picked")
    args = parser.parse_args()
    config = load_config(args.config, {"data.data_dir": args.data_dir})
    spec = RunSpec.from_config(config)
    data = spec.data
    _, splits = PROTOCOL_SOURCES["gapchat"]
    pool = gapchat_eval_pool(*[read_episodes(data.tfds_name, s, data_dir=args.data_dir) for s in splits])
    cut = int(data.max_session_turns)
    by_id = {e.episode_id: clip_sessions(e, cut) for e in pool}
    missing = [i for i in args.episodes if i not in by_id]
    if missing:
        raise SystemExit(f"episodes not in {data.tfds_name}: {missing}")
    others = [t.text for e in pool if e.episode_id not in args.episodes for s in e.sessions for t in s.turns]
    k, scale = int(config.rl.reward.likelihood_later_turns), float(config.rl.reward.likelihood_scale)
    judge = LikelihoodProxyJudge(spec.make_backend("generator"), scale=scale)
    rng = random.Random(args.seed)
    rows: list[tuple[float | None, ...]] = []
    for eid in args.episodes:
        episode = history_sessions(by_id[eid])
        asks: list[tuple[str, Sequence[GoldTarget]]] = []
        for s, session in enumerate(episode.sessions[:-1]):
            for turn in session.turns:
                similar = later_targets(episode, s, turn.text, k, match=args.match) or []
                asks += [(turn.text, similar), (control_text(turn.text, others, rng), similar),
                         (turn.text, random_later(episode, s, k, rng))]
        best = best_gains(judge, asks)
        rows += [tuple(best[i:i + 3]) for i in range(0, len(best), 3)]
        print(f"{eid}: {len(rows)} turns so far", flush=True)
    scored = [r for r in rows if r[0] is not None]
    own, ctrl, rand = ([r[i] for r in scored] for i in range(3))
    diff = [a - b for a, b in zip(own, ctrl, strict=True)]
    print(f"\n{len(rows)} turns; {len(scored)} share a word with a later gold turn (the rest have proxy 0)")
    print("| memory text on the targets | mean best gain (nats/tok) | sd | mean proxy | proxy >= 0.5 |")
    print("|---|---:|---:|---:|---:|")
    for label, gains in ((f"the turn, its BM25-similar later turns (match {args.match})", own),
                         ("a same-length turn of another episode, same targets", ctrl),
                         ("the turn, random later turns", rand),
                         ("the turn minus the control (calibrated)", diff)):
        proxies = [information_value(g, scale) for g in gains]
        print(f"| {label} | {statistics.mean(gains):+.4f} | {statistics.stdev(gains):.4f} | "
              f"{statistics.mean(proxies):.3f} | {sum(p >= 0.5 for p in proxies) / len(proxies):.1%} |")


if __name__ == "__main__":
    main()
