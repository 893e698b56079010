"""GGUF -> HF conversion on tiny GGUF files written like llama.cpp writes them (no download).

Each file comes from a tiny random transformers model (Llama with Llama-3 rope scaling, Qwen2 with biases and
an untied head, Qwen3 with q/k norms, Gemma3 with sliding-window layers), with llama.cpp's transforms and a mix
of quantization types. The converted directory must hold exactly the weights the file holds (checked against
transformers' own torch dequantization), load in ours and in transformers, and give the original model's logits.
"""

from __future__ import annotations

import json

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from icml_jax.models import convert_gguf, from_pretrained, gguf_io, load_tokenizer
from icml_jax.models.families import llama as llama_family
from icml_jax.models.safetensors_io import Checkpoint
from tests.models import gguf_fixtures as G
from tests.models import hf_fixtures as F

Q = gguf.GGMLQuantizationType
TOL = 1e-4
KINDS = ["llama", "qwen2", "qwen3", "gemma3"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """kind -> (converted directory, torch model holding the file's weights, expected tensors, BPE tokenizer)."""
    out = {}
    for kind in KINDS:
        d = tmp_path_factory.mktemp(f"gguf_{kind}")
        model, expected, bpe = G.write_gguf(kind, d / "model.gguf", quant=G.QUANT_MIX)
        gguf_io.convert(d / "model.gguf", d / "hf")
        out[kind] = (d / "hf", model, expected, bpe)
    return out


def padded_batch(vocab: int, length: int = 13, seed: int = 0):
    """Two rows, the second left-padded by 4 (longer than Gemma3's window of 5)."""
    ids = np.random.RandomState(seed).randint(3, vocab, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    ids[1, :4] = 0
    return ids, mask


@pytest.mark.parametrize("kind", KINDS)
def test_converted_tensors_equal_the_file(converted, kind):
    directory, _, expected, _ = converted[kind]
    ckpt = Checkpoint(directory)
    assert set(ckpt.keys()) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(ckpt.get(name), value, err_msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_original_model(converted, kind):
    directory, torch_model, _, _ = converted[kind]
    model = from_pretrained(directory)
    ids, mask = padded_batch(model.config.vocab_size)
    ref = F.torch_logits(torch_model, ids, mask, np.maximum(np.cumsum(mask, 1) - 1, 0))
    ours = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)).logits)
    real = mask.astype(bool)
    assert np.abs(ref - ours)[real].max() <= TOL
    assert np.abs(ref).max() > 1.0
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert type(hf) is type(torch_model)
    theirs = F.torch_logits(hf, ids, mask, np.maximum(np.cumsum(mask, 1) - 1, 0))
    assert np.abs(ref - theirs)[real].max() <= 1e-5


