"""Wall time of a small synthesis and of one online episode with ~300 ms back ends, sequential vs concurrent.

Episode: the tiny persona-world learner (`persona_run.build_learner`'s policies) whose generator, condenser and
judges are the Gemini back end pointed at the tests' loopback fake Gemini server (`delay_s` per request). The
sequential arm marks that back end `remote = False` (today's path: reply, condense, quality judge, proxy judge
one after the other); the concurrent arm keeps `remote = True` (proxy judge in flight during the agent's step,
reply beside condense). The episode's PPO update is left out (`update_every` past the run): only the turn
loop's requests change. A warm-up episode at zero latency compiles the policies first.

Synthesis: the fake server cannot write persona-world storylines (their answers come from request metadata
that never reaches a model), so the offline back end's answers are delayed by `delay_s` per request instead:
one at a time (sequential) vs up to 8 in flight per back-end call, as Gemini's `max_concurrency` default does.

Usage: python scripts/benchmark_concurrency.py [--delay 0.3]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from icml_jax.data.persona_world import PersonaWorldConfig, generate_episodes  # noqa: E402
from icml_jax.experiments.persona_run import PersonaRunConfig, build_learner  # noqa: E402
from icml_jax.llm import OfflineBackend, make_backend  # noqa: E402
from icml_jax.llm.judges import ProxyJudge, QualityJudge  # noqa: E402
from icml_jax.llm.prompts import QUALITY_DIMENSIONS  # noqa: E402
from icml_jax.llm.types import LLMRequest, LLMResponse  # noqa: E402
from icml_jax.memory.store import MemoryStore  # noqa: E402
from icml_jax.rl import OnlineLearner  # noqa: E402
from icml_jax.synthesis import SynthesisConfig, synthesize  # noqa: E402
from tests.llm.conftest import TEST_KEY, FakeGemini, _handler  # noqa: E402


def answer(body: dict) -> dict:
    """The fake model: a judge verdict when JSON is asked for, else a short reply / note."""
    gen = body.get("generationConfig", {})
    if gen.get("responseMimeType") == "application/json" or "responseSchema" in gen or "responseJsonSchema" in gen:
        verdict = {"score": 0.5, "reason": "ok", **{d: 4 for d in QUALITY_DIMENSIONS}}
        return FakeGemini.ok(json.dumps(verdict))
    return FakeGemini.ok("Sounds lovely, tell me more.")


def start_server(delay_s: float) -> tuple[FakeGemini, ThreadingHTTPServer]:
    state = FakeGemini()
    state.delay_s, state.responder = delay_s, answer
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return state, server


def episode_seconds(base: OnlineLearner, tokenizer, episode, backend) -> tuple[float, int]:
    """Wall seconds of one episode's turn loop with every back end `backend`, and the turns played."""
    config = dataclasses.replace(base.config, update_every=10**9)
    learner = OnlineLearner(base.policies, tokenizer, MemoryStore(), backend, proxy_judge=ProxyJudge(backend),
                            quality_judge=QualityJudge(backend), config=config)
    with learner:
        start = time.perf_counter()
        out = learner.run_episode(episode)
        seconds = time.perf_counter() - start
        failures = learner._since["proxy_failures"] + learner._since["quality_failures"]
    assert failures == 0, f"{failures} judge failures: the fake server's answers do not parse"
    return seconds, int(out["episode/turns"])


class DelayedOffline:
    """The offline back end's answers after `delay_s` per request, `concurrency` requests in flight per call."""

    remote = True
    name = "offline"

    def __init__(self, delay_s: float, concurrency: int) -> None:
        self.inner, self.delay_s = OfflineBackend(), delay_s
        self.pool = cf.ThreadPoolExecutor(max_workers=concurrency)
        self.requests = 0

    @property
    def usage(self):
        return self.inner.usage

    def close(self) -> None:
        self.pool.shutdown()

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        list(self.pool.map(lambda _: time.sleep(self.delay_s), requests))
        self.requests += len(requests)
        return self.inner.generate(requests)


def synthesis_seconds(delay_s: float, concurrency: int) -> tuple[float, int, int]:
    """Wall seconds of a small synthesis, its back-end requests and the episodes written."""
    config = SynthesisConfig(seed=5, num_seeds=4, storylines_per_seed=2, prequels_per_storyline=3,
                             heldout_fraction=0.25, world=PersonaWorldConfig(seed=5, min_user_turns=3),
                             hard_negatives=2, soft_negatives=2, note_max_tokens=48)
    backend = DelayedOffline(delay_s, concurrency)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        manifest = synthesize(config, backend, out)
        seconds = time.perf_counter() - start
    backend.close()
    return seconds, backend.requests, int(manifest["counts"]["storylines_accepted"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.3, help="seconds per request")
    args = parser.parse_args()
    os.environ["GEMINI_API_KEY"] = TEST_KEY
    for name in ("GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        os.environ.pop(name, None)

    seq, n_req, n_ep = synthesis_seconds(args.delay, 1)
    conc, _, _ = synthesis_seconds(args.delay, 8)
    print(f"synthesis ({n_req} requests, {n_ep} episodes, {args.delay:.2f} s/request): "
          f"sequential {seq:.2f} s, concurrent (8 in flight) {conc:.2f} s, ratio {seq / conc:.2f}x")

    state, server = start_server(0.0)
    with tempfile.TemporaryDirectory() as tmp:
        run = PersonaRunConfig()
        base, tokenizer = build_learner(run, Path(tmp))
        episode = generate_episodes(run.world, 1)[0]
        gemini = make_backend({"kind": "gemini", "model": "gemini-test", "base_url": state.base_url,
                               "max_attempts": 2})
        try:
            episode_seconds(base, tokenizer, episode, gemini)  # compiles the policies at zero latency
            state.delay_s = args.delay
            gemini.remote = False
            seq, turns = episode_seconds(base, tokenizer, episode, gemini)
            hits = state.hits
            gemini.remote = True
            conc, _ = episode_seconds(base, tokenizer, episode, gemini)
            print(f"episode ({turns} turns, {state.hits - hits} requests, {args.delay:.2f} s/request, fake Gemini): "
                  f"sequential {seq:.2f} s, concurrent {conc:.2f} s, ratio {seq / conc:.2f}x, "
                  f"max in flight {state.max_inflight}")
        finally:
            gemini.close()
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    main()
