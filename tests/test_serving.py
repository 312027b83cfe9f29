"""The continuous-batching scheduler and AsyncLlama on tiny random models (CPU engine).

Greedy equality with a request run alone is exact here: on the CPU f32 path a row of a decode batch
is bit-identical to the same row alone, and prefill chunks sit at fixed offsets of each prompt
whatever else runs, so a prompt's KV cache does not depend on its neighbours. The LM head is redrawn
with std 1 (as in test_api.py) so that greedy choices are not near-ties.
"""

import asyncio
import threading

import numpy as np
import pytest

from llama_brrr import Llama, ModelConfig, SamplingParams
from llama_brrr.errors import NonFiniteLogitsError
from llama_brrr.serving import Scheduler
from llama_brrr.serving.async_engine import AsyncLlama, EngineClosedError

TINY = dict(dim=48, hidden_dim=80, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
            max_seq_len=128, name="tiny")
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


def make_tiny(max_batch=4, seed=0) -> Llama:
    config = ModelConfig(**TINY)
    llm = Llama.random(config, seed=seed, device="cpu", max_batch=max_batch, n_threads=1)
    head = np.random.default_rng(seed + 1000).normal(0.0, 1.0, (config.vocab_size, config.dim))
    llm.engine.set_weight("output", head.astype(np.float32), "f32")
    return llm


@pytest.fixture(scope="module")
def llm():
    return make_tiny()


def prompts_of(rng, lengths):
    return [rng.integers(3, TINY["vocab_size"], size=n).tolist() for n in lengths]


def alone(llm, prompt, params=GREEDY):
    return llm.generate(prompt, params)[0]


def request(llm, prompt, params=GREEDY, index=0):
    r = llm._make_request(None, list(prompt), params)
    r.index = index
    return r


def run_all(scheduler, requests, max_steps=10_000):
    for r in requests:
        scheduler.add(r)
    steps = 0
    while scheduler.has_work():
        scheduler.step()
        steps += 1
        assert steps < max_steps
    return steps


# ---- greedy equality and the step loop ---------------------------------------------------------

@pytest.mark.parametrize("pipeline", [False, True])
@pytest.mark.parametrize("budget,decode_steps", [(16, 1), (9, 3), (512, 1)])
def test_more_requests_than_slots_equal_each_alone(llm, rng, budget, decode_steps, pipeline):
    prompts = prompts_of(rng, [1, 40, 7, 2, 63, 15, 30, 3, 11])
    expected = [alone(llm, p).token_ids for p in prompts]
    scheduler = llm.make_scheduler(max_num_seqs=3, max_num_batched_tokens=budget,
                                   decode_steps=decode_steps, pipeline=pipeline)
    requests = [request(llm, p, index=i) for i, p in enumerate(prompts)]
    run_all(scheduler, requests)
    assert [r.token_ids for r in requests] == expected
    assert all(r.finish_reason == "length" for r in requests)
    usage = scheduler.usage()
    assert (usage["running"], usage["waiting"], usage["slots_used"], usage["kv_blocks_used"],
            usage["kv_positions_used"]) == (0, 0, 0, 0, 0)
    assert usage["kv_blocks_free"] == usage["kv_blocks_total"] == 4 * 8  # 4 slots x 128 / 16
    assert llm.engine.decode_pending == 0 and not scheduler.in_flight


