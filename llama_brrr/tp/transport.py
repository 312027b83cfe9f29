"""How TensorParallelEngine reaches its ranks: the call and fault rules live in engine.py, the
moving of messages here.

PipeTransport  ranks are "spawn" child processes of the caller, one pipe each (one host).
DistTransport  ranks are the processes torchrun started (run.py); this process is rank 0 and
               runs its own rank's engine on a helper thread. Calls travel as a gloo
               broadcast_object_list, replies as a gather_object; both over a process group
               rendezvoused through the TCPStore at MASTER_ADDR:MASTER_PORT, which also carries
               the NCCL id, early error reports and every rank's heartbeat.

A transport offers: launch(spec, rendezvous, library), after_loaded(), send(messages),
poll(pending, wait_s) -> {rank: reply} (the replies that have arrived; RankLost for a rank that is
gone), stop() (an orderly end), kill(why) (the end after a fault), pids.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue
import socket
import sys
import threading
import time
from multiprocessing.connection import wait

from . import worker

STOP_WAIT_S = 5.0


class RankLost(Exception):
    """Rank `rank` is gone (`what`: how, for the message); rank None: one that could not be
    told."""

    def __init__(self, rank: int | None, what: str, pid=None):
        super().__init__(rank, what)
        self.rank, self.what, self.pid = rank, what, pid


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (for rank 0's TCPStore)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _main_module_hidden():
    """Starts "spawn" children without re-running the caller's main script in them (what spawn does
    to find functions defined there): a script that builds a Llama at top level, with no
    `if __name__ == "__main__":` guard, would otherwise start its workers again in every worker.
    The workers run only llama_brrr code, so they need nothing from __main__."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {key: main.__dict__[key] for key in ("__file__", "__spec__") if key in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


