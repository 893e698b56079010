"""The straight-line Threefry lowering on CPU: Random123's known answers, a NumPy reference, JAX's own bits, and
no loop left in the compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

from icml_jax.cpu_rng import PARITY, ROTATIONS  # importing icml_jax registers the lowering


def numpy_threefry(key: np.ndarray, x1: np.ndarray, x2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32, 20 rounds, in NumPy uint32 arithmetic (wrapping), written from the specification."""
    ks = [np.uint32(key[0]), np.uint32(key[1]), np.uint32(key[0]) ^ np.uint32(key[1]) ^ PARITY]
    a, b = (x1 + ks[0]).astype(np.uint32), (x2 + ks[1]).astype(np.uint32)
    with np.errstate(over="ignore"):
        for group in range(5):
            for r in ROTATIONS[group % 2]:
                a = a + b
                b = (b << np.uint32(r)) | (b >> np.uint32(32 - r))
                b = a ^ b
            a = a + ks[(group + 1) % 3]
            b = b + ks[(group + 2) % 3] + np.uint32(group + 1)
    return a, b


def test_known_answers_of_random123():
    vectors = [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
               ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
               ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]
    hash_ = jax.jit(threefry_2x32)
    for key, count, expected in vectors:
        out = hash_(jnp.asarray(key, jnp.uint32), jnp.asarray(count, jnp.uint32))
        assert tuple(int(v) for v in out) == expected


def test_equals_the_numpy_reference_on_random_counters():
    rng = np.random.default_rng(0)
    key = rng.integers(0, 2**32, 2, dtype=np.uint32)
    count = rng.integers(0, 2**32, 2 * 513, dtype=np.uint32)  # odd halves: the hash pads and splits the counter
    out = np.asarray(jax.jit(threefry_2x32)(jnp.asarray(key), jnp.asarray(count)))
    half = count.size // 2
    a, b = numpy_threefry(key, count[:half], count[half:])
    np.testing.assert_array_equal(out, np.concatenate([a, b]))


def test_jax_random_gives_the_bits_of_the_looped_lowering_and_compiles_without_a_loop():
    # Recorded from JAX 0.10.2's own (looped) CPU lowering, in a process that did not import icml_jax.
    bits = jax.jit(lambda k: jax.random.bits(k, (6,)))
    assert [int(x) for x in bits(jax.random.key(42))] == [2098992034, 2919706841, 2646866425, 2409546199,
                                                          1935504149, 2516274904]
    split = jax.random.key_data(jax.jit(lambda k: jax.random.split(k, 2))(jax.random.key(7)))
    assert np.asarray(split).tolist() == [[3625411723, 1954958720], [195045567, 4062205631]]
    hlo = jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (8, 64))).lower(jax.random.key(0)).compile().as_text()
    assert "while" not in hlo.lower()
