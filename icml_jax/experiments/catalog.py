"""One function per paper result. Each builds its variants with `runs` under `<root>/seed<k>/<variant>` and
returns a `tables.Report`. Variant directories are named the same in every experiment (base, ours, no_planner,
lambda_0.3, baseline_mem0, ...), so experiments run on one workdir share whatever they have in common: `ablation`
after `main` reuses its warm-up and its trained agent, `judges` trains from the same warm-up, `rejudge` rejudges
`main`'s replies.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from icml_jax.baselines import baseline_factory
from icml_jax.data.config import PERSONA_WORLD
from icml_jax.evaluate import EVAL_DIR, eval_episodes
from icml_jax.evaluation.judging import judge_targets
from icml_jax.evaluation.report import RESULTS_JSON, TABLE1, read_targets
from icml_jax.experiments import runs
from icml_jax.experiments.efficiency import efficiency_report, per_session_of
from icml_jax.experiments.locomo import locomo_report
from icml_jax.experiments.policy_maps import episode_maps, plot_maps
from icml_jax.experiments.tables import Report, aggregate, metrics_of
from icml_jax.llm.cache import CachedBackend, ResponseCache, answer_namespace
from icml_jax.llm.judges import QualityJudge
from icml_jax.llm.local import DEFAULT_JUDGE_MODE, JUDGE_MODE_SCORES
from icml_jax.llm.config import GENERATOR, JUDGE
from icml_jax.llm.registry import make_backend
from icml_jax.models.backbone import TINY
from icml_jax.rl.config import LIKELIHOOD_KEYS
from icml_jax.rl.save_log import pearson_or_none
from icml_jax.run.agent_loading import find_checkpoint
from icml_jax.run.runlog import METRICS_FILE, read_metrics
from icml_jax.run.runspec import RunSpec
from icml_jax.synthesis.config import SynthesisConfig


@dataclasses.dataclass
class Context:
    """The experiment's config, workdir and seeds, and where progress lines go."""

    config: ml_collections.ConfigDict
    root: Path
    seeds: Sequence[int]
    log: Callable[[str], None] = print
    warmed: dict[int, Path] = dataclasses.field(default_factory=dict)  # seed -> warm-up checkpoint, once per run

    def seed_dir(self, seed: int) -> Path:
        return self.root / f"seed{seed}"

    def cfg(self, seed: int) -> ml_collections.ConfigDict:
        return runs.seed_config(self.config, seed)

    @functools.cached_property
    def spec(self) -> RunSpec:
        """The typed blocks of the experiment's config (each seed's run config differs only in its seed)."""
        return RunSpec.from_config(self.config)

    def exp(self, key: str, default: Any = None) -> Any:
        return (self.config.get("experiments") or {}).get(key, default)


REPLY_COLUMNS = {**{c: ("B-4" if c == "BLEU-4" else "R-L" if c == "ROUGE-L" else "Bert" if c == "BERTScore" else c)
                    for c in TABLE1}, "Memory gain": "Gain (nats/tok)", "NLL": "NLL (nats/tok)"}
MEMORY_COLUMNS = {"planner_precision": "P-prec", "planner_recall": "P-rec", "trigger_recall": "T-rec"}
ORACLE = ("The offline judge is an oracle: it scores a reply by whether the memory it used is the one the data's "
          "labels say the turn needs, and the offline generator quotes that memory; judge columns and the learning "
          "they drive show whether the right memory reached the reply, not reply quality.")


def judge_notes(config: ml_collections.ConfigDict) -> list[str]:
    """What the judged columns mean under the config's back ends: the oracle note when the judge is offline, what
    the judge reads when it is a real model, and a note when the offline generator (not an LLM) writes replies."""
    llm = RunSpec.from_config(config).llm
    judge, kind = llm.block(JUDGE), llm.kind(JUDGE)
    if kind == "offline":
        notes = [ORACLE]
    else:
        model = judge.get("model_dir") or judge.get("model") or "?"

        how = (" by its score-token probabilities (the expected 1-5 score per dimension)"
               if kind == "local" and (judge.get("judge_mode") or DEFAULT_JUDGE_MODE) == JUDGE_MODE_SCORES
               else "")
        notes = [f"Judge columns: the {kind} judge ({Path(str(model)).name}) rates each reply{how}; it reads "
                 "the dialogue and the reply, never the gold turn or a label."]
    if llm.kind(GENERATOR) == "offline" and kind != "offline":
        notes.append("The offline generator writes the replies (it quotes the recalled memory): no LLM wrote them.")
    return notes


# ------------------------------------------------------------------------------------------- shared variants


def warm(ctx: Context, seed: int) -> Path:
    """The seed's synthesis + warm-up (`base`), the start of every variant that learns online (run, or resumed
    and checked, once per experiment)."""
    if seed not in ctx.warmed:
        ctx.log(f"seed {seed}: synthesis and warm-up")
        ctx.warmed[seed] = runs.base_run(ctx.cfg(seed), ctx.seed_dir(seed))
    return ctx.warmed[seed]


