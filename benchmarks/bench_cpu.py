#!/usr/bin/env python3
"""CPU batch-1 decode benchmark on the real SmolLM2-135M-Instruct.

Contestants, all on the same machine, the same ~128-token chat prompt (as token ids), greedy,
the same thread count:
  llama_brrr f32 / bf16   Llama.from_pretrained(device="cpu").generate(..., ignore_eos=True)
  llama.cpp F32 / F16     llama-cpp-python 0.3.36 on F32 / F16 GGUFs that llama.cpp's own
                          quantize writes from the Q4_1 default model (cached under
                          <llama_brrr cache>/bench/)
  torch eager f32         llama_brrr.reference.ReferenceLlama, token by token with its KV cache

Every contestant loads the same F32 GGUF (llama.cpp F16 loads its F16 twin), so all of them run
the same numbers. Before any speed is compared the outputs are checked: llama_brrr f32 logits vs
the reference (max |Δ| < 1e-3), and its first 32 greedy tokens vs llama.cpp F32 and vs eager.

Each contestant lives in its own process, as it would for a user: three OpenMP runtimes, three
allocators and three thread pools never share one address space. The parent only sends prompts
and collects timings, one contestant at a time, so the others sit idle while one is measured.

Rates (identical for every contestant):
  decode tok/s  = (generated - 1) / (time from the first generated token to the last)
  TTFT          = prompt in -> first token out; prefill tok/s = prompt tokens / TTFT
One warm-up run per contestant, then `--repeats` rounds; a round runs every contestant once, so
a change in machine load hits all of them alike. Medians with min/max are reported.

This box is shared: /proc/stat tells how many cores other processes (and other guests of the
hypervisor) used during each run. A run where that exceeds --max-other-cores is set aside (kept
in the JSON) and measured again, up to --retries times, whoever the contestant; a run still
disturbed after that is kept, marked, and the script warns.

    python benchmarks/bench_cpu.py                 # full run -> benchmarks/results/cpu/
    python benchmarks/bench_cpu.py --quick         # smoke run (few tokens, 1 repeat) -> a temp dir
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import multiprocessing
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from llama_brrr.bench.llamacpp import (LLAMA_CPP_INSTALL, BenchError, LlamaCpp,  # noqa: E402
                                       reference_gguf)
from llama_brrr.bench.metrics import cpu_flags, cpu_model, versions  # noqa: E402
from llama_brrr.errors import BrrrError  # noqa: E402

RESULT_NAME = "decode_smollm2"
N_CTX = 512
CALL_TIMEOUT_S = 1200  # loading or one run; generous for a loaded 2-core box, finite for a hang
AGREE_TOKENS = 32      # docs/design.md: greedy tokens identical to the oracle for the first 32
LOGIT_TOLERANCE = 1e-3  # docs/design.md: fp32 CPU path vs fp32 oracle, max |Δlogit|

# A request that makes a small chat model write a long answer; ~128 tokens through ChatML.
PROMPT_MESSAGES = [
    {"role": "system",
     "content": "You are a helpful assistant who writes long, detailed and vivid stories."},
    {"role": "user",
     "content": ("Write a long story about a lighthouse keeper on a small northern island who "
                 "finds a mysterious glass bottle washed up on the rocks after a winter storm. "
                 "Inside the bottle is a faded map and a letter written decades ago by a sailor "
                 "who never came home. Describe the keeper's daily routine, the island, the "
                 "weather and the sea, the people in the nearby fishing village, and the long "
                 "journey the keeper takes to follow the map to its very end. Use many paragraphs "
                 "and do not stop early.")},
]


# ---- one measured run ----------------------------------------------------------------------------

@dataclass
class Run:
    tokens: list[int]   # generated ids; the first comes from the prompt's logits
    ttft_s: float       # prompt in -> first token out
    decode_s: float     # first token out -> last token out
    prompt_tokens: int
    extra: dict = field(default_factory=dict)  # contestant-specific numbers (internal timers)

    @property
    def decode_tok_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else float("nan")

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else float("nan")

    def record(self) -> dict:
        return {"generated_tokens": len(self.tokens), "decode_tok_s": self.decode_tok_s,
                "decode_s": self.decode_s, "ttft_s": self.ttft_s,
                "prefill_tok_s": self.prefill_tok_s, **self.extra}


# ---- contestants (each built inside its own worker process) -------------------------------------

class BrrrContestant:
    """llama_brrr's CPU engine through the public generate() API."""

    def __init__(self, model_path: str, dtype: str, threads: int):
        from llama_brrr import Llama, _C

        self.llm = Llama.from_pretrained(model_path, device="cpu", dtype=dtype, max_seq_len=N_CTX,
                                         max_batch=1, n_threads=threads, progress=False)
        self.settings = {"model_file": model_path, "dtype": dtype, "n_threads": threads,
                         "max_seq_len": N_CTX, "max_batch": 1, "cpu_simd": _C.cpu_simd()}

    def run(self, prompt_ids: list[int], n_tokens: int) -> Run:
        out = self.llm.generate(list(prompt_ids), max_tokens=n_tokens, temperature=0.0,
                                ignore_eos=True)[0]
        if len(out.token_ids) != n_tokens:
            raise BenchError(f"generate returned {len(out.token_ids)} tokens, asked for "
                             f"{n_tokens} with ignore_eos=True (finish_reason "
                             f"{out.finish_reason!r})")
        t = out.timings
        return Run(list(out.token_ids), t["ttft_s"], t["decode_s"], len(prompt_ids),
                   extra={"reported_decode_tok_s": t["decode_tok_s"],
                          "reported_prefill_tok_s": t["prefill_tok_s"]})

    def all_logits(self, ids: list[int]) -> np.ndarray:
        return self.llm.forward(list(ids))

    def chat_prompt(self, messages: list[dict]) -> tuple[str, list[int]]:
        text = self.llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return text, list(self.llm.tokenizer.encode(text, add_bos=False))

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.tokenizer.decode(list(ids))


