"""Per-kernel benchmark of the CUDA matmul and attention kernels against cuBLAS / PyTorch, one GPU.

Every figure is device time per call from the kernels' own durations (torch.profiler / CUPTI, so
neither side pays for the host launch or the synchronization of _C.testing), the median over
--repeats calls after a warm-up, with min and max. Weights and KV caches rotate among enough
copies (> 4x the 50 MB L2 of an H100) that no call finds its operand in L2 from the previous one.

  gemv          batch-1 decode projections of Llama-3.2-1B and Llama-3-8B (qkv, wo, w13 with the
                SwiGLU epilogue, w2, LM head): GB/s of our GEMV as a fraction of the measured
                device-copy bandwidth (read + write of 1 GiB), against torch.matmul (cuBLAS)
                of the same [M, K] x [K, N] (cuBLAS does no epilogue), and against a device copy
                that moves the GEMV's own byte count (the copy yardstick at that size, with the
                launch ramp and tail that a 1 GiB copy amortizes away).
  switch        the decode projections at M = 1..16 rows: the GEMV on CUDA cores, the GEMV on tensor
                cores and the tile GEMM, us and % of the copy bandwidth: where the engine switches.
  gemm          prefill projections at M = 128, 512, 2048, 4096, 8192: TFLOP/s against
                torch.matmul, and as a fraction of the measured GEMM ceiling (best cuBLAS TFLOP/s
                of an 8192^3 bf16 matmul). wqkv also as the engine calls it (RMSNorm first, RoPE +
                KV-cache append in the epilogue) against the same call with a plain store. The fp32
                epilogues also against cuBLAS doing the same job in one call ("x same job": wo / w2
                as an addmm into the fp32 residual, beta = 1), since the plain matmul writes half
                the bytes and reads none back.
  flash_decode  one query per sequence over 128 / 2048 / 8192 cached positions (1B: hd 64,
                8B: hd 128, 32 query / 8 KV heads): GB/s of K/V read, against torch SDPA.
  prefill       causal attention of T new tokens (T = 512, 2048, 8192, 16384): TFLOP/s against torch
                SDPA's FlashAttention-2 backend and its cuDNN backend, and as a fraction of the
                GEMM ceiling.
The KV cache is paged: our attention kernels and the RoPE epilogue reach it through a block table,
here the identity table over contiguous [slots, max_seq, Hkv, hd] caches in blocks of KV_BLOCK
(identity_kv), so SDPA reads the same rows without one.

    python benchmarks/bench_kernels.py --out benchmarks/results/h100/kernels.json
    python benchmarks/bench_kernels.py --quick          # 1B shapes only, under a minute
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from llama_brrr.config import shape_config  # noqa: E402

STORE_BF16, STORE_F32, ADD_RESIDUAL, SWIGLU, ROPE_KV = 0, 1, 2, 3, 4
EPILOGUE_NAMES = {STORE_BF16: "store_bf16", STORE_F32: "store_f32", ADD_RESIDUAL: "add_residual",
                  SWIGLU: "swiglu", ROPE_KV: "rope_kv"}
ROTATE_BYTES = 200 * 1024 * 1024  # operand bytes cycled through per kernel: 4x an H100's L2
INIT_STD = 0.02
KV_BLOCK = 16  # KV positions per cache block: the engine's default kv_block_size


def device_times(fn, repeats: int, warmup: int = 3, copies: bool = False) -> dict:
    """Device seconds per call of fn(i): the summed durations of the kernels call i launched (with
    copies=True, of its device copies too)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(repeats):
            fn(warmup + i)
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and (copies or not e.name.startswith(("Memcpy", "Memset")))),
                     key=lambda e: e.time_range.start)
    if not kernels:
        raise RuntimeError("the profiler recorded no kernels (CUPTI unavailable?)")
    durations = [e.time_range.elapsed_us() * 1e-6 for e in kernels]
    if len(durations) % repeats == 0:
        per = len(durations) // repeats
        times = [sum(durations[i * per:(i + 1) * per]) for i in range(repeats)]
    else:  # a library that varies its kernel count per call: only the mean is meaningful
        times = [sum(durations) / repeats] * repeats
    median = statistics.median(times)
    return {"median_s": median, "min_s": min(times), "max_s": max(times),
            "spread_pct": 100.0 * (max(times) - min(times)) / median,
            "kernels": sorted({e.name[:80] for e in kernels})}


