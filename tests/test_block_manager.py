"""The paged KV cache's block manager, preemption and prefix caching.

Unit tests drive BlockManager over a fake engine that records the tables and histories it is
given; the end-to-end tests run tiny random models on the CPU engine, where greedy output of a
request in any mix equals the request alone bit for bit (see test_serving.py), so a preempted and
recomputed request, or one whose prefix came from the cache, must produce exactly the same tokens.
"""

import numpy as np
import pytest

from llama_brrr import Llama, ModelConfig, SamplingParams
from llama_brrr.serving import BlockManager, Request

B = 16


class FakeEngine:
    def __init__(self, kv_blocks, block_size=B):
        self.config = {"kv_block_size": block_size, "kv_blocks": kv_blocks}
        self.tables = {}
        self.uploads = 0
        self.history = {}

    def set_block_table(self, slot, blocks):
        assert blocks.dtype == np.int32
        self.tables[slot] = blocks.tolist()
        self.uploads += 1

    def set_history(self, slot, start_pos, tokens):
        self.history[slot] = (start_pos, tokens.tolist())


class Seq:
    """What the block manager reads of a request."""

    def __init__(self, prompt, generated=()):
        self.prompt_ids = list(prompt)
        self.token_ids = list(generated)
        self.slot = None
        self.prefilled = 0
        self.prefill_target = len(self.prompt_ids) + len(self.token_ids) - 1
        self.position = 0

    def prefill_all(self, bm):
        """As the scheduler does: reserve, then write, chunk by chunk (here one chunk)."""
        assert bm.reserve(self, self.prefill_target - self.prefilled)
        self.prefilled = self.prefill_target
        bm.written(self)


def tokens(rng, n):
    return rng.integers(3, 300, size=n).tolist()


def manager(kv_blocks=12, n_slots=3, max_seq_len=64, caching=True):
    engine = FakeEngine(kv_blocks)
    return engine, BlockManager(engine, n_slots, max_seq_len, enable_prefix_caching=caching)


def assert_empty(bm):
    u = bm.usage()
    assert (u["slots_used"], u["kv_blocks_used"], u["kv_positions_used"]) == (0, 0, 0)
    assert u["kv_blocks_free"] == u["kv_blocks_total"] == bm.n_blocks


def test_alloc_free_and_ref_counts(rng):
    engine, bm = manager(kv_blocks=6, max_seq_len=96, caching=False)
    a, b = Seq(tokens(rng, 40)), Seq(tokens(rng, 20))
    assert bm.admit(a) and a.slot == 0 and a.prefilled == 0
    assert engine.tables[0] == [bm._tables[0][0]]  # the first chunk's block (chunk=1: position 0)
    a.prefill_all(bm)
    assert len(bm._tables[0]) == 3  # 39 positions
    assert bm.usage()["kv_blocks_used"] == 3 and bm.usage()["kv_positions_used"] == 39
    uploads = engine.uploads
    assert bm.reserve(a, 0) and engine.uploads == uploads  # no change, no upload
    assert bm.admit(b)
    b.prefill_all(bm)  # 19 positions: 2 blocks
    assert bm.usage()["kv_blocks_free"] == 1
    assert not bm.reserve(a, 40)  # 79 positions = 5 blocks: 2 more, 1 free
    assert bm.usage()["kv_blocks_free"] == 1  # a refusal allocates nothing
    assert bm.reserve(a, 9)  # 48 positions: the last free block
    assert sorted(bm._tables[0] + bm._tables[1]) == sorted(set(bm._tables[0] + bm._tables[1]))
    bm.free(a)
    bm.free(a)  # twice is harmless
    assert a.slot is None and engine.tables[0] == []
    assert bm.usage()["kv_blocks_free"] == 4
    bm.free(b)
    assert_empty(bm)
    assert all(r == 0 for r in bm._ref)


def test_no_free_slot_or_blocks_refuses_admission(rng):
    engine, bm = manager(kv_blocks=3, n_slots=2)
    a, b, c = Seq(tokens(rng, 40)), Seq(tokens(rng, 5)), Seq(tokens(rng, 5))
    assert bm.admit(a, chunk=64)  # first chunk: 39 positions = 3 blocks, the whole pool
    assert not bm.admit(b) and b.slot is None  # a slot, but no block
    assert bm.usage()["slots_used"] == 1
    bm.free(a)
    assert bm.admit(b) and bm.admit(c)
    assert not bm.admit(Seq(tokens(rng, 5)))  # no slot
    bm.free(b)
    bm.free(c)
    assert_empty(bm)


