"""One Flax NNX decoder for Llama-3.x, Qwen2, Qwen3 and Gemma3; family differences are switches in ModelConfig.

Parameters keep heads explicit (`q` kernel is [embed, heads, head_dim]) and carry logical axis names in their
`logical_axes` metadata so a rules table can place them on a mesh. The transformer blocks are stored stacked (one
`Block` whose parameters have a leading `layers` axis, as in MaxText and tunix) and run under one `lax.scan`, so
XLA compiles one block whatever the depth; per-layer differences (Gemma3's sliding/global pattern: mask and rope
base) are a flag scanned alongside the parameters. The KV cache is a pytree passed in and returned, never module
state, so jitted samplers can donate it.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from icml_jax.models.config import ModelConfig, RopeConfig

Array = jax.Array

# Logical axis names; the rules table in icml_jax.parallel maps them to mesh axes. (The feed-forward axis is
# MLP_AXIS: a constant named MLP would be shadowed by the MLP class below.)
EMBED, VOCAB, HEADS, KV_HEADS, HEAD_DIM, MLP_AXIS = "embed", "vocab", "heads", "kv_heads", "head_dim", "mlp"
LAYERS = "layers"  # the leading axis of every stacked block parameter (replicated by the default rules)
# What a backward pass keeps of each scanned layer (`Decoder.remat`, the config's `policy.remat`): everything
# ("none"), only matmul outputs against weights, recomputing attention and the elementwise ops ("dots"), or only
# the layer's input, recomputing the whole layer ("full"). Gradients are the same; memory and time are not.
REMAT_POLICIES = {"none": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "full": jax.checkpoint_policies.nothing_saveable}


def remat_policy(name: str):
    """The `jax.checkpoint` policy of `policy.remat` = `name` (None: keep everything); an unknown name is an error."""
    if name not in REMAT_POLICIES:
        raise ValueError(f"policy.remat={name!r} is not one of {sorted(REMAT_POLICIES)}")
    return REMAT_POLICIES[name]


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], dtype, scale: float) -> nnx.Param:
    """A normally initialised parameter tagged with its logical axes."""
    value = (scale * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
    return nnx.Param(value, logical_axes=axes)


class RMSNorm(nnx.Module):
    """RMS norm in float32; Llama/Qwen scale by `w` after casting back, Gemma by `(1 + w)` before."""

    def __init__(self, dim: int, eps: float, plus_one: bool, dtype, axis_name: str = EMBED):
        self.eps, self.plus_one = eps, plus_one
        init = jnp.zeros if plus_one else jnp.ones
        self.scale = nnx.Param(init((dim,), dtype), logical_axes=(axis_name,))

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.scale[...]
        if self.plus_one:
            return (normed * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
        return w * normed.astype(x.dtype)


class KVCache(NamedTuple):
    """Keys/values of all layers [layers, batch, slots, kv_heads, head_dim], which slots hold real tokens, and the
    next slot. For layers run unrolled (`Decoder.__call__(layers=...)`) k and v are tuples of per-layer arrays
    [batch, slots, kv_heads, head_dim] (`unstack_cache`)."""

    k: Array | tuple[Array, ...]
    v: Array | tuple[Array, ...]
    valid: Array  # [batch, slots] bool
    index: Array  # [] int32: the slot the next token is written to


def init_cache(config: ModelConfig, batch: int, slots: int, dtype=jnp.float32) -> KVCache:
    """An empty cache with room for `slots` tokens per row."""
    shape = (config.num_layers, batch, slots, config.num_kv_heads, config.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        valid=jnp.zeros((batch, slots), bool),
        index=jnp.zeros((), jnp.int32),
    )


def repeat_cache(cache: KVCache, times: int) -> KVCache:
    """Each row of a cache (stacked or unstacked) `times` times in a row: one prefix's keys and values for `times`
    continuations."""
    if isinstance(cache.k, tuple):  # per-layer arrays [batch, ...]
        rows = lambda arrays: tuple(jnp.repeat(a, times, axis=0) for a in arrays)  # noqa: E731
        return cache._replace(k=rows(cache.k), v=rows(cache.v), valid=jnp.repeat(cache.valid, times, axis=0))
    return cache._replace(k=jnp.repeat(cache.k, times, axis=1), v=jnp.repeat(cache.v, times, axis=1),
                          valid=jnp.repeat(cache.valid, times, axis=0))


def unstack_cache(cache: KVCache) -> KVCache:
    """The cache with per-layer tuples of keys and values (for layers run unrolled)."""
    return cache._replace(k=tuple(cache.k), v=tuple(cache.v))


def stack_cache(cache: KVCache) -> KVCache:
    """The inverse of `unstack_cache`."""
    return cache._replace(k=jnp.stack(cache.k), v=jnp.stack(cache.v))


def rope_tables(rope: RopeConfig, head_dim: int, positions: Array) -> tuple[Array, Array]:
    """cos/sin [batch, length, head_dim] for integer positions [batch, length], float32."""
    inv_freq = jnp.asarray(rope.inv_freq(head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """Rotates x [batch, length, heads, head_dim] by the split-half convention of HF checkpoints."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


