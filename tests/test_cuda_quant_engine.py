"""Quantized weights in the CUDA engine (cuda/qlayout.h tiles, gemv_quant at decode, gemv_quant_mma
from 2 rows: one pass of up to 64 rows for a matrix of one type, passes of up to 16 rows
(tuning::kGemvQuantPassRows) for one of several parts, even chunks past that up to
tuning::kGemvQuantChunkMaxRows rows, on Hopper gemv_quant_wgmma at 17-64 rows for the matrices it
takes, and for longer prompts gemm_quant on Hopper (the wgmma GEMM dequantizing tile by tile) up
to tuning::kGemmQuantMaxRows rows, past them (and off Hopper) the
matrix dequantized into bf16 scratch for the bf16 GEMM: whole, or a slice of columns at a time
where the budget holds only a scratch of about the L2) against the CPU engine on the same GGUF
blocks.

Numerics rule (docs/design.md, quantized weights): like the CPU engine's quantized path, each
decode matmul quantizes its activations per block of 32 to int8 (the same rounding); the GPU also
keeps bf16 activations and a bf16 KV cache where the bf16 engine does. Logits are held to the CPU
quantized tests' bound (test_quant_engine.LOGIT_REL_BOUND: max deviation over max |logit|) against
the fp32 CPU engine on the dequantized weights, and decode rows to prefill rows within it.
"""

import gc

import numpy as np
import pytest

from llama_brrr import quant

from test_cuda_kernels import decode_head_blocks
from test_quant_engine import KEPT, LOGIT_REL_BOUND, MIXED, quant_config, random_weights, rel_dev, types_for

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def C(cuda_C):
    return cuda_C


def engines(C, config, types, weights, max_batch=2, graphs=True, gpu_memory_utilization=None):
    """(CUDA engine on the blocks, CPU quantized engine on the same blocks, CPU f32 engine on
    their dequantized values), and the blocks by tensor name."""
    ids = quant.kept_types()
    type_ids = {n: ids[t] for n, t in types.items()}
    d = config.engine_dict(config.max_seq_len, max_batch)
    gpu = C.Engine("cuda", config.engine_dict(config.max_seq_len, max_batch,
                                              gpu_memory_utilization=gpu_memory_utilization), "bf16", 0, 0, type_ids)
    gpu.use_cuda_graphs = graphs
    cpu_q = C.Engine("cpu", d, "f32", 0, 1, type_ids)
    cpu_f = C.Engine("cpu", d, "f32", 0, 1)
    blocks = {}
    for name, w in weights.items():
        if name in types:
            blocks[name] = C.quant_ops.quantize(types[name], w)
            for e in (gpu, cpu_q):
                e.set_weight_blocks(name, blocks[name], ids[types[name]], list(w.shape))
            cpu_f.set_weight(name, C.quant_ops.dequantize(types[name], blocks[name], w.shape[1]), "f32")
        else:
            for e in (gpu, cpu_q, cpu_f):
                e.set_weight(name, w, "f32")
    return gpu, cpu_q, cpu_f, blocks


# A K-quant mix as llama.cpp's Q4_K_M makes it: a Q6_K wv (and w2) beside Q4_K, so wqkv is two parts
# that a decode row runs as one gemv_quant_pair launch.
K_MIX = {"wq": "q4_k", "wk": "q4_k", "wv": "q6_k", "wo": "q4_k", "w1": "q4_k", "w3": "q4_k", "w2": "q6_k",
         "tok_embeddings": "q4_k", "output": "q6_k"}
SPECS = {"mixed": MIXED, "k_mix": K_MIX}


def decode_steps(tokens, slot, n=4):
    """(step, position, engine.decode's arguments) for the last n tokens one row at a time at slot,
    after a prompt of the tokens before them: the first runs eager, the second is captured, the
    rest replay the graph."""
    for step, token in enumerate(tokens[-n:]):
        pos = len(tokens) - n + step
        yield step, pos, (np.array([token], np.int32), np.array([slot], np.int32), np.array([pos], np.int32))


