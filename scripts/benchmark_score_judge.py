"""The local score-token judge on real dialogue: each cue as its own row vs the cues on one shared prompt, side by
side in one run.

Quality-judge requests (five cues, one per dimension, `llm.prompts.quality_score_request`) are built from GapChat
test episodes (`--gapchat`, the release's test/5_session.json): for every user turn of the first sessions, the
previous turns as history, the turn as the utterance and the next turn as the reply. The same requests are scored
by `LocalBackend.score` twice: split into single-cue requests (each (prompt, cue) row a full forward pass, the
path every request took before) and whole (the prompt once into a KV cache, each cue against it). Prints both wall
times (the first call of each path compiles and is not counted), their ratio and the largest difference of the
expected scores. With `--turn N` it also times what one lockstep turn of N users asks of the local back end on the
same turns (a reply and a memory note of at most `--max-tokens` tokens each, a quality verdict, a proxy verdict),
request kind by request kind, the first batch of each kind not counted.

    python scripts/benchmark_score_judge.py --model ~/.cache/icml_jax/models/smollm2-135m-instruct \
        --gapchat ../shared/data/gapchat/test/5_session.json --requests 32
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from icml_jax.data.sources.gapchat import parse_gapchat  # noqa: E402
from icml_jax.llm import LocalBackend, prompts  # noqa: E402
from icml_jax.llm.types import ScoreRequest  # noqa: E402
from icml_jax.models import from_pretrained, load_tokenizer  # noqa: E402


def quality_requests(path: Path, n: int) -> list[ScoreRequest]:
    """`n` quality-judge requests from the first sessions of the GapChat episodes in `path`."""
    out = []
    for episode in parse_gapchat(path):
        for session in episode.sessions:
            turns = [(t.speaker, t.text) for t in session.turns]
            for t in range(1, len(turns) - 1, 2):
                out.append(prompts.quality_score_request(tuple(turns[:t]), turns[t][1], turns[t + 1][1], None))
                if len(out) == n:
                    return out
    return out


def turn_requests(path: Path, users: int, max_tokens: int) -> dict[str, list]:
    """One lockstep turn of `users` users on GapChat turns: the four kinds of request it sends the local back end."""
    requests = quality_requests(path, users)
    out: dict[str, list] = {"reply": [], "note": [], "quality verdict": requests, "proxy verdict": []}
    for episode in parse_gapchat(path):
        turns = [(t.speaker, t.text) for t in episode.sessions[0].turns]
        out["reply"].append(prompts.reply_request(tuple(turns[:-1]), turns[-1][1], None, max_output_tokens=max_tokens))
        out["note"].append(prompts.condense_request(turns[-1][1], tuple(turns[:-1]), max_output_tokens=max_tokens))
        out["proxy verdict"].append(prompts.proxy_score_request(turns[-1][1], tuple(turns[:-1])))
        if len(out["reply"]) == users:
            break
    return out


def time_turn(backend: LocalBackend, path: Path, users: int, max_tokens: int) -> None:
    """Prints the seconds of each request kind of one lockstep turn of `users` users (after a compiling batch)."""
    total = 0.0
    for kind, batch in turn_requests(path, users, max_tokens).items():
        call = backend.generate if kind in ("reply", "note") else backend.score
        call(batch)
        start = time.perf_counter()
        call(batch)
        spent = time.perf_counter() - start
        total += spent
        print(f"turn of {users} users, {kind:15s} {spent:7.2f} s")
    print(f"turn of {users} users, back-end total  {total:7.2f} s")


def timed(backend: LocalBackend, requests: list[ScoreRequest], repeats: int) -> tuple[float, np.ndarray]:
    """Seconds per call of backend.score(requests) (after one compiling call) and the expected scores."""
    result = backend.score(requests)
    start = time.perf_counter()
    for _ in range(repeats):
        result = backend.score(requests)
    return (time.perf_counter() - start) / repeats, np.array([e for r in result for e in r.expected])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a local HF model directory (the judge)")
    parser.add_argument("--gapchat", type=Path, required=True, help="GapChat's test/5_session.json")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turn", type=int, default=0, help="also time one lockstep turn of this many users")
    parser.add_argument("--max-tokens", type=int, default=32, help="the turn's reply and note budget")
    args = parser.parse_args()
    backend = LocalBackend(from_pretrained(args.model), load_tokenizer(args.model), max_batch=args.max_batch,
                           judge_mode="scores")
    requests = quality_requests(args.gapchat, args.requests)
    singles = [ScoreRequest(r.request, (cue,)) for r in requests for cue in r.cues]
    rows_s, rows_e = timed(backend, singles, args.repeats)
    shared_s, shared_e = timed(backend, requests, args.repeats)
    tokens = [r.prompt_tokens / len(r.expected) for r in backend.score(requests)]  # per (prompt, cue) row
    print(f"{len(requests)} quality requests x 5 cues, prompts {min(tokens)}-{max(tokens)} tokens "
          f"(mean {np.mean(tokens):.0f}), max_batch {args.max_batch}, {args.model.name}")
    print(f"row by row:    {rows_s:7.2f} s per call")
    print(f"shared prefix: {shared_s:7.2f} s per call")
    print(f"speed-up {rows_s / shared_s:.2f}x; largest |expected score difference| "
          f"{np.abs(rows_e - shared_e).max():.2e}")
    if args.turn:
        time_turn(backend, args.gapchat, args.turn, args.max_tokens)


if __name__ == "__main__":
    main()
