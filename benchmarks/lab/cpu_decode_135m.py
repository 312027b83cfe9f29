#!/usr/bin/env python3
"""Lab timer: batch-1 greedy decode of a SmolLM2-135M-shaped CpuEngine with random weights.

Reports tok/s and the weight-streaming rate it implies (weight bytes per token x tok/s), next to
a plain read-bandwidth probe of the same size (numpy sum over an array as large as the weights),
so a result can be judged against what the memory system gives on this box right now.
The correctness of the engine is the tests' job (tests/test_cpu_engine.py); this only times it.

    python benchmarks/lab/cpu_decode_135m.py [--tokens 128] [--threads 0] [--dtypes f32,bf16]
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from llama_brrr import _C  # noqa: E402
from llama_brrr.config import shape_config  # noqa: E402
from llama_brrr.sampling import uniform_rows  # noqa: E402


def decode_rate(engine, n_tokens, prompt_len=16):
    vocab = engine.config["vocab_size"]
    prompt = (np.arange(prompt_len) * 7919 % vocab).astype(np.int32)
    engine.prefill(0, prompt, 0, "none")
    slot = np.array([0], np.int32)
    greedy = (uniform_rows(1), np.zeros(1, np.uint64))
    token = np.array([1], np.int32)
    start = time.perf_counter()
    for pos in range(prompt_len, prompt_len + n_tokens):
        position = np.array([pos], np.int32)
        engine.decode(token, slot, position, False)
        token, _ = engine.sample(slot, position, *greedy)
    return n_tokens / (time.perf_counter() - start)


def read_bandwidth(n_bytes, repeats=5):
    data = np.ones(n_bytes // 4, np.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return n_bytes / min(times) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="f32,bf16")
    args = parser.parse_args()

    config = shape_config("smollm2-135m")
    print(f"simd: {_C.cpu_simd()}   load average: {os.getloadavg()}")
    for dtype in args.dtypes.split(","):
        engine = _C.Engine("cpu", config.engine_dict(1024, 1), dtype, 0, args.threads)
        engine.init_random(0, 0.02)
        weight_bytes = config.n_params() * (4 if dtype == "f32" else 2)
        decode_rate(engine, 8)  # warm-up: page in the weights and the cache
        rates = [decode_rate(engine, args.tokens) for _ in range(args.repeats)]
        best, median = max(rates), statistics.median(rates)
        print(f"{dtype:5s} decode: median {median:6.1f} tok/s (best {best:6.1f}, all "
              f"{', '.join(f'{r:.1f}' for r in rates)})  ->  {weight_bytes * median / 1e9:5.1f} GB/s "
              f"of weights   |  numpy read probe: {read_bandwidth(weight_bytes):5.1f} GB/s")


if __name__ == "__main__":
    main()
