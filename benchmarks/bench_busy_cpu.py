#!/usr/bin/env python3
"""CPU decode speed on a busy machine: quiet, and with a busy-loop process of our own.

The CPU engine's OpenMP worker threads wait for each other at the end of every parallel region
(hundreds per token). If they spin for long there, a machine where another process holds a core
makes the spinning thread and the preempted one wait on each other, and decode with all cores
falls below what one thread alone does. This benchmark measures that, per wait policy:

  policy     the engine and the OpenMP wait setting of its process: "package" leaves
             OMP_WAIT_POLICY and GOMP_SPINCOUNT unset, so llama_brrr's own defaults apply;
             "before" runs the engine of --before-repo (a checkout from before those defaults,
             built in place) with GOMP_SPINCOUNT=300000, libgomp's value when nothing is set
             (OMP_DISPLAY_ENV shows the two alike); "libgomp" is this engine with that spin
             count; "spin=N" this engine with GOMP_SPINCOUNT=N; "passive" with
             OMP_WAIT_POLICY=PASSIVE.
  condition  quiet; busy (one busy-loop process, placed by the kernel); busy-pinned (the busy
             loop pinned to the last allowed core).
  threads    0 (the engine's default: all cores) and 1.
  dtype      the default model as the engine runs it by default ("quantized": its Q4_1 / Q8_0
             blocks as stored), or its file dequantized to f32 / bf16 (quant="none").

Each (policy, dtype, threads) is one worker process that loads the model once and then decodes on
request, so the OpenMP runtime of each starts with its own environment. A round runs every
condition once and, inside a condition, every worker once, so the two thread counts are measured
at the same time under the same load. One warm-up run per worker, then --repeats rounds; medians
with min/max. The busy loop is started and stopped by this script around each condition, and
stops by itself after --busy-max-s whatever happens to the script.

decode tok/s is the engine's own (generated - 1) / decode time. /proc/stat says how many cores
other processes used during each run (machine busy time less ours and our busy loop's); it and
/proc/loadavg are recorded with every run, since this box is shared.

    python benchmarks/bench_busy_cpu.py                       # -> benchmarks/results/cpu/busy_cpu.json
    python benchmarks/bench_busy_cpu.py --policies spin=0,spin=10000 --dtypes f32 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "cpu" / "busy_cpu.json"
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
LIBGOMP_DEFAULT_SPINCOUNT = "300000"  # libgomp's spin count when no wait variable is set
BUSY_LOOP = ("import sys, time\n"
             "deadline = time.monotonic() + float(sys.argv[1])\n"
             "while time.monotonic() < deadline:\n"
             "    for _ in range(100000):\n"
             "        pass\n")


def policy_env(policy: str, before_repo: Path) -> dict:
    """The worker's environment for a policy name (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    repo = REPO
    if policy == "package":
        pass
    elif policy == "before":
        env["GOMP_SPINCOUNT"] = LIBGOMP_DEFAULT_SPINCOUNT
        repo = before_repo
    elif policy == "libgomp":
        env["GOMP_SPINCOUNT"] = LIBGOMP_DEFAULT_SPINCOUNT
    elif policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy.startswith("spin="):
        env["GOMP_SPINCOUNT"] = str(int(policy[5:]))
    else:
        raise SystemExit(f"bench_busy_cpu: unknown policy {policy!r}")
    env["PYTHONPATH"] = str(repo) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ---- worker process ----------------------------------------------------------------------------

def worker(dtype: str, threads: int, prompt_tokens: int) -> None:
    """Loads the default model, then per stdin line "<n_tokens>" decodes and prints one JSON line."""
    from llama_brrr import Llama

    quantized = dtype == "quantized"
    llm = Llama.from_pretrained(None, device="cpu", dtype=None if quantized else dtype,
                                quant=None if quantized else "none", max_seq_len=512, max_batch=1,
                                n_threads=threads, progress=False)
    prompt = [(17 * i + 5) % 1000 + 100 for i in range(prompt_tokens)]
    import llama_brrr

    hello = {"wait_env": {k: os.environ.get(k) for k in WAIT_VARS},
             "package": str(Path(llama_brrr.__file__).parent)}
    print(json.dumps(hello), flush=True)
    for line in sys.stdin:
        n = int(line)
        out = llm.generate(prompt, max_tokens=n, temperature=0.0, ignore_eos=True)[0]
        print(json.dumps({"tokens": len(out.token_ids),
                          "decode_tok_s": out.timings["decode_tok_s"]}), flush=True)


