"""Numbers every benchmark shares: statistics over repeats, the analytic FLOPs and bytes of a
workload (docs/design.md's MFU / MBU definitions), the peaks they are divided by, and the facts about
the machine and software that every results file records.

FLOPs and bytes are counted from shapes, not measured:
  FLOPs = 2 x (matrix parameters a token passes through) per token + attention (QK^T and PV,
          2 x 2 x n_heads x head_dim per cached key per layer); the LM head counts only for the
          tokens whose logits are computed (the last prompt token of each sequence, every decode
          token).
  bytes = every weight once per forward pass + the KV cache read and written, at the engine's
          storage widths.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import statistics
import subprocess
from pathlib import Path

from ..config import ModelConfig

# Dense bf16 tensor-core FLOP/s and HBM bytes/s by a substring of the GPU's name; first match
# wins. Used when llama_brrr.peaks (calibrated, cached per GPU) is absent.
DATASHEET_PEAKS = [("H200", 989e12, 4.8e12), ("H100 PCIe", 756e12, 2.0e12), ("H100", 989e12, 3.35e12),
                   ("A100-SXM4-80GB", 312e12, 2.039e12), ("A100 80GB PCIe", 312e12, 1.935e12),
                   ("A100", 312e12, 1.555e12), ("L40S", 362e12, 0.864e12), ("A10", 125e12, 0.6e12)]

DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def summarize(values: list[float]) -> dict:
    """Median, min, max and the spread (max - min) as a percentage of the median."""
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values),
            "spread_pct": 100.0 * (max(values) - min(values)) / median if median else 0.0,
            "repeats": list(values)}


# ---- analytic work ---------------------------------------------------------------------------------

def body_params(c: ModelConfig) -> int:
    """Matrix parameters of the transformer layers (what every token multiplies through)."""
    return c.n_layers * ((c.q_dim + 2 * c.kv_dim) * c.dim + c.dim * c.q_dim + 3 * c.hidden_dim * c.dim)


def attention_flops(c: ModelConfig, first_key_count: int, tokens: int) -> float:
    """QK^T and PV of `tokens` consecutive positions whose first one sees first_key_count keys."""
    keys = tokens * first_key_count + tokens * (tokens - 1) / 2  # sum of the key counts
    return 4.0 * c.n_layers * c.n_heads * c.head_dim * keys


def kv_bytes(c: ModelConfig, positions: float, kv_dtype: str) -> float:
    """Bytes of K and V for `positions` cached positions over all layers."""
    return 2.0 * c.n_layers * c.kv_dim * positions * DTYPE_BYTES[kv_dtype]


def weight_bytes(c: ModelConfig, dtype: str, types: dict | None = None) -> float:
    """Every matrix once (the LM head included) plus the norms (kept in f32) and one embedding row
    per token, which is negligible and left out. types: matrix name -> block type ("q4_k") of the
    matrices stored quantized (Llama.weight_types), counted at their stored bytes."""
    norms = (2 * c.n_layers + 1) * c.dim * 4
    if not types:
        return (body_params(c) + c.vocab_size * c.dim) * DTYPE_BYTES[dtype] + norms
    from llama_brrr import _C

    head = "tok_embeddings" if c.tie_embeddings else "output"
    total = norms
    for name, shape in c.tensor_shapes().items():
        if len(shape) != 2 or (name == "tok_embeddings" and not c.tie_embeddings) or (name == "output" and head != name):
            continue
        t = types.get(name)
        total += shape[0] * (_C.quant_ops.row_bytes(t, shape[1]) if t else shape[1] * DTYPE_BYTES[dtype])
    return float(total)


def prefill_work(c: ModelConfig, batch: int, prompt: int, dtype: str, types: dict | None = None) -> dict:
    """FLOPs and bytes of prefilling `batch` prompts of `prompt` tokens, logits of the last only."""
    flops = batch * (2.0 * body_params(c) * prompt + attention_flops(c, 1, prompt)
                     + 2.0 * c.vocab_size * c.dim)
    moved = weight_bytes(c, dtype, types) + batch * kv_bytes(c, prompt, kv_dtype(dtype))
    return {"flops": flops, "bytes": moved, "tokens": batch * prompt}


def decode_work(c: ModelConfig, batch: int, context: int, steps: int, dtype: str,
                types: dict | None = None) -> dict:
    """FLOPs and bytes of `steps` decode steps of `batch` sequences starting at position `context`
    (the first step's token sees context + 1 keys)."""
    per_token = 2.0 * (body_params(c) + c.vocab_size * c.dim)
    flops = batch * (per_token * steps + attention_flops(c, context + 1, steps))
    mean_keys = context + 1 + (steps - 1) / 2
    kv = batch * steps * kv_bytes(c, mean_keys + 1, kv_dtype(dtype))  # read the keys, write one row
    return {"flops": flops, "bytes": steps * weight_bytes(c, dtype, types) + kv, "tokens": batch * steps}


def kv_dtype(dtype: str) -> str:
    """The engines keep the KV cache in bf16 on GPUs and in the compute width (f32) on CPUs."""
    return "f32" if dtype == "f32" else "bf16"


# ---- peaks -----------------------------------------------------------------------------------------

def peaks(device_name: str) -> dict:
    """{"flops", "bandwidth", "source"} for MFU / MBU; None values when nothing is known (CPUs)."""
    import llama_brrr

    calibrated = getattr(llama_brrr, "peaks", None)
    if calibrated is not None:
        with contextlib.suppress(Exception):  # an uncalibrated GPU falls back to the datasheet
            found = calibrated(device_name) if callable(calibrated) else None
            if found:
                flops = getattr(found, "flops", None) or found.get("flops")
                bandwidth = getattr(found, "bandwidth", None) or found.get("bandwidth")
                if flops and bandwidth:
                    return {"flops": flops, "bandwidth": bandwidth, "source": "llama_brrr.peaks"}
    for key, flops, bandwidth in DATASHEET_PEAKS:
        if key in device_name:
            return {"flops": flops, "bandwidth": bandwidth, "source": f"datasheet ({key})"}
    return {"flops": None, "bandwidth": None, "source": "unknown device: MFU/MBU not reported"}


def peaks_of_group(peak: dict, gpus: int) -> dict:
    """The peaks of `gpus` such devices together: a tensor-parallel run's MFU / MBU are shares of
    the whole group's FLOP/s and bandwidth, not of one GPU's (which TP 2 would pass)."""
    if gpus == 1 or not peak["flops"]:
        return peak
    return {"flops": peak["flops"] * gpus, "bandwidth": peak["bandwidth"] * gpus,
            "source": f"{peak['source']} x {gpus} GPUs"}


def utilization(work: dict, seconds: float, peak: dict) -> dict:
    """MFU and MBU of `work` done in `seconds` against `peak` (None where a peak is unknown)."""
    return {"mfu": work["flops"] / seconds / peak["flops"] if peak["flops"] else None,
            "mbu": work["bytes"] / seconds / peak["bandwidth"] if peak["bandwidth"] else None}


# ---- the machine and the software ------------------------------------------------------------------

def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni",
              "amx_bf16")
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return [f for f in wanted if f in present]
    return []


def git_commit() -> str:
    """HEAD of the checkout the package runs from, "+dirty" with uncommitted changes."""
    here = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if dirty else "")


def versions() -> dict:
    import numpy as np

    import llama_brrr

    found = {"python": platform.python_version(), "llama_brrr": llama_brrr.__version__,
             "llama_brrr_commit": git_commit(), "numpy": np.__version__}
    for name, distribution in (("torch", "torch"), ("transformers", "transformers"),
                               ("llama_cpp_python", "llama_cpp_python")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(distribution)
    with contextlib.suppress(ImportError):
        import torch
        found["cuda"] = torch.version.cuda
    return found


def machine() -> dict:
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "cpu_flags": cpu_flags(),
            "load_average": list(os.getloadavg()), "platform": platform.platform()}
