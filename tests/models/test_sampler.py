"""KV-cache generation: cached greedy equals uncached step-by-step argmax; sampling filters; EOS; compilations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from icml_jax.models import from_pretrained
from icml_jax.models import sampler as S
from icml_jax.models.tokenizer import load_tokenizer
from tests.models import hf_fixtures as F
from tests.models.tokenizer_fixtures import build_tokenizer


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    F.build(request.param, d)
    return from_pretrained(d)


def reference_greedy(model, prompts, steps):
    """Step-by-step argmax of the uncached forward on the growing left-padded batch.

    The batch is right-padded to its final length so one program serves every step; causality keeps the
    not-yet-generated slots from touching the logits read at the current one.
    """
    length = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), length + steps), np.int32)
    mask = np.zeros_like(ids, dtype=bool)
    for i, p in enumerate(prompts):
        ids[i, length - len(p):length], mask[i, length - len(p):length] = p, True
    forward = jax.jit(lambda t, m: model(t, attention_mask=m).logits)
    out = []
    for step in range(steps):
        cur = length + step
        logits = forward(jnp.asarray(ids), jnp.asarray(mask))[:, cur - 1]
        nxt = np.asarray(jnp.argmax(logits, -1)).astype(np.int32)
        out.append(nxt)
        ids[:, cur], mask[:, cur] = nxt, True
    return np.stack(out, 1)


@pytest.mark.parametrize("unroll_layers", [True, False])  # the CPU default, and the scanned decode of accelerators
def test_cached_greedy_equals_uncached_argmax(model, unroll_layers):
    prompts = [[5, 17, 33, 8, 61, 12, 9], [40, 3, 77]]  # different lengths: the second row is left-padded
    result = S.generate_tokens(model, prompts, max_new_tokens=32, unroll_layers=unroll_layers)
    expected = reference_greedy(model, prompts, 32)
    np.testing.assert_array_equal(result.tokens, expected)
    assert (result.lengths == 32).all()
    if model.config.family == "gemma3":  # the decode ran past the sliding window
        assert len(prompts[0]) + 32 > 3 * model.config.sliding_window


def test_padding_does_not_change_a_row(model):
    alone = S.generate_tokens(model, [[40, 3, 77]], max_new_tokens=8).tokens
    batched = S.generate_tokens(model, [[5, 17, 33, 8, 61, 12, 9, 1, 2, 3], [40, 3, 77]], max_new_tokens=8).tokens
    np.testing.assert_array_equal(alone[0], batched[1])


def test_eos_stops_a_row_and_pads_the_rest(model):
    greedy = S.generate_tokens(model, [[5, 17, 33]], max_new_tokens=12).tokens[0]
    eos = int(greedy[4])
    first = int(np.argmax(greedy == eos))
    result = S.generate_tokens(model, [[5, 17, 33]], max_new_tokens=12, eos_ids=[eos], pad_id=0)
    assert result.lengths[0] == first + 1
    np.testing.assert_array_equal(result.tokens[0, : first + 1], greedy[: first + 1])
    assert (result.tokens[0, first + 1:] == 0).all()


def test_filters_reduce_to_greedy_and_sampling_follows_softmax():
    logits = jnp.asarray(np.random.RandomState(0).randn(4, 11).astype(np.float32))
    key = jax.random.key(1)
    keys = jax.random.split(key, 4)  # one per row
    greedy = np.asarray(S.sample_logits(logits, keys, S.SamplingConfig()))
    for cfg in (S.SamplingConfig(temperature=1.0, top_k=1), S.SamplingConfig(temperature=1.0, top_p=1e-6)):
        np.testing.assert_array_equal(np.asarray(S.sample_logits(logits, keys, cfg)), greedy)
    row = jnp.asarray([[2.0, 1.0, 0.0, -1.0, -9.0]])
    draws = jax.vmap(lambda k: S.sample_logits(row, k[None], S.SamplingConfig(temperature=1.0)))(
        jax.random.split(key, 20000))
    freq = np.bincount(np.asarray(draws).ravel(), minlength=5) / 20000
    np.testing.assert_allclose(freq, np.asarray(jax.nn.softmax(row[0])), atol=0.015)
    top2 = jax.vmap(lambda k: S.sample_logits(row, k[None], S.SamplingConfig(temperature=1.0, top_k=2)))(
        jax.random.split(key, 2000))
    assert set(np.unique(np.asarray(top2))) == {0, 1}
    # top_p 0.7: token 0 has ~0.64 of the mass, so tokens 0 and 1 are kept and nothing else.
    topp = jax.vmap(lambda k: S.sample_logits(row, k[None], S.SamplingConfig(temperature=1.0, top_p=0.7)))(
        jax.random.split(key, 2000))
    assert set(np.unique(np.asarray(topp))) == {0, 1}


def test_a_sampled_row_depends_on_its_prompt_and_seed_only(model):
    """At temperature 1 a row seeded alike samples the same tokens alone, beside another prompt, at another
    position and in a batch of another bucket; an int seed gives each row its own key."""
    hot = S.SamplingConfig(temperature=1.0)
    p, q = [40, 3, 77], [5, 17, 33, 8, 61, 12, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # q: the next prompt bucket
    alone = S.generate_tokens(model, [p], max_new_tokens=16, sampling=hot, seed=[7]).tokens[0]
    beside = S.generate_tokens(model, [q, p, p], max_new_tokens=16, sampling=hot, seed=[3, 9, 7]).tokens
    np.testing.assert_array_equal(beside[2], alone)
    assert not np.array_equal(beside[1], alone)  # another seed, another sample
    rows = S.generate_tokens(model, [p, p], max_new_tokens=16, sampling=hot, seed=5).tokens
    assert not np.array_equal(rows[0], rows[1])
    np.testing.assert_array_equal(S.generate_tokens(model, [p, p], max_new_tokens=16, sampling=hot, seed=5).tokens,
                                  rows)
    for bad in ([1], [1, -1], [1, 2**32]):
        with pytest.raises(ValueError, match="one per prompt"):
            S.generate_tokens(model, [p, p], max_new_tokens=2, sampling=hot, seed=bad)


def test_length_buckets_are_powers_of_two_then_steps_of_512():
    """Up to 1,024 a length pads to the next power of two, above it to the next multiple of 512; never past the
    power-of-two bucket."""
    got = {n: S.length_bucket(n) for n in (1, 16, 17, 1000, 1024, 1025, 1536, 1537, 2100, 4096, 5000)}
    assert got == {1: 16, 16: 16, 17: 32, 1000: 1024, 1024: 1024, 1025: 1536, 1536: 1536, 1537: 2048, 2100: 2560,
                   4096: 4096, 5000: 5120}
    assert all(n <= S.length_bucket(n) <= S.bucket(n) for n in range(1, 9000, 37))
    assert S.length_bucket(100, minimum=2048) == 2048  # the minimum holds above 1,024 too


def test_same_buckets_compile_once(model):
    S.generate_tokens(model, [[1, 2, 3]], max_new_tokens=5)
    before = (S._prefill._cache_size(), S._decode._cache_size())
    S.generate_tokens(model, [[4, 5, 6, 7, 8]], max_new_tokens=5, seed=3)  # same buckets, other values
    assert (S._prefill._cache_size(), S._decode._cache_size()) == before


def test_generate_strings_with_tokenizer(model, tmp_path):
    build_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)
    texts = S.generate(model, tok, ["i like my dog", "hello"], max_new_tokens=6)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    ids = S.generate_tokens(model, [tok("hello")["input_ids"]], max_new_tokens=6,
                            eos_ids=[tok.eos_token_id, *model.config.eos_token_ids]).tokens[0]
    assert texts[1] == tok.decode([t for t in ids if t not in (tok.eos_token_id, 2)], skip_special_tokens=True)


def test_bad_arguments():
    with pytest.raises(ValueError):
        S.SamplingConfig(top_p=0.0)
