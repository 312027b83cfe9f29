"""`llama-brrr bench serve`: a serving benchmark in vLLM benchmark_serving's terms.

Workload: random prompts of --input-len tokens that generate exactly --output-len tokens each
(ignore_eos), or a dataset file (JSON lines {"prompt": text or ids, "output_len": n}); requests
arrive all at once (--request-rate inf), by a seeded Poisson process of the given rate, and/or
under --max-concurrency. Per request: TTFT (arrival to first token), TPOT ((e2e - TTFT) /
(output - 1)), ITL (every gap between consecutive tokens) and e2e latency; per run: request
throughput, output tok/s and total (prompt + output) tok/s over the run's wall time.

Modes, each on the same weights and the same requests in one run:
  scheduler  AsyncLlama in-process: continuous batching, streamed deltas
  http       the OpenAI server (uvicorn on a thread of this process) through a plain asyncio
             HTTP client reading the SSE stream (logprobs=0 so every token makes a chunk)
  static     Llama._generate_static_waves: the waves of max_batch that generate() ran before the
             scheduler (all requests at once only)
  hf         transformers' continuous batching (generate_batch) on the same weights (all at once)
Outputs are compared with the scheduler's (greedy): a mode whose texts differ is flagged.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MODES = ("scheduler", "http", "static", "hf")


@dataclass
class ServeOptions:
    shape: str | None = "smollm2-135m"
    model: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    quant: str | None = None
    threads: int = 0
    tensor_parallel: int = 1
    max_num_seqs: int | None = None  # None: the engine's default max_batch (8 cpu, 64 cuda)
    max_num_batched_tokens: int | None = None
    decode_steps: int | None = None
    pipeline: bool | None = None  # None: the scheduler's default (on for CUDA)
    kv_block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"  # or "fp8": Llama.from_pretrained(kv_cache_dtype=...)
    num_prompts: int = 32
    input_len: int = 64
    shared_prefix: int = 0  # random prompts: the first shared_prefix tokens are the same in all
    output_len: int = 32
    dataset: str | None = None
    request_rate: float = math.inf
    max_concurrency: int | None = None
    seed: int = 0
    repeats: int = 3
    modes: tuple = MODES


@dataclass
class Record:
    prompt_len: int
    arrival: float = 0.0
    ttft: float = math.nan
    token_times: list = field(default_factory=list)
    end: float = math.nan
    output_len: int = 0
    text: str = ""
    ids: list | None = None  # generated token ids, where the mode returns them
    error: str | None = None


# ---- workload -------------------------------------------------------------------------------

def build_requests(llm, opts: ServeOptions) -> list[tuple[list[int], int]]:
    """(prompt ids, output tokens) per request."""
    rng = np.random.default_rng(opts.seed)
    if opts.dataset and opts.shared_prefix:
        raise ValueError("--shared-prefix shapes random prompts; it does not apply to --dataset")
    if opts.dataset:
        out = []
        for n, line in enumerate(Path(opts.dataset).read_text().splitlines()):
            if not line.strip():
                continue
            item = json.loads(line)
            prompt = item["prompt"]
            ids = llm.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            out.append((ids, int(item.get("output_len", opts.output_len))))
            if len(out) == opts.num_prompts:
                break
        if not out:
            raise ValueError(f"--dataset {opts.dataset}: no requests in it")
        return out
    if opts.input_len < 1 or opts.output_len < 1:
        raise ValueError("--input-len and --output-len must be >= 1")
    if not 0 <= opts.shared_prefix <= opts.input_len:
        raise ValueError(f"--shared-prefix must be in [0, --input-len={opts.input_len}], got "
                         f"{opts.shared_prefix}")
    low = 3 if llm.config.vocab_size > 3 else 0  # past the byte tokenizer's <unk>, <s>, </s>
    prefix = rng.integers(low, llm.config.vocab_size, size=opts.shared_prefix).tolist()
    own = opts.input_len - opts.shared_prefix
    return [(prefix + rng.integers(low, llm.config.vocab_size, size=own).tolist(), opts.output_len)
            for _ in range(opts.num_prompts)]


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which each request arrives: 0 for rate inf, else a Poisson
    process (exponential gaps of mean 1 / rate) from a seeded generator."""
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate, size=n)
    return np.cumsum(gaps).tolist()


# ---- modes ------------------------------------------------------------------------------------