@pytest.mark.parametrize("spec", KEPT + list(SPECS))
def test_quantized_logits_match_the_cpu_engine(C, rng, spec):
    config = quant_config()
    types = types_for(config, SPECS.get(spec, spec))
    gpu, cpu_q, cpu_f, blocks = engines(C, config, types, random_weights(config, rng))
    # the device holds the file's values bit for bit (repacked, then unpacked by get_weight)
    for name in ("layers.0.wq", "layers.0.wv", "layers.1.w2", "tok_embeddings"):
        if name in blocks:
            want = C.quant_ops.dequantize(types[name], blocks[name], config.tensor_shapes()[name][1])
            assert np.array_equal(gpu.get_weight(name), want), (spec, name)
    tokens = rng.integers(0, config.vocab_size, 23).astype(np.int32)
    want = cpu_f.prefill(0, tokens, 0, "all")
    got = gpu.prefill(0, tokens, 0, "all")  # 23 rows: the tensor-core GEMV (mixed w13: two chunks)
    assert np.isfinite(got).all()
    assert rel_dev(got, want) < LOGIT_REL_BOUND, spec
    assert rel_dev(got, cpu_q.prefill(0, tokens, 0, "all")) < LOGIT_REL_BOUND, spec
    # decode rows (gemv_quant on int8 activations) against the same positions run as a prompt
    gpu.prefill(1, tokens[:-4], 0, "none")
    cpu_q.prefill(1, tokens[:-4], 0, "none")
    for step, pos, args in decode_steps(tokens, slot=1):
        row = gpu.decode(*args)[0]
        assert rel_dev(row, want[pos]) < LOGIT_REL_BOUND, (spec, step)
        # The CPU engine's quantized decode takes int8 blocks of the same rule, but from fp32
        # inputs where the GPU rounds attention and MLP outputs (and the KV cache) to bf16 first,
        # which moves a row as much as the int8 rounding does. Both are held to the fp32 values:
        # the two rows differ by up to the sum of their deviations from them (H200, 1,000 rows of
        # every type: GPU 0.045 at most, CPU 0.043, GPU against CPU 0.030 on average, 0.067 at most).
        assert rel_dev(cpu_q.decode(*args)[0], want[pos]) < LOGIT_REL_BOUND, (spec, step)


@pytest.mark.parametrize("spec", ["q8_0", "k_mix"])
def test_quantized_decode_at_head_dim_128_matches_the_cpu_engine(C, rng, spec):
    """At head dim 128 flash_decode lets a quantized wo launch before its CTAs exit (early_trigger;
    before a bf16 wo it waits for them): decode rows over a context of three splits (the merge),
    eager, captured and replayed, against the fp32 CPU engine on the dequantized weights."""
    config = quant_config(dim=512, hidden_dim=512, n_heads=4, n_kv_heads=2, max_seq_len=192)
    assert config.head_dim == 128
    types = types_for(config, SPECS.get(spec, spec))
    gpu, _, cpu_f, _ = engines(C, config, types, random_weights(config, rng))
    tokens = rng.integers(0, config.vocab_size, 150).astype(np.int32)
    for e in (gpu, cpu_f):
        e.prefill(0, tokens[:-4], 0, "none")
    for step, pos, args in decode_steps(tokens, slot=0):
        row = gpu.decode(*args)[0]
        assert np.isfinite(row).all(), (spec, step)
        assert rel_dev(row, cpu_f.decode(*args)[0]) < LOGIT_REL_BOUND, (spec, step)


