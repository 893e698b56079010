"""Backbone speed, ours vs `transformers`, side by side in one run on the same weights.

Without `--model`, builds one mid-size Llama-style config (~75M parameters) with random weights, saves it with
`transformers` (torch) and loads it with `icml_jax.models.from_pretrained`; with `--model DIR` both load that
local HF directory (e.g. the converted SmolLM2-135M-Instruct from `python -m icml_jax.models.fetch`). Prints
prefill tokens/s, cached-decode tokens/s and ours/theirs, and puts both against this machine's own limits
measured in the same run: prefill as a fraction of the float32 matmul peak XLA reaches, decode against the time
to read every weight once. With `--agent-turn`, also times one agent turn (Trigger over 15 candidate memories,
Planner, a 32-token reply by the same backbone) and counts the programs compiled over a 5-session episode.
With `--lora`, only the policies' forward with and without LoRA adapters (rank 8, every projection), interleaved.
Beside each ratio against `transformers` it prints the same run's raw matmul ratio (XLA against torch, the same
shape and dtype) and the CPU model: on CPU the model ratio mostly follows the host's matrix libraries.
With `--dtype bfloat16`, both models hold and compute in bfloat16 (weights, activations, logits), and the peak and
the matmul ratios are bfloat16's. Compilation is done (and timed) before measuring; every figure is the median of
`--repeats` runs.

    python scripts/benchmark_backbone.py            # CPU here; uses the GPU when JAX and torch see one
    python scripts/benchmark_backbone.py --model ~/.cache/icml_jax/models/smollm2-135m-instruct --agent-turn
    python scripts/benchmark_backbone.py --model ~/.cache/icml_jax/models/smollm2-135m-instruct --lora
    python scripts/benchmark_backbone.py --model ~/.cache/icml_jax/models/smollm2-135m-instruct --dtype bfloat16
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from flax import nnx

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


def load_pair(model_dir: str | None, device: str, dtype: str = "float32"):
    """(ours, theirs, description): the same weights in our decoder and in `transformers`, both in `dtype`."""
    if model_dir:
        theirs = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        ours = from_pretrained(model_dir, dtype=getattr(jnp, dtype))
        name = Path(model_dir).name
    else:
        torch.manual_seed(0)
        theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
        with tempfile.TemporaryDirectory() as d:
            theirs.save_pretrained(d)
            ours = from_pretrained(d, dtype=getattr(jnp, dtype))
        name = "Llama-style, random weights"
    theirs = theirs.to(getattr(torch, dtype)).eval().to(device)
    n_params = sum(p.numel() for p in theirs.parameters())
    return ours, theirs, f"{name}, {n_params / 1e6:.1f}M parameters, {dtype}"


def matmul_peak(repeats: int, n: int = 2048, dtype: str = "float32") -> float:
    """FLOP/s of a jitted n x n x n matmul in `dtype`: the compute limit XLA reaches on this machine."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    return 2 * n**3 / median_time(lambda: mm(a).block_until_ready(), max(repeats, 5))


def cpu_model() -> str:
    """The host CPU's model name (/proc/cpuinfo), else what `platform` knows: a ratio is this host's, not ours."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def matmul_rates(m: int, k: int, n: int, dtype: str, repeats: int, device: str) -> tuple[float, float]:
    """(XLA, torch) FLOP/s of one (m x k) @ (k x n) matmul in `dtype` on the same host, jitted / no_grad: what the
    host's matrix libraries give each side before any model code."""
    a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    t_xla = median_time(lambda: mm(a, b).block_until_ready(), max(repeats, 5))
    ta = torch.randn(m, k, device=device).to(getattr(torch, dtype))
    tb = torch.randn(k, n, device=device).to(getattr(torch, dtype))
    with torch.no_grad():
        (ta @ tb).cpu()
        t_torch = median_time(lambda: (ta @ tb).cpu(), max(repeats, 5))
    return 2 * m * k * n / t_xla, 2 * m * k * n / t_torch


def prefill_flops(ours, batch: int, length: int) -> float:
    """Matmul FLOPs of one prefill with full logits: weights (head included) plus attention scores and mixing."""
    c = ours.config
    per_layer = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * \
        c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    weights = c.num_layers * per_layer + c.hidden_size * c.vocab_size
    attention = c.num_layers * 2 * 2 * length * length * c.num_heads * c.head_dim  # q.k and p.v, full square
    return batch * (2 * length * weights + attention)


def count_compiles() -> list[str]:
    """A list that grows by one entry per XLA program compiled from now on."""
    events: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, _duration, **_: events.append(name) if name == "/jax/core/compile/backend_compile_duration"
        else None)
    return events


