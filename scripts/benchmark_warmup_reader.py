"""What the warm-up's batch reader costs: the demo's synthesis + warm-up with the batches read in the calling
thread (as `icml_jax.train.supervised.batches` does) against Grain's default read-ahead of the same endless
stream (16 threads, 500 elements), each in a fresh process so both compile everything; prints the XLA compile
seconds of each warm-up step and the stage times, and their ratios.

    python scripts/benchmark_warmup_reader.py           # configs/demo.py's synthesis (12 seeds)
    python scripts/benchmark_warmup_reader.py --smoke   # the experiments tests' size (2 seeds, 1 storyline each)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib.util, io, json, sys
import grain, jax
spec = importlib.util.spec_from_file_location("demo", sys.argv[2])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
config = module.get_config(); config.mode = ("synthesize", "warmup")
if sys.argv[4] == "smoke":
    config.synthesis.num_seeds, config.synthesis.storylines_per_seed = 2, 1
    config.synthesis.prequels_per_storyline, config.synthesis.heldout_fraction = 2, 0.5
from icml_jax.train import supervised
if sys.argv[1] == "grain_default":  # the reader before: Grain's default ReadOptions on the endless stream
    def batches(arrays, batch_size, seed):
        n = len(next(iter(arrays.values())))
        ds = (grain.MapDataset.range(n).shuffle(seed=seed).repeat(None)
              .map(lambda i: {k: v[i] for k, v in arrays.items()}).batch(batch_size, drop_remainder=True))
        return iter(ds)
    supervised.batches = batches
compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, fun_name="", **kw: compiles.append(secs)
    if event == "/jax/core/compile/backend_compile_duration" and fun_name == "jit(step)" else None)
from icml_jax import main as job
summary = job.run(config, sys.argv[3], out=io.StringIO())
print(json.dumps({"step_compiles": compiles, "warmup_s": summary["warmup"]["seconds"]}))
"""


def run(mode: str, workdir: Path, size: str) -> dict:
    """One fresh process: synthesis + warm-up of configs/demo.py with the given reader."""
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(ROOT / "configs" / "demo.py"), str(workdir), size],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    size = "smoke" if "--smoke" in sys.argv[1:] else "demo"
    with tempfile.TemporaryDirectory() as tmp:
        ours = run("calling_thread", Path(tmp) / "a", size)
        before = run("grain_default", Path(tmp) / "b", size)
    for name, r in (("calling thread", ours), ("Grain default read-ahead", before)):
        print(f"{name:>25}: warm-up step compiles {[round(s, 2) for s in r['step_compiles']]} s, "
              f"warm-up stage {r['warmup_s']:.1f} s")
    print(f"ratios (Grain default / calling thread): step compiles "
          f"{sum(before['step_compiles']) / sum(ours['step_compiles']):.2f}x, "
          f"warm-up stage {before['warmup_s'] / ours['warmup_s']:.2f}x")


if __name__ == "__main__":
    main()
