"""Tensor parallelism: one model over N GPUs, one worker process per GPU (of one host, or of
several under torchrun).

    llm = Llama.from_pretrained(path, tensor_parallel=2)     # or Llama.random(shape, tensor_parallel=2)
    llm.generate("Hello")                                     # as on one GPU

shard.py   the sharding math (local configs, tensor slices, sharded loading), pure numpy
worker.py  one rank: builds its engine on its GPU from its shards, joins NCCL, serves calls
engine.py  TensorParallelEngine: the ranks behind the interface of one _C.Engine
transport.py  how the engine reaches the ranks: pipes to spawned processes, or torch.distributed
           to the processes of a torchrun job
run.py     the torchrun entry point (python -m llama_brrr.tp.run -- <llama-brrr arguments>)

docs/tensor_parallel.md has the process layout and the commands.
"""

from __future__ import annotations

from .engine import TensorParallelEngine, TensorParallelError
from .shard import ShardingError, check_split, local_config

__all__ = ["TensorParallelEngine", "TensorParallelError", "ShardingError", "check_split",
           "local_config", "parse_size", "rank_devices", "from_arrays"]


def parse_size(tensor_parallel) -> int:
    """The tensor_parallel argument: an integer >= 1."""
    from ..model import _is_int

    if not _is_int(tensor_parallel) or tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be an integer >= 1 (the number of GPUs), got "
                         f"{tensor_parallel!r}")
    return int(tensor_parallel)


def rank_devices(backend: str, device_index: int, size: int) -> list[int]:
    """The GPU of each rank: device_index, device_index + 1, ...; ValueError when the device is
    not CUDA or too few GPUs are visible."""
    from .. import _C

    if backend != "cuda":
        raise ValueError(f"tensor_parallel={size} needs device='cuda' (one rank per GPU); got a "
                         f"{backend} device")
    count = _C.cuda_device_count()
    from .transport import current_group

    group = current_group()
    if group is not None:
        # torchrun: one rank per process, each on its own host's cuda:LOCAL_RANK.
        if size != group.size:
            raise ValueError(f"tensor_parallel={size} under torchrun needs as many processes; the "
                             f"job has WORLD_SIZE={group.size}: pass --tensor-parallel {group.size}")
        if group.local_rank >= count:
            raise ValueError(f"LOCAL_RANK={group.local_rank} but this host has {count} visible GPUs; "
                             f"start at most {count} processes per host (--nproc-per-node)")
        return [group.local_rank] * size
    if device_index + size > count:
        first = f"from cuda:{device_index} " if device_index else ""
        raise ValueError(f"tensor_parallel={size} needs {size} GPUs {first}but {count} are visible "
                         f"(CUDA_VISIBLE_DEVICES); use tensor_parallel <= {count - device_index}")
    return [device_index + r for r in range(size)]


def from_arrays(config, arrays: dict, tensor_parallel: int, *, device: str = "cuda",
                dtype: str | None = None, max_seq_len: int | None = None,
                max_batch: int | None = None, quant: str | None = None,
                kv_block_size: int = 16, gpu_memory_utilization: float = 0.9,
                kv_blocks: int | None = None, enable_prefix_caching: bool = True,
                kv_cache_dtype: str = "auto", collectives: bool = True):
    """A Llama of `config` over tensor_parallel ranks holding the full float `arrays` (canonical
    names -> arrays; every rank receives them all and keeps its shards): the same weights a
    one-GPU engine can be given, so the two runs can be compared. collectives=False (with
    device='cpu') starts ranks that never join a communicator: for testing the process plumbing."""
    from .. import model as m
    from ..model import Llama, RandomModelTokenizer

    size = parse_size(tensor_parallel)
    backend, device_index = m._parse_device(device)
    if backend == "cuda" or (collectives and size > 1):
        devices = rank_devices(backend, device_index, size)
    else:
        devices = [device_index] * size
    engine_dtype = m._parse_dtype(dtype, backend)
    max_seq_len = m._parse_max_seq_len(max_seq_len, config)
    max_batch = m._parse_max_batch(max_batch, backend)
    kv = m._parse_kv(kv_block_size, gpu_memory_utilization, kv_blocks, enable_prefix_caching,
                     kv_cache_dtype)
    missing = sorted(set(config.tensor_shapes()) - set(arrays))
    if missing:
        raise ValueError(f"arrays lacks tensor(s) {', '.join(missing[:5])}")
    spec = dict(kind="arrays", config=config, backend=backend, devices=devices, dtype=engine_dtype,
                max_seq_len=max_seq_len, max_batch=max_batch, kv=kv, n_threads=0,
                quant=quant, arrays=arrays)
    engine = TensorParallelEngine(spec, size, collectives=collectives)
    tokenizer = (RandomModelTokenizer(config.vocab_size)
                 if config.vocab_size >= RandomModelTokenizer.N_SPECIAL + 256 else None)
    return Llama(engine, config, tokenizer, device=m._device_name(backend, device_index),
                 dtype=engine_dtype, max_seq_len=max_seq_len, max_batch=max_batch,
                 source=f"arrays:{config.name}", weight_types=engine.weight_types,
                 enable_prefix_caching=enable_prefix_caching, tensor_parallel=size)
