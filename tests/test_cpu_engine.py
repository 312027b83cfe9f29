"""The whole CPU engine (_C.Engine("cpu", ...)) against llama_brrr.reference.ReferenceLlama on tiny
random models: prefill, decode after prefill, batched decode, chunked prompts, bf16 weights, the fp8
(e4m3) KV cache, sampling through the engine, and every argument error the bindings promise to name.

Weights are drawn so activations and logits are O(1) (conftest.random_weights): with the usual
N(0, 0.02) the logits of a tiny model are ~1e-3 and a 1e-3 tolerance would prove nothing.
"""

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from llama_brrr.config import ModelConfig
from llama_brrr.reference import ReferenceLlama
from llama_brrr.sampling import uniform_rows

FP32_TOL = 1e-3  # docs/design.md: fp32 CPU path vs fp32 oracle, max |delta logit|
CHUNK = 256      # CpuEngine::kPrefillChunk

LLAMA3_SMALL = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
CONFIGS = {
    "gqa": ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256),
    "mha-tied": ModelConfig(dim=64, hidden_dim=128, n_layers=2, n_heads=4, n_kv_heads=4,
                            vocab_size=200, tie_embeddings=True),
    "llama3-rope": ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=1,
                               vocab_size=160, rope_theta=500000.0, rope_scaling=LLAMA3_SMALL,
                               tie_embeddings=True),
    "head-dim-32-of-72": ModelConfig(dim=72, hidden_dim=100, n_layers=2, n_heads=3, n_kv_heads=1,
                                     head_dim=32, vocab_size=150, norm_eps=1e-6),
    "odd": ModelConfig(dim=72, hidden_dim=200, n_layers=3, n_heads=6, n_kv_heads=2,
                       vocab_size=333, rope_theta=12345.6),
}


def build_engine(C, config, tensors, dtype="f32", max_seq_len=320, max_batch=4, n_threads=0,
                 as_dtype=None, kv_cache_dtype=None):
    engine = C.Engine("cpu", config.engine_dict(max_seq_len, max_batch, kv_cache_dtype=kv_cache_dtype),
                      dtype, 0, n_threads)
    for name, array in tensors.items():
        if as_dtype == "bf16":
            engine.set_weight(name, array.astype(ml_dtypes.bfloat16).view(np.uint16), "bf16")
        elif as_dtype == "f16":
            engine.set_weight(name, array.astype(np.float16), "f16")
        else:
            engine.set_weight(name, array, "f32")
    return engine


def tokens(rng, config, n):
    return rng.integers(0, config.vocab_size, n).astype(np.int32)


@pytest.fixture(params=list(CONFIGS))
def model(request, rng, make_weights):
    config = CONFIGS[request.param]
    return config, make_weights(config, rng)


# ---- fp32 logits vs the oracle ------------------------------------------------------------------

def test_prefill_all_logits_match_reference(C, rng, model):
    config, tensors = model
    engine = build_engine(C, config, tensors)
    prompt = tokens(rng, config, 37)
    ours = engine.prefill(0, prompt, 0, "all")
    theirs = ReferenceLlama(config, tensors).forward(prompt.tolist())[0].numpy()
    assert ours.shape == (37, config.vocab_size)
    assert np.abs(ours - theirs).max() < FP32_TOL
    last = engine.prefill(1, prompt, 0, "last")
    assert last.shape == (1, config.vocab_size)
    np.testing.assert_array_equal(last[0], ours[-1])
    assert engine.prefill(2, prompt, 0, "none") is None


def test_decode_after_prefill_matches_reference(C, rng, model):
    config, tensors = model
    engine = build_engine(C, config, tensors)
    ref = ReferenceLlama(config, tensors)
    prompt = tokens(rng, config, 9)
    slot = 2
    ours = engine.prefill(slot, prompt, 0, "last")[0]
    theirs = ref.forward(prompt.tolist())[0, -1].numpy()
    assert np.abs(ours - theirs).max() < FP32_TOL
    for pos in range(len(prompt), len(prompt) + 8):
        token = int(rng.integers(config.vocab_size))
        ours = engine.decode(np.array([token], np.int32), np.array([slot], np.int32),
                             np.array([pos], np.int32))
        theirs = ref.forward([token], start_pos=pos)[0, -1].numpy()
        assert ours.shape == (1, config.vocab_size)
        assert np.abs(ours[0] - theirs).max() < FP32_TOL, f"position {pos}"