def _softcap(x: Array, cap: float | None) -> Array:
    return x if cap is None else jnp.tanh(x / cap) * cap


class Attention(nnx.Module):
    """Grouped-query attention with optional q/k norm, sliding window and logit soft-capping."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        c = config
        self.config = c
        s = c.hidden_size**-0.5
        self.q = _param(rngs, (c.hidden_size, c.num_heads, c.head_dim), (EMBED, HEADS, HEAD_DIM), dtype, s)
        self.k = _param(rngs, (c.hidden_size, c.num_kv_heads, c.head_dim), (EMBED, KV_HEADS, HEAD_DIM), dtype, s)
        self.v = _param(rngs, (c.hidden_size, c.num_kv_heads, c.head_dim), (EMBED, KV_HEADS, HEAD_DIM), dtype, s)
        so = (c.num_heads * c.head_dim) ** -0.5
        self.o = _param(rngs, (c.num_heads, c.head_dim, c.hidden_size), (HEADS, HEAD_DIM, EMBED), dtype, so)
        if c.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((c.num_heads, c.head_dim), dtype), logical_axes=(HEADS, HEAD_DIM))
            self.k_bias = nnx.Param(jnp.zeros((c.num_kv_heads, c.head_dim), dtype), logical_axes=(KV_HEADS, HEAD_DIM))
            self.v_bias = nnx.Param(jnp.zeros((c.num_kv_heads, c.head_dim), dtype), logical_axes=(KV_HEADS, HEAD_DIM))
        if c.o_bias:
            self.o_bias = nnx.Param(jnp.zeros((c.hidden_size,), dtype), logical_axes=(EMBED,))
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.norm_plus_one, dtype, HEAD_DIM)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.norm_plus_one, dtype, HEAD_DIM)

    def __call__(
        self, x: Array, rope: tuple[Array, Array], mask: Array, cache_kv: tuple[Array, Array] | None,
        index: Array | None,
    ) -> tuple[Array, tuple[Array, Array]]:
        """x [B, T, E]; rope = (cos, sin) [B, T, head_dim]; mask [B, T, S] bool over key slots (S = T without a
        cache); with a cache (this layer's keys/values [B, S, kv_heads, head_dim]) the new keys/values are
        written at slot `index`. Returns the output and this call's keys/values [B, T, kv_heads, head_dim]."""
        c = self.config
        q = jnp.einsum("bte,ehd->bthd", x, self.q[...])
        k = jnp.einsum("bte,ehd->bthd", x, self.k[...])
        v = jnp.einsum("bte,ehd->bthd", x, self.v[...])
        if c.qkv_bias:
            q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        new_kv = (k, v)
        if cache_kv is not None:
            ck, cv = cache_kv
            new_kv = (k.astype(ck.dtype), v.astype(cv.dtype))
            k = jax.lax.dynamic_update_slice(ck, new_kv[0], (0, index, 0, 0))
            v = jax.lax.dynamic_update_slice(cv, new_kv[1], (0, index, 0, 0))
        b, t, _, d = q.shape
        groups = c.num_heads // c.num_kv_heads
        q = q.reshape(b, t, c.num_kv_heads, groups, d)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k.astype(q.dtype), preferred_element_type=jnp.float32)
        scores = _softcap(scores * c.attn_scale, c.attn_logit_softcap)
        scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v.astype(x.dtype)).reshape(b, t, c.num_heads, d)
        out = jnp.einsum("bthd,hde->bte", out, self.o[...])
        if c.o_bias:
            out = out + self.o_bias[...]
        return out, new_kv


