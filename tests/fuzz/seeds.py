"""Small valid model files the fuzzer starts from, written here (random weights, tiny shapes).

Every seed loads and generates in a few milliseconds, so thousands of mutated copies are cheap:

    gguf-f32      GGUF, f32 matrices, byte-level BPE vocabulary with merges, a chat template
    gguf-q8_0     the same with Q8_0 matrices (block-scale quantization: scales are fuzz targets)
    gguf-q4_0     Q4_0 matrices, tied embeddings (no output.weight)
    safetensors   a Hugging Face directory: config.json, model.safetensors, tokenizer.json
    llama2c-v0    a legacy llama2.c checkpoint (7 int32 header) + tokenizer.bin
    llama2c-v1    the versioned llama2.c layout (256-byte header, "ak42")
    default       the default model (SmolLM2-135M Q4_1), when it is on disk

Weights are N(0, 1/fan_in) (norms 1 + N(0, 0.2)), so logits are O(1) and any misread tensor
changes the greedy tokens.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, CONTEXT = 64, 96, 2, 4, 2, 64
LAYER_KINDS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3")
GGUF_LAYER = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
              "ffn_norm": "ffn_norm", "w1": "ffn_gate", "w3": "ffn_up", "w2": "ffn_down"}
HF_LAYER = {"attn_norm": "input_layernorm", "wq": "self_attn.q_proj", "wk": "self_attn.k_proj",
            "wv": "self_attn.v_proj", "wo": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "w1": "mlp.gate_proj", "w3": "mlp.up_proj", "w2": "mlp.down_proj"}
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@dataclass
class Seed:
    name: str
    kind: str          # "gguf" | "safetensors" | "llama2c"
    path: Path         # what Llama.from_pretrained gets
    files: dict        # role -> file path the mutators may change ("model", "config", "tokenizer")


def byte_level_vocabulary() -> tuple[list[str], list[str]]:
    """Three special tokens, the 256 byte-level characters, and merged tokens for "the", " the",
    "hello", " world": 270 tokens."""
    from llama_brrr.tokenizer import byte_level_alphabet

    alphabet = byte_level_alphabet()
    merges = ["t h", "th e", "Ġ the", "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [alphabet[b] for b in range(256)]
    tokens += [m.replace(" ", "") for m in merges]
    return tokens, merges


def shapes(vocab: int, tied: bool) -> dict[str, tuple[int, ...]]:
    head_dim = DIM // HEADS
    out = {"tok_embeddings": (vocab, DIM)}
    for i in range(LAYERS):
        out.update({f"layers.{i}.attn_norm": (DIM,), f"layers.{i}.wq": (DIM, DIM),
                    f"layers.{i}.wk": (KV_HEADS * head_dim, DIM), f"layers.{i}.wv": (KV_HEADS * head_dim, DIM),
                    f"layers.{i}.wo": (DIM, DIM), f"layers.{i}.ffn_norm": (DIM,),
                    f"layers.{i}.w1": (HIDDEN, DIM), f"layers.{i}.w3": (HIDDEN, DIM),
                    f"layers.{i}.w2": (DIM, HIDDEN)})
    out["norm"] = (DIM,)
    if not tied:
        out["output"] = (vocab, DIM)
    return out


def random_tensors(vocab: int, tied: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in shapes(vocab, tied).items():
        if len(shape) == 1:
            out[name] = (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
    return out


def gguf_name(name: str) -> str:
    top = {"tok_embeddings": "token_embd.weight", "norm": "output_norm.weight", "output": "output.weight"}
    if name in top:
        return top[name]
    _, layer, kind = name.split(".")
    return f"blk.{layer}.{GGUF_LAYER[kind]}.weight"


def write_gguf(path: Path, qtype_name: str, tied: bool, rng: np.random.Generator) -> Path:
    import gguf

    tokens, merges = byte_level_vocabulary()
    qtype = getattr(gguf.GGMLQuantizationType, qtype_name)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("fuzz seed")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(DIM)
    writer.add_feed_forward_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(DIM // HEADS)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    # Stored q/k rows are in llama.cpp's adjacent-pair order; a random matrix is as good in either.
    for name, array in random_tensors(len(tokens), tied, rng).items():
        if array.ndim == 1 or qtype_name == "F32":
            writer.add_tensor(gguf_name(name), array)
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_name(name: str) -> str:
    top = {"tok_embeddings": "model.embed_tokens.weight", "norm": "model.norm.weight", "output": "lm_head.weight"}
    if name in top:
        return top[name]
    _, layer, kind = name.split(".")
    return f"model.layers.{layer}.{HF_LAYER[kind]}.weight"


def write_safetensors_file(path: Path, arrays: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in arrays.items():
        blob = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": {"float32": "F32", "float16": "F16"}[array.dtype.name],
                        "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def write_hf_dir(directory: Path, rng: np.random.Generator) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = byte_level_vocabulary()
    directory.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                   merges=[tuple(m.split(" ")) for m in merges]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(tokens[:3])
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIM,
              "intermediate_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": CONTEXT, "tie_word_embeddings": False, "vocab_size": len(tokens),
              "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    arrays = {hf_name(k): v for k, v in random_tensors(len(tokens), False, rng).items()}
    # Half of the matrices in f16: two dtypes in one header.
    arrays = {k: (v.astype(np.float16) if "mlp" in k else v) for k, v in arrays.items()}
    write_safetensors_file(directory / "model.safetensors", arrays)
    return directory


LLAMA2C_VOCAB = 300


def write_llama2c_tokenizer(path: Path) -> Path:
    words = [b" the", b" hello", b" world", b"he", b"ll", b"or", b"ld", b" w"]
    tokens = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    tokens += [bytes([c]) for c in range(32, 127)][:LLAMA2C_VOCAB - len(tokens) - len(words)]
    tokens += words
    out = [struct.pack("<i", max(len(t) for t in tokens))]
    for i, token in enumerate(tokens):
        out.append(struct.pack("<fi", -float(i) if i >= 259 else 0.0, len(token)) + token)
    path.write_bytes(b"".join(out))
    return path


def write_llama2c(path: Path, version: int, rng: np.random.Generator) -> Path:
    t = random_tensors(LLAMA2C_VOCAB, True, rng)

    def per_layer(kind):
        return [t[f"layers.{i}.{kind}"] for i in range(LAYERS)]

    ints = [DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, LLAMA2C_VOCAB, CONTEXT]
    with open(path, "wb") as f:
        if version == 0:
            f.write(struct.pack("<7i", *ints))
            rope = np.zeros((2, CONTEXT, DIM // HEADS // 2), np.float32)
            order = ([t["tok_embeddings"]] + per_layer("attn_norm") + per_layer("wq") + per_layer("wk")
                     + per_layer("wv") + per_layer("wo") + per_layer("ffn_norm") + per_layer("w1")
                     + per_layer("w2") + per_layer("w3") + [t["norm"], rope])
        else:
            f.write(struct.pack("<Ii7iB", 0x616B3432, 1, *ints, 1))
            f.write(b"\0" * (256 - f.tell()))
            order = (per_layer("attn_norm") + per_layer("ffn_norm") + [t["norm"], t["tok_embeddings"]]
                     + per_layer("wq") + per_layer("wk") + per_layer("wv") + per_layer("wo")
                     + per_layer("w1") + per_layer("w2") + per_layer("w3"))
        for w in order:
            f.write(np.asarray(w, dtype="<f4").tobytes())
    write_llama2c_tokenizer(path.parent / "tokenizer.bin")
    return path


def write_seeds(directory: Path, include_default: bool = True) -> list[Seed]:
    """Writes every seed under `directory` (one sub-folder each); the default model is linked in
    when it is on disk and include_default is set."""
    rng = np.random.default_rng(1234)
    seeds = []
    for name, qtype, tied in (("gguf-f32", "F32", False), ("gguf-q8_0", "Q8_0", False), ("gguf-q4_0", "Q4_0", True)):
        folder = directory / name
        folder.mkdir(parents=True, exist_ok=True)
        path = write_gguf(folder / "model.gguf", qtype, tied, rng)
        seeds.append(Seed(name, "gguf", path, {"model": path}))
    hf = write_hf_dir(directory / "safetensors", rng)
    seeds.append(Seed("safetensors", "safetensors", hf, {"model": hf / "model.safetensors",
                                                         "config": hf / "config.json",
                                                         "tokenizer": hf / "tokenizer_config.json"}))
    for version in (0, 1):
        folder = directory / f"llama2c-v{version}"
        folder.mkdir(parents=True, exist_ok=True)
        path = write_llama2c(folder / "model.bin", version, rng)
        seeds.append(Seed(f"llama2c-v{version}", "llama2c", path,
                          {"model": path, "tokenizer": folder / "tokenizer.bin"}))
    if include_default:
        default = default_model()
        if default is not None:
            seeds.append(Seed("default", "gguf", default, {"model": default}))
    return seeds


def default_model() -> Path | None:
    from llama_brrr import fetch

    path = fetch.local_default_model()
    return Path(path) if path is not None and Path(path).is_file() else None


def copy_seed(seed: Seed, directory: Path) -> Seed:
    """A private copy of the seed's folder (the default model is not copied: its mutants are
    written whole by the mutator)."""
    if seed.name == "default":
        return seed
    source_dir = seed.path if seed.path.is_dir() else seed.path.parent
    target = directory / seed.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source_dir, target)
    path = target if seed.path.is_dir() else target / seed.path.name
    files = {role: target / p.relative_to(source_dir) for role, p in seed.files.items()}
    return Seed(seed.name, seed.kind, path, files)