def trained(ctx: Context, seed: int, name: str, overrides: dict[str, Any] | None = None, *,
            from_warmup: bool = True) -> Path:
    """An online run named `name` from the seed's warm-up (or from untrained heads)."""
    start = warm(ctx, seed) if from_warmup else None
    ctx.log(f"seed {seed}: online learning ({name})")
    return runs.online_run(ctx.cfg(seed), ctx.seed_dir(seed) / name, init_from=start, overrides=overrides)


def scored(ctx: Context, seed: int, workdir: Path, system: str, *, overrides: dict[str, Any] | None = None,
           checkpoint: Path | None = None, factory: Callable | None = None) -> dict[str, Any]:
    """The evaluation of a trained run (or a checkpoint, or a baseline's agent), as results.json content; read
    back when it already ran under the same config."""
    cfg = runs.derive(ctx.cfg(seed), overrides or {})
    done = runs.read_back(cfg, workdir, system)
    if done is not None:
        ctx.log(f"seed {seed}: {system} read back from its results.json")
        return done
    ctx.log(f"seed {seed}: evaluating {system}")
    return runs.evaluate(cfg, workdir, ctx.root, system=system, checkpoint=checkpoint, factory=factory)


def learned(ctx: Context, seed: int, name: str, overrides: dict[str, Any] | None = None, *,
            from_warmup: bool = True, eval_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The evaluation of the online run `name`, read back without touching its run (or the warm-up) when it was
    already scored under the same config: a workdir that kept only its results files still rebuilds the tables."""
    done = runs.read_back(runs.derive(ctx.cfg(seed), eval_overrides or {}), ctx.seed_dir(seed) / name, name)
    if done is not None:
        ctx.log(f"seed {seed}: {name} read back from its results.json")
        return done
    workdir = trained(ctx, seed, name, overrides, from_warmup=from_warmup)
    return scored(ctx, seed, workdir, name, overrides=eval_overrides)


def ours(ctx: Context, seed: int) -> dict[str, Any]:
    """The full method: warm-up, then online learning; evaluated."""
    return learned(ctx, seed, "ours")


def baseline(ctx: Context, seed: int, name: str) -> dict[str, Any]:
    """A baseline (icml_jax.baselines) on the same episodes, back ends and caches."""
    return scored(ctx, seed, ctx.seed_dir(seed) / f"baseline_{name}", name, factory=baseline_factory(name))


def _setting_note(content: dict[str, Any]) -> str:
    s = content["setting"]
    return f"{len(s['episode_ids'])} evaluation episodes ({s['selection']}), {content['targets']} targets"


def _provenance(content: dict[str, Any]) -> dict[str, Any]:
    s = content["setting"]
    return {k: s.get(k) for k in ("checkpoint", "baseline", "selection", "backend_requests", "llm_usage")
            if k in s} | {"episode_ids": s["episode_ids"]}


def _rows(ctx: Context, variants: dict[str, Callable[[int], dict[str, Any]]], report: Report,
          metric: Callable[[dict[str, Any]], dict[str, Any]] = metrics_of) -> dict[str, dict[int, dict[str, Any]]]:
    """Runs every variant for every seed; fills report.rows and report.provenance; returns the raw contents."""
    contents: dict[str, dict[int, dict[str, Any]]] = {}
    for seed in ctx.seeds:
        for name, fn in variants.items():
            content = fn(seed)
            contents.setdefault(name, {})[seed] = content
            report.rows.setdefault(name, {})[seed] = metric(content)
            report.provenance.setdefault(name, {})[seed] = _provenance(content)
    if contents:
        first = next(iter(next(iter(contents.values())).values()))
        report.notes.append(f"Each run: {_setting_note(first)}.")
    return contents


# ------------------------------------------------------------------------------------------------ experiments


def _ours_against(ctx: Context, report: Report, names: Sequence[str]) -> Report:
    """`report` filled with ours and the baselines `names`, one row each, and the columns' notes."""
    variants = {"ours": lambda s: ours(ctx, s)}
    variants |= {n: (lambda s, n=n: baseline(ctx, s, n)) for n in names}
    _rows(ctx, variants, report)
    report.notes += [*judge_notes(ctx.config), "T-rec: trigger recall (a needed memory reached the reply), over "
                     "history and target turns; prompt tok: reply prompt tokens per target; stored tok: memory "
                     "tokens after the last history session."]
    return report


SYSTEM_COLUMNS = {**REPLY_COLUMNS, "trigger_recall": "T-rec", "prompt_tokens": "prompt tok",
                  "storage_tokens": "stored tok"}


def main(ctx: Context) -> Report:
    """Table 1: ours against every baseline on the config's dataset."""
    report = Report("main", "Ours against the baselines", "Table 1", dict(SYSTEM_COLUMNS), {})
    return _ours_against(ctx, report, list(ctx.exp("baselines", ())))


def table6(ctx: Context) -> Report:
    """Table 6: ours against the memory-related methods (`experiments.table6_baselines`: MemoChat, Rsum, COMEDY,
    prompted to the config's generator) on the config's dataset."""
    report = Report("table6", "Ours against memory-related methods", "Table 6", dict(SYSTEM_COLUMNS), {})
    return _ours_against(ctx, report, list(ctx.exp("table6_baselines", ())))


def efficiency(ctx: Context) -> Report:
    """Figures 9, 10 and 15: per session, tokens, construction / retrieval latency and processing time of ours and
    every baseline of `main` and `table6`, from their evaluations in this workdir (those missing are run)."""
    names = list(dict.fromkeys([*ctx.exp("baselines", ()), *ctx.exp("table6_baselines", ())]))
    contents: dict[str, dict[int, list[dict[str, Any]]]] = {}
    provenance: dict[str, dict[int, Any]] = {}
    first = None
    for seed in ctx.seeds:
        for system in ["ours", *names]:
            content = ours(ctx, seed) if system == "ours" else baseline(ctx, seed, system)
            variant = "ours" if system == "ours" else f"baseline_{system}"
            where = str(ctx.seed_dir(seed) / variant / EVAL_DIR / RESULTS_JSON)
            contents.setdefault(system, {})[seed] = per_session_of(content, where)
            provenance.setdefault(system, {})[seed] = _provenance(content) | {"results": where}
            first = first or content
    report = efficiency_report(contents)
    report.provenance = provenance
    if first is not None:
        report.notes.insert(0, f"Each run: {_setting_note(first)}; every system on the same episodes, back ends "
                               "and answer cache, read from its evaluation in this workdir (run where missing).")
    return report


ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {  # name -> (what it removes, overrides of the online run)
    "w/o synthetic data": ("no warm-up: online learning from untrained heads", {}),
    "w/o Planner": ("every user turn saved (learner.planner_rule=save_all), Planner not trained",
                    {"learner.planner_rule": "save_all"}),
    "w/o Trigger": ("BM25 top-1 recall (learner.trigger_rule=lexical), Trigger not trained",
                    {"learner.trigger_rule": "lexical"}),
    "w/o truth reward": ("lambda = 0 and every save rewarded at the next update (no pending buffer)",
                         {"rl.reward.truth_lambda": 0.0, "rl.reward.untriggered": "proxy"}),
    "w/o evolution": ("the warm-up policy, no online learning", {}),
}
_ABLATION_DIRS = {"w/o synthetic data": "no_synthetic", "w/o Planner": "no_planner", "w/o Trigger": "no_trigger",
                  "w/o truth reward": "no_truth", "w/o evolution": "no_evolution"}


def ablation(ctx: Context) -> Report:
    """Table 2: the full method and each component removed."""
    report = Report("ablation", "Ablations", "Table 2",
                    {**REPLY_COLUMNS, **MEMORY_COLUMNS}, {}, row_header="variant")

    def variant(name: str) -> Callable[[int], dict[str, Any]]:
        overrides, dirname = ABLATIONS[name][1], _ABLATION_DIRS[name]

        def run(seed: int) -> dict[str, Any]:
            if name == "w/o evolution":
                done = runs.read_back(ctx.cfg(seed), ctx.seed_dir(seed) / dirname, dirname)
                return done or scored(ctx, seed, ctx.seed_dir(seed) / dirname, dirname, checkpoint=warm(ctx, seed))
            return learned(ctx, seed, dirname, overrides, from_warmup=name != "w/o synthetic data",
                           eval_overrides=overrides)

        return run

    names = tuple(ctx.exp("ablations", ())) or tuple(ABLATIONS)
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        raise ValueError(f"experiments.ablations: unknown variant(s) {unknown}; known: {list(ABLATIONS)}")
    _rows(ctx, {"full": lambda s: ours(ctx, s)} | {n: variant(n) for n in names}, report)
    report.notes += [f"{n}: {ABLATIONS[n][0]}." for n in names] + judge_notes(ctx.config)
    return report


def _scale_seeds(syn: SynthesisConfig, episodes: int) -> int:
    """Seed sessions that give about `episodes` synthesized training episodes (storylines per seed, less the
    held-out fraction)."""
    per_seed = int(syn.storylines_per_seed) * (1.0 - float(syn.heldout_fraction))
    return max(2, math.ceil(episodes / per_seed))


def synthetic_scale(ctx: Context) -> Report:
    """Table 3: the warm-up on 0 / 0.1K / 0.25K / 0.5K / 1K synthesized episodes, then online learning."""
    report = Report("synthetic_scale", "Scale of the synthetic data", "Table 3",
                    {"synthesized": "train episodes", **REPLY_COLUMNS, **MEMORY_COLUMNS}, {},
                    row_header="synthesized (asked)")
    variants = {}
    for n in ctx.exp("synthetic_scale", ()):
        def run(seed: int, n: int = n) -> dict[str, Any]:
            if n == 0:
                content = learned(ctx, seed, "no_synthetic", from_warmup=False)
                return {**content, "synthesized": 0}
            overrides = {"synthesis.num_seeds": _scale_seeds(ctx.spec.synthesis, n)}
            ctx.log(f"seed {seed}: synthesis and warm-up on ~{n} episodes")
            start = runs.base_run(ctx.cfg(seed), ctx.seed_dir(seed), name=f"base_scale_{n}", overrides=overrides)
            manifest = json.loads((start.parent / "synthesis" / "manifest.json").read_text(encoding="utf-8"))
            workdir = runs.online_run(ctx.cfg(seed), ctx.seed_dir(seed) / f"scale_{n}", init_from=start,
                                      overrides=overrides)
            content = scored(ctx, seed, workdir, f"scale_{n}", overrides=overrides)
            return {**content, "synthesized": manifest["counts"]["train"]["episodes"]}

        variants[str(n)] = run
    _rows(ctx, variants, report, metric=lambda c: {**metrics_of(c), "synthesized": c["synthesized"]})
    report.notes += ["The warm-up's steps grow with the data (warmup.epochs passes over it); online learning is the "
                     "same for every row.", *judge_notes(ctx.config)]
    return report


def _judge_block(ctx: Context, spec: str) -> dict[str, Any]:
    """A judge back-end block from an `experiments.judges` entry: offline, generator, judge, or a local model dir."""
    if spec == "offline":
        return {"kind": "offline"}
    if spec in ("generator", "judge"):
        return RunSpec.from_config(ctx.config).llm.options(spec)
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"experiments.judges entry {spec!r} is not offline / generator / judge or a local model "
                         "directory (config.json missing)")
    return {"kind": "local", "model_dir": str(path), "dtype": "float32",
            "max_output_tokens": int(ctx.exp("local_judge_max_tokens", 128))}


