"""prefill_ttft.py — one line per `llama-brrr bench --json` file: each model's time to first token,
median / min of its repeats, in ms (the table of prefill_ab.sh's runs).

    python3 benchmarks/lab/prefill_ttft.py OUT/prefill_pdl*.json
"""
import json
import os
import sys


def main():
    for path in sorted(sys.argv[1:]):
        with open(path) as f:
            runs = json.load(f)["runs"]
        cells = [f"{r['model']} {1e3 * r['ttft_s']['median']:.2f} / {1e3 * r['ttft_s']['min']:.2f}" for r in runs]
        print(f"{os.path.basename(path):32} " + "   ".join(cells))


if __name__ == "__main__":
    main()
