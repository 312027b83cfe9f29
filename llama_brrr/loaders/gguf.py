"""GGUF (llama.cpp) files -> LoadedModel.

The container is read by gguf_file.py (header checked against the file, one memory map);
dequantization of the types the engine does not keep is the `gguf` package's. This module
maps llama.cpp's metadata and tensor names onto ModelConfig and the canonical names, undoes the
q/k row permutation llama.cpp applies at conversion, and turns every failure into a ModelFileError
that names the file.

Nothing is read at load but the header: the tensors come one at a time from the memory map when the
engine asks (GGUFTensors), quantized ones either as their blocks (kept as they are) or dequantized.
Before any of that the tensor table is held to the file: every tensor's data aligned, inside the
file, and packed exactly where the previous one ends (so a changed type, shape or offset shows up as
an overlap or a hole), rows made of whole blocks. Each tensor is scanned as it is read: NaN or inf
in a float tensor's values or in a quantized tensor's block scales is an error naming the tensor.
"""

from __future__ import annotations

import math
import mmap
import re
from pathlib import Path

import ml_dtypes
import numpy as np

import gguf
from gguf import GGMLQuantizationType

from .gguf_file import GGUFFile, GGUFFormatError, UnknownTensorType

from ..errors import ModelFileError, UnsupportedModelError
from .common import (LoadedModel, ProgressFn, TensorSet, check_shapes, dominant,
                     first_nonfinite_row, interleaved_to_half, make_config, require_file)

GGUF_MAGIC = b"GGUF"

# Architectures whose GGUF tensors and metadata are exactly llama's. llama.cpp converts Mistral
# checkpoints to "llama"; a few third-party converters write "mistral" with the same layout.
LLAMA_ARCHITECTURES = ("llama", "mistral")

_GLOBAL_NAMES = {"token_embd.weight": "tok_embeddings", "output_norm.weight": "norm",
                 "output.weight": "output"}
_LAYER_NAMES = {"attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv",
                "attn_output": "wo", "ffn_norm": "ffn_norm", "ffn_gate": "w1", "ffn_up": "w3",
                "ffn_down": "w2"}
_GGUF_LAYER_NAMES = {kind: gguf_kind for gguf_kind, kind in _LAYER_NAMES.items()}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# Tokenizer keys always present in tokenizer_spec (None when the file lacks them), so consumers
# can index instead of probing.
_TOKENIZER_KEYS = ("model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id",
                   "eos_token_id", "unknown_token_id", "padding_token_id", "add_bos_token",
                   "add_eos_token", "add_space_prefix", "chat_template")

# llama.cpp's defaults when a key is absent (llama-model.cpp / llama-hparams).
_DEFAULT_NORM_EPS = 1e-5
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_ORIGINAL_CONTEXT = 8192


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def load_gguf(path: str | Path, progress: ProgressFn | None = None) -> LoadedModel:
    path = Path(path)
    require_file(path, "GGUF file")
    if not is_gguf(path):
        with open(path, "rb") as f:
            head = f.read(4)
        raise ModelFileError(path, f"not a GGUF file: it starts with {head!r}, not "
                                   f"{GGUF_MAGIC!r}; pass a .gguf file, a directory of "
                                   f"safetensors, or a llama2.c .bin")
    reader = _open_reader(path)
    meta = _Metadata(reader, path)

    arch = meta.get("general.architecture")
    if arch not in LLAMA_ARCHITECTURES:
        raise UnsupportedModelError(path, f"architecture {arch!r} is not supported; llama_brrr "
                                          f"runs Llama-family models "
                                          f"({', '.join(LLAMA_ARCHITECTURES)})")

    by_name = {t.name: t for t in reader.tensors}
    canonical = _canonical_tensors(reader, path)
    try:
        config = _config(meta, arch, by_name, path)
    except ModelFileError:
        raise
    except (TypeError, ValueError) as exc:
        raise ModelFileError(path, f"GGUF metadata holds a value of the wrong type ({exc}); the "
                                   f"file is mis-converted") from exc

    declared = {name: _numpy_shape(t) for name, t in canonical.items()}
    check_shapes(config, declared, path, gguf_tensor_name)
    _check_layout(reader, path)
    wanted = {name: canonical[name] for name in config.tensor_shapes()}
    for t in wanted.values():
        _check_readable_type(t, path)
        _check_whole_blocks(t, path)
    elements_by_type: dict[str, int] = {}
    for t in wanted.values():
        elements_by_type[t.tensor_type.name] = (elements_by_type.get(t.tensor_type.name, 0)
                                                + int(t.n_elements))
    if progress is not None:
        progress(len(wanted), len(wanted))  # nothing is read until the engine asks for a tensor

    spec = _tokenizer_spec(meta, path)
    eos_ids = [spec[key] for key in ("eos_token_id", "eot_token_id", "eom_token_id")
               if spec.get(key) is not None]
    return LoadedModel(config=config, tensors=GGUFTensors(reader, wanted, config, path),
                       tokenizer_spec=spec, source=str(path),
                       file_dtype=dominant(elements_by_type),
                       eos_token_ids=list(dict.fromkeys(int(i) for i in eos_ids)),
                       bos_token_id=spec["bos_token_id"])


