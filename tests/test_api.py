"""The Python API (Llama, SamplingParams, RequestOutput) on tiny random models on the CPU engine.

Random N(0, 0.02) weights give nearly uniform logits, where argmax comparisons between two
numerically different paths (prefill vs decode, batch vs alone) would hinge on float rounding. So
the fixtures redraw the LM head with std 1: logit gaps become O(1). Near-ties still turn up now and
then (a top-2 gap of 4e-4 in one of 48 positions), so greedy checks ask each token to be the argmax
of its own history up to a tolerance rather than comparing two runs token for token.
"""

import math

import numpy as np
import pytest

from llama_brrr import Llama, ModelConfig, RequestOutput, SamplingParams
from llama_brrr.model import RandomModelTokenizer

from counter_rng import uniform01

TINY = dict(dim=48, hidden_dim=80, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
            max_seq_len=128, name="tiny")
TIMING_KEYS = {"prompt_tokens", "generated_tokens", "ttft_s", "prefill_s", "decode_s", "total_s",
               "prefill_tok_s", "decode_tok_s"}


def make_tiny(max_batch=8, max_seq_len=None, weight_seed=0, dtype="f32", kv_cache_dtype="auto",
              **overrides) -> Llama:
    config = ModelConfig(**dict(TINY, **overrides))
    # One thread: tiny matrices gain nothing from more, and a busy CI box punishes spinning teams.
    llm = Llama.random(config, seed=weight_seed, device="cpu", max_batch=max_batch,
                       max_seq_len=max_seq_len, dtype=dtype, n_threads=1,
                       kv_cache_dtype=kv_cache_dtype)
    rng = np.random.default_rng(weight_seed + 1000)
    head = rng.normal(0.0, 1.0, (config.vocab_size, config.dim)).astype(np.float32)
    llm.engine.set_weight("output", head, "f32")
    return llm


@pytest.fixture(scope="module")
def llm():
    return make_tiny()


def random_prompts(rng, lengths, vocab=TINY["vocab_size"]):
    return [rng.integers(3, vocab, size=n).tolist() for n in lengths]


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def logits_along(llm, prompt, continuation):
    """forward() logits at each step of prompt + continuation: row i predicts continuation[i]. One
    whole-sequence forward, so generate's decode path is checked against the prefill path."""
    return llm.forward(list(prompt) + list(continuation[:-1]))[len(prompt) - 1:]


def assert_greedy(tokens, logits, tol=1e-3):
    """Each token must be the argmax of the logits over its own history, up to tol: two float paths
    may order a near-tie either way. Checking along the generated sequence (not against a second
    greedy run, which parts from it after the first near-tie) checks every position."""
    assert len(logits) == len(tokens)
    for i, (token, row) in enumerate(zip(tokens, np.asarray(logits, dtype=np.float64))):
        best = int(np.argmax(row))
        assert row[token] >= row[best] - tol, (
            f"token {i}: got {token} (logit {row[token]:.5f}), argmax {best} "
            f"(logit {row[best]:.5f}); tokens {list(tokens)}")


# ---- greedy correctness ------------------------------------------------------------------------

def test_greedy_generate_matches_argmax_of_forward(llm, rng):
    for prompt in random_prompts(rng, [1, 7, 23]):
        out = llm.generate(prompt, max_tokens=16, ignore_eos=True)[0]
        assert len(out.token_ids) == 16
        assert_greedy(out.token_ids, logits_along(llm, prompt, out.token_ids))


def test_bf16_weights_on_cpu_generate_their_own_argmax(rng):
    llm = make_tiny(dtype="bf16")
    assert llm.dtype == "bf16"
    prompt = random_prompts(rng, [6])[0]
    out = llm.generate(prompt, max_tokens=10, ignore_eos=True)[0]
    assert len(out.token_ids) == 10
    assert_greedy(out.token_ids, logits_along(llm, prompt, out.token_ids))


