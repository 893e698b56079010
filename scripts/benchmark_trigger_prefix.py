"""Times one Trigger decision (15 candidate memories + "none" = 16 options) with the full pass and with the
shared-prefix pass (`MemoryPolicies(shared_prefix=True)`), after compilation, median of N, and prints the ratio.

Backbones: the tiny random one of `icml_jax.agents.tiny`, and SmolLM2-135M-Instruct (with LoRA, as
`agents.build` makes it) when its converted directory exists. Usage: python scripts/benchmark_trigger_prefix.py
[--repeats N] [--dtype float32|bfloat16] [--context-turns 4] [--suffix-slots 32]
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import icml_jax.agents.observation as obs
from icml_jax.agents.policy import MemoryPolicies, split_shared_prefix, trigger_act
from icml_jax.agents.tiny import build_tokenizer, learning_world, tiny_model_config, world_vocabulary
from icml_jax.models import Decoder, from_pretrained, load_tokenizer
from icml_jax.models.lora import LoraConfig, apply_lora

SMOLLM2 = Path("~/.cache/icml_jax/models/smollm2-135m-instruct").expanduser()
HISTORY = [
    ("User", "I adopted a rescue dog last spring and we walk by the river every morning before work"),
    ("Assistant", "That sounds like a lovely routine; how is the dog settling in with the neighbours?"),
    ("User", "Pretty well, although she still barks at the postman and hates the rain in the evenings"),
    ("Assistant", "Many rescue dogs take months to relax; a rain coat and treats by the door may help her."),
]
UTTERANCE = "Any idea what I could cook tonight for my sister who visits from Lyon?"
MEMORIES = [f"The user {m}" for m in (
    "is vegetarian since 2019", "has a dog named Luna", "works as a nurse on night shifts", "lives in Bristol",
    "has a sister in Lyon", "is allergic to peanuts", "plays the cello", "is training for a half marathon",
    "dislikes coriander", "moved house in March", "drives an old blue Volvo", "speaks some French",
    "enjoys spicy Thai food", "reads crime novels", "grows tomatoes on the balcony")]


def time_decision(policies: MemoryPolicies, arrays, repeats: int) -> tuple[float, float]:
    """(compile + first run, median of `repeats` runs after it) in seconds of one `trigger_act` call."""
    graphdef, state = nnx.split(policies)

    def once(seed: int) -> float:
        start = time.perf_counter()
        action, stats = trigger_act(graphdef, state, *arrays, jax.random.key(seed), greedy=True)
        jax.block_until_ready((action, stats))
        return time.perf_counter() - start

    first = once(0)
    return first, statistics.median(once(i + 1) for i in range(repeats))


def benchmark(name: str, backbone: Decoder, tokenizer, config: obs.ObservationConfig, repeats: int,
              suffix_slots: int) -> None:
    options = obs.trigger_texts(HISTORY, UTTERANCE, MEMORIES, config)
    arrays = tuple(map(jnp.asarray, obs.encode_trigger(tokenizer, [options], config)))
    tokens, mask, cand = arrays
    split = split_shared_prefix(tokens, mask, cand, suffix_slots)
    n, k = np.asarray(mask.sum(-1))[0], int(split.prefix_mask.sum())
    print(f"[{name}] options {tokens.shape[1]}, length bucket {tokens.shape[2]}, tokens per option "
          f"{n.min()}-{n.max()}, shared prefix {k}, longest suffix {int((n - k).max())} "
          f"(slots {suffix_slots}, fits {bool(split.fits)})")
    results, probs = {}, {}
    for shared in (False, True):
        policies = MemoryPolicies(backbone, shared_prefix=shared, suffix_slots=suffix_slots, rngs=nnx.Rngs(0))
        keys = iter(jax.random.split(jax.random.key(1), 2))
        for head in (policies.trigger_actor, policies.trigger_critic):  # non-uniform scores
            head.kernel[...] = jax.random.normal(next(keys), head.kernel.shape) * head.kernel.shape[0] ** -0.5
        trigger_act.clear_cache()
        results[shared] = time_decision(policies, arrays, repeats)
        print(f"[{name}] {'shared-prefix' if shared else 'full'}: compile+first {results[shared][0]:.3f} s, "
              f"decision median of {repeats} {1e3 * results[shared][1]:.1f} ms, compiled programs "
              f"{trigger_act._cache_size()}")
        graphdef, state = nnx.split(policies)
        probs[shared] = np.asarray(trigger_act(graphdef, state, *arrays, jax.random.key(0), greedy=True)[1].probs)
    diff = np.abs(np.log(probs[True][0, :len(options)]) - np.log(probs[False][0, :len(options)])).max()
    print(f"[{name}] speed-up full/shared {results[False][1] / results[True][1]:.2f}x "
          f"(max |logp diff| {diff:.2e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context-turns", type=int, default=4)
    parser.add_argument("--suffix-slots", type=int, default=32)
    parser.add_argument("--skip-real", action="store_true")
    args = parser.parse_args()
    config = obs.ObservationConfig(context_turns=args.context_turns)  # defaults: 256 tokens, 15 candidates
    print(f"backend {jax.default_backend()}, devices {jax.devices()}")
    with tempfile.TemporaryDirectory() as tmp:
        words = world_vocabulary(learning_world(), config)
        words += sorted({w for text in [UTTERANCE, *MEMORIES, *(t for _, t in HISTORY)]
                         for w in re.findall(r"\w+|[^\w\s]+", text)})  # the tiny tokenizer's words
        tokenizer = build_tokenizer(Path(tmp), words)
        backbone = Decoder(tiny_model_config(len(tokenizer)), rngs=nnx.Rngs(0))
        benchmark("tiny", backbone, tokenizer, config, args.repeats, args.suffix_slots)
    if SMOLLM2.is_dir() and not args.skip_real:
        backbone = apply_lora(from_pretrained(str(SMOLLM2), dtype=jnp.dtype(args.dtype)), LoraConfig())
        benchmark(f"smollm2-135m {args.dtype}", backbone, load_tokenizer(SMOLLM2), config, args.repeats,
                  args.suffix_slots)
    else:
        print(f"[smollm2-135m] skipped ({SMOLLM2} missing or --skip-real)")


if __name__ == "__main__":
    main()
