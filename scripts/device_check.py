"""The GPU check in one run: backbone speed against `transformers` in bfloat16, one PPO update's model FLOP
utilisation, and one plan + trigger decision's latency beside the paper's Figure 10, printed as one table.

Weights are random (speed does not depend on their values; parity with `transformers` is tested on CPU by
`tests/models`): SmolLM2-135M's architecture and the `llama-3.2-1b` preset. The bfloat16 matmul peak measured in
the same run gives each row its floor. Run it through `scripts/device_check.sh` on a machine with a GPU (about 4
minutes on an H200); `--smoke` runs every row at toy sizes on any backend (the test suite runs it on CPU), and its
figures mean nothing.

    python scripts/device_check.py [--smoke] [--dtype bfloat16] [--rows backbone,ppo,decisions] [--slots N]
                                   [--remat full,dots,none]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from icml_jax.models import Decoder, ModelConfig  # noqa: E402
from icml_jax.models import sampler as S  # noqa: E402
from icml_jax.models.flops import forward_flops, train_flops  # noqa: E402
from icml_jax.models.presets import PRESETS  # noqa: E402

SMOLLM2 = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
               rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
TOY = dict(SMOLLM2, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16)
# Figure 10, ICML: (b) retrieval ~13 ms, (a) construction ~63 ms, as ../shared/docs/paper_numbers.md reads them
# (its "?": the annotations' attribution to methods is by size)
PAPER_MS = {"trigger": 13.0, "planner": 63.0}
ROWS: list[tuple[str, str, str, str, str]] = []  # (measure, ours, reference, ratio, floor / note)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What each row runs: prefill (batch x length), decode (batch, prompt, new tokens), PPO minibatch."""

    prefill: tuple[tuple[int, int], ...] = ((1, 512), (4, 256))
    decode: tuple[tuple[int, int, int], ...] = ((1, 16, 128), (4, 16, 128))
    slots: int = 2  # PPO minibatch slots (one Planner row + one Trigger decision each); 4 did not fit an H200
    candidates: int = 16
    length: int = 256
    repeats: int = 5


