"""The quantized decode GEMV (testing.gemv_quant, blocks as stored) on the Llama-3-8B batch-1
projections, beside the bf16 GEMV (testing.gemv_bf16, fp32 store) and a device copy of the
quantized GEMV's own byte count, all measured in the same run on one GPU.

Times are device time per call from torch.profiler kernel durations (bench_kernels.device_times:
the testing bindings synchronize after each call, so host-side events would time the sync), the
median of --repeats calls after a warm-up, with min / max. Weights rotate among enough copies to
defeat L2. Blocks are random bytes with random finite fp16 scales (every value pattern a file can
hold; the decode has no data-dependent branch), and each type's result is checked on 64 rows
against the CPU dequantizer's float64 reference before its time counts.

GB/s counts the bytes streamed: the blocks (or bf16 weights) plus x and y. "of copy" is that rate
over a same-size device copy's (read + write counted, as bench_kernels' yardstick).

    python benchmarks/lab/gpu_gemv_quant_bench.py --out /tmp/gemv_quant.json
    python benchmarks/lab/gpu_gemv_quant_bench.py --types q8_0,q4_k,q6_k,q4_0,q5_k --repeats 100
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

LAB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(LAB))
for p in (ROOT, os.path.join(ROOT, "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_kernels import (STORE_F32, copies_to_defeat_l2, device_times, random_bf16,  # noqa: E402
                           same_size_copy)

# name: (GGML type id, block elements, block bytes, byte offsets of the fp16 scale fields)
TYPES = {"q8_0": (8, 32, 34, (0,)), "q4_0": (2, 32, 18, (0,)), "q4_1": (3, 32, 20, (0, 2)),
         "q5_0": (6, 32, 22, (0,)), "q5_1": (7, 32, 24, (0, 2)), "q4_k": (12, 256, 144, (0, 2)),
         "q5_k": (13, 256, 176, (0, 2)), "q6_k": (14, 256, 210, (208,))}
# Llama-3-8B batch-1 decode projections (N, K)
SHAPES = [("wqkv", 6144, 4096), ("wo", 4096, 4096), ("w13", 28672, 4096), ("w2", 4096, 14336),
          ("lm_head", 128256, 4096)]
CHECK_ROWS = 64
ACC_BOUND = 2e-6  # as tests/test_cuda_gemv_quant.py: fp32 accumulation against sum |x||w|


def random_blocks(name, N, K, gen):
    """uint8 [N, row_bytes]: random bytes, each block's fp16 scales set to finite values in
    (-0.02, 0.02) (a K-quant's dmin likewise), so no output is inf or NaN."""
    _, elems, size, scale_offsets = TYPES[name]
    nb = K // elems
    blocks = torch.randint(0, 256, (N, nb, size), dtype=torch.uint8, device="cuda", generator=gen)
    for off in scale_offsets:
        scales = ((torch.rand((N, nb), device="cuda", generator=gen) - 0.5) * 0.04).half()
        blocks[:, :, off:off + 2] = scales.view(torch.uint8).view(N, nb, 2)
    return blocks.view(N, nb * size)


def check(C, name, blocks, x, N, K):
    """Runs the kernel once and compares CHECK_ROWS rows with the CPU dequantizer's reference."""
    type_id = TYPES[name][0]
    y = torch.full((1, N), float("nan"), device="cuda")
    C.testing.gemv_quant(type_id, blocks.data_ptr(), x.data_ptr(), y.data_ptr(), 1, N, K)
    rows = min(N, CHECK_ROWS)
    deq = C.quant_ops.dequantize(name, blocks[:rows].cpu().numpy(), K).astype(np.float64)
    xd = x.double().cpu().numpy()
    ref = xd @ deq.T
    bound = ACC_BOUND * (np.abs(xd) @ np.abs(deq).T)
    got = y[:, :rows].double().cpu().numpy()
    if not np.isfinite(y.cpu().numpy()).all() or (np.abs(got - ref) > bound).any():
        raise SystemExit(f"gemv_quant {name} {N}x{K}: result off the reference; no timing counts")


def bench(C, names, repeats, gen):
    rows = []
    for proj, N, K in SHAPES:
        x = random_bf16((1, K))
        y = torch.zeros((1, N), device="cuda")
        bf16_w = [random_bf16((N, K), 0.02) for _ in range(copies_to_defeat_l2(N * K * 2))]
        bf16_bytes = N * K * 2 + K * 2 + N * 4

        def run_bf16(i):
            C.testing.gemv_bf16(x.data_ptr(), bf16_w[i % len(bf16_w)].data_ptr(), 1, N, K, STORE_F32,
                                out_f32=y.data_ptr())
        t_bf16 = device_times(run_bf16, repeats)
        del bf16_w
        torch.cuda.empty_cache()
        for name in names:
            type_id, elems, size, _ = TYPES[name]
            blocks = [random_blocks(name, N, K, gen)]
            check(C, name, blocks[0], x, N, K)
            blocks += [random_blocks(name, N, K, gen) for _ in range(copies_to_defeat_l2(blocks[0].numel()) - 1)]
            moved = blocks[0].numel() + K * 2 + N * 4

            def run_quant(i):
                C.testing.gemv_quant(type_id, blocks[i % len(blocks)].data_ptr(), x.data_ptr(), y.data_ptr(), 1, N, K)
            t = device_times(run_quant, repeats)
            copy = same_size_copy(blocks, moved, repeats)
            rows.append({"proj": proj, "type": name, "M": 1, "N": N, "K": K, "bytes": moved, "ours": t,
                         "bf16": t_bf16, "bf16_bytes": bf16_bytes, "copy_same_bytes": copy,
                         "ours_GBps": moved / t["median_s"] / 1e9,
                         "bf16_GBps": bf16_bytes / t_bf16["median_s"] / 1e9,
                         "ours_frac_of_same_size_copy": moved / t["median_s"] / copy["Bps"],
                         "speedup_vs_bf16": t_bf16["median_s"] / t["median_s"],
                         "bytes_ratio_bf16_over_ours": bf16_bytes / moved})
            del blocks
            torch.cuda.empty_cache()
    return rows


def print_table(result):
    print(f"gemv_quant, Llama-3-8B decode projections, M = 1 on {result['gpu']} "
          f"(median of {result['repeats']}, [min, max] us)")
    print(f"{'proj':8} {'type':5} {'N x K':>13} {'ours us':>22} {'GB/s':>7} {'of copy':>8} "
          f"{'bf16 us':>22} {'bf16 GB/s':>9} {'x bf16':>7} {'bytes x':>7}")
    for r in result["rows"]:
        o, b = r["ours"], r["bf16"]
        print(f"{r['proj']:8} {r['type']:5} {r['N']:>6}x{r['K']:<6} "
              f"{o['median_s'] * 1e6:8.1f} [{o['min_s'] * 1e6:5.1f},{o['max_s'] * 1e6:6.1f}] "
              f"{r['ours_GBps']:7.0f} {100 * r['ours_frac_of_same_size_copy']:7.0f}% "
              f"{b['median_s'] * 1e6:8.1f} [{b['min_s'] * 1e6:5.1f},{b['max_s'] * 1e6:6.1f}] "
              f"{r['bf16_GBps']:9.0f} {r['speedup_vs_bf16']:6.2f}x {r['bytes_ratio_bf16_over_ours']:6.2f}x")
    print("x bf16: bf16 GEMV time / ours (same run); bytes x: the ceiling of that ratio (bf16 bytes / block bytes)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", default="q8_0,q4_k,q6_k", help="comma-separated (default %(default)s; "
                        f"any of {', '.join(TYPES)})")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per kernel (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    names = [t for t in args.types.split(",") if t]
    unknown = [t for t in names if t not in TYPES]
    if unknown or not names:
        parser.error(f"--types: unknown {unknown}; choose from {', '.join(TYPES)}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not torch.cuda.is_available():
        sys.exit("gpu_gemv_quant_bench: no CUDA device visible to torch")
    from llama_brrr import _C
    if not _C.cuda_compiled() or _C.cuda_device_count() < 1 or not hasattr(_C.testing, "gemv_quant"):
        sys.exit("gpu_gemv_quant_bench: llama_brrr._C has no CUDA backend with testing.gemv_quant "
                 "(build with LLAMA_BRRR_CUDA=1 on a machine with a GPU)")
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    torch.manual_seed(args.seed)
    started = time.monotonic()
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "host": platform.node(), "repeats": args.repeats, "seed": args.seed, "types": names,
              "command": " ".join([sys.executable] + sys.argv),
              "method": "device time per call from torch.profiler kernel durations; median of repeats"}
    result["rows"] = bench(_C, names, args.repeats, gen)
    result["wall_s"] = time.monotonic() - started
    print_table(result)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
