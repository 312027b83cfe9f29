"""Tensor parallelism under torchrun (llama_brrr/tp/run.py, transport.DistTransport) on the CPU:
two processes started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), CPU engines without a communicator (collectives=False: each rank computes its partial
sums), so what is tested is the transport: the calls, the replies, the faults and the exits. The
NCCL side runs in test_tp_cuda.py."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from llama_brrr.tp.transport import free_port

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT_S = 10.0  # a fault must surface on rank 0 within this many seconds
JOB_TIMEOUT_S = 180

PROLOGUE = """
import os, signal, sys, time
import numpy as np
import pytest
from llama_brrr import Llama, _C
from llama_brrr.config import ModelConfig
from llama_brrr.model import RandomModelTokenizer
from llama_brrr.tp import TensorParallelError, from_arrays, shard
from llama_brrr.tp import run as tprun

CONFIG = ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                     vocab_size=300, name="tp-torchrun")
rng = np.random.default_rng(int(os.environ["TEST_SEED"]))
ARRAYS = {n: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
          for n, s in CONFIG.tensor_shapes().items()}
FAULT_S = %r


def rank0_alone():
    # What rank 0 computes without a communicator: an engine of its local config holding its
    # shards, built here in one process.
    local = shard.local_config(CONFIG, 0, 2)
    engine = _C.Engine("cpu", local.engine_dict(32, 2), "f32", 0, 1, {})
    for name, array in ARRAYS.items():
        engine.set_weight(name, np.ascontiguousarray(shard.shard_array(array, CONFIG, name, 0, 2)),
                          "f32")
    return Llama(engine, local, RandomModelTokenizer(CONFIG.vocab_size), device="cpu",
                 dtype="f32", max_seq_len=32, max_batch=2)


def start():
    return from_arrays(CONFIG, ARRAYS, 2, device="cpu", max_seq_len=32, max_batch=2,
                       collectives=False)