def test_pipelined_steps_drop_the_tokens_of_rows_that_stopped_unannounced(llm, rng):
    """Pipelined, each launch continues rows before the previous launch is read, so a row that
    a stop id or stop string ends mid-burst has already been launched again: those tokens must be
    dropped, and every request end exactly as alone (unpipelined) with every slot and block back."""
    prompts = prompts_of(rng, [4, 9, 2, 17, 6, 11, 3])
    probe = SamplingParams(max_tokens=14, ignore_eos=True)
    params = []
    for i, p in enumerate(prompts):
        seen = alone(llm, p, probe)
        if i % 3 == 0:  # a stop id somewhere inside a burst
            params.append(SamplingParams(max_tokens=14, ignore_eos=True, stop_token_ids=[seen.token_ids[5 + i % 4]]))
        elif i % 3 == 1:  # a stop string: the text of one of its tokens
            params.append(SamplingParams(max_tokens=14, ignore_eos=True,
                                         stop=[llm.tokenizer.decode([seen.token_ids[4 + i % 5]]) or "\x05"]))
        else:
            params.append(SamplingParams(max_tokens=3 + i, ignore_eos=True, temperature=0.9, seed=i))
    expected = [alone(llm, p, q) for p, q in zip(prompts, params)]
    scheduler = llm.make_scheduler(max_num_seqs=3, decode_steps=4, pipeline=True)
    requests = [request(llm, p, q, index=i) for i, (p, q) in enumerate(zip(prompts, params))]
    run_all(scheduler, requests)
    for r, e in zip(requests, expected):
        out = r.output()
        assert (out.token_ids, out.text, out.finish_reason) == (e.token_ids, e.text, e.finish_reason)
    assert any(e.finish_reason == "stop" for e in expected)
    usage = scheduler.usage()
    assert (usage["running"], usage["slots_used"], usage["kv_blocks_used"]) == (0, 0, 0)
    assert llm.engine.decode_pending == 0 and not scheduler.in_flight


def test_pipelined_abort_with_a_launch_in_flight(llm, rng):
    a, b = prompts_of(rng, [5, 8])
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    scheduler = llm.make_scheduler(max_num_seqs=2, pipeline=True)
    left, kept = request(llm, a, params), request(llm, b, params)
    scheduler.add(left)
    scheduler.add(kept)
    for _ in range(4):
        scheduler.step()
    assert scheduler.in_flight and left.ahead == 1
    assert scheduler.abort(left)
    assert left.slot is None and llm.engine.decode_pending == 1  # `kept` still has a launch in flight
    n_left = len(left.token_ids)
    run_all(scheduler, [])
    assert len(left.token_ids) == n_left  # its launched tokens were dropped
    assert kept.token_ids == alone(llm, b, params).token_ids
    assert llm.engine.decode_pending == 0 and scheduler.usage()["slots_used"] == 0
    # aborting the last running request forgets the launch at once
    last = request(llm, a, params)
    scheduler.add(last)
    scheduler.step()
    scheduler.step()
    assert llm.engine.decode_pending == 1
    scheduler.abort(last)
    assert llm.engine.decode_pending == 0 and not scheduler.in_flight
    assert llm.forward([1, 2, 3]).shape[-1] == TINY["vocab_size"]  # the engine serves direct calls again


def test_generate_goes_through_the_scheduler_in_input_order(llm, rng):
    prompts = prompts_of(rng, [5, 1, 33, 8, 2, 17, 4, 9, 12])  # 9 > max_batch = 4
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.9, seed=5, logprobs=True)
    outs = llm.generate(prompts, params)
    assert [o.prompt_token_ids for o in outs] == prompts
    for p, o in zip(prompts, outs):
        one = alone(llm, p, params)
        assert o.token_ids == one.token_ids
        np.testing.assert_allclose(o.logprobs, one.logprobs, atol=1e-5)
    assert llm._scheduler.usage()["slots_used"] == 0


def test_admission_mid_flight(llm, rng):
    long_prompt, late_prompt = prompts_of(rng, [6, 5])
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    scheduler = llm.make_scheduler(max_num_seqs=2)
    first, late = request(llm, long_prompt, params), request(llm, late_prompt)
    scheduler.add(first)
    for _ in range(5):
        scheduler.step()
    assert len(first.token_ids) == 5
    scheduler.add(late)
    scheduler.step()  # admitted, prefilled and decoded together with `first`
    assert len(first.token_ids) == 6 and len(late.token_ids) == 1
    assert first.slot != late.slot
    while scheduler.has_work():
        scheduler.step()
    assert first.token_ids == alone(llm, long_prompt, params).token_ids
    assert late.token_ids == alone(llm, late_prompt).token_ids


def test_a_long_prompt_is_chunked_while_decodes_go_on(llm, rng):
    short, long_ = prompts_of(rng, [4, 70])
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    scheduler = llm.make_scheduler(max_num_seqs=2, max_num_batched_tokens=12)
    assert scheduler.prefill_chunk == 10
    running, arriving = request(llm, short, params), request(llm, long_, GREEDY)
    scheduler.add(running)
    scheduler.step()
    scheduler.add(arriving)
    prefilled = []
    while arriving.prefilled < arriving.prefill_target:
        before = len(running.token_ids)
        scheduler.step()
        assert len(running.token_ids) == before + 1  # the decode was not stalled by the prompt
        prefilled.append(arriving.prefilled)
    # 69 prompt tokens in chunks of 10 at fixed offsets: one chunk per step (budget 12 - 1 decode).
    assert prefilled == [10, 20, 30, 40, 50, 60, 69]
    while scheduler.has_work():
        scheduler.step()
    assert running.token_ids == alone(llm, short, params).token_ids
    assert arriving.token_ids == alone(llm, long_).token_ids


