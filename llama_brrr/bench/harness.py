"""The benchmark harness behind `llama-brrr bench` and `llama-brrr compare`.

A workload is B sequences of a P-token random prompt, then G greedy tokens each:
  TTFT            prompts in -> first tokens out (prefill of every sequence + the first sample)
  prefill tok/s   B x P / TTFT
  decode tok/s    B x G / (time of the G decode steps after the first token)
  ms per token    decode time / G (the latency one sequence sees per output token)
  MFU, MBU        analytic FLOPs and bytes of the phase (metrics.py) / (time x peak)
Every contestant gets one or more warm-up runs (first use of each kernel, graph capture,
torch.compile), then --repeats timed runs; medians with min / max and the spread. The timer's
edges wait for the device (a host copy of sampled tokens, or torch.cuda.synchronize).

Before speeds are compared (compare), every contestant's last-position logits on a check prompt
are compared with an fp32 PyTorch oracle on the same weights: the fp32 CPU path must be within
1e-3 (max |diff|); a 16-bit contestant's relative error (L2) must be at most 2x that of PyTorch
doing the same computation in that dtype (docs/design.md). On a real model the greedy tokens are also
compared with llama_brrr's. A contestant that disagrees keeps its numbers but is marked.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import shlex
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..config import shape_config
from . import metrics
from .contestants import Engine, HuggingFace, Reference, Skip
from .llamacpp import BenchError, LlamaCpp, LLAMA_CPP_INSTALL, available as llama_cpp_available
from .llamacpp import llama_bench_opponent

SEED = 1234
INIT_STD = 0.02
CHECK_PROMPT = 32         # tokens of the agreement-check prompt
AGREE_TOKENS = 32         # greedy tokens compared on a real model (docs/design.md)
F32_LOGIT_TOLERANCE = 1e-3
OPPONENTS = ("torch-eager", "hf-eager", "hf-sdpa", "torch-compile", "llama.cpp", "llama.cpp-cuda")
# Opponents that run the model file themselves, without PyTorch or the shared weights.
FILE_OPPONENTS = ("llama.cpp", "llama.cpp-cuda")

# Sweeps (issue 6): decode at batch x context, prefill at prompt lengths, three shapes.
SWEEP_SHAPES = ("smollm2-135m", "llama3.2-1b", "llama3-8b")
SWEEP_DECODE_BATCHES = (1, 4, 16, 64)
SWEEP_DECODE_CONTEXTS = (128, 2048)
SWEEP_PREFILL = (128, 512, 2048, 8192)


@dataclass(frozen=True)
class Workload:
    batch: int
    prompt: int
    generate: int

    @property
    def name(self) -> str:
        return f"b{self.batch} pp{self.prompt}" + (f" tg{self.generate}" if self.generate else "")


@dataclass
class Options:
    shape: str | None = "smollm2-135m"   # a config.SHAPES name, random weights
    model: str | None = None              # or a model file (wins over shape)
    device: str = "auto"
    dtype: str | None = None
    quant: str | None = None              # Llama.from_pretrained(quant=...): None = as stored
    threads: int = 0
    tensor_parallel: int = 1              # Llama.from_pretrained / random(tensor_parallel=...)
    repeats: int = 3
    warmup: int = 1
    contestants: tuple = ("llama_brrr",)
    budget_s: float = 1e9
    split: bool = True                    # the compute / memory / overhead split, when available
    on_run: object = None                 # called with the result so far after each workload
    command: str = field(default_factory=lambda: shlex.join([os.path.basename(sys.argv[0])] + sys.argv[1:]))


def sweep_groups(shape: str, decode_tokens: int, quick: bool) -> list[list[Workload]]:
    """The sweep's workloads, in groups that share one engine (decode: one KV cache sized for the
    largest batch x context; prefill: batch 1, the longest prompt)."""
    batches = (1, 16, 64) if quick else SWEEP_DECODE_BATCHES
    decode = [Workload(b, ctx, decode_tokens) for ctx in SWEEP_DECODE_CONTEXTS for b in batches]
    prefill = [Workload(1, p, 0) for p in SWEEP_PREFILL]
    return [decode, prefill]


class Budget:
    """Wall-clock allowance for a run; what would not fit is skipped, named."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


# ---- one timed workload ------------------------------------------------------------------------------