def _judge_label(spec: str) -> str:
    """A judge spec's name in tables and run directories: offline / generator / judge, or the model dir's name."""
    return spec if spec in ("offline", "generator", "judge") else Path(spec).name


LIKELIHOOD = "likelihood"  # experiments.judges entry: the likelihood reward (rl.likelihood) instead of a judge
CONTROL = "control"  # "likelihood/<match>+control": that entry's proxy less its control text's (likelihood_control)
COST = "cost"  # "likelihood/<match>+cost<c>": that entry's Planner save cost (rl.reward.save_cost) is c
REWARD_KEYS = (*LIKELIHOOD_KEYS, "save_cost")  # what a likelihood entry sets, as provenance records it


def _likelihood_settings(ctx: Context, spec: str = LIKELIHOOD) -> dict[str, Any]:
    """The reward settings (`REWARD_KEYS`) of a `likelihood` entry, as provenance records them: the config's own
    for "likelihood"; "likelihood/<match>[+control][+cost<c>]" sets likelihood_match to <match>,
    likelihood_control to whether "+control" is there and save_cost to c where given (the rest stay the
    config's): a calibrated proxy's zero is a control text's gain, so it needs its own save cost."""
    settings = {k: getattr(ctx.spec.reward, k) for k in REWARD_KEYS}
    if spec != LIKELIHOOD:
        match, *options = spec.removeprefix(LIKELIHOOD + "/").split("+")
        settings |= {"likelihood_match": match, "likelihood_control": False}
        for option in options:
            if option == CONTROL:
                settings["likelihood_control"] = True
            elif option.startswith(COST):
                try:
                    settings["save_cost"] = float(option.removeprefix(COST))
                except ValueError:
                    raise ValueError(f"experiments.judges entry {spec!r}: {option!r} is not {COST}<number>") from None
            else:
                raise ValueError(f"experiments.judges entry {spec!r}: after '+' only {CONTROL!r} and "
                                 f"'{COST}<number>' are known, got {option!r}")
        dataclasses.replace(ctx.spec.reward, **settings)  # an unknown match raises here
    return settings