def agent_turns(model_dir: str, repeats: int) -> None:
    """Times MemoryAgent.step (Trigger over 15 memories + Planner + 32-token reply) and counts compilations."""
    from icml_jax.agents.agent import AgentConfig, MemoryAgent
    from icml_jax.agents.policy import MemoryPolicies
    from icml_jax.llm.local import LocalBackend
    from icml_jax.llm.offline import OfflineBackend
    from icml_jax.memory.fragment import NewFragment
    from icml_jax.memory.store import MemoryStore
    from icml_jax.models import load_tokenizer
    from icml_jax.models.lora import LoraConfig, apply_lora

    tokenizer = load_tokenizer(model_dir)
    backbone = from_pretrained(model_dir)
    policies = MemoryPolicies(apply_lora(backbone, LoraConfig(), seed=0), rngs=nnx.Rngs(0))
    generator = LocalBackend(backbone, tokenizer)
    facts = ["I am vegetarian since last spring.", "My dog Biscuit is afraid of thunder.",
             "I work night shifts as a nurse.", "My sister lives in Lisbon.", "I am training for a half marathon.",
             "I can't stand cilantro.", "My daughter starts school in September.", "I play the cello on Sundays.",
             "I'm allergic to penicillin.", "We are moving to a bigger flat in May.", "I started learning Korean.",
             "My knee hurts after long runs.", "I drive an old blue Volvo.", "My father is recovering from surgery.",
             "I prefer tea over coffee."]
    questions = ["What should I cook for dinner tonight?", "Any tips for my run this weekend?",
                 "How do I keep my dog calm tonight?", "What should I bring when I visit my sister?",
                 "Can you suggest a hobby for rainy days?", "How can I sleep better after work?"]
    store = MemoryStore()
    # condensation is not part of the measured turn: the offline back end stores the turn text as the note
    agent = MemoryAgent(policies, tokenizer, store, generator, condenser=OfflineBackend(),
                        config=AgentConfig(greedy=True, reply_temperature=0.0, reply_max_tokens=32))
    compiles = count_compiles()
    # a 5-session episode of 6 turns each on an empty memory: every program the turn loop needs gets compiled
    turn_times = []
    for session in range(5):
        history: list[tuple[str, str]] = []
        for turn in range(6):
            utterance = (facts + questions)[(session * 6 + turn) % (len(facts) + len(questions))]
            start = time.perf_counter()
            reply, _ = agent.step("u_episode", utterance, history=history, episode_id="bench", session=session,
                                  turn=turn)
            turn_times.append(time.perf_counter() - start)
            history += [("user", utterance), ("assistant", reply)]
    n_episode = len(compiles)
    print(f"agent turn: {n_episode} XLA programs compiled over a 5-session x 6-turn episode "
          f"(first turn {turn_times[0]:.1f} s, memories at the end: {store.count('u_episode')})")
    store.append_many("u_bench", [NewFragment("bench", 0, i, f, f, "0") for i, f in enumerate(facts)])
    history = [("user", "Hi, it's me again."), ("assistant", "Welcome back! How have you been?")]
    times = []
    for i in range(max(repeats, 20)):
        start = time.perf_counter()
        _, receipt = agent.step("u_bench", questions[i % len(questions)], history=history, episode_id="bench",
                                session=1, turn=i)
        times.append(time.perf_counter() - start)
    assert len(receipt.trigger.candidate_ids) == 15, receipt.trigger.candidate_ids
    p50, p95 = np.percentile(np.asarray(times) * 1e3, [50, 95])
    print(f"agent turn with 15 candidate memories, greedy, 32-token reply, after compilation: "
          f"p50 {p50:.0f} ms, p95 {p95:.0f} ms over {len(times)} turns "
          f"({len(compiles) - n_episode} more compilations)")


def lora_overhead(model_dir: str, repeats: int) -> None:
    """Times the policies' forward (final hidden states, no logits) with and without LoRA rank 8 on every
    projection, interleaved, at a B = 1 Trigger's rows (8 x 64) and a B = 16 one's (128 x 64)."""
    from icml_jax.models.flops import forward_flops
    from icml_jax.models.lora import LoraConfig, apply_lora

    base = from_pretrained(model_dir)
    adapted = apply_lora(base, LoraConfig(rank=8), seed=0)
    adapted.eval()
    hidden = nnx.jit(lambda m, t: m(t, compute_logits=False).hidden)
    for rows in (8, 128):
        tokens = jnp.asarray(np.random.RandomState(rows).randint(3, base.config.vocab_size, (rows, 64)), jnp.int32)
        times = {"plain": [], "lora": []}
        for model in (base, adapted):
            hidden(model, tokens).block_until_ready()
        for _ in range(max(repeats, 5)):  # interleaved: a drift of the machine's load hits both alike
            for name, model in (("plain", base), ("lora", adapted)):
                start = time.perf_counter()
                hidden(model, tokens).block_until_ready()
                times[name].append(time.perf_counter() - start)
        plain, lora = (statistics.median(times[k]) for k in ("plain", "lora"))
        flops = forward_flops(base.config, rows, 64), forward_flops(base.config, rows, 64, lora_rank=8)
        print(f"LoRA forward overhead, {rows} x 64 tokens: plain {plain * 1e3:.0f} ms, LoRA r8 {lora * 1e3:.0f} ms, "
              f"+{lora / plain - 1:.1%} (adapter FLOPs +{flops[1] / flops[0] - 1:.1%})")
    lora_backward(adapted, repeats)