@pytest.mark.parametrize("spelling", ["fp8", "fp8_e4m3"])
def test_fp8_kv_cache_generates_its_own_argmax(rng, spelling):
    llm = make_tiny(kv_cache_dtype=spelling)
    assert llm.engine.config["kv_cache_dtype"] == "fp8_e4m3"
    assert make_tiny().engine.config["kv_cache_dtype"] == "auto"
    for prompt in random_prompts(rng, [1, 9]):
        out = llm.generate(prompt, max_tokens=12, ignore_eos=True)[0]
        assert len(out.token_ids) == 12
        # Prefill and decode compute a key's fp32 value with different noise, so one lying at an
        # e4m3 tie may round either way: a logit moves by up to ~1e-2 then.
        assert_greedy(out.token_ids, logits_along(llm, prompt, out.token_ids), tol=5e-2)


def test_greedy_matches_reference_llama(llm, rng):
    torch = pytest.importorskip("torch")
    from llama_brrr.reference import ReferenceLlama

    config = llm.config
    weights = {name: torch.from_numpy(llm.engine.get_weight(name))
               for name in config.tensor_shapes()}
    ref = ReferenceLlama(config, weights)
    prompt = random_prompts(rng, [11])[0]
    out = llm.generate(prompt, max_tokens=16, ignore_eos=True)[0]
    assert len(out.token_ids) == 16

    ids = list(prompt) + out.token_ids[:-1]
    with torch.no_grad():
        logits = ref.forward(torch.tensor([ids]))[0, len(prompt) - 1:].double().numpy()
    assert_greedy(out.token_ids, logits)


def test_forward_in_pieces_equals_forward_at_once(llm, rng):
    prompt = random_prompts(rng, [19])[0]
    whole = llm.forward(prompt)
    head = llm.forward(prompt[:8], slot=2)
    tail = llm.forward(prompt[8:], start_pos=8, slot=2)
    assert whole.shape == (19, TINY["vocab_size"]) and whole.dtype == np.float32
    np.testing.assert_allclose(np.concatenate([head, tail]), whole, atol=1e-4, rtol=1e-4)


# ---- batching ----------------------------------------------------------------------------------

def test_batch_of_different_lengths_equals_each_alone(llm, rng):
    prompts = random_prompts(rng, [1, 13, 5, 30, 2])
    batch = llm.generate(prompts, max_tokens=12, ignore_eos=True, logprobs=True)
    assert [o.prompt_token_ids for o in batch] == prompts  # results come back in input order
    for prompt, out in zip(prompts, batch):
        alone = llm.generate(prompt, max_tokens=12, ignore_eos=True, logprobs=True)[0]
        assert out.token_ids == alone.token_ids
        np.testing.assert_allclose(out.logprobs, alone.logprobs, atol=1e-4)


def test_more_requests_than_max_batch_run_in_waves(rng):
    llm = make_tiny(max_batch=2)
    prompts = random_prompts(rng, [3, 9, 1, 6, 4])
    params = SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.8, seed=11)
    batch = llm.generate(prompts, params)
    assert len(batch) == 5
    for prompt, out in zip(prompts, batch):
        assert out.prompt_token_ids == prompt
        assert out.token_ids == llm.generate(prompt, params)[0].token_ids


def test_text_prompts_are_tokenized(llm):
    texts = ["hello", "naïve café ☕"]
    outs = llm.generate(texts, max_tokens=4, ignore_eos=True)
    for text, out in zip(texts, outs):
        assert out.prompt == text
        assert out.prompt_token_ids == llm.tokenizer.encode(text)
        assert out.token_ids == llm.generate(out.prompt_token_ids, max_tokens=4,
                                             ignore_eos=True)[0].token_ids


def test_single_prompt_returns_a_list_of_one(llm):
    for prompt in ("hi there", [5, 6, 7], np.array([5, 6, 7])):
        outs = llm.generate(prompt, max_tokens=3, ignore_eos=True)
        assert isinstance(outs, list) and len(outs) == 1 and isinstance(outs[0], RequestOutput)


# ---- sampling ----------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible_and_seeds_differ(llm, rng):
    prompt = random_prompts(rng, [6])[0]

    def run(seed):
        return llm.generate(prompt, max_tokens=16, temperature=3.0, seed=seed,
                            ignore_eos=True)[0].token_ids

    first = run(123)
    assert run(123) == first
    others = [run(seed) for seed in (1, 2, 3)]
    assert any(o != first for o in others)
    greedy = llm.generate(prompt, max_tokens=16, ignore_eos=True)[0].token_ids
    assert first != greedy  # temperature 3 on O(1) logit gaps must leave the argmax path



