"""An evaluation's numbers and files: `results.json` (everything, with its setting), `results.md` (the paper's
Table 1 and Table 8 layouts), `targets.jsonl` (one row per target) and `efficiency.png` (storage tokens per
session, latencies)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from icml_jax.evaluation.metrics import JUDGE_DIMENSIONS, bleu4, rouge_l, rouge_l_per_target
from icml_jax.evaluation.memory_gain import GAIN, NLL
from icml_jax.evaluation.protocol import EpisodeResult
from icml_jax.data.labels import SessionCounts, pooled_metrics

RESULTS_JSON, RESULTS_MD, TARGETS_JSONL, EFFICIENCY_PNG = "results.json", "results.md", "targets.jsonl", \
    "efficiency.png"
TABLE1 = ("BLEU-4", "ROUGE-L", "BERTScore", "MAUVE", "Engagingness", "Humanness", "Coherence", "Consistency",
          "Memorability")
LIKELIHOOD = {"Memory gain": GAIN, "NLL": NLL}  # column -> target row key (evaluation.memory_gain), nats per token
TABLE8 = ("planner_precision", "planner_recall", "trigger_recall", "planner_miss_rate",
          "planner_false_positive_rate")


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    return {"p50": float(np.percentile(values, 50)), "p95": float(np.percentile(values, 95)), "n": len(values)}


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def per_session_efficiency(results: Sequence[EpisodeResult]) -> list[dict[str, Any]]:
    """Per session (the paper's Figures 9, 10 and 15): the generator's tokens per episode, stored tokens after it,
    memory construction (the session's total ms) and retrieval (ms per retrieval), and the session's total
    processing time in seconds; means over episodes, latencies leaving out the first episode when there are
    several (it compiles most of the programs). An episode's final session builds no memory."""
    warm_ids = {id(e) for e in (results[1:] if len(results) > 1 else results)}
    n_sessions = max(max(len(e.session_ms), len(e.storage_tokens) + 1) for e in results)
    out = []
    for s in range(n_sessions):
        used, storage, construction, per_turn, retrieval, seconds, finals = [], [], [], [], [], [], 0
        for e in results:
            if s < len(e.session_usage):
                used.append(e.session_usage[s])
            if s < len(e.storage_tokens):
                storage.append(e.storage_tokens[s])
            elif s == len(e.storage_tokens):
                finals += 1
            if id(e) not in warm_ids:
                continue
            if s < len(e.session_ms):
                seconds.append(e.session_ms[s] / 1e3)
            if s < len(e.storage_tokens) and e.observed_sessions:
                mine = [i for i, n in enumerate(e.observed_sessions) if n == s]
                construction.append(sum(e.construction_ms[i] for i in mine))
                per_turn += [e.construction_ms[i] for i in mine]
                retrieval += [e.observe_retrieval_ms[i] for i in mine]
            elif s == len(e.storage_tokens):
                retrieval += [r["retrieval_ms"] for r in e.targets]
        tokens = {k: _mean([u[k] for u in used]) for k in ("calls", "prompt_tokens", "output_tokens")}
        out.append({
            "session": s + 1, "final_in": finals,  # episodes whose target session this is
            "inference_tokens": (None if tokens["prompt_tokens"] is None
                                 else tokens["prompt_tokens"] + tokens["output_tokens"]), **tokens,
            "storage_tokens": _mean(storage), "construction_ms": _mean(construction),
            "construction_ms_per_turn": _mean(per_turn), "retrieval_ms": _mean(retrieval),
            "retrievals": len(retrieval), "processing_s": _mean(seconds), "timed_episodes": len(seconds)})
    return out


def summarize(results: Sequence[EpisodeResult],
              model_scores: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Generation, memory and efficiency figures of an evaluation; `model_scores`: {"BERTScore" / "MAUVE":
    a ModelScore} computed by the caller. Latency percentiles leave out the first episode when there are several
    (it compiles most of the programs)."""
    rows = [r for e in results for r in e.targets]
    if not rows:
        raise ValueError("evaluation produced no targets")
    replies, refs = [r["reply"] for r in rows], [r["reference"] for r in rows]
    b, rl = bleu4(replies, refs), rouge_l(replies, refs)
    for row, value in zip(rows, rouge_l_per_target(replies, refs), strict=True):
        row["rouge_l"] = value  # per target, in targets.jsonl
    generation = {"BLEU-4": b.value, "ROUGE-L": rl.value, "signatures": {"BLEU-4": b.signature, "ROUGE-L": rl.signature}}
    for name, score in (model_scores or {}).items():
        generation[name] = score.value
        generation["signatures"][name] = score.signature
    for name, key in LIKELIHOOD.items():  # scored by the evaluation when the generator can (memory_gain)
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            generation[name] = float(np.mean(values))
    judged = [r["judge"] for r in rows if r.get("judge")]
    if any("judge" in r for r in rows):  # mean normalized score per dimension over the valid verdicts, percent
        for dim in JUDGE_DIMENSIONS:
            generation[dim.capitalize()] = 100.0 * float(np.mean([j[dim] for j in judged])) if judged else None
        generation["judge"] = {"judged": len(judged), "failures": sum(1 for r in rows if r.get("judge_failure")),
                               "backend_failures": sum(1 for r in rows  # requests that failed for good
                                                       if str(r.get("judge_failure") or "").startswith("back end:"))}
    n_sessions = max(len(e.counts) for e in results)
    per_session = []
    for s in range(n_sessions):
        counts = [e.counts[s] for e in results if s < len(e.counts)]
        row = {k.split("/", 1)[1]: v for k, v in pooled_metrics(counts, "m").items()}
        storage = [e.storage_tokens[s] for e in results if s < len(e.storage_tokens)]
        row["storage_tokens"] = float(np.mean(storage)) if storage else None
        per_session.append({"session": s + 1, **row})
    all_counts: list[SessionCounts] = [c for e in results for c in e.counts]
    memory = {k.split("/", 1)[1]: v for k, v in pooled_metrics(all_counts, "m").items()}
    warm = results[1:] if len(results) > 1 else results
    efficiency = {
        "inference_tokens_per_reply": float(np.mean([r["prompt_tokens"] for r in rows])),
        "memory_tokens_per_reply": float(np.mean([r["memory_tokens"] for r in rows])),
        "output_tokens_per_reply": float(np.mean([r["output_tokens"] for r in rows])),
        "storage_tokens_per_session": [p["storage_tokens"] for p in per_session[:-1]],
        "retrieval_ms": _percentiles([r["retrieval_ms"] for e in warm for r in e.targets]),
        "construction_ms": _percentiles([ms for e in warm for ms in e.construction_ms]),
        "generation_ms": _percentiles([r["generation_ms"] for e in warm for r in e.targets]),
        "per_session": per_session_efficiency(results),
    }
    return _nan_to_none({"targets": len(rows), "episodes": len(results), "generation": generation,
                         "memory": memory, "memory_per_session": per_session, "efficiency": efficiency})


def _fmt(value: Any, scale: float = 1.0) -> str:
    return "-" if value is None else f"{scale * value:.2f}"


def results_markdown(summary: Mapping[str, Any], system: str, setting: Mapping[str, Any]) -> str:
    """Table 1 (reply metrics, percent; columns not computed show '-') and Table 8 (memory metrics per session,
    percent) of one system, with the setting they were measured in."""
    gen = summary["generation"]
    lines = [f"# Evaluation of {system}", "",
             f"{summary['episodes']} episodes, {summary['targets']} final-session targets; "
             f"data: {setting.get('data')}; generator: {setting.get('generator')}; seed {setting.get('seed')}.", "",
             "## Table 1: replies (percent)", "",
             "| system | " + " | ".join(TABLE1) + " |", "|---|" + "---:|" * len(TABLE1),
             f"| {system} | " + " | ".join(_fmt(gen.get(c)) for c in TABLE1) + " |", "",
             f"BLEU-4: sacrebleu `{gen['signatures']['BLEU-4']}`; ROUGE-L: {gen['signatures']['ROUGE-L']}."
             + "".join(f" {k}: {gen['signatures'][k]}." for k in ("BERTScore", "MAUVE") if k in gen['signatures'])
             + (" BERTScore / MAUVE: not computed (set eval.bertscore_model / eval.mauve_model to local model "
                "directories)." if not {"BERTScore", "MAUVE"} <= set(gen['signatures']) else "")
             + (f" Judge ({setting.get('judge')}): mean normalized 1-5 score of {gen['judge']['judged']} replies, "
                f"{gen['judge']['failures']} failed verdicts left out." if "judge" in gen else ""), "",
             ("Memory gain (the generator's log-likelihood of the gold turn with the system's memory in the prompt "
              f"minus without, nats per token): {gen['Memory gain']:+.4f}; NLL of the gold turn: {gen['NLL']:.4f} "
              "nats per token." if "Memory gain" in gen else
              "Memory gain: not scored (the generator cannot score a given continuation, or eval.memory_gain is "
              "off; results.json says which)."), "",
             "## Table 8: memory (percent; sessions 1..N-1 build the memory, N is the target session)", "",
             "| session | " + " | ".join(TABLE8) + " | storage tokens |", "|---|" + "---:|" * (len(TABLE8) + 1)]
    for row in summary["memory_per_session"]:
        lines.append(f"| {row['session']} | " + " | ".join(_fmt(row.get(k), 100) for k in TABLE8) +
                     f" | {_fmt(row.get('storage_tokens'))} |")
    mem = summary["memory"]
    lines.append("| all | " + " | ".join(_fmt(mem.get(k), 100) for k in TABLE8) + " | |")
    if mem.get("proxy_truth"):
        pt = mem["proxy_truth"]
        r = "-" if pt["r"] is None else f"{pt['r']:.3f}"
        lines += ["", f"Pearson r between proxy and truth rewards: {r} over {pt['saves_used']} saves that a reply "
                      f"used (of {pt['saves']} saves; {pt['proxy_failures']} proxy verdicts failed)."]
    eff = summary["efficiency"]

    def ms(p: Mapping[str, Any]) -> str:
        return "-" if p["p50"] is None else f"p50 {p['p50']:.1f} ms, p95 {p['p95']:.1f} ms over {p['n']}"

    lines += ["", "## Efficiency (latencies leave out the first episode, which compiles)", "",
              f"- tokens per reply: prompt {eff['inference_tokens_per_reply']:.1f} (memory "
              f"{eff['memory_tokens_per_reply']:.1f} of it), output {eff['output_tokens_per_reply']:.1f}",
              f"- memory retrieval per target: {ms(eff['retrieval_ms'])}",
              f"- memory construction per observed turn: {ms(eff['construction_ms'])}",
              f"- reply generation per target: {ms(eff['generation_ms'])}"]
    if eff.get("per_session"):
        lines += ["", "Per session (means per episode; generator tokens, stored tokens after the session, memory "
                  "construction over the session, retrieval per call, the session's processing time):", "",
                  "| session | generator tokens | stored tokens | construction ms | retrieval ms | processing s |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['session']} | {_fmt(r['inference_tokens'])} | {_fmt(r['storage_tokens'])} | "
                  f"{_fmt(r['construction_ms'])} | {_fmt(r['retrieval_ms'])} | {_fmt(r['processing_s'])} |"
                  for r in eff["per_session"]]
    for role, u in (setting.get("llm_usage") or {}).items():
        per = u.get("per_turn") or {}
        cost = f", estimated {u['estimated_usd']:.4f} USD" if "estimated_usd" in u else ""
        lines.append(f"- {role} back end: {u['calls']} calls, {u['prompt_tokens']} prompt + {u['output_tokens']} "
                     f"output tokens ({per.get('calls', 0):.2f} calls and "
                     f"{per.get('prompt_tokens', 0) + per.get('output_tokens', 0):.0f} tokens per turn){cost}")
    lines.append("")
    return "\n".join(lines)


def efficiency_plot(summary: Mapping[str, Any], path: Path) -> None:
    """Storage tokens after each history session, and latency p50/p95, as one PNG (drawn on its own Agg canvas,
    so a notebook's or an application's matplotlib backend is left alone)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    eff = summary["efficiency"]
    fig = Figure(figsize=(9, 3.2))
    FigureCanvasAgg(fig)
    a, b = fig.subplots(1, 2)
    storage = [x if x is not None else float("nan") for x in eff["storage_tokens_per_session"]]
    a.plot(range(1, len(storage) + 1), storage, marker="o")
    a.set_xlabel("session")
    a.set_ylabel("stored memory tokens")
    names = ["retrieval_ms", "construction_ms", "generation_ms"]
    for i, q in enumerate(("p50", "p95")):
        b.bar(np.arange(3) + 0.4 * i, [eff[n][q] or 0.0 for n in names], width=0.4, label=q)
    b.set_xticks(np.arange(3) + 0.2, ["retrieval", "construction", "reply"])
    b.set_ylabel("ms")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_outputs(out_dir: Path, results: Sequence[EpisodeResult], system: str,
                  setting: Mapping[str, Any], model_scores: Mapping[str, Any] | None = None,
                  memory_extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Writes the four files into `out_dir`; returns results.json's content. `memory_extra` joins the memory
    metrics (e.g. the proxy / truth reward correlation)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(results, model_scores)
    summary["memory"].update(memory_extra or {})
    with open(out_dir / TARGETS_JSONL, "w", encoding="utf-8") as f:
        for e in results:
            for row in e.targets:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    content = {"system": system, "setting": dict(setting), **summary}
    (out_dir / RESULTS_JSON).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / RESULTS_MD).write_text(results_markdown(summary, system, setting), encoding="utf-8")
    efficiency_plot(summary, out_dir / EFFICIENCY_PNG)
    return content


def read_targets(eval_dir: str | Path) -> list[dict[str, Any]]:
    """The per-target rows `write_outputs` wrote into `eval_dir` (its targets.jsonl); a line that is not JSON is
    named by file and line."""
    path = Path(eval_dir) / TARGETS_JSONL
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no targets.jsonl (an evaluation directory, `<workdir>/eval`, is expected)")
    return read_jsonl(path)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file (blank lines skipped); a line that is not JSON is named by file and line."""
    rows = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not JSON ({exc.msg})") from None
    return rows


__all__ = ["EFFICIENCY_PNG", "RESULTS_JSON", "RESULTS_MD", "TABLE1", "TABLE8", "TARGETS_JSONL", "read_jsonl", "read_targets",
           "per_session_efficiency", "results_markdown", "summarize", "write_outputs"]