def test_prefix_hits_share_blocks_and_record_history(rng):
    engine, bm = manager()
    system = tokens(rng, 40)
    a = Seq(system + tokens(rng, 9))
    assert bm.admit(a)
    a.prefill_all(bm)  # 48 positions written: blocks 0-2 registered
    b = Seq(system + tokens(rng, 30))
    assert bm.admit(b)
    assert b.prefilled == 32  # blocks 0 and 1 (block 2 holds a's own tokens 32..47)
    assert bm._tables[b.slot][:2] == bm._tables[a.slot][:2]
    assert [bm._ref[x] for x in bm._tables[a.slot][:3]] == [2, 2, 1]
    assert engine.history[b.slot] == (0, system[:32])
    assert engine.tables[b.slot][:2] == bm._tables[a.slot][:2]
    u = bm.usage()
    assert u["prefix_cache_queries"] == len(a.prompt_ids) + len(b.prompt_ids)
    assert u["prefix_cache_hits"] == 32
    bm.free(a)
    assert [bm._ref[x] for x in bm._tables[b.slot][:2]] == [1, 1]
    bm.free(b)
    assert_empty(bm)
    assert bm.usage()["kv_blocks_cached"] >= 3  # freed blocks keep their digests


def test_a_token_mismatch_is_a_miss_whatever_the_digest(rng):
    engine, bm = manager()
    prompt = tokens(rng, 50)
    a = Seq(prompt)
    assert bm.admit(a)
    a.prefill_all(bm)
    block_1 = bm._tables[a.slot][1]
    bm.free(a)
    # The block cached for positions 16..31 now claims other tokens under the same digest (as a
    # digest collision would): a lookup must compare tokens and stop there.
    bm._tokens[block_1] = (np.frombuffer(bm._tokens[block_1], dtype=np.int32) + 1).tobytes()
    b = Seq(prompt)
    assert bm.admit(b)
    assert b.prefilled == 16
    bm.free(b)
    c = Seq([prompt[0] + 1] + prompt[1:])  # the first block differs: nothing shared
    assert bm.admit(c) and c.prefilled == 0
    bm.free(c)
    assert_empty(bm)


def test_the_last_token_rule(rng):
    engine, bm = manager()
    prompt = tokens(rng, 33)
    a = Seq(prompt)
    assert bm.admit(a)
    a.prefill_all(bm)  # 32 positions: two full blocks
    a.token_ids, a.position = [7], 33  # the first decode wrote position 32
    bm.written(a)
    bm.free(a)
    # The same 33 tokens: position 32 is written by the first decode, so blocks 0-1 are shared.
    b = Seq(prompt)
    assert bm.admit(b) and b.prefilled == 32
    # A 32-token prompt writes position 31 with its first decode: block 1 may not be shared.
    c = Seq(prompt[:32])
    assert bm.admit(c) and c.prefilled == 16
    shared = set(bm._tables[b.slot]) & set(bm._tables[c.slot])
    assert shared == {bm._tables[b.slot][0]}
    # Every block either writes is private to it from its first written position on.
    for seq in (b, c):
        first_written = seq.prefilled // B
        for block in bm._tables[seq.slot][first_written:]:
            assert bm._ref[block] == 1
    bm.free(b)
    bm.free(c)
    assert_empty(bm)


def test_a_prefix_cached_after_admission_is_picked_up_before_the_first_chunk(rng):
    engine, bm = manager()
    system = tokens(rng, 40)
    a, b = Seq(system + tokens(rng, 9)), Seq(system + tokens(rng, 20))
    assert bm.admit(a) and bm.admit(b, chunk=64)  # admitted together: nothing cached yet
    assert b.prefilled == 0 and len(bm._tables[b.slot]) == 4  # its first chunk: 59 positions
    private = list(bm._tables[b.slot])
    a.prefill_all(bm)
    bm.extend_prefix(b)
    assert b.prefilled == 32 and bm._tables[b.slot][:2] == bm._tables[a.slot][:2]
    assert bm._tables[b.slot][2:] == private[2:]  # its own blocks for positions 32.. stay
    assert engine.history[b.slot] == (0, system[:32])
    assert engine.tables[b.slot] == bm._tables[b.slot]
    assert bm.usage()["kv_blocks_used"] == 3 + 2  # b's two replaced blocks went back
    b.prefilled = 40  # a chunk written: nothing more is replaced
    bm.extend_prefix(b)
    assert b.prefilled == 40
    bm.free(a)
    bm.free(b)
    assert_empty(bm)


