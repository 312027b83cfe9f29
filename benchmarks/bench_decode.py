"""Batch-1 decode on the GPU: llama_brrr's CUDA engine against PyTorch, in one run, on one GPU.

For each model shape (random N(0, 0.02) bf16 weights; norms 1 + N(0, 0.02)):
  ours            _C.Engine("cuda"): prefill 127 prompt tokens, then decode + greedy sample per
                  token (graph replay, one host sync per token, in sample), as Llama.generate does
  torch-eager     llama_brrr.reference.ReferenceLlama in bf16 on the same weights
  hf-eager        transformers LlamaForCausalLM (sdpa, DynamicCache) on the same weights
  torch-compile   a gpt-fast-style static-KV-cache decode step, torch.compile(mode="reduce-overhead")
The torch opponents get exactly the engine's weights: the engine's init_random draws each canonical
tensor with fill_normal_bf16 under init_random_key(seed, index), and so does this script.

Reported per shape: tok/s (median, min, max over --repeats after a warm-up), MBU = bytes that must
move per token (every weight once + the KV cache read at that position) x tok/s / peak, against both
the measured device copy bandwidth (read + write of 1 GiB) and the datasheet; per decode projection
the GB/s of our matmul kernels (from a torch.profiler trace of eager decode steps) and of cuBLAS
(torch.matmul [1, K] x [K, N]), each as a fraction of the copy bandwidth.

    python benchmarks/bench_decode.py                   # llama3.2-1b and llama3-8b, everything
    python benchmarks/bench_decode.py --quick           # fewer tokens; torch.compile on the 1B only
    python benchmarks/bench_decode.py --shapes llama3.2-1b --out /tmp/decode.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from llama_brrr.config import ModelConfig, shape_config  # noqa: E402

SEED = 1234
INIT_STD = 0.02
# Datasheet HBM bandwidth (bytes/s) by a substring of torch.cuda.get_device_name(); first match wins.
DATASHEET_BW = [("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("A100-SXM4-80GB", 2.039e12),
                ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12), ("L40S", 0.864e12), ("A10", 0.6e12)]


class Budget:
    """Wall-clock allowance for the whole run; opponents that would not fit are skipped, named."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def require(self, seconds: float, what: str) -> None:
        if self.left() < seconds:
            raise BudgetExceeded(f"skipped: {what} needs ~{seconds:.0f} s, {max(self.left(), 0):.0f} s of "
                                 f"the --budget-s allowance left")


class BudgetExceeded(Exception):
    pass


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def summarize(rates: list[float]) -> dict:
    median = statistics.median(rates)
    return {"tok_s_repeats": rates, "tok_s_median": median, "tok_s_min": min(rates),
            "tok_s_max": max(rates), "spread_pct": 100.0 * (max(rates) - min(rates)) / median}


def sync() -> None:
    torch.cuda.synchronize()


# ---- bytes that must move -------------------------------------------------------------------------

def weight_bytes_per_token(c: ModelConfig) -> int:
    """bf16 bytes of every matrix the decode of one token reads, plus norms and one embedding row."""
    per_layer = (c.q_dim + 2 * c.kv_dim) * c.dim + c.dim * c.q_dim + 3 * c.hidden_dim * c.dim + 2 * c.dim
    return 2 * (c.n_layers * per_layer + c.vocab_size * c.dim + c.dim + c.dim)


def kv_bytes_per_token(c: ModelConfig, prompt_len: int, n_new: int) -> float:
    """Mean bf16 bytes of K and V read by attention, plus the row written, over the decode steps
    (positions prompt_len - 1 .. prompt_len + n_new - 2: the last prompt token is decoded, as in
    Llama.generate)."""
    mean_keys = statistics.mean(range(prompt_len, prompt_len + n_new))  # keys = position + 1
    return 2 * 2 * c.n_layers * c.kv_dim * (mean_keys + 1)


