"""Tensor parallelism on several GPUs: logits at TP 2 and 4 against TP 1 on the same weights under
docs/design.md's bf16 rule (vocabularies that the ranks divide and that they do not, tied
embeddings, one row and several: both ways of the LM head's all-gather), the same logits on every
rank, greedy tokens against TP 1, invalid token ids as on one GPU, sharded loading from GGUF files,
and the faults (a killed rank, an out-of-memory rank). One GPU suffices for the vocabulary-shard
embedding kernels and a rank engine's refusals. Each test is skipped unless the GPUs it needs are
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
from llama_brrr.tp import TensorParallelError, from_arrays, shard, worker  # noqa: E402
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
    # a vocabulary 2 and 4 divide (no padding on the last rank), MHA
    "even-vocab": ModelConfig(dim=256, hidden_dim=384, n_layers=2, n_heads=4, n_kv_heads=4,
                              head_dim=64, vocab_size=1024, name="even-vocab"),
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
        # one row of logits (the all-gather in place): a prompt's last row
        ours = every_rank_alike(tp, "prefill", 1, tokens[:20], 0, "last")
        one = single.prefill(1, tokens[:20], 0, "last")
        oracle, torch_bf16 = oracles.forward(list(tokens[:20]), 0)
        assert_bf16_rule(ours, oracle[-1:], torch_bf16[-1:], f"{name} TP {size} prefill, last row")
        assert rel_err(ours, one) <= 2 * rel_err(torch_bf16[-1:], oracle[-1:]), "TP vs one GPU, last row"
        # decode after the prefill, two sequences at once, through the CUDA graphs (eager, captured,
        # replayed), then one sequence alone (one row again)
        contexts = [list(tokens), list(tokens[:20])]
        for i in range(3):
            step = rng.integers(0, config.vocab_size, 2).astype(np.int32)
            slots = np.array([0, 1], np.int32)
            positions = np.array([len(c) for c in contexts], np.int32)
            ours = every_rank_alike(tp, "decode", step, slots, positions, True)
            one = single.decode(step, slots, positions, True)
            for row, context in enumerate(contexts):
                context.append(int(step[row]))
                oracle, torch_bf16 = oracles.forward(context, 0)
                assert_bf16_rule(ours[row], oracle[-1], torch_bf16[-1],
                                 f"{name} TP {size} decode {i}, row {row}")
                assert rel_err(ours[row], one[row]) <= 2 * rel_err(torch_bf16[-1], oracle[-1])
        for i in range(3):
            step = rng.integers(0, config.vocab_size, 1).astype(np.int32)
            slots, positions = np.array([1], np.int32), np.array([len(contexts[1])], np.int32)
            ours = every_rank_alike(tp, "decode", step, slots, positions, True)
            one = single.decode(step, slots, positions, True)
            contexts[1].append(int(step[0]))
            oracle, torch_bf16 = oracles.forward(contexts[1], 0)
            assert_bf16_rule(ours[0], oracle[-1], torch_bf16[-1], f"{name} TP {size} decode of one row, {i}")
            assert rel_err(ours[0], one[0]) <= 2 * rel_err(torch_bf16[-1], oracle[-1])


def every_rank_alike(tp, call, *args):
    """Every rank's answer to engine call `call`: the logits must be the same bits on every rank
    (each logit is one row of the LM head on one rank, gathered to all), since each rank samples
    from its own copy. Returns rank 0's."""
    answers = tp.engine._broadcast(("call", call, args, {}))
    for rank, answer in enumerate(answers[1:], 1):
        np.testing.assert_array_equal(answer, answers[0], err_msg=f"{call}: rank {rank} differs from rank 0")
    return answers[0]


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
@pytest.mark.parametrize("name", ["gqa-untied", "few-kv-tied"])
def test_greedy_tokens_equal_one_gpu(C, rng, make_weights, size, name):
    need_gpus(size)
    config = CONFIGS[name]
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
        # pipelined steps (each step's decode launched on the ranks before the last one is read):
        # the same tokens as step by step, and nothing left in flight afterwards
        tp._scheduler = tp.make_scheduler(pipeline=False)
        stepped = [o.token_ids for o in tp.generate(prompts, max_tokens=32, temperature=0, ignore_eos=True)]
        tp._scheduler = tp.make_scheduler(pipeline=True)
        pipelined = [o.token_ids for o in tp.generate(prompts, max_tokens=32, temperature=0, ignore_eos=True)]
        assert pipelined == stepped
        assert tp.engine.decode_pending == 0
        assert tp.make_scheduler().pipeline  # a GPU group's default, as one GPU's
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
        # a replicated tensor is the same on both ranks, and so are the shards (element i of a
        # tensor's draw depends on i alone): rank 1's 500 vocabulary rows are rank 0's first 500
        norms = tp.engine._broadcast(("call", "get_weight", ("norm",), {}))
        np.testing.assert_array_equal(norms[0], norms[1])
        shards = tp.engine._broadcast(("call", "get_weight", ("tok_embeddings",), {}))
        assert [s.shape[0] for s in shards] == [501, 500]
        np.testing.assert_array_equal(shards[0][:500], shards[1])


