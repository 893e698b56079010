"""Evaluate a trained agent on the paper's protocol and write `<workdir>/eval/`:

    python -m icml_jax.evaluate --config=configs/demo.py --workdir=/tmp/icml_demo
    python -m icml_jax.evaluate --config=configs/cc.py --workdir=DIR --checkpoint=DIR/warmup

The policy is `<workdir>/policy` (else the warm-up checkpoint) or `--checkpoint`; greedy decisions, no
learning. A policy that trained on an evaluated episode's final session is refused before anything is played
(`evaluation.leakage`), and results.json records which episodes trained it. The episodes: the persona world's held-out ones (`config.data.eval_episodes`), or the protocol's 50
of a real dataset (`config.eval`: seeded draw or THEANINE's ids). Every back-end answer is cached in
`<workdir>/eval/cache.sqlite`, so a rerun or a resumed crash asks nothing twice. Reply metrics so far: BLEU-4,
ROUGE-L and the judge's five dimensions (`config.llm.judge`; the offline judge is an oracle that reads labels);
memory metrics (Table 8) where the data has labels; tokens and latencies.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_collections
from absl import app, flags
from tqdm.auto import tqdm

from icml_jax.agents.agent import MemoryAgent
from icml_jax.checkpoint import load_warmup
from icml_jax.data.protocol import load_eval_episodes, shared_data_dir
from icml_jax.data.config import PERSONA_WORLD
from icml_jax.data.stream import clip_sessions, held_out_episodes, user_speaker
from icml_jax.evaluation.judging import judge_targets, proxy_truth_correlation
from icml_jax.evaluation.leakage import check_no_leak, training_record
from icml_jax.evaluation.memory_gain import can_score, score_rows
from icml_jax.evaluation.model_metrics import (
    bertscore_f1,
    check_bertscore_model,
    check_mauve_model,
    last_token_features,
    load_mauve_featurizer,
    mauve_score,
)
from icml_jax.evaluation.pairwise import compare, write_pairwise
from icml_jax.evaluation.protocol import LearningAgent, PolicyAgent, play, reply_temperature
from icml_jax.evaluation.report import TARGETS_JSONL, read_targets, write_outputs
from icml_jax.llm.cache import CachedBackend, ResponseCache
from icml_jax.llm.config import GENERATOR, JUDGE
from icml_jax.llm.judges import PairwiseJudge, ProxyJudge, QualityJudge
from icml_jax.llm.openai_compat import structured_mode_of
from icml_jax.memory.store import MemoryStore
from icml_jax.models.backbone import TINY
from icml_jax.models.tokenizer import load_tokenizer
from icml_jax.rl.learner import OnlineLearner
from icml_jax.rl.likelihood import reward_judges
from icml_jax.run.agent_loading import ChatError, find_checkpoint
from icml_jax.run.builders import build_models, build_tiny_tokenizer
from icml_jax.run.runspec import EvalConfig, RunSpec

EVAL_DIR = "eval"
CACHE_FILE = "cache.sqlite"


def eval_selection(config: ml_collections.ConfigDict) -> str:
    """`eval.selection`, with "auto" resolved: THEANINE's own episode ids for MSC / CC when their ids file is
    there (`shared/data/<dataset>/theanine_eval_ids.json`), else the seeded draw."""
    selection = EvalConfig.from_config(config).selection
    if selection != "auto":
        return selection
    name = RunSpec.from_config(config).data.name
    ids = shared_data_dir() / name / "theanine_eval_ids.json"
    return "theanine" if name in ("msc", "cc") and ids.is_file() else "seeded"


def eval_episodes(config: ml_collections.ConfigDict) -> list:
    """The protocol's episodes for `config.data`: persona world held-out episodes, or a real dataset's 50."""
    data = RunSpec.from_config(config).data
    if data.name == PERSONA_WORLD:
        return held_out_episodes(data)
    ev = EvalConfig.from_config(config)
    if not data.data_dir:
        raise ValueError(f"evaluation on {data.name}: config.data.data_dir (the built TFDS data) is not set")
    episodes = load_eval_episodes(data.name, data_dir=data.data_dir, selection=eval_selection(config),
                                  seed=ev.seed, n=ev.episodes, builder=ev.tfds_name)
    # the online stream's cut, so both play the same turns
    return [clip_sessions(e, data.max_session_turns) for e in episodes]


def _versions() -> dict[str, str]:
    out = {}
    for name in ("icml_jax", "jax", "flax", "sacrebleu", "rouge-score"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _model_metric_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """{"BERTScore" / "MAUVE": what it will run with} for the model paths `config.eval` names, checked before the
    evaluation plays (a missing directory, a layer the encoder lacks or a decoder family we cannot load fails
    here, not after every reply is generated)."""
    ev = EvalConfig.from_config(config)
    out: dict[str, Any] = {}
    if ev.bertscore_model:
        out["BERTScore"] = check_bertscore_model(ev.bertscore_model, ev.bertscore_layer)
    if ev.mauve_model:
        out["MAUVE"] = {**check_mauve_model(ev.mauve_model), "max_length": ev.mauve_max_length}
    return out


def _model_scores(config: ml_collections.ConfigDict, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """BERTScore and MAUVE of the replies against the references, for the model paths `config.eval` names."""
    ev = EvalConfig.from_config(config)
    settings = _model_metric_settings(config)
    replies, refs = [r["reply"] for r in rows], [r["reference"] for r in rows]
    out: dict[str, Any] = {}
    if "BERTScore" in settings:
        out["BERTScore"] = bertscore_f1(replies, refs, model_path=ev.bertscore_model,
                                        layer=settings["BERTScore"]["layer"])
        for row, value in zip(rows, out["BERTScore"].per_target, strict=True):
            row["bertscore_f1"] = value
    if "MAUVE" in settings:
        model, tok, details = load_mauve_featurizer(ev.mauve_model)
        n = settings["MAUVE"]["max_length"]
        feats = [last_token_features(model, tok, texts, max_length=n) for texts in (replies, refs)]
        out["MAUVE"] = mauve_score(*feats, seed=int(config.seed), details={**details, "max_length": n},
                                   featurizer=f"last-token final hidden state of {Path(details['model']).name} "
                                              f"({details['model_type']}, not GPT-2 large), {n} tokens")
    return out


def _reply_temperature(spec: RunSpec) -> float:
    """The temperature the target replies were written at (eval.reply_temperature, else learner's)."""
    own = spec.eval.reply_temperature
    return float(own if own is not None else spec.agent.reply_temperature)


def _memory_gain(spec: RunSpec, generator, results, episodes) -> dict[str, Any]:
    """Scores every target row's memory gain and NLL with the generator (`evaluation.memory_gain`) when
    `eval.memory_gain` is on and the generator can score a continuation; returns what the setting records."""
    if not spec.eval.memory_gain:
        return {"computed": False, "reason": "eval.memory_gain is off"}
    if not can_score(generator):
        return {"computed": False, "reason": f"the {spec.llm.kind(GENERATOR)} generator cannot score a given "
                                             "continuation (only the local back end can)"}
    rows = [row for r in results for row in r.targets]
    start = time.perf_counter()
    score_rows(generator, rows, {e.episode_id: e for e in episodes})
    return {"computed": True, "model": spec.llm.block(GENERATOR).get("model_dir"), "targets": len(rows),
            "seconds": round(time.perf_counter() - start, 2),
            "unit": "nats per reference token: log p(gold | prompt with the memory) - log p(gold | prompt without)"}


def backend_usage(backend: Any, turns: int, prices: Any) -> dict[str, Any]:
    """A back end's calls and tokens over the evaluation (cached answers included: the cost of one run), per
    turn the agent acted on or answered, the estimated cost when `prices` = {"input": USD, "output": USD}
    per million tokens is configured, and the structured-output mode an OpenAI-compatible back end settled on."""
    used = dict(backend.answered)
    out: dict[str, Any] = {**used, "per_turn": {k: v / turns for k, v in used.items()} if turns else None}
    if prices:
        out["estimated_usd"] = (used["prompt_tokens"] * float(prices["input"])
                                + used["output_tokens"] * float(prices["output"])) / 1e6
    mode = structured_mode_of(backend)
    if mode is not None:
        out["structured_output"] = mode
    return out


def _name(path: Path) -> str:
    """A file-name-safe label of a workdir."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in path.name) or "run"


@dataclasses.dataclass
class EvalContext:
    """What an agent factory gets to build the system under evaluation: the config, the workdir, the cached
    back ends (every answer lands in the evaluation's cache), a fresh memory store and the backbone's tokenizer."""

    config: ml_collections.ConfigDict
    workdir: Path
    generator: Any  # CachedBackend
    judge: Any  # CachedBackend, or None when eval.judge is off
    store: Any  # MemoryStore
    tokenizer: Any
    count_tokens: Callable[[str], int]
    lockstep: int = 1  # episodes whose history sessions are played together (`learner.users_in_flight`)


AgentFactory = Callable[[EvalContext], tuple[Any, dict[str, Any]]]  # -> (EvalAgent, provenance for the setting)


def build_tokenizer(config: ml_collections.ConfigDict, workdir: Path, spec: RunSpec | None = None):
    """The backbone's tokenizer without the policies: tiny (the world's words, as `builders.build_models`) or the
    pretrained checkpoint's; token counts of every system are in this tokenizer. `spec`: the run's typed configs
    when the caller holds them (else built from `config`)."""
    spec = spec if spec is not None else RunSpec.from_config(config)
    if spec.model.kind == TINY:
        return build_tiny_tokenizer(config, workdir, spec)
    return load_tokenizer(spec.model.path)


def policy_factory(checkpoint: str | Path | None = None) -> AgentFactory:
    """The trained Planner and Trigger of `<workdir>/policy` (else the warm-up checkpoint) or `checkpoint`, greedy;
    with `eval.learn`, learning online on each episode's history sessions (`LearningAgent`)."""

    def build(ctx: EvalContext):
        config = ctx.config
        spec = RunSpec.from_config(config)
        ckpt = Path(checkpoint) if checkpoint else find_checkpoint(ctx.workdir)[0]
        policies, _ = build_models(config, ctx.workdir, spec)
        meta = load_warmup(ckpt, policies)
        policies.eval()
        if EvalConfig.from_config(config).learn:  # Algorithm 1 on the history sessions
            if ctx.judge is None:
                raise ValueError("eval.learn needs the judge (eval.judge) for the online rewards")
            reward = spec.learner.reward
            proxy_judge, quality_judge = reward_judges(reward, judge=ctx.judge, generator=ctx.generator)
            learner = OnlineLearner(policies, ctx.tokenizer, ctx.store, ctx.generator, proxy_judge=proxy_judge,
                                    quality_judge=quality_judge, config=spec.learner)
            agent = LearningAgent(learner, temperature=reply_temperature(config),
                                  lockstep=spec.learner.users_in_flight)
        else:
            agent = PolicyAgent(MemoryAgent(policies, ctx.tokenizer, ctx.store, ctx.generator,
                                            config=dataclasses.replace(spec.agent, greedy=True), seed=int(config.seed),
                                            policy_version=str(meta.get("policy_version", ckpt.name))),
                                temperature=reply_temperature(config), lockstep=spec.learner.users_in_flight)
        # notes, planner: the note check's and the Planner's live counts, read when the setting is written after the run
        return agent, {"checkpoint": str(ckpt), "training": training_record(ckpt, meta),
                       "notes": agent.agent.note_stats, "planner": agent.agent.save_stats}

    return build


def evaluate_workdir(config: ml_collections.ConfigDict, workdir: str | Path, *, checkpoint: str | Path | None = None,
                     system: str = "icml", against: str | Path | None = None,
                     cache_path: str | Path | None = None) -> dict[str, Any]:
    """Runs the evaluation of the policy in `workdir` (or `checkpoint`) and writes `<workdir>/eval/`; returns
    results.json's content. `against`: another evaluated workdir; the judge then also compares the two systems'
    replies target by target (`pairwise_<this>_vs_<that>.{json,md}`)."""
    return evaluate_agent(config, workdir, policy_factory(checkpoint), system=system, against=against,
                          cache_path=cache_path)


def evaluate_agent(config: ml_collections.ConfigDict, workdir: str | Path, factory: AgentFactory, *,
                   system: str, against: str | Path | None = None,
                   cache_path: str | Path | None = None) -> dict[str, Any]:
    """Plays the protocol with the agent `factory` builds (ours or a baseline), judges and scores it, and writes
    `<workdir>/eval/`; returns results.json's content. `cache_path`: the back-end answer cache (default
    `<workdir>/eval/cache.sqlite`; experiments share one across their variants)."""
    workdir = Path(workdir).expanduser().absolute()
    out_dir = workdir / EVAL_DIR
    other_rows = None
    if against is not None:
        other = Path(against).expanduser().absolute() / EVAL_DIR / TARGETS_JSONL
        if not other.is_file():
            raise ValueError(f"--against: {other} does not exist; evaluate that run first")
        other_rows = read_targets(other.parent)
    spec = RunSpec.from_config(config)
    episodes = eval_episodes(config)
    if not episodes:
        raise ValueError(f"no evaluation episodes for data {spec.data.name!r}")
    _model_metric_settings(config)  # BERTScore / MAUVE models checked before anything is played
    tokenizer = build_tokenizer(config, workdir, spec)
    cache = ResponseCache(Path(cache_path) if cache_path else out_dir / CACHE_FILE)
    generator_backend, generator, judge_backend = _cached_backends(spec, cache)
    use_judge = judge_backend is not None
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    try:
        with MemoryStore() as store:
            agent, provenance = factory(EvalContext(config, workdir, generator, judge_backend, store, tokenizer,
                                                    count, lockstep=spec.learner.users_in_flight))
            agent.name = system
            if "training" in provenance:  # before anything is played: a leaking policy is refused up front
                check_no_leak(provenance["training"], episodes, str(provenance.get("checkpoint", system)))
            learn = EvalConfig.from_config(config).learn
            failed: list[dict[str, str]] | None = None if learn else []  # a learner cannot skip half an episode
            results = play(agent, episodes, user_speaker=user_speaker(spec.data), count_tokens=count,
                           progress=lambda xs: tqdm(xs, desc=f"evaluating {system}", unit="ep", leave=False),
                           failures=failed, usage=lambda: generator.answered)
        _check_failures(config, "episodes (a reply or memory request)", failed or [], len(episodes), cache.path,
                        "episode_id")
        gain_setting = _memory_gain(spec, generator_backend, results, episodes)
        correlation = _judge_results(config, judge_backend, results, episodes, cache.path)
        if other_rows is not None:
            if judge_backend is None:
                raise ValueError("--against needs the judge (config.eval.judge)")
            pairwise = compare([row for r in results for row in r.targets], other_rows,
                               PairwiseJudge(judge_backend, backend_failures="record"), episodes,
                               seed=int(config.seed))
    finally:
        generator.close()
        if judge_backend is not None:
            judge_backend.close()
        cache.close()
    model_scores = _model_scores(config, [row for r in results for row in r.targets])
    backends = [b for b in (generator, judge_backend) if b is not None]
    turns = sum(len(r.construction_ms) + len(r.targets) for r in results)
    llm_usage = {role: backend_usage(b, turns, EvalConfig.from_config(config).prices.get(role))
                 for role, b in (("generator", generator), ("judge", judge_backend)) if b is not None}
    judge_block = spec.llm.options(JUDGE) if use_judge else None
    setting = {"data": spec.data.name, "episode_ids": [e.episode_id for e in episodes],
               "selection": "held-out persona-world episodes" if spec.data.name == PERSONA_WORLD
               else eval_selection(config),
               **provenance, "generator": spec.llm.options(GENERATOR), "seed": int(config.seed),
               "judge": (f"{judge_block.get('kind')} (an oracle: it reads the data's labels)"
                         if judge_block and judge_block.get("kind") == "offline" else judge_block),
               "greedy": True, "reply_temperature": _reply_temperature(spec), "learning": {"online": learn, "updates": len(getattr(agent, "updates", []))},
               "backend_requests": {"sent": sum(b.misses for b in backends),
                                    "from_cache": sum(b.hits for b in backends)},
               "llm_usage": llm_usage,
               "failed_episodes": failed or [],  # skipped: a back-end request failed for good (their ids, why)
               "model_metrics": {name: score.details for name, score in model_scores.items()},  # model, layer
               "memory_gain": gain_setting,
               "versions": _versions(), "config": config.to_dict()}
    content = write_outputs(out_dir, results, system, setting, model_scores,
                            memory_extra={"proxy_truth": correlation} if correlation else None)
    if other_rows is not None:
        content["pairwise"] = write_pairwise(out_dir, pairwise, _name(workdir), _name(Path(against)),
                                             {k: setting[k] for k in ("data", "judge", "seed")})
    return content


def _cached_backends(spec: RunSpec, cache: ResponseCache) -> tuple[Any, CachedBackend, CachedBackend | None]:
    """(the generator back end, it behind the answer cache, the judge behind the cache or None without
    `eval.judge`). An HTTP back end (Gemini, OpenAI-compatible) makes one call per request anyway: sending them one
    at a time stores each answer as it arrives, so a killed evaluation loses nothing."""
    remote = lambda backend: bool(getattr(backend, "remote", False))  # noqa: E731
    generator_backend = spec.llm.make_backend(GENERATOR)
    generator = CachedBackend(generator_backend, cache, spec.llm.namespace(GENERATOR),
                              per_request=remote(generator_backend))
    if not spec.eval.judge:
        return generator_backend, generator, None
    judge_raw = spec.llm.make_backend(JUDGE)
    return generator_backend, generator, CachedBackend(judge_raw, cache, spec.llm.namespace(JUDGE),
                                                       per_request=remote(judge_raw))


def _judge_results(config: ml_collections.ConfigDict, judge: CachedBackend | None, results: Sequence[Any],
                   episodes: Sequence[Any], cache_path: Path) -> dict[str, Any] | None:
    """Judges every target reply in place (a request that fails for good is a recorded judge failure, too many
    fail the evaluation) and returns the proxy / truth correlation; None without a judge."""
    if judge is None:
        return None
    judge_targets(QualityJudge(judge, backend_failures="record"), results, episodes)
    rows = [row for r in results for row in r.targets]
    _check_failures(config, "judge requests", [r for r in rows if str(r.get("judge_failure") or "")
                                               .startswith("back end:")], len(rows), cache_path, "judge_failure")
    return proxy_truth_correlation(ProxyJudge(judge, backend_failures="record"), results, episodes)


class EvaluationError(RuntimeError):
    """The evaluation cannot produce its tables (e.g. too many judge requests failed); says what to do."""


def _check_failures(config: ml_collections.ConfigDict, what: str, failed: Sequence[Mapping[str, Any]], total: int,
                    cache: Path, field: str) -> None:
    """Fails when more than `eval.max_failed_fraction` of `total` (episodes, judge requests) failed in the back end
    for good (each is counted in results.json and left out; a few are tolerated, a broken back end is not)."""
    limit = EvalConfig.from_config(config).max_failed_fraction
    if total and len(failed) / total > limit:
        raise EvaluationError(
            f"{len(failed)} of {total} {what} failed after all retries ({len(failed) / total:.1%} > "
            f"eval.max_failed_fraction={limit:g}); first: {str(failed[0].get(field))[:300]}. Answers so far are "
            f"cached in {cache}: rerun to ask only what is missing, or raise eval.max_failed_fraction")


def cli() -> None:
    """Runs with the shared `--config` / `--workdir` flags (`icml_jax.run.cli`) and `--checkpoint`."""
    from icml_jax.run import cli as shared  # local: it defines the absl flags; importing this module defines none

    config_flag, workdir_flag = shared.CONFIG, shared.WORKDIR
    checkpoint_flag = flags.DEFINE_string("checkpoint", None, "a policy checkpoint dir (default: <workdir>/policy)")
    against_flag = flags.DEFINE_string("against", None, "another evaluated workdir: judge the two pairwise")

    def main(argv: Sequence[str]) -> None:
        """absl entry point; errors in the setting exit with status 2 and their message."""
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments {argv[1:]}")
        if config_flag.value is None or not workdir_flag.value:
            raise app.UsageError("--config and --workdir are required")

        shared.quiet_info_logs()
        try:
            content = evaluate_workdir(config_flag.value, workdir_flag.value, checkpoint=checkpoint_flag.value,
                                       against=against_flag.value)
        except (ValueError, KeyError, FileNotFoundError, ChatError, EvaluationError) as exc:  # not a bug
            shared.fail("evaluation", exc, shared.DEBUG.value)
        except Exception as exc:
            if shared.user_error(exc) is None:
                raise
            shared.fail("evaluation", exc, shared.DEBUG.value)
        out = Path(workdir_flag.value).expanduser().absolute() / EVAL_DIR
        gen = content["generation"]
        print(f"{content['targets']} targets in {content['episodes']} episodes: BLEU-4 {gen['BLEU-4']:.2f}, "
              f"ROUGE-L {gen['ROUGE-L']:.2f}; {out / 'results.md'}")
        if "pairwise" in content and content["pairwise"]["preference"]:
            p = content["pairwise"]["preference"]
            print(f"vs {content['pairwise']['b']}: win {100 * p['win_rate']:.1f}%, tie {100 * p['tie_rate']:.1f}%, "
                  f"lose {100 * p['loss_rate']:.1f}%, sign test p = {p['p_value']:.3g}")

    app.run(main, flags_parser=lambda argv: shared.parse_flags(argv, "evaluation"))


if __name__ == "__main__":
    cli()
