"""Forward synthesis (the paper's Table 12 comparison): sessions written in time order from the sessions so far,
annotated and turned into examples exactly as backward storylines are; backward output unchanged by the mode."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import pytest
from tqdm.auto import tqdm

from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.llm import LLMRequest, OfflineBackend
from icml_jax.synthesis import (
    StorylineKey,
    SynthesisConfig,
    default_config,
    load_expert_data,
    make_seeds,
    planner_examples,
    prompts,
    storyline_sessions,
    storylines,
    synthesize,
    synthesize_episodes,
)
from icml_jax.synthesis.offline_world import split_fact
from icml_jax.synthesis.seeds import SeedSpec
from tests.data.test_synthesis import WORLD, FaultyBackend

U, A = WORLD.user_speaker, WORLD.assistant_speaker
WRITERS = (prompts.TASK_SYNTH_SEED, prompts.TASK_SYNTH_PREQUEL, prompts.TASK_SYNTH_OPENING, prompts.TASK_SYNTH_SEQUEL)

# sha256 of the episodes (Episode.to_json, one per line) and of the request stream, computed with the code as it
# was BEFORE the forward mode existed: the backward path must keep producing exactly these.
BACKWARD_DEFAULT_EPISODES = "ac1837164cf78a7b29142ebb7192dcd13780ca39ca40993f4e655ddde336f6b4"
BACKWARD_SMALL_EPISODES = "8b2777f027cf979e3efbb4592540ac19214273b8fc071782aeacebd1fe6c7201"
BACKWARD_SMALL_REQUESTS = "bde1dd4779ddf1cc28a79c0527b099c598e06774490b79db6664ce3f5b600993"
BACKWARD_DATA_EPISODES = "2e05760ad0e96b8dd8f58de4b43ca1209ebce963a0900ae7ff0e1e8475543e14"
SMALL = SynthesisConfig(seed=3, num_seeds=4, storylines_per_seed=2, prequels_per_storyline=3, world=WORLD,
                        facts_per_seed=2)


def _config(**kw) -> SynthesisConfig:
    base = dict(seed=1, num_seeds=1, storylines_per_seed=1, prequels_per_storyline=3, world=WORLD,
                heldout_fraction=0.0)
    return SynthesisConfig(**{**base, **kw})


def _data_seeds() -> list[SeedSpec]:
    """Two seeds that bring their own (first, real) session, as on msc / cc / gapchat."""
    return [SeedSpec("data:a", (), Session((Turn(U, "I love hiking with my dog Rex."), Turn(A, "Nice!"),
                                            Turn(U, "Any trail tips?"), Turn(A, "Sure.")))),
            SeedSpec("data:b", (), Session((Turn(U, "Work has been busy lately."), Turn(A, "Sorry to hear."))))]


def _digest(episodes: Sequence[Episode]) -> str:
    d = hashlib.sha256()
    for e in episodes:
        d.update(e.to_json().encode())
        d.update(b"\n")
    return d.hexdigest()


def _dialogue(session: Session) -> list[list[str]]:
    return [[t.speaker, t.text] for t in session.turns]


def _texts(sessions: Sequence[Session]) -> set[str]:
    return {t.text for s in sessions for t in s.turns}


def _writes(request: LLMRequest, P: int) -> int:
    """Index in time order of the session a writer request asks for."""
    md = request.metadata
    return {prompts.TASK_SYNTH_SEED: P, prompts.TASK_SYNTH_PREQUEL: P - 1 - md.get("prequel", 0),
            prompts.TASK_SYNTH_OPENING: 0}.get(request.task, md.get("session", -1))


def _shows_exactly(request: LLMRequest, shown: Sequence[Session], hidden: Sequence[Session]) -> bool:
    """Every turn of `shown` is in the prompt, no turn found only in `hidden` is."""
    return all(t in request.prompt for t in _texts(shown)) and \
        not any(t in request.prompt for t in _texts(hidden) - _texts(shown))


def test_forward_writes_sessions_in_time_order_backward_the_other_way():
    P = 3
    for direction in ("forward", "backward"):
        backend = FaultyBackend(lambda r: None)
        (ep,) = synthesize_episodes(_config(direction=direction), backend, make_seeds(_config())).episodes
        writers = [r for r in backend.seen if r.task in WRITERS]
        order = [_writes(r, P) for r in writers]
        annotations = [r.metadata["session"] for r in backend.seen if r.task == prompts.TASK_SYNTH_ANNOTATE]
        assert annotations == list(range(P + 1))  # annotated oldest first in both directions, after the writing
        assert backend.seen[len(writers)].task == prompts.TASK_SYNTH_ANNOTATE
        if direction == "forward":
            assert [r.task for r in writers] == [prompts.TASK_SYNTH_OPENING] + [prompts.TASK_SYNTH_SEQUEL] * P
            assert order == [0, 1, 2, 3]
            for s, r in zip(order, writers, strict=True):  # each sees exactly the sessions before it
                assert r.metadata.get("sessions", []) == [_dialogue(x) for x in ep.sessions[:s]]
                assert _shows_exactly(r, ep.sessions[:s], ep.sessions[s:])
                assert r.metadata["direction"] == "forward"
                if s:
                    assert f"session {s + 1} of {P + 1}" in r.prompt and r.json_schema == prompts.SYNTH_SEQUEL_SCHEMA
            assert [s.meta["role"] for s in ep.sessions] == ["seed"] + ["sequel"] * P
            assert ep.meta["seed_session"] == 0
        else:
            assert [r.task for r in writers] == [prompts.TASK_SYNTH_SEED] + [prompts.TASK_SYNTH_PREQUEL] * P
            assert order == [3, 2, 1, 0]
            for s, r in zip(order, writers, strict=True):  # each sees exactly the sessions after it
                assert _shows_exactly(r, ep.sessions[s + 1:], ep.sessions[:s + 1])
                assert "direction" not in r.metadata
            assert [s.meta["role"] for s in ep.sessions] == ["prequel"] * P + ["seed"]
            assert ep.meta["seed_session"] == P


def test_forward_from_data_seeds_starts_with_the_seed_session():
    backend = FaultyBackend(lambda r: None)
    config = _config(num_seeds=2, storylines_per_seed=2, prequels_per_storyline=2, direction="forward")
    result = synthesize_episodes(config, backend, _data_seeds())
    assert not [r for r in backend.seen if r.task in (prompts.TASK_SYNTH_OPENING, prompts.TASK_SYNTH_SEED)]
    assert len(result.episodes) == 4 and result.stats.requests == 4 * (2 * 2 + 1)
    seeds = {s.seed_id: s.session for s in _data_seeds()}
    for ep in result.episodes:
        assert ep.sessions[0].turns[0].text == seeds[ep.meta["seed_id"]].turns[0].text
    for r in backend.seen:
        if r.task == prompts.TASK_SYNTH_SEQUEL:  # every sequel is written after the real first session
            assert r.metadata["sessions"][0] == _dialogue(seeds[r.metadata["seed_id"]])


def test_forward_synthesis_gives_labelled_episodes_examples_and_a_manifest(tmp_path, monkeypatch):
    closed = []

    class Recorder(tqdm):
        def close(self):
            if not self.disable:
                closed.append((self.n, self.total))
            super().close()

    monkeypatch.setattr(storylines, "tqdm", Recorder)
    config = _config(seed=3, num_seeds=4, storylines_per_seed=2, prequels_per_storyline=3, facts_per_seed=2,
                     direction="forward")
    manifest = synthesize(config, OfflineBackend(), tmp_path)
    assert manifest["direction"] == "forward" and manifest["config"]["direction"] == "forward"
    assert manifest["requests"]["requests"] == 4 + 8 * (2 * 3 + 1) and closed == [(60, 60)]  # as backward
    data = load_expert_data(tmp_path)
    episodes = data.train_episodes
    assert len(episodes) == 8 and manifest["counts"]["storylines_accepted"] == 8
    queries = 0
    for ep in episodes:
        assert len(ep.sessions) == 4 and ep.sessions[0].gap_text is None
        assert all(s.gap_seconds and s.gap_seconds > 0 for s in ep.sessions[1:])
        key = StorylineKey(config.world, config.offline, ep.meta["seed_id"], tuple(ep.meta["facts"]),
                           ep.meta["storyline"], 3, "forward")
        plan = storyline_sessions(key)
        assert [_dialogue(s) for s in ep.sessions] == [_dialogue(s) for s in plan]
        assert [s.gap_text for s in ep.sessions] == [s.gap_text for s in plan]
        current: dict[str, str] = {}
        for si, (session, planned) in enumerate(zip(ep.sessions, plan, strict=True)):
            for turn, truth in zip(session.turns, planned.turns, strict=True):
                if turn.speaker != U:
                    assert turn.y_p is False and turn.y_t == ()
                    continue
                kind = truth.meta.get("kind")
                assert turn.y_p == (kind in ("fact", "update"))
                if kind == "query":  # needs the earlier turn that stated the current value
                    (ref,) = turn.y_t
                    fact_kind = truth.meta["fact_kind"]
                    assert ref.session < si and ep.turn(ref).y_p and current[fact_kind] in ep.turn(ref).text
                    queries += 1
                else:
                    assert turn.y_t == ()
            for t in planned.turns:
                if t.meta.get("kind") in ("fact", "update"):
                    current[t.meta["fact_kind"]] = split_fact(t.meta["fact"])[1]
        # the opening session states the seed's constraints
        assert all(f"{t.meta['fact']}" in ep.meta["facts"] for t in plan[0].turns if t.meta.get("kind") == "fact")
    assert queries > 0
    trigger = data.train_trigger
    assert trigger and any(x.target > 0 for x in trigger) and any(x.target == 0 for x in trigger)
    planner = planner_examples(episodes, user_speaker=U)
    assert planner and any(x.label for x in planner) and not all(x.label for x in planner)


def test_forward_drops_are_counted_and_the_bar_ends_full(tmp_path, monkeypatch):
    closed = []

    class Recorder(tqdm):
        def close(self):
            if not self.disable:
                closed.append((self.n, self.total))
            super().close()

    def fault(r: LLMRequest) -> str | None:
        md = r.metadata
        if md["seed_id"] == "seed-5-1" and r.task == prompts.TASK_SYNTH_OPENING:
            return "no JSON"  # the opening and both its storylines dropped
        if md["seed_id"] == "seed-5-0" and md["storyline"] == 0 and r.task == prompts.TASK_SYNTH_SEQUEL \
                and md["session"] == 2:
            return json.dumps({"gap_to_next": "3 days", "turns": [{"speaker": "user", "text": "hi"}]})
        return None

    monkeypatch.setattr(storylines, "tqdm", Recorder)
    config = _config(seed=5, num_seeds=3, storylines_per_seed=2, prequels_per_storyline=2, direction="forward")
    manifest = synthesize(config, FaultyBackend(fault), tmp_path)
    rej = {(r["seed_id"], r["stage"]): r for r in manifest["rejections"]}
    assert set(rej) == {("seed-5-1", "opening"), ("seed-5-0", "sequel_2")}
    assert "'gap_since_previous' must be a non-empty string" in rej[("seed-5-0", "sequel_2")]["errors"][0]
    assert manifest["counts"]["storylines_accepted"] == 3 and closed == [(3 + 6 * 5, 3 + 6 * 5)]


def test_direction_is_a_validated_config_field():
    assert default_config().direction == "backward" and SynthesisConfig().direction == "backward"
    cfg = default_config()
    cfg.direction = "forward"
    assert SynthesisConfig.from_config(cfg).direction == "forward"
    with pytest.raises(ValueError, match=r"SynthesisConfig\.direction must be one of .*'sideways'"):
        SynthesisConfig(direction="sideways")
    cfg.direction = "sideways"
    with pytest.raises(ValueError, match=r"SynthesisConfig\.direction"):
        SynthesisConfig.from_config(cfg)
    with pytest.raises(ValueError, match=r"StorylineKey\.direction"):
        StorylineKey(WORLD, SMALL.offline, "s", (), direction="up")


def test_backward_output_is_unchanged_and_forward_differs():
    class Recording(OfflineBackend):
        """The offline back end, hashing every request it is sent (task, system, prompt, metadata, knobs)."""

        def __init__(self) -> None:
            super().__init__()
            self.digest = hashlib.sha256()

        def generate(self, requests):
            for r in requests:
                self.digest.update(json.dumps([r.task, r.system, r.prompt, r.metadata, r.temperature,
                                               r.max_output_tokens], sort_keys=True).encode())
            return super().generate(requests)

    default = SynthesisConfig()
    assert _digest(synthesize_episodes(default, OfflineBackend(), make_seeds(default)).episodes) == \
        BACKWARD_DEFAULT_EPISODES
    backend = Recording()
    backward = synthesize_episodes(SMALL, backend, make_seeds(SMALL)).episodes
    assert _digest(backward) == BACKWARD_SMALL_EPISODES and backend.digest.hexdigest() == BACKWARD_SMALL_REQUESTS
    data_config = SynthesisConfig(seed=1, num_seeds=2, storylines_per_seed=2, prequels_per_storyline=2, world=WORLD)
    assert _digest(synthesize_episodes(data_config, OfflineBackend(), _data_seeds()).episodes) == \
        BACKWARD_DATA_EPISODES

    forward_config = SynthesisConfig(**{**SMALL.__dict__, "direction": "forward"})
    forward = synthesize_episodes(forward_config, OfflineBackend(), make_seeds(SMALL)).episodes
    assert [e.episode_id for e in forward] == [e.episode_id for e in backward]
    for f, b in zip(forward, backward, strict=True):
        assert [_dialogue(s) for s in f.sessions] != [_dialogue(s) for s in b.sessions]
    # backward plants a dependency on every seed fact in the final session; forward's are incidental
    assert all(sum(bool(t.y_t) for t in b.sessions[-1].turns) == 2 for b in backward)
    assert sum(bool(t.y_t) for f in forward for t in f.sessions[-1].turns) < 2 * len(forward)
