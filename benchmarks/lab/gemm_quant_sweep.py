"""gemm_quant_sweep.py — the two prefill paths on quantized weights, per matrix and row count M:
gemm_quant (the wgmma GEMM dequantizing each k tile of W in its consumers, once per row tile of
x) against dequantize_bf16 of every part into scratch then gemm_bf16 (one bf16 copy shared by
all M rows). Sets tuning::kGemmQuantMaxRows: the largest M where the first is faster.

--gemv adds, at M <= 64, the decode path below gemm_quant's rows: gemv_quant_mma as
CudaEngine::matmul runs it, one pass of all M rows on a matrix of one part, even chunks of at most
16 rows (tuning::kGemvQuantPassRows) on one of several parts, each part stored as fp32 into its
columns (the engine's staging; the epilogue kernel after it is left out). Its "gemv / fused"
column is the switch point between the two (tuning::kGemvQuantMaxRowsBesideGemm on Hopper).

Llama-3-8B (or, --matrices 1b, Llama-3.2-1B) matrices as llama.cpp's Q4_K_M recipe stores them
(wqkv: Q4_K q and k, Q6_K v; w13 and wo Q4_K; w2 Q6_K or Q4_K by layer; the LM head Q6_K).
Weights: 256 quantized rows of random normals, repeated to the matrix's rows (the kernels' time
does not depend on the values), in enough copies that the calls rotate through 200 MiB (as
bench_kernels does: a matrix never sits in L2, as it does not in a forward pass). Both paths get
the engine's split-K scratch and StoreBf16. Device time per call from torch.profiler kernel
durations (bench_kernels.device_times: the testing bindings synchronize after every call, so
host-side events would also time the launch and the sync, tens of us a call), the median of
--reps calls after a warm-up; one JSON line per (matrix, M), and a table.

  PYTHONPATH=. python3 benchmarks/lab/gemm_quant_sweep.py --json sweep.jsonl
  PYTHONPATH=. python3 benchmarks/lab/gemm_quant_sweep.py --gemv --rows 17,24,32,40,48,56,64 --json switch.jsonl
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

from llama_brrr import _C as C

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_kernels import copies_to_defeat_l2, device_times  # noqa: E402

STORE_BF16 = 0
STORE_F32 = 1
GEMV_MAX_ROWS = 64  # tuning::kGemvQuantChunkMaxRows (the kernel's limit)
PASS_ROWS = 16  # tuning::kGemvQuantPassRows
TYPE_IDS = {"q4_k": 12, "q6_k": 14, "q8_0": 8}
# name: ([(type, rows), ...], K)
MATRICES = {
    "wqkv": ([("q4_k", 5120), ("q6_k", 1024)], 4096),
    "wo": ([("q4_k", 4096)], 4096),
    "w13": ([("q4_k", 28672)], 4096),
    "w2_q6_k": ([("q6_k", 4096)], 14336),
    "w2_q4_k": ([("q4_k", 4096)], 14336),
    "lm_head": ([("q6_k", 128256)], 4096),
}
# Llama-3.2-1B's (--matrices 1b).
MATRICES_1B = {
    "1b_wqkv": ([("q4_k", 2560), ("q6_k", 512)], 2048),
    "1b_wo": ([("q4_k", 2048)], 2048),
    "1b_w13": ([("q4_k", 16384)], 2048),
    "1b_w2_q6_k": ([("q6_k", 2048)], 8192),
    "1b_w2_q4_k": ([("q4_k", 2048)], 8192),
    "1b_lm_head": ([("q6_k", 128256)], 2048),
}
MATRICES.update(MATRICES_1B)


def part(name, rows, K, rng):
    w = (rng.standard_normal((256, K)) * 0.02).astype(np.float32)
    blocks = C.quant_ops.quantize(name, w)
    tiled = np.ascontiguousarray(np.tile(blocks, (rows // 256, 1)))
    return torch.from_numpy(C.quant_ops.gpu_repack(name, tiled, K)).cuda()


def split_scratch(T):
    """The engine's split-K scratch on this GPU for testing.gemm_quant / gemm_bf16: (the binding's
    split tuple, the tensors behind it, which must outlive every call that uses the tuple)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    floats, counters = T.gemm_split_scratch_sizes(sms)
    partials = torch.empty(floats, dtype=torch.float32, device="cuda")
    counts = torch.zeros(counters, dtype=torch.int32, device="cuda")
    return (partials.data_ptr(), floats, counts.data_ptr(), counters), (partials, counts)


def timed(calls, reps):
    """Median device us of calls(i) (a list of launches on weight copy i) over reps."""
    def run(i):
        for fn in calls(i):
            fn()
    return device_times(run, reps)["median_s"] * 1e6


