"""gemv_quant_mma under Nsight Compute, plain epilogue: the cases named on the command line as
type:N:K:M (default: Q6_K w2 and Q4_K w13 of the 8B at 16 rows), NCU_LAUNCHES launches each (3
unless set) on one weight copy (ncu flushes the caches before each pass by default: compare trees,
not against the copy rate); no torch.profiler, which cannot share CUPTI with ncu. Imports the
extension of its own tree (the bench module puts that tree first on sys.path). Run from a tree's
root:
  ncu --clock-control none --kernel-name regex:gemv_quant_mma_kernel --launch-count 6 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats \
      python3 benchmarks/lab/gemv_quant_mma_ncu.py q4_k:4096:14336:16 q4_k:4096:4096:2
The stall reasons (the sections print only their sum, "Warp Cycles Per Issued Instruction"): add
  --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_gemv_quant_bench as gb  # noqa: E402
from llama_brrr import _C as C  # noqa: E402

CASES = sys.argv[1:] or ["q6_k:4096:14336:16", "q4_k:28672:4096:16"]
LAUNCHES = int(os.environ.get("NCU_LAUNCHES", "3"))

rng = np.random.default_rng(0)
for case in CASES:
    name, N, K, M = case.split(":")
    N, K, M = int(N), int(K), int(M)
    packed, _, _ = gb.packed_weights(C, name, N, K, rng)
    x = gb.random_bf16((M, K))
    y = torch.zeros((M, N), device="cuda")
    for _ in range(LAUNCHES):
        C.testing.gemv_quant_mma(gb.TYPES[name], packed.data_ptr(), x.data_ptr(), M, N, K, gb.STORE_F32,
                                 out_f32=y.data_ptr())
    torch.cuda.synchronize()
    print(case, "ok", flush=True)