class GGUFTensors(TensorSet):
    """The canonical tensors of a GGUF file, read from its memory map one at a time (TensorSet)."""

    def __init__(self, reader: GGUFFile, tensors: dict, config, path: Path):
        self._reader = reader
        self._tensors = tensors
        self._config = config
        self._path = path

    def __getitem__(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        array = _tensor_array(self._reader, t, self._path)
        bad_row = first_nonfinite_row(array)
        if bad_row >= 0:
            raise ModelFileError(self._path, f"tensor {t.name!r} holds NaN or inf values (row "
                                             f"{bad_row}); the file is corrupt, re-download it")
        return self._permuted(name, array)

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def file_type(self, name: str) -> str:
        return self._tensors[name].tensor_type.name

    def blocks(self, name: str) -> np.ndarray:
        """uint8 [rows, row_bytes] of a quantized tensor as stored, after its block scales are
        checked; q/k rows permuted like the values (whole rows, so the blocks are untouched)."""
        from .. import _C

        t = self._tensors[name]
        kind = t.tensor_type
        if kind in _FLOAT_TYPES:
            return super().blocks(name)
        rows = _numpy_shape(t)[0]
        raw = self._reader.tensor_bytes(t)
        bad = _C.quant_ops.first_bad_scale(int(kind), raw)
        if bad >= 0:
            per_row = int(t.n_elements) // rows // gguf.GGML_QUANT_SIZES[kind][0]
            raise ModelFileError(self._path, f"tensor {t.name!r} ({kind.name}) has a NaN or inf "
                                             f"scale in block {bad} (row {bad // per_row}); the "
                                             f"file is corrupt, re-download it")
        return self._permuted(name, raw.reshape(rows, -1))

    def release(self, name: str) -> None:
        """Drops the tensor's pages from this process's memory (they stay in the page cache), so
        loading never holds the file and the engine's copy at once."""
        t = self._tensors[name]
        backing = getattr(self._reader.data, "_mmap", None)
        if backing is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = int(t.data_offset) // mmap.PAGESIZE * mmap.PAGESIZE
        end = int(t.data_offset) + int(t.n_bytes)
        try:
            backing.madvise(mmap.MADV_DONTNEED, start, end - start)
        except (OSError, ValueError):
            pass  # advice only: the pages are dropped when the reader is

    def _permuted(self, name: str, rows: np.ndarray) -> np.ndarray:
        if name.endswith(".wq"):
            return interleaved_to_half(rows, self._config.n_heads)
        if name.endswith(".wk"):
            return interleaved_to_half(rows, self._config.n_kv_heads)
        return rows


def _check_layout(reader: GGUFFile, path: Path) -> None:
    """Every tensor's bytes aligned, inside the file, and packed after the previous tensor's (up to
    the alignment padding): how llama.cpp and gguf-py write files, and what turns a damaged type,
    shape or offset field into an error instead of a tensor read from its neighbour's bytes."""
    size = path.stat().st_size
    alignment = reader.alignment
    spans = sorted((int(t.data_offset), int(t.n_bytes), t.name) for t in reader.tensors)
    expected_start = int(reader.data_offset)
    previous = None
    for offset, n_bytes, name in spans:
        if offset % alignment:
            raise ModelFileError(path, f"tensor {name!r} starts at byte {offset}, not a multiple of "
                                       f"the file's alignment {alignment}; the tensor table is "
                                       f"corrupt")
        if offset + n_bytes > size:
            raise ModelFileError(path, f"the GGUF file is truncated or corrupt: tensor {name!r} "
                                       f"needs bytes {offset}..{offset + n_bytes} but the file "
                                       f"has {size}; re-download it")
        if offset < expected_start:
            where = f"inside tensor {previous!r}" if previous else "inside the header"
            raise ModelFileError(path, f"tensor {name!r} starts at byte {offset}, {where}; the "
                                       f"tensor table is corrupt (a type, shape or offset does "
                                       f"not match the data)")
        if offset - expected_start >= alignment:
            after = f"after tensor {previous!r}" if previous else "at the start of the data"
            raise ModelFileError(path, f"{offset - expected_start} unused bytes {after}, before "
                                       f"tensor {name!r}; the tensor table is corrupt (a type, "
                                       f"shape or offset does not match the data)")
        expected_start = -(-(offset + n_bytes) // alignment) * alignment
        previous = name
    if previous is not None and size - expected_start >= alignment:
        raise ModelFileError(path, f"{size - expected_start} bytes follow the last tensor "
                                   f"({previous!r}); the tensor table does not cover the data "
                                   f"(a type, shape or offset was changed)")


_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


def _check_readable_type(t, path: Path) -> None:
    """A float type, or a block format the gguf package can dequantize (the kept ones included)."""
    if t.tensor_type in _FLOAT_TYPES or t.tensor_type in gguf.quants._type_traits:
        return
    raise UnsupportedModelError(path, f"tensor {t.name!r} has type {t.tensor_type.name}, which "
                                      f"llama_brrr cannot read (float types, Q4_0..Q8_0, the "
                                      f"K-quants and the IQ types are supported)")


def _check_whole_blocks(t, path: Path) -> None:
    block = gguf.GGML_QUANT_SIZES.get(t.tensor_type, (1, 1))[0]
    row = int(t.shape[0]) if len(t.shape) else 1
    if block > 1 and row % block:
        raise ModelFileError(path, f"tensor {t.name!r} is {t.tensor_type.name} with rows of {row} "
                                   f"values, not whole blocks of {block}; the file is corrupt")


def _open_reader(path: Path) -> GGUFFile:
    try:
        return GGUFFile(path)
    except UnknownTensorType as exc:
        raise UnsupportedModelError(path, f"{exc}; the installed gguf {_gguf_version()} and "
                                          f"llama_brrr do not support it") from exc
    except GGUFFormatError as exc:
        raise ModelFileError(path, f"the GGUF file is truncated or corrupt: {exc}; "
                                   f"re-download it") from exc
    except OSError as exc:
        raise ModelFileError(path, f"cannot read the file ({exc})") from exc


def _gguf_version() -> str:
    try:
        from importlib.metadata import version
        return version("gguf")
    except ImportError:
        return "(unknown version)"


class _Metadata:
    """Typed access to the GGUF key/value section, with errors that name the key and the file."""

    def __init__(self, reader: GGUFFile, path: Path):
        self._fields = reader.fields
        self._path = path
        self.reader = reader

    def keys(self):
        return self._fields.keys()

    def get(self, key: str, default=None):
        value = self._fields.get(key)
        if value is None:
            return default
        return value.tolist() if isinstance(value, np.ndarray) else value

    def require_int(self, key: str) -> int:
        value = self.get(key)
        if value is None:
            raise ModelFileError(self._path, f"GGUF metadata lacks {key!r}, which a Llama model "
                                             f"needs; the file is incomplete or mis-converted")
        if isinstance(value, list) and value and all(v == value[0] for v in value):
            value = value[0]  # per-layer lists (allowed by llama.cpp) that are uniform
        if isinstance(value, bool) or not isinstance(value, int):
            raise UnsupportedModelError(self._path, f"GGUF metadata {key!r} = {value!r}: expected "
                                                    f"one integer (per-layer values are not "
                                                    f"supported)")
        return value


def gguf_tensor_name(canonical: str) -> str:
    """The GGUF name of a canonical tensor name ("layers.3.wq" -> "blk.3.attn_q.weight")."""
    for gguf_name, name in _GLOBAL_NAMES.items():
        if name == canonical:
            return gguf_name
    _, layer, kind = canonical.split(".")
    return f"blk.{layer}.{_GGUF_LAYER_NAMES[kind]}.weight"


def _canonical_tensors(reader: GGUFFile, path: Path) -> dict:
    canonical = {}
    for t in reader.tensors:
        name = _GLOBAL_NAMES.get(t.name)
        match = _LAYER_TENSOR.fullmatch(t.name)
        if match and match.group(3) == "bias" and match.group(2) in _LAYER_NAMES:
            # Ignoring a bias would silently compute a different model.
            raise UnsupportedModelError(path, f"tensor {t.name!r}: biases on attention/MLP "
                                              f"projections are not supported by llama_brrr")
        if name is None and match and match.group(2) in _LAYER_NAMES:
            name = f"layers.{int(match.group(1))}.{_LAYER_NAMES[match.group(2)]}"
        if name is not None:
            canonical[name] = t
    return canonical


def _numpy_shape(t) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-varying first; numpy wants them slowest first.
    return tuple(int(d) for d in reversed(t.shape))


def _config(meta: _Metadata, arch: str, by_name: dict, path: Path):
    p = arch + "."
    dim = meta.require_int(p + "embedding_length")
    n_heads = meta.require_int(p + "attention.head_count")
    n_kv_heads = (meta.require_int(p + "attention.head_count_kv")
                  if meta.get(p + "attention.head_count_kv") is not None else n_heads)
    head_dim = (meta.require_int(p + "attention.key_length")
                if meta.get(p + "attention.key_length") is not None else dim // max(n_heads, 1))
    value_length = meta.get(p + "attention.value_length")
    if value_length is not None and value_length != head_dim:
        raise UnsupportedModelError(path, f"{p}attention.value_length ({value_length}) differs "
                                          f"from key_length ({head_dim}); not supported")
    rope_dims = meta.get(p + "rope.dimension_count")
    if rope_dims is not None and rope_dims != head_dim:
        raise UnsupportedModelError(path, f"{p}rope.dimension_count is {rope_dims} but heads "
                                          f"have {head_dim} dims; partial rotary embeddings are "
                                          f"not supported")

    embedding = by_name.get("token_embd.weight")
    if embedding is None:
        raise ModelFileError(path, "missing tensor 'token_embd.weight' (the token embedding); "
                                   "the file is incomplete or not a Llama model")
    vocab_size = _numpy_shape(embedding)[0]
    rope_theta = float(meta.get(p + "rope.freq_base", _DEFAULT_ROPE_THETA))

    return make_config(
        path, dim=dim, hidden_dim=meta.require_int(p + "feed_forward_length"),
        n_layers=meta.require_int(p + "block_count"), n_heads=n_heads, n_kv_heads=n_kv_heads,
        vocab_size=vocab_size, head_dim=head_dim,
        max_seq_len=meta.require_int(p + "context_length"),
        norm_eps=float(meta.get(p + "attention.layer_norm_rms_epsilon", _DEFAULT_NORM_EPS)),
        rope_theta=rope_theta,
        rope_scaling=_rope_scaling(meta, p, by_name, head_dim, rope_theta, path),
        tie_embeddings="output.weight" not in by_name,
        name=str(meta.get("general.name") or path.stem),
        extra={"format": "gguf", "architecture": arch,
               "file_type": meta.get("general.file_type")})


def _rope_scaling(meta: _Metadata, p: str, by_name: dict, head_dim: int, theta: float,
                  path: Path) -> dict | None:
    scaling_type = meta.get(p + "rope.scaling.type")
    rope_freqs = by_name.get("rope_freqs.weight")
    if rope_freqs is not None:
        # llama.cpp's converter stores Llama 3.x scaling as this per-frequency divisor tensor
        # instead of metadata.
        if scaling_type not in (None, "none"):
            raise UnsupportedModelError(path, f"both rope_freqs.weight and rope.scaling.type "
                                              f"{scaling_type!r} are present; not supported")
        divisors = _tensor_array(meta.reader, rope_freqs, path).astype(np.float64).ravel()
        original = meta.get(p + "rope.scaling.original_context_length") or _DEFAULT_ORIGINAL_CONTEXT
        return llama3_scaling_from_divisors(divisors, head_dim, theta, int(original), path)
    if scaling_type in (None, "none"):
        return None
    if scaling_type == "linear":
        factor = meta.get(p + "rope.scaling.factor")
        if not factor or factor <= 0:
            raise ModelFileError(path, f"rope.scaling.type is 'linear' but {p}rope.scaling.factor "
                                       f"is {factor!r}; the file is mis-converted")
        return {"rope_type": "linear", "factor": float(factor)}
    raise UnsupportedModelError(path, f"rope scaling {scaling_type!r} is not supported "
                                      f"(supported: linear, llama3)")


def llama3_divisors(params: dict, head_dim: int, theta: float) -> np.ndarray:
    """What llama.cpp's converter stores in rope_freqs.weight for Llama 3 rope scaling params:
    the number each rotary frequency is divided by (1 for fast ones, `factor` for slow ones)."""
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    original = params["original_max_position_embeddings"]
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    band = 1.0 / ((1.0 - smooth) / factor + smooth)
    slow = np.where(wavelen > original / low, factor, band)
    return np.where(wavelen < original / high, 1.0, slow)


def llama3_scaling_from_divisors(divisors: np.ndarray, head_dim: int, theta: float,
                                 original: int, path: Path) -> dict | None:
    """Recover Llama 3 rope-scaling parameters from a rope_freqs.weight divisor vector.

    Inside the transition band 1/d = (1 - s)/factor + s, with s = (original/wavelen - low) /
    (high - low) a straight line in original/wavelen, so two or more band points give low and
    high exactly.
    Only low/original and high/original matter, so assuming `original` loses nothing. The result
    is accepted only if it reproduces every divisor.
    """
    if divisors.shape != (head_dim // 2,):
        raise ModelFileError(path, f"rope_freqs.weight has {divisors.size} values, expected "
                                   f"head_dim/2 = {head_dim // 2}; the file is mis-converted")
    if not np.all(np.isfinite(divisors)) or np.any(divisors <= 0):
        raise ModelFileError(path, "rope_freqs.weight holds non-positive or non-finite values; "
                                   "the file is corrupt")
    factor = float(divisors.max())
    if np.allclose(divisors, 1.0, rtol=0, atol=1e-6):
        return None
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    x = original * inv_freq / (2 * math.pi)
    in_band = (divisors > 1 + 1e-4) & (divisors < factor * (1 - 1e-4))
    low, high = 1.0, 4.0  # Meta's values, used when too few frequencies fall inside the band
    if in_band.sum() >= 2:
        s = (1.0 / divisors[in_band] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(x[in_band], s, 1)
        if slope > 0:
            low = -intercept / slope
            high = low + 1.0 / slope
    params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
              "high_freq_factor": float(high), "original_max_position_embeddings": int(original)}
    if not (0 < low < high) or not np.allclose(llama3_divisors(params, head_dim, theta), divisors,
                                               rtol=1e-3, atol=0):
        raise UnsupportedModelError(path, "rope_freqs.weight does not follow the Llama 3 rope "
                                          "scaling rule; this rope scaling is not supported")
    return params


def _tensor_array(reader: GGUFFile, t, path: Path) -> np.ndarray:
    shape = _numpy_shape(t)
    kind = t.tensor_type
    raw = reader.tensor_bytes(t)
    if kind == GGMLQuantizationType.F32:
        array = raw.view(np.float32)
    elif kind == GGMLQuantizationType.F16:
        array = raw.view(np.float16)
    elif kind == GGMLQuantizationType.BF16:
        array = raw.view(np.uint16).view(ml_dtypes.bfloat16)  # in place, not upcast
    else:
        try:
            array = gguf.quants.dequantize(raw.reshape(shape[0] if len(shape) > 1 else 1, -1), kind)
        except NotImplementedError as exc:
            raise UnsupportedModelError(path, f"tensor {t.name!r} has type {kind.name}, which "
                                              f"llama_brrr cannot dequantize") from exc
    if tuple(array.shape) != shape:
        array = array.reshape(shape)
    return array


def read_tokenizer_spec(path: str | Path) -> dict:
    """The tokenizer_spec of a GGUF file without loading its tensors (see LoadedModel)."""
    path = Path(path)
    require_file(path, "GGUF file")
    return _tokenizer_spec(_Metadata(_open_reader(path), path), path)


def _tokenizer_spec(meta: _Metadata, path: Path) -> dict:
    spec: dict = {key: None for key in _TOKENIZER_KEYS}
    for key in meta.keys():
        if key.startswith("tokenizer.ggml."):
            spec[key[len("tokenizer.ggml."):]] = meta.get(key)
        elif key.startswith("tokenizer."):
            spec[key[len("tokenizer."):]] = meta.get(key)
    spec["format"] = "gguf"
    spec["path"] = str(path)
    return spec