async def _drive(opts, requests, offsets, run_one) -> tuple[list[Record], float]:
    """Starts each request at its arrival time under the concurrency limit; returns the records and
    the run's wall time."""
    semaphore = asyncio.Semaphore(opts.max_concurrency) if opts.max_concurrency else None
    records = [Record(len(ids)) for ids, _ in requests]
    t0 = time.perf_counter()

    async def one(i):
        await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
        if semaphore is not None:
            await semaphore.acquire()
        try:
            records[i].arrival = time.perf_counter()
            try:
                await run_one(i, requests[i], records[i])
            except Exception as error:  # counted as a failed request, reported in the table
                records[i].error = f"{type(error).__name__}: {error}"
        finally:
            if semaphore is not None:
                semaphore.release()

    await asyncio.gather(*(one(i) for i in range(len(requests))))
    return records, time.perf_counter() - t0


def run_scheduler(engine, opts, requests, offsets):
    from ..sampling import SamplingParams

    async def run_one(i, request, rec):
        ids, n_out = request
        params = SamplingParams(max_tokens=n_out, ignore_eos=True)
        async for delta in engine.generate(ids, params, request_id=f"bench-{i}-{time.monotonic_ns()}"):
            now = time.perf_counter()
            rec.token_times += [now] * len(delta.token_ids)
            if delta.finished:
                rec.text = delta.output.text
                rec.ids = delta.output.token_ids
                rec.output_len = len(delta.output.token_ids)
        rec.end = time.perf_counter()

    return asyncio.run(_drive(opts, requests, offsets, run_one))


async def _sse_post(port: int, body: dict):
    """POSTs `body` to /v1/completions and yields each SSE payload (a dict) as it arrives."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
    await writer.drain()
    try:
        status = await reader.readline()
        if b" 200 " not in status:
            rest = await reader.read()
            raise RuntimeError(f"HTTP {status.decode().strip()}: {rest[-300:].decode(errors='replace')}")
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            chunked |= line.lower().startswith(b"transfer-encoding: chunked")
        buffer = b""
        while True:
            if chunked:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    break
                buffer += await reader.readexactly(size)
                await reader.readexactly(2)
            else:
                piece = await reader.read(65536)
                if not piece:
                    break
                buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                payload = event[len(b"data: "):]
                if payload == b"[DONE]":
                    return
                yield json.loads(payload)
    finally:
        writer.close()


def run_http(port: int, model_name: str, opts, requests, offsets):
    async def run_one(i, request, rec):
        ids, n_out = request
        body = {"model": model_name, "prompt": ids, "max_tokens": n_out, "temperature": 0,
                "ignore_eos": True, "stream": True, "logprobs": 0,
                "stream_options": {"include_usage": True}}
        text = []
        async for payload in _sse_post(port, body):
            if "error" in payload:
                raise RuntimeError(payload["error"]["message"])
            now = time.perf_counter()
            for choice in payload.get("choices", []):
                n = len((choice.get("logprobs") or {}).get("tokens") or [])
                rec.token_times += [now] * n
                text.append(choice["text"])
            if payload.get("usage"):
                rec.output_len = payload["usage"]["completion_tokens"]
        rec.text = "".join(text)
        rec.end = time.perf_counter()

    return asyncio.run(_drive(opts, requests, offsets, run_one))


def run_static(llm, requests):
    from ..sampling import SamplingParams

    reqs = [llm._make_request(None, ids, SamplingParams(max_tokens=n, ignore_eos=True))
            for ids, n in requests]
    # On a thread of its own, as the scheduler's engine loop runs: an engine's CPU speed can differ
    # between the main thread and another (each calling thread gets its own OpenMP team).
    t0 = time.perf_counter()
    worker = threading.Thread(target=llm._run_static_waves, args=(reqs,))
    worker.start()
    worker.join()
    wall = time.perf_counter() - t0
    records = []
    for r in reqs:
        rec = Record(len(r.prompt_ids), arrival=r.t_call, token_times=list(r.token_times),
                     end=r.t_done, output_len=len(r.token_ids), text=r.text, ids=list(r.token_ids))
        records.append(rec)
    return records, wall


def hf_weights(llm) -> tuple[dict, object]:
    """The engine's weights as torch tensors in the dtype HF will run (bf16 on cuda, f32 on cpu),
    on the host, one tensor converted at a time (no f32 copy of the whole model), and its torch
    dtype. On cuda they go to the device only once our engine has freed its memory."""
    import torch

    dtype = torch.float32 if llm.device == "cpu" else torch.bfloat16
    weights = {}
    for name in llm.config.tensor_shapes():
        # get_weight gives f32; the engine's bf16 values round-trip exactly.
        weights[name] = torch.from_numpy(llm.engine.get_weight(name)).to(dtype)
    return weights, dtype


def hf_model(config, weights: dict, device: str, dtype):
    """transformers' LlamaForCausalLM on `weights`, moved to `device` tensor by tensor."""
    from .contestants import hf_llama

    target = "cpu" if device == "cpu" else device
    moved = {}
    for name in list(weights):
        moved[name] = weights.pop(name).to(target)  # the host copy goes as its device copy lands
    return hf_llama(config, moved, target, dtype, "sdpa")


