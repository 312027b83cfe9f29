"""gemm_residual_race.py — hunts wrong AddResidual results of the Hopper GEMM: the same call many
times on fresh random inputs, each result checked element by element against residual + StoreF32's
y of the same x and W (bit for bit: the add is one fp32 add), and every wrong element classified:
  lost     the residual unchanged (the add never landed)
  twice    residual + 2 y (added twice)
  other    anything else (e.g. another box's values)
and located by 64 x 32 box (the TMA epilogue's unit). Exit status 1 when any element was wrong.
    python3 benchmarks/lab/gemm_residual_race.py [--ks 64,136,576] [--repeats 5] [--label default]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from llama_brrr import _C  # noqa: E402

STORE_F32, ADD_RESIDUAL = 1, 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="64,136,576")
    ap.add_argument("--m", type=int, default=2000)
    ap.add_argument("--n", type=int, default=4104)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--label", default="default")
    args = ap.parse_args()
    ops = _C.testing
    gen = torch.Generator(device="cuda").manual_seed(1)
    M, N = args.m, args.n
    clean = True
    for K in (int(k) for k in args.ks.split(",")):
        counts = {"lost": 0, "twice": 0, "other": 0}
        boxes, bad_runs = set(), 0
        for _ in range(args.repeats):
            x = torch.randn((M, K), generator=gen, device="cuda").bfloat16()
            W = (torch.randn((N, K), generator=gen, device="cuda") / K ** 0.5).bfloat16()
            y = torch.full((M, N), float("nan"), device="cuda")
            ops.gemm_bf16(x.data_ptr(), W.data_ptr(), M, N, K, STORE_F32, out_f32=y.data_ptr())
            residual = torch.randn((M, N), generator=gen, device="cuda")
            before = residual.clone()
            ops.gemm_bf16(x.data_ptr(), W.data_ptr(), M, N, K, ADD_RESIDUAL, residual=residual.data_ptr())
            torch.cuda.synchronize()
            wrong = residual != before + y
            if not wrong.any():
                continue
            bad_runs += 1
            clean = False
            lost = wrong & (residual == before)
            twice = wrong & ~lost & (residual == (before + y) + y)
            counts["lost"] += int(lost.sum())
            counts["twice"] += int(twice.sum())
            counts["other"] += int((wrong & ~lost & ~twice).sum())
            rows, cols = wrong.nonzero(as_tuple=True)
            boxes.update(zip((rows // 64).tolist(), (cols // 32).tolist()))
        print(f"{args.label:14} K={K:5d}  runs with wrong elements {bad_runs}/{args.repeats}  {counts}  "
              f"boxes {len(boxes)}: {sorted(boxes)[:6]}", flush=True)
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
