"""Which storage type each weight matrix gets: the `quant=` argument of Llama.from_pretrained and
Llama.random, the `--quant` option of the CLI.

    quant=None / "auto"  quantized GGUF tensors of a kept type stay as stored (CPU); every other
                         tensor runs in the engine dtype. A 16/32-bit file stays 16/32-bit.
    quant="none"         every tensor dequantized to the engine dtype.
    quant="q8_0", "q4_k", ...   every matrix in that block format: float tensors are quantized at
                         load, tensors stored in another block format are dequantized and
                         requantized, tensors already in it are kept as they are.
    quant="q4_k_m", "q5_k_m"    llama.cpp's mixes of the same names (RECIPES below).

A type whose blocks do not divide a matrix's rows falls back as llama.cpp's quantizer does
(q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0), or to q8_0 when that fallback is not a kept type.
Norm weights always stay fp32.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from . import _C
from .config import ModelConfig

# Recipes: (base type, what the LM head / tied embedding gets, what attn_v and ffn_down get in the
# layers use_more_bits picks). llama.cpp's llama_tensor_get_type for these file types.
RECIPES = {"q4_k_m": ("q4_k", "q6_k", "q6_k"), "q5_k_m": ("q5_k", "q6_k", "q6_k")}
_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
_MATRIX_KINDS = ("wq", "wk", "wv", "wo", "w1", "w3", "w2")


class QuantWarning(UserWarning):
    """A tensor type the engine cannot keep quantized: it is dequantized at load."""


@functools.lru_cache(maxsize=None)
def kept_types() -> dict[str, int]:
    """Block formats the CPU engine keeps as they are: lowercase name -> GGML type id."""
    out = {}
    for t in GGMLQuantizationType:
        try:
            _C.quant_ops.row_bytes(int(t), 256)
        except ValueError:
            continue
        out[t.name.lower()] = int(t)
    return out


def choices() -> list[str]:
    return ["auto", "none", *sorted(kept_types()), *RECIPES]


@dataclass(frozen=True)
class QuantPlan:
    """types: matrix name -> kept block type name ("q4_1"); matrices absent run in the engine dtype."""

    types: dict

    def type_ids(self) -> dict[str, int]:
        ids = kept_types()
        return {name: ids[t] for name, t in self.types.items()}


def parse_quant(quant) -> str:
    """None / "auto" / "none" / a kept type / a recipe -> its canonical lowercase name."""
    if quant is None:
        return "auto"
    if not isinstance(quant, str):
        from .errors import ArgumentTypeError
        raise ArgumentTypeError(f"quant must be a str or None, got {quant!r}")
    key = quant.strip().lower()
    if key not in choices():
        raise ValueError(f"quant must be one of {', '.join(choices())}; got {quant!r}")
    return key


def plan(config: ModelConfig, quant: str, file_types: dict[str, str] | None, backend: str) -> QuantPlan:
    """Storage types for every matrix of `config`. file_types: canonical name -> the type the file
    stores it in ("Q4_1", "F32", ...), None for random weights."""
    mode = parse_quant(quant)
    matrices = [n for n, shape in config.tensor_shapes().items() if len(shape) == 2]
    kept = kept_types()
    if mode == "none" or (mode == "auto" and not file_types):
        types = {}
    elif mode == "auto":
        types = {n: file_types[n].lower() for n in matrices if file_types[n].lower() in kept}
    else:
        wanted = _recipe_types(config, mode) if mode in RECIPES else {n: mode for n in matrices}
        types = {n: _fitting(t, config.tensor_shapes()[n][1]) for n, t in wanted.items()}
    if file_types:
        dequantized = sorted({file_types[n] for n in matrices if n not in types
                              and file_types[n] not in ("F32", "F16", "BF16")})
        if dequantized and mode != "none":
            warnings.warn(f"tensor type(s) {', '.join(dequantized)} are not kept quantized on "
                          f"{backend}: those tensors are dequantized at load", QuantWarning,
                          stacklevel=3)
    return QuantPlan(types)


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _recipe_types(config: ModelConfig, recipe: str) -> dict[str, str]:
    base, head, more = RECIPES[recipe]
    types = {}
    for name, shape in config.tensor_shapes().items():
        if len(shape) != 2:
            continue
        if name == "output" or (name == "tok_embeddings" and config.tie_embeddings):
            types[name] = head
        elif name == "tok_embeddings":
            types[name] = base
        else:
            layer, kind = int(name.split(".")[1]), name.split(".")[2]
            bump = kind in ("wv", "w2") and _use_more_bits(layer, config.n_layers)
            types[name] = more if bump else base
    return types


def _fitting(type_name: str, cols: int) -> str:
    """type_name, or its llama.cpp fallback when its blocks do not divide a row of `cols`."""
    kept = kept_types()
    if cols % _block_elems(type_name) == 0:
        return type_name
    fallback = _FALLBACK.get(type_name, "q8_0")
    if fallback not in kept or cols % _block_elems(fallback):
        fallback = "q8_0"
    if cols % 32:
        raise ValueError(f"rows of {cols} values cannot be stored as {type_name} or any block "
                         f"format (blocks of 32); use quant='none'")
    return fallback


def _block_elems(type_name: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType(kept_types()[type_name])][0]


def family(name: str) -> str:
    """A canonical tensor's family for reports: "wq", "w2", "tok_embeddings", ..."""
    return name.split(".")[-1]


def census(config: ModelConfig, types: dict[str, str], dtype: str) -> tuple[dict[str, str], int]:
    """Per family the storage type(s) ("q4_k/q6_k" when mixed), and the matrices' bytes."""
    by_family: dict[str, list[str]] = {}
    total = 0
    for name, shape in config.tensor_shapes().items():
        t = types.get(name, dtype if len(shape) == 2 else "f32")
        if t not in by_family.setdefault(family(name), []):
            by_family[family(name)].append(t)
        if t in kept_types():
            total += shape[0] * _C.quant_ops.row_bytes(t, shape[1])
        else:
            total += shape[0] * (shape[1] if len(shape) == 2 else 1) * (2 if t in ("bf16", "f16") else 4)
    return {f: "/".join(sorted(ts)) for f, ts in by_family.items()}, total


def describe(config: ModelConfig, types: dict[str, str], dtype: str) -> str:
    """"wq wk wo w1 w3 q4_1, wv w2 q6_k, tok_embeddings q8_0, norms f32; 97.9 MB" (one line)."""
    fams, total = census(config, types, dtype)
    groups: dict[str, list[str]] = {}
    for fam, t in fams.items():
        if fam in ("attn_norm", "ffn_norm", "norm"):
            continue
        groups.setdefault(t, []).append(fam)
    parts = [f"{' '.join(fs)} {t}" for t, fs in groups.items()]
    return f"{', '.join(parts)}, norms f32; {total / 1e6:.1f} MB"