def test_batched_quantized_decode_rows_equal_each_row_alone(C, rng):
    """Batches of 2+ rows take gemv_quant_mma (weights decoded to bf16, tensor cores), whose rows
    do not depend on the batch: a row of a batch of 3 equals the same row beside a stranger up to
    flash_decode's batch-dependent split merge (1e-6, as test_cuda_engine). Batch 1 takes the int8
    gemv_quant: the same row alone agrees within the engine bound."""
    config = quant_config()
    types = types_for(config, MIXED)
    weights = random_weights(config, rng)
    batched, _, _, _ = engines(C, config, types, weights, max_batch=4)
    paired, _, _, _ = engines(C, config, types, weights, max_batch=4)
    alone, _, _, _ = engines(C, config, types, weights, max_batch=4)
    prompts = [rng.integers(0, config.vocab_size, n).astype(np.int32) for n in (4, 9, 15)]
    for slot, p in enumerate(prompts):
        for e in (batched, paired, alone):
            e.prefill(slot, p, 0, "none")
    positions = np.array([len(p) for p in prompts], np.int32)
    slots = np.arange(3, dtype=np.int32)
    stranger = 3
    for step in range(4):
        tokens = rng.integers(0, config.vocab_size, 3).astype(np.int32)
        together = batched.decode(tokens, slots, positions)
        for i in range(3):
            pair = paired.decode(np.array([tokens[i], 7], np.int32), np.array([slots[i], stranger], np.int32),
                                 np.array([positions[i], step], np.int32))[0]
            single = alone.decode(tokens[i:i + 1], slots[i:i + 1], positions[i:i + 1])[0]
            assert np.abs(together[i] - pair).max() <= 1e-6 * np.abs(pair).max(), (step, i)
            assert rel_dev(together[i], single) < LOGIT_REL_BOUND, (step, i)
        positions += 1


# flash_decode takes its tensor-core kernel from tuning::kDecodeMmaMinCtas one-split CTAs (a
# sequence's head block of one KV head each) on and its CUDA-core kernel below, except at head dim
# 64 (bf16 cache: these engines'), where it takes the tensor-core kernel at every batch
# (kDecodeMmaMinCtasHd64). The two sum in another order and the MMA rounds P to bf16, so rows of
# batches on the two sides agree within the batch rule, not to 1e-6.
MMA_MIN_CTAS = 64


def same_decode_attention(config, *batches) -> bool:
    if config.head_dim == 64:
        return True
    head_blocks = decode_head_blocks(config.n_heads, config.n_kv_heads)
    return len({B * config.n_kv_heads * head_blocks >= MMA_MIN_CTAS for B in batches}) == 1


# Batch sizes past 16 rows: one gemv_quant_mma call of 4 (17) or 8 (33, 64) n8 tiles per matrix
# of one type; a mixed w13 (two types, staged in the 16-row gate_up_) in even chunks of at most 16
# (17: 8 + 9; 33: 11 x 3; 64: 16 x 4), with the row counts of the last chunk odd where M is. Where
# gemm_quant runs (Hopper) it takes the rows past tuning::kGemvQuantMaxRowsBesideGemm (33, 64).
CHUNKED_BATCHES = (17, 33, 64)


def gemv_rows(C):
    """Rows up to which CudaEngine::matmul runs a quantized matrix on the tensor-core GEMV."""
    return 32 if C.testing.gemm_quant_available() else 64


