"""Tensor parallelism over the processes of a torchrun job, on one host or several:

    torchrun --nnodes H --nproc-per-node G [--rdzv/--master options] \\
        -m llama_brrr.tp.run -- generate --model M.gguf --device cuda --tensor-parallel H*G "Hello"

Every process is one rank on cuda:LOCAL_RANK. Rank 0 runs the llama-brrr command (the arguments
after `--`); its Llama's TensorParallelEngine reaches the other ranks through a gloo process group
over the TCPStore at MASTER_ADDR:MASTER_PORT (transport.DistTransport). Ranks 1.. serve rank 0's
requests (worker.serve_torchrun) until rank 0's command ends. From Python, run(job) does the same
with a function in place of the command.
"""

from __future__ import annotations

import os
import sys
import traceback

from . import transport, worker

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def group_from_env(timeout_s: float = 300.0, heartbeat_timeout_s: float = 60.0) -> transport.DistGroup:
    """This process's DistGroup from torchrun's environment; ValueError naming what is missing."""
    missing = [key for key in _ENV if not os.environ.get(key)]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set: llama_brrr.tp.run must be started by "
                         f"torchrun (e.g. torchrun --nproc-per-node 2 -m llama_brrr.tp.run -- "
                         f"generate ...), which sets {', '.join(_ENV)}")
    try:
        rank, size, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    except ValueError as exc:
        raise ValueError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers ({exc})") from None
    if not 0 <= rank < size:
        raise ValueError(f"RANK={rank} is outside [0, WORLD_SIZE={size})")
    rendezvous = worker.Rendezvous.from_env(timeout_s)
    return transport.DistGroup(rank, size, local_rank, rendezvous, heartbeat_timeout_s)


def run(job, *, group: transport.DistGroup | None = None):
    """Runs job() on rank 0 with the job's ranks behind every tensor-parallel Llama it builds
    (tensor_parallel must equal WORLD_SIZE); ranks 1.. serve until job returns or raises. Returns
    (is rank 0, job's result or None). A fault that left rank 0's own rank inside a collective
    cannot be undone in this process, so run() then ends it (os._exit) once job is done."""
    group = group or group_from_env()
    if group.rank != 0:
        return False, worker.serve_torchrun(group)
    transport.set_current_group(group)
    try:
        return True, job()
    finally:
        transport.set_current_group(None)
        from . import engine

        engine._stop_all_at_exit()
        if group.broken is None:
            _end(group)
        else:
            failure = sys.exc_info()[1]
            if failure is not None:
                traceback.print_exception(failure)
            print(f"llama_brrr.tp.run: the tensor-parallel group was stopped ({group.broken}); "
                  f"ending the job", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)


def _end(group: transport.DistGroup) -> None:
    """Rank 0's orderly end of the job: every rank is told to exit and acknowledges."""
    group.broadcast(("exit",))
    group.gather(("bye",))
    group.close()


def _has_size_option(argv: list[str]) -> bool:
    return any(a in ("--tensor-parallel", "--tp") or a.startswith(("--tensor-parallel=", "--tp="))
               for a in argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    try:
        group = group_from_env()
    except ValueError as exc:
        print(f"llama_brrr.tp.run: {exc}", file=sys.stderr)
        return 2
    if group.rank == 0 and not _has_size_option(argv):
        print(f"llama_brrr.tp.run: the command needs --tensor-parallel {group.size} (the job's "
              f"WORLD_SIZE) so that its model is split over every rank", file=sys.stderr)
        _end(group)
        return 2
    from ..cli import main as cli_main

    _, code = run(lambda: cli_main(argv), group=group)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
