"""The paged KV cache at the engine boundary, on both backends (csrc/model.h KvPages, BlockTables):
tables in any block order give the same logits as the default layout; slots that share prefix
blocks read them; a position without a block, a block outside the pool and a row too long are
refused with the argument named; the pool size the config asks for is the one the engine makes."""
import numpy as np
import pytest

from llama_brrr.config import ModelConfig

CONFIG = ModelConfig(dim=128, hidden_dim=192, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                     vocab_size=300)
MAX_SEQ, MAX_BATCH, BLOCK = 100, 3, 16
BPS = -(-MAX_SEQ // BLOCK)


def backends(C):
    return ["cpu"] + (["cuda"] if C.cuda_compiled() and C.cuda_device_count() > 0 else [])


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def backend(request, C):
    if request.param not in backends(C):
        pytest.skip("no CUDA device")
    return request.param


def engine(C, backend, weights, **pool):
    d = CONFIG.engine_dict(MAX_SEQ, MAX_BATCH)
    d.update(kv_block_size=BLOCK, **pool)
    e = C.Engine(backend, d, "f32" if backend == "cpu" else "bf16")
    for name, array in weights.items():
        e.set_weight(name, np.ascontiguousarray(array, dtype=np.float32), "f32")
    return e


def run(e, slot, prompt, n_decode):
    """Prefill of prompt[:-1] in two chunks, then n_decode greedy decode steps; every logit row."""
    cut = len(prompt) // 2
    e.prefill(slot, prompt[:cut], 0, "none")
    rows = [e.prefill(slot, prompt[cut:-1], cut, "last")[0]]
    token, pos = int(prompt[-1]), len(prompt) - 1
    for _ in range(n_decode):
        logits = e.decode(np.array([token], np.int32), np.array([slot], np.int32), np.array([pos], np.int32))[0]
        rows.append(logits)
        token, pos = int(np.argmax(logits)), pos + 1
    return np.stack(rows)


@pytest.fixture
def weights(make_weights, rng):
    return make_weights(CONFIG, rng)


def test_shuffled_tables_give_the_default_layouts_logits(C, backend, weights, rng):
    prompt = rng.integers(0, CONFIG.vocab_size, 70).astype(np.int32)
    plain = engine(C, backend, weights)
    assert plain.config["kv_blocks"] == MAX_BATCH * BPS and plain.config["kv_block_size"] == BLOCK
    expected = run(plain, 1, prompt, 12)
    shuffled = engine(C, backend, weights)
    order = rng.permutation(MAX_BATCH * BPS).astype(np.int32)
    for slot in range(MAX_BATCH):
        shuffled.set_block_table(slot, order[slot * BPS:(slot + 1) * BPS])
    np.testing.assert_array_equal(run(shuffled, 1, prompt, 12), expected)


def test_a_slot_reads_shared_prefix_blocks(C, backend, weights, rng):
    """Slot 2 takes slot 0's first two blocks (32 positions) and computes only the rest."""
    prompt = rng.integers(0, CONFIG.vocab_size, 60).astype(np.int32)
    e = engine(C, backend, weights, kv_blocks=2 * BPS)
    first = list(range(BPS))
    e.set_block_table(0, np.array(first, np.int32))
    e.prefill(0, prompt[:40], 0, "none")
    e.set_block_table(2, np.array(first[:2] + list(range(BPS, 2 * BPS - 2)), np.int32))
    e.set_history(2, 0, prompt[:32])
    e.prefill(2, prompt[32:-1], 32, "none")
    got = e.decode(prompt[-1:], np.array([2], np.int32), np.array([len(prompt) - 1], np.int32))[0]
    alone = engine(C, backend, weights)
    alone.prefill(0, prompt[:-1], 0, "none")
    want = alone.decode(prompt[-1:], np.array([0], np.int32), np.array([len(prompt) - 1], np.int32))[0]
    # The shared prefix was computed in another chunking: within the engine's batch rule.
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()
    assert int(np.argmax(got)) == int(np.argmax(want))


def test_table_errors_name_the_problem(C, backend, weights):
    e = engine(C, backend, weights, kv_blocks=BPS + 2)
    assert e.config["kv_blocks"] == BPS + 2
    tokens = np.arange(20, dtype=np.int32)
    # The default layout gives slot 0 its BPS blocks and slot 1 the 2 left: positions 32.. of slot 1 have none.
    with pytest.raises(ValueError, match=r"slot 1 has no KV block for positions \[32, 48\)"):
        e.prefill(1, np.arange(40, dtype=np.int32), 0, "none")
    with pytest.raises(ValueError, match="no KV block"):
        e.decode(tokens[:1], np.array([2], np.int32), np.array([0], np.int32))
    with pytest.raises(ValueError, match=r"blocks\[1\] = 99 is not a block of the pool"):
        e.set_block_table(1, np.array([0, 99], np.int32))
    with pytest.raises(ValueError, match="holds at most"):
        e.set_block_table(1, np.zeros(BPS + 1, np.int32))
    with pytest.raises(ValueError, match="set_history"):
        e.set_history(0, MAX_SEQ - 2, tokens[:3])
    e.set_block_table(2, np.array([BPS, BPS + 1], np.int32))  # the engine stays usable
    assert e.prefill(2, tokens, 0, "last").shape == (1, CONFIG.vocab_size)


def test_bad_pool_config_raises(C, backend):
    d = CONFIG.engine_dict(MAX_SEQ, MAX_BATCH)
    for key, value, message in (("kv_block_size", 24, "kv_block_size must be 16, 32, 64 or 128"),
                                ("kv_blocks", -1, "kv_blocks must be >= 0"),
                                ("gpu_memory_utilization", 1.5, r"gpu_memory_utilization must be in \(0, 1\]")):
        with pytest.raises(ValueError, match=message):
            C.Engine(backend, {**d, key: value}, "f32" if backend == "cpu" else "bf16")


def check_prefill_many(backend, many, single, prompts, starts, slots):
    """Prefills prompt p[start:-1] of each sequence into `many` in one prefill_many call and into
    `single` one prefill per sequence, then decodes each prompt's last token on both: the logits
    agree (bit for bit on the CPU, whose f32 rows are batch invariant; within the bf16 rule on the
    GPU). Returns the decode's (tokens, positions)."""
    counts = np.array([len(p) - 1 - s for p, s in zip(prompts, starts)], np.int32)
    chunks = [p[s:s + n] for p, s, n in zip(prompts, starts, counts)]
    many.prefill_many(slots, starts, counts, np.concatenate(chunks))
    for slot, start, chunk in zip(slots, starts, chunks):
        single.prefill(int(slot), chunk, int(start), "none")
    last = np.array([p[-1] for p in prompts], np.int32)
    positions = np.array([len(p) - 1 for p in prompts], np.int32)
    got, want = many.decode(last, slots, positions), single.decode(last, slots, positions)
    if backend == "cpu":
        np.testing.assert_array_equal(got, want)
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()
    return last, positions


def test_prefill_many_equals_one_prefill_per_sequence(C, backend, weights, rng):
    """Three sequences' chunks in one pass (one continuing a prompt already in its slot) leave the
    cache as three prefill calls do: the next decode's logits agree (bit for bit on the CPU, whose
    f32 rows are batch invariant; within the bf16 rule on the GPU)."""
    prompts = [rng.integers(0, CONFIG.vocab_size, n).astype(np.int32) for n in (9, 70, 33)]
    slots = np.array([2, 0, 1], np.int32)
    many, single = engine(C, backend, weights), engine(C, backend, weights)
    for e in (many, single):  # sequence 1 has its first 20 tokens in the cache already
        e.prefill(0, prompts[1][:20], 0, "none")
    last, positions = check_prefill_many(backend, many, single, prompts, np.array([0, 20, 0], np.int32), slots)
    params = np.zeros(1, C.sampling_params_dtype)
    params["top_p"], params["repetition_penalty"] = 1.0, 1.0
    many.prefill_many(slots[:1], positions[:1], np.ones(1, np.int32), last[:1])
    with pytest.raises(RuntimeError, match="no logits|run prefill or decode"):
        many.sample(slots[:1], positions[:1] + 1, params, np.zeros(1, np.uint64))


def test_prefill_many_mixes_long_and_short_segments(C, backend, weights, rng):
    """A pass of a prompt longer than a query tile beside short tails after cached prefixes (on the
    GPU the long one runs alone, the short ones share one launch) leaves the cache as one prefill
    per sequence does."""
    max_seq = 400
    d = CONFIG.engine_dict(max_seq, 4)
    d.update(kv_block_size=BLOCK)
    many, single = (C.Engine(backend, d, "f32" if backend == "cpu" else "bf16") for _ in range(2))
    for e in (many, single):
        for name, array in weights.items():
            e.set_weight(name, np.ascontiguousarray(array, dtype=np.float32), "f32")
    prompts = [rng.integers(0, CONFIG.vocab_size, n).astype(np.int32) for n in (300, 150, 141, 12)]
    starts = np.array([0, 100, 130, 0], np.int32)
    slots = np.array([3, 1, 0, 2], np.int32)
    for e in (many, single):  # the prefixes already in their slots
        for slot, p, start in zip(slots, prompts, starts):
            if start:
                e.prefill(int(slot), p[:start], 0, "none")
    check_prefill_many(backend, many, single, prompts, starts, slots)


def test_prefill_many_errors(C, backend, weights):
    e = engine(C, backend, weights)
    two = np.array([0, 0], np.int32)
    with pytest.raises(ValueError, match="slot 0 appears twice"):
        e.prefill_many(two, np.zeros(2, np.int32), np.ones(2, np.int32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="counts add up to 3"):
        e.prefill_many(np.array([0, 1], np.int32), np.zeros(2, np.int32), np.array([1, 2], np.int32),
                       np.zeros(5, np.int32))
    with pytest.raises(ValueError, match="context is full"):
        e.prefill_many(np.array([1], np.int32), np.array([MAX_SEQ - 1], np.int32), np.array([2], np.int32),
                       np.zeros(2, np.int32))
