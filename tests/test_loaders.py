"""Loaders: every format round-trips random canonical weights, RoPE order is pinned end to end, bad
files raise ModelFileError naming the file, and the real default model matches HF transformers."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest

from llama_brrr import fetch
from llama_brrr.config import ModelConfig
from llama_brrr.errors import ModelFileError, UnsupportedModelError
from llama_brrr.loaders import load_model
from llama_brrr.loaders.common import interleaved_to_half

Q = gguf.GGMLQuantizationType


# ----------------------------------------------------------------------------------------------
# Test models and writers (each written from the format's description, not from the loaders)

def tiny_config(**overrides) -> ModelConfig:
    # GQA, an odd vocab, and in-dims that are multiples of 32 so every GGUF quant type applies.
    fields = dict(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=67,
                  max_seq_len=32, norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=False)
    fields.update(overrides)
    return ModelConfig(**fields)


def random_tensors(config: ModelConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    tensors = {}
    for name, shape in config.tensor_shapes().items():
        if len(shape) == 1:  # norm weights live around 1
            tensors[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:  # 1/sqrt(fan_in) keeps activations O(1), so a RoPE mix-up changes logits visibly
            tensors[name] = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
    return tensors


def to_pair_order(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rotate-half rows -> adjacent-pair rows: row i of a head goes to 2i, row i + hd/2 to 2i + 1
    (what llama.cpp's converter does, and Meta's / llama2.c's native layout)."""
    head_dim = w.shape[0] // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        for i in range(head_dim // 2):
            out[h * head_dim + 2 * i] = w[h * head_dim + i]
            out[h * head_dim + 2 * i + 1] = w[h * head_dim + head_dim // 2 + i]
    return out


def file_order(config: ModelConfig, tensors: dict) -> dict:
    """The canonical tensors with q/k rows as GGUF and llama2.c store them."""
    out = dict(tensors)
    for i in range(config.n_layers):
        out[f"layers.{i}.wq"] = to_pair_order(tensors[f"layers.{i}.wq"], config.n_heads)
        out[f"layers.{i}.wk"] = to_pair_order(tensors[f"layers.{i}.wk"], config.n_kv_heads)
    return out


GGUF_LAYER = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
              "wo": "attn_output", "ffn_norm": "ffn_norm", "w1": "ffn_gate", "w3": "ffn_up",
              "w2": "ffn_down"}
HF_LAYER = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
            "wv": "self_attn.v_proj", "wo": "self_attn.o_proj",
            "ffn_norm": "post_attention_layernorm", "w1": "mlp.gate_proj", "w3": "mlp.up_proj",
            "w2": "mlp.down_proj"}


def gguf_name(canonical: str) -> str:
    top = {"tok_embeddings": "token_embd.weight", "norm": "output_norm.weight",
           "output": "output.weight"}
    if canonical in top:
        return top[canonical]
    _, layer, kind = canonical.split(".")
    return f"blk.{layer}.{GGUF_LAYER[kind]}.weight"


def hf_name(canonical: str) -> str:
    top = {"tok_embeddings": "model.embed_tokens.weight", "norm": "model.norm.weight",
           "output": "lm_head.weight"}
    if canonical in top:
        return top[canonical]
    _, layer, kind = canonical.split(".")
    return f"model.layers.{layer}.{HF_LAYER[kind]}.weight"


TOKENS = [f"tok{i}" for i in range(67)]


def add_llama_metadata(writer, config: ModelConfig) -> None:
    """The hyperparameter keys llama.cpp writes for a llama model of `config`."""
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.dim)
    writer.add_feed_forward_length(config.hidden_dim)
    writer.add_block_count(config.n_layers)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.head_dim)


