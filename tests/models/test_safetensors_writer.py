"""The one safetensors writer (`safetensors_io.write_safetensors`): what it writes reads back the same with the
`safetensors` package, it streams (each array is written before the next is asked for), and a failure leaves the
old file or none, never half of one."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors
import torch

from icml_jax.models.safetensors_io import SafetensorsFile, TensorSpec, write_safetensors, write_tensors


def _mixed() -> dict[str, np.ndarray]:
    """One tensor of every dtype the format holds here, odd shapes and a scalar and an empty one included."""
    rng = np.random.default_rng(0)
    return {
        "f64": rng.normal(size=(3, 5)), "f32": rng.normal(size=(7,)).astype(np.float32),
        "f16": rng.normal(size=(2, 3, 4)).astype(np.float16), "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "i32": np.array(-3, dtype=np.int32), "i16": np.arange(5, dtype=np.int16), "i8": np.arange(-4, 4, dtype=np.int8),
        "u8": np.arange(9, dtype=np.uint8).reshape(3, 3), "bool": np.array([True, False, True]),
        "empty": np.zeros((0, 4), np.float32),
    }


def test_round_trip_matches_the_safetensors_readers(tmp_path: Path) -> None:
    tensors = _mixed()
    path = write_tensors(tmp_path / "m.safetensors", tensors, {"format": "pt", "note": "x"})
    with safetensors.safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "pt", "note": "x"} and set(f.keys()) == set(tensors)
        for name, array in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == array.dtype and got.shape == array.shape, name
            np.testing.assert_array_equal(got, array)
    ours = SafetensorsFile(path)
    assert ours.keys() == list(tensors)
    for name, array in tensors.items():
        np.testing.assert_array_equal(ours.get(name), array)


def test_bfloat16_reads_back_with_the_torch_reader(tmp_path: Path) -> None:
    values = np.random.default_rng(1).normal(size=(4, 6)).astype(ml_dtypes.bfloat16)
    path = write_tensors(tmp_path / "bf16.safetensors", {"w": values})
    with safetensors.safe_open(path, framework="pt") as f:
        got = f.get_tensor("w")
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.float().numpy(), values.astype(np.float32))


def test_many_tensors(tmp_path: Path) -> None:
    """Thousands of tensors (a large model's per-layer names) in one header, in order, each at its offset."""
    tensors = {f"model.layers.{i}.w": np.full((i % 5 + 1,), i, np.float32) for i in range(5000)}
    path = write_tensors(tmp_path / "many.safetensors", tensors)
    with safetensors.safe_open(path, framework="np") as f:
        assert len(f.keys()) == 5000
        for name in ("model.layers.0.w", "model.layers.2345.w", "model.layers.4999.w"):
            np.testing.assert_array_equal(f.get_tensor(name), tensors[name])
    assert SafetensorsFile(path).keys() == list(tensors)


def test_each_array_is_written_before_the_next_is_produced(tmp_path: Path) -> None:
    """The writer pulls arrays from a generator one at a time and writes each before asking for the next."""
    path = tmp_path / "stream.safetensors"
    specs = [TensorSpec(f"t{i}", np.float32, (256,)) for i in range(4)]
    sizes = []

    def arrays():
        for i in range(4):
            (tmp,) = tmp_path.glob("stream.safetensors.tmp*")
            sizes.append(tmp.stat().st_size)
            yield np.full((256,), i, np.float32)

    write_safetensors(path, specs, arrays())
    header = sizes[0]
    assert sizes == [header + i * 1024 for i in range(4)]
    assert path.stat().st_size == header + 4 * 1024 and not list(tmp_path.glob("*.tmp*"))


def test_a_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = write_tensors(tmp_path / "m.safetensors", {"old": np.ones(3, np.float32)})
    before = path.read_bytes()
    specs = [TensorSpec("a", np.float32, (2,)), TensorSpec("b", np.float32, (2,))]

    def failing():
        yield np.zeros(2, np.float32)
        raise RuntimeError("gather failed")

    with pytest.raises(RuntimeError, match="gather failed"):
        write_safetensors(path, specs, failing())
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
    with pytest.raises(ValueError, match=r"m\.safetensors: tensor 'b' has shape \(3,\), its header says \(2,\)"):
        write_safetensors(path, specs, [np.zeros(2, np.float32), np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match=r"no data for tensor 'b' \(only 1 arrays for 2 tensors\)"):
        write_safetensors(path, specs, [np.zeros(2, np.float32)])
    with pytest.raises(ValueError, match="more arrays than the 2 tensors"):
        write_safetensors(path, specs, [np.zeros(2, np.float32)] * 3)
    with pytest.raises(ValueError, match=r"tensor 'a' has dtype float32, its header says int32"):
        write_safetensors(path, [TensorSpec("a", np.int32, (2,))], [np.zeros(2, np.float32)])
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
    new = tmp_path / "new.safetensors"
    with pytest.raises(RuntimeError):
        write_safetensors(new, specs, failing())
    assert not new.exists()


def test_unwritable_dtypes_and_duplicate_names_are_named() -> None:
    with pytest.raises(ValueError, match=r"tensor 'c': dtype complex64 cannot be written to safetensors"):
        TensorSpec("c", np.complex64, (2,))
    with pytest.raises(ValueError, match="tensor name 'a' appears twice"):
        write_safetensors(Path("unused.safetensors"), [TensorSpec("a", np.float32, ())] * 2, [])