def _is_likelihood(spec: str) -> bool:
    return spec == LIKELIHOOD or spec.startswith(LIKELIHOOD + "/")


def _reward_model(ctx: Context, spec: str) -> dict[str, Any]:
    """What `spec` of experiments.judges sets as the reward model: the likelihood reward (its settings), or a judge
    back end as `llm.judge` with `rl.reward.source` "judge"."""
    if _is_likelihood(spec):
        return {"source": LIKELIHOOD, **_likelihood_settings(ctx, spec)}
    return {"source": "judge", **_judge_block(ctx, spec)}


def _likelihood_run(spec: str, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The online run's name and overrides of a likelihood entry: "reward_likelihood" for the plain entry,
    "reward_likelihood_<match>[_control][_cost<c>]" for a variant."""
    name = "reward_likelihood" if spec == LIKELIHOOD else \
        "reward_likelihood_" + spec.removeprefix(LIKELIHOOD + "/").replace("+", "_")
    return name, {"rl.reward.source": LIKELIHOOD, **{f"rl.reward.{k}": block[k] for k in REWARD_KEYS}}


def judges(ctx: Context) -> Report:
    """Tables 7 and 11 as the paper runs them: online learning from the seed's warm-up with each reward model of
    `experiments.judges` (a judge back end as `llm.judge`: r_proxy and r_qual; or "likelihood", the label-free
    reward of rl.likelihood, or a variant of it, "likelihood/utterance+control+cost0.1"), then the trained agent's
    automatic metrics; every evaluation is judged by the config's own judge, so only the reward model differs."""
    own_source = ctx.spec.reward.source
    own = {"source": own_source, **(_judge_block(ctx, JUDGE) if own_source == "judge" else _likelihood_settings(ctx))}
    specs = list(ctx.exp("judges", ("offline",)))
    blocks = {spec if _is_likelihood(spec) else _judge_label(spec): _reward_model(ctx, spec) for spec in specs}
    if len(blocks) < len(specs):
        raise ValueError(f"experiments.judges {specs}: two entries have the same name")
    variants = {}
    for label, block in blocks.items():
        if block == own:  # the config's reward model: the run every other experiment calls `ours`
            variants[label] = lambda s: ours(ctx, s)
            continue
        if block["source"] == LIKELIHOOD:
            name, over = _likelihood_run(label, block)
        else:
            judge = {k: v for k, v in block.items() if k != "source"}
            name, over = f"judge_{label}", {"llm.judge": ml_collections.ConfigDict(judge),
                                            "rl.reward.source": "judge"}
        variants[label] = lambda s, name=name, over=over: learned(ctx, s, name, over)
    report = Report("judges", "Reward model (judge back end)", "Tables 7 and 11",
                    {**REPLY_COLUMNS, **MEMORY_COLUMNS}, {}, row_header="reward model")
    _rows(ctx, variants, report)
    for label, per_seed in report.provenance.items():
        for entry in per_seed.values():
            entry["reward_model"] = blocks[label]
    report.notes += ["Each row: the online stage trained with that back end as `llm.judge` (the Planner's r_proxy "
                     "and the Trigger's r_qual) from the same warm-up; the evaluation's judged columns come from "
                     "the config's judge for every row. The old protocol (one run's replies re-judged by each "
                     "back end) is the `rejudge` experiment.", *judge_notes(ctx.config)]
    if any(b.get("kind") == "offline" for b in blocks.values()) and own.get("kind") != "offline":
        report.notes.append("The `offline` reward model is an oracle: it rewards by the data's labels.")
    return report


def rejudge(ctx: Context) -> Report:
    """One run, several judges (not the paper's Tables 7 / 11, which train with each judge: `judges`): the same
    replies (ours and the baselines of `main`) judged by each back end of `experiments.judges`; the systems'
    ranking per judge and each judge's per-reply agreement with the first."""
    from scipy.stats import spearmanr

    specs = list(ctx.exp("judges", ("offline",)))
    systems = ["ours", *ctx.exp("baselines", ())]
    label = {spec: _judge_label(spec) for spec in specs}
    columns = {f"{spec}|{key}": f"{label[spec]} {head}" for spec in specs
               for key, head in (("mean", "score"), ("failures", "failed"))}
    report = Report("rejudge", "One run, several judges", "Tables 7 and 11 (re-judged, not retrained)", columns,
                    {})
    agreement: dict[str, Any] = {}
    for seed in ctx.seeds:
        main(dataclasses.replace(ctx, seeds=[seed]))  # the systems' replies (reused when main already ran)
        cfg = ctx.cfg(seed)
        episodes = eval_episodes(cfg)
        per_target: dict[str, dict[str, list[float | None]]] = {}
        cache = ResponseCache(ctx.root / runs.EVAL_CACHE)
        try:
            for spec in specs:
                block = _judge_block(ctx, spec)
                backend = CachedBackend(make_backend(ml_collections.ConfigDict(block)), cache, answer_namespace(block))
                try:
                    for system in systems:
                        name = "ours" if system == "ours" else f"baseline_{system}"
                        rows = read_targets(ctx.seed_dir(seed) / name / EVAL_DIR)
                        holder = [type("R", (), {"targets": rows})()]
                        judge_targets(QualityJudge(backend), holder, episodes)
                        means = [None if not r.get("judge") else float(np.mean(list(r["judge"].values())))
                                 for r in rows]
                        per_target.setdefault(spec, {})[system] = means
                        valid = [m for m in means if m is not None]
                        metrics = report.rows.setdefault(system, {}).setdefault(seed, {})
                        metrics[f"{spec}|mean"] = 100.0 * float(np.mean(valid)) if valid else None
                        metrics[f"{spec}|failures"] = float(len(means) - len(valid))
                finally:
                    backend.close()
        finally:
            cache.close()
        ref = specs[0]
        for spec in specs[1:]:
            xs, ys = [], []
            for system in systems:
                for a, b in zip(per_target[ref][system], per_target[spec][system], strict=True):
                    if a is not None and b is not None:
                        xs.append(a)
                        ys.append(b)
            rank_ref = [np.nanmean([m for m in per_target[ref][s] if m is not None] or [np.nan]) for s in systems]
            rank_spec = [np.nanmean([m for m in per_target[spec][s] if m is not None] or [np.nan]) for s in systems]
            agreement.setdefault(spec, {})[seed] = {
                "pearson_per_reply": pearson_or_none(xs, ys),
                "spearman_systems": (float(spearmanr(rank_ref, rank_spec).statistic)
                                     if len(systems) > 2 and np.all(np.isfinite(rank_ref + rank_spec)) else None),
                "replies": len(xs)}
    report.extra["agreement_with_first_judge"] = agreement
    report.notes += [f"Judges: {specs}; each cell is the mean normalized 1-5 score (percent) over the five "
                     "dimensions of the replies it judged; failures: verdicts that stayed invalid (left out).",
                     f"Agreement with {specs[0]} (per-reply Pearson r, system-ranking Spearman rho) is in the JSON "
                     "under extra.agreement_with_first_judge.", *judge_notes(ctx.config)]
    return report


EXPLORATION_KEYS = ("planner_miss_rate", "planner_false_positive_rate", "proxy_truth_r", "saves_used")


def training_session_rows(workdir: Path) -> dict[int, dict[str, Any]]:
    """{session: Table 8's numbers} of the online stage in `workdir`: its per-session rows over the training
    episodes (`stages.online.session_rows`, phase "online") as metrics.jsonl holds them."""
    path = workdir / METRICS_FILE
    rows = [r for r in read_metrics(path) if r.get("stage") == "online" and r.get("table") == "sessions"
            and r.get("phase") == "online"]
    if not rows:
        raise ValueError(f"{path}: no per-session rows of the online stage (table 'sessions', phase 'online'); "
                         "did the online stage finish?")
    missing = sorted({k for r in rows for k in EXPLORATION_KEYS if k not in r})
    if missing:
        raise ValueError(f"{path}: the online stage's per-session rows lack {missing} (written before they were "
                         "logged); rerun that run in a new workdir")
    return {int(r["session"]): {k: r[k] for k in EXPLORATION_KEYS} for r in rows}  # a later row wins


def exploration(ctx: Context) -> Report:
    """Table 8: per training session (the session number within the episodes the online stage learned on), the
    Planner's miss rate and false-positive rate and the proxy / truth reward correlation of the saves made in
    that session, as the online stage logged them while it trained."""
    report = Report("exploration", "Exploration per training session", "Table 8",
                    {"planner_miss_rate": "miss rate", "planner_false_positive_rate": "FPR",
                     "proxy_truth_r": "proxy/truth r", "saves_used": "saves used"}, {}, row_header="session")
    for seed in ctx.seeds:
        workdir = trained(ctx, seed, "ours")
        for n, row in sorted(training_session_rows(workdir).items()):
            report.rows.setdefault(f"session {n}", {})[seed] = row
        report.provenance[str(seed)] = {"run": str(workdir), "metrics": str(workdir / "metrics.jsonl")}
    report.notes += ["Over the online stage's training episodes (`ours`, sampled decisions, the policy learning as "
                     "it plays), per session number: miss rate = high-value turns (y_p) not saved, FPR = other turns "
                     "saved; proxy/truth r: Pearson r between a save's r_proxy and its r_qual(future) over that "
                     "session's saves a later reply used (None with fewer than 3 or a constant side); saves used: "
                     "their number.", *judge_notes(ctx.config)]
    return report


def lambda_(ctx: Context) -> Report:
    """Table 10: the truth-reward weight lambda."""
    report = Report("lambda", "Truth-reward weight", "Table 10", {**REPLY_COLUMNS, **MEMORY_COLUMNS}, {},
                    row_header="lambda")
    default = float(ctx.spec.reward.truth_lambda)
    variants = {}
    for lam in ctx.exp("lambdas", ()):
        lam = float(lam)
        if lam == default:
            variants[f"{lam:g}"] = lambda s: ours(ctx, s)
        else:
            over = {"rl.reward.truth_lambda": lam}
            variants[f"{lam:g}"] = (lambda s, lam=lam, over=over: learned(ctx, s, f"lambda_{lam:g}", over,
                                                                          eval_overrides=over))
    _rows(ctx, variants, report)
    report.notes += [f"lambda {default:g} is the config's own run (`ours`).", *judge_notes(ctx.config)]
    return report


def synthesis_direction(ctx: Context) -> Report:
    """Table 12: storylines written backwards from the seed (ours) against sessions generated forwards."""
    report = Report("synthesis_direction", "Backward storylines vs forward generation", "Table 12",
                    {"dependent_turns": "dependent turns / ep", "warmup_trigger_acc": "warm-up T-acc", **REPLY_COLUMNS,
                     **MEMORY_COLUMNS}, {}, row_header="synthesis")

    def stats(base: Path) -> dict[str, Any]:
        manifest = json.loads((base / "synthesis" / "manifest.json").read_text(encoding="utf-8"))
        progress = json.loads((base / "progress.json").read_text(encoding="utf-8"))
        train = manifest["counts"]["train"]
        return {"dependent_turns": train["turns_with_y_t"] / max(1, train["episodes"]),
                "warmup_trigger_acc": progress["done"].get("warmup", {}).get("after/trigger/accuracy")}

    def run(seed: int, direction: str) -> dict[str, Any]:
        if direction == "backward":
            start = warm(ctx, seed)
            content = ours(ctx, seed)
        else:
            over = {"synthesis.direction": "forward"}
            ctx.log(f"seed {seed}: forward synthesis and warm-up")
            start = runs.base_run(ctx.cfg(seed), ctx.seed_dir(seed), name="base_forward", overrides=over)
            workdir = runs.online_run(ctx.cfg(seed), ctx.seed_dir(seed) / "forward", init_from=start, overrides=over)
            content = scored(ctx, seed, workdir, "forward", overrides=over)
        return {**content, "_synthesis": stats(start.parent)}

    _rows(ctx, {"backward (ours)": lambda s: run(s, "backward"), "forward": lambda s: run(s, "forward")}, report,
          metric=lambda c: {**metrics_of(c), **c["_synthesis"]})
    report.notes += ["dependent turns / ep: turns of a synthesized training episode that need an earlier one (y_t); "
                     "warm-up T-acc: the warm-up's held-out Trigger accuracy (percent).", *judge_notes(ctx.config)]
    return report


def size_grid(ctx: Context) -> Report:
    """Figure 6: Planner backbone size x Trigger backbone size (a different backbone per agent)."""
    sizes = list(ctx.exp("size_grid", ()))
    model = RunSpec.from_config(ctx.config).model
    tiny = model.kind == TINY
    if not sizes:
        sizes = [model.hidden] if tiny else [model.path]
    report = Report("size_grid", "Planner size x Trigger size", "Figure 6",
                    {"planner": "Planner", "trigger": "Trigger", **MEMORY_COLUMNS, "Memorability": "Memorability"},
                    {}, row_header="Planner x Trigger")

    def label(x: Any) -> str:
        return f"h{x}" if tiny else Path(str(x)).name

    variants = {}
    for p in sizes:
        for t in sizes:
            over = ({"model.hidden": int(p), "model.trigger_hidden": int(t)} if tiny else
                    {"policy.planner_model": str(p), "policy.trigger_model": str(t), "model.path": str(p)})
            name = f"grid_{label(p)}_x_{label(t)}"

            def run(seed: int, over: dict[str, Any] = over, name: str = name) -> dict[str, Any]:
                synthesis = warm(ctx, seed).parent / "synthesis"
                ctx.log(f"seed {seed}: {name}")
                workdir = runs.full_run(ctx.cfg(seed), ctx.seed_dir(seed) / name, synthesis_from=synthesis,
                                        overrides=over)
                return scored(ctx, seed, workdir, name, overrides=over)

            variants[f"{label(p)} x {label(t)}"] = run
    _rows(ctx, variants, report)
    for v, per in report.rows.items():
        for m in per.values():
            m["planner"], m["trigger"] = None, None
    report.columns.pop("planner")
    report.columns.pop("trigger")
    names = [label(s) for s in sizes]

    def figure(path: Path) -> None:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
        for ax, key in zip(axes, ("trigger_recall", "planner_precision"), strict=True):
            grid = np.full((len(sizes), len(sizes)), np.nan)
            for i, p in enumerate(names):
                for j, t in enumerate(names):
                    m = aggregate(report.rows[f"{p} x {t}"]).get(key, {}).get("mean")
                    grid[i, j] = np.nan if m is None else 100 * m
            im = ax.imshow(grid, cmap="viridis", origin="lower")
            ax.set_xticks(range(len(names)), names)
            ax.set_yticks(range(len(names)), names)
            ax.set_xlabel("Trigger backbone")
            ax.set_ylabel("Planner backbone")
            ax.set_title(key.replace("_", " ") + " (%)")
            fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)

    report.figure = figure
    report.notes += ["Tiny backbones: sizes are hidden widths (`model.hidden` for the Planner, `model.trigger_hidden` "
                     "for the Trigger); pretrained ones: model directories sharing one tokenizer (one family).",
                     *judge_notes(ctx.config)]
    return report


