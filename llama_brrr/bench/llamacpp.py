"""llama.cpp as an opponent, two ways, and the GGUF files both sides run.

  LlamaCpp        llama.cpp's CPU backend through llama-cpp-python, driven token by token
  LlamaBench      llama-bench of a llama.cpp CUDA build (LLAMA_BRRR_LLAMACPP_BIN), timing itself on
                  the same GGUF file: the GPU peer (scripts/gpu_llamacpp_peer.sh builds it)
  reference_gguf  twins of a GGUF written by llama.cpp's own quantize: F32 / F16, so llama.cpp and
                  llama_brrr can run the same numbers, and Q8_0 / Q4_K_M requantizations, so both
                  run the quantized files people download
  write_random_gguf  a random-weight F16 GGUF of a shape, for llama.cpp's quantize to start from

llama-cpp-python is optional: `available()` says whether it is importable, LLAMA_CPP_INSTALL how
to get it (a CPU build from source, minutes).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ..config import ModelConfig, shape_config
from ..errors import BrrrError
from ..loaders.gguf import gguf_tensor_name

LLAMA_CPP_VERSION = "0.3.36"
# Every native CPU feature but AMX: built with GCC 12, ggml's AMX matmul segfaults on its first
# quantized eval (see extra_buffer_types_note), while this build keeps llama.cpp's repacked layouts.
LLAMA_CPP_INSTALL = (
    'CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON '
    '-DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON '
    '-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF '
    f'-DGGML_AMX_BF16=OFF" pip install llama-cpp-python=={LLAMA_CPP_VERSION}   '
    "(builds from source, minutes)")


class BenchError(BrrrError, RuntimeError):
    """A benchmark that cannot run as asked; the message says what to do."""


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def amx_build() -> bool:
    """Whether this llama.cpp build runs quantized matmuls on AMX tiles."""
    import llama_cpp

    return "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode()


def extra_buffer_types_note() -> str:
    if amx_build():
        return ("off (use_extra_bufts=False): ggml's AMX matmul segfaults on this machine's first "
                "quantized eval (ggml-org/llama.cpp issue 20824), and the switch that drops AMX also "
                "drops the CPU_REPACK layouts (llama.cpp's --no-repack)")
    return "on (llama.cpp default: CPU_REPACK where a type has one)"


def open_llama(model_path: str, **kwargs):
    """llama_cpp.Llama(model_path, **kwargs), with ggml's extra CPU buffer types off in an AMX
    build (extra_buffer_types_note says why). llama-cpp-python takes no argument for it, so its
    model-parameter defaults are wrapped while the model loads."""
    import llama_cpp
    import llama_cpp.llama_cpp as low

    if not amx_build():
        return llama_cpp.Llama(model_path, **kwargs)
    defaults = low.llama_model_default_params

    def without_extra_buffer_types():
        params = defaults()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = without_extra_buffer_types
    try:
        return llama_cpp.Llama(model_path, **kwargs)
    finally:
        low.llama_model_default_params = defaults


class LlamaCpp:
    """llama.cpp driven token by token with greedy argmax over its logits.

    Its eval() and the logits pointer are the whole per-token path (llama-cpp-python's sampler is
    bypassed), so generation runs through EOS like ignore_eos, and the Python around it costs
    microseconds against milliseconds of decode. Batch 1 only.
    """

    key, label = "llama.cpp", "llama.cpp (llama-cpp-python)"

    def __init__(self, model_path: str, threads: int, n_ctx: int):
        import llama_cpp

        self.lc = llama_cpp
        self.llm = open_llama(model_path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                              n_threads_batch=threads, n_gpu_layers=0, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.settings = {"model_file": model_path, "n_threads": threads,
                         "n_threads_batch": threads, "n_ctx": n_ctx, "n_batch": n_ctx,
                         "flash_attn": False, "kv_cache": "f16 (llama.cpp default)",
                         "extra_buffer_types": extra_buffer_types_note(),
                         "llama_cpp_python": llama_cpp.__version__,
                         "system_info": llama_cpp.llama_print_system_info().decode().strip()}
        self.note = f"cpu, {Path(model_path).name}, {threads} threads"

    def _last_logits(self) -> np.ndarray:
        pointer = self.lc.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,))

    def prefill(self, prompts: np.ndarray) -> np.ndarray:
        if len(prompts) != 1:
            raise ValueError(f"llama.cpp here runs batch 1, got batch {len(prompts)}")
        self.llm.reset()
        self.llm.eval([int(t) for t in prompts[0]])
        return np.array([np.argmax(self._last_logits())])

    def decode(self, tokens: np.ndarray, position: int) -> np.ndarray:
        self.llm.eval([int(tokens[0])])
        return np.array([np.argmax(self._last_logits())])

    def last_logits(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(list(ids))
        return self._last_logits().copy()

    def sync(self) -> None:
        pass  # eval() returns when the logits are there

    def tokens_list(self, tokens) -> list[int]:
        return [int(t) for t in tokens]


# ---- twins of a GGUF, written by llama.cpp's quantize ------------------------------------------------

# The file types llama.cpp's quantize is asked for. F32 / F16 twins let every contestant run the
# same numbers in full precision; Q8_0 / Q4_K_M requantizations of the default Q4_1 file are the
# quantized files people download, made from the one file this project pins.
TWIN_TYPES = ("F32", "F16", "Q8_0", "Q4_K_M")


@contextlib.contextmanager
def stderr_to(path: Path):
    """Points file descriptor 2 at `path` (llama.cpp logs from C, past Python's sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def gguf_matrix_types(path: Path) -> set[str]:
    """The tensor types of a GGUF's matrices (1-D norm weights stay F32 in every llama.cpp type)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}


def tensor_census(path: Path) -> dict:
    """What a GGUF holds, per type and per tensor family: {"types": {type: tensors},
    "families": {family: {type: tensors}}, "bytes": tensor data bytes}. A family is the tensor's
    name without its layer number ("blk.3.attn_q.weight" -> "attn_q.weight")."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    types: dict[str, int] = {}
    families: dict[str, dict[str, int]] = {}
    total = 0
    for t in reader.tensors:
        kind = t.tensor_type.name
        parts = t.name.split(".")
        family = ".".join(parts[2:]) if parts[0] == "blk" else t.name
        types[kind] = types.get(kind, 0) + 1
        families.setdefault(family, {})
        families[family][kind] = families[family].get(kind, 0) + 1
        total += int(t.n_bytes)
    return {"types": dict(sorted(types.items())), "families": dict(sorted(families.items())),
            "bytes": total}


def quantize_tool() -> str:
    """The program that writes the twins, named with its version (recorded beside every result)."""
    import llama_cpp

    return f"llama.cpp's quantize (llama_model_quantize) through llama-cpp-python {llama_cpp.__version__}"


def _expected(file_type: str, found: set[str]) -> bool:
    """Whether a twin's matrix types are what llama.cpp makes for `file_type`. F32 / F16 / Q8_0 hold
    only that type. Q4_K_M is a recipe of Q4_K and Q6_K whose rows fall back to Q5_0 / Q5_1 / Q8_0
    where a row is not a multiple of 256 values, so any mixture of those passes."""
    if file_type == "Q4_K_M":
        return bool(found) and found <= {"Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "Q8_0", "Q4_0", "Q4_1"}
    return found == {file_type}


def reference_gguf(source: Path, source_sha256: str, file_type: str, cache: Path,
                   threads: int) -> Path:
    """`source` rewritten by llama.cpp's quantize as `file_type` (TWIN_TYPES); made once, then
    cached as <cache>/<stem>.<source sha256[:12]>.<file_type>.gguf."""
    import llama_cpp

    if file_type not in TWIN_TYPES:
        raise ValueError(f"file_type must be one of {', '.join(TWIN_TYPES)}, got {file_type!r}")
    ftype = getattr(llama_cpp, "LLAMA_FTYPE_ALL_F32" if file_type == "F32"
                    else f"LLAMA_FTYPE_MOSTLY_{file_type}")
    # The source's hash is in the name, so a different source file never meets a stale copy.
    target = cache / f"{source.stem}.{source_sha256[:12]}.{file_type}.gguf"
    if target.is_file():
        with contextlib.suppress(Exception):  # any unreadable cached file is simply rewritten
            if _expected(file_type, gguf_matrix_types(target)):
                return target
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    log = target.with_name(f"{target.name}.log")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the source is already quantized (Q4_1 / Q8_0)
    params.nthread = threads
    print(f"writing {target} with llama.cpp's quantize ...", flush=True)
    with stderr_to(log):
        status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(),
                                                ctypes.byref(params))
    if status != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        last_lines = [line for line in log.read_text(errors="replace").splitlines() if line][-2:]
        raise BenchError(f"llama.cpp could not convert {source} to {file_type} (status {status}): "
                         + " | ".join(last_lines)
                         + f"; is it a complete llama GGUF? (full log: {log})")
    log.unlink()
    found = gguf_matrix_types(partial)
    if not _expected(file_type, found):
        partial.unlink()
        raise BenchError(f"llama.cpp's {file_type} conversion of {source} holds matrices of types "
                         f"{sorted(found)}; not what its {file_type} recipe makes")
    os.replace(partial, target)
    return target


# ---- random-weight GGUFs, for llama.cpp's quantize to start from ---------------------------------

# A llama small enough for a CPU dry run of scripts/gpu_llamacpp_peer.sh that llama.cpp still
# loads, benches and quantizes with its K types (every matrix row a multiple of 256 values).
PEER_TINY = ModelConfig(dim=256, hidden_dim=512, n_layers=2, n_heads=4, n_kv_heads=2,
                        vocab_size=2048, max_seq_len=4096, norm_eps=1e-5, rope_theta=500000.0,
                        name="peer-tiny")
# The pool every random matrix is a window of: a prime length, larger than any row, so no two rows
# of one matrix start at the same pool offset and no two are equal.
RANDOM_POOL = 16_777_259


def peer_config(shape: str) -> ModelConfig:
    """A config.SHAPES shape, or "peer-tiny" (PEER_TINY)."""
    return PEER_TINY if shape == PEER_TINY.name else shape_config(shape)


def _pool_window(pool: np.ndarray, start: int, n: int) -> np.ndarray:
    """n values of `pool` from `start` on, wrapping around."""
    out = np.empty(n, pool.dtype)
    done = 0
    while done < n:
        take = min(n - done, len(pool) - start)
        out[done: done + take] = pool[start: start + take]
        done += take
        start = 0
    return out


def add_random_llama_header(writer, config: ModelConfig) -> None:
    """The hyperparameter keys llama.cpp reads for a llama model of `config`, and a byte-level BPE
    vocabulary of vocab_size tokens (three specials, one merge) that its loader accepts: the header
    of every random-weight GGUF the benchmarks write."""
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.dim)
    writer.add_feed_forward_length(config.hidden_dim)
    writer.add_block_count(config.n_layers)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    specials, plain = ["<unk>", "<s>", "</s>"], ["t", "o", "to"]
    writer.add_token_list(specials + plain + [f"x{i}" for i in range(config.vocab_size - 6)])
    writer.add_token_types([3] * len(specials) + [1] * (config.vocab_size - len(specials)))
    writer.add_token_merges(["t o"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def write_random_gguf(path: Path, config: ModelConfig, seed: int = 0, std: float = 0.02) -> Path:
    """A llama GGUF of `config`: F16 matrices of N(0, std) values, F32 norm weights 1 + N(0, std),
    the hyperparameter keys llama.cpp reads, and a byte-level BPE vocabulary of vocab_size tokens
    (three specials, one merge) that llama.cpp's loader accepts. Each matrix is a window of one
    pool of RANDOM_POOL normal draws at a random start: the 8B shape's 16 GB cost copies, not 8e9
    draws, while every row differs. Tensors stream to the file one at a time."""
    import gguf

    rng = np.random.default_rng(seed)
    pool = (std * rng.standard_normal(RANDOM_POOL, dtype=np.float32)).astype(np.float16)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"random {config.name} F16 (llama_brrr write_random_gguf, seed {seed})")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_random_llama_header(writer, config)
    shapes = config.tensor_shapes()
    for name, shape in shapes.items():
        dtype = np.float32 if len(shape) == 1 else np.float16
        writer.add_tensor_info(gguf_tensor_name(name), shape, np.dtype(dtype),
                               int(np.prod(shape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for shape in shapes.values():
        if len(shape) == 1:
            writer.write_tensor_data((1.0 + std * rng.standard_normal(shape)).astype(np.float32))
        else:
            window = _pool_window(pool, int(rng.integers(RANDOM_POOL)), int(np.prod(shape)))
            writer.write_tensor_data(window.reshape(shape))
    writer.close()
    return path


# ---- llama.cpp's CUDA backend through llama-bench: the GPU peer -----------------------------------

LLAMACPP_BIN_ENV = "LLAMA_BRRR_LLAMACPP_BIN"
LLAMA_BENCH_TIMEOUT_S = 900
# Every layer on the GPU, flash attention on: how llama.cpp's CUDA numbers are quoted.
LLAMA_BENCH_GPU_ARGS = ("-ngl", "99", "-fa", "1")


def llama_bench_program(bin_dir: str | None = None) -> Path:
    """The llama-bench of `bin_dir` (default: $LLAMA_BRRR_LLAMACPP_BIN). Raises LookupError when
    neither names a folder, BenchError when the folder has no llama-bench."""
    folder = bin_dir or os.environ.get(LLAMACPP_BIN_ENV)
    if not folder:
        raise LookupError(f"set {LLAMACPP_BIN_ENV} to the bin/ folder of a llama.cpp CUDA build "
                          "(scripts/gpu_llamacpp_peer.sh builds one from the llama-cpp-python sdist)")
    program = Path(folder) / "llama-bench"
    if not (program.is_file() and os.access(program, os.X_OK)):
        raise BenchError(f"no executable llama-bench in {folder}: point {LLAMACPP_BIN_ENV} at the "
                         "bin/ folder of a llama.cpp build (scripts/gpu_llamacpp_peer.sh)")
    return program


def llama_bench_command(program: Path, model: str, prompt: int, generate: int,
                        repetitions: int) -> list[str]:
    """llama-bench on `model`, all layers on the GPU, flash attention on: a `prompt`-token prefill
    (pp, empty cache) and `generate` decode steps after a `prompt`-token context (tg at depth
    `prompt`), JSON out. Depths 0 and `prompt` together: llama-bench runs every test at every
    depth, so one process (one model load) holds both tests the workload needs."""
    if prompt < 1 or generate < 0 or repetitions < 1:
        raise ValueError(f"llama-bench needs prompt >= 1, generate >= 0, repetitions >= 1; got "
                         f"{prompt}, {generate}, {repetitions}")
    depths = f"0,{prompt}" if generate else "0"
    return [str(program), "-m", str(model), *LLAMA_BENCH_GPU_ARGS, "-p", str(prompt),
            "-n", str(generate), "-d", depths, "-r", str(repetitions), "-o", "json"]


def parse_llama_bench(text: str) -> list[dict]:
    """llama-bench's `-o json` output: one object per test, each with its samples."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as error:
        raise BenchError(f"llama-bench printed no JSON ({error}); its output began "
                         f"{text[:200]!r}") from None
    need = ("n_prompt", "n_gen", "n_depth", "samples_ns", "avg_ts", "backends")
    if not isinstance(tests, list) or not tests:
        raise BenchError(f"llama-bench's JSON is not a list of tests: {text[:200]!r}")
    for test in tests:
        missing = [k for k in need if not isinstance(test, dict) or k not in test]
        if missing:
            raise BenchError(f"a llama-bench test lacks {missing}: not the JSON of this llama-bench "
                             f"version ({str(test)[:200]})")
    return tests


def bench_test_name(test: dict) -> str:
    """llama-bench's own name of a test: pp128, tg128, pp128+tg128, with "@ d128" past depth 0."""
    p, g, d = test["n_prompt"], test["n_gen"], test["n_depth"]
    name = "+".join(f"{kind}{n}" for kind, n in (("pp", p), ("tg", g)) if n)
    return name + (f" @ d{d}" if d else "")


def find_test(tests: list[dict], n_prompt: int, n_gen: int, n_depth: int) -> dict:
    for test in tests:
        if (test["n_prompt"], test["n_gen"], test["n_depth"]) == (n_prompt, n_gen, n_depth):
            return test
    wanted = bench_test_name({"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth})
    have = ", ".join(bench_test_name(t) for t in tests)
    raise BenchError(f"llama-bench ran no {wanted} test (it ran {have})")


def require_backend(tests: list[dict], backend: str) -> None:
    """Every test ran on `backend` (llama-bench's "backends" field, e.g. "CUDA")."""
    for test in tests:
        if backend not in test["backends"].split(","):
            raise BenchError(f"this llama-bench ran {bench_test_name(test)} on {test['backends']!r}, not "
                             f"{backend}: build llama.cpp with -DGGML_CUDA=ON "
                             "(scripts/gpu_llamacpp_peer.sh)")


def summarize_test(test: dict) -> dict:
    """One test's speed (tokens/s per repetition, mean and stdev as llama-bench computes them) and
    what it ran on."""
    tokens = test["n_prompt"] + test["n_gen"]
    rates = [tokens * 1e9 / ns for ns in test["samples_ns"]]
    keep = ("model_type", "model_size", "model_n_params", "n_gpu_layers", "flash_attn", "type_k",
            "type_v", "n_batch", "n_ubatch", "backends", "gpu_info", "build_commit", "build_number")
    return {"test": bench_test_name(test), "n_prompt": test["n_prompt"], "n_gen": test["n_gen"],
            "n_depth": test["n_depth"], "tok_s_mean": test["avg_ts"],
            "tok_s_stdev": test.get("stddev_ts"), "tok_s_samples": rates,
            "repetitions": len(rates), **{k: test[k] for k in keep if k in test}}


def run_llama_bench(command: list[str]) -> list[dict]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=LLAMA_BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"llama-bench ran past {LLAMA_BENCH_TIMEOUT_S} s: {' '.join(command)}") from None
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-3:]
        raise BenchError(f"llama-bench exited with status {done.returncode}: " + " | ".join(last))
    return parse_llama_bench(done.stdout)


class LlamaBench:
    """llama.cpp's CUDA backend timed by its own llama-bench on the GGUF file llama_brrr runs.

    llama-bench loads the model in its own process and reports per repetition the prefill time of
    the prompt (pp, empty cache) and the decode time of the generated tokens after a prompt-long
    context (tg at depth prompt): TTFT and decode time of the workload, without the sampling of
    the first token. Each timed round is one llama-bench process of one repetition (it warms each
    test up itself, so warm-up rounds run nothing). It computes no logits this side can read, so
    it is timed, not checked: the file is its tie to llama_brrr's numbers. Batch 1.
    """

    key, label = "llama.cpp-cuda", "llama.cpp CUDA (llama-bench)"

    def __init__(self, program: Path, model_path: str):
        self.program, self.model_path = program, model_path
        version = subprocess.run([str(program), "--version"], capture_output=True, text=True,
                                 timeout=60)
        self.version = " ".join((version.stdout + version.stderr).split())
        self.last_tests: list[dict] = []
        self.settings = {"program": str(program), "model_file": model_path,
                         "arguments": " ".join(LLAMA_BENCH_GPU_ARGS), "version": self.version,
                         "timing": "llama-bench's own: pp = prefill of the prompt (empty cache), "
                                   "tg @ d<prompt> = decode after a prompt-long context"}
        self.note = f"cuda, {Path(model_path).name}, llama-bench {' '.join(LLAMA_BENCH_GPU_ARGS)}"

    def timed_runs(self, prompts: np.ndarray, generate: int, repeats: int, warmup: int) -> dict:
        """measure()'s result for this workload: TTFT and decode seconds per repetition."""
        batch, prompt = prompts.shape
        if batch != 1:
            raise ValueError(f"llama-bench is compared at batch 1, got batch {batch}")
        out = {"ttft_s": [], "decode_s": [], "tokens": None}
        if repeats == 0:
            return out
        tests = run_llama_bench(llama_bench_command(self.program, self.model_path, prompt,
                                                    generate, repeats))
        require_backend(tests, "CUDA")
        self.last_tests = tests
        self.settings["tests"] = [summarize_test(t) for t in tests]
        out["ttft_s"] = [ns / 1e9 for ns in find_test(tests, prompt, 0, 0)["samples_ns"]]
        if generate:
            out["decode_s"] = [ns / 1e9 for ns in find_test(tests, 0, generate, prompt)["samples_ns"]]
        return out

    def last_logits(self, ids: list[int]) -> np.ndarray:
        raise NotImplementedError("llama-bench reports speeds only: llama.cpp CUDA's logits are not "
                                  "checked (the GGUF file both run is the tie)")

    def sync(self) -> None:
        pass  # llama-bench's process has ended when its timings are read

    def tokens_list(self, tokens) -> list[int]:
        return [int(t) for t in tokens]


def llama_bench_opponent(opts, llm, device: str, w) -> LlamaBench:
    """compare's llama.cpp-cuda contestant for workload w, or Skip with the reason."""
    from .contestants import Skip

    if not device.startswith("cuda"):
        raise Skip(f"llama.cpp-cuda runs llama.cpp's CUDA backend: compare on a GPU, not {device}")
    if not opts.model or not str(opts.model).endswith(".gguf"):
        raise Skip("llama.cpp runs GGUF model files, not random shapes: pass --model FILE.gguf")
    if w.batch != 1:
        raise Skip("llama.cpp-cuda is compared at batch 1 only")
    try:
        program = llama_bench_program()
    except LookupError as why:
        raise Skip(str(why)) from None
    return LlamaBench(program, str(llm.source))
