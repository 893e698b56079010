"""Damaged or hostile checkpoint files fail with errors naming the file and what is wrong (issue 16, item 5):
safetensors headers checked against the file size before anything is allocated, config.json values checked
before any division. Files are a few bytes, written by hand; no model is built."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from icml_jax.models import from_pretrained
from icml_jax.models.config import ModelConfig, ModelConfigError
from icml_jax.models.presets import PRESETS
from icml_jax.models.safetensors_io import Checkpoint, CheckpointError, CheckpointNotFoundError, SafetensorsFile

TINY = {"model_type": "qwen3", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": True}


def write_st(path: Path, header: Any, data: bytes = b"", *, header_len: int | None = None) -> Path:
    """A safetensors file from a header (dict, or raw bytes) and data; `header_len` overrides the length field."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def one_tensor(shape=(2, 2), dtype="F32", offsets=None) -> dict[str, Any]:
    n = math.prod(shape) * 4
    return {"w": {"dtype": dtype, "shape": list(shape), "data_offsets": offsets or [0, n]}}


# --- safetensors -----------------------------------------------------------------------------------------------


def test_well_formed_file_still_reads(tmp_path: Path) -> None:
    values = np.arange(4, dtype=np.float32)
    f = SafetensorsFile(write_st(tmp_path / "m.safetensors", one_tensor(), values.tobytes()))
    np.testing.assert_array_equal(f.get("w"), values.reshape(2, 2))


def test_huge_header_length_is_named_not_a_memory_error(tmp_path: Path) -> None:
    """A header length field of 2**62 fails on the size check, before any allocation, naming the file."""
    path = write_st(tmp_path / "model.safetensors", one_tensor(), bytes(16), header_len=2**62)
    with pytest.raises(CheckpointError, match=rf"{path}: header length field says {2**62} bytes but the file has only"):
        SafetensorsFile(path)
    with pytest.raises(CheckpointError, match="header length field"):  # and through the loader
        (tmp_path / "config.json").write_text(json.dumps(TINY))
        from_pretrained(tmp_path)


def test_truncated_file_names_tensor_and_sizes(tmp_path: Path) -> None:
    """Data shorter than the header says (an interrupted download) is caught when the file is opened."""
    path = write_st(tmp_path / "model.safetensors", one_tensor(), bytes(10))
    with pytest.raises(CheckpointError, match=rf"{path}: tensor 'w': its data ends at byte \d+ but the file has only "
                                              rf"{path.stat().st_size} bytes: the file is truncated"):
        SafetensorsFile(path)


@pytest.mark.parametrize("header", [b"not json at all", b"\xff\xfe{}", b"[1, 2]"])
def test_header_that_is_not_a_json_object(tmp_path: Path, header: bytes) -> None:
    path = write_st(tmp_path / "model.safetensors", header)
    with pytest.raises(CheckpointError, match=rf"{path}: the (\d+-byte header is not JSON|header is a JSON list)"):
        SafetensorsFile(path)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (one_tensor(offsets=[8, 4]), r"data_offsets \[8, 4\] are not \[begin, end\]"),
        (one_tensor(offsets=[0, 8]), r"shape \[2, 2\] of F32 needs 16 bytes but data_offsets \[0, 8\] span 8"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, r"shape \[-1\] is not a list"),
        ({"w": {"shape": [1], "data_offsets": [0, 4]}}, r"header entry .* has no dtype string"),
    ],
)
def test_bad_header_entries_name_the_tensor(tmp_path: Path, entry: dict, message: str) -> None:
    path = write_st(tmp_path / "model.safetensors", entry, bytes(16))
    with pytest.raises(CheckpointError, match=rf"{path}: tensor 'w': {message}"):
        SafetensorsFile(path)


def test_too_short_file_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match=rf"{path}: only 2 bytes"):
        SafetensorsFile(path)
    with pytest.raises(CheckpointNotFoundError, match="no such safetensors file"):
        SafetensorsFile(tmp_path / "absent.safetensors")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointNotFoundError, match=r"no \*\.safetensors files"):
        Checkpoint(empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):  # still a FileNotFoundError for old callers
        from_pretrained(tmp_path / "nope")


