"""JSON judging vs score-token judging on the same requests, with one local model (default SmolLM2-135M-Instruct).

On a few persona-world user turns (the proxy judge) and replies (the quality judge: each turn's reference reply
and, as a poor reply, the reference reply of another turn), runs the judges twice on the same model: once asking
for JSON (`judge_mode="json"`: generate, parse, re-ask once) and once reading the next-token probabilities of
"1".."5" after a cue (`judge_mode="scores"`). Prints how often each gives no verdict and, where both do, their
agreement (Pearson r and mean absolute difference of the [0, 1] scores). No judge reads labels: the persona
world's y_p / y_t / gold facts are never passed (ProxyInput.label and QualityInput.label_needed stay None).

    python scripts/judge_agreement.py                    # 6 turns: 6 proxy items, 12 quality items
    python scripts/judge_agreement.py --turns 4 --model ~/.cache/icml_jax/models/gemma3-270m
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from icml_jax.data.persona_world import PersonaWorldConfig, generate_episodes
from icml_jax.llm.judges import JudgeResult, ProxyInput, ProxyJudge, QualityInput, QualityJudge
from icml_jax.llm.local import LocalBackend
from icml_jax.models import from_pretrained, load_tokenizer
from icml_jax.models.fetch import model_dir


def items(turns: int, seed: int) -> tuple[list[ProxyInput], list[QualityInput]]:
    """`turns` user turns with a reference reply, spread over turn kinds; no labels attached."""
    picked: list[tuple[tuple[tuple[str, str], ...], str, str, str]] = []  # (history, utterance, reply, kind)
    by_kind: dict[str, list] = collections.defaultdict(list)
    for episode in generate_episodes(PersonaWorldConfig(seed=seed), 2):
        for session in episode.sessions:
            for k, turn in enumerate(session.turns[:-1]):
                nxt = session.turns[k + 1]
                if turn.speaker == "user" and nxt.speaker == "assistant":
                    history = tuple((t.speaker.capitalize(), t.text) for t in session.turns[:k])
                    by_kind[str(turn.meta.get("kind", "other"))].append((history, turn.text, nxt.text))
    kinds = sorted(by_kind)
    while len(picked) < turns and any(by_kind.values()):
        for kind in kinds:
            if by_kind[kind] and len(picked) < turns:
                picked.append((*by_kind[kind].pop(0), kind))
    proxy = [ProxyInput(u, h) for h, u, _, _ in picked]
    quality = [QualityInput(h, u, r, None) for h, u, r, _ in picked]
    quality += [QualityInput(h, u, picked[(i + 1) % len(picked)][2], None)  # another turn's reply: a poor one
                for i, (h, u, _, _) in enumerate(picked)]
    return proxy, quality


def agreement(a: list[JudgeResult], b: list[JudgeResult]) -> dict[str, float | int | None]:
    """Pearson r and mean |difference| of the scores where both verdicts exist."""
    pairs = [(x.score, y.score) for x, y in zip(a, b, strict=True) if x.ok and y.ok]
    if not pairs:
        return {"pairs": 0, "pearson_r": None, "mean_abs_diff": None}
    x, y = np.array(pairs, np.float64).T
    r = float(np.corrcoef(x, y)[0, 1]) if len(pairs) > 2 and x.std() > 0 and y.std() > 0 else None
    return {"pairs": len(pairs), "pearson_r": r, "mean_abs_diff": float(np.mean(np.abs(x - y)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(model_dir("smollm2-135m-instruct")), help="local HF model directory")
    parser.add_argument("--turns", type=int, default=6, help="persona-world user turns (quality items: twice that)")
    parser.add_argument("--seed", type=int, default=0, help="persona-world seed")
    parser.add_argument("--max-output-tokens", type=int, default=128, help="JSON judge's answer cap (as Table 7's)")
    args = parser.parse_args()
    path = Path(args.model).expanduser()
    model, tok = from_pretrained(path, dtype=jnp.float32), load_tokenizer(path)
    proxy_items, quality_items = items(args.turns, args.seed)
    rows = {}
    for mode in ("json", "scores"):
        backend = LocalBackend(model, tok, judge_mode=mode, max_output_tokens=args.max_output_tokens)
        start = time.perf_counter()
        proxy_judge, quality_judge = ProxyJudge(backend), QualityJudge(backend)
        rows[mode] = {"proxy": proxy_judge.judge(proxy_items), "quality": quality_judge.judge(quality_items),
                      "seconds": time.perf_counter() - start,
                      "reasks": proxy_judge.stats.reasks + quality_judge.stats.reasks}
    report = {"model": path.name, "turns": args.turns, "seed": args.seed,
              "max_output_tokens": args.max_output_tokens}
    for kind in ("proxy", "quality"):
        j, s = rows["json"][kind], rows["scores"][kind]
        reasons = collections.Counter((v.failure or "")[:60] for v in j if not v.ok).most_common(3)
        report[kind] = {"items": len(j), "json_failures": sum(not v.ok for v in j),
                        "json_failure_rate": sum(not v.ok for v in j) / len(j),
                        "scores_failures": sum(not v.ok for v in s),
                        "scores_failure_rate": sum(not v.ok for v in s) / len(s),
                        **agreement(j, s), "json_failure_reasons": reasons,
                        "scores_mean": float(np.mean([v.score for v in s if v.ok])) if any(v.ok for v in s) else None}
    if quality_items:  # the scores judge should rank a turn's own reply above another turn's
        n = len(quality_items) // 2
        own = [v.score for v in rows["scores"]["quality"][:n]]
        other = [v.score for v in rows["scores"]["quality"][n:]]
        report["quality"]["scores_own_reply_preferred"] = sum(a > b for a, b in zip(own, other)) / n
    report["seconds"] = {m: round(rows[m]["seconds"], 1) for m in rows}
    report["json_reasks"] = rows["json"]["reasks"]
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
