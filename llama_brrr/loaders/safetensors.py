"""Hugging Face checkpoints (config.json + *.safetensors) -> LoadedModel, without torch.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor name
to {dtype, shape, data_offsets: [begin, end)} relative to the end of the header, then the raw
little-endian data. Tensors are returned as read-only memory maps of the file. HF Llama q/k rows
are already in rotate-half order, so nothing is permuted.
"""

from __future__ import annotations

import difflib
import json
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from ..errors import ModelFileError, UnsupportedModelError
from ..tokenizer.chat import hf_chat_template
from .common import LoadedModel, ProgressFn, check_shapes, dominant, make_config, require_file

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
           "BF16": np.dtype(ml_dtypes.bfloat16)}
# Far above any real header (a 405B model's is a few hundred KiB), far below a corrupt length.
_MAX_HEADER_BYTES = 100 * 1024 * 1024

_GLOBAL_NAMES = {"model.embed_tokens.weight": "tok_embeddings", "model.norm.weight": "norm",
                 "lm_head.weight": "output"}
_LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "wq", "self_attn.k_proj": "wk",
                "self_attn.v_proj": "wv", "self_attn.o_proj": "wo",
                "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "w1", "mlp.up_proj": "w3",
                "mlp.down_proj": "w2"}
_HF_LAYER_NAMES = {kind: hf_kind for hf_kind, kind in _LAYER_NAMES.items()}
_LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.([\w.]+)\.(weight|bias)")

_TOKENIZER_FILES = {"tokenizer_json": "tokenizer.json", "tokenizer_model": "tokenizer.model",
                    "tokenizer_config": "tokenizer_config.json",
                    "generation_config": "generation_config.json",
                    "special_tokens_map": "special_tokens_map.json"}


def is_safetensors_dir(path: Path) -> bool:
    return (path.is_dir() and (path / "config.json").is_file()
            and ((path / INDEX_FILE).is_file() or any(path.glob("*.safetensors"))))


