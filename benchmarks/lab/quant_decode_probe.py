"""quant_decode_probe.py — batch-B decode time per step of a random quantized model, for A/B runs
of a kernel change (gemv_quant_ab.sh runs it once per variant tree).

The shape may be cut to fewer layers (--layers): the matrices keep their shapes, so every kernel
takes its full-model time, and the random model is made 4x faster (8 of the 8B shape's 32 layers).
B sequences of 128-token prompts, then engine.decode without logits (CUDA graphs, PDL as set by
LLAMA_BRRR_PDL), n steps per timing, the median of 5 timings with min / max. One JSON line.

--kernels adds, per batch, the device time a step of each kernel (by name, summed over its
launches; torch.profiler's kernel records, graphs included) over n more steps, under
"bB_kernels_us", largest first: where a step's time went, for A/B runs that move it. Under PDL a
kernel's record starts at its early launch and so includes its wait for the one before (the sums
then exceed the step); LLAMA_BRRR_PDL=0 gives durations that add up.

  PYTHONPATH=. python3 benchmarks/lab/quant_decode_probe.py --shape llama3-8b --layers 8 --quant q4_k_m --batches 1,2
"""
import argparse
import dataclasses
import json
import time

import numpy as np
import torch

from llama_brrr import Llama
from llama_brrr.config import SHAPES


def kernel_times(run, steps):
    """Device us a step per kernel name (summed over its launches) over one run() of steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    totals = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")):
            name = e.name.replace("(anonymous namespace)::", "").split("<")[0].split("(")[0][:60]
            totals[name] = totals.get(name, 0.0) + e.time_range.elapsed_us()
    return {k: round(v / steps, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--layers", type=int, default=0, help="layers kept (0: all)")
    ap.add_argument("--quant", default="q4_k_m")
    ap.add_argument("--label", default="")
    ap.add_argument("-n", type=int, default=64, help="decode steps per timing")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--kernels", action="store_true", help="also each kernel's device us a step")
    a = ap.parse_args()
    cfg = SHAPES[a.shape]
    if a.layers:
        cfg = dataclasses.replace(cfg, n_layers=a.layers, name=f"{a.shape}-{a.layers}l")
    t0 = time.time()
    batches = [int(b) for b in a.batches.split(",")]
    llm = Llama.random(cfg, device="cuda", max_seq_len=1024, max_batch=max(batches), quant=a.quant)
    out = {"label": a.label, "shape": cfg.name, "quant": a.quant, "make_s": round(time.time() - t0, 1),
           "gpu": torch.cuda.get_device_name()}
    eng = llm.engine
    rng = np.random.default_rng(0)
    for slot in range(max(batches)):
        eng.prefill(slot, rng.integers(300, 30000, size=128).astype(np.int32), 0, "none")
    for B in batches:
        tokens = rng.integers(300, 30000, size=B).astype(np.int32)
        slots = np.arange(B, dtype=np.int32)

        def run():
            for i in range(a.n):
                eng.decode(tokens, slots, np.full(B, 128 + i, np.int32), logits=False)
            torch.cuda.synchronize()

        run()  # warm-up: captures this batch's graph
        times = []
        for _ in range(5):
            t = time.perf_counter()
            run()
            times.append((time.perf_counter() - t) / a.n * 1e6)
        times.sort()
        out[f"b{B}_us"] = round(times[2], 1)
        out[f"b{B}_spread"] = [round(times[0], 1), round(times[-1], 1)]
        if a.kernels:
            out[f"b{B}_kernels_us"] = kernel_times(run, a.n)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