class LlamaCppContestant(LlamaCpp):
    """llama.cpp through llama-cpp-python (llama_brrr.bench.llamacpp.LlamaCpp: eval() plus greedy
    argmax over its logits, so generation continues through EOS exactly like ignore_eos), with
    llama.cpp's internal timers recorded beside the wall clock."""

    def __init__(self, model_path: str, threads: int):
        super().__init__(model_path, threads, N_CTX)

    def run(self, prompt_ids: list[int], n_tokens: int) -> Run:
        lc, llm = self.lc, self.llm
        llm.reset()
        lc.llama_perf_context_reset(llm.ctx)
        t0 = time.perf_counter()
        llm.eval(list(prompt_ids))
        tokens = [int(np.argmax(self._last_logits()))]
        t_first = time.perf_counter()
        while len(tokens) < n_tokens:
            llm.eval([tokens[-1]])
            tokens.append(int(np.argmax(self._last_logits())))
        t_last = time.perf_counter()
        perf = lc.llama_perf_context(llm.ctx)
        extra = {"internal_prefill_ms": perf.t_p_eval_ms, "internal_prefill_tokens": perf.n_p_eval,
                 "internal_decode_ms": perf.t_eval_ms, "internal_decode_tokens": perf.n_eval}
        if perf.t_eval_ms > 0:
            extra["internal_decode_tok_s"] = perf.n_eval / (perf.t_eval_ms / 1e3)
        return Run(tokens, t_first - t0, t_last - t_first, len(prompt_ids), extra=extra)

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def chat_prompt(self, messages: list[dict]) -> tuple[str, list[int]]:
        import jinja2

        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise BenchError(f"{self.settings['model_file']} has no chat template to build the "
                             f"prompt with; include llama_brrr-f32 in --only")
        text = jinja2.Template(template).render(messages=messages, add_generation_prompt=True)
        return text, self.tokenize(text)


