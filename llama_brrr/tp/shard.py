"""Megatron-style sharding of a Llama model over tensor-parallel ranks: pure Python and numpy.

Rank r of N holds:

    wq  [Hq/N * hd, D]      the rows of its query heads r*Hq/N .. (r+1)*Hq/N - 1
    wk, wv [Hkv_r * hd, D]  the rows of the KV heads those query heads read (query head h reads KV
                            head h // (Hq / Hkv)): Hkv/N heads when Hkv >= N; when Hkv < N one KV
                            head, replicated on the N/Hkv ranks whose query heads share it
    wo  [D, Hq/N * hd]      the columns that multiply its heads' attention outputs
    w1, w3 [H/N, D]         its rows of the MLP
    w2  [D, H/N]            the matching columns
    tok_embeddings, output [rows_r, D]   its rows of the vocabulary, r*Vs .. min((r+1)*Vs, V) - 1
                            with Vs = ceil(V/N) (vocab_rows; the last rank's may be fewer); with
                            tied embeddings the one shard serves as both
    norms                   whole, on every rank

so a rank's engine is an ordinary engine of `local_config` (fewer heads, a narrower MLP, its
vocabulary rows; dim, vocab_size and layers unchanged) told its rank (tp_rank, tp_size). wo and w2
give each rank a partial sum of the full product; the engine all-reduces those partials into the
residual stream, so every rank ends each layer with the full model's residual. The embedding is
split the same way: a rank embeds the tokens of its rows and zeros for the others', and the
all-reduce that follows sums the rows. The LM head gives each rank its Vs logit columns (the
engine holds the last rank's rows padded to Vs with zeros), which the engine all-gathers, so every
rank holds the same full logits, bit for bit, and samples the same tokens.

Quantized (GGUF block) tensors split the same way on their bytes: a row slice is whole rows of
blocks; a column slice is one contiguous byte range of every row (blocks run along a row), which
needs each shard's columns to be whole blocks (check_blocks).

ShardedTensors wraps a loader's TensorSet and reads only a rank's shard of each tensor from the
file (slices of the memory map; a copy touches only the pages it reads).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from ..config import ModelConfig
from ..loaders.common import TensorSet, interleaved_to_half

# Matrices split by rows (output features) and by columns (input features); the rest are whole.
ROW_SPLIT = ("wq", "wk", "wv", "w1", "w3", "tok_embeddings", "output")
COLUMN_SPLIT = ("wo", "w2")
VOCAB_SPLIT = ("tok_embeddings", "output")  # by rows of the vocabulary (vocab_rows)


class ShardingError(ValueError):
    """A model that cannot be split over the asked number of ranks (the message names the numbers)."""


def _kind(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def check_split(config: ModelConfig, size: int) -> None:
    """ShardingError unless `config` splits evenly over `size` ranks."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ShardingError(f"tensor_parallel must be an integer >= 1, got {size!r}")
    size = int(size)
    if config.n_heads % size:
        raise ShardingError(f"tensor_parallel={size} does not divide the model's {config.n_heads} "
                            f"query heads; use a tensor-parallel size that divides {config.n_heads}")
    if config.hidden_dim % size:
        raise ShardingError(f"tensor_parallel={size} does not divide the MLP width hidden_dim="
                            f"{config.hidden_dim}; use a size that divides it")
    if config.n_kv_heads >= size and config.n_kv_heads % size:
        raise ShardingError(f"tensor_parallel={size} does not divide the model's {config.n_kv_heads} "
                            f"KV heads; use a size that divides {config.n_kv_heads}, or a multiple "
                            f"of it")
    if (size - 1) * -(-config.vocab_size // size) >= config.vocab_size:
        raise ShardingError(f"tensor_parallel={size} leaves the last rank no rows of the "
                            f"{config.vocab_size}-token vocabulary (ceil({config.vocab_size} / "
                            f"{size}) rows each); use fewer ranks")
    if config.n_kv_heads < size and size % config.n_kv_heads:
        raise ShardingError(f"with {config.n_kv_heads} KV heads, tensor_parallel={size} would give a "
                            f"rank query heads of two KV heads; use a size that is a multiple of "
                            f"{config.n_kv_heads} (or divides it)")


def q_heads(config: ModelConfig, rank: int, size: int) -> range:
    """The query heads rank `rank` of `size` computes."""
    per = config.n_heads // size
    return range(rank * per, (rank + 1) * per)


def kv_heads(config: ModelConfig, rank: int, size: int) -> range:
    """The KV heads rank `rank` of `size` holds: those its query heads read."""
    group = config.n_heads // config.n_kv_heads
    heads = q_heads(config, rank, size)
    return range(heads.start // group, (heads.stop - 1) // group + 1)


def vocab_rows(config: ModelConfig, rank: int, size: int) -> range:
    """The vocabulary rows (of tok_embeddings and output) rank `rank` of `size` holds: Vs =
    ceil(V / size) from rank * Vs, fewer on the last rank when size does not divide V (the C++
    Config's vocab_offset / vocab_rows)."""
    per = -(-config.vocab_size // size)
    return range(min(rank * per, config.vocab_size), min((rank + 1) * per, config.vocab_size))


@dataclasses.dataclass
class RankConfig(ModelConfig):
    """A tensor-parallel rank's ModelConfig (local_config): its heads and MLP width in the usual
    fields, vocab_size the full vocabulary, and which rank of how many it is, which sets its rows of
    tok_embeddings and output (tensor_shapes) and goes to the engine (engine_dict)."""

    tp_rank: int = 0
    tp_size: int = 1

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = super().tensor_shapes()
        rows = len(vocab_rows(self, self.tp_rank, self.tp_size))
        for name in VOCAB_SPLIT:
            if name in shapes:
                shapes[name] = (rows, self.dim)
        return shapes

    def engine_dict(self, *args, **kwargs) -> dict:
        return {**super().engine_dict(*args, **kwargs), "tp_rank": self.tp_rank,
                "tp_size": self.tp_size}


def local_config(config: ModelConfig, rank: int, size: int) -> ModelConfig:
    """The config of rank `rank`'s engine: its heads, MLP width and vocabulary rows (a
    RankConfig), the rest of `config`; `config` itself when size is 1."""
    check_split(config, size)
    if not 0 <= rank < size:
        raise ShardingError(f"rank must be in [0, {size}), got {rank}")
    if size == 1:
        return config
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ModelConfig)}
    fields.update(n_heads=config.n_heads // size, n_kv_heads=len(kv_heads(config, rank, size)),
                  hidden_dim=config.hidden_dim // size, head_dim=config.head_dim,
                  rope_scaling=dict(config.rope_scaling) if config.rope_scaling else None,
                  extra=dict(config.extra))
    return RankConfig(**fields, tp_rank=rank, tp_size=size)


def split(config: ModelConfig, name: str, rank: int, size: int) -> tuple[int, int, int] | None:
    """(axis, start, stop) of rank `rank`'s shard of canonical tensor `name` (axis 0: rows, 1:
    columns, in values), or None when every rank holds the tensor whole."""
    if size == 1:
        return None
    kind, hd = _kind(name), config.head_dim
    if kind == "wq":
        heads = q_heads(config, rank, size)
        return 0, heads.start * hd, heads.stop * hd
    if kind in ("wk", "wv"):
        heads = kv_heads(config, rank, size)
        return 0, heads.start * hd, heads.stop * hd
    if kind == "wo":
        heads = q_heads(config, rank, size)
        return 1, heads.start * hd, heads.stop * hd
    per = config.hidden_dim // size
    if kind in ("w1", "w3"):
        return 0, rank * per, (rank + 1) * per
    if kind == "w2":
        return 1, rank * per, (rank + 1) * per
    if name in VOCAB_SPLIT:
        rows = vocab_rows(config, rank, size)
        return 0, rows.start, rows.stop
    return None


def shard_array(array: np.ndarray, config: ModelConfig, name: str, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s shard of the full canonical array `name`: a view, no copy."""
    where = split(config, name, rank, size)
    if where is None:
        return array
    axis, start, stop = where
    return array[start:stop] if axis == 0 else array[:, start:stop]


def shard_blocks(rows: np.ndarray, config: ModelConfig, name: str, rank: int, size: int,
                 block_values: int, block_bytes: int) -> np.ndarray:
    """Rank `rank`'s shard of a quantized tensor's rows as stored (uint8 [rows, row_bytes], blocks
    of `block_values` values in `block_bytes` bytes along each row): a view, no copy."""
    where = split(config, name, rank, size)
    if where is None:
        return rows
    axis, start, stop = where
    if axis == 0:
        return rows[start:stop]
    if start % block_values or stop % block_values:
        raise ShardingError(f"{name}: columns {start}..{stop} of rank {rank} are not whole blocks "
                            f"of {block_values} values")
    return rows[:, start // block_values * block_bytes:stop // block_values * block_bytes]


def merge_shards(config: ModelConfig, name: str, shards: list[np.ndarray]) -> np.ndarray:
    """The full tensor from every rank's shard (in rank order): the inverse of shard_array."""
    size = len(shards)
    where = split(config, name, 0, size)
    if where is None:
        return shards[0]
    axis = where[0]
    if _kind(name) in ("wk", "wv") and config.n_kv_heads < size:
        # A replicated KV head: its first holder's copy stands for it.
        shards = [shards[r] for r in range(size) if kv_heads(config, r, size).start
                  != (kv_heads(config, r - 1, size).start if r else -1)]
    return np.concatenate(shards, axis=axis)


def block_values(type_name: str) -> tuple[int, int]:
    """(values, bytes) of one block of GGML type `type_name` ("q4_k", "Q8_0", ...)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]]


def check_blocks(config: ModelConfig, size: int, types: dict[str, str]) -> None:
    """ShardingError unless every column-split matrix stored in blocks (`types`: name -> GGML type
    name, block types only) has whole blocks in each rank's shard."""
    for name, type_name in types.items():
        if type_name.upper() in ("F32", "F16", "BF16"):
            continue
        where = split(config, name, 0, size)
        if where is None or where[0] != 1:
            continue
        values, _ = block_values(type_name)
        width = where[2] - where[1]
        if width % values:
            raise ShardingError(
                f"tensor_parallel={size} splits {name} ({type_name}, rows of "
                f"{config.tensor_shapes()[name][1]} values) into {width} columns per rank, not "
                f"whole blocks of {values}; use a size whose shards are whole blocks, or "
                f"quant='none' (or a block type of 32 values such as q8_0)")


class ShardedTensors(TensorSet):
    """One rank's shards of a loader's TensorSet: the same TensorSet interface with the shapes of
    local_config(config, rank, size). Reads only the shard from a memory-mapped file: GGUF tensors
    are sliced before any RoPE row permutation (it acts within each head, so slicing whole heads
    first is the same) and before dequantization (blocks are independent); safetensors arrays are
    memory-map views already."""

    def __init__(self, base: TensorSet, config: ModelConfig, rank: int, size: int):
        from ..loaders.gguf import GGUFTensors

        self._base = base
        self._config = config
        self._local = local_config(config, rank, size)
        self._rank, self._size = rank, size
        self._gguf = isinstance(base, GGUFTensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)

    def file_type(self, name: str) -> str:
        return self._base.file_type(name)

    def file_name(self, name: str) -> str:
        return self._base.file_name(name)

    def release(self, name: str) -> None:
        self._base.release(name)

    def __getitem__(self, name: str) -> np.ndarray:
        if not self._gguf:
            return np.ascontiguousarray(shard_array(self._base[name], self._config, name,
                                                    self._rank, self._size))
        from ..loaders.gguf import _FLOAT_TYPES, _tensor_array

        info = self._gguf_info(name)
        if info.tensor_type in _FLOAT_TYPES:
            full = _tensor_array(self._base._reader, info, self._base._path)
            return self._permuted(name, np.ascontiguousarray(
                shard_array(full, self._config, name, self._rank, self._size)))
        import gguf

        rows = self._raw_shard(name)
        values = gguf.quants.dequantize(np.ascontiguousarray(rows), info.tensor_type)
        return self._permuted(name, values.reshape(rows.shape[0], -1))

    def blocks(self, name: str) -> np.ndarray:
        if not self._gguf:
            return np.ascontiguousarray(self._shard_of_blocks(name, self._base.blocks(name)))
        rows = np.ascontiguousarray(self._raw_shard(name))
        self._check_scales(name, rows)
        return self._permuted(name, rows)

    def block_chunks(self, name: str, max_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
        yield 0, self.blocks(name)

    # ---- GGUF internals: the loader's memory map, read only where the shard lies ---------------

    def _gguf_info(self, name: str):
        return self._base._tensors[name]

    def _raw_shard(self, name: str) -> np.ndarray:
        info = self._gguf_info(name)
        raw = self._base._reader.tensor_bytes(info)
        rows = raw.reshape(self._config.tensor_shapes()[name][0], -1)
        return self._shard_of_blocks(name, rows)

    def _shard_of_blocks(self, name: str, rows: np.ndarray) -> np.ndarray:
        values, n_bytes = block_values(self.file_type(name))
        return shard_blocks(rows, self._config, name, self._rank, self._size, values, n_bytes)

    def _check_scales(self, name: str, rows: np.ndarray) -> None:
        from .. import _C
        from ..errors import ModelFileError

        info = self._gguf_info(name)
        bad = _C.quant_ops.first_bad_scale(int(info.tensor_type), rows.reshape(-1))
        if bad >= 0:
            raise ModelFileError(self._base._path, f"tensor {info.name!r} ({info.tensor_type.name}) "
                                                   f"has a NaN or inf scale in block {bad} of "
                                                   f"tensor-parallel rank {self._rank}'s shard; the "
                                                   f"file is corrupt, re-download it")

    def _permuted(self, name: str, rows: np.ndarray) -> np.ndarray:
        # GGUF stores q/k rows in adjacent-pair RoPE order within each head (loaders/gguf.py).
        if name.endswith(".wq"):
            return interleaved_to_half(rows, self._local.n_heads)
        if name.endswith(".wk"):
            return interleaved_to_half(rows, self._local.n_kv_heads)
        return rows
