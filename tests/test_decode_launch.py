"""Engine.decode_launch / decode_wait: decode_steps split in two, so the scheduler enqueues round
k + 1 before it reads round k. On both backends: the results equal decode_steps over the same batch
compositions bit for bit (continued rows fed on the device, a prompt prefilled between the two
launches), and every misuse is refused with the engine still usable afterwards."""

from __future__ import annotations

import numpy as np
import pytest

from llama_brrr.config import ModelConfig
from llama_brrr.sampling import uniform_rows

# head_dim 64 and sizes that are not powers of two: both backends run it
CONFIG = ModelConfig(dim=136, hidden_dim=200, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                     vocab_size=1001, name="decode-launch")
MAX_SEQ, MAX_BATCH = 96, 4


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def engine_pair(request, make_weights, rng):
    """Two engines of one backend with the same random weights: the reference and the one tested."""
    if request.param == "cuda":
        C = request.getfixturevalue("cuda_C")
        make = lambda: C.Engine("cuda", CONFIG.engine_dict(MAX_SEQ, MAX_BATCH), "bf16", 0)  # noqa: E731
    else:
        C = request.getfixturevalue("C")
        make = lambda: C.Engine("cpu", CONFIG.engine_dict(MAX_SEQ, MAX_BATCH), "f32", 0, 0)  # noqa: E731
    tensors = make_weights(CONFIG, rng)
    engines = []
    for _ in range(2):
        engine = make()
        for name, array in tensors.items():
            engine.set_weight(name, np.ascontiguousarray(array, dtype=np.float32), "f32")
        engines.append(engine)
    return engines


def prompts(rng, lengths):
    return [rng.integers(0, CONFIG.vocab_size, size=n).astype(np.int32) for n in lengths]


def prefill_many(engine, slots, prompt_list):
    engine.prefill_many(np.array(slots, np.int32), np.zeros(len(slots), np.int32),
                        np.array([len(p) for p in prompt_list], np.int32), np.concatenate(prompt_list))


def test_launches_equal_decode_steps_with_rows_continued_on_the_device(engine_pair, rng):
    """Launch 1 runs rows in slots 2, 0, 1; launch 2, enqueued before launch 1 is read, continues
    slots 1 and 2 (reordered, slot 0 dropped) by negative tokens and adds slot 3, prefilled
    between the launches. decode_steps over the same compositions, tokens handed back by the host,
    must give the same tokens and log-probabilities bit for bit."""
    reference, tested = engine_pair
    first = prompts(rng, (5, 11, 8))
    late = prompts(rng, (13,))
    for engine in engine_pair:
        prefill_many(engine, [0, 1, 2], first)
    slots1 = np.array([2, 0, 1], np.int32)
    pos1 = np.array([len(first[s]) for s in slots1], np.int32)
    tok1 = rng.integers(0, CONFIG.vocab_size, size=3).astype(np.int32)
    seeds = rng.integers(0, 2**63, size=4).astype(np.uint64)
    params1 = uniform_rows(3, temperature=[0.0, 0.8, 1.0], top_k=[0, 50, 0], repetition_penalty=[1.2, 1.0, 1.1],
                           seed=seeds[:3])
    steps1 = np.array([0, 3, 7], np.uint64)
    n1, n2 = 5, 4

    # launch 2's rows: slot 1 (row 2 of launch 1), slot 2 (row 0), slot 3 (new)
    slots2 = np.array([1, 2, 3], np.int32)
    from_row = np.array([2, 0], np.int32)
    pos2 = np.concatenate([pos1[from_row] + n1, [len(late[0])]]).astype(np.int32)
    params2 = uniform_rows(3, temperature=[1.0, 0.0, 0.7], repetition_penalty=[1.1, 1.2, 1.0],
                           seed=np.array([seeds[2], seeds[0], seeds[3]], np.uint64))
    steps2 = np.concatenate([steps1[from_row] + n1, [0]]).astype(np.uint64)
    new_token = np.int32(rng.integers(0, CONFIG.vocab_size))

    ref1, ref1_lp = reference.decode_steps(tok1, slots1, pos1, params1, steps1, n1)
    prefill_many(reference, [3], late)
    tok2 = np.array([ref1[-1, 2], ref1[-1, 0], new_token], np.int32)
    ref2, ref2_lp = reference.decode_steps(tok2, slots2, pos2, params2, steps2, n2)

    tested.decode_launch(tok1, slots1, pos1, params1, steps1, n1)
    assert tested.decode_pending == 1
    prefill_many(tested, [3], late)  # queued behind launch 1
    fed = np.array([-1 - 2, -1 - 0, new_token], np.int32)
    tested.decode_launch(fed, slots2, pos2, params2, steps2, n2)
    assert tested.decode_pending == 2
    got1, got1_lp = tested.decode_wait()
    got2, got2_lp = tested.decode_wait()
    assert tested.decode_pending == 0
    assert got1.shape == (n1, 3) and got2.shape == (n2, 3)
    np.testing.assert_array_equal(got1, ref1)
    np.testing.assert_array_equal(got1_lp, ref1_lp)
    np.testing.assert_array_equal(got2, ref2)
    np.testing.assert_array_equal(got2_lp, ref2_lp)

    # A launch after both were taken still continues the newest one; decode_steps and sample
    # work again once nothing is pending.
    pos3 = pos2 + n2
    steps3 = steps2 + n2
    ref3, _ = reference.decode_steps(ref2[-1].astype(np.int32), slots2, pos3, params2, steps3, 1)
    tested.decode_launch(np.array([-1, -2, -3], np.int32), slots2, pos3, params2, steps3, 1)
    got3, _ = tested.decode_wait()
    np.testing.assert_array_equal(got3, ref3)
    again, _ = tested.sample(slots2, pos3, params2, steps3)
    np.testing.assert_array_equal(again, ref3[0])