def write_gguf(path: Path, config: ModelConfig, tensors: dict, qtype=Q.F32, arch="llama",
               omit=(), tweak_metadata=None, extra_tensors=None, write_head_dim=False) -> Path:
    """A llama GGUF as llama.cpp writes it: q/k in pair order, 1-D tensors F32."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny test model")
    add_llama_metadata(writer, config)
    if write_head_dim:
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS[:config.vocab_size])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_token_merges(["t o", "to k"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{{ messages }}")
    if tweak_metadata is not None:
        tweak_metadata(writer)
    for name, array in file_order(config, tensors).items():
        if name in omit:
            continue
        if array.ndim == 1 or qtype == Q.F32:
            writer.add_tensor(gguf_name(name), array.astype(np.float32))
        elif qtype == Q.F16:
            writer.add_tensor(gguf_name(name), array.astype(np.float16))
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


SAFETENSORS_DTYPE = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                     np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float64): "F64",
                     np.dtype(np.int32): "I32"}


def write_safetensors(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in arrays.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPE[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)
    return path


def hf_config(config: ModelConfig, **overrides) -> dict:
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": config.dim, "intermediate_size": config.hidden_dim,
           "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
           "num_key_value_heads": config.n_kv_heads, "head_dim": config.head_dim,
           "rms_norm_eps": config.norm_eps, "rope_theta": config.rope_theta, "rope_scaling": None,
           "max_position_embeddings": config.max_seq_len,
           "tie_word_embeddings": config.tie_embeddings, "vocab_size": config.vocab_size,
           "bos_token_id": 1, "eos_token_id": 2}
    out.update(overrides)
    return out


def write_hf_dir(directory: Path, config: ModelConfig, tensors: dict, dtype=np.float32,
                 shards: int = 1, config_overrides=None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    fields = hf_config(config, **(config_overrides or {}))
    (directory / "config.json").write_text(json.dumps(fields))
    named = {hf_name(k): v.astype(dtype) for k, v in tensors.items()}
    names = list(named)
    if shards == 1:
        write_safetensors(directory / "model.safetensors", named)
    else:
        weight_map = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            write_safetensors(directory / file, {n: named[n] for n in part})
            weight_map.update({n: file for n in part})
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def write_llama2c(path: Path, config: ModelConfig, tensors: dict, version: int,
                  group_size: int = 32, rng=None) -> Path:
    """llama2.c's export.py layouts (legacy_export, version1_export, version2_export)."""
    t = file_order(config, tensors)
    L = range(config.n_layers)

    def per_layer(kind):
        return [t[f"layers.{i}.{kind}"] for i in L]

    shared = config.tie_embeddings
    ints = [config.dim, config.hidden_dim, config.n_layers, config.n_heads, config.n_kv_heads,
            config.vocab_size, config.max_seq_len]
    with open(path, "wb") as f:
        if version == 0:
            ints[5] = config.vocab_size if shared else -config.vocab_size
            f.write(struct.pack("<7i", *ints))
            rope_tables = rng.standard_normal((2, config.max_seq_len, config.head_dim // 2))
            order = ([t["tok_embeddings"]] + per_layer("attn_norm") + per_layer("wq")
                     + per_layer("wk") + per_layer("wv") + per_layer("wo") + per_layer("ffn_norm")
                     + per_layer("w1") + per_layer("w2") + per_layer("w3") + [t["norm"]]
                     + [rope_tables] + ([] if shared else [t["output"]]))
            for w in order:
                f.write(np.asarray(w, dtype="<f4").tobytes())
            return path
        f.write(struct.pack("<Ii7iB", 0x616B3432, version, *ints, int(shared)))
        if version == 2:
            f.write(struct.pack("<i", group_size))
        f.write(b"\0" * (256 - f.tell()))
        norms = per_layer("attn_norm") + per_layer("ffn_norm") + [t["norm"]]
        matrices = ([t["tok_embeddings"]] + per_layer("wq") + per_layer("wk") + per_layer("wv")
                    + per_layer("wo") + per_layer("w1") + per_layer("w2") + per_layer("w3")
                    + ([] if shared else [t["output"]]))
        for w in norms:
            f.write(np.asarray(w, dtype="<f4").tobytes())
        if version == 1:
            for w in matrices:
                f.write(np.asarray(w, dtype="<f4").tobytes())
            return path
        scales = []
        for w in matrices:
            groups = w.reshape(-1, group_size)
            scale = np.abs(groups).max(axis=1) / 127.0
            f.write(np.round(groups / scale[:, None]).astype(np.int8).tobytes())
            scales.append(scale.astype("<f4"))
        for s in scales:
            f.write(s.tobytes())
    return path


def llama2c_q8(w: np.ndarray, group_size: int) -> np.ndarray:
    groups = w.reshape(-1, group_size)
    scale = (np.abs(groups).max(axis=1) / 127.0).astype(np.float32)
    return (np.round(groups / scale[:, None]).astype(np.int8) * scale[:, None]).reshape(w.shape)


# ----------------------------------------------------------------------------------------------
# An independent numpy Llama, with either RoPE pairing, to pin the q/k convention end to end

def numpy_logits(config: ModelConfig, tensors: dict, ids: list[int], rope: str) -> np.ndarray:
    """Logits [T, V] in float64. rope="half" pairs (i, i + hd/2); rope="pairs" pairs (2i, 2i+1)."""
    t = {k: np.asarray(v, dtype=np.float64) for k, v in tensors.items()}
    hd, T = config.head_dim, len(ids)
    inv_freq = config.rope_theta ** (-np.arange(0, hd, 2) / hd)
    angles = np.arange(T)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]

    def rotate(x):  # x [T, heads, hd]
        if rope == "half":
            a, b = x[..., :hd // 2], x[..., hd // 2:]
            return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
        return out

    def rmsnorm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + config.norm_eps) * w

    x = t["tok_embeddings"][ids]
    group = config.n_heads // config.n_kv_heads
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for i in range(config.n_layers):
        p = f"layers.{i}."
        h = rmsnorm(x, t[p + "attn_norm"])
        q = rotate((h @ t[p + "wq"].T).reshape(T, config.n_heads, hd))
        k = rotate((h @ t[p + "wk"].T).reshape(T, config.n_kv_heads, hd))
        v = (h @ t[p + "wv"].T).reshape(T, config.n_kv_heads, hd)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(T, -1)
        x = x + attn @ t[p + "wo"].T
        h = rmsnorm(x, t[p + "ffn_norm"])
        gate = h @ t[p + "w1"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ t[p + "w3"].T)) @ t[p + "w2"].T
    head = t["tok_embeddings"] if config.tie_embeddings else t["output"]
    return rmsnorm(x, t["norm"]) @ head.T


