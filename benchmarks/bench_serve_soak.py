"""Soak test of the OpenAI server: many concurrent streaming clients for minutes.

    python benchmarks/bench_serve_soak.py --clients 200 --minutes 3 --out results/cpu/serve_soak.json

The server runs in this process (uvicorn on a thread). By default over a tiny random model (a few
layers, byte tokenizer) on the CPU, so the soak exercises the scheduler, the engine thread and the
HTTP layer rather than the matmuls; --shape NAME --device cuda runs a named random shape on the GPU
instead (its CUDA graphs, the paged kernels and the block manager at GPU speed):

    python benchmarks/bench_serve_soak.py --shape llama3.2-1b --device cuda --max-num-seqs 128 \
        --clients 200 --minutes 1.5 --out serve_soak_gpu.json

Each client loops until the deadline: a streaming /v1/completions request for one of a
fixed set of prompts (random lengths), greedy, ignore_eos, a random max_tokens; it checks the stream
ends in [DONE] with usage, that it got exactly max_tokens tokens, and that its text equals the
offline Llama.generate answer for that prompt (computed first, by the same model before it serves;
its LM head is replaced by a sharp one, so greedy choices have no near-ties that a different batch
could flip). One request
in --disconnect-every is dropped by its client mid-stream (its slot must come back). At the end the
engine must be idle (no running or waiting request, no slot or KV position in use), and every
request sent must be accounted for: completed, deliberately dropped, or an error (there should be
none). The summary JSON has the counts, the latency percentiles and the final /metrics gauges.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llama_brrr import Llama, ModelConfig  # noqa: E402
from llama_brrr.bench.serve import _sse_post  # noqa: E402
from llama_brrr.serving.async_engine import AsyncLlama  # noqa: E402
from llama_brrr.serving.server import build_app  # noqa: E402

SMALL = dict(dim=128, hidden_dim=256, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=300,
             max_seq_len=256, name="soak")


def make_model(args) -> Llama:
    if args.shape:
        llm = Llama.random(args.shape, seed=1, device=args.device, max_batch=args.max_num_seqs,
                           n_threads=args.threads, kv_blocks=args.kv_blocks,
                           max_seq_len=args.max_seq_len)
    else:
        llm = Llama.random(ModelConfig(**SMALL), seed=1, device=args.device, max_batch=args.max_num_seqs,
                           n_threads=args.threads, kv_blocks=args.kv_blocks)
    config = llm.config
    # A sharp LM head (std 1): greedy choices without near-ties, so texts compare exactly.
    head = np.random.default_rng(2).normal(0.0, 1.0, (config.vocab_size, config.dim)).astype(np.float32)
    llm.engine.set_weight("tok_embeddings" if config.tie_embeddings else "output", head, "f32")
    return llm


async def dropped_stream(port: int, body: dict) -> None:
    """Reads the first SSE bytes of a stream and hangs up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    await writer.drain()
    seen = b""
    while b"data: " not in seen:
        chunk = await reader.read(1024)
        if not chunk:
            break
        seen += chunk
    writer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64, help="distinct prompts checked")
    parser.add_argument("--disconnect-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-blocks", type=int, default=None,
                        help="a KV pool smaller than the slots can fill, so requests get preempted")
    parser.add_argument("--shape", default=None,
                        help="a named random shape (config.SHAPES, e.g. llama3.2-1b) instead of the tiny model")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    parser.add_argument("--max-seq-len", type=int, default=1024, help="context of --shape (default 1024)")
    parser.add_argument("--max-tokens", type=int, default=48, help="a request asks 1..N tokens (48)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="per-step token budget (default 256 for the tiny model, the engine's otherwise)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(3, 259, size=int(n)).tolist() for n in rng.integers(1, 120, size=args.prompts)]
    max_tokens = args.max_tokens
    if args.clients < 1 or args.minutes <= 0 or max_tokens < 1:
        raise ValueError("--clients and --max-tokens must be >= 1 and --minutes > 0")
    llm = make_model(args)
    # The expected answers, offline, in waves of at most max_num_seqs, before the model serves.
    expected_ids = [o.token_ids for o in llm.generate(prompts, max_tokens=max_tokens, ignore_eos=True)]
    tokenizer = llm.tokenizer
    budget = args.max_num_batched_tokens or (256 if args.shape is None else None)
    engine = AsyncLlama(llm, max_num_batched_tokens=budget)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(build_app(engine, "soak"), host="127.0.0.1", port=port,
                                           log_level="error", backlog=4096))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)

    counts = {"sent": 0, "completed": 0, "dropped": 0, "errors": 0, "wrong_text": 0,
              "wrong_count": 0, "tokens": 0}
    errors: list[str] = []
    ttft, e2e = [], []
    peak = {"running": 0, "waiting": 0}
    deadline = time.monotonic() + args.minutes * 60

    async def client(c: int) -> None:
        r = random.Random(args.seed * 1000 + c)
        n = 0
        while time.monotonic() < deadline:
            n += 1
            i = r.randrange(len(prompts))
            k = r.randint(1, max_tokens)
            body = {"model": "soak", "prompt": prompts[i], "max_tokens": k, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            counts["sent"] += 1
            if n % args.disconnect_every == 0:
                await dropped_stream(port, body)
                counts["dropped"] += 1
                continue
            t0 = time.perf_counter()
            first, text, usage = None, [], None
            try:
                async for payload in _sse_post(port, body):
                    if "error" in payload:
                        raise RuntimeError(payload["error"]["message"])
                    if first is None and payload.get("choices"):
                        first = time.perf_counter()
                    text += [ch["text"] for ch in payload.get("choices", [])]
                    usage = payload.get("usage") or usage
            except Exception as error:  # counted and reported: the soak's verdict
                counts["errors"] += 1
                errors.append(f"{type(error).__name__}: {error}")
                continue
            counts["completed"] += 1
            e2e.append(time.perf_counter() - t0)
            if first is not None:
                ttft.append(first - t0)
            if usage is None or usage["completion_tokens"] != k:
                counts["wrong_count"] += 1
            else:
                counts["tokens"] += k
            # The offline answer's first k tokens, decoded (greedy tokens do not depend on k).
            if tokenizer.decode(expected_ids[i][:k]) != "".join(text):
                counts["wrong_text"] += 1

    async def watch() -> None:
        while time.monotonic() < deadline:
            u = engine.usage()
            peak["running"] = max(peak["running"], u["running"])
            peak["waiting"] = max(peak["waiting"], u["waiting"])
            await asyncio.sleep(0.2)

    async def run_all() -> None:
        await asyncio.gather(watch(), *(client(c) for c in range(args.clients)))

    t_start = time.perf_counter()
    asyncio.run(run_all())
    wall = time.perf_counter() - t_start
    end = time.monotonic() + 10
    while time.monotonic() < end:
        final = engine.usage()
        if (final["running"] == final["waiting"] == final["slots_used"] == final["kv_positions_used"]
                == final["kv_blocks_used"] == 0):
            break
        time.sleep(0.05)
    metrics = engine.metrics.render()
    server.should_exit = True
    thread.join(timeout=10)
    engine.close()

    def pct(values, q):
        return float(np.percentile(values, q)) * 1e3 if values else None

    accounted = counts["completed"] + counts["dropped"] + counts["errors"]
    summary = {
        "benchmark": "serve_soak", "command": "python benchmarks/bench_serve_soak.py " + " ".join(sys.argv[1:]),
        "model": args.shape or SMALL, "device": llm.device, "clients": args.clients, "minutes": args.minutes, "wall_s": wall,
        "max_num_seqs": args.max_num_seqs, "threads": args.threads, "counts": counts,
        "lost": counts["sent"] - accounted, "errors_sample": errors[:5],
        "peak_running": peak["running"], "peak_waiting": peak["waiting"],
        "final_usage": final, "engine_steps": engine.steps, "engine_errors": engine.errors,
        "output_tok_s": counts["tokens"] / wall,
        "ttft_ms": {"median": pct(ttft, 50), "p99": pct(ttft, 99)},
        "e2e_ms": {"median": pct(e2e, 50), "p99": pct(e2e, 99)},
        "metrics_final": [line for line in metrics.splitlines()
                          if line.startswith(("llama_brrr_requests", "llama_brrr_kv", "llama_brrr_generation",
                                              "llama_brrr_prompt", "llama_brrr_preemptions",
                                              "llama_brrr_prefix"))],
    }
    ok = (summary["lost"] == 0 and counts["errors"] == 0 and counts["wrong_text"] == 0
          and counts["wrong_count"] == 0 and final["slots_used"] == 0 and final["kv_positions_used"] == 0
          and final["kv_blocks_used"] == 0)
    summary["passed"] = ok
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
