"""quant_engine_deviations.py — how far the CUDA engine's quantized logits lie from the CPU engines'
over many seeds, to set or check test_cuda_quant_engine's bounds (test_quant_engine.LOGIT_REL_BOUND).

For every kept type and the two mixes of test_cuda_quant_engine, N seeds of its tiny model
(quant_config): the 23-token prefill and 4 decode rows of the GPU engine (gpu), the CPU quantized
engine on the same blocks (cpu_q) and the fp32 CPU engine on their dequantized values (f32), each
pair's deviation as max |difference| / max |logit| (rel_dev). Writes every row as JSON and prints
the maxima.

  PYTHONPATH=.:tests python3 benchmarks/lab/quant_engine_deviations.py --seeds 25 --json out.json
"""
import argparse
import json

import numpy as np

import llama_brrr._C as C
from test_cuda_quant_engine import SPECS, decode_steps, engines
from test_quant_engine import KEPT, quant_config, random_weights, rel_dev, types_for


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=25)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    rows = []
    for spec in KEPT + list(SPECS):
        for seed in range(a.seeds):
            rng = np.random.default_rng(1000 + seed)
            config = quant_config()
            types = types_for(config, SPECS.get(spec, spec))
            gpu, cpu_q, cpu_f, _ = engines(C, config, types, random_weights(config, rng))
            tokens = rng.integers(0, config.vocab_size, 23).astype(np.int32)
            f32 = cpu_f.prefill(0, tokens, 0, "all")
            g, q = gpu.prefill(0, tokens, 0, "all"), cpu_q.prefill(0, tokens, 0, "all")
            rows.append(dict(spec=spec, seed=seed, step="prefill", gq=rel_dev(g, q), gf=rel_dev(g, f32),
                             qf=rel_dev(q, f32)))
            for e in (gpu, cpu_q):
                e.prefill(1, tokens[:-4], 0, "none")
            for step, pos, args in decode_steps(tokens, slot=1):
                g, q = gpu.decode(*args)[0], cpu_q.decode(*args)[0]
                rows.append(dict(spec=spec, seed=seed, step=step, gq=rel_dev(g, q), gf=rel_dev(g, f32[pos]),
                                 qf=rel_dev(q, f32[pos])))
    with open(a.json, "w") as f:
        json.dump(rows, f)
    for kind in ("prefill", "decode"):
        for spec in KEPT + list(SPECS) + ["all"]:
            d = np.array([[r["gq"], r["gf"], r["qf"]] for r in rows
                          if (r["step"] == "prefill") == (kind == "prefill") and spec in ("all", r["spec"])])
            print(f"{kind:7s} {spec:6s} rows {len(d):4d}  gpu-cpu_q max {d[:, 0].max():.4f} mean {d[:, 0].mean():.4f}"
                  f"  gpu-f32 max {d[:, 1].max():.4f}  cpu_q-f32 max {d[:, 2].max():.4f}")


if __name__ == "__main__":
    main()
