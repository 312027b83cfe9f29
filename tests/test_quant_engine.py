"""Quantized weights in the CPU engine: storage per tensor, quantize at load, GGUF blocks kept as
they are, and the damaged-block checks of the loader.

Numerics rule (docs/design.md, quantized weights): a quantized engine computes exactly what an f32
engine holding the dequantized weights computes, except that each matmul's activations are
quantized per block of 32 to int8 (error per dot product bounded in test_quant_kernels.py). Over a
whole model these errors add up; the tests below bound the logits' deviation relative to their
scale, and require decode rows to equal prefill rows within the same bound.
"""

import math

import gguf
import numpy as np
import pytest

from llama_brrr import Llama, quant
from llama_brrr.config import ModelConfig, shape_config
from llama_brrr.errors import ModelFileError

from test_loaders import add_llama_metadata, file_order, gguf_name  # noqa: E402

Q = gguf.GGMLQuantizationType
KEPT = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]
# Mixed types inside the fused matrices (wqkv, w13), a quantized embedding and a Q6_K head.
MIXED = {"wq": "q4_k", "wk": "q8_0", "wv": "q6_k", "wo": "q4_0", "w1": "q4_1", "w3": "q5_k",
         "w2": "q5_0", "tok_embeddings": "q8_0", "output": "q6_k"}
# Logits of the quantized engine vs the f32 engine on the same (dequantized) weights: max deviation
# over max |logit|. Measured 0.020-0.026 on these shapes (int8 activations over 2 layers).
LOGIT_REL_BOUND = 0.06


def quant_config(**overrides) -> ModelConfig:
    """Rows of 256 and 512 values so every kept type (K-quants: blocks of 256) applies."""
    fields = dict(dim=256, hidden_dim=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
                  max_seq_len=64, norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=False)
    fields.update(overrides)
    return ModelConfig(**fields)


def random_weights(config: ModelConfig, rng) -> dict:
    out = {}
    for name, shape in config.tensor_shapes().items():
        if len(shape) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / math.sqrt(shape[1])).astype(np.float32)
    return out


def types_for(config: ModelConfig, spec) -> dict:
    """spec: one type for every matrix, or MIXED-style {family: type}."""
    matrices = [n for n, s in config.tensor_shapes().items() if len(s) == 2]
    if isinstance(spec, str):
        return {n: spec for n in matrices}
    return {n: spec[n.split(".")[-1]] for n in matrices if n.split(".")[-1] in spec}


def engine_pair(C, config, types: dict, weights: dict, max_batch=2):
    """(quantized engine with `weights` quantized at load, f32 engine with its dequantized values)."""
    ids = quant.kept_types()
    d = config.engine_dict(config.max_seq_len, max_batch)
    eq = C.Engine("cpu", d, "f32", 0, 1, {n: ids[t] for n, t in types.items()})
    for name, w in weights.items():
        eq.set_weight(name, w, "f32")
    ef = C.Engine("cpu", d, "f32", 0, 1)
    for name in weights:
        ef.set_weight(name, eq.get_weight(name), "f32")
    return eq, ef


def rel_dev(got, want) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("spec", KEPT + ["mixed"])
def test_quantized_engine_matches_f32_engine_on_dequantized_weights(C, rng, spec):
    config = quant_config()
    types = types_for(config, MIXED if spec == "mixed" else spec)
    eq, ef = engine_pair(C, config, types, random_weights(config, rng))
    tokens = rng.integers(0, config.vocab_size, 23).astype(np.int32)
    want = ef.prefill(0, tokens, 0, "all")
    got = eq.prefill(0, tokens, 0, "all")
    assert np.isfinite(got).all()
    assert rel_dev(got, want) < LOGIT_REL_BOUND, spec
    # decode rows (the GEMV) against the same positions run as a prompt (the GEMM)
    eq.prefill(1, tokens[:-3], 0, "none")
    for step, token in enumerate(tokens[-3:]):
        pos = len(tokens) - 3 + step
        row = eq.decode(np.array([token], np.int32), np.array([1], np.int32),
                        np.array([pos], np.int32))[0]
        assert rel_dev(row, want[pos]) < LOGIT_REL_BOUND, (spec, step)