def measure(contestant, prompts: np.ndarray, generate: int, repeats: int, warmup: int) -> dict:
    """Times prefill + `generate` decode steps; returns TTFT and decode seconds per repeat and the
    greedy tokens of sequence 0 (last repeat; None from a contestant that times itself)."""
    if hasattr(contestant, "timed_runs"):  # a benchmark program that times itself (llama-bench)
        return contestant.timed_runs(prompts, generate, repeats, warmup)
    ttft, decode = [], []
    length = prompts.shape[1]
    for run in range(warmup + repeats):
        contestant.sync()
        t0 = time.perf_counter()
        token = contestant.prefill(prompts)
        contestant.sync()
        t1 = time.perf_counter()
        produced = [token]
        if hasattr(contestant, "decode_run"):  # llama_brrr: rounds in chunks, as generate() runs them
            produced += contestant.decode_run(token, length, generate)
        else:
            for step in range(generate):
                token = contestant.decode(token, length + step)
                produced.append(token)
        contestant.sync()
        t2 = time.perf_counter()
        if run >= warmup:
            ttft.append(t1 - t0)
            decode.append(t2 - t1)
    tokens = [contestant.tokens_list(t)[0] for t in produced]
    return {"ttft_s": ttft, "decode_s": decode if generate else [], "tokens": tokens}


# What building or running an opponent may raise instead of a result (torch.OutOfMemoryError is a
# RuntimeError): the opponent is then reported as skipped, with the error.
OPPONENT_ERRORS = (ImportError, RuntimeError, TypeError, ValueError, AttributeError,
                   NotImplementedError, MemoryError)


def measure_interleaved(contestants: list, prompts: np.ndarray, generate: int, repeats: int,
                        warmup: int, label: str) -> dict:
    """measure() for every contestant, the repeats taken in turns (round r times each contestant
    once), so a neighbour's load on a shared machine falls on all of them alike instead of on
    whichever ran during it. key -> measure()'s result plus wall_s, or {"error": ...}; llama_brrr
    (the first) may not fail."""
    out = {key: {"ttft_s": [], "decode_s": [], "tokens": None, "wall_s": 0.0}
           for key, _ in contestants}
    for round_ in range(warmup + repeats):
        for key, contestant in contestants:
            if "error" in out[key]:
                continue
            print(f"{label} {key} {'warm-up' if round_ < warmup else 'repeat'} "
                  f"{round_ + 1 - (warmup if round_ >= warmup else 0)}", file=sys.stderr, flush=True)
            started = time.perf_counter()
            try:
                timed = measure(contestant, prompts, generate, 1 if round_ >= warmup else 0,
                                0 if round_ >= warmup else 1)
            except OPPONENT_ERRORS as error:
                if key == "llama_brrr":
                    raise
                out[key] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                continue
            out[key]["wall_s"] += time.perf_counter() - started
            out[key]["ttft_s"] += timed["ttft_s"]
            out[key]["decode_s"] += timed["decode_s"]
            out[key]["tokens"] = timed["tokens"]
    return out


def rates(timed: dict, w: Workload, config, dtype: str, peak: dict, types: dict | None = None) -> dict:
    """The table's numbers from measure()'s seconds; types: the quantized matrices' block types
    (their stored bytes count in MBU)."""
    out = {"ttft_s": metrics.summarize(timed["ttft_s"]),
           "prefill_tok_s": metrics.summarize([w.batch * w.prompt / t for t in timed["ttft_s"]])}
    work = metrics.prefill_work(config, w.batch, w.prompt, dtype, types)
    out["prefill"] = {**work, **metrics.utilization(work, out["ttft_s"]["median"], peak)}
    if w.generate:
        out["decode_s"] = metrics.summarize(timed["decode_s"])
        out["decode_tok_s"] = metrics.summarize([w.batch * w.generate / t for t in timed["decode_s"]])
        out["ms_per_token"] = 1e3 * out["decode_s"]["median"] / w.generate
        work = metrics.decode_work(config, w.batch, w.prompt, w.generate, dtype, types)
        out["decode"] = {**work, **metrics.utilization(work, out["decode_s"]["median"], peak)}
    return out