def gemv_passes(T, parts, x_all, y, y32, M, N, K):
    """The calls of CudaEngine::matmul's tensor-core GEMV path at M rows (2 <= M <= 64): one pass of
    all rows on a one-part matrix (StoreBf16), even chunks of at most PASS_ROWS rows on several
    parts, each part's fp32 into its columns of y32 (ld_out = N)."""
    if len(parts) == 1:
        t, w, _ = parts[0]
        return [lambda: T.gemv_quant_mma(t, w.data_ptr(), x_all.data_ptr(), M, N, K, STORE_BF16, out=y.data_ptr())]
    calls, chunks, r = [], -(-M // PASS_ROWS), 0
    for c in range(chunks):
        rows = (M - r) // (chunks - c)
        col = 0
        for t, w, n in parts:
            calls.append(lambda t=t, w=w, n=n, r=r, rows=rows, col=col: T.gemv_quant_mma(
                t, w.data_ptr(), x_all[r].data_ptr(), rows, n, K, STORE_F32, out_f32=y32[r, col:].data_ptr(), ld_out=N))
            col += n
        r += rows
    return calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="65,128,192,256,320,384,512,1024,2048")
    ap.add_argument("--matrices", default=",".join(m for m in MATRICES if m not in MATRICES_1B),
                    help="comma-separated names, or 1b for the Llama-3.2-1B ones")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default="")
    ap.add_argument("--gemv", action="store_true", help="also the tensor-core GEMV's passes at M <= 64")
    a = ap.parse_args()
    T = C.testing
    assert T.gemm_quant_available(), "gemm_quant needs a Hopper GPU"
    rng = np.random.default_rng(0)
    split, _scratch = split_scratch(T)
    rows = [int(m) for m in a.rows.split(",")]
    out = open(a.json, "w") if a.json else None
    gemv_col = f" {'gemv us':>8s} {'gemv/fused':>10s}" if a.gemv else ""
    print(f"{'matrix':10s} {'M':>5s} {'fused us':>9s} {'scratch us':>10s} {'ratio':>6s}{gemv_col}")
    names = list(MATRICES_1B) if a.matrices == "1b" else a.matrices.split(",")
    for mname in names:
        spec, K = MATRICES[mname]
        first = [(TYPE_IDS[t], part(t, n, K, rng), n) for t, n in spec]
        N = sum(n for _, _, n in first)
        n_copies = copies_to_defeat_l2(sum(w.numel() * w.element_size() for _, w, _ in first))
        copies = [first] + [[(t, w.clone(), n) for t, w, n in first] for _ in range(n_copies - 1)]
        deq = torch.empty((N, K), dtype=torch.bfloat16, device="cuda")
        x_all = torch.randn((max(rows), K), device="cuda").to(torch.bfloat16)
        y = torch.empty((max(rows), N), dtype=torch.bfloat16, device="cuda")
        y32 = torch.empty((max(rows), N), dtype=torch.float32, device="cuda")

        def fused(i, M):
            plist = [(t, w.data_ptr(), n) for t, w, n in copies[i % n_copies]]
            return [lambda: T.gemm_quant(plist, x_all.data_ptr(), M, N, K, STORE_BF16, out=y.data_ptr(),
                                         split=split)]

        def scratch(i, M):
            calls, r0 = [], 0
            for t, w, n in copies[i % n_copies]:
                calls.append(lambda t=t, w=w, n=n, r0=r0: T.dequantize_bf16(t, w.data_ptr(), deq[r0].data_ptr(),
                                                                            n, K))
                r0 += n
            calls.append(lambda: T.gemm_bf16(x_all.data_ptr(), deq.data_ptr(), M, N, K, STORE_BF16,
                                             out=y.data_ptr(), split=split))
            return calls

        for M in rows:
            f = timed(lambda i: fused(i, M), a.reps)
            s = timed(lambda i: scratch(i, M), a.reps)
            rec = {"matrix": mname, "M": M, "N": N, "K": K, "fused_us": round(f, 1), "scratch_us": round(s, 1),
                   "fused_over_scratch": round(f / s, 3), "gpu": torch.cuda.get_device_name()}
            line = f"{mname:10s} {M:5d} {f:9.1f} {s:10.1f} {f / s:6.2f}"
            if a.gemv and M <= GEMV_MAX_ROWS:
                g = timed(lambda i: gemv_passes(T, copies[i % n_copies], x_all, y, y32, M, N, K), a.reps)
                rec.update(gemv_us=round(g, 1), gemv_over_fused=round(g / f, 3))
                line += f" {g:8.1f} {g / f:10.2f}"
            print(line, flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
