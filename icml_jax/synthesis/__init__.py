"""Retrospective Session Synthesis: the cold-start expert data for the supervised warm-up of both policies.

`synthesize(config, backend, out_dir)` draws seeds, has the back end write each seed session and its prequel
storylines backwards (or, with `config.direction = "forward"`, an opening session and its sequels in time
order, the paper's comparison), annotates them forwards (y_p from information gain, y_t dependencies), builds
Trigger examples with hard and soft negatives, and writes everything as ArrayRecord files with a manifest. It
works with every back end: Gemini, the local model, and the offline one (persona-world templates, no network).

Every answer is stored as it arrives in `<out_dir>/requests.sqlite` (`icml_jax.llm.cache`), so a rerun of a
synthesis that died replays them and asks the back end only what is missing, writing the same files as an
uninterrupted run. A request the back end fails for good is counted and its storyline skipped; the stage
fails only when more than `max_failed_fraction` of the requests did.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.llm.cache import CachedBackend, ResponseCache, answer_namespace
from icml_jax.llm.types import LLMBackend
from icml_jax.synthesis import dataset
from icml_jax.synthesis.config import DIRECTIONS, OfflineWorldConfig, SynthesisConfig, default_config
from icml_jax.synthesis.dataset import ExpertData, load_expert_data, read_manifest
from icml_jax.synthesis.examples import (
    Candidate,
    PlannerExample,
    TriggerExample,
    example_stats,
    planner_examples,
    trigger_examples,
)
from icml_jax.synthesis.memories import condense_expert_data
from icml_jax.synthesis.offline_world import (
    StorylineKey,
    ground_truth,
    opening_session,
    seed_session,
    storyline_sessions,
)
from icml_jax.synthesis.parsing import MalformedOutput
from icml_jax.synthesis.seeds import SeedSpec, make_seeds, seeds_from_episodes, split_seeds
from icml_jax.synthesis.storylines import (
    Rejection,
    RequestStats,
    SynthesisFailedError,
    SynthesisResult,
    check_failures,
    synthesize_episodes,
)

def describe_backend(backend: LLMBackend) -> dict[str, Any]:
    """Back-end name and model for the manifest (Gemini: its model id; local: the backbone family and size)."""
    model = None
    config = getattr(backend, "config", None)
    if config is not None and getattr(config, "model", None):
        model = str(config.model)
    elif getattr(backend, "model", None) is not None and hasattr(backend.model, "config"):
        c = backend.model.config
        model = f"{getattr(c, 'family', '?')} (hidden {getattr(c, 'hidden_size', '?')}, " \
                f"{getattr(c, 'num_layers', '?')} layers)"
    return {"name": backend.name, "model": model}


def cache_namespace(backend: LLMBackend) -> dict[str, Any]:
    """What identifies a back end's answers in the request cache: its name and model, and the knobs of its
    config (a dataclass, e.g. GeminiConfig) that change answers (thinking budget, structured output mode)."""
    namespace: dict[str, Any] = {"backend": describe_backend(backend)}
    config = getattr(backend, "config", None)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        namespace["config"] = answer_namespace(dataclasses.asdict(config))
    return namespace


def _cached(backend: LLMBackend, cache: ResponseCache) -> CachedBackend:
    """`backend` behind `cache`; a remote back end (`backend.remote`, e.g. Gemini) stores each answer on arrival."""
    in_flight = getattr(getattr(backend, "config", None), "max_concurrency", 16)
    return CachedBackend(backend, cache, cache_namespace(backend), per_request=bool(getattr(backend, "remote", False)),
                         in_flight=max(1, int(in_flight)))


def _count(episodes: Any, user_speaker: str) -> dict[str, int]:
    turns = [t for e in episodes for s in e.sessions for t in s.turns]
    user = [t for t in turns if t.speaker == user_speaker]
    return {
        "episodes": len(episodes),
        "sessions": sum(len(e.sessions) for e in episodes),
        "turns": len(turns),
        "user_turns": len(user),
        "y_p_true": sum(bool(t.y_p) for t in user),
        "turns_with_y_t": sum(bool(t.y_t) for t in user),
    }


def synthesize(config: SynthesisConfig | ml_collections.ConfigDict | dict, backend: LLMBackend,
               out_dir: str | os.PathLike[str], *, seeds: Sequence[SeedSpec] | None = None,
               condenser: LLMBackend | None = None) -> dict[str, Any]:
    """Runs the synthesis with `backend` and writes the expert dataset to `out_dir`; returns the manifest.

    `seeds`: the seeds to write storylines from (e.g. `seeds_from_episodes` of the episodes to be played);
    None = `make_seeds(config)` (the seeds file, else constraints drawn from the persona world).
    `condenser`: the back end the online agent condenses memories with (the main job's generator); None =
    `backend`. Used when `config.condense_memories`.

    Answers are kept in `<out_dir>/requests.sqlite` and replayed by a rerun. Raises SynthesisFailedError (before
    writing any output) when more than `config.max_failed_fraction` of the requests failed for good.
    """
    if not isinstance(config, SynthesisConfig):
        config = SynthesisConfig.from_config(config)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    usage_before = backend.usage
    seeds = list(seeds) if seeds is not None else make_seeds(config)
    if not seeds:
        raise ValueError("synthesize: no seeds")
    train_ids, held_ids = split_seeds(seeds, config.heldout_fraction, config.seed)
    condenser = condenser or backend
    condenser_usage = condenser.usage
    cache = ResponseCache(out / dataset.REQUESTS_CACHE)
    try:
        writer = _cached(backend, cache)
        cached_condenser = writer if condenser is backend else _cached(condenser, cache)
        result = synthesize_episodes(config, writer, seeds)
        asked = [result.stats]
        user = config.world.user_speaker
        held = set(held_ids)
        splits = {
            "train": [e for e in result.episodes if e.meta["seed_id"] not in held],
            "heldout": [e for e in result.episodes if e.meta["seed_id"] in held],
        }
        records, counts, condensed = {}, {}, {}
        for split, episodes in splits.items():
            examples = trigger_examples(episodes, user_speaker=user, hard_negatives=config.hard_negatives,
                                        soft_negatives=config.soft_negatives,
                                        none_per_episode=config.none_examples_per_episode, seed=config.seed)
            if config.condense_memories:
                episodes, examples, condensed[split], condense_stats = condense_expert_data(
                    episodes, examples, cached_condenser, user_speaker=user, batch_size=config.batch_size,
                    max_output_tokens=config.note_max_tokens)
                asked.append(condense_stats)
            records[split] = (episodes, examples)
            counts[split] = {**_count(episodes, user), "trigger": example_stats(examples)}
        check_failures(asked, config.max_failed_fraction, str(cache.path))
        wrappers = [writer] if cached_condenser is writer else [writer, cached_condenser]
        cache_counts = {"file": dataset.REQUESTS_CACHE, "hits": sum(w.hits for w in wrappers),
                        "misses": sum(w.misses for w in wrappers)}
    finally:
        cache.close()
    files = _write_splits(out, records)
    manifest = {
        "format_version": dataset.FORMAT_VERSION,
        "created_by": "icml_jax.synthesis",
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": describe_backend(backend),
        "config": config.to_dict(),
        "direction": config.direction,  # how the storylines were written: "backward" (the paper's) or "forward"
        "seeds": [s.to_dict() for s in seeds],
        "split_seed_ids": {"train": train_ids, "heldout": held_ids},
        "counts": _manifest_counts(config, seeds, result, asked, counts),
        "requests": result.stats.to_dict(),
        # what this run spent (answers replayed from requests.sqlite cost nothing): tokens, calls, HTTP attempts,
        # retries and failures of the synthesis back end (the condenser's too when it is the same back end)
        "usage": (backend.usage - usage_before).to_dict(),
        "cache": cache_counts,  # requests answered from requests.sqlite (hits) and sent to a back end (misses)
        "memories": {"condensed": config.condense_memories, "backend": describe_backend(condenser),
                     "usage": (condenser.usage - condenser_usage).to_dict() if condenser is not backend else None,
                     **{split: c for split, c in condensed.items()}},
        "rejections": [r.to_dict() for r in result.rejections],
        "files": files,
    }
    (out / dataset.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    return manifest


def _write_splits(out: Path, records: Mapping[str, tuple[Sequence[Any], Sequence[Any]]]) -> dict[str, Any]:
    """Each split's episodes and Trigger examples as record files; their names -> what `write_records` says."""
    files = {}
    for split, (episodes, examples) in records.items():
        files[dataset.episodes_path(out, split).name] = dataset.write_records(
            dataset.episodes_path(out, split), [e.to_json() for e in episodes])
        files[dataset.trigger_path(out, split).name] = dataset.write_records(
            dataset.trigger_path(out, split), [x.to_json() for x in examples])
    return files


def _manifest_counts(config: SynthesisConfig, seeds: Sequence[SeedSpec], result: Any, asked: Sequence[Any],
                     counts: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's counts: seeds, storylines asked / accepted / rejected, malformed and failed requests, and
    each split's episode and example counts."""
    rejected_seeds = {r.seed_id for r in result.rejections if r.storyline is None}
    requested = len(seeds) * config.storylines_per_seed
    return {
        "seeds": len(seeds),
        "seeds_rejected": len(rejected_seeds),
        "storylines_requested": requested,
        "storylines_accepted": len(result.episodes),
        "storylines_rejected": requested - len(result.episodes),
        "rejected_outputs": len(result.rejections),
        "malformed_answers": result.stats.malformed,
        # requests (storylines' and condensations') the back end failed for good: skipped, not fatal
        "failed_requests": sum(a.failed for a in asked),
        **dict(counts),
    }


__all__ = [
    "Candidate",
    "DIRECTIONS",
    "ExpertData",
    "MalformedOutput",
    "OfflineWorldConfig",
    "PlannerExample",
    "Rejection",
    "RequestStats",
    "SeedSpec",
    "StorylineKey",
    "SynthesisConfig",
    "SynthesisFailedError",
    "SynthesisResult",
    "TriggerExample",
    "cache_namespace",
    "default_config",
    "describe_backend",
    "example_stats",
    "ground_truth",
    "load_expert_data",
    "make_seeds",
    "opening_session",
    "planner_examples",
    "read_manifest",
    "seed_session",
    "seeds_from_episodes",
    "split_seeds",
    "storyline_sessions",
    "synthesize",
    "synthesize_episodes",
    "trigger_examples",
]
