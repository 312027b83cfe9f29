"""The `llama-brrr` command (also `python -m llama_brrr`).

    llama-brrr generate "Once upon a time" --max-new-tokens 64
    llama-brrr chat --model path/to/model.gguf

Subcommands live in COMMANDS (name -> help, argument setup, handler), so bench / compare / profile /
calibrate add themselves with one entry. Generated text goes to stdout as it is produced; progress
bars, statistics and errors go to stderr. A user error prints "llama-brrr: error: <message>" and
exits with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable

from . import cli_bench, cli_profile
from .errors import BrrrError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
USER_ERRORS = (BrrrError, ValueError, RuntimeError, MemoryError, FileNotFoundError, ImportError)
# Set to 1 to get the traceback of an error the command does not expect (a bug to report).
TRACEBACK_ENV = "LLAMA_BRRR_TRACEBACK"


@dataclass
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ---- shared options ---------------------------------------------------------------------------

def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--model", "-m", default=None,
                       help="model file or name (default: the default model, downloaded if missing)")
    group.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    group.add_argument("--dtype", default=None,
                       help="f32 | bf16 | f16 (default: bf16 on cuda, f32 on cpu)")
    group.add_argument("--quant", default=None,
                       help="auto | none | q8_0 | q4_k | q4_k_m | ... (default auto: quantized GGUF "
                            "tensors run as stored on the CPU; none: dequantize; a type or recipe: "
                            "quantize at load)")
    group.add_argument("--max-seq-len", type=int, default=None,
                       help="context length in tokens (default: min(model context, 4096))")
    group.add_argument("--threads", type=int, default=0, help="CPU threads (default 0 = all cores)")
    group.add_argument("--tensor-parallel", "--tp", type=int, default=1, metavar="N",
                       help="GPUs to split the model over, one worker process each (default 1; needs cuda)")


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-new-tokens", type=int, default=256,
                       help="tokens to generate at most (default 256)")
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    group.add_argument("--top-k", type=int, default=0, help="0 = off (default)")
    group.add_argument("--top-p", type=float, default=1.0, help="1 = off (default)")
    group.add_argument("--min-p", type=float, default=0.0, help="0 = off (default)")
    group.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off (default)")
    group.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")


def load_model(args: argparse.Namespace):
    from . import Llama

    llm = Llama.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                max_seq_len=args.max_seq_len, n_threads=args.threads,
                                progress=True, quant=args.quant,
                                tensor_parallel=args.tensor_parallel)
    print(f"llama-brrr: loaded {llm.source} on {llm.device}: {llm.weights_summary}", file=sys.stderr)
    return llm


def sampling_params(args: argparse.Namespace):
    from .sampling import SamplingParams

    return SamplingParams(max_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed)


def timing_line(timings: dict) -> str:
    """The closing statistics line. The first generated token comes out of the prompt pass, so the
    generation rate counts the decode steps after it: (generated - 1) / decode time."""
    return (f"prompt {timings['prompt_tokens']} tok in {timings['prefill_s']:.3f} s "
            f"({timings['prefill_tok_s']:.1f} tok/s), "
            f"generated {timings['generated_tokens']} tok in {timings['decode_s']:.3f} s "
            f"({timings['decode_tok_s']:.1f} tok/s)")


def write_stream(pieces) -> None:
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


# ---- generate ---------------------------------------------------------------------------------

def add_generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the text to continue")
    add_model_arguments(parser)
    add_sampling_arguments(parser)


def run_generate(args: argparse.Namespace) -> int:
    prompt = text_argument("the prompt", args.prompt)
    params = sampling_params(args)
    llm = load_model(args)
    write_stream(llm.stream(prompt, params))
    print(timing_line(llm.last_output.timings), file=sys.stderr)
    return 0


# ---- chat -------------------------------------------------------------------------------------

def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--system", default=None, help="a system message opening the conversation")
    add_model_arguments(parser)
    add_sampling_arguments(parser)


def run_chat(args: argparse.Namespace) -> int:
    system = text_argument("--system", args.system) if args.system is not None else None
    params = sampling_params(args)
    llm = load_model(args)
    interactive = sys.stdin.isatty()
    if interactive:
        print("chat: type a message; /exit or Ctrl-D ends", file=sys.stderr)
    history = [{"role": "system", "content": system}] if system else []
    # Bytes, decoded here: a line that is not UTF-8 gets an error naming it, whatever the locale.
    stdin = getattr(sys.stdin, "buffer", None)
    line_number = 0
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = stdin.readline() if stdin is not None else sys.stdin.readline()
        if not line:
            break
        line_number += 1
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"chat input line {line_number} is not valid UTF-8 (byte "
                                 f"{line[error.start]:#04x} at offset {error.start})") from None
        message = line.strip()
        if message == "/exit":
            break
        if not message:
            continue
        history.append({"role": "user", "content": message})
        drop_old_turns(llm, history)
        write_stream(llm.chat_stream(history, params))
        history.append({"role": "assistant", "content": llm.last_output.text})
        print(timing_line(llm.last_output.timings), file=sys.stderr)
    return 0


def text_argument(name: str, value: str) -> str:
    """A command-line text argument as text. Python hands bytes that are not UTF-8 over as lone
    surrogates (surrogateescape); the model cannot take them, so say which byte is wrong."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raw = value.encode("utf-8", "surrogateescape")
        bad = value[error.start:error.start + 1].encode("utf-8", "surrogateescape")
        raise ValueError(f"{name} is not valid UTF-8 (byte {bad[0]:#04x} at character "
                         f"{error.start} of {len(raw)} bytes)") from None
    return value