def test_batched_decode_equals_each_sequence_alone(C, rng, model):
    config, tensors = model
    lengths = [3, 20, 11]
    prompts = [tokens(rng, config, n) for n in lengths]
    next_tokens = tokens(rng, config, 3)
    slots = np.array([3, 0, 1], np.int32)

    batched = build_engine(C, config, tensors)
    for slot, prompt in zip(slots, prompts):
        batched.prefill(int(slot), prompt, 0, "none")
    together = batched.decode(next_tokens, slots, np.array(lengths, np.int32))

    alone = build_engine(C, config, tensors, max_batch=1)
    for i, prompt in enumerate(prompts):
        alone.prefill(0, prompt, 0, "none")
        single = alone.decode(next_tokens[i:i + 1], np.array([0], np.int32),
                              np.array([lengths[i]], np.int32))[0]
        ref = ReferenceLlama(config, tensors)
        ref.forward(prompt.tolist())
        theirs = ref.forward([int(next_tokens[i])], start_pos=lengths[i])[0, -1].numpy()
        np.testing.assert_allclose(together[i], single, rtol=0, atol=1e-5)
        assert np.abs(together[i] - theirs).max() < FP32_TOL


def test_prompt_longer_than_a_chunk_matches_one_shot(C, rng, make_weights):
    config = CONFIGS["odd"]
    tensors = make_weights(config, rng)
    engine = build_engine(C, config, tensors, max_seq_len=2 * CHUNK + 40)
    n = 2 * CHUNK + 13
    prompt = tokens(rng, config, n)
    chunked = engine.prefill(0, prompt, 0, "all")
    theirs = ReferenceLlama(config, tensors).forward(prompt.tolist())[0].numpy()
    assert np.abs(chunked - theirs).max() < FP32_TOL
    # The same prompt fed in uneven pieces through start_pos: identical rows, exactly.
    pieces = [engine.prefill(1, prompt[a:b], a, "all") for a, b in [(0, 100), (100, 101), (101, n)]]
    np.testing.assert_allclose(np.concatenate(pieces), chunked, rtol=0, atol=1e-5)


def test_thread_count_does_not_change_results(C, rng, make_weights):
    config = CONFIGS["gqa"]
    tensors = make_weights(config, rng)
    prompt = tokens(rng, config, 19)
    one = build_engine(C, config, tensors, n_threads=1).prefill(0, prompt, 0, "all")
    two = build_engine(C, config, tensors, n_threads=2).prefill(0, prompt, 0, "all")
    np.testing.assert_array_equal(one, two)


# ---- weight storage -----------------------------------------------------------------------------

def test_get_weight_round_trips_and_f16_input(C, rng, make_weights):
    config = CONFIGS["gqa"]
    tensors = make_weights(config, rng)
    engine = build_engine(C, config, tensors)
    for name in ["tok_embeddings", "layers.1.wk", "layers.0.wv", "layers.1.w3", "norm", "output"]:
        np.testing.assert_array_equal(engine.get_weight(name), tensors[name])
    bf16 = build_engine(C, config, tensors, dtype="bf16")
    for name in ["layers.0.wq", "layers.1.w1", "layers.0.ffn_norm"]:
        want = tensors[name]
        if want.ndim == 2:  # matrices are stored in bf16; norm weights stay fp32
            want = want.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(bf16.get_weight(name), want)
    # f16 inputs are widened exactly: same logits as the fp32 copy of the same f16 values.
    prompt = tokens(rng, config, 7)
    from_f16 = build_engine(C, config, tensors, as_dtype="f16").prefill(0, prompt, 0, "all")
    widened = {k: v.astype(np.float16).astype(np.float32) for k, v in tensors.items()}
    np.testing.assert_array_equal(from_f16, build_engine(C, config, widened).prefill(0, prompt, 0, "all"))


