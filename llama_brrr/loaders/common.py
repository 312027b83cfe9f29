"""Pieces every loader shares: the normalized result, shape validation, the RoPE row permutation."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..config import ConfigError, ModelConfig
from ..errors import ModelFileError, UnsupportedModelError

ProgressFn = Callable[[int, int], None]


class TensorSet(Mapping):
    """A model file's canonical tensors, read one at a time.

    ``tensors[name]`` is the tensor as a float32, float16 or ml_dtypes.bfloat16 array of exactly
    ``config.tensor_shapes()[name]`` (q/k rows in rotate-half order); a quantized tensor is
    dequantized on each access and nothing is cached, so walking the names streams the file.
    ``file_type(name)`` is the type the file stores it in ("F32", "BF16", "Q4_1", ...);
    ``blocks(name)``, for a quantized type, its rows as stored (uint8 [rows, row_bytes], q/k rows
    permuted like the values); ``release(name)`` tells the set the tensor has been consumed, so
    a memory-mapped file can drop its pages.
    """

    def file_type(self, name: str) -> str:
        raise NotImplementedError

    def blocks(self, name: str) -> np.ndarray:
        raise ValueError(f"tensor {name!r} is stored as {self.file_type(name)}, not in blocks")

    def release(self, name: str) -> None:
        pass


_NUMPY_TYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


class ArrayTensors(TensorSet):
    """A TensorSet over arrays already at hand (memory maps or loaded arrays)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self._arrays = arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def file_type(self, name: str) -> str:
        dtype = self._arrays[name].dtype
        return _NUMPY_TYPE_NAMES.get(dtype.name, dtype.name.upper())


@dataclass
class LoadedModel:
    """A model file in the one form the rest of the package consumes.

    tensors: a TensorSet: canonical names (see config.py) -> float32, float16 or
        ml_dtypes.bfloat16 arrays of exactly ``config.tensor_shapes()``, q/k rows in rotate-half
        order, read on access; quantized GGUF tensors also as their blocks. Arrays that can be
        used straight from the file are read-only memory maps of it.
    tokenizer_spec: what llama_brrr.tokenizer.load_tokenizer reads, under these same keys. Always
        has "format" ("gguf", "hf" or "llama2c"); the other keys depend on it:
        gguf:    every ``tokenizer.ggml.*`` key without that prefix ("model", "pre", "tokens",
                 "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
                 "unknown_token_id", "padding_token_id", "add_bos_token", "add_eos_token",
                 "add_space_prefix", ...) plus "chat_template" (None when absent) and "path" (the
                 file, as str). The keys named here are always present (None when the file lacks them).
        hf:      "tokenizer_json", "tokenizer_model", "tokenizer_config", "generation_config",
                 "special_tokens_map" (absolute paths as str, or None) and "chat_template".
        llama2c: "tokenizer_bin" (absolute path as str) and "vocab_size" (the model's).
    file_dtype: the tensor type holding most of the parameters in the file ("Q4_1", "BF16", "F32").
    """

    config: ModelConfig
    tensors: TensorSet = field(repr=False)
    tokenizer_spec: dict = field(repr=False)
    source: str
    file_dtype: str
    eos_token_ids: list[int]
    bos_token_id: int | None


    def __post_init__(self):
        if not isinstance(self.tensors, TensorSet):
            self.tensors = ArrayTensors(dict(self.tensors))


def first_nonfinite_row(array: np.ndarray) -> int:
    """Index of the first row of `array` holding NaN or inf, or -1; scanned in slices of about
    4M values so a large tensor needs no full-size temporary."""
    rows = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(-1, 1)
    step = max(1, (1 << 22) // max(1, rows.shape[1]))
    for r0 in range(0, rows.shape[0], step):
        chunk = rows[r0:r0 + step]
        finite = np.isfinite(chunk.astype(np.float32, copy=False)).all(axis=1)
        if not finite.all():
            return r0 + int(np.argmin(finite))
    return -1


def require_file(path: Path, what: str = "model file") -> None:
    if not path.exists():
        raise ModelFileError(path, f"no such {what}; check the path (run `python weights/fetch.py` "
                                   f"to download the default model)")
    if not path.is_file():
        raise ModelFileError(path, f"expected a {what}, found a directory or special file")
    if path.stat().st_size == 0:
        raise ModelFileError(path, "the file is empty; re-download it")


def make_config(path: Path, **fields) -> ModelConfig:
    """ModelConfig(**fields); metadata the engine cannot run is reported against the file."""
    try:
        return ModelConfig(**fields)
    except ConfigError as exc:
        raise UnsupportedModelError(path, f"the model's configuration is not usable: "
                                          f"{exc}") from exc


def check_shapes(config: ModelConfig, found: dict[str, tuple[int, ...]], path: Path,
                 file_name: Callable[[str], str] = str) -> None:
    """Raise ModelFileError unless every tensor the config needs is in `found` with its shape.

    `found` maps canonical names to the shapes the file declares; names the config does not need
    are ignored. `file_name` turns a canonical name into the file's own, for the messages.
    """
    expected = config.tensor_shapes()
    missing = [name for name in expected if name not in found]
    if missing:
        shown = ", ".join(repr(file_name(n)) for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ModelFileError(path, f"missing tensor(s) {shown}{more} that a "
                                   f"{config.n_layers}-layer model needs; the file is incomplete "
                                   f"or not a Llama model")
    for name, shape in expected.items():
        if tuple(found[name]) != tuple(shape):
            raise ModelFileError(
                path, f"tensor {file_name(name)!r} has shape {tuple(found[name])}, but "
                      f"the model's configuration implies {tuple(shape)}; the file's metadata and "
                      f"weights disagree (corrupt or mis-converted file)")


def interleaved_to_half(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder the rows of a q or k projection from adjacent-pair RoPE order to rotate-half order.

    GGUF and llama2.c (Meta's layout) rotate the row pairs (2i, 2i+1) of each head; the engine, like
    HF, rotates (i, i + head_dim/2). Row 2i of a head must become row i, and row 2i+1 row
    i + head_dim/2.
    This is the inverse of llama.cpp's convert-time `permute` and equal to HF's Meta->HF `permute`.
    """
    rows, cols = w.shape
    head_dim = rows // n_heads
    return np.ascontiguousarray(
        w.reshape(n_heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols))


def dominant(counts: dict[str, int]) -> str:
    """The key with the largest count (ties broken by name, so the answer is deterministic)."""
    return max(sorted(counts), key=lambda k: counts[k])


def fspath(path: str | os.PathLike) -> Path:
    return Path(os.fspath(path)).expanduser()