@pytest.mark.parametrize("type_name", KEPT)
def test_quantize_at_load_equals_the_quantizer(C, rng, type_name):
    """set_weight of floats into a quantized tensor stores quant_ops.quantize's blocks (which are
    bit-identical to the gguf package's quantizer for the 32-blocks and to llama.cpp's reference
    for the K-quants: test_quantize.py): their dequantized values match exactly."""
    config = quant_config()
    weights = random_weights(config, rng)
    eq, _ = engine_pair(C, config, types_for(config, type_name), weights)
    for name in ("layers.0.wq", "layers.1.w2", "tok_embeddings"):
        blocks = C.quant_ops.quantize(type_name, weights[name])
        want = C.quant_ops.dequantize(type_name, blocks, weights[name].shape[1])
        assert np.array_equal(eq.get_weight(name), want), name
    if type_name in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        w = weights["layers.0.w1"]
        theirs = gguf.quants.quantize(w, Q[type_name.upper()])
        assert np.array_equal(C.quant_ops.quantize(type_name, w), theirs)


def test_set_weight_blocks_keeps_blocks_bit_for_bit(C, rng):
    config = quant_config()
    ids = quant.kept_types()
    types = types_for(config, MIXED)
    e = C.Engine("cpu", config.engine_dict(16, 1), "bf16", 0, 1, {n: ids[t] for n, t in types.items()})
    for name, w in random_weights(config, rng).items():
        if name in types:
            blocks = C.quant_ops.quantize(types[name], w)
            if name.endswith("w1"):  # in consecutive row chunks, as the loader streams big tensors
                for r0 in range(0, len(blocks), 100):
                    e.set_weight_blocks(name, blocks[r0:r0 + 100], ids[types[name]], list(w.shape), r0)
            else:
                e.set_weight_blocks(name, blocks, ids[types[name]], list(w.shape))
            assert np.array_equal(e.get_weight(name), C.quant_ops.dequantize(types[name], blocks, w.shape[1]))
        else:
            e.set_weight(name, w, "f32")
    assert np.isfinite(e.prefill(0, np.arange(5, dtype=np.int32), 0, "last")).all()


def test_random_quantized_weights_are_the_quantized_float_draws(C):
    config = quant_config()
    ids = quant.kept_types()
    d = config.engine_dict(16, 1)
    ef = C.Engine("cpu", d, "f32", 0, 1)
    ef.init_random(7, 0.02)
    eq = C.Engine("cpu", d, "f32", 0, 1, {"layers.1.w1": ids["q4_k"],
                                            "output": ids["q6_k"]})
    eq.init_random(7, 0.02)
    for name, t in (("layers.1.w1", "q4_k"), ("output", "q6_k")):
        w = ef.get_weight(name)
        want = C.quant_ops.dequantize(t, C.quant_ops.quantize(t, w), w.shape[1])
        assert np.array_equal(eq.get_weight(name), want), name
    assert np.array_equal(eq.get_weight("layers.0.wq"), ef.get_weight("layers.0.wq"))


