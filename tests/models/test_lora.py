"""LoRA through qwix: placement, trainable filter, dropout switch, merged HF export, adapters saved alone."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers
from flax import nnx

from icml_jax.models import from_pretrained, generate_tokens, lora
from icml_jax.models.decoder import MLP
from icml_jax.models.export import (export_hf, hf_config_for_export, load_adapters, read_adapter_config,
                                    save_adapters)
from tests import lora_helpers as H
from tests.models import hf_fixtures as F
from tests.models.tokenizer_fixtures import build_tokenizer

TOL = 1e-4
SMALL = lora.LoraConfig(rank=4, alpha=8.0, dropout=0.1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """kind -> directory of a tiny random HF checkpoint."""
    out = {}
    for kind in ("llama", "gemma3"):
        d = tmp_path_factory.mktemp(kind)
        F.build(kind, d)
        out[kind] = d
    return out


@pytest.fixture(scope="module")
def adapted(checkpoints):
    """(base model, adapted model with random non-zero adapters) for the llama checkpoint."""
    base = from_pretrained(checkpoints["llama"])
    model = lora.apply_lora(base, SMALL, seed=1)
    H.randomize_adapters(model, seed=2)
    return base, model


def logits(model, ids, mask):
    """Jitted logits (eager calls through qwix's interception are slow to dispatch)."""
    return np.asarray(H.forward(model, jnp.asarray(ids), jnp.asarray(mask)))


def test_config_defaults_are_the_papers_and_validate():
    c = lora.LoraConfig.from_config(lora.default_config())
    assert (c.rank, c.alpha, c.dropout, c.scale) == (8, 16.0, 0.1, 2.0)
    assert c.target_modules == ("q", "k", "v", "o", "gate", "up", "down")
    assert lora.LoraConfig(target_modules=("q_proj", "v_proj")).target_modules == ("q", "v")
    with pytest.raises(ValueError, match="unknown LoRA target modules.*lm_head"):
        lora.LoraConfig(target_modules=("q", "lm_head"))
    with pytest.raises(ValueError, match="rank must be >= 1"):
        lora.LoraConfig(rank=0)
    with pytest.raises(ValueError, match="unknown LoRA settings.*rnak"):
        lora.LoraConfig.from_config({"rnak": 4})


def test_adapters_sit_on_targets_with_axes_of_their_weight(checkpoints):
    base = from_pretrained(checkpoints["llama"])
    model = lora.apply_lora(base, lora.LoraConfig(rank=4, target_modules=("k", "o", "down")))
    # base arrays are shared with the input model, not copied
    assert model.layers.attn.q.get_raw_value() is base.layers.attn.q.get_raw_value()
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
    assert len(flat) == 3 * 2  # stacked over layers, like the block's weights
    n = base.config.num_layers
    attn = model.layers.attn
    axes = lambda v: v.get_metadata()["logical_axes"]  # noqa: E731
    assert attn.k_lora_a.shape == (n, 64, 4) and axes(attn.k_lora_a) == ("layers", "embed", None)
    assert attn.k_lora_b.shape == (n, 4, 2, 16) and axes(attn.k_lora_b) == ("layers", None, "kv_heads", "head_dim")
    assert attn.o_lora_a.shape == (n, 4, 16, 4) and axes(attn.o_lora_a) == ("layers", "heads", "head_dim", None)
    assert attn.o_lora_b.shape == (n, 4, 64) and axes(attn.o_lora_b) == ("layers", None, "embed")
    mlp = model.layers.mlp
    assert axes(mlp.down_lora_a) == ("layers", "mlp", None) and axes(mlp.down_lora_b) == ("layers", None, "embed")
    assert not np.array_equal(attn.k_lora_a[...][0], attn.k_lora_a[...][1])  # each layer its own init
    assert not hasattr(attn, "q_lora_a") and not hasattr(mlp, "gate_lora_a")
    # B starts at zero: the adapted model equals the base
    ids, mask = H.token_batch(batch=2)
    np.testing.assert_allclose(logits(model, ids, mask), logits(base, ids, mask), rtol=0, atol=1e-6)


def test_projection_that_qwix_cannot_intercept_is_an_error(checkpoints):
    class MatmulMLP(MLP):
        def __call__(self, x):
            return (jax.nn.silu(x @ self.gate[...]) * (x @ self.up[...])) @ self.down[...]

    base = from_pretrained(checkpoints["llama"])
    base.layers.mlp.__class__ = MatmulMLP
    with pytest.raises(ValueError, match=r"no LoRA adapter on 3 target.*layers/mlp/gate"):
        lora.apply_lora(base, SMALL)


def test_one_step_changes_only_adapters(adapted):
    _, model = adapted
    model = nnx.clone(model)  # private copy: the fixture stays untouched
    frozen_before = {p: np.array(v.get_raw_value()) for p, v in nnx.to_flat_state(nnx.state(model, lora.FROZEN))}
    lora_before = H.adapters_numpy(model)
    assert frozen_before and lora_before and not set(lora_before) & {".".join(map(str, p)) for p in frozen_before}
    model.train()
    optimizer = H.make_optimizer(model)
    ids, mask = H.token_batch()
    loss = H.train_step(model, optimizer, jnp.asarray(ids), jnp.asarray(mask))
    assert np.isfinite(float(loss))
    for p, v in nnx.to_flat_state(nnx.state(model, lora.FROZEN)):
        np.testing.assert_array_equal(np.asarray(v.get_raw_value()), frozen_before[p], err_msg=str(p))
    after = H.adapters_numpy(model)
    unchanged = [k for k in lora_before if np.array_equal(after[k], lora_before[k])]
    assert not unchanged


def test_trainable_filter_selects_adapters_and_head_params():
    class Head(nnx.Module):
        def __init__(self):
            self.w = lora.TrainableParam(jnp.ones((2,)))
            self.base = nnx.Param(jnp.ones((2,)))
            self.a = nnx.LoRAParam(jnp.ones((2,)))

    head = Head()
    assert {p[0] for p, _ in nnx.to_flat_state(nnx.state(head, lora.TRAINABLE))} == {"w", "a"}
    assert {p[0] for p, _ in nnx.to_flat_state(nnx.state(head, lora.FROZEN))} == {"base"}


def test_dropout_on_in_train_off_in_eval(adapted, checkpoints):
    _, model = adapted
    ids, mask = H.token_batch(batch=2)
    e1, e2 = logits(model, ids, mask), logits(model, ids, mask)
    np.testing.assert_array_equal(e1, e2)  # eval (the default after apply_lora): deterministic
    no_dropout = lora.apply_lora(from_pretrained(checkpoints["llama"]),
                                 lora.LoraConfig(rank=4, alpha=8.0, dropout=0.0), seed=1)
    H.randomize_adapters(no_dropout, seed=2)
    np.testing.assert_allclose(logits(no_dropout, ids, mask), e1, atol=1e-6)
    model.train()
    try:
        t1, t2 = logits(model, ids, mask), logits(model, ids, mask)  # the dropout RNG advances between calls
    finally:
        model.eval()
    assert np.abs(t1 - e1).max() > 1e-2 and np.abs(t1 - t2).max() > 1e-2
    np.testing.assert_array_equal(logits(model, ids, mask), e1)  # back in eval: dropout off again


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_merged_export_loads_in_transformers_with_our_logits(checkpoints, kind, tmp_path):
    base = from_pretrained(checkpoints[kind])
    model = lora.apply_lora(base, SMALL, seed=3)
    H.randomize_adapters(model, seed=4, scale=0.2)
    build_tokenizer(tmp_path / "tok")
    out = export_hf(model, tmp_path / "export", base_dir=checkpoints[kind], tokenizer_dir=tmp_path / "tok")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids, mask = H.token_batch(batch=2)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ref = F.torch_logits(hf, ids, mask, positions)
    ours = logits(model, ids, mask)
    real = mask.astype(bool)
    diff = np.abs(ref - ours)[real].max()
    print(f"export {kind}: max |logit diff| vs transformers = {diff:.2e}")
    assert diff <= TOL
    assert np.abs(ref - logits(base, ids, mask))[real].max() > 100 * TOL  # the adapters are in the export
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("i like my dog").input_ids[0] == 1
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


def test_export_in_bfloat16_and_several_files_round_trips(adapted, checkpoints, tmp_path):
    _, model = adapted
    out = export_hf(model, tmp_path / "bf16", base_dir=checkpoints["llama"], dtype=jnp.bfloat16,
                    max_shard_bytes=40_000)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and (out / "model.safetensors.index.json").exists()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    back = dict(nnx.to_flat_state(nnx.state(from_pretrained(out))))  # our loader reads the merged weights
    merged = dict(lora.iter_merged_params(model))
    assert back.keys() == merged.keys()
    for path, value in merged.items():
        expected = np.asarray(value).astype(jnp.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(back[path].get_raw_value()), expected, err_msg=str(path))


def test_export_errors_name_the_missing_input(adapted, checkpoints, tmp_path):
    _, model = adapted
    with pytest.raises(FileNotFoundError, match="config.json.*does not exist"):
        export_hf(model, tmp_path / "x", base_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no tokenizer files.*in " + str(tmp_path)):
        export_hf(model, tmp_path / "x", base_dir=checkpoints["llama"], tokenizer_dir=tmp_path)


def test_gemma3_multimodal_config_exports_as_text_model():
    hf = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "eos_token_id": [1, 106],
          "text_config": {"model_type": "gemma3_text", "hidden_size": 64}, "vision_config": {}}
    out = hf_config_for_export(hf, "bfloat16")
    assert out["model_type"] == "gemma3_text" and out["architectures"] == ["Gemma3ForCausalLM"]
    assert out["eos_token_id"] == [1, 106] and out["dtype"] == "bfloat16" and "vision_config" not in out


def test_adapters_saved_alone_are_small_and_load_back(adapted, checkpoints, tmp_path):
    base, model = adapted
    path = save_adapters(model, tmp_path / "ad")
    assert path.stat().st_size < 0.2 * (checkpoints["llama"] / "model.safetensors").stat().st_size
    assert read_adapter_config(tmp_path / "ad") == SMALL
    fresh = lora.apply_lora(base, read_adapter_config(tmp_path / "ad"), seed=9)
    ids, mask = H.token_batch(batch=2)
    assert np.abs(logits(fresh, ids, mask) - logits(model, ids, mask)).max() > 1e-2
    load_adapters(fresh, tmp_path / "ad")
    saved, loaded = H.adapters_numpy(model), H.adapters_numpy(fresh)
    assert saved.keys() == loaded.keys()
    for k in saved:
        np.testing.assert_array_equal(saved[k], loaded[k])
    np.testing.assert_array_equal(logits(fresh, ids, mask), logits(model, ids, mask))
    with pytest.raises(ValueError, match="rank 4, alpha 8.0; the model has rank 2"):
        load_adapters(lora.apply_lora(base, lora.LoraConfig(rank=2, alpha=8.0)), tmp_path / "ad")
    with pytest.raises(ValueError, match="no LoRA adapters; apply_lora"):
        load_adapters(base, tmp_path / "ad")
    with pytest.raises(ValueError, match="adapters do not match the model"):
        load_adapters(lora.apply_lora(base, lora.LoraConfig(rank=4, alpha=8.0, target_modules=("q", "v", "up"))),
                      tmp_path / "ad")


def test_rollouts_with_adapters_equal_the_merged_model(adapted):
    """Generation (jitted prefill + decode) sees the adapters, with dropout off in eval mode."""
    base, model = adapted
    merged = nnx.clone(base)
    nnx.update(merged, nnx.from_flat_state(list(lora.iter_merged_params(model))))
    prompts = [[1, 5, 9, 14], [1, 22, 7]]
    ours = generate_tokens(model, prompts, max_new_tokens=6)
    ref = generate_tokens(merged, prompts, max_new_tokens=6)
    np.testing.assert_array_equal(ours.tokens, ref.tokens)


@pytest.mark.parametrize("lora_str, shapes", [
    ("bte,er,rhd->bthd", ((2, 5, 12), (12, 4), (4, 3, 8))),  # q / k / v
    ("bthd,hdr,re->bte", ((2, 5, 3, 8), (3, 8, 4), (4, 12))),  # o
    ("bce,er,rm->bcm", ((2, 5, 12), (12, 4), (4, 20))),  # gate / up (down alike)
])
def test_the_adapter_product_and_its_hand_written_gradients_equal_the_three_operand_einsum(lora_str, shapes):
    """`lora.low_rank_product` (two einsums, a custom VJP that computes weight gradients rank first) against qwix's
    single einsum and JAX's own derivative of it."""
    keys = jax.random.split(jax.random.key(0), 4)
    x, a, b = (jax.random.normal(k, s, jnp.float32) for k, s in zip(keys, shapes))
    g = jax.random.normal(keys[3], jnp.einsum(lora_str, x, a, b).shape, jnp.float32)
    np.testing.assert_allclose(lora.low_rank_product(lora_str, x, a, b), jnp.einsum(lora_str, x, a, b),
                               rtol=1e-5, atol=1e-5)
    ours = jax.grad(lambda *t: jnp.sum(lora.low_rank_product(lora_str, *t) * g), argnums=(0, 1, 2))(x, a, b)
    ref = jax.grad(lambda *t: jnp.sum(jnp.einsum(lora_str, *t) * g), argnums=(0, 1, 2))(x, a, b)
    for got, want in zip(ours, ref, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def _adapter_grads(model, ids, mask, *, unrolled: bool):
    """The next-token loss's gradient w.r.t. every adapter (dotted path -> array) and what its backward runs: the
    lengths of the scans in the gradient's jaxpr (scanned layers) or XLA's FLOP count (unrolled layers)."""
    graphdef, trainable, rest = nnx.split(model, lora.TRAINABLE, ...)

    def loss(train):
        m = nnx.merge(graphdef, train, rest)
        out = m(ids, attention_mask=mask, layers=m.unstacked_layers() if unrolled else None).logits[:, :-1]
        ce = optax.softmax_cross_entropy_with_integer_labels(out, ids[:, 1:])
        return jnp.sum(ce * mask[:, 1:]) / jnp.sum(mask[:, 1:])

    grad = jax.jit(jax.grad(loss))
    if unrolled:
        cost = grad.lower(trainable).compile().cost_analysis()
        work = (cost[0] if isinstance(cost, list) else cost)["flops"]
    else:
        work = [e.params["length"] for e in jax.make_jaxpr(grad)(trainable).jaxpr.eqns[0].params["jaxpr"].eqns
                if e.primitive.name == "scan"]
    grads = {".".join(map(str, p)): np.asarray(v.get_raw_value()) for p, v in nnx.to_flat_state(grad(trainable))}
    return grads, work


@pytest.mark.parametrize("unrolled", [False, True], ids=["scan", "unrolled"])
def test_adapters_of_the_top_layers_only_train_and_the_backward_stops_there(checkpoints, unrolled):
    base = from_pretrained(checkpoints["llama"])  # 3 layers
    full = lora.apply_lora(base, SMALL, seed=1)
    top = lora.apply_lora(base, dataclasses.replace(SMALL, layers=1), seed=1)
    for m in (full, top):
        H.randomize_adapters(m, seed=2)
    assert (full.frozen_layers, top.frozen_layers) == (0, 2)
    ids, mask = (jnp.asarray(a) for a in H.token_batch())
    np.testing.assert_array_equal(logits(full, ids, mask), logits(top, ids, mask))  # the forward is the same
    g_full, work_full = _adapter_grads(full, ids, mask, unrolled=unrolled)
    g_top, work_top = _adapter_grads(top, ids, mask, unrolled=unrolled)
    for key, value in g_full.items():
        np.testing.assert_array_equal(g_top[key][:2], 0.0, err_msg=key)  # the frozen bottom: exactly nothing
        np.testing.assert_allclose(g_top[key][2], value[2], rtol=1e-4, atol=1e-5 * np.abs(value).max(), err_msg=key)
    if unrolled:  # the backward runs through one layer of three: forward F + backward ~2F/3 against 3F
        assert work_top < 0.75 * work_full, (work_top, work_full)
    else:  # forward over 3 layers and backward over 3, against forward over 2 then 1 and backward over 1
        assert (work_full, work_top) == ([3, 3], [2, 1, 1])


def test_lora_layers_validate(checkpoints):
    assert lora.LoraConfig.from_config({}).layers is None  # adapter files without the field: every layer
    assert lora.LoraConfig.from_config({"layers": 0}).layers == 0
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="LoRA layers must be None"):
            lora.LoraConfig(layers=bad)
    with pytest.raises(ValueError, match="exceeds the model's 3 layers"):
        lora.apply_lora(from_pretrained(checkpoints["llama"]), lora.LoraConfig(layers=4))


def test_models_adapted_alike_share_one_graph_and_one_compilation(checkpoints):
    """Two adaptations with one LoRA config (other weights, other seeds) are one graph, so a program compiled for
    the first serves the second; another config is another graph."""
    base = from_pretrained(checkpoints["llama"])
    first, second = lora.apply_lora(base, SMALL, seed=1), lora.apply_lora(base, SMALL, seed=2)
    other = lora.apply_lora(base, dataclasses.replace(SMALL, rank=2), seed=1)
    assert nnx.graphdef(first) == nnx.graphdef(second) and nnx.graphdef(first) != nnx.graphdef(other)
    traces = []

    @nnx.jit
    def forward(model, ids):
        traces.append(1)
        return model(ids).logits

    ids = jnp.ones((1, 4), jnp.int32)
    H.randomize_adapters(second, seed=3)
    a, b = forward(first, ids), forward(second, ids)
    assert len(traces) == 1 and not np.allclose(np.asarray(a), np.asarray(b))  # one program, each model's values


def test_remat_keeps_the_gradients_and_saves_the_backward_passs_memory(adapted):
    model = adapted[1]
    ids, mask = (jnp.asarray(a) for a in H.token_batch())
    _, trainable, rest = nnx.split(model, lora.TRAINABLE, ...)
    grads, temp = {}, {}
    try:
        for remat in ("none", "dots", "full"):
            model.remat = remat
            graphdef = nnx.graphdef(model)

            def loss(train, graphdef=graphdef):
                out = nnx.merge(graphdef, train, rest)(ids, attention_mask=mask).logits[:, :-1]
                return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, ids[:, 1:]) * mask[:, 1:])

            grad = jax.jit(jax.grad(loss)).lower(trainable).compile()
            temp[remat] = grad.memory_analysis().temp_size_in_bytes
            grads[remat] = jax.tree.leaves(grad(trainable))
        model.remat = "some"
        with pytest.raises(ValueError, match="policy.remat"):
            model(ids)
    finally:
        model.remat = "none"
    for remat in ("dots", "full"):
        for got, want in zip(grads[remat], grads["none"], strict=True):
            # float32: the recomputed layers fuse differently (2e-5 of the largest gradient; in float64 equal)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert temp["full"] < temp["dots"] < temp["none"], temp
