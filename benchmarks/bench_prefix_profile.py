"""The shared-prefix workload under the engine profiler: where a prefill step's time goes.

256 random prompts of 1,100 tokens sharing their first 1,000 (a system prompt), one token out,
through Llama.generate (the scheduler), with and without prefix caching; prints the wall, the
prompt tokens per second and the profiler's kernel table of each. The throughput figures of record
come from `llama-brrr bench serve --shared-prefix` (benchmarks/results/<gpu>/serving/); this says
why they are what they are.

    python3 benchmarks/bench_prefix_profile.py [--shape llama3.2-1b] [--prompts 256]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llama_brrr import Llama  # noqa: E402
from llama_brrr.profiler import profile  # noqa: E402
from llama_brrr.sampling import SamplingParams  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama3.2-1b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--prefix", type=int, default=1000, help="shared prompt tokens")
    parser.add_argument("--own", type=int, default=100, help="tokens of each prompt after the prefix")
    args = parser.parse_args()
    n_tokens = args.prompts * (args.prefix + args.own)
    for caching in (True, False):
        llm = Llama.random(args.shape, device=args.device, max_batch=args.prompts,
                           max_seq_len=args.prefix + args.own + 8, enable_prefix_caching=caching)
        vocab = llm.config.vocab_size
        rng = np.random.default_rng(0)
        prefix = rng.integers(3, vocab, size=args.prefix).tolist()
        prompts = [prefix + rng.integers(3, vocab, size=args.own).tolist() for _ in range(args.prompts)]
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        # Warm-up on prompts of their own (graphs, first-use allocations; nothing cached for the run).
        llm.generate([rng.integers(3, vocab, size=args.prefix + args.own).tolist() for _ in range(8)], params)
        t0 = time.perf_counter()
        with profile() as prof:
            prof.attach(llm)
            llm.generate(prompts, params)
        wall = time.perf_counter() - t0
        print(f"caching={caching}: wall {wall:.3f} s, {n_tokens / wall:,.0f} prompt tok/s")
        print(prof.summary().table())
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