def test_an_invalid_token_id_is_refused_as_on_one_gpu(C, rng, make_weights):
    need_gpus(2)
    config = CONFIGS["gqa-untied"]
    weights = bf16_rounded(make_weights(config, rng))
    single = one_gpu_engine(C, config, weights)
    with from_arrays(config, weights, 2, max_seq_len=64, max_batch=2) as tp:
        for bad in (config.vocab_size, -1):
            tokens = np.array([5, bad, 7], np.int32)
            for call, args in (("prefill", (0, tokens, 0, "last")),
                               ("decode", (tokens[:2], np.array([0, 1], np.int32), np.zeros(2, np.int32), True))):
                with pytest.raises(ValueError) as one:
                    getattr(single, call)(*args)
                with pytest.raises(ValueError) as ours:
                    getattr(tp.engine, call)(*args)
                assert f"token id {bad} is out of range for vocab_size {config.vocab_size}" in str(one.value)
                assert str(ours.value) == f"tensor-parallel rank 0: {one.value}", call
        assert tp.engine.alive  # refused alike on every rank before any collective
        tokens = rng.integers(0, config.vocab_size, 9).astype(np.int32)
        tokens[-1] = config.vocab_size - 1  # the last row of the last rank
        ours, one = tp.engine.prefill(0, tokens, 0, "all"), single.prefill(0, tokens, 0, "all")
        oracle, torch_bf16 = Oracles(config, weights).forward(tokens.tolist(), 0)
        assert rel_err(ours, one) <= 2 * rel_err(torch_bf16, oracle)


# ---- one GPU: the vocabulary-shard embedding kernels and a rank engine's refusals ---------------