def test_init_random_is_deterministic_and_scaled(C):
    config = CONFIGS["odd"]
    a = C.Engine("cpu", config.engine_dict(64, 1), "f32", 0, 1)
    b = C.Engine("cpu", config.engine_dict(64, 1), "f32", 0, 2)
    c = C.Engine("cpu", config.engine_dict(64, 1), "f32")
    a.init_random(7, 0.02)
    b.init_random(7, 0.02)
    c.init_random(8, 0.02)
    for name in ["tok_embeddings", "layers.2.w2", "layers.0.wk", "norm"]:
        np.testing.assert_array_equal(a.get_weight(name), b.get_weight(name))
        assert not np.array_equal(a.get_weight(name), c.get_weight(name))
    emb = a.get_weight("tok_embeddings")
    assert abs(emb.mean()) < 1e-3 and abs(emb.std() - 0.02) < 1e-3
    norm = a.get_weight("layers.1.attn_norm")
    assert abs(norm.mean() - 1) < 0.01 and 0.01 < norm.std() < 0.03
    # wq and wk draw from different streams even though they share the fused buffer
    assert not np.array_equal(a.get_weight("layers.0.wq")[:12], a.get_weight("layers.0.wk")[:12])
    logits = a.prefill(0, np.arange(5, dtype=np.int32), 0, "all")
    assert np.isfinite(logits).all()


# ---- bf16 weights under docs/design.md's rule ------------------------------------------------------------

def rel_error(x, oracle):
    return float(np.linalg.norm(x - oracle) / np.linalg.norm(oracle))


@pytest.mark.parametrize("feed", ["f32", "bf16"])
def test_bf16_engine_within_twice_torch_bf16_error(C, rng, model, feed):
    config, tensors = model
    prompt = tokens(rng, config, 24)
    oracle = ReferenceLlama(config, tensors).forward(prompt.tolist())[0].numpy()
    torch_bf16 = ReferenceLlama(config, tensors, dtype=torch.bfloat16).forward(prompt.tolist())[0].numpy()
    engine = build_engine(C, config, tensors, dtype="bf16", as_dtype=feed)
    ours = engine.prefill(0, prompt[:-1], 0, "all")
    decoded = engine.decode(prompt[-1:], np.array([0], np.int32), np.array([len(prompt) - 1], np.int32))
    ours = np.concatenate([ours, decoded])
    bound = rel_error(torch_bf16, oracle)
    assert bound > 0
    assert rel_error(ours, oracle) <= 2 * bound, (rel_error(ours, oracle), bound)


# ---- the fp8 (e4m3) KV cache against the oracle that rounds its KV the same way -----------------

# A key or value whose fp32 value lies within ~1e-5 (relative) of an e4m3 rounding boundary may round
# one way in the engine and the other in the oracle, both correctly: their float noise differs by
# ~1e-6. That one e4m3 step (6-12%) moves the logits by up to ~1e-2, past FP32_TOL, in a few percent
# of random cases. So the comparison runs on inputs whose every key and value is farther than this
# from a boundary in the oracle, where both must round alike.
E4M3_TIE_MARGIN = 3e-5


def e4m3_tie_margin(t: torch.Tensor) -> float:
    """The smallest distance of an element of t from an e4m3 rounding boundary (a midpoint between
    neighbouring e4m3 values), relative to the element's magnitude (to 2^-6, the smallest normal,
    below it)."""
    scale = t.detach().abs().double().clamp(min=2.0**-6)
    spacing = torch.exp2(torch.floor(torch.log2(scale)) - 3)  # 3 mantissa bits
    steps = t.detach().abs().double() / spacing
    distance = ((steps - steps.floor()) - 0.5).abs() * spacing
    return float((distance / scale).min()) if t.numel() else math.inf