@pytest.mark.parametrize("spec", ["mixed", "q4_k"])
@pytest.mark.parametrize("B", CHUNKED_BATCHES)
def test_chunked_quantized_decode_rows_equal_each_row_alone(C, rng, B, spec):
    """Decode batches of 17..64 rows run each quantized matrix of one type as one gemv_quant_mma
    pass (the fused epilogues, residual, SwiGLU output, RoPE positions, slots, q rows,
    the KV append, logits). Mixed types add the multi-part paths: fp32 staging of wqkv in one call
    per part, and the w13 in chunks of at most 16 rows, each with its inputs and destinations moved
    by the chunk's first row, reusing the gate_up scratch; past gemv_rows, gemm_quant. The rule of
    the batch test above per row: equal to the same row beside a stranger up to flash_decode's split
    merge (within the engine bound where the batch takes flash_decode's other kernel,
    same_decode_attention, or gemm_quant), within
    the engine bound of the row alone (int8 gemv_quant) and of the f32 CPU engine on the
    dequantized blocks."""
    config = quant_config()
    types = types_for(config, MIXED if spec == "mixed" else spec)
    weights = random_weights(config, rng)
    stranger = B  # a slot no batch row uses
    batched, _, cpu_f, _ = engines(C, config, types, weights, max_batch=B + 1)
    paired, _, _, _ = engines(C, config, types, weights, max_batch=B + 1)
    alone, _, _, _ = engines(C, config, types, weights, max_batch=B + 1)
    lengths = rng.integers(1, 24, B)
    for slot, n in enumerate(lengths):
        prompt = rng.integers(0, config.vocab_size, n).astype(np.int32)
        for e in (batched, paired, alone, cpu_f):
            e.prefill(slot, prompt, 0, "none")
    positions = lengths.astype(np.int32)
    # rows in another order than their slots, so a row offset taken for a slot offset shows
    slots = rng.permutation(B).astype(np.int32)
    positions = positions[slots]
    # whether the batch and the pair run the same kernels (then their rows agree to 1e-6)
    same_kernels = same_decode_attention(config, B, 2) and B <= gemv_rows(C)
    for step in range(3):  # eager, capture, replay
        tokens = rng.integers(0, config.vocab_size, B).astype(np.int32)
        together = batched.decode(tokens, slots, positions)
        assert together.shape == (B, config.vocab_size) and np.isfinite(together).all(), step
        want = cpu_f.decode(tokens, slots, positions)
        for i in range(B):
            pair = paired.decode(np.array([tokens[i], 7], np.int32), np.array([slots[i], stranger], np.int32),
                                 np.array([positions[i], step], np.int32))[0]
            single = alone.decode(tokens[i:i + 1], slots[i:i + 1], positions[i:i + 1])[0]
            if same_kernels:
                assert np.abs(together[i] - pair).max() <= 1e-6 * np.abs(pair).max(), (B, spec, step, i)
            else:
                assert rel_dev(together[i], pair) < LOGIT_REL_BOUND, (B, spec, step, i)
            assert rel_dev(together[i], single) < LOGIT_REL_BOUND, (B, spec, step, i)
            assert rel_dev(together[i], want[i]) < LOGIT_REL_BOUND, (B, spec, step, i)
        positions += 1


def test_decode_batches_on_gemv_quant_wgmma_match_the_cpu_engine(C, rng):
    """On Hopper a decode batch of 17-64 rows runs a matrix of enough 64-row blocks times 1024-k
    slices (tuning::kGemvQuantWgmmaMinUnits) on gemv_quant_wgmma: here the Q4_K w13 (its SwiGLU
    applied by the planes' sum) and the Q6_K LM head (StoreF32 into the logits) at 24, 40 and 64
    rows; the other matrices stay on the GEMV (24) or gemm_quant. Rows of each batch, eager, captured and replayed, against the fp32 CPU engine on the
    dequantized blocks."""
    if not C.testing.gemm_quant_available():
        pytest.skip("gemv_quant_wgmma runs on Hopper (sm_90a) only")
    config = quant_config(dim=1024, hidden_dim=12288, n_layers=1, n_heads=8, n_kv_heads=2, vocab_size=24576)
    ids = quant.kept_types()
    roomy = 1 << 30
    assert C.testing.gemv_quant_wgmma_takes([(ids["q4_k"], 2 * 12288)], 24, 1024, roomy)
    assert C.testing.gemv_quant_wgmma_takes([(ids["q6_k"], 24576)], 24, 1024, roomy)
    assert C.testing.gemv_quant_wgmma_takes([(ids["q6_k"], 24576)], 64, 1024, roomy)
    assert not C.testing.gemv_quant_wgmma_takes([(ids["q6_k"], 1024)], 40, 12288, roomy)  # w2: gemm_quant
    types = types_for(config, K_MIX)
    gpu, _, cpu_f, _ = engines(C, config, types, random_weights(config, rng), max_batch=64)
    for B in (24, 40, 64):
        lengths = rng.integers(1, 12, B)
        for slot, n in enumerate(lengths):
            prompt = rng.integers(0, config.vocab_size, n).astype(np.int32)
            for e in (gpu, cpu_f):
                e.prefill(slot, prompt, 0, "none")
        positions = lengths.astype(np.int32)
        slots = np.arange(B, dtype=np.int32)
        for step in range(3):  # eager, capture, replay
            tokens = rng.integers(0, config.vocab_size, B).astype(np.int32)
            got = gpu.decode(tokens, slots, positions)
            want = cpu_f.decode(tokens, slots, positions)
            assert got.shape == (B, config.vocab_size) and np.isfinite(got).all(), (B, step)
            for i in range(B):
                assert rel_dev(got[i], want[i]) < LOGIT_REL_BOUND, (B, step, i)
            positions += 1
    del gpu, cpu_f
    gc.collect()


