"""Safetensors files as NumPy arrays, bfloat16 included: memory-mapped reading of (possibly sharded) checkpoints,
and the one streaming, atomic writer every exported or converted file goes through.

`safetensors`' own NumPy back end cannot return or save bfloat16 (0.8: "data type 'bfloat16' not understood"), and
its Flax back end copies every tensor onto the default device, which defeats sharded loading. The file format is a
length-prefixed JSON header followed by raw little-endian buffers, so we map the file and view each tensor
with `ml_dtypes`; nothing is read until a tensor is asked for. Writing, the header is made from the tensors'
names, dtypes and shapes alone, so each tensor's data can be produced, written and dropped one at a time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

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
_CODES = {np.dtype(dtype): code for code, dtype in _DTYPES.items()}


MAX_HEADER_BYTES = 100_000_000  # the `safetensors` library refuses larger headers too
_RECOVER = "the file is damaged or not a safetensors file; download or export it again"


class CheckpointError(ValueError):
    """A model checkpoint (directory, safetensors file, index) cannot be loaded; names the file and what is wrong."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint directory or file that should be there is not."""


class SafetensorsFile:
    """One `.safetensors` file: tensor names, shapes and zero-copy views into a read-only memory map.

    The header is checked against the file's size before anything is allocated or mapped: its length, that it
    is a JSON object, and that every tensor's byte range lies inside the file and fits its shape and dtype.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 8:
                    raise CheckpointError(f"{self.path}: only {size} bytes, too short for the 8-byte header length "
                                          f"a safetensors file starts with; {_RECOVER}")
                (header_len,) = struct.unpack("<Q", f.read(8))
                if header_len > min(size - 8, MAX_HEADER_BYTES):
                    limit = (f"the file has only {size - 8} bytes after it" if header_len > size - 8
                             else f"the limit is {MAX_HEADER_BYTES}")
                    raise CheckpointError(f"{self.path}: header length field says {header_len} bytes but {limit}; "
                                          f"{_RECOVER}")
                raw = f.read(header_len)
        except FileNotFoundError as e:
            raise CheckpointNotFoundError(f"{self.path}: no such safetensors file") from e
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read safetensors file ({e})") from e
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{self.path}: the {header_len}-byte header is not JSON ({e}); {_RECOVER}") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: the header is a JSON {type(header).__name__}, not an object; "
                                  f"{_RECOVER}")
        metadata = header.pop("__metadata__", None)
        self.metadata: dict[str, str] = metadata if isinstance(metadata, dict) else {}
        self._offset = 8 + header_len
        data_size = size - self._offset
        for name, info in header.items():
            self._check_entry(name, info, data_size, size)
        self._header = header
        self._map: np.memmap | None = None

    def _check_entry(self, name: str, info: Any, data_size: int, size: int) -> None:
        """Raises CheckpointError unless `info` is a well-formed entry whose bytes lie inside the file."""
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(info, dict) or not isinstance(info.get("dtype"), str):
            raise CheckpointError(f"{where}: header entry {info!r} has no dtype string; {_RECOVER}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of non-negative integers; {_RECOVER}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
                or offsets[0] > offsets[1]):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end; "
                                  f"{_RECOVER}")
        begin, end = offsets
        if end > data_size:
            raise CheckpointError(f"{where}: its data ends at byte {self._offset + end} but the file has only {size} "
                                  f"bytes: the file is truncated (an interrupted download?); download it again")
        dtype = _DTYPES.get(info["dtype"])
        if dtype is not None and end - begin != math.prod(shape) * np.dtype(dtype).itemsize:
            raise CheckpointError(f"{where}: shape {shape} of {info['dtype']} needs "
                                  f"{math.prod(shape) * np.dtype(dtype).itemsize} bytes but data_offsets {offsets} "
                                  f"span {end - begin}; {_RECOVER}")

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
            raise CheckpointError(f"{self.path}: tensor {name!r} has dtype {info['dtype']}, which this loader does "
                                  f"not read (supported: {', '.join(_DTYPES)})")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        start, end = info["data_offsets"]
        raw = self._map[self._offset + start : self._offset + end]
        return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


def _is_count(x: Any) -> bool:
    """A non-negative int (JSON true/false excluded)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class Checkpoint:
    """All safetensors files of a HF model directory, with or without `model.safetensors.index.json`."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_bytes())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:  # ValueError: not JSON, not UTF-8
                raise CheckpointError(f"{index}: unreadable index file ({type(e).__name__}: {e}); download it "
                                      "again") from e
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise CheckpointError(f"{index}: 'weight_map' is not an object of tensor name -> file name; download "
                                      "it again")
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (self.directory / f).is_file()]
            if missing:
                raise CheckpointNotFoundError(f"{index} lists files that are not in {self.directory}: {missing}")
        else:
            files = sorted(p.name for p in self.directory.glob("*.safetensors"))
            if not files:
                raise CheckpointNotFoundError(f"no *.safetensors files in {self.directory}")
        self._files = {name: SafetensorsFile(self.directory / name) for name in files}
        self._where: dict[str, str] = {}
        for fname, f in self._files.items():
            for key in f.keys():
                if key in self._where:
                    raise CheckpointError(f"{self.directory}: tensor {key!r} appears in both {self._where[key]} "
                                          f"and {fname}")
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


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor's header entry, known before its data: so the writer can put the header first and then stream."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        """Normalises dtype and shape; a dtype safetensors cannot hold is a ValueError naming the tensor."""
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in _CODES:
            raise ValueError(f"tensor {self.name!r}: dtype {self.dtype} cannot be written to safetensors "
                             f"(supported: {', '.join(str(d) for d in _CODES)})")

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data in the file."""
        return math.prod(self.shape) * self.dtype.itemsize