class PipeTransport:
    """One spawned process and one duplex pipe per rank (worker.main is the rank's side)."""

    def __init__(self, size: int):
        self.size = size
        self._procs: list = []
        self._conns: list = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def launch(self, spec: dict, rendezvous, library: str) -> None:
        context = multiprocessing.get_context("spawn")
        for rank in range(self.size):
            ours, theirs = context.Pipe(duplex=True)
            proc = context.Process(target=worker.main, name=f"llama_brrr-tp-rank{rank}",
                                   args=(rank, self.size, spec, theirs, rendezvous, library),
                                   daemon=True)
            with _main_module_hidden():
                proc.start()
            theirs.close()
            self._procs.append(proc)
            self._conns.append(ours)

    def after_loaded(self) -> None:
        """The ranks join the communicator by themselves once loaded."""

    def send(self, messages: list) -> None:
        for rank, (conn, m) in enumerate(zip(self._conns, messages)):
            try:
                conn.send(m)
            except (OSError, ValueError) as exc:
                raise self._lost(rank, f"its pipe is closed ({exc})") from None

    def poll(self, pending: list[int], wait_s: float) -> dict[int, tuple]:
        ready = wait([self._conns[r] for r in pending] + [self._procs[r].sentinel for r in pending],
                     wait_s)
        got = {}
        for rank in pending:
            conn = self._conns[rank]
            if conn in ready or conn.poll(0):
                try:
                    got[rank] = conn.recv()
                except (EOFError, OSError):
                    self._procs[rank].join(STOP_WAIT_S)
                    raise self._lost(rank, "its pipe closed") from None
            elif not self._procs[rank].is_alive():
                raise self._lost(rank, "it exited")
        return got

    def _lost(self, rank: int, how: str) -> RankLost:
        proc = self._procs[rank]
        code = proc.exitcode
        if code is None:
            proc.join(0.1)
            code = proc.exitcode
        what = (f"was killed by signal {-code}" if code is not None and code < 0
                else f"exited with code {code}" if code is not None else "stopped answering")
        return RankLost(rank, f"{what} ({how})", proc.pid)

    def stop(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.kill("closed")

    def kill(self, why: str) -> None:
        """Terminates every rank still alive (killing those that ignore it) and closes the pipes."""
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(STOP_WAIT_S)
        for conn in self._conns:
            conn.close()


# ---- torchrun ------------------------------------------------------------------------------------

# Store keys, under the group's own prefix (see DistGroup).
ABORT_KEY = "abort"
HEARTBEAT_S = 1.0


def error_key(seq: int, rank: int) -> str:
    return f"error/{seq}/{rank}"


def heartbeat_key(rank: int) -> str:
    return f"heartbeat/{rank}"


class DistGroup:
    """This process's place in a torchrun job: rank, world size, local rank, the TCPStore and the
    gloo process group over it, and a heartbeat thread. run.py makes one per process.

    heartbeat_timeout_s: a rank whose heartbeat counter stands still this long is taken for dead
    (engine calls hold the Python lock, so it must exceed the longest call)."""

    def __init__(self, rank: int, size: int, local_rank: int, rendezvous: worker.Rendezvous,
                 heartbeat_timeout_s: float = 60.0):
        from datetime import timedelta

        import torch.distributed as dist
        from torch.distributed import PrefixStore, TCPStore

        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.rendezvous = rendezvous
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        master = rendezvous.host_store and rank == 0
        base = TCPStore(rendezvous.host, rendezvous.port, world_size=size, is_master=master,
                        timeout=timedelta(seconds=rendezvous.timeout_s), wait_for_workers=False)
        self._base = base
        # torchrun's agent store outlives a failed attempt (--max-restarts): each attempt keeps
        # its keys apart, as torch's own env:// rendezvous does.
        prefix = f"llama_brrr/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.store = PrefixStore(f"{prefix}/tp", base)
        # Idle ranks wait in a broadcast for the next call for as long as the caller is idle (a
        # server between requests): gloo's own timeout is set out of the way, and liveness comes
        # from the heartbeats instead.
        dist.init_process_group("gloo", store=PrefixStore(f"{prefix}/gloo", base), rank=rank,
                                world_size=size, timeout=timedelta(days=365))
        self.dist = dist
        # One store client per thread that uses it: this one's callers, the heartbeat thread, and
        # (on rank 0) the caller's thread polling while the helper thread runs a call.
        def client():
            return PrefixStore(f"{prefix}/tp", TCPStore(
                rendezvous.host, rendezvous.port, world_size=size, is_master=False,
                timeout=timedelta(seconds=rendezvous.timeout_s), wait_for_workers=False))

        self._beat_store = client()
        self.poll_store = client() if rank == 0 else None
        self._seen: dict[int, tuple[int, float]] = {}
        self.broken: str | None = None
        self.seq = 0
        self.generation = 0
        self._stopping = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="llama_brrr-tp-heartbeat",
                                        daemon=True)
        self._beater.start()

    def _beat(self) -> None:
        """Counts up this rank's heartbeat; a worker rank also exits when the caller (rank 0)
        stops beating or the group is aborted; not once the job is ending in order (stop_beating:
        rank 0 and its store may then go at any moment)."""
        while not self._stopping.is_set():
            try:
                self._beat_store.add(heartbeat_key(self.rank), 1)
                if self.rank != 0 and not self._stopping.is_set():
                    if self._beat_store.check([ABORT_KEY]):
                        os._exit(75)
                    if self.stale([0], self._beat_store):
                        os._exit(76)
            except Exception:  # noqa: BLE001 - the store is gone: so is rank 0, which serves or reaches it
                if self.rank != 0 and not self._stopping.is_set():
                    os._exit(77)
                return
            self._stopping.wait(HEARTBEAT_S)

    def stale(self, ranks, store) -> list[int]:
        """The ranks whose heartbeat has not moved for heartbeat_timeout_s."""
        now = time.monotonic()
        out = []
        for rank in ranks:
            count = store.add(heartbeat_key(rank), 0)
            last = self._seen.get(rank)
            if last is None or last[0] != count:
                self._seen[rank] = (count, now)
            elif now - last[1] > self.heartbeat_timeout_s:
                out.append(rank)
        return out

    def broadcast(self, message=None):
        """Rank 0 sends `message`, the others receive it."""
        box = [message]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, reply) -> list | None:
        out = [None] * self.size if self.rank == 0 else None
        self.dist.gather_object(reply, out, dst=0)
        return out

    def abort(self, why: str) -> None:
        """Tells every rank to exit (their heartbeat threads watch this key)."""
        with contextlib.suppress(Exception):
            (self.poll_store or self.store).set(ABORT_KEY, why)

    def stop_beating(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        """Stops the heartbeat and leaves the process group (the orderly end of the job)."""
        self._stopping.set()
        self._beater.join(2 * HEARTBEAT_S)
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()


_current: DistGroup | None = None


def current_group() -> DistGroup | None:
    """The torchrun group when this process is rank 0 of one (run.py), else None."""
    return _current


def set_current_group(group: DistGroup | None) -> None:
    global _current
    _current = group


class DistTransport:
    """The ranks of a torchrun job, seen from rank 0 (this process). Each call runs on a helper
    thread: the broadcast, this rank's own part (worker.RankServer.handle), the gather. Meanwhile
    poll() watches that thread, the store's early error reports and the heartbeats, so a rank
    stuck in a collective or gone cannot hold the caller past the fault rules."""

    def __init__(self, group: DistGroup, size: int):
        if size != group.size:
            raise ValueError(f"tensor_parallel={size} under torchrun needs as many processes, but "
                             f"the job has WORLD_SIZE={group.size}; pass --tensor-parallel "
                             f"{group.size} (or start torchrun with {size} processes)")
        self.size = size
        self.group = group
        self._server = worker.RankServer(0, size, group)
        self._jobs: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._own: tuple | None = None
        self._pids: list = []
        self._seq = None
        self._thread = threading.Thread(target=self._run, name="llama_brrr-tp-rank0", daemon=True)
        self._thread.start()

    @property
    def pids(self) -> list:
        return list(self._pids)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            seq, message = job
            try:
                self.group.broadcast(message)
                reply = self._server.handle(message)
                self._own = (seq, reply)
                replies = self.group.gather(reply)
                self._results.put((seq, "ok", replies))
            except Exception as exc:  # noqa: BLE001 - a broken group: poll() names the lost rank
                self._results.put((seq, "broken", exc))
                return

    def launch(self, spec: dict, rendezvous, library: str) -> None:
        self.group.generation += 1
        self.send([("start", spec, library if rendezvous is not None else None,
                    self.group.generation)] * self.size)

    def after_loaded(self) -> None:
        self.send([("join",)] * self.size)

    def send(self, messages: list) -> None:
        message = messages[0] if all(m is messages[0] for m in messages) else ("each", messages)
        self.group.seq += 1
        self._seq = self.group.seq
        self._jobs.put((self._seq, message))

    def poll(self, pending: list[int], wait_s: float) -> dict[int, tuple]:
        deadline = time.monotonic() + wait_s
        try:
            while True:
                # a call given up early (every rank refused it) may still finish its gather
                seq, kind, value = self._results.get(timeout=max(0.0, deadline - time.monotonic()))
                if seq == self._seq or kind == "broken":
                    break
        except queue.Empty:
            got = {}
            own = self._own
            if 0 in pending and own is not None and own[0] == self._seq:
                got[0] = own[1]
            for rank in pending:
                if rank and self.group.poll_store.check([error_key(self._seq, rank)]):
                    got[rank] = pickle.loads(self.group.poll_store.get(error_key(self._seq, rank)))
            lost = self.group.stale([r for r in pending if r not in got and r != 0],
                                   self.group.poll_store)
            if lost:
                raise RankLost(lost[0], f"sent no heartbeat for {self.group.heartbeat_timeout_s:g} "
                                        f"s (it died, or its host is unreachable)")
            return got
        if kind == "broken":
            # gloo fails at once when a peer's connection closes: the rank whose heartbeat stops
            # is the one that went.
            others = [r for r in range(1, self.size)]
            counts = {r: self.group.poll_store.add(heartbeat_key(r), 0) for r in others}
            time.sleep(3 * HEARTBEAT_S + 1)
            still = [r for r in others if self.group.poll_store.add(heartbeat_key(r), 0) == counts[r]]
            how = f"broke the job's connections ({type(value).__name__}: {value})"
            raise RankLost(still[0] if still else None, how)
        replies = value
        if replies and replies[0] and replies[0][0] == "loaded":
            self._pids = [r[3] if r[0] == "loaded" else None for r in replies]
        return {rank: replies[rank] for rank in pending}

    def stop(self) -> None:
        """Every rank drops its engine and waits for the next one (or run.py's exit)."""
        if self.group.broken is not None:
            return
        self.send([("stop",)] * self.size)
        deadline = time.monotonic() + STOP_WAIT_S
        pending = list(range(self.size))
        while pending and time.monotonic() < deadline:
            try:
                got = self.poll(pending, 0.2)
            except RankLost:
                return
            pending = [r for r in pending if r not in got]
        self._jobs.put(None)

    def kill(self, why: str) -> None:
        """After a fault the ranks may be inside a collective: they are told to exit (through the
        store), and this process must not issue another gloo call on the group."""
        self.group.abort(why)
        self.group.broken = why