def test_engine_refuses_bad_quant_types_and_blocks(C):
    config = quant_config()
    d = config.engine_dict(16, 1)
    ids = quant.kept_types()
    with pytest.raises(ValueError, match="norm weight"):
        C.Engine("cpu", d, "f32", 0, 1, {"layers.0.attn_norm": ids["q8_0"]})
    with pytest.raises(ValueError, match="GGML type 1\\b.*not a block format"):
        C.Engine("cpu", d, "f32", 0, 1, {"layers.0.wq": 1})
    with pytest.raises(ValueError, match="unknown weight name|nonsense"):
        C.Engine("cpu", d, "f32", 0, 1, {"nonsense": ids["q8_0"]})
    small = quant_config(dim=96, hidden_dim=160, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match="rows of 96 values.*multiple of 256.*q4_k"):
        C.Engine("cpu", small.engine_dict(16, 1), "f32", 0, 1, {"layers.0.wq": ids["q4_k"]})
    with pytest.raises(ValueError, match="quant_types maps"):
        C.Engine("cpu", d, "f32", 0, 1, {"layers.0.wq": "q4_k"})

    e = C.Engine("cpu", d, "f32", 0, 1, {"layers.0.wq": ids["q8_0"]})
    w = np.ones((256, 256), np.float32)
    blocks = C.quant_ops.quantize("q8_0", w)
    with pytest.raises(ValueError, match="stored as f32.*not as blocks"):
        e.set_weight_blocks("layers.0.wk", C.quant_ops.quantize("q8_0", np.ones((128, 256), np.float32)),
                            ids["q8_0"], [128, 256])
    with pytest.raises(ValueError, match="GGML type 2 given.*stores it as q8_0"):
        e.set_weight_blocks("layers.0.wq", blocks, ids["q4_0"], [256, 256])
    with pytest.raises(ValueError, match="bytes of q8_0 blocks given.*not whole rows"):
        e.set_weight_blocks("layers.0.wq", blocks.reshape(-1)[:-1], ids["q8_0"], [256, 256])
    with pytest.raises(ValueError, match="uint8"):
        e.set_weight_blocks("layers.0.wq", blocks.view(np.int8), ids["q8_0"], [256, 256])
    with pytest.raises(ValueError, match="shape"):
        e.set_weight_blocks("layers.0.wq", blocks, ids["q8_0"], [255, 256])
    e.init_random(0, 0.02)
    e.set_weight_blocks("layers.0.wq", blocks[:100], ids["q8_0"], [256, 256])
    with pytest.raises(ValueError, match="starting at row 150.*100 rows have arrived"):
        e.set_weight_blocks("layers.0.wq", blocks[150:], ids["q8_0"], [256, 256], 150)
    with pytest.raises(ValueError, match="from row 100.*within"):
        e.set_weight_blocks("layers.0.wq", blocks, ids["q8_0"], [256, 256], 100)
    with pytest.raises(Exception, match="layers.0.wq.*never set"):  # half a tensor is not a tensor
        e.prefill(0, np.arange(3, dtype=np.int32), 0, "last")
    # the engine is still usable
    e.set_weight_blocks("layers.0.wq", blocks, ids["q8_0"], [256, 256])
    assert np.array_equal(e.get_weight("layers.0.wq"), C.quant_ops.dequantize("q8_0", blocks, 256))
    # the CUDA engine keeps the same types (qlayout.h); the plan does not depend on the backend
    assert quant.plan(config, "q8_0", None, "cuda").types == quant.plan(config, "q8_0", None, "cpu").types


# ---- recipes -------------------------------------------------------------------------------------

def test_q4_k_m_recipe_follows_llama_cpp():
    config = shape_config("llama3-8b")
    types = quant.plan(config, "q4_k_m", None, "cpu").types
    assert types["output"] == "q6_k" and types["tok_embeddings"] == "q4_k"
    n = config.n_layers  # 32: use_more_bits picks layers < 4, >= 28, and (i - 4) % 3 == 2
    more = [i for i in range(n) if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2]
    for i in range(n):
        for kind in ("wv", "w2"):
            assert types[f"layers.{i}.{kind}"] == ("q6_k" if i in more else "q4_k"), (i, kind)
        for kind in ("wq", "wk", "wo", "w1", "w3"):
            assert types[f"layers.{i}.{kind}"] == "q4_k", (i, kind)
    fams, total = quant.census(config, types, "f32")
    assert fams["wv"] == "q4_k/q6_k" and fams["attn_norm"] == "f32"
    assert 4.6e9 < total < 5.0e9  # an 8B Q4_K_M file weighs about 4.9 GB


def test_recipe_falls_back_like_llama_cpp_when_rows_are_not_256_blocks():
    # dim 576 (the default model): Q4_K -> Q5_0, Q6_K -> Q8_0; w2 has rows of 1536 = 6 * 256.
    config = quant_config(dim=576, hidden_dim=1536, n_heads=9, n_kv_heads=3, tie_embeddings=True)
    types = quant.plan(config, "q4_k_m", None, "cpu").types
    assert types["tok_embeddings"] == "q8_0"  # tied head: q6_k, which falls back
    assert types["layers.0.wq"] == "q5_0"
    # use_more_bits(i, 2) picks layer 1 only (i >= 7 * 2 // 8); w2's rows of 1536 take K-quants
    assert types["layers.0.w2"] == "q4_k" and types["layers.1.w2"] == "q6_k"


def test_quant_argument_is_checked():
    with pytest.raises(ValueError, match="quant must be one of"):
        Llama.random(quant_config(), quant="q3_k", device="cpu")
    with pytest.raises(TypeError, match="quant must be a str"):
        Llama.random(quant_config(), quant=4, device="cpu")


def test_random_model_with_a_recipe_runs_and_reports_its_types():
    llm = Llama.random(quant_config(), quant="q4_k_m", device="cpu", max_seq_len=32, max_batch=1)
    assert llm.weight_types["output"] == "q6_k" and llm.weight_types["layers.0.wq"] == "q4_k"
    assert "q6_k" in repr(llm) and "q4_k" in llm.weights_summary and "MB" in llm.weights_summary
    out = llm.generate([1, 2, 3], max_tokens=4, ignore_eos=True)[0]
    assert len(out.token_ids) == 4


