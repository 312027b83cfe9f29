"""llama.cpp (through llama-cpp-python) as an opponent, and the F32 / F16 twins of a GGUF that
llama.cpp's own quantize writes, so llama.cpp and llama_brrr can run the same numbers.

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
LLAMA_CPP_INSTALL = (f'CMAKE_ARGS="-DGGML_CUDA=OFF" pip install '
                     f"llama-cpp-python=={LLAMA_CPP_VERSION}   (builds from source, minutes)")


class BenchError(BrrrError, RuntimeError):
    """A benchmark that cannot run as asked; the message says what to do."""


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


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
        self.llm = llama_cpp.Llama(model_path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, n_gpu_layers=0, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.settings = {"model_file": model_path, "n_threads": threads,
                         "n_threads_batch": threads, "n_ctx": n_ctx, "n_batch": n_ctx,
                         "flash_attn": False, "kv_cache": "f16 (llama.cpp default)",
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


# ---- the F32 / F16 GGUFs, written by llama.cpp's quantize ----------------------------------------

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


def reference_gguf(source: Path, source_sha256: str, file_type: str, cache: Path,
                   threads: int) -> Path:
    """`source` rewritten by llama.cpp as an all-F32 or mostly-F16 GGUF; made once, then cached."""
    import llama_cpp

    ftype = {"F32": llama_cpp.LLAMA_FTYPE_ALL_F32,
             "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16}[file_type]
    # The source's hash is in the name, so a different source file never meets a stale copy.
    target = cache / f"{source.stem}.{source_sha256[:12]}.{file_type}.gguf"
    if target.is_file():
        with contextlib.suppress(Exception):  # any unreadable cached file is simply rewritten
            if gguf_matrix_types(target) == {file_type}:
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
    if gguf_matrix_types(partial) != {file_type}:
        found = gguf_matrix_types(partial)
        partial.unlink()
        raise BenchError(f"llama.cpp's {file_type} conversion of {source} holds matrices of types "
                         f"{sorted(found)}; expected only {file_type}")
    os.replace(partial, target)
    return target