class Worker:
    def __init__(self, policy: str, dtype: str, threads: int, prompt_tokens: int, before_repo: Path):
        self.policy, self.dtype, self.threads = policy, dtype, threads
        cmd = [sys.executable, __file__, "--worker", dtype, str(threads), str(prompt_tokens)]
        self.proc = subprocess.Popen(cmd, env=policy_env(policy, before_repo), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.hello = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"bench_busy_cpu: worker {self.policy}/{self.dtype}/t{self.threads} "
                             f"died (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, n_tokens: int) -> dict:
        self.proc.stdin.write(f"{n_tokens}\n")
        self.proc.stdin.flush()
        return self._answer()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---- busy loop and machine load ----------------------------------------------------------------

class BusyLoop:
    """One pure-Python busy-loop process, optionally pinned; bounded by max_s in any case."""

    def __init__(self, pinned: bool, max_s: float):
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(max_s)])
        self.core = None
        if pinned:
            self.core = max(os.sched_getaffinity(0))
            os.sched_setaffinity(self.proc.pid, {self.core})
        time.sleep(0.3)  # let it reach its loop (and the scheduler place it)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def machine_busy_s() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None) -> float:
    """utime + stime of a process (all its threads); 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def measured_run(w: Worker, busy: BusyLoop | None, n_tokens: int) -> dict:
    busy_pid = busy.proc.pid if busy else None
    t0, m0 = time.monotonic(), machine_busy_s()
    w0, b0 = process_cpu_s(w.proc.pid), process_cpu_s(busy_pid)
    answer = w.run(n_tokens)
    wall = time.monotonic() - t0
    ours = process_cpu_s(w.proc.pid) - w0 + process_cpu_s(busy_pid) - b0
    other = max(0.0, machine_busy_s() - m0 - ours) / wall if wall > 0 else 0.0
    return {**answer, "other_cores": round(other, 3), "loadavg": loadavg()}


# ---- report ------------------------------------------------------------------------------------

def summarize(runs: list[dict]) -> dict:
    groups: dict[tuple, list[float]] = {}
    for r in runs:
        groups.setdefault((r["policy"], r["dtype"], r["threads"], r["condition"]), []).append(
            r["decode_tok_s"])
    return {"/".join(map(str, k)): {"median": statistics.median(v), "min": min(v), "max": max(v),
                                     "n": len(v)} for k, v in groups.items()}


def ratios(summary: dict, policies, dtypes, conditions, baseline: str | None) -> dict:
    """Per policy and dtype: busy/quiet at the default thread count, busy default/busy 1-thread,
    and the quiet default-thread speed against the baseline policy's."""
    out = {}
    for p in policies:
        for d in dtypes:
            med = lambda t, c, pol=p: summary.get(f"{pol}/{d}/{t}/{c}", {}).get("median")  # noqa: E731
            row = {}
            quiet = med(0, "quiet")
            for c in conditions:
                if c == "quiet":
                    continue
                busy, one = med(0, c), med(1, c)
                if quiet and busy:
                    row[f"{c}_vs_quiet"] = busy / quiet
                if busy and one:
                    row[f"{c}_vs_1thread"] = busy / one
            base = med(0, "quiet", baseline) if baseline else None
            if baseline and p != baseline and quiet and base:
                row[f"quiet_vs_{baseline}"] = quiet / base
            out[f"{p}/{d}"] = row
    return out


def print_table(summary: dict, ratio: dict) -> None:
    print(f"\n{'policy/dtype/threads/condition':<40} {'median':>8} {'min':>8} {'max':>8}  tok/s")
    for key, s in summary.items():
        print(f"{key:<40} {s['median']:8.1f} {s['min']:8.1f} {s['max']:8.1f}")
    print()
    for key, row in ratio.items():
        print(f"{key:<24} " + "  ".join(f"{k} {v:.2f}" for k, v in row.items()))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="before,package")
    p.add_argument("--before-repo", type=Path, default=Path("/work/main"),
                   help='a checkout whose engine (built in place) the policy "before" runs')
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--conditions", default="quiet,busy,busy-pinned")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per run")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--busy-max-s", type=float, default=120.0,
                   help="a busy loop stops by itself after this long")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    args = parse_args(argv)
    policies = args.policies.split(",")
    dtypes = args.dtypes.split(",")
    conditions = args.conditions.split(",")
    for c in conditions:
        if c not in ("quiet", "busy", "busy-pinned"):
            raise SystemExit(f"bench_busy_cpu: unknown condition {c!r}")
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = loadavg()
    print(f"loadavg before: {load_before}  cores allowed: {sorted(os.sched_getaffinity(0))}")
    runs, hellos = [], {}
    for policy in policies:
        workers = [Worker(policy, d, t, args.prompt_tokens, args.before_repo)
                   for d in dtypes for t in (0, 1)]
        try:
            for w in workers:
                hellos[f"{policy}/{w.dtype}/{w.threads}"] = w.hello
                w.run(args.tokens)  # warm-up
            for rep in range(args.repeats):
                for cond in conditions:
                    busy = BusyLoop(cond == "busy-pinned", args.busy_max_s) if cond != "quiet" else None
                    try:
                        for w in workers:
                            r = measured_run(w, busy, args.tokens)
                            r.update(policy=policy, dtype=w.dtype, threads=w.threads,
                                     condition=cond, repeat=rep)
                            runs.append(r)
                            print(f"{policy:>10} {w.dtype:>4} t{w.threads} {cond:<11} "
                                  f"{r['decode_tok_s']:7.1f} tok/s  other cores "
                                  f"{r['other_cores']:.2f}  load {r['loadavg'][0]:.2f}", flush=True)
                    finally:
                        if busy:
                            busy.stop()
        finally:
            for w in workers:
                w.stop()
    summary = summarize(runs)
    baseline = next((p for p in ("before", "libgomp") if p in policies), None)
    ratio = ratios(summary, policies, dtypes, conditions, baseline)
    print_table(summary, ratio)
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in
                                        ["benchmarks/bench_busy_cpu.py", *(argv or sys.argv[1:])]),
        "started_utc": started, "cpu_count": os.cpu_count(),
        "cores_allowed": sorted(os.sched_getaffinity(0)),
        "loadavg_before": load_before, "loadavg_after": loadavg(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "workers": hellos, "summary": summary, "ratios": ratio, "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
