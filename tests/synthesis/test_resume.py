"""A synthesis survives its back end: every answer is kept in `<out>/requests.sqlite` as it arrives, a rerun
of a synthesis that died replays them (never asking one twice) and writes the same files as an uninterrupted
run; a request that fails after all retries is counted and its storyline skipped, and only too many of them
fail the stage, with one error that says how many and which setting to change."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence

import pytest

from icml_jax.llm import GeminiBackend, GeminiConfig, LLMRequest, LLMResponse, OfflineBackend, TokenUsage
from icml_jax.llm.types import TASK_CONDENSE, BackendError
from icml_jax.synthesis import SynthesisConfig, default_config, load_expert_data, prompts, synthesize
from icml_jax.synthesis.dataset import MANIFEST, SPLITS, episodes_path, trigger_path
from tests.data.test_synthesis import WORLD
from tests.llm.conftest import fake_gemini, gemini_env  # noqa: F401 - pytest fixtures

CONFIG = SynthesisConfig(seed=5, num_seeds=3, storylines_per_seed=2, prequels_per_storyline=2, world=WORLD,
                         heldout_fraction=0.34, batch_size=4)
STORYLINES = 3 * 2


def _id(r: LLMRequest) -> str:
    """What tells two requests apart (what a model and the offline back end read)."""
    return json.dumps([r.task, r.system, r.prompt, r.metadata, r.temperature, r.max_output_tokens], sort_keys=True)


class Killed(BaseException):
    """The process dies mid-request (as on SIGTERM or Ctrl-C): no `except Exception` stops it."""


class Flaky:
    """The offline back end, except that requests `fails(request)` picks fail for good (BackendError), or, with
    `crash`, end the process (an exception that is no back-end failure). Records every request it is sent."""

    name = "offline"  # the same back end as far as the cache's namespace is concerned

    def __init__(self, fails: Callable[[LLMRequest], bool] = lambda r: False, *, crash: bool = False) -> None:
        self.inner, self.fails, self.crash = OfflineBackend(), fails, crash
        self.asked: list[str] = []
        self.failed: set[str] = set()

    @property
    def usage(self) -> TokenUsage:
        return self.inner.usage

    def close(self) -> None:
        pass

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        for r in requests:
            if self.fails(r):
                self.failed.add(_id(r))
                if self.crash:
                    raise Killed("simulated kill")
                raise BackendError("flaky", 9, 9, "HTTP 429 RESOURCE_EXHAUSTED", True)
        self.asked.extend(_id(r) for r in requests)
        return self.inner.generate(requests)


def kth(k: int, task: str | None = None) -> Callable[[LLMRequest], bool]:
    """Picks the k-th distinct request (0-based, in order of arrival; of `task` only when given), every time."""
    order: dict[str, int] = {}
    return lambda r: (task is None or r.task == task) and order.setdefault(_id(r), len(order)) == k


def _files(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for s in SPLITS for p in (episodes_path(directory, s), trigger_path(directory, s))}


@pytest.mark.parametrize("crash", [False, True], ids=["failed-for-good", "killed"])
def test_a_rerun_resumes_and_writes_the_files_of_an_uninterrupted_run(tmp_path, crash):
    reference = synthesize(CONFIG, OfflineBackend(), tmp_path / "reference")
    strict = SynthesisConfig(**{**CONFIG.__dict__, "max_failed_fraction": 0.0})
    first = Flaky(kth(20), crash=crash)
    with pytest.raises(Killed if crash else RuntimeError) as info:
        synthesize(strict, first, tmp_path / "run")
    if not crash:
        assert "1 of " in str(info.value) and "synthesis.max_failed_fraction" in str(info.value)
    assert not (tmp_path / "run" / MANIFEST).exists() and first.failed
    healthy = Flaky()
    again = synthesize(strict, healthy, tmp_path / "run")
    assert not set(healthy.asked) & set(first.asked), "a request answered before the failure was asked again"
    assert first.failed <= set(healthy.asked)
    assert _files(tmp_path / "run") == _files(tmp_path / "reference") and again["files"] == reference["files"]
    assert again["counts"]["failed_requests"] == 0
    assert again["cache"]["misses"] == len(healthy.asked)  # each sent once
    # the same requests as an uninterrupted run (run 1 may have asked a few that only its smaller data needed)
    assert again["cache"]["hits"] + again["cache"]["misses"] == reference["cache"]["misses"]
    # the third run asks nothing at all
    idle = Flaky()
    synthesize(strict, idle, tmp_path / "run")
    assert idle.asked == [] and _files(tmp_path / "run") == _files(tmp_path / "reference")


def test_failed_requests_are_counted_and_their_storyline_skipped(tmp_path):
    def fails(r: LLMRequest) -> bool:
        md = r.metadata
        return r.task == prompts.TASK_SYNTH_PREQUEL and md["seed_id"] == "seed-5-1" and md["storyline"] == 1

    backend = Flaky(fails)
    manifest = synthesize(CONFIG, backend, tmp_path)  # 1 of 61 requests failed: under max_failed_fraction 0.1
    c = manifest["counts"]
    assert c["failed_requests"] == 1 and c["storylines_accepted"] == STORYLINES - 1
    assert manifest["requests"]["failed"] == 1
    (rejection,) = manifest["rejections"]
    assert (rejection["seed_id"], rejection["storyline"], rejection["stage"]) == ("seed-5-1", 1, "prequel_0")
    assert rejection["backend_failure"] and "HTTP 429" in rejection["errors"][-1]
    data = load_expert_data(tmp_path)
    ids = {e.episode_id for e in data.train_episodes + data.heldout_episodes}
    assert "seed-5-1/story1" not in ids and len(ids) == STORYLINES - 1


def test_a_failed_condensation_keeps_the_turn_text_and_is_counted(tmp_path):
    manifest = synthesize(CONFIG, OfflineBackend(), tmp_path, condenser=Flaky(kth(1, TASK_CONDENSE)))
    memories = manifest["memories"]
    assert manifest["counts"]["failed_requests"] == 1
    assert sum(memories[s]["failed"] for s in ("train", "heldout")) == 1
    assert sum(memories[s]["fallbacks"] for s in ("train", "heldout")) >= 1  # the note is the turn text


def test_too_many_failures_fail_the_stage_with_one_clear_error(tmp_path):
    backend = Flaky(lambda r: r.task == prompts.TASK_SYNTH_ANNOTATE and r.metadata["session"] == 0)
    with pytest.raises(RuntimeError) as info:
        synthesize(CONFIG, backend, tmp_path)  # max_failed_fraction 0.1 by default
    msg = str(info.value)
    assert f"{STORYLINES} of " in msg and "synthesis.max_failed_fraction=0.1" in msg
    assert "requests.sqlite" in msg and "HTTP 429" in msg
    assert not (tmp_path / MANIFEST).exists()
    assert len(msg.splitlines()) == 1


def test_manifest_usage_carries_total_tokens_and_retry_counts(tmp_path):
    manifest = synthesize(CONFIG, OfflineBackend(), tmp_path)
    usage = manifest["usage"]
    assert {"total_tokens", "calls", "attempts", "retries", "failures"} <= set(usage)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["output_tokens"] + usage["thoughts_tokens"] > 0
    assert usage["calls"] == usage["attempts"] > 0 and usage["retries"] == usage["failures"] == 0
    condensed = synthesize(CONFIG, OfflineBackend(), tmp_path / "other", condenser=OfflineBackend())
    assert condensed["memories"]["usage"]["total_tokens"] > 0


def test_max_failed_fraction_is_a_validated_config_field():
    from tests.config_files import load_config

    assert SynthesisConfig().max_failed_fraction == 0.1 and default_config().max_failed_fraction == 0.1
    assert load_config("base").synthesis.max_failed_fraction == 0.1
    cfg = default_config()
    cfg.max_failed_fraction = 0.25
    assert SynthesisConfig.from_config(cfg).max_failed_fraction == 0.25
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"SynthesisConfig\.max_failed_fraction must be in \[0, 1\]"):
            SynthesisConfig(max_failed_fraction=bad)


def test_gemini_failure_is_skipped_and_the_rerun_asks_only_what_is_missing(
        fake_gemini, gemini_env, tmp_path):  # noqa: F811
    """Through the real client: a prequel that meets a 500 on every try is counted and its storyline dropped; a
    rerun against a healthy server never sends a request that was answered before."""
    seeds: list[str] = []
    broken = {"on": True}
    answered: list[list[str]] = [[]]

    def responder(body):
        prompt = body["contents"][0]["parts"][0]["text"]
        if "Write one conversation session" in prompt:
            seeds.append(prompt)
            turns = [{"speaker": "user", "text": f"Any dinner ideas for tonight? (seed {len(seeds)})"},
                     {"speaker": "assistant", "text": "How about a lentil curry?"}]
            action = fake_gemini.ok(json.dumps({"turns": turns}))
        elif "Write the session that took place just BEFORE" in prompt:
            seed = re.search(r"\(seed \d\)", prompt).group()
            if broken["on"] and seed == "(seed 2)":
                return fake_gemini.status(500, "internal")
            action = fake_gemini.ok(json.dumps({"gap_to_next": "2 weeks", "turns": [
                {"speaker": "user", "text": f"I decided to go vegan this week {seed}."},
                {"speaker": "assistant", "text": "That's a big step!"}]}))
        elif "Write one short note" in prompt:
            action = fake_gemini.ok("The user has gone vegan.")
        elif "Current session:\nSession 0" in prompt:
            action = fake_gemini.ok(json.dumps({"labels": [{"turn": 0, "gain": 0.9, "needs": []}]}))
        else:
            action = fake_gemini.ok(json.dumps({"labels": [{"turn": 0, "gain": 0.0,
                                                            "needs": [{"session": 0, "turn": 0}]}]}))
        answered[-1].append(json.dumps(body, sort_keys=True))
        return action

    fake_gemini.responder = responder
    config = SynthesisConfig(num_seeds=2, storylines_per_seed=1, prequels_per_storyline=1, world=WORLD,
                             heldout_fraction=0.0, max_failed_fraction=0.5)
    gemini = GeminiConfig(model="gemini-test", base_url=fake_gemini.base_url, max_concurrency=2, max_attempts=2)

    def run():
        backend = GeminiBackend(gemini, sleep=lambda s: None, rng=random.Random(0))
        try:
            return synthesize(config, backend, tmp_path)
        finally:
            backend.close()

    first = run()
    assert first["counts"]["failed_requests"] == 1 and first["counts"]["storylines_accepted"] == 1
    assert first["usage"]["failures"] == 1 and first["usage"]["retries"] == 1
    assert first["usage"]["attempts"] == fake_gemini.hits and first["usage"]["total_tokens"] > 0
    (rejection,) = first["rejections"]
    assert rejection["backend_failure"] and "500" in rejection["errors"][-1]
    broken["on"], hits = False, fake_gemini.hits
    answered.append([])
    second = run()
    assert not set(answered[1]) & set(answered[0])  # nothing answered before is asked again
    assert 3 <= fake_gemini.hits - hits == second["cache"]["misses"]  # the prequel and its 2 annotations at least
    assert second["counts"]["failed_requests"] == 0 and second["counts"]["storylines_accepted"] == 2
