"""Checkpoint loading: errors that name the tensor and the file, configs, presets."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from icml_jax.models import ModelConfig, abstract_model, from_pretrained
from icml_jax.models.presets import PRESETS, preset
from icml_jax.models.safetensors_io import Checkpoint, write_tensors
from tests.models import hf_fixtures as F


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3")
    F.build("qwen3", d)
    return d


def rewrite(src, dst, edit):
    """Copies checkpoint `src` to `dst`, passing its tensors (as float32 NumPy) through `edit`."""
    shutil.copytree(src, dst)
    ckpt = Checkpoint(dst)
    tensors = {k: np.array(ckpt.get(k), dtype=np.float32) for k in ckpt.keys()}
    (dst / "model.safetensors").unlink()
    write_tensors(dst / "model.safetensors", edit(tensors))


def test_missing_tensor_is_named(qwen_dir, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    rewrite(qwen_dir, tmp_path / "m", lambda t: {k: v for k, v in t.items() if k != name})
    with pytest.raises(ValueError, match=f"lacks 1 tensor.*{name}"):
        from_pretrained(tmp_path / "m")


def test_unexpected_tensor_is_named_with_file(qwen_dir, tmp_path):
    rewrite(qwen_dir, tmp_path / "m", lambda t: {**t, "model.layers.0.extra.weight": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected.*model\.layers\.0\.extra\.weight.*model\.safetensors"):
        from_pretrained(tmp_path / "m")


def test_misshaped_tensor_is_named_with_file_and_shapes(qwen_dir, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    rewrite(qwen_dir, tmp_path / "m", lambda t: {**t, name: t[name][:-1]})
    with pytest.raises(ValueError, match=rf"{name}.*model\.safetensors.*\(63, 64\), expected \(64, 64\)"):
        from_pretrained(tmp_path / "m")


def test_bfloat16_checkpoint_loads(tmp_path):
    import torch

    model = F.build("llama_tied", tmp_path / "bf16")
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    ours = from_pretrained(tmp_path / "bf16")
    ref = model.model.embed_tokens.weight.detach().float().numpy()
    np.testing.assert_array_equal(np.asarray(ours.embedding[...]), ref)


def test_missing_directory_and_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_pretrained(tmp_path / "nope")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        from_pretrained(tmp_path / "m")


def test_config_from_hf_files(qwen_dir):
    config = ModelConfig.from_json_file(qwen_dir / "config.json")
    assert (config.family, config.head_dim, config.qk_norm, config.tie_embeddings) == ("qwen3", 32, True, True)
    assert config.num_heads * config.head_dim != config.hidden_size  # explicit head_dim honoured


def test_gemma3_layer_pattern_and_old_style_rope_keys():
    hf = {**PRESETS["gemma3-4b"]}
    config = ModelConfig.from_hf(hf)
    assert config.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert config.rope.kind == "linear" and config.rope.factor == 8.0 and config.rope.theta == 1e6
    assert config.rope_local.kind == "default" and config.rope_local.theta == 1e4
    assert config.attn_scale == pytest.approx(256**-0.5)


# Published parameter counts (embedding counted once when tied).
EXPECTED_PARAMS = {
    "llama-3.2-1b": 1.236e9, "llama-3.2-3b": 3.213e9, "llama-3.1-8b": 8.030e9,
    "gemma3-1b": 1.000e9, "gemma3-4b": 3.880e9, "gemma3-12b": 11.766e9,
    "qwen3-1.7b": 1.721e9, "qwen3-4b": 4.022e9, "qwen3-8b": 8.191e9,
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_have_the_published_sizes(name):
    model = abstract_model(preset(name))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert count == pytest.approx(EXPECTED_PARAMS[name], rel=0.01)
