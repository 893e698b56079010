"""Compile time of the jitted steps on a SmolLM2-135M-shaped backbone, side by side at several depths.

Measures, for each depth in `--layers`, the XLA compile time of the warm-up steps (planner and trigger), the
joint PPO step and the Planner / Trigger act functions, with the default observation sizes (length 256,
15 memories + "none" = 16 Trigger options; warm-up and PPO batches of 4, one row per act call). Weights are
random (compile time does not depend on their values). Each (depth, function) runs in a fresh process, lowered
and compiled `--repeats` times after `jax.clear_caches()`; the minimum is reported (the machine is shared, so
timings are noisy), with the optimized program's instruction count, which load does not change, and the
worker's peak resident memory. `--before DIR` also runs a checkout of older code (e.g. `git worktree add
/tmp/icml_old <commit>`) through the same measurement, for a before/after table; a worker past `--timeout`
or `--max-rss-gb` is stopped and reported as not compiled.

    python scripts/benchmark_compile.py --layers 8 30
    python scripts/benchmark_compile.py --layers 8 30 --repeats 3 --before /tmp/icml_old --timeout 1500
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FUNCTIONS = ("warmup_planner", "warmup_trigger", "ppo_step", "planner_act", "trigger_act")
ROOT = Path(__file__).resolve().parents[1]


def smollm2_config(num_layers: int):
    """SmolLM2-135M's shapes (Llama family) with `num_layers` layers."""
    from icml_jax.models.config import ModelConfig, RopeConfig

    return ModelConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_layers=num_layers, num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5,
                       rope=RopeConfig(theta=1e5), tie_embeddings=True)