def test_configs_state_what_the_file_states(converted):
    llama = from_pretrained(converted["llama"][0]).config
    assert llama.rope.kind == "llama3" and llama.rope.factor == 8.0  # recovered from rope_freqs
    np.testing.assert_allclose(llama.rope.inv_freq(16), from_hf_rope(converted["llama"][1]), rtol=1e-6)
    assert llama.eos_token_ids == (2,) and llama.bos_token_id == 1
    qwen2 = from_pretrained(converted["qwen2"][0]).config
    assert qwen2.family == "qwen2" and qwen2.qkv_bias and not qwen2.o_bias and not qwen2.tie_embeddings
    gemma = from_pretrained(converted["gemma3"][0]).config
    assert gemma.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert gemma.sliding_window == 5 and gemma.rope.kind == "linear" and gemma.rope_local.theta == 1e4
    assert gemma.query_pre_attn_scalar == 16 and gemma.rms_norm_eps == 1e-6
    generation = json.loads((converted["gemma3"][0] / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}


def from_hf_rope(torch_model) -> np.ndarray:
    """transformers' rotary inverse frequencies of layer 0."""
    return torch_model.model.rotary_emb.inv_freq.numpy()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_bpe_tokenizer_and_chat_template(converted, kind):
    """Ours tokenizes like transformers' own GGUF tokenizer; the Llama file (GPT-2 split) like the trained BPE."""
    directory, _, _, bpe = converted[kind]
    tok = load_tokenizer(directory)
    reference = transformers.AutoTokenizer.from_pretrained(directory.parent, gguf_file="model.gguf")
    for text in ("the cat sat on the mat", "hello world, 12 tiny tests", " spaced  out "):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == reference(text, add_special_tokens=False)["input_ids"]
        if kind == "llama":
            assert ids == bpe.encode(text).ids
        assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.chat_template == G.CHATML
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2 and tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == 0


def test_sentencepiece_tokenizer(converted):
    tok = load_tokenizer(converted["gemma3"][0])
    ids = tok("hello world")["input_ids"]
    assert ids[0] == tok.bos_token_id == 2  # the file says add BOS
    assert tok.decode(ids, skip_special_tokens=True) == "hello world"
    assert tok("<start_of_turn>user", add_special_tokens=False)["input_ids"][0] == 4


def test_chat_template_and_eos_given_to_convert(tmp_path):
    G.write_gguf("gemma3", tmp_path / "g.gguf", chat_template=None)
    template = "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}"
    gguf_io.convert(tmp_path / "g.gguf", tmp_path / "hf", chat_template=template, extra_eos_tokens=["<end_of_turn>"])
    assert load_tokenizer(tmp_path / "hf").chat_template == template
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] == [1, 5]
    assert from_pretrained(tmp_path / "hf").config.eos_token_ids == (1, 5)
    with pytest.raises(gguf_io.GGUFError, match="'<nope>' is not in the vocabulary"):
        gguf_io.convert(tmp_path / "g.gguf", tmp_path / "hf2", extra_eos_tokens=["<nope>"])


def test_k_quants(tmp_path):
    """Q4_K and Q6_K (256-value super-blocks) on the MLP down projection; values from random blocks."""
    quant = {"blk.0.ffn_down.weight": Q.Q4_K, "ffn_down.weight": Q.Q6_K, "attn_q.weight": Q.Q8_0}
    model, expected, _ = G.write_gguf("llama", tmp_path / "k.gguf", quant=quant, intermediate_size=256)
    reader = gguf_io.open_gguf(tmp_path / "k.gguf")
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.ffn_down.weight"] == Q.Q4_K and types["blk.1.ffn_down.weight"] == Q.Q6_K
    gguf_io.convert(tmp_path / "k.gguf", tmp_path / "hf")
    ckpt = Checkpoint(tmp_path / "hf")
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.2.mlp.down_proj.weight"):
        np.testing.assert_array_equal(ckpt.get(name), expected[name])
        assert 0.01 < np.abs(expected[name]).max() < 10
    ours = from_pretrained(tmp_path / "hf")
    ids, mask = padded_batch(ours.config.vocab_size)
    ref = F.torch_logits(model, ids, mask, np.maximum(np.cumsum(mask, 1) - 1, 0))
    logits = np.asarray(ours(jnp.asarray(ids), attention_mask=jnp.asarray(mask)).logits)
    assert np.abs(ref - logits)[mask.astype(bool)].max() <= TOL


def test_unpermute_inverts_llama_cpp_permutation():
    w = np.arange(8 * 2 * 3, dtype=np.float32).reshape(16, 3)
    np.testing.assert_array_equal(llama_family.unpermute_rotary_rows(G.permute_rows(w, 2), 2), w)
    assert not np.array_equal(G.permute_rows(w, 2), w)


