#!/usr/bin/env python3
"""End-to-end benchmarks from a checkout: `llama-brrr bench` and `llama-brrr compare` (the harness
lives in llama_brrr.bench so the installed command has it too). Arguments as for the command:

    python benchmarks/bench_e2e.py bench --shape llama3.2-1b -b 1,16 -p 512 -n 128
    python benchmarks/bench_e2e.py bench --sweep --quick --json /tmp/sweep.json
    python benchmarks/bench_e2e.py compare --shape llama3.2-1b --out-dir benchmarks/results/<gpu>
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from llama_brrr.cli import main  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("bench", "compare"):
        sys.exit(f"usage: {sys.argv[0]} bench|compare [options]   (--help for the options)")
    sys.exit(main(sys.argv[1:]))
