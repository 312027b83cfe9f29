"""Tensor-parallel sharding (llama_brrr/tp/shard.py) on the CPU: local configs and their errors, the
slices of float and block tensors, the sharded model's math against the whole model's (numpy), and
sharded reading of a GGUF file against slices of the full tensors."""

import dataclasses

import numpy as np
import pytest

from llama_brrr.config import ModelConfig
from llama_brrr.tp import shard
from llama_brrr.tp.shard import ShardingError

MHA = ModelConfig(dim=96, hidden_dim=200, n_layers=2, n_heads=8, n_kv_heads=8, head_dim=16,
                  vocab_size=301, name="mha")
GQA = ModelConfig(dim=96, hidden_dim=200, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16,
                  vocab_size=301, name="gqa")  # 4 KV heads: 2 per rank at N=2, 1 at N=4
FEW_KV = ModelConfig(dim=96, hidden_dim=200, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16,
                     vocab_size=301, name="few-kv")  # 2 KV heads over 4 ranks: each on two ranks


@pytest.mark.parametrize("config, size, heads, kv", [
    (MHA, 2, 4, 4), (MHA, 4, 2, 2), (MHA, 8, 1, 1),
    (GQA, 2, 4, 2), (GQA, 4, 2, 1),
    (FEW_KV, 2, 4, 1), (FEW_KV, 4, 2, 1), (FEW_KV, 8, 1, 1),
])
def test_local_config_splits_heads_and_mlp(config, size, heads, kv):
    group = config.n_heads // config.n_kv_heads
    held_kv = []
    for rank in range(size):
        local = shard.local_config(config, rank, size)
        assert (local.n_heads, local.n_kv_heads) == (heads, kv)
        assert local.hidden_dim == config.hidden_dim // size
        assert (local.dim, local.vocab_size, local.n_layers, local.head_dim) == \
               (config.dim, config.vocab_size, config.n_layers, config.head_dim)
        # every query head of the rank reads a KV head the rank holds, at the same local offset
        # the engine's GQA rule (local head j reads local KV head j // local group) gives
        q, k = shard.q_heads(config, rank, size), shard.kv_heads(config, rank, size)
        for j, h in enumerate(q):
            assert h // group in k
            assert h // group - k.start == j // (local.n_heads // local.n_kv_heads)
        held_kv.extend(k)
    assert sorted(set(held_kv)) == list(range(config.n_kv_heads))  # no KV head lost


def test_size_one_is_the_model_itself():
    assert shard.local_config(GQA, 0, 1) is GQA
    assert shard.split(GQA, "layers.0.wq", 0, 1) is None


@pytest.mark.parametrize("config, size, words", [
    (MHA, 3, ["3", "8 query heads"]),
    (ModelConfig(dim=64, hidden_dim=90, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=16,
                 vocab_size=10), 4, ["hidden_dim=90", "4"]),
    (ModelConfig(dim=96, hidden_dim=96, n_layers=1, n_heads=12, n_kv_heads=6, head_dim=8,
                 vocab_size=10), 4, ["6 KV heads", "4"]),
    (ModelConfig(dim=96, hidden_dim=96, n_layers=1, n_heads=12, n_kv_heads=3, head_dim=8,
                 vocab_size=10), 4, ["3 KV heads", "4"]),
    (ModelConfig(dim=576, hidden_dim=1536, n_layers=1, n_heads=9, n_kv_heads=3, vocab_size=10),
     2, ["9 query heads", "tensor_parallel=2"]),  # SmolLM2's heads
])
def test_models_that_cannot_split_are_refused_with_the_numbers(config, size, words):
    with pytest.raises(ShardingError) as info:
        shard.check_split(config, size)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(ValueError):
        shard.local_config(config, 0, size)


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
def test_bad_sizes_are_value_errors(size):
    with pytest.raises(ValueError, match="tensor_parallel"):
        shard.check_split(MHA, size)


def test_bad_rank_is_refused():
    with pytest.raises(ShardingError, match="rank"):
        shard.local_config(MHA, 2, 2)


# ---- float slices and the math of the split model --------------------------------------------------

def full_weights(config, rng):
    return {name: rng.standard_normal(shape) / np.sqrt(shape[-1])
            for name, shape in config.tensor_shapes().items()}


