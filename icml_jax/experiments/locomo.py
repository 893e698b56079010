"""The LoCoMo experiment: every system's memory of each LoCoMo conversation, asked its questions
(`evaluation.locomo_qa`), scored per category as the field reports it, with paired per-question tests.

    python -m icml_jax.experiments --experiment=locomo --config=configs/locomo_smollm2.py --workdir=DIR --seeds 0

Settings: `config.experiments.locomo` (`LocomoSettings`). Ours is the config's trained agent (warm-up and online
learning on the config's own data, never on LoCoMo), answering from the memory its Planner built and its Trigger
recalls; `ours_online` the same agent learning on each conversation's sessions as it reads them (Algorithm 1 with
the config's rewards; the sessions only, never a question, answer or evidence), updated before the questions;
each baseline from its own memory and retrieval; `dense@k` the dense baseline showing its top k; the
evidence oracle the question's evidence turns (the generator's ceiling). Each system writes
`<workdir>/seed<k>/locomo_<system>/qa.jsonl` (one row per question, every metric recomputable) and `results.json`
(the summary and the setting); a rerun under the same config reads them back.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from icml_jax.baselines import baseline_factory
from icml_jax.configlib import config_differences
from icml_jax.data.sources.locomo import first_sessions, parse_locomo
from icml_jax.data.sources.longmemeval import parse_longmemeval
from icml_jax.evaluate import EvalContext, build_tokenizer, policy_factory
from icml_jax.evaluation import locomo_scoring as scoring
from icml_jax.evaluation.locomo_qa import QA_JSONL, QAItem, judge_rows, play_qa
from icml_jax.evaluation.significance import sign_flip_p_value
from icml_jax.experiments import runs
from icml_jax.experiments.tables import Report
from icml_jax.llm.cache import CachedBackend, ResponseCache
from icml_jax.llm.config import GENERATOR, JUDGE
from icml_jax.llm.verbatim import VerbatimNotes
from icml_jax.memory.store import MemoryStore
from icml_jax.run.runspec import RunSpec
from icml_jax.run.validation import EXTENDABLE_KEYS

RESULTS = "results.json"
ORACLE = "evidence_oracle"
OURS_ONLINE = "ours_online"  # ours, learning online (its own rewards) on each conversation's sessions as it reads them
OURS_SYSTEMS = ("ours", OURS_ONLINE)  # the systems that play the trained policy
# how long ours trains and how its checkpoints are kept: a baseline's rows do not depend on them, so a finished run
# extended (validation.EXTENDABLE_KEYS) reads its baselines back and plays only ours again
OURS_TRAINING_KEYS = ("checkpoint.", *EXTENDABLE_KEYS)
DENSE_K = "dense@"
FORMATS = ("locomo", "longmemeval")  # LocomoSettings.format: how `file` is read


@dataclasses.dataclass(frozen=True)
class LocomoSettings:
    """`config.experiments.locomo`: the data, which questions, how memories are written, which systems."""

    file: str | None = None  # the LoCoMo JSON (the release's locomo10.json or shared/data/locomo/locomo7.json)
    conversations: int | None = None  # the first n conversations (None: all)
    sessions: int | None = None  # each conversation's first n sessions and only the questions whose evidence
    # lies in them (`first_sessions`; None: all): a cut for systems that cost a generation per turn
    answered: int | None = None  # per conversation, a seeded draw of n questions the generator answers (None: all);
    # every question is recalled for (evidence recall)
    question_seed: int = 0
    user_speaker: str | None = None  # whose turns the systems build memory from (None: both speakers)
    notes: str = "turn"  # "turn": each saved turn's text is its note (llm.verbatim); "model": the generator writes
    systems: tuple[str, ...] = ("ours", "no_memory", "dense", ORACLE)  # "ours", baselines, "dense@k", ORACLE
    judge: bool = False  # J from the judge back end (config.llm.judge) on categories 1-4
    format: str = "locomo"  # "locomo": a LoCoMo JSON; "longmemeval": a LongMemEval JSON (one episode per question)

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> LocomoSettings:
        block = dict((config.get("experiments") or {}).get("locomo") or {})
        unknown = set(block) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"config.experiments.locomo: unknown keys {sorted(unknown)}; known: "
                             f"{[f.name for f in dataclasses.fields(cls)]}")
        if "systems" in block:
            block["systems"] = tuple(block["systems"])
        settings = cls(**block)
        if not settings.file:
            raise ValueError("config.experiments.locomo.file: the LoCoMo JSON is not set (the release's "
                             "data/locomo10.json, or ../shared/data/locomo/locomo7.json)")
        if settings.notes not in ("turn", "model"):
            raise ValueError(f"config.experiments.locomo.notes must be 'turn' or 'model', got {settings.notes!r}")
        if settings.format not in FORMATS:
            raise ValueError(f"config.experiments.locomo.format must be one of {list(FORMATS)} (how the file is "
                             f"read), got {settings.format!r}")
        if settings.sessions is not None:
            if isinstance(settings.sessions, bool) or not isinstance(settings.sessions, int) or settings.sessions < 1:
                raise ValueError(f"config.experiments.locomo.sessions must be a positive integer or None, got "
                                 f"{settings.sessions!r}")
            if settings.format != "locomo":
                raise ValueError("config.experiments.locomo.sessions cuts LoCoMo conversations; a LongMemEval "
                                 "question's haystack is not cut (format='longmemeval')")
        return settings

    def record(self) -> dict[str, Any]:
        """The settings as results.json records them (the default format left out, so LoCoMo runs made before the
        field existed are read back)."""
        d = dataclasses.asdict(self)
        if d["format"] == "locomo":
            del d["format"]
        if d["sessions"] is None:
            del d["sessions"]
        return d


def conversations(settings: LocomoSettings) -> list:
    """The episodes of the settings' file (the first `conversations` of them, each cut to its first `sessions`):
    LoCoMo conversations, or one LongMemEval question each with `format="longmemeval"`."""
    if settings.format not in FORMATS:
        raise ValueError(f"LocomoSettings.format must be one of {list(FORMATS)}, got {settings.format!r}")
    parse = parse_longmemeval if settings.format == "longmemeval" else parse_locomo
    episodes = list(parse(Path(settings.file).expanduser(), relpath=Path(settings.file).name))
    episodes = episodes[:settings.conversations] if settings.conversations else episodes
    return [first_sessions(e, settings.sessions) for e in episodes] if settings.sessions else episodes


def answered_selector(settings: LocomoSettings) -> Callable[[Any, list[QAItem]], list[bool]] | None:
    """Which questions of a conversation the generator answers: a seeded draw of `settings.answered` (the same
    for every system); None: all."""
    if settings.answered is None:
        return None
    n = int(settings.answered)

    def select(episode: Any, items: list[QAItem]) -> list[bool]:
        keep = set(random.Random(f"{settings.question_seed}/{episode.episode_id}").sample(
            range(len(items)), min(n, len(items))))
        return [i in keep for i in range(len(items))]

    return select


def _system_config(config: ml_collections.ConfigDict, system: str) -> ml_collections.ConfigDict:
    """The config a system runs under: dense@k sets `baselines.top_k`, ours_online `eval.learn`."""
    if system.startswith(DENSE_K):
        return runs.derive(config, {"baselines.top_k": int(system[len(DENSE_K):])})
    if system == OURS_ONLINE:
        return runs.derive(config, {"eval.learn": True})
    return config


def _factory(system: str, checkpoint: Path | None):
    """The agent factory of a system (None: the evidence oracle, which has no agent)."""
    if system == ORACLE:
        return None
    if system in OURS_SYSTEMS:
        return policy_factory(checkpoint)
    return baseline_factory("dense" if system.startswith(DENSE_K) else system)


def run_system(config: ml_collections.ConfigDict, settings: LocomoSettings, out_dir: Path, system: str, *,
               episodes: Sequence[Any], cache_path: Path, policy_dir: Path | None = None) -> dict[str, Any]:
    """One system over the conversations: writes `out_dir`/qa.jsonl and results.json, returns the results (read
    back when `out_dir` holds them for the same config and settings)."""
    from tqdm.auto import tqdm

    config = _system_config(config, system)
    setting = {"config": config.to_dict(), "locomo": settings.record(), "system": system,
               "policy_dir": str(policy_dir) if policy_dir else None}
    done = out_dir / RESULTS
    if done.is_file():
        content = json.loads(done.read_text(encoding="utf-8"))
        if _same_setting(content.get("setting") or {}, json.loads(json.dumps(setting))):
            return content
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = RunSpec.from_config(config)
    tokenizer = build_tokenizer(config, policy_dir or out_dir, spec)
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    cache = ResponseCache(cache_path)
    generator = CachedBackend(spec.llm.make_backend(GENERATOR), cache, spec.llm.namespace(GENERATOR))
    writer = VerbatimNotes(generator) if settings.notes == "turn" else generator
    # the judge back end: J (settings.judge) and the learner's rewards where they come from judges
    judge = (CachedBackend(spec.llm.make_backend(JUDGE), cache, spec.llm.namespace(JUDGE))
             if settings.judge or system == OURS_ONLINE else None)
    factory = _factory(system, policy_dir)
    with MemoryStore() as store:
        agent, provenance = None, None
        if factory is not None:
            agent, provenance = factory(EvalContext(config, policy_dir or out_dir, writer, judge, store, tokenizer,
                                                    count))
            agent.name = system
        rows, ingested = play_qa(agent, list(episodes), writer, user_speaker=settings.user_speaker,
                                 count_tokens=count, answered=answered_selector(settings), seed=settings.question_seed,
                                 progress=lambda xs: tqdm(xs, desc=f"locomo {system}", unit="group", leave=False))
    unusable = judge_rows(rows, judge) if settings.judge else 0
    with (out_dir / QA_JSONL).open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    content = {"system": system, "summary": scoring.summarize(rows), "questions": len(rows),
               "ingested": ingested, "judge_unusable": unusable,
               "verbatim_notes": getattr(writer, "notes", None),
               "agent": provenance,  # its live counters (e.g. a baseline's malformed answers) hold the run's counts
               "updates": getattr(agent, "updates", None),  # ours_online: each PPO update's metrics, in order
               "setting": setting}
    done.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return content


def _comparable(setting: Mapping[str, Any]) -> dict[str, Any]:
    """A system's recorded setting without the experiment's list of systems (which does not change any one
    system's run): what a rerun must match to be read back."""
    out = json.loads(json.dumps(setting))
    out.get("locomo", {}).pop("systems", None)
    ((out.get("config") or {}).get("experiments") or {}).get("locomo", {}).pop("systems", None)
    return out


def _same_setting(stored: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether a system's stored results were written for `current`: the LoCoMo settings, system and policy
    equal, the configs without differences (`config_differences`: keys added since read as their old value; the
    experiments block, whose LoCoMo part is the settings, not compared; for a baseline, how long ours trains)."""
    old, new = _comparable(stored), _comparable(current)
    configs = old.pop("config", None) or {}, new.pop("config", None) or {}
    ignore = ("experiments.",) + (() if new.get("system") in OURS_SYSTEMS else OURS_TRAINING_KEYS)
    return old == new and not config_differences(*configs, ignore=ignore)


def read_rows(out_dir: Path) -> list[dict[str, Any]]:
    """A system's per-question rows."""
    return [json.loads(line) for line in (out_dir / QA_JSONL).read_text(encoding="utf-8").splitlines() if line]


def paired(rows: Sequence[Mapping[str, Any]], against: Sequence[Mapping[str, Any]], key: str
           ) -> dict[str, Any] | None:
    """Paired sign-flip test of one per-question metric between two systems over the questions both have a
    number for: {"n", "mean_difference", "p"}; None when no question has both."""
    other = {r["question_id"]: r.get(key) for r in against}
    diffs = [float(r[key]) - float(other[r["question_id"]]) for r in rows
             if r.get(key) is not None and other.get(r["question_id"]) is not None]
    if not diffs:
        return None
    return {"n": len(diffs), "mean_difference": sum(diffs) / len(diffs), "p": sign_flip_p_value(diffs)}


COLUMNS = {"f1_1": "F1 multi-hop (1)", "f1_2": "F1 temporal (2)", "f1_3": "F1 open-dom. (3)",
           "f1_4": "F1 single-hop (4)", "f1": "F1 (1-4)", "bleu1": "B1 (1-4)", "judge": "J (1-4)",
           "evidence_recall": "Ev. recall", "offered_recall": "Offered recall", "session_recall": "Sess. recall",
           "adversarial": "Adv. (5)",
           "prompt_tokens": "prompt tok", "retrieval_p95": "retr. p95 ms"}


def table_row(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The table's numbers of one system's summary (`locomo_scoring.summarize`)."""
    overall = summary["overall"]
    row = {f"f1_{c}": summary[str(c)]["f1"] for c in (1, 2, 3, 4)}
    row.update({k: overall.get(k) for k in ("f1", "bleu1", "judge", "evidence_recall", "offered_recall",
                                            "session_recall", "prompt_tokens")})
    row["adversarial"] = summary["5"]["f1"]
    row["retrieval_p95"] = overall["retrieval_ms_p95"]
    return row


def locomo_report(ctx: Any, ours_policy: Callable[[int], Path]) -> Report:
    """The LoCoMo table: every system of `config.experiments.locomo.systems`, per seed of the experiment context
    `ctx` (catalog.Context); `ours_policy(seed)`: the trained policy's checkpoint directory."""
    settings = LocomoSettings.from_config(ctx.config)
    episodes = conversations(settings)
    report = Report("locomo", "LoCoMo question answering", "LoCoMo (Maharana et al., 2024); not in the paper",
                    dict(COLUMNS), {})
    tests: dict[str, dict[int, dict[str, Any]]] = {}
    for seed in ctx.seeds:
        config, rows = ctx.cfg(seed), {}
        for system in settings.systems:
            policy = ours_policy(seed) if system in OURS_SYSTEMS else None
            ctx.log(f"seed {seed}: locomo {system}")
            out = ctx.seed_dir(seed) / f"locomo_{system}"
            content = run_system(config, settings, out, system, episodes=episodes,
                                 cache_path=ctx.root / runs.EVAL_CACHE, policy_dir=policy)
            report.rows.setdefault(system, {})[seed] = table_row(content["summary"])
            report.provenance.setdefault(system, {})[seed] = {"qa": str(out / QA_JSONL),
                                                              "questions": content["questions"]}
            rows[system] = read_rows(out)
        for system, mine in rows.items():
            for base in ("no_memory", "ours"):
                if base in rows and base != system:
                    for key in ("f1", "evidence_recall"):
                        result = paired([r for r in mine if r["category"] != 5],
                                        [r for r in rows[base] if r["category"] != 5], key)
                        tests.setdefault(f"{system} vs {base}: {key}", {})[seed] = result
    report.extra["paired_tests"] = tests
    report.sections.append(paired_markdown(tests))
    report.sections.append(PUBLISHED)
    answered = ("every question" if settings.answered is None
                else f"{settings.answered} seeded questions per conversation")
    notes = ("each saved turn is its own memory text (no model writes notes)" if settings.notes == "turn"
             else "the generator writes each note")
    report.notes += [
        f"{len(episodes)} {'LoCoMo conversations' if settings.format == 'locomo' else 'LongMemEval questions'} "
        f"of {settings.file}; every question recalled for; {answered} answered"
        "; F1: LoCoMo's own token F1 (Porter-stemmed, per category as its release scores it), B1: BLEU-1 (nltk, "
        "smoothing 1, the Mem0 paper's tokens); categories 1-4 pooled, adversarial (5) apart: the share answered "
        "'not mentioned'.",
        "Ev. recall: the share of a question's evidence turns whose memory reached the answer prompt (questions "
        "with evidence only); Sess. recall: the same by session; Offered recall: the same over the memories the "
        "Trigger chose among (its candidates after the prefilter; '-' for systems that do not choose), so Offered "
        "minus Ev. recall is what the choice lost.",
        f"Notes: {notes}.",
        f"The setting's data ({RunSpec.from_config(ctx.config).data.name}) is what ours was trained on; every system reads LoCoMo.",
    ]
    return report


def paired_markdown(tests: Mapping[str, Mapping[int, Mapping[str, Any] | None]]) -> str:
    """The paired tests as a markdown table: mean difference and p per seed."""
    lines = ["Paired sign-flip tests per question (categories 1-4): mean difference (p) per seed.", "",
             "| comparison | " + " | ".join(f"seed {s}" for s in sorted({s for v in tests.values() for s in v})) + " |"]
    seeds = sorted({s for v in tests.values() for s in v})
    lines.append("|---|" + "---|" * len(seeds))
    for name, per_seed in tests.items():
        cells = []
        for s in seeds:
            t = per_seed.get(s)
            cells.append("-" if t is None else f"{t['mean_difference']:+.4f} (p={t['p']:.4f}, n={t['n']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PUBLISHED = """Published LoCoMo numbers (not ours; another setting): the Mem0 paper (arXiv 2504.19413), GPT-4o-mini
answering, the Mem0 paper's scorers (set-overlap F1 without stemming, BLEU-1) and its category names (its
single-hop is category 1, multi-hop category 3, open-domain category 4, temporal category 2), J from 10 judge runs.

| system | cat 1 F1 / B1 / J | cat 3 F1 / B1 / J | cat 4 F1 / B1 / J | cat 2 F1 / B1 / J | overall J |
|---|---|---|---|---|---:|
| Mem0 | 38.72 / 27.13 / 67.13 | 28.64 / 21.58 / 51.15 | 47.65 / 38.72 / 72.93 | 48.93 / 40.51 / 55.51 | 66.88 |
| Zep | 35.74 / 23.30 / 61.70 | 19.37 / 14.82 / 41.35 | 49.56 / 38.92 / 76.60 | 42.00 / 34.53 / 49.31 | 65.99 |
| LangMem | 35.51 / 26.86 / 62.23 | 26.04 / 22.32 / 47.92 | 40.91 / 33.63 / 71.12 | 30.75 / 25.84 / 23.43 | 58.10 |
| full context | | | | | 72.90 |
"""


__all__ = ["COLUMNS", "FORMATS", "LocomoSettings", "ORACLE", "OURS_ONLINE", "answered_selector", "conversations",
           "locomo_report", "paired", "read_rows", "run_system", "table_row"]
