"""The dense encoder: mean-pooled final hidden states of one of our decoders, batched and padded to power-of-two
buckets (one compilation per bucket), and built from the run's config (the tiny random stand-in here)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from icml_jax.agents.tiny import build_tokenizer, tiny_model_config
from icml_jax.baselines.encoder import DenseRelevance, cosine, encoder_from_config, tiny_encoder
from icml_jax.models.decoder import Decoder

WORDS = "the a dog cat sat on mat very long sentence with many words in it".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), WORDS)


@pytest.fixture(scope="module")
def encoder(tokenizer):
    return tiny_encoder(tokenizer, hidden=32, layers=1, seed=3, max_length=64)


def test_mean_pooling_matches_an_unpadded_forward(tokenizer, encoder):
    texts = ["the dog sat", "a cat", "the cat sat on the mat", ""]
    out = encoder(texts)
    assert out.shape == (4, 32) and out.dtype == np.float32 and np.isfinite(out).all()
    model = Decoder(tiny_model_config(len(tokenizer), 32, 1), rngs=nnx.Rngs(3))  # the same seed: the same weights
    for text, row in zip(texts[1:3], out[1:3], strict=True):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        hidden = model(jnp.asarray([ids]), compute_logits=False).hidden[0]
        np.testing.assert_allclose(row, np.asarray(hidden).mean(0), atol=1e-5)
    np.testing.assert_allclose(encoder(["a cat"])[0], out[1], atol=1e-5)  # batch-independent
    again = tiny_encoder(tokenizer, hidden=32, layers=1, seed=3)  # a fixed seed: the same random features
    for x, y in zip(jax.tree.leaves(again._state), jax.tree.leaves(encoder._state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_one_compilation_per_bucket(encoder):
    encoder.shapes.clear()
    before = encoder._run._cache_size()
    encoder(["the dog", "a cat sat"])
    encoder(["the cat sat on the mat", "dog"])  # other lengths, same (2 rows, 16 tokens) bucket
    encoder(["a very long sentence with many words in it " * 3])  # 30 tokens: the 32 bucket, 1 row
    encoder(["the dog sat on the mat very long"] * 3)  # 3 rows pad to 4
    assert encoder.shapes == {(2, 16), (1, 32), (4, 16)}
    assert encoder._run._cache_size() - before <= len(encoder.shapes)


def test_dense_relevance_encodes_each_text_once():
    calls = []

    def fake(texts):
        calls.append(list(texts))
        return np.asarray([[len(t), 1.0] for t in texts], np.float32)

    rel = DenseRelevance(fake)
    first = rel.scores(["ab", "abcd"], ["abcd", "x"])
    np.testing.assert_allclose(first, cosine(fake(["ab", "abcd"]), fake(["abcd", "x"])), atol=1e-6)
    calls.clear()
    rel.scores(["ab"], ["abcd", "x", "new"])
    assert calls == [["new"]]
    rel.forget()
    rel.scores(["ab"], ["x"])
    assert calls[-1] == ["ab", "x"]


def test_encoder_from_config(tokenizer, tmp_path):
    config = ml_collections.ConfigDict({"seed": 7, "model": {"kind": "tiny", "hidden": 16, "layers": 1,
                                                             "path": None}})
    enc = encoder_from_config(config, tokenizer, model_dir=None, max_length=32)
    assert "random tiny decoder (seed 7)" in enc.label and enc.dim == 16 and enc.max_length == 32
    config.model.kind = "pretrained"
    with pytest.raises(ValueError, match="encoder_model or config.model.path"):
        encoder_from_config(config, tokenizer, model_dir=None, max_length=32)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        encoder_from_config(config, tokenizer, model_dir=str(tmp_path / "missing"), max_length=32)


def test_encoder_from_config_reads_a_bert_directory(tokenizer, tmp_path):
    """`baselines.encoder_model` naming a BERT directory (a tiny random one here, all-MiniLM-L6-v2 in practice)
    gives the sentence encoder with its own tokenizer, pooling and normalisation, not a mean-pooled decoder."""
    from icml_jax.models import SentenceEncoder, load_sentence_encoder
    from tests.models import bert_fixtures

    bert_fixtures.build(tmp_path / "bert", seed=4)  # max_seq_length 32, mean pooling + Normalize
    config = ml_collections.ConfigDict({"seed": 7, "model": {"kind": "pretrained", "path": None,
                                                             "dtype": "float32"}})
    enc = encoder_from_config(config, tokenizer, model_dir=str(tmp_path / "bert"), max_length=128)
    assert isinstance(enc, SentenceEncoder) and enc.dim == 64 and enc.max_length == 32
    assert enc.label == "bert (BERT, mean + L2 norm pooling)"
    texts = ["i like my dog", "we went to the park on sunday", "hello"]
    direct = load_sentence_encoder(tmp_path / "bert")
    np.testing.assert_allclose(enc(texts), direct(texts), atol=1e-6)
    scores = DenseRelevance(enc).scores(["i like my dog"], texts)
    assert scores.shape == (1, 3) and abs(scores[0, 0] - 1.0) < 1e-5 and (np.abs(scores) <= 1 + 1e-5).all()
    assert encoder_from_config(config, tokenizer, model_dir=str(tmp_path / "bert"), max_length=8).max_length == 8
