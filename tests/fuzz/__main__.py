"""python -m tests.fuzz --cases N [--seed S] [--out summary.json] [--no-default] [--replay INDEX]

Runs N mutated model files (see tests/fuzz/runner.py) and writes a summary JSON: counts per
outcome, per seed and per mutator, and every failure with its mutation and traceback. Exit
status 1 when any case crashed, hung or changed the output silently. --replay INDEX runs one
case of the same --seed again and prints it in full.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from .runner import FAILURES, Fuzzer, summarize
from .seeds import write_seeds

# The default model (when on disk) takes seconds per case, the tiny seeds milliseconds.
DEFAULT_MODEL_WEIGHT = 0.012


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case (tiny seeds)")
    parser.add_argument("--no-default", action="store_true", help="leave the default model out")
    parser.add_argument("--replay", type=int)
    args = parser.parse_args(argv)

    command = "python -m tests.fuzz " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    with tempfile.TemporaryDirectory(prefix="llama_brrr_fuzz_") as scratch:
        scratch = Path(scratch)
        seeds = write_seeds(scratch / "written", include_default=not args.no_default)
        fuzzer = Fuzzer(seeds, scratch / "run", timeout=args.timeout)
        weights = {"default": DEFAULT_MODEL_WEIGHT}
        try:
            if args.replay is not None:
                case = fuzzer.run_case(args.replay, args.seed, weights)
                print(json.dumps(dict(case=case.index, seed=case.seed, file=case.role, outcome=case.outcome,
                                      mutation=case.mutation.describe(), result=case.result), indent=1))
                return 0
            cases, start = [], time.perf_counter()
            for index in range(args.cases):
                case = fuzzer.run_case(index, args.seed, weights)
                cases.append(case)
                if case.outcome in FAILURES:
                    print(f"case {index} [{case.seed}/{case.role}] {case.outcome}: {case.mutation.describe()} "
                          f"-> {case.result.get('error') or case.result.get('stage')}", file=sys.stderr)
                if (index + 1) % 500 == 0:
                    print(f"{index + 1} cases, {time.perf_counter() - start:.0f} s", file=sys.stderr)
                    if args.out:  # a partial summary, so a long run that is stopped still reports
                        write_summary(args.out, summarize(cases, command + f"  (partial: {index + 1} of "
                                                          f"{args.cases})", args.seed, time.perf_counter() - start))
        finally:
            fuzzer.close()
    summary = summarize(cases, command, args.seed, time.perf_counter() - start)
    if args.out:
        write_summary(args.out, summary)
    print(json.dumps({k: summary[k] for k in ("cases", "elapsed_s", "outcomes", "failures_total")}))
    return 1 if summary["failures_total"] else 0


def write_summary(path: Path, summary: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
