"""Quantized decode and prefill on the GPU against the bf16 engine, one model per quantization
(issue 32's targets): batch-1 and batch-16 decode of 256 tokens after a 128-token prompt, and a
2048-token prefill, random weights of one shape, each quantization built once and run on every
workload. Medians of --repeats with [min, max]; ratios against the bf16 run of the same process.

    python3 benchmarks/bench_quant_gpu.py --shape llama3-8b --quants none,q4_k_m,q8_0 --out results.json

--prefill-only runs prefills alone, of --prompts tokens (default 2048: the prefill target).
"""

import argparse
import gc
import json

from llama_brrr import Llama
from llama_brrr.bench import harness, metrics
from llama_brrr.bench.contestants import Engine

WORKLOADS = [harness.Workload(1, 128, 256), harness.Workload(16, 128, 256), harness.Workload(1, 2048, 0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--quants", default="none,q4_k_m,q8_0")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill-only", action="store_true", help="only prefills, of --prompts tokens")
    ap.add_argument("--prompts", default="2048", help="--prefill-only: comma-separated prompt lengths")
    args = ap.parse_args()
    workloads = WORKLOADS
    if args.prefill_only:
        workloads = [harness.Workload(1, int(n), 0) for n in args.prompts.split(",")]
    device = args.device
    peak = metrics.peaks(harness.device_name(device))
    result = {"benchmark": "quant_gpu", "shape": args.shape, "device_name": harness.device_name(device),
              "versions": metrics.versions(), "repeats": args.repeats, "runs": []}
    for quant in args.quants.split(","):
        llm = Llama.random(args.shape, seed=harness.SEED, device=device, max_batch=16, max_seq_len=2304,
                           quant=quant)
        types = llm.weight_types or None
        ours = Engine(llm)
        for w in workloads:
            prompts = harness.prompts_for(llm.config, w)
            timed = harness.measure(ours, prompts, w.generate, args.repeats, 1)
            run = {"quant": quant, "weights": llm.weights_summary, "name": w.name, "workload": w.__dict__,
                   **harness.rates(timed, w, llm.config, llm.dtype, peak, types)}
            result["runs"].append(run)
            rate = run["decode_tok_s"] if w.generate else run["prefill_tok_s"]
            print(f"{args.shape} {quant:7s} {w.name:18s} {rate['median']:10.1f} tok/s "
                  f"[{rate['min']:.1f}, {rate['max']:.1f}]", flush=True)
        del ours, llm
        gc.collect()
    base = {r["name"]: r for r in result["runs"] if r["quant"] == "none"}
    for r in result["runs"]:
        if r["name"] in base and r["quant"] != "none":
            key = "decode_tok_s" if r["workload"]["generate"] else "prefill_tok_s"
            r["vs_bf16"] = r[key]["median"] / base[r["name"]][key]["median"]
            print(f"{r['quant']:7s} {r['name']:18s} {r['vs_bf16']:.2f}x the unquantized run")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