def ten_sessions(ctx: Context) -> Report:
    """Figure 7: planner precision and trigger recall per session over episodes of 10 sessions."""
    if RunSpec.from_config(ctx.config).data.name != PERSONA_WORLD:
        raise ValueError("ten_sessions needs the persona world (config.data.name='persona_world'): the real "
                         "datasets have at most 5 sessions per episode")
    n = int(ctx.exp("sessions", 10))
    over = {"data.world.num_sessions": n}
    report = Report("ten_sessions", f"{n} sessions", "Figure 7", {**MEMORY_COLUMNS, "save_rate": "save rate"}, {},
                    row_header="session")
    contents = {}
    for seed in ctx.seeds:
        ctx.log(f"seed {seed}: {n}-session episodes")
        workdir = runs.full_run(runs.derive(ctx.cfg(seed), over), ctx.seed_dir(seed) / f"sessions_{n}")
        content = scored(ctx, seed, workdir, f"sessions_{n}", overrides=over)
        contents[seed] = content
        for row in content["memory_per_session"]:
            report.rows.setdefault(f"session {row['session']}", {})[seed] = {k: row.get(k) for k in report.columns}
        report.provenance[str(seed)] = _provenance(content)

    def figure(path: Path) -> None:
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.4))
        xs = list(range(1, len(report.rows) + 1))
        for key, label in (("planner_precision", "planner precision"), ("trigger_recall", "trigger recall")):
            ys = [aggregate(report.rows[f"session {x}"]).get(key, {}).get("mean") for x in xs]
            ax.plot(xs, [np.nan if y is None else 100 * y for y in ys], marker="o", label=label)
        ax.set_xlabel("session")
        ax.set_ylabel("%")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)

    report.figure = figure
    report.notes += [f"Persona-world episodes of {n} sessions (the world's num_sessions); session {n} holds the "
                     "evaluation targets (trigger recall only).", *judge_notes(ctx.config)]
    return report


