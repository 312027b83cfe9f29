"""decode_breakdown.py — where a batch-1 decode token goes beyond the decode graph itself.

Times, per token, on random weights of each shape (128-token prompt, then N tokens):
  steps   engine.decode_steps(N): graph replay + on-device greedy sampling + feed-back, per round
  graph   engine.decode(logits=False) N times: the decode graph alone (plus a 12-byte input upload)
The difference is what sampling, feeding back and the graph boundary cost per token. Wall clock
around a synchronized batch of N rounds, median of repeats.
  PYTHONPATH=. python3 benchmarks/lab/decode_breakdown.py [--shapes llama3.2-1b llama3-8b] [-n 64]
"""
import argparse
import json
import statistics
import time

import numpy as np
import torch

from llama_brrr import Llama
from llama_brrr.sampling import uniform_rows


def per_token_s(fn, n, repeats):
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / n)
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["llama3.2-1b", "llama3-8b"])
    ap.add_argument("-n", type=int, default=64)  # decode_steps takes at most 64
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    n = args.n
    rows = []
    for shape in args.shapes:
        model = Llama.random(shape, device="cuda", max_seq_len=1024, max_batch=1)
        eng = model.engine
        rng = np.random.default_rng(0)
        prompt = rng.integers(300, 30000, size=128).astype(np.int32)
        eng.prefill(0, prompt, 0, "none")
        one = lambda v, dt: np.array([v], dtype=dt)
        greedy = dict(params=uniform_rows(1), step=one(0, np.uint64))

        def steps():
            eng.decode_steps(one(7, np.int32), one(0, np.int32), one(128, np.int32), n_steps=n, **greedy)

        def graph_only():
            for i in range(n):
                eng.decode(one(7, np.int32), one(0, np.int32), one(128 + i, np.int32), logits=False)

        steps()  # warm-up: captures the graphs
        graph_only()
        s = per_token_s(steps, n, args.repeats)
        g = per_token_s(graph_only, n, args.repeats)
        row = {"shape": shape, "n": n, "steps_us": s[0] * 1e6, "steps_min_us": s[1] * 1e6,
               "steps_max_us": s[2] * 1e6, "graph_us": g[0] * 1e6, "graph_min_us": g[1] * 1e6,
               "graph_max_us": g[2] * 1e6, "sample_feedback_us": (s[0] - g[0]) * 1e6}
        rows.append(row)
        print(f"{shape:12s} steps {row['steps_us']:8.1f} us/token ({1e6 / row['steps_us']:.1f} tok/s)  "
              f"graph alone {row['graph_us']:8.1f}  difference {row['sample_feedback_us']:6.1f} us", flush=True)
        del model, eng  # the engine's weights and cache go before the next shape's
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