@pytest.mark.parametrize("spec", ["mixed", "q4_k", "k_mix"])
@pytest.mark.parametrize("vocab_size", [300, 1100])
def test_all_logits_prefill_with_a_quantized_head(C, rng, spec, vocab_size):
    """Every row's logits of a prompt through a quantized LM head. 23 rows: the layers and the
    head through the GEMV (even passes of at most 16 rows). 100 rows: the layers through
    gemm_quant on Hopper (on wqkv's parts of two types for k_mix), the head in two calls
    (logit_rows_ = max_batch = 72, then 28). 300 rows: the layers through the bf16 GEMM on the
    dequantized scratch (past tuning::kGemmQuantMaxRows), the head 72 rows at a time (gemm_quant on
    Hopper). Off Hopper every call past 64 rows runs on the scratch. Every matrix here fits the
    scratch whole; test_the_dequantization_scratch_shrinks_to_the_l2_before_the_kv_cache_does
    slices one."""
    config = quant_config(vocab_size=vocab_size, max_seq_len=320)
    types = types_for(config, SPECS.get(spec, spec))
    assert "output" in types
    gpu, cpu_q, cpu_f, _ = engines(C, config, types, random_weights(config, rng), max_batch=72)
    for slot, T in enumerate((23, 100, 300)):
        tokens = rng.integers(0, config.vocab_size, T).astype(np.int32)
        got = gpu.prefill(slot, tokens, 0, "all")
        assert got.shape == (T, vocab_size) and np.isfinite(got).all(), (spec, T)
        want = cpu_f.prefill(slot, tokens, 0, "all")
        # the rule of the first test, over all rows: a misplaced chunk moves whole rows of
        # logits, a deviation of the size of the logits themselves
        assert rel_dev(got, want) < LOGIT_REL_BOUND, (spec, T)
        assert rel_dev(got, cpu_q.prefill(slot, tokens, 0, "all")) < LOGIT_REL_BOUND, (spec, T)
        # the KV cache the prompt left (RoPE and the append in the chunked or GEMM epilogues)
        row = gpu.decode(np.array([tokens[0]], np.int32), np.array([slot], np.int32), np.array([T], np.int32))[0]
        want_row = cpu_f.decode(np.array([tokens[0]], np.int32), np.array([slot], np.int32), np.array([T], np.int32))[0]
        assert rel_dev(row, want_row) < LOGIT_REL_BOUND, (spec, T)


