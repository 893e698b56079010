"""The policy file: one written in the layout the warm-up has always used (`warmup.json` + `state/`, written
here by hand as the former `train/checkpoint.py` wrote it) restores through `load_warmup`, and `save_warmup`
still writes that layout byte for byte."""

from __future__ import annotations

import json

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from icml_jax.agents import MemoryPolicies
from icml_jax.checkpoint import TRAINABLE, load_warmup, save_warmup
from icml_jax.models import lora
from tests.train.world_fixtures import world_backbone

LORA = lora.LoraConfig(rank=2, alpha=4.0, dropout=0.0)


def _policies(seed: int) -> MemoryPolicies:
    """Tiny LoRA policies; `seed` sets the adapters and heads (the backbone is the same for every seed)."""
    policies = MemoryPolicies(lora.apply_lora(world_backbone(64, seed=0, layers=1), LORA, seed=seed),
                              rngs=nnx.Rngs(seed))
    for i, (_, var) in enumerate(nnx.to_flat_state(nnx.state(policies, TRAINABLE))):  # heads start at zero
        value = var.get_raw_value()
        var.set_raw_value(value + jax.random.normal(jax.random.key(seed * 100 + i), value.shape, value.dtype))
    return policies


def _old_layout(path, policies: MemoryPolicies, metadata: dict) -> None:
    """Writes `policies`' trainable state exactly as the pre-issue-28 `save_warmup` did (one process)."""
    flat = {"/".join(map(str, p)): v.get_raw_value() for p, v in nnx.to_flat_state(nnx.state(policies, TRAINABLE))}
    path.mkdir(parents=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path / "state", flat, force=True)
        ckptr.wait_until_finished()
    index = {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in flat.items()}
    meta = {"format_version": 1, "params": index, **metadata}
    (path / "warmup.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def test_a_policy_file_in_the_old_layout_restores_and_the_layout_is_unchanged(tmp_path):
    trained, fresh = _policies(1), _policies(2)
    _old_layout(tmp_path / "old", trained, {"config": {"learning_rate": 2e-5}})
    meta = load_warmup(tmp_path / "old", fresh)
    assert meta["config"] == {"learning_rate": 2e-5}
    want = {k: np.asarray(v.get_raw_value()) for k, v in nnx.to_flat_state(nnx.state(trained, TRAINABLE))}
    got = {k: np.asarray(v.get_raw_value()) for k, v in nnx.to_flat_state(nnx.state(fresh, TRAINABLE))}
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    save_warmup(tmp_path / "new", trained, {"config": {"learning_rate": 2e-5}})
    assert (tmp_path / "new" / "warmup.json").read_bytes() == (tmp_path / "old" / "warmup.json").read_bytes()
    assert not list((tmp_path / "new").glob("*.tmp*"))  # the atomic write leaves no temporary file
