"""Model files of every supported format -> one normalized LoadedModel.

    from llama_brrr.loaders import load_model
    loaded = load_model("SmolLM2-135M-Instruct.Q4_1.gguf")   # or a HF directory, or a llama2.c .bin
    loaded.config, loaded.tensors["layers.0.wq"], loaded.tokenizer_spec

What a path means is decided by its content first, its name second: a file starting with "GGUF"
is GGUF; a directory with config.json and *.safetensors (or a .safetensors file with config.json
beside it) is a Hugging Face checkpoint; a file with the llama2.c magic, or any other .bin, is a
llama2.c checkpoint (tokenizer.bin beside it, or `tokenizer_path`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFileError
from .common import LoadedModel, ProgressFn, fspath, require_file
from .gguf import is_gguf, load_gguf
from .llama2c import has_llama2c_magic, load_llama2c
from .safetensors import is_safetensors_dir, load_safetensors

__all__ = ["LoadedModel", "load_model", "load_gguf", "load_safetensors", "load_llama2c"]

_WHAT_WORKS = ("pass a .gguf file, a directory with config.json and *.safetensors, or a llama2.c "
               ".bin checkpoint")


def load_model(path: str | os.PathLike, progress: ProgressFn | None = None,
               tokenizer_path: str | os.PathLike | None = None) -> LoadedModel:
    """Load any supported model file. `progress(done, total)` is called after each tensor;
    `tokenizer_path` overrides where a llama2.c checkpoint's tokenizer.bin is looked for."""
    path = fspath(path)
    if not path.exists():
        raise ModelFileError(path, f"no such file or directory; {_WHAT_WORKS} (or run "
                                   f"`python weights/fetch.py` for the default model)")
    if path.is_dir():
        return _load_directory(path, progress)
    require_file(path)
    if path.name == "config.json":
        return load_safetensors(path.parent, progress=progress)
    if is_gguf(path) or path.suffix.lower() == ".gguf":
        return load_gguf(path, progress=progress)
    if path.suffix.lower() == ".safetensors":
        return load_safetensors(path, progress=progress)
    if has_llama2c_magic(path) or path.suffix.lower() == ".bin":
        return load_llama2c(path, tokenizer_path=tokenizer_path, progress=progress)
    raise ModelFileError(path, f"unrecognized model file (no GGUF or llama2.c magic, and neither "
                               f".gguf, .safetensors nor .bin); {_WHAT_WORKS}")


def _load_directory(path: Path, progress: ProgressFn | None) -> LoadedModel:
    if is_safetensors_dir(path):
        return load_safetensors(path, progress=progress)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0], progress=progress)
    if len(ggufs) > 1:
        raise ModelFileError(path, f"directory holds {len(ggufs)} .gguf files "
                                   f"({', '.join(g.name for g in ggufs[:4])}); pass one of them")
    raise ModelFileError(path, f"directory holds no model (no config.json with *.safetensors, no "
                               f".gguf); {_WHAT_WORKS}")
