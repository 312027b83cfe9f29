"""One tensor-parallel rank: a process that owns one engine on one GPU and serves calls from a pipe.

The launcher (engine.py) starts one per rank with multiprocessing's "spawn" context and sends
nothing until the rank reports. A rank:

  1. builds its engine with local_config (shard.py) on its device and fills it:
       "pretrained": loads the model file itself and reads only its shards (ShardedTensors), with
                     the quant plan rules of Llama.from_pretrained applied to its local shapes;
       "random":     init_random(seed) on its local shapes: a tensor's draw depends only on the
                     seed, its index and its shape, so the whole tensors (the norms) are the same
                     on every rank, and every rank's shard of a split matrix holds the same values
                     (the last rank's vocabulary rows the first of them where it holds fewer): a
                     valid random model of the full shape, not the one a single GPU would draw
                     from that seed;
       "arrays":     the full model's float arrays (given to every rank), of which it keeps its
                     shards: how tests put the same weights in a tensor-parallel and a one-GPU run;
     and reports ("loaded", engine.config, its storage types);
  2. joins the NCCL communicator: rank 0 makes the id (_C.nccl_unique_id) and publishes it through
     a torch.distributed TCPStore, the others read it there; then every rank calls
     engine.init_tensor_parallel, which returns once all have joined; reports ("ready",);
  3. answers ("call", name, args, kwargs), ("get", name) and ("set", name, value) with ("ok",
     result) or ("error", exception, traceback text) until ("stop",) or the pipe closes; on
     ("stop",) every rank leaves the one-shot all-reduce's buffer sharing together (leave_group)
     before dropping its engine.

A rank whose launcher dies exits on its own (a watchdog thread waits on the parent's sentinel),
even while its engine is blocked in a collective, so no rank outlives its caller holding GPU memory.

Under torchrun (run.py) the same requests arrive by broadcast instead of a pipe: RankServer is a
rank's side (rank 0 runs one on a helper thread of the caller, the others in serve_torchrun), with
("start", ...) and ("join",) requests in place of steps 1 and 2, the NCCL id in the job's store.
"""

from __future__ import annotations

import os
import pickle
import threading
import traceback
from dataclasses import dataclass

NCCL_ID_KEY = "llama_brrr/nccl_unique_id"


@dataclass(frozen=True)
class Rendezvous:
    """Where ranks meet to exchange the NCCL id: a TCPStore at host:port. `host_store`: rank 0
    serves the store (the launcher's case); False when someone else already serves it (torchrun's
    agent store)."""

    host: str
    port: int
    timeout_s: float = 60.0
    host_store: bool = True

    @classmethod
    def from_env(cls, timeout_s: float = 60.0) -> "Rendezvous":
        """torchrun's MASTER_ADDR / MASTER_PORT; its agent serves the store when it says so."""
        missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(key)]
        if missing:
            raise ValueError(f"{' and '.join(missing)} not set: start the ranks with torchrun, or "
                             f"let the launcher pick a port on this host")
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return cls(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout_s,
                   host_store=not agent)


def nccl_library() -> str:
    """libnccl.so.2 of the nvidia-nccl-cu12 wheel PyTorch's CUDA builds install, or "" (the
    default dlopen search) when that wheel is absent."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(root, "nccl", "lib", "libnccl.so.2")
        if os.path.isfile(candidate):
            return candidate
    return ""


def exchange_nccl_id(rendezvous: Rendezvous, rank: int, size: int, library: str):
    """Rank 0 makes the NCCL id and publishes it, the others fetch it: (the id, the store, which
    must live until every rank has read it, so the caller keeps it)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    from .. import _C

    store = TCPStore(rendezvous.host, rendezvous.port, world_size=size,
                     is_master=rendezvous.host_store and rank == 0,
                     timeout=timedelta(seconds=rendezvous.timeout_s), wait_for_workers=False)
    if rank == 0:
        unique_id = _C.nccl_unique_id(library)
        store.set(NCCL_ID_KEY, unique_id)
    else:
        unique_id = store.get(NCCL_ID_KEY)
    return bytes(unique_id), store


def build_engine(spec: dict, rank: int, size: int):
    """The rank's engine, filled with its shards; returns (engine, its storage types)."""
    from .. import _C
    from .. import quant as quantization
    from ..loaders.common import ArrayTensors
    from ..model import _RANDOM_INIT_STD, _set_weights
    from .shard import ShardedTensors, local_config

    config = spec["config"]
    local = local_config(config, rank, size)
    backend = spec["backend"]
    device = spec["devices"][rank]
    loaded = None
    if spec["kind"] == "pretrained":
        from ..loaders import load_model

        loaded = load_model(spec["path"])
        file_types = {name: loaded.tensors.file_type(name) for name in local.tensor_shapes()}
    else:
        file_types = None
    plan = quantization.plan(local, spec["quant"], file_types, backend)
    engine = _C.Engine(backend, local.engine_dict(spec["max_seq_len"], spec["max_batch"], **spec["kv"]),
                       spec["dtype"], device, spec["n_threads"], plan.type_ids())
    if spec["kind"] == "pretrained":
        _set_weights(engine, ShardedTensors(loaded.tensors, config, rank, size), local, plan,
                     False, spec["path"])
    elif spec["kind"] == "random":
        engine.init_random(spec["seed"], _RANDOM_INIT_STD)
    elif spec["kind"] == "arrays":
        _set_weights(engine, ShardedTensors(ArrayTensors(spec["arrays"]), config, rank, size),
                     local, plan, False, "arrays")
    else:
        raise ValueError(f"unknown weight source {spec['kind']!r}")
    return engine, dict(plan.types)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any failure to pickle means "send a stand-in"
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _exit_with_parent() -> None:
    """Ends this process as soon as the launcher's does (even inside a blocked engine call)."""
    import multiprocessing
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        wait([parent.sentinel])
        os._exit(70)

    threading.Thread(target=watch, name="llama_brrr-tp-watchdog", daemon=True).start()


