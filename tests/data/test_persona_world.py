"""Offline persona world: deterministic per seed, complete and consistent labels, knobs that work."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml_jax.data.labels import need_labels, planner_precision_recall, precision_recall, save_labels, trigger_recall
from icml_jax.data.persona_world import (
    FACT_KINDS,
    PersonaWorldConfig,
    PersonaWorldSource,
    default_config,
    generate_episode,
    generate_episodes,
)
from icml_jax.data.schema import Episode, TurnRef


def test_deterministic_per_seed_and_index() -> None:
    """Same (seed, index) -> identical episode, however many others were generated; other seeds differ."""
    cfg = PersonaWorldConfig(seed=3)
    a = generate_episodes(cfg, 6)
    b = generate_episodes(cfg, 6)
    assert a == b and [e.to_json() for e in a] == [e.to_json() for e in b]
    assert generate_episode(cfg, 4) == a[4] == PersonaWorldSource(cfg, 2, start_index=4)[0]
    other = generate_episodes(dataclasses.replace(cfg, seed=4), 6)
    assert [e.to_json() for e in other] != [e.to_json() for e in a]
    assert len({e.to_json() for e in a}) == 6


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_sessions=st.integers(2, 6),
    facts=st.integers(1, 7),
    updates=st.integers(0, 3),
    noise=st.sampled_from([0.0, 0.3, 0.5, 0.8]),
)
def test_labels_are_complete_and_consistent(seed: int, num_sessions: int, facts: int, updates: int, noise: float) -> None:
    """Every turn is labelled; queries need the latest earlier statement of their fact; updates win."""
    cfg = PersonaWorldConfig(seed=seed, num_sessions=num_sessions, facts_per_episode=facts, num_updates=updates, noise_ratio=noise)
    ep = generate_episode(cfg, 0).validate()
    assert Episode.from_json(ep.to_json()) == ep
    assert len(ep.sessions) == num_sessions
    assert ep.sessions[0].gap_seconds is None and all(s.gap_seconds > 0 for s in ep.sessions[1:])
    for s, session in enumerate(ep.sessions):
        for t, turn in enumerate(session.turns):
            assert turn.y_p is not None and turn.y_t is not None
            kind = turn.meta["kind"]
            assert turn.y_p == (kind in ("fact", "update"))
            if kind != "query":
                assert turn.y_t == () and turn.gold_facts is None
                continue
            (need,) = turn.y_t
            assert need.session < s
            source = ep.turn(need)
            assert source.meta["kind"] in ("fact", "update") and source.y_p
            assert turn.gold_facts == (source.meta["fact"],)
            # No statement of the same fact kind between the needed turn and this query's session.
            later = [
                r for r in ep.meta["facts"]
                if r["kind"] == turn.meta["fact_kind"] and (need.session, need.turn) < (r["session"], r["turn"]) and r["session"] < s
            ]
            assert later == []
            for stale in turn.meta.get("stale_facts", []):
                assert stale != turn.gold_facts[0] and stale.split(": ")[0] == turn.meta["fact_kind"]
    final_facts = {r["fact"] for r in ep.meta["facts"] if r["superseded_by"] is None}
    assert set(ep.personas["user"]) == final_facts


def test_updates_overwrite_and_later_queries_need_the_new_fact() -> None:
    """Across many episodes, some queries follow an update: they need the update turn, not the old fact."""
    checked = 0
    for ep in generate_episodes(PersonaWorldConfig(seed=0, num_updates=3), 40):
        for ref, needs in need_labels(ep).items():
            turn = ep.turn(ref)
            if "stale_facts" in turn.meta:
                source = ep.turn(needs[0])
                assert source.meta["kind"] == "update"
                assert source.meta["supersedes"] in turn.meta["stale_facts"]
                assert turn.gold_facts[0].split(": ", 1)[1] in ep.turn(TurnRef(ref.session, ref.turn + 1)).text
                checked += 1
    assert checked >= 10


def test_final_session_has_queries_and_all_fact_kinds_appear() -> None:
    """The eval target session always asks something; all seven kinds show up across episodes."""
    eps = generate_episodes(PersonaWorldConfig(seed=1), 30)
    assert all(any(t.meta["kind"] == "query" for t in e.sessions[-1].turns) for e in eps)
    assert {r["kind"] for e in eps for r in e.meta["facts"]} == set(FACT_KINDS)


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.75])
def test_noise_ratio_knob(ratio: float) -> None:
    """The share of noise among user turns follows noise_ratio (exactly 0 when it is 0)."""
    cfg = PersonaWorldConfig(seed=2, noise_ratio=ratio, min_user_turns=0)
    user = [t for e in generate_episodes(cfg, 30) for s in e.sessions for t in s.turns if t.speaker == "user"]
    share = sum(t.meta["kind"] == "noise" for t in user) / len(user)
    assert share == pytest.approx(ratio, abs=0.08)
    kinds = {t.meta.get("noise_kind") for t in user if t.meta["kind"] == "noise"}
    assert kinds == (set() if ratio == 0 else {"weather", "mood", "deadline"})


def test_size_and_vocabulary_knobs_from_a_configdict() -> None:
    """Sizes, vocabulary, kinds and speakers come from an ml_collections config."""
    cfg = default_config()
    cfg.num_sessions = 3
    cfg.fact_kinds = ["diet", "pet"]
    cfg.vocabulary = {"diet": ["raw-food", "fruitarian"]}
    cfg.values_per_kind = 2
    cfg.assistant_turns = False
    cfg.user_speaker = "Alice"
    cfg.noise_vocabulary = {"weather": ["Snow again."]}
    pw = PersonaWorldConfig.from_config(cfg)
    eps = generate_episodes(pw, 20)
    assert all(len(e.sessions) == 3 for e in eps)
    values = {(r["kind"], r["value"]) for e in eps for r in e.meta["facts"]}
    assert {k for k, _ in values} == {"diet", "pet"}
    assert {v for k, v in values if k == "diet"} <= {"raw-food", "fruitarian"}
    assert {v for k, v in values if k == "pet"} <= set(pw.values("pet")) and len(pw.values("pet")) == 2
    assert {t.speaker for e in eps for s in e.sessions for t in s.turns} == {"Alice"}
    weather = {t.text for e in eps for s in e.sessions for t in s.turns if t.meta.get("noise_kind") == "weather"}
    assert weather == {"Snow again."}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_sessions=1), "num_sessions"),
        (dict(noise_ratio=1.0), "noise_ratio"),
        (dict(fact_kinds=("diet", "hobby")), "fact_kinds"),
        (dict(vocabulary={"diet": ["vegan"]}), "at least 2 values"),
    ],
)
def test_bad_knobs_are_rejected(kwargs, message: str) -> None:
    """Knob values that cannot make a labelled episode fail early."""
    with pytest.raises(ValueError, match=message):
        PersonaWorldConfig(**kwargs)


def test_labels_measure_precision_and_recall() -> None:
    """An oracle planner/trigger scores 1.0; saving everything has full recall but low precision."""
    ep = generate_episode(PersonaWorldConfig(seed=9), 0)
    gold = {r for r, y in save_labels(ep).items() if y}
    assert planner_precision_recall(ep, gold) == (1.0, 1.0)
    p, r = planner_precision_recall(ep, save_labels(ep, speaker="user"))
    assert r == 1.0 and p < 0.6
    assert trigger_recall(ep, need_labels(ep)) == 1.0
    assert trigger_recall(ep, {}) == 0.0
    assert precision_recall([], []) == (1.0, 1.0)
    assert precision_recall([TurnRef(0, 0)], [TurnRef(0, 0), TurnRef(0, 1)]) == (1.0, 0.5)


def test_source_is_grain_ready() -> None:
    """PersonaWorldSource has len/getitem, bounds-checks, and pickles (for Grain worker processes)."""
    import pickle

    src = PersonaWorldSource(PersonaWorldConfig(seed=1), 5)
    assert len(src) == 5 and list(src) == generate_episodes(PersonaWorldConfig(seed=1), 5)
    assert pickle.loads(pickle.dumps(src))[3] == src[3]
    with pytest.raises(IndexError):
        src[5]


def test_restatements_say_a_known_fact_again_with_its_current_value():
    """restatements > 0: later turns state an already-known fact again (y_p False, nothing new); queries keep
    needing the first statement or the update; worlds without restatements have no such turn."""
    base = PersonaWorldConfig(seed=4, restatements=0)
    assert not [t for e in generate_episodes(base, 20) for s in e.sessions for t in s.turns
                if t.meta.get("kind") == "restate"]
    with pytest.raises(ValueError, match="restatements"):
        PersonaWorldConfig(restatements=-1)
    world = dataclasses.replace(base, restatements=2)
    found = 0
    for ep in generate_episodes(world, 20):
        current: dict[str, str] = {}
        for s, session in enumerate(ep.sessions):
            for t, turn in enumerate(session.turns):
                kind = turn.meta.get("kind")
                if kind == "restate":
                    found += 1
                    fact_kind, value = turn.meta["fact"].split(": ", 1)
                    assert turn.y_p is False and turn.y_t == () and current[fact_kind] == value
                    assert value in turn.text
                for need in turn.y_t or ():
                    assert ep.turn(need).meta["kind"] in ("fact", "update")
            for turn in session.turns:  # values become current after their session
                if turn.meta.get("kind") in ("fact", "update"):
                    current[turn.meta["fact_kind"]] = turn.meta["fact"].split(": ", 1)[1]
    assert found >= 20
