"""What each engine form of the one-row quantized GEMV costs: gemv_quant at M = 1 on the Llama-3-8B
projections, the same weights timed as

  blocks        ActBlock input (made by a separate quantizer, not timed), plain fp32 store: the form
                gpu_gemv_quant_bench.py times, a grid of many 4-warp CTAs
  blocks_swiglu the same input with the SwiGLU epilogue (w13: gate row j with up row N/2 + j a warp)
  norm          fp32 rows RMS-normalized and quantized by every CTA of a one-wave grid (the engine's
                wqkv / w13 input), plain store
  norm_swiglu   that input with SwiGLU: the engine's w13 kernel
  bf16          bf16 rows quantized by every CTA of a one-wave grid (the engine's wo / w2 input)
  bf16_residual that input with AddResidual: the engine's wo / w2 kernel

The fused forms get the engine's unit counters (QuantGemvInput::counters) where the extension has
them (testing.gemv_quant_counter_words), so a grid of many rounds is fed as in the engine. Beside
a same-size device copy, all in one run on one GPU: device time per call from torch.profiler
(bench_kernels.device_times), the median of --repeats calls, weights rotating among enough copies
to defeat L2. Weights are real blocks (Gaussian rows quantized by the CPU quantizer); x is Gaussian.
Before any time counts, each form's result is checked: the plain ActBlock form against the float64
reference (gpu_gemv_quant_bench.check); the fused inputs against the ActBlock form on the
standalone quantizers' blocks (the same bits by design, so the same fp32 sums: equal bit for bit);
SwiGLU against silu(gate) * up of the plain form's sums (within a bf16 rounding); AddResidual
against residual + the plain sums (within fp32 rounding).

    python3 benchmarks/lab/gemv_quant_forms.py --types q4_k,q6_k,q8_0 --out /tmp/forms.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

LAB = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, LAB)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpu_gemv_quant_bench as gb  # noqa: E402  (puts the tree, benchmarks and tests on sys.path)
from bench_kernels import (ADD_RESIDUAL, STORE_F32, SWIGLU, copies_to_defeat_l2, device_times,  # noqa: E402
                           random_bf16, same_size_copy)

SHAPES = [("wqkv", 6144, 4096), ("wo", 4096, 4096), ("w13", 28672, 4096), ("w2", 4096, 14336)]
EPS = 1e-5


def forms_of(proj):
    if proj == "w13":
        return ["blocks", "blocks_swiglu", "norm", "norm_swiglu"]
    if proj == "wqkv":
        return ["blocks", "norm"]
    return ["blocks", "bf16", "bf16_residual"]


def fail(msg):
    raise SystemExit(f"gemv_quant_forms: {msg}; no timing counts")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="q4_k,q6_k,q8_0")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("gemv_quant_forms: no CUDA device visible to torch")
    from llama_brrr import _C as C
    rng = np.random.default_rng(args.seed)
    names = args.types.split(",")
    fed = {}
    if hasattr(C.testing, "gemv_quant_counter_words"):
        counters = torch.zeros(C.testing.gemv_quant_counter_words(), dtype=torch.int32, device="cuda")
        fed = {"counters": counters.data_ptr()}
    rows = []
    for proj, N, K in SHAPES:
        x_f32 = torch.randn((1, K), device="cuda")
        norm_w = random_bf16((K,), 1.0)
        x_bf16 = random_bf16((1, K))
        residual0 = torch.randn((1, N), device="cuda")
        xq_norm = torch.empty((1, K // 32 * 48), dtype=torch.uint8, device="cuda")
        C.testing.rmsnorm_quantize_act(x_f32.data_ptr(), norm_w.data_ptr(), EPS, xq_norm.data_ptr(), 1, K)
        xq_bf16 = torch.empty_like(xq_norm)
        C.testing.quantize_act_bf16(x_bf16.data_ptr(), xq_bf16.data_ptr(), 1, K)
        for name in names:
            first, deq, _ = gb.packed_weights(C, name, N, K, rng)
            gb.check(C, name, first, deq, xq_bf16, 1, N, K)  # the ActBlock form against float64
            weights = [first] + [first.clone() for _ in range(copies_to_defeat_l2(first.numel()) - 1)]
            t = gb.TYPES[name]
            y = torch.empty((1, N), device="cuda")
            hb = torch.empty((1, N // 2), dtype=torch.bfloat16, device="cuda")
            res = torch.empty((1, N), device="cuda")

            def call(form, w, fill=None):
                if fill is not None:
                    for buf in (y, hb, res):
                        buf.fill_(fill)
                if form == "bf16_residual" and fill is not None:
                    res.copy_(residual0)
                xq = xq_norm if proj in ("w13", "wqkv") else xq_bf16  # the blocks of the fused forms' input
                if form == "blocks":
                    C.testing.gemv_quant(t, w, xq.data_ptr(), 1, N, K, STORE_F32, out_f32=y.data_ptr())
                elif form == "blocks_swiglu":
                    C.testing.gemv_quant(t, w, xq.data_ptr(), 1, N, K, SWIGLU, out=hb.data_ptr())
                elif form == "norm":
                    C.testing.gemv_quant(t, w, 0, 1, N, K, STORE_F32, out_f32=y.data_ptr(), x_f32=x_f32.data_ptr(),
                                         norm_w=norm_w.data_ptr(), eps=EPS, **fed)
                elif form == "norm_swiglu":
                    C.testing.gemv_quant(t, w, 0, 1, N, K, SWIGLU, out=hb.data_ptr(), x_f32=x_f32.data_ptr(),
                                         norm_w=norm_w.data_ptr(), eps=EPS, **fed)
                elif form == "bf16":
                    C.testing.gemv_quant(t, w, 0, 1, N, K, STORE_F32, out_f32=y.data_ptr(), x=x_bf16.data_ptr(), **fed)
                elif form == "bf16_residual":
                    C.testing.gemv_quant(t, w, 0, 1, N, K, ADD_RESIDUAL, residual=res.data_ptr(), x=x_bf16.data_ptr(),
                                         **fed)

            # results first: every form against the plain ActBlock form of the same input
            w0 = first.data_ptr()
            call("blocks", w0, fill=float("nan"))
            ref = y.clone()
            if not torch.isfinite(ref).all():
                fail(f"{name} {proj}: the ActBlock form gave non-finite sums")
            row = {"proj": proj, "type": name, "N": N, "K": K, "bytes": first.numel()}
            for form in forms_of(proj)[1:]:
                call(form, w0, fill=float("nan"))
                if form in ("norm", "bf16"):
                    row[f"{form}_bit_equal"] = bool(torch.equal(y, ref))
                    if not ((y - ref).abs() <= 2.0 ** -16 * ref.abs().max()).all():
                        fail(f"{name} {proj} {form}: off the ActBlock form on the same blocks")
                elif form.endswith("swiglu"):
                    g, u = ref[0, :N // 2], ref[0, N // 2:]
                    want = (g * torch.sigmoid(g) * u)
                    got = hb[0].float()
                    if not (torch.isfinite(got).all() and
                            ((got - want).abs() <= 2.0 ** -7 * want.abs() + 1e-6 * want.abs().max()).all()):
                        fail(f"{name} {proj} {form}: off silu(gate) * up of the plain sums")
                else:
                    want = residual0 + ref
                    if not ((res - want).abs() <= 2.0 ** -20 * (residual0.abs() + ref.abs()) + 1e-30).all():
                        fail(f"{name} {proj} {form}: off residual + the plain sums")
            for form in forms_of(proj):
                row[form] = device_times(lambda i, f=form: call(f, weights[i % len(weights)].data_ptr()),
                                         args.repeats)
            row["copy_same_bytes"] = same_size_copy(weights, first.numel(), args.repeats)
            rows.append(row)
            cells = "  ".join(f"{f} {row[f]['median_s'] * 1e6:6.1f}" for f in forms_of(proj))
            print(f"{proj:5s} {name:5s} {N:6d}x{K:5d}  us: {cells}  copy {row['copy_same_bytes']['median_s'] * 1e6:6.1f}",
                  flush=True)
            weights = first = None
            torch.cuda.empty_cache()
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "repeats": args.repeats,
              "fed_by_counters": bool(fed),
              "seed": args.seed, "command": "python3 benchmarks/lab/gemv_quant_forms.py " + " ".join(argv or sys.argv[1:]),
              "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
