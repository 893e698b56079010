"""Threefry-2x32 on XLA:CPU as straight-line code.

JAX lowers the Threefry hash behind every `jax.random` draw (adapter dropout, sampling, initialisation) to a
5-trip while loop on CPU and to straight-line code elsewhere; XLA cannot fuse across the loop, so on CPU each draw
materialises its counters and copies its carry every trip. `register()` gives the CPU the straight-line form:
the same hash, the same bits, fewer and fused kernels (docs/benchmarks.md, "Threefry on XLA:CPU").
"""

from __future__ import annotations

import numpy as np
from jax import lax
from jax import numpy as jnp
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # Threefry-2x32's rotation constants, alternating per 4 rounds
PARITY = np.uint32(0x1BD11BDA)  # the key schedule's parity constant


def threefry2x32(key1, key2, x1, x2) -> tuple:
    """Threefry-2x32 with 20 rounds (Salmon et al., 2011) over broadcast uint32 arrays, unrolled."""
    key1, key2, x1, x2 = jnp.broadcast_arrays(key1, key2, x1, x2)
    ks = (key1, key2, key1 ^ key2 ^ PARITY)
    a, b = x1 + ks[0], x2 + ks[1]
    for group in range(5):
        for r in ROTATIONS[group % 2]:
            a = a + b
            b = lax.shift_left(b, np.uint32(r)) | lax.shift_right_logical(b, np.uint32(32 - r))
            b = a ^ b
        a = a + ks[(group + 1) % 3]
        b = b + ks[(group + 2) % 3] + np.uint32(group + 1)
    return a, b


def register() -> None:
    """Lowers `threefry2x32_p` on CPU with `threefry2x32` (process-wide; later compilations use it)."""
    mlir.register_lowering(threefry2x32_p, mlir.lower_fun(threefry2x32, multiple_results=True), platform="cpu")
