"""gemv_quant_wgmma_sweep.py — the engine's decode paths at 17-64 rows on quantized weights, per
type, matrix and row count M: gemv_quant_wgmma (W decoded into wgmma's A registers, the slices'
planes and their sum counted) against the path CudaEngine::matmul would otherwise take there, the
tensor-core GEMV (one pass of all M rows, gemm_quant_sweep.gemv_passes) up to 32 rows and
gemm_quant past them (Hopper). Sets gemv_quant_wgmma_takes's rule (tuning::kGemvQuantWgmmaMinUnits:
which matrices it takes). Rows of 16 or fewer measure the kernel where the engine keeps the GEMV
(it stages 32 x rows there).

Llama-3-8B's matrices, each of one type (a file quantized to that type throughout): wqkv, wo, w13,
w2 and the LM head. Weights as gemm_quant_sweep.part makes them (256 quantized rows repeated),
rotated through 200 MiB of copies; StoreBf16; device time per call from torch.profiler kernel
durations, the median of --reps calls. Before any timing, each (type, matrix, M) checks the
wgmma result against the GEMV's (StoreF32: the same bf16 weights, sums in another order).

  PYTHONPATH=. python3 benchmarks/lab/gemv_quant_wgmma_sweep.py --types q8_0,q4_1 --rows 24,32,40,64 --json s.jsonl

--wgmma-only times the kernel alone, unchecked (a module built with an ablation patch computes wrong
results on purpose); --copies 1 leaves one weight copy, so W stays in L2 where it fits. --ncu N
only launches the kernel N times a case, untimed, for Nsight Compute (which cannot share CUPTI with
torch.profiler; it flushes the caches before each pass by default):
  ncu --clock-control none --kernel-name regex:gemv_quant_wgmma_kernel --launch-count 4 \
      --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
      python3 benchmarks/lab/gemv_quant_wgmma_sweep.py --ncu 2 --types q4_k --matrices w13 --rows 17,32
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

from llama_brrr import _C as C
from llama_brrr import quant

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_kernels import copies_to_defeat_l2  # noqa: E402
from gemm_quant_sweep import STORE_BF16, STORE_F32, gemv_passes, part, split_scratch, timed  # noqa: E402

GEMV_ROWS = 32  # tuning::kGemvQuantMaxRowsBesideGemm: the GEMV's rows on Hopper
MATRICES = {"wqkv": (6144, 4096), "wo": (4096, 4096), "w13": (28672, 4096), "w2": (4096, 14336),
            "lm_head": (128256, 4096)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q8_0,q4_0,q4_1,q5_0,q5_1,q5_k")
    ap.add_argument("--matrices", default="wqkv,wo,w13,w2")
    ap.add_argument("--rows", default="24,32,40,64")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default="")
    ap.add_argument("--wgmma-only", action="store_true",
                    help="time the kernel alone, unchecked (ablation modules whose results are wrong on purpose)")
    ap.add_argument("--ncu", type=int, default=0, help="only launch the kernel this many times a case, untimed")
    ap.add_argument("--copies", type=int, default=0,
                    help="weight copies to rotate through (default: enough to defeat L2; 1 keeps W in L2 where it fits)")
    a = ap.parse_args()
    T = C.testing
    assert T.gemm_quant_available(), "gemv_quant_wgmma and gemm_quant need a Hopper GPU"
    ids = quant.kept_types()
    rng = np.random.default_rng(0)
    split, _scratch = split_scratch(T)
    rows = [int(m) for m in a.rows.split(",")]
    out = open(a.json, "w") if a.json else None
    print(f"{'type':5s} {'matrix':8s} {'M':>3s} {'path':>10s} {'path us':>8s} {'wgmma us':>9s} {'path/wgmma':>10s}")
    for tname in a.types.split(","):
        for mname in a.matrices.split(","):
            N, K = MATRICES[mname]
            t = ids[tname]
            first = part(tname, N, K, rng)
            n_copies = 1 if a.ncu else a.copies or copies_to_defeat_l2(first.numel() * first.element_size())
            copies = [first] + [first.clone() for _ in range(n_copies - 1)]
            x_all = torch.randn((max(rows), K), device="cuda").to(torch.bfloat16)
            y = torch.empty((max(rows), N), dtype=torch.bfloat16, device="cuda")
            y32 = torch.empty((max(rows), N), dtype=torch.float32, device="cuda")
            floats = T.gemv_quant_wgmma_plane_floats(max(rows), N, K)
            planes = torch.empty(floats, dtype=torch.float32, device="cuda")

            def wgmma(i, M, ep=STORE_BF16, dest=None):
                w = copies[i % n_copies]
                kw = {"out_f32": dest.data_ptr()} if ep == STORE_F32 else {"out": y.data_ptr()}
                return [lambda: T.gemv_quant_wgmma([(t, w.data_ptr(), N)], x_all.data_ptr(), M, N, K, ep,
                                                   planes=planes.data_ptr(), plane_floats=floats, **kw)]

            def other(i, M):
                w = copies[i % n_copies]
                if M <= GEMV_ROWS:
                    return gemv_passes(T, [(t, w, N)], x_all, y, y32, M, N, K)
                return [lambda: T.gemm_quant([(t, w.data_ptr(), N)], x_all.data_ptr(), M, N, K, STORE_BF16,
                                             out=y.data_ptr(), split=split)]

            for M in rows:
                if a.ncu:
                    for _ in range(a.ncu):
                        for fn in wgmma(0, M):
                            fn()
                    torch.cuda.synchronize()
                    print(f"{tname} {mname} M={M} launched {a.ncu}x", flush=True)
                    continue
                if a.wgmma_only:
                    w_us = timed(lambda i: wgmma(i, M), a.reps)
                    rec = {"type": tname, "matrix": mname, "M": M, "N": N, "K": K, "wgmma_us": round(w_us, 1),
                           "copies": n_copies, "gpu": torch.cuda.get_device_name()}
                    print(f"{tname:5s} {mname:8s} {M:3d} {'-':>10s} {'-':>8s} {w_us:9.1f}", flush=True)
                    if out:
                        out.write(json.dumps(rec) + "\n")
                        out.flush()
                    continue
                got = torch.full((M, N), float("nan"), device="cuda")
                for fn in wgmma(0, M, STORE_F32, got):
                    fn()
                want = torch.empty((M, N), dtype=torch.float32, device="cuda")
                T.gemv_quant_mma(t, first.data_ptr(), x_all.data_ptr(), M, N, K, STORE_F32, out_f32=want.data_ptr())
                torch.cuda.synchronize()
                dev = ((got - want).abs().max() / want.abs().max()).item()
                assert dev < 1e-4, f"{tname} {mname} M={M}: wgmma off the GEMV by {dev:.2e} of max |y|"
                w_us = timed(lambda i: wgmma(i, M), a.reps)
                o_us = timed(lambda i: other(i, M), a.reps)
                path = "gemv" if M <= GEMV_ROWS else "gemm_quant"
                rec = {"type": tname, "matrix": mname, "M": M, "N": N, "K": K, "path": path, "path_us": round(o_us, 1),
                       "wgmma_us": round(w_us, 1), "path_over_wgmma": round(o_us / w_us, 3), "copies": n_copies,
                       "gpu": torch.cuda.get_device_name()}
                print(f"{tname:5s} {mname:8s} {M:3d} {path:>10s} {o_us:8.1f} {w_us:9.1f} {o_us / w_us:10.2f}",
                      flush=True)
                if out:
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
            del copies, first


if __name__ == "__main__":
    main()