class TieMarginReference(ReferenceLlama):
    """ReferenceLlama that records how near a rounding boundary its rounded keys and values came."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tie_margin = math.inf

    def _kv_rounded(self, t):
        self.tie_margin = min(self.tie_margin, e4m3_tie_margin(t))
        return super()._kv_rounded(t)


def run_prefill_then_decode(engine, prompt, steps, slot=1):
    """The prompt's logits (every row) then one row per decoded token, fed one at a time."""
    rows = [engine.prefill(slot, prompt, 0, "all")]
    for i, token in enumerate(steps):
        rows.append(engine.decode(np.array([token], np.int32), np.array([slot], np.int32),
                                  np.array([len(prompt) + i], np.int32)))
    return np.concatenate(rows)


def fp8_case_clear_of_ties(rng, config, tensors, n_prompt=12, n_decode=4, tries=300):
    """A prompt, tokens to decode after it, and the fp8-KV oracle's logits for them (prefill rows, then
    one row per decode step through its cache), drawn until no key or value of the oracle lies within
    E4M3_TIE_MARGIN of a rounding boundary."""
    for _ in range(tries):
        prompt, steps = tokens(rng, config, n_prompt), tokens(rng, config, n_decode)
        oracle = TieMarginReference(config, tensors, kv_dtype=torch.float8_e4m3fn)
        rows = [oracle.forward(prompt.tolist())[0]]
        rows += [oracle.forward([int(t)], start_pos=n_prompt + i)[0] for i, t in enumerate(steps)]
        if oracle.tie_margin >= E4M3_TIE_MARGIN:
            return prompt, steps, torch.cat(rows).numpy()
    pytest.fail(f"no draw of {tries} kept every key and value {E4M3_TIE_MARGIN} from an e4m3 tie")


def test_fp8_kv_cache_matches_the_oracle_that_rounds_its_kv(C, rng, model):
    config, tensors = model
    prompt, steps, oracle = fp8_case_clear_of_ties(rng, config, tensors)
    fp8 = build_engine(C, config, tensors, kv_cache_dtype="fp8_e4m3")
    assert fp8.config["kv_cache_dtype"] == "fp8_e4m3"
    ours = run_prefill_then_decode(fp8, prompt, steps)
    error = np.abs(ours - oracle).max()
    assert error < FP32_TOL, f"prefill and decode vs the fp8-KV oracle: {error}"
    # The option is not ignored: the default cache gives other logits, the oracle that keeps its
    # KV in fp32 is farther from this engine than the one that rounds it.
    default = build_engine(C, config, tensors)
    assert default.config["kv_cache_dtype"] == "auto"
    assert np.abs(ours - run_prefill_then_decode(default, prompt, steps)).max() > 10 * FP32_TOL
    unrounded = ReferenceLlama(config, tensors).forward(prompt.tolist() + steps.tolist())[0].numpy()
    assert np.abs(ours - unrounded).max() > 10 * max(error, FP32_TOL)


# ---- sampling through the engine ----------------------------------------------------------------

def sample_args(batch, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0, seed=0, step=0):
    """(params, step) of Engine.sample for `batch` rows alike."""
    params = uniform_rows(batch, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repetition_penalty=penalty, seed=seed)
    return params, np.full(batch, step, dtype=np.uint64)


def test_engine_sample_matches_sample_row_with_slot_history(C, rng, make_weights):
    config = CONFIGS["gqa"]
    engine = build_engine(C, config, make_weights(config, rng))
    prompt = tokens(rng, config, 12)
    logits = engine.prefill(1, prompt, 0, "last")[0]
    slot, pos = np.array([1], np.int32), np.array([11], np.int32)
    token, logprob = engine.sample(slot, pos, *sample_args(1))
    assert token[0] == np.argmax(logits)
    for step in range(5):
        args = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, penalty=1.3, seed=99, step=step)
        token, logprob = engine.sample(slot, pos, *sample_args(1, **args))
        want = C.cpu_ops.sample_row(logits, prompt, temperature=0.9, top_k=40, top_p=0.95,
                                    min_p=0.01, repetition_penalty=1.3, seed=99, step=step)
        assert (int(token[0]), float(logprob[0])) == pytest.approx(want)

    # After a batched decode, row i samples sequence i with its own slot's history.
    engine.prefill(3, prompt[:5], 0, "none")
    step_tokens = tokens(rng, config, 2)
    rows = engine.decode(step_tokens, np.array([1, 3], np.int32), np.array([12, 5], np.int32))
    got, _ = engine.sample(np.array([1, 3], np.int32), np.array([12, 5], np.int32),
                           *sample_args(2, penalty=1.5))
    for i, history in enumerate([np.append(prompt, step_tokens[0]), np.append(prompt[:5], step_tokens[1])]):
        assert got[i] == C.cpu_ops.sample_row(rows[i], history.astype(np.int32), repetition_penalty=1.5)[0]