def test_sampled_tokens_follow_the_seed_and_step_contract(llm, rng):
    """Token k of a request is drawn with uniform01(seed, k) from softmax(logits / T) (cpu/sampling.h:
    heaviest first, first token whose running weight exceeds u * total). Replaying that rule on
    forward() logits must give the same tokens, which pins the seed and step numbering."""
    prompt = random_prompts(rng, [5])[0]
    seed, temperature, n = int(rng.integers(0, 2**63)), 4.0, 12
    out = llm.generate(prompt, max_tokens=n, temperature=temperature, seed=seed,
                       ignore_eos=True)[0]
    logits = llm.forward(prompt)[-1]
    pos = len(prompt)
    for step, got in enumerate(out.token_ids):
        z = logits.astype(np.float64)
        weights = np.exp((z - z.max()) / temperature)
        order = np.lexsort((np.arange(len(z)), -weights))  # heaviest first, lower id on ties
        running = np.cumsum(weights[order])
        threshold = uniform01(seed, step) * running[-1]
        pick = int(np.searchsorted(running, threshold, side="right"))
        # Where the threshold lies within float32 rounding of a boundary, either neighbour is right.
        close = np.flatnonzero(np.abs(running - threshold) < 1e-5 * running[-1])
        allowed = {int(order[pick])} | {int(order[i]) for i in close} | {
            int(order[i + 1]) for i in close if i + 1 < len(order)}
        assert got in allowed, f"step {step}: got {got}, the rule says {order[pick]}"
        # Continue from the engine's token, so one borderline draw does not end the comparison.
        logits = llm.forward([got], start_pos=pos)[-1]
        pos += 1


def test_unseeded_sampling_draws_a_fresh_seed_per_request(llm):
    prompt = [9, 10, 11]
    runs = {tuple(llm.generate(prompt, max_tokens=16, temperature=3.0,
                               ignore_eos=True)[0].token_ids) for _ in range(3)}
    assert len(runs) > 1


def test_seeded_sampling_is_independent_of_batch_layout(llm, rng):
    prompts = random_prompts(rng, [4, 8, 2])
    params = SamplingParams(max_tokens=10, temperature=1.5, top_p=0.9, seed=77, ignore_eos=True)
    batch = llm.generate(prompts, params)
    for prompt, out in zip(prompts, batch):
        assert out.token_ids == llm.generate(prompt, params)[0].token_ids


@pytest.mark.parametrize("filters", [dict(top_k=1), dict(min_p=1.0), dict(top_p=1e-6)])
def test_filters_that_keep_only_the_top_token_give_greedy(llm, rng, filters):
    prompt = random_prompts(rng, [5])[0]
    greedy = llm.generate(prompt, max_tokens=12, ignore_eos=True)[0].token_ids
    sampled = llm.generate(prompt, max_tokens=12, ignore_eos=True, temperature=5.0, seed=3,
                           **filters)[0].token_ids
    assert sampled == greedy


def repeats_of_seen(prompt, generated):
    """How many generated tokens repeat a token of the prompt or an earlier generated one."""
    seen, repeats = set(prompt), 0
    for token in generated:
        repeats += token in seen
        seen.add(token)
    return repeats


def test_strong_repetition_penalty_forbids_repeats(llm, rng):
    # Greedy decoding of a tiny random model falls into a loop for most prompts (~97%); take the
    # first random prompt whose plain run repeats, so the penalty has something to forbid.
    for _ in range(20):
        prompt = random_prompts(rng, [6])[0]
        plain = llm.generate(prompt, max_tokens=24, ignore_eos=True)[0].token_ids
        if repeats_of_seen(prompt, plain) > 0:
            break
    assert repeats_of_seen(prompt, plain) > 0, "no plain greedy run of 20 random prompts repeats"
    penalized = llm.generate(prompt, max_tokens=24, ignore_eos=True,
                             repetition_penalty=1e4)[0].token_ids
    # The penalty covers the prompt too, so no generated token repeats anything seen before it
    # (the random prompt itself may hold a repeat; that is not the sampler's doing).
    assert repeats_of_seen(prompt, penalized) == 0


