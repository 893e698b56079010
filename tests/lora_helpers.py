"""Shared by the LoRA tests and the sharding / multi-host worker scripts (no torch here: workers import it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from icml_jax import parallel
from icml_jax.models import lora

LR = 0.1


def randomize_adapters(model: nnx.Module, seed: int = 0, scale: float = 0.3) -> None:
    """Gives every adapter (B included) non-zero values, deterministic in `seed` and the parameter path.

    Adapters are stacked over layers; values are drawn layer by layer, adapter by adapter (the order a per-layer
    model's state has), so a model gets the same adapters however its layers are stored."""
    rng = np.random.RandomState(seed)
    variables = [var for _, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))]
    values = [np.zeros(var.get_raw_value().shape, var.get_raw_value().dtype) for var in variables]
    for layer in range(values[0].shape[0] if values else 0):
        for value in values:
            value[layer] = scale * rng.standard_normal(value.shape[1:])
    for var, value in zip(variables, values):
        var.set_value(parallel.place(value, var.get_raw_value().sharding))


def token_batch(batch: int = 4, length: int = 12, vocab: int = 97, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random ids and a mask whose second row is left-padded by 3."""
    ids = np.random.RandomState(seed).randint(3, vocab, size=(batch, length)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


def next_token_loss(model: nnx.Module, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy over real tokens."""
    logits = model(tokens, attention_mask=mask).logits[:, :-1]
    weights = mask[:, 1:].astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    return jnp.sum(ce * weights) / jnp.sum(weights)


def make_optimizer(model: nnx.Module) -> nnx.Optimizer:
    """Plain SGD on the trainable variables only (a sign-free update, so sharded and unsharded runs compare)."""
    return nnx.Optimizer(model, optax.sgd(LR), wrt=lora.TRAINABLE)


@nnx.jit
def train_step(model: nnx.Module, optimizer: nnx.Optimizer, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """One update of the trainable variables; the model must be in train mode for dropout."""
    loss, grads = nnx.value_and_grad(next_token_loss, argnums=nnx.DiffState(0, lora.TRAINABLE))(model, tokens, mask)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def forward(model: nnx.Module, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """Logits of a (possibly sharded) model."""
    return model(tokens, attention_mask=mask).logits


def adapters_numpy(model: nnx.Module) -> dict[str, np.ndarray]:
    """Every adapter as a host array, keyed by its dotted path (gathered across processes)."""
    from icml_jax.models.export import to_host

    return {".".join(map(str, p)): to_host(v.get_raw_value())
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
