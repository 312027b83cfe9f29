"""The tensor-parallel process plumbing on the CPU (llama_brrr/tp/engine.py, worker.py): ranks are
CPU engines, of size 1 (a whole model, so results can be checked against an in-process engine) or
several without a communicator (collectives=False: each computes partial sums, which is enough to
exercise the pipes, the fault handling and the clean-up). The NCCL side runs in test_tp_cuda.py."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from llama_brrr import Llama
from llama_brrr.config import ModelConfig
from llama_brrr.errors import ModelFileError
from llama_brrr.model import RandomModelTokenizer
from llama_brrr.tp import TensorParallelError, from_arrays
from llama_brrr.tp.worker import Rendezvous

CONFIG = ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                     vocab_size=300, name="tp-cpu")
FAULT_S = 10.0  # a fault must surface within this many seconds


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pids, seconds=10.0) -> list[int]:
    """The pids still alive after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


@pytest.fixture
def weights(rng, make_weights):
    return make_weights(CONFIG, rng)


def local_llama(C, weights):
    engine = C.Engine("cpu", CONFIG.engine_dict(32, 2), "f32", 0, 1, {})
    for name, array in weights.items():
        engine.set_weight(name, array, "f32")
    return Llama(engine, CONFIG, RandomModelTokenizer(CONFIG.vocab_size), device="cpu",
                 dtype="f32", max_seq_len=32, max_batch=2)


def test_one_rank_answers_like_the_engine_in_this_process(C, rng, weights):
    ours = local_llama(C, weights)
    with from_arrays(CONFIG, weights, 1, device="cpu", max_seq_len=32, max_batch=2) as tp:
        assert tp.tensor_parallel == 1 and tp.engine.alive
        assert tp.engine.config["kv_blocks"] == ours.engine.config["kv_blocks"]
        tokens = rng.integers(0, CONFIG.vocab_size, 11).tolist()
        logits = tp.forward(tokens)
        np.testing.assert_array_equal(logits, ours.forward(tokens))
        # generation through the scheduler and block manager: every engine call they make
        a = tp.generate([tokens, tokens[:4]], max_tokens=9, temperature=0.8, seed=5)
        b = ours.generate([tokens, tokens[:4]], max_tokens=9, temperature=0.8, seed=5)
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        # pipelined (CUDA's default): the ranks' decode_launch / decode_wait, rows continued by them
        tp._scheduler = tp.make_scheduler(pipeline=True)
        c = tp.generate([tokens, tokens[:4]], max_tokens=9, temperature=0.8, seed=5)
        assert [o.token_ids for o in c] == [o.token_ids for o in b]
        assert tp.engine.decode_pending == 0
        assert "".join(tp.stream("hi", max_tokens=4, temperature=0)) == \
               "".join(ours.stream("hi", max_tokens=4, temperature=0))
        for name in ("layers.1.wk", "tok_embeddings", "norm"):
            np.testing.assert_array_equal(tp.engine.get_weight(name), weights[name])
        group = tp.engine
    assert not group.alive  # leaving the `with` block closed the Llama and its ranks
    assert wait_gone(group.pids) == []
    with pytest.raises(RuntimeError, match="closed"):
        tp.generate([1, 2], max_tokens=2)


def test_the_ranks_get_the_kv_cache_dtype(C, rng, weights):
    engine = C.Engine("cpu", CONFIG.engine_dict(32, 2, kv_cache_dtype="fp8_e4m3"), "f32", 0, 1, {})
    for name, array in weights.items():
        engine.set_weight(name, array, "f32")
    tokens = rng.integers(0, CONFIG.vocab_size, 11).astype(np.int32)
    with from_arrays(CONFIG, weights, 1, device="cpu", max_seq_len=32, max_batch=2,
                     kv_cache_dtype="fp8") as tp:
        assert tp.engine.config["kv_cache_dtype"] == "fp8_e4m3"
        np.testing.assert_array_equal(tp.forward(tokens.tolist()), engine.prefill(0, tokens, 0, "all"))


