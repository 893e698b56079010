"""Retrospective Session Synthesis: consistent storylines, labels on real earlier turns, clean negatives,
re-asks and counted rejections, a reproducible manifest, and the same parse path through Gemini."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence

import pytest

from icml_jax.data import timegap
from icml_jax.data.persona_world import PersonaWorldConfig
from icml_jax.data.schema import Session, Turn, TurnRef
from icml_jax.llm import GeminiBackend, GeminiConfig, LLMRequest, LLMResponse, OfflineBackend, TokenUsage
from icml_jax.synthesis import (
    MalformedOutput,
    StorylineKey,
    SynthesisConfig,
    load_expert_data,
    prompts,
    storyline_sessions,
    synthesize,
)
from icml_jax.synthesis.offline_world import split_fact
from icml_jax.synthesis.parsing import parse_labels, parse_session
from icml_jax.synthesis.seeds import read_seeds_file
from tests.llm.conftest import fake_gemini, gemini_env  # noqa: F401 - pytest fixtures

WORLD = PersonaWorldConfig(seed=3, min_user_turns=3)
SMALL = SynthesisConfig(seed=3, num_seeds=6, world=WORLD, heldout_fraction=0.34, batch_size=8)


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """(manifest, data, config) of a small offline synthesis (6 seeds x 3 storylines x 4 prequels)."""
    out = tmp_path_factory.mktemp("synth")
    manifest = synthesize(SMALL, OfflineBackend(), out)
    return manifest, load_expert_data(out), SMALL


def _episodes(data):
    return data.train_episodes + data.heldout_episodes


def test_offline_storylines_are_consistent_and_labels_point_at_real_earlier_turns(offline_run):
    manifest, data, config = offline_run
    episodes = _episodes(data)
    assert len(episodes) == 18 and manifest["counts"]["storylines_accepted"] == 18
    by_seed: dict[str, list] = {}
    for ep in episodes:
        by_seed.setdefault(ep.meta["seed_id"], []).append(ep)
        assert len(ep.sessions) == config.prequels_per_storyline + 1
        assert [s.meta["role"] for s in ep.sessions] == ["prequel"] * 4 + ["seed"]
        assert ep.sessions[0].gap_text is None
        assert all(timegap.gap_seconds(s.gap_text) == s.gap_seconds > 0 for s in ep.sessions[1:])
        # What was parsed is exactly the storyline the offline writer planned (backwards, one prequel at a time).
        key = StorylineKey(config.world, config.offline, ep.meta["seed_id"], tuple(ep.meta["facts"]),
                           ep.meta["storyline"], config.prequels_per_storyline)
        plan = storyline_sessions(key)
        assert [[(t.speaker, t.text) for t in s.turns] for s in ep.sessions] == \
            [[(t.speaker, t.text) for t in s.turns] for s in plan]
        current: dict[str, str] = {}
        for si, (session, planned) in enumerate(zip(ep.sessions, plan, strict=True)):
            for ti, (turn, truth) in enumerate(zip(session.turns, planned.turns, strict=True)):
                kind = truth.meta.get("kind")
                if turn.speaker != WORLD.user_speaker:
                    assert turn.y_p is False and turn.y_t == ()
                    continue
                fact_kind = truth.meta.get("fact_kind")
                assert turn.y_p == (kind in ("fact", "update")), (ep.episode_id, si, ti, turn.text)
                if kind == "query":
                    # The needed turn is real, earlier (an earlier session), a memory (y_p), and states the value
                    # the reference reply uses: the latest one.
                    (ref,) = turn.y_t
                    needed = ep.turn(ref)
                    assert ref.session < si and needed.speaker == WORLD.user_speaker and needed.y_p
                    assert current[fact_kind] in needed.text
                    assert truth.gold_facts == (f"{fact_kind}: {current[fact_kind]}",)
                else:
                    assert turn.y_t == ()
            for t in planned.turns:
                if t.meta.get("kind") in ("fact", "update"):
                    current[t.meta["fact_kind"]] = split_fact(t.meta["fact"])[1]
        # Every seed query needs the seed's own constraint, at its final value.
        seed_queries = [t for t in ep.sessions[-1].turns if t.y_t]
        assert len(seed_queries) == len(ep.meta["facts"])
        for fact in ep.meta["facts"]:
            assert current[split_fact(fact)[0]] == split_fact(fact)[1]
    assert len(by_seed) == 6
    for seed_id, eps in by_seed.items():
        assert len(eps) == 3
        seeds = {tuple(t.text for t in e.sessions[-1].turns) for e in eps}
        prequels = {tuple(t.text for s in e.sessions[:-1] for t in s.turns) for e in eps}
        assert len(seeds) == 1, f"{seed_id}: storylines of one seed must share the seed session"
        assert len(prequels) == 3, f"{seed_id}: storylines must differ"


def test_manifest_records_seeds_backend_counts_and_files(offline_run, tmp_path):
    manifest, data, config = offline_run
    assert manifest["backend"] == {"name": "offline", "model": None}
    assert [s["seed_id"] for s in manifest["seeds"]] == [f"seed-3-{i}" for i in range(6)]
    split = manifest["split_seed_ids"]
    assert sorted(split["train"] + split["heldout"]) == sorted(s["seed_id"] for s in manifest["seeds"])
    assert len(split["heldout"]) == 2 and {e.meta["seed_id"] for e in data.heldout_episodes} == set(split["heldout"])
    c = manifest["counts"]
    assert (c["seeds"], c["storylines_requested"], c["storylines_rejected"], c["rejected_outputs"]) == (6, 18, 0, 0)
    assert c["train"]["episodes"] + c["heldout"]["episodes"] == 18
    assert c["train"]["trigger"]["examples"] == len(data.train_trigger)
    # 6 seed sessions + 18 x 4 prequels + 18 x 5 annotations, sent in batches of 8.
    assert manifest["requests"]["requests"] == 6 + 72 + 90 and manifest["requests"]["reasks"] == 0
    assert manifest["requests"]["calls"] == 1 + 4 * 3 + 5 * 3
    assert manifest["config"]["prequels_per_storyline"] == 4 and manifest["config"]["storylines_per_seed"] == 3
    assert {f: v["records"] for f, v in manifest["files"].items()} == {
        "episodes-train.array_record": len(data.train_episodes),
        "episodes-heldout.array_record": len(data.heldout_episodes),
        "trigger-train.array_record": len(data.train_trigger),
        "trigger-heldout.array_record": len(data.heldout_trigger)}
    # Reproducible: the same config and back end write the same records.
    again = synthesize(config, OfflineBackend(), tmp_path / "again")
    assert again["files"] == manifest["files"]
    other = synthesize(SynthesisConfig(**{**config.__dict__, "seed": 4}), OfflineBackend(), tmp_path / "other")
    assert other["files"]["episodes-train.array_record"] != manifest["files"]["episodes-train.array_record"]


def test_trigger_negatives_never_contain_the_positive(offline_run):
    _, data, config = offline_run
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    for split_eps, examples in ((data.train_episodes, data.train_trigger),
                                (data.heldout_episodes, data.heldout_trigger)):
        eps = {e.episode_id: e for e in split_eps}
        assert examples and any(x.target == 0 for x in examples) and any(x.target > 0 for x in examples)
        for x in examples:
            ep = eps[x.episode_id]
            assert x.utterance == ep.turn(x.query).text
            assert x.history == tuple((t.speaker, t.text) for t in ep.sessions[x.query.session].turns[:x.query.turn])
            positives = [c for c in x.candidates if c.source == "positive"]
            needs = set(ep.turn(x.query).y_t)
            if x.target == 0:
                assert not positives and not needs
            else:
                (pos,) = positives
                assert x.candidates[x.target - 1] is pos and pos.ref in needs and pos.episode_id == x.episode_id
                for c in x.candidates:
                    if c is pos:
                        continue
                    assert not (c.episode_id == x.episode_id and c.ref in needs)
                    assert norm(c.text) not in {norm(ep.turn(r).text) for r in needs}
            hard = [c for c in x.candidates if c.source == "hard"]
            soft = [c for c in x.candidates if c.source == "soft"]
            assert len(hard) <= config.hard_negatives and len(soft) <= config.soft_negatives
            for c in hard:
                assert c.episode_id == x.episode_id and ep.turn(c.ref).speaker == WORLD.user_speaker
                if positives:
                    assert c.ref.session == positives[0].ref.session
            for c in soft:  # memories of other seeds whose constraints are of other kinds
                other = eps[c.episode_id]
                assert other.meta["seed_id"] != ep.meta["seed_id"] and other.turn(c.ref).y_p
                kinds = lambda e: {f.split(":")[0] for f in e.meta["facts"]}  # noqa: E731
                assert not kinds(other) & kinds(ep)
                assert other.turn(c.ref).text == c.text


class FaultyBackend:
    """The offline back end, with synthesis answers replaced by `fault(request)` when it returns a string."""

    name = "faulty"

    def __init__(self, fault: Callable[[LLMRequest], str | None]) -> None:
        self.inner, self.fault, self.seen = OfflineBackend(), fault, []

    @property
    def usage(self) -> TokenUsage:
        return self.inner.usage

    def close(self) -> None:
        pass

    def generate(self, requests: Sequence[LLMRequest]) -> list[LLMResponse]:
        self.seen.extend(requests)
        out = []
        for r, resp in zip(requests, self.inner.generate(requests), strict=True):
            bad = self.fault(r) if r.task in prompts.SYNTHESIS_TASKS else None  # memory condensation: untouched
            if bad is None:
                out.append(resp)
            else:
                from icml_jax.llm import parse_json_text

                parsed, err = parse_json_text(bad)
                out.append(LLMResponse(text=bad, parsed=parsed, parse_error=err))
        return out


def test_malformed_output_is_reasked_then_skipped_and_counted(tmp_path):
    config = SynthesisConfig(seed=5, num_seeds=4, storylines_per_seed=2, prequels_per_storyline=3, world=WORLD,
                             heldout_fraction=0.0)

    def fault(r: LLMRequest) -> str | None:
        md, first = r.metadata, "attempt" not in r.metadata
        if md["seed_id"] == "seed-5-0" and r.task == prompts.TASK_SYNTH_PREQUEL and first:
            return "Sure! Here is the session you asked for."  # not JSON: re-asked, then fine
        if md["seed_id"] == "seed-5-1" and r.task == prompts.TASK_SYNTH_SEED:
            return json.dumps({"turns": [{"speaker": "narrator", "text": "Once upon a time"}]})  # always bad
        if md["seed_id"] == "seed-5-2" and md["storyline"] == 1 and r.task == prompts.TASK_SYNTH_ANNOTATE \
                and md["session"] == 2:
            return json.dumps({"labels": [{"turn": 0, "gain": 0.0, "needs": [{"session": 3, "turn": 0}]}]})
        return None

    backend = FaultyBackend(fault)
    manifest = synthesize(config, backend, tmp_path)
    c = manifest["counts"]
    assert c["storylines_requested"] == 8 and c["storylines_accepted"] == 5 and c["storylines_rejected"] == 3
    assert c["seeds_rejected"] == 1 and c["rejected_outputs"] == 2
    # seed-5-0: 2 storylines x 3 prequels answered badly once, each re-asked; seed-5-1: 1 re-ask; seed-5-2: 1.
    assert manifest["requests"]["reasks"] == 6 + 1 + 1
    assert manifest["counts"]["malformed_answers"] == 6 + 2 + 2
    rej = {(r["seed_id"], r["storyline"]): r for r in manifest["rejections"]}
    assert set(rej) == {("seed-5-1", None), ("seed-5-2", 1)}
    assert rej[("seed-5-1", None)]["stage"] == "seed" and rej[("seed-5-1", None)]["attempts"] == 2
    assert "speaker must be 'user' or 'assistant'" in rej[("seed-5-1", None)]["errors"][0]
    assert rej[("seed-5-2", 1)]["stage"] == "annotate_2" and "not a turn shown" in rej[("seed-5-2", 1)]["errors"][-1]
    assert "narrator" in rej[("seed-5-1", None)]["raw"]
    # A re-ask says what was wrong.
    retried = [r for r in backend.seen if r.metadata.get("attempt") == 2 and r.metadata["seed_id"] == "seed-5-0"]
    assert len(retried) == 6 and all("could not be used (not JSON" in r.prompt for r in retried)
    ids = {e.episode_id for e in load_expert_data(tmp_path).train_episodes}
    assert ids == {"seed-5-0/story0", "seed-5-0/story1", "seed-5-2/story0", "seed-5-3/story0", "seed-5-3/story1"}


def test_prompts_show_everything_already_written():
    config = SynthesisConfig(seed=1, num_seeds=1, storylines_per_seed=1, prequels_per_storyline=3, world=WORLD,
                             heldout_fraction=0.0)
    backend = FaultyBackend(lambda r: None)
    from icml_jax.synthesis import make_seeds, synthesize_episodes

    (ep,) = synthesize_episodes(config, backend, make_seeds(config)).episodes
    prequels = [r for r in backend.seen if r.task == prompts.TASK_SYNTH_PREQUEL]
    annotations = [r for r in backend.seen if r.task == prompts.TASK_SYNTH_ANNOTATE]
    assert [r.metadata["prequel"] for r in prequels] == [0, 1, 2]
    for k, r in enumerate(prequels):  # written backwards: the k-th prequel sees the seed and the k newer prequels
        later = ep.sessions[3 - k:]
        assert all(t.text in r.prompt for s in later for t in s.turns)
        assert not any(t.text in r.prompt for s in ep.sessions[:3 - k] for t in s.turns if t.text not in
                       {u.text for s2 in later for u in s2.turns})
        assert f"prequel {k + 1} of 3" in r.prompt and r.json_schema == prompts.SYNTH_PREQUEL_SCHEMA
    for s, r in enumerate(annotations):  # walked forwards: session s sees sessions 0..s, with turn ids
        assert r.metadata["session"] == s and r.temperature == 0.0
        assert f"[{s}.0] " in r.prompt and f"[{s + 1}.0] " not in r.prompt


def test_parsers_reject_unusable_answers():
    def resp(obj) -> LLMResponse:
        text = obj if isinstance(obj, str) else json.dumps(obj)
        from icml_jax.llm import parse_json_text

        parsed, err = parse_json_text(text)
        return LLMResponse(text=text, parsed=parsed, parse_error=err)

    kw = dict(user_speaker="user", assistant_speaker="assistant", max_turns=4, want_gap=True)
    ok = parse_session(resp({"gap_to_next": "3 days", "turns": [{"speaker": "User", "text": " hi "},
                                                                {"speaker": "assistant", "text": "hello"}]}), **kw)
    assert ok.gap_to_next == "3 days" and [(t.speaker, t.text) for t in ok.session.turns] == [
        ("user", "hi"), ("assistant", "hello")]
    bad = {
        "no JSON here": "not JSON",
        json.dumps([1]): "expected a JSON object",
        json.dumps({"gap_to_next": "1 day", "turns": []}): "non-empty list",
        json.dumps({"gap_to_next": "1 day", "turns": [{"speaker": "user", "text": ""}]}): "non-empty string",
        json.dumps({"gap_to_next": "1 day", "turns": [{"speaker": "assistant", "text": "x"}]}): "no user turn",
        json.dumps({"turns": [{"speaker": "user", "text": "x"}]}): "gap_to_next",
        json.dumps({"gap_to_next": "1 day", "turns": [{"speaker": "user", "text": "x"}] * 5}): "more than max",
        # issue 31: a lone surrogate (a JSON escape in the answer) is a malformed answer, not a later crash
        json.dumps({"gap_to_next": "1 day", "turns": [{"speaker": "user", "text": "a\ud800"}]}):
            r"written session: turns\[0\].text holds a lone surrogate U\+D800 .* at character 1",
        json.dumps({"gap_to_next": "\udc80", "turns": [{"speaker": "user", "text": "x"}]}):
            r"written session: 'gap_to_next' is not valid UTF-8",
    }
    for text, why in bad.items():
        with pytest.raises(MalformedOutput, match=why):
            parse_session(resp(text), **kw)

    s0 = Session((Turn("user", "I am vegan."), Turn("assistant", "Noted.")))
    s1 = Session((Turn("user", "Dinner ideas?"), Turn("assistant", "Sure."), Turn("user", "Thanks")))
    good = {"labels": [{"turn": 0, "gain": 0.1, "needs": [{"session": 0, "turn": 0}]},
                       {"turn": 1, "gain": 0.0, "needs": []},  # an assistant turn: ignored
                       {"turn": 2, "gain": 0, "needs": [{"session": 1, "turn": 0}]}]}
    labels = parse_labels(resp(good), [s0, s1], 1, user_speaker="user")
    assert labels[0].needs == (TurnRef(0, 0),) and labels[2].needs == (TurnRef(1, 0),) and set(labels) == {0, 2}
    bad_labels = {
        "have no label": {"labels": [good["labels"][0]]},
        "labelled twice": {"labels": good["labels"] + [good["labels"][0]]},
        "not earlier": {"labels": [good["labels"][0], {"turn": 2, "gain": 0, "needs": [{"session": 1, "turn": 2}]}]},
        "not a turn shown": {"labels": [{"turn": 0, "gain": 0, "needs": [{"session": 0, "turn": 9}]},
                                        good["labels"][2]]},
        "gain must be": {"labels": [{"turn": 0, "gain": 1.5, "needs": []}, good["labels"][2]]},
        "must be an integer": {"labels": [{"turn": "0", "gain": 1, "needs": []}, good["labels"][2]]},
    }
    for why, obj in bad_labels.items():
        with pytest.raises(MalformedOutput, match=why):
            parse_labels(resp(obj), [s0, s1], 1, user_speaker="user")


def test_seeds_file_sessions_skip_the_seed_request_and_bad_lines_name_the_line(tmp_path):
    path = tmp_path / "seeds.jsonl"
    session = Session((Turn("user", "What should I cook tonight?"), Turn("assistant", "Let me think.")))
    path.write_text(json.dumps({"seed_id": "mine", "facts": ["diet: vegan"], "session": session.to_dict()}) + "\n"
                    + json.dumps({"seed_id": "drawn", "facts": ["pet: two rabbits"]}) + "\n")
    config = SynthesisConfig(num_seeds=5, storylines_per_seed=1, prequels_per_storyline=2, world=WORLD,
                             seeds_file=str(path), heldout_fraction=0.0)
    backend = FaultyBackend(lambda r: None)
    manifest = synthesize(config, backend, tmp_path / "out")
    assert [r.metadata["seed_id"] for r in backend.seen if r.task == prompts.TASK_SYNTH_SEED] == ["drawn"]
    eps = {e.episode_id: e for e in load_expert_data(tmp_path / "out").train_episodes}
    assert [t.text for t in eps["mine/story0"].sessions[-1].turns] == [t.text for t in session.turns]
    assert manifest["counts"]["storylines_accepted"] == 2
    path.write_text(json.dumps({"seed_id": "a", "facts": ["x: y"]}) + "\n" + '{"seed_id": 3}\n')
    with pytest.raises(ValueError, match=r"seeds.jsonl:2: bad seed record"):
        read_seeds_file(path)


def test_gemini_back_end_runs_the_same_parse_path(fake_gemini, gemini_env, tmp_path):  # noqa: F811
    """Real google-genai client on a loopback server: structured-output requests, a re-ask, parsed episodes."""
    seen_first = {"done": False}

    def responder(body):
        prompt = body["contents"][0]["parts"][0]["text"] if isinstance(body["contents"], list) else str(body)
        if "Write one conversation session" in prompt:
            turns = [{"speaker": "user", "text": "Any dinner ideas for tonight?"},
                     {"speaker": "assistant", "text": "How about a lentil curry?"}]
            return fake_gemini.ok(json.dumps({"turns": turns}))
        if "Write the session that took place just BEFORE" in prompt:
            if not seen_first["done"]:
                seen_first["done"] = True
                return fake_gemini.ok("```json\n{\"turns\": [ oops")  # malformed: re-asked
            turns = [{"speaker": "user", "text": "I decided to go vegan this week."},
                     {"speaker": "assistant", "text": "That's a big step!"}]
            return fake_gemini.ok(json.dumps({"gap_to_next": "2 weeks", "turns": turns}))
        if "Write one short note" in prompt:  # the expert memory's condensation, as online
            return fake_gemini.ok("The user has gone vegan.")
        if "Current session:\nSession 0" in prompt:
            return fake_gemini.ok(json.dumps({"labels": [{"turn": 0, "gain": 0.9, "needs": []}]}))
        return fake_gemini.ok(json.dumps({"labels": [{"turn": 0, "gain": 0.0,
                                                      "needs": [{"session": 0, "turn": 0}]}]}))

    fake_gemini.responder = responder
    backend = GeminiBackend(GeminiConfig(model="gemini-test", base_url=fake_gemini.base_url, timeout_s=5.0,
                                         max_concurrency=1, max_attempts=2, initial_backoff_s=0.001, jitter=0.0),
                            rng=random.Random(0))
    config = SynthesisConfig(num_seeds=1, storylines_per_seed=1, prequels_per_storyline=1, world=WORLD,
                             heldout_fraction=0.0)
    try:
        manifest = synthesize(config, backend, tmp_path)
    finally:
        backend.close()
    assert manifest["backend"] == {"name": "gemini", "model": "gemini-test"}
    assert manifest["requests"]["reasks"] == 1 and manifest["counts"]["storylines_accepted"] == 1
    (ep,) = load_expert_data(tmp_path).train_episodes
    assert ep.sessions[1].gap_text == "2 weeks" and ep.sessions[1].gap_seconds == 14 * 86400
    assert ep.sessions[0].turns[0].y_p is True and ep.sessions[1].turns[0].y_t == (TurnRef(0, 0),)
    structured = [r for r in fake_gemini.requests if "Write one short note" not in str(r["body"])]
    assert all("responseJsonSchema" in r["body"].get("generationConfig", {}) for r in structured)
    assert fake_gemini.hits == 1 + 2 + 2 + 1  # seed, prequel (re-asked), 2 annotations, 1 memory condensed
    (example,) = load_expert_data(tmp_path).train_trigger
    assert [c.text for c in example.candidates] == ["The user has gone vegan."]
