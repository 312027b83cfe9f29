"""The GGUF container: header, metadata and tensor table, read with every length checked against
the file before anything is allocated from it; tensor bytes as views of one memory map.

GGUF v2/v3, little-endian (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):
    "GGUF" | u32 version | u64 n_tensors | u64 n_kv | n_kv x (string key, u32 type, value) |
    n_tensors x (string name, u32 n_dims, n_dims x u64 dim, u32 ggml type, u64 offset) |
    padding to `general.alignment` (default 32) | tensor data (offsets relative to its start)
A string is u64 length + UTF-8 bytes; an array is u32 item type + u64 count + items.

The `gguf` package's GGUFReader does the same, but builds a numpy array per string (seconds and
~180 MB of Python objects for a 49k-token vocabulary) and trusts counts until numpy fails; this
reader decodes strings straight to `str`, numeric arrays to one numpy array, and reports a field
that runs past the end of the file as a truncated or corrupt file, naming the field.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS

# value type id -> (struct format, numpy dtype) for scalars
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF file; the message names the field and the offset."""


class UnknownTensorType(GGUFFormatError):
    """A tensor's GGML type id is not one the gguf package knows."""


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]        # GGML order: fastest-varying dimension first
    tensor_type: GGMLQuantizationType
    data_offset: int              # absolute, in the file
    n_elements: int
    n_bytes: int


class GGUFFile:
    """fields: key -> Python value (int, float, bool, str, list of str, numpy array of numbers);
    tensors: the tensor table in file order; data: a read-only np.memmap of the whole file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.size = self.path.stat().st_size
        self.data = np.memmap(self.path, dtype=np.uint8, mode="r") if self.size else np.zeros(0, np.uint8)
        self._buf = memoryview(self.data)
        self._at = 0
        if self._bytes(4, "the magic") != MAGIC:
            raise GGUFFormatError("the file does not start with GGUF")
        self.version = self._scalar("<I", "the version")
        if self.version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {self.version} is not supported (2 and 3 are; "
                                  f"big-endian files are not)")
        n_tensors = self._scalar("<Q", "the tensor count")
        n_kv = self._scalar("<Q", "the metadata count")
        # Each entry needs at least 8 + 4 bytes (key length, type) / 8 + 4 + 8 + 4 + 8 (a tensor):
        # a count the remaining bytes cannot hold is damage, not a reason to loop for hours.
        if n_kv * 12 + n_tensors * 32 > self.size - self._at:
            raise GGUFFormatError(f"the header claims {n_kv} metadata entries and {n_tensors} "
                                  f"tensors, more than the {self.size}-byte file can hold")
        self.fields: dict = {}
        for i in range(n_kv):
            key = self._string(f"metadata key #{i}")
            kind = self._scalar("<I", f"the type of {key!r}")
            self.fields[key] = self._value(kind, key)
        self.alignment = self._alignment()
        infos = []
        for i in range(n_tensors):
            name = self._string(f"tensor name #{i}")
            n_dims = self._scalar("<I", f"the rank of tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS})")
            shape = tuple(self._scalar("<Q", f"a dimension of tensor {name!r}") for _ in range(n_dims))
            type_id = self._scalar("<I", f"the type of tensor {name!r}")
            offset = self._scalar("<Q", f"the offset of tensor {name!r}")
            infos.append((name, shape, type_id, offset))
        self.data_offset = -(-self._at // self.alignment) * self.alignment
        self.tensors = [self._tensor(*info) for info in infos]

    def tensor_bytes(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes (uint8 view of the map; the caller checked they lie in the file)."""
        return self.data[t.data_offset:t.data_offset + t.n_bytes]

    # ---- parsing ----------------------------------------------------------------------------

    def _need(self, n: int, what: str) -> None:
        if n < 0 or self._at + n > self.size:
            raise GGUFFormatError(f"{what} at byte {self._at} runs past the end of the file "
                                  f"({self.size} bytes)")

    def _bytes(self, n: int, what: str) -> bytes:
        self._need(n, what)
        out = bytes(self._buf[self._at:self._at + n])
        self._at += n
        return out

    def _scalar(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self._need(size, what)
        (value,) = struct.unpack_from(fmt, self._buf, self._at)
        self._at += size
        return value

    def _string(self, what: str) -> str:
        n = self._scalar("<Q", f"the length of {what}")
        raw = self._bytes(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFFormatError(f"{what} is not valid UTF-8 ({exc})") from exc

    def _value(self, kind: int, key: str):
        if kind in _SCALARS:
            fmt, _ = _SCALARS[kind]
            value = self._scalar(fmt, f"the value of {key!r}")
            return bool(value) if kind == 7 else value
        if kind == _STRING:
            return self._string(f"the value of {key!r}")
        if kind == _ARRAY:
            item = self._scalar("<I", f"the item type of {key!r}")
            count = self._scalar("<Q", f"the length of {key!r}")
            if item in _SCALARS:
                fmt, dtype = _SCALARS[item]
                n_bytes = count * struct.calcsize(fmt)
                self._need(n_bytes, f"the {count} items of {key!r}")
                values = np.frombuffer(self._buf, dtype=np.dtype(dtype).newbyteorder("<"),
                                       count=count, offset=self._at).copy()
                self._at += n_bytes
                return values
            if item == _STRING:
                if count * 8 > self.size - self._at:
                    raise GGUFFormatError(f"{key!r} claims {count} strings, more than the file holds")
                return [self._string(f"item {i} of {key!r}") for i in range(count)]
            if item == _ARRAY:
                for i in range(count):  # nested arrays: skipped (no key the engine reads has them)
                    self._value(_ARRAY, f"{key}[{i}]")
                return None
            raise GGUFFormatError(f"{key!r} is an array of unknown item type {item}")
        raise GGUFFormatError(f"{key!r} has unknown value type {kind}")

    def _alignment(self) -> int:
        value = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
            raise GGUFFormatError(f"general.alignment = {value!r}: must be a power of two")
        return value

    def _tensor(self, name: str, shape: tuple, type_id: int, offset: int) -> TensorInfo:
        try:
            kind = GGMLQuantizationType(type_id)
        except ValueError:
            raise UnknownTensorType(f"tensor {name!r} has GGML type id {type_id}, which is not a "
                                    f"known type") from None
        if kind not in GGML_QUANT_SIZES:
            raise UnknownTensorType(f"tensor {name!r} has type {kind.name}, which has no size")
        block, type_size = GGML_QUANT_SIZES[kind]
        n_elements = 1
        for d in shape:
            n_elements *= d
        if n_elements > self.size * 8:  # more values than 1 bit each in the whole file
            raise GGUFFormatError(f"tensor {name!r} has shape {shape}: {n_elements} values cannot "
                                  f"fit a {self.size}-byte file")
        return TensorInfo(name=name, shape=shape, tensor_type=kind,
                          data_offset=self.data_offset + offset, n_elements=n_elements,
                          n_bytes=n_elements // block * type_size)
