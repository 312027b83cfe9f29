"""llama2.c checkpoints (Karpathy's run.c / export.py formats) -> LoadedModel.

Three layouts, all little-endian, matrices [out, in] row-major, each weight kind stored for all
layers in a row:
  legacy (v0): 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
               vocab_size < 0 means an unshared classifier), then fp32 tok_embeddings, attn_norm*L,
               wq*L, wk*L, wv*L, wo*L, ffn_norm*L, w1*L, w2*L, w3*L, norm, two RoPE tables of
               seq_len * head_dim/2 floats (unused: the engine computes RoPE), [output].
  v1:          256-byte header: uint32 magic "ak42", int32 version 1, the 7 int32 (vocab_size
               positive), uint8 shared_classifier, zero padding; then fp32 attn_norm*L,
               ffn_norm*L, norm, tok_embeddings, wq*L, wk*L, wv*L, wo*L, w1*L, w2*L, w3*L, [output].
  v2:          like v1 plus int32 group_size after the flag; fp32 norms as in v1, then the int8
               values of tok_embeddings, wq*L ... w3*L, [output], then all their fp32 scales
               (one per group_size consecutive values: value = int8 * scale).
The weights are in Meta's q/k row order (adjacent-pair RoPE) and are converted to rotate-half.
llama2.c models use eps 1e-5 and RoPE theta 10000 (hard-coded in run.c).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from .common import LoadedModel, ProgressFn, interleaved_to_half, make_config, require_file

MAGIC = 0x616B3432  # "ak42" read as a little-endian uint32
VERSIONED_HEADER_BYTES = 256
LEGACY_HEADER_BYTES = 7 * 4
NORM_EPS = 1e-5
ROPE_THETA = 10000.0
# run.c ends a sample at BOS (1): llama2.c's training data separates stories with it. The
# Llama 2 tokenizer's EOS (2) ends one too.
STOP_TOKEN_IDS = [1, 2]
BOS_TOKEN_ID = 1

_PER_LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


def has_llama2c_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return len(head) == 4 and struct.unpack("<I", head)[0] == MAGIC


def load_llama2c(path: str | Path, tokenizer_path: str | Path | None = None,
                 progress: ProgressFn | None = None) -> LoadedModel:
    path = Path(path)
    require_file(path, "llama2.c checkpoint")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(VERSIONED_HEADER_BYTES)
    if head[:4] == b"PK\x03\x04":
        raise ModelFileError(path, "this is a zip (PyTorch pickle) checkpoint, not a llama2.c "
                                   ".bin; convert it with llama2.c's export.py or use safetensors")

    if len(head) >= 8 and struct.unpack("<I", head[:4])[0] == MAGIC:
        version = struct.unpack("<i", head[4:8])[0]
        if version not in (1, 2):
            raise UnsupportedModelError(path, f"llama2.c format version {version} is not supported "
                                              f"(supported: legacy, 1, 2)")
        if len(head) < VERSIONED_HEADER_BYTES:
            raise ModelFileError(path, "file is shorter than its 256-byte header (truncated); "
                                       "re-export or re-download it")
        fields = struct.unpack("<7i", head[8:36])
        shared = head[36] != 0
        group_size = struct.unpack("<i", head[37:41])[0] if version == 2 else 0
    else:
        if len(head) < LEGACY_HEADER_BYTES:
            raise ModelFileError(path, "file is too short to hold a llama2.c header (truncated)")
        version = 0
        fields = struct.unpack("<7i", head[:LEGACY_HEADER_BYTES])
        shared = fields[5] > 0
        group_size = 0

    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len = fields
    vocab_size = abs(vocab_size)
    _check_header(path, fields, version, group_size)
    config = make_config(path, dim=dim, hidden_dim=hidden_dim, n_layers=n_layers, n_heads=n_heads,
                         n_kv_heads=n_kv_heads, vocab_size=vocab_size, max_seq_len=seq_len,
                         norm_eps=NORM_EPS, rope_theta=ROPE_THETA, tie_embeddings=shared,
                         name=path.stem, extra={"format": "llama2c", "version": version})

    layout = _layout(config, version)
    if version == 2:
        uneven = [n for n in layout["int8"] if _count(config, n) % group_size]
        if uneven:
            raise ModelFileError(path, f"tensor {uneven[0]!r} has {_count(config, uneven[0])} "
                                       f"values, not a multiple of the header's group_size "
                                       f"{group_size}; corrupt file")
        expected = (VERSIONED_HEADER_BYTES + sum(4 * _count(config, n) for n in layout["fp32"])
                    + sum(_count(config, n) * (group_size + 4) // group_size
                          for n in layout["int8"]))
    else:
        header = LEGACY_HEADER_BYTES if version == 0 else VERSIONED_HEADER_BYTES
        expected = header + 4 * sum(_count(config, n) for n in layout["fp32"])
    if size != expected:
        problem = "truncated" if size < expected else "has extra bytes"
        raise ModelFileError(path, f"file is {problem}: {size} bytes, but its header "
                                   f"({_describe(fields)}, format version {version}) implies "
                                   f"{expected}; re-export or re-download it")

    tokenizer = (Path(tokenizer_path) if tokenizer_path is not None
                 else path.parent / "tokenizer.bin")
    if not tokenizer.is_file():
        raise ModelFileError(tokenizer, f"llama2.c tokenizer not found (needed by {path.name}); "
                                        f"put llama2.c's tokenizer.bin next to the checkpoint or "
                                        f"pass its path as tokenizer_path")

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = _read_tensors(raw, config, layout, version, group_size, progress)
    spec = {"format": "llama2c", "tokenizer_bin": str(tokenizer.resolve()),
            "vocab_size": config.vocab_size}
    return LoadedModel(config=config, tensors=tensors, tokenizer_spec=spec,
                       source=str(path), file_dtype="Q8_0" if version == 2 else "F32",
                       eos_token_ids=list(STOP_TOKEN_IDS), bos_token_id=BOS_TOKEN_ID)


def _check_header(path: Path, fields: tuple, version: int, group_size: int) -> None:
    dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len = fields
    sane = (all(v > 0 for v in (dim, hidden_dim, n_layers, n_heads, n_kv_heads, seq_len))
            and vocab_size != 0 and dim % n_heads == 0 and n_heads % n_kv_heads == 0
            and max(dim, hidden_dim, abs(vocab_size)) < 1 << 24 and n_layers < 1 << 12
            and seq_len < 1 << 24)
    if not sane:
        raise ModelFileError(path, f"not a llama2.c checkpoint: its header reads "
                                   f"{_describe(fields)}; pass a llama2.c .bin, a .gguf or a "
                                   f"safetensors directory")
    if version == 2 and group_size <= 0:
        raise ModelFileError(path, f"llama2.c v2 header has group_size {group_size}; corrupt file")


def _describe(fields: tuple) -> str:
    names = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
    return ", ".join(f"{n}={v}" for n, v in zip(names, fields, strict=True))


def _layout(config, version: int) -> dict[str, list[str]]:
    """The file's tensor order: canonical names, and "rope_tables" for legacy's unused tables."""
    def per_layer(kind):
        return [f"layers.{i}.{kind}" for i in range(config.n_layers)]

    output = [] if config.tie_embeddings else ["output"]
    matrices = [name for kind in _PER_LAYER_MATRICES for name in per_layer(kind)]
    if version == 0:
        fp32 = (["tok_embeddings"] + per_layer("attn_norm") + per_layer("wq") + per_layer("wk")
                + per_layer("wv") + per_layer("wo") + per_layer("ffn_norm") + per_layer("w1")
                + per_layer("w2") + per_layer("w3") + ["norm", "rope_tables"] + output)
        return {"fp32": fp32, "int8": []}
    norms = per_layer("attn_norm") + per_layer("ffn_norm") + ["norm"]
    if version == 1:
        return {"fp32": norms + ["tok_embeddings"] + matrices + output, "int8": []}
    return {"fp32": norms, "int8": ["tok_embeddings"] + matrices + output}


def _shape(config, name: str) -> tuple[int, ...]:
    if name == "rope_tables":  # freq_cis_real and freq_cis_imag, back to back
        return (2, config.max_seq_len, config.head_dim // 2)
    return config.tensor_shapes()[name]


def _count(config, name: str) -> int:
    return int(np.prod(_shape(config, name)))


def _read_tensors(raw: np.ndarray, config, layout: dict, version: int, group_size: int,
                  progress: ProgressFn | None) -> dict[str, np.ndarray]:
    offset = LEGACY_HEADER_BYTES if version == 0 else VERSIONED_HEADER_BYTES
    wanted = config.tensor_shapes()
    tensors: dict[str, np.ndarray] = {}

    def finish(name, array):
        if name.endswith(".wq"):
            array = interleaved_to_half(array, config.n_heads)
        elif name.endswith(".wk"):
            array = interleaved_to_half(array, config.n_kv_heads)
        tensors[name] = array
        if progress is not None:
            progress(len(tensors), len(wanted))

    for name in layout["fp32"]:
        count = _count(config, name)
        if name in wanted:
            data = raw[offset:offset + 4 * count].view(np.float32)
            finish(name, data.reshape(_shape(config, name)))
        offset += 4 * count

    values = []
    for name in layout["int8"]:
        count = _count(config, name)
        values.append(raw[offset:offset + count].view(np.int8))
        offset += count
    for name, q in zip(layout["int8"], values, strict=True):
        n_groups = q.size // group_size
        scales = raw[offset:offset + 4 * n_groups].view(np.float32)
        offset += 4 * n_groups
        weights = q.reshape(n_groups, group_size).astype(np.float32) * scales[:, None]
        finish(name, weights.reshape(_shape(config, name)))
    return tensors
