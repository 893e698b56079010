"""One of two local processes joined by jax.distributed (loopback coordinator, gloo CPU collectives).

Usage: python tests/multihost_worker.py PROCESS_ID PORT CHECKPOINT_DIR OUT_DIR. Each process owns 2 fake CPU
devices; together they run a sharded forward and one LoRA step on a (data 1, fsdp 2, tensor 2) mesh that spans
both processes; process 0 then repeats both on its first device alone. Results go to OUT_DIR/result_<i>.npz.
"""

from __future__ import annotations

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import jax  # noqa: E402

from icml_jax import parallel  # noqa: E402

PROCESS_ID, PORT, CHECKPOINT, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
info = parallel.initialize({"coordinator_address": f"127.0.0.1:{PORT}", "num_processes": 2,
                            "process_id": PROCESS_ID, "cpu_collectives": "gloo", "initialization_timeout": 60})
jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from icml_jax.models import from_pretrained, lora  # noqa: E402
from icml_jax.models.export import save_adapters, to_host  # noqa: E402
from tests import lora_helpers as H  # noqa: E402

LORA = lora.LoraConfig(rank=4, alpha=8.0, dropout=0.1)


def run(base, tokens) -> dict[str, np.ndarray]:
    """Logits, then one LoRA step (train mode, dropout on): loss and updated adapters, all as host arrays."""
    out = {"logits": to_host(H.forward(base, *tokens))}
    model = lora.apply_lora(base, LORA, seed=5)
    H.randomize_adapters(model, seed=6)
    model.train()
    optimizer = H.make_optimizer(model)
    mesh = parallel.model_mesh(model)
    if mesh is not None:
        parallel.shard_model(optimizer, mesh)  # the step counter must be a global array too
    out["loss"] = np.asarray(to_host(H.train_step(model, optimizer, *tokens)))
    out.update({f"adapter/{k}": v for k, v in H.adapters_numpy(model).items()})
    out["_model"] = model
    return out


def main() -> None:
    assert (info.process_index, info.process_count, info.local_device_count, info.device_count) == (PROCESS_ID, 2, 2, 4)
    mesh = parallel.make_mesh({"data": 1, "fsdp": -1, "tensor": 2})
    ids, mask = H.token_batch(batch=4, vocab=97)
    rows = slice(2 * PROCESS_ID, 2 * PROCESS_ID + 2)  # data loading shards by process index
    tokens = parallel.global_batch((ids[rows], mask[rows]), mesh)
    sharded = from_pretrained(CHECKPOINT, mesh=mesh)
    spans = {d.process_index for d in sharded.layers.attn.q[...].sharding.device_set}
    result = run(sharded, tokens)
    save_adapters(result.pop("_model"), os.path.join(OUT, "adapters"))  # collective gather, process 0 writes

    reference = {}
    if PROCESS_ID == 0:  # the single-device reference, on this process's first device only
        with jax.default_device(jax.local_devices()[0]):
            reference = run(from_pretrained(CHECKPOINT), (jnp.asarray(ids), jnp.asarray(mask)))
        reference.pop("_model")
    np.savez(os.path.join(OUT, f"result_{PROCESS_ID}.npz"), spans=np.array(sorted(spans)),
             **result, **{f"ref/{k}": v for k, v in reference.items()})
    print(f"process {PROCESS_ID}: done", flush=True)


if __name__ == "__main__":
    main()
