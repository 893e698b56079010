"""observation.prefilter: the embedding prefilter picks the nearest memories by cosine, caches memory embeddings,
respects max_candidates and planner_memories, applies to the warm-up's Planner examples; bm25 stays bit-identical."""

from __future__ import annotations

import numpy as np
import pytest

from icml_jax.agents import AgentConfig, MemoryAgent, ObservationConfig
from icml_jax.agents import observation as obs
from icml_jax.agents.prefilter import (EmbeddingPrefilter, LexicalPrefilter, encoder_directory, memory_document,
                                       prefilter_for)
from icml_jax.data.schema import Episode, Session, Turn
from icml_jax.llm import OfflineBackend
from icml_jax.memory import MemoryStore, NewFragment, most_similar
from icml_jax.synthesis.examples import planner_examples

MEMORIES = ["i like my dog", "my cat is warm", "we went to the park on sunday", "your sister is a doctor",
            "no meat please", "remember that allergy peanuts", "weather rain cold", "plan trip paris next month",
            "job work office teacher", "pasta rice fish for dinner"]
QUERIES = ["what do we eat tonight", "how is my dog", "the trip next month", "hello how are you"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from tests.models import bert_fixtures

    directory = tmp_path_factory.mktemp("prefilter") / "bert"
    bert_fixtures.build(directory, seed=7)
    return directory


@pytest.fixture(scope="module")
def encoder(bert_dir):
    from icml_jax.models.encoder import load_sentence_encoder

    return load_sentence_encoder(bert_dir)


def reference_order(encoder, query: str, documents: list[str]) -> list[int]:
    """NumPy reference: documents by cosine with the query (each text embedded alone), best first, ties newest."""
    q = encoder([query])[0]
    d = np.stack([encoder([t])[0] for t in documents])
    cos = (d / np.linalg.norm(d, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    return sorted(range(len(documents)), key=lambda i: (-float(cos[i]), -i))


def test_embedding_prefilter_picks_the_nearest_memories_by_cosine(encoder):
    pre = EmbeddingPrefilter(encoder)
    docs = [MEMORIES] * len(QUERIES)
    for q, got in zip(QUERIES, pre.similar(QUERIES, docs, 3), strict=True):
        assert got == reference_order(encoder, q, MEMORIES)[:3]
    for q, got in zip(QUERIES, pre.capped(QUERIES, docs, 4), strict=True):
        assert got == sorted(reference_order(encoder, q, MEMORIES)[:4])  # creation order
    np.testing.assert_allclose(pre.scores(QUERIES[:1], [MEMORIES])[0], [
        float(np.dot(encoder([QUERIES[0]])[0], encoder([m])[0])) for m in MEMORIES], atol=1e-5)  # unit vectors
    # under the cap every memory stays and nothing is encoded
    fresh = EmbeddingPrefilter(encoder)
    assert fresh.capped(QUERIES, [MEMORIES[:3]] * len(QUERIES), 4) == [[0, 1, 2]] * len(QUERIES)
    assert fresh.encoded == 0 and fresh.similar(["x"], [[]], 2) == [[]] and fresh.capped(["x"], [MEMORIES], 0) == [[]]


def test_memory_embeddings_are_cached_and_the_cache_is_bounded(encoder):
    calls = []

    def counting(texts):
        calls.append(list(texts))
        return encoder(texts)

    pre = EmbeddingPrefilter(counting, cache_size=len(MEMORIES))
    pre.similar(QUERIES, [MEMORIES] * len(QUERIES), 2)
    assert len(calls) == 1 and calls[0] == QUERIES + MEMORIES  # one batch: the utterances and each memory once
    pre.capped(QUERIES[:2], [MEMORIES] * 2, 3)
    assert calls[1] == QUERIES[:2] and pre.cached() == len(MEMORIES)  # memories come from the cache
    pre.similar(["a new utterance"], [MEMORIES[:2] + ["a new memory"]], 1)
    assert calls[2] == ["a new utterance", "a new memory"]
    assert pre.cached() == len(MEMORIES)  # bounded: the least recently used memory left
    pre.similar(["q"], [[MEMORIES[2]]], 1)
    assert calls[3] == ["q", MEMORIES[2]]  # MEMORIES[2] was the least recently used
    # the encoder compiles one program per (rows, length) power-of-two bucket
    assert all(n & (n - 1) == 0 and length & (length - 1) == 0 for n, length in encoder.shapes)


def _store(texts):
    store = MemoryStore()
    store.append_many("alice", [NewFragment("e0", 0, i, t, t, "0") for i, t in enumerate(texts)])
    return store


def test_the_agents_candidates_and_planner_view_follow_the_embedding_prefilter(policies, tokenizer, bert_dir,
                                                                                encoder):
    view = ObservationConfig(max_length=64, min_length_bucket=16, max_candidates=4, planner_memories=2,
                             prefilter="embedding", prefilter_model=str(bert_dir))
    store = _store(MEMORIES)
    agent = MemoryAgent(policies, tokenizer, store, OfflineBackend(),
                        config=AgentConfig(observation=view, reply_max_tokens=8))
    assert agent.prefilter is prefilter_for("embedding", str(bert_dir))  # one per process and directory
    assert MemoryAgent(policies, tokenizer, store, OfflineBackend(), config=AgentConfig(observation=view)
                       ).prefilter is agent.prefilter
    utterance = QUERIES[0]
    _, receipt = agent.step("alice", utterance, episode_id="e1", session=0, turn=0)
    frags = store.fragments("alice", current_only=True)[: len(MEMORIES)]
    order = reference_order(encoder, utterance, [memory_document(f) for f in frags])
    assert receipt.trigger.candidate_ids == tuple(frags[i].fragment_id for i in sorted(order[:4]))
    assert len(receipt.trigger.candidate_ids) == view.max_candidates
    shown = [frags[i].text for i in order[:2]]
    tokens, _ = obs.encode_planner(tokenizer, [obs.planner_text((), utterance, view, shown)], view)
    np.testing.assert_array_equal(receipt.planner.tokens, tokens[0])
    options = obs.trigger_texts((), utterance, [frags[i].text for i in sorted(order[:4])], view)
    np.testing.assert_array_equal(receipt.trigger.tokens, obs.encode_trigger(tokenizer, [options], view)[0][0])


def test_bm25_default_gives_bit_identical_observations(policies, tokenizer):
    """The default (bm25) reads exactly what it read before the option: `MemoryStore.candidates` for the Trigger,
    `most_similar` over note + turn text for the Planner."""
    view = ObservationConfig(max_length=64, min_length_bucket=16, max_candidates=4, planner_memories=2)
    assert ObservationConfig().prefilter == "bm25" and isinstance(view.make_prefilter(), LexicalPrefilter)
    store = _store(MEMORIES)
    agent = MemoryAgent(policies, tokenizer, store, OfflineBackend(),
                        config=AgentConfig(observation=view, reply_max_tokens=8, greedy=True))
    history: list[tuple[str, str]] = []
    for turn, utterance in enumerate(QUERIES + ["my dog likes the park"]):
        frags = store.fragments("alice", current_only=True)
        cands = store.candidates("alice", utterance, view.max_candidates)
        shown = [frags[i].text for i in most_similar(utterance, [f"{f.text} {f.source_text}" for f in frags], 2)]
        reply, receipt = agent.step("alice", utterance, history=history, episode_id="e1", session=0, turn=turn)
        assert receipt.trigger.candidate_ids == tuple(f.fragment_id for f in cands)
        options = obs.trigger_texts(history, utterance, [f.text for f in cands], view)
        t, m, c = obs.encode_trigger(tokenizer, [options], view)
        np.testing.assert_array_equal(receipt.trigger.tokens, t[0])
        np.testing.assert_array_equal(receipt.trigger.mask, m[0])
        np.testing.assert_array_equal(receipt.trigger.cand_mask, c[0])
        p, _ = obs.encode_planner(tokenizer, [obs.planner_text(history, utterance, view, shown)], view)
        np.testing.assert_array_equal(receipt.planner.tokens, p[0])
        history += [("User", utterance), ("Assistant", reply)]


def _episode() -> Episode:
    said = [("i like my dog", True), ("weather rain cold", False), ("plan trip paris next month", True),
            ("no meat please", True), ("the trip next month", False), ("what do we eat tonight", False)]
    turns = tuple(Turn("user", text, y_p=y_p) for text, y_p in said)
    return Episode("test", "ep", (Session(turns),))


def test_warmup_planner_examples_rank_memories_with_the_configured_prefilter(encoder):
    ep = _episode()
    plain = planner_examples([ep], "user", memories=2)
    assert plain == planner_examples([ep], "user", memories=2, similar=LexicalPrefilter().similar)
    for e in plain:  # bm25: as before the option, `most_similar` turn by turn
        held = [t.text for t in ep.sessions[0].turns[: e.ref.turn] if t.y_p]
        assert e.memories == tuple(held[i] for i in most_similar(e.utterance, [f"{h} {h}" for h in held], 2))
    dense = planner_examples([ep], "user", memories=2, similar=EmbeddingPrefilter(encoder).similar)
    for e in dense:
        held = [t.text for t in ep.sessions[0].turns[: e.ref.turn] if t.y_p]
        order = reference_order(encoder, e.utterance, [f"{h} {h}" for h in held]) if held else []
        assert e.memories == tuple(held[i] for i in order[:2])
    assert dense[-1].memories and len(dense[-1].memories) == 2  # cosine always shows k when there are k


def test_prefilter_settings_fail_naming_what_is_wrong(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="observation.prefilter must be one of"):
        ObservationConfig(prefilter="dense")
    with pytest.raises(ValueError, match="only read by prefilter='embedding'"):
        ObservationConfig(prefilter_model="/models/minilm")
    monkeypatch.setenv("ICML_JAX_MODELS", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="python -m icml_jax.models.fetch all-minilm-l6-v2"):
        encoder_directory("")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        encoder_directory(str(tmp_path / "missing"))
    (tmp_path / "decoder").mkdir()
    (tmp_path / "decoder" / "config.json").write_text('{"model_type": "qwen3"}')
    with pytest.raises(ValueError, match="not a BERT sentence encoder"):
        encoder_directory(str(tmp_path / "decoder"))
