"""llama.cpp (through llama-cpp-python) as an opponent, and the twins of a GGUF that llama.cpp's
own quantize writes: F32 / F16, so llama.cpp and llama_brrr can run the same numbers, and Q8_0 /
Q4_K_M requantizations, so both run the quantized files people download.

llama-cpp-python is optional: `available()` says whether it is importable, LLAMA_CPP_INSTALL how
to get it (a CPU build from source, minutes).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

from ..errors import BrrrError

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
