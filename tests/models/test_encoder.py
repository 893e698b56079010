"""`icml_jax.models.encoder` against transformers' `BertModel`, float32: a tiny random BERT always, and the real
all-MiniLM-L6-v2 once fetched (`python -m icml_jax.models.fetch all-minilm-l6-v2`; outside CI a missing model is
skipped with that command in the reason, in CI (CI=true) it is a failure, as in test_real_models.py).

The reference for sentence vectors is sentence-transformers' own arithmetic on transformers' last hidden
states: the pooling of 1_Pooling/config.json over the attention mask, then L2 normalisation (its Normalize
module); sentence-transformers itself is not installed.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from icml_jax.models import CheckpointError, ModelConfigError, encoder
from icml_jax.models.safetensors_io import write_tensors
from tests.fetched import fetched_dir
from tests.models import bert_fixtures as B

TOL = 1e-4
SENTENCES = [  # real sentences of the kind the memory baselines embed, of different lengths
    "I adopted a dog named Biscuit last spring.",
    "What should I cook for dinner tonight? Something without peanuts, please.",
    "My sister works as a doctor in Paris and visits us every December.",
    "Remember that I am allergic to shellfish.",
    "We went hiking in the mountains on Sunday, and it rained the whole time.",
    "ok",
    "",
    "The quarterly report is due next Friday; my manager wants the sales figures broken down by region.",
]
TINY_SENTENCES = ["i like my dog", "we went to the park on sunday and it rained", "hello", "",
                  "you said your sister is a doctor in paris , what do you eat for dinner tonight ?"]


def padded(rows: list[list[int]], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded token ids and attention mask of token-id rows."""
    length = max(len(r) for r in rows)
    ids = np.full((len(rows), length), pad, np.int64)
    mask = np.zeros((len(rows), length), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    return ids, mask


def torch_hidden(model, ids, mask, types=None) -> np.ndarray:
    """transformers' float32 last hidden states."""
    kwargs = {} if types is None else {"token_type_ids": torch.as_tensor(types)}
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), **kwargs)
    return out.last_hidden_state.float().numpy()


