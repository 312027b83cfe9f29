"""Peak rates a profile is measured against: datasheet values, and ceilings measured on this machine.

    from llama_brrr import peaks
    peaks.get_peaks("NVIDIA H100 80GB HBM3")   # Peaks(flops_datasheet=989e12, bw_datasheet=3.35e12, ...)
    peaks.get_peaks("cpu")                     # this host: nominal FLOP/s from cpuinfo, no datasheet bandwidth
    peaks.calibrate("cuda")                    # measures copy bandwidth and best bf16 GEMM, caches them

Datasheet rates are dense (no sparsity) bf16 tensor-core FLOP/s with fp32 accumulation and HBM
bandwidth. Measured ceilings (`llama-brrr calibrate`) are cached per device name in
<cache>/peaks.json (<cache> = $LLAMA_BRRR_HOME or ~/.cache/llama_brrr): on a GPU, device-to-device
copy bandwidth (bytes read + written) and the best bf16 GEMM rate found over a few large shapes
(cuBLAS through torch: the rate a good kernel can reach on this part); on the CPU, memcpy bandwidth
and the best f32 matmul of the engine's own kernel and numpy's BLAS.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

# (pattern on the lower-cased device name, label, dense bf16 FLOP/s, memory bytes/s); first match wins.
DATASHEET: list[tuple[str, str, float, float]] = [
    (r"h200", "H200", 989e12, 4.8e12),
    (r"h100.*nvl", "H100 NVL", 835e12, 3.9e12),
    (r"h100.*pcie", "H100 PCIe", 756e12, 2.0e12),
    (r"h100", "H100 SXM", 989e12, 3.35e12),
    (r"gh200", "GH200", 989e12, 4.0e12),
    (r"a100.*80\s*gb.*pcie|a100.*pcie.*80", "A100 80GB PCIe", 312e12, 1.935e12),
    (r"a100.*80", "A100 80GB SXM", 312e12, 2.039e12),
    (r"a100", "A100 40GB", 312e12, 1.555e12),
    (r"l40s", "L40S", 362e12, 0.864e12),
    (r"rtx 4090", "RTX 4090", 165e12, 1.008e12),
    (r"l4\b", "L4", 121e12, 0.300e12),
    (r"a10\b", "A10", 125e12, 0.600e12),
]

CACHE_NAME = "peaks.json"

# Below this much roofline time per launch a GPU kernel's duration is the launch itself: the time
# to ramp a grid up, drain it and hand over to the next kernel (about 2 us per kernel on H100, in
# a stream or a graph), not its bytes or FLOPs. Such a kernel is latency-bound and its time counts
# as overhead: only fewer launches (fusion, graphs) shorten it. The CPU has no such floor.
GPU_LAUNCH_FLOOR_S = 2e-6


@dataclass
class Peaks:
    """FLOP/s and bytes/s ceilings for one device; None where unknown."""

    device: str
    flops_datasheet: float | None
    bw_datasheet: float | None
    flops_measured: float | None = None
    bw_measured: float | None = None
    label: str = ""
    launch_floor_s: float | None = None   # see GPU_LAUNCH_FLOOR_S; None on the CPU

    @property
    def flops(self) -> float | None:
        """The rate kernels are classified against: the datasheet's, else the measured one."""
        return self.flops_datasheet or self.flops_measured

    @property
    def bw(self) -> float | None:
        return self.bw_datasheet or self.bw_measured

    def to_dict(self) -> dict:
        return {"flops_datasheet": self.flops_datasheet, "bw_datasheet": self.bw_datasheet,
                "flops_measured": self.flops_measured, "bw_measured": self.bw_measured,
                "launch_floor_s": self.launch_floor_s}