def test_a_finished_request_frees_its_slot_for_the_next_step(llm, rng):
    a, b, c = prompts_of(rng, [3, 3, 3])
    scheduler = llm.make_scheduler(max_num_seqs=2)
    short = request(llm, a, SamplingParams(max_tokens=2, ignore_eos=True))
    long_ = request(llm, b, SamplingParams(max_tokens=20, ignore_eos=True))
    waiting = request(llm, c)
    for r in (short, long_, waiting):
        scheduler.add(r)
    scheduler.step()
    assert scheduler.usage()["waiting"] == 1
    scheduler.step()
    assert short.finish_reason == "length" and short.slot is None
    scheduler.step()
    assert waiting.slot is not None and len(waiting.token_ids) == 1
    while scheduler.has_work():  # the model's block manager is shared: leave no slot behind
        scheduler.step()


def test_cancelling_frees_the_slot_at_once(llm, rng):
    a, b = prompts_of(rng, [5, 5])
    scheduler = llm.make_scheduler(max_num_seqs=1)
    running = request(llm, a, SamplingParams(max_tokens=50, ignore_eos=True))
    queued = request(llm, b)
    scheduler.add(running)
    scheduler.add(queued)
    scheduler.step()
    assert scheduler.usage()["slots_used"] == 1 and scheduler.usage()["kv_positions_used"] == 5
    assert scheduler.abort(running)
    assert running.finish_reason == "abort" and running.output().finish_reason == "abort"
    assert scheduler.usage()["slots_used"] == 0
    scheduler.step()
    assert queued.slot is not None and len(queued.token_ids) == 1
    assert not scheduler.abort(running)  # already gone
    while scheduler.has_work():
        scheduler.step()
    assert queued.token_ids == alone(llm, b).token_ids


def test_first_come_first_served(llm, rng):
    prompts = prompts_of(rng, [30, 2, 2, 2])
    scheduler = llm.make_scheduler(max_num_seqs=2, max_num_batched_tokens=8)
    requests = [request(llm, p, SamplingParams(max_tokens=3, ignore_eos=True)) for p in prompts]
    run_all(scheduler, requests)
    admitted = sorted(requests, key=lambda r: r.t_admit)
    assert admitted == requests


