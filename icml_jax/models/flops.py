"""Model FLOPs of the decoder's matrix products: the numerator of a FLOP floor or a model FLOP utilisation.

Counted as 2 x multiply-adds of every projection (LoRA adapters included) and of attention's q.k and p.v over the
full (causal, unmasked) square the decoder computes; elementwise work (norms, rope, softmax) is left out, as in
the usual MFU accounting. XLA's own cost analysis counts a `lax.scan` body once, so it cannot give this figure
for the scanned decoder; `tests/models/test_flops.py` checks these counts against XLA's on unrolled layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from icml_jax.models.config import ModelConfig

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


def projection_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(inputs, outputs) of each projection of one layer."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return {"q": (c.hidden_size, q), "k": (c.hidden_size, kv), "v": (c.hidden_size, kv), "o": (q, c.hidden_size),
            "gate": (c.hidden_size, c.intermediate_size), "up": (c.hidden_size, c.intermediate_size),
            "down": (c.intermediate_size, c.hidden_size)}


def _parts(config: ModelConfig, length: int, cached: int, lora_rank: int, lora_targets: Sequence[str]
           ) -> tuple[float, float, float]:
    """Per sequence and layer: FLOPs of the frozen projections, of the adapters and of attention's two products."""
    c = config
    shapes = projection_shapes(c)
    weights = sum(i * o for i, o in shapes.values())
    adapters = sum(lora_rank * (i + o) for name, (i, o) in shapes.items() if name in lora_targets)
    attention = 2 * length * (cached + length) * c.num_heads * c.head_dim  # one of q.k, p.v
    return 2.0 * length * weights, 2.0 * length * adapters, 2.0 * attention


def forward_flops(config: ModelConfig, rows: int, length: int, *, lora_rank: int = 0,
                  lora_targets: Sequence[str] = PROJECTIONS, logits: bool = False, cached: int = 0) -> float:
    """FLOPs of one forward pass over `rows` sequences of `length` new tokens attending to `cached` earlier
    slots plus themselves; `logits` adds the vocabulary head on every position."""
    frozen, adapters, attention = _parts(config, length, cached, lora_rank, lora_targets)
    per_row = config.num_layers * (frozen + adapters + attention)
    if logits:
        per_row += 2.0 * length * config.hidden_size * config.vocab_size
    return float(rows * per_row)


def train_flops(config: ModelConfig, rows: int, length: int, *, lora_rank: int,
                lora_targets: Sequence[str] = PROJECTIONS) -> float:
    """FLOPs of a forward and backward pass through a frozen backbone with LoRA adapters (no logits). The
    backward computes every activation gradient (once more each frozen product, twice each attention product,
    the adapters' input gradients) and the adapters' weight gradients, but no frozen weight gradient."""
    frozen, adapters, attention = _parts(config, length, 0, lora_rank, lora_targets)
    forward = frozen + adapters + attention
    backward = frozen + 2 * adapters + 2 * attention
    return float(rows * config.num_layers * (forward + backward))
