"""Our decoder against `transformers` PyTorch on tiny random checkpoints, float32, max |logit diff| <= 1e-4."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from icml_jax.models import Decoder, from_pretrained
from tests.models import hf_fixtures as F

TOL = 1e-4
KINDS = ["llama", "llama_tied", "llama_bias", "qwen2", "qwen2_tied_swa", "qwen3", "gemma3"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> (directory, torch model), built once per module."""
    out = {}
    for kind in KINDS:
        d = tmp_path_factory.mktemp(kind)
        out[kind] = (d, F.build(kind, d))
    return out


def padded_batch(length: int = 13, seed: int = 0):
    """Two rows, the second left-padded by 4; positions count real tokens only."""
    ids = np.random.RandomState(seed).randint(3, 97, size=(2, length))
    mask = np.ones_like(ids)
    mask[1, :4] = 0
    ids[1, :4] = 0
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return ids, mask, positions


def our_logits(model, ids, mask):
    return np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)).logits)


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers_on_padded_batch(checkpoints, kind):
    directory, torch_model = checkpoints[kind]
    model = from_pretrained(directory)
    ids, mask, positions = padded_batch()
    ref = F.torch_logits(torch_model, ids, mask, positions)
    ours = our_logits(model, ids, mask)
    real = mask.astype(bool)
    assert np.abs(ref - ours)[real].max() <= TOL
    assert np.abs(ref).max() > 1.0  # the weights are large enough for a layout error to show


@pytest.mark.parametrize("kind", ["gemma3", "qwen2_tied_swa"])
def test_sliding_window_is_exercised(checkpoints, kind):
    """Sequence longer than the window: turning the window off must change the logits (so the test above bites)."""
    directory, torch_model = checkpoints[kind]
    model = from_pretrained(directory)
    assert model.config.sliding_window < 13 and "sliding_attention" in model.config.layer_types
    if kind == "gemma3":
        assert model.config.rope_local.theta != model.config.rope.theta
    ids, mask, positions = padded_batch()
    ref = F.torch_logits(torch_model, ids, mask, positions)
    no_window = dataclasses.replace(model.config, layer_types=("full_attention",) * model.config.num_layers)
    graphdef, state = nnx.split(model)
    other = nnx.merge(graphdef, state)
    other.config = no_window  # the decoder picks each layer's mask and rope from its config's layer_types
    other.layers.attn.config = no_window
    assert np.abs(ref - our_logits(other, ids, mask))[mask.astype(bool)].max() > 100 * TOL


def test_attention_bias_flags(checkpoints):
    """Llama's attention_bias adds q, k, v and o biases; Qwen2 has q/k/v biases but no o bias, window off by default."""
    llama, qwen2, swa = (from_pretrained(checkpoints[k][0]).config for k in ("llama_bias", "qwen2", "qwen2_tied_swa"))
    assert llama.qkv_bias and llama.o_bias
    assert qwen2.family == "qwen2" and qwen2.qkv_bias and not qwen2.o_bias and not qwen2.tie_embeddings
    assert qwen2.sliding_window is None and set(qwen2.layer_types) == {"full_attention"}
    assert swa.sliding_window == 5 and swa.layer_types == ("full_attention",) + ("sliding_attention",) * 2
    assert swa.tie_embeddings


def test_gemma3_text_tower_of_multimodal_checkpoint(tmp_path):
    torch_model = F.build_gemma3_multimodal(tmp_path)
    model = from_pretrained(tmp_path)
    assert model.config.family == "gemma3"
    ids, mask, positions = padded_batch()
    ref = F.torch_logits(torch_model, ids, mask, positions)
    assert np.abs(ref - our_logits(model, ids, mask))[mask.astype(bool)].max() <= TOL


def test_sharded_checkpoint_with_index(tmp_path):
    torch_model = F.build("llama", tmp_path, max_shard_size="40KB")
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) > 2 and (tmp_path / "model.safetensors.index.json").exists()
    model = from_pretrained(tmp_path)
    ids, mask, positions = padded_batch(seed=1)
    ref = F.torch_logits(torch_model, ids, mask, positions)
    assert np.abs(ref - our_logits(model, ids, mask))[mask.astype(bool)].max() <= TOL


def test_bfloat16_forward_close_to_float32(checkpoints):
    directory, _ = checkpoints["qwen3"]
    f32, bf16 = from_pretrained(directory), from_pretrained(directory, dtype=jnp.bfloat16)
    assert bf16.embedding[...].dtype == jnp.bfloat16
    ids, mask, _ = padded_batch()
    a, b = our_logits(f32, ids, mask), our_logits(bf16, ids, mask)
    real = mask.astype(bool)
    assert np.isfinite(b).all()
    rel = np.abs(a - b)[real].max() / np.abs(a)[real].max()
    assert rel < 0.05
    assert (a.argmax(-1) == b.argmax(-1))[real].mean() > 0.9


def test_model_without_cache_is_a_plain_decoder():
    """A freshly initialised model runs and returns [batch, length, vocab] logits first."""
    from icml_jax.models import ModelConfig

    config = ModelConfig.from_hf(json.loads(F.CONFIGS["qwen3"]().to_json_string()))
    model = Decoder(config, rngs=nnx.Rngs(0))
    out = model(jnp.ones((2, 5), jnp.int32))
    assert out[0].shape == (2, 5, config.vocab_size) and out.hidden.shape == (2, 5, config.hidden_size)