def test_decode_steps_equals_decode_and_sample_in_turn(C, rng, make_weights):
    """Engine.decode_steps (the loop model.py runs) against decode + sample called in turn."""
    config = CONFIGS["gqa"]
    tensors = make_weights(config, rng)
    looped, stepped = build_engine(C, config, tensors), build_engine(C, config, tensors)
    for slot, n in ((0, 7), (2, 3)):
        prompt = tokens(rng, config, n)
        looped.prefill(slot, prompt, 0, "none")
        stepped.prefill(slot, prompt, 0, "none")
    slots, positions = np.array([2, 0], np.int32), np.array([3, 7], np.int32)
    args = sample_args(2, temperature=0.8, top_k=20, penalty=1.2, seed=5)[:-1]
    steps, current = np.array([0, 4], np.uint64), tokens(rng, config, 2)
    got_tokens, got_logprobs = looped.decode_steps(current, slots, positions, *args, steps, 6)
    assert got_tokens.shape == got_logprobs.shape == (6, 2)
    for s in range(6):
        stepped.decode(current, slots, positions + s, False)
        chosen, logprobs = stepped.sample(slots, positions + s, *args, steps + s)
        np.testing.assert_array_equal(got_tokens[s], chosen)
        np.testing.assert_array_equal(got_logprobs[s], logprobs)
        current = chosen.astype(np.int32)
    with pytest.raises(ValueError, match="context is full"):
        looped.decode_steps(current, slots, np.array([3, 318], np.int32), *args, steps, 3)
    with pytest.raises(ValueError, match="n_steps"):
        looped.decode_steps(current, slots, positions, *args, steps, 0)


def test_prefill_without_logits_leaves_nothing_to_sample(C, rng, make_weights):
    config = CONFIGS["gqa"]
    engine = build_engine(C, config, make_weights(config, rng))
    prompt = tokens(rng, config, 6)
    engine.prefill(0, prompt, 0, "last")
    engine.prefill(0, prompt[:5], 0, "none")
    with pytest.raises(RuntimeError, match=r"no logits to sample from"):
        engine.sample(np.array([0], np.int32), np.array([4], np.int32), *sample_args(1))
    # the "none" prefill still filled the cache: decoding the last token gives the full logits
    last = engine.decode(prompt[5:], np.array([0], np.int32), np.array([5], np.int32))
    np.testing.assert_allclose(last, engine.prefill(1, prompt, 0, "last"), rtol=0, atol=1e-5)
    token, _ = engine.sample(np.array([0], np.int32), np.array([5], np.int32), *sample_args(1))
    assert token[0] == np.argmax(last[0])


# ---- errors -------------------------------------------------------------------------------------