def lora_backward(model, repeats: int, rows: int = 36) -> None:
    """Forward + backward to the adapters over `rows` x 64 tokens (a PPO minibatch of 4 slots: 4 Planner rows
    and 4 x 8 Trigger options), with `lora.low_rank_product`'s hand-written VJP against JAX's own derivative of
    the same two einsums (swapped in for this comparison only), interleaved."""
    from icml_jax.models import lora
    from icml_jax.models.flops import train_flops

    graphdef, trainable, frozen, rest = nnx.split(model, lora.TRAINABLE, lora.FROZEN, ...)
    tokens = jnp.asarray(np.random.RandomState(rows).randint(3, model.config.vocab_size, (rows, 64)), jnp.int32)

    def loss(trainable, frozen, rest, tokens):
        return jnp.sum(nnx.merge(graphdef, trainable, frozen, rest)(tokens, compute_logits=False).hidden ** 2)

    hand = jax.jit(jax.grad(loss))
    jax.block_until_ready(hand(trainable, frozen, rest, tokens))  # traced with the hand-written VJP
    original = lora.low_rank_product  # an einsum keyword selects its plain two-einsum path (JAX differentiates)
    lora.low_rank_product = lambda lora_str, x, a, b, **kw: original(lora_str, x, a, b, precision=None)
    try:
        auto = jax.jit(jax.grad(loss))
        jax.block_until_ready(auto(trainable, frozen, rest, tokens))  # traced with the plain einsums
    finally:
        lora.low_rank_product = original
    times = {"jax": [], "hand": []}
    for _ in range(max(repeats, 3)):
        for name, fn in (("jax", auto), ("hand", hand)):
            start = time.perf_counter()
            jax.block_until_ready(fn(trainable, frozen, rest, tokens))
            times[name].append(time.perf_counter() - start)
    t_auto, t_hand = (statistics.median(times[k]) for k in ("jax", "hand"))
    floor = train_flops(model.config, rows, 64, lora_rank=8) / matmul_peak(repeats)
    print(f"LoRA forward + backward, {rows} x 64 tokens: JAX's derivative {t_auto:.2f} s, hand-written VJP "
          f"{t_hand:.2f} s ({t_auto / t_hand:.2f}x); FLOP floor {floor:.2f} s (hand-written at {t_hand / floor:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local HF directory (default: random Llama-style weights)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512, help="prefill length")
    parser.add_argument("--decode-prompt", type=int, default=16, help="prompt length for the decode run")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agent-turn", action="store_true", help="also time one agent turn (needs --model)")
    parser.add_argument("--lora", action="store_true", help="only the LoRA forward overhead (needs --model)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the models' weights and compute (and the matmul rates printed beside them)")
    parser.add_argument("--bf16-matmul", action="store_true",
                        help="also the bfloat16 2048^3 matmul rate of XLA and torch (torch may use AMX units)")
    args = parser.parse_args()
    if args.lora:
        if not args.model:
            parser.error("--lora needs --model")
        lora_overhead(args.model, args.repeats)
        return
    if args.agent_turn and not args.model:
        parser.error("--agent-turn needs --model (a tokenizer and chat template)")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0].device_kind}); "
          f"torch {torch.__version__} on {device} with {torch.get_num_threads()} threads; "
          f"transformers {transformers.__version__}; CPU {cpu_model()}")

    ours, theirs, description = load_pair(args.model, device, args.dtype)
    print(f"model: {description}")
    vocab = ours.config.vocab_size
    rng = np.random.RandomState(0)
    ids = rng.randint(3, vocab, size=(args.batch, args.prompt)).astype(np.int32)
    ids_t = torch.as_tensor(ids, dtype=torch.long, device=device)

    # Prefill: logits for every prompt position, no cache, on both sides.
    forward = jax.jit(lambda m, t: m(t).logits)
    t0 = time.perf_counter()
    ours_logits = forward(ours, jnp.asarray(ids)).block_until_ready()
    compile_prefill = time.perf_counter() - t0
    with torch.no_grad():
        ref = theirs(ids_t, use_cache=False).logits.float().cpu().numpy()
    diff = float(np.abs(np.asarray(ours_logits, np.float32) - ref).max())
    del ours_logits, ref

    def run_theirs_prefill():
        with torch.no_grad():
            theirs(ids_t, use_cache=False).logits.cpu()

    t_ours = median_time(lambda: forward(ours, jnp.asarray(ids)).block_until_ready(), args.repeats)
    t_theirs = median_time(run_theirs_prefill, args.repeats)
    tokens = args.batch * args.prompt
    p_ours, p_theirs = tokens / t_ours, tokens / t_theirs
    peak = matmul_peak(args.repeats, dtype=args.dtype)
    flops = prefill_flops(ours, args.batch, args.prompt)

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
    weights = [w.reshape(-1, w.shape[-1]) for w in jax.tree.leaves(nnx.state(ours, nnx.Param))]
    read_all = jax.jit(lambda ws: sum(jnp.sum(jnp.ones((1, w.shape[0]), w.dtype) @ w) for w in ws))
    read_all(weights).block_until_ready()
    t_floor = median_time(lambda: read_all(weights).block_until_ready(), max(args.repeats, 5))
    n_bytes = sum(w.nbytes for w in weights)
    step_ours, step_theirs = args.batch / d_ours, args.batch / d_theirs

    print(f"max |logit diff| ours vs theirs (prefill, {args.dtype}): {diff:.2e}; greedy tokens agreeing: {agree:.1%}")
    print(f"compile: prefill {compile_prefill:.1f} s, generate (prefill+decode) {compile_decode:.1f} s")
    # The host's matrix libraries alone, in the same run: XLA's matmul against torch's at the prefill's MLP shape
    # and at the decode step's (a batch of rows), so a model ratio can be read against the library ratio.
    hidden, inter = ours.config.hidden_size, ours.config.intermediate_size
    mm_prefill = matmul_rates(args.batch * args.prompt, hidden, inter, args.dtype, args.repeats, device)
    mm_decode = matmul_rates(args.batch, hidden, inter, args.dtype, args.repeats, device)
    mm_square = matmul_rates(2048, 2048, 2048, args.dtype, args.repeats, device)
    print(f"{'':34s}{'ours':>12s}{'transformers':>14s}{'ratio':>8s}{'matmul ratio (same shape)':>28s}")
    print(f"{'prefill tokens/s (b=%d, len=%d)' % (args.batch, args.prompt):34s}"
          f"{p_ours:12.0f}{p_theirs:14.0f}{p_ours / p_theirs:7.2f}x"
          f"{mm_prefill[0] / mm_prefill[1]:14.2f}x ({args.batch * args.prompt}x{hidden} @ {hidden}x{inter})")
    print(f"{'decode tokens/s (b=%d, %d new)' % (args.batch, n):34s}"
          f"{d_ours:12.1f}{d_theirs:14.1f}{d_ours / d_theirs:7.2f}x"
          f"{mm_decode[0] / mm_decode[1]:14.2f}x ({args.batch}x{hidden} @ {hidden}x{inter})")
    print(f"{args.dtype} matmul GFLOP/s, XLA / torch: 2048^3 {mm_square[0] / 1e9:.0f} / {mm_square[1] / 1e9:.0f} "
          f"({mm_square[0] / mm_square[1]:.2f}x); prefill shape {mm_prefill[0] / 1e9:.0f} / {mm_prefill[1] / 1e9:.0f}; "
          f"decode shape {mm_decode[0] / 1e9:.1f} / {mm_decode[1] / 1e9:.1f}")
    if args.bf16_matmul:
        bf = matmul_rates(2048, 2048, 2048, "bfloat16", args.repeats, device)
        print(f"bfloat16 matmul GFLOP/s (2048^3), XLA / torch: {bf[0] / 1e9:.0f} / {bf[1] / 1e9:.0f} "
              f"({bf[0] / bf[1]:.2f}x)")
    print(f"prefill: {flops / 1e9:.1f} GFLOP per call; {args.dtype} matmul peak here {peak / 1e9:.0f} GFLOP/s "
          f"(2048^3, jitted): ours at {flops / t_ours / peak:.0%} of it, transformers at {flops / t_theirs / peak:.0%}")
    print(f"decode step: ours {step_ours * 1e3:.2f} ms, transformers {step_theirs * 1e3:.2f} ms; reading all "
          f"{n_bytes / 1e6:.0f} MB of weights once (vector x matrix) takes {t_floor * 1e3:.2f} ms "
          f"({n_bytes / t_floor / 1e9:.1f} GB/s): ours runs at {t_floor / step_ours:.0%} of that floor")
    if args.agent_turn:
        del theirs
        agent_turns(args.model, args.repeats)


if __name__ == "__main__":
    main()
