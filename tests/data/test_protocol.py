"""Evaluation protocol: seeded 50-episode choice, THEANINE's ids, final-session targets, GapChat pooling."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from icml_jax.data.protocol import (
    NUM_EVAL_EPISODES,
    Target,
    compare_with_theanine_prefixes,
    eval_targets,
    final_session_targets,
    gapchat_eval_pool,
    load_theanine_ids,
    natural_key,
    select_by_ids,
    select_eval_episodes,
    shared_data_dir,
    target_context,
    theanine_selection,
)
from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.data.sources import parse_gapchat


def _toy(eid: str, sizes=(2, 3)) -> Episode:
    return Episode(
        "toy",
        eid,
        tuple(Session(tuple(Turn("AB"[t % 2], f"{eid}/{s}/{t}") for t in range(n))) for s, n in enumerate(sizes)),
    )


def test_shared_data_dir_is_beside_the_repo(shared_data: Path) -> None:
    """The package finds ../shared/data relative to the repository, like the tests do."""
    assert shared_data_dir() == shared_data


def test_seeded_selection_is_fixed_and_order_independent() -> None:
    """Same seed, same 50 ids whatever the storage order; another seed, another choice."""
    eps = [_toy(f"ep-{i}") for i in range(120)]
    a = select_eval_episodes(eps)
    shuffled = eps[:]
    random.Random(1).shuffle(shuffled)
    b = select_eval_episodes(shuffled)
    assert len(a) == NUM_EVAL_EPISODES and len({e.episode_id for e in a}) == NUM_EVAL_EPISODES
    assert [e.episode_id for e in a] == [e.episode_id for e in b]
    assert [e.episode_id for e in select_eval_episodes(eps, seed=1)] != [e.episode_id for e in a]
    with pytest.raises(ValueError, match="only 10"):
        select_eval_episodes(eps[:10])
    assert natural_key("ep-2") < natural_key("ep-10")


def test_theanine_ids_and_selection(shared_data: Path) -> None:
    """THEANINE's 50 evaluated MSC and CC ids load; selection keeps their order; missing ids are named."""
    msc_ids = load_theanine_ids(shared_data / "msc/theanine_eval_ids.json")
    cc_ids = load_theanine_ids(shared_data / "cc/theanine_eval_ids.json")
    assert len(msc_ids) == 50 and msc_ids[0] == "msc-episode-40"
    assert len(cc_ids) == 50 and cc_ids[0] == "episode-12727"
    assert len(load_theanine_ids(shared_data / "msc/theanine_eval_ids.json", "sampled_200")) == 200
    pool = [_toy(i) for i in reversed(msc_ids)] + [_toy("msc-episode-99999")]
    assert [e.episode_id for e in theanine_selection("msc", pool, shared_data)] == msc_ids
    with pytest.raises(KeyError, match="1 of 2 requested episodes are missing"):
        select_by_ids(pool, [msc_ids[0], "msc-episode-nope"])
    with pytest.raises(ValueError, match="'msc' and 'cc' only"):
        theanine_selection("gapchat", pool, shared_data)


def test_final_session_targets_are_turns_from_1() -> None:
    """Targets: every turn t >= 1 of the last session, with its speaker; context is the gold prefix."""
    ep = _toy("e", (2, 4))
    ts = final_session_targets(ep)
    assert [(t.session, t.turn, t.speaker) for t in ts] == [(1, 1, "B"), (1, 2, "A"), (1, 3, "B")]
    assert ts[0] == Target("e", 1, 1, "B", "e/1/1")
    history, prefix = target_context(ep, ts[1])
    assert history == ep.sessions[:1] and [t.text for t in prefix] == ["e/1/0", "e/1/1"]
    assert len(eval_targets([ep, _toy("f", (3,))])) == 3 + 2


@pytest.mark.parametrize("dataset, n_targets", [("msc", 541), ("cc", 594)])
def test_target_rule_reproduces_theanine_counts(shared_data: Path, dataset: str, n_targets: int) -> None:
    """Our target rule on THEANINE's session-5 shapes gives its 541 MSC and 594 CC targets, turn for turn."""
    path = shared_data / dataset / "theanine_eval_session5_prefixes.jsonl"
    eps = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        turns = [Turn(s, t) for s, t in zip(rec["fifth_session_speakers_prefix"], rec["fifth_session_dialogue_prefix"])]
        turns.append(Turn(rec["target_speakers"][-1], "<last utterance not in the source>"))
        eps.append(Episode(dataset, rec["dataID"], (Session((Turn("x", "earlier"),)),) * 4 + (Session(tuple(turns)),)))
    assert len(eval_targets(eps)) == n_targets
    assert compare_with_theanine_prefixes(eps, path) == []
    first = eps[0]
    bad = Episode(dataset, first.episode_id, first.sessions[:4] + (Session(first.sessions[4].turns[::-1]),))
    problems = compare_with_theanine_prefixes([bad] + eps[1:], path)
    assert problems == [f"{first.episode_id}: final-session text or speakers differ (prefixes line 1)"]


def test_gapchat_pool_of_real_samples(shared_data: Path) -> None:
    """GapChat pools 4- and 5-session test episodes (20 + 40 here), picks 50, targets each last session."""
    pool = gapchat_eval_pool(
        parse_gapchat(shared_data / "gapchat/test/4_session.first20.json"),
        parse_gapchat(shared_data / "gapchat/test/5_session.json"),
    )
    assert len(pool) == 60
    chosen = select_eval_episodes(pool)
    assert len(chosen) == 50
    assert {e.episode_id.rsplit("-", 1)[0] for e in chosen} == {"gapchat-test-4", "gapchat-test-5"}
    targets = eval_targets(chosen)
    assert len(targets) == sum(len(e.sessions[-1].turns) - 1 for e in chosen)
    assert all(t.session == len(next(e for e in chosen if e.episode_id == t.episode_id).sessions) - 1 for t in targets)
    with pytest.raises(ValueError, match="collide"):
        gapchat_eval_pool(pool[:2], pool[:1])


def test_load_eval_episodes_from_built_datasets(tmp_path: Path, shared_data: Path) -> None:
    """End to end: build the real samples, then get the protocol's episodes from the TFDS splits."""
    from icml_jax.data import tfds_builders as tb
    from icml_jax.data.protocol import load_eval_episodes

    tb.build("gapchat_episodes/sample", manual_dir=shared_data / "gapchat", data_dir=tmp_path)
    chosen = load_eval_episodes("gapchat", data_dir=tmp_path, builder="gapchat_episodes/sample")
    pool = gapchat_eval_pool(
        parse_gapchat(shared_data / "gapchat/test/4_session.first20.json"),
        parse_gapchat(shared_data / "gapchat/test/5_session.json"),
    )
    assert chosen == select_eval_episodes(pool)  # TFDS storage order does not change the choice
    tb.build("msc_episodes/theanine_sample", manual_dir=shared_data / "msc", data_dir=tmp_path)
    with pytest.raises(KeyError, match="50 of 50 requested episodes are missing"):
        load_eval_episodes("msc", data_dir=tmp_path, builder="msc_episodes/theanine_sample", selection="theanine", ids_dir=shared_data)
    (only,) = load_eval_episodes("msc", data_dir=tmp_path, builder="msc_episodes/theanine_sample", n=1)
    assert only.episode_id == "msc-episode-30"
