"""Tensor parallelism on several GPUs: logits at TP 2 and 4 against TP 1 on the same weights under
docs/design.md's bf16 rule, greedy tokens against TP 1, sharded loading from GGUF files, and the
faults (a killed rank, an out-of-memory rank). Each test is skipped unless the GPUs it needs are
visible (torch.cuda.device_count()).

The weights: random_weights rounded to bf16, handed whole to every rank (tp.from_arrays), which
keeps its shards; TP 1 is a _C.Engine on cuda:0 given the same arrays. The bf16 rule holds the
tensor-parallel logits to the fp32 oracle as it holds one GPU's: relative error at most twice that
of PyTorch in bf16.
"""

import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llama_brrr import Llama  # noqa: E402
from llama_brrr.config import ModelConfig  # noqa: E402
from llama_brrr.tp import TensorParallelError, from_arrays  # noqa: E402
from test_cuda_engine import Oracles, assert_bf16_rule, bf16_rounded, rel_err  # noqa: E402
from test_tp_shard import SHARD_GGUF_CONFIG, write_sharding_gguf  # noqa: E402
from test_tp_workers import wait_gone  # noqa: E402

pytestmark = pytest.mark.cuda

CONFIGS = {
    # GQA 8/4: 2 KV heads per rank at TP 2, 1 at TP 4; untied head, odd vocab and widths per rank
    "gqa-untied": ModelConfig(dim=200, hidden_dim=344, n_layers=2, n_heads=8, n_kv_heads=4,
                              head_dim=64, vocab_size=1001, name="gqa-untied"),
    # 2 KV heads over 4 ranks (each replicated on two), tied embeddings, head_dim 128, llama3 rope
    "few-kv-tied": ModelConfig(dim=256, hidden_dim=520, n_layers=2, n_heads=8, n_kv_heads=2,
                               head_dim=128, vocab_size=515, rope_theta=500000.0,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64},
                               tie_embeddings=True, name="few-kv-tied"),
}


def need_gpus(n):
    if not torch.cuda.is_available() or torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs, {torch.cuda.device_count()} visible")


@pytest.fixture(scope="module")
def C(cuda_C):
    return cuda_C


def one_gpu_engine(C, config, weights, max_seq=64, max_batch=2):
    engine = C.Engine("cuda", config.engine_dict(max_seq, max_batch), "bf16", 0)
    for name, array in weights.items():
        engine.set_weight(name, np.ascontiguousarray(array, dtype=np.float32), "f32")
    return engine


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_follow_the_bf16_rule_like_one_gpu(C, rng, make_weights, size, name):
    need_gpus(size)
    config = CONFIGS[name]
    weights = bf16_rounded(make_weights(config, rng))
    single = one_gpu_engine(C, config, weights)
    oracles = Oracles(config, weights)
    with from_arrays(config, weights, size, max_seq_len=64, max_batch=2) as tp:
        assert tp.tensor_parallel == size
        for w in ("layers.1.wk", "layers.0.w2", "tok_embeddings"):  # the ranks hold exactly these
            np.testing.assert_array_equal(tp.engine.get_weight(w), weights[w])
        tokens = rng.integers(0, config.vocab_size, 37).astype(np.int32)
        ours = tp.engine.prefill(0, tokens, 0, "all")
        oracle, torch_bf16 = oracles.forward(tokens, 0)
        assert_bf16_rule(ours, oracle, torch_bf16, f"{name} TP {size} prefill")
        one = single.prefill(0, tokens, 0, "all")
        assert rel_err(ours, one) <= 2 * rel_err(torch_bf16, oracle), "TP vs one GPU"
        # decode after the prefill, two sequences at once, through the CUDA graphs
        single.prefill(1, tokens[:20], 0, "none")
        tp.engine.prefill(1, tokens[:20], 0, "none")
        step = rng.integers(0, config.vocab_size, 2).astype(np.int32)
        slots, positions = np.array([0, 1], np.int32), np.array([37, 20], np.int32)
        ours = tp.engine.decode(step, slots, positions, True)
        for row, context in enumerate((list(tokens), list(tokens[:20]))):
            oracle, torch_bf16 = oracles.forward(context + [step[row]], 0)
            assert_bf16_rule(ours[row], oracle[-1], torch_bf16[-1],
                             f"{name} TP {size} decode, row {row}")