# ---- GGUF files with quantized tensors -----------------------------------------------------------

def write_quant_gguf(path, config, weights, types, C):
    """A GGUF whose matrices are stored as `types` (our quantizer), q/k rows in pair order."""
    stored = file_order(config, weights)
    ids = quant.kept_types()
    writer = gguf.GGUFWriter(str(path), "llama")
    add_llama_metadata(writer, config)
    writer.add_tokenizer_model("gpt2")
    tokens = ["<unk>", "<s>", "</s>", "t", "o", "to"]
    writer.add_token_list(tokens + [f"x{i}" for i in range(config.vocab_size - len(tokens))])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_token_merges(["t o"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, w in stored.items():
        if name in types:
            writer.add_tensor(gguf_name(name), C.quant_ops.quantize(types[name], w),
                              raw_dtype=Q(ids[types[name]]))
        else:
            writer.add_tensor(gguf_name(name), w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_blocks_are_kept_as_stored(C, rng, tmp_path):
    config = quant_config()
    weights = random_weights(config, rng)
    types = types_for(config, MIXED)
    path = write_quant_gguf(tmp_path / "mixed.gguf", config, weights, types, C)
    llm = Llama.from_pretrained(str(path), device="cpu", progress=False, max_seq_len=32, max_batch=1)
    assert llm.weight_types == types
    deq = Llama.from_pretrained(str(path), device="cpu", progress=False, quant="none",
                                max_seq_len=32, max_batch=1)
    assert deq.weight_types == {}
    for name, t in types.items():
        want = C.quant_ops.dequantize(t, C.quant_ops.quantize(t, weights[name]), config.tensor_shapes()[name][1])
        got = llm.engine.get_weight(name)
        if name.endswith((".wq", ".wk")):  # rows went back from pair order to rotate-half order
            assert np.array_equal(np.sort(got, axis=None), np.sort(deq.engine.get_weight(name), axis=None))
        else:
            assert np.array_equal(got, want), name
        assert np.array_equal(got, deq.engine.get_weight(name)), name
    tokens = list(rng.integers(0, config.vocab_size, 12))
    assert rel_dev(llm.forward(tokens), deq.forward(tokens)) < LOGIT_REL_BOUND
    # requantize: q4_1 blocks in the file, q8_0 asked for
    re = Llama.from_pretrained(str(path), device="cpu", progress=False, quant="q8_0",
                               max_seq_len=32, max_batch=1)
    assert set(re.weight_types.values()) == {"q8_0"}
    assert rel_dev(re.forward(tokens), deq.forward(tokens)) < LOGIT_REL_BOUND


def _patch(path, data: bytes, at: int):
    raw = bytearray(path.read_bytes())
    raw[at:at + len(data)] = data
    path.write_bytes(bytes(raw))


def _tensor_info(path, name):
    from llama_brrr.loaders.gguf_file import GGUFFile
    return next(t for t in GGUFFile(path).tensors if t.name == name)


@pytest.mark.parametrize("type_name", ["q8_0", "q4_1", "q4_k", "q6_k"])
def test_nan_scale_in_a_block_is_a_model_file_error(C, rng, tmp_path, type_name):
    config = quant_config()
    weights = random_weights(config, rng)
    path = write_quant_gguf(tmp_path / "nan.gguf", config, weights, types_for(config, type_name), C)
    t = _tensor_info(path, "blk.1.ffn_up.weight")
    block_bytes = {"q8_0": 34, "q4_1": 20, "q4_k": 144, "q6_k": 210}[type_name]
    scale_at = {"q8_0": 0, "q4_1": 2, "q4_k": 0, "q6_k": 208}[type_name]  # d (or m for q4_1)
    _patch(path, np.float16(np.nan).tobytes(), t.data_offset + 5 * block_bytes + scale_at)
    with pytest.raises(ModelFileError, match=r"blk\.1\.ffn_up\.weight.*NaN or inf scale in block 5"):
        Llama.from_pretrained(str(path), device="cpu", progress=False, max_seq_len=32)
    # dequantized instead, the same damage is found in the values
    with pytest.raises(ModelFileError, match=r"blk\.1\.ffn_up\.weight.*NaN or inf"):
        Llama.from_pretrained(str(path), device="cpu", progress=False, max_seq_len=32, quant="none")


def test_changed_tensor_type_or_offset_is_a_model_file_error(C, rng, tmp_path):
    config = quant_config()
    weights = random_weights(config, rng)
    types = types_for(config, "q4_1")
    good = write_quant_gguf(tmp_path / "good.gguf", config, weights, types, C)
    raw = good.read_bytes()
    name = b"blk.0.attn_output.weight"
    at = raw.index(name) + len(name)  # then u32 n_dims, 2 x u64 dims, u32 type, u64 offset
    type_at, offset_at = at + 4 + 16, at + 4 + 16 + 4
    cases = {"type.gguf": (np.uint32(Q.Q8_0).tobytes(), type_at),
             "type_small.gguf": (np.uint32(Q.Q4_0).tobytes(), type_at),
             "offset.gguf": (np.uint64(0).tobytes(), offset_at)}
    for file_name, (data, where) in cases.items():
        path = tmp_path / file_name
        path.write_bytes(raw)
        _patch(path, data, where)
        with pytest.raises(ModelFileError, match="tensor table is corrupt|unused bytes|truncated"):
            Llama.from_pretrained(str(path), device="cpu", progress=False, max_seq_len=32)
    unknown = tmp_path / "unknown.gguf"
    unknown.write_bytes(raw)
    _patch(unknown, np.uint32(77).tobytes(), type_at)
    with pytest.raises(Exception, match=r"blk\.0\.attn_output\.weight.*type id 77") as info:
        Llama.from_pretrained(str(unknown), device="cpu", progress=False, max_seq_len=32)
    assert isinstance(info.value, ValueError)  # UnsupportedModelError is a ValueError
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(raw[:-1000])
    with pytest.raises(ModelFileError, match="truncated"):
        Llama.from_pretrained(str(truncated), device="cpu", progress=False, max_seq_len=32)


def test_types_the_engine_does_not_keep_are_dequantized_with_one_warning(C, rng, tmp_path, monkeypatch):
    config = quant_config()
    weights = random_weights(config, rng)
    types = types_for(config, {"wq": "q4_1", "wk": "q4_1", "wv": "q4_1", "wo": "q8_0", "w1": "q8_0",
                               "w3": "q8_0", "w2": "q8_0", "tok_embeddings": "q8_0",
                               "output": "q8_0"})
    path = write_quant_gguf(tmp_path / "m.gguf", config, weights, types, C)
    kept = {k: v for k, v in quant.kept_types().items() if k != "q4_1"}
    monkeypatch.setattr(quant, "kept_types", lambda: kept)  # as if Q4_1 had no kernels
    with pytest.warns(quant.QuantWarning, match="Q4_1 are not kept quantized on cpu") as caught:
        llm = Llama.from_pretrained(str(path), device="cpu", progress=False, max_seq_len=32)
    assert len(caught) == 1
    assert "layers.0.wq" not in llm.weight_types and llm.weight_types["layers.0.wo"] == "q8_0"
    assert np.array_equal(llm.engine.get_weight("layers.1.wv"),
                          C.quant_ops.dequantize("q4_1", C.quant_ops.quantize("q4_1", weights["layers.1.wv"]), 256))


def test_safetensors_quantized_at_load(C, rng, tmp_path, monkeypatch):
    import llama_brrr.tokenizer
    from test_loaders import write_hf_dir

    config = quant_config()
    weights = random_weights(config, rng)
    directory = write_hf_dir(tmp_path / "hf", config, weights, dtype=np.float16)
    monkeypatch.setattr(llama_brrr.tokenizer, "load_tokenizer", lambda spec: None)  # weights only
    f16 = Llama.from_pretrained(str(directory), device="cpu", progress=False, max_seq_len=32)
    assert f16.weight_types == {}  # a 16-bit file stays 16-bit unless asked
    q = Llama.from_pretrained(str(directory), device="cpu", progress=False, max_seq_len=32,
                              quant="q4_k_m")
    assert q.weight_types["output"] == "q6_k" and q.weight_types["layers.0.wq"] == "q4_k"
    w = weights["layers.1.w1"].astype(np.float16).astype(np.float32)
    assert np.array_equal(q.engine.get_weight("layers.1.w1"),
                          C.quant_ops.dequantize("q4_k", C.quant_ops.quantize("q4_k", w), 256))
    assert np.isfinite(q.forward(list(rng.integers(0, config.vocab_size, 12)))).all()