def test_lru_eviction(rng):
    engine, bm = manager(kv_blocks=4, n_slots=2)
    p1, p2 = tokens(rng, 40), tokens(rng, 40)
    a = Seq(p1)
    assert bm.admit(a)
    a.prefill_all(bm)  # 3 blocks, 2 full and registered
    bm.free(a)
    assert bm.usage()["kv_blocks_cached"] == 2
    b = Seq(p2[:18])  # 17 positions: 2 blocks, the unregistered free blocks first, then the LRU
    assert bm.admit(b, chunk=64)
    assert bm.usage()["kv_blocks_cached"] == 2  # the two unregistered blocks were taken
    b.prefilled = 17
    assert bm.reserve(b, 16)  # 33 positions: a third block evicts a's second block (freed first)
    assert bm.usage()["kv_blocks_cached"] == 1
    bm.free(b)
    c = Seq(p1)
    assert bm.admit(c) and c.prefilled == 16  # a's first block survived
    bm.free(c)
    assert_empty(bm)


def test_generated_tokens_are_cached_too(rng):
    engine, bm = manager()
    prompt = tokens(rng, 10)
    a = Seq(prompt)
    assert bm.admit(a)
    a.prefill_all(bm)
    generated = tokens(rng, 30)
    a.token_ids, a.position = generated, 10 + 29  # positions 0..38 written
    assert bm.reserve(a, 1)
    bm.written(a)
    bm.free(a)
    b = Seq(prompt + generated[:25] + tokens(rng, 5))
    assert bm.admit(b) and b.prefilled == 32
    bm.free(b)
    assert_empty(bm)


def test_reset_identity(rng):
    engine, bm = manager(kv_blocks=10, n_slots=3, max_seq_len=64)  # 4 blocks a slot
    a = Seq(tokens(rng, 40))
    assert bm.admit(a)
    with pytest.raises(RuntimeError, match="still hold KV blocks"):
        bm.reset_identity()
    a.prefill_all(bm)
    bm.free(a)
    bm.reset_identity()
    assert engine.tables == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7], 2: [8, 9]}
    assert bm.usage()["kv_blocks_cached"] == 0
    assert bm.admit(Seq(a.prompt_ids)) and bm.usage()["prefix_cache_hits"] == 0


def test_check_fits_names_the_numbers():
    engine, bm = manager(kv_blocks=3, max_seq_len=64)
    bm.check_fits(40, 9)  # 48 positions = 3 blocks
    with pytest.raises(ValueError, match=r"needs 49 KV positions.*4 blocks of 16.*has 3 blocks"):
        bm.check_fits(40, 10)


# ---- end to end on the CPU engine ---------------------------------------------------------------

TINY = dict(dim=48, hidden_dim=80, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
            max_seq_len=128, name="tiny")


def make_tiny(**kwargs) -> Llama:
    config = ModelConfig(**TINY)
    llm = Llama.random(config, seed=0, device="cpu", max_batch=4, n_threads=1, **kwargs)
    head = np.random.default_rng(1000).normal(0.0, 1.0, (config.vocab_size, config.dim))
    llm.engine.set_weight("output", head.astype(np.float32), "f32")
    return llm


@pytest.fixture(scope="module")
def reference():
    return make_tiny()


