"""Memory that comes back: N load / generate / unload cycles of one model in one process.

After each unload (del + gc.collect(), then llama_brrr.memory.release_freed_memory() unless
--no-trim) the process's resident set size is read from /proc/self/statm. The figure of merit is
the growth from the 2nd cycle's RSS to the last one's (the 1st cycle pays for imports and
one-time caches); the target is <= 20 MB over 100 cycles. Both modes run in fresh processes of
their own, so one does not inherit the other's heap.

    python benchmarks/bench_load_cycles.py --cycles 100 --out benchmarks/results/cpu/load_cycles.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def cycles(model: str | None, n: int, trim: bool) -> dict:
    from llama_brrr import Llama
    from llama_brrr.memory import release_freed_memory

    rows = []
    for i in range(n):
        start = time.perf_counter()
        llm = Llama.from_pretrained(model, device="cpu", progress=False)
        loaded = rss_mb()
        tokens = llm.generate("The capital of France is", max_tokens=4)[0].token_ids
        del llm
        gc.collect()
        if trim:
            release_freed_memory()
        rows.append({"cycle": i + 1, "rss_loaded_mb": round(loaded, 1), "rss_after_unload_mb": round(rss_mb(), 1),
                     "seconds": round(time.perf_counter() - start, 2), "tokens": tokens})
        print(f"cycle {i + 1}: loaded {loaded:.0f} MB, after unload {rows[-1]['rss_after_unload_mb']:.0f} MB "
              f"({rows[-1]['seconds']:.1f} s)", file=sys.stderr, flush=True)
    after = [r["rss_after_unload_mb"] for r in rows]
    return {"trim": trim, "cycles": rows, "growth_2nd_to_last_mb": round(after[-1] - after[1], 1) if n > 1 else None,
            "max_after_unload_mb": max(after), "same_tokens_every_cycle": len({str(r["tokens"]) for r in rows}) == 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--model", default=None, help="a model path (default: the default model)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--mode", choices=["trim", "no-trim"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # one mode, in this process
        print(json.dumps(cycles(args.model, args.cycles, args.mode == "trim")))
        return 0
    results = {}
    for mode in ("no-trim", "trim"):
        command = [sys.executable, __file__, "--cycles", str(args.cycles), "--mode", mode]
        if args.model:
            command += ["--model", args.model]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
        results[mode] = json.loads(done.stdout)
    summary = {"command": "python benchmarks/bench_load_cycles.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
               "machine": platform.node(), "python": platform.python_version(), "target_growth_mb": 20,
               **{f"growth_{m.replace('-', '_')}_mb": results[m]["growth_2nd_to_last_mb"] for m in results},
               "modes": results}
    print(json.dumps({k: v for k, v in summary.items() if k != "modes"}, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