# ---- logprobs ----------------------------------------------------------------------------------

def test_logprobs_equal_log_softmax_of_forward_logits(llm, rng):
    prompt = random_prompts(rng, [9])[0]
    out = llm.generate(prompt, max_tokens=10, ignore_eos=True, logprobs=True)[0]
    logits = logits_along(llm, prompt, out.token_ids)
    assert_greedy(out.token_ids, logits)
    expected = [log_softmax(row)[token] for row, token in zip(logits, out.token_ids)]
    np.testing.assert_allclose(out.logprobs, expected, atol=1e-4)


def test_sampled_logprobs_are_finite_and_not_positive(llm):
    outs = llm.generate([[4, 5], [6]], max_tokens=8, ignore_eos=True, temperature=2.0, seed=5,
                        logprobs=True)
    for out in outs:
        assert len(out.logprobs) == len(out.token_ids) == 8
        assert all(math.isfinite(lp) and lp <= 0 for lp in out.logprobs)


def test_logprobs_absent_unless_asked(llm):
    assert llm.generate([4, 5], max_tokens=2)[0].logprobs is None


# ---- stopping ----------------------------------------------------------------------------------

def long_text_run(llm, rng):
    """A greedy run whose text is long enough to cut stop strings out of."""
    for _ in range(20):
        prompt = random_prompts(rng, [4])[0]
        out = llm.generate(prompt, max_tokens=40, ignore_eos=True)[0]
        if len(out.text) >= 12 and len(set(out.token_ids)) >= 6:
            return prompt, out
    pytest.fail("no greedy run produced 12 characters of text; the tiny model is degenerate")


def test_max_tokens_ends_with_length(llm):
    out = llm.generate([7, 8, 9], max_tokens=5, ignore_eos=True)[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.timings["generated_tokens"] == 5


def test_stop_string_truncates_text(llm, rng):
    prompt, full = long_text_run(llm, rng)
    for start, length in ((4, 2), (7, 1), (0, 3)):
        stop = full.text[start:start + length]
        cut = full.text.find(stop)
        out = llm.generate(prompt, max_tokens=40, ignore_eos=True, stop=["\x00never", stop])[0]
        assert out.finish_reason == "stop"
        assert out.text == full.text[:cut]
        assert full.token_ids[:len(out.token_ids)] == out.token_ids


def test_stop_token_ids_end_generation_and_keep_the_id(llm, rng):
    prompt, full = long_text_run(llm, rng)
    stop_id = full.token_ids[5]
    first = full.token_ids.index(stop_id)
    out = llm.generate(prompt, max_tokens=40, ignore_eos=True, stop_token_ids=[stop_id])[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full.token_ids[:first + 1]
    assert out.text == llm.tokenizer.decode(full.token_ids[:first])


def test_eos_stops_unless_ignored(rng):
    llm = make_tiny()
    prompt, full = long_text_run(llm, rng)
    eos = full.token_ids[3]
    first = full.token_ids.index(eos)
    llm.eos_token_ids = (eos,)
    out = llm.generate(prompt, max_tokens=40)[0]
    assert out.finish_reason == "stop" and out.token_ids == full.token_ids[:first + 1]
    ignored = llm.generate(prompt, max_tokens=40, ignore_eos=True)[0]
    assert ignored.token_ids == full.token_ids and ignored.finish_reason == "length"


def test_context_limit_ends_with_length_not_an_error(rng):
    llm = make_tiny(max_seq_len=24)
    for prompt_len in (1, 20, 23):
        prompt = random_prompts(rng, [prompt_len])[0]
        out = llm.generate(prompt, max_tokens=100, ignore_eos=True)[0]
        assert out.finish_reason == "length"
        assert len(prompt) + len(out.token_ids) == 24
    # a batch in which one request hits the context and the other its max_tokens
    outs = llm.generate([[5] * 22, [6] * 3], max_tokens=5, ignore_eos=True)
    assert [len(o.token_ids) for o in outs] == [2, 5]


# ---- streaming ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(max_tokens=30, ignore_eos=True),
    dict(max_tokens=30, ignore_eos=True, temperature=1.0, seed=9),
])
def test_stream_pieces_concatenate_to_generate_text(llm, kwargs):
    prompt = "stream me"
    pieces = list(llm.stream(prompt, **kwargs))
    out = llm.generate(prompt, **kwargs)[0]
    assert "".join(pieces) == out.text
    assert llm.last_output.text == out.text and llm.last_output.token_ids == out.token_ids


