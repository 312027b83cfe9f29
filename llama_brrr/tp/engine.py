"""TensorParallelEngine: N worker processes, one engine each, behind the interface of one _C.Engine.

Llama, the scheduler, the block manager, AsyncLlama, the profiler and the benchmarks drive it as
they drive a _C.Engine. Every call goes to every rank in the same order (send to all, then wait
for all), because each forward pass all-reduces across the ranks and each rank samples the same
tokens from the same full logits; rank 0's answer is returned. get_weight gathers the full tensor
from the ranks' shards, set_weight hands each rank its shard.

The ranks are reached through a transport (transport.py): pipes to "spawn" children of this
process (one host), or, when this process is rank 0 of a torchrun job (run.py), torch.distributed
to the job's other processes; the rules below are the same for both.

Faults end the group, never hang the caller. While waiting the launcher polls the transport (once
a second):
  - a rank that exits (a crash, a kill, an out-of-memory kill) -> RuntimeError naming the rank and
    its exit code (under torchrun: the rank whose heartbeat stopped, or a rank silent for the
    heartbeat timeout);
  - an exception on every rank (a bad argument, refused alike by all before any collective) ->
    that exception, the rank named, and the group stays usable;
  - an exception on some ranks only (a GPU out of memory on one) -> the others may be blocked in a
    collective: after fault_grace_s the exception is raised, the rank named;
  - a rank that has not joined the communicator join_timeout_s after all loaded -> RuntimeError.
After any but the second, every rank is terminated (killed if it does not exit within seconds;
under torchrun told to exit through the store, and run.py ends the job) and later calls raise at
once. close(), garbage collection and interpreter exit stop the ranks too.
"""

from __future__ import annotations

import atexit
import copy
import time
import weakref

import numpy as np

from . import shard, worker
from .transport import (STOP_WAIT_S, DistTransport, PipeTransport, RankLost, current_group,
                        free_port)

__all__ = ["TensorParallelEngine", "TensorParallelError", "free_port", "STOP_WAIT_S"]

POLL_S = 1.0

_live: "weakref.WeakSet[TensorParallelEngine]" = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for group in list(_live):
        group.close()


atexit.register(_stop_all_at_exit)


class TensorParallelError(RuntimeError):
    """A rank died, hung or failed alone: the group is stopped (the message says which and how)."""