@pytest.mark.parametrize("config", [MHA, GQA, FEW_KV], ids=lambda c: c.name)
@pytest.mark.parametrize("size", [2, 4])
def test_shards_have_local_shapes_and_merge_back(config, size, rng):
    weights = full_weights(config, rng)
    for rank in range(size):
        local = shard.local_config(config, rank, size).tensor_shapes()
        for name, array in weights.items():
            part = shard.shard_array(array, config, name, rank, size)
            assert part.shape == local[name], name
            assert np.shares_memory(part, array)  # a view: a memory map reads only these pages
    for name, array in weights.items():
        parts = [shard.shard_array(array, config, name, r, size) for r in range(size)]
        np.testing.assert_array_equal(shard.merge_shards(config, name, parts), array)


def attention(x, wq, wk, wv, n_heads, n_kv, hd):
    """Causal GQA attention of x [T, D] (query head h reads KV head h // (n_heads / n_kv)); the
    heads' outputs side by side [T, n_heads * hd]. RoPE rotates within a head, so it commutes
    with splitting by heads and is left out."""
    T = x.shape[0]
    q = (x @ wq.T).reshape(T, n_heads, hd)
    k = (x @ wk.T).reshape(T, n_kv, hd)
    v = (x @ wv.T).reshape(T, n_kv, hd)
    group = n_heads // n_kv
    out = np.empty((T, n_heads, hd))
    mask = np.tril(np.ones((T, T), bool))
    for h in range(n_heads):
        s = q[:, h] @ k[:, h // group].T / np.sqrt(hd)
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // group]
    return out.reshape(T, n_heads * hd)


def mlp(x, w1, w3, w2):
    g = x @ w1.T
    return (g / (1 + np.exp(-g)) * (x @ w3.T)) @ w2.T


@pytest.mark.parametrize("config", [MHA, GQA, FEW_KV], ids=lambda c: c.name)
@pytest.mark.parametrize("size", [2, 4, 8])
def test_sum_of_rank_partials_is_the_whole_layer(config, size, rng):
    """What the engine's all-reduce adds up: each rank's wo and w2 outputs from its own heads and
    MLP rows sum to the full layer's, for the attention and the MLP."""
    w = full_weights(config, rng)
    x = rng.standard_normal((7, config.dim))
    p = "layers.0."
    whole_attn = attention(x, w[p + "wq"], w[p + "wk"], w[p + "wv"], config.n_heads,
                           config.n_kv_heads, config.head_dim) @ w[p + "wo"].T
    whole_mlp = mlp(x, w[p + "w1"], w[p + "w3"], w[p + "w2"])
    attn_sum, mlp_sum = np.zeros_like(whole_attn), np.zeros_like(whole_mlp)
    for rank in range(size):
        local = shard.local_config(config, rank, size)
        s = {n: shard.shard_array(w[p + n], config, p + n, rank, size)
             for n in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")}
        attn_sum += attention(x, s["wq"], s["wk"], s["wv"], local.n_heads, local.n_kv_heads,
                              local.head_dim) @ s["wo"].T
        mlp_sum += mlp(x, s["w1"], s["w3"], s["w2"])
    np.testing.assert_allclose(attn_sum, whole_attn, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mlp_sum, whole_mlp, rtol=1e-10, atol=1e-12)


# ---- block slices ------------------------------------------------------------------------------------

def quantized(C, type_name, array):
    return C.quant_ops.quantize(type_name, np.ascontiguousarray(array, dtype=np.float32))


@pytest.mark.parametrize("type_name, size", [("q4_k", 2), ("q8_0", 3), ("q6_k", 2), ("q4_1", 4)])
def test_block_column_slice_dequantizes_to_the_column_slice(C, rng, type_name, size):
    values, _ = shard.block_values(type_name)
    config = ModelConfig(dim=24, hidden_dim=values * size, n_layers=1, n_heads=2, n_kv_heads=2,
                         head_dim=12, vocab_size=10)
    rows, cols = config.tensor_shapes()["layers.0.w2"]  # column split: [dim, hidden]
    blocks = quantized(C, type_name, rng.standard_normal((rows, cols)))
    whole = C.quant_ops.dequantize(type_name, blocks, cols)
    n_values, n_bytes = shard.block_values(type_name)
    for rank in range(size):
        part = shard.shard_blocks(blocks, config, "layers.0.w2", rank, size, n_values, n_bytes)
        assert np.shares_memory(part, blocks)
        width = cols // size
        got = C.quant_ops.dequantize(type_name, np.ascontiguousarray(part), width)
        np.testing.assert_array_equal(got, whole[:, rank * width:(rank + 1) * width])


def test_block_row_slice_is_whole_rows(C, rng):
    config = ModelConfig(dim=64, hidden_dim=6, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=32,
                         vocab_size=10)
    rows, cols = config.tensor_shapes()["layers.0.w1"]
    blocks = quantized(C, "q8_0", rng.standard_normal((rows, cols)))
    whole = C.quant_ops.dequantize("q8_0", blocks, cols)
    for rank in range(3):
        part = shard.shard_blocks(blocks, config, "layers.0.w1", rank, 3, 32, 34)
        np.testing.assert_array_equal(C.quant_ops.dequantize("q8_0", np.ascontiguousarray(part), cols),
                                      whole[2 * rank:2 * rank + 2])


def test_column_shards_must_be_whole_blocks():
    config = ModelConfig(dim=64, hidden_dim=768, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=16,
                         vocab_size=10)
    shard.check_blocks(config, 2, {"layers.0.w1": "Q4_K"})  # split by rows: whole blocks always
    with pytest.raises(ShardingError, match=r"w2 \(Q4_K.*384 columns.*256"):
        shard.check_blocks(config, 2, {"layers.0.w2": "Q4_K"})
    shard.check_blocks(config, 2, {"layers.0.w2": "Q8_0", "layers.0.wo": "F16"})
    with pytest.raises(ShardingError, match="wo"):
        shard.check_blocks(config, 4, {"layers.0.wo": "Q8_0"})  # 64 / 4 = 16 columns


# ---- sharded reading of a GGUF file ------------------------------------------------------------------

SHARD_GGUF_CONFIG = ModelConfig(dim=256, hidden_dim=512, n_layers=2, n_heads=4, n_kv_heads=2,
                                head_dim=64, vocab_size=300, max_seq_len=128, name="tp-gguf")


def write_sharding_gguf(C, path, config, types: dict, rng):
    """A llama GGUF of `config`: matrix `name` stored as types.get(name, "f16") (a block type is the
    quantization of N(0, 1/fan_in) values), norms F32 1 + N(0, 0.1). Returns path."""
    import gguf

    from llama_brrr import quant
    from llama_brrr.bench.llamacpp import add_random_llama_header
    from llama_brrr.loaders.gguf import gguf_tensor_name

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(config.name)
    add_random_llama_header(writer, config)
    for name, shape in config.tensor_shapes().items():
        if len(shape) == 1:
            writer.add_tensor(gguf_tensor_name(name),
                              (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        values = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        type_name = types.get(name, "f16")
        if type_name == "f16":
            writer.add_tensor(gguf_tensor_name(name), values.astype(np.float16))
        else:
            writer.add_tensor(gguf_tensor_name(name), quantized(C, type_name, values),
                              raw_dtype=gguf.GGMLQuantizationType(quant.kept_types()[type_name]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


MIXED_TYPES = {"layers.0.wq": "q8_0", "layers.0.wk": "q4_k", "layers.0.wo": "q8_0",
               "layers.0.w1": "q4_k", "layers.0.w2": "q4_k", "layers.1.wv": "q6_k",
               "layers.1.w2": "q8_0", "output": "q8_0"}


@pytest.mark.parametrize("size", [2, 4])
def test_sharded_gguf_reads_the_slices_of_the_full_tensors(C, rng, tmp_path, monkeypatch, size):
    from llama_brrr.loaders import load_model
    from llama_brrr.loaders.gguf import GGUFTensors

    types = MIXED_TYPES if size == 2 else {n: t for n, t in MIXED_TYPES.items() if t != "q4_k"}
    path = write_sharding_gguf(C, tmp_path / "m.gguf", SHARD_GGUF_CONFIG, types, rng)
    config = SHARD_GGUF_CONFIG
    loaded = load_model(path)
    full = {name: np.asarray(loaded.tensors[name], dtype=np.float32) for name in config.tensor_shapes()}
    full_blocks = {name: loaded.tensors.blocks(name) for name in types}

    def whole_tensor_read(self, name):
        raise AssertionError(f"a rank read all of {name}")

    monkeypatch.setattr(GGUFTensors, "__getitem__", whole_tensor_read)
    monkeypatch.setattr(GGUFTensors, "blocks", whole_tensor_read)
    for rank in range(size):
        local = shard.local_config(config, rank, size)
        sharded = shard.ShardedTensors(loaded.tensors, config, rank, size)
        assert set(sharded) == set(config.tensor_shapes())
        for name, shape in local.tensor_shapes().items():
            assert sharded.file_type(name) == loaded.tensors.file_type(name)
            values = np.asarray(sharded[name], dtype=np.float32)
            assert values.shape == shape, name
            np.testing.assert_array_equal(values, shard.shard_array(full[name], config, name, rank,
                                                                    size), err_msg=name)
            if name in types:
                blocks = sharded.blocks(name)
                np.testing.assert_array_equal(
                    blocks, np.ascontiguousarray(shard.shard_blocks(
                        full_blocks[name], config, name, rank, size,
                        *shard.block_values(types[name]))), err_msg=name)
                assert [first for first, _ in sharded.block_chunks(name, 1 << 20)] == [0]


def test_one_rank_of_a_gguf_runs_like_the_whole_model(C, rng, tmp_path):
    """tensor_parallel=1 through ShardedTensors loads the same engine as the plain path."""
    from llama_brrr import Llama

    path = write_sharding_gguf(C, tmp_path / "m.gguf", SHARD_GGUF_CONFIG, MIXED_TYPES, rng)
    llm = Llama.from_pretrained(str(path), device="cpu", max_seq_len=32, max_batch=1,
                                progress=False)
    from llama_brrr import _C, quant
    from llama_brrr.loaders import load_model
    from llama_brrr.model import _set_weights

    loaded = load_model(path)
    config = loaded.config
    file_types = {n: loaded.tensors.file_type(n) for n in config.tensor_shapes()}
    plan = quant.plan(config, None, file_types, "cpu")
    engine = _C.Engine("cpu", config.engine_dict(32, 1), "f32", 0, 0, plan.type_ids())
    _set_weights(engine, shard.ShardedTensors(loaded.tensors, config, 0, 1), config, plan, False,
                 str(path))
    tokens = rng.integers(0, config.vocab_size, 9).astype(np.int32)
    np.testing.assert_array_equal(engine.prefill(0, tokens, 0, "all"), llm.forward(tokens.tolist()))


def test_random_draws_are_the_same_on_every_rank(C):
    """Llama.random(tensor_parallel=N) relies on init_random drawing element i of a tensor from the
    seed, the tensor's index and i only: the whole tensors then agree across ranks, and so do the
    shards (the last rank's fewer vocabulary rows are the first rows of the others')."""
    engines = []
    for rank in range(2):
        local = shard.local_config(FEW_KV, rank, 2)
        engine = C.Engine("cpu", local.engine_dict(16, 1), "f32", 0, 1, {})
        engine.init_random(1234, 0.02)
        engines.append(engine)
    for name in shard.local_config(FEW_KV, 0, 2).tensor_shapes():
        first, last = engines[0].get_weight(name), engines[1].get_weight(name)
        if name in shard.VOCAB_SPLIT:
            assert (first.shape[0], last.shape[0]) == (151, 150)  # 301 rows over 2 ranks
            first = first[:last.shape[0]]
        np.testing.assert_array_equal(first, last, err_msg=name)


# ---- the vocabulary split: tok_embeddings and output by rows ------------------------------------

TIED = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                   vocab_size=1001, tie_embeddings=True, name="tied")
UNTIED = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                     vocab_size=1001, name="untied")


@pytest.mark.parametrize("vocab, size, rows", [
    (1001, 2, [501, 500]), (1001, 4, [251, 251, 251, 248]), (1000, 4, [250] * 4),
    (1024, 2, [512, 512]), (7, 4, [2, 2, 2, 1]),
])
def test_vocabulary_rows_are_ceil_v_over_n_from_each_rank(vocab, size, rows):
    config = dataclasses.replace(UNTIED, vocab_size=vocab)
    got = [shard.vocab_rows(config, r, size) for r in range(size)]
    assert [len(g) for g in got] == rows
    assert [g.start for g in got] == [r * rows[0] for r in range(size)]  # Vs = ceil(V / N) apart
    assert got[-1].stop == vocab
    for r in range(size):
        assert shard.split(config, "tok_embeddings", r, size) == (0, got[r].start, got[r].stop)
        assert shard.split(config, "output", r, size) == (0, got[r].start, got[r].stop)
        assert shard.split(config, "norm", r, size) is None


@pytest.mark.parametrize("config", [TIED, UNTIED], ids=lambda c: c.name)
@pytest.mark.parametrize("size", [2, 4])
def test_vocabulary_shards_have_the_rank_shapes_and_merge_back(config, size, rng):
    weights = full_weights(config, rng)
    names = [n for n in shard.VOCAB_SPLIT if n in weights]
    assert names == (["tok_embeddings"] if config.tie_embeddings else ["tok_embeddings", "output"])
    for rank in range(size):
        local = shard.local_config(config, rank, size)
        rows = shard.vocab_rows(config, rank, size)
        for name in names:
            assert local.tensor_shapes()[name] == (len(rows), config.dim)
            part = shard.shard_array(weights[name], config, name, rank, size)
            np.testing.assert_array_equal(part, weights[name][rows.start:rows.stop])
    for name in names:
        parts = [shard.shard_array(weights[name], config, name, r, size) for r in range(size)]
        np.testing.assert_array_equal(shard.merge_shards(config, name, parts), weights[name])


def test_local_config_carries_the_rank_to_the_engine():
    for rank in range(4):
        local = shard.local_config(UNTIED, rank, 4)
        assert isinstance(local, shard.RankConfig) and isinstance(local, ModelConfig)
        assert (local.tp_rank, local.tp_size, local.vocab_size) == (rank, 4, 1001)
        d = local.engine_dict(16, 2)
        assert (d["tp_rank"], d["tp_size"], d["vocab_size"]) == (rank, 4, 1001)
        assert d["n_heads"] == 1 and d["hidden_dim"] == 24
    assert "tp_rank" not in UNTIED.engine_dict(16, 2)  # one engine: no keys, the defaults 0 / 1


@pytest.mark.parametrize("type_name", ["q8_0", "q6_k", "q4_1"])
def test_vocabulary_block_rows_are_whole_rows(C, rng, type_name):
    config = dataclasses.replace(UNTIED, dim=256, n_heads=4, head_dim=64, vocab_size=13)
    n_values, n_bytes = shard.block_values(type_name)
    blocks = quantized(C, type_name, rng.standard_normal((13, 256)))
    whole = C.quant_ops.dequantize(type_name, blocks, 256)
    for size in (2, 4):
        shard.check_blocks(config, size, {"output": type_name.upper(), "tok_embeddings": type_name})
        for rank in range(size):
            rows = shard.vocab_rows(config, rank, size)
            part = shard.shard_blocks(blocks, config, "output", rank, size, n_values, n_bytes)
            assert np.shares_memory(part, blocks)
            np.testing.assert_array_equal(
                C.quant_ops.dequantize(type_name, np.ascontiguousarray(part), 256),
                whole[rows.start:rows.stop])


def test_a_vocabulary_too_small_for_the_ranks_is_refused():
    config = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=8, n_kv_heads=8, head_dim=8,
                         vocab_size=5)
    shard.check_split(config, 2)  # 3 and 2 rows
    for size in (4, 8):  # ceil(5 / 4) = 2 rows each: 2, 2, 1 and none for rank 3
        with pytest.raises(ShardingError, match=f"tensor_parallel={size} leaves the last rank no "
                                                f"rows of the 5-token vocabulary"):
            shard.check_split(config, size)


# ---- a rank's engine: the vocabulary rows in the C++ Config ---------------------------------------

def rank_engine(C, config, rank, size, weights=None):
    local = shard.local_config(config, rank, size)
    engine = C.Engine("cpu", local.engine_dict(16, 2), "f32", 0, 1, {})
    for name, array in (weights or {}).items():
        engine.set_weight(name, np.ascontiguousarray(
            shard.shard_array(array, config, name, rank, size), dtype=np.float32), "f32")
    return engine


def test_engine_config_takes_and_reports_the_rank(C):
    engine = rank_engine(C, UNTIED, 3, 4)
    assert (engine.config["tp_rank"], engine.config["tp_size"], engine.config["vocab_size"]) == (3, 4, 1001)
    plain = C.Engine("cpu", UNTIED.engine_dict(16, 2), "f32", 0, 1, {})
    assert (plain.config["tp_rank"], plain.config["tp_size"]) == (0, 1)
    for rank, size, words in [(2, 2, "tp_rank"), (-1, 2, "tp_rank"), (0, 0, "tp_size")]:
        with pytest.raises(ValueError, match=words):
            C.Engine("cpu", {**UNTIED.engine_dict(16, 2), "tp_rank": rank, "tp_size": size},
                     "f32", 0, 1, {})
    with pytest.raises(ValueError, match="too small to split over tp_size 8"):
        C.Engine("cpu", {**dataclasses.replace(UNTIED, vocab_size=5).engine_dict(16, 2),
                         "tp_rank": 0, "tp_size": 8}, "f32", 0, 1, {})


def test_a_rank_engine_takes_only_its_vocabulary_rows(C, rng):
    engine = rank_engine(C, UNTIED, 1, 2)
    whole = rng.standard_normal((1001, 64)).astype(np.float32)
    for name in ("tok_embeddings", "output"):
        with pytest.raises(ValueError, match=rf"'{name}' has shape \(1001, 64\) but the config "
                                             rf"expects \(500, 64\)"):
            engine.set_weight(name, whole, "f32")
        engine.set_weight(name, np.ascontiguousarray(whole[501:]), "f32")
        np.testing.assert_array_equal(engine.get_weight(name), whole[501:])


@pytest.mark.parametrize("config", [TIED, UNTIED], ids=lambda c: c.name)
@pytest.mark.parametrize("size", [2, 4])
def test_a_cpu_rank_computes_its_share_of_embedding_and_logits(C, rng, config, size):
    """Without a communicator a CPU rank computes what a CUDA rank computes before its collectives:
    the embedding of its own tokens (zeros for others') and its own logit columns (zeros
    elsewhere). With wo = w2 = 0 the layers add nothing, so a rank's columns for a token of its
    rows are the whole model's, and a token of another rank's rows gives an all-zero row."""
    weights = full_weights(config, rng)
    for name in weights:
        if name.endswith((".wo", ".w2")):
            weights[name] = np.zeros_like(weights[name])
    whole = C.Engine("cpu", config.engine_dict(16, 2), "f32", 0, 1, {})
    for name, array in weights.items():
        whole.set_weight(name, np.ascontiguousarray(array, dtype=np.float32), "f32")
    tokens = np.array([0, 1000, 500, 250, 751, 3], np.int32)
    want = whole.prefill(0, tokens, 0, "all")
    seen = np.zeros(config.vocab_size, bool)
    for rank in range(size):
        rows = shard.vocab_rows(config, rank, size)
        got = rank_engine(C, config, rank, size, weights).prefill(0, tokens, 0, "all")
        assert got.shape == (len(tokens), config.vocab_size)
        outside = np.ones(config.vocab_size, bool)
        outside[rows.start:rows.stop] = False
        assert (got[:, outside] == 0).all(), "a rank wrote logit columns of another rank"
        for m, token in enumerate(tokens):
            if token in rows:
                np.testing.assert_allclose(got[m, rows.start:rows.stop], want[m, rows.start:rows.stop],
                                           rtol=1e-5, atol=1e-6, err_msg=f"rank {rank} token {token}")
            else:
                assert (got[m] == 0).all(), f"rank {rank} embedded token {token} of another rank"
        seen[rows.start:rows.stop] = True
    assert seen.all()
    # the decode path spreads its rows the same way
    engine = rank_engine(C, config, size - 1, size, weights)
    rows = shard.vocab_rows(config, size - 1, size)
    out = engine.decode(np.array([1000, 0], np.int32), np.array([0, 1], np.int32),
                        np.array([0, 0], np.int32), True)
    assert (out[1] == 0).all() and (out[0, :rows.start] == 0).all()
    assert np.abs(out[0, rows.start:]).max() > 0


# ---- sharded reading of a sharded safetensors directory ------------------------------------------

SHARD_HF_CONFIG = ModelConfig(dim=96, hidden_dim=200, n_layers=2, n_heads=8, n_kv_heads=2,
                              head_dim=16, vocab_size=301, max_seq_len=64, tie_embeddings=False,
                              name="tp-hf")


def write_sharded_hf_dir(directory, config, dtype, rng):
    """A Hugging Face checkpoint of random `config` weights in two files plus their index (the
    layout the loader reads; tests/test_loaders.py writes it). Returns (directory, the full
    arrays as stored)."""
    import json

    from test_loaders import write_hf_dir

    full = full_weights(config, rng)
    write_hf_dir(directory, config, full, dtype=dtype, shards=2)
    files = sorted(p.name for p in directory.iterdir())
    assert files == ["config.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(weight_map.values()) == {files[1], files[2]}
    return directory, {name: array.astype(dtype) for name, array in full.items()}


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sharded_safetensors_reads_the_slices_of_the_full_tensors(rng, tmp_path, size, dtype):
    """Each rank's ShardedTensors over a two-file safetensors checkpoint gives exactly the slice of
    the full tensor, and reads no whole tensor: the loader hands out memory maps of the files,
    and a rank's read copies only its shard (the whole tensors are read, on every rank, only
    where they are not split)."""
    import tracemalloc

    import ml_dtypes

    from llama_brrr.loaders import load_model

    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    config = SHARD_HF_CONFIG
    directory, full = write_sharded_hf_dir(tmp_path / "hf", config, np_dtype, rng)
    loaded = load_model(directory)
    assert (loaded.config.n_heads, loaded.config.n_kv_heads, loaded.config.hidden_dim) == \
           (config.n_heads, config.n_kv_heads, config.hidden_dim)
    for name in config.tensor_shapes():
        mapped = loaded.tensors[name]
        assert isinstance(mapped, np.memmap) or isinstance(mapped.base, np.memmap), name
    tracemalloc.start()
    try:
        for rank in range(size):
            local = shard.local_config(config, rank, size)
            sharded = shard.ShardedTensors(loaded.tensors, config, rank, size)
            assert set(sharded) == set(config.tensor_shapes())
            for name, shape in local.tensor_shapes().items():
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                values = sharded[name]
                copied = tracemalloc.get_traced_memory()[1] - before
                assert values.shape == shape and values.dtype == np_dtype, name
                assert values.flags.c_contiguous
                expected = shard.shard_array(full[name], config, name, rank, size)
                np.testing.assert_array_equal(values, expected, err_msg=name)
                whole = full[name].nbytes
                if shard.split(config, name, rank, size) is not None:
                    # a row shard is a view of its rows in the map; a column shard a copy of its
                    # own bytes (and bookkeeping): never the whole tensor's
                    assert copied < values.nbytes + whole // (2 * size), (name, copied, whole)
                del values
    finally:
        tracemalloc.stop()


def test_ranks_built_from_a_sharded_safetensors_dir_hold_their_shards(C, rng, tmp_path):
    """worker.build_engine's "pretrained" path over the two-file checkpoint: each rank's engine
    holds the slices of the full tensors."""
    from llama_brrr.tp import worker

    config = SHARD_HF_CONFIG
    directory, full = write_sharded_hf_dir(tmp_path / "hf", config, np.float32, rng)
    spec = dict(kind="pretrained", path=str(directory), config=config, backend="cpu",
                devices=[0, 0], dtype="f32", max_seq_len=16, max_batch=1, kv={}, n_threads=1,
                quant=None)
    for rank in range(2):
        engine, types = worker.build_engine(spec, rank, 2)
        for name in config.tensor_shapes():
            np.testing.assert_array_equal(
                engine.get_weight(name), shard.shard_array(full[name], config, name, rank, 2),
                err_msg=f"rank {rank} {name}")
