"""decode_kernel_times.py — where a batched decode step's GPU time goes, kernel by kernel.

Random weights of each shape, B sequences of 128-token prompts, then N decode steps
(engine.decode without logits, CUDA graphs as the engine runs them) under torch.profiler, whose
CUPTI trace holds our kernels too. Per kernel name: launches and device time per step; beside them
the wall time per step, and (--sequence K) the first K launches of a step in order with their times,
which places each launch at its projection. Run with LLAMA_BRRR_PDL=0 so that no kernel's duration
includes waiting for the one before (PDL kernels start early and wait inside). --layers L keeps L
of the shape's layers (the matrices keep their shapes; the random model is made faster).
  LLAMA_BRRR_PDL=0 PYTHONPATH=. python3 benchmarks/lab/decode_kernel_times.py --shapes llama3.2-1b -b 1 16
  LLAMA_BRRR_PDL=0 PYTHONPATH=. python3 benchmarks/lab/decode_kernel_times.py --shapes llama3-8b -b 1 16 --quant q4_k_m
  LLAMA_BRRR_PDL=0 PYTHONPATH=. python3 benchmarks/lab/decode_kernel_times.py --shapes llama3-8b --layers 8 -b 1 \
      --quant q4_k_m --sequence 24
"""
import argparse
import collections
import dataclasses
import json
import time

import numpy as np
import torch

from llama_brrr import Llama
from llama_brrr.config import SHAPES


def kernel_name(signature: str) -> str:
    """'void brrr::cuda::(anonymous namespace)::gemv_kernel<1, ...>(...)' -> 'gemv_kernel<1, ...>'
    (template arguments kept: they tell the GEMV's row count and form apart)."""
    s = signature.replace("(anonymous namespace)::", "").removeprefix("void ").strip()
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # the parameter list starts at the first '(' outside <...>
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    s = s[:cut]
    head = s.split("<")[0]
    return s[len(head) - len(head.split("::")[-1]):].replace("brrr::cuda::", "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["llama3.2-1b", "llama3-8b"])
    ap.add_argument("-b", "--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--quant", default=None, help="as Llama.random(quant=...), e.g. q4_k_m")
    ap.add_argument("--layers", type=int, default=0, help="layers kept (0: all)")
    ap.add_argument("--sequence", type=int, default=0, help="print the first K launches of a step in order")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for shape in args.shapes:
        cfg = SHAPES[shape]
        if args.layers:
            cfg = dataclasses.replace(cfg, n_layers=args.layers, name=f"{shape}-{args.layers}l")
        model = Llama.random(cfg, device="cuda", max_seq_len=1024, max_batch=max(args.batches),
                             quant=args.quant)
        eng = model.engine
        rng = np.random.default_rng(0)
        for slot in range(max(args.batches)):
            eng.prefill(slot, rng.integers(300, 30000, size=128).astype(np.int32), 0, "none")
        for B in args.batches:
            tokens = rng.integers(300, 30000, size=B).astype(np.int32)
            slots = np.arange(B, dtype=np.int32)

            def run(start):
                for i in range(args.n):
                    eng.decode(tokens, slots, np.full(B, start + i, np.int32), logits=False)
                torch.cuda.synchronize()

            run(128)  # warm-up: captures the graph of this batch
            t0 = time.perf_counter()
            run(128)
            wall = (time.perf_counter() - t0) / args.n
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                run(128)
            per_name = collections.defaultdict(lambda: [0, 0.0])
            launches = []
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
                    name = kernel_name(e.name)
                    per_name[name][0] += 1
                    per_name[name][1] += e.device_time_total
                    launches.append((e.time_range.start, name, e.device_time_total))
            total = sum(v[1] for v in per_name.values()) / args.n
            print(f"\n{cfg.name} {args.quant or 'bf16'} batch {B}: wall {wall * 1e6:.1f} us/step, kernels {total:.1f} us/step")
            kernels = []
            for name, (count, us) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
                print(f"  {name[:70]:70s} {count / args.n:6.1f} launches {us / args.n:9.1f} us/step")
                kernels.append({"name": name, "launches_per_step": count / args.n, "us_per_step": us / args.n})
            launches.sort()
            sequence = [{"name": n, "us": us} for _, n, us in launches[:args.sequence]]
            if sequence:
                print(f"  first {len(sequence)} launches of a step:")
                for i, k in enumerate(sequence):
                    print(f"  {i:4d} {k['name'][:70]:70s} {k['us']:9.1f} us")
            rows.append({"shape": cfg.name, "quant": args.quant, "batch": B, "wall_us": wall * 1e6, "kernel_us": total,
                         "kernels": kernels, "sequence": sequence})
        del model, eng
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "n": args.n, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
