"""scripts/benchmark_backbone.py's host readings: the raw matmul rates of XLA and torch it prints beside every
ratio against transformers, and the CPU model that says whose libraries those rates are."""

from __future__ import annotations

import math
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from tests.scripts_loader import load_script


@pytest.fixture(scope="module")
def script() -> ModuleType:
    """scripts/benchmark_backbone.py as a module."""
    return load_script("benchmark_backbone")


def test_matmul_rates_time_both_libraries_on_the_same_shape(script, monkeypatch):
    calls = []
    monkeypatch.setattr(script, "median_time", lambda fn, repeats: (calls.append(fn()), 0.5)[1])
    xla, torch_rate = script.matmul_rates(8, 16, 32, "float32", 1, "cpu")
    assert xla == torch_rate == 2 * 8 * 16 * 32 / 0.5  # FLOPs of the shape over the measured time
    assert [tuple(c.shape) for c in calls] == [(8, 32), (8, 32)]  # each side ran the product, not a stand-in
    script.matmul_rates(4, 8, 4, "bfloat16", 1, "cpu")
    assert str(calls[2].dtype) == "bfloat16" and str(calls[3].dtype) == "torch.bfloat16"
    monkeypatch.undo()  # and with real clocks, two finite rates
    assert all(math.isfinite(r) and r > 0 for r in script.matmul_rates(64, 64, 64, "float32", 1, "cpu"))


def test_cpu_model_names_the_host(script):
    assert script.cpu_model().strip()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_pair_holds_both_models_in_the_asked_dtype(script, monkeypatch, dtype):
    """`--dtype`: ours and transformers load the same weights in that dtype and give the same logits."""
    tiny = dict(script.CONFIG, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    monkeypatch.setattr(script, "CONFIG", tiny)
    ours, theirs, description = script.load_pair(None, "cpu", dtype)
    assert description.endswith(dtype)
    assert {str(p.dtype) for p in jax.tree.leaves(nnx.state(ours, nnx.Param))} == {dtype}
    assert {p.dtype for p in theirs.parameters()} == {getattr(torch, dtype)}
    ids = np.arange(3, 19, dtype=np.int32)[None]
    mine = np.asarray(ours(jnp.asarray(ids)).logits, np.float32)
    with torch.no_grad():
        ref = theirs(torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()
    np.testing.assert_allclose(mine, ref, atol=1e-4 if dtype == "float32" else 5e-2)