def drop_old_turns(llm, history: list[dict]) -> None:
    """Forgets the oldest exchanges (keeping a system message) until the prompt fits the context."""
    first = 1 if history and history[0]["role"] == "system" else 0
    while len(history) - first > 1:
        text = llm.tokenizer.apply_chat_template(history, add_generation_prompt=True)
        if len(llm.tokenizer.encode(text)) < llm.max_seq_len:
            return
        del history[first:first + 2]


# ---- serve ------------------------------------------------------------------------------------

def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    group.add_argument("--served-model-name", default=None,
                       help="the model name clients pass (default: the model file's name)")
    group.add_argument("--max-num-seqs", type=int, default=None,
                       help="sequences running at once: the engine's KV slots (default 8 on cpu, "
                            "64 on cuda)")
    group.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="tokens one engine step processes at most, decode rows plus prompt "
                            "chunks (default 512 on cpu, 8192 on cuda)")
    group.add_argument("--decode-steps", type=int, default=None,
                       help="decode rounds per engine call while no request waits (default 1 on "
                            "cpu, 16 on cuda)")
    add_kv_cache_arguments(parser)
    group.add_argument("--log-level", default="info", help="uvicorn's log level (default info)")


def add_kv_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """The paged KV cache's options (serve and bench serve)."""
    group = parser.add_argument_group("KV cache")
    group.add_argument("--kv-block-size", type=int, default=16,
                       help="positions per KV block: 16, 32, 64 or 128 (default 16)")
    group.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="CUDA: the share of the GPU's memory the engine may hold, weights and "
                            "KV pool included (default 0.9)")
    group.add_argument("--kv-blocks", type=int, default=None,
                       help="KV pool size in blocks (default: enough for every sequence to hold "
                            "the whole context, on CUDA fewer when memory is short)")
    group.add_argument("--no-prefix-caching", action="store_true",
                       help="requests sharing a prompt prefix do not share its KV blocks")
    group.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto",
                       help="KV element type: auto (the compute dtype) or fp8 (e4m3, unit scale: "
                            "half the bytes of bf16, twice the blocks in the same memory; default "
                            "auto)")


def kv_cache_kwargs(args: argparse.Namespace) -> dict:
    return dict(kv_block_size=args.kv_block_size, gpu_memory_utilization=args.gpu_memory_utilization,
                kv_blocks=args.kv_blocks, enable_prefix_caching=not args.no_prefix_caching,
                kv_cache_dtype=args.kv_cache_dtype)


def kv_pool_description(llm) -> str:
    """The KV pool as the startup line gives it: "KV pool of N blocks of B", with " in fp8_e4m3"
    when the cache does not hold the compute dtype."""
    kv_cache_dtype = llm.engine.config.get("kv_cache_dtype", "auto")
    element = "" if kv_cache_dtype == "auto" else f" in {kv_cache_dtype}"
    return f"KV pool of {llm.block_manager.n_blocks} blocks of {llm.block_manager.block_size}{element}"


