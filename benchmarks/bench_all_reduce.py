"""All-reduce latency of tensor parallelism inside a CUDA graph: NCCL against the one-shot IPC
kernel and its low-latency form (csrc/cuda/allreduce.cu), at the sizes where the switch points
between them are decided.

    python benchmarks/bench_all_reduce.py --tensor-parallel 2 \
        --out benchmarks/results/h100-sxm/all_reduce_tp2.json

Starts a one-layer random model of the 8B width (dim 4096) at tensor_parallel=N, whose ranks hold
the same NCCL communicator and one-shot group as a real model's. For each size and method every
rank captures `--iters` all-reduces of a random fp32 buffer (uniform in [-1, 1), out of place so
the values stay finite) into one CUDA graph and times `--repeats` replays with events
(TensorParallelEngine.all_reduce_bench); a round's figure is rank 0's median per all-reduce. The
whole measurement runs `--rounds` times: the JSON keeps every round, the table the median round and
the spread. 16 KB is one batch-1 decode message of the 8B shape (4096 fp32). Sizes above the
engine's one-shot capacity (tuning::all_reduce_oneshot_max_bytes) run the one-shot kernel on a group
opened for that size, so the crossover can be measured on both sides of the current switch point;
the low-latency form ("ll") runs up to its own capacity (tuning::kAllReduceLLMaxBytes), the rows past
it say so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SIZES = {"16KB": 16 << 10, "64KB": 64 << 10, "256KB": 256 << 10, "1MB": 1 << 20, "4MB": 4 << 20}
METHODS = ("nccl", "oneshot", "ll")


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse_sizes(text: str) -> dict:
    """"16KB,1MB" -> {"16KB": 16384, "1MB": 1048576}; a size must be a multiple of 16 bytes."""
    sizes = {}
    for token in filter(None, (t.strip() for t in text.split(","))):
        upper = token.upper()
        for unit, scale in (("KB", 1 << 10), ("MB", 1 << 20), ("B", 1)):
            if upper.endswith(unit) and upper[:-len(unit)].isdigit():
                n = int(upper[:-len(unit)]) * scale
                break
        else:
            raise ValueError(f"size {token!r}: write it as <int>B, <int>KB or <int>MB")
        if n <= 0 or n % 16:
            raise ValueError(f"size {token!r} is {n} bytes: it must be a positive multiple of 16")
        sizes[token] = n
    if not sizes:
        raise ValueError("no sizes given")
    return sizes


def summarize(rounds: list[float]) -> dict:
    return {"median_us": statistics.median(rounds), "min_us": min(rounds), "max_us": max(rounds),
            "rounds_us": rounds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensor-parallel", type=int, default=2)
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--iters", type=int, default=200, help="all-reduces per graph")
    parser.add_argument("--repeats", type=int, default=20, help="timed replays per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sizes = parse_sizes(args.sizes)

    from llama_brrr import Llama
    from llama_brrr.bench import metrics
    from llama_brrr.config import ModelConfig

    config = ModelConfig(dim=4096, hidden_dim=1024, n_layers=1, n_heads=32, n_kv_heads=8,
                         head_dim=128, vocab_size=1024, name="all-reduce-bench")
    results = []
    with Llama.random(config, seed=0, device="cuda", tensor_parallel=args.tensor_parallel,
                      max_seq_len=2048, max_batch=1) as llm:
        engine = llm.engine
        info = engine.all_reduce_info()
        for label, nbytes in sizes.items():
            for method in METHODS:
                row = {"size": label, "bytes": nbytes, "method": method}
                if method != "nccl" and not info["oneshot"]:
                    row["skipped"] = info["why_not"]
                elif method == "ll" and nbytes > info["ll_max_bytes"]:
                    row["skipped"] = f"past the low-latency capacity of {info['ll_max_bytes']} bytes"
                else:
                    row.update(summarize([engine.all_reduce_bench(nbytes, method, args.iters,
                                                                  args.repeats)
                                          for _ in range(args.rounds)]))
                results.append(row)
                shown = (f"{row['median_us']:9.2f} us  [{row['min_us']:.2f}, {row['max_us']:.2f}]"
                         if "median_us" in row else f"skipped: {row['skipped']}")
                print(f"{label:>7} {method:>8}  {shown}", flush=True)

    report = {
        "name": "all_reduce",
        "command": " ".join([sys.executable] + sys.argv),
        "gpu": gpu_name(),
        "tensor_parallel": args.tensor_parallel,
        "iters": args.iters, "repeats": args.repeats, "rounds": args.rounds,
        "oneshot": info,
        "machine": metrics.machine(),
        "versions": metrics.versions(),
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