@pytest.mark.parametrize("head_dim, hi, orig", [(64, 4.0, 8192), (128, 4.0, 8192), (64, 2.0, 4096), (128, 2.0, 4096)])
def test_llama3_rope_recovered_from_factors(head_dim, hi, orig):
    """Llama-3.2 (head_dim 64) and 3.1 (128) values come back exactly; others give the same frequencies."""
    params = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                  high_freq_factor=hi, original_max_position_embeddings=orig)
    factors = G.llama3_rope_factors(params, head_dim)
    got = llama_family.llama3_rope_from_factors(factors, 500000.0, head_dim)
    assert got["factor"] == 32.0 and got["low_freq_factor"] == 1.0
    np.testing.assert_allclose(G.llama3_rope_factors(got, head_dim), factors, rtol=1e-5)
    if hi == 4.0:
        assert got == params
    with pytest.raises(gguf_io.GGUFError, match="do not follow Llama-3"):
        llama_family.llama3_rope_from_factors(np.linspace(1, 5, 32), 500000.0, 64)


def gemma_meta(**extra):
    """Gemma3 GGUF metadata of a 12-layer model without a layer-pattern key, plus `extra`."""
    meta = {"general.architecture": "gemma3", "gemma3.embedding_length": 64, "gemma3.block_count": 12,
            "gemma3.feed_forward_length": 96, "gemma3.attention.head_count": 4, "gemma3.attention.head_count_kv": 1,
            "gemma3.attention.key_length": 16, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
            "gemma3.attention.sliding_window": 8, **extra}
    return meta


class _Shape:
    """Stands in for a GGUF tensor where only its (GGUF-ordered) shape is read."""

    def __init__(self, *shape):
        self.shape = np.array(shape)


def test_gemma3_defaults_follow_llama_cpp(tmp_path):
    """No pattern key: every 6th layer global; local rope base 10000; q.k scale from head_dim."""
    config = gguf_io.hf_config(gemma_meta(), {"token_embd.weight": _Shape(64, 50)}, tmp_path / "x.gguf")
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [5, 11]
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0
    assert config["query_pre_attn_scalar"] == 16 and config["vocab_size"] == 50 and config["tie_word_embeddings"]


def test_unsupported_files_are_named(tmp_path):
    path = tmp_path / "x.gguf"
    with pytest.raises(gguf_io.GGUFError, match=r"architecture 'phi3' is not supported"):
        gguf_io.hf_config({"general.architecture": "phi3"}, {}, path)
    with pytest.raises(gguf_io.GGUFError, match=r"gemma3.rope.scaling.type 'yarn' is not supported"):
        gguf_io.hf_config(gemma_meta(**{"gemma3.rope.scaling.type": "yarn"}), {"token_embd.weight": _Shape(64, 50)},
                          path)
    meta = gemma_meta()
    del meta["gemma3.attention.sliding_window"]
    with pytest.raises(gguf_io.GGUFError, match=r"x.gguf: metadata key 'gemma3.attention.sliding_window' is missing"):
        gguf_io.hf_config(meta, {"token_embd.weight": _Shape(64, 50)}, path)
    with pytest.raises(gguf_io.GGUFError, match="does not exist"):
        gguf_io.open_gguf(tmp_path / "none.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(gguf_io.GGUFError, match="bad.gguf: not a readable GGUF file"):
        gguf_io.open_gguf(tmp_path / "bad.gguf")


def test_unknown_tensor_is_named(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((50, 64), np.float32))
    writer.add_tensor("blk.0.attn_qkv.weight", np.zeros((192, 64), np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    reader = gguf_io.open_gguf(tmp_path / "odd.gguf")
    config = {"num_attention_heads": 4, "num_key_value_heads": 4}
    with pytest.raises(gguf_io.GGUFError, match=r"tensor 'blk.0.attn_qkv.weight' has no Hugging Face counterpart"):
        gguf_io.plan_tensors(reader, config, "llama", tmp_path / "odd.gguf")


def test_cli(tmp_path, capsys):
    G.write_gguf("qwen3", tmp_path / "q.gguf")
    assert convert_gguf.main([str(tmp_path / "q.gguf"), str(tmp_path / "out")]) == 0
    assert from_pretrained(tmp_path / "out").config.family == "qwen3"
    assert convert_gguf.main([str(tmp_path / "missing.gguf"), str(tmp_path / "out2")]) == 1
    assert capsys.readouterr().err.strip().startswith("convert_gguf error: GGUF file")
