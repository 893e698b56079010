"""The Mem0-style baseline retrieves with the sentence encoder `baselines.encoder_model` names: a tiny random BERT
(ranking checked against a NumPy cosine reference) and, when fetched, all-MiniLM-L6-v2 (semantic recall)."""

from __future__ import annotations

import json
import types

import ml_collections
import numpy as np
from icml_jax.baselines import mem0
from icml_jax.baselines.common import Query
from icml_jax.baselines.encoder import DenseRelevance
from icml_jax.models import SentenceEncoder, load_sentence_encoder
from tests.baselines.helpers import Recording, episode, play
from tests.fetched import fetched_dir


# every user turn is one fact, and every fact a new memory: what is stored is exactly the turns, so only retrieval
# is under test
ANSWERS = {"baseline_extract_facts": lambda r: json.dumps({"facts": [{"turn": t["turn"], "fact": t["text"]}
                                                                     for t in r.metadata["turns"] if t["user"]]}),
           "baseline_mem0_decide": lambda r: json.dumps({"event": "ADD"})}


def _built(encoder_dir) -> mem0.Mem0Agent:
    config = ml_collections.ConfigDict({
        "seed": 0, "data": {"name": "msc"}, "model": {"kind": "pretrained", "path": None, "dtype": "float32"},
        "baselines": {"encoder_model": str(encoder_dir), "top_k": 2}})
    agent, provenance = mem0.build(types.SimpleNamespace(config=config, tokenizer=None, generator=Recording(ANSWERS)))
    assert provenance["relevance"] == "dense" and provenance["encoder"] == agent.relevance.encoder.label
    assert isinstance(agent.relevance, DenseRelevance) and isinstance(agent.relevance.encoder, SentenceEncoder)
    return agent


def test_mem0_ranks_memories_by_the_configured_sentence_encoders_cosine(tmp_path):
    from tests.models import bert_fixtures

    bert_fixtures.build(tmp_path / "bert", seed=3)
    agent = _built(tmp_path / "bert")
    facts = ["i like my dog", "your sister is a doctor", "plan trip paris next month", "no meat please"]
    play(agent, episode(facts, ["bye"]))
    memories = agent.memory_texts("ep-1")
    assert memories == facts and agent.malformed == {}  # the last session is the scored one
    direct = load_sentence_encoder(tmp_path / "bert")
    vecs = direct(memories)
    for utterance in ["what do we eat tonight", "how is my cat", "hello"]:
        (choice,) = agent.recall("ep-1", [Query(utterance, (), "ep-1", 1, 2)], final=True)
        cos = vecs @ direct([utterance])[0] / np.linalg.norm(vecs, axis=1) / np.linalg.norm(direct([utterance])[0])
        best = sorted(range(len(memories)), key=lambda i: (-float(cos[i]), -i))[:2]
        assert choice.refs == tuple(("ep-1", 0, 2 * i) for i in best)  # memory i is the i-th user turn


def test_mem0_with_the_fetched_minilm_recalls_the_semantically_related_fact():
    agent = _built(fetched_dir("all-minilm-l6-v2"))
    facts = ["I moved to Berlin with my wife last month.", "I have a golden retriever named Biscuit.",
             "My doctor says I have a peanut allergy.", "I work as a nurse at the city hospital."]
    play(agent, episode(facts, ["bye"]))
    for utterance, expected in [("Any tips for walking a puppy in the rain?", 1),
                                ("Which snacks are safe for me to eat?", 2),
                                ("How do I deal with long night shifts?", 3)]:
        (choice,) = agent.recall("ep-1", [Query(utterance, (), "ep-1", 1, 2)], final=True)
        assert choice.ref == ("ep-1", 0, 2 * expected), (utterance, choice.text)


