"""Reads the tensors of a safetensors checkpoint as raw bytes, without torch.

The safetensors numpy API cannot represent bf16 or fp8, and the engine wants bytes anyway (it
converts, fuses and shards in C++), so this module parses the format itself: an 8-byte
little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then the data.
Files are memory-mapped read-only and each tensor is a zero-copy uint8 view into the map.
Every header entry is validated before any tensor is handed out, so a truncated or corrupt
file fails at open with the file and tensor named, not as garbage weights.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .errors import CheckpointError

SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"

# safetensors dtype -> (bytes per element, PE_DTYPE_* value or None if the engine has none).
# The PE_DTYPE_* values are those of native/include/pyengine.h.
_SAFETENSORS_DTYPES: dict[str, tuple[int, int | None]] = {
    "F32": (4, 0),
    "F16": (2, 1),
    "BF16": (2, 2),
    "F8_E4M3": (1, 3),
    "I8": (1, 4),
    "I32": (4, 5),
    "F64": (8, None),
    "I64": (8, None),
    "U64": (8, None),
    "U32": (4, None),
    "I16": (2, None),
    "U16": (2, None),
    "U8": (1, None),
    "BOOL": (1, None),
    "F8_E5M2": (1, None),
}
# The safetensors library's own limit; a larger value means a corrupt length field.
_MAX_HEADER_BYTES = 100_000_000
# Checkpoint prefixes the engine's tensor names leave out (pe_model_set_tensor); the longer
# one first, since "model." is a prefix of it.
_STRIPPED_PREFIXES = ("model.language_model.", "model.")
# Vision-tower tensors of the multimodal wrapper; the engine is text-only.
_SKIPPED_PREFIXES = ("model.visual.", "visual.")


def engine_tensor_name(checkpoint_name: str) -> str | None:
    """The name pe_model_set_tensor expects, or None for a tensor the engine does not use."""
    if checkpoint_name.startswith(_SKIPPED_PREFIXES):
        return None
    for prefix in _STRIPPED_PREFIXES:
        if checkpoint_name.startswith(prefix):
            return checkpoint_name[len(prefix) :]
    return checkpoint_name  # "lm_head.weight", "mtp.*"


@dataclass(frozen=True)
class CheckpointTensor:
    name: str  # engine name (prefix stripped)
    checkpoint_name: str  # name in the file
    dtype: int  # PE_DTYPE_*
    dtype_name: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]
    data: np.ndarray  # 1-D uint8, a view into the file's read-only map
    file_name: str  # base name of the safetensors file

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


@dataclass(frozen=True)
class _HeaderEntry:
    name: str
    dtype_name: str
    shape: tuple[int, ...]
    begin: int  # absolute offsets in the file
    end: int


class SafetensorsFile:
    """One safetensors file: parsed, validated header and a read-only map of the data."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.file_name = os.path.basename(self.path)
        try:
            with open(self.path, "rb") as f:
                self.file_size = os.fstat(f.fileno()).st_size
                self.entries = self._read_header(f)
                self._map: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise CheckpointError(f"{self.path}: file not found") from None
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read: {e}") from None

    def fail(self, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {problem}")

    def _read_header(self, f) -> dict[str, _HeaderEntry]:
        if self.file_size < 8:
            raise self.fail(f"{self.file_size} bytes is too short for a safetensors file")
        header_len = int.from_bytes(f.read(8), "little")
        if header_len > min(_MAX_HEADER_BYTES, self.file_size - 8):
            raise self.fail(
                f"header length {header_len} is impossible for a file of {self.file_size} bytes "
                "(truncated or not a safetensors file)"
            )
        try:
            header = json.loads(f.read(header_len).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self.fail(f"header is not valid JSON: {e}") from None
        if not isinstance(header, dict):
            raise self.fail("header is not a JSON object")
        data_start = 8 + header_len
        entries = {
            name: self._parse_entry(name, raw, data_start)
            for name, raw in header.items()
            if name != "__metadata__"
        }
        self._check_layout(entries, data_start)
        return entries

    def _parse_entry(self, name: str, raw: object, data_start: int) -> _HeaderEntry:
        if not isinstance(raw, dict):
            raise self.fail(f"tensor {name!r}: header entry is not an object")
        dtype_name = raw.get("dtype")
        if dtype_name not in _SAFETENSORS_DTYPES:
            raise self.fail(f"tensor {name!r}: unknown dtype {dtype_name!r}")
        shape = raw.get("shape")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise self.fail(
                f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers"
            )
        offsets = raw.get("data_offsets")
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
        ):
            raise self.fail(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
        begin, end = offsets
        if begin > end:
            raise self.fail(f"tensor {name!r}: data_offsets {offsets} end before they begin")
        expected = math.prod(shape) * _SAFETENSORS_DTYPES[dtype_name][0]
        if end - begin != expected:
            raise self.fail(
                f"tensor {name!r}: {end - begin} bytes of data for shape {shape} {dtype_name} "
                f"(expected {expected})"
            )
        if data_start + end > self.file_size:
            raise self.fail(
                f"tensor {name!r}: data ends at byte {data_start + end} but the file has "
                f"{self.file_size} bytes (truncated?)"
            )
        return _HeaderEntry(name, dtype_name, tuple(shape), data_start + begin, data_start + end)

    def _check_layout(self, entries: dict[str, _HeaderEntry], data_start: int) -> None:
        # Like the safetensors library: tensors tile the data area exactly, no overlap, no hole.
        position = data_start
        for entry in sorted(entries.values(), key=lambda e: (e.begin, e.end)):
            if entry.begin != position:
                what = (
                    "overlaps the previous tensor"
                    if entry.begin < position
                    else "leaves a gap before it"
                )
                raise self.fail(f"tensor {entry.name!r}: data at byte {entry.begin} {what}")
            position = entry.end
        if position != self.file_size:
            raise self.fail(
                f"{self.file_size - position} bytes after the last tensor are not described "
                "by the header"
            )

    def tensor(self, checkpoint_name: str) -> CheckpointTensor:
        entry = self.entries.get(checkpoint_name)
        if entry is None:
            raise self.fail(f"no tensor {checkpoint_name!r}")
        size, pe_dtype = _SAFETENSORS_DTYPES[entry.dtype_name]
        if pe_dtype is None:
            raise self.fail(
                f"tensor {checkpoint_name!r}: dtype {entry.dtype_name} is not supported "
                "by the engine"
            )
        if self._map is None:
            raise self.fail("read after close()")
        data = np.frombuffer(
            self._map, dtype=np.uint8, count=entry.end - entry.begin, offset=entry.begin
        )
        name = engine_tensor_name(checkpoint_name) or checkpoint_name
        return CheckpointTensor(
            name, checkpoint_name, pe_dtype, entry.dtype_name, entry.shape, data, self.file_name
        )

    def close(self) -> None:
        if self._map is None:
            return
        try:
            self._map.close()
        except BufferError:
            # A caller still holds a view; dropping our reference lets the map close when the
            # last view goes, instead of leaving that view pointing at unmapped memory.
            pass
        self._map = None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class CheckpointReader:
    """All text-model tensors of a checkpoint directory (one file or an index of shards).

    Use as a context manager, or call close(); the tensors' data views stay valid until then.
    """

    def __init__(self, model_dir: str | os.PathLike):
        self.model_dir = os.fspath(model_dir)
        self._index: dict[str, str] | None = None  # weight_map of a sharded checkpoint
        self._files: list[SafetensorsFile] = []
        # engine name -> (file, checkpoint name), in file then header order
        self._locations: dict[str, tuple[SafetensorsFile, str]] = {}
        try:
            for path in self._shard_paths():
                self._add_file(SafetensorsFile(path))
        except BaseException:
            self.close()
            raise

    def _shard_paths(self) -> list[str]:
        single = os.path.join(self.model_dir, SINGLE_FILE_NAME)
        index = os.path.join(self.model_dir, INDEX_FILE_NAME)
        # transformers prefers the single file when both exist; so do we.
        if os.path.exists(single):
            return [single]
        if not os.path.exists(index):
            raise CheckpointError(
                f"{self.model_dir}: neither {SINGLE_FILE_NAME} nor {INDEX_FILE_NAME} found"
            )
        self._index = _read_weight_map(index)
        shard_names = list(dict.fromkeys(self._index.values()))
        paths = [os.path.join(self.model_dir, shard) for shard in shard_names]
        for shard, path in zip(shard_names, paths, strict=True):
            if not os.path.exists(path):
                raise CheckpointError(
                    f"{index}: shard {shard!r} listed in weight_map does not exist"
                )
        return paths

    def _add_file(self, shard: SafetensorsFile) -> None:
        self._files.append(shard)
        for checkpoint_name in shard.entries:
            name = engine_tensor_name(checkpoint_name)
            if name is None:
                continue
            if name in self._locations:
                other_file, other_name = self._locations[name]
                raise CheckpointError(
                    f"{shard.path}: tensor {checkpoint_name!r} duplicates {other_name!r} "
                    f"in {other_file.file_name}"
                )
            self._locations[name] = (shard, checkpoint_name)
        if self._index is not None:
            for checkpoint_name, shard_name in self._index.items():
                if shard_name == shard.file_name and checkpoint_name not in shard.entries:
                    raise CheckpointError(
                        f"{os.path.join(self.model_dir, INDEX_FILE_NAME)}: weight_map puts "
                        f"{checkpoint_name!r} in {shard_name} but that file has no such tensor"
                    )

    @property
    def file_names(self) -> list[str]:
        return [f.file_name for f in self._files]

    def names(self) -> list[str]:
        """Engine names of every tensor the engine may use."""
        return list(self._locations)

    def __contains__(self, name: str) -> bool:
        return name in self._locations

    def __len__(self) -> int:
        return len(self._locations)

    def tensor(self, name: str) -> CheckpointTensor:
        """The tensor with this engine name (KeyError if absent)."""
        shard, checkpoint_name = self._locations[name]
        return shard.tensor(checkpoint_name)

    def __iter__(self) -> Iterator[CheckpointTensor]:
        for shard, checkpoint_name in self._locations.values():
            yield shard.tensor(checkpoint_name)

    def close(self) -> None:
        for shard in self._files:
            shard.close()
        self._files = []
        self._locations = {}

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _read_weight_map(index_path: str) -> dict[str, str]:
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index_path}: cannot read JSON: {e}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: weight_map is missing, empty or not an object")
    for name, shard in weight_map.items():
        # A shard must be a plain file name in the directory, never a path out of it.
        if (
            not isinstance(shard, str)
            or not shard
            or os.path.basename(shard) != shard
            or shard in (".", "..")
        ):
            raise CheckpointError(
                f"{index_path}: weight_map[{name!r}]: {shard!r} is not a file name"
            )
    return weight_map