def test_a_rank_exception_is_raised_with_its_type_and_rank_and_the_group_goes_on(weights):
    tp = from_arrays(CONFIG, weights, 2, device="cpu", max_seq_len=32, max_batch=2,
                     collectives=False)
    try:
        engine = tp.engine
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=r"tensor-parallel rank 0: .*max_seq_len") as info:
            engine.prefill(0, np.arange(5, dtype=np.int32), 30, "all")
        assert time.monotonic() - t0 < FAULT_S
        assert "Traceback" in str(info.value.__cause__)  # the rank's own traceback
        assert engine.alive  # every rank refused alike: nothing diverged
        assert engine.prefill(0, np.arange(5, dtype=np.int32), 0, "last").shape == (1, CONFIG.vocab_size)
        # the merged weights are the full model's, from the two ranks' shards
        for name, array in weights.items():
            np.testing.assert_array_equal(engine.get_weight(name), array, err_msg=name)
        engine.profile_enabled = True
        assert engine.profile_enabled
        engine.prefill(0, np.arange(3, dtype=np.int32), 0, "none")
        assert engine.profile_records()
        engine.profile_enabled = False
    finally:
        tp.close()


def test_one_rank_failing_alone_stops_every_rank(weights):
    tp = from_arrays(CONFIG, weights, 2, device="cpu", max_seq_len=32, max_batch=2,
                     collectives=False)
    engine, pids = tp.engine, tp.engine.pids
    good = ("call", "prefill", (0, np.arange(4, dtype=np.int32), 0, "none"), {})
    bad = ("call", "prefill", (0, np.arange(4, dtype=np.int32), 31, "none"), {})
    with pytest.raises(ValueError, match="rank 1: .*every rank was stopped"):
        engine._broadcast([good, bad])
    assert not engine.alive
    assert wait_gone(pids) == []
    with pytest.raises(TensorParallelError, match="stopped"):
        engine.decode(np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32))


def test_a_rank_stuck_while_another_failed_is_stopped_after_the_grace(weights):
    """Rank 0 is stopped (SIGSTOP: stuck for certain, whatever the machine's speed) while rank 1
    fails: the caller hears of rank 1 once the grace for rank 0 has passed, and both are gone."""
    tp = from_arrays(CONFIG, weights, 2, device="cpu", max_seq_len=32, max_batch=1, collectives=False)
    engine, pids = tp.engine, tp.engine.pids
    engine.fault_grace_s = 0.5
    stuck = ("call", "prefill", (0, np.arange(4, dtype=np.int32), 0, "none"), {})
    bad = ("call", "prefill", (0, np.arange(4, dtype=np.int32), 31, "none"), {})
    os.kill(pids[0], signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"rank 1: .*\[0\] did not answer within 0.5 s"):
        engine._broadcast([stuck, bad])
    assert time.monotonic() - t0 < FAULT_S
    assert wait_gone(pids) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_rank_is_an_error_within_seconds_and_leaves_no_process(weights, sig):
    tp = from_arrays(CONFIG, weights, 2, device="cpu", max_seq_len=32, max_batch=2,
                     collectives=False)
    pids = tp.engine.pids
    os.kill(pids[1], sig)
    t0 = time.monotonic()
    with pytest.raises(TensorParallelError, match=rf"rank 1 \(pid {pids[1]}\) was killed by signal {int(sig)}"):
        tp.generate([1, 2, 3], max_tokens=4)
    assert time.monotonic() - t0 < FAULT_S
    assert wait_gone(pids) == []
    with pytest.raises(RuntimeError, match="stopped"):
        tp.forward([1])
    tp.close()  # closing a stopped group is a no-op