def st_pool(hidden: np.ndarray, mask: np.ndarray, mode: str = "mean", normalize: bool = True) -> np.ndarray:
    """sentence-transformers' Pooling (+ Normalize) in NumPy, float64."""
    h, m = hidden.astype(np.float64), mask.astype(np.float64)[..., None]
    count = np.maximum(m.sum(1), 1e-9)
    if mode == "cls":
        out = h[:, 0]
    elif mode == "max":
        out = np.where(m > 0, h, -1e9).max(1)
    elif mode == "mean_sqrt_len":
        out = (h * m).sum(1) / np.sqrt(count)
    else:
        out = (h * m).sum(1) / count
    if normalize:
        out = out / np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random BERT sentence-encoder directory, the torch model and ours."""
    directory = tmp_path_factory.mktemp("tiny_bert")
    model = B.build(directory, seed=3)
    return directory, model, encoder.load_sentence_encoder(directory)


def test_tiny_hidden_states_and_embeddings_match_transformers(tiny):
    directory, model, ours = tiny
    rows = ours.tokenize(TINY_SENTENCES)
    assert rows[3] == [2, 3] and all(r[0] == 2 and r[-1] == 3 for r in rows)  # [CLS] ... [SEP]
    ids, mask = padded(rows)
    assert (mask == 0).any()
    hidden, vectors = ours.encode_tokens(ids, mask)
    ref = torch_hidden(model, ids, mask)
    real = mask.astype(bool)
    hidden_diff = float(np.abs(hidden - ref)[real].max())
    vector_diff = float(np.abs(vectors - st_pool(ref, mask)).max())
    print(f"tiny BERT: max |hidden diff| {hidden_diff:.3g}, max |embedding diff| {vector_diff:.3g}")
    assert hidden_diff <= TOL and vector_diff <= TOL
    assert np.abs(ref).max() > 1.0 and np.abs(st_pool(ref, mask, normalize=False)).max() > 0.3  # not trivial
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)  # modules.json: Normalize


def test_tiny_token_types_and_sentence_pairs(tiny):
    directory, model, ours = tiny
    enc = ours.tokenizer(["i like my dog", "hello"], ["we went to the park", "bye"], return_token_type_ids=True)
    ids, mask = padded(enc["input_ids"])
    types, _ = padded(enc["token_type_ids"])
    assert types.max() == 1
    hidden, _ = ours.encode_tokens(ids, mask, types)
    assert float(np.abs(hidden - torch_hidden(model, ids, mask, types))[mask.astype(bool)].max()) <= TOL


def test_call_is_bucketed_and_independent_of_padding(tiny):
    directory, model, ours = tiny
    texts = TINY_SENTENCES * 3 + ["i like my cat"]  # 16 texts
    small = encoder.SentenceEncoder(encoder.load_bert(directory), ours.tokenizer, ours.settings, batch_size=6)
    before = small._run._cache_size()
    out = small(texts)
    assert out.shape == (16, 64) and out.dtype == np.float32
    assert small.shapes == {(8, 32), (4, 32)}  # 6 + 6 + 4 rows, each padded to a power of two; 20 tokens at most -> 32
    assert small._run._cache_size() - before == len(small.shapes)
    for text, vec in zip(texts, out):  # one text alone (no padding at all) gives the same vector
        ids, mask = padded(ours.tokenize([text]))
        single = ours.encode_tokens(ids, mask)[1][0]
        assert np.abs(single - vec).max() <= 1e-5, text
    assert small([]).shape == (0, 64)


def test_state_is_passed_in_not_closed_over(tiny):
    directory, model, ours = tiny
    enc = encoder.load_sentence_encoder(directory)
    first = enc(["i like my dog"])
    before = enc._run._cache_size()
    enc._state = jax.tree.map(lambda a: a * 1.5, enc._state)  # the same structure and shapes, new values
    second = enc(["i like my dog"])
    assert enc._run._cache_size() == before  # no recompilation
    assert np.abs(first - second).max() > 1e-3  # the new weights were used


def test_truncation_to_max_seq_length(tiny):
    directory, model, ours = tiny
    assert ours.max_length == 32  # sentence_bert_config.json
    long_text = " ".join(["i like my dog"] * 20)
    (row,) = ours.tokenize([long_text])
    assert len(row) == 32 and row[0] == 2 and row[-1] == 3
    assert encoder.load_sentence_encoder(directory, max_length=8).tokenize([long_text])[0][-1] == 3
    assert encoder.load_sentence_encoder(directory, max_length=1000).max_length == 32  # never past the limit


@pytest.mark.parametrize("mode", ["cls", "max", "mean_sqrt_len", "mean"])
def test_pooling_modes(tmp_path, mode):
    model = B.build(tmp_path, seed=5, pooling=mode, normalize=mode == "max", max_seq_length=None)
    ours = encoder.load_sentence_encoder(tmp_path)
    assert ours.settings.pooling == encoder.Pooling(mode, normalize=mode == "max")
    assert ours.max_length == B.TINY["max_position_embeddings"]  # no sentence_bert_config.json
    ids, mask = padded(ours.tokenize(TINY_SENTENCES))
    _, vectors = ours.encode_tokens(ids, mask)
    ref = st_pool(torch_hidden(model, ids, mask), mask, mode, normalize=mode == "max")
    assert float(np.abs(vectors - ref).max()) <= TOL


def test_plain_bert_directory_and_masked_lm_prefix(tmp_path):
    """Without sentence-transformers files: mean pooling, no norm. A BertForMaskedLM saves its body under
    "bert." next to its head; the head is not read."""
    model = B.build(tmp_path, seed=1, model_class=transformers.BertForMaskedLM, sentence=False)
    names = load_file(tmp_path / "model.safetensors")
    assert "bert.embeddings.word_embeddings.weight" in names and any(n.startswith("cls.") for n in names)
    ours = encoder.load_sentence_encoder(tmp_path)
    assert ours.settings == encoder.SentenceSettings(encoder.Pooling("mean", normalize=False))
    ids, mask = padded(ours.tokenize(TINY_SENTENCES))
    hidden, vectors = ours.encode_tokens(ids, mask)
    ref = torch_hidden(model.bert, ids, mask)
    assert float(np.abs(hidden - ref)[mask.astype(bool)].max()) <= TOL
    assert float(np.abs(vectors - st_pool(ref, mask, normalize=False)).max()) <= TOL


def test_bfloat16_weights_stay_close(tiny):
    directory, model, ours = tiny
    low = encoder.load_sentence_encoder(directory, dtype=jnp.bfloat16)
    assert low._state["word_embeddings"][...].dtype == jnp.bfloat16
    cos = np.sum(low(TINY_SENTENCES) * ours(TINY_SENTENCES), axis=-1)
    assert cos.min() > 0.98, cos


def _rewrite(directory, change) -> str:
    """Applies `change` to the tensors of model.safetensors in place; returns the file's path."""
    path = directory / "model.safetensors"
    tensors = dict(load_file(path))
    change(tensors)
    write_tensors(path, tensors)
    return str(path)