def copy_bandwidth() -> float:
    """Device-to-device copy of 1 GiB, read + write counted, best of 10 (bytes/s)."""
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


def gemm_ceiling() -> float:
    """Best bf16 FLOP/s of cuBLAS on an 8192^3 matmul (best of 10 after warm-up): the compute
    roof the prefill kernels are held against, measured rather than read off the datasheet."""
    n = 8192
    a, b = random_bf16((n, n)), random_bf16((n, n))
    out = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=out)
    best = math.inf
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del a, b, out
    torch.cuda.empty_cache()
    return 2.0 * n ** 3 / best


def same_size_copy(weights, moved: int, repeats: int) -> dict:
    """A device-to-device copy (cudaMemcpy) that moves as many bytes as the GEMV, read + write
    counted as in copy_bandwidth, from the same L2-defeating weight copies: what a device copy
    reaches at this size, launch ramp and tail included, which the 1 GiB copy amortizes away."""
    half = moved // 2 // 16 * 16
    sources = [w.view(torch.uint8).view(-1)[:half] for w in weights]
    targets = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(copies_to_defeat_l2(half))]

    def run(i):
        targets[i % len(targets)].copy_(sources[i % len(sources)])
    times = device_times(run, repeats, copies=True)
    return {**times, "bytes": 2 * half, "Bps": 2 * half / times["median_s"]}


def copies_to_defeat_l2(bytes_each: int) -> int:
    return max(1, math.ceil(ROTATE_BYTES / bytes_each))


def random_bf16(shape, scale=1.0):
    return (torch.randn(shape, device="cuda") * scale).to(torch.bfloat16)