class EagerContestant:
    """PyTorch eager fp32: the package's reference model, decoding token by token."""

    def __init__(self, model_path: str, threads: int):
        import torch

        from llama_brrr.loaders import load_model
        from llama_brrr.reference import ReferenceLlama

        self.torch = torch
        torch.set_num_threads(threads)
        loaded = load_model(model_path)
        with warnings.catch_warnings():
            # The reference wraps the loader's read-only memory maps; it never writes to them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.model = ReferenceLlama(loaded.config, loaded.tensors, dtype=torch.float32,
                                        device="cpu")
        self.settings = {"model_file": model_path, "dtype": "float32",
                         "torch_threads": torch.get_num_threads(), "torch": torch.__version__}

    def _forward(self, ids: list[int], start_pos: int):
        return self.model.forward(self.torch.tensor([ids], dtype=self.torch.long),
                                  start_pos=start_pos)

    def run(self, prompt_ids: list[int], n_tokens: int) -> Run:
        with self.torch.inference_mode():
            self.model.reset()
            t0 = time.perf_counter()
            tokens = [int(self._forward(list(prompt_ids), 0)[0, -1].argmax())]
            t_first = time.perf_counter()
            position = len(prompt_ids)
            while len(tokens) < n_tokens:
                tokens.append(int(self._forward([tokens[-1]], position)[0, -1].argmax()))
                position += 1
            t_last = time.perf_counter()
        return Run(tokens, t_first - t0, t_last - t_first, len(prompt_ids))

    def all_logits(self, ids: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            self.model.reset()
            return self._forward(list(ids), 0)[0].float().numpy()


@dataclass
class Spec:
    """What a worker process builds: a contestant class by name, with its arguments."""
    key: str
    label: str
    kind: str   # "brrr", "llama.cpp" or "eager"
    kwargs: dict


KINDS = {"brrr": BrrrContestant, "llama.cpp": LlamaCppContestant, "eager": EagerContestant}


def machine_cpu_s() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of the whole machine since boot, from /proc/stat; zeros where
    there is none (then no run is ever seen as disturbed)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0, 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / ticks_per_s, steal / ticks_per_s


def serve(conn, spec: Spec) -> None:
    """Worker process: builds the contestant, then answers (method, args) calls until "stop"."""
    try:
        contestant = KINDS[spec.kind](**spec.kwargs)
    except Exception as error:  # any failure to build is reported to the parent, not lost
        conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))
        return
    conn.send(("ok", contestant.settings))
    while True:
        try:
            method, args = conn.recv()
        except EOFError:  # the parent is gone
            return
        if method == "stop":
            return
        try:
            wall, own, (busy, steal) = time.perf_counter(), time.process_time(), machine_cpu_s()
            value = getattr(contestant, method)(*args)
            if isinstance(value, Run):
                wall = time.perf_counter() - wall
                own = time.process_time() - own
                busy_now, steal_now = machine_cpu_s()
                busy, steal = busy_now - busy, steal_now - steal
                # Average cores in use during the run by this process, by everything else on
                # the machine, and by other guests of the hypervisor (steal).
                value.extra["own_cpu_cores"] = own / wall
                value.extra["other_cpu_cores"] = max(0.0, busy - own) / wall
                value.extra["steal_cores"] = steal / wall
                # A Run travels as a plain dict: classes of a spawned __main__ do not unpickle.
                conn.send(("run", asdict(value)))
            else:
                conn.send(("ok", value))
        except Exception as error:  # reported with its traceback; the parent decides
            conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


class Remote:
    """A contestant in its own process; calls go over a pipe and block until answered."""

    def __init__(self, spec: Spec):
        self.key, self.label, self.settings = spec.key, spec.label, None
        context = multiprocessing.get_context("spawn")
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=serve, args=(child_conn, spec), daemon=True,
                                       name=f"bench-{spec.key}")
        self.process.start()
        child_conn.close()

    def _answer(self, what: str):
        if not self.conn.poll(CALL_TIMEOUT_S):
            self.process.terminate()
            raise BenchError(f"{self.label}: no answer to {what} within {CALL_TIMEOUT_S} s; "
                             f"its process was stopped (is the machine overloaded?)")
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.process.join(timeout=5)
            raise BenchError(f"{self.label}: its process died during {what} (exit code "
                             f"{self.process.exitcode})") from None
        if status == "error":
            raise BenchError(f"{self.label}: {what} failed: {value}")
        return Run(**value) if status == "run" else value

    def ready(self) -> None:
        self.settings = self._answer("loading")

    def call(self, method: str, *args):
        try:
            self.conn.send((method, args))
        except OSError:  # the pipe breaks when the worker is gone
            self.process.join(timeout=5)
            raise BenchError(f"{self.label}: its process is gone (exit code "
                             f"{self.process.exitcode}); cannot run {method}") from None
        return self._answer(method)

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(("stop", ()))
            self.process.join(timeout=5)  # an idle worker leaves at once; a busy one is ended
        if self.process.is_alive():
            self.process.terminate()
            self.process.join()


