"""Microbenchmark of the quantized CPU GEMV (_C.quant_ops.gemv) against the bf16 and f32 GEMV of
cpu_ops.matmul on SmolLM2-135M decode shapes (dim 576, hidden 1536, vocab 49152), one thread count.

Figure: GB/s of weights streamed (the bytes the weight matrix takes in that format, blocks with
their scales) = bytes / (median time per call), and the time ratio against bf16 at the same
shape. Each call is timed from Python (perf_counter around `--inner` calls, so the per-call
binding overhead of a few microseconds is included on both sides); median over --repeats with
the min and max. K-quants need K % 256 == 0, so on these shapes they run only where K = 1536.

    OMP_NUM_THREADS=2 python benchmarks/bench_quant_cpu.py --threads 2
"""

import argparse
import json
import os
import time

import numpy as np

SHAPES = {  # name: (N, K)
    "ffn_up (w1 or w3)": (1536, 576),
    "ffn_down (w2)": (576, 1536),
    "lm_head": (49152, 576),
}
TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
BLOCK_ELEMS = {"q8_0": 32, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q4_k": 256, "q5_k": 256, "q6_k": 256}


def timed(fn, inner, repeats):
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    s = np.array(samples)
    return float(np.median(s)), float(s.min()), float(s.max())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--inner", type=int, default=20)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    if os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        print(f"note: OMP_NUM_THREADS is {os.environ.get('OMP_NUM_THREADS')!r}; cpu_ops.matmul uses "
              f"OpenMP's default, so set OMP_NUM_THREADS={args.threads} for a like-for-like run")
    from llama_brrr import _C
    Q, ops = _C.quant_ops, _C.cpu_ops
    rng = np.random.default_rng(0)
    print(f"quant isa: {Q.best_isa()}  ({Q.cpu_features()}), threads {args.threads}")
    rows = []
    header = f"{'shape':<20} {'format':<6} {'bytes':>10} {'us/call':>9} {'(min-max)':>17} {'GB/s':>7} {'x bf16':>7}"
    print(header)
    for shape, (N, K) in SHAPES.items():
        w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        x = rng.standard_normal(K).astype(np.float32)
        x2 = x[None, :].copy()
        inner = max(2, args.inner // (8 if N > 10000 else 1))
        bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for timing
        out = np.empty((1, N), np.float32)
        base = {}
        for fmt, arr in (("f32", w), ("bf16", bf16)):
            med, lo, hi = timed(lambda: ops.matmul(x2, arr, w_dtype=fmt, out=out), inner, args.repeats)
            base[fmt] = med
            rows.append(dict(shape=shape, N=N, K=K, format=fmt, bytes=arr.nbytes, us=med * 1e6,
                             us_min=lo * 1e6, us_max=hi * 1e6, gbps=arr.nbytes / med / 1e9))
        for t in TYPES:
            if K % BLOCK_ELEMS[t]:
                continue
            blocks = Q.quantize(t, w)
            y = np.empty(N, np.float32)
            med, lo, hi = timed(lambda: Q.gemv(t, blocks, x, n_threads=args.threads, out=y), inner, args.repeats)
            rows.append(dict(shape=shape, N=N, K=K, format=t, bytes=blocks.nbytes, us=med * 1e6,
                             us_min=lo * 1e6, us_max=hi * 1e6, gbps=blocks.nbytes / med / 1e9))
        for r in rows:
            if r["shape"] == shape:
                r["speedup_vs_bf16"] = base["bf16"] / (r["us"] * 1e-6)
                print(f"{shape:<20} {r['format']:<6} {r['bytes']:>10} {r['us']:>9.1f} "
                      f"{'(' + format(r['us_min'], '.1f') + '-' + format(r['us_max'], '.1f') + ')':>17} "
                      f"{r['gbps']:>7.2f} {r['speedup_vs_bf16']:>7.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(threads=args.threads, isa=Q.best_isa(), features=Q.cpu_features(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