def split(contestant, prompts: np.ndarray, w: Workload, config, dtype: str) -> dict:
    """compute / memory / overhead seconds per phase from the instrumentation layer, or why not."""
    import llama_brrr

    if not hasattr(llama_brrr, "profile"):
        return {"unavailable": "this llama_brrr has no instrumentation layer (llama_brrr.profile)"}
    keys = ("wall_s", "compute_s", "memory_s", "overhead_s", "mfu", "mbu", "dominant")
    try:
        if isinstance(contestant, Engine):
            prof = llama_brrr.profile()
            with prof:
                prof.attach(contestant.engine)  # the contestant drives the _C engine directly
                measure(contestant, prompts, w.generate, 1, 0)
            phases = prof.summary().to_dict()["phases"]
        elif hasattr(llama_brrr, "profile_torch") and hasattr(contestant, "torch"):
            phases = {}
            # PyTorch contestants hold every weight in `dtype`: no block types to count.
            work = metrics.prefill_work(config, w.batch, w.prompt, dtype, None)
            first = []
            summary = llama_brrr.profile_torch(lambda: first.append(contestant.prefill(prompts)),
                                               model_flops=work["flops"], model_bytes=work["bytes"],
                                               tokens=work["tokens"], phase="prefill")
            phases["prefill"] = summary.to_dict()["phases"]["prefill"]
            if w.generate:
                work = metrics.decode_work(config, w.batch, w.prompt, w.generate, dtype, None)

                def steps():
                    token = first[-1]
                    for step in range(w.generate):
                        token = contestant.decode(token, w.prompt + step)

                summary = llama_brrr.profile_torch(steps, model_flops=work["flops"],
                                                   model_bytes=work["bytes"], tokens=work["tokens"],
                                                   phase="decode")
                phases["decode"] = summary.to_dict()["phases"]["decode"]
        else:
            return {"unavailable": "no profiler for this contestant"}
    except Exception as error:  # the split is an add-on: its failure never costs the timing
        return {"unavailable": f"{type(error).__name__}: {str(error)[:200]}"}
    return {phase: {k: v.get(k) for k in keys} for phase, v in phases.items()}


# ---- the model and its weights -------------------------------------------------------------------------

def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(int(device.partition(":")[2] or 0))
    return metrics.cpu_model()


def resolve_device(device: str) -> str:
    from llama_brrr import _C

    if device == "auto":
        return "cuda" if _C.cuda_device_count() > 0 else "cpu"
    return device


def free_memory(device: str) -> float | None:
    """Bytes free on `device` (None when unknown)."""
    if device.startswith("cuda"):
        try:
            import torch

            return float(torch.cuda.mem_get_info(int(device.partition(":")[2] or 0))[0])
        except (ImportError, RuntimeError):
            return None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return None