# ---- agreement checks ----------------------------------------------------------------------------

def first_difference(a: list[int], b: list[int], n: int) -> int | None:
    for i in range(min(n, len(a), len(b))):
        if a[i] != b[i]:
            return i
    return None


def token_check(name: str, ours: Run, theirs: Run, n: int, eager: Remote | None,
                prompt_ids: list[int], required: bool) -> dict:
    """Greedy tokens of two contestants over the first n; at a split, the oracle's top-2 margin."""
    where = first_difference(ours.tokens, theirs.tokens, n)
    check = {"name": name, "required": required, "tokens_compared": n, "passed": where is None,
             "first_difference": where}
    if where is not None:
        check["ours"] = ours.tokens[:where + 1]
        check["theirs"] = theirs.tokens[:where + 1]
        if eager is not None:
            logits = eager.call("all_logits", list(prompt_ids) + ours.tokens[:where])[-1]
            top2 = np.sort(logits)[-2:]
            check["reference_top2_margin_at_difference"] = float(top2[1] - top2[0])
    return check


def run_checks(contestants: dict, warm: dict, prompt_ids: list[int], n_tokens: int) -> list[dict]:
    checks = []
    eager = contestants.get("torch-eager")
    n = min(AGREE_TOKENS, n_tokens)
    if "llama_brrr-f32" in contestants and eager is not None:
        ours = contestants["llama_brrr-f32"].call("all_logits", prompt_ids)
        difference = float(np.abs(ours - eager.call("all_logits", prompt_ids)).max())
        checks.append({"name": "llama_brrr f32 logits vs reference (prompt, all positions)",
                       "required": True, "max_abs_diff": difference, "limit": LOGIT_TOLERANCE,
                       "passed": difference < LOGIT_TOLERANCE})
    if "llama_brrr-f32" in warm and "llama.cpp-F32" in warm:
        checks.append(token_check("llama_brrr f32 vs llama.cpp F32 greedy tokens",
                                  warm["llama_brrr-f32"], warm["llama.cpp-F32"], n, eager,
                                  prompt_ids, required=True))
    if "llama_brrr-f32" in warm and eager is not None:
        checks.append(token_check("llama_brrr f32 vs torch eager greedy tokens",
                                  warm["llama_brrr-f32"], warm["torch-eager"], n, eager,
                                  prompt_ids, required=True))
    if "llama_brrr-bf16" in warm and "llama.cpp-F16" in warm:
        # Two different 16-bit formats round differently; an early split here is information.
        checks.append(token_check("llama_brrr bf16 vs llama.cpp F16 greedy tokens",
                                  warm["llama_brrr-bf16"], warm["llama.cpp-F16"], n, eager,
                                  prompt_ids, required=False))
    if eager is not None and "llama.cpp-F32" in contestants:
        theirs = contestants["llama.cpp-F32"].call("last_logits", prompt_ids)
        reference = eager.call("all_logits", prompt_ids)[-1]
        checks.append({"name": "llama.cpp F32 last-position logits vs reference (information; "
                               "its KV cache is f16)",
                       "required": False, "max_abs_diff": float(np.abs(theirs - reference).max()),
                       "passed": True})
    return checks


def detail(check: dict) -> str:
    if "max_abs_diff" in check:
        limit = f" (limit {check['limit']:.0e})" if "limit" in check else ""
        return f"max |Δlogit| {check['max_abs_diff']:.2e}{limit}"
    if check["passed"]:
        return f"first {check['tokens_compared']} greedy tokens identical"
    if check["first_difference"] is None:
        return "differs between runs"
    text = f"tokens differ at {check['first_difference']}"
    if "reference_top2_margin_at_difference" in check:
        margin = check["reference_top2_margin_at_difference"]
        text += f" (reference top-2 margin there {margin:.2e})"
    return text