def _hf_batch_kwargs(model, requests) -> dict:
    """Arguments of generate_batch that size HF's manager for the whole workload. Newer
    transformers size a persistent manager from the first call's requests (their count and longest
    sequence): the warm-up's two requests would cap every later batch at two. An explicit
    ContinuousBatchingConfig fixes the size; versions without it size from the generation config."""
    import inspect

    accepts = inspect.signature(model.generate_batch).parameters
    kwargs = {k: v for k, v in (("record_timestamps", True), ("warmup", False),
                                ("persistent_manager", True)) if k in accepts}
    if "continuous_batching_config" in accepts:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        cb = ContinuousBatchingConfig()
        longest = max(len(ids) + n for ids, n in requests)
        blocks = -(-longest // getattr(cb, "page_size", 256)) + 1
        cb.max_blocks_per_request = blocks + blocks % 2
        cb.max_requests_per_batch = len(requests)
        kwargs["continuous_batching_config"] = cb
    return kwargs


def run_hf(model, tokenizer, requests, batch_kwargs: dict):
    from transformers import GenerationConfig

    n_out = {n for _, n in requests}
    if len(n_out) != 1:
        raise ValueError("the hf mode needs one output length for every request")
    config = GenerationConfig(max_new_tokens=n_out.pop(), do_sample=False, eos_token_id=-1,
                              pad_token_id=0)
    t0 = time.perf_counter()
    # persistent_manager: the manager (its KV pool, its thread) outlives the call, so the warm-up
    # call pays its start-up (~15 s on 2 cores) and the timed calls do not.
    results = model.generate_batch([ids for ids, _ in requests], generation_config=config,
                                   **batch_kwargs)
    wall = time.perf_counter() - t0
    records = []
    for (ids, _), out in zip(requests, results.values()):
        tokens = list(out.generated_tokens)
        text = tokenizer.decode(tokens) if tokenizer is not None else ""
        # HF's timestamps are perf_counter values; its requests arrive at the call.
        records.append(Record(len(ids), arrival=t0, token_times=list(out.timestamps or []),
                              end=(out.timestamps or [t0])[-1], output_len=len(tokens), text=text, ids=tokens,
                              error=str(out.error) if out.error else None))
    if len(records) < len(requests):  # generate_batch returns what finished; the rest failed
        records += [Record(len(ids), error="no result from generate_batch")
                    for ids, _ in requests[len(records):]]
    return records, wall


# ---- metrics --------------------------------------------------------------------------------

def _stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "median": None, "p99": None}
    a = np.asarray(values) * 1e3
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p99": float(np.percentile(a, 99))}