def policy_maps(ctx: Context) -> Report:
    """Figure 5: the Planner's save probability over one episode's user turns before (warm-up) and after online
    learning, and a 2-D projection of the Trigger's query and memory features with the needed pairs marked."""
    index = int(ctx.exp("policy_map_episode", 0))
    report = Report("policy_maps", "What the policies learned", "Figure 5",
                    {"save_prob_gold": "p(save) y_p=1", "save_prob_other": "p(save) y_p=0",
                     "pair_distance": "pair dist", "other_distance": "other dist"}, {}, row_header="policy")
    maps: dict[int, Any] = {}
    for seed in ctx.seeds:
        start = warm(ctx, seed)
        final = trained(ctx, seed, "ours")
        maps[seed] = episode_maps(ctx.cfg(seed), ctx.seed_dir(seed) / "policy_maps",
                                  {"untrained": None, "warm-up": start, "online": final / "policy"}, index)
        for name, m in maps[seed]["policies"].items():
            report.rows.setdefault(name, {})[seed] = m["summary"]
    report.extra["maps"] = maps
    report.figure = lambda path: plot_maps(maps[ctx.seeds[0]], path)
    report.notes += ["p(save): the Planner's mean save probability over the episode's user turns whose label y_p "
                     "is 1 / 0, playing the episode greedily with that policy; pair dist: mean distance in the "
                     "Trigger's feature space between a query and the memory it needs, other dist: to the other "
                     "memories (smaller pair dist than other dist = the Trigger separates them).",
                     "The figure shows the first seed; every point is in the JSON (extra.maps)."]
    return report


def locomo(ctx: Context) -> Report:
    """LoCoMo question answering (not in the paper): ours (trained as `main` trains it) against the baselines,
    dense top-k and the evidence oracle on LoCoMo's conversations (`experiments.locomo`)."""
    return locomo_report(ctx, lambda seed: find_checkpoint(trained(ctx, seed, "ours"))[0])


EXPERIMENTS: dict[str, Callable[[Context], Report]] = {
    "main": main, "ablation": ablation, "synthetic_scale": synthetic_scale, "judges": judges, "rejudge": rejudge,
    "exploration": exploration, "lambda": lambda_, "synthesis_direction": synthesis_direction,
    "size_grid": size_grid, "ten_sessions": ten_sessions, "policy_maps": policy_maps,
    "table6": table6, "efficiency": efficiency, "locomo": locomo,
}

__all__ = ["ABLATIONS", "EXPERIMENTS", "Context", "ORACLE", "judge_notes"]