class MLP(nnx.Module):
    """Gated feed-forward: down(act(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        c = config
        self.act = c.act
        s_in, s_out = c.hidden_size**-0.5, c.intermediate_size**-0.5
        self.gate = _param(rngs, (c.hidden_size, c.intermediate_size), (EMBED, MLP_AXIS), dtype, s_in)
        self.up = _param(rngs, (c.hidden_size, c.intermediate_size), (EMBED, MLP_AXIS), dtype, s_in)
        self.down = _param(rngs, (c.intermediate_size, c.hidden_size), (MLP_AXIS, EMBED), dtype, s_out)

    def __call__(self, x: Array) -> Array:
        # einsum rather than `@`: qwix LoRA intercepts `jnp.einsum` on a module's params, while `@` reaches
        # dot_general inside jnp.matmul's own jit, where qwix can neither find the weight nor create adapters.
        gate = jnp.einsum("...e,em->...m", x, self.gate[...])
        gate = jax.nn.silu(gate) if self.act == "silu" else jax.nn.gelu(gate, approximate=True)
        h = gate * jnp.einsum("...e,em->...m", x, self.up[...])
        return jnp.einsum("...m,me->...e", h, self.down[...])


class Block(nnx.Module):
    """Pre-norm transformer block; Gemma adds post-attention and post-MLP norms (four in all)."""

    def __init__(self, config: ModelConfig, dtype, rngs: nnx.Rngs):
        c = config
        self.sandwich = c.sandwich_norm
        norm = lambda: RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_plus_one, dtype)  # noqa: E731
        self.input_norm = norm()
        self.attn = Attention(c, dtype, rngs)
        self.post_attn_norm = norm()  # Llama/Qwen: the pre-MLP norm; Gemma: the post-attention norm
        if c.sandwich_norm:
            self.pre_mlp_norm = norm()
            self.post_mlp_norm = norm()
        self.mlp = MLP(c, dtype, rngs)

    def __call__(self, x, rope, mask, cache_kv, index):
        """One layer (see `Attention.__call__`); returns the new residual stream and this call's keys/values."""
        h, new_kv = self.attn(self.input_norm(x), rope, mask, cache_kv, index)
        if self.sandwich:
            x = x + self.post_attn_norm(h)
            x = x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))
        else:
            x = x + h
            x = x + self.mlp(self.post_attn_norm(x))
        return x, new_kv


def stack_blocks(blocks: list[Block]) -> Block:
    """One Block whose every variable stacks the blocks' values on a new leading `layers` axis (logical axes
    gain LAYERS in front); the blocks must share one structure."""
    graphdef, _ = nnx.split(blocks[0])

    def stack(*variables: nnx.Variable) -> nnx.Variable:
        first = variables[0]
        value = jnp.stack([v.get_raw_value() for v in variables])
        axes = first.get_metadata().get("logical_axes")
        return first.replace(value) if axes is None else first.replace(value, logical_axes=(LAYERS, *axes))

    states = [nnx.state(b) for b in blocks]
    return nnx.merge(graphdef, jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable)))


class Output(NamedTuple):
    """What the decoder returns: logits first, then the updated cache (or None) and the final hidden states."""

    logits: Array | None  # [batch, length, vocab], float32
    cache: KVCache | None
    hidden: Array  # [batch, length, embed], after the final norm


