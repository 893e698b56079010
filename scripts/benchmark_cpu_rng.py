"""Threefry on XLA:CPU: JAX's looped lowering against `icml_jax.cpu_rng`'s straight-line one, side by side in
one process.

For each backbone, the warm-up's planner and trigger steps (LoRA r8 with the paper's dropout 0.1, which draws a
mask per adapted projection) are compiled and timed under each lowering: compile seconds, ms per step (median of
`--repeats` rounds of `--steps` steps), the optimized program's fusions and while loops, and the ratio
looped / straight-line. The two lowerings are checked to give the same bits first.

    python scripts/benchmark_cpu_rng.py                       # the tests' tiny backbone and 4 SmolLM2 layers
    python scripts/benchmark_cpu_rng.py --models tiny --steps 40
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

from icml_jax import cpu_rng
from icml_jax.agents.policy import MemoryPolicies
from icml_jax.models.config import ModelConfig, RopeConfig
from icml_jax.models.decoder import Decoder
from icml_jax.models.lora import LoraConfig, apply_lora
from icml_jax.train import supervised as sup

MODELS = {  # name -> ModelConfig: the tests' tiny Qwen3-style decoder, SmolLM2-135M's shapes at 4 layers
    "tiny": lambda: ModelConfig(family="qwen3", vocab_size=512, hidden_size=64, intermediate_size=96, num_layers=2,
                                num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6, rope=RopeConfig(theta=1e6),
                                qk_norm=True),
    "smollm2_4l": lambda: ModelConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                      num_layers=4, num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                                      rope=RopeConfig(theta=1e5), tie_embeddings=True),
}


def looped_threefry(key1, key2, x1, x2):
    """Threefry-2x32 as JAX lowers it on CPU by default: the 5 groups of 4 rounds under a `fori_loop`."""
    key1, key2, x1, x2 = jnp.broadcast_arrays(key1, key2, x1, x2)
    ks = [key1, key2, key1 ^ key2 ^ cpu_rng.PARITY]
    rot = [jnp.asarray(r, jnp.uint32) for r in cpu_rng.ROTATIONS]

    def body(i, state):
        (a, b), ks, rot = state
        for j in range(4):
            a = a + b
            b = lax.shift_left(b, rot[0][j]) | lax.shift_right_logical(b, np.uint32(32) - rot[0][j])
            b = a ^ b
        return (a + ks[0], b + ks[1] + (i + 1).astype(jnp.uint32)), ks[1:] + ks[:1], rot[1:] + rot[:1]

    (a, b), _, _ = lax.fori_loop(0, 5, body, ((x1 + ks[0], x2 + ks[1]), ks[1:] + ks[:1], rot))
    return a, b


LOWERINGS = {"looped (JAX's CPU default)": looped_threefry, "straight-line (icml_jax.cpu_rng)": cpu_rng.threefry2x32}


def use(lowering) -> None:
    """Registers `lowering` for threefry on CPU and drops every compiled program."""
    mlir.register_lowering(threefry2x32_p, mlir.lower_fun(lowering, multiple_results=True), platform="cpu")
    jax.clear_caches()


def same_bits() -> bool:
    """Both lowerings give the same bits for a split, raw bits and a dropout mask."""
    draw = lambda: jax.tree.map(np.asarray, jax.jit(lambda k: (  # noqa: E731
        jax.random.key_data(jax.random.split(k, 3)), jax.random.bits(k, (1001,)),
        jax.random.bernoulli(k, 0.9, (17, 33))))(jax.random.key(5)))
    outs = []
    for lowering in LOWERINGS.values():
        use(lowering)
        outs.append(draw())
    return all(np.array_equal(a, b) for a, b in zip(*(jax.tree.leaves(o) for o in outs), strict=True))


def step_inputs(config: ModelConfig, agent: str, batch: int, length: int, options: int):
    """(step, args) of one warm-up step on random LoRA policies and a random batch."""
    policies = MemoryPolicies(apply_lora(Decoder(config, rngs=nnx.Rngs(0)), LoraConfig(), seed=0), rngs=nnx.Rngs(0))
    policies.train()
    graphdef, trainable, rng_state, frozen = sup.split_policies(policies)
    step = sup.train_step_for(sup._StepSpec.of(sup.WarmupConfig(batch_size=batch), agent))
    rng = np.random.default_rng(0)
    shape = (batch, length) if agent == "planner" else (batch, options, length)
    data = {"tokens": jnp.asarray(rng.integers(4, config.vocab_size, shape), jnp.int32),
            "mask": jnp.ones(shape, bool), "value_target": jnp.zeros((batch,), jnp.float32)}
    if agent == "planner":
        data["label"] = jnp.asarray(rng.integers(0, 2, batch), jnp.float32)
    else:
        data["cand_mask"] = jnp.ones((batch, options), bool)
        data["target"] = jnp.asarray(rng.integers(0, options, batch), jnp.int32)
    return step, [graphdef, trainable, rng_state, step.tx.init(trainable), frozen, data, jnp.zeros((), jnp.int32)]


def measure(config: ModelConfig, agent: str, args: argparse.Namespace) -> dict[str, float]:
    """compile_s, ms_per_step (median round), fusions and while loops of one warm-up step."""
    sup.train_step_for.cache_clear()
    step, inputs = step_inputs(config, agent, args.batch, args.length, args.options)
    t0 = time.perf_counter()
    compiled = step.lower(*inputs).compile()
    compile_s = time.perf_counter() - t0
    text = compiled.as_text()
    g, tr, rs, opt, fr, data, skipped = inputs
    tr, rs, opt, skipped, _ = compiled(tr, rs, opt, fr, data, skipped)  # warm
    rounds = []
    for _ in range(args.repeats):
        jax.block_until_ready(tr)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            tr, rs, opt, skipped, _ = compiled(tr, rs, opt, fr, data, skipped)
        jax.block_until_ready(tr)
        rounds.append((time.perf_counter() - t0) / args.steps * 1e3)
    return {"compile_s": compile_s, "ms_per_step": statistics.median(rounds),
            "fusions": text.count(" fusion("), "whiles": text.count(" while(")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--options", type=int, default=4, help="Trigger candidates per example")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    assert same_bits(), "the two threefry lowerings disagree"
    print(f"bits equal under both lowerings; batch {args.batch} x length {args.length}, trigger options "
          f"{args.options}, {jax.devices()[0].platform}, {jax.device_count()} device(s)\n")
    print("| backbone | step | lowering | compile s | ms / step | fusions | while loops |")
    print("|---|---|---|---:|---:|---:|---:|")
    ratios = []
    for model in args.models:
        for agent in ("planner", "trigger"):
            rows = {}
            for name, lowering in LOWERINGS.items():
                use(lowering)
                rows[name] = r = measure(MODELS[model](), agent, args)
                print(f"| {model} | {agent} | {name} | {r['compile_s']:.1f} | {r['ms_per_step']:.1f} | "
                      f"{r['fusions']} | {r['whiles']} |", flush=True)
            old, new = rows.values()
            ratios.append(f"{model} {agent}: step {old['ms_per_step'] / new['ms_per_step']:.2f}x, compile "
                          f"{old['compile_s'] / new['compile_s']:.2f}x")
    use(cpu_rng.threefry2x32)
    print("\nlooped / straight-line:\n" + "\n".join(ratios))


if __name__ == "__main__":
    main()