def test_errors_name_the_problem_and_leave_the_engine_usable(C, rng, make_weights):
    config = CONFIGS["odd"]
    tensors = make_weights(config, rng)
    engine = build_engine(C, config, tensors, max_seq_len=40, max_batch=2)
    one = np.array([1], np.int32)
    with pytest.raises(ValueError, match=r"token id 333 is out of range for vocab_size 333"):
        engine.prefill(0, np.array([1, 333], np.int32))
    with pytest.raises(ValueError, match=r"token id -4"):
        engine.decode(np.array([-4], np.int32), np.array([0], np.int32), one)
    with pytest.raises(ValueError, match=r"context is full.*max_seq_len is 40"):
        engine.prefill(0, np.zeros(41, np.int32))
    with pytest.raises(ValueError, match=r"context is full.*max_seq_len is 40"):
        engine.prefill(0, np.zeros(5, np.int32), 36)
    with pytest.raises(ValueError, match=r"context is full.*max_seq_len is 40"):
        engine.decode(one, np.array([0], np.int32), np.array([40], np.int32))
    with pytest.raises(ValueError, match=r"slot 2 is out of range.*max_batch = 2"):
        engine.prefill(2, one)
    with pytest.raises(ValueError, match=r"slot 1 appears twice"):
        engine.decode(np.array([1, 2], np.int32), np.array([1, 1], np.int32), np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match=r"batch size 3"):
        engine.decode(np.zeros(3, np.int32), np.arange(3, dtype=np.int32), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"at least one token"):
        engine.prefill(0, np.zeros(0, np.int32))
    with pytest.raises(ValueError, match=r"tokens must be a C-contiguous int32"):
        engine.prefill(0, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"positions must be"):
        engine.decode(one, np.array([0], np.int32), np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=r"unknown weight name 'layers.0.wqkv'"):
        engine.set_weight("layers.0.wqkv", np.zeros((10, 72), np.float32), "f32")
    with pytest.raises(ValueError, match=r"layer 3 out of range"):
        engine.set_weight("layers.3.wq", np.zeros((72, 72), np.float32), "f32")
    with pytest.raises(ValueError, match=r"'layers.1.w2' has shape \(72, 201\) but the config expects \(72, 200\)"):
        engine.set_weight("layers.1.w2", np.zeros((72, 201), np.float32), "f32")
    with pytest.raises(ValueError, match=r"'norm'.*must be float32, got float64"):
        engine.set_weight("norm", np.zeros(72), "f32")
    with pytest.raises(ValueError, match=r"must be C-contiguous"):
        engine.set_weight("layers.0.wo", np.zeros((72, 72), np.float32).T, "f32")
    with pytest.raises(ValueError, match=r"dtype must be"):
        engine.set_weight("norm", np.zeros(72, np.float32), "int8")
    with pytest.raises(ValueError, match=r"logits must be"):
        engine.prefill(0, one, 0, "first")
    with pytest.raises(ValueError, match=r"sampling row 0: top_p"):
        engine.sample(np.array([0], np.int32), np.array([0], np.int32), *sample_args(1, top_p=0.0))

    # ... and the engine still computes the right thing afterwards.
    prompt = tokens(rng, config, 30)
    ours = engine.prefill(0, prompt, 0, "all")
    theirs = ReferenceLlama(config, tensors).forward(prompt.tolist())[0].numpy()
    assert np.abs(ours - theirs).max() < FP32_TOL


def test_missing_weight_is_named_before_the_first_forward(C, rng, make_weights):
    config = CONFIGS["gqa"]
    tensors = make_weights(config, rng)
    engine = C.Engine("cpu", config.engine_dict(32, 1), "f32")
    for name, array in tensors.items():
        if name != "layers.1.ffn_norm":
            engine.set_weight(name, array, "f32")
    with pytest.raises(RuntimeError, match=r"'layers.1.ffn_norm' was never set"):
        engine.prefill(0, np.array([1, 2], np.int32))
    with pytest.raises(RuntimeError, match=r"no logits to sample from"):
        engine.sample(np.array([0], np.int32), np.array([1], np.int32), *sample_args(1))
    engine.set_weight("layers.1.ffn_norm", tensors["layers.1.ffn_norm"], "f32")
    ours = engine.prefill(0, np.array([1, 2], np.int32), 0, "all")
    assert np.abs(ours - ReferenceLlama(config, tensors).forward([1, 2])[0].numpy()).max() < FP32_TOL


def test_tied_config_has_no_output_weight(C):
    engine = C.Engine("cpu", CONFIGS["mha-tied"].engine_dict(16, 1), "f32")
    with pytest.raises(ValueError, match=r"'output' does not exist.*tie"):
        engine.set_weight("output", np.zeros((200, 64), np.float32), "f32")


