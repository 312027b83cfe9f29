"""The all-reduce calls of TensorParallelEngine (llama_brrr/tp/engine.py) on the CPU: what Python
checks before any rank is asked, and the engines' refusal on ranks that are not CUDA engines of a
group, after which the ranks still serve calls. The all-reduce itself runs in test_tp_cuda.py."""

import numpy as np
import pytest

from llama_brrr.config import ModelConfig
from llama_brrr.tp import from_arrays

CONFIG = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                     vocab_size=300, name="tp-all-reduce-cpu")


@pytest.fixture(scope="module")
def tp():
    # the weights play no part here: any finite values
    draw = np.random.default_rng(0)
    weights = {name: (0.1 * draw.standard_normal(shape)).astype(np.float32)
               for name, shape in CONFIG.tensor_shapes().items()}
    llm = from_arrays(CONFIG, weights, 2, device="cpu", max_seq_len=16, max_batch=1,
                      collectives=False)
    yield llm
    llm.close()


def test_one_array_per_rank_of_one_length(tp):
    with pytest.raises(ValueError, match="one array per rank: 2 ranks, got 3"):
        tp.engine.all_reduce([np.zeros(8, np.float32)] * 3)
    with pytest.raises(ValueError, match=r"one length on every rank, got shapes \[\(8,\), \(12,\)\]"):
        tp.engine.all_reduce([np.zeros(8, np.float32), np.zeros(12, np.float32)])
    with pytest.raises(ValueError, match="1-D"):
        tp.engine.all_reduce([np.zeros((2, 4), np.float32)] * 2)


@pytest.mark.parametrize("call", [
    lambda e: e.all_reduce_info(),
    lambda e: e.all_reduce([np.ones(8, np.float32)] * 2, "nccl"),
    lambda e: e.all_reduce_bench(16384, "oneshot", 2, 2),
])
def test_cpu_ranks_refuse_alike_and_keep_serving(tp, call):
    with pytest.raises(RuntimeError, match="cuda"):
        call(tp.engine)
    assert tp.engine.alive
    assert tp.engine.config["tensor_parallel"] == 2


def bench_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_all_reduce.py"
    spec = importlib.util.spec_from_file_location("bench_all_reduce", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_script_sizes():
    bench = bench_script()
    assert bench.parse_sizes("16KB, 1MB,48B") == {"16KB": 16384, "1MB": 1 << 20, "48B": 48}
    assert bench.parse_sizes(",".join(bench.SIZES)) == bench.SIZES
    for bad, why in (("1000B", "multiple of 16"), ("0KB", "multiple of 16"), ("16 kB", "<int>KB"),
                     ("2GB", "<int>KB"), ("", "no sizes")):
        with pytest.raises(ValueError, match=why):
            bench.parse_sizes(bad)
    summary = bench.summarize([3.0, 1.0, 2.0])
    assert (summary["median_us"], summary["min_us"], summary["max_us"]) == (2.0, 1.0, 3.0)