def test_misuse_is_refused_and_the_engine_stays_usable(engine_pair, rng):
    _, engine = engine_pair
    prefill_many(engine, [0, 1], prompts(rng, (6, 9)))
    slots = np.array([0, 1], np.int32)
    pos = np.array([6, 9], np.int32)
    params, steps = uniform_rows(2), np.zeros(2, np.uint64)
    tok = np.array([3, 4], np.int32)

    with pytest.raises(ValueError, match="none to continue"):
        engine.decode_launch(np.array([-1, 4], np.int32), slots, pos, params, steps, 2)
    with pytest.raises(RuntimeError, match="no decode_launch is pending"):
        engine.decode_wait()
    engine.decode_launch(tok, slots, pos, params, steps, 2)
    with pytest.raises(ValueError, match="continues row 2 of the previous decode_launch, which had 2 rows"):
        engine.decode_launch(np.array([-3, -1], np.int32), slots, pos + 2, params, steps + 2, 1)
    with pytest.raises(ValueError, match="context is full"):
        engine.decode_launch(np.array([-1, -2], np.int32), slots, pos + 40, params, steps + 2, 64)
    engine.decode_launch(np.array([-1, -2], np.int32), slots, pos + 2, params, steps + 2, 1)
    with pytest.raises(RuntimeError, match="2 launches are pending already"):
        engine.decode_launch(np.array([-1, -2], np.int32), slots, pos + 3, params, steps + 3, 1)
    for call in (lambda: engine.decode_steps(tok, slots, pos, params, steps, 1),
                 lambda: engine.decode(tok, slots, pos),
                 lambda: engine.sample(slots, pos, params, steps)):
        with pytest.raises(RuntimeError, match="decode_launch call\\(s\\) are pending"):
            call()
    first, _ = engine.decode_wait()
    second, _ = engine.decode_wait()
    assert first.shape == (2, 2) and second.shape == (1, 2)

    # decode_discard forgets what is pending and what could be continued
    engine.decode_launch(tok, slots, pos, params, steps, 1)
    engine.decode_discard()
    assert engine.decode_pending == 0
    with pytest.raises(ValueError, match="none to continue"):
        engine.decode_launch(np.array([-1, -2], np.int32), slots, pos + 1, params, steps + 1, 1)
    tokens, _ = engine.decode_steps(tok, slots, pos, params, steps, 3)
    assert tokens.shape == (3, 2) and ((0 <= tokens) & (tokens < CONFIG.vocab_size)).all()
