"""gemv_quant_wgmma under Nsight Compute, StoreBf16 epilogue: the cases named on the command line as
type:N:K:M (default: the 8B's Q4_K w13 at 17 and 32 rows and its Q6_K w2 at 32), NCU_LAUNCHES
launches each (2 unless set) on one weight copy with the planes the engine would lend (ncu
flushes the caches before each pass by default); no torch.profiler, which cannot share CUPTI with
ncu. Imports the extension of its own tree. Run from a tree's root:
  ncu --clock-control none --kernel-name regex:gemv_quant_wgmma_kernel --launch-count 4 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section MemoryWorkloadAnalysis --section InstructionStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
      python3 benchmarks/lab/gemv_quant_wgmma_ncu.py q4_k:28672:4096:17 q4_k:28672:4096:32
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_quant_sweep import STORE_BF16, part  # noqa: E402
from llama_brrr import _C as C  # noqa: E402
from llama_brrr import quant  # noqa: E402

CASES = sys.argv[1:] or ["q4_k:28672:4096:17", "q4_k:28672:4096:32", "q6_k:4096:14336:32"]
LAUNCHES = int(os.environ.get("NCU_LAUNCHES", "2"))

T = C.testing
assert T.gemm_quant_available(), "gemv_quant_wgmma needs a Hopper GPU"
ids = quant.kept_types()
rng = np.random.default_rng(0)
for case in CASES:
    name, N, K, M = case.split(":")
    N, K, M = int(N), int(K), int(M)
    w = part(name, N, K, rng)
    x = torch.randn((M, K), device="cuda").to(torch.bfloat16)
    y = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
    floats = T.gemv_quant_wgmma_plane_floats(M, N, K)
    planes = torch.empty(floats, dtype=torch.float32, device="cuda")
    for _ in range(LAUNCHES):
        T.gemv_quant_wgmma([(ids[name], w.data_ptr(), N)], x.data_ptr(), M, N, K, STORE_BF16, planes=planes.data_ptr(),
                           plane_floats=floats, out=y.data_ptr())
    torch.cuda.synchronize()
    assert torch.isfinite(y.float()).all(), f"{case}: non-finite output"
    print(case, "ok", flush=True)