def test_a_load_failure_names_the_rank_and_stops_every_rank(weights):
    bad = dict(weights)
    bad["layers.1.w2"] = weights["layers.1.w2"].copy()
    bad["layers.1.w2"][0, -1] = np.nan  # the last column: rank 1's shard only
    t0 = time.monotonic()
    with pytest.raises(ModelFileError, match=r"tensor-parallel rank 1: .*NaN") as info:
        from_arrays(CONFIG, bad, 2, device="cpu", max_seq_len=32, collectives=False)
    assert time.monotonic() - t0 < FAULT_S + 10
    assert isinstance(info.value, ValueError)


def test_garbage_collection_and_exit_stop_the_ranks(weights):
    import gc

    tp = from_arrays(CONFIG, weights, 2, device="cpu", max_seq_len=32, collectives=False)
    pids = tp.engine.pids
    del tp
    gc.collect()
    assert wait_gone(pids) == []


def run_child(script: str, timeout=120) -> subprocess.CompletedProcess:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=timeout, env=env)


CHILD_PROLOGUE = """
    import os, sys
    import numpy as np
    from llama_brrr.config import ModelConfig
    from llama_brrr.tp import from_arrays
    config = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                         vocab_size=300)
    rng = np.random.default_rng(0)
    arrays = {n: (0.1 * rng.standard_normal(s)).astype(np.float32) for n, s in config.tensor_shapes().items()}
    tp = from_arrays(config, arrays, 2, device="cpu", max_seq_len=32, collectives=False)
    print(" ".join(map(str, tp.engine.pids)), flush=True)
"""


def test_ranks_exit_with_a_caller_that_is_killed():
    result = run_child(CHILD_PROLOGUE + "    os.kill(os.getpid(), 9)\n")
    assert result.returncode == -9, result.stderr
    pids = [int(p) for p in result.stdout.split()]
    assert len(pids) == 2
    assert wait_gone(pids) == [], "ranks outlived their killed caller"


def test_ranks_stop_at_interpreter_exit_and_scripts_need_no_main_guard():
    """The child script builds its ranks at top level, with no __main__ guard: spawn must not
    run it again in the ranks; a normal exit stops them (atexit)."""
    result = run_child(CHILD_PROLOGUE + "    print(tp.forward([1, 2, 3]).shape)\n")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    pids = [int(p) for p in lines[0].split()]
    assert lines[1] == "(3, 300)"
    assert wait_gone(pids) == []


def test_a_rank_that_cannot_reach_the_rendezvous_is_an_error_within_the_timeout(weights):
    pytest.importorskip("torch")
    from llama_brrr.tp import TensorParallelEngine
    from llama_brrr.tp.engine import free_port

    spec = dict(kind="arrays", config=CONFIG, backend="cpu", devices=[0, 0], dtype="f32",
                max_seq_len=32, max_batch=1, kv={}, n_threads=1, quant=None, arrays=weights)
    nobody = Rendezvous("127.0.0.1", free_port(), timeout_s=2.0, host_store=False)
    t0 = time.monotonic()
    # The ranks' own 2 s rendezvous timeout must fire before the group's join timeout: on a busy
    # 2-core machine starting a rank (interpreter, torch, the store's retries) has taken over 5 s.
    with pytest.raises(Exception, match="tensor-parallel rank 0") as info:
        TensorParallelEngine(spec, 2, rendezvous=nobody, nccl_library="", join_timeout_s=20.0)
    assert time.monotonic() - t0 < 30, info.value


def test_tensor_parallel_arguments_are_checked_before_any_process_starts():
    with pytest.raises(ValueError, match="tensor_parallel must be an integer"):
        Llama.random(CONFIG, device="cpu", tensor_parallel=0)
    with pytest.raises(ValueError, match="needs device='cuda'"):
        Llama.random(CONFIG, device="cpu", tensor_parallel=2)
    with pytest.raises(ValueError, match="tensor_parallel"):
        Llama.random(CONFIG, device="cpu", tensor_parallel="2")