def assert_same_tensors(loaded, expected: dict, dtype=None):
    assert set(loaded.tensors) == set(expected)
    for name, want in expected.items():
        got = loaded.tensors[name]
        want = want if dtype is None else want.astype(dtype)
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert np.array_equal(got, want), name


# ----------------------------------------------------------------------------------------------
# The permutation itself

@pytest.mark.parametrize("n_heads,head_dim,cols", [(1, 2, 1), (3, 6, 5), (4, 16, 7)])
def test_interleaved_to_half_moves_each_row_where_rope_pairs_it(n_heads, head_dim, cols, rng):
    w = rng.standard_normal((n_heads * head_dim, cols)).astype(np.float32)
    out = interleaved_to_half(w, n_heads)
    half = head_dim // 2
    for h in range(n_heads):
        for r in range(head_dim):
            source = 2 * r if r < half else 2 * (r - half) + 1
            assert np.array_equal(out[h * head_dim + r], w[h * head_dim + source])
    assert np.array_equal(interleaved_to_half(to_pair_order(w, n_heads), n_heads), w)


def test_interleaved_to_half_keeps_bfloat16(rng):
    w = rng.standard_normal((8, 3)).astype(ml_dtypes.bfloat16)
    out = interleaved_to_half(to_pair_order(w, 2), 2)
    assert out.dtype == w.dtype and np.array_equal(out, w)


# ----------------------------------------------------------------------------------------------
# GGUF

@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("qtype,dtype", [(Q.F32, np.float32), (Q.F16, np.float16),
                                         (Q.BF16, ml_dtypes.bfloat16)], ids=["F32", "F16", "BF16"])
def test_gguf_round_trip_float_types(tmp_path, rng, qtype, dtype, tied):
    config = tiny_config(tie_embeddings=tied)
    tensors = random_tensors(config, rng)
    path = write_gguf(tmp_path / "m.gguf", config, tensors, qtype=qtype)
    loaded = load_model(path)
    expected = {k: (v if v.ndim == 1 else v.astype(dtype)) for k, v in tensors.items()}
    assert_same_tensors(loaded, expected)
    assert loaded.config.tie_embeddings == tied
    assert loaded.file_dtype == qtype.name
    for field in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                  "head_dim", "max_seq_len", "rope_theta"):
        assert getattr(loaded.config, field) == getattr(config, field), field
    assert loaded.config.norm_eps == pytest.approx(config.norm_eps, rel=1e-6)
    assert loaded.config.rope_scaling is None


