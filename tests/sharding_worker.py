"""Run by tests/test_parallel.py with 8 fake CPU devices: sharded vs single-device forward and LoRA step.

Usage: python tests/sharding_worker.py CHECKPOINT_DIR. Prints one JSON object on the last stdout line.
"""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

from icml_jax import parallel  # noqa: E402
from icml_jax.models import from_pretrained, lora  # noqa: E402
from tests import lora_helpers as H  # noqa: E402

MESH = {"data": 2, "fsdp": -1, "tensor": 2}
LORA = lora.LoraConfig(rank=4, alpha=8.0, dropout=0.1)


def record_transfers():
    """Wraps make_array_from_callback so every host->device piece the loader sends is recorded."""
    pieces: list[tuple[tuple[int, ...], int]] = []
    original = jax.make_array_from_callback

    def spy(shape, sharding, callback, *args, **kwargs):
        def recording(index):
            piece = callback(index)
            pieces.append((tuple(shape), int(np.size(piece))))
            return piece

        return original(shape, sharding, recording, *args, **kwargs)

    jax.make_array_from_callback = spy
    return pieces, lambda: setattr(jax, "make_array_from_callback", original)


def sharding_report(model, mesh) -> dict:
    """Parameters whose sharding differs from the rules, and how many are really split."""
    wrong, split, per_device_ok = [], 0, True
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = var.get_raw_value()
        expected = parallel.variable_sharding(var, mesh)
        if not value.sharding.is_equivalent_to(expected, value.ndim):
            wrong.append(f"{'/'.join(map(str, path))}: {value.sharding.spec} != {expected.spec}")
        shard_shape = expected.shard_shape(value.shape)
        split += shard_shape != value.shape
        per_device_ok &= all(s.data.shape == shard_shape for s in value.addressable_shards)
    return {"wrong": wrong, "split": split, "per_device_ok": bool(per_device_ok)}


def lora_axes_report(model) -> list[str]:
    """Adapters whose axes do not follow their base weight (A: input axes + rank; B: rank + output axes; both
    behind the stacked weight's leading `layers` axis)."""
    params = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    bad = []
    for path, ad in lora.adapters_by_weight(model).items():
        layers, *axes = tuple(params[path].get_metadata()["logical_axes"])
        a_axes, b_axes = ad["a"].get_metadata()["logical_axes"], ad["b"].get_metadata()["logical_axes"]
        if (layers, a_axes[0], b_axes[0]) != ("layers",) * 3:
            bad.append(f"{path}: not stacked over layers: {a_axes} {b_axes}")
            continue
        a_axes, b_axes = a_axes[1:], b_axes[1:]
        if a_axes[-1] is not None or b_axes[0] is not None or tuple(a_axes[:-1]) + tuple(b_axes[1:]) != tuple(axes):
            bad.append(f"{path}: {a_axes} {b_axes} vs {axes}")
    return bad


def main(directory: str) -> None:
    mesh = parallel.make_mesh(MESH)
    out: dict = {"mesh_shape": list(mesh.devices.shape), "devices": jax.device_count()}
    try:
        parallel.make_mesh({"data": 3, "fsdp": 1, "tensor": 2})
    except ValueError as e:
        out["bad_mesh_error"] = str(e)

    pieces, restore = record_transfers()
    sharded = from_pretrained(directory, mesh=mesh)
    restore()
    out["transfers"] = {"count": len(pieces), "max_fraction": max(size / math.prod(shape) for shape, size in pieces),
                        "full_copies": sum(size == math.prod(shape) for shape, size in pieces)}
    out["params"] = sharding_report(sharded, mesh)
    layer = sharded.layers  # the stacked block
    out["specs"] = {name: str(tuple(v[...].sharding.spec)) for name, v in (
        ("embedding", sharded.embedding), ("lm_head", sharded.lm_head), ("q", layer.attn.q), ("k", layer.attn.k),
        ("o", layer.attn.o), ("gate", layer.mlp.gate), ("down", layer.mlp.down), ("norm", layer.input_norm.scale))}
    single = from_pretrained(directory)

    ids, mask = H.token_batch(batch=4, vocab=128)
    g_ids, g_mask = parallel.global_batch((ids, mask), mesh)
    ref = np.asarray(H.forward(single, jnp.asarray(ids), jnp.asarray(mask)))
    got = np.asarray(H.forward(sharded, g_ids, g_mask))
    real = mask.astype(bool)
    out["logits_max_diff"] = float(np.abs(ref - got)[real].max())
    out["logits_scale"] = float(np.abs(ref).max())

    results = {}
    for name, base, tokens in (("single", single, (jnp.asarray(ids), jnp.asarray(mask))),
                               ("sharded", sharded, (g_ids, g_mask))):
        model = lora.apply_lora(base, LORA, seed=5)
        H.randomize_adapters(model, seed=6)
        if name == "sharded":
            out["lora_params"] = sharding_report_lora(model, mesh)
            out["lora_axes_bad"] = lora_axes_report(model)
        model.train()
        optimizer = H.make_optimizer(model)
        before = H.adapters_numpy(model)
        loss = float(H.train_step(model, optimizer, *tokens))
        after = H.adapters_numpy(model)
        results[name] = (loss, before, after)
    (l1, b1, a1), (l2, b2, a2) = results["single"], results["sharded"]
    out["loss"] = [l1, l2]
    out["adapters_max_diff"] = max(float(np.abs(a1[k] - a2[k]).max()) for k in a1)
    out["adapters_max_change"] = min(float(np.abs(a1[k] - b1[k]).max()) for k in a1)
    print(json.dumps(out))


def sharding_report_lora(model, mesh) -> dict:
    """Like sharding_report, for the adapters."""
    wrong, split = [], 0
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        value = var.get_raw_value()
        expected = parallel.variable_sharding(var, mesh)
        if not value.sharding.is_equivalent_to(expected, value.ndim):
            wrong.append(f"{'/'.join(map(str, path))}: {value.sharding.spec} != {expected.spec}")
        split += expected.shard_shape(value.shape) != value.shape
    return {"wrong": wrong, "split": split}


if __name__ == "__main__":
    main(sys.argv[1])