def test_stream_never_shows_a_stop_string(llm, rng):
    prompt, full = long_text_run(llm, rng)
    stop = full.text[6:9]
    pieces = list(llm.stream(prompt, max_tokens=40, ignore_eos=True, stop=stop))
    text = "".join(pieces)
    assert text == full.text[:full.text.find(stop)]
    assert llm.last_output.finish_reason == "stop"


def test_stream_keeps_multibyte_characters_whole():
    tokenizer = RandomModelTokenizer(300)
    decoder = tokenizer.stream_decoder()
    text = "añ€😀z"
    pieces = [decoder.push(i) for i in tokenizer.encode(text, add_bos=False)] + [decoder.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_an_unfinished_stream_blocks_other_generations_until_closed(llm):
    stream = llm.stream([5, 6, 7], max_tokens=50, ignore_eos=True)
    next(stream)
    with pytest.raises(RuntimeError, match="already generating"):
        llm.generate([5], max_tokens=2)
    stream.close()
    assert len(llm.generate([5], max_tokens=2, ignore_eos=True)[0].token_ids) == 2


# ---- chat, timings, repr -----------------------------------------------------------------------

def test_chat_uses_the_template(llm):
    messages = [{"role": "user", "content": "hi"}]
    out = llm.chat(messages, max_tokens=6, ignore_eos=True)
    assert out.prompt == llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt)
    assert "".join(llm.chat_stream(messages, max_tokens=6, ignore_eos=True)) == out.text


def test_timings_are_complete_and_consistent(llm):
    out = llm.generate([[3, 4, 5, 6], [7]], max_tokens=6, ignore_eos=True)
    for o in out:
        t = o.timings
        assert set(t) == TIMING_KEYS
        assert t["prompt_tokens"] == len(o.prompt_token_ids)
        assert t["generated_tokens"] == len(o.token_ids) == 6
        assert 0 < t["prefill_s"] <= t["ttft_s"] <= t["total_s"]
        assert t["decode_s"] > 0
        assert t["total_s"] == pytest.approx(t["ttft_s"] + t["decode_s"])
        assert t["decode_tok_s"] == pytest.approx(5 / t["decode_s"])


def test_repr_names_the_essentials(llm):
    text = repr(llm)
    for part in ("layers=2", "dim=48", "vocab=300", "device='cpu'", "dtype='f32'"):
        assert part in text


def test_random_shape_names_and_small_vocab_without_tokenizer():
    llm = Llama.random(ModelConfig(**dict(TINY, vocab_size=64)), device="cpu", max_seq_len=32,
                       n_threads=1)
    assert llm.tokenizer is None
    out = llm.generate([1, 2, 3], max_tokens=4, ignore_eos=True)[0]
    assert len(out.token_ids) == 4 and out.text == ""
    with pytest.raises(ValueError, match="token ids"):
        llm.generate("text", max_tokens=4)


def test_close_frees_the_engine_and_refuses_further_work():
    from llama_brrr import Llama
    from llama_brrr.config import ModelConfig

    config = ModelConfig(dim=64, hidden_dim=96, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=300,
                         max_seq_len=32)
    with Llama.random(config, device="cpu", max_batch=1) as llm:
        assert len(llm.generate([1, 2, 3], max_tokens=2, ignore_eos=True)[0].token_ids) == 2
    assert llm.engine is None
    with pytest.raises(RuntimeError, match="was closed"):
        llm.generate([1, 2, 3], max_tokens=2)
    with pytest.raises(RuntimeError, match="was closed"):
        list(llm.stream([1, 2, 3], max_tokens=2))
    llm.close()  # twice is fine