def safetensors_header(specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
    """The length-prefixed JSON header of a file holding `specs` in order (padded to 8 bytes with spaces)."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {})}
    offset = 0
    for spec in specs:
        if spec.name in header:
            raise ValueError(f"tensor name {spec.name!r} appears twice (or is the reserved '__metadata__')")
        header[spec.name] = {"dtype": _CODES[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


def write_safetensors(path: str | Path, specs: Sequence[TensorSpec], arrays: Iterable[np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> Path:
    """Writes `path` from the header `specs` and then `arrays` (one per spec, in order), holding one array at a time.

    `arrays` may be a generator producing each tensor when asked (dequantized, merged, gathered). Each array must
    have its spec's shape and a dtype that casts to the spec's within its kind; a wrong shape, dtype or count is a
    ValueError naming the tensor and the file. The file is written to a temporary name beside `path` and renamed
    over it when complete, so a failure (or a kill) leaves the old file or none, never half of one."""
    path = Path(path)
    specs = list(specs)
    head = safetensors_header(specs, metadata)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            f.flush()  # on disk before the first array is produced (and after each one): nothing piles up
            produced = iter(arrays)
            for count, spec in enumerate(specs):
                array = next(produced, None)
                if array is None:
                    raise ValueError(f"{path}: no data for tensor {spec.name!r} (only {count} arrays for "
                                     f"{len(specs)} tensors)")
                f.write(_tensor_bytes(path, spec, array))
                f.flush()
            if next(produced, None) is not None:
                raise ValueError(f"{path}: more arrays than the {len(specs)} tensors of the header")
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_tensors(path: str | Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
                  ) -> Path:
    """Writes a dict of arrays already in memory (adapters, test fixtures) through `write_safetensors`."""
    arrays = {name: np.asarray(a) for name, a in tensors.items()}
    specs = [TensorSpec(name, a.dtype, a.shape) for name, a in arrays.items()]
    return write_safetensors(path, specs, arrays.values(), metadata)


def _tensor_bytes(path: Path, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """`array` as the bytes of `spec`'s little-endian buffer (a uint8 view, no copy when it already fits); a
    mismatch is a ValueError naming the tensor and the file."""
    array = np.asarray(array)
    if tuple(array.shape) != spec.shape:
        raise ValueError(f"{path}: tensor {spec.name!r} has shape {tuple(array.shape)}, its header says {spec.shape}")
    if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
        raise ValueError(f"{path}: tensor {spec.name!r} has dtype {array.dtype}, its header says {spec.dtype}")
    data = np.ascontiguousarray(array, dtype=spec.dtype.newbyteorder("<"))
    return data.reshape(-1).view(np.uint8)
