"""Candidate recall of the Trigger's prefilter (observation.prefilter: bm25 vs embedding) on the persona world.

Setting: each persona-world episode's memory holds every user turn before the query (a save-every-turn Planner,
the note being the turn text, as the offline writer keeps it), so a store outgrows `max_candidates` from the
third or fourth session on. For every (query, needed memory) pair (the world's y_t labels) it measures whether
the prefilter keeps the needed memory among its candidates (`Prefilter.capped`, exactly what `MemoryAgent`
offers the Trigger), and the trigger recall of the lexical Trigger rule (`learner.trigger_rule = "lexical"`: the
candidate with the best BM25 score > 0, else none) on those candidates. Pairs whose store fits under the cap
are recalled by construction and counted apart. A "newest" row (the k most recent memories) is the reference BM25
falls back to when a query shares no word with any memory (ties go to the newer memory).

    python scripts/prefilter_recall.py --seeds 0 1 2 --episodes 100 --max_candidates 15 5
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Sequence

from icml_jax.agents.prefilter import DEFAULT_MODEL, EmbeddingPrefilter, LexicalPrefilter, Prefilter, encoder_directory
from icml_jax.data.persona_world import PersonaWorldConfig, generate_episodes
from icml_jax.data.schema import Episode, TurnRef
from icml_jax.memory.lexical import bm25_scores


@dataclasses.dataclass(frozen=True)
class Pair:
    """One query, the memories held before it (oldest first) and the index of the one it needs."""

    utterance: str
    memories: tuple[str, ...]  # memory documents as the agent ranks them (note + turn text)
    needed: int


def pairs_of(episodes: Sequence[Episode], user_speaker: str) -> list[Pair]:
    """Every (query, needed turn) pair of the episodes, with the user turns said before the query as memories."""
    out = []
    for ep in episodes:
        held: list[tuple[TurnRef, str]] = []
        for s, session in enumerate(ep.sessions):
            for t, turn in enumerate(session.turns):
                if turn.speaker != user_speaker:
                    continue
                refs = [ref for ref, _ in held]
                for need in turn.y_t or ():
                    out.append(Pair(turn.text, tuple(f"{text} {text}" for _, text in held), refs.index(need)))
                held.append((TurnRef(s, t), turn.text))
    return out


class NewestFirst:
    """A reference, not a prefilter option: the k newest memories (what BM25 falls back to when no word overlaps)."""

    kind = "newest (reference)"

    def capped(self, queries: Sequence[str], documents: Sequence[Sequence[str]], k: int) -> list[list[int]]:
        return [list(range(max(0, len(d) - k), len(d))) if k > 0 else [] for d in documents]


def lexical_choice(utterance: str, memories: Sequence[str], candidates: Sequence[int]) -> int | None:
    """The lexical Trigger rule: the candidate with the highest BM25 score (> 0; ties: the later one), else None."""
    scores = bm25_scores(utterance, [memories[i] for i in candidates])
    best = max(range(len(candidates)), key=lambda j: (scores[j], j), default=None)
    return None if best is None or scores[best] <= 0 else candidates[best]


def measure(prefilter: Prefilter | NewestFirst, pairs: Sequence[Pair], k: int) -> dict[str, float]:
    """Candidate recall and lexical-Trigger recall over the pairs whose store exceeds k, and over all pairs."""
    picked = prefilter.capped([p.utterance for p in pairs], [p.memories for p in pairs], k)
    over = [i for i, p in enumerate(pairs) if len(p.memories) > k]
    kept = [pairs[i].needed in picked[i] for i in range(len(pairs))]
    chosen = [lexical_choice(p.utterance, p.memories, c) == p.needed for p, c in zip(pairs, picked, strict=True)]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"pairs": len(pairs), "over_cap": len(over), "recall_over_cap": mean([kept[i] for i in over]),
            "recall_all": mean(kept), "lexical_trigger_all": mean(chosen),
            "lexical_trigger_over_cap": mean([chosen[i] for i in over])}


def _cell(values: Sequence[float], scale: float = 100.0) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{scale * statistics.fmean(values):.1f} ± {scale * sd:.1f}"


def main(argv: Sequence[str] | None = None) -> None:
    """Prints the Markdown table (mean ± sample sd over seeds, in %)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=100, help="persona-world episodes per seed")
    parser.add_argument("--num_sessions", type=int, default=PersonaWorldConfig.num_sessions)
    parser.add_argument("--max_candidates", type=int, nargs="+", default=[15, 5])
    parser.add_argument("--model", default="", help=f"BERT sentence-encoder dir ('' = the fetched {DEFAULT_MODEL})")
    args = parser.parse_args(argv)

    from icml_jax.models.encoder import load_sentence_encoder

    start = time.perf_counter()
    encoder = load_sentence_encoder(encoder_directory(args.model))
    prefilters: dict[str, Prefilter | NewestFirst] = {"bm25": LexicalPrefilter(), "embedding": EmbeddingPrefilter(encoder),
                                        "newest (reference)": NewestFirst()}
    rows: dict[tuple[str, int], list[dict[str, float]]] = {}
    for seed in args.seeds:
        world = PersonaWorldConfig(seed=seed, num_sessions=args.num_sessions)
        pairs = pairs_of(generate_episodes(world, args.episodes), world.user_speaker)
        for k in args.max_candidates:
            for name, prefilter in prefilters.items():
                rows.setdefault((name, k), []).append(measure(prefilter, pairs, k))
    print(f"persona world, {args.episodes} episodes x {args.num_sessions} sessions per seed, seeds {args.seeds}; "
          f"encoder {encoder.label}; {time.perf_counter() - start:.0f} s\n")
    print("| prefilter | max_candidates | pairs (over the cap) | candidate recall, over the cap | candidate recall, "
          "all | lexical Trigger recall, over the cap | lexical Trigger recall, all |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, k), ms in rows.items():
        n, over = sum(m["pairs"] for m in ms), sum(m["over_cap"] for m in ms)
        print(f"| {name} | {k} | {n} ({over}) | {_cell([m['recall_over_cap'] for m in ms])} | "
              f"{_cell([m['recall_all'] for m in ms])} | {_cell([m['lexical_trigger_over_cap'] for m in ms])} | "
              f"{_cell([m['lexical_trigger_all'] for m in ms])} |")


if __name__ == "__main__":
    main()
