"""Judging evaluation targets through Gemini, sequential vs N requests in flight, side by side in one run.

The tests' fake Gemini server (`tests/llm/conftest.py`, loopback only) answers every request with a valid
five-dimension verdict after `--latency` seconds; the evaluation's judge path (`judge_targets` -> QualityJudge ->
GeminiBackend, JSON parsing included) rates `--targets` replies once with `max_concurrency=1` and once with
`--in-flight`. Prints the wall times and their ratio.

    python scripts/benchmark_judge_concurrency.py --targets 200 --latency 0.3 --in-flight 16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from icml_jax.data.schema import Episode, Session, Turn  # noqa: E402
from icml_jax.evaluation.judging import judge_targets  # noqa: E402
from icml_jax.evaluation.protocol import EpisodeResult  # noqa: E402
from icml_jax.llm.gemini import GeminiBackend, GeminiConfig  # noqa: E402
from icml_jax.llm.judges import QualityJudge  # noqa: E402
from tests.llm.conftest import TEST_KEY, FakeGemini, _handler, ok  # noqa: E402

VERDICT = json.dumps({"reason": "fine", "engagingness": 4, "humanness": 4, "coherence": 3, "consistency": 5,
                      "memorability": 3})


def targets(n: int) -> tuple[list[Episode], list[EpisodeResult]]:
    """`n` targets of one two-session episode (distinct replies, so no two requests are the same)."""
    final = Session(tuple(Turn("A" if t % 2 else "B", f"turn {t}") for t in range(n + 1)))
    episode = Episode("bench", "ep", (Session((Turn("A", "hello"),)), final))
    rows = [{"episode_id": "ep", "session": 1, "turn": t, "utterance": f"turn {t - 1}", "reply": f"reply {t}",
             "memory": None, "memory_ref": None, "needed": []} for t in range(1, n + 1)]
    return [episode], [EpisodeResult("ep", rows, [], [], [], [])]


def timed(state: FakeGemini, n: int, in_flight: int) -> tuple[float, int]:
    """Seconds to judge `n` targets with `in_flight` concurrent requests, and the most the server saw at once."""
    episodes, results = targets(n)
    state.max_inflight = 0
    config = GeminiConfig(model="gemini-2.5-flash", base_url=state.base_url, timeout_s=30.0,
                          max_concurrency=in_flight, max_attempts=2)
    with GeminiBackend(config) as backend:
        start = time.perf_counter()
        judge_targets(QualityJudge(backend), results, episodes)
        seconds = time.perf_counter() - start
    assert all(r["judge"] is not None for r in results[0].targets), "a verdict failed"
    return seconds, state.max_inflight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.3, help="seconds the server waits before answering")
    parser.add_argument("--in-flight", type=int, default=16)
    args = parser.parse_args()
    os.environ["GEMINI_API_KEY"] = TEST_KEY  # the fake server's key; nothing leaves the machine
    os.environ.pop("GOOGLE_API_KEY", None)
    state = FakeGemini()
    state.default, state.delay_s = ok(VERDICT), args.latency
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        sequential, seen_1 = timed(state, args.targets, 1)
        concurrent, seen_n = timed(state, args.targets, args.in_flight)
    finally:
        server.shutdown()
        server.server_close()
    print(f"{args.targets} judged targets, {args.latency * 1e3:.0f} ms server latency, {os.cpu_count()} CPUs")
    print(f"sequential (1 in flight):   {sequential:7.2f} s  (server saw at most {seen_1} at once)")
    print(f"concurrent ({args.in_flight} in flight): {concurrent:7.2f} s  (server saw at most {seen_n} at once)")
    print(f"speed-up: {sequential / concurrent:.2f}x (ideal {args.in_flight}x)")


if __name__ == "__main__":
    main()