class SafetensorsFile:
    """One .safetensors file: its validated header and a lazily created memory map."""

    def __init__(self, path: Path):
        require_file(path, "safetensors file")
        self.path = path
        self.size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ModelFileError(path, "file is too short to be safetensors (truncated); "
                                           "re-download it")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len < 2 or header_len > min(_MAX_HEADER_BYTES, self.size - 8):
                raise ModelFileError(path, f"not a safetensors file, or truncated: its header "
                                           f"length field says {header_len} bytes and the file has "
                                           f"{self.size}; re-download it")
            raw = f.read(header_len)
        if not raw.startswith(b"{"):
            raise ModelFileError(path, "safetensors header does not start with '{'; the file is "
                                       "corrupt or not safetensors")
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelFileError(path, f"safetensors header is not valid JSON ({exc}); the file is "
                                       f"corrupt, re-download it") from exc
        if not isinstance(header, dict):
            raise ModelFileError(path, "safetensors header is not a JSON object; the file is "
                                       "corrupt")
        header.pop("__metadata__", None)
        self.data_start = 8 + header_len
        self.entries = {name: self._entry(name, info) for name, info in header.items()}
        self._check_layout()
        self._map = None

    def _check_layout(self) -> None:
        """As the safetensors library requires: the tensors' byte ranges tile the data section
        exactly, back to back from its start to the end of the file. A header-length field that is
        off by a few bytes (JSON padding makes the header still parse) fails here, instead of every
        tensor being read a few bytes off."""
        expected = 0
        for name, (_, _, begin, end) in sorted(self.entries.items(), key=lambda e: e[1][2:]):
            if begin != expected:
                raise ModelFileError(self.path, f"tensor {name!r} starts at data byte {begin}, "
                                                f"expected {expected} (the tensors must follow "
                                                f"each other with no gap or overlap); the header is "
                                                f"corrupt")
            expected = end
        if self.data_start + expected != self.size:
            raise ModelFileError(self.path, f"the tensors end at byte {self.data_start + expected} "
                                            f"but the file has {self.size}: the header length or "
                                            f"the data offsets are wrong; the file is corrupt")

    def _entry(self, name: str, info) -> tuple[str, tuple[int, ...], int, int]:
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise TypeError(f"shape {shape}")
            if not (isinstance(begin, int) and isinstance(end, int)):
                raise TypeError(f"data_offsets {[begin, end]}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(self.path, f"safetensors header entry for {name!r} is malformed "
                                            f"({exc}); the file is corrupt") from exc
        if self.data_start + end > self.size:
            raise ModelFileError(self.path, f"tensor {name!r} ends at byte {self.data_start + end} "
                                            f"but the file has only {self.size} bytes: the file is "
                                            f"truncated, re-download it")
        if dtype in _DTYPES:
            count = int(np.prod(shape, dtype=np.int64))
            if end - begin != count * _DTYPES[dtype].itemsize or begin > end:
                raise ModelFileError(self.path, f"tensor {name!r}: {end - begin} bytes for shape "
                                                f"{shape} of {dtype}; the file is corrupt")
        return dtype, shape, begin, end

    def array(self, name: str) -> np.ndarray:
        dtype, shape, begin, end = self.entries[name]
        if dtype not in _DTYPES:
            raise UnsupportedModelError(self.path, f"tensor {name!r} has dtype {dtype}; supported: "
                                                   f"{', '.join(_DTYPES)}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._map[self.data_start + begin:self.data_start + end]
        return raw.view(_DTYPES[dtype]).reshape(shape)


def load_safetensors(path: str | Path, progress: ProgressFn | None = None) -> LoadedModel:
    """`path`: a directory with config.json and *.safetensors, or one .safetensors file with
    config.json beside it (if an index sits beside it too, the whole sharded set is loaded)."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(path, "no such file or directory")
    directory = path if path.is_dir() else path.parent
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ModelFileError(path, f"no config.json in {directory}; a Hugging Face checkpoint "
                                   f"needs it next to the .safetensors files")
    files = _weight_files(path, directory)
    hf = _read_json(config_path)

    by_canonical: dict[str, tuple[SafetensorsFile, str]] = {}
    ignored: list[tuple[SafetensorsFile, str]] = []  # names of no tensor llama_brrr reads
    for st in files:
        for name in st.entries:
            canonical = _canonical_name(name, st.path)
            if canonical is None:
                ignored.append((st, name))
                continue
            if canonical in by_canonical:
                raise ModelFileError(st.path, f"tensor {name!r} also appears in "
                                              f"{by_canonical[canonical][0].path}; remove the "
                                              f"stray file")
            by_canonical[canonical] = (st, name)

    if "output" not in by_canonical:
        # A checkpoint without lm_head.weight is read as tied; one whose head is there under a
        # damaged name (a changed byte of the header) must not be: a tensor the head's shape, or
        # a name one or two characters from its, is that head.
        head_shape = [hf.get("vocab_size"), hf.get("hidden_size")]
        for st, name in ignored:
            near = difflib.SequenceMatcher(None, name, "lm_head.weight").ratio() >= 0.85
            if name.startswith("lm_head") or near or list(st.entries[name][1]) == head_shape:
                raise ModelFileError(st.path, f"no tensor 'lm_head.weight' but one named {name!r} "
                                              f"(shape {list(st.entries[name][1])}): the header is "
                                              f"damaged (re-download the file)")
    try:
        config = _config(hf, config_path, "output" not in by_canonical, directory)
    except ModelFileError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ModelFileError(config_path, f"config.json holds a malformed value "
                                          f"({type(exc).__name__}: {exc}); fix or re-download "
                                          f"it") from exc
    declared = {c: st.entries[n][1] for c, (st, n) in by_canonical.items()}
    check_shapes(config, declared, path, hf_tensor_name)
    if config.tie_embeddings and "output" in by_canonical:
        # Tied, yet lm_head.weight is there: harmless only if it is the embedding itself.
        head, embedding = (st.array(n) for st, n in (by_canonical["output"],
                                                      by_canonical["tok_embeddings"]))
        if head.shape != embedding.shape or not np.array_equal(head, embedding):
            raise ModelFileError(config_path, "config.json ties the embeddings "
                                              "(tie_word_embeddings) but the checkpoint holds a "
                                              "different lm_head.weight; the config is damaged "
                                              "or belongs to another model")

    wanted = config.tensor_shapes()
    tensors, elements_by_type = {}, {}
    for done, canonical in enumerate(wanted, start=1):
        st, name = by_canonical[canonical]
        tensors[canonical] = st.array(name)
        dtype = st.entries[name][0]
        elements_by_type[dtype] = elements_by_type.get(dtype, 0) + tensors[canonical].size
        if progress is not None:
            progress(done, len(wanted))

    spec = _tokenizer_spec(directory)
    generation = _read_json(Path(spec["generation_config"])) if spec["generation_config"] else {}
    eos = _id_list(generation.get("eos_token_id")) + _id_list(hf.get("eos_token_id"))
    bos = generation.get("bos_token_id", hf.get("bos_token_id"))
    return LoadedModel(config=config, tensors=tensors, tokenizer_spec=spec, source=str(path),
                       file_dtype=dominant(elements_by_type),
                       eos_token_ids=list(dict.fromkeys(eos)),
                       bos_token_id=int(bos) if isinstance(bos, int) else None)


def _weight_files(path: Path, directory: Path) -> list[SafetensorsFile]:
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFileError(index, "has no 'weight_map'; the index is corrupt, re-download it")
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise ModelFileError(directory / missing[0], f"shard listed in {INDEX_FILE} is missing "
                                                         f"({len(missing)} of {len(names)} shards "
                                                         f"absent); download every shard")
        return [SafetensorsFile(directory / n) for n in names]
    if path.is_file():
        return [SafetensorsFile(path)]
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise ModelFileError(directory, "no .safetensors files here; download the model's weights")
    return [SafetensorsFile(s) for s in shards]


def hf_tensor_name(canonical: str) -> str:
    """HF name of a canonical name: "layers.3.wq" -> "model.layers.3.self_attn.q_proj.weight"."""
    for hf_name, name in _GLOBAL_NAMES.items():
        if name == canonical:
            return hf_name
    _, layer, kind = canonical.split(".")
    return f"model.layers.{layer}.{_HF_LAYER_NAMES[kind]}.weight"


def _canonical_name(name: str, path: Path) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER_TENSOR.fullmatch(name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        return None
    if match.group(3) == "bias":
        # Ignoring a bias would silently compute a different model.
        raise UnsupportedModelError(path, f"tensor {name!r}: biases on attention/MLP projections "
                                          f"are not supported by llama_brrr")
    return f"layers.{int(match.group(1))}.{_LAYER_NAMES[match.group(2)]}"


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(path, f"cannot read JSON ({exc}); re-download it") from exc
    if not isinstance(value, dict):
        raise ModelFileError(path, "expected a JSON object")
    return value


def _id_list(value) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _config(hf: dict, config_path: Path, lm_head_absent: bool, directory: Path):
    architectures = hf.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in architectures):
        raise UnsupportedModelError(config_path, f"architectures {architectures} are not "
                                                 f"supported; llama_brrr runs "
                                                 f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise UnsupportedModelError(config_path, "attention_bias/mlp_bias models are not supported")

    def need(key):
        if key not in hf or hf[key] is None:
            raise ModelFileError(config_path, f"config.json lacks {key!r}; the checkpoint is "
                                              f"incomplete")
        return hf[key]

    n_heads = need("num_attention_heads")
    max_seq_len = need("max_position_embeddings")
    extra = {"format": "safetensors", "architectures": architectures,
             "torch_dtype": hf.get("torch_dtype", hf.get("dtype"))}
    sliding_window = hf.get("sliding_window")
    if sliding_window and sliding_window < max_seq_len:
        # Full attention matches sliding-window attention only up to the window; cap the
        # context there instead of silently computing something else beyond it.
        extra["sliding_window"] = sliding_window
        max_seq_len = sliding_window

    tie = hf.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ModelFileError(config_path, f"config.json: tie_word_embeddings = {tie!r}, expected "
                                          f"true or false")
    rope = hf.get("rope_parameters") or {}  # transformers >= 5 folds theta and scaling in here
    rope_theta = hf.get("rope_theta") or rope.get("rope_theta") or 10000.0
    return make_config(
        config_path, dim=need("hidden_size"), hidden_dim=need("intermediate_size"),
        n_layers=need("num_hidden_layers"), n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads, vocab_size=need("vocab_size"),
        head_dim=hf.get("head_dim") or 0, max_seq_len=max_seq_len,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta),
        rope_scaling=_rope_scaling(hf.get("rope_scaling") or rope, config_path),
        tie_embeddings=tie or lm_head_absent,
        name=directory.name, extra=extra)


def _rope_scaling(scaling: dict, config_path: Path) -> dict | None:
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type in (None, "default"):
        return None
    if rope_type == "linear":
        return {"rope_type": "linear", "factor": float(scaling["factor"])}
    if rope_type == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in keys if k not in scaling]
        if missing:
            raise ModelFileError(config_path, f"llama3 rope_scaling lacks {missing}")
        return {"rope_type": "llama3", **{k: scaling[k] for k in keys}}
    raise UnsupportedModelError(config_path, f"rope scaling {rope_type!r} is not supported "
                                             f"(supported: linear, llama3)")


def _tokenizer_spec(directory: Path) -> dict:
    spec: dict = {"format": "hf"}
    for key, filename in _TOKENIZER_FILES.items():
        candidate = directory / filename
        spec[key] = str(candidate.resolve()) if candidate.is_file() else None
    spec["chat_template"] = hf_chat_template(directory, spec["tokenizer_config"])
    return spec
