"""`llama-brrr bench` and `llama-brrr compare` (entries in cli.COMMANDS; the work is in
llama_brrr.bench).

    llama-brrr bench --shape llama3.2-1b -b 1,16 -p 512 -n 128 --device cuda
    llama-brrr bench --sweep --quick --json out/sweep.json
    llama-brrr compare --shape llama3.2-1b -p 128,2048 -n 128 --out-dir benchmarks/results/h100-sxm
    llama-brrr compare --model SmolLM2-135M-Instruct.Q4_1.gguf --device cpu --threads 2
    llama-brrr compare --device cpu --threads 2 --model default --quant-twins q8_0,q4_k_m \
        --workloads 32:256,512:0 --contestants llama.cpp --perplexity --out-dir benchmarks/results/cpu
    llama-brrr bench serve --shape smollm2-135m --num-prompts 64 --input-len 128 --output-len 64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

QUICK = {"repeats": 2, "warmup": 1, "generate": 32, "sweep_generate": 16}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _pairs(text: str) -> list[tuple[int, int]]:
    pairs = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        prompt, colon, generate = item.partition(":")
        if not colon or not prompt.isdigit() or not generate.isdigit() or int(prompt) < 1:
            raise ValueError(f"--workloads: expected PROMPT:GENERATED pairs such as 32:256,512:0, got {item!r}")
        pairs.append((int(prompt), int(generate)))
    if not pairs:
        raise ValueError("--workloads: expected at least one PROMPT:GENERATED pair")
    return pairs


def add_common_arguments(parser: argparse.ArgumentParser, compare: bool) -> None:
    what = parser.add_argument_group("what to run")
    what.add_argument("--shape", default=None,
                      help="random-weight shape(s), comma-separated config.SHAPES names (default "
                           "smollm2-135m; with --sweep: smollm2-135m,llama3.2-1b,llama3-8b)")
    what.add_argument("--model", "-m", default=None, help="a model file instead of random weights")
    what.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    what.add_argument("--dtype", default=None, help="f32 | bf16 | f16 (default bf16 on cuda, f32 on cpu)")
    what.add_argument("--quant", default=None,
                      help="Llama.from_pretrained(quant=...): none | q8_0 | q4_k_m | ... (default: a "
                           "GGUF's quantized tensors as stored)")
    what.add_argument("--threads", type=int, default=0, help="CPU threads (default 0 = all cores)")
    what.add_argument("--tensor-parallel", "--tp", type=int, default=1, metavar="N",
                      help="GPUs to split the model over, one worker process each (default 1; needs cuda)")
    what.add_argument("-b", "--batch", type=_ints, default=[1], help="batch sizes, comma-separated (1)")
    what.add_argument("-p", "--prompt", type=_ints, default=[128, 2048] if compare else [512],
                      help=f"prompt tokens, comma-separated ({'128,2048' if compare else '512'})")
    what.add_argument("-n", "--generate", type=_ints, default=None,
                      help="generated tokens after the first, comma-separated; 0 = prefill only "
                           "(128; 32 with --quick)")
    what.add_argument("--workloads", default=None,
                      help="PROMPT:GENERATED pairs, comma-separated, instead of the -p x -n product "
                           "(e.g. 32:256,512:0: a decode run after a short prompt, a prefill-only run)")
    what.add_argument("--sweep", action="store_true",
                      help="decode at batch 1,4,16,64 x context 128,2048 and prefill at "
                           "128,512,2048,8192 tokens, on every --shape")
    how = parser.add_argument_group("how")
    how.add_argument("--repeats", type=int, default=None, help="timed repeats (default 5; 2 with --quick)")
    how.add_argument("--warmup", type=int, default=None, help="warm-up runs (default 1)")
    how.add_argument("--quick", action="store_true",
                     help="fewer tokens, repeats and sweep points (a GPU sweep in minutes)")
    how.add_argument("--no-split", action="store_true",
                     help="skip the compute / memory / overhead split (one extra profiled run)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, default=None, help="write the results JSON here")
    out.add_argument("--out-dir", type=Path, default=None,
                     help="write <out-dir>/{bench,sweep,compare}.json (and compare.png) here, e.g. "
                          "benchmarks/results/<gpu>")
    if compare:
        from .bench.harness import OPPONENTS

        parser.add_argument("--contestants", default=",".join(OPPONENTS),
                            help=f"opponents, comma-separated (default all: {','.join(OPPONENTS)}); "
                                 f"one that cannot run here is skipped with a note")
        parser.add_argument("--budget-s", type=float, default=1e9,
                            help="skip opponents and profiled splits that would run past this many seconds")
        parser.add_argument("--png", type=Path, default=None,
                            help="grouped bar chart path (default: beside the JSON)")
        parser.add_argument("--no-png", action="store_true", help="no bar chart")
        parser.add_argument("--quant-twins", default=None,
                            help="also run requantizations of --model (a GGUF) that llama.cpp's quantize "
                                 "makes, comma-separated: q8_0,q4_k_m (also f32,f16); per file: the "
                                 "tensor-type census, each side's RSS after load, issue 31's targets")
        parser.add_argument("--perplexity", action="store_true",
                            help="with --quant-twins: both sides' perplexity on tests/data's fixed "
                                 "text per file (the llama.cpp check: within 1%%)")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, compare=False)


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, compare=True)


def _plan(args: argparse.Namespace):
    """(Options template, [(shape or None, workload groups)]) from the arguments, checked."""
    from .bench.harness import SWEEP_SHAPES, Options, Workload, sweep_groups
    from .config import shape_config

    repeats = args.repeats if args.repeats is not None else (QUICK["repeats"] if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else 1
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need --repeats >= 1 and --warmup >= 0, got {repeats} and {warmup}")
    generate = args.generate or [QUICK["generate"] if args.quick else 128]
    if min(generate) < 0 or min(args.prompt) < 1 or min(args.batch) < 1:
        raise ValueError("need --prompt >= 1, --batch >= 1 and --generate >= 0")
    if args.model and args.shape:
        raise ValueError("give --model or --shape, not both")
    if args.model and args.sweep:
        raise ValueError("--sweep runs random-weight shapes; leave out --model")
    shapes = [s.strip() for s in (args.shape or "").split(",") if s.strip()]
    shapes = shapes or ([None] if args.model else list(SWEEP_SHAPES) if args.sweep else ["smollm2-135m"])
    for shape in shapes:
        if shape is not None:
            shape_config(shape)  # a ConfigError (ValueError) naming the known shapes
    if args.sweep:
        tokens = args.generate[0] if args.generate else (QUICK["sweep_generate"] if args.quick else 128)
        groups = sweep_groups(None, tokens, args.quick)
    elif args.workloads:
        groups = [[Workload(b, p, n) for b in args.batch for p, n in _pairs(args.workloads)]]
    else:
        groups = [[Workload(b, p, n) for b in args.batch for p in args.prompt for n in generate]]
    model = args.model
    if model == "default" and getattr(args, "quant_twins", None):
        from .fetch import resolve_model

        model = str(resolve_model(None, progress=False))  # the twins are named after the real file
    options = Options(model=model, device=args.device, dtype=args.dtype, quant=args.quant, threads=args.threads,
                      tensor_parallel=args.tensor_parallel,
                      repeats=repeats, warmup=warmup, split=not args.no_split)
    return options, [(shape, groups) for shape in shapes]


def _run(args: argparse.Namespace, kind: str) -> dict:
    import dataclasses

    from .bench import harness

    options, plan = _plan(args)
    if kind == "compare":
        wanted = [c.strip() for c in args.contestants.split(",") if c.strip()]
        unknown = [c for c in wanted if c not in harness.OPPONENTS]
        if unknown:
            raise ValueError(f"--contestants: unknown {unknown}; choose from {', '.join(harness.OPPONENTS)}")
        options.contestants = ("llama_brrr", *wanted)
        options.budget_s = args.budget_s
    result = None
    name = ("compare" if kind == "compare" else "bench") if not args.sweep else \
        ("compare_sweep" if kind == "compare" else "sweep")

    def save_partial(part: dict) -> None:
        # Written after every workload, so a run cut short (a time limit) leaves what it measured.
        earlier = result["runs"] if result is not None else []
        _outputs(args, {**part, "runs": earlier + part["runs"], "partial": True}, name)

    options.on_run = save_partial
    if kind == "compare" and args.quant_twins is not None:
        if not options.model or plan[0][0] is not None:
            raise ValueError("--quant-twins requantizes a GGUF: pass --model FILE.gguf (or --model default)")
        if args.sweep:
            raise ValueError("--quant-twins runs the given workloads, not --sweep")
        twins = [t.strip() for t in args.quant_twins.split(",") if t.strip()]
        options.on_run = lambda part: _outputs(args, {**part, "partial": True}, "compare_quant")
        return harness.run_quant_peer(options, plan[0][1], twins, args.perplexity)
    if kind == "compare" and args.perplexity:
        raise ValueError("--perplexity goes with --quant-twins")
    for shape, groups in plan:
        opts = dataclasses.replace(options, shape=shape)
        part = (harness.run_compare if kind == "compare" else harness.run_bench)(opts, groups)
        if result is None:
            result = part
        else:
            result["runs"] += part["runs"]
            result["skipped"] += part["skipped"]
    result["sweep"] = bool(args.sweep)
    return result


def _outputs(args, result: dict, name: str) -> list[Path]:
    from .bench import report

    paths = [p for p in (args.json, args.out_dir and args.out_dir / f"{name}.json") if p]
    for path in paths:
        report.write_json(result, path)
    return paths


def run_bench(args: argparse.Namespace) -> int:
    from .bench import report

    result = _run(args, "bench")
    print(report.print_bench(result))
    for path in _outputs(args, result, "sweep" if args.sweep else "bench"):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from .bench import report

    result = _run(args, "compare")
    print(report.print_compare(result))
    name = "compare_sweep" if args.sweep else "compare"
    if result.get("benchmark") == "compare_quant":
        print(report.print_quant_peer(result))
        name = "compare_quant"
    paths = _outputs(args, result, name)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    png = args.png or (paths[0].with_suffix(".png") if paths else None)
    if png and not args.no_png:
        report.plot_compare(result, png)
        print(f"wrote {png}", file=sys.stderr)
    disagree = [f"{run['name']} {key}" for run in result["runs"] for key, r in run["ratios"].items()
                if r.get("agrees") is False]
    if disagree:
        print(f"llama-brrr compare: outputs disagree ({', '.join(disagree)}): those speeds compare "
              f"different work", file=sys.stderr)
        return 1
    return 0


# ---- bench serve --------------------------------------------------------------------------------

def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a rate > 0 (or inf), got {text!r}")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """`llama-brrr bench serve`: serving throughput and latency (llama_brrr.bench.serve)."""
    from .bench.serve import MODES

    what = parser.add_argument_group("model")
    what.add_argument("--shape", default=None, help="random-weight shape (default smollm2-135m)")
    what.add_argument("--model", "-m", default=None, help="a model file instead of random weights")
    what.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    what.add_argument("--dtype", default=None, help="f32 | bf16 | f16")
    what.add_argument("--quant", default=None, help="as Llama.from_pretrained(quant=...)")
    what.add_argument("--threads", type=int, default=0, help="CPU threads (default 0 = all cores)")
    what.add_argument("--tensor-parallel", "--tp", type=int, default=1, metavar="N",
                      help="GPUs to split the model over, one worker process each (default 1; needs cuda)")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--max-num-seqs", type=int, default=None,
                        help="KV slots, sequences at once (default: the engine's, 8 on cpu, 64 on cuda)")
    engine.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="per-step token budget (default 512 cpu, 8192 cuda)")
    engine.add_argument("--decode-steps", type=int, default=None,
                        help="decode rounds per engine call while nobody waits (1 cpu, 16 cuda)")
    engine.add_argument("--no-pipeline", dest="pipeline", action="store_const", const=False, default=None,
                        help="read each step's tokens before the next launch (the default on cuda "
                             "launches step k + 1 before reading step k)")
    engine.add_argument("--pipeline", dest="pipeline", action="store_const", const=True,
                        help="launch step k + 1 before reading step k (the default on cuda; "
                             "on cpu nothing overlaps)")
    from .cli import add_kv_cache_arguments

    add_kv_cache_arguments(parser)
    load = parser.add_argument_group("workload")
    load.add_argument("--num-prompts", type=int, default=32, help="requests (32)")
    load.add_argument("--input-len", type=int, default=64, help="random prompt tokens (64)")
    load.add_argument("--shared-prefix", type=int, default=0,
                      help="the first N of every random prompt's --input-len tokens are the same "
                           "(a system prompt; default 0)")
    load.add_argument("--output-len", type=int, default=32, help="generated tokens, ignore_eos (32)")
    load.add_argument("--dataset", default=None,
                      help='JSON lines {"prompt": text or ids, "output_len": n} instead of random prompts')
    load.add_argument("--request-rate", type=_rate, default=float("inf"),
                      help="requests per second, Poisson arrivals (default inf: all at once)")
    load.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    load.add_argument("--seed", type=int, default=0, help="prompts and arrivals (0)")
    how = parser.add_argument_group("run")
    how.add_argument("--modes", default=",".join(MODES),
                     help=f"comma-separated, in the order run (default {','.join(MODES)})")
    how.add_argument("--repeats", type=int, default=3, help="runs of each mode, interleaved (3)")
    how.add_argument("--json", type=Path, default=None, help="write the results JSON here")


def run_bench_serve(args: argparse.Namespace) -> int:
    from .bench import report
    from .bench.serve import ServeOptions, run, table
    from .cli import kv_cache_kwargs

    if args.model and args.shape:
        raise ValueError("give --model or --shape, not both")
    opts = ServeOptions(
        shape=args.shape or (None if args.model else "smollm2-135m"), model=args.model,
        device=args.device, dtype=args.dtype, quant=args.quant, threads=args.threads,
        tensor_parallel=args.tensor_parallel, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        decode_steps=args.decode_steps, pipeline=args.pipeline, **kv_cache_kwargs(args),
        shared_prefix=args.shared_prefix,
        num_prompts=args.num_prompts, input_len=args.input_len,
        output_len=args.output_len, dataset=args.dataset, request_rate=args.request_rate,
        max_concurrency=args.max_concurrency, seed=args.seed, repeats=args.repeats,
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()))
    if opts.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {opts.num_prompts}")
    command = "llama-brrr " + " ".join(getattr(args, "argv", ["bench", "serve"]))

    def progress(partial: dict) -> None:
        # The JSON so far after every mode's run: a run stopped by a time limit keeps those.
        if args.json:
            partial["command"] = command
            partial["partial"] = True
            report.write_json(partial, args.json)

    result = run(opts, on_progress=progress)
    result["command"] = command
    result["partial"] = False
    print(table(result))
    if args.json:
        report.write_json(result, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
