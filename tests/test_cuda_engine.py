"""The CUDA engine end to end: logits against llama_brrr.reference.ReferenceLlama under docs/design.md's
bf16 rule, decode after prefill, batched decode against each sequence alone, CUDA-graph replay
against eager, on-device sampling against the CPU sampler, the real model's greedy tokens against
the CPU backend, and the errors (out of memory, bad ids, missing weights).

The bf16 rule: the relative error of our logits against the fp32 oracle must be at most twice the
relative error of the same computation done by PyTorch in bf16 (ReferenceLlama(dtype=bf16) on the
GPU). Both the oracle and the bf16 run use the weights as the engine stores them (rounded to bf16),
so the comparison measures the arithmetic, not the storage format.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llama_brrr.config import ModelConfig  # noqa: E402
from llama_brrr.sampling import uniform_rows  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def C(cuda_C):
    return cuda_C


CHUNK = 2048  # CudaEngine::kPrefillChunk

LLAMA3_SMALL = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

CONFIGS = {
    # GQA 4/2, untied LM head, head_dim 64, hidden and vocab sizes that are not powers of two
    "gqa-untied-hd64": ModelConfig(dim=136, hidden_dim=200, n_layers=2, n_heads=4, n_kv_heads=2,
                                   head_dim=64, vocab_size=1001, name="gqa-untied-hd64"),
    # tied embeddings, llama3 rope scaling, head_dim 128, GQA 4/1
    "tied-llama3-hd128": ModelConfig(dim=256, hidden_dim=344, n_layers=2, n_heads=4, n_kv_heads=1,
                                     head_dim=128, vocab_size=515, rope_theta=500000.0,
                                     rope_scaling=dict(LLAMA3_SMALL), tie_embeddings=True,
                                     name="tied-llama3-hd128"),
    # plain multi-head attention, odd model width and MLP width
    "mha-odd-dims": ModelConfig(dim=201, hidden_dim=257, n_layers=3, n_heads=2, n_kv_heads=2,
                                head_dim=64, vocab_size=999, norm_eps=1e-6, name="mha-odd-dims"),
}


def bf16_rounded(tensors: dict) -> dict:
    """The weights as the engine stores them, back in float32."""
    return {name: torch.from_numpy(a).to(torch.bfloat16).float().numpy() for name, a in tensors.items()}


def make_engine(C, config, tensors=None, max_seq=64, max_batch=1, graphs=True, kv_cache_dtype="auto"):
    engine = C.Engine("cuda", dict(config.engine_dict(max_seq, max_batch), kv_cache_dtype=kv_cache_dtype), "bf16", 0)
    engine.use_cuda_graphs = graphs
    if tensors is not None:
        for name, array in tensors.items():
            engine.set_weight(name, np.ascontiguousarray(array, dtype=np.float32), "f32")
    return engine


def rel_err(x, ref):
    x, ref = np.asarray(x, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


class Oracles:
    """The fp32 oracle (CPU) and the PyTorch-bf16 run (GPU) of one model, fed the same calls."""

    def __init__(self, config, tensors, kv_dtype=None):
        from llama_brrr.reference import ReferenceLlama
        weights = bf16_rounded(tensors)
        self.fp32 = ReferenceLlama(config, weights, dtype=torch.float32, device="cpu", kv_dtype=kv_dtype)
        self.bf16 = ReferenceLlama(config, weights, dtype=torch.bfloat16, device="cuda", kv_dtype=kv_dtype)

    def forward(self, tokens, start_pos):
        a = self.fp32.forward(list(map(int, tokens)), start_pos=start_pos)[0].cpu().numpy()
        b = self.bf16.forward(list(map(int, tokens)), start_pos=start_pos)[0].float().cpu().numpy()
        return a, b


def assert_bf16_rule(ours, oracle, torch_bf16, what):
    assert np.isfinite(ours).all(), f"{what}: non-finite logits"
    ours_err, torch_err = rel_err(ours, oracle), rel_err(torch_bf16, oracle)
    assert 0 < torch_err < 0.2, f"{what}: the PyTorch bf16 run is off by {torch_err:.3g}; the bound is meaningless"
    assert ours_err <= 2 * torch_err, (
        f"{what}: relative error {ours_err:.3g} > 2 x PyTorch bf16's {torch_err:.3g}")


# ---- logits against the oracle ------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_logits_follow_the_bf16_rule(C, rng, make_weights, name):
    config = CONFIGS[name]
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors, max_seq=64)
    oracles = Oracles(config, tensors)
    tokens = rng.integers(0, config.vocab_size, size=37).astype(np.int32)
    ours = engine.prefill(0, tokens, 0, "all")
    assert ours.shape == (37, config.vocab_size)
    oracle, torch_bf16 = oracles.forward(tokens, 0)
    assert_bf16_rule(ours, oracle, torch_bf16, f"{name} prefill of 37 tokens")
    # "last" is the last row of "all" (its LM head runs as a 1-row matmul: same sums, maybe
    # another summation order)
    last = make_engine(C, config, tensors, max_seq=64).prefill(0, tokens, 0, "last")
    assert last.shape == (1, config.vocab_size)
    np.testing.assert_allclose(last[0], ours[-1], rtol=0, atol=1e-5 * np.abs(ours[-1]).max())


def test_long_prompt_runs_in_chunks_and_continues(C, rng, make_weights):
    """A prompt longer than the prefill chunk runs in two chunks; a second prefill continues."""
    config = CONFIGS["gqa-untied-hd64"]
    tensors = make_weights(config, rng)
    n = CHUNK + 90
    engine = make_engine(C, config, tensors, max_seq=n + 40)
    oracles = Oracles(config, tensors)
    first = rng.integers(0, config.vocab_size, size=n).astype(np.int32)
    more = rng.integers(0, config.vocab_size, size=9).astype(np.int32)
    ours = np.concatenate([engine.prefill(0, first, 0, "all"), engine.prefill(0, more, n, "all")])
    oracle_a, bf16_a = oracles.forward(first, 0)
    oracle_b, bf16_b = oracles.forward(more, n)
    assert_bf16_rule(ours, np.concatenate([oracle_a, oracle_b]), np.concatenate([bf16_a, bf16_b]),
                     f"{n} + 9 prompt tokens")


@pytest.mark.parametrize("name", ["gqa-untied-hd64", "tied-llama3-hd128"])
def test_decode_after_prefill_follows_the_bf16_rule(C, rng, make_weights, name):
    config = CONFIGS[name]
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors, max_seq=64, max_batch=2)
    oracles = Oracles(config, tensors)
    prompt = rng.integers(0, config.vocab_size, size=20).astype(np.int32)
    ours, oracle, torch_bf16 = [engine.prefill(1, prompt, 0, "last")[0]], [], []
    a, b = oracles.forward(prompt, 0)
    oracle.append(a[-1])
    torch_bf16.append(b[-1])
    for step, token in enumerate(rng.integers(0, config.vocab_size, size=8)):
        position = 20 + step
        logits = engine.decode(np.array([token], np.int32), np.array([1], np.int32),
                               np.array([position], np.int32), True)
        ours.append(logits[0])
        a, b = oracles.forward([token], position)
        oracle.append(a[-1])
        torch_bf16.append(b[-1])
    assert_bf16_rule(np.array(ours), np.array(oracle), np.array(torch_bf16), f"{name} decode")


@pytest.mark.parametrize("name", ["gqa-untied-hd64", "tied-llama3-hd128"])
def test_fp8_kv_cache_follows_the_bf16_rule_against_an_fp8_oracle(C, rng, make_weights, name):
    """kv_cache_dtype fp8_e4m3: prefill (every row) and decode (CUDA graphs) against the oracles
    whose caches round k and v to e4m3 the same way; the bf16 engine is farther from that oracle
    than the fp8 engine is, so the option is not ignored."""
    config = CONFIGS[name]
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors, max_seq=64, max_batch=2, kv_cache_dtype="fp8_e4m3")
    plain = make_engine(C, config, tensors, max_seq=64, max_batch=2)
    assert engine.config["kv_cache_dtype"] == "fp8_e4m3" and plain.config["kv_cache_dtype"] == "auto"
    oracles = Oracles(config, tensors, kv_dtype=torch.float8_e4m3fn)
    prompt = rng.integers(0, config.vocab_size, size=37).astype(np.int32)
    ours, bf16_kv = [engine.prefill(1, prompt, 0, "all")], [plain.prefill(1, prompt, 0, "all")]
    a, b = oracles.forward(prompt, 0)
    oracle, torch_bf16 = [a], [b]
    for step, token in enumerate(rng.integers(0, config.vocab_size, size=8)):
        args = (np.array([token], np.int32), np.array([1], np.int32), np.array([37 + step], np.int32), True)
        ours.append(engine.decode(*args))
        bf16_kv.append(plain.decode(*args))
        a, b = oracles.forward([token], 37 + step)
        oracle.append(a)
        torch_bf16.append(b)
    ours, bf16_kv, oracle, torch_bf16 = map(np.concatenate, (ours, bf16_kv, oracle, torch_bf16))
    assert_bf16_rule(ours, oracle, torch_bf16, f"{name} with an fp8 KV cache")
    assert rel_err(bf16_kv, oracle) > rel_err(ours, oracle), f"{name}: the fp8 cache made no difference"


# ---- batching and graphs ------------------------------------------------------------------------

def test_batched_decode_of_mixed_lengths_equals_each_alone(C, rng, make_weights):
    """Each row of a batch of 3 sequences of mixed lengths against the same sequence decoded
    beside a stranger (a batch of 2: the same tensor-core GEMVs, so equal up to flash_decode's
    batch-dependent split merge, 1e-6) and alone (batch 1: the CUDA-core GEMV, which sums in
    another order, so equal within bf16 rounding)."""
    config = CONFIGS["gqa-untied-hd64"]
    tensors = make_weights(config, rng)
    batched = make_engine(C, config, tensors, max_seq=64, max_batch=4)
    paired = make_engine(C, config, tensors, max_seq=64, max_batch=4)
    alone = make_engine(C, config, tensors, max_seq=64, max_batch=4)
    slots = np.array([2, 0, 3], np.int32)
    stranger_slot = 1
    prompts = [rng.integers(0, config.vocab_size, size=n).astype(np.int32) for n in (5, 17, 40)]
    for slot, prompt in zip(slots, prompts):
        for engine in (batched, paired, alone):
            engine.prefill(int(slot), prompt, 0, "none")
    positions = np.array([len(p) for p in prompts], np.int32)
    for step in range(6):  # eager, capture, then replays of the B = 3, 2 and 1 graphs
        tokens = rng.integers(0, config.vocab_size, size=3).astype(np.int32)
        together = batched.decode(tokens, slots, positions, True)
        for i in range(3):
            # the stranger re-decodes position `step` of its slot: same token, same K/V each time
            pair = paired.decode(np.array([tokens[i], 7], np.int32), np.array([slots[i], stranger_slot], np.int32),
                                 np.array([positions[i], step], np.int32), True)[0]
            single = alone.decode(tokens[i:i + 1], slots[i:i + 1], positions[i:i + 1], True)[0]
            scale = np.abs(single).max()
            assert np.abs(together[i] - pair).max() <= 1e-6 * scale, f"row {i}: batch of 3 against 2"
            assert np.abs(together[i] - single).max() <= 2e-2 * scale, f"row {i}: batch of 3 against alone"
        positions += 1


def test_graph_replay_equals_eager(C, rng, make_weights):
    config = CONFIGS["tied-llama3-hd128"]
    tensors = make_weights(config, rng)
    graphed = make_engine(C, config, tensors, max_seq=64, max_batch=2, graphs=True)
    eager = make_engine(C, config, tensors, max_seq=64, max_batch=2, graphs=False)
    assert graphed.use_cuda_graphs and not eager.use_cuda_graphs
    prompts = [rng.integers(0, config.vocab_size, size=n).astype(np.int32) for n in (3, 11)]
    for slot, prompt in enumerate(prompts):
        np.testing.assert_array_equal(graphed.prefill(slot, prompt, 0, "last"),
                                      eager.prefill(slot, prompt, 0, "last"))
    positions = np.array([3, 11], np.int32)
    for step in range(5):
        tokens = rng.integers(0, config.vocab_size, size=2).astype(np.int32)
        batch = 2 if step != 3 else 1  # the B = 1 graph too, interleaved
        args = (tokens[:batch], np.arange(batch, dtype=np.int32), positions[:batch])
        np.testing.assert_array_equal(graphed.decode(*args, True), eager.decode(*args, True),
                                      err_msg=f"step {step}")
        positions[:batch] += 1


def test_decode_without_logits_then_sample(C, rng, make_weights):
    """The hot loop: decode(logits=False) never syncs; sample picks from the device logits and
    agrees with the CPU sampler run on the same logits and history."""
    config = CONFIGS["gqa-untied-hd64"]
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors, max_seq=64, max_batch=3)
    probe = make_engine(C, config, tensors, max_seq=64, max_batch=3)
    history = {}
    for slot, n in enumerate((4, 9, 13)):
        prompt = rng.integers(0, config.vocab_size, size=n).astype(np.int32)
        engine.prefill(slot, prompt, 0, "none")
        probe.prefill(slot, prompt, 0, "none")
        history[slot] = list(prompt)
    slots = np.arange(3, dtype=np.int32)
    positions = np.array([4, 9, 13], np.int32)
    tokens = rng.integers(0, config.vocab_size, size=3).astype(np.int32)
    cases = [(0.0, 0, 1.0, 0.0, 1.0), (0.0, 0, 1.0, 0.0, 1.3), (0.9, 40, 0.9, 0.0, 1.1), (1.0, 0, 1.0, 0.05, 1.0)]
    agree = total = 0
    for step in range(8):
        for slot in range(3):
            history[slot].append(int(tokens[slot]))
        assert engine.decode(tokens, slots, positions, False) is None
        logits = probe.decode(tokens, slots, positions, True)
        temperature, top_k, top_p, min_p, penalty = cases[step % len(cases)]
        seeds = rng.integers(0, 2**63, size=3).astype(np.uint64)
        steps = np.full(3, step, np.uint64)
        params = uniform_rows(3, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repetition_penalty=penalty, seed=seeds)
        chosen, logprobs = engine.sample(slots, positions, params, steps)
        for i in range(3):
            expected, expected_lp = C.cpu_ops.sample_row(
                logits[i], np.array(history[i], np.int32), temperature, top_k, top_p, min_p, penalty,
                int(seeds[i]), step)
            if temperature == 0.0:
                assert chosen[i] == expected, f"greedy row {i} step {step}"
            total += 1
            agree += chosen[i] == expected
            if chosen[i] == expected:
                assert abs(logprobs[i] - expected_lp) <= 1e-4 * max(1.0, abs(expected_lp))
        tokens = chosen.astype(np.int32)
        positions += 1
    assert agree >= total - 1, f"{agree}/{total} sampled tokens agree with the CPU sampler"


def step_by_step(engine, tokens, slots, positions, params, steps, n_steps):
    """What model.py did before decode_steps: decode and sample in turn, tokens fed back by the host."""
    tokens, positions, steps = tokens.copy(), positions.copy(), steps.copy()
    out_tokens, out_logprobs = [], []
    for _ in range(n_steps):
        assert engine.decode(tokens, slots, positions, False) is None
        chosen, logprobs = engine.sample(slots, positions, params, steps)
        out_tokens.append(chosen)
        out_logprobs.append(logprobs)
        tokens, positions, steps = chosen.astype(np.int32), positions + 1, steps + 1
    return np.stack(out_tokens), np.stack(out_logprobs)


@pytest.mark.parametrize("graphs", [True, False])
def test_decode_steps_equals_decode_and_sample_in_turn(C, rng, make_weights, graphs):
    """The device-side loop (tokens fed back on the GPU) gives the host loop's tokens and logprobs
    bit for bit: greedy, sampled and penalized rows of mixed lengths in one batch."""
    config = CONFIGS["gqa-untied-hd64"]
    tensors = make_weights(config, rng)
    looped = make_engine(C, config, tensors, max_seq=64, max_batch=3, graphs=graphs)
    stepped = make_engine(C, config, tensors, max_seq=64, max_batch=3, graphs=graphs)
    lengths = (4, 9, 13)
    for slot, n in enumerate(lengths):
        prompt = rng.integers(0, config.vocab_size, size=n).astype(np.int32)
        looped.prefill(slot, prompt, 0, "none")
        stepped.prefill(slot, prompt, 0, "none")
    slots = np.array([2, 0, 1], np.int32)  # rows need not follow slot order
    positions = np.array([lengths[s] for s in slots], np.int32)
    tokens = rng.integers(0, config.vocab_size, size=3).astype(np.int32)
    params = uniform_rows(3, temperature=[0.0, 0.9, 1.0], top_k=[0, 40, 0], top_p=[1.0, 0.9, 1.0],
                          min_p=[0.0, 0.0, 0.05], repetition_penalty=[1.3, 1.1, 1.0],
                          seed=rng.integers(0, 2**63, size=3).astype(np.uint64))
    steps = np.array([0, 5, 2], np.uint64)
    expected_tokens, expected_logprobs = step_by_step(stepped, tokens, slots, positions, params, steps, 7)
    got_tokens, got_logprobs = looped.decode_steps(tokens, slots, positions, params, steps, 7)
    assert got_tokens.shape == (7, 3) and got_logprobs.shape == (7, 3)
    np.testing.assert_array_equal(got_tokens, expected_tokens)
    np.testing.assert_array_equal(got_logprobs, expected_logprobs)
    # The loop continues where it left off, in chunks of any size, including one round.
    positions, steps, tokens = positions + 7, steps + 7, got_tokens[-1].astype(np.int32)
    expected_tokens, _ = step_by_step(stepped, tokens, slots, positions, params, steps, 3)
    first, _ = looped.decode_steps(tokens, slots, positions, params, steps, 1)
    rest, _ = looped.decode_steps(first[0].astype(np.int32), slots, positions + 1, params, steps + 1, 2)
    np.testing.assert_array_equal(np.concatenate([first, rest]), expected_tokens)


def test_decode_steps_bad_arguments_raise_and_leave_the_engine_usable(C, rng, make_weights):
    config = CONFIGS["mha-odd-dims"]
    engine = make_engine(C, config, make_weights(config, rng), max_seq=32, max_batch=2)
    engine.prefill(0, np.arange(5, dtype=np.int32), 0, "none")
    params = uniform_rows(1)
    args = (np.array([5], np.int32), np.array([0], np.int32), np.array([5], np.int32))
    with pytest.raises(ValueError, match="n_steps"):
        engine.decode_steps(*args, params, np.zeros(1, np.uint64), 0)
    with pytest.raises(ValueError, match="n_steps"):
        engine.decode_steps(*args, params, np.zeros(1, np.uint64), 65)
    with pytest.raises(ValueError, match="context is full"):
        engine.decode_steps(*args, params, np.zeros(1, np.uint64), 28)  # positions 5..32 > 31
    with pytest.raises(ValueError, match="top_k"):
        engine.decode_steps(*args, uniform_rows(1, top_k=-1), np.zeros(1, np.uint64), 2)
    tokens, _ = engine.decode_steps(*args, params, np.zeros(1, np.uint64), 27)  # positions 5..31
    assert tokens.shape == (27, 1) and ((0 <= tokens) & (tokens < config.vocab_size)).all()


def test_sample_after_prefill_uses_its_last_logits(C, rng, make_weights):
    config = CONFIGS["mha-odd-dims"]
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors, max_seq=64, max_batch=2)
    prompt = rng.integers(0, config.vocab_size, size=12).astype(np.int32)
    greedy_args = (uniform_rows(1), np.zeros(1, np.uint64))
    for mode in ("none", "last", "all"):
        result = engine.prefill(1, prompt, 0, mode)
        token, _ = engine.sample(np.array([1], np.int32), np.array([11], np.int32), *greedy_args)
        if result is not None:
            assert token[0] == int(np.argmax(result[-1]))
    with pytest.raises(RuntimeError, match="does not match"):
        engine.sample(np.array([0, 1], np.int32), np.array([11, 11], np.int32),
                      *(np.repeat(a, 2) for a in greedy_args))


# ---- weights ------------------------------------------------------------------------------------

def test_set_and_get_weight_round_trip_through_bf16(C, rng, make_weights):
    config = CONFIGS["gqa-untied-hd64"]
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors)
    for name in ("tok_embeddings", "layers.1.wk", "layers.0.w3", "layers.1.ffn_norm", "output"):
        expected = bf16_rounded({name: tensors[name]})[name]
        np.testing.assert_array_equal(engine.get_weight(name), expected, err_msg=name)
    half = tensors["layers.0.wv"].astype(np.float16)
    engine.set_weight("layers.0.wv", half, "f16")
    np.testing.assert_array_equal(engine.get_weight("layers.0.wv"),
                                  torch.from_numpy(half.astype(np.float32)).to(torch.bfloat16).float().numpy())
    bits = torch.from_numpy(tensors["layers.0.wq"]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    engine.set_weight("layers.0.wq", bits, "bf16")
    np.testing.assert_array_equal(engine.get_weight("layers.0.wq"), bf16_rounded(tensors)["layers.0.wq"])


def test_init_random_makes_the_cpu_engines_weights(C):
    config = CONFIGS["tied-llama3-hd128"]
    gpu = C.Engine("cuda", config.engine_dict(16, 1), "bf16", 0)
    cpu = C.Engine("cpu", config.engine_dict(16, 1), "bf16")
    gpu.init_random(1234, 0.02)
    cpu.init_random(1234, 0.02)
    for name in config.tensor_shapes():
        a, b = gpu.get_weight(name), cpu.get_weight(name)
        if name.endswith("norm"):  # the CPU keeps norms in fp32
            b = torch.from_numpy(b).to(torch.bfloat16).float().numpy()
        assert (a == b).mean() >= 0.999, name
        assert np.abs(a - b).max() <= 2.0**-7 * max(1.0, np.abs(b).max()), name
    assert abs(gpu.get_weight("layers.0.w1").std() - 0.02) < 0.001


# ---- the real model -----------------------------------------------------------------------------

def test_real_model_greedy_tokens_match_the_cpu_backend(C):
    pytest.importorskip("gguf", reason="the default model is a GGUF file; pip install gguf")
    from llama_brrr import Llama, fetch
    path = fetch.local_default_model()
    if path is None:
        pytest.skip(f"default model not found at {fetch.default_model_path()} (or $LLAMA_BRRR_DEFAULT_MODEL): "
                    "run `python weights/fetch.py`")
    prompt = "The three primary colors are"
    outputs = {}
    # Both engines hold the same bf16 weights (quant="none"; test_cuda_quant_engine.py runs the
    # blocks as stored); they differ only in arithmetic (the GPU feeds its matmuls bf16
    # activations, the CPU computes in fp32).
    for device in ("cuda", "cpu"):
        llm = Llama.from_pretrained(str(path), device=device, dtype="bf16", max_seq_len=256,
                                    max_batch=1, progress=False, quant="none")
        outputs[device] = llm.generate(prompt, max_tokens=32, temperature=0.0, ignore_eos=True)[0].token_ids
        del llm
    assert len(outputs["cuda"]) == 32
    assert outputs["cuda"] == outputs["cpu"]


# ---- errors -------------------------------------------------------------------------------------

def test_out_of_memory_is_a_memory_error_and_the_process_goes_on(C, rng, make_weights):
    config = CONFIGS["gqa-untied-hd64"]
    with pytest.raises(MemoryError) as info:
        C.Engine("cuda", config.engine_dict(2**28, 64), "bf16", 0)
    message = str(info.value)
    assert "bytes" in message and "free" in message and "max_seq_len" in message, message
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors, max_seq=32)
    logits = engine.prefill(0, np.arange(5, dtype=np.int32), 0, "last")
    assert np.isfinite(logits).all()


def test_bad_arguments_raise_and_leave_the_engine_usable(C, rng, make_weights):
    config = CONFIGS["gqa-untied-hd64"]
    tensors = make_weights(config, rng)
    engine = make_engine(C, config, tensors, max_seq=32, max_batch=2)
    V = config.vocab_size
    with pytest.raises(ValueError, match=f"token id {V + 5}"):
        engine.prefill(0, np.array([1, V + 5], np.int32), 0, "last")
    with pytest.raises(ValueError, match="token id -1"):
        engine.decode(np.array([-1], np.int32), np.array([0], np.int32), np.array([0], np.int32), True)
    with pytest.raises(ValueError, match="slot"):
        engine.decode(np.array([1], np.int32), np.array([2], np.int32), np.array([0], np.int32), True)
    with pytest.raises(ValueError, match="context is full"):
        engine.prefill(0, np.arange(30, dtype=np.int32), 10, "last")
    with pytest.raises(ValueError, match="appears twice"):
        engine.decode(np.array([1, 2], np.int32), np.array([1, 1], np.int32), np.array([0, 0], np.int32), True)
    with pytest.raises(RuntimeError, match="no logits"):
        engine.sample(np.array([0], np.int32), np.array([0], np.int32), uniform_rows(1),
                      np.zeros(1, np.uint64))
    assert np.isfinite(engine.prefill(0, np.array([1, 2, 3], np.int32), 0, "last")).all()


def test_missing_weight_is_named(C, rng, make_weights):
    config = CONFIGS["mha-odd-dims"]
    tensors = make_weights(config, rng)
    del tensors["layers.2.w2"]
    engine = make_engine(C, config, tensors)
    with pytest.raises(RuntimeError, match="layers.2.w2"):
        engine.prefill(0, np.array([1, 2], np.int32), 0, "last")


def test_engine_rejects_what_the_gpu_kernels_cannot_run(C):
    bad_head = ModelConfig(dim=64, hidden_dim=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32,
                           vocab_size=10)
    with pytest.raises(RuntimeError, match="head_dim"):
        C.Engine("cuda", bad_head.engine_dict(16, 1), "bf16", 0)
    with pytest.raises(RuntimeError, match="bf16"):
        C.Engine("cuda", CONFIGS["gqa-untied-hd64"].engine_dict(16, 1), "f32", 0)
    with pytest.raises(RuntimeError, match="device"):
        C.Engine("cuda", CONFIGS["gqa-untied-hd64"].engine_dict(16, 1), "bf16", C.cuda_device_count())
