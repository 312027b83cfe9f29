"""decode_chunks.py — what the host's turn between decode_steps calls costs a batch-1 decode token.

Llama.generate (and `llama-brrr bench` / `compare`, which drive the engine the same way) decodes in
calls of DECODE_CHUNK rounds: each call enqueues its rounds, then waits for their tokens, so the GPU
idles from the end of one call's last round until the host has enqueued the next call's first.
This times 256 greedy tokens after a 128-token prompt (random weights) with the chunk at 1, 4, 16
(shipped) and 64 (the most one call takes), through the bench contestant's decode_run, and beside
them the decode graph replayed alone (no sampling, no feed-back: what the sampler's two kernels
and the feed-back cost a token is the difference). Per token: median of repeats.
  PYTHONPATH=. python3 benchmarks/lab/decode_chunks.py [--shapes llama3.2-1b llama3-8b] [--json F]
"""
import argparse
import json

import numpy as np
import torch

from decode_breakdown import per_token_s  # this folder: the script's own directory is on sys.path
from llama_brrr import Llama
from llama_brrr.bench.contestants import Engine

CHUNKS = (1, 4, 16, 64)


def per_token_us(fn, n, repeats):
    """decode_breakdown's timer (median, min, max seconds a token), in microseconds."""
    return tuple(t * 1e6 for t in per_token_s(fn, n, repeats))


def measure(shape, args, shipped):
    """One shape's row: us per token at each chunk, and the graph alone."""
    model = Llama.random(shape, device="cuda", max_seq_len=args.p + args.n + 8, max_batch=1)
    contestant, engine = Engine(model), model.engine
    rng = np.random.default_rng(0)
    prompt = rng.integers(300, 30000, size=(1, args.p)).astype(np.int32)
    first = contestant.prefill(prompt)
    row = {"shape": shape, "prompt": args.p, "tokens": args.n}

    def run():
        contestant.decode_run(first, args.p, args.n)

    try:
        for chunk in CHUNKS:
            Llama.DECODE_CHUNK["cuda"] = chunk
            run()  # warm-up (the first call also captures the decode graph)
            row[f"chunk_{chunk}_us"] = per_token_us(run, args.n, args.repeats)
    finally:
        Llama.DECODE_CHUNK["cuda"] = shipped

    def one(v):
        return np.array([v], dtype=np.int32)

    def graph_only():
        for i in range(args.n):
            engine.decode(one(7), one(0), one(args.p + i), logits=False)

    graph_only()
    row["graph_only_us"] = per_token_us(graph_only, args.n, args.repeats)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["llama3.2-1b", "llama3-8b"])
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shipped = Llama.DECODE_CHUNK["cuda"]
    rows = []
    for shape in args.shapes:
        row = measure(shape, args, shipped)  # the engine is freed before the next shape's
        rows.append(row)
        cells = "  ".join(f"chunk {c}: {row[f'chunk_{c}_us'][0]:7.1f}" for c in CHUNKS)
        print(f"{shape:12s} us/token  {cells}  graph alone: {row['graph_only_us'][0]:7.1f}  "
              f"(tok/s at chunk {shipped}: {1e6 / row[f'chunk_{shipped}_us'][0]:.1f}, "
              f"at 64: {1e6 / row['chunk_64_us'][0]:.1f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