# Error bound of one value: one quantization step of its 32-value block (Q4_0 clips one side of
# its range by a full step), plus the fp16 rounding of the stored scale/offset times the range.
def quant_error_bound(w: np.ndarray, qtype) -> np.ndarray:
    blocks = w.reshape(w.shape[0], -1, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    spread = blocks.max(axis=-1, keepdims=True) - blocks.min(axis=-1, keepdims=True)
    step = {Q.Q8_0: amax / 127, Q.Q4_0: amax / 8, Q.Q4_1: spread / 15}[qtype]
    bound = step + 4 * amax * 2.0 ** -11
    return np.broadcast_to(bound, blocks.shape).reshape(w.shape)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_gguf_quantized_types_dequantize_within_quantization_error(tmp_path, rng, qtype):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    loaded = load_model(write_gguf(tmp_path / "q.gguf", config, tensors, qtype=qtype))
    assert loaded.file_dtype == qtype.name
    as_stored = file_order(config, tensors)
    for name, want in tensors.items():
        got = loaded.tensors[name]
        assert got.dtype == np.float32 and got.shape == want.shape, name
        if want.ndim == 1:
            assert np.array_equal(got, want), name
            continue
        assert np.all(np.abs(got - want) <= quant_error_bound(want, qtype)), name
        # And bit-exact against gguf's own dequantization of the stored rows, put back in order.
        stored = gguf.quants.dequantize(gguf.quants.quantize(as_stored[name], qtype), qtype)
        if name.endswith(".wq"):
            stored = interleaved_to_half(stored, config.n_heads)
        elif name.endswith(".wk"):
            stored = interleaved_to_half(stored, config.n_kv_heads)
        assert np.array_equal(got, stored), name


def test_gguf_rope_order_is_undone_end_to_end(tmp_path, rng):
    """What a GGUF model computes with adjacent-pair RoPE on its stored weights, the loaded model
    computes with rotate-half RoPE: the loader's permutation is the right one."""
    config = tiny_config(n_layers=1, vocab_size=41)
    tensors = random_tensors(config, rng)
    loaded = load_model(write_gguf(tmp_path / "m.gguf", config, tensors))
    ids = rng.integers(0, config.vocab_size, size=7).tolist()
    as_stored = numpy_logits(config, file_order(config, tensors), ids, rope="pairs")
    as_loaded = numpy_logits(loaded.config, loaded.tensors, ids, rope="half")
    np.testing.assert_allclose(as_loaded, as_stored, rtol=0, atol=1e-4)
    # The check has teeth: the stored rows read in the wrong convention give other logits.
    wrong = numpy_logits(config, file_order(config, tensors), ids, rope="half")
    assert np.abs(wrong - as_stored).max() > 1e-2


def test_gguf_metadata_head_dim_and_tokenizer(tmp_path, rng):
    config = tiny_config(n_heads=2, n_kv_heads=1, head_dim=48)  # head_dim != dim / n_heads
    tensors = random_tensors(config, rng)
    path = write_gguf(tmp_path / "hd.gguf", config, tensors, write_head_dim=True,
                      tweak_metadata=lambda w: w.add_eot_token_id(5))
    loaded = load_model(path)
    assert loaded.config.head_dim == 48 and loaded.config.q_dim == 96
    assert_same_tensors(loaded, tensors)
    spec = loaded.tokenizer_spec
    assert spec["format"] == "gguf" and spec["model"] == "gpt2" and spec["pre"] == "smollm"
    assert spec["tokens"] == TOKENS[:config.vocab_size]
    assert spec["merges"] == ["t o", "to k"]
    assert spec["token_type"] == [1] * config.vocab_size
    assert spec["bos_token_id"] == 1 and spec["eos_token_id"] == 2
    assert spec["add_bos_token"] is False and spec["add_eos_token"] is None
    assert spec["chat_template"] == "{{ messages }}"
    assert loaded.bos_token_id == 1 and loaded.eos_token_ids == [2, 5]
    assert loaded.source == str(path)


def gguf_llama3_divisors(factor, low, high, original, head_dim, theta):
    """llama.cpp convert_hf_to_gguf's rope_freqs for Llama 3 scaling, one frequency at a time."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi / (theta ** (-i / head_dim))
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("factor,low,high,original", [(32.0, 1.0, 4.0, 8192), (8.0, 1.0, 4.0, 8192),
                                                      (16.0, 2.0, 8.0, 4096)])
def test_gguf_llama3_rope_freqs_tensor_becomes_rope_scaling(tmp_path, rng, factor, low, high,
                                                            original):
    config = tiny_config(n_heads=1, n_kv_heads=1, rope_theta=500000.0)  # head_dim 64
    divisors = gguf_llama3_divisors(factor, low, high, original, config.head_dim, config.rope_theta)
    assert ((divisors > 1) & (divisors < factor)).sum() >= 2  # the band is exercised
    path = write_gguf(tmp_path / "l3.gguf", config, random_tensors(config, rng),
                      extra_tensors={"rope_freqs.weight": divisors})
    scaling = load_model(path).config.rope_scaling
    assert scaling["rope_type"] == "llama3"
    assert scaling["factor"] == pytest.approx(factor)
    assert scaling["original_max_position_embeddings"] == 8192
    # Only low/original and high/original are determined by the tensor; they must match.
    assert scaling["low_freq_factor"] / 8192 == pytest.approx(low / original, rel=1e-3)
    assert scaling["high_freq_factor"] / 8192 == pytest.approx(high / original, rel=1e-3)


def test_gguf_rope_freqs_that_are_not_llama3_are_rejected(tmp_path, rng):
    config = tiny_config(n_heads=1, n_kv_heads=1, rope_theta=500000.0)
    divisors = np.linspace(1.0, 9.0, config.head_dim // 2).astype(np.float32)[::-1].copy()
    path = write_gguf(tmp_path / "odd.gguf", config, random_tensors(config, rng),
                      extra_tensors={"rope_freqs.weight": divisors})
    with pytest.raises(UnsupportedModelError, match="odd.gguf.*Llama 3"):
        load_model(path)


def test_gguf_linear_rope_scaling(tmp_path, rng):
    config = tiny_config()

    def linear(writer):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(4.0)

    path = write_gguf(tmp_path / "lin.gguf", config, random_tensors(config, rng),
                      tweak_metadata=linear)
    assert load_model(path).config.rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_gguf_yarn_scaling_is_unsupported(tmp_path, rng):
    config = tiny_config()

    def yarn(writer):
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)

    path = write_gguf(tmp_path / "yarn.gguf", config, random_tensors(config, rng),
                      tweak_metadata=yarn)
    with pytest.raises(UnsupportedModelError, match="yarn.gguf.*yarn"):
        load_model(path)


def test_progress_callback_counts_every_tensor(tmp_path, rng):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    total = len(config.tensor_shapes())
    calls = []
    load_model(write_hf_dir(tmp_path / "hf", config, tensors),
               progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i, total) for i in range(1, total + 1)]
    # A GGUF reads no tensor at load (they stream into the engine later): one call, all done.
    calls.clear()
    load_model(write_gguf(tmp_path / "m.gguf", config, tensors),
               progress=lambda done, total: calls.append((done, total)))
    assert calls == [(total, total)]


# ----------------------------------------------------------------------------------------------
# safetensors

@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shards", [1, 3])
def test_safetensors_round_trip(tmp_path, rng, dtype, shards, tied):
    config = tiny_config(tie_embeddings=tied)
    tensors = random_tensors(config, rng)
    directory = write_hf_dir(tmp_path / "hf", config, tensors, dtype=dtype, shards=shards)
    loaded = load_model(directory)
    assert_same_tensors(loaded, tensors, dtype=dtype)
    assert loaded.config.tie_embeddings == tied
    assert loaded.file_dtype == SAFETENSORS_DTYPE[np.dtype(dtype)]
    assert loaded.eos_token_ids == [2] and loaded.bos_token_id == 1
    # Straight from the file: a read-only map, not a copy.
    assert not loaded.tensors["layers.0.wq"].flags.writeable


def test_safetensors_single_file_with_config_beside_it(tmp_path, rng):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    directory = write_hf_dir(tmp_path / "hf", config, tensors)
    assert_same_tensors(load_model(directory / "model.safetensors"), tensors)
    assert_same_tensors(load_model(directory / "config.json"), tensors)


def test_safetensors_untied_config_without_lm_head_is_tied(tmp_path, rng):
    config = tiny_config(tie_embeddings=True)
    tensors = random_tensors(config, rng)
    directory = write_hf_dir(tmp_path / "hf", config, tensors,
                             config_overrides={"tie_word_embeddings": False})
    assert load_model(directory).config.tie_embeddings


def test_safetensors_config_fields_tokenizer_files_and_generation_eos(tmp_path, rng):
    config = tiny_config()
    llama3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    directory = write_hf_dir(tmp_path / "hf", config, random_tensors(config, rng),
                             config_overrides={"rope_scaling": llama3, "rope_theta": 500000.0,
                                               "rms_norm_eps": 1e-6, "eos_token_id": [2, 9]})
    (directory / "tokenizer.json").write_text("{}")
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": "T{{x}}"}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    loaded = load_model(directory)
    assert loaded.config.rope_scaling == llama3
    assert loaded.config.rope_theta == 500000.0 and loaded.config.norm_eps == 1e-6
    assert loaded.eos_token_ids == [7, 2, 9]
    spec = loaded.tokenizer_spec
    assert spec["format"] == "hf" and spec["chat_template"] == "T{{x}}"
    assert spec["tokenizer_json"] == str((directory / "tokenizer.json").resolve())
    assert spec["tokenizer_model"] is None
    (directory / "chat_template.jinja").write_text("J{{y}}")
    assert load_model(directory).tokenizer_spec["chat_template"] == "J{{y}}"


def test_transformers5_rope_parameters(tmp_path, rng):
    config = tiny_config()
    directory = write_hf_dir(tmp_path / "hf", config, random_tensors(config, rng),
                             config_overrides={"rope_theta": None, "rope_scaling": None,
                                               "rope_parameters": {"rope_type": "linear",
                                                                   "factor": 2.0,
                                                                   "rope_theta": 1234.0}})
    loaded = load_model(directory)
    assert loaded.config.rope_theta == 1234.0
    assert loaded.config.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_gguf_and_safetensors_of_one_model_agree_end_to_end(tmp_path, rng):
    """Same canonical weights through both formats: identical tensors, and the same logits from
    the independent numpy model and (when present) llama_brrr.reference.ReferenceLlama."""
    config = tiny_config(n_layers=2, vocab_size=53)
    tensors = random_tensors(config, rng)
    from_gguf = load_model(write_gguf(tmp_path / "m.gguf", config, tensors))
    from_hf = load_model(write_hf_dir(tmp_path / "hf", config, tensors))
    assert_same_tensors(from_gguf, from_hf.tensors)
    ids = rng.integers(0, config.vocab_size, size=9).tolist()
    expected = numpy_logits(config, tensors, ids, rope="half")
    np.testing.assert_allclose(numpy_logits(from_gguf.config, from_gguf.tensors, ids, "half"),
                               expected, rtol=0, atol=1e-4)

    reference = pytest.importorskip("llama_brrr.reference")
    logits = []
    for loaded in (from_gguf, from_hf):
        out = reference.ReferenceLlama(loaded.config, loaded.tensors).forward(ids)
        out = out.detach().cpu().numpy() if hasattr(out, "detach") else np.asarray(out)
        assert out.shape == (1, len(ids), config.vocab_size)
        logits.append(out[0])
    np.testing.assert_array_equal(logits[0], logits[1])
    np.testing.assert_allclose(logits[0], expected, rtol=0, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# llama2.c

@pytest.mark.parametrize("version,tied", [(0, True), (0, False), (1, True), (1, False)])
def test_llama2c_round_trip(tmp_path, rng, version, tied):
    config = tiny_config(tie_embeddings=tied, vocab_size=37, max_seq_len=24)
    tensors = random_tensors(config, rng)
    path = write_llama2c(tmp_path / "model.bin", config, tensors, version, rng=rng)
    (tmp_path / "tokenizer.bin").write_bytes(b"\0" * 16)
    loaded = load_model(path)
    assert_same_tensors(loaded, tensors)
    assert loaded.config.max_seq_len == 24 and loaded.config.tie_embeddings == tied
    assert loaded.config.rope_theta == 10000.0 and loaded.config.norm_eps == 1e-5
    assert loaded.tokenizer_spec == {"format": "llama2c",
                                     "tokenizer_bin": str((tmp_path / "tokenizer.bin").resolve()),
                                     "vocab_size": config.vocab_size}
    assert loaded.file_dtype == "F32" and loaded.bos_token_id == 1


@pytest.mark.parametrize("tied", [True, False])
def test_llama2c_v2_int8_groups(tmp_path, rng, tied):
    config = tiny_config(tie_embeddings=tied, vocab_size=40)
    tensors = random_tensors(config, rng)
    path = write_llama2c(tmp_path / "q.bin", config, tensors, version=2, group_size=32)
    tokenizer = tmp_path / "elsewhere" / "tok.bin"  # the loader only locates it
    tokenizer.parent.mkdir()
    tokenizer.write_bytes(b"x")
    loaded = load_model(path, tokenizer_path=tokenizer)
    expected = {k: (v if v.ndim == 1 else llama2c_q8(v, 32)) for k, v in tensors.items()}
    for name, want in expected.items():
        np.testing.assert_allclose(loaded.tensors[name], want, rtol=1e-6, atol=0, err_msg=name)
    assert loaded.file_dtype == "Q8_0"


def test_llama2c_rope_order_is_undone_end_to_end(tmp_path, rng):
    config = tiny_config(n_layers=1, vocab_size=29)
    tensors = random_tensors(config, rng)
    path = write_llama2c(tmp_path / "m.bin", config, tensors, version=1)
    (tmp_path / "tokenizer.bin").write_bytes(b"x")
    loaded = load_model(path)
    ids = rng.integers(0, config.vocab_size, size=6).tolist()
    np.testing.assert_allclose(numpy_logits(loaded.config, loaded.tensors, ids, "half"),
                               numpy_logits(config, file_order(config, tensors), ids, "pairs"),
                               rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# Bad input: always ModelFileError (or a subclass) naming the file

def raises_naming(path: Path, error=ModelFileError, match=""):
    return pytest.raises(error, match=rf"{path.name}.*{match}" if match else path.name)


def test_missing_paths(tmp_path):
    for name in ("nothing.gguf", "nothing.bin", "nothing"):
        with raises_naming(tmp_path / name, match="no such file"):
            load_model(tmp_path / name)


def test_empty_directory_and_unknown_file(tmp_path):
    with raises_naming(tmp_path, match="no model"):
        load_model(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with raises_naming(tmp_path / "notes.txt", match="unrecognized"):
        load_model(tmp_path / "notes.txt")


def test_wrong_magic(tmp_path):
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"GGML" + bytes(100))
    with raises_naming(bad, match="not a GGUF file"):
        load_model(bad)
    pickle = tmp_path / "pytorch_model.bin"
    pickle.write_bytes(b"PK\x03\x04" + bytes(100))
    with raises_naming(pickle, match="zip"):
        load_model(pickle)


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with raises_naming(empty, match="empty"):
        load_model(empty)


def test_truncated_gguf(tmp_path, rng):
    config = tiny_config()
    full = write_gguf(tmp_path / "full.gguf", config, random_tensors(config, rng)).read_bytes()
    for cut in (6, 40, 300, len(full) // 2, len(full) - 3):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(full[:cut])
        with raises_naming(path, match="truncated or corrupt"):
            load_model(path)


def test_truncated_safetensors(tmp_path, rng):
    config = tiny_config()
    directory = write_hf_dir(tmp_path / "hf", config, random_tensors(config, rng))
    file = directory / "model.safetensors"
    full = file.read_bytes()
    for cut in (5, 12, len(full) - 1):
        file.write_bytes(full[:cut])
        with raises_naming(file, match="truncated"):
            load_model(directory)


def test_safetensors_missing_shard_and_garbage_header(tmp_path, rng):
    config = tiny_config()
    directory = write_hf_dir(tmp_path / "hf", config, random_tensors(config, rng), shards=2)
    shard = directory / "model-00002-of-00002.safetensors"
    full = shard.read_bytes()
    shard.unlink()
    with raises_naming(shard, match="missing"):
        load_model(directory)
    shard.write_bytes(full[:8] + b"{" * (len(full) - 8))
    with raises_naming(shard, match="JSON"):
        load_model(directory)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_truncated_or_padded_llama2c(tmp_path, rng, version):
    config = tiny_config()
    path = write_llama2c(tmp_path / "m.bin", config, random_tensors(config, rng), version, rng=rng)
    (tmp_path / "tokenizer.bin").write_bytes(b"x")
    full = path.read_bytes()
    path.write_bytes(full[:-4])
    with raises_naming(path, match="truncated"):
        load_model(path)
    path.write_bytes(full + b"\0")
    with raises_naming(path, match="extra bytes"):
        load_model(path)
    path.write_bytes(full[:20])
    with raises_naming(path):
        load_model(path)


def test_llama2c_garbage_header(tmp_path):
    path = tmp_path / "junk.bin"
    path.write_bytes(struct.pack("<7i", 5, -3, 0, 7, 2, 100, 0) + bytes(64))
    with raises_naming(path, match="not a llama2.c checkpoint"):
        load_model(path)


def test_llama2c_missing_tokenizer(tmp_path, rng):
    config = tiny_config()
    path = write_llama2c(tmp_path / "m.bin", config, random_tensors(config, rng), version=1)
    with raises_naming(tmp_path / "tokenizer.bin", match="tokenizer not found.*m.bin"):
        load_model(path)
    with raises_naming(tmp_path / "elsewhere.bin", match="tokenizer not found"):
        load_model(path, tokenizer_path=tmp_path / "elsewhere.bin")


def test_llama2c_unknown_version(tmp_path):
    path = tmp_path / "v9.bin"
    path.write_bytes(struct.pack("<Ii", 0x616B3432, 9) + bytes(300))
    with raises_naming(path, UnsupportedModelError, match="version 9"):
        load_model(path)


def test_unknown_gguf_tensor_type(tmp_path, rng):
    config = tiny_config()
    path = write_gguf(tmp_path / "t99.gguf", config, random_tensors(config, rng))
    raw = bytearray(path.read_bytes())
    # Tensor info: name, n_dims (u32), dims (u64 each), type (u32), offset (u64).
    name = b"output_norm.weight"
    type_at = raw.index(name) + len(name) + 4 + 8 * 1
    assert struct.unpack_from("<I", raw, type_at)[0] == Q.F32
    struct.pack_into("<I", raw, type_at, 99)
    path.write_bytes(bytes(raw))
    with raises_naming(path, UnsupportedModelError, match="99"):
        load_model(path)


def test_unsupported_architecture(tmp_path, rng):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    path = write_gguf(tmp_path / "gpt.gguf", config, tensors, arch="gpt2")
    with raises_naming(path, UnsupportedModelError, match="'gpt2'"):
        load_model(path)
    directory = write_hf_dir(tmp_path / "qwen", config, tensors,
                             config_overrides={"architectures": ["Qwen2ForCausalLM"]})
    with raises_naming(directory / "config.json", UnsupportedModelError, match="Qwen2ForCausalLM"):
        load_model(directory)


def test_unsupported_dtypes(tmp_path, rng):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    path = write_gguf(tmp_path / "ints.gguf", config, tensors,
                      omit=("layers.1.wv",),
                      extra_tensors={"blk.1.attn_v.weight": np.ones((config.kv_dim, config.dim),
                                                                    dtype=np.int8)})
    with raises_naming(path, UnsupportedModelError, match="blk.1.attn_v.weight.*I8"):
        load_model(path)
    directory = write_hf_dir(tmp_path / "hf", config, tensors)
    named = {hf_name(k): v for k, v in tensors.items()}
    named["model.layers.0.self_attn.k_proj.weight"] = named[
        "model.layers.0.self_attn.k_proj.weight"].astype(np.float64)
    write_safetensors(directory / "model.safetensors", named)
    with raises_naming(directory / "model.safetensors", UnsupportedModelError,
                       match="k_proj.weight.*F64"):
        load_model(directory)


def test_shape_contradicting_config(tmp_path, rng):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    path = write_gguf(tmp_path / "ffn.gguf", config, tensors, omit=("layers.0.w3",),
                      extra_tensors={"blk.0.ffn_up.weight": np.ones((config.hidden_dim + 1,
                                                                     config.dim), np.float32)})
    with raises_naming(path, match=r"blk.0.ffn_up.weight.*\(97, 64\).*\(96, 64\)"):
        load_model(path)
    directory = write_hf_dir(tmp_path / "hf", config, tensors,
                             config_overrides={"intermediate_size": 100})
    with raises_naming(directory, match=r"gate_proj.weight.*\(96, 64\).*\(100, 64\)"):
        load_model(directory)


def test_missing_tensor(tmp_path, rng):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    path = write_gguf(tmp_path / "holes.gguf", config, tensors, omit=("layers.1.w3",))
    with raises_naming(path, match="missing tensor.*blk.1.ffn_up.weight"):
        load_model(path)
    del tensors["layers.0.wo"]
    directory = write_hf_dir(tmp_path / "hf", config, tensors)
    with raises_naming(directory, match="missing tensor.*o_proj"):
        load_model(directory)


def test_projection_biases_are_refused_not_ignored(tmp_path, rng):
    config = tiny_config()
    path = write_gguf(tmp_path / "bias.gguf", config, random_tensors(config, rng),
                      extra_tensors={"blk.0.attn_q.bias": np.zeros(config.q_dim, np.float32)})
    with raises_naming(path, UnsupportedModelError, match="bias"):
        load_model(path)


# A changed byte anywhere in the name: its tail, its prefix (the fuzzer's "lm_]ead.weight"), or
# one that leaves nothing of "lm_head" (the head's shape gives it away).
@pytest.mark.parametrize("damaged", ["lm_head.weigh,", "lm_]ead.weight", "l{_head.weight", "xx"])
def test_a_damaged_lm_head_name_is_an_error_not_a_tied_model(tmp_path, rng, damaged):
    """Without lm_head.weight a checkpoint reads as tied; with the head under a damaged name (a
    changed byte of the JSON header) it must not."""
    config = tiny_config()
    tensors = random_tensors(config, rng)
    directory = write_hf_dir(tmp_path / "hf", config, tensors)
    named = {hf_name(k): v for k, v in tensors.items()}
    named[damaged] = named.pop("lm_head.weight")
    write_safetensors(directory / "model.safetensors", named)
    with raises_naming(directory / "model.safetensors", match=re.escape(repr(damaged))):
        load_model(directory)


def test_unknown_extra_tensors_are_ignored(tmp_path, rng):
    config = tiny_config()
    tensors = random_tensors(config, rng)
    directory = write_hf_dir(tmp_path / "hf", config, tensors)
    named = {hf_name(k): v for k, v in tensors.items()}
    named["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    named["model.something_else"] = np.ones((2, 2), np.int32)
    write_safetensors(directory / "model.safetensors", named)
    assert_same_tensors(load_model(directory), tensors)


# ----------------------------------------------------------------------------------------------
# The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF)

@pytest.fixture(scope="module")
def default_model_file() -> Path:
    path = fetch.local_default_model()
    if path is None:
        pytest.skip(f"default model not on disk: run `python weights/fetch.py` (puts it at "
                    f"{fetch.default_model_path()}) or set {fetch.DEFAULT_MODEL_ENV}")
    return path


@pytest.fixture(scope="module")
def default_model(default_model_file):
    return load_model(default_model_file)


def test_default_model_config_and_tokenizer(default_model):
    c = default_model.config
    assert (c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim) == (
        576, 1536, 30, 9, 3, 64)
    assert c.vocab_size == 49152 and c.tie_embeddings and c.rope_scaling is None
    assert c.rope_theta == 100000.0 and c.norm_eps == pytest.approx(1e-5)
    assert default_model.file_dtype == "Q4_1"
    spec = default_model.tokenizer_spec
    assert spec["model"] == "gpt2" and spec["pre"] == "smollm" and len(spec["tokens"]) == 49152
    assert "<|im_start|>" in spec["chat_template"]
    assert spec["tokens"][default_model.eos_token_ids[0]] == "<|im_end|>"
    assert spec["tokens"][default_model.bos_token_id] == "<|im_start|>"
    assert set(default_model.tensors) == set(c.tensor_shapes())


@pytest.mark.slow
def test_default_model_matches_transformers_gguf_loader(default_model_file, default_model):
    """HF transformers reads the same GGUF (its own metadata mapping and q/k un-permutation):
    every tensor must be identical, and the model it builds must give our tensors' logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(default_model_file.parent), gguf_file=default_model_file.name, dtype=torch.float32)
    state = hf.state_dict()
    for name, ours in default_model.tensors.items():
        theirs = state[hf_name(name)].numpy()
        assert np.array_equal(np.asarray(ours, dtype=np.float32), theirs), name
    ids = [1, 504, 3458, 282, 4649, 314, 198, 2]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0].numpy()
    ours = numpy_logits(default_model.config, default_model.tensors, ids, rope="half")
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# damage caught at load (docs/design.md, quantized weights: checked at load)