def greedy_until_near_tie(reference: Llama, prompt, ours, theirs, margin=0.05):
    """Greedy tokens must agree until the reference's top-2 logits come within `margin` (bf16
    partial sums may order a near-tie either way): the first difference must be such a tie."""
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            logits = reference.forward(prompt + theirs[:i])[-1]
            top2 = np.sort(logits)[-2:]
            assert top2[1] - top2[0] < margin, f"greedy tokens differ at {i} without a near-tie"
            return i
    return len(ours)


@pytest.mark.parametrize("size", [2, 4])
def test_greedy_tokens_equal_one_gpu(C, rng, make_weights, size):
    need_gpus(size)
    config = CONFIGS["gqa-untied"]
    weights = bf16_rounded(make_weights(config, rng))
    single = Llama(one_gpu_engine(C, config, weights, max_seq=128, max_batch=4), config, None,
                   device="cuda:0", dtype="bf16", max_seq_len=128, max_batch=4)
    prompts = [rng.integers(3, config.vocab_size, n).tolist() for n in (5, 17, 30)]
    with from_arrays(config, weights, size, max_seq_len=128, max_batch=4) as tp:
        ours = [o.token_ids for o in tp.generate(prompts, max_tokens=32, temperature=0, ignore_eos=True)]
        theirs = [o.token_ids for o in single.generate(prompts, max_tokens=32, temperature=0,
                                                        ignore_eos=True)]
        agreed = [greedy_until_near_tie(single, p, a, b) for p, a, b in zip(prompts, ours, theirs)]
        assert sum(agreed) >= 16, agreed  # most of the tokens, not a vacuous pass
        # sampling too: same seeds, same logits on every rank -> one answer
        sampled = tp.generate(prompts, max_tokens=16, temperature=0.9, top_p=0.95, seed=3)
        again = tp.generate(prompts, max_tokens=16, temperature=0.9, top_p=0.95, seed=3)
        assert [o.token_ids for o in sampled] == [o.token_ids for o in again]


@pytest.mark.parametrize("size", [2, 4])
def test_sharded_float_gguf_loads_the_file_weights(C, rng, tmp_path, size):
    need_gpus(size)
    path = write_sharding_gguf(C, tmp_path / "f16.gguf", SHARD_GGUF_CONFIG, {}, rng)
    single = Llama.from_pretrained(str(path), device="cuda", max_seq_len=64, max_batch=1,
                                   progress=False)
    with Llama.from_pretrained(str(path), device="cuda", max_seq_len=64, max_batch=1,
                               progress=False, tensor_parallel=size) as tp:
        assert tp.tensor_parallel == size
        for name in SHARD_GGUF_CONFIG.tensor_shapes():
            np.testing.assert_array_equal(tp.engine.get_weight(name), single.engine.get_weight(name),
                                          err_msg=name)
        tokens = rng.integers(0, SHARD_GGUF_CONFIG.vocab_size, 23).tolist()
        ours, one = tp.forward(tokens), single.forward(tokens)
        weights = {n: single.engine.get_weight(n) for n in SHARD_GGUF_CONFIG.tensor_shapes()}
        oracle, torch_bf16 = Oracles(SHARD_GGUF_CONFIG, weights).forward(tokens, 0)
        assert_bf16_rule(ours, oracle, torch_bf16, f"TP {size} from a GGUF")
        assert rel_err(ours, one) <= 2 * rel_err(torch_bf16, oracle)


