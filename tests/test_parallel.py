"""Meshes, sharding rules, multi-host start-up; the 8-device checks run in a subprocess with fake CPU devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import torch
import transformers
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec as P

from icml_jax import parallel
from icml_jax.models import lora
from tests.models import hf_fixtures as F

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- in-process (one CPU device)


def test_mesh_shape_fills_the_remaining_devices():
    assert parallel.resolve_mesh_shape({"data": 2, "fsdp": -1, "tensor": 2}, 8) == (2, 2, 2)
    assert parallel.resolve_mesh_shape({"fsdp": -1}, 8) == (1, 8, 1)
    assert parallel.resolve_mesh_shape(parallel.default_config().mesh, 4) == (1, 4, 1)


@pytest.mark.parametrize("spec, n, message", [
    ({"data": 2, "fsdp": 2, "tensor": 2}, 4, r"mesh spec \{'data': 2, 'fsdp': 2, 'tensor': 2\} needs 8 devices but 4"),
    ({"data": 3, "fsdp": -1}, 8, r"does not fit 8 devices: 8 is not a multiple of 3"),
    ({"data": -1, "fsdp": -1}, 8, r"at most one -1"),
    ({"model": 2}, 8, r"unknown axes \['model'\]"),
])
def test_mesh_spec_errors_name_spec_and_device_count(spec, n, message):
    with pytest.raises(ValueError, match=message):
        parallel.resolve_mesh_shape(spec, n)


def test_make_mesh_on_one_device_uses_auto_axes():
    mesh = parallel.make_mesh(parallel.default_config().mesh)
    assert mesh.axis_names == ("data", "fsdp", "tensor") and mesh.devices.shape == (1, 1, 1)
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_rules_map_logical_axes_and_drop_what_does_not_fit():
    mesh = AbstractMesh((2, 2, 2), parallel.MESH_AXES)
    assert parallel.logical_to_spec(("embed", "heads", "head_dim"), mesh=mesh) == P("fsdp", "tensor", None)
    assert parallel.logical_to_spec(("batch", None)) == P(("data", "fsdp"), None)
    # a mesh axis is used once per array; an axis that does not divide the dimension is dropped
    assert parallel.logical_to_spec(("mlp", "heads"), mesh=mesh) == P("tensor", None)
    kv = parallel.logical_to_spec(("embed", "kv_heads", "head_dim"), mesh=mesh, shape=(64, 1, 16))
    assert kv == P("fsdp", None, None)
    assert parallel.logical_to_spec(("batch",), mesh=mesh, shape=(6,)) == P("data")
    # LoRA axes: rank (None) replicated
    assert parallel.logical_to_spec((None, "kv_heads", "head_dim"), mesh=mesh) == P(None, "tensor", None)
    custom = parallel.rules_from([["embed", None], ["heads", ["fsdp", "tensor"]]])
    assert custom == (("embed", None), ("heads", ("fsdp", "tensor")))
    assert parallel.logical_to_spec(("embed", "heads"), custom, mesh) == P(None, ("fsdp", "tensor"))
    with pytest.raises(ValueError, match="not a \\(logical axis, mesh axes\\) pair"):
        parallel.rules_from([("embed",)])


def test_configs_are_importable_with_paper_defaults():
    from configs import base

    config = base.get_config()
    assert config.lora.rank == 8 and config.lora.alpha == 16.0 and config.lora.dropout == 0.1
    assert dict(config.parallel.mesh) == {"data": 1, "fsdp": -1, "tensor": 1}
    assert parallel.rules_from(config.parallel.rules) == parallel.DEFAULT_RULES
    assert lora.LoraConfig.from_config(config.lora) == lora.LoraConfig()
    # typed placeholders: command-line style overrides of the unset fields work
    config.model.path = "/models/qwen3"
    config.parallel.distributed.num_processes = 2
    config.parallel.distributed.coordinator_address = "10.0.0.1:1234"
    with pytest.raises(TypeError):
        config.parallel.distributed.process_id = "first"


def test_every_parameter_names_its_axes_from_the_known_set():
    from icml_jax.models import abstract_model
    from icml_jax.models.presets import preset

    known = {name for name, _ in parallel.DEFAULT_RULES}
    model = abstract_model(preset("gemma3-1b"))
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = var.get_metadata()["logical_axes"]
        assert len(axes) == len(var.shape) and set(axes) <= known, (path, axes)
    mlp = model.layers.mlp  # block parameters are stacked over layers (replicated by the rules)
    assert mlp.gate.get_metadata()["logical_axes"] == ("layers", "embed", "mlp")
    assert mlp.down.get_metadata()["logical_axes"] == ("layers", "mlp", "embed")
    assert mlp.gate.shape[0] == 26 and parallel.logical_to_spec(("layers", "embed")) == P(None, "fsdp")


@pytest.fixture
def fake_distributed(monkeypatch):
    """Records jax.distributed.initialize calls instead of making them."""
    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_AUTO_DETECT"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_initialize_is_a_no_op_on_one_process(fake_distributed):
    info = parallel.initialize(parallel.default_config().distributed)
    assert fake_distributed == []
    assert (info.process_index, info.process_count) == (0, 1)
    parallel.initialize(num_processes=1)
    assert fake_distributed == []


def test_initialize_passes_config_then_env_then_overrides(fake_distributed, monkeypatch):
    config = parallel.default_config().distributed
    config.update(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=2, local_device_ids=(0, 1))
    parallel.initialize(config)
    assert fake_distributed[-1][0] == ("10.0.0.1:1234", 4, 2, (0, 1))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.9:99")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "1")
    parallel.initialize()
    assert fake_distributed[-1][0][:3] == ("10.0.0.9:99", 2, 1)
    parallel.initialize(config, process_id=3)
    assert fake_distributed[-1][0][:3] == ("10.0.0.1:1234", 4, 3)
    monkeypatch.setenv("JAX_AUTO_DETECT", "1")
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
    monkeypatch.delenv("JAX_NUM_PROCESSES")
    monkeypatch.delenv("JAX_PROCESS_ID")
    parallel.initialize()
    assert fake_distributed[-1][0][:3] == (None, None, None)  # jax detects the TPU pod / SLURM / MPI cluster


def test_initialize_errors_name_what_is_missing(fake_distributed, monkeypatch):
    with pytest.raises(ValueError, match="needs coordinator_address, process_id"):
        parallel.initialize(num_processes=2)
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an integer"):
        parallel.initialize()
    with pytest.raises(TypeError, match="unknown settings \\['num_hosts'\\]"):
        parallel.initialize(num_hosts=2)
    assert fake_distributed == []


# ---------------------------------------------------------------- 8 fake devices, in a subprocess


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    """Runs tests/sharding_worker.py on a tiny Llama (vocab 128, so every axis divides) with 8 CPU devices."""
    directory = tmp_path_factory.mktemp("llama128")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**F.TINY, "vocab_size": 128}, head_dim=16, rms_norm_eps=1e-5,
                                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).float().eval()
    F.randomize_(model, 0)
    model.save_pretrained(directory)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "sharding_worker.py"), str(directory)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_mesh_from_config_on_eight_devices(eight_devices):
    assert eight_devices["devices"] == 8 and eight_devices["mesh_shape"] == [2, 2, 2]
    assert "needs 6 devices but 8 are available" in eight_devices["bad_mesh_error"]


def test_parameters_are_sharded_as_the_rules_say(eight_devices):
    params = eight_devices["params"]
    assert params["wrong"] == [] and params["per_device_ok"]
    assert params["split"] == 12  # every parameter (9 stacked per block) has an axis the (2, 2, 2) mesh splits
    assert eight_devices["specs"] == {
        "embedding": "('tensor', 'fsdp')", "lm_head": "('fsdp', 'tensor')", "q": "(None, 'fsdp', 'tensor', None)",
        "k": "(None, 'fsdp', 'tensor', None)", "o": "(None, 'tensor', None, 'fsdp')",
        "gate": "(None, 'fsdp', 'tensor')", "down": "(None, 'tensor', 'fsdp')", "norm": "(None, 'fsdp')"}


def test_loading_sends_each_device_only_its_shard(eight_devices):
    t = eight_devices["transfers"]
    assert t["count"] == 12 * 8 and t["full_copies"] == 0 and t["max_fraction"] <= 0.5


def test_sharded_logits_equal_single_device(eight_devices):
    print(f"(2,2,2) mesh logits vs single device: {eight_devices['logits_max_diff']:.2e}")
    assert eight_devices["logits_max_diff"] <= 1e-5 and eight_devices["logits_scale"] > 1.0


def test_adapters_follow_their_base_weights_on_the_mesh(eight_devices):
    assert eight_devices["lora_axes_bad"] == []
    assert eight_devices["lora_params"]["wrong"] == [] and eight_devices["lora_params"]["split"] == 14


def test_sharded_lora_step_equals_single_device(eight_devices):
    single, sharded = eight_devices["loss"]
    assert abs(single - sharded) <= 1e-5
    print(f"(2,2,2) mesh LoRA step vs single device: {eight_devices['adapters_max_diff']:.2e}")
    assert eight_devices["adapters_max_diff"] <= 1e-5 and eight_devices["adapters_max_change"] > 1e-4