def fits(config, dtype: str, device: str, batch: int, max_seq: int, copies: float, gpus: int = 1) -> str | None:
    """None when `copies` sets of weights plus the KV cache fit in free memory, else the note.
    gpus > 1: one tensor-parallel rank's share, 1/gpus of the weights and its KV heads (whole
    heads, at least one: a group wider than the KV heads replicates them), against `device`."""
    kv_heads = -(-config.n_kv_heads // gpus)
    need = (copies * metrics.weight_bytes(config, dtype) / gpus
            + metrics.kv_bytes(config, batch * max_seq, metrics.kv_dtype(dtype)) * kv_heads / config.n_kv_heads)
    free = free_memory(device)
    if free is not None and need > 0.9 * free:
        share = f" a GPU of {gpus}" if gpus > 1 else ""
        return (f"skipped: needs ~{need / 2**30:.1f} GiB{share} ({copies:g} weight copies + KV cache for "
                f"batch {batch} x {max_seq} positions), {free / 2**30:.1f} GiB free on {device}")
    return None


def build_llm(opts: Options, device: str, batch: int, max_seq: int):
    from llama_brrr import Llama

    if opts.model:
        return Llama.from_pretrained(opts.model, device=device, dtype=opts.dtype, max_seq_len=max_seq,
                                     max_batch=batch, n_threads=opts.threads, progress=False,
                                     **quant_argument(opts.quant), **_tp_argument(opts))
    return Llama.random(opts.shape, seed=SEED, device=device, dtype=opts.dtype, max_seq_len=max_seq,
                        max_batch=batch, n_threads=opts.threads, **_tp_argument(opts),
                        **({"quant": opts.quant} if opts.quant not in (None, "auto") else {}))


def _tp_argument(opts: Options) -> dict:
    """{"tensor_parallel": N} when N > 1, so a one-GPU run also works with an engine that predates it."""
    return {"tensor_parallel": opts.tensor_parallel} if opts.tensor_parallel != 1 else {}


def quant_argument(quant: str | None) -> dict:
    """{"quant": quant} for an engine whose from_pretrained takes it; {} for one that does not
    (which runs every file dequantized), unless a specific quantization was asked for."""
    import inspect

    from llama_brrr import Llama

    if "quant" in inspect.signature(Llama.from_pretrained).parameters:
        return {"quant": quant}
    if quant not in (None, "none"):
        raise ValueError(f"this llama_brrr's Llama.from_pretrained has no quant= argument "
                         f"(asked for quant={quant!r}); leave out --quant")
    return {}


def check_not_constant(llm) -> None:
    """Random weights must be random: zeros or constants hide bugs and run faster than data."""
    for name in ("layers.0.wo", "layers.0.attn_norm"):
        w = llm.engine.get_weight(name)
        if not np.isfinite(w).all() or float(w.std()) == 0.0:
            raise BenchError(f"weight {name} of {llm.source} is constant or not finite "
                             f"(std {float(w.std())}): refusing to time it")


def prompts_for(config, w: Workload) -> np.ndarray:
    return np.random.default_rng(SEED + w.prompt).integers(3, config.vocab_size,
                                                           size=(w.batch, w.prompt)).astype(np.int32)


# ---- bench ------------------------------------------------------------------------------------------------

def header(opts: Options, kind: str, device: str) -> dict:
    return {"benchmark": kind, "command": opts.command,
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": device, "device_name": device_name(device), "machine": metrics.machine(),
            "versions": metrics.versions(),
            "peaks": metrics.peaks_of_group(metrics.peaks(device_name(device)), opts.tensor_parallel),
            "repeats": opts.repeats, "warmup": opts.warmup,
            "definitions": {"ttft_s": "prompts in -> first tokens out (all sequences)",
                            "prefill_tok_s": "batch x prompt / ttft_s",
                            "decode_tok_s": "batch x generated / decode time after the first token",
                            "ms_per_token": "decode time / generated tokens",
                            "mfu": "analytic FLOPs / (time x peak bf16 FLOP/s)",
                            "mbu": "weights + KV bytes that must move / (time x peak bandwidth)",
                            "peaks": "of one device, or of all N under --tensor-parallel N"},
            "runs": [], "skipped": []}


def model_label(opts: Options) -> str:
    return os.path.basename(opts.model) if opts.model else opts.shape


def run_bench(opts: Options, groups: list[list[Workload]]) -> dict:
    """llama_brrr alone on each workload."""
    device = resolve_device(opts.device)
    result = header(opts, "bench", device)
    peak = result["peaks"]
    for group in groups:
        batch = max(w.batch for w in group)
        max_seq = max(w.prompt + w.generate + 1 for w in group)
        config = shape_config(opts.shape) if not opts.model else None
        if config is not None:
            note = fits(config, opts.dtype or default_dtype(device), device, batch, max_seq, 1,
                        opts.tensor_parallel)
            if note:
                result["skipped"].append({"model": model_label(opts), "workloads": [w.name for w in group],
                                          "note": note})
                continue
        llm = build_llm(opts, device, batch, max_seq)
        check_not_constant(llm)
        ours = Engine(llm)
        for w in group:
            prompts = prompts_for(llm.config, w)
            timed = measure(ours, prompts, w.generate, opts.repeats, opts.warmup)
            types = getattr(llm, "weight_types", None) or None
            run = {"model": model_label(opts), "dtype": llm.dtype if not types else f"{llm.dtype}+{opts.quant or 'file'}",
                   "weights": getattr(llm, "weights_summary", llm.dtype), "workload": w.__dict__,
                   "name": w.name, **rates(timed, w, llm.config, llm.dtype, peak, types)}
            if opts.split:
                run["split"] = split(ours, prompts, w, llm.config, llm.dtype)
            result["runs"].append(run)
            if opts.on_run:
                opts.on_run(result)
        del ours, llm
        gc.collect()
    return result


def default_dtype(device: str) -> str:
    return "bf16" if device.startswith("cuda") else "f32"


# ---- compare ----------------------------------------------------------------------------------------------

def compare_positions(w: Workload) -> int:
    """Cache positions a compare workload needs: its prompt and generation, and the agreement check."""
    return max(w.prompt + w.generate + 1, CHECK_PROMPT)


def build_opponent(key: str, opts: Options, llm, weights: dict, device: str, w: Workload,
                   compiled: dict):
    """One PyTorch / llama.cpp contestant for workload w, or Skip with the reason. A compiled
    decoder is kept in `compiled` per batch size and cache length, so workloads of one length share
    its compilation. Its static cache is sized for the workload, as gpt-fast sizes it per
    generation: its attention reads the whole cache under a mask, so a cache sized for the group's
    longest workload slowed its 128-token-prompt decode from 672 to 533 tok/s (H100, 1B shape,
    runs CS / CU)."""
    from .weights import canonical, torch_dtype

    config, dtype = llm.config, torch_dtype(llm.dtype)
    if key == "torch-eager":
        return Reference(config, canonical(weights, config), device, dtype)
    if key in ("hf-eager", "hf-sdpa"):
        return HuggingFace(config, weights, device, dtype, key.partition("-")[2])
    if key == "torch-compile":
        from .compiled import Compiled

        length = compare_positions(w)
        if compiled.get(w.batch, (None, None))[0] != length:
            compiled.pop(w.batch, None)  # its caches go before the next one's are allocated
            _empty_cache(device)
            compiled[w.batch] = (length, Compiled(config, weights, device, dtype, w.batch, length))
        return compiled[w.batch][1]
    if key == "llama.cpp":
        if not llama_cpp_available():
            raise Skip(f"llama-cpp-python is not installed ({LLAMA_CPP_INSTALL})")
        if not opts.model or not str(opts.model).endswith(".gguf"):
            raise Skip("llama.cpp runs GGUF model files, not random shapes: pass --model FILE.gguf")
        if w.batch != 1:
            raise Skip("llama.cpp is compared at batch 1 only")
        return LlamaCpp(str(llm.source), opts.threads or os.cpu_count(), w.prompt + w.generate + 1)
    if key == "llama.cpp-cuda":
        return llama_bench_opponent(opts, llm, device, w)
    raise ValueError(f"unknown contestant {key!r}; choose from llama_brrr, {', '.join(OPPONENTS)}")


def relative_error(x: np.ndarray, oracle: np.ndarray) -> float:
    return float(np.linalg.norm(x.astype(np.float64) - oracle) / np.linalg.norm(oracle))


class Checker:
    """The fp32 oracle's logits on the check prompt, and the error budget a contestant gets."""

    def __init__(self, llm, weights: dict, device: str):
        import torch

        from ..reference import ReferenceLlama
        from .weights import canonical, torch_dtype

        config = llm.config
        self.dtype = llm.dtype
        self.ids = list(np.random.default_rng(SEED).integers(3, config.vocab_size, size=CHECK_PROMPT))
        self.note = None
        self.oracle = self.torch_error = None
        if fits(config, "f32", device, 1, CHECK_PROMPT, 1.2):
            self.note = "unchecked: the fp32 oracle does not fit in free memory"
            return
        oracle = ReferenceLlama(config, {k: v.float() for k, v in canonical(weights, config).items()},
                                dtype=torch.float32, device=device)
        self.oracle = oracle.forward([self.ids])[0, -1].cpu().numpy().astype(np.float64)
        del oracle
        if self.dtype != "f32":
            same = ReferenceLlama(config, canonical(weights, config), dtype=torch_dtype(self.dtype),
                                  device=device)
            self.torch_error = relative_error(same.forward([self.ids])[0, -1].cpu().numpy(), self.oracle)
            del same
        gc.collect()

    def check(self, contestant) -> dict:
        if self.oracle is None:
            return {"agrees": None, "note": self.note}
        logits = np.asarray(contestant.last_logits(self.ids), dtype=np.float64)
        if self.dtype == "f32" and contestant.key != "llama.cpp":
            diff = float(np.abs(logits - self.oracle).max())
            return {"agrees": diff < F32_LOGIT_TOLERANCE, "max_abs_diff": diff,
                    "limit": F32_LOGIT_TOLERANCE, "rule": "fp32: max |logit - oracle| < 1e-3"}
        error = relative_error(logits, self.oracle)
        limit = 2 * self.torch_error if self.torch_error else None
        if limit is None:  # llama.cpp on an f32 run: its own weight / KV widths, so information only
            return {"agrees": True, "relative_error": error, "rule": "information only"}
        return {"agrees": error <= limit, "relative_error": error, "limit": limit,
                "rule": f"relative L2 error vs the fp32 oracle <= 2x torch {self.dtype}'s "
                        f"({self.torch_error:.2e})"}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def run_compare(opts: Options, groups: list[list[Workload]]) -> dict:
    """llama_brrr and the opponents on each workload, on the same weights, checked, as ratios."""
    device = resolve_device(opts.device)
    result = header(opts, "compare", device)
    result["contestants_requested"] = list(opts.contestants)
    peak = result["peaks"]
    budget = Budget(opts.budget_s)
    for group in groups:
        batch = max(w.batch for w in group)
        max_seq = max(compare_positions(w) for w in group)
        dtype = opts.dtype or default_dtype(device)
        if not opts.model:
            note = fits(shape_config(opts.shape), dtype, device, batch, max_seq, 2)
            if note:
                result["skipped"].append({"model": model_label(opts), "workloads": [w.name for w in group],
                                          "note": note})
                continue
        llm = build_llm(opts, device, batch, max_seq)
        check_not_constant(llm)
        ours = Engine(llm)
        weights, checker = None, None
        if any(k not in ("llama_brrr", *FILE_OPPONENTS) for k in opts.contestants):
            try:
                from .weights import shared_weights

                weights = shared_weights(llm, None if opts.model else SEED, INIT_STD, device)
                checker = Checker(llm, weights, device)
            except ImportError as error:
                result["skipped"].append({"model": model_label(opts), "note": f"PyTorch opponents: {error}"})
        compiled: dict = {}
        for w in group:
            result["runs"].append(compare_workload(opts, w, llm, ours, weights, checker, device,
                                                   peak, budget, compiled))
            if opts.on_run:
                opts.on_run(result)
        del ours, llm, weights, checker, compiled
        _reset_dynamo()
        gc.collect()
        _empty_cache(device)
    return result


def compare_workload(opts, w, llm, ours, weights, checker, device, peak, budget, compiled) -> dict:
    config = llm.config
    prompts = prompts_for(config, w)
    run = {"model": model_label(opts), "dtype": llm.dtype, "workload": w.__dict__, "name": w.name,
           "contestants": {}, "ratios": {}}
    entries = run["contestants"]
    contestants = [("llama_brrr", ours)]
    for key in (k for k in opts.contestants if k != "llama_brrr"):
        if weights is None and key not in FILE_OPPONENTS:
            entries[key] = {"skipped": "PyTorch is not installed"}
            continue
        need = 120 if key == "torch-compile" else 15
        if budget.left() < need:
            entries[key] = {"skipped": f"out of --budget-s (needs ~{need} s, {max(budget.left(), 0):.0f} s left)"}
            continue
        print(f"[{run['model']} {w.name}] building {key} ...", file=sys.stderr, flush=True)
        try:
            contestants.append((key, build_opponent(key, opts, llm, weights, device, w, compiled)))
        except Skip as why:
            entries[key] = {"skipped": str(why)}
        except OPPONENT_ERRORS as error:
            entries[key] = {"skipped": f"{type(error).__name__}: {str(error)[:300]}"}
            _empty_cache(device)
    timings = measure_interleaved(contestants, prompts, w.generate, opts.repeats, opts.warmup,
                                  f"[{run['model']} {w.name}]")
    reference_tokens = timings["llama_brrr"]["tokens"]
    for key, contestant in list(contestants):
        timed = timings[key]
        if "error" in timed:
            entries[key] = {"skipped": timed["error"]}
            contestants.remove((key, contestant))
            continue
        entries[key] = {"label": contestant.label, "note": contestant.note,
                        **({"settings": contestant.settings} if hasattr(contestant, "settings") else {}),
                        "wall_s": timed["wall_s"], **rates(timed, w, config, llm.dtype, peak)}
        if key != "llama_brrr" and opts.model and w.generate and timed["tokens"] is not None:
            n = min(AGREE_TOKENS, w.generate + 1)
            where = first_difference(timed["tokens"][:n], reference_tokens[:n])
            entries[key]["greedy_tokens_match_llama_brrr"] = {"compared": n, "first_difference": where}
    for key, contestant in contestants:
        entry = entries[key]
        if checker is not None:
            try:
                entry["check"] = checker.check(contestant)
            except (RuntimeError, ValueError) as error:
                entry["check"] = {"agrees": None, "note": f"check failed to run: {error}"}
        match = entry.get("greedy_tokens_match_llama_brrr")
        if match and match["first_difference"] is not None and entry.get("check", {}).get("agrees"):
            entry["check"]["agrees"] = False
            entry["check"]["note"] = f"greedy tokens differ from llama_brrr's at {match['first_difference']}"
        if opts.split:
            # A profiled PyTorch decode and the parsing of its ~10^5 events take about a minute
            # (timed on the H100, 1B shape, 128 tokens); a run without the time left says so.
            need = 10 if key == "llama_brrr" else 60
            entry["split"] = (split(contestant, prompts, w, config, llm.dtype) if budget.left() >= need
                              else {"unavailable": f"out of --budget-s (the split needs ~{need} s, "
                                                   f"{max(budget.left(), 0):.0f} s left)"})
        if key != "llama_brrr":
            run["ratios"][key] = ratio(entries["llama_brrr"], entry)
    del contestants
    gc.collect()
    _empty_cache(device)
    return run


def ratio(ours: dict, theirs: dict) -> dict:
    """llama_brrr's median rate over the opponent's, per phase; flagged when they disagree."""
    out = {"agrees": theirs.get("check", {}).get("agrees")}
    for metric in ("prefill_tok_s", "decode_tok_s"):
        if metric in ours and metric in theirs:
            out[metric] = ours[metric]["median"] / theirs[metric]["median"]
    return out


def _reset_dynamo() -> None:
    """Frees torch.compile's graphs (and their CUDA-graph memory pools) of the finished group."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch

        torch._dynamo.reset()


def _empty_cache(device: str) -> None:
    if device.startswith("cuda"):
        with contextlib.suppress(ImportError):
            import torch

            torch.cuda.empty_cache()


# ---- llama.cpp as the CPU peer: a GGUF and its requantized twins ---------------------------------------

# Issue 31's targets: llama_brrr's median over llama.cpp's, same file, same threads, same run.
PEER_TARGETS = {"decode_tok_s": {"Q4_1": 1.6, "Q4_K_M": 1.6, "Q8_0": 1.3}, "prefill_tok_s": 1.0}
PPL_TOLERANCE = 0.01      # docs/design.md: perplexity within 1% of llama.cpp's on the same file

_RSS_PROBE = r"""
import json, sys
which, path, threads, n_ctx, quant = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if which == "llama_brrr":
    from llama_brrr import Llama
    from llama_brrr.bench.harness import quant_argument
    model = Llama.from_pretrained(path, device="cpu", max_seq_len=n_ctx, max_batch=1, n_threads=threads,
                                  progress=False, **quant_argument(None if quant == "-" else quant))
else:
    from llama_brrr.bench.llamacpp import open_llama
    model = open_llama(path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads, n_gpu_layers=0, verbose=False)
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
kib = lambda key: int(status[key].split()[0]) * 1024
print(json.dumps({"rss_after_load": kib("VmRSS"), "peak_rss": kib("VmHWM")}))
"""


def load_rss(which: str, path: str, threads: int, n_ctx: int, quant: str | None) -> dict:
    """RSS of a fresh process right after `which` (llama_brrr | llama.cpp) loaded `path`, and its
    peak (VmHWM) until then; a process of its own, so neither side's memory counts for the other."""
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-c", _RSS_PROBE, which, path, str(threads), str(n_ctx),
                           quant or "-"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"unavailable": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main_type(census: dict) -> str:
    """The type most of a file's matrices have (Q4_1 for the default file)."""
    quantized = {k: v for k, v in census["types"].items() if k not in ("F32",)}
    return max(quantized or census["types"], key=lambda k: (quantized or census["types"])[k])


def peer_perplexity(path: str, opts: Options) -> dict:
    """Perplexity of llama_brrr (as it runs this file in the benchmark) and of llama.cpp, same ids."""
    from . import perplexity

    llm = perplexity.load_llama_brrr(path, quant=opts.quant, threads=opts.threads)
    ids, bos = perplexity.text_ids(llm.tokenizer), perplexity.bos_for(llm.tokenizer)
    ours = perplexity.llama_brrr_perplexity(llm, ids)
    del llm
    gc.collect()
    theirs = perplexity.llama_cpp_perplexity(path, ids, bos, threads=opts.threads or os.cpu_count())
    ratio = ours["ppl"] / theirs["ppl"]
    return {"text": str(perplexity.TEXT_PATH.name), "convention": ours["convention"],
            "n_tokens": ours["n_tokens"], "llama_brrr": ours["ppl"], "llama.cpp": theirs["ppl"],
            "ratio": ratio, "within_1pct": abs(ratio - 1) < PPL_TOLERANCE,
            "nll_per_window": {"llama_brrr": ours["nll_per_window"], "llama.cpp": theirs["nll_per_window"]},
            "llama_cpp_extra_buffer_types": theirs["extra_buffer_types"]}


def peer_targets(result: dict) -> list[dict]:
    """Each measured ratio beside its issue target."""
    rows = []
    for run in result["runs"]:
        ratio = run["ratios"].get("llama.cpp", {})
        for metric in ("decode_tok_s", "prefill_tok_s"):
            if metric not in ratio or (metric == "decode_tok_s" and not run["workload"]["generate"]):
                continue
            if metric == "prefill_tok_s" and run["workload"]["generate"]:
                continue  # a decode workload's short prompt says little about prefill
            target = PEER_TARGETS[metric]
            target = target.get(run["file_type"]) if isinstance(target, dict) else target
            ours, theirs = run["contestants"]["llama_brrr"][metric], run["contestants"]["llama.cpp"][metric]
            rows.append({"file_type": run["file_type"], "workload": run["name"], "metric": metric,
                         "llama_brrr": ours["median"], "llama_brrr_spread_pct": ours["spread_pct"],
                         "llama.cpp": theirs["median"], "llama.cpp_spread_pct": theirs["spread_pct"],
                         "ratio": ratio[metric], "target": target,
                         "met": None if target is None else ratio[metric] >= target})
    return rows


def run_quant_peer(opts: Options, groups: list[list[Workload]], twins: list[str],
                   with_perplexity: bool) -> dict:
    """compare on a GGUF file and on its requantizations by llama.cpp's quantize (twins: Q8_0,
    Q4_K_M), each file's contestants in the same run; per file: its tensor-type census, peak RSS
    after load of each side, and (with_perplexity) both sides' perplexity on the fixed text."""
    import dataclasses
    from pathlib import Path

    from .. import fetch
    from .llamacpp import TWIN_TYPES, quantize_tool, reference_gguf, tensor_census

    if not llama_cpp_available():
        raise BenchError(f"--quant-twins needs llama-cpp-python ({LLAMA_CPP_INSTALL})")
    wanted = [t.upper() for t in twins]
    bad = [t for t in wanted if t not in TWIN_TYPES]
    if bad:
        raise ValueError(f"--quant-twins: unknown {bad}; choose from {', '.join(t.lower() for t in TWIN_TYPES)}")
    source = Path(opts.model)
    threads = opts.threads or os.cpu_count()
    files = [(None, source)]
    cache = fetch.cache_dir() / "bench"
    sha = fetch.sha256_of(source)
    files += [(t, reference_gguf(source, sha, t, cache, threads)) for t in wanted]
    result = None
    n_ctx = max(compare_positions(w) for group in groups for w in group)
    for twin, path in files:
        census = tensor_census(path)
        label = twin or main_type(census)
        print(f"[{path.name}] {label}: {census['types']}", file=sys.stderr, flush=True)
        done_before = result["runs"] if result else []

        def save(part, label=label, done_before=done_before):
            for run in part["runs"]:
                run.setdefault("file_type", label)
            if opts.on_run:
                opts.on_run({**part, "runs": done_before + part["runs"]})

        part = run_compare(dataclasses.replace(opts, model=str(path), on_run=save), groups)
        for run in part["runs"]:
            run["file_type"] = label
        entry = {"path": str(path), "file_bytes": path.stat().st_size, "census": census,
                 "made_by": quantize_tool() + f" from {source.name} (allow_requantize)" if twin else "the source file",
                 "rss": {which: load_rss(which, str(path), threads, n_ctx, opts.quant)
                         for which in ("llama_brrr", "llama.cpp")}}
        if with_perplexity:
            entry["perplexity"] = peer_perplexity(str(path), opts)
            for run in part["runs"]:
                lc = run["contestants"].get("llama.cpp", {})
                if "skipped" not in lc and lc:
                    lc["check"] = {"agrees": entry["perplexity"]["within_1pct"],
                                   "ppl_ratio": entry["perplexity"]["ratio"],
                                   "rule": "perplexity on the fixed text within 1% of llama_brrr's"}
                    run["ratios"]["llama.cpp"]["agrees"] = lc["check"]["agrees"]
        if result is None:
            result = part
            result["files"] = {}
        else:
            result["runs"] += part["runs"]
            result["skipped"] += part["skipped"]
        # Other people's work on a shared machine shows here (the benchmark's own threads count 2).
        entry["load_average_after"] = list(os.getloadavg())
        result["files"][label] = entry
    result["benchmark"] = "compare_quant"
    result["threads"] = threads
    result["targets"] = peer_targets(result)
    return result