# ---- running -------------------------------------------------------------------------------------

CONTESTANTS = ("llama_brrr-f32", "llama_brrr-bf16", "llama.cpp-F32", "llama.cpp-F16", "torch-eager")
RATIOS = (("llama_brrr-f32", "llama.cpp-F32"), ("llama_brrr-bf16", "llama.cpp-F16"),
          ("llama_brrr-f32", "torch-eager"), ("llama_brrr-bf16", "torch-eager"))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="the Q4_1 SmolLM2 GGUF (default: llama_brrr's default model, "
                                   "fetched when missing)")
    p.add_argument("--threads", type=int, default=2, help="threads for every contestant (2)")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens generated per run (default 128; 16 with --quick)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed rounds (default 5; 1 with --quick)")
    p.add_argument("--only", default=",".join(CONTESTANTS),
                   help=f"comma-separated contestants (default all: {','.join(CONTESTANTS)})")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: few tokens, 1 round, missing opponents skipped, results to a "
                        "temp dir unless --out-dir is given")
    p.add_argument("--retries", type=int, default=None,
                   help="extra attempts for a run disturbed by other work (default 3; 0 with "
                        "--quick)")
    p.add_argument("--max-other-cores", type=float, default=0.1,
                   help="a run is disturbed when other processes (and the hypervisor's other "
                        "guests) used more than this many cores on average during it (0.1)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the JSON and PNG go (default benchmarks/results/cpu)")
    args = p.parse_args(argv)
    args.tokens = args.tokens if args.tokens is not None else (16 if args.quick else 128)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    args.retries = args.retries if args.retries is not None else (0 if args.quick else 3)
    if args.retries < 0:
        p.error(f"--retries must be >= 0, got {args.retries}")
    if not args.max_other_cores > 0:
        p.error(f"--max-other-cores must be > 0, got {args.max_other_cores}")
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    if not 2 <= args.tokens < N_CTX:
        p.error(f"--tokens must be in [2, {N_CTX}) (one token from the prompt's logits plus "
                f"decode steps, inside the {N_CTX}-token context), got {args.tokens}")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in args.only if c not in CONTESTANTS]
    if unknown or not args.only:
        p.error(f"--only: unknown contestant(s) {unknown}; choose from {', '.join(CONTESTANTS)}")
    if args.out_dir is None:
        args.out_dir = (Path(tempfile.gettempdir()) / "llama_brrr_bench_quick" if args.quick
                        else REPO / "benchmarks" / "results" / "cpu")
    return args


def resolve_source(model: str | None) -> Path:
    from llama_brrr import fetch

    try:
        path = fetch.resolve_model(model)
    except BrrrError as error:
        hint = "" if model else "  -- or pass --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf"
        raise BenchError(f"{error}{hint}") from error
    if not Path(path).is_file():
        raise BenchError(f"{path}: expected a GGUF file (the Q4_1 SmolLM2-135M-Instruct); pass "
                         f"--model /path/to/file.gguf")
    return Path(path)


def available(module: str, how: str, needed: bool, quick: bool, skipped: dict) -> bool:
    """Whether an opponent's library is installed; a full run that needs it insists."""
    if importlib.util.find_spec(module) is not None:
        return True
    if needed:
        message = f"{module} is not installed; install it: {how}"
        if not quick:
            raise BenchError(message + "  -- or leave its contestants out with --only")
        skipped[module] = message
    return False