def test_sharded_quantized_gguf_keeps_the_blocks(C, rng, tmp_path):
    need_gpus(2)
    types = {"layers.0.wq": "q8_0", "layers.0.wk": "q4_k", "layers.0.wo": "q8_0",
             "layers.0.w1": "q4_k", "layers.0.w2": "q4_k", "layers.1.wv": "q6_k",
             "layers.1.w2": "q8_0", "output": "q8_0"}
    path = write_sharding_gguf(C, tmp_path / "mixed.gguf", SHARD_GGUF_CONFIG, types, rng)
    single = Llama.from_pretrained(str(path), device="cuda", max_seq_len=64, max_batch=1,
                                   progress=False)
    with Llama.from_pretrained(str(path), device="cuda", max_seq_len=64, max_batch=1,
                               progress=False, tensor_parallel=2) as tp:
        assert tp.weight_types == single.weight_types
        for name in types:  # the blocks as stored: dequantized, the same values
            np.testing.assert_array_equal(tp.engine.get_weight(name), single.engine.get_weight(name),
                                          err_msg=name)
        tokens = rng.integers(0, SHARD_GGUF_CONFIG.vocab_size, 23).tolist()
        # same int8 activation blocks on both sides (shards are whole blocks): only the order of
        # the fp32 partial sums and bf16 roundings differs
        assert rel_err(tp.forward(tokens), single.forward(tokens)) < 2e-2


def test_a_killed_rank_mid_generation_stops_every_rank(C, rng, make_weights):
    need_gpus(2)
    config = CONFIGS["gqa-untied"]
    import threading

    tp = from_arrays(config, make_weights(config, rng), 2, max_seq_len=16384, max_batch=4)
    pids = tp.engine.pids
    prompts = [rng.integers(3, config.vocab_size, 8).tolist() for _ in range(4)]
    failure = []

    def generate():
        try:
            tp.generate(prompts, max_tokens=16000, temperature=0, ignore_eos=True)
        except Exception as exc:  # noqa: BLE001 - the test inspects it below
            failure.append(exc)

    thread = threading.Thread(target=generate)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive(), "generation ended before the kill: make it longer"
    os.kill(pids[1], 9)
    t0 = time.monotonic()
    thread.join(30)
    assert not thread.is_alive(), "the caller hangs after a rank died"
    assert time.monotonic() - t0 < 15
    assert len(failure) == 1 and isinstance(failure[0], TensorParallelError), failure
    assert "rank 1" in str(failure[0])
    assert wait_gone(pids, 15) == []


def test_out_of_memory_on_one_rank_is_a_memory_error_and_stops_every_rank(C, rng, make_weights):
    need_gpus(2)
    config = CONFIGS["gqa-untied"]
    free1, _ = torch.cuda.mem_get_info(1)
    hog = torch.empty(int(free1 * 0.9), dtype=torch.uint8, device="cuda:1")  # rank 1's GPU only
    try:
        # K and V, bf16, each layer, 16 positions, the 2 KV heads a rank holds at TP 2
        blocks = int(free1 * 0.5) // (2 * 2 * config.n_layers * 16 * 2 * config.head_dim)
        t0 = time.monotonic()
        with pytest.raises((MemoryError, RuntimeError), match="rank 1"):
            from_arrays(config, make_weights(config, rng), 2, max_seq_len=64, max_batch=1,
                        kv_blocks=blocks)
        assert time.monotonic() - t0 < 60
    finally:
        del hog
        torch.cuda.empty_cache()


def test_more_ranks_than_gpus_is_a_value_error_naming_both(C):
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"tensor_parallel={count + 1} needs {count + 1} GPUs but "
                                         rf"{count} are visible"):
        Llama.random(CONFIGS["gqa-untied"], device="cuda", tensor_parallel=count + 1)


def test_random_shapes_at_tensor_parallel_generate(C):
    need_gpus(2)
    with Llama.random(CONFIGS["gqa-untied"], seed=7, tensor_parallel=2, max_seq_len=64,
                      max_batch=2) as tp:
        out = tp.generate([[1, 2, 3], [4, 5]], max_tokens=8, temperature=0, ignore_eos=True)
        assert [len(o.token_ids) for o in out] == [8, 8]
        # the replicated tensors are the same on both ranks (one draw per tensor and shape)
        shards = tp.engine._broadcast(("call", "get_weight", ("tok_embeddings",), {}))
        np.testing.assert_array_equal(shards[0], shards[1])