@pytest.mark.parametrize("pipeline", [False, True])
@pytest.mark.parametrize("budget,decode_steps", [(24, 1), (512, 4)])
def test_preemption_finishes_everything_like_alone(reference, rng, budget, decode_steps, pipeline):
    prompts = [tokens(rng, n) for n in [40, 63, 7, 30, 55, 12, 20, 3, 45]]
    params = [SamplingParams(max_tokens=40, ignore_eos=True),
              SamplingParams(max_tokens=35, ignore_eos=True, temperature=0.8, seed=3,
                             repetition_penalty=1.2, stop=["\x05"])]
    expected = [reference.generate(p, params[i % 2])[0] for i, p in enumerate(prompts)]
    small = make_tiny(kv_blocks=10)  # 4 slots of 8 blocks would need 32
    scheduler = small.make_scheduler(max_num_batched_tokens=budget, decode_steps=decode_steps,
                                     pipeline=pipeline)
    requests = []
    for i, p in enumerate(prompts):
        r = small._make_request(None, p, params[i % 2])
        r.index = i
        requests.append(r)
        scheduler.add(r)
    steps = 0
    while scheduler.has_work():
        scheduler.step()
        steps += 1
        assert steps < 5000
        assert scheduler.usage()["kv_blocks_used"] <= 10
    for r, e in zip(requests, expected):
        out = r.output()
        assert (out.token_ids, out.text, out.finish_reason) == (e.token_ids, e.text, e.finish_reason)
    usage = scheduler.usage()
    assert usage["preemptions"] > 0 and sum(r.preemptions for r in requests) == usage["preemptions"]
    assert (usage["running"], usage["waiting"], usage["slots_used"], usage["kv_blocks_used"]) == \
        (0, 0, 0, 0)
    assert small.engine.decode_pending == 0


def test_a_request_too_large_for_the_pool_is_refused(rng):
    small = make_tiny(kv_blocks=3)  # 48 positions
    with pytest.raises(ValueError, match="whole KV pool has 3 blocks"):
        small.generate(tokens(rng, 40), max_tokens=10)
    assert small.generate(tokens(rng, 40), max_tokens=9, ignore_eos=True)[0].token_ids
    scheduler = small.make_scheduler()
    with pytest.raises(ValueError, match="needs 49 KV positions"):
        scheduler.add(Request(None, tokens(rng, 40), SamplingParams(max_tokens=10), 0, None,
                              frozenset()))
    assert not scheduler.has_work()


def test_prefix_caching_shares_a_system_prompt_and_changes_nothing(rng):
    system = tokens(rng, 50)
    prompts = [system + tokens(rng, n) for n in [5, 17, 1, 30, 9]]
    params = SamplingParams(max_tokens=20, ignore_eos=True, repetition_penalty=1.3)
    on, off = make_tiny(), make_tiny(enable_prefix_caching=False)
    together = on.generate(prompts[:3], params)  # the first prefills the system prompt for all
    assert on._scheduler.usage()["prefix_cache_hits"] >= 2 * 48
    rest = on.generate(prompts[3:], params)  # the cache outlives a call
    expected = off.generate(prompts, params)
    assert [o.token_ids for o in together + rest] == [o.token_ids for o in expected]
    usage = on._scheduler.usage()
    assert usage["prefix_cache_hits"] >= 4 * 48 and usage["kv_blocks_used"] == 0
    assert off._scheduler.usage()["prefix_cache_hits"] == 0
    # Direct slot writes drop the cache: the next call recomputes, with the same result.
    on.forward([1, 2, 3])
    again = on.generate(prompts[1], params)[0]
    assert again.token_ids == expected[1].token_ids
    assert on._scheduler.usage()["prefix_cache_hits"] == usage["prefix_cache_hits"]


def test_bad_kv_arguments():
    for kwargs, pattern in [(dict(kv_block_size=8), "kv_block_size must be 16, 32, 64 or 128"),
                            (dict(kv_blocks=0), "kv_blocks must be None"),
                            (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
                            (dict(gpu_memory_utilization="0.5"), "gpu_memory_utilization"),
                            (dict(enable_prefix_caching=1), "enable_prefix_caching"),
                            (dict(kv_cache_dtype="fp16"),
                             "kv_cache_dtype must be one of 'auto', 'fp8', 'fp8_e4m3'.*got 'fp16'"),
                            (dict(kv_cache_dtype="FP8"), "kv_cache_dtype must be one of"),
                            (dict(kv_cache_dtype=8), "kv_cache_dtype must be a str.*got 8"),
                            (dict(kv_cache_dtype=None), "kv_cache_dtype must be a str.*got None")]:
        with pytest.raises(ValueError, match=pattern):
            make_tiny(**kwargs)