def plan(args, source: Path, skipped: dict) -> tuple[list[Spec], dict]:
    """Which contestants run on which file; writes the llama.cpp GGUFs when missing."""
    from llama_brrr import fetch

    wanted = [key for key in CONTESTANTS if key in args.only]
    files = {"source": str(source)}
    f32 = f16 = None
    needs_llama_cpp = any(key.startswith("llama.cpp") for key in wanted)
    if available("llama_cpp", LLAMA_CPP_INSTALL, needs_llama_cpp, args.quick, skipped):
        sha = fetch.sha256_of(source)
        cache = fetch.cache_dir() / "bench"
        f32 = reference_gguf(source, sha, "F32", cache, args.threads)
        if "llama.cpp-F16" in wanted:
            f16 = reference_gguf(source, sha, "F16", cache, args.threads)
        files.update(source_sha256=sha, f32=str(f32), f16=str(f16) if f16 else None)
    have_torch = available("torch", "pip install torch", "torch-eager" in wanted, args.quick,
                           skipped)
    # Everyone reads the F32 GGUF that llama.cpp wrote, so all run the same numbers; without
    # llama.cpp ours read the source file (dequantized at load: the same values up to rounding).
    weights = str(f32 or source)
    files["read_by_llama_brrr_and_eager"] = weights
    threads = args.threads
    specs = {
        "llama_brrr-f32": Spec("llama_brrr-f32", "llama_brrr f32", "brrr",
                               {"model_path": weights, "dtype": "f32", "threads": threads}),
        "llama_brrr-bf16": Spec("llama_brrr-bf16", "llama_brrr bf16", "brrr",
                                {"model_path": weights, "dtype": "bf16", "threads": threads}),
        "llama.cpp-F32": f32 and Spec("llama.cpp-F32", "llama.cpp F32", "llama.cpp",
                                      {"model_path": str(f32), "threads": threads}),
        "llama.cpp-F16": f16 and Spec("llama.cpp-F16", "llama.cpp F16", "llama.cpp",
                                      {"model_path": str(f16), "threads": threads}),
        "torch-eager": have_torch and Spec("torch-eager", "torch eager f32", "eager",
                                           {"model_path": weights, "threads": threads}),
    }
    return [specs[key] for key in wanted if specs[key]], files


def start(specs: list[Spec]) -> dict[str, Remote]:
    """Starts one worker per contestant (their loading overlaps) and waits until all are ready."""
    remotes = {}
    try:
        for spec in specs:
            remotes[spec.key] = Remote(spec)
        for remote in remotes.values():
            remote.ready()
    except BaseException:
        for remote in remotes.values():
            remote.stop()
        raise
    return remotes


def chat_prompt(contestants: dict[str, Remote]) -> tuple[str, list[int], dict]:
    """The chat prompt as token ids, by llama_brrr's tokenizer; llama.cpp's ids are compared."""
    brrr = contestants.get("llama_brrr-f32") or contestants.get("llama_brrr-bf16")
    lcpp = contestants.get("llama.cpp-F32") or contestants.get("llama.cpp-F16")
    notes = {}
    if brrr is not None:
        text, ids = brrr.call("chat_prompt", PROMPT_MESSAGES)
        if lcpp is not None:
            notes["tokenizers_agree_with_llama_cpp"] = lcpp.call("tokenize", text) == ids
    elif lcpp is not None:
        text, ids = lcpp.call("chat_prompt", PROMPT_MESSAGES)
    else:
        raise BenchError("the prompt needs llama_brrr or llama.cpp among the contestants")
    return text, ids, notes


def summarize(runs: list[Run]) -> dict:
    out = {}
    for metric in ("decode_tok_s", "ttft_s", "prefill_tok_s"):
        values = [getattr(r, metric) for r in runs]
        out[metric] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def ratios(summary: dict) -> dict:
    out = {}
    for ours, theirs in RATIOS:
        if ours in summary and theirs in summary:
            out[f"{ours} / {theirs}"] = {
                metric: summary[ours][metric]["median"] / summary[theirs][metric]["median"]
                for metric in ("decode_tok_s", "prefill_tok_s")}
    return out


