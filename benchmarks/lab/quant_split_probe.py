"""quant_split_probe.py — LAB: batch-1 decode time per step of random quantized models under the
variants of benchmarks/lab/variants/gemv_quant_split_by_shape.patch (for the tree of a259b8f): which
one-row quantized matmuls take the standalone quantizer and the ActBlock grid instead of quantizing
their input in every CTA of a one-wave walking grid. The patch reads LAB_SPLIT="min_n:min_k" at every
call (a matrix splits when N >= min_n or K >= min_k) and drops the decode graphs when it changes, so
one model per (quant, shape) serves every variant, rounds interleaved; median of 5 timings of 64
steps a round. One JSON line per (quant, shape, variant); the results are
benchmarks/lab/results/gemv_quant/split_ab_h100.jsonl and the table in docs/kernels/gemv.md.

  git apply benchmarks/lab/variants/gemv_quant_split_by_shape.patch && python3 setup.py build_ext --inplace
  PYTHONPATH=. python3 benchmarks/lab/quant_split_probe.py q4_k_m,q8_0 [llama3.2-1b,llama3-8b] [base,lm,wide]
"""
import dataclasses
import json
import os
import sys
import time

import numpy as np
import torch

from llama_brrr import Llama
from llama_brrr.config import SHAPES

NEVER = 1 << 30
VARIANTS = [("base", ""), ("lm", f"65536:{NEVER}"), ("wide", f"16384:{NEVER}"), ("longk", f"{NEVER}:8192"),
            ("wide_longk", "16384:8192"), ("all", f"1:{NEVER}")]
SHAPE_LAYERS = {"llama3.2-1b": 0, "llama3-8b": 8}  # the 8B cut to 8 of its 32 layers
ROUNDS, STEPS = 3, 64


def probe(quant, shape, variants):
    cfg = SHAPES[shape]
    if SHAPE_LAYERS[shape]:
        cfg = dataclasses.replace(cfg, n_layers=SHAPE_LAYERS[shape], name=f"{shape}-{SHAPE_LAYERS[shape]}l")
    llm = Llama.random(cfg, device="cuda", max_seq_len=1024, max_batch=1, quant=quant)
    eng = llm.engine
    rng = np.random.default_rng(0)
    eng.prefill(0, rng.integers(300, 30000, size=128).astype(np.int32), 0, "none")
    tokens, slots = np.array([1234], np.int32), np.zeros(1, np.int32)

    def run():
        for i in range(STEPS):
            eng.decode(tokens, slots, np.full(1, 128 + i, np.int32), logits=False)
        torch.cuda.synchronize()

    result = {name: [] for name, _ in variants}
    for _ in range(ROUNDS):
        for name, split in variants:
            os.environ["LAB_SPLIT"] = split
            run()  # the first call after a change captures the new graph
            times = []
            for _ in range(5):
                t = time.perf_counter()
                run()
                times.append((time.perf_counter() - t) / STEPS * 1e6)
            result[name].append(sorted(times)[2])
    for name, split in variants:
        print(json.dumps({"shape": cfg.name, "quant": quant, "variant": name, "split": split,
                          "us": [round(x, 1) for x in result[name]], "gpu": torch.cuda.get_device_name()}), flush=True)
    llm.close()


def main():
    quants = sys.argv[1].split(",")
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SHAPE_LAYERS)
    variants = [v for v in VARIANTS if len(sys.argv) <= 3 or v[0] in sys.argv[3].split(",")]
    for quant in quants:
        for shape in shapes:
            probe(quant, shape, variants)


if __name__ == "__main__":
    main()