def test_index_that_is_not_json_names_the_index(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_bytes(b"\xe9{")
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: unreadable index file"):
        Checkpoint(tmp_path)


# --- config.json -----------------------------------------------------------------------------------------------


def _config_file(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**PRESETS["qwen3-1.7b"], **changes}))
    return path


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_attention_heads", 0),
        ("num_key_value_heads", 0),
        ("num_hidden_layers", 0),
        ("hidden_size", -8),
        ("vocab_size", 0),
        ("intermediate_size", 0),
        ("head_dim", 0),
        ("max_position_embeddings", 0),
        ("num_attention_heads", 2.5),
        ("num_attention_heads", True),
        ("num_attention_heads", "16"),
    ],
)
def test_non_positive_or_non_integer_sizes_are_named(tmp_path: Path, key: str, value: Any) -> None:
    """num_attention_heads=0 used to divide by zero; every size must be a positive integer, named with its file."""
    path = _config_file(tmp_path, **{key: value})
    with pytest.raises(ModelConfigError, match=rf"{path}: {key} = {value!r} must be a positive integer"):
        ModelConfig.from_json_file(path)


def test_zero_heads_without_head_dim_is_not_a_zero_division(tmp_path: Path) -> None:
    path = _config_file(tmp_path, num_attention_heads=0, head_dim=None)
    with pytest.raises(ModelConfigError, match=rf"{path}: num_attention_heads = 0 must be a positive integer"):
        ModelConfig.from_json_file(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rms_norm_eps": -1e-6}, r"rms_norm_eps = -1e-06 must be a finite positive number"),
        ({"rms_norm_eps": 0}, r"rms_norm_eps = 0 must be a finite positive number"),
        ({"rope_theta": 0.0}, r"rope_theta = 0\.0 must be a finite positive number"),
        ({"rope_theta": -10000.0}, r"rope_theta = -10000\.0 must be a finite positive number"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, r"rope_scaling\.factor = 0 must be"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": -1}}, r"rope_parameters\.rope_theta = -1 must"),
        ({"head_dim": None, "hidden_size": 2050}, r"hidden_size = 2050 is not divisible by num_attention_heads = 16"),
        ({"num_key_value_heads": 3}, r"num_key_value_heads = 3 does not divide num_attention_heads = 16"),
        ({"num_hidden_layers": None}, r"missing key num_hidden_layers"),
    ],
)
def test_bad_values_name_file_key_and_value(tmp_path: Path, changes: dict, message: str) -> None:
    path = _config_file(tmp_path, **changes)
    with pytest.raises(ModelConfigError, match=rf"{path}: {message}"):
        ModelConfig.from_json_file(path)


def test_infinite_rope_theta_and_gemma_text_config_keys(tmp_path: Path) -> None:
    """JSON's Infinity is read by Python's json: rejected too; a multimodal Gemma names text_config.<key>."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**PRESETS["qwen3-1.7b"], "rope_theta": math.inf}))
    with pytest.raises(ModelConfigError, match="rope_theta = inf must be a finite positive number"):
        ModelConfig.from_json_file(path)
    text = {**PRESETS["gemma3-1b"], "sliding_window_pattern": 0}
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": text}))
    with pytest.raises(ModelConfigError, match=rf"{path}: text_config\.sliding_window_pattern = 0 must be a positive"):
        ModelConfig.from_json_file(path)


def test_config_that_is_not_json_or_missing(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\xe9\x00garbage")
    with pytest.raises(ModelConfigError, match=rf"{path} is not a JSON config"):
        ModelConfig.from_json_file(path)
    with pytest.raises(ModelConfigError, match="cannot read model config"):
        ModelConfig.from_json_file(tmp_path / "absent.json")


def test_direct_construction_is_checked_too() -> None:
    """ModelConfig built in code (not from a file) rejects the same values, naming the field."""
    good = ModelConfig.from_hf(TINY)
    with pytest.raises(ModelConfigError, match="num_kv_heads = 0 must be a positive integer"):
        ModelConfig(**{**good.__dict__, "num_kv_heads": 0})
    with pytest.raises(ModelConfigError, match=r"rms_norm_eps = -0\.1 must be"):
        ModelConfig(**{**good.__dict__, "rms_norm_eps": -0.1})


def test_damaged_adapter_file_is_named_not_a_memory_error(tmp_path: Path) -> None:
    """Saved LoRA adapters (models.export) are read through the same checked header."""
    from icml_jax.models import export

    path = tmp_path / export.ADAPTER_FILE
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(CheckpointError, match=rf"{path.name}: header length field says {2**62} bytes"):
        export.read_adapter_config(tmp_path)
