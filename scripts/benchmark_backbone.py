"""Backbone speed, ours vs `transformers`, side by side in one run on the same random weights.

Builds one mid-size Llama-style config (~75M parameters), saves it with `transformers` (torch), loads it with
`icml_jax.models.from_pretrained`, and prints prefill tokens/s, cached-decode tokens/s and ours/theirs.
Compilation is done (and timed) before measuring; every figure is the median of `--repeats` runs.

    python scripts/benchmark_backbone.py            # CPU here; uses the GPU when JAX and torch see one
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from icml_jax.models import from_pretrained
from icml_jax.models import sampler as S

CONFIG = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
              num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
              rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def median_time(fn, repeats: int) -> float:
    """Median wall time of `fn()` (which must block until its result is ready)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512, help="prefill length")
    parser.add_argument("--decode-prompt", type=int, default=16, help="prompt length for the decode run")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}); "
          f"torch {torch.__version__} on {device} with {torch.get_num_threads()} threads; "
          f"transformers {transformers.__version__}")

    torch.manual_seed(0)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).float().eval().to(device)
    n_params = sum(p.numel() for p in theirs.parameters())
    with tempfile.TemporaryDirectory() as d:
        theirs.save_pretrained(d)
        ours = from_pretrained(d)
    print(f"model: Llama-style, {n_params / 1e6:.1f}M parameters, float32")

    rng = np.random.RandomState(0)
    ids = rng.randint(3, CONFIG["vocab_size"], size=(args.batch, args.prompt)).astype(np.int32)
    ids_t = torch.as_tensor(ids, dtype=torch.long, device=device)

    # Prefill: logits for every prompt position, no cache, on both sides.
    forward = jax.jit(lambda m, t: m(t).logits)
    t0 = time.perf_counter()
    ours_logits = forward(ours, jnp.asarray(ids)).block_until_ready()
    compile_prefill = time.perf_counter() - t0
    with torch.no_grad():
        ref = theirs(ids_t, use_cache=False).logits.float().cpu().numpy()
    diff = float(np.abs(np.asarray(ours_logits) - ref).max())

    def run_theirs_prefill():
        with torch.no_grad():
            theirs(ids_t, use_cache=False).logits.cpu()

    t_ours = median_time(lambda: forward(ours, jnp.asarray(ids)).block_until_ready(), args.repeats)
    t_theirs = median_time(run_theirs_prefill, args.repeats)
    tokens = args.batch * args.prompt
    p_ours, p_theirs = tokens / t_ours, tokens / t_theirs

    # Cached greedy decode of `new_tokens` tokens after a short prompt (end to end: prefill included).
    prompts = [list(row[: args.decode_prompt]) for row in ids]
    n = args.new_tokens

    def run_ours():
        return S.generate_tokens(ours, prompts, max_new_tokens=n, eos_ids=[])

    t0 = time.perf_counter()
    ours_tokens = run_ours().tokens
    compile_decode = time.perf_counter() - t0
    short = torch.as_tensor(np.array(prompts), dtype=torch.long, device=device)

    def run_theirs():
        with torch.no_grad():
            return theirs.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)

    theirs_tokens = run_theirs()[:, args.decode_prompt:].cpu().numpy()
    agree = float((ours_tokens == theirs_tokens).mean())
    d_ours = args.batch * n / median_time(run_ours, args.repeats)
    d_theirs = args.batch * n / median_time(run_theirs, args.repeats)

    # Roofline of one decode step: a vector-matrix product over every weight, i.e. the bytes a step must read.
    from flax import nnx

    weights = [w.reshape(-1, w.shape[-1]) for w in jax.tree.leaves(nnx.state(ours, nnx.Param))]
    read_all = jax.jit(lambda ws: sum(jnp.sum(jnp.ones((1, w.shape[0]), w.dtype) @ w) for w in ws))
    read_all(weights).block_until_ready()
    t_floor = median_time(lambda: read_all(weights).block_until_ready(), max(args.repeats, 5))
    n_bytes = sum(w.nbytes for w in weights)
    step_ours, step_theirs = args.batch / d_ours, args.batch / d_theirs

    print(f"max |logit diff| ours vs theirs (prefill, float32): {diff:.2e}; greedy tokens agreeing: {agree:.1%}")
    print(f"compile: prefill {compile_prefill:.1f} s, generate (prefill+decode) {compile_decode:.1f} s")
    print(f"{'':34s}{'ours':>12s}{'transformers':>14s}{'ratio':>8s}")
    print(f"{'prefill tokens/s (b=%d, len=%d)' % (args.batch, args.prompt):34s}"
          f"{p_ours:12.0f}{p_theirs:14.0f}{p_ours / p_theirs:7.2f}x")
    print(f"{'decode tokens/s (b=%d, %d new)' % (args.batch, n):34s}"
          f"{d_ours:12.1f}{d_theirs:14.1f}{d_ours / d_theirs:7.2f}x")
    print(f"decode step: ours {step_ours * 1e3:.2f} ms, transformers {step_theirs * 1e3:.2f} ms; reading all "
          f"{n_bytes / 1e6:.0f} MB of weights once (vector x matrix) takes {t_floor * 1e3:.2f} ms "
          f"({n_bytes / t_floor / 1e9:.1f} GB/s): ours runs at {t_floor / step_ours:.0%} of that floor")


if __name__ == "__main__":
    main()
