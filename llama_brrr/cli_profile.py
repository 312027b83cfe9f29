"""`llama-brrr profile` and `llama-brrr calibrate` (entries in cli.COMMANDS).

    llama-brrr profile --shape llama3.2-1b --device cuda --prompt "Hello" --max-new-tokens 64 --out prof/
    llama-brrr profile --model model.gguf --device cpu --torch        # reference.py beside it
    llama-brrr calibrate --device cuda

profile prints the report, writes <out>/summary.json, roofline.png, breakdown.png and trace.json
(the pictures need matplotlib); with --torch it also runs the same prompt through reference.py's
ReferenceLlama (PyTorch eager) under torch.profiler and writes the same files with a torch_ prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", "-m", default=None, help="model file (default: the default model)")
    source.add_argument("--shape", default=None,
                        help="random weights of a named shape (config.SHAPES, e.g. llama3.2-1b)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    parser.add_argument("--dtype", default=None, help="f32 | bf16 | f16 (default: bf16 on cuda, f32 on cpu)")
    parser.add_argument("--quant", default=None,
                        help="auto | none | q8_0 | q4_k | q4_k_m | ... (see llama-brrr run --help)")
    parser.add_argument("--prompt", default="The capital of France is", help="the prompt to run")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="context length (default: model's, at most 4096)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default 0 = all cores)")
    parser.add_argument("--no-graphs", action="store_true", help="cuda: run decode without CUDA graphs")
    parser.add_argument("--out", default=None, help="folder for summary.json, the PNGs and trace.json")
    parser.add_argument("--torch", action="store_true",
                        help="also profile reference.py (PyTorch eager) on the same tokens")


def _load(args):
    from .model import Llama

    if args.shape:
        return Llama.random(args.shape, device=args.device, dtype=args.dtype,
                            max_seq_len=args.max_seq_len or 4096, n_threads=args.threads,
                            quant=args.quant)
    return Llama.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                 max_seq_len=args.max_seq_len, n_threads=args.threads, progress=True,
                                 quant=args.quant)


def _write(summary, out: str | None, prefix: str = "") -> list[str]:
    if not out:
        return []
    os.makedirs(out, exist_ok=True)
    written = []
    path = os.path.join(out, f"{prefix}summary.json")
    with open(path, "w") as f:
        json.dump(summary.to_dict(), f, indent=1)
    written.append(path)
    for name, writer in (("trace.json", summary.write_trace), ("roofline.png", summary.write_roofline),
                         ("breakdown.png", summary.write_breakdown)):
        path = os.path.join(out, prefix + name)
        writer(path)
        written.append(path)
    return written


def run_profile(args: argparse.Namespace) -> int:
    from . import profile
    from .sampling import SamplingParams

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    llm = _load(args)
    if args.no_graphs:
        llm.engine.use_cuda_graphs = False
    params = SamplingParams(max_tokens=args.max_new_tokens, ignore_eos=True)
    llm.generate(args.prompt, params)  # warm-up: first-call costs (graph capture) stay out of the report
    with profile() as prof:
        out = llm.generate(args.prompt, params)[0]
    summary = prof.summary()
    print(summary.table())
    written = _write(summary, args.out)
    if args.torch:
        written += _profile_reference(llm, out.prompt_token_ids, args)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    if not args.out:
        print("no files written: add --out DIR for summary.json, trace.json, roofline.png and "
              "breakdown.png", file=sys.stderr)
    return 0


def _profile_reference(llm, prompt_ids: list[int], args) -> list[str]:
    """The same tokens through ReferenceLlama (PyTorch eager, the engine's weights, its own KV
    cache) under torch.profiler: the prompt pass, then greedy decode one token at a time."""
    try:
        import torch
    except ImportError as error:
        raise ImportError("--torch needs PyTorch (pip install torch)") from error
    from . import profile_torch
    from .reference import ReferenceLlama

    cfg = llm.config
    device = "cuda" if llm.device.startswith("cuda") else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    weights = {name: llm.engine.get_weight(name) for name in cfg.tensor_shapes()}
    ref = ReferenceLlama(cfg, weights, dtype=dtype, device=device)
    n = args.max_new_tokens
    state = {}

    def prefill():
        ref.reset()
        state["next"] = int(ref.forward(prompt_ids)[0, -1].argmax())

    def decode():
        token = state["next"]
        for i in range(n):
            token = int(ref.forward([token], start_pos=len(prompt_ids) + i)[0, -1].argmax())

    prefill()
    decode()  # warm-up of both passes
    dense_flops = 2.0 * (cfg.n_params() - cfg.vocab_size * cfg.dim * (0 if cfg.tie_embeddings else 1))
    summaries = [("prefill", profile_torch(prefill, tokens=len(prompt_ids), phase="prefill",
                                           model_flops=dense_flops * len(prompt_ids))),
                 ("decode", profile_torch(decode, tokens=n, phase="decode", model_flops=dense_flops * n))]
    written = []
    for phase, summary in summaries:
        print(f"\n-- PyTorch eager (reference.py), {phase} --")
        print(summary.table())
        written += _write(summary, args.out, prefix=f"torch_{phase}_")
    return written


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="cpu | cuda | cuda:N (default: cuda when present)")
    parser.add_argument("--quick", action="store_true", help="fewer, smaller measurements")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default 0 = all cores)")


def run_calibrate(args: argparse.Namespace) -> int:
    from . import _C, peaks

    device = args.device
    if device == "auto":
        device = "cuda" if _C is not None and _C.cuda_device_count() > 0 else "cpu"
    backend, _, index = device.partition(":")
    if backend not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    result = peaks.calibrate(backend, int(index or 0), quick=args.quick, n_threads=args.threads)
    print(peaks.describe(result))
    entry = peaks.cached(result.device) or {}
    for key in ("flops_source", "bw_source"):
        if key in entry:
            print(f"  {key}: {entry[key]}")
    return 0