""" % FAULT_S


def run_job(job: str, world: int = 2, seed: int = 0, heartbeat_s: float = 60.0):
    """Starts `world` processes of PROLOGUE + job + `tprun.run(job)` with torchrun's environment
    on a free port; returns their CompletedProcess-like (returncode, stdout, stderr) in rank order.
    Every process is killed if the job outlives JOB_TIMEOUT_S."""
    script = (PROLOGUE + textwrap.dedent(job)
              + "\ngroup = tprun.group_from_env(heartbeat_timeout_s=float(os.environ['TEST_HEARTBEAT_S']))"
              + "\nis_rank0, result = tprun.run(job, group=group)"
              + "\nsys.exit(0 if is_rank0 else result)\n")
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TEST_SEED=str(seed), TEST_HEARTBEAT_S=str(heartbeat_s),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
    results = []
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_a_generate_round_trip_over_torchrun_ranks(rng):
    seed = int(rng.integers(1 << 31))
    job = """
    def job():
        with start() as tp:
            engine = tp.engine
            assert tp.tensor_parallel == 2 and engine.alive
            ours = rank0_alone()
            tokens = rng.integers(0, CONFIG.vocab_size, 11).tolist()
            np.testing.assert_array_equal(tp.forward(tokens), ours.forward(tokens))
            # every engine call the scheduler and the block manager make
            # past EOS too: a sampled end token would cut the length check below short
            a = tp.generate([tokens, tokens[:4]], max_tokens=9, temperature=0.8, seed=5, ignore_eos=True)
            b = ours.generate([tokens, tokens[:4]], max_tokens=9, temperature=0.8, seed=5, ignore_eos=True)
            assert [o.token_ids for o in a] == [o.token_ids for o in b]
            assert all(len(o.token_ids) == 9 for o in a)
            # rank 1 holds and returns its own shards: the gathered tensors are the full ones
            for name, array in ARRAYS.items():
                np.testing.assert_array_equal(engine.get_weight(name), array, err_msg=name)
            # set_weight sends each rank its shard
            new = rng.standard_normal(ARRAYS["layers.1.w2"].shape).astype(np.float32)
            engine.set_weight("layers.1.w2", new, "f32")
            np.testing.assert_array_equal(engine.get_weight("layers.1.w2"), new)
            print("PIDS", " ".join(engine.pids), flush=True)
        assert not engine.alive
        print("OK", flush=True)
    """
    (rc0, out0, err0), (rc1, out1, err1) = run_job(job, seed=seed)
    assert rc0 == 0, err0
    assert rc1 == 0, err1
    assert out0.splitlines()[-1:] == ["OK"], (out0, err0)
    pids = out0.split("PIDS ")[1].split("\n")[0].split()
    assert len(pids) == 2 and len(set(pids)) == 2  # two processes, rank 0 being this one


def test_an_error_on_rank_1_is_raised_on_rank_0_with_the_rank_named():
    job = """
    def job():
        tp = start()
        engine = tp.engine
        # refused alike by every rank: raised, and the group goes on
        with pytest.raises(ValueError, match=r"tensor-parallel rank 0: .*max_seq_len") as info:
            engine.prefill(0, np.arange(5, dtype=np.int32), 30, "all")
        assert "Traceback" in str(info.value.__cause__)
        assert engine.alive
        assert engine.prefill(0, np.arange(5, dtype=np.int32), 0, "last").shape == (1, 300)
        # refused by rank 1 only: raised on rank 0 with rank 1 named, and the job is stopped
        good = ("call", "prefill", (0, np.arange(4, dtype=np.int32), 0, "none"), {})
        bad = ("call", "prefill", (0, np.arange(4, dtype=np.int32), 31, "none"), {})
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=r"tensor-parallel rank 1: .*every rank was stopped") as info:
            engine._broadcast([good, bad])
        assert time.monotonic() - t0 < FAULT_S
        assert "Traceback" in str(info.value.__cause__)
        assert not engine.alive
        with pytest.raises(TensorParallelError, match="stopped"):
            engine.decode(np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32))
        with pytest.raises(RuntimeError, match="stopped"):
            tp.forward([1, 2])
        print("OK", flush=True)
    """
    t0 = time.monotonic()
    (rc0, out0, err0), (rc1, out1, err1) = run_job(job)
    assert out0.splitlines()[-1:] == ["OK"], (out0, err0)
    # a group stopped by a fault ends the job: rank 0 exits with an error, rank 1 on its own
    assert rc0 == 1, err0
    assert rc1 != 0, err1
    assert time.monotonic() - t0 < JOB_TIMEOUT_S


def test_a_killed_rank_is_an_error_on_rank_0_within_seconds():
    job = """
    def job():
        tp = start()
        victim = int(tp.engine.pids[1].rsplit(":", 1)[1])
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(TensorParallelError, match=r"tensor-parallel rank 1 .*every rank was stopped"):
            tp.generate([1, 2, 3], max_tokens=4)
        assert time.monotonic() - t0 < FAULT_S, time.monotonic() - t0
        with pytest.raises(RuntimeError, match="stopped"):
            tp.forward([1])
        print("OK", flush=True)
    """
    (rc0, out0, err0), (rc1, _, _) = run_job(job)
    assert out0.splitlines()[-1:] == ["OK"], (out0, err0)
    assert rc0 == 1 and rc1 == -9


def test_a_stuck_rank_is_an_error_on_rank_0_after_the_heartbeat_timeout():
    """Rank 1 is stopped (SIGSTOP): alive, connected, silent. Rank 0 names it once its heartbeat
    has stood still for the timeout, then lets it go on, and it exits on the group's abort."""
    job = """
    def job():
        tp = start()
        victim = int(tp.engine.pids[1].rsplit(":", 1)[1])
        os.kill(victim, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            with pytest.raises(TensorParallelError, match=r"rank 1 sent no heartbeat for 3 s"):
                tp.forward([1, 2, 3])
        finally:
            os.kill(victim, signal.SIGCONT)
        assert 3 <= time.monotonic() - t0 < 3 + FAULT_S, time.monotonic() - t0
        print("OK", flush=True)
    """
    (rc0, out0, err0), (rc1, _, err1) = run_job(job, heartbeat_s=3.0)
    assert out0.splitlines()[-1:] == ["OK"], (out0, err0)
    assert rc0 == 1 and rc1 != 0, err1