def print_table(labels: dict, summary: dict, ratio: dict, checks: list[dict]) -> None:
    print()
    print(f"{'contestant':<18} {'decode tok/s  median [min, max]':>34} {'TTFT ms':>9} "
          f"{'prefill tok/s':>14}")
    for key, s in summary.items():
        d = s["decode_tok_s"]
        print(f"{labels[key]:<18} {d['median']:>12.1f} [{d['min']:7.1f}, {d['max']:7.1f}]      "
              f"{s['ttft_s']['median'] * 1e3:>9.1f} {s['prefill_tok_s']['median']:>14.1f}")
    if ratio:
        print()
        print(f"{'ratio (medians)':<36} {'decode':>8} {'prefill':>8}")
        for name, r in ratio.items():
            print(f"{name:<36} {r['decode_tok_s']:>7.2f}x {r['prefill_tok_s']:>7.2f}x")
    if checks:
        print()
        for c in checks:
            state = "ok  " if c["passed"] else ("FAIL" if c["required"] else "note")
            print(f"[{state}] {c['name']}: {detail(c)}")
    print()


def plot(path: Path, labels: dict, summary: dict, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(summary)
    colors = ["#d62728" if k.startswith("llama_brrr") else "#1f77b4" if k.startswith("llama.cpp")
              else "#7f7f7f" for k in keys]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, metric, name in ((axes[0], "decode_tok_s", "batch-1 decode tok/s"),
                             (axes[1], "prefill_tok_s", "prefill tok/s (prompt / TTFT)")):
        med = np.array([summary[k][metric]["median"] for k in keys])
        low = med - np.array([summary[k][metric]["min"] for k in keys])
        high = np.array([summary[k][metric]["max"] for k in keys]) - med
        bars = ax.bar(range(len(keys)), med, color=colors, yerr=[low, high], capsize=4)
        ax.bar_label(bars, labels=[f"{m:.0f}" for m in med], padding=3, fontsize=8)
        ax.set_xticks(range(len(keys)), [labels[k] for k in keys], rotation=20, ha="right",
                      fontsize=8)
        ax.set_ylabel(name)
        ax.set_ylim(0, (med + high).max() * 1.18)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure(args, contestants: dict[str, Remote], prompt_ids: list[int]):
    """Warm-up, agreement checks, then the timed rounds."""
    warm = {}
    for key, c in contestants.items():
        warm[key] = c.call("run", prompt_ids, args.tokens)
        print(f"  warm-up {c.label:<17} {warm[key].decode_tok_s:7.1f} tok/s", flush=True)
    checks = run_checks(contestants, warm, prompt_ids, args.tokens)
    runs: dict[str, list[Run]] = {key: [] for key in contestants}
    discarded: dict[str, list[Run]] = {key: [] for key in contestants}
    for round_index in range(args.repeats):
        for key, c in contestants.items():
            run = c.call("run", prompt_ids, args.tokens)
            # Someone else's work on these cores slows one contestant and not the next; such a
            # run is set aside (and kept in the JSON) and measured again, up to --retries times.
            for _ in range(args.retries):
                if not disturbed(run, args.max_other_cores):
                    break
                discarded[key].append(run)
                run = c.call("run", prompt_ids, args.tokens)
            run.extra["disturbed"] = disturbed(run, args.max_other_cores)
            runs[key].append(run)
        line = "  ".join(f"{c.label} {runs[key][-1].decode_tok_s:.1f}"
                         + ("*" if runs[key][-1].extra["disturbed"] else "")
                         for key, c in contestants.items())
        print(f"  round {round_index + 1}/{args.repeats}: {line}", flush=True)
    for key, c in contestants.items():
        if any(r.tokens != warm[key].tokens for r in runs[key]):
            checks.append({"name": f"{c.label} greedy output identical in every run",
                           "required": True, "passed": False, "tokens_compared": args.tokens,
                           "first_difference": None})
    return warm, runs, discarded, checks


def disturbed(run: Run, max_other_cores: float) -> bool:
    return run.extra["other_cpu_cores"] + run.extra["steal_cores"] > max_other_cores


def main(argv=None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    skipped: dict = {}
    source = resolve_source(args.model)
    specs, files = plan(args, source, skipped)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if not specs:
        raise BenchError(f"no contestant can run: {skipped}")
    contestants = start(specs)
    try:
        labels = {key: c.label for key, c in contestants.items()}
        prompt_text, prompt_ids, prompt_notes = chat_prompt(contestants)
        if len(prompt_ids) + args.tokens > N_CTX:
            raise BenchError(f"--tokens {args.tokens} plus the {len(prompt_ids)}-token prompt "
                             f"exceeds the {N_CTX}-token context every contestant is given")
        if prompt_notes.get("tokenizers_agree_with_llama_cpp") is False:
            print("note: llama.cpp tokenizes the prompt differently; every contestant gets "
                  "llama_brrr's ids")
        print(f"prompt {len(prompt_ids)} tokens, {args.tokens} generated per run, {args.repeats} "
              f"round(s), {args.threads} thread(s); load average {load_before[0]:.2f}", flush=True)
        warm, runs, discarded, checks = measure(args, contestants, prompt_ids)
        sample_text = None
        if "llama_brrr-f32" in contestants:
            sample_text = contestants["llama_brrr-f32"].call("detokenize",
                                                             warm["llama_brrr-f32"].tokens)
        settings = {key: c.settings for key, c in contestants.items()}
    finally:
        for c in contestants.values():
            c.stop()
    load_after = os.getloadavg()

    summary = {key: summarize(r) for key, r in runs.items()}
    n_disturbed = sum(r.extra["disturbed"] for rs in runs.values() for r in rs)
    ratio = ratios(summary)
    print_table(labels, summary, ratio, checks)
    result = {
        "benchmark": "CPU batch-1 decode, SmolLM2-135M-Instruct",
        "command": shlex.join([sys.executable] + sys.argv),
        "date_utc": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "cpu_flags": cpu_flags(),
                    "load_average_before": load_before, "load_average_after": load_after,
                    "platform": platform.platform()},
        "threads": args.threads,
        "versions": versions(),
        "model_files": files,
        "prompt": {"messages": PROMPT_MESSAGES, "text": prompt_text, "tokens": len(prompt_ids),
                   **prompt_notes},
        "generated_tokens_per_run": args.tokens,
        "repeats": args.repeats,
        "disturbance_rule": {"max_other_cores": args.max_other_cores, "retries": args.retries,
                             "kept_disturbed_runs": n_disturbed},
        "definitions": {
            "decode_tok_s": "(generated - 1) / (time from the first generated token to the last)",
            "ttft_s": "prompt in -> first generated token out (prefill + first sample)",
            "prefill_tok_s": "prompt tokens / ttft_s",
        },
        "sample_output_llama_brrr_f32": sample_text,
        "contestants": {key: {"label": labels[key], "settings": settings[key],
                              "warmup": warm[key].record(),
                              "runs": [r.record() for r in runs[key]],
                              "discarded_disturbed_runs": [r.record() for r in discarded[key]],
                              "summary": summary[key]} for key in contestants},
        "skipped": skipped,
        "ratios": ratio,
        "checks": checks,
        "all_required_checks_passed": all(c["passed"] for c in checks if c["required"]),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out_dir / f"{RESULT_NAME}.json"
    png_path = args.out_dir / f"{RESULT_NAME}.png"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    title = (f"SmolLM2-135M batch-1, {result['machine']['cpu']}, {args.threads} threads, "
             f"{len(prompt_ids)}-token prompt, {args.tokens} generated, median of {args.repeats} "
             f"(bars: min-max); load {load_before[0]:.2f}")
    if ratio:
        title += "\ndecode: " + ",  ".join(f"{name} = {r['decode_tok_s']:.2f}x"
                                           for name, r in ratio.items())
    plot(png_path, labels, summary, title)
    print(f"wrote {json_path} and {png_path}")
    if n_disturbed:
        print(f"warning: {n_disturbed} timed run(s) (marked * above) shared the machine with "
              f"other work even after {args.retries} retries; rerun when `uptime` shows a quiet "
              f"machine", file=sys.stderr)
    if not result["all_required_checks_passed"]:
        print("the outputs do not agree (see [FAIL] above): the speeds compare different work",
              file=sys.stderr)
        return 1
    return 0


def exit_on_sigterm(signum, frame):
    # SystemExit unwinds through main's `finally`, which stops the worker processes.
    raise SystemExit(f"bench_cpu: stopped by signal {signum}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        sys.exit(main())
    except (BenchError, BrrrError) as error:
        print(f"bench_cpu: error: {error}", file=sys.stderr)
        sys.exit(2)