def test_huge_layer_count_is_refused_at_once(tmp_path, rng):
    import time

    config = tiny_config()
    path = write_gguf(tmp_path / "layers.gguf", config, random_tensors(config, rng),
                      tweak_metadata=lambda w: w.add_uint32("llama.block_count", 2**31 - 1))
    start = time.perf_counter()
    with raises_naming(path, match="2147483647 layers but the file holds tensors for 2"):
        load_model(path)
    assert time.perf_counter() - start < 2.0


def test_safetensors_header_length_a_few_bytes_short(tmp_path, rng):
    config = tiny_config()
    directory = write_hf_dir(tmp_path / "hf", config, random_tensors(config, rng))
    path = directory / "model.safetensors"
    raw = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    # The writer pads the JSON with spaces to a multiple of 8, so a length cut by up to 7 bytes may
    # still parse; the tensors would then all be read a few bytes off.
    for cut in range(1, 8):
        damaged = tmp_path / f"cut{cut}" / "model.safetensors"
        damaged.parent.mkdir()
        (damaged.parent / "config.json").write_text((directory / "config.json").read_text())
        damaged.write_bytes(struct.pack("<Q", length - cut) + bytes(raw[8:]))
        with pytest.raises(ModelFileError, match="cut%d.*(not valid JSON|the file is corrupt)" % cut):
            load_model(damaged.parent)


@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_nan_in_a_float_tensor_is_refused_at_load(tmp_path, rng, kind):
    from llama_brrr import Llama

    config = tiny_config()
    tensors = random_tensors(config, rng)
    tensors["layers.1.w2"][7, 3] = np.inf
    if kind == "gguf":
        path, file_name = write_gguf(tmp_path / "nan.gguf", config, tensors), "blk.1.ffn_down.weight"
    else:
        path, file_name = write_hf_dir(tmp_path / "hf", config, tensors), "layers.1.w2"
    with pytest.raises(ModelFileError, match=rf"{file_name}.*NaN or inf values \(row 7\)"):
        Llama.from_pretrained(str(path), device="cpu", progress=False, max_seq_len=16)