def test_under_torchrun_itself_with_its_agent_store(tmp_path):
    """The same job started by torchrun (python -m torch.distributed.run): its agent serves the
    store (TORCHELASTIC_USE_AGENT_STORE) and sets the environment."""
    pytest.importorskip("torch.distributed.run")
    job = """
    def job():
        assert os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        with start() as tp:
            ours = rank0_alone()
            a = tp.generate([[5, 6, 7], [8]], max_tokens=6, temperature=0.8, seed=3)
            b = ours.generate([[5, 6, 7], [8]], max_tokens=6, temperature=0.8, seed=3)
            assert [o.token_ids for o in a] == [o.token_ids for o in b]
            for name, array in ARRAYS.items():
                np.testing.assert_array_equal(tp.engine.get_weight(name), array, err_msg=name)
        print("OK", flush=True)
    """
    script = tmp_path / "job.py"
    script.write_text(PROLOGUE + textwrap.dedent(job)
                      + "\nis_rank0, result = tprun.run(job)\nsys.exit(0 if is_rank0 else result)\n")
    env = dict(os.environ, TEST_SEED="7", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", str(free_port()), str(script)],
                            capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout.splitlines(), (result.stdout, result.stderr[-3000:])


def test_run_outside_torchrun_names_the_missing_variables():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-m", "llama_brrr.tp.run", "--", "generate", "x"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "RANK" in result.stderr and "torchrun" in result.stderr


def test_the_command_must_split_over_every_rank():
    """Without --tensor-parallel the command would run on rank 0's GPU alone: refused."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, "-m", "llama_brrr.tp.run", "--", "generate",
                                       "--model", "m.gguf", "hi"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=JOB_TIMEOUT_S) for p in procs]
    assert procs[0].returncode == 2 and "--tensor-parallel 2" in outs[0][1]
    assert procs[1].returncode == 0, outs[1][1]


class FakeStore:
    def __init__(self):
        self.data = {}

    def set(self, key, value):
        self.data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):
        return self.data[key]

    def check(self, keys):
        return all(k in self.data for k in keys)

    def add(self, key, n):
        value = int(self.data.get(key, b"0")) + n
        self.data[key] = str(value).encode()
        return value


class FakeGroup:
    """Rank 0's side of a two-rank group whose gathers finish only when the test says so."""

    def __init__(self):
        import queue

        self.rank, self.size, self.local_rank = 0, 2, 0
        self.seq = self.generation = 0
        self.heartbeat_timeout_s = 60.0
        self.broken = None
        self.store = self.poll_store = FakeStore()
        self.sent = []
        self.release = queue.Queue()

    def broadcast(self, message):
        self.sent.append(message)

    def gather(self, reply):
        return [reply, self.release.get(timeout=30)]

    def abort(self, why):
        self.broken = why

    def stale(self, ranks, store):
        return []


def test_dist_transport_reports_early_errors_and_drops_replies_of_abandoned_calls():
    """The paths the process tests cannot time: rank 1's error read from the store while the
    gather is still open (another rank inside a collective), rank 0's own reply before the gather,
    and a gather that completes after its call was given up: its replies never answer the next."""
    import pickle

    from llama_brrr.tp.transport import DistTransport, error_key

    group = FakeGroup()
    transport = DistTransport(group, 2)
    transport.send([("get", "anything")] * 2)
    error = ("error", ValueError("rank 1 refused"), "Traceback: ...")
    group.store.set(error_key(group.seq, 1), pickle.dumps(error))
    got = {}
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        got.update(transport.poll([r for r in (0, 1) if r not in got], 0.05))
    assert got[0][0] == "error" and "no tensor-parallel engine" in str(got[0][1])  # rank 0's own
    assert got[1][0] == "error" and str(got[1][1]) == "rank 1 refused"
    transport.send([("get", "again")] * 2)
    group.release.put(("ok", "stale"))      # the first call's gather ends now
    group.release.put(("ok", "fresh"))      # the second call's
    replies = {}
    deadline = time.monotonic() + 10
    while len(replies) < 2 and time.monotonic() < deadline:
        replies.update(transport.poll([r for r in (0, 1) if r not in replies], 0.5))
    assert replies[1] == ("ok", "fresh")
    assert group.sent == [("get", "anything"), ("get", "again")]
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        DistTransport(group, 4)