def run_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import Llama
    from .serving.async_engine import AsyncLlama
    from .serving.server import run_server

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ImportError(f"llama-brrr serve needs fastapi and uvicorn ({error}); pip install "
                          f"fastapi uvicorn") from None
    llm = Llama.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                max_seq_len=args.max_seq_len, max_batch=args.max_num_seqs,
                                n_threads=args.threads, progress=True, quant=args.quant,
                                tensor_parallel=args.tensor_parallel, **kv_cache_kwargs(args))
    engine = AsyncLlama(llm, max_num_batched_tokens=args.max_num_batched_tokens,
                        decode_steps=args.decode_steps, owns_model=True)
    name = args.served_model_name or Path(llm.source).name
    print(f"llama-brrr: serving {llm.source} as {name!r} on http://{args.host}:{args.port}/v1 "
          f"({llm.device}, {engine.scheduler.max_num_seqs} sequences, "
          f"{engine.scheduler.max_num_batched_tokens} tokens per step, {kv_pool_description(llm)}, "
          f"prefix caching {'on' if llm.enable_prefix_caching else 'off'})", file=sys.stderr)
    run_server(engine, name, host=args.host, port=args.port, log_level=args.log_level)
    return 0


# ---- dispatch ---------------------------------------------------------------------------------

COMMANDS: dict[str, Command] = {
    "generate": Command("continue a prompt, streaming the text", add_generate_arguments,
                        run_generate),
    "chat": Command("interactive chat over stdin (history kept; /exit or EOF ends)",
                    add_chat_arguments, run_chat),
    "serve": Command("an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, "
                     "/metrics) with continuous batching", add_serve_arguments, run_serve),
    "bench": Command("time llama_brrr on prefill / decode workloads (llama-bench style table)",
                     cli_bench.add_bench_arguments, cli_bench.run_bench),
    "compare": Command("llama_brrr against PyTorch eager, HF, torch.compile and llama.cpp, as ratios",
                       cli_bench.add_compare_arguments, cli_bench.run_compare),
    "profile": Command("profile a generation: compute / memory / overhead per phase, per kernel; "
                       "PNGs and a Chrome trace with --out",
                       cli_profile.add_profile_arguments, cli_profile.run_profile),
    "calibrate": Command("measure this device's copy bandwidth and best matmul rate (cached for "
                         "profile reports)", cli_profile.add_calibrate_arguments,
                         cli_profile.run_calibrate),
}


class _Parser(argparse.ArgumentParser):
    """argparse prints its own 'prog: error:' line; make it the same prefix as ours."""

    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"llama-brrr: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="llama-brrr", description="llama_brrr: Llama-family inference engine")
    parser.add_argument("--version", action="version", version=f"llama-brrr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def error_message(error: BaseException) -> str:
    """The text after "llama-brrr: error: ": never empty, and printable whatever the locale (a
    file name that is not UTF-8 comes back escaped)."""
    text = str(error).strip()
    if not text:
        text = f"{type(error).__name__} (no message)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "serve"]:
        # A mode of `bench` with options of its own (bench's other options do not apply to it).
        parser = _Parser(prog="llama-brrr bench serve",
                         description="serving throughput and latency: the continuous-batching "
                                     "scheduler, the HTTP server, static waves and HF transformers")
        cli_bench.add_serve_arguments(parser)
        args = parser.parse_args(argv[2:])
        args.argv = argv
        run = cli_bench.run_bench_serve
    else:
        args = build_parser().parse_args(argv)
        run = COMMANDS[args.command].run
    try:
        return run(args)
    except USER_ERRORS as error:
        sys.stdout.flush()
        print(f"llama-brrr: error: {error_message(error)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\nllama-brrr: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # a case no check foresaw: still one line, the traceback on request
        sys.stdout.flush()
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"llama-brrr: error: {type(error).__name__}: {error_message(error)} (an unexpected "
              f"error; {TRACEBACK_ENV}=1 shows its traceback for a bug report)", file=sys.stderr)
        return EXIT_USER_ERROR
