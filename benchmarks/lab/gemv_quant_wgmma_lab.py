"""The Q4_K GEMV at 9-16 rows on the warpgroup MMA (benchmarks/lab/cuda_gemv_quant_wgmma_lab.cu: W
decoded into wgmma's A registers, x staged once per CTA in shared memory) beside the engine's
gemv_quant_mma (testing.gemv_quant_mma, mma.sync) on the same repacked weights, x and M, in one
process on one Hopper GPU, with a same-size device copy as the yardstick. Past 16 rows (up to 64)
the lab stages 64 x rows (wgmma.m64n64k16, SHAPES_64's configurations) and the engine's own path
at those rows, gemm_quant (testing.gemm_quant, StoreF32), is timed beside it too; there --type
q6_k runs the lab's Q6_K form (SHAPES_64_Q6_K: it needs more registers than 4 warpgroups leave).

Each configuration (warpgroups a CTA, k slices, CTAs an SM) is checked before its time counts: the
first 64 rows against float64 of the decoded weights times x (gpu_gemv_quant_bench.check_mma's
reference and bound), every output finite (outputs NaN-poisoned first) and within 1e-3 of the
largest |y| of the engine's result for the same call. Times are device time per call from
torch.profiler kernel durations (a k-sliced call counts its add_planes kernel too), median of
--repeats, weights rotating among enough copies to defeat L2.

    python benchmarks/lab/gemv_quant_wgmma_lab.py --out /tmp/wgmma_lab.json      # Hopper GPU

--ncu WG,KS,CPS,FORM only launches that configuration (and the engine's kernel) twice each on the
first shape of --shapes at the first of --rows, untimed, for Nsight Compute (which cannot share
CUPTI with torch.profiler):
    ncu --clock-control none --kernel-name regex:"q4k_wgmma|gemv_quant_mma_kernel" --launch-count 4 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
        python3 benchmarks/lab/gemv_quant_wgmma_lab.py --shapes w13 --rows 16 --ncu 4,1,1,0
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

LAB = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(LAB))
for p in (ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests"), LAB):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_kernels import STORE_F32, copies_to_defeat_l2, device_times, random_bf16, same_size_copy  # noqa: E402
from gemm_quant_sweep import split_scratch  # noqa: E402
from gpu_gemv_quant_bench import TYPES, check_mma, packed_weights  # noqa: E402
from mma_decode_ref import decode_slack  # noqa: E402

# Forms (the library's `form` argument): 0 one W tile ahead a lane, one wgmma group left in flight;
# 1 two tiles ahead; 2 two groups in flight; 3 form 0 without x's staging (timing only: its results
# are wrong and not checked).
FORMS = {0: "pf1", 1: "pf2", 2: "wait2", 3: "no-stage"}
# (proj, N, K, configurations (warpgroups a CTA, k slices, CTAs an SM, form))
SHAPES = [
    ("wqkv", 6144, 4096, [(2, 4, 2, 0), (2, 4, 2, 1), (1, 4, 4, 1)]),
    ("wo", 4096, 4096, [(2, 8, 3, 0), (2, 8, 3, 1), (2, 4, 2, 1)]),
    ("w13", 28672, 4096, [(4, 1, 1, 0), (4, 1, 1, 1), (4, 1, 1, 3), (4, 2, 1, 1), (2, 4, 2, 1), (1, 4, 4, 1)]),
    ("w2", 4096, 14336, [(4, 7, 1, 0), (4, 7, 1, 1), (4, 7, 1, 3)]),
    ("lm_head", 128256, 4096, [(4, 1, 1, 0), (4, 1, 1, 1), (4, 1, 1, 3), (2, 2, 2, 1)]),
]
# 64 staged x rows take 8 KB of shared memory per 64 k, so a CTA holds at most 2048 k of x: K is
# cut into 4+ slices (PF = 2 spills at 4 warpgroups).
SHAPES_64 = {
    "wqkv": [(2, 8, 2, 0), (4, 4, 1, 0), (2, 8, 2, 1)],
    "wo": [(2, 8, 2, 0), (1, 8, 4, 0), (2, 8, 2, 1)],
    "w13": [(4, 4, 1, 0), (4, 8, 1, 0), (2, 8, 2, 0), (2, 8, 2, 1), (4, 4, 1, 3)],
    "w2": [(4, 14, 1, 0), (2, 28, 2, 0), (2, 28, 2, 1)],
    "lm_head": [(4, 4, 1, 0), (4, 8, 1, 0), (2, 8, 2, 1)],
}
SHAPES_64_Q6_K = {
    "wqkv": [(3, 4, 1, 0), (2, 8, 1, 0)],
    "wo": [(2, 8, 1, 0), (3, 4, 1, 0)],
    "w13": [(3, 4, 1, 0), (2, 4, 1, 0), (4, 4, 1, 0)],
    "w2": [(3, 14, 1, 0), (2, 14, 1, 0), (4, 14, 1, 0)],
    "lm_head": [(3, 4, 1, 0), (2, 4, 1, 0), (4, 4, 1, 0)],
}


def build(out_dir):
    lib = os.path.join(out_dir, "wgmma_lab.so")
    cmd = ["nvcc", "-O3", "-std=c++17", "-I" + os.path.join(ROOT, "csrc"), "-gencode=arch=compute_90a,code=sm_90a",
           "-Xptxas", "-v", "-Xcompiler", "-fPIC", "-shared", "-o", lib,
           os.path.join(LAB, "cuda_gemv_quant_wgmma_lab.cu")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(out_dir, "wgmma_lab_build.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit("nvcc failed:\n" + r.stderr[-3000:])
    return ctypes.CDLL(lib)


def check_lab(name, y, y_eng, deq, blocks, x, what):
    """y (the lab's) against float64 of the decoded weights x x on the first rows, and against the
    engine's y everywhere."""
    rows = deq.shape[0]
    K = deq.shape[1]
    slack = decode_slack(name, blocks, deq)
    xd = x.double().cpu().numpy()
    ref = xd @ deq.T
    bound = (K / 128 + 16) * 2.0 ** -22 * (np.abs(xd) @ (np.abs(deq) + slack).T) + np.abs(xd) @ slack.T
    got = y[:, :rows].double().cpu().numpy()
    if not torch.isfinite(y).all():
        raise SystemExit(f"{what}: non-finite outputs")
    if (np.abs(got - ref) > bound).any():
        bad = np.argwhere(np.abs(got - ref) > bound)[:5]
        raise SystemExit(f"{what}: off the float64 reference at {bad.tolist()}: got {got[tuple(bad[0])]}, "
                         f"ref {ref[tuple(bad[0])]}, bound {bound[tuple(bad[0])]}")
    diff = (y - y_eng).abs().max().item()
    if diff > 1e-3 * y_eng.abs().max().item():
        raise SystemExit(f"{what}: differs from the engine's result by {diff}")
    return diff


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="16,8")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--ncu", default=None, help="WG,KS,CPS,FORM: launches only, for Nsight Compute")
    ap.add_argument("--type", default="q4_k", choices=["q4_k", "q6_k"], help="q6_k: past 16 rows only")
    args = ap.parse_args(argv)
    import llama_brrr._C as C

    out_dir = os.path.dirname(os.path.abspath(args.out)) if args.out else tempfile.mkdtemp()
    lib = build(out_dir)
    lib.q4k_wgmma_launch.restype = ctypes.c_int
    rng = np.random.default_rng(7)
    name = args.type
    results = []
    for proj, N, K, configs in SHAPES:
        if proj not in args.shapes.split(","):
            continue
        first, deq, blocks = packed_weights(C, name, N, K, rng)
        weights = [first] + [first.clone() for _ in range(copies_to_defeat_l2(first.numel()) - 1)]
        if args.ncu:
            wg, ks, cps, form = (int(v) for v in args.ncu.split(","))
            M = int(args.rows.split(",")[0])
            nr = 16 if M <= 16 else 64
            x = random_bf16((M, K))
            y = torch.zeros((M, N), device="cuda")
            part = torch.zeros((ks, M, N), device="cuda")
            for _ in range(2):
                C.testing.gemv_quant_mma(TYPES[name], first.data_ptr(), x.data_ptr(), M, N, K, STORE_F32,
                                         out_f32=y.data_ptr())
                rc = lib.q4k_wgmma_launch(ctypes.c_void_p(first.data_ptr()), ctypes.c_void_p(x.data_ptr()),
                                          ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(part.data_ptr()), M, N, K,
                                          wg, ks, cps, form, nr, TYPES[name])
                if rc:
                    raise SystemExit(f"q4k_wgmma_launch returned {rc}")
            torch.cuda.synchronize()
            print(f"ncu launches of {proj} M={M} ({args.ncu}) done")
            return
        for M in [int(m) for m in args.rows.split(",")]:
            nr = 16 if M <= 16 else 64
            x = random_bf16((M, K))
            check_mma(C, name, first, deq, blocks, x, M, N, K)
            y_eng = torch.full((M, N), float("nan"), device="cuda")
            C.testing.gemv_quant_mma(TYPES[name], first.data_ptr(), x.data_ptr(), M, N, K, STORE_F32,
                                     out_f32=y_eng.data_ptr())
            y = torch.zeros((M, N), device="cuda")

            def run_eng(i):
                C.testing.gemv_quant_mma(TYPES[name], weights[i % len(weights)].data_ptr(), x.data_ptr(), M, N, K,
                                         STORE_F32, out_f32=y.data_ptr())
            t_eng = device_times(run_eng, args.repeats)
            moved = first.numel() + M * K * 2 + M * N * 4
            copy = same_size_copy(weights, moved, args.repeats)
            row = {"proj": proj, "type": name, "M": M, "N": N, "K": K, "bytes": moved, "engine": t_eng,
                   "copy_same_bytes": copy, "engine_frac_of_copy": moved / t_eng["median_s"] / copy["Bps"],
                   "lab": []}
            print(f"{proj:8s} {name} M={M:2d} {N}x{K}: engine {t_eng['median_s'] * 1e6:7.1f} us "
                  f"({row['engine_frac_of_copy'] * 100:.0f}% of copy)", flush=True)
            if nr == 64:
                split, _scratch = split_scratch(C.testing)

                def run_gemm(i):
                    C.testing.gemm_quant([(TYPES[name], weights[i % len(weights)].data_ptr(), N)], x.data_ptr(), M,
                                         N, K, STORE_F32, out_f32=y.data_ptr(), split=split)
                t_gemm = device_times(run_gemm, args.repeats)
                row["gemm_quant"] = t_gemm
                print(f"    gemm_quant (the engine's path at {M} rows): {t_gemm['median_s'] * 1e6:7.1f} us", flush=True)
            if nr == 16 and name != "q4_k":
                raise SystemExit("the 16-row form is Q4_K only")
            for wg, ks, cps, form in (configs if nr == 16 else (SHAPES_64 if name == "q4_k" else SHAPES_64_Q6_K)[proj]):
                part = torch.zeros((ks, M, N), device="cuda") if ks > 1 else y
                yl = torch.full((M, N), float("nan"), device="cuda")

                def launch(w, out):
                    rc = lib.q4k_wgmma_launch(ctypes.c_void_p(w.data_ptr()), ctypes.c_void_p(x.data_ptr()),
                                              ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(part.data_ptr()),
                                              M, N, K, wg, ks, cps, form, nr, TYPES[name])
                    if rc:
                        raise SystemExit(f"q4k_wgmma_launch({proj}, wg={wg}, ks={ks}, cps={cps}, form={form}) "
                                         f"returned {rc}")
                launch(first, yl)
                torch.cuda.synchronize()
                what = f"wgmma {proj} M={M} wg={wg} ks={ks} cps={cps} {FORMS[form]}"
                diff = None if FORMS[form] == "no-stage" else check_lab(name, yl, y_eng, deq, blocks, x, what)
                t = device_times(lambda i: launch(weights[i % len(weights)], y), args.repeats)
                frac = moved / t["median_s"] / copy["Bps"]
                row["lab"].append({"wg": wg, "ks": ks, "ctas_per_sm": cps, "form": FORMS[form], "time": t, "frac_of_copy": frac,
                                   "max_abs_diff_vs_engine": diff,
                                   "speedup_vs_engine": t_eng["median_s"] / t["median_s"]})
                print(f"    wg={wg} ks={ks:2d} cps={cps} {FORMS[form]:8s}: {t['median_s'] * 1e6:7.1f} us ({frac * 100:.0f}% of copy, "
                      f"{t_eng['median_s'] / t['median_s']:.2f}x engine)", flush=True)
            results.append(row)
        weights = first = None
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