class TensorParallelEngine:
    """`size` ranks of one model (see the module docstring).

    spec: what each rank builds (worker.build_engine): "kind" ("pretrained", "random", "arrays"),
    "config" (the full model's ModelConfig), "backend", "devices" (one device index per rank),
    "dtype", "max_seq_len", "max_batch", "kv" (ModelConfig.engine_dict's paged-cache keys),
    "n_threads", "quant", and "path", "seed" or "arrays" by kind.
    collectives: False starts the ranks without a communicator (each computes only its partial
    sums): only for exercising the process plumbing where there is no NCCL (CPU tests).
    """

    def __init__(self, spec: dict, size: int, *, collectives: bool = True,
                 nccl_library: str | None = None, join_timeout_s: float = 60.0,
                 fault_grace_s: float = 5.0, rendezvous: worker.Rendezvous | None = None):
        shard.check_split(spec["config"], size)
        if len(spec["devices"]) != size:
            raise ValueError(f"spec['devices'] names {len(spec['devices'])} devices for {size} ranks")
        self.size = int(size)
        self.fault_grace_s = float(fault_grace_s)
        self._full_config = spec["config"]
        self._backend = spec["backend"]
        self._dtype = spec["dtype"]
        self._closed_because: str | None = None
        group = current_group()
        if collectives and self.size > 1:
            library = worker.nccl_library() if nccl_library is None else nccl_library
            if group is None:
                rendezvous = rendezvous or worker.Rendezvous("127.0.0.1", free_port(), join_timeout_s)
        else:
            library, rendezvous = "", None
        if group is not None:
            # Under torchrun (run.py) the ranks are the job's processes, this one rank 0; they
            # exchange the NCCL id through the job's own store.
            self._transport = DistTransport(group, self.size)
            rendezvous = group.rendezvous if collectives and self.size > 1 else None
        else:
            self._transport = PipeTransport(self.size)
        _live.add(self)
        try:
            self._transport.launch(spec, rendezvous, library)
            loaded = self._gather("loaded", None)
            self._transport.after_loaded()
            self._gather("ready", join_timeout_s)
        except BaseException:
            self._shutdown("start-up failed")
            raise
        self._rank_configs = [reply[1] for reply in loaded]
        self.weight_types = loaded[0][2]
        self._kv_blocks = min(int(c["kv_blocks"]) for c in self._rank_configs)
        if any(int(c["kv_blocks"]) != self._kv_blocks for c in self._rank_configs):
            self._identity_tables()

    # ---- what Llama and the serving layer read ------------------------------------------------

    @property
    def config(self) -> dict:
        """The full model's engine config; the KV pool's keys from the ranks (the smallest pool,
        so every block id handed out exists on every rank)."""
        rank0 = {key: value for key, value in self._rank_configs[0].items()
                 if key not in ("tp_rank", "tp_size")}  # rank 0's own place in the group
        full = self._full_config.engine_dict(rank0["max_seq_len"], rank0["max_batch"])
        return {**rank0, **full, "kv_block_size": rank0["kv_block_size"],
                "kv_blocks": self._kv_blocks, "tensor_parallel": self.size}

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def pids(self) -> list:
        """The ranks' process ids (under torchrun: "host:pid" strings)."""
        return self._transport.pids

    @property
    def alive(self) -> bool:
        """Whether the ranks still serve calls (False once closed or stopped by a fault)."""
        return self._closed_because is None

    @property
    def stopped_because(self) -> str | None:
        """Why the ranks were stopped ("closed", "rank 1 was killed by signal 9", ...), or None."""
        return self._closed_because

    # ---- engine calls -------------------------------------------------------------------------

    def prefill(self, *args, **kwargs):
        return self._call("prefill", args, kwargs)

    def prefill_many(self, *args, **kwargs):
        return self._call("prefill_many", args, kwargs)

    def decode(self, *args, **kwargs):
        return self._call("decode", args, kwargs)

    def decode_steps(self, *args, **kwargs):
        return self._call("decode_steps", args, kwargs)

    def decode_launch(self, *args, **kwargs):
        return self._call("decode_launch", args, kwargs)

    def decode_wait(self):
        return self._call("decode_wait", (), {})

    def decode_discard(self) -> None:
        """Forgets the ranks' pending launches; nothing to forget once the ranks are stopped."""
        if self._closed_because is None:
            self._call("decode_discard", (), {})

    @property
    def decode_pending(self) -> int:
        return self._broadcast(("get", "decode_pending"))[0]

    def sample(self, *args, **kwargs):
        return self._call("sample", args, kwargs)

    def set_block_table(self, *args, **kwargs):
        return self._call("set_block_table", args, kwargs)

    def set_history(self, *args, **kwargs):
        return self._call("set_history", args, kwargs)

    def init_random(self, *args, **kwargs):
        return self._call("init_random", args, kwargs)

    def profile_records(self):
        return self._call("profile_records", (), {})

    def profile_clear(self):
        return self._call("profile_clear", (), {})

    def get_weight(self, name: str) -> np.ndarray:
        """The full tensor, gathered from the ranks' shards."""
        return shard.merge_shards(self._full_config, name,
                                  self._broadcast(("call", "get_weight", (name,), {})))

    def set_weight(self, name: str, array: np.ndarray, dtype: str) -> None:
        """Sets the full tensor: each rank receives its shard."""
        full = self._full_config.tensor_shapes().get(name)
        if full is None:
            raise ValueError(f"unknown weight name {name!r}")
        if tuple(np.shape(array)) != tuple(full):
            raise ValueError(f"weight {name!r}: shape {tuple(np.shape(array))}, expected {full}")
        self._broadcast([("call", "set_weight", (name, np.ascontiguousarray(
            shard.shard_array(array, self._full_config, name, r, self.size)), dtype), {})
            for r in range(self.size)])

    @property
    def profile_enabled(self) -> bool:
        return self._broadcast(("get", "profile_enabled"))[0]

    @profile_enabled.setter
    def profile_enabled(self, on: bool) -> None:
        self._broadcast(("set", "profile_enabled", bool(on)))

    @property
    def use_cuda_graphs(self) -> bool:
        return self._broadcast(("get", "use_cuda_graphs"))[0]

    @use_cuda_graphs.setter
    def use_cuda_graphs(self, on: bool) -> None:
        self._broadcast(("set", "use_cuda_graphs", bool(on)))

    # ---- the group's all-reduce (tests and benchmarks; csrc/cuda/allreduce.cu) -------------------

    def all_reduce_info(self) -> dict:
        """Whether residual all-reduces of up to "oneshot_max_bytes" take the one-shot IPC kernel
        ("oneshot"), those of up to "ll_max_bytes" its low-latency form, else "why_not" (every rank
        decides alike; rank 0's answer)."""
        return self._call("all_reduce_info", (), {})

    def all_reduce(self, values: list, method: str = "oneshot") -> list:
        """Rank r all-reduces values[r] (float32, the same length on every rank, a multiple of 4) by
        `method` ("oneshot" | "ll" | "nccl"); every rank's result, in rank order."""
        if len(values) != self.size:
            raise ValueError(f"all_reduce takes one array per rank: {self.size} ranks, got "
                             f"{len(values)} arrays")
        arrays = [np.ascontiguousarray(v, dtype=np.float32) for v in values]
        if any(a.shape != arrays[0].shape or a.ndim != 1 for a in arrays):
            raise ValueError(f"all_reduce takes 1-D arrays of one length on every rank, got shapes "
                             f"{[a.shape for a in arrays]}")
        return self._broadcast([("call", "all_reduce", (a, method), {}) for a in arrays])

    def all_reduce_bench(self, nbytes: int, method: str, iters: int = 100, repeats: int = 20) -> float:
        """Median microseconds per all-reduce of `nbytes` by `method`, `iters` of them captured in
        one CUDA graph, replayed `repeats` times on every rank together (rank 0's figure)."""
        return self._call("all_reduce_bench", (int(nbytes), method, int(iters), int(repeats)), {})

    # ---- life -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops every rank (their engines free the GPUs); later calls raise."""
        if self._closed_because is None:
            self._closed_because = "closed"
            _live.discard(self)
            self._transport.stop()
            return
        self._shutdown("closed")

    def __enter__(self) -> "TensorParallelEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_closed_because", "never started") is None:
            if isinstance(getattr(self, "_transport", None), DistTransport):
                self.close()  # the job's ranks drop their engines and wait for the next model
            else:
                self._shutdown("garbage-collected")

    def __repr__(self) -> str:
        state = self._closed_because or "running"
        return (f"TensorParallelEngine(size={self.size}, backend={self._backend!r}, "
                f"pids={self.pids}, {state})")

    # ---- internals ------------------------------------------------------------------------------

    def _call(self, name: str, args: tuple, kwargs: dict):
        return self._broadcast(("call", name, args, kwargs))[0]

    def _identity_tables(self) -> None:
        """Puts every slot on the same blocks on every rank when their pools differ in size (the
        ranks' own initial layouts follow their own pools)."""
        per_seq = -(-int(self._rank_configs[0]["max_seq_len"]) // int(self._rank_configs[0]["kv_block_size"]))
        for slot in range(int(self._rank_configs[0]["max_batch"])):
            first = slot * per_seq
            last = min(first + per_seq, self._kv_blocks)
            self.set_block_table(slot, np.arange(first, max(first, last), dtype=np.int32))

    def _broadcast(self, message) -> list:
        """Sends `message` (or message[r] to rank r, given a list) to every rank, then waits for
        every answer; returns them in rank order."""
        if self._closed_because is not None:
            raise TensorParallelError(f"the tensor-parallel workers were stopped "
                                      f"({self._closed_because}); load the model again")
        messages = message if isinstance(message, list) else [message] * self.size
        try:
            self._transport.send(messages)
        except RankLost as lost:
            self._raise_dead(lost)
        return [reply[1] for reply in self._gather("ok", None)]

    def _gather(self, expected: str, timeout_s: float | None) -> list:
        """One reply per rank, of kind `expected`; raises (and stops the group where the ranks may
        disagree) on a death, an error or the timeout, as the module docstring says."""
        replies: dict[int, tuple] = {}
        errors: dict[int, tuple] = {}
        first_error_at = None
        started = time.monotonic()
        while len(replies) + len(errors) < self.size:
            pending = [r for r in range(self.size) if r not in replies and r not in errors]
            try:
                got = self._transport.poll(pending, POLL_S)
            except RankLost as lost:
                self._raise_dead(lost)
            for rank, reply in got.items():
                (errors if reply[0] == "error" else replies)[rank] = reply
                if reply[0] == "error" and first_error_at is None:
                    first_error_at = time.monotonic()
            now = time.monotonic()
            if errors and now - first_error_at > self.fault_grace_s \
                    and len(replies) + len(errors) < self.size:
                rank = min(errors)
                self._shutdown(f"rank {rank} failed alone")
                raise self._rank_error(rank, errors[rank],
                                       f"; ranks {sorted(set(range(self.size)) - set(errors))} did "
                                       f"not answer within {self.fault_grace_s:g} s, so every rank "
                                       f"was stopped")
            if timeout_s is not None and not errors and now - started > timeout_s \
                    and len(replies) < self.size:
                late = sorted(set(range(self.size)) - set(replies))
                self._shutdown(f"ranks {late} did not join")
                raise TensorParallelError(
                    f"tensor-parallel rank(s) {late} did not join the NCCL communicator within "
                    f"{timeout_s:g} s (GPUs that cannot reach each other, or a blocked network "
                    f"port); every rank was stopped")
        if errors:
            rank = min(errors)
            if len(errors) < self.size or expected != "ok":
                self._shutdown(f"rank {rank} failed")
                raise self._rank_error(rank, errors[rank], "; every rank was stopped")
            raise self._rank_error(rank, errors[rank], "")
        wrong = [r for r, reply in replies.items() if reply[0] != expected]
        if wrong:
            self._shutdown("protocol error")
            raise TensorParallelError(f"rank {wrong[0]} answered {replies[wrong[0]][0]!r} where "
                                      f"{expected!r} was due; every rank was stopped")
        return [replies[r] for r in range(self.size)]

    def _rank_error(self, rank: int, reply: tuple, tail: str) -> BaseException:
        """The rank's exception, of its own type, its message led by the rank, chained to a
        stand-in that carries the rank's traceback."""
        exc, trace = reply[1], reply[2]
        message = f"tensor-parallel rank {rank}: {exc}{tail}"
        try:
            rebuilt = copy.copy(exc)
            rebuilt.args = (message,)
        except Exception:  # noqa: BLE001 - an exception type that cannot be copied keeps its own text
            rebuilt = exc
            rebuilt.add_note(message)
        rebuilt.__cause__ = _RemoteTraceback(trace)
        return rebuilt

    def _raise_dead(self, lost: RankLost) -> None:
        pid = f" (pid {lost.pid})" if lost.pid is not None else ""
        who = f"rank {lost.rank}" if lost.rank is not None else "a rank"
        self._shutdown(f"{who} {lost.what}")
        raise TensorParallelError(f"tensor-parallel {who}{pid} {lost.what}; every rank was "
                                  f"stopped: load the model again")

    def _shutdown(self, why: str) -> None:
        """Stops every rank (see the transport's kill)."""
        if self._closed_because is None:
            self._closed_because = why
        _live.discard(self)
        transport = getattr(self, "_transport", None)
        if transport is not None:
            transport.kill(why)


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a tensor-parallel rank, as text."""

    def __init__(self, text: str):
        super().__init__(text)

    def __str__(self) -> str:
        return "\n" + self.args[0]
