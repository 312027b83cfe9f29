"""dequant_slices_sweep.py — the long-prompt path on quantized weights, per matrix and row count M:
gemm_dequant_slices with a scratch that holds all of W (one slice: W dequantized whole, then one
gemm_bf16, the engine's path before slicing) against scratches of 0.5, 1 and 2 L2s of bf16 values
(the engine's is 1), which dequantize and multiply a slice of output columns at a time.

Llama-3-8B and Llama-3.2-1B matrices as llama.cpp's Q4_K_M recipe stores them (wqkv: Q4_K q and
k, Q6_K v; w13 and wo Q4_K; w2 Q6_K), each with the engine's epilogue (w13 SwiGLU, wo and w2
AddResidual into fp32, wqkv StoreF32: the staged form of its RopeKV). Weights: 256 quantized rows
of random normals repeated to the matrix's rows (the kernels' time does not depend on the
values). All get the engine's split-K scratch. Median of --reps calls after a warm-up, each one
testing call bracketed by CUDA events (so each figure carries the same launch and synchronization
overhead, a few microseconds); one JSON line per (matrix, M) and a table with each slicing's
width. The engine never runs more than 2048 rows a call (its prefill chunk).

  PYTHONPATH=. python3 benchmarks/lab/dequant_slices_sweep.py --json sweep.jsonl
"""
import argparse
import json

import numpy as np
import torch

from gemm_quant_sweep import part, timed  # the same weights and timing (this folder)
from llama_brrr import _C as C

STORE_F32, ADD_RESIDUAL, SWIGLU = 1, 2, 3
TYPE_IDS = {"q4_k": 12, "q6_k": 14}
# name: ([(type, rows), ...], K, epilogue)
MATRICES = {
    "wqkv": ([("q4_k", 5120), ("q6_k", 1024)], 4096, STORE_F32),
    "wo": ([("q4_k", 4096)], 4096, ADD_RESIDUAL),
    "w13": ([("q4_k", 28672)], 4096, SWIGLU),
    "w2": ([("q6_k", 4096)], 14336, ADD_RESIDUAL),
    "1b_wqkv": ([("q4_k", 2560), ("q6_k", 512)], 2048, STORE_F32),
    "1b_wo": ([("q4_k", 2048)], 2048, ADD_RESIDUAL),
    "1b_w13": ([("q4_k", 16384)], 2048, SWIGLU),
    "1b_w2": ([("q6_k", 2048)], 8192, ADD_RESIDUAL),
}
FRACTIONS = (0.5, 1.0, 2.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="320,512,1024,2048")
    ap.add_argument("--matrices", default=",".join(MATRICES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    T = C.testing
    rng = np.random.default_rng(0)
    props = torch.cuda.get_device_properties(0)
    l2_values = props.L2_cache_size // 2
    floats, counters = T.gemm_split_scratch_sizes(props.multi_processor_count)
    partials = torch.empty(floats, dtype=torch.float32, device="cuda")
    counts = torch.zeros(counters, dtype=torch.int32, device="cuda")
    split = (partials.data_ptr(), floats, counts.data_ptr(), counters)
    rows = [int(m) for m in a.rows.split(",")]
    out = open(a.json, "w") if a.json else None
    head = " ".join(f"{f:>4.1f} L2 us (cols)" for f in FRACTIONS)
    print(f"{'matrix':8s} {'M':>5s} {'whole us':>9s} {head}")
    for mname in a.matrices.split(","):
        spec, K, ep = MATRICES[mname]
        parts = [(TYPE_IDS[t], part(t, n, K, rng), n) for t, n in spec]
        N = sum(n for _, _, n in parts)
        width = N // 2 if ep == SWIGLU else N
        scratch = torch.empty((max(N * K, int(max(FRACTIONS) * l2_values)),), dtype=torch.bfloat16, device="cuda")
        x_all = torch.randn((max(rows), K), device="cuda").to(torch.bfloat16)
        if ep == SWIGLU:
            y = torch.empty((max(rows), width), dtype=torch.bfloat16, device="cuda")
            dest = {"out": y.data_ptr()}
        elif ep == ADD_RESIDUAL:
            y = torch.zeros((max(rows), width), dtype=torch.float32, device="cuda")
            dest = {"residual": y.data_ptr()}
        else:
            y = torch.empty((max(rows), width), dtype=torch.float32, device="cuda")
            dest = {"out_f32": y.data_ptr()}
        plist = [(t, w.data_ptr(), n) for t, w, n in parts]

        for M in rows:
            def sliced(elems):
                return [lambda: T.gemm_dequant_slices(plist, x_all.data_ptr(), M, N, K, ep, split=split,
                                                      scratch=scratch.data_ptr(), scratch_elems=elems, **dest)]

            rec = {"matrix": mname, "M": M, "N": N, "K": K, "epilogue": ep, "gpu": torch.cuda.get_device_name(),
                   "l2_bytes": props.L2_cache_size, "whole_us": round(timed(sliced(N * K), a.reps), 1)}
            cells = []
            for f in FRACTIONS:
                elems = int(f * l2_values)
                cols = T.gemm_dequant_slice_cols(M, N, K, ep, elems)
                t = timed(sliced(elems), a.reps)
                rec[f"slices_{f}_us"], rec[f"slices_{f}_cols"] = round(t, 1), cols
                rec[f"slices_{f}_over_whole"] = round(t / rec["whole_us"], 3)
                cells.append(f"{t:9.1f} ({cols:5d})")
            print(f"{mname:8s} {M:5d} {rec['whole_us']:9.1f} {' '.join(cells)}", flush=True)
            if out:
                out.write(json.dumps(rec) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
