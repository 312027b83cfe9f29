"""The quantized decode GEMV (testing.gemv_quant on the qlayout tiles, int8 ActBlock activations)
on the Llama-3-8B decode projections (--shape: another of llama_brrr.config.SHAPES) at M = 1, 2, 4, 8, 16, beside the bf16 GEMV (testing.gemv_bf16,
fp32 store, the engine's path choice for that M) of the same shape and a device copy of the
quantized GEMV's own byte count, all measured in the same run on one GPU.

Times are device time per call from torch.profiler kernel durations (bench_kernels.device_times:
the testing bindings synchronize after each call, so host-side events would time the sync), the
median of --repeats calls after a warm-up, with min / max. Weights rotate among enough copies to
defeat L2. Weights are real blocks, never zeros: min(N, 1024) rows of Gaussian floats quantized by
our CPU quantizers (quant_ops.quantize), repeated to N rows and repacked (quant_ops.gpu_repack);
x is Gaussian, quantized on the GPU (testing.quantize_act_bf16, not timed). Each (type, shape, M)
is checked on 64 rows against the float64 reference of the CPU dequantizer before its time counts
(the bound of tests/test_cuda_gemv_quant.py).

GB/s counts the bytes streamed: the tiles plus the ActBlocks and y (bf16: weights, x and y). "of
copy" is that rate over a same-size device copy's (read + write counted, as bench_kernels'
yardstick); "x bf16" = bf16 GEMV time / ours.

--path mma / both adds the tensor-core form (testing.gemv_quant_mma, csrc/cuda/gemv_quant_mma.cu:
bf16 x rows, not ActBlocks) on the same weights, M and run: its bytes are the tiles plus the bf16
x and y, checked first against float64 of the weights it decodes (bf16 of the CPU-dequantized W, or
W within the decode's slack: tests/mma_decode_ref.py) times x within the bound of
tests/test_cuda_gemv_quant_mma.py; "mma of copy" uses the same-size copy's rate of that row.
The default (--path dp4a) prints and writes exactly what it did before. With --path mma, --rows
may go up to 64 (one weight pass serves them all): past 16 the bf16 opponent is the engine's
matmul_bf16 (the tensor-core GEMM with split-K scratch there), and "x 16-row" is the time of the
same rows as even calls of at most 16 (how the engine ran them before) over the one call.

    python benchmarks/lab/gpu_gemv_quant_bench.py --out /tmp/gemv_quant.json
    python benchmarks/lab/gpu_gemv_quant_bench.py --path both --rows 2,4,8,16 --out /tmp/gemv_quant_mma.json
    python benchmarks/lab/gpu_gemv_quant_bench.py --types q4_k,q6_k,q8_0,q4_0 --rows 1,2,4,8,16 --repeats 100
    python benchmarks/lab/gpu_gemv_quant_bench.py --path mma --types q4_k,q8_0 --rows 16,32,64 --out /tmp/qmma64.json
    python benchmarks/lab/gpu_gemv_quant_bench.py --path mma --shape llama3.2-1b --types q4_k,q6_k --rows 2,16
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
for p in (ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from llama_brrr.config import SHAPES as MODEL_SHAPES  # noqa: E402
from bench_kernels import (STORE_F32, copies_to_defeat_l2, device_times, random_bf16,  # noqa: E402
                           same_size_copy)
from mma_decode_ref import decode_slack  # noqa: E402

# name: GGML type id
TYPES = {"q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q4_k": 12, "q5_k": 13, "q6_k": 14}
# What the tables call each --shape.
TITLES = {"llama3-8b": "Llama-3-8B", "llama3.2-1b": "Llama-3.2-1B"}


def decode_shapes(shape):
    """A model shape's decode projections (proj, N, K): the 8B's wqkv 6144 x 4096, wo 4096 x 4096,
    w13 28672 x 4096, w2 4096 x 14336, LM head 128256 x 4096."""
    c = MODEL_SHAPES[shape]
    return [("wqkv", c.q_dim + 2 * c.n_kv_heads * c.head_dim, c.dim), ("wo", c.dim, c.q_dim),
            ("w13", 2 * c.hidden_dim, c.dim), ("w2", c.dim, c.hidden_dim), ("lm_head", c.vocab_size, c.dim)]


CHECK_ROWS = 64
BASE_ROWS = 1024  # rows quantized on the CPU, repeated to N


def packed_weights(C, name, N, K, rng):
    """(tiles uint8 [matrix_bytes] on the device, the CPU-dequantized first CHECK_ROWS rows, their
    blocks)."""
    R = min(N, BASE_ROWS)
    w = rng.standard_normal((R, K)).astype(np.float32) * rng.uniform(0.005, 0.05, size=(R, 1)).astype(np.float32)
    base = C.quant_ops.quantize(name, w)
    blocks = base[np.arange(N) % R]
    packed = torch.from_numpy(C.quant_ops.gpu_repack(name, blocks, K)).cuda()
    check_blocks = base[:min(R, CHECK_ROWS)]
    return packed, C.quant_ops.dequantize(name, check_blocks, K).astype(np.float64), check_blocks


def act_deq(xq):
    b = xq.cpu().numpy().reshape(xq.shape[0], -1, 48)
    d = b[:, :, :4].copy().view(np.float32)[:, :, 0].astype(np.float64)
    q = b[:, :, 16:].copy().view(np.int8).astype(np.float64)
    return (d[:, :, None] * q).reshape(xq.shape[0], -1)


def check(C, name, packed, deq, xq, M, N, K):
    """Runs the kernel once and compares the first rows with the CPU dequantizer's reference."""
    y = torch.full((M, N), float("nan"), device="cuda")
    C.testing.gemv_quant(TYPES[name], packed.data_ptr(), xq.data_ptr(), M, N, K, STORE_F32, out_f32=y.data_ptr())
    rows = deq.shape[0]
    xd = act_deq(xq)
    ref = xd @ deq.T
    halves = np.repeat(np.abs(deq).reshape(rows, K // 16, 16).max(axis=2), 16, axis=1)
    bound = 64 * 2.0 ** -24 * (np.abs(xd) @ (4 * halves).T)
    got = y[:, :rows].double().cpu().numpy()
    if not np.isfinite(y.cpu().numpy()).all() or (np.abs(got - ref) > bound).any():
        raise SystemExit(f"gemv_quant {name} M={M} {N}x{K}: result off the reference; no timing counts")


def check_mma(C, name, packed, deq, blocks, x, M, N, K):
    """Runs gemv_quant_mma once and compares the first rows with float64 of its decoded weights x x."""
    y = torch.full((M, N), float("nan"), device="cuda")
    C.testing.gemv_quant_mma(TYPES[name], packed.data_ptr(), x.data_ptr(), M, N, K, STORE_F32, out_f32=y.data_ptr())
    rows = deq.shape[0]
    slack = decode_slack(name, blocks, deq)
    if slack is None:
        wb, slack = torch.from_numpy(deq).to(torch.float32).to(torch.bfloat16).double().numpy(), np.zeros_like(deq)
    else:
        wb = deq
    xd = x.double().cpu().numpy()
    ref = xd @ wb.T
    bound = (K / 128 + 16) * 2.0 ** -22 * (np.abs(xd) @ (np.abs(wb) + slack).T) + np.abs(xd) @ slack.T
    got = y[:, :rows].double().cpu().numpy()
    if not np.isfinite(y.cpu().numpy()).all() or (np.abs(got - ref) > bound).any():
        raise SystemExit(f"gemv_quant_mma {name} M={M} {N}x{K}: result off the reference; no timing counts")


def bench(C, names, row_counts, repeats, rng, path="dp4a", shape="llama3-8b"):
    rows = []
    floats, counters = C.testing.gemm_split_scratch_sizes(torch.cuda.get_device_properties(0).multi_processor_count)
    partials = torch.zeros(floats, device="cuda")
    counts = torch.zeros(counters, device="cuda", dtype=torch.int32)
    split = (partials.data_ptr(), floats, counts.data_ptr(), counters)
    for proj, N, K in decode_shapes(shape):
        bf16_w = [random_bf16((N, K), 0.02) for _ in range(copies_to_defeat_l2(N * K * 2))]
        t_bf16 = {}
        for M in row_counts:
            x = random_bf16((M, K))
            y = torch.zeros((M, N), device="cuda")

            def run_bf16(i):
                if M <= 16:
                    C.testing.gemv_bf16(x.data_ptr(), bf16_w[i % len(bf16_w)].data_ptr(), M, N, K, STORE_F32,
                                        out_f32=y.data_ptr())
                else:
                    C.testing.matmul_bf16(x.data_ptr(), bf16_w[i % len(bf16_w)].data_ptr(), M, N, K, STORE_F32,
                                          out_f32=y.data_ptr(), split=split)
            t_bf16[M] = device_times(run_bf16, repeats)
        bf16_w = None
        torch.cuda.empty_cache()
        for name in names:
            first, deq, check_blocks = packed_weights(C, name, N, K, rng)
            weights = [first] + [first.clone() for _ in range(copies_to_defeat_l2(first.numel()) - 1)]
            for M in row_counts:
                x = random_bf16((M, K))
                y = torch.zeros((M, N), device="cuda")
                bf16_bytes = N * K * 2 + M * K * 2 + M * N * 4
                tb = t_bf16[M]
                row = {"proj": proj, "type": name, "M": M, "N": N, "K": K}
                copy = None
                if path in ("dp4a", "both"):
                    xq = torch.empty((M, K // 32 * 48), dtype=torch.uint8, device="cuda")
                    C.testing.quantize_act_bf16(x.data_ptr(), xq.data_ptr(), M, K)
                    check(C, name, first, deq, xq, M, N, K)
                    moved = first.numel() + xq.numel() + M * N * 4

                    def run_quant(i):
                        C.testing.gemv_quant(TYPES[name], weights[i % len(weights)].data_ptr(), xq.data_ptr(), M, N,
                                             K, STORE_F32, out_f32=y.data_ptr())
                    t = device_times(run_quant, repeats)
                    copy = same_size_copy(weights, moved, repeats)
                    row.update({"bytes": moved, "ours": t,
                                "bf16": tb, "bf16_bytes": bf16_bytes, "copy_same_bytes": copy,
                                "ours_GBps": moved / t["median_s"] / 1e9,
                                "bf16_GBps": bf16_bytes / tb["median_s"] / 1e9,
                                "ours_frac_of_same_size_copy": moved / t["median_s"] / copy["Bps"],
                                "speedup_vs_bf16": tb["median_s"] / t["median_s"],
                                "bytes_ratio_bf16_over_ours": bf16_bytes / moved})
                if path in ("mma", "both"):
                    check_mma(C, name, first, deq, check_blocks, x, M, N, K)
                    moved_mma = first.numel() + M * K * 2 + M * N * 4

                    def run_mma(i):
                        C.testing.gemv_quant_mma(TYPES[name], weights[i % len(weights)].data_ptr(), x.data_ptr(), M,
                                                 N, K, STORE_F32, out_f32=y.data_ptr())
                    tm = device_times(run_mma, repeats)
                    if copy is None:
                        copy = same_size_copy(weights, moved_mma, repeats)
                    row.update({"mma_bytes": moved_mma, "mma": tm, "bf16": tb, "bf16_bytes": bf16_bytes,
                                "copy_same_bytes": copy, "bf16_GBps": bf16_bytes / tb["median_s"] / 1e9,
                                "mma_GBps": moved_mma / tm["median_s"] / 1e9,
                                "mma_frac_of_same_size_copy": moved_mma / tm["median_s"] / copy["Bps"],
                                "mma_speedup_vs_bf16": tb["median_s"] / tm["median_s"]})
                    if "ours" in row:
                        row["mma_speedup_vs_dp4a"] = row["ours"]["median_s"] / tm["median_s"]
                    if M > 16:
                        chunks = -(-M // 16)
                        bounds = [M * c // chunks for c in range(chunks + 1)]

                        def run_chunks(i):
                            w = weights[i % len(weights)].data_ptr()
                            for r0, r1 in zip(bounds, bounds[1:]):
                                C.testing.gemv_quant_mma(TYPES[name], w, x[r0:].data_ptr(), r1 - r0, N, K, STORE_F32,
                                                         out_f32=y[r0:].data_ptr())
                        tc = device_times(run_chunks, repeats)
                        row.update({"mma_16row_chunks": tc, "mma_speedup_vs_16row_chunks":
                                    tc["median_s"] / tm["median_s"]})
                rows.append(row)
            weights = first = None
            torch.cuda.empty_cache()
    return rows


def print_table(result):
    if result.get("path", "dp4a") != "dp4a":
        return print_table_mma(result)
    print(f"gemv_quant, {TITLES[result.get('shape', 'llama3-8b')]} decode projections on {result['gpu']} "
          f"(median of {result['repeats']}, [min, max] us)")
    print(f"{'proj':8} {'type':5} {'M':>2} {'N x K':>13} {'ours us':>22} {'GB/s':>7} {'of copy':>8} "
          f"{'bf16 us':>22} {'bf16 GB/s':>9} {'x bf16':>7} {'bytes x':>7}")
    for r in result["rows"]:
        o, b = r["ours"], r["bf16"]
        print(f"{r['proj']:8} {r['type']:5} {r['M']:>2} {r['N']:>6}x{r['K']:<6} "
              f"{o['median_s'] * 1e6:8.1f} [{o['min_s'] * 1e6:5.1f},{o['max_s'] * 1e6:6.1f}] "
              f"{r['ours_GBps']:7.0f} {100 * r['ours_frac_of_same_size_copy']:7.0f}% "
              f"{b['median_s'] * 1e6:8.1f} [{b['min_s'] * 1e6:5.1f},{b['max_s'] * 1e6:6.1f}] "
              f"{r['bf16_GBps']:9.0f} {r['speedup_vs_bf16']:6.2f}x {r['bytes_ratio_bf16_over_ours']:6.2f}x")
    print("x bf16: bf16 GEMV time / ours (same run); bytes x: the ceiling of that ratio (bf16 bytes / block bytes)")


def print_table_mma(result):
    """--path mma / both: the tensor-core form beside dp4a (where measured), the bf16 GEMV and the copy."""
    both = result["path"] == "both"
    print(f"gemv_quant_mma{' vs gemv_quant (dp4a)' if both else ''}, {TITLES[result.get('shape', 'llama3-8b')]} "
          "decode projections on "
          f"{result['gpu']} (median of {result['repeats']}, [min, max] us)")
    head = f"{'proj':8} {'type':5} {'M':>2} {'N x K':>13} {'mma us':>22} {'of copy':>8} "
    if both:
        head += f"{'dp4a us':>22} {'of copy':>8} {'x dp4a':>7} "
    print(head + f"{'bf16 us':>22} {'x bf16':>7} {'x 16-row':>8}")
    for r in result["rows"]:
        m, b = r["mma"], r["bf16"]
        line = (f"{r['proj']:8} {r['type']:5} {r['M']:>2} {r['N']:>6}x{r['K']:<6} "
                f"{m['median_s'] * 1e6:8.1f} [{m['min_s'] * 1e6:5.1f},{m['max_s'] * 1e6:6.1f}] "
                f"{100 * r['mma_frac_of_same_size_copy']:7.0f}% ")
        if both:
            o = r["ours"]
            line += (f"{o['median_s'] * 1e6:8.1f} [{o['min_s'] * 1e6:5.1f},{o['max_s'] * 1e6:6.1f}] "
                     f"{100 * r['ours_frac_of_same_size_copy']:7.0f}% {r['mma_speedup_vs_dp4a']:6.2f}x ")
        line += (f"{b['median_s'] * 1e6:8.1f} [{b['min_s'] * 1e6:5.1f},{b['max_s'] * 1e6:6.1f}] "
                 f"{r['mma_speedup_vs_bf16']:6.2f}x")
        if "mma_speedup_vs_16row_chunks" in r:
            line += f" {r['mma_speedup_vs_16row_chunks']:7.2f}x"
        print(line)
    print("of copy: GB/s moved / a same-size device copy's (same run); x dp4a / x bf16: their time / the mma "
          "form's (bf16: the GEMV up to 16 rows, matmul_bf16's GEMM past); x 16-row: the same rows as even calls of "
          "at most 16 / one call")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", default="q4_k,q6_k,q8_0,q4_0", help="comma-separated (default %(default)s; "
                        f"any of {', '.join(TYPES)})")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per kernel (default %(default)s)")
    parser.add_argument("--rows", default="1,2,4,8,16", help="values of M (default %(default)s; up to 64 with "
                        "--path mma)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=list(TITLES), default="llama3-8b", help="the model whose projections "
                        "are timed (default %(default)s)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--path", choices=["dp4a", "mma", "both"], default="dp4a",
                        help="dp4a: gemv_quant (default, the table as before); mma: gemv_quant_mma, the "
                        "tensor-core form; both: the two side by side")
    args = parser.parse_args(argv)
    names = [t for t in args.types.split(",") if t]
    unknown = [t for t in names if t not in TYPES]
    if unknown or not names:
        parser.error(f"--types: unknown {unknown}; choose from {', '.join(TYPES)}")
    try:
        row_counts = [int(m) for m in args.rows.split(",") if m]
    except ValueError:
        parser.error(f"--rows: integers in [1, 16], got {args.rows!r}")
    most = 64 if args.path == "mma" else 16
    if not row_counts or any(m < 1 or m > most for m in row_counts):
        parser.error(f"--rows: integers in [1, {most}] with --path {args.path} (gemv_quant takes at most 16 rows, "
                     f"gemv_quant_mma 64: use --path mma past 16), got {args.rows!r}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not torch.cuda.is_available():
        sys.exit("gpu_gemv_quant_bench: no CUDA device visible to torch")
    from llama_brrr import _C
    needed = ["gemv_quant"] if args.path == "dp4a" else ["gemv_quant_mma"] if args.path == "mma" else \
        ["gemv_quant", "gemv_quant_mma"]
    if not _C.cuda_compiled() or _C.cuda_device_count() < 1 or not all(hasattr(_C.testing, n) for n in needed):
        sys.exit(f"gpu_gemv_quant_bench: llama_brrr._C has no CUDA backend with testing.{' and '.join(needed)} "
                 "(build with LLAMA_BRRR_CUDA=1 on a machine with a GPU)")
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    started = time.monotonic()
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "host": platform.node(), "repeats": args.repeats, "seed": args.seed, "types": names,
              "rows_M": row_counts,
              "command": " ".join([sys.executable] + sys.argv),
              "method": "device time per call from torch.profiler kernel durations; median of repeats"}
    if args.path != "dp4a":
        result["path"] = args.path
    if args.shape != "llama3-8b":
        result["shape"] = args.shape
    result["rows"] = bench(_C, names, row_counts, args.repeats, rng, args.path, args.shape)
    result["wall_s"] = time.monotonic() - started
    print_table(result)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