def measure(num_layers: int, functions: list[str], repeats: int, length: int, options: int,
            batch: int) -> dict[str, dict[str, float]]:
    """{function: {lower_s, compile_s, hlo_instructions}} for one depth (minimum over repeats); the optimized
    program's instruction count is a load-independent measure of what XLA had to compile."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from icml_jax.agents.policy import MemoryPolicies, planner_act, trigger_act
    from icml_jax.models.decoder import Decoder
    from icml_jax.models.lora import LoraConfig, apply_lora
    from icml_jax.rl import batch as rl_batch
    from icml_jax.rl import ppo as rl_ppo
    from icml_jax.rl import updater as rl_updater
    from icml_jax.rl.config import PPOConfig
    from icml_jax.train import supervised as sup

    backbone = Decoder(smollm2_config(num_layers), dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    policies = MemoryPolicies(apply_lora(backbone, LoraConfig(), seed=0), rngs=nnx.Rngs(0))
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    i32, f32 = jnp.int32, jnp.float32

    def planner_rows(n):
        return spec((n, length), i32), spec((n, length), bool)

    def trigger_rows(n):
        return spec((n, options, length), i32), spec((n, options, length), bool), spec((n, options), bool)

    def lowered(name):
        if name.startswith("warmup_"):
            agent = name.split("_", 1)[1]
            step = sup.train_step_for(sup._StepSpec.of(sup.WarmupConfig(batch_size=batch), agent))
            policies.train()
            graphdef, trainable, rng_state, frozen = sup.split_policies(policies)
            policies.eval()
            opt_state = step.tx.init(trainable)
            if agent == "planner":
                tokens, mask = planner_rows(batch)
                data = {"tokens": tokens, "mask": mask, "label": spec((batch,), f32),
                        "value_target": spec((batch,), f32)}
            else:
                tokens, mask, cand = trigger_rows(batch)
                data = {"tokens": tokens, "mask": mask, "cand_mask": cand, "target": spec((batch,), i32),
                        "value_target": spec((batch,), f32)}
            return step.lower(graphdef, trainable, rng_state, opt_state, frozen, data, jnp.zeros((), i32))
        if name == "ppo_step":
            updater = rl_updater.JointUpdater(policies, PPOConfig(minibatch_size=batch))
            params, frozen, rest = updater.split()
            vec = lambda dtype: spec((batch,), dtype)  # noqa: E731
            p = rl_batch.PlannerBatch(*planner_rows(batch), vec(i32), vec(f32), vec(f32), vec(bool))
            t = rl_batch.TriggerBatch(*trigger_rows(batch), vec(i32), vec(f32), vec(f32), vec(bool))
            old = rl_batch.OldStats(*(vec(f32),) * 4)
            return rl_ppo.ppo_step.lower(updater.spec, params, frozen, rest, updater.opt_state,
                                            updater.num_skipped, rl_batch.Minibatch(p, t), old, jnp.asarray(True))
        graphdef, state = nnx.split(policies)
        key = jax.random.key(0)
        if name == "planner_act":
            return planner_act.lower(graphdef, state, *planner_rows(1), key)
        return trigger_act.lower(graphdef, state, *trigger_rows(1), key)

    out = {}
    for name in functions:
        best = None
        for _ in range(repeats):
            jax.clear_caches()
            t0 = time.perf_counter()
            low = lowered(name)
            t1 = time.perf_counter()
            compiled = low.compile()
            t2 = time.perf_counter()
            row = {"lower_s": t1 - t0, "compile_s": t2 - t1, "hlo_instructions": compiled.as_text().count(" = ")}
            best = row if best is None or row["compile_s"] < best["compile_s"] else best
            best["lower_s"] = min(best["lower_s"], row["lower_s"])
        out[name] = best
        print(f"  [{num_layers} layers] {name}: lower {best['lower_s']:.1f} s, compile {best['compile_s']:.1f} s",
              file=sys.stderr, flush=True)
    return out


def _rss_gb(pid: int) -> float:
    """Resident memory of process `pid` in GiB (Linux /proc; 0 when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def run_worker(code: Path, num_layers: int, name: str, repeats: int, args: argparse.Namespace) -> dict:
    """Measures one function at one depth in a fresh process on the code at `code`.

    Returns the measurement, or {"stopped": why, "seconds": s, "rss_gb": peak} when the worker passes the
    timeout or `--max-rss-gb` (it is killed: a compile that takes the shared machine's memory is reported, not
    waited for), or {"failed": status} when it dies otherwise.
    """
    env = dict(os.environ, PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--layers", str(num_layers),
           "--repeats", str(repeats), "--length", str(args.length), "--options", str(args.options),
           "--batch", str(args.batch), "--functions", name]
    start, peak = time.perf_counter(), 0.0
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file, subprocess.Popen(
            cmd, env=env, cwd=code, stdout=out_file, stderr=err_file, text=True) as proc:
        while proc.poll() is None:
            peak = max(peak, _rss_gb(proc.pid))
            elapsed = time.perf_counter() - start
            why = ("timeout" if elapsed > args.timeout else
                   "memory" if args.max_rss_gb and peak > args.max_rss_gb else None)
            if why:
                proc.kill()
                proc.wait()
                print(f"  {code} [{num_layers} layers] {name}: stopped ({why}) after {elapsed:.0f} s at "
                      f"{peak:.1f} GiB resident, not compiled", file=sys.stderr)
                return {"stopped": why, "seconds": elapsed, "rss_gb": peak}
            time.sleep(1.0)
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    if proc.returncode:
        sys.stderr.write(err[-2000:])
        print(f"  {code} [{num_layers} layers] {name}: worker died with status {proc.returncode}", file=sys.stderr)
        return {"failed": proc.returncode}
    sys.stderr.write(err.splitlines()[-1] + "\n" if err else "")
    return {**json.loads(out.strip().splitlines()[-1])[name], "rss_gb": peak}


def cell(row: dict, key: str = "compile_s") -> str:
    if "stopped" in row:
        return f"> {row['seconds']:.0f} ({row['stopped']}, {row['rss_gb']:.0f} GiB)"
    if "failed" in row:
        return f"died ({row['failed']})"
    return f"{row[key]:.1f}" if key == "compile_s" else str(row[key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 30])
    parser.add_argument("--functions", nargs="+", default=list(FUNCTIONS), choices=FUNCTIONS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--length", type=int, default=256, help="tokens per sequence (observation.max_length)")
    parser.add_argument("--options", type=int, default=16, help="Trigger options (max_candidates + 1)")
    parser.add_argument("--batch", type=int, default=4, help="warm-up batch and PPO minibatch size")
    parser.add_argument("--before", type=Path, default=None, help="a checkout of older code to compare with")
    parser.add_argument("--before-repeats", type=int, default=1, help="repeats for the older code (slow)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per function, depth and code")
    parser.add_argument("--max-rss-gb", type=float, default=12.0, help="stop a worker past this resident memory")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.layers[0], args.functions, args.repeats, args.length, args.options,
                                 args.batch)))
        return
    codes = {"after": ROOT} if args.before is None else {"before": args.before.resolve(), "after": ROOT}
    repeats = {"before": args.before_repeats, "after": args.repeats}
    results = {(label, n, name): run_worker(code, n, name, repeats[label], args)
               for label, code in codes.items() for n in args.layers for name in args.functions}
    lo, hi = min(args.layers), max(args.layers)
    print(f"compile seconds (min of {args.repeats}; before: {args.before_repeats}), SmolLM2-135M shapes, bf16, "
          f"LoRA r8 (dropout 0.1), length {args.length}, {args.options} Trigger options, batch {args.batch}; {os.cpu_count()} CPUs")
    header = ["function"] + [f"{label} {n}L" for label in codes for n in args.layers]
    header += [f"{label} {hi}/{lo}" for label in codes]
    print(" | ".join(header))
    for name in args.functions:
        cells = [cell(results[(label, n, name)]) for label in codes for n in args.layers]
        for label in codes:
            a, b = results[(label, lo, name)], results[(label, hi, name)]
            ok = "compile_s" in a and "compile_s" in b
            cells.append(f"{b['compile_s'] / a['compile_s']:.2f}x" if ok else "-")
        print(" | ".join([name] + cells))
    for title, key in (("optimized HLO instructions", "hlo_instructions"), ("peak resident GiB", "rss_gb")):
        print(f"\n{title}")
        print(" | ".join(["function"] + [f"{label} {n}L" for label in codes for n in args.layers]))
        for name in args.functions:
            rows = [results[(label, n, name)] for label in codes for n in args.layers]
            print(" | ".join([name] + [str(r.get(key, "-")) if key != "rss_gb" else f"{r.get(key, 0):.1f}"
                                       for r in rows]))
    print(json.dumps({f"{label}/{n}/{name}": row for (label, n, name), row in results.items()}))


if __name__ == "__main__":
    main()