def summarize(records: list[Record], wall: float) -> dict:
    ok = [r for r in records if r.error is None and r.token_times]
    ttft = [r.token_times[0] - r.arrival for r in ok]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1)
            for r in ok if len(r.token_times) > 1]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:])]
    e2e = [r.end - r.arrival for r in ok]
    out_tokens = sum(r.output_len for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    return {"completed": len(ok), "failed": len(records) - len(ok), "wall_s": wall,
            "request_throughput": len(ok) / wall, "output_tok_s": out_tokens / wall,
            "total_tok_s": (out_tokens + in_tokens) / wall, "output_tokens": out_tokens,
            "prompt_tok_s": in_tokens / wall,
            "ttft_ms": _stats(ttft), "tpot_ms": _stats(tpot), "itl_ms": _stats(itl),
            "e2e_ms": _stats(e2e),
            "errors": sorted({r.error for r in records if r.error})[:3]}


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


# ---- the run --------------------------------------------------------------------------------

def run(opts: ServeOptions, on_progress=None) -> dict:
    """Runs every mode of `opts`; the result dict (see table()). on_progress(result), if given, is
    called with the result so far after each mode's run, so a run cut short still leaves what it
    measured (the hf mode on a big model is the slow one)."""
    import hashlib

    from .. import Llama, __version__
    from ..serving.async_engine import AsyncLlama

    unknown = [m for m in opts.modes if m not in MODES]
    if unknown:
        raise ValueError(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if opts.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {opts.repeats}")
    if opts.request_rate <= 0:
        raise ValueError(f"--request-rate must be > 0 (inf = all at once), got {opts.request_rate}")
    if opts.max_concurrency is not None and opts.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {opts.max_concurrency}")
    kwargs = dict(device=opts.device, dtype=opts.dtype, max_batch=opts.max_num_seqs,
                  n_threads=opts.threads, quant=opts.quant, kv_block_size=opts.kv_block_size,
                  gpu_memory_utilization=opts.gpu_memory_utilization, kv_blocks=opts.kv_blocks,
                  enable_prefix_caching=opts.enable_prefix_caching, kv_cache_dtype=opts.kv_cache_dtype,
                  **({"tensor_parallel": opts.tensor_parallel} if opts.tensor_parallel != 1 else {}))
    if opts.model:
        llm = Llama.from_pretrained(opts.model, progress=False, **kwargs)
    else:
        llm = Llama.random(opts.shape, **kwargs)
    requests = build_requests(llm, opts)
    longest = max(len(ids) + n for ids, n in requests)
    if longest > llm.max_seq_len:
        raise ValueError(f"a request needs {longest} positions; the context holds {llm.max_seq_len}")
    for ids, n in requests:
        llm.block_manager.check_fits(len(ids), n)
    offsets = arrival_offsets(len(requests), opts.request_rate, opts.seed)
    all_at_once = math.isinf(opts.request_rate) and opts.max_concurrency is None
    notes, runs, cache = {}, {m: [] for m in opts.modes}, {m: [] for m in opts.modes}
    if "hf" in opts.modes and not all_at_once:
        notes["hf"] = "runs only with every request at once (--request-rate inf, no --max-concurrency)"
    if "static" in opts.modes and not all_at_once:
        notes["static"] = "runs only with every request at once (--request-rate inf, no --max-concurrency)"
    digest = hashlib.sha256(json.dumps(requests).encode()).hexdigest()[:16]
    head = {"benchmark": "serve", "version": __version__, "command": None,
            "model": llm.source, "device": llm.device, "dtype": llm.dtype,
            "weights": llm.weights_summary,
            "options": {**{k: (None if isinstance(v, float) and math.isinf(v) else v)
                           for k, v in vars(opts).items()}, "max_num_seqs": llm.max_batch},
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "load_avg_before": os.getloadavg()},
            # Every mode ran these same requests (prompt ids, output lengths): their digest.
            "requests": {"count": len(requests), "sha256_16": digest, "same_for_every_mode": True}}
    tokenizer = llm.tokenizer
    # On a GPU our engine and HF's would share its memory (each sizes its KV pool from what is
    # free), so HF runs last, with the whole device, after our engine is freed: its weights are
    # copied to the host first. On the CPU the modes alternate per repeat, as the others do.
    hf_last = "hf" in opts.modes and "hf" not in notes and llm.device != "cpu"
    hf, hf_kwargs, hf_host = None, {}, None

    def start_hf():
        nonlocal hf, hf_kwargs
        try:
            weights, dtype = hf_host if hf_host is not None else hf_weights(llm)
            t0 = time.perf_counter()
            hf = hf_model(llm.config, weights, llm.device, dtype)
            hf_kwargs = _hf_batch_kwargs(hf, requests)
            # Warm-up: the manager, its cache, the kernels; a few tokens (the manager is sized
            # for the whole workload by hf_kwargs, not by this call).
            run_hf(hf, tokenizer, [(ids, min(n, 32)) for ids, n in requests[:2]], hf_kwargs)
            head["hf_setup_s"] = time.perf_counter() - t0
        except Exception as error:  # an opponent that cannot run here is a note, not a failure
            notes["hf"] = f"skipped: {type(error).__name__}: {error}"
            hf = None

    def result_now() -> dict:
        result = dict(head, versions=_versions(bool(runs.get("hf"))), notes=notes, modes={})
        _fill_modes(result, runs, cache)
        return result

    if "hf" in opts.modes and "hf" not in notes and not hf_last:
        start_hf()
    modes = [m for m in opts.modes if not (hf_last and m == "hf")]
    for repeat in range(opts.repeats):
        for mode in modes:
            if mode in notes:
                continue
            if mode == "static":
                records, wall = run_static(llm, requests)
            elif mode == "hf":
                records, wall = run_hf(hf, tokenizer, requests, hf_kwargs)
            else:
                # Every run starts with a cold prefix cache: hits come only from the run's own
                # requests (a shared prefix), never from the previous repeat's identical prompts.
                llm.block_manager.clear_prefix_cache()
                engine = AsyncLlama(llm, max_num_batched_tokens=opts.max_num_batched_tokens,
                                    decode_steps=opts.decode_steps, pipeline=opts.pipeline)
                before = engine.scheduler.usage()
                try:
                    if mode == "scheduler":
                        records, wall = run_scheduler(engine, opts, requests, offsets)
                    else:
                        records, wall = _with_server(engine, opts, requests, offsets)
                finally:
                    engine.close()
                after = engine.scheduler.usage()
                cache[mode].append({key: after[key] - before[key] for key in
                                    ("prefix_cache_queries", "prefix_cache_hits", "preemptions")})
            runs[mode].append((records, wall))
            if on_progress is not None:
                on_progress(result_now())
    if hf_last:
        hf_host = hf_weights(llm)
        llm.close()
        start_hf()
        if hf is not None:
            for repeat in range(opts.repeats):
                runs["hf"].append(run_hf(hf, tokenizer, requests, hf_kwargs))
                if on_progress is not None:
                    on_progress(result_now())
    return result_now()


def _fill_modes(result: dict, runs: dict, cache: dict) -> None:
    reference = runs["scheduler"][0][0] if runs.get("scheduler") else None
    for mode, repeats in runs.items():
        if not repeats:
            continue
        summaries = [summarize(records, wall) for records, wall in repeats]
        mid = sorted(range(len(summaries)), key=lambda i: summaries[i]["output_tok_s"])[len(summaries) // 2]
        for summary, counts in zip(summaries, cache.get(mode, [])):
            summary.update(counts)
            summary["prefix_cache_hit_rate"] = (counts["prefix_cache_hits"] / counts["prefix_cache_queries"]
                                                if counts["prefix_cache_queries"] else None)
        entry = dict(summaries[mid])
        entry["prompt_tok_s_spread"] = _spread([s["prompt_tok_s"] for s in summaries])
        entry["output_tok_s_spread"] = _spread([s["output_tok_s"] for s in summaries])
        entry["request_throughput_spread"] = _spread([s["request_throughput"] for s in summaries])
        entry["repeats"] = summaries
        if reference is not None:
            # Token ids where both sides have them; the text otherwise (the HTTP stream).
            same = [(a.ids == b.ids) if a.ids is not None else (a.text == b.text)
                    for a, b in zip(repeats[0][0], reference)]
            entry["agrees_with_scheduler"] = sum(same) / len(same)
        result["modes"][mode] = entry
    base = result["modes"].get("scheduler", {}).get("output_tok_s")
    for entry in result["modes"].values():
        entry["output_tok_s_vs_scheduler"] = entry["output_tok_s"] / base if base else None


def _versions(with_hf: bool) -> dict:
    """Versions of what ran; the server's packages only where they are installed (the in-process
    modes do not need them)."""
    import importlib.metadata

    out = {"python": platform.python_version(), "numpy": np.__version__}
    for name in ("fastapi", "uvicorn"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    if with_hf:
        import torch
        import transformers

        out.update(torch=torch.__version__, transformers=transformers.__version__)
    return out


def _with_server(engine, opts, requests, offsets):
    import socket

    import uvicorn

    from ..serving.server import build_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    server = uvicorn.Server(uvicorn.Config(build_app(engine, "bench"), host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        return run_http(port, "bench", opts, requests, offsets)
    finally:
        server.should_exit = True
        thread.join()


def table(result: dict) -> str:
    head = (f"{'mode':<10} {'done':>5} {'req/s':>7} {'in tok/s':>10} {'hit':>5} {'out tok/s':>10} "
            f"{'(min-max)':>15} {'vs sched':>8} "
            f"{'TTFT mean/med/p99 ms':>24} {'TPOT mean/med/p99 ms':>24} {'ITL mean/med/p99 ms':>24} {'agree':>6}")
    lines = [head, "-" * len(head)]

    def trio(s):
        return "/".join("-" if s[k] is None else f"{s[k]:.1f}" for k in ("mean", "median", "p99"))

    for mode, e in result["modes"].items():
        spread = e["output_tok_s_spread"]
        agree = e.get("agrees_with_scheduler")
        hit = e.get("prefix_cache_hit_rate")
        lines.append(
            f"{mode:<10} {e['completed']:>5} {e['request_throughput']:>7.2f} {e['prompt_tok_s']:>10.1f} "
            f"{'-' if hit is None else f'{hit:.0%}':>5} {e['output_tok_s']:>10.1f} "
            f"{spread['min']:>7.1f}-{spread['max']:<7.1f} {e['output_tok_s_vs_scheduler'] or 0:>8.2f} "
            f"{trio(e['ttft_ms']):>24} {trio(e['tpot_ms']):>24} {trio(e['itl_ms']):>24} "
            f"{'-' if agree is None else f'{agree:.0%}':>6}")
    for mode, note in result["notes"].items():
        lines.append(f"{mode}: {note}")
    return "\n".join(lines)
