"""dequant_bench.py — dequantize_bf16 alone (the prefill scratch path's first pass) on the
Llama-3-8B matrices, against a device copy of the bf16 result's size, same process.

Kernel times come from torch.profiler (the device time of each dequantize_kernel launch, median of
--reps), so the testing launcher's synchronization after every call is not counted; the copy's
from CUDA events around --reps back-to-back copies. "of copy" is
the bytes moved (qlayout read + bf16 written) per second over a same-size bf16 copy's (read +
write) per second. Weights: 256 quantized rows of random normals, repeated (the kernel's time does
not depend on the values).

  PYTHONPATH=. python3 benchmarks/lab/dequant_bench.py --json dequant.jsonl
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_quant_sweep import TYPE_IDS, part  # noqa: E402
from llama_brrr import _C as C  # noqa: E402

SHAPES = {  # name: (type, N, K)
    "wqkv_q4_k": ("q4_k", 6144, 4096),
    "wo_q4_k": ("q4_k", 4096, 4096),
    "w13_q4_k": ("q4_k", 28672, 4096),
    "w2_q4_k": ("q4_k", 4096, 14336),
    "w2_q6_k": ("q6_k", 4096, 14336),
    "w13_q8_0": ("q8_0", 28672, 4096),
}


def device_us(fn, reps, key):
    """Median device time (us) of the kernels whose name contains key, one per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time_total for e in prof.events()
             if key in e.name and e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0]
    assert len(times) >= reps, f"expected {reps} launches of {key}, saw {len(times)}"
    return float(np.median(times))


def copy_us(dst, src, reps):
    """Device time (us) of one dst.copy_(src), from CUDA events around reps back-to-back copies."""
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    out = open(a.json, "w") if a.json else None
    print(f"{'matrix':10s} {'N x K':>12s} {'deq us':>8s} {'copy us':>8s} {'of copy':>8s}")
    for name, (t, N, K) in SHAPES.items():
        W = part(t, N, K, rng)
        deq = torch.empty((N, K), dtype=torch.bfloat16, device="cuda")
        src = torch.randn((N, K), device="cuda").to(torch.bfloat16)
        d = device_us(lambda: C.testing.dequantize_bf16(TYPE_IDS[t], W.data_ptr(), deq.data_ptr(), N, K), a.reps,
                      "dequantize_kernel")
        c = copy_us(deq, src, a.reps)
        moved, copied = W.numel() * W.element_size() + deq.numel() * 2, 2 * deq.numel() * 2
        rec = {"matrix": name, "type": t, "N": N, "K": K, "dequant_us": round(d, 1), "copy_us": round(c, 1),
               "of_copy": round((moved / d) / (copied / c), 3), "gpu": torch.cuda.get_device_name()}
        print(f"{name:10s} {N:6d}x{K:<5d} {d:8.1f} {c:8.1f} {rec['of_copy']:8.0%}", flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
