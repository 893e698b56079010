"""KV-cache generation: a jitted prefill, then a jitted `lax.while_loop` decode that donates the cache.

Model state is an argument of both programs (never closed over), so new weights need no recompilation, and
prompt lengths and cache sizes are rounded up to buckets so a run compiles a handful of programs.
Each row samples with its own random key (`generate_tokens`' `seed`), folded with the step, so a row's tokens
depend on its prompt and key only, never on the other rows of its batch.
The prefill scans the stacked layers. The decode loop does too, except on CPU (`unroll_layers`), where XLA
copies each scanned layer's weights out of the stack before its matmuls: a batch-1 decode step is bound by
reading the weights, so the copy doubles it. There the decode program slices the layers once per call, before
its loop (one extra copy of the block weights while it runs), and runs them unrolled (compile time linear in
depth, a forward pass of one token).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from icml_jax.models.decoder import Decoder, KVCache, init_cache, stack_cache, unstack_cache

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen: temperature 0 is greedy; top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"invalid sampling settings {self}")


def sample_logits(logits: Array, keys: Array, sampling: SamplingConfig) -> Array:
    """Next tokens [batch] from float32 logits [batch, vocab]; `keys` [batch] holds each row's random key."""
    if sampling.temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits.astype(jnp.float32) / sampling.temperature
    neg = jnp.finfo(jnp.float32).min
    if sampling.top_k:
        kth = jax.lax.top_k(logits, min(sampling.top_k, logits.shape[-1]))[0][:, -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if sampling.top_p < 1.0:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of strictly more likely tokens
        keep = before < sampling.top_p  # always keeps the most likely token
        cutoff = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, neg, logits)
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


def _step_keys(keys: Array, step: Array | int) -> Array:
    """Each row's key for generation step `step` (0: the token the prefill samples)."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)


@functools.partial(jax.jit, static_argnames=("graphdef", "slots", "sampling"))
def _prefill(graphdef, state, tokens, mask, keys, *, slots: int, sampling: SamplingConfig):
    """Runs the prompt [batch, length] into a fresh cache of `slots` slots and samples the first token."""
    model = nnx.merge(graphdef, state)
    cache = init_cache(model.config, tokens.shape[0], slots, model.dtype)
    out = model(tokens, attention_mask=mask, cache=cache, compute_logits=False)
    logits = model.logits(out.hidden[:, -1])
    return sample_logits(logits, _step_keys(keys, 0), sampling), out.cache


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "sampling", "unroll_layers"),
                   donate_argnames=("cache",))
def _decode(graphdef, state, cache: KVCache, first: Array, keys: Array, eos_ids: Array, pad_id: Array,
            *, max_new_tokens: int, sampling: SamplingConfig, unroll_layers: bool):
    """Feeds back one token at a time until every row has emitted EOS or `max_new_tokens` tokens exist."""
    model = nnx.merge(graphdef, state)
    layers = None
    if unroll_layers:  # sliced once, outside the loop (see the module docstring)
        layers, cache = model.unstacked_layers(), unstack_cache(cache)
    batch = first.shape[0]
    out = jnp.full((batch, max_new_tokens), pad_id, jnp.int32).at[:, 0].set(first)
    done = jnp.isin(first, eos_ids)
    lengths = jnp.ones((batch,), jnp.int32)

    def cond(carry):
        step, _, _, done, _ = carry
        return (step < max_new_tokens) & ~jnp.all(done)

    def body(carry):
        step, cache, out, done, lengths = carry
        last = out[:, step - 1]
        result = model(last[:, None], cache=cache, compute_logits=False, layers=layers)
        token = sample_logits(model.logits(result.hidden[:, -1]), _step_keys(keys, step), sampling)
        token = jnp.where(done, pad_id, token)
        out = jax.lax.dynamic_update_slice(out, token[:, None], (0, step))
        lengths = lengths + (~done).astype(jnp.int32)
        done = done | jnp.isin(token, eos_ids)
        return step + 1, result.cache, out, done, lengths

    carry = (jnp.int32(1), cache, out, done, lengths)
    _, cache, out, done, lengths = jax.lax.while_loop(cond, body, carry)
    if unroll_layers:
        cache = stack_cache(cache)
    return out, lengths, cache  # returning the cache lets XLA update the donated buffers in place


def pad_left(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads token rows to `length`: tokens [N, length] int32 and mask [N, length] bool."""
    tokens = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, row in enumerate(rows):
        if row:
            tokens[i, length - len(row):] = row
            mask[i, length - len(row):] = True
    return tokens, mask


