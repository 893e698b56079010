"""Model-based reply metrics on tiny local models the tests build: BERTScore against a NumPy recomputation from
the encoder's hidden states, MAUVE's behaviour on equal and separated feature sets, and our decoder's last-token
features independent of batching and padding. On the fetched all-MiniLM-L6-v2 (skipped outside CI with the fetch
command when it is missing; a failure in CI), our BERTScore equals bert-score's own `score` at the same layer.
Unusable models fail before anything is scored: a layer the encoder lacks, a GPT-2 featurizer for MAUVE."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from flax import nnx
from transformers import BertConfig, BertModel, BertTokenizerFast

from icml_jax import evaluate as ev
from icml_jax.agents import tiny
from icml_jax.evaluation.model_metrics import (bertscore_f1, check_bertscore_model, check_mauve_model,
                                               last_token_features, load_mauve_featurizer, mauve_score)
from icml_jax.models import ModelConfigError
from icml_jax.models.decoder import Decoder
from tests.fetched import fetched_dir
from tests.models import hf_fixtures

MINILM = "all-minilm-l6-v2"
MINILM_LAYER = 6  # its last layer: the one its sentence-transformers pooling reads; bert-score has no entry for it
MINILM_PAIRS = [  # (reply, reference)
    ("How is your dog doing after the vet visit?", "How is your dog after his trip to the vet?"),
    ("Good luck with the kitchen renovation this summer!", "Good luck with the renovation this summer."),
    ("I remember you said your cat went vegan.", "Is your cat still on that vegan diet?"),
    ("Paris is lovely in spring.", "I have never been to France."),
]

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


def test_bertscore_on_minilm_equals_bert_score_called_directly():
    from bert_score import score

    path = fetched_dir(MINILM)
    replies, refs = [p[0] for p in MINILM_PAIRS], [p[1] for p in MINILM_PAIRS]
    got = bertscore_f1(replies, refs, model_path=path, layer=MINILM_LAYER)
    _, _, f1 = score(replies, refs, model_type=str(path), num_layers=MINILM_LAYER, idf=False,
                     rescale_with_baseline=False, use_fast_tokenizer=True)
    assert got.value == pytest.approx(100 * float(f1.mean()), abs=1e-6)
    assert got.per_target == pytest.approx([100 * float(x) for x in f1], abs=1e-6)
    assert got.per_target[0] > got.per_target[3]  # the paraphrase scores above the unrelated pair
    assert got.details == {"model": str(path), "model_type": "bert", "layer": 6, "num_hidden_layers": 6,
                           "idf": False, "rescale_with_baseline": False, "package": got.details["package"]}
    assert "layer 6 of 6" in got.signature and "no idf, no rescaling" in got.signature
    # a lower layer is a different metric: bert-score's own score at layer 3 again, and not layer 6's
    low = bertscore_f1(replies, refs, model_path=path, layer=3)
    want = 100 * float(score(replies, refs, model_type=str(path), num_layers=3, use_fast_tokenizer=True)[2].mean())
    assert low.value == pytest.approx(want, abs=1e-6) and low.value != pytest.approx(got.value, abs=1e-3)


def test_bertscore_layer_the_encoder_lacks_fails_naming_its_layer_count(tiny_bert):
    with pytest.raises(ValueError, match=r"layer 17 is outside 0\.\.3 .*num_hidden_layers 3"):
        bertscore_f1(REPLIES, REFERENCES, model_path=tiny_bert, layer=17)  # the roberta-large default
    with pytest.raises(ValueError, match="not an integer"):
        check_bertscore_model(tiny_bert, "6")
    assert check_bertscore_model(tiny_bert, 0)["layer"] == 0  # 0: the embeddings, as bert-score allows


def write_gpt2(path):
    """A one-layer GPT-2 config.json (what MAUVE's reference featurizer, GPT-2 large, looks like)."""
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64).save_pretrained(path)
    return path


def test_mauve_featurizer_gpt2_is_one_clear_error(tmp_path):
    gpt2 = write_gpt2(tmp_path / "gpt2")
    for call in (check_mauve_model, load_mauve_featurizer):
        with pytest.raises(ModelConfigError) as err:
            call(gpt2)
        message = str(err.value)
        assert "eval.mauve_model" in message and str(gpt2) in message and "model_type 'gpt2'" in message
        assert "llama, qwen2, qwen3, gemma3" in message and "not comparable" in message
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        check_mauve_model(tmp_path / "missing")


def test_mauve_records_its_featurizer(tmp_path):
    llama = tmp_path / "llama"
    hf_fixtures.build("llama", llama)
    from tests.models import tokenizer_fixtures

    tokenizer_fixtures.build_tokenizer(llama)
    model, tok, details = load_mauve_featurizer(llama)
    assert details["model"] == str(llama) and details["model_type"] == "llama" and details["family"] == "llama"
    assert "final hidden state" in details["layer"] and "last token" in details["layer"]
    texts = [f"{w} is good" for w in WORDS[:12]]
    feats = last_token_features(model, tok, texts, max_length=16)
    assert feats.shape == (12, details["hidden_size"])
    got = mauve_score(feats[:6], feats[6:], details=details)
    assert got.details["model_type"] == "llama" and got.details["feature_dim"] == details["hidden_size"]


def test_evaluation_checks_the_metric_models_before_playing(tmp_path):
    from tests.test_main import tiny_demo

    config = tiny_demo()
    config.eval.mauve_model = str(write_gpt2(tmp_path / "gpt2"))
    with pytest.raises(ModelConfigError, match="model_type 'gpt2'"):
        ev.evaluate_workdir(config, tmp_path / "run")
    config.eval.mauve_model = None
    config.eval.bertscore_model = str(write_tiny_bert(tmp_path / "bert"))  # eval.bertscore_layer: 17 by default
    with pytest.raises(ValueError, match="outside 0..3"):
        ev.evaluate_workdir(config, tmp_path / "run")
    assert not (tmp_path / "run" / ev.EVAL_DIR / "targets.jsonl").exists()