def test_a_closed_stream_leaves_no_slot_behind(llm, rng):
    stream = llm.stream(prompts_of(rng, [4])[0], max_tokens=50, ignore_eos=True)
    next(stream)
    stream.close()
    assert llm._scheduler.usage()["slots_used"] == 0
    assert llm.generate([1, 2, 3], max_tokens=2)[0].token_ids  # usable again


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(max_num_seqs=5), "max_num_seqs must be an integer in \\[1, max_batch=4\\]"),
    (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=4), "must exceed max_num_seqs"),
    (dict(max_num_batched_tokens=20, prefill_chunk=17), "prefill_chunk must be an integer in \\[1, "),
    (dict(decode_steps=0), "decode_steps must be an integer >= 1"),
    (dict(decode_steps=65), "at most 64"),
    (dict(max_num_batched_tokens=True), "max_num_batched_tokens"),
])
def test_bad_scheduler_arguments(llm, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        llm.make_scheduler(**kwargs)


# ---- AsyncLlama ---------------------------------------------------------------------------------

@pytest.fixture(params=[False, True], ids=["unpipelined", "pipelined"])
def engine(request):
    llm = make_tiny()
    engine = AsyncLlama(llm, max_num_batched_tokens=16, pipeline=request.param)
    yield engine
    engine.close()
    assert llm.engine.decode_pending == 0


async def collect(engine, prompt, params=GREEDY, request_id=None):
    deltas = [d async for d in engine.generate(prompt, params, request_id)]
    return deltas


def wait_idle(engine, timeout=5.0):
    """Polls until the engine thread reports no running or waiting request."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        u = engine.usage()
        if u["running"] == 0 and u["waiting"] == 0 and u["slots_used"] == 0:
            return u
        time.sleep(0.01)
    raise AssertionError(f"engine still busy: {engine.usage()}")


def test_async_concurrent_requests_equal_offline(engine, rng):
    reference = make_tiny()
    prompts = prompts_of(rng, [3, 50, 1, 9, 22, 6, 2, 14, 5, 31])
    expected = reference.generate(prompts, GREEDY)

    async def main():
        return await asyncio.gather(*(collect(engine, p, request_id=f"r{i}")
                                      for i, p in enumerate(prompts)))

    results = asyncio.run(main())
    for deltas, want in zip(results, expected):
        assert [t for d in deltas for t in d.token_ids] == want.token_ids
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
        assert deltas[-1].output.token_ids == want.token_ids
        assert deltas[-1].finish_reason == "length"
    wait_idle(engine)
    metrics = engine.metrics.render()
    assert f"llama_brrr_generation_tokens_total {10 * len(prompts)}" in metrics
    assert f"llama_brrr_prompt_tokens_total {sum(map(len, prompts))}" in metrics


def test_async_text_stream_and_stop_strings(engine):
    reference = make_tiny()
    full = reference.generate("hello there", max_tokens=24, ignore_eos=True)[0].text
    stop = full[8:10]
    cut = full[:full.index(stop)]

    async def main():
        return await collect(engine, "hello there",
                             SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop]))

    deltas = asyncio.run(main())
    assert "".join(d.text for d in deltas) == cut == deltas[-1].output.text
    assert deltas[-1].finish_reason == "stop"


def slow_down(engine):
    """Makes each step take >= 5 ms, so a request of 100+ tokens is still running while the test
    acts on it even when this thread is descheduled for a while on a busy machine."""
    engine.scheduler.engine = SlowEngine(engine.scheduler.engine)


def test_async_abort_frees_the_slot_within_a_step(engine, rng):
    prompt = prompts_of(rng, [8])[0]
    slow_down(engine)

    async def main():
        stream = engine.submit(engine.make_request(prompt, SamplingParams(max_tokens=110,
                                                                          ignore_eos=True)), "victim")
        got = []
        async for delta in stream:
            got.append(delta)
            if len(got) == 2:
                engine.abort("victim")
        return got

    got = asyncio.run(main())
    assert got[-1].finish_reason == "abort"
    assert len(got[-1].output.token_ids) < 110
    wait_idle(engine)
    assert 'llama_brrr_requests_total{finish_reason="abort"} 1' in engine.metrics.render()


def test_leaving_the_stream_early_aborts(engine, rng):
    prompt = prompts_of(rng, [8])[0]
    slow_down(engine)

    async def main():
        async for delta in engine.generate(prompt, max_tokens=110, ignore_eos=True, request_id="x"):
            break
        await asyncio.sleep(0)

    asyncio.run(main())
    wait_idle(engine)
    assert 'finish_reason="abort"} 1' in engine.metrics.render()


def test_async_bad_requests(engine):
    async def run(prompt, **kwargs):
        return [d async for d in engine.generate(prompt, **kwargs)]

    with pytest.raises(ValueError, match="prompt has 200 tokens"):
        asyncio.run(run([5] * 200))
    with pytest.raises(ValueError, match="max_tokens must be an integer >= 1"):
        asyncio.run(run("hi", max_tokens=0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        asyncio.run(run([3, 999]))

    async def duplicate():
        slow_down(engine)
        s = engine.submit(engine.make_request([3, 4], SamplingParams(max_tokens=100, ignore_eos=True)),
                          "same")
        with pytest.raises(ValueError, match="already running"):
            engine.submit(engine.make_request([3, 4]), "same")
        engine.abort("same")
        return [d async for d in s]

    assert asyncio.run(duplicate())[-1].finish_reason == "abort"
    wait_idle(engine)
    assert asyncio.run(run([3, 4], max_tokens=3))[-1].finish_reason == "length"


class FailingEngine:
    """A _C.Engine stand-in whose decode_steps, or (pipelined) decode_wait, raises once when
    armed: the latter with launches still pending in the real engine."""

    def __init__(self, real):
        self.real = real
        self.armed = False

    def __getattr__(self, name):
        return getattr(self.real, name)

    def fault(self):
        if self.armed:
            self.armed = False
            raise RuntimeError("injected engine fault")

    def decode_steps(self, *args):
        self.fault()
        return self.real.decode_steps(*args)

    def decode_wait(self):
        self.fault()
        return self.real.decode_wait()


def test_an_engine_fault_reaches_every_request_and_the_engine_goes_on(engine, rng):
    failing = FailingEngine(engine.scheduler.engine)
    engine.scheduler.engine = failing
    prompts = prompts_of(rng, [4, 6, 3, 5, 7, 2])  # 6 requests, 4 slots: two still waiting

    async def one(p, i):
        try:
            return [d async for d in engine.generate(p, GREEDY, f"f{i}")][-1].finish_reason
        except RuntimeError as error:
            return str(error)

    async def main():
        failing.armed = True
        return await asyncio.gather(*(one(p, i) for i, p in enumerate(prompts)))

    outcomes = asyncio.run(main())
    assert "injected engine fault" in outcomes
    assert all(o in ("injected engine fault", "length") for o in outcomes)
    wait_idle(engine)
    after = asyncio.run(collect(engine, prompts[0]))
    assert [t for d in after for t in d.token_ids] == make_tiny().generate(prompts[0], GREEDY)[0].token_ids


def test_non_finite_logits_fail_only_their_request(engine, rng):
    llm = engine.llm
    good, bad = [5, 6, 7, 8], [5, 6, 9, 8]
    embeddings = llm.engine.get_weight("tok_embeddings").copy()
    damaged = embeddings.copy()
    damaged[9] = np.nan
    llm.engine.set_weight("tok_embeddings", damaged, "f32")

    async def main():
        async def run(p, rid):
            try:
                return [d async for d in engine.generate(p, GREEDY, rid)][-1].finish_reason
            except NonFiniteLogitsError as error:
                return error

        return await asyncio.gather(run(good, "good"), run(bad, "bad"))

    try:
        ok, failed = asyncio.run(main())
    finally:
        llm.engine.set_weight("tok_embeddings", embeddings, "f32")
    assert ok == "length"
    assert isinstance(failed, NonFiniteLogitsError)
    wait_idle(engine)


def test_submissions_from_several_threads(engine, rng):
    prompts = prompts_of(rng, [3, 7, 12, 5, 9, 2, 4, 8])
    expected = [o.token_ids for o in make_tiny().generate(prompts, GREEDY)]
    results = [None] * len(prompts)

    def worker(i):
        deltas = asyncio.run(collect(engine, prompts[i]))
        results[i] = [t for d in deltas for t in d.token_ids]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected


class SlowEngine(FailingEngine):
    """Decode steps that take at least 5 ms, so a test can act while requests are in flight."""

    def decode_steps(self, *args):
        import time

        time.sleep(0.005)
        return self.real.decode_steps(*args)

    def decode_wait(self):
        import time

        time.sleep(0.005)
        return self.real.decode_wait()


def test_close_ends_waiting_requests_and_frees_the_model(rng):
    llm = make_tiny(max_batch=1)
    engine = AsyncLlama(llm)
    slow_down(engine)
    with pytest.raises(RuntimeError, match="already generating"):
        llm.generate([1, 2], max_tokens=2)

    async def main():
        params = SamplingParams(max_tokens=100, ignore_eos=True)
        running, waiting = [engine.submit(engine.make_request(p, params)) for p in prompts_of(rng, [4, 4])]
        deltas = running.__aiter__()
        await deltas.__anext__()  # the first request runs (100 steps: 0.5 s at least)
        await asyncio.get_running_loop().run_in_executor(None, engine.close)
        for stream in (deltas, waiting.__aiter__()):
            with pytest.raises(EngineClosedError):
                async for _ in stream:
                    pass

    asyncio.run(main())
    assert llm.generate([1, 2], max_tokens=2)[0].token_ids  # the Llama is free again
    with pytest.raises(EngineClosedError):
        asyncio.run(collect(engine, [1, 2]))


def test_scheduler_is_exported():
    import llama_brrr

    assert llama_brrr.AsyncLlama is AsyncLlama
    assert Scheduler.__module__ == "llama_brrr.serving.scheduler"
