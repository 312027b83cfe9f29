"""gemm_quant under Nsight Compute, StoreBf16 epilogue: the cases named on the command line as
type:N:K:M (default: the 8B's Q4_K w13 and Q6_K LM head at 64 rows), NCU_LAUNCHES launches each
(2 unless set) on one weight copy, with the engine's split-K scratch; no torch.profiler, which
cannot share CUPTI with ncu. Imports the extension of its own tree. Run from a tree's root:
  ncu --clock-control none --kernel-name regex:gemm_sm90_kernel --launch-count 4 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section MemoryWorkloadAnalysis --section InstructionStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
      python3 benchmarks/lab/gemm_quant_ncu.py q4_k:28672:4096:64 q6_k:128256:4096:64
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_quant_sweep import STORE_BF16, TYPE_IDS, part, split_scratch  # noqa: E402
from llama_brrr import _C as C  # noqa: E402

CASES = sys.argv[1:] or ["q4_k:28672:4096:64", "q6_k:128256:4096:64"]
LAUNCHES = int(os.environ.get("NCU_LAUNCHES", "2"))

T = C.testing
assert T.gemm_quant_available(), "gemm_quant needs a Hopper GPU"
rng = np.random.default_rng(0)
split, _scratch = split_scratch(T)
for case in CASES:
    name, N, K, M = case.split(":")
    N, K, M = int(N), int(K), int(M)
    w = part(name, N, K, rng)
    x = torch.randn((M, K), device="cuda").to(torch.bfloat16)
    y = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
    for _ in range(LAUNCHES):
        T.gemm_quant([(TYPE_IDS[name], w.data_ptr(), N)], x.data_ptr(), M, N, K, STORE_BF16, out=y.data_ptr(),
                     split=split)
    torch.cuda.synchronize()
    print(case, "ok", flush=True)
