"""One scheduler step of many running sequences: where its time goes, host and device.

    # the host's share alone, on any machine: a stub engine that returns at once
    python benchmarks/bench_serve_step.py --engine stub --rows 256 --context 1500 --steps 200
    # the real engine: host vs engine time per step, then the engine profiler over decode steps
    python benchmarks/bench_serve_step.py --shape llama3.2-1b --device cuda --rows 256 \\
        --context 1500 --steps 64 --out prof_step/

`--rows` requests of `--context` random prompt tokens are admitted and prefilled (chunked, as the
scheduler does), then every step is a decode step of all rows. For each --decode-steps value k the
script times --steps scheduler steps of k rounds each and splits each one into the time inside
engine calls (decode_steps: launch, the device's work, the copy of the tokens back; the call is
synchronous) and the rest, the host's Python (admission, block reservation, per-token stop rules and
detokenization, block registration), which the device does not overlap. Each k runs unpipelined
and pipelined (--pipeline): pipelined, the time inside engine calls is mostly decode_wait, the host
waiting for the GPU, and the rest is the host's share the GPU did not overlap. With the real engine
it then runs the steps again under llama_brrr.profile() (per-kernel device time: profiler.py) and
writes the report. The stub engine measures the host share without a model: its decode_steps returns
random tokens at once. The JSON (and --out DIR/step.json) has every number.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llama_brrr import Llama, ModelConfig, profile  # noqa: E402
from llama_brrr.sampling import SamplingParams  # noqa: E402
from llama_brrr.serving.block_manager import BlockManager  # noqa: E402
from llama_brrr.serving.scheduler import Scheduler  # noqa: E402


class StubEngine:
    """The engine calls the scheduler and the block manager make, answered at once."""

    backend = "cpu"

    def __init__(self, rows: int, max_seq_len: int, vocab: int, block_size: int = 16):
        blocks = rows * -(-max_seq_len // block_size)
        self.config = {"kv_block_size": block_size, "kv_blocks": blocks}
        self.vocab = vocab
        self.rng = np.random.default_rng(0)
        self.pending: list = []  # the pipelined scheduler's launches, results made at once

    def decode_steps(self, tokens, slots, positions, params, counts, n_steps):
        rows = len(tokens)
        return (self.rng.integers(3, self.vocab, size=(n_steps, rows), dtype=np.int32),
                np.full((n_steps, rows), -1.5, dtype=np.float32))

    def decode_launch(self, tokens, slots, positions, params, counts, n_steps):
        self.pending.append(self.decode_steps(tokens, slots, positions, params, counts, n_steps))

    def decode_wait(self):
        return self.pending.pop(0)

    def decode_discard(self):
        self.pending.clear()

    @property
    def decode_pending(self):
        return len(self.pending)

    def prefill_many(self, slots, starts, lengths, ids):
        pass

    def set_block_table(self, slot, table):
        pass

    def set_history(self, slot, start, ids):
        pass


class TimedEngine:
    """Forwards to an engine, adding up the seconds spent inside each call by name."""

    def __init__(self, engine):
        self._engine = engine
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def __getattr__(self, name):
        attr = getattr(self._engine, name)
        if not callable(attr):
            return attr

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1
        return timed

    def reset(self):
        self.seconds.clear()
        self.calls.clear()


def build(args):
    """(llm giving requests and tokenizer, scheduler over a timed engine, the timed engine)."""
    max_seq_len = args.context + args.steps * max(args.decode_steps) * 3 + 64
    if args.engine == "stub":
        # A tiny real model supplies requests (tokenizer, stream decoder) of a big vocabulary;
        # the scheduler runs over the stub.
        config = ModelConfig(dim=64, hidden_dim=128, n_layers=1, n_heads=2, n_kv_heads=1,
                             vocab_size=args.vocab, max_seq_len=max_seq_len, name="stub")
        llm = Llama.random(config, device="cpu", max_batch=1, max_seq_len=max_seq_len)
        stub = StubEngine(args.rows, max_seq_len, args.vocab)
        engine = TimedEngine(stub)
        allocator = BlockManager(engine, args.rows, max_seq_len)
    else:
        llm = Llama.random(args.shape, device=args.device, max_batch=args.rows, max_seq_len=max_seq_len,
                           gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_dtype=args.kv_cache_dtype)
        engine = TimedEngine(llm.engine)
        allocator = llm.block_manager  # the model's own (one per engine), its calls timed too
        allocator.engine = engine
    return llm, engine, allocator, max_seq_len


def make_requests(llm, args, max_seq_len, check=True):
    rng = np.random.default_rng(args.seed)
    vocab = llm.config.vocab_size
    params = SamplingParams(max_tokens=max_seq_len - args.context - 1, ignore_eos=True,
                            temperature=args.temperature)
    out = []
    for _ in range(args.rows):
        ids = rng.integers(3, vocab, size=args.context).tolist()
        if check:
            out.append(llm._make_request(None, ids, params))
        else:  # the stub's pool is not the tiny model's: skip its fit check
            from llama_brrr.serving.request import Request
            out.append(Request(None, ids, params, int(rng.integers(1 << 62)),
                               llm.tokenizer.stream_decoder(), frozenset()))
    return out


def fill(scheduler, requests) -> int:
    """Admits and prefills every request; the steps it took."""
    for r in requests:
        scheduler.add(r)
    steps = 0
    while scheduler.waiting or any(r.prefilled < r.prefill_target for r in scheduler.running):
        scheduler.step()
        steps += 1
    return steps


def time_steps(scheduler, engine, n: int) -> dict:
    engine.reset()
    walls = []
    usage_s = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        scheduler.step()
        t1 = time.perf_counter()
        scheduler.usage()  # AsyncLlama's loop asks for it after every step
        usage_s += time.perf_counter() - t1
        walls.append(t1 - t0)
    inside = sum(engine.seconds.values())
    total = sum(walls)
    rows = len(scheduler.running)
    return {"steps": n, "rows": rows, "step_ms_median": float(np.median(walls)) * 1e3,
            "step_ms_mean": total / n * 1e3, "engine_ms_per_step": inside / n * 1e3,
            "engine_calls": dict(engine.calls),
            "engine_ms_by_call": {k: v / n * 1e3 for k, v in engine.seconds.items()},
            "host_us_per_step": (total - inside) / n * 1e6,
            "usage_us_per_step": usage_s / n * 1e6,
            "host_share": (total - inside) / total if total else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("real", "stub"), default="real")
    parser.add_argument("--shape", default="llama3.2-1b", help="random shape for --engine real")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto", help="for --engine real")
    parser.add_argument("--rows", type=int, default=256, help="running sequences (256)")
    parser.add_argument("--context", type=int, default=1500, help="prompt tokens of each (1500)")
    parser.add_argument("--steps", type=int, default=64, help="timed steps per --decode-steps value")
    parser.add_argument("--decode-steps", default="1,16", help="rounds per step to time (1,16)")
    parser.add_argument("--pipeline", choices=("off", "on", "both"), default="both",
                        help="time the scheduler unpipelined, pipelined or both (both)")
    parser.add_argument("--profile-steps", type=int, default=16,
                        help="decode steps (k=1) under the engine profiler; 0: none (real engine only)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--vocab", type=int, default=128256, help="the stub's vocabulary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also N steps (k=1) under cProfile: the top host functions")
    parser.add_argument("--out", type=Path, default=None, help="folder for step.json and the profile")
    args = parser.parse_args()
    args.decode_steps = [int(k) for k in args.decode_steps.split(",") if k.strip()]
    if args.rows < 1 or args.context < 2 or args.steps < 1 or not args.decode_steps:
        raise ValueError("--rows >= 1, --context >= 2, --steps >= 1 and a --decode-steps value are needed")

    llm, engine, allocator, max_seq_len = build(args)
    result = {"benchmark": "serve_step", "command": " ".join(sys.argv), "engine": args.engine,
              "shape": args.shape if args.engine == "real" else "stub", "device": llm.device,
              "rows": args.rows, "context": args.context, "runs": {}}
    out = args.out
    if out:
        out.mkdir(parents=True, exist_ok=True)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.pipeline]
    for k, pipelined in [(k, p) for k in args.decode_steps for p in modes]:
        scheduler = Scheduler(engine, max_seq_len=max_seq_len, max_num_seqs=args.rows,
                              decode_steps=k, allocator=allocator, pipeline=pipelined)
        args.seed += 1  # prompts of their own: no prefix-cache hits from the previous run
        requests = make_requests(llm, args, max_seq_len, check=args.engine == "real")
        t0 = time.perf_counter()
        fill_steps = fill(scheduler, requests)
        fill_s = time.perf_counter() - t0
        for _ in range(3):  # warm-up: graph capture at this batch, first-use allocations
            scheduler.step()
        run = time_steps(scheduler, engine, args.steps)
        run.update(fill_steps=fill_steps, fill_s=fill_s, prefill_tok_s=args.rows * args.context / fill_s,
                   tokens_per_step=run["rows"] * k,
                   host_us_per_token=run["host_us_per_step"] / (run["rows"] * k))
        run["pipelined"] = pipelined
        result["runs"][f"decode_steps={k}" + (",pipelined" if pipelined else "")] = run
        print(f"k={k:>2}{' pipelined' if pipelined else ''}: {run['rows']} rows, step {run['step_ms_median']:.3f} ms median "
              f"({run['step_ms_mean']:.3f} mean), engine {run['engine_ms_per_step']:.3f} ms, host "
              f"{run['host_us_per_step']:.0f} us ({100 * run['host_share']:.1f}%), "
              f"{run['host_us_per_token']:.2f} us/token; usage() {run['usage_us_per_step']:.0f} us; "
              f"fill {fill_s:.1f} s ({run['prefill_tok_s']:,.0f} prompt tok/s)", flush=True)
        if k == 1 and args.cprofile and pipelined == modes[-1]:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.cprofile):
                scheduler.step()
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
            result["cprofile_top"] = text.getvalue()
            print(text.getvalue())
        if k == 1 and args.engine == "real" and args.profile_steps and pipelined == modes[-1]:
            with profile() as prof:
                prof.attach(llm)
                for _ in range(args.profile_steps):
                    scheduler.step()
            summary = prof.summary()
            report = summary.table()
            print(report)
            result["profile"] = {"steps": args.profile_steps, "rows": len(scheduler.running),
                                 "phases": summary.phases,
                                 "kernels_top": sorted(summary.kernels, key=lambda r: -r["time_s"])[:25]}
            if out:
                (out / "profile_table.txt").write_text(report + "\n")
                (out / "profile_summary.json").write_text(summary.to_json(indent=1) + "\n")
        for r in list(scheduler.running) + list(scheduler.waiting):
            scheduler.abort(r)
    text = json.dumps(result, indent=1, default=str)
    if out:
        (out / "step.json").write_text(text + "\n")
        print(f"wrote {out / 'step.json'}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
