"""Local tokenizers: load from a directory, encode/decode, chat templates."""

import pytest

from icml_jax.models.tokenizer import apply_chat_template, load_tokenizer
from tests.models.tokenizer_fixtures import build_tokenizer


def test_load_encode_decode_roundtrip(tmp_path):
    build_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)
    ids = tok("i like my dog")["input_ids"]
    assert ids[0] == tok.bos_token_id == 1
    assert tok.decode(ids, skip_special_tokens=True) == "i like my dog"
    assert tok.padding_side == "left"


def test_chat_template(tmp_path):
    build_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)
    text = apply_chat_template(tok, [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                                     {"role": "user", "content": "how are you"}])
    assert text == "<bos><user> hello <assistant> hi <eos><user> how are you <assistant>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "none")