class Decoder(nnx.Module):
    """The causal LM: embed -> blocks -> norm -> logits (tied or separate head)."""

    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.dtype = dtype
        self.embedding = _param(rngs, (c.vocab_size, c.hidden_size), (VOCAB, EMBED), dtype, 1.0)
        # built layer by layer (the same random values as separate blocks), then stacked for the scan
        self.layers = stack_blocks([Block(c, dtype, rngs) for _ in range(c.num_layers)])
        self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_plus_one, dtype)
        # layers [0, frozen_layers) pass no gradient (their parameters, adapters included, and their output are
        # stop-gradient): a backward pass stops at the first trained layer (`LoraConfig.layers` sets it)
        self.frozen_layers = 0
        self.remat = "none"  # a key of REMAT_POLICIES: what the backward pass keeps of each layer
        if not c.tie_embeddings:
            self.lm_head = _param(rngs, (c.hidden_size, c.vocab_size), (EMBED, VOCAB), dtype, c.hidden_size**-0.5)

    def __call__(
        self,
        tokens: Array,
        *,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        cache: KVCache | None = None,
        compute_logits: bool = True,
        layers: tuple[nnx.State, ...] | None = None,
    ) -> Output:
        """Runs token ids [batch, length].

        attention_mask [batch, length] marks real tokens (1) and padding (0) of `tokens`; positions default to
        the count of real tokens before each one, so left padding does not shift positions. With a cache the
        tokens are written at slots [cache.index, cache.index + length) and attend to every valid earlier slot.
        `layers` (from `unstacked_layers()`, sliced once outside a decode loop) runs the blocks unrolled from
        those per-layer parameters instead of scanning the stacked ones, with an unstacked cache: XLA:CPU copies
        each scanned layer's weights out of the stack before its matmuls, which doubles the memory traffic of
        a small-batch decode step.
        """
        c = self.config
        b, t = tokens.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), bool)
        attention_mask = attention_mask.astype(bool)
        if positions is None:
            offset = 0 if cache is None else jnp.sum(cache.valid, axis=1, keepdims=True)
            positions = offset + jnp.cumsum(attention_mask, axis=1) - 1
            positions = jnp.maximum(positions, 0)
        if cache is None:
            valid, q_slot, k_slot = attention_mask, jnp.arange(t), jnp.arange(t)
            index = None
        else:
            index = cache.index
            valid = jax.lax.dynamic_update_slice(cache.valid, attention_mask, (0, index))
            q_slot, k_slot = index + jnp.arange(t), jnp.arange(cache.valid.shape[1])
        causal = k_slot[None, :] <= q_slot[:, None]  # [T, S]
        base = valid[:, None, :] & causal[None]
        full = (base, rope_tables(c.rope, c.head_dim, positions))
        sliding = None
        if "sliding_attention" in c.layer_types:
            window = k_slot[None, :] > q_slot[:, None] - c.sliding_window
            local_rope = full[1] if c.rope_local in (None, c.rope) else rope_tables(c.rope_local, c.head_dim, positions)
            sliding = (base & window[None], local_rope)

        x = jnp.take(self.embedding[...], tokens, axis=0)
        if c.embed_scale:
            x = x * jnp.asarray(np.sqrt(c.hidden_size), self.dtype).astype(x.dtype)
        x, new_kv = self._run_layers(x, full, sliding, cache, index, layers)
        hidden = self.final_norm(x)
        new_cache = None
        if cache is not None:
            new_cache = KVCache(*new_kv, valid, cache.index + t)
        logits = self.logits(hidden) if compute_logits else None
        return Output(logits, new_cache, hidden)

    def unstacked_layers(self) -> tuple[nnx.State, ...]:
        """Each layer's parameters, sliced out of the stacked block (for `__call__(layers=...)`)."""
        _, params, _ = nnx.split(self.layers, nnx.Param, ...)
        return tuple(jax.tree.map(lambda a, i=i: a[i], params) for i in range(self.config.num_layers))

    def _run_layers(self, x: Array, full: tuple, sliding: tuple | None, cache: KVCache | None,
                    index: Array | None, layers: tuple[nnx.State, ...] | None,
                    ) -> tuple[Array, tuple[Array, Array] | None]:
        """All blocks, under one `lax.scan` over the stacked parameters (or unrolled over `layers`); returns x and
        the updated cache's k, v.

        `full` / `sliding` are (mask, rope tables) of global and sliding-window layers; a per-layer flag picks one
        when the model mixes them. Variables other than parameters (the LoRA dropout RNG state) are threaded
        through the carry, as an unrolled loop would advance them, and written back after the scan when a layer
        changed them (only then: a model called inside a sampler's while loop must not mutate). The cache's
        new keys/values are written into the stacked cache in the carry (only this call's slots), so a donated
        cache is updated in place.
        """
        c = self.config
        graphdef, params, rest = nnx.split(self.layers, nnx.Param, ...)
        flags = np.array([kind == "sliding_attention" for kind in c.layer_types])
        mutated = []  # set while tracing when a layer changes a non-parameter variable

        def run_layer(x, rest, layer_params, is_sliding, layer_cache):
            before = jax.tree.leaves(rest)  # merge shares rest's Variables with the block: compare values after
            block = nnx.merge(graphdef, layer_params, rest)
            if isinstance(is_sliding, (bool, np.bool_)):
                mask, rope = sliding if is_sliding else full
            else:
                mask, rope = jax.tree.map(lambda s, f: jnp.where(is_sliding, s, f), sliding, full)
            x, new_kv = block(x, rope, mask, layer_cache, index)
            new_rest = nnx.split(block, nnx.Param, ...)[2]
            if any(a is not b for a, b in zip(jax.tree.leaves(new_rest), before, strict=True)):
                mutated.append(True)
            return x, new_rest, new_kv

        frozen = self.frozen_layers
        if layers is not None:
            ks, vs = (None, None) if cache is None else (list(cache.k), list(cache.v))
            for i, layer_params in enumerate(layers):
                layer_cache = None if cache is None else (ks[i], vs[i])
                if i < frozen:
                    layer_params = jax.lax.stop_gradient(layer_params)
                x, rest, new_kv = run_layer(x, rest, layer_params, flags[i], layer_cache)
                if i == frozen - 1:
                    x = jax.lax.stop_gradient(x)
                if cache is not None:
                    ks[i] = jax.lax.dynamic_update_slice(ks[i], new_kv[0], (0, index, 0, 0))
                    vs[i] = jax.lax.dynamic_update_slice(vs[i], new_kv[1], (0, index, 0, 0))
            cache_kv = None if cache is None else (tuple(ks), tuple(vs))
        else:
            uniform = bool(flags.all() or not flags.any())
            policy = remat_policy(self.remat)

            def body(carry, xs):
                x, rest, cache_kv = carry
                layer_params, is_sliding, layer = xs
                layer_cache = None
                if cache_kv is not None:
                    layer_cache = tuple(jax.lax.dynamic_index_in_dim(a, layer, keepdims=False) for a in cache_kv)
                x, rest, new_kv = run_layer(x, rest, layer_params, flags[0] if uniform else is_sliding,
                                            layer_cache)
                if cache_kv is not None:
                    cache_kv = tuple(jax.lax.dynamic_update_slice(a, n[None], (layer, 0, index, 0, 0))
                                     for a, n in zip(cache_kv, new_kv))
                return (x, rest, cache_kv), None

            if policy is not None:  # recompute in the backward pass what the policy does not keep
                body = jax.checkpoint(body, policy=policy, prevent_cse=False)
            cache_kv = None if cache is None else (cache.k, cache.v)
            xs = (params, jnp.asarray(flags), jnp.arange(c.num_layers))
            if 0 < frozen < c.num_layers:  # two scans: the frozen bottom, then the layers a gradient reaches
                bottom = jax.lax.stop_gradient(jax.tree.map(lambda a: a[:frozen], xs))
                (x, rest, cache_kv), _ = jax.lax.scan(body, (x, rest, cache_kv), bottom)
                x = jax.lax.stop_gradient(x)
                xs = jax.tree.map(lambda a: a[frozen:], xs)
            elif frozen:
                xs = jax.lax.stop_gradient(xs)
            (x, rest, cache_kv), _ = jax.lax.scan(body, (x, rest, cache_kv), xs)
            if frozen >= c.num_layers:
                x = jax.lax.stop_gradient(x)
        if mutated:
            nnx.update(self.layers, rest)
        return x, cache_kv

    def logits(self, hidden: Array) -> Array:
        """Projects final hidden states [..., embed] to float32 logits [..., vocab]."""
        c = self.config
        if c.tie_embeddings:
            out = jnp.einsum("...e,ve->...v", hidden, self.embedding[...], preferred_element_type=jnp.float32)
        else:
            out = jnp.einsum("...e,ev->...v", hidden, self.lm_head[...], preferred_element_type=jnp.float32)
        return _softcap(out, c.final_logit_softcap)