def main(rank: int, size: int, spec: dict, conn, rendezvous: Rendezvous | None,
         library: str) -> None:
    """The rank's life: build, join, serve (see the module docstring)."""
    _exit_with_parent()
    try:
        engine, types = build_engine(spec, rank, size)
        conn.send(("loaded", engine.config, types))
        store = None
        if rendezvous is not None:
            unique_id, store = exchange_nccl_id(rendezvous, rank, size, library)
            engine.init_tensor_parallel(unique_id, rank, size, library)
        conn.send(("ready",))
    except Exception as exc:  # noqa: BLE001 - reported to the launcher, which raises it
        conn.send(("error", portable(exc), traceback.format_exc()))
        return
    serve(engine, conn)
    del store


def answer(engine, message) -> tuple:
    """("ok", result) or ("error", exception, traceback text) for one engine request."""
    op = message[0]
    try:
        if op == "call":
            _, name, args, kwargs = message
            result = getattr(engine, name)(*args, **kwargs)
        elif op == "get":
            result = getattr(engine, message[1])
        elif op == "set":
            setattr(engine, message[1], message[2])
            result = None
        else:
            raise ValueError(f"unknown tensor-parallel request {op!r}")
        return ("ok", result)
    except Exception as exc:  # noqa: BLE001 - every engine error goes back to the caller
        return ("error", portable(exc), traceback.format_exc())


def leave_group(engine) -> None:
    """Every rank on a normal stop: ends the one-shot all-reduce's buffer sharing together (a
    collective, so never on a fault path, where a rank may be gone). A failure is left to the
    engine's own release, which frees everything anyway."""
    try:
        engine.leave_tensor_parallel()
    except RuntimeError as exc:
        import sys

        print(f"llama_brrr tensor-parallel rank: leaving the group failed ({exc})", file=sys.stderr)


def serve(engine, conn) -> None:
    """Answers the launcher's calls until ("stop",) or the launcher's end of the pipe closes."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            break
        conn.send(answer(engine, message))
    leave_group(engine)
    del engine
    from ..memory import release_freed_memory

    release_freed_memory()
    conn.send(("stopped",))


class RankServer:
    """One rank of a torchrun job (transport.DistGroup `group`): its engine's life, driven by
    the caller's broadcast requests. Rank 0 runs one on a helper thread of the caller; the other
    ranks run serve_torchrun. Requests: ("start", spec, library or None, generation) -> build
    ("loaded", config, types, "host:pid"); ("join",) -> NCCL ("ready",); ("call" | "get" |
    "set", ...) -> answer(); ("each", [message per rank]) -> this rank's; ("stop",) -> drop the
    engine ("stopped",)."""

    def __init__(self, rank: int, size: int, group):
        self.rank, self.size, self.group = rank, size, group
        self.engine = None
        self._join = None

    def handle(self, message) -> tuple:
        if message[0] == "each":
            message = message[1][self.rank]
        op = message[0]
        try:
            if op == "start":
                _, spec, library, generation = message
                spec = dict(spec)
                if spec["backend"] == "cuda":
                    spec["devices"] = [self.group.local_rank] * self.size
                self.engine = None
                self.engine, types = build_engine(spec, self.rank, self.size)
                self._join = (library, generation)
                import socket

                return ("loaded", self.engine.config, types, f"{socket.gethostname()}:{os.getpid()}")
            if op == "join":
                library, generation = self._join
                if library is not None:
                    key = f"{NCCL_ID_KEY}/{generation}"
                    if self.rank == 0:
                        self.group.store.set(key, _nccl_id(library))
                    unique_id = bytes(self.group.store.get(key))
                    self.engine.init_tensor_parallel(unique_id, self.rank, self.size, library)
                return ("ready",)
            if op == "stop":
                if self.engine is not None:
                    leave_group(self.engine)
                self.engine = None
                from ..memory import release_freed_memory

                release_freed_memory()
                return ("stopped",)
            if self.engine is None:
                raise RuntimeError("no tensor-parallel engine on this rank (request before start)")
        except Exception as exc:  # noqa: BLE001 - reported to rank 0, which raises it
            return ("error", portable(exc), traceback.format_exc())
        return answer(self.engine, message)


def serve_torchrun(group) -> int:
    """Ranks 1.. of a torchrun job: answer rank 0's broadcast requests until ("exit",). An error
    reply is also put in the store at once, so rank 0 hears of it while other ranks may still be
    inside a collective (and never reach the gather). Returns the process's exit code."""
    from .transport import error_key

    import sys

    server = RankServer(group.rank, group.size, group)
    while True:
        try:
            message = group.broadcast()
            if message[0] == "exit":
                # acknowledged, so rank 0 (which may serve the store) leaves only after this rank
                # has stopped watching it
                group.stop_beating()
                group.gather(("bye",))
                group.close()
                return 0
            group.seq += 1
            reply = server.handle(message)
            if reply[0] == "error":
                group.store.set(error_key(group.seq, group.rank), pickle.dumps(reply))
            group.gather(reply)
        except RuntimeError as exc:  # gloo's error for a peer whose connection closed
            print(f"llama_brrr tensor-parallel rank {group.rank}: the job's group broke ({exc}); "
                  f"exiting", file=sys.stderr)
            return 1


def _nccl_id(library: str) -> bytes:
    from .. import _C

    return bytes(_C.nccl_unique_id(library))