@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("quant", [None, "q8_0", "q6_k"])
def test_embedding_shards_sum_to_the_whole_embedding(C, rng, size, quant):
    """What each rank's embed (or embed_quant) writes, as the engine calls it (rank r's rows from
    r * Vs, Vs rows with the last rank's padded by zero rows): its own tokens' rows, zeros for the
    other ranks' tokens, NaN for an invalid id on rank 0 only; so the residual all-reduce's sum is
    the whole table's embedding, NaN rows included, exactly."""
    need_gpus(1)
    from test_cuda_gemv_quant import Weights

    V, D, M = CONFIGS["gqa-untied"].vocab_size, 256, 9
    Vs = -(-V // size)
    ids = rng.integers(0, V, M).astype(np.int32)
    ids[:4] = [0, V - 1, Vs - 1, V]  # first and last rows, the end of rank 0's rows, invalid
    ids[5] = -1
    tokens = torch.from_numpy(ids).cuda()
    if quant is None:
        table = torch.randn((V, D), device="cuda").to(torch.bfloat16)
        whole = table.float().cpu().numpy()
    else:
        weights = Weights(C, quant, V, D, rng)
        whole = weights.deq
    parts = []
    for rank in range(size):
        rows = shard.vocab_rows(CONFIGS["gqa-untied"], rank, size)  # its vocab_size is V
        x = torch.full((M, D), float("nan"), device="cuda")
        if quant is None:
            own = torch.zeros((Vs, D), dtype=torch.bfloat16, device="cuda")
            own[:len(rows)] = table[rows.start:rows.stop]
            C.testing.embed(tokens.data_ptr(), own.data_ptr(), x.data_ptr(), M, D, V,
                            vocab_offset=rows.start, vocab_rows=Vs)
        else:
            blocks = np.zeros((Vs, weights.blocks.shape[1]), np.uint8)
            blocks[:len(rows)] = weights.blocks[rows.start:rows.stop]
            own = torch.from_numpy(C.quant_ops.gpu_repack(quant, blocks, D)).cuda()
            C.testing.embed_quant(tokens.data_ptr(), weights.type_id, own.data_ptr(), x.data_ptr(), M, D, V,
                                  vocab_offset=rows.start, vocab_rows=Vs)
        torch.cuda.synchronize()
        got = x.cpu().numpy()
        for m, t in enumerate(ids):
            if t in rows:
                np.testing.assert_array_equal(got[m], whole[t], err_msg=f"rank {rank}, token {t}")
            elif 0 <= t < V or rank > 0:
                assert (got[m] == 0).all(), f"rank {rank}: token {t} of another rank is not a zero row"
            else:
                assert np.isnan(got[m]).all(), f"rank 0: invalid token {t} is not a NaN row"
        parts.append(got)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    for m, t in enumerate(ids):
        if 0 <= t < V:
            np.testing.assert_array_equal(total[m], whole[t])
        else:
            assert np.isnan(total[m]).all()
    with pytest.raises(RuntimeError, match="holds no row"):
        C.testing.embed(tokens.data_ptr(), tokens.data_ptr(), tokens.data_ptr(), 1, D, V,
                        vocab_offset=V, vocab_rows=1)


def test_a_rank_engine_runs_only_in_its_group_and_as_its_rank(C, rng, make_weights):
    need_gpus(1)
    config = CONFIGS["gqa-untied"]
    local = shard.local_config(config, 1, 2)
    engine = C.Engine("cuda", local.engine_dict(64, 1), "bf16", 0)
    assert (engine.config["tp_rank"], engine.config["tp_size"]) == (1, 2)
    weights = make_weights(config, rng)
    with pytest.raises(ValueError, match=r"'output' has shape \(1001, 200\) but the config expects \(500, 200\)"):
        engine.set_weight("output", np.ascontiguousarray(weights["output"], dtype=np.float32), "f32")
    for name, array in weights.items():
        engine.set_weight(name, np.ascontiguousarray(shard.shard_array(array, config, name, 1, 2),
                                                     dtype=np.float32), "f32")
    np.testing.assert_array_equal(engine.get_weight("tok_embeddings"),
                                  bf16_rounded({"t": weights["tok_embeddings"][501:]})["t"])
    with pytest.raises(RuntimeError, match="rank 1 of 2 .*init_tensor_parallel"):
        engine.prefill(0, np.arange(3, dtype=np.int32), 0, "last")
    with pytest.raises(RuntimeError, match="rank 1 of 2 .*init_tensor_parallel"):
        engine.decode(np.arange(1, dtype=np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), True)
    with pytest.raises(ValueError, match="joining as rank 0 of 2, but this engine was built as rank 1 of 2"):
        engine.init_tensor_parallel(bytes(128), 0, 2, worker.nccl_library())


# ---- the one-shot all-reduce (csrc/cuda/allreduce.cu) -------------------------------------------

def p2p_everywhere(size):
    return all(torch.cuda.can_device_access_peer(a, b) for a in range(size) for b in range(size)
               if a != b)


def open_one_shot(tp, size):
    """The group's all-reduce info; it must be on exactly where every pair of GPUs has P2P."""
    info = tp.engine.all_reduce_info()
    assert info["oneshot"] == p2p_everywhere(size), info
    if not info["oneshot"]:
        assert info["why_not"], info
        pytest.skip(f"no P2P between these GPUs: {info['why_not']}")
    return info


@pytest.mark.parametrize("size", [2, 4])
def test_one_shot_all_reduce_is_the_rank_order_fp32_sum_on_every_rank(C, rng, size):
    need_gpus(size)
    config = CONFIGS["gqa-untied"]
    with Llama.random(config, seed=1, tensor_parallel=size, max_seq_len=64, max_batch=2) as tp:
        info = open_one_shot(tp, size)
        # every residual message of this engine (up to 64 rows of dim) fits the one-shot path
        assert info["oneshot_max_bytes"] >= 4 * 64 * config.dim
        ll_rows = info["ll_max_bytes"] // (4 * config.dim)
        assert ll_rows >= 1, info  # a batch-1 decode message takes the low-latency form
        for rows in (1, 3, 17, 64):  # odd row counts, and the engine's largest message
            count = rows * config.dim
            for _ in range(3):  # consecutive calls alternate the double-buffered halves
                values = [(rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
                          for _ in range(size)]
                ours = tp.engine.all_reduce(values, "oneshot")  # destinations NaN-poisoned first
                nccl = tp.engine.all_reduce(values, "nccl")
                in_rank_order = values[0].copy()
                for v in values[1:]:
                    in_rank_order = in_rank_order + v  # float32 adds, IEEE round to nearest
                for r in range(size):  # bit-identical on every rank: the ranks sample alike
                    np.testing.assert_array_equal(ours[r], in_rank_order, err_msg=f"rank {r}, {rows} rows")
                if rows <= ll_rows:  # the low-latency form, sharing the rounds: the same bits
                    ll = tp.engine.all_reduce(values, "ll")
                    for r in range(size):
                        np.testing.assert_array_equal(ll[r], in_rank_order, err_msg=f"ll rank {r}, {rows} rows")
                exact = np.sum(np.stack(values).astype(np.float64), axis=0)
                bound = size * np.finfo(np.float32).eps * np.sum(np.abs(np.stack(values)), axis=0,
                                                                  dtype=np.float64)
                assert (np.abs(nccl[0] - exact) <= bound).all()
                assert (np.abs(ours[0] - exact) <= bound).all()
                if size == 2:  # a + b == b + a: NCCL's order cannot differ
                    np.testing.assert_array_equal(ours[0], nccl[0])


def test_one_shot_all_reduce_refuses_what_it_cannot_take_and_the_group_goes_on(C, rng):
    need_gpus(2)
    config = CONFIGS["gqa-untied"]
    with Llama.random(config, seed=1, tensor_parallel=2, max_seq_len=64, max_batch=2) as tp:
        info = open_one_shot(tp, 2)
        too_many = info["oneshot_max_bytes"] // 4 + 4
        with pytest.raises(ValueError, match="nccl"):
            tp.engine.all_reduce([np.ones(too_many, np.float32)] * 2, "oneshot")
        with pytest.raises(ValueError, match="multiple of 4"):
            tp.engine.all_reduce([np.ones(6, np.float32)] * 2, "oneshot")
        with pytest.raises(ValueError, match="low-latency capacity"):
            tp.engine.all_reduce([np.ones(info["ll_max_bytes"] // 4 + 4, np.float32)] * 2, "ll")
        with pytest.raises(ValueError, match="method"):
            tp.engine.all_reduce([np.ones(8, np.float32)] * 2, "ring")
        with pytest.raises(ValueError, match="multiple of 16"):
            tp.engine.all_reduce_bench(1000, "oneshot", 2, 2)
        assert tp.engine.alive
        values = [rng.standard_normal(8).astype(np.float32) for _ in range(2)]
        np.testing.assert_array_equal(tp.engine.all_reduce(values, "oneshot")[1], values[0] + values[1])
        # the benchmark: positive figures for every method, in the engine's group and beyond it
        for nbytes in (16384, 2 * info["oneshot_max_bytes"]):
            for method in ("oneshot", "nccl", "ll"):
                if method == "ll" and nbytes > info["ll_max_bytes"]:
                    with pytest.raises(ValueError, match="low-latency capacity"):
                        tp.engine.all_reduce_bench(nbytes, method, 5, 3)
                    continue
                us = tp.engine.all_reduce_bench(nbytes, method, 5, 3)
                assert 0 < us < 1e5, (nbytes, method, us)
        np.testing.assert_array_equal(tp.engine.all_reduce(values, "oneshot")[0], values[0] + values[1])


@pytest.mark.parametrize("size", [2, 4])
def test_a_long_prefill_takes_nccl_and_decode_the_one_shot_kernel(C, rng, make_weights, size):
    need_gpus(size)
    # wide enough that a prefill chunk of 1024+ rows (4 MB of fp32 residual) passes the switch point
    config = ModelConfig(dim=1024, hidden_dim=2048, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=128,
                         vocab_size=1001, name="wide")
    weights = bf16_rounded(make_weights(config, rng))
    single = one_gpu_engine(C, config, weights, max_seq=2048, max_batch=1)
    oracles = Oracles(config, weights)
    with from_arrays(config, weights, size, max_seq_len=2048, max_batch=1) as tp:
        info = open_one_shot(tp, size)
        switch_rows = info["oneshot_max_bytes"] // (4 * config.dim)
        # a whole chunk, then one just past the switch point whose rows the ranks do not divide
        # (last, so that the decode steps after it fit the context)
        for n in (2048, switch_rows + 37):
            assert switch_rows < n <= 2048
            tokens = rng.integers(0, config.vocab_size, n).astype(np.int32)
            tp.engine.profile_enabled = True
            ours = tp.engine.prefill(0, tokens, 0, "all")  # every row: each rank's share of x gathered
            names = {record[0] for record in tp.engine.profile_records()}
            tp.engine.profile_enabled = False
            # past the switch point the bf16 parts cross the links; 2 ranks sum, add and
            # normalize them in the rows kernel, more through NCCL, then the add (with the next
            # RMSNorm, but after the last layer)
            want = {"all_reduce_rows"} if size == 2 else {"all_reduce", "add_rmsnorm", "add_partials"}
            assert want <= names, (n, names)
            one = single.prefill(0, tokens, 0, "all")
            oracle, torch_bf16 = oracles.forward(tokens.tolist(), 0)
            assert_bf16_rule(ours, oracle, torch_bf16, f"TP {size} prefill of {n} rows through NCCL")
            assert rel_err(ours, one) <= 2 * rel_err(torch_bf16, oracle)
        tp.engine.profile_enabled = True
        step = np.array([tokens[-1]], np.int32)
        decoded = [tp.engine.decode(step, np.array([0], np.int32), np.array([n + i], np.int32), True)
                   for i in range(3)]  # eager, captured, replayed
        names = {record[0] for record in tp.engine.profile_records()}
        tp.engine.profile_enabled = False
        # a decode message (4 KB) is within the low-latency capacity: the LL form of the one-shot kernel
        assert 4 * config.dim <= info["ll_max_bytes"] and "all_reduce_ll" in names, names
        for i, logits in enumerate(decoded):
            want = single.decode(step, np.array([0], np.int32), np.array([n + i], np.int32), True)
            oracle, torch_bf16 = oracles.forward(tokens.tolist() + [step[0]] * (i + 1), 0)
            assert_bf16_rule(logits, oracle[-1:], torch_bf16[-1:], f"TP {size} decode {i} through the one-shot kernel")
            assert rel_err(logits, want) <= 2 * rel_err(torch_bf16[-1:], oracle[-1:])