def test_bad_configs_and_backends(C):
    good = CONFIGS["gqa"].engine_dict(16, 1)
    missing = {k: v for k, v in good.items() if k not in ("n_heads", "rope_theta")}
    with pytest.raises(KeyError, match=r"missing keys: n_heads, rope_theta"):
        C.Engine("cpu", missing, "f32")
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be a multiple of config.n_kv_heads \(3\)"):
        C.Engine("cpu", dict(good, n_kv_heads=3), "f32")
    with pytest.raises(ValueError, match=r"max_seq_len must be a positive integer"):
        C.Engine("cpu", dict(good, max_seq_len=0), "f32")
    with pytest.raises(ValueError, match=r"backend must be"):
        C.Engine("tpu", good, "f32")
    with pytest.raises(ValueError, match=r"dtype \"f16\" is for the cuda backend"):
        C.Engine("cpu", good, "f16")
    with pytest.raises(ValueError, match=r"n_threads must be >= 0"):
        C.Engine("cpu", good, "f32", 0, -1)
    with pytest.raises(ValueError, match=r"kv_cache_dtype'\] must be 'auto' or 'fp8_e4m3', got 'fp8'"):
        C.Engine("cpu", dict(good, kv_cache_dtype="fp8"), "f32")  # the engine takes only its own spelling
    assert C.Engine("cpu", good, "f32").config["kv_cache_dtype"] == "auto"
    if not C.cuda_compiled():
        with pytest.raises(RuntimeError, match=r"no CUDA support"):
            C.Engine("cuda", good, "bf16")
        assert C.cuda_device_count() == 0


def test_absurd_cache_raises_memory_error(C):
    config = dataclasses.replace(CONFIGS["gqa"], max_seq_len=1 << 30)
    with pytest.raises(MemoryError, match=r"bytes.*KV cache"):
        C.Engine("cpu", config.engine_dict(1 << 30, 64), "f32")
    assert C.Engine("cpu", CONFIGS["gqa"].engine_dict(16, 1), "f32").config["max_seq_len"] == 16


# ---- the real default model ---------------------------------------------------------------------

@pytest.mark.slow
def test_real_model_matches_reference_for_32_greedy_tokens(C):
    from llama_brrr.fetch import local_default_model
    from llama_brrr.loaders import load_model

    path = local_default_model()
    if path is None:
        pytest.skip("the default model is not fetched: run `python weights/fetch.py` "
                    "(or point LLAMA_BRRR_DEFAULT_MODEL at the GGUF)")
    model = load_model(path)
    config, tensors = model.config, model.tensors
    engine = C.Engine("cpu", config.engine_dict(128, 1), "f32")
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        if array.dtype == np.float32:
            engine.set_weight(name, array, "f32")
        elif array.dtype == np.float16:
            engine.set_weight(name, array, "f16")
        else:
            engine.set_weight(name, array.view(np.uint16), "bf16")
    ref = ReferenceLlama(config, tensors)
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308]
    ours = engine.prefill(0, np.array(prompt, np.int32), 0, "all")
    theirs = ref.forward(prompt)[0].numpy()
    assert np.abs(ours - theirs).max() < FP32_TOL
    # Teacher-forced on the oracle's greedy tokens, so one near-tie cannot derail the rest.
    ours, theirs = ours[-1], theirs[-1]
    for pos in range(len(prompt), len(prompt) + 32):
        token = int(np.argmax(theirs))
        top2 = np.sort(theirs)[-2:]
        if top2[1] - top2[0] > 1e-3:
            assert int(np.argmax(ours)) == token, f"greedy token differs at position {pos}"
        ours = engine.decode(np.array([token], np.int32), np.array([0], np.int32),
                             np.array([pos], np.int32))[0]
        theirs = ref.forward([token], start_pos=pos)[0, -1].numpy()
        assert np.abs(ours - theirs).max() < FP32_TOL, f"position {pos}"