def test_damaged_checkpoints_name_the_tensor_and_file(tmp_path):
    B.build(tmp_path, seed=2)
    file = _rewrite(tmp_path, lambda t: t.update({"encoder.layer.1.attention.self.key.weight":
                                                  t["encoder.layer.1.attention.self.key.weight"][:, :32].copy()}))
    with pytest.raises(CheckpointError, match=re.escape(
            f"tensor 'encoder.layer.1.attention.self.key.weight' in {file} has shape (64, 32), expected (64, 64) "
            "(parameter layers/k, layer 1)")):
        encoder.load_bert(tmp_path)
    B.build(tmp_path, seed=2)
    _rewrite(tmp_path, lambda t: t.pop("encoder.layer.2.output.LayerNorm.bias"))
    with pytest.raises(CheckpointError, match=re.escape(
            f"{tmp_path}: checkpoint lacks 1 tensor(s): encoder.layer.2.output.LayerNorm.bias")):
        encoder.load_bert(tmp_path)
    B.build(tmp_path, seed=2)
    _rewrite(tmp_path, lambda t: t.update({"encoder.layer.0.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match=re.escape(
            "unexpected tensor(s) the BERT encoder does not use: 'encoder.layer.0.extra.weight' (model.safetensors)")):
        encoder.load_bert(tmp_path)
    B.build(tmp_path, seed=2)
    _rewrite(tmp_path, lambda t: [t.pop(k) for k in list(t) if k.startswith("embeddings.word")])
    with pytest.raises(CheckpointError, match="no BERT word embedding found"):
        encoder.load_bert(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        encoder.load_bert(tmp_path / "nowhere")


def test_bad_configs_name_the_file_and_key(tmp_path):
    B.build(tmp_path, seed=2)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(ModelConfigError, match=re.escape(f"{tmp_path / 'config.json'}: hidden_act = 'relu' is not "
                                                         "supported")):
        encoder.load_bert(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ModelConfigError, match=re.escape("model_type = 'llama' is not 'bert'")):
        encoder.load_bert(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 5}))
    with pytest.raises(ModelConfigError, match=re.escape(f"{tmp_path / 'config.json'}: hidden_size 64 is not a "
                                                         "multiple of num_attention_heads 5")):
        encoder.load_bert(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    modules = json.loads((tmp_path / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
    (tmp_path / "modules.json").write_text(json.dumps(modules + [dense]))
    with pytest.raises(ModelConfigError, match=re.escape(f"{tmp_path / 'modules.json'}: module '3' "
                                                         "('sentence_transformers.models.Dense') is not supported")):
        encoder.load_sentence_encoder(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    pooling = tmp_path / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}))
    with pytest.raises(ModelConfigError, match=re.escape(f"{pooling}: pooling_mode_mean_tokens, "
                                                         "pooling_mode_cls_token set")):
        encoder.load_sentence_encoder(tmp_path)
    pooling.write_text(json.dumps({"pooling_mode_mean_tokens": True, "word_embedding_dimension": 32}))
    with pytest.raises(ModelConfigError, match="word_embedding_dimension 32 is not the model's hidden_size 64"):
        encoder.load_sentence_encoder(tmp_path)


def test_ids_outside_the_vocabulary_are_refused(tiny):
    directory, model, ours = tiny
    with pytest.raises(ValueError, match="token id 999 is outside the encoder's vocabulary"):
        ours.encode_tokens(np.array([[2, 999, 3]]), np.ones((1, 3)))


# --- the real all-MiniLM-L6-v2 -------------------------------------------------------------------------------

MINILM = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def minilm():
    """all-MiniLM-L6-v2 loaded by us and by transformers (once per module)."""
    directory = fetched_dir(MINILM)
    return (encoder.load_sentence_encoder(directory),
            transformers.BertModel.from_pretrained(directory, dtype=torch.float32).eval())


def test_minilm_matches_transformers(minilm):
    ours, model = minilm
    assert ours.settings.pooling == encoder.Pooling("mean", normalize=True) and ours.max_length == 256
    assert ours.tokenize(["Hello world!"]) == [[101, 7592, 2088, 999, 102]]  # lower-cased WordPiece
    ids, mask = padded(ours.tokenize(SENTENCES))
    hidden, vectors = ours.encode_tokens(ids, mask)
    ref = torch_hidden(model, ids, mask)
    hidden_diff = float(np.abs(hidden - ref)[mask.astype(bool)].max())
    vector_diff = float(np.abs(vectors - st_pool(ref, mask)).max())
    print(f"all-MiniLM-L6-v2 ({ids.shape[0]} sentences, {ids.shape[1]} tokens): max |hidden diff| "
          f"{hidden_diff:.3g}, max |embedding diff| {vector_diff:.3g}")
    assert hidden_diff <= TOL and vector_diff <= TOL
    assert float(np.abs(ours(SENTENCES) - vectors).max()) <= 1e-5  # the bucketed path gives the same vectors


def test_minilm_long_text_and_similarity(minilm):
    """A text past max_seq_length (256 tokens) is truncated like sentence-transformers does, and matches too;
    paraphrases score higher than unrelated sentences."""
    ours, model = minilm
    long_text = " ".join(f"On day {i} I walked {i % 7 + 2} km and read {i % 5 + 1} chapters." for i in range(60))
    (row,) = ours.tokenize([long_text])
    assert len(row) == 256 and row[-1] == 102
    ids, mask = padded([row])
    hidden, vectors = ours.encode_tokens(ids, mask)
    ref = torch_hidden(model, ids, mask)
    diff = float(max(np.abs(hidden - ref).max(), np.abs(vectors - st_pool(ref, mask)).max()))
    print(f"all-MiniLM-L6-v2 (256 tokens): max |diff| {diff:.3g}")
    assert diff <= TOL
    a, b, c = ours(["I have a dog called Biscuit.", "My dog's name is Biscuit.", "The stock market fell today."])
    assert a @ b > 0.7 and a @ c < 0.3, (a @ b, a @ c)
