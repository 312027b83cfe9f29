"""gemm_epilogue_cost.py — what the Hopper GEMM's epilogue costs on one projection shape: the same
x and W through gemm_bf16 with each epilogue (bf16 store, fp32 store, fp32 residual add), beside
cuBLAS's plain bf16 matmul and, for the fp32 epilogues, cuBLAS doing the same job in one call
(bench_kernels.py's Matmul.cublas_same_job: an fp32-out matmul, an addmm into the residual);
device time from the kernels' own durations (bench_kernels.py's method). The Llama-3-8B wo
(K = 4096) is where the fp32 residual add shows most: its tiles have the shortest main loop per
output byte.

    python3 benchmarks/lab/gemm_epilogue_cost.py [--shapes 4096x4096,4096x14336] [--ms 2048,4096]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_kernels import (ADD_RESIDUAL, EPILOGUE_NAMES, STORE_BF16, STORE_F32, Matmul,  # noqa: E402
                           device_times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x4096,6144x4096,4096x14336", help="NxK list")
    ap.add_argument("--ms", default="2048,4096", help="M list")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--epilogues", default="store_bf16,store_f32,add_residual", help="which epilogues")
    ap.add_argument("--label", default="", help="a name for this setting in the output")
    ap.add_argument("--json", default=None, help="append one JSON line per case here")
    args = ap.parse_args()
    from llama_brrr import _C
    ops = _C.testing
    print(f"{'setting':12} {'N':>6} {'K':>6} {'M':>5} {'epilogue':13} {'us':>8} {'cuBLAS us':>9} {'x cuBLAS':>8}"
          f" {'same-job us':>11} {'x same':>6}")
    for shape in args.shapes.split(","):
        N, K = (int(v) for v in shape.split("x"))
        for M in (int(v) for v in args.ms.split(",")):
            for epilogue in (e for e in (STORE_BF16, STORE_F32, ADD_RESIDUAL)
                             if EPILOGUE_NAMES[e] in args.epilogues.split(",")):
                mm = Matmul(ops, M, N, K, epilogue, rotate=False)
                ours = device_times(mm.ours("gemm_bf16"), args.repeats)
                theirs = device_times(mm.cublas, args.repeats)
                ratio = theirs["median_s"] / ours["median_s"]
                same_job = mm.cublas_same_job()
                same = device_times(same_job, args.repeats) if same_job else None
                same_cells = (f" {same['median_s'] * 1e6:11.1f} {same['median_s'] / ours['median_s']:6.3f}"
                              if same else f" {'-':>11} {'-':>6}")
                name = EPILOGUE_NAMES[epilogue]
                print(f"{args.label:12} {N:6} {K:6} {M:5} {name:13} {ours['median_s'] * 1e6:8.1f} "
                      f"{theirs['median_s'] * 1e6:9.1f} {ratio:8.3f}" + same_cells)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps({"setting": args.label, "N": N, "K": K, "M": M, "epilogue": name,
                                            "ours": ours, "cublas": theirs, "x_cublas": ratio,
                                            "cublas_same_job": same}) + "\n")
                del mm


if __name__ == "__main__":
    main()
