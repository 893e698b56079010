"""Episode schema: exact JSON round trips, strict parsing, y_t validation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icml_jax.data.schema import Episode, SchemaError, Session, Turn, TurnRef

_text = st.text(max_size=20)
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), _text)
_meta = st.dictionaries(st.text(min_size=1, max_size=5), st.one_of(_json_leaf, st.lists(_json_leaf, max_size=3)), max_size=3)


@st.composite
def episodes(draw: st.DrawFn) -> Episode:
    """Random episodes whose y_t always points at an earlier turn."""
    sessions = []
    n_sessions = draw(st.integers(0, 3))
    for s in range(n_sessions):
        turns = []
        for t in range(draw(st.integers(0, 4))):
            earlier = [TurnRef(i, j) for i, sess in enumerate(sessions) for j in range(len(sess.turns))]
            earlier += [TurnRef(s, j) for j in range(t)]
            y_t = draw(st.one_of(st.none(), st.lists(st.sampled_from(earlier), max_size=2).map(tuple))) if earlier else draw(st.sampled_from([None, ()]))
            turns.append(
                Turn(
                    speaker=draw(_text),
                    text=draw(_text),
                    y_p=draw(st.one_of(st.none(), st.booleans())),
                    y_t=y_t,
                    gold_facts=draw(st.one_of(st.none(), st.lists(_text, max_size=2).map(tuple))),
                    meta=draw(_meta),
                )
            )
        sessions.append(
            Session(
                turns=tuple(turns),
                gap_seconds=draw(st.one_of(st.none(), st.floats(0, 1e9, allow_nan=False))),
                gap_text=draw(st.one_of(st.none(), _text)),
                summary=draw(st.one_of(st.none(), _text)),
                meta=draw(_meta),
            )
        )
    return Episode(
        dataset=draw(st.sampled_from(["msc", "cc", "gapchat", "persona_world"])),
        episode_id=draw(_text),
        sessions=tuple(sessions),
        relationship=draw(st.one_of(st.none(), _text)),
        personas=draw(st.dictionaries(_text, st.lists(_text, max_size=2).map(tuple), max_size=2)),
        meta=draw(_meta),
    )


@settings(max_examples=60, deadline=None)
@given(episodes())
def test_json_round_trip_is_exact(ep: Episode) -> None:
    """from_json(to_json(e)) == e, and serialisation is deterministic."""
    s = ep.to_json()
    back = Episode.from_json(s)
    assert back == ep
    assert back.to_json() == s
    assert Episode.from_json(s.encode("utf-8")) == ep
    ep.validate()


def test_to_dict_leaves_out_unset_fields() -> None:
    """Unlabelled turns stay small: no y_p/y_t/gold_facts/meta keys."""
    d = Turn("a", "hi").to_dict()
    assert d == {"speaker": "a", "text": "hi"}
    assert Turn.from_dict(d) == Turn("a", "hi")


def test_empty_y_t_differs_from_unlabelled() -> None:
    """y_t=() means "needs nothing", None means "no label"; both survive the round trip."""
    for y_t in (None, ()):
        ep = Episode("x", "e", (Session((Turn("a", "b", y_t=y_t),)),))
        assert Episode.from_json(ep.to_json()).sessions[0].turns[0].y_t == y_t


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("sessions"), "lacks"),
        (lambda d: d.update(bogus=1), "unknown keys"),
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d["sessions"][0]["turns"][0].update(y_p="yes"), "y_p"),
        (lambda d: d["sessions"][0]["turns"][0].update(text=3), "turn.text"),
        (lambda d: d["sessions"][0]["turns"][0].update(y_t=[[0]]), "y_t"),
        (lambda d: d["sessions"][0].update(gap_seconds="5 days"), "gap_seconds"),
        # issue 31: text that is not valid Unicode (a JSON escape of a lone surrogate) names the field and offset
        (lambda d: d["sessions"][0]["turns"][0].update(text="ok\ud800"), r"episode: turn.text holds a lone "
                                                                          r"surrogate U\+D800 .* at character 2"),
        (lambda d: d["sessions"][0]["turns"][0].update(speaker="\udcff"), r"turn.speaker is not valid UTF-8"),
    ],
)
def test_from_dict_rejects_bad_fields(mutate, message: str) -> None:
    """Strict parsing names the bad field."""
    d = Episode("x", "e", (Session((Turn("a", "b"),)),)).to_dict()
    mutate(d)
    with pytest.raises(SchemaError, match=message):
        Episode.from_dict(json.loads(json.dumps(d)))


def test_validate_rejects_forward_and_dangling_refs() -> None:
    """y_t must point at an existing, earlier turn."""
    ok = Turn("a", "x")
    fwd = Episode("x", "e", (Session((Turn("a", "y", y_t=(TurnRef(0, 1),)), ok)),))
    with pytest.raises(SchemaError, match="not earlier"):
        fwd.validate()
    dangling = Episode("x", "e", (Session((ok, Turn("a", "y", y_t=(TurnRef(3, 0),)))),))
    with pytest.raises(SchemaError, match="does not exist"):
        dangling.validate()


def test_episodes_are_hashable_and_turn_lookup_works() -> None:
    """Frozen dataclasses: usable as dict keys; turn() follows a TurnRef."""
    ep = Episode("x", "e", (Session((Turn("a", "x"), Turn("b", "y"))),), meta={"k": [1]})
    assert {ep: 1}[ep] == 1
    assert ep.turn(TurnRef(0, 1)).text == "y"
    assert ep.num_turns == 2
