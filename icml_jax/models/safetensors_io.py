"""Memory-mapped reading of (possibly sharded) safetensors checkpoints as NumPy arrays, bfloat16 included.

`safetensors`' own NumPy back end cannot return bfloat16 (0.8: "data type 'bfloat16' not understood"), and its
Flax back end copies every tensor onto the default device, which defeats sharded loading. The file format is a
length-prefixed JSON header followed by raw little-endian buffers, so we map the file and view each tensor
with `ml_dtypes`; nothing is read until a tensor is asked for.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsFile:
    """One `.safetensors` file: tensor names, shapes and zero-copy views into a read-only memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{self.path}: not a readable safetensors file ({e})") from e
        header.pop("__metadata__", None)
        self._header = header
        self._offset = 8 + header_len
        self._map: np.memmap | None = None

    def keys(self) -> list[str]:
        """Tensor names in this file."""
        return list(self._header)

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor `name` without reading it."""
        return tuple(self._header[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        """A read-only view of tensor `name`."""
        info = self._header[name]
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        start, end = info["data_offsets"]
        raw = self._map[self._offset + start : self._offset + end]
        return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


class Checkpoint:
    """All safetensors files of a HF model directory, with or without `model.safetensors.index.json`."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError) as e:
                raise ValueError(f"{index}: unreadable index file ({e})") from e
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (self.directory / f).exists()]
            if missing:
                raise FileNotFoundError(f"{index} lists files that are not in {self.directory}: {missing}")
        else:
            files = sorted(p.name for p in self.directory.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors files in {self.directory}")
        self._files = {name: SafetensorsFile(self.directory / name) for name in files}
        self._where: dict[str, str] = {}
        for fname, f in self._files.items():
            for key in f.keys():
                if key in self._where:
                    raise ValueError(f"tensor {key!r} appears in both {self._where[key]} and {fname}")
                self._where[key] = fname

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def keys(self) -> Iterator[str]:
        """All tensor names."""
        return iter(self._where)

    def file_of(self, name: str) -> Path:
        """The file holding tensor `name` (for error messages)."""
        return self.directory / self._where[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._files[self._where[name]].shape(name)

    def get(self, name: str) -> np.ndarray:
        return self._files[self._where[name]].get(name)