def datasheet(device_name: str) -> tuple[str, float, float] | None:
    """(label, FLOP/s, bytes/s) of the first DATASHEET row matching `device_name`, else None."""
    name = device_name.lower()
    for pattern, label, flops, bw in DATASHEET:
        if re.search(pattern, name):
            return label, flops, bw
    return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def cpu_nominal_flops(n_threads: int | None = None) -> float | None:
    """cores x clock x f32 FLOPs per cycle (two FMA pipes of the widest SIMD in cpuinfo): the
    datasheet figure of a CPU, which vendors do not publish per SKU. None when cpuinfo is silent."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return None
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M)]
    flags = re.search(r"^flags\s*:(.*)$", info, re.M)
    if not mhz or not flags:
        return None
    flags_set = set(flags.group(1).split())
    lanes = 16 if "avx512f" in flags_set else 8 if "avx2" in flags_set else 4
    cores = n_threads or os.cpu_count() or 1
    return cores * max(mhz) * 1e6 * lanes * 2 * 2  # 2 FLOPs per FMA, 2 FMA pipes


def _cache_path():
    from .fetch import cache_dir

    return cache_dir() / CACHE_NAME


def _read_cache() -> dict:
    try:
        with open(_cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached(device_name: str) -> dict | None:
    """The measured ceilings cached for `device_name` ({"flops", "bw", "when", ...}), or None."""
    entry = _read_cache().get(device_name)
    return entry if isinstance(entry, dict) else None


def _write_cache(device_name: str, entry: dict) -> None:
    data = _read_cache()
    data[device_name] = entry
    path = _cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def device_name(backend: str, index: int = 0) -> str:
    """The key peaks are stored under: the GPU's name for cuda, the CPU model for cpu."""
    if backend == "cpu":
        return cpu_name()
    if backend == "cuda":
        import torch

        return torch.cuda.get_device_name(index)
    raise ValueError(f"backend must be 'cpu' or 'cuda', got {backend!r}")


def get_peaks(device_name_or_backend: str) -> Peaks:
    """Peaks for a device name (e.g. "NVIDIA H100 80GB HBM3"), or "cpu" / "cuda" / "cuda:N" for the
    device present. Measured values come from the calibrate cache (None when never calibrated)."""
    key = device_name_or_backend
    if key == "cpu":
        key = cpu_name()
    elif key.startswith("cuda"):
        key = device_name("cuda", int(key.split(":")[1]) if ":" in key else 0)
    if key.startswith("cpu"):
        flops, bw, label = cpu_nominal_flops(), None, "CPU (nominal FLOP/s from cpuinfo)"
    else:
        row = datasheet(key)
        label, flops, bw = row if row else ("unknown GPU", None, None)
    entry = cached(key) or {}
    return Peaks(device=key, flops_datasheet=flops, bw_datasheet=bw,
                 flops_measured=entry.get("flops"), bw_measured=entry.get("bw"), label=label,
                 launch_floor_s=None if key.startswith("cpu") else GPU_LAUNCH_FLOOR_S)


# ---- calibration ------------------------------------------------------------------------------

def _best_time(fn, repeats: int, min_time: float = 0.0) -> float:
    best = float("inf")
    start = time.perf_counter()
    n = 0
    while n < repeats or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        n += 1
    return best


