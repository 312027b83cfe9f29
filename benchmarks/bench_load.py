"""Load time and peak memory of a quantized GGUF on the CPU engine.

    python benchmarks/bench_load.py --shape llama3-8b --quant q4_k_m --dir /tmp/brrr_gguf \
        --out benchmarks/results/cpu/load_llama3-8b_q4_k_m.json

Writes (once, then reuses) a random-weight GGUF of the shape with the recipe's per-tensor types:
each matrix is 64 random rows (N(0, 0.02)) quantized by our quantizers (bit-identical to
llama.cpp's) and repeated to the full height, which keeps the file fast to make while every block
is a real one (load time does not depend on the values). Then each repeat loads it in a fresh
process (`Llama.from_pretrained(path, device="cpu")`, max_seq_len 256, max_batch 1) and records
the load's wall time and the process's peak RSS (VmHWM) against the file's size. The page cache is
warm after the first repeat (the file was just written): the figure is load work, not disk speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROWS_DRAWN = 64


def write_random_gguf(path: Path, shape: str, quant_name: str, seed: int = 0) -> Path:
    import gguf

    from llama_brrr import _C, quant
    from llama_brrr.bench.llamacpp import add_random_llama_header
    from llama_brrr.loaders.gguf import gguf_tensor_name
    from llama_brrr.config import shape_config

    config = shape_config(shape)
    types = quant.plan(config, quant_name, None, "cpu").types
    ids = quant.kept_types()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random {shape} {quant_name}")
    add_random_llama_header(writer, config)
    for name, shape_ in config.tensor_shapes().items():
        file_name = gguf_tensor_name(name)
        if len(shape_) == 1:
            writer.add_tensor(file_name, np.ones(shape_, np.float32))
            continue
        rows, cols = shape_
        drawn = (0.02 * rng.standard_normal((ROWS_DRAWN, cols))).astype(np.float32)
        blocks = _C.quant_ops.quantize(types[name], drawn)
        full = np.tile(blocks, (rows // ROWS_DRAWN + 1, 1))[:rows]
        writer.add_tensor(file_name, full, raw_dtype=gguf.GGMLQuantizationType(ids[types[name]]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_CHILD = """
import sys, time
t0 = time.perf_counter()
from llama_brrr import Llama
t1 = time.perf_counter()
llm = Llama.from_pretrained(sys.argv[1], device="cpu", max_seq_len=256, max_batch=1, progress=False)
t2 = time.perf_counter()
status = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith("Vm"))
kb = lambda key: int(status[key].split()[0])
print(t1 - t0, t2 - t1, kb("VmHWM"), kb("VmRSS"), llm.weights_summary, sep="\\t")
"""


def measure(path: Path, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                             text=True, check=True)
        import_s, load_s, hwm_kb, rss_kb, weights = out.stdout.strip().split("\t")
        runs.append({"import_s": float(import_s), "load_s": float(load_s),
                     "peak_rss_bytes": int(hwm_kb) * 1024, "rss_after_load_bytes": int(rss_kb) * 1024,
                     "weights": weights})
        print(f"load {float(load_s):.2f} s, peak RSS {int(hwm_kb) / 2**20:.2f} GiB", flush=True)
    size = path.stat().st_size
    loads = [r["load_s"] for r in runs]
    peaks = [r["peak_rss_bytes"] for r in runs]
    return {"file": str(path), "file_bytes": size, "runs": runs,
            "load_s_median": statistics.median(loads), "load_s_min": min(loads),
            "load_s_max": max(loads), "peak_rss_over_file_max": max(peaks) / size,
            "peak_rss_over_file_median": statistics.median(peaks) / size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--quant", default="q4_k_m")
    parser.add_argument("--dir", default="/tmp/brrr_gguf", help="where the random GGUF is written")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="JSON results file")
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"random-{args.shape}-{args.quant}.gguf"
    made_s = None
    if not path.exists():
        t = time.perf_counter()
        partial = path.with_suffix(".partial")
        write_random_gguf(partial, args.shape, args.quant)
        os.replace(partial, path)
        made_s = time.perf_counter() - t
        print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {made_s:.0f} s", flush=True)
    result = {"command": " ".join(["python", *sys.argv]), "shape": args.shape,
              "quant": args.quant, "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "write_s": made_s, **measure(path, args.repeats)}
    print(f"{args.shape} {args.quant}: {result['file_bytes'] / 1e9:.2f} GB, load "
          f"{result['load_s_median']:.2f} s median ({result['load_s_min']:.2f}-"
          f"{result['load_s_max']:.2f}), peak RSS {result['peak_rss_over_file_max']:.3f}x the file")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