def bucket(n: int, minimum: int = 16) -> int:
    """The smallest power of two >= max(n, minimum): the shape buckets of prompts and caches."""
    size = minimum
    while size < n:
        size *= 2
    return size


FINE_LENGTHS_ABOVE, FINE_LENGTH_STEP = 1024, 512  # length buckets: powers of two up to 1,024, then steps of 512


def length_bucket(n: int, minimum: int = 16) -> int:
    """The padded length of a token sequence: `bucket` up to 1,024, then the next multiple of 512 (a 2,100-token
    prompt runs at 2,560, not 4,096, whose prefill costs 2.5 times as much; a few more programs compile)."""
    size = bucket(n, minimum)
    if size > FINE_LENGTHS_ABOVE:
        size = min(size, max(minimum, -(-n // FINE_LENGTH_STEP) * FINE_LENGTH_STEP))
    return size


def _row_keys(seed: int | Sequence[int], rows: int) -> Array:
    """Each row's random key [rows]: from one int seed and the row's index, or from the row's own seed."""
    if isinstance(seed, int | np.integer):
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(int(seed)), jnp.arange(rows))
    seeds = np.asarray(seed)
    if seeds.shape != (rows,) or not np.issubdtype(seeds.dtype, np.integer) or (seeds < 0).any() \
            or (seeds >= 2**32).any():
        raise ValueError(f"generate_tokens: seed must be an int or {rows} seeds in [0, 2**32), one per prompt; "
                         f"got shape {seeds.shape}, dtype {seeds.dtype}")
    return jax.vmap(jax.random.key)(jnp.asarray(seeds.astype(np.uint32)))


@dataclasses.dataclass
class GenerationResult:
    """Generated token ids [batch, max_new_tokens] (pad after the end) and each row's length (EOS included)."""

    tokens: np.ndarray
    lengths: np.ndarray


def generate_tokens(
    model: Decoder,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    seed: int | Sequence[int] = 0,
    min_prompt_bucket: int = 16,
    unroll_layers: bool | None = None,
) -> GenerationResult:
    """Continues each token-id prompt; prompts are left-padded to a common bucketed length (`length_bucket`).

    `seed`: an int gives row i the key `fold_in(key(seed), i)`; a sequence gives each row its own seed (uint32),
    so that a row's sample is the same in any batch.
    `unroll_layers`: run the decode loop's layers unrolled from per-layer slices (None: on CPU; see the module
    docstring)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate_tokens needs at least one prompt and no empty prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    length = length_bucket(max(len(p) for p in prompts), min_prompt_bucket)
    tokens, mask = pad_left(prompts, length, pad_id)
    new_bucket = bucket(max_new_tokens, 16)
    graphdef, state = nnx.split(model)
    keys = _row_keys(seed, len(prompts))
    first, cache = _prefill(graphdef, state, jnp.asarray(tokens), jnp.asarray(mask), keys,
                            slots=length + new_bucket, sampling=sampling)
    eos = jnp.asarray(sorted(set(int(e) for e in eos_ids)) or [-1], jnp.int32)
    if unroll_layers is None:
        unroll_layers = jax.default_backend() == "cpu"
    out, lengths, _ = _decode(graphdef, state, cache, first, keys, eos, jnp.int32(pad_id),
                              max_new_tokens=max_new_tokens, sampling=sampling, unroll_layers=unroll_layers)
    return GenerationResult(np.asarray(out), np.asarray(lengths))


def generate(
    model: Decoder,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | Sequence[int] = 0,
    add_special_tokens: bool = True,
    skip_special_tokens: bool = True,
) -> list[str]:
    """Generates a continuation string for each prompt string (EOS and padding removed).

    `add_special_tokens=False` suits prompts made with a chat template, which already carry the BOS token.
    """
    encoded = [tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"] for p in prompts]
    eos = set(model.config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id or 0
    result = generate_tokens(model, encoded, max_new_tokens=max_new_tokens,
                             sampling=SamplingConfig(temperature, top_k, top_p), eos_ids=sorted(eos),
                             pad_id=int(pad), seed=seed)
    texts = []
    for row, n in zip(result.tokens, result.lengths):
        ids = [int(t) for t in row[:n] if int(t) not in eos]
        texts.append(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
    return texts