def identity_kv(slots: int, max_seq: int):
    """The paged-cache keyword arguments of the _C.testing attention and RoPE ops for caches laid
    out [slots, max_seq, Hkv, hd]: the identity block table (slot s, block j -> block
    s * blocks_per_seq + j) on the device, made once here rather than by the binding at every
    timed call. Returns (table, kwargs); keep the table alive while the kwargs are used."""
    if max_seq % KV_BLOCK:
        raise ValueError(f"identity_kv: max_seq={max_seq} must be a multiple of the KV block size {KV_BLOCK}")
    n_blocks = slots * (max_seq // KV_BLOCK)
    table = torch.arange(n_blocks, dtype=torch.int32, device="cuda")
    return table, {"block_table": table.data_ptr(), "block_size": KV_BLOCK, "n_blocks": n_blocks}


def projections(config):
    c = config
    # wqkv stores bf16: the engine's RoPE epilogue writes q, k and v as bf16 (the rotation is not timed)
    return [("wqkv", c.q_dim + 2 * c.kv_dim, c.dim, STORE_BF16), ("wo", c.dim, c.q_dim, ADD_RESIDUAL),
            ("w13", 2 * c.hidden_dim, c.dim, SWIGLU), ("w2", c.dim, c.hidden_dim, ADD_RESIDUAL),
            ("lm_head", c.vocab_size, c.dim, STORE_F32)]


class Matmul:
    """Operands of one projection at M rows and the two ways to run it."""

    def __init__(self, ops, M, N, K, epilogue, rotate=True):
        self.ops, self.N, self.K, self.epilogue = ops, N, K, epilogue
        self.width = N // 2 if epilogue == SWIGLU else N
        copies = copies_to_defeat_l2(N * K * 2) if rotate else 1
        self.weights = [random_bf16((N, K), INIT_STD) for _ in range(copies)]
        self.set_rows(M)
        # the engine's split-K scratch, which the GEMM uses where few tiles would leave SMs idle
        floats, counters = ops.gemm_split_scratch_sizes(torch.cuda.get_device_properties(0).multi_processor_count)
        self.partials = torch.zeros(floats, device="cuda")
        self.counters = torch.zeros(counters, device="cuda", dtype=torch.int32)
        self.split = (self.partials.data_ptr(), floats, self.counters.data_ptr(), counters)

    def set_rows(self, M):
        """Fresh x, output and cuBLAS output for M rows (the weights stay)."""
        self.M = M
        self.x = random_bf16((M, self.K))
        self.out = torch.empty((M, self.width), device="cuda",
                               dtype=torch.float32 if self.epilogue in (STORE_F32, ADD_RESIDUAL) else torch.bfloat16)
        self.out.zero_()
        self.torch_out = torch.empty((M, self.N), device="cuda", dtype=torch.bfloat16)

    def bytes_moved(self) -> int:
        out = self.M * self.width * self.out.element_size() * (2 if self.epilogue == ADD_RESIDUAL else 1)
        return self.N * self.K * 2 + self.M * self.K * 2 + out

    def ours(self, fn_name, **extra):
        fn = getattr(self.ops, fn_name)
        kw = {"out_f32" if self.epilogue == STORE_F32 else
              "residual" if self.epilogue == ADD_RESIDUAL else "out": self.out.data_ptr(), **extra}
        if fn_name != "gemv_bf16":
            kw["split"] = self.split

        def run(i):
            w = self.weights[i % len(self.weights)]
            fn(self.x.data_ptr(), w.data_ptr(), self.M, self.N, self.K, self.epilogue, **kw)
        return run

    def cublas(self, i):
        torch.matmul(self.x, self.weights[i % len(self.weights)].T, out=self.torch_out)

    def cublas_same_job(self):
        """cuBLAS asked for what our epilogue delivers, in one call: the fp32 store as a bf16 x bf16
        -> fp32 matmul, the residual add as an addmm into the fp32 residual itself (beta = 1: read,
        add, write back, as ours). The plain bf16 matmul (cublas) leaves that traffic out. None where
        one call cannot (SwiGLU, the bf16 store: the plain matmul is that job) or where this torch
        has no out_dtype matmul (torch.mm / addmm with out_dtype, CUDA only)."""
        if self.epilogue == STORE_F32:
            def run(i):
                torch.mm(self.x, self.weights[i % len(self.weights)].T, out_dtype=torch.float32, out=self.out)
        elif self.epilogue == ADD_RESIDUAL:
            def run(i):
                torch.addmm(self.out, self.x, self.weights[i % len(self.weights)].T, out_dtype=torch.float32,
                            out=self.out)
        else:
            return None
        try:
            run(0)
        except (RuntimeError, TypeError):
            return None
        return run


def bench_gemv(ops, shapes, repeats, copy_bw):
    rows = []
    for shape in shapes:
        for name, N, K, epilogue in projections(shape_config(shape)):
            mm = Matmul(ops, 1, N, K, epilogue)
            ours = device_times(mm.ours("gemv_bf16"), repeats)
            theirs = device_times(mm.cublas, repeats)
            moved = mm.bytes_moved()
            copy = same_size_copy(mm.weights, moved, repeats)
            rows.append({"shape": shape, "proj": name, "M": 1, "N": N, "K": K,
                         "epilogue": EPILOGUE_NAMES[epilogue], "bytes": moved, "ours": ours, "cublas": theirs,
                         "copy_same_bytes": copy,
                         "ours_GBps": moved / ours["median_s"] / 1e9,
                         "ours_frac_of_copy": moved / ours["median_s"] / copy_bw,
                         "ours_frac_of_same_size_copy": moved / ours["median_s"] / copy["Bps"],
                         "same_size_copy_frac_of_copy": copy["Bps"] / copy_bw,
                         "cublas_GBps": moved / theirs["median_s"] / 1e9,
                         "speedup_vs_cublas": theirs["median_s"] / ours["median_s"]})
            del mm
            torch.cuda.empty_cache()
    return rows


def bench_switch(ops, shapes, repeats, copy_bw):
    """The decode projections at M = 1..16 rows three ways: the GEMV on CUDA cores, the GEMV on
    tensor cores (gemv_bf16's two paths) and the tile GEMM; where matmul_bf16 switches comes from here."""
    rows = []
    for shape in shapes:
        for name, N, K, epilogue in projections(shape_config(shape)):
            if name == "lm_head":
                continue
            mm = Matmul(ops, 1, N, K, epilogue)
            for M in (1, 2, 3, 4, 6, 8, 12, 16):
                mm.set_rows(M)
                times = {"cuda_cores": device_times(mm.ours("gemv_bf16", path="cuda_cores"), repeats),
                         "tensor_cores": device_times(mm.ours("gemv_bf16", path="tensor_cores"), repeats),
                         "gemm": device_times(mm.ours("gemm_bf16"), repeats)}
                moved = mm.bytes_moved()
                rows.append({"shape": shape, "proj": name, "M": M, "N": N, "K": K, "bytes": moved, **times,
                             "frac_of_copy": {k: moved / v["median_s"] / copy_bw for k, v in times.items()}})
            del mm
            torch.cuda.empty_cache()
    return rows


def bench_wqkv_rope(ops, config, mm, repeats):
    """The engine's wqkv call as prefill makes it, rmsnorm_matmul_bf16 (the RMSNorm kernel, then
    the GEMM), with the RoPE + KV-cache epilogue and with a plain bf16 store: the difference is
    what the rotation and the scattered cache writes cost."""
    from llama_brrr import _C
    M, N, K = mm.M, mm.N, mm.K
    x = torch.randn((M, K), device="cuda")
    norm_w = (1 + 0.1 * torch.randn(K, device="cuda")).to(torch.bfloat16)
    xn = torch.empty((M, K), device="cuda", dtype=torch.bfloat16)
    staging = torch.empty((M, N), device="cuda")
    positions = torch.arange(M, device="cuda", dtype=torch.int32)
    slots = torch.zeros(M, device="cuda", dtype=torch.int32)
    inv_freq = torch.from_numpy(_C.rope_inv_freq(config.engine_dict(M, 1))).cuda()
    q_out = torch.empty((M, config.n_heads, config.head_dim), device="cuda", dtype=torch.bfloat16)
    caches = [torch.empty((1, M, config.n_kv_heads, config.head_dim), device="cuda", dtype=torch.bfloat16)
              for _ in range(2)]
    table, paged = identity_kv(1, M)
    w = mm.weights[0]

    def rope(i):
        ops.rmsnorm_matmul_bf16(x.data_ptr(), norm_w.data_ptr(), 1e-5, w.data_ptr(), M, N, K, ROPE_KV,
                                out_f32=staging.data_ptr(), xn=xn.data_ptr(), positions=positions.data_ptr(),
                                slots=slots.data_ptr(), inv_freq=inv_freq.data_ptr(), q_out=q_out.data_ptr(),
                                k_cache=caches[0].data_ptr(), v_cache=caches[1].data_ptr(),
                                n_heads=config.n_heads, n_kv_heads=config.n_kv_heads, head_dim=config.head_dim,
                                max_seq=M, split=mm.split, **paged)

    def store(i):
        ops.rmsnorm_matmul_bf16(x.data_ptr(), norm_w.data_ptr(), 1e-5, w.data_ptr(), M, N, K, STORE_BF16,
                                out=mm.out.data_ptr(), xn=xn.data_ptr(), split=mm.split)

    with_rope, plain = device_times(rope, repeats), device_times(store, repeats)
    return {"norm_rope": with_rope, "norm_store": plain,
            "rope_cost_s": with_rope["median_s"] - plain["median_s"]}


def bench_gemm(ops, shapes, ms, repeats, ceiling):
    rows = []
    for shape in shapes:
        config = shape_config(shape)
        for name, N, K, epilogue in projections(config)[:4]:
            for M in ms:
                mm = Matmul(ops, M, N, K, epilogue, rotate=False)
                ours = device_times(mm.ours("gemm_bf16"), repeats)
                theirs = device_times(mm.cublas, repeats)
                flops = 2.0 * M * N * K
                row = {"shape": shape, "proj": name, "M": M, "N": N, "K": K,
                       "epilogue": EPILOGUE_NAMES[epilogue], "ours": ours, "cublas": theirs,
                       "ours_TFLOPs": flops / ours["median_s"] / 1e12,
                       "ours_frac_of_gemm_ceiling": flops / ours["median_s"] / ceiling,
                       "cublas_TFLOPs": flops / theirs["median_s"] / 1e12,
                       "speedup_vs_cublas": theirs["median_s"] / ours["median_s"]}
                same_job = mm.cublas_same_job()
                if same_job is not None:
                    same = device_times(same_job, repeats)
                    row.update({"cublas_same_job": same,
                                "speedup_vs_cublas_same_job": same["median_s"] / ours["median_s"]})
                if name == "wqkv":
                    row["engine_call"] = bench_wqkv_rope(ops, config, mm, repeats)
                rows.append(row)
                del mm
                torch.cuda.empty_cache()
    return rows


ATTENTION_SHAPES = {"llama3.2-1b": (32, 8, 64), "llama3-8b": (32, 8, 128)}
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


def engine_max_splits(n_kv_heads, max_seq):
    """The CUDA engine's flash-decode split limit (csrc/cuda/engine.cu, layer_max_splits)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(math.ceil(2 * sms / n_kv_heads), math.ceil(max_seq / 64), 64))


def bench_flash_decode(ops, shapes, contexts, repeats, copy_bw):
    rows = []
    for shape in shapes:
        n_heads, n_kv, hd = ATTENTION_SHAPES[shape]
        for ctx in contexts:
            kv_bytes = 2 * ctx * n_kv * hd * 2
            # One cache per rotation step, each exactly one context long: max_seq = ctx.
            caches = [(random_bf16((1, ctx, n_kv, hd)), random_bf16((1, ctx, n_kv, hd)))
                      for _ in range(copies_to_defeat_l2(kv_bytes))]
            table, paged = identity_kv(1, ctx)  # the same layout in every copy
            q = random_bf16((1, n_heads, hd))
            slots = torch.zeros(1, dtype=torch.int32, device="cuda")
            positions = torch.full((1,), ctx - 1, dtype=torch.int32, device="cuda")
            out = torch.empty((1, n_heads * hd), device="cuda", dtype=torch.bfloat16)
            max_splits = engine_max_splits(n_kv, 8192)
            scratch = torch.zeros(ops.flash_decode_scratch_floats(1, n_heads, hd, max_splits),
                                  device="cuda", dtype=torch.float32)  # arrival counters start at zero

            def ours(i):
                k, v = caches[i % len(caches)]
                ops.flash_decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), slots.data_ptr(),
                                 positions.data_ptr(), out.data_ptr(), scratch.data_ptr(), 1, n_heads,
                                 n_kv, hd, ctx, max_splits, **paged)

            # SDPA wants [B, H, L, hd]: give it its own head-major copies.
            q4 = q.view(1, n_heads, 1, hd)
            head_major = [(k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()) for k, v in caches]

            def sdpa(i):
                k, v = head_major[i % len(head_major)]
                F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)

            mine = device_times(ours, repeats)
            row = {"shape": shape, "context": ctx, "n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": hd,
                   "max_splits": max_splits, "kv_bytes": kv_bytes, "ours": mine,
                   "ours_GBps": kv_bytes / mine["median_s"] / 1e9,
                   "ours_frac_of_copy": kv_bytes / mine["median_s"] / copy_bw}
            try:
                theirs = device_times(sdpa, repeats)
                row.update({"torch_sdpa": theirs, "torch_sdpa_GBps": kv_bytes / theirs["median_s"] / 1e9,
                            "speedup_vs_torch": theirs["median_s"] / mine["median_s"]})
            except (RuntimeError, TypeError) as error:  # older torch: no enable_gqa
                row["torch_sdpa"] = {"skipped": str(error)[:200]}
            rows.append(row)
            torch.cuda.empty_cache()
    return rows


def bench_prefill(ops, shapes, lengths, repeats, ceiling):
    rows = []
    for shape in shapes:
        n_heads, n_kv, hd = ATTENTION_SHAPES[shape]
        for T in lengths:
            k, v = random_bf16((1, T, n_kv, hd)), random_bf16((1, T, n_kv, hd))
            q = random_bf16((T, n_heads, hd))
            out = torch.empty((T, n_heads * hd), device="cuda", dtype=torch.bfloat16)
            table, paged = identity_kv(1, T)

            def ours(i):
                ops.attention_prefill(q.data_ptr(), k.data_ptr(), v.data_ptr(), 0, 0, T, out.data_ptr(),
                                      n_heads, n_kv, hd, T, **paged)

            qh = q.transpose(0, 1)[None].contiguous()
            # The K/V heads repeated for the GQA group: SDPA's backends differ in whether they take
            # enable_gqa, and the FLOPs are the same either way.
            group = n_heads // n_kv
            kh = k.transpose(1, 2).repeat_interleave(group, dim=1).contiguous()
            vh = v.transpose(1, 2).repeat_interleave(group, dim=1).contiguous()

            flops = 2.0 * n_heads * hd * T * T  # QK^T and PV over the causal half: 2 * (2 T^2 hd / 2)
            mine = device_times(ours, repeats)
            row = {"shape": shape, "T": T, "ours": mine, "ours_TFLOPs": flops / mine["median_s"] / 1e12,
                   "ours_frac_of_gemm_ceiling": flops / mine["median_s"] / ceiling}
            for key, backend in SDPA_BACKENDS.items():
                def sdpa(i, backend=backend):
                    with sdpa_kernel(backend):
                        F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
                try:
                    theirs = device_times(sdpa, repeats)
                    row.update({key: theirs, key + "_TFLOPs": flops / theirs["median_s"] / 1e12,
                                "speedup_vs_" + key: theirs["median_s"] / mine["median_s"]})
                except (RuntimeError, TypeError) as error:
                    row[key] = {"skipped": str(error)[:200]}
            rows.append(row)
            del k, v, q, out, qh, kh, vh
            torch.cuda.empty_cache()
    return rows


def print_tables(result):
    gpu = result["gpu"]
    print(f"\n{gpu}: device copy {result['copy_bandwidth_Bps'] / 1e12:.2f} TB/s (read + write, measured), "
          f"GEMM ceiling {result['gemm_ceiling_FLOPs'] / 1e12:.0f} TFLOP/s (cuBLAS 8192^3 bf16)")
    print(f"\n{'gemv M=1':<24}{'N x K':>14}{'ours us':>10}{'GB/s':>8}{'% copy':>8}{'cuBLAS us':>11}{'x cuBLAS':>9}"
          f"{'copy@size us':>14}{'its % copy':>12}{'ours % of it':>14}")
    for r in result["gemv"]:
        same = r.get("copy_same_bytes")
        print(f"{r['shape'] + ' ' + r['proj']:<24}{str(r['N']) + 'x' + str(r['K']):>14}"
              f"{r['ours']['median_s'] * 1e6:>10.1f}{r['ours_GBps']:>8.0f}{100 * r['ours_frac_of_copy']:>7.1f}%"
              f"{r['cublas']['median_s'] * 1e6:>11.1f}{r['speedup_vs_cublas']:>9.2f}"
              + (f"{same['median_s'] * 1e6:>14.1f}{100 * r['same_size_copy_frac_of_copy']:>11.1f}%"
                 f"{100 * r['ours_frac_of_same_size_copy']:>13.1f}%" if same else ""))
    if result.get("switch"):
        print(f"\n{'M rows, us (% copy)':<24}{'M':>4}{'CUDA cores':>18}{'tensor cores':>18}{'GEMM':>18}")
        for r in result["switch"]:
            cells = "".join(f"{r[k]['median_s'] * 1e6:>10.1f} ({100 * r['frac_of_copy'][k]:>3.0f}%)"
                            for k in ("cuda_cores", "tensor_cores", "gemm"))
            print(f"{r['shape'] + ' ' + r['proj']:<24}{r['M']:>4}{cells}")
    print(f"\n{'gemm':<24}{'M':>6}{'N x K':>14}{'ours TF/s':>11}{'% ceil':>8}{'cuBLAS TF/s':>13}{'x cuBLAS':>9}"
          f"{'x same job':>11}")
    for r in result["gemm"]:
        same = r.get("speedup_vs_cublas_same_job")
        print(f"{r['shape'] + ' ' + r['proj']:<24}{r['M']:>6}{str(r['N']) + 'x' + str(r['K']):>14}"
              f"{r['ours_TFLOPs']:>11.1f}{100 * r['ours_frac_of_gemm_ceiling']:>7.1f}%"
              f"{r['cublas_TFLOPs']:>13.1f}{r['speedup_vs_cublas']:>9.2f}"
              + (f"{same:>11.2f}" if same else f"{'-':>11}"))
    print(f"\n{'wqkv as the engine calls it':<28}{'M':>6}{'norm+store us':>15}{'norm+RoPE us':>14}{'RoPE us':>9}")
    for r in result["gemm"]:
        call = r.get("engine_call")
        if call:
            print(f"{r['shape']:<28}{r['M']:>6}{call['norm_store']['median_s'] * 1e6:>15.1f}"
                  f"{call['norm_rope']['median_s'] * 1e6:>14.1f}{call['rope_cost_s'] * 1e6:>9.1f}")
    print(f"\n{'flash_decode B=1':<24}{'ctx':>6}{'ours us':>10}{'GB/s':>8}{'% copy':>8}{'SDPA us':>10}{'x SDPA':>8}")
    for r in result["flash_decode"]:
        sdpa = r["torch_sdpa"].get("median_s")
        print(f"{r['shape'] + ' hd' + str(r['head_dim']):<24}{r['context']:>6}{r['ours']['median_s'] * 1e6:>10.1f}"
              f"{r['ours_GBps']:>8.0f}{100 * r['ours_frac_of_copy']:>7.1f}%"
              + (f"{sdpa * 1e6:>10.1f}{r['speedup_vs_torch']:>8.2f}" if sdpa else f"{'n/a':>10}"))
    print(f"\n{'attention_prefill':<24}{'T':>6}{'ours us':>10}{'TF/s':>8}{'FA2 TF/s':>10}{'x FA2':>7}"
          f"{'cuDNN TF/s':>12}{'x cuDNN':>9}")
    for r in result["prefill"]:
        cells = ""
        for key, width in (("sdpa_flash", 10), ("sdpa_cudnn", 12)):
            tf = r.get(key + "_TFLOPs")
            ratio = r.get("speedup_vs_" + key)
            cells += (f"{tf:>{width}.1f}{ratio:>{width - 3}.2f}" if tf else f"{'n/a':>{width}}{'':>{width - 3}}")
        print(f"{r['shape']:<24}{r['T']:>6}{r['ours']['median_s'] * 1e6:>10.1f}{r['ours_TFLOPs']:>8.1f}{cells}")


SECTIONS = ("gemv", "switch", "gemm", "flash_decode", "prefill")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1B shapes, fewer sizes and repeats (< 60 s)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per kernel (default 30, quick 10)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help="comma-separated sections to run (default all: %(default)s)")
    parser.add_argument("--shapes", help="comma-separated shapes (default llama3.2-1b,llama3-8b; --quick: 1B)")
    args = parser.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    if only - set(SECTIONS):
        parser.error(f"--only: unknown sections {sorted(only - set(SECTIONS))}; choose from {', '.join(SECTIONS)}")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not torch.cuda.is_available():
        sys.exit("bench_kernels: no CUDA device visible to torch")
    from llama_brrr import _C
    if not _C.cuda_compiled() or _C.cuda_device_count() < 1:
        sys.exit("bench_kernels: llama_brrr._C has no usable CUDA backend "
                 "(build with LLAMA_BRRR_CUDA=1 on a machine with a GPU)")
    ops = _C.testing
    torch.backends.cuda.matmul.allow_tf32 = False
    repeats = args.repeats or (10 if args.quick else 30)
    shapes = args.shapes.split(",") if args.shapes else ["llama3.2-1b"] if args.quick else ["llama3.2-1b", "llama3-8b"]
    started = time.monotonic()

    copy_bw = copy_bandwidth()
    ceiling = gemm_ceiling()
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda": torch.version.cuda, "host": platform.node(), "quick": args.quick,
              "repeats": repeats, "rotate_bytes": ROTATE_BYTES, "copy_bandwidth_Bps": copy_bw,
              "gemm_ceiling_FLOPs": ceiling, "command": " ".join([sys.executable] + sys.argv),
              "method": "device time per call from torch.profiler kernel durations; median of repeats"}
    result["sections"] = sorted(only)
    result["gemv"] = bench_gemv(ops, shapes, repeats, copy_bw) if "gemv" in only else []
    result["switch"] = [] if args.quick or "switch" not in only else bench_switch(ops, shapes, repeats, copy_bw)
    result["gemm"] = bench_gemm(ops, shapes, [512] if args.quick else [128, 512, 2048, 4096, 8192], repeats,
                                ceiling) if "gemm" in only else []
    result["flash_decode"] = bench_flash_decode(ops, shapes, [128, 2048] if args.quick else [128, 2048, 8192],
                                                repeats, copy_bw) if "flash_decode" in only else []
    result["prefill"] = bench_prefill(ops, shapes, [512] if args.quick else [512, 2048, 8192, 16384], repeats,
                                      ceiling) if "prefill" in only else []
    result["wall_s"] = time.monotonic() - started
    print_tables(result)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
