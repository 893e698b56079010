"""Model-based reply metrics on tiny local models the tests build: BERTScore against a NumPy recomputation from
the encoder's hidden states, MAUVE's behaviour on equal and separated feature sets, and our decoder's last-token
features independent of batching and padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import BertConfig, BertModel, BertTokenizerFast

from icml_jax.evaluation.model_metrics import bertscore_f1, last_token_features, mauve_score
from icml_jax.models.decoder import Decoder
from icml_jax.agents import tiny

WORDS = "the a my dog cat vet visit kitchen vegan good luck how is after his trip to renovation summer now".split()
REPLIES = ["how is the dog after the vet visit", "good luck with the kitchen", "my cat is vegan now"]
REFERENCES = ["how is his dog after his trip to the vet", "good luck with the renovation this summer",
              "the cat is vegan"]


def write_tiny_bert(path):
    """A 3-layer, 32-wide random BERT with a word-level vocabulary, saved with its tokenizer to `path`."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "with", "this"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt"), model_max_length=64).save_pretrained(path)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("bert"))


def reference_bertscore(path, layer: int) -> float:
    """Greedy cosine matching of layer-`layer` token embeddings, F1 averaged; as bert-score does, [CLS]/[SEP] get
    weight 0 on their own side but may be the best match of the other side's tokens."""
    tok, model = BertTokenizerFast.from_pretrained(path), BertModel.from_pretrained(path).eval()

    def embed(text):
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc, output_hidden_states=True).hidden_states[layer][0].numpy()
        return h / np.linalg.norm(h, axis=-1, keepdims=True)

    f1s = []
    for c, r in zip(REPLIES, REFERENCES, strict=True):
        sim = embed(c) @ embed(r).T
        p, rec = sim.max(axis=1)[1:-1].mean(), sim.max(axis=0)[1:-1].mean()
        f1s.append(2 * p * rec / (p + rec))
    return 100 * float(np.mean(f1s))


@pytest.mark.parametrize("layer", [1, 3])
def test_bertscore_matches_a_numpy_recomputation(tiny_bert, layer):
    got = bertscore_f1(REPLIES, REFERENCES, model_path=tiny_bert, layer=layer)
    assert got.value == pytest.approx(reference_bertscore(tiny_bert, layer), abs=1e-3)
    assert f"layer {layer}" in got.signature and got.count == 3
    assert bertscore_f1(REFERENCES, REFERENCES, model_path=tiny_bert, layer=layer).value == pytest.approx(100, abs=1e-3)
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        bertscore_f1(REPLIES, REFERENCES, model_path=tiny_bert / "missing", layer=layer)


def test_last_token_features_do_not_depend_on_batching_or_padding(tmp_path):
    tokenizer = tiny.build_tokenizer(tmp_path / "tok", sorted(set(WORDS)))
    model = Decoder(tiny.tiny_model_config(len(tokenizer), 32, 2), rngs=nnx.Rngs(0))
    texts = REPLIES + REFERENCES + ["dog"]
    together = last_token_features(model, tokenizer, texts, batch_size=8)
    alone = np.concatenate([last_token_features(model, tokenizer, [t]) for t in texts])
    assert together.shape == (7, 32) and together.dtype == np.float32
    np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-5)
    assert not np.allclose(together[0], together[1])


def test_mauve_is_high_for_one_distribution_and_low_for_separated_ones():
    rng = np.random.default_rng(0)
    p = rng.normal(size=(200, 8)).astype(np.float32)
    q = rng.normal(size=(200, 8)).astype(np.float32)
    same = mauve_score(p, q, featurizer="gaussian")
    apart = mauve_score(p, q + 4.0)
    assert same.value > 90 and apart.value < 20 and "gaussian" in same.signature
    with pytest.raises(ValueError, match="equal d"):
        mauve_score(p, q[:, :4])