SMOKE = Sizes(prefill=((1, 32),), decode=((1, 8, 8),), slots=2, candidates=4, length=32, repeats=2)


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `fn()` after one warm-up call (which compiles); `fn` must block on its result."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(dtype, n: int, repeats: int) -> float:
    """FLOP/s of a jitted n^3 matmul in `dtype`: the compute limit this device reaches from XLA."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x: x @ x)
    return 2 * n**3 / median_time(lambda: mm(a).block_until_ready(), repeats)


def row(measure: str, ours: str, reference: str = "", ratio: str = "", note: str = "") -> None:
    ROWS.append((measure, ours, reference, ratio, note))
    print(f"  {measure}: {ours} | {reference} | {ratio} | {note}", flush=True)


def torch_pair(hf: dict, dtype_name: str):
    """A `transformers` model of the same config (random weights) on the GPU, or None without torch or CUDA."""
    try:
        import torch
        import transformers
    except ImportError:
        return None, None
    if not torch.cuda.is_available():
        return None, None
    config = transformers.AutoConfig.for_model(**hf)
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, dtype_name))
    return model.cuda().eval(), torch


def backbone_rows(name: str, hf: dict, sizes: Sizes, dtype, peak: float) -> None:
    """Prefill (full logits) and cached greedy decode, ours against transformers, same config, same dtype."""
    config = ModelConfig.from_hf(hf)
    ours = Decoder(config, dtype=dtype, rngs=nnx.Rngs(0))
    theirs, torch = torch_pair(hf, jnp.dtype(dtype).name)
    forward = nnx.jit(lambda m, t: m(t).logits)
    for batch, length in sizes.prefill:
        ids = np.random.RandomState(0).randint(3, config.vocab_size, (batch, length)).astype(np.int32)
        t_ours = median_time(lambda: forward(ours, jnp.asarray(ids)).block_until_ready(), sizes.repeats)
        floor = forward_flops(config, batch, length, logits=True) / peak
        ref = ratio = ""
        if theirs is not None:
            ids_t = torch.as_tensor(ids, dtype=torch.long, device="cuda")

            def run_theirs():
                with torch.no_grad():
                    theirs(ids_t, use_cache=False).logits
                torch.cuda.synchronize()

            t_theirs = median_time(run_theirs, sizes.repeats)
            ref, ratio = f"{batch * length / t_theirs:.0f} tok/s", f"{t_theirs / t_ours:.2f}x"
        row(f"{name} prefill b{batch} x {length}", f"{batch * length / t_ours:.0f} tok/s", ref, ratio,
            f"{floor / t_ours:.0%} of the matmul peak")
    for batch, prompt, new in sizes.decode:
        prompts = [list(r) for r in np.random.RandomState(1).randint(3, config.vocab_size, (batch, prompt))]
        t_ours = median_time(lambda: S.generate_tokens(ours, prompts, max_new_tokens=new, eos_ids=[]), sizes.repeats)
        ref = ratio = ""
        if theirs is not None:
            short = torch.as_tensor(np.array(prompts), dtype=torch.long, device="cuda")

            def gen_theirs():
                with torch.no_grad():
                    theirs.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=new,
                                    min_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
                torch.cuda.synchronize()

            t_theirs = median_time(gen_theirs, sizes.repeats)
            ref, ratio = f"{batch * new / t_theirs:.1f} tok/s", f"{t_theirs / t_ours:.2f}x"
        row(f"{name} decode b{batch}, {prompt} + {new} new", f"{batch * new / t_ours:.1f} tok/s", ref, ratio,
            "end to end (prefill included)")


def policies_on(hf: dict, dtype, rank: int = 8, remat: str = "none"):
    """MemoryPolicies with LoRA rank `rank` on a random backbone of config `hf` (`remat`: policy.remat)."""
    from icml_jax.agents.policy import MemoryPolicies
    from icml_jax.models.lora import LoraConfig, apply_lora

    backbone = apply_lora(Decoder(ModelConfig.from_hf(hf), dtype=dtype, rngs=nnx.Rngs(0)), LoraConfig(rank=rank))
    backbone.remat = remat
    return MemoryPolicies(backbone, pooling="last", rngs=nnx.Rngs(1))


def ppo_row(name: str, hf: dict, sizes: Sizes, dtype, peak: float, remat: str = "none") -> None:
    """One PPO update (1 epoch over one minibatch of `sizes.slots` turn slots: Planner rows [slots, length],
    Trigger rows [slots, candidates, length]) and its model FLOP utilisation; the device's peak memory is the
    process's so far (run several `remat` rows in the order full, dots, none)."""
    from icml_jax.rl.config import PPOConfig
    from icml_jax.rl.batch import collate, rollout_stats
    from icml_jax.rl.trajectory import PlannerItem, Slot, TriggerItem
    from icml_jax.rl.updater import JointUpdater

    policies = policies_on(hf, dtype, remat=remat)
    config = ModelConfig.from_hf(hf)
    rng = np.random.default_rng(0)
    length, cands = sizes.length, sizes.candidates
    slots = []
    for _ in range(sizes.slots):
        p_tok = rng.integers(3, config.vocab_size, length).astype(np.int32)
        t_tok = rng.integers(3, config.vocab_size, (cands, length)).astype(np.int32)
        slots.append(Slot(PlannerItem(p_tok, np.ones(length, bool), 1, 0.5, 0.5, -0.7),
                          TriggerItem(t_tok, np.ones((cands, length), bool), np.ones(cands, bool), 1, 0.5, 0.5,
                                      -np.log(cands))))
    batches = [collate(slots, sizes.slots)]
    rollout = [rollout_stats(slots, sizes.slots)]
    updater = JointUpdater(policies, PPOConfig(epochs=1, minibatch_size=sizes.slots))

    def update():
        result = updater.run(batches, np.random.default_rng(0), rollout)
        jax.block_until_ready(nnx.state(policies))
        return result

    seconds = median_time(update, sizes.repeats)
    peak_bytes = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    memory = f", peak {peak_bytes / 2**30:.1f} GiB on the device" if peak_bytes else ""
    flops = train_flops(config, sizes.slots * (1 + cands), length, lora_rank=8)
    label = "" if remat == "none" else f", remat {remat}"
    row(f"{name} PPO update, {sizes.slots} slots x (1 + {cands}) rows x {length}{label}", f"{seconds * 1e3:.0f} ms",
        "", "", f"MFU {flops / seconds / peak:.0%} ({flops / 1e12:.2f} TFLOP, LoRA r8{memory})")