def calibrate_cpu(n_threads: int = 0, quick: bool = False) -> dict:
    """memcpy bandwidth (bytes read + written per second) and the best f32 matmul FLOP/s of the
    engine's kernel and numpy, on random inputs."""
    import numpy as np

    rng = np.random.default_rng(0)
    n_bytes = (64 if quick else 256) << 20
    src = rng.standard_normal(n_bytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    copy_bw = 2 * n_bytes / _best_time(lambda: np.copyto(dst, src), 3 if quick else 8)
    del dst
    bw, bw_source = copy_bw, f"memcpy {n_bytes >> 20} MiB"
    try:
        from . import _C
    except ImportError:
        _C = None
    if _C is not None:
        # Decode streams weights with every thread; a one-row matmul over a large matrix is that
        # access pattern, and on most hosts beats a single-threaded memcpy.
        rows = n_bytes // 4 // 4096
        w = src.reshape(rows, 4096)
        x = rng.standard_normal((1, 4096), dtype=np.float32)
        y = np.empty((1, rows), dtype=np.float32)
        stream_bw = n_bytes / _best_time(lambda: _C.cpu_ops.matmul(x, w, out=y), 3 if quick else 8)
        if stream_bw > bw:
            bw, bw_source = stream_bw, f"engine GEMV streaming {n_bytes >> 20} MiB"

    size = 512 if quick else 1024
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    flop = 2.0 * size ** 3
    candidates = {"numpy": flop / _best_time(lambda: a @ b.T, 3 if quick else 5)}
    if _C is not None:
        out = np.empty((size, size), dtype=np.float32)
        candidates["engine"] = flop / _best_time(
            lambda: _C.cpu_ops.matmul(a, b, out=out), 3 if quick else 5)
    best = max(candidates, key=candidates.get)
    return {"flops": candidates[best], "bw": bw, "flops_source": f"f32 matmul {size}^3 ({best})",
            "bw_source": bw_source, "candidates": candidates}


def calibrate_cuda(index: int = 0, quick: bool = False) -> dict:
    """Device-to-device copy bandwidth and the best bf16 GEMM FLOP/s over a few large shapes,
    timed with CUDA events (median of repeats after warm-up)."""
    try:
        import torch
    except ImportError as error:
        raise ImportError("calibrating a GPU needs PyTorch with CUDA (pip install torch)") from error
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible to PyTorch; run `llama-brrr calibrate --device cpu`")
    dev = torch.device("cuda", index)

    def timed(fn, repeats):
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return sorted(times)[len(times) // 2]

    n_bytes = 1 << 30
    src = torch.randn(n_bytes // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    bw = 2 * n_bytes / timed(lambda: dst.copy_(src), 5 if quick else 20)
    del src, dst

    shapes = [(8192, 8192, 8192)] if quick else [(4096, 4096, 4096), (8192, 8192, 8192),
                                                 (16384, 8192, 4096), (8192, 16384, 8192)]
    rates = {}
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        b = torch.randn(n, k, dtype=torch.bfloat16, device=dev)
        rates[f"{m}x{n}x{k}"] = 2.0 * m * n * k / timed(lambda: a @ b.T, 5 if quick else 20)
        del a, b
    best = max(rates, key=rates.get)
    return {"flops": rates[best], "bw": bw, "flops_source": f"bf16 GEMM {best} (cuBLAS via torch)",
            "bw_source": "device-to-device copy, 1 GiB", "candidates": rates}


def calibrate(backend: str = "cpu", index: int = 0, quick: bool = False, n_threads: int = 0,
              save: bool = True) -> Peaks:
    """Measures this machine's ceilings for `backend` ("cpu" or "cuda"), caches them (save=True)
    under the device's name, and returns the Peaks with both datasheet and measured values."""
    if backend == "cpu":
        entry = calibrate_cpu(n_threads, quick)
    elif backend == "cuda":
        entry = calibrate_cuda(index, quick)
    else:
        raise ValueError(f"backend must be 'cpu' or 'cuda', got {backend!r}")
    name = device_name(backend, index)
    entry["when"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    if save:
        _write_cache(name, entry)
    peaks = get_peaks(name)
    peaks.flops_measured, peaks.bw_measured = entry["flops"], entry["bw"]
    return peaks


def describe(peaks: Peaks) -> str:
    def rate(value, unit, scale):
        return "n/a" if value is None else f"{value / scale:,.1f} {unit}"

    return (f"{peaks.device} [{peaks.label}]: datasheet {rate(peaks.flops_datasheet, 'TFLOP/s', 1e12)}, "
            f"{rate(peaks.bw_datasheet, 'GB/s', 1e9)}; measured {rate(peaks.flops_measured, 'TFLOP/s', 1e12)}, "
            f"{rate(peaks.bw_measured, 'GB/s', 1e9)}")


__all__ = ["Peaks", "DATASHEET", "datasheet", "get_peaks", "calibrate", "calibrate_cpu",
           "calibrate_cuda", "cached", "device_name", "describe"]
