"""Microbenchmark of the quantized CPU kernels (_C.quant_ops) against the bf16 and f32 matmul of
cpu_ops.matmul on SmolLM2-135M shapes (dim 576, hidden 1536, vocab 49152), one thread count.

--m 1 (default): the decode GEMV on ffn up / ffn down / LM head. --m 512: the prefill GEMM on the
engine's fused matrices (wqkv 960 x 576, wo 576 x 576, w13 3072 x 576, w2 576 x 1536, LM head
49152 x 576) with isa="auto" (AMX tiles where the CPU has them).

Figure: time per call, median over --repeats with min and max, and the ratio bf16 time / this
time (and f32 time / this time) at the same shape. The formats of one shape are timed round-robin
(one call of each per repeat), so a busy neighbour slows them alike. Each call is timed from Python
(perf_counter around `--inner` calls, so the binding overhead of a few microseconds is included on
both sides). For the GEMV, GB/s of weights streamed = the bytes of the weight matrix in that format
(blocks with their scales) / median time. K-quants need K % 256 == 0, so they run only where K = 1536.
Random weights N(0, 0.02), quantized by quant_ops.quantize; activations N(0, 1).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_quant_cpu.py --threads 1
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_quant_cpu.py --threads 1 --m 512 --inner 1
"""

import argparse
import json
import os
import time

import numpy as np

GEMV_SHAPES = {  # name: (N, K)
    "ffn_up (w1 or w3)": (1536, 576),
    "ffn_down (w2)": (576, 1536),
    "lm_head": (49152, 576),
}
GEMM_SHAPES = {
    "wqkv": (960, 576),
    "wo": (576, 576),
    "w13": (3072, 576),
    "w2": (576, 1536),
    "lm_head": (49152, 576),
}
TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
BLOCK_ELEMS = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256}


def timed_round_robin(fns, inner, repeats):
    """fns: {name: fn}. One call of each (warm-up), then `repeats` rounds timing each in turn."""
    for fn in fns.values():
        fn()
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[k].append((time.perf_counter() - t0) / inner)
    return {k: (float(np.median(v)), float(np.min(v)), float(np.max(v))) for k, v in samples.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--m", type=int, default=1, help="rows of X: 1 = decode GEMV, > 1 = prefill GEMM")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--inner", type=int, default=20)
    p.add_argument("--types", default=",".join(TYPES), help="comma-separated quantized types")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    if os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        print(f"note: OMP_NUM_THREADS is {os.environ.get('OMP_NUM_THREADS')!r}; cpu_ops.matmul uses "
              f"OpenMP's default, so set OMP_NUM_THREADS={args.threads} for a like-for-like run")
    from llama_brrr import _C
    Q, ops = _C.quant_ops, _C.cpu_ops
    rng = np.random.default_rng(0)
    M = args.m
    types = [t for t in args.types.split(",") if t]
    print(f"quant isa: {Q.best_isa()}  ({Q.cpu_features()}), threads {args.threads}, M = {M}")
    rows = []
    print(f"{'shape':<18} {'format':<6} {'bytes':>10} {'us/call':>10} {'(min-max)':>21} {'GB/s':>7} "
          f"{'x bf16':>7} {'x f32':>7}")
    for shape, (N, K) in (GEMV_SHAPES if M == 1 else GEMM_SHAPES).items():
        w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        X = rng.standard_normal((M, K)).astype(np.float32)
        inner = max(1, args.inner // (8 if N * M > 10000 * 64 or N > 10000 else 1))
        bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for timing
        out = np.empty((M, N), np.float32)
        fns, nbytes = {}, {}
        for fmt, arr in (("f32", w), ("bf16", bf16)):
            fns[fmt] = (lambda arr=arr, fmt=fmt: ops.matmul(X, arr, w_dtype=fmt, out=out))
            nbytes[fmt] = arr.nbytes
        for t in types:
            if K % BLOCK_ELEMS[t]:
                continue
            blocks = Q.quantize(t, w)
            nbytes[t] = blocks.nbytes
            if M == 1:
                y = np.empty(N, np.float32)
                fns[t] = (lambda t=t, blocks=blocks, y=y: Q.gemv(t, blocks, X[0], n_threads=args.threads, out=y))
            else:
                fns[t] = (lambda t=t, blocks=blocks: Q.gemm(t, blocks, X, n_threads=args.threads, out=out))
        times = timed_round_robin(fns, inner, args.repeats)
        for fmt, (med, lo, hi) in times.items():
            r = dict(shape=shape, M=M, N=N, K=K, format=fmt, bytes=nbytes[fmt], us=med * 1e6, us_min=lo * 1e6,
                     us_max=hi * 1e6, gbps=nbytes[fmt] / med / 1e9, speedup_vs_bf16=times["bf16"][0] / med,
                     speedup_vs_f32=times["f32"][0] / med)
            rows.append(r)
            print(f"{shape:<18} {fmt:<6} {r['bytes']:>10} {r['us']:>10.1f} "
                  f"{'(' + format(r['us_min'], '.1f') + '-' + format(r['us_max'], '.1f') + ')':>21} "
                  f"{r['gbps']:>7.2f} {r['speedup_vs_bf16']:>7.2f} {r['speedup_vs_f32']:>7.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(threads=args.threads, M=M, isa=Q.best_isa(), features=Q.cpu_features(), rows=rows,
                           command=f"OMP_NUM_THREADS={args.threads} PYTHONPATH=. python benchmarks/bench_quant_cpu.py "
                                   f"--threads {args.threads} --m {M} --repeats {args.repeats} --inner {args.inner}"),
                      f, indent=1)


if __name__ == "__main__":
    main()