def copy_bandwidth() -> float:
    """Device-to-device copy of 1 GiB, counting read + write, best of 10 (bytes/s)."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    best = math.inf
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / best


# ---- the weights, identical to the engine's init_random -------------------------------------------

def canonical_weights(C, config: ModelConfig, seed: int) -> dict:
    """name -> bf16 CUDA tensor, drawn exactly like Engine.init_random(seed, INIT_STD). wq|wk|wv and
    w1|w3 are row ranges of one fused tensor per layer (also returned, as "layers.i.wqkv"/"w13")."""
    names = list(config.tensor_shapes())
    shapes = config.tensor_shapes()
    tensors = {}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        wqkv = torch.empty(config.q_dim + 2 * config.kv_dim, config.dim, dtype=torch.bfloat16, device="cuda")
        w13 = torch.empty(2 * config.hidden_dim, config.dim, dtype=torch.bfloat16, device="cuda")
        tensors[p + "wqkv"], tensors[p + "w13"] = wqkv, w13
        tensors[p + "wq"] = wqkv[: config.q_dim]
        tensors[p + "wk"] = wqkv[config.q_dim: config.q_dim + config.kv_dim]
        tensors[p + "wv"] = wqkv[config.q_dim + config.kv_dim:]
        tensors[p + "w1"], tensors[p + "w3"] = w13[: config.hidden_dim], w13[config.hidden_dim:]
    for index, name in enumerate(names):
        if name not in tensors:
            tensors[name] = torch.empty(shapes[name], dtype=torch.bfloat16, device="cuda")
        t = tensors[name]
        mean = 1.0 if name.endswith("norm") else 0.0
        C.cuda_ops.fill_normal_bf16(t.data_ptr(), t.numel(), C.cuda_ops.init_random_key(seed, index),
                                    mean, INIT_STD)
    return tensors


# ---- ours -----------------------------------------------------------------------------------------

def bench_ours(C, config, prompt, n_new, repeats):
    engine = C.Engine("cuda", config.engine_dict(len(prompt) + n_new + 1, 1), "bf16", 0)
    engine.init_random(SEED, INIT_STD)
    slots = np.zeros(1, np.int32)
    pos = np.zeros(1, np.int32)
    tok = np.zeros(1, np.int32)
    greedy = (np.zeros(1, np.float32), np.zeros(1, np.int32), np.ones(1, np.float32),
              np.zeros(1, np.float32), np.ones(1, np.float32), np.zeros(1, np.uint64))

    def run():
        engine.prefill(0, prompt[:-1], 0, "none")
        tok[0], pos[0] = prompt[-1], len(prompt) - 1
        generated = []
        sync()
        start = time.perf_counter()
        for step in range(n_new):
            engine.decode(tok, slots, pos, False)
            chosen, _ = engine.sample(slots, pos, *greedy, np.full(1, step, np.uint64))
            tok[0] = chosen[0]
            pos[0] += 1
            generated.append(int(chosen[0]))
        sync()
        return n_new / (time.perf_counter() - start), generated

    run()  # warm-up: first use of every kernel, capture of the B = 1 graph
    results = [run() for _ in range(repeats)]
    out = summarize([r[0] for r in results])
    out["tokens"] = results[0][1]
    return engine, out


def bench_ours_matmuls(engine, config, prompt):
    """Per-kernel times of our matmuls in eager decode steps (a graph replay hides its kernels from
    some profiler versions), mapped to shapes by their order in the forward pass."""
    from torch.profiler import ProfilerActivity, profile
    engine.use_cuda_graphs = False
    engine.prefill(0, prompt, 0, "none")
    steps = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for step in range(steps):
            engine.decode(np.array([prompt[step]], np.int32), np.zeros(1, np.int32),
                          np.array([len(prompt) + step], np.int32), False)
        sync()
    engine.use_cuda_graphs = True
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    matmuls = [e for e in kernels if re.search(r"gemv|gemm|matmul", e.name, re.I)]
    per_step = 4 * config.n_layers + 1
    if len(matmuls) != steps * per_step:
        names = sorted({e.name for e in kernels})
        return {"skipped": f"found {len(matmuls)} matmul kernels for {steps} steps, expected "
                           f"{steps * per_step} (4 per layer + LM head); kernel names: {names[:20]}"}
    order = ["wqkv", "wo", "w13", "w2"]
    times: dict[str, list[float]] = {k: [] for k in order + ["lm_head"]}
    for s in range(steps):
        chunk = matmuls[s * per_step:(s + 1) * per_step]
        for i, event in enumerate(chunk[:-1]):
            times[order[i % 4]].append(event.time_range.elapsed_us() * 1e-6)
        times["lm_head"].append(chunk[-1].time_range.elapsed_us() * 1e-6)
    return {name: statistics.median(t) for name, t in times.items()}


# ---- the PyTorch opponents ------------------------------------------------------------------------

def matmul_shapes(config):
    c = config
    return {"wqkv": (c.q_dim + 2 * c.kv_dim, c.dim), "wo": (c.dim, c.q_dim),
            "w13": (2 * c.hidden_dim, c.dim), "w2": (c.dim, c.hidden_dim), "lm_head": (c.vocab_size, c.dim)}


def bench_cublas(config):
    """torch.matmul of one bf16 row by each decode matrix (cuBLAS GEMV), median of 50 (seconds)."""
    out = {}
    for name, (n, k) in matmul_shapes(config).items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * INIT_STD
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(5):
            torch.matmul(x, w.T)
        times = []
        for _ in range(50):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(x, w.T)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        out[name] = statistics.median(times)
        del w, x
    torch.cuda.empty_cache()
    return out


def timed_greedy_loop(step_fn, first_token, n_new, repeats):
    """Runs `step_fn(token, position) -> next token (device tensor)` n_new times per repeat."""
    rates = []
    for _ in range(repeats + 1):
        tok = first_token()
        sync()
        start = time.perf_counter()
        for i in range(n_new):
            tok = step_fn(tok, i)
        sync()
        rates.append(n_new / (time.perf_counter() - start))
    return summarize(rates[1:])  # the first repeat is the warm-up


@torch.no_grad()
def bench_reference(config, weights, prompt, n_new, repeats):
    from llama_brrr.reference import ReferenceLlama
    ref = ReferenceLlama(config, {k: v for k, v in weights.items() if k in config.tensor_shapes()},
                         dtype=torch.bfloat16, device="cuda")
    n_prompt = len(prompt)

    def first_token():
        ref.reset()
        return ref.forward(torch.as_tensor(prompt, device="cuda"), start_pos=0)[0, -1].argmax().view(1, 1)

    def step(tok, i):
        return ref.forward(tok, start_pos=n_prompt + i)[0, -1].argmax().view(1, 1)

    return timed_greedy_loop(step, first_token, n_new, repeats)


def hf_model(config, weights):
    """LlamaForCausalLM (sdpa) of the shape, its parameters replaced by the shared weights."""
    from transformers import LlamaConfig, LlamaForCausalLM
    hf_config = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.dim, intermediate_size=config.hidden_dim,
        num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta, rope_scaling=config.rope_scaling,
        tie_word_embeddings=config.tie_embeddings, attn_implementation="sdpa")
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(hf_config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.eval()

    def put(module, name, tensor):
        module._parameters[name] = torch.nn.Parameter(tensor, requires_grad=False)

    put(model.model.embed_tokens, "weight", weights["tok_embeddings"])
    put(model.model.norm, "weight", weights["norm"])
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    else:
        put(model.lm_head, "weight", weights["output"])
    for i, layer in enumerate(model.model.layers):
        p = f"layers.{i}."
        for module, name in ((layer.self_attn.q_proj, "wq"), (layer.self_attn.k_proj, "wk"),
                             (layer.self_attn.v_proj, "wv"), (layer.self_attn.o_proj, "wo"),
                             (layer.mlp.gate_proj, "w1"), (layer.mlp.up_proj, "w3"),
                             (layer.mlp.down_proj, "w2")):
            put(module, "weight", weights[p + name])
        put(layer.input_layernorm, "weight", weights[p + "attn_norm"])
        put(layer.post_attention_layernorm, "weight", weights[p + "ffn_norm"])
    gc.collect()
    torch.cuda.empty_cache()
    return model


@torch.no_grad()
def bench_hf(config, weights, prompt, n_new, repeats):
    model = hf_model(config, weights)
    ids = torch.as_tensor(prompt, device="cuda").view(1, -1)
    state = {}

    def first_token():
        out = model(input_ids=ids, use_cache=True)
        state["cache"] = out.past_key_values
        return out.logits[0, -1].argmax().view(1, 1)

    def step(tok, i):
        out = model(input_ids=tok, past_key_values=state["cache"], use_cache=True)
        state["cache"] = out.past_key_values
        return out.logits[0, -1].argmax().view(1, 1)

    return timed_greedy_loop(step, first_token, n_new, repeats)


class StaticCacheDecoder(torch.nn.Module):
    """One decode step with a preallocated KV cache and fused wqkv/w13 (the gpt-fast recipe), the
    math of reference.py: fp32 RMSNorm statistics, fp32 RoPE angles, rotate-half."""

    def __init__(self, config, weights, max_seq):
        super().__init__()
        from llama_brrr.reference import rope_inv_freq
        c = self.c = config
        self.w = weights
        self.register_buffer("k_cache", torch.zeros(c.n_layers, 1, c.n_kv_heads, max_seq, c.head_dim,
                                                    dtype=torch.bfloat16, device="cuda"))
        self.register_buffer("v_cache", torch.zeros_like(self.k_cache))
        self.register_buffer("inv_freq", rope_inv_freq(config).to("cuda"))
        self.register_buffer("positions", torch.arange(max_seq, device="cuda"))
        self.lm_head = weights["tok_embeddings" if c.tie_embeddings else "output"]

    def rmsnorm(self, x, weight):
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.c.norm_eps)).to(x.dtype)

    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(self, token, pos):
        """token [1] int64, pos [1] int64 (device) -> the greedy next token [1]."""
        c = self.c
        angles = pos.float()[:, None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
        mask = (self.positions <= pos).view(1, 1, 1, -1)
        x = self.w["tok_embeddings"][token]  # [1, D]
        for i in range(c.n_layers):
            p = f"layers.{i}."
            h = self.rmsnorm(x, self.w[p + "attn_norm"])
            qkv = h @ self.w[p + "wqkv"].T
            q, k, v = qkv.split([c.q_dim, c.kv_dim, c.kv_dim], dim=-1)
            q = self.rope(q.view(1, c.n_heads, 1, c.head_dim), cos, sin)
            k = self.rope(k.view(1, c.n_kv_heads, 1, c.head_dim), cos, sin)
            self.k_cache[i].index_copy_(2, pos, k)
            self.v_cache[i].index_copy_(2, pos, v.view(1, c.n_kv_heads, 1, c.head_dim))
            attn = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i], attn_mask=mask,
                                                  enable_gqa=c.n_heads != c.n_kv_heads)
            x = x + attn.view(1, c.q_dim) @ self.w[p + "wo"].T
            h = self.rmsnorm(x, self.w[p + "ffn_norm"])
            gate, up = (h @ self.w[p + "w13"].T).split(c.hidden_dim, dim=-1)
            x = x + (F.silu(gate) * up) @ self.w[p + "w2"].T
        logits = self.rmsnorm(x, self.w["norm"]) @ self.lm_head.T
        return logits.argmax(-1)


@torch.no_grad()
def bench_compiled(config, weights, prompt, n_new, repeats):
    decoder = StaticCacheDecoder(config, weights, len(prompt) + n_new + 1)
    step_fn = torch.compile(decoder.forward, mode="reduce-overhead", fullgraph=True)
    pos = torch.zeros(1, dtype=torch.long, device="cuda")
    n_prompt = len(prompt)

    def first_token():
        # The prompt goes through the same step function (this bench times decode only).
        for i in range(n_prompt):
            pos.fill_(i)
            nxt = step_fn(torch.as_tensor(prompt[i:i + 1], device="cuda").long(), pos).clone()
        return nxt

    def step(tok, i):
        pos.fill_(n_prompt + i)
        return step_fn(tok, pos).clone()

    compile_start = time.perf_counter()
    first_token()
    compile_s = time.perf_counter() - compile_start
    result = timed_greedy_loop(step, first_token, n_new, repeats)
    result["compile_and_first_prompt_s"] = compile_s
    torch._dynamo.reset()
    return result


# ---- driver ---------------------------------------------------------------------------------------

def opponent(name, budget, need_s, fn, *args):
    """Runs one opponent; a missing package, an unsupported feature or the budget is a named skip."""
    try:
        budget.require(need_s, name)
        return fn(*args)
    except BudgetExceeded as error:
        return {"skipped": str(error)}
    except (ImportError, RuntimeError, TypeError, ValueError, AttributeError, NotImplementedError,
            torch.OutOfMemoryError) as error:
        torch.cuda.empty_cache()
        return {"skipped": f"{type(error).__name__}: {str(error)[:400]}"}


def run_ours(C, name, args, budget, copy_bw, datasheet_bw):
    """Our engine on one shape: tok/s and MBU, and every decode matmul against cuBLAS."""
    config = shape_config(name)
    prompt = bench_prompt(config, args.prompt)
    n_new = args.new_tokens
    w_bytes = weight_bytes_per_token(config)
    kv_bytes = kv_bytes_per_token(config, args.prompt, n_new)
    result = {"config": config.to_dict(), "prompt_tokens": args.prompt, "new_tokens": n_new,
              "weight_bytes_per_token": w_bytes, "kv_bytes_per_token_mean": kv_bytes}
    print(f"[{name}] ours ...", flush=True)
    engine, ours = bench_ours(C, config, prompt, n_new, args.repeats)
    result["ours_first_tokens"] = ours.pop("tokens")[:16]
    add_mbu(ours, ours, w_bytes + kv_bytes, copy_bw, datasheet_bw)
    result["ours"] = ours
    matmul_times = opponent("matmul profile", budget, 10, bench_ours_matmuls, engine, config, prompt)
    del engine
    gc.collect()
    cublas = opponent("cuBLAS GEMV", budget, 10, bench_cublas, config)
    result["matmuls"] = {}
    for key, (n, k) in matmul_shapes(config).items():
        moved = 2 * (n * k + n + k)
        entry = {"N": n, "K": k, "bytes": moved}
        for who, times in (("ours", matmul_times), ("cublas", cublas)):
            if "skipped" in times:
                entry[who] = times["skipped"]
            else:
                gbs = moved / times[key] / 1e9
                entry[f"{who}_us"] = times[key] * 1e6
                entry[f"{who}_GBps"] = gbs
                entry[f"{who}_frac_of_copy_bw"] = gbs * 1e9 / copy_bw
        result["matmuls"][key] = entry
    return result


def run_opponents(C, name, result, args, budget, copy_bw, datasheet_bw):
    """The PyTorch opponents on the engine's own weights, after every shape's own numbers are in."""
    config = shape_config(name)
    prompt = bench_prompt(config, args.prompt)
    bytes_per_token = result["weight_bytes_per_token"] + kv_bytes_per_token(config, args.prompt,
                                                                            args.opponent_tokens)
    weights = canonical_weights(C, config, SEED)
    big = config.n_params() > 3e9
    for key, fn, need_s in (("torch-eager", bench_reference, 30), ("hf-eager", bench_hf, 30),
                            ("torch-compile", bench_compiled, 240 if big else 120)):
        print(f"[{name}] {key} ...", flush=True)
        if key == "torch-compile" and args.quick and big:
            result[key] = {"skipped": "skipped: --quick compiles only shapes under 3B parameters"}
            continue
        result[key] = opponent(key, budget, need_s, fn, config, weights, prompt, args.opponent_tokens,
                               args.repeats)
        if "tok_s_median" in result[key]:
            add_mbu(result[key], result["ours"], bytes_per_token, copy_bw, datasheet_bw)
    del weights
    gc.collect()
    torch.cuda.empty_cache()


def bench_prompt(config, n):
    return np.random.default_rng(SEED).integers(3, config.vocab_size, size=n).astype(np.int32)


def add_mbu(entry, ours, bytes_per_token, copy_bw, datasheet_bw):
    entry["mbu_vs_copy_bw"] = entry["tok_s_median"] * bytes_per_token / copy_bw
    entry["mbu_vs_datasheet"] = entry["tok_s_median"] * bytes_per_token / datasheet_bw if datasheet_bw else None
    entry["ours_speedup"] = ours["tok_s_median"] / entry["tok_s_median"]


def print_table(results):
    print()
    for name, r in results["shapes"].items():
        print(f"{name}: {r['weight_bytes_per_token'] / 1e9:.2f} GB weights + "
              f"{r['kv_bytes_per_token_mean'] / 1e6:.1f} MB KV per token")
        print(f"  {'':15s} {'tok/s':>9s} {'spread':>8s} {'MBU(copy)':>10s} {'MBU(sheet)':>10s} {'ours x':>7s}")
        for key in ("ours", "torch-eager", "hf-eager", "torch-compile"):
            e = r.get(key, {"skipped": "not run"})
            if "tok_s_median" not in e:
                print(f"  {key:15s} {e.get('skipped', '?')[:90]}")
                continue
            sheet = e["mbu_vs_datasheet"]
            print(f"  {key:15s} {e['tok_s_median']:9.1f} {e['spread_pct']:7.1f}% {e['mbu_vs_copy_bw']:10.1%} "
                  f"{(f'{sheet:.1%}' if sheet else 'n/a'):>10s} {e['ours_speedup']:7.2f}")
        print(f"  {'matmul':8s} {'N x K':>14s} {'ours GB/s':>10s} {'of copy':>8s} {'cuBLAS GB/s':>12s} {'of copy':>8s}")
        for key, m in r["matmuls"].items():
            ours = f"{m['ours_GBps']:10.0f} {m['ours_frac_of_copy_bw']:8.1%}" if "ours_GBps" in m else f"{'n/a':>19s}"
            cub = f"{m['cublas_GBps']:12.0f} {m['cublas_frac_of_copy_bw']:8.1%}" if "cublas_GBps" in m else f"{'n/a':>21s}"
            print(f"  {key:8s} {m['N']:>6d} x {m['K']:<6d} {ours} {cub}")
    print(f"copy bandwidth {results['copy_bandwidth_Bps'] / 1e12:.2f} TB/s (measured), "
          f"datasheet {(results['datasheet_bandwidth_Bps'] or 0) / 1e12:.2f} TB/s, GPU {results['gpu']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="llama3.2-1b,llama3-8b", help="comma-separated config.SHAPES names")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    parser.add_argument("--new-tokens", type=int, default=256, help="decoded tokens per repeat (default 256)")
    parser.add_argument("--opponent-tokens", type=int, default=None,
                        help="decoded tokens per repeat for the PyTorch opponents (default: --new-tokens)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats after one warm-up (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help="128 new tokens (64 for the opponents), torch.compile only below 3B parameters")
    parser.add_argument("--budget-s", type=float, default=1e9, help="skip what would run past this many seconds")
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<gpu>/decode.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.new_tokens = min(args.new_tokens, 128)
        args.opponent_tokens = args.opponent_tokens or 64
    args.opponent_tokens = args.opponent_tokens or args.new_tokens
    if args.repeats < 1 or args.prompt < 2 or args.new_tokens < 1:
        parser.error("need --repeats >= 1, --prompt >= 2 and --new-tokens >= 1")

    from llama_brrr import _C
    if not (torch.cuda.is_available() and _C.cuda_compiled() and _C.cuda_device_count() > 0):
        sys.exit("bench_decode.py needs a CUDA GPU and a CUDA build of llama_brrr "
                 "(LLAMA_BRRR_CUDA=1 python setup.py build_ext --inplace)")
    budget = Budget(args.budget_s)
    gpu = torch.cuda.get_device_name(0)
    datasheet_bw = next((bw for key, bw in DATASHEET_BW if key in gpu), None)
    copy_bw = copy_bandwidth()
    results = {
        "command": " ".join([sys.executable] + sys.argv), "gpu": gpu,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "transformers": _version("transformers")},
        "copy_bandwidth_Bps": copy_bw, "datasheet_bandwidth_Bps": datasheet_bw,
        "mbu_definition": "(weight bytes + mean KV bytes read per decode token) x tok/s / peak",
        "shapes": {},
    }
    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    # Our numbers for every shape first: they are the point of the run, the opponents fill what
    # time is left.
    for name in names:
        if budget.left() < 20:
            results["shapes"][name] = {"skipped": "out of --budget-s"}
            continue
        try:
            results["shapes"][name] = run_ours(_C, name, args, budget, copy_bw, datasheet_bw)
        except (RuntimeError, MemoryError) as error:  # our engine failed: record it, go on
            results["shapes"][name] = {"error": f"{type(error).__name__}: {error}"}
            print(f"[{name}] FAILED: {type(error).__name__}: {error}", flush=True)
            gc.collect()
            torch.cuda.empty_cache()
    for name in names:
        if "ours" in results["shapes"][name]:
            run_opponents(_C, name, results["shapes"][name], args, budget, copy_bw, datasheet_bw)
    out = args.out or os.path.join(ROOT, "benchmarks", "results", slug(gpu), "decode.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print_table({**results, "shapes": {k: v for k, v in results["shapes"].items() if "ours" in v}})
    print(f"wrote {out}")


def _version(package):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
