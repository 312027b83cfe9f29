"""llama_brrr: a Llama-family inference engine — our own C++/CUDA kernels behind a thin Python API.

    from llama_brrr import Llama, SamplingParams
    llm = Llama.from_pretrained()                    # the default model, fetched when missing
    out = llm.generate("The capital of France is", max_tokens=16)[0]
    print(out.text, out.timings["decode_tok_s"])
"""

__version__ = "0.1.0"

# The CPU engine's OpenMP threads meet at the end of every parallel region, hundreds per token.
# libgomp's default lets a waiting thread spin for milliseconds there, so when another process
# holds a core, the spinning thread and the preempted one wait on each other and decode with all
# cores falls far below one thread's speed. A short spin (long enough to cover the gap between two
# regions of a quiet decode step: 1,000 rounds lose ~3% of quiet decode, 10,000 nothing measurable)
# and then a sleep keeps the quiet speed and frees the core for the preempted thread; the engine
# itself (csrc/cpu/busy_cores.h) also leaves out the cores other processes keep busy. libgomp
# reads this once, when it loads with _C, so it is set here, before that; a user's own
# OMP_WAIT_POLICY or GOMP_SPINCOUNT wins. benchmarks/bench_busy_cpu.py measures the choice.
import os as _os

DEFAULT_GOMP_SPINCOUNT = "10000"
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = DEFAULT_GOMP_SPINCOUNT

# Loaders, tokenizer and config work without the compiled engine, so a missing _C only fails the
# names that need it, with a message that says how to build it.
try:
    from . import _C
except ImportError as _error:
    import importlib.util as _importlib_util

    _C = None
    _C_MISSING = (
        "llama_brrr: the C++ extension llama_brrr._C "
        + ("is not built" if _importlib_util.find_spec("llama_brrr._C") is None
           else f"does not load ({_error})")
        + "; run `pip install -e .` (or `python setup.py build_ext --inplace`) in the repository")

from .config import ModelConfig  # noqa: E402
from .sampling import SamplingParams  # noqa: E402
from . import peaks  # noqa: E402
from .profiler import ProfileSummary, profile, profile_torch  # noqa: E402

if _C is not None:
    from .model import Llama, RequestOutput  # noqa: E402
    from .serving.async_engine import AsyncLlama  # noqa: E402


def __getattr__(name):
    if name in ("Llama", "RequestOutput", "AsyncLlama") and _C is None:
        raise ImportError(_C_MISSING)
    raise AttributeError(f"module 'llama_brrr' has no attribute {name!r}")


def cuda_available() -> bool:
    """True when this build has CUDA and at least one GPU is visible."""
    if _C is None:
        raise ImportError(_C_MISSING)
    return _C.cuda_device_count() > 0


__all__ = ["Llama", "AsyncLlama", "SamplingParams", "RequestOutput", "ModelConfig", "cuda_available",
           "profile", "profile_torch", "ProfileSummary", "peaks", "__version__"]