def test_the_dequantization_scratch_shrinks_to_the_l2_before_the_kv_cache_does(C, rng):
    """Long prompts dequantize a quantized matrix whole into bf16 scratch where the budget
    (gpu_memory_utilization) holds it beside the KV cache asked for, else into a scratch of about
    the L2, a slice of columns at a time (gemm_dequant_slices). A model whose quantized LM head is
    2.5 L2s of bf16 values: with room, the scratch holds the head whole; under a budget halfway
    between the two arenas' sizes, the scratch is the L2's size, the KV cache still holds every
    slot's max_seq_len, and a prompt of 300 rows with every row's logits (logit_rows_ = max_batch
    = 300, past gemm_quant's rows) runs the head in at least two slices: against the fp32 CPU
    engine on the dequantized weights, under the first test's rule."""
    torch = pytest.importorskip("torch")
    l2_values = torch.cuda.get_device_properties(0).L2_cache_size // 2
    dim = 256
    vocab = (l2_values * 5 // 2 // dim + 127) // 128 * 128
    config = quant_config(dim=dim, vocab_size=vocab, max_seq_len=320)
    types = types_for(config, K_MIX)
    weights = random_weights(config, rng)
    roomy = engines(C, config, types, weights, max_batch=300)[0]
    whole = roomy.cuda_memory
    assert not whole["dequant_sliced"] and whole["dequant_scratch"] == vocab * dim * 2, whole
    kv_blocks = roomy.config["kv_blocks"]
    arena = whole["weights"] + whole["kv_cache"] + whole["buffers"]
    del roomy
    gc.collect()
    free, total = torch.cuda.mem_get_info()
    saved = whole["dequant_scratch"] - 2 * l2_values
    util = (total - free + arena - saved / 2) / total
    gpu, _, cpu_f, _ = engines(C, config, types, weights, max_batch=300, gpu_memory_utilization=util)
    tight = gpu.cuda_memory
    assert tight["dequant_sliced"] and tight["dequant_scratch"] == 2 * l2_values, tight
    assert gpu.config["kv_blocks"] == kv_blocks
    assert C.testing.gemm_dequant_slice_cols(300, vocab, dim, 1, l2_values) < vocab
    tokens = rng.integers(0, vocab, 300).astype(np.int32)
    got = gpu.prefill(0, tokens, 0, "all")
    assert got.shape == (300, vocab) and np.isfinite(got).all()
    assert rel_dev(got, cpu_f.prefill(0, tokens, 0, "all")) < LOGIT_REL_BOUND


def test_quantized_graph_replay_equals_eager(C, rng):
    config = quant_config(tie_embeddings=True)
    types = types_for(config, {"wq": "q4_k", "wk": "q4_k", "wv": "q6_k", "wo": "q8_0", "w1": "q4_k",
                               "w3": "q4_k", "w2": "q6_k", "tok_embeddings": "q6_k"})
    weights = random_weights(config, rng)
    graphed, _, _, _ = engines(C, config, types, weights, graphs=True)
    eager, _, _, _ = engines(C, config, types, weights, graphs=False)
    prompt = rng.integers(0, config.vocab_size, 7).astype(np.int32)
    for e in (graphed, eager):
        e.prefill(0, prompt, 0, "none")
    for step in range(4):
        args = (np.array([step + 3], np.int32), np.array([0], np.int32), np.array([7 + step], np.int32))
        np.testing.assert_array_equal(graphed.decode(*args), eager.decode(*args), err_msg=f"step {step}")


def test_blocks_arrive_in_row_chunks_and_bad_blocks_are_refused(C, rng):
    config = quant_config()
    ids = quant.kept_types()
    types = types_for(config, "q6_k")  # Q6_K: tiles and the tail of scales, both chunked
    e = C.Engine("cuda", config.engine_dict(16, 1), "bf16", 0, 0, {n: ids[t] for n, t in types.items()})
    w = random_weights(config, rng)["layers.0.w1"]
    blocks = C.quant_ops.quantize("q6_k", w)
    for r0 in range(0, len(blocks), 100):
        e.set_weight_blocks("layers.0.w1", blocks[r0:r0 + 100], ids["q6_k"], list(w.shape), r0)
    assert np.array_equal(e.get_weight("layers.0.w1"), C.quant_ops.dequantize("q6_k", blocks, w.shape[1]))
    with pytest.raises(ValueError, match="GGML type 8 given.*stores it as q6_k"):
        e.set_weight_blocks("layers.0.w1", blocks, ids["q8_0"], list(w.shape))
    with pytest.raises(ValueError, match="starting at row 150.*rows have arrived"):
        e.set_weight_blocks("layers.0.w1", blocks[150:], ids["q6_k"], list(w.shape), 150)
    with pytest.raises(ValueError, match="not a block format the CUDA engine keeps"):
        C.Engine("cuda", config.engine_dict(16, 1), "bf16", 0, 0, {"layers.0.wq": 1})
    with pytest.raises(ValueError, match="not a multiple of 256"):
        C.Engine("cuda", quant_config(dim=96, n_heads=2, n_kv_heads=1).engine_dict(16, 1), "bf16", 0, 0,
                 {"layers.0.wq": ids["q4_k"]})


def test_random_quantized_model_on_the_gpu_generates(C):
    from llama_brrr import Llama
    llm = Llama.random(quant_config(vocab_size=512), device="cuda", quant="q4_k_m", max_batch=2)
    assert "q4_k" in llm.weights_summary and "q6_k" in llm.weights_summary
    outs = llm.generate([[1, 2, 3], [4, 5]], max_tokens=6, ignore_eos=True)
    assert [len(o.token_ids) for o in outs] == [6, 6]