def decision_rows(name: str, hf: dict, sizes: Sizes, dtype) -> None:
    """One Trigger decision over 15 stored memories and one Planner decision (the agent's jitted scoring), beside
    the paper's ICML latencies (Figure 10: ~13 ms retrieval, ~63 ms construction)."""
    from icml_jax.agents.policy import planner_act, trigger_act

    policies = policies_on(hf, dtype)
    graphdef, state = nnx.split(policies)
    config = ModelConfig.from_hf(hf)
    rng = np.random.default_rng(0)
    cands, length = sizes.candidates, sizes.length
    t_tok = jnp.asarray(rng.integers(3, config.vocab_size, (1, cands, length)), jnp.int32)
    t_mask, cand = jnp.ones((1, cands, length), bool), jnp.ones((1, cands), bool)
    p_tok = jnp.asarray(rng.integers(3, config.vocab_size, (1, length)), jnp.int32)
    key = jax.random.key(0)
    t = median_time(lambda: jax.block_until_ready(trigger_act(graphdef, state, t_tok, t_mask, cand, key)),
                    sizes.repeats)
    p = median_time(lambda: jax.block_until_ready(planner_act(graphdef, state, p_tok, jnp.ones_like(p_tok, bool),
                                                              key)), sizes.repeats)
    row(f"{name} Trigger decision, {cands} options x {length}", f"{t * 1e3:.1f} ms", f"{PAPER_MS['trigger']:.0f} ms",
        f"{PAPER_MS['trigger'] / (t * 1e3):.2f}x", "paper: ICML retrieval latency (Fig. 10b), its backbone")
    row(f"{name} Planner decision, 1 x {length}", f"{p * 1e3:.1f} ms", f"{PAPER_MS['planner']:.0f} ms",
        f"{PAPER_MS['planner'] / (p * 1e3):.2f}x", "paper: construction (Fig. 10a) includes writing the note")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="toy sizes, any backend (checks the script runs)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rows", default="backbone,ppo,decisions", help="which rows to run (comma-separated)")
    parser.add_argument("--slots", type=int, help="PPO minibatch slots (default: Sizes.slots)")
    parser.add_argument("--remat", default="none",
                        help="policy.remat of the PPO rows, comma-separated (full,dots,none)")
    args = parser.parse_args()
    dtype = jnp.dtype(args.dtype)
    sizes = SMOKE if args.smoke else Sizes()
    if args.slots:
        sizes = dataclasses.replace(sizes, slots=args.slots)
    wanted = set(args.rows.split(","))
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}), {len(jax.devices())} device(s); "
          f"dtype {args.dtype}{'; SMOKE sizes: figures mean nothing' if args.smoke else ''}", flush=True)
    peak = matmul_peak(dtype, 256 if args.smoke else 8192, sizes.repeats)
    row(f"{args.dtype} matmul peak (jitted n^3)", f"{peak / 1e12:.1f} TFLOP/s", "", "", "the floors' denominator")
    models = {"toy": TOY} if args.smoke else {"SmolLM2-135M": SMOLLM2, "llama-3.2-1b": PRESETS["llama-3.2-1b"]}
    for name, hf in models.items() if "backbone" in wanted else ():
        backbone_rows(name, hf, sizes, dtype, peak)
    big = list(models)[-1]
    for remat in args.remat.split(",") if "ppo" in wanted else ():
        ppo_row(big, models[big], sizes, dtype, peak, remat)
    if "decisions" in wanted:
        decision_rows(big, models[big], sizes, dtype)
    print("\n| measure | ours | reference | ratio | floor / note |\n|---|---:|---:|---:|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
