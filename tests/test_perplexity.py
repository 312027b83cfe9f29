"""Perplexity (llama_brrr.bench.perplexity): the function against a float64 computation of its own
on a tiny random model (no llama.cpp needed), and on the real default model the quantized path
against the dequantized one and against llama.cpp on the same ids (docs/design.md: within 1%).
The real-model tests skip when the default model or llama-cpp-python is absent."""

import importlib.util
import inspect

import numpy as np
import pytest

from llama_brrr import Llama, fetch
from llama_brrr.bench import perplexity as P
from llama_brrr.config import ModelConfig

MODEL_PATH = fetch.local_default_model()
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
PPL_TOLERANCE = 0.01  # docs/design.md: within 1% of the dequantized path and of llama.cpp


def brute_force_ppl(llm, ids, window, bos):
    """Perplexity the long way: every window through Llama.forward, every scored token's
    probability from a float64 softmax of the whole row."""
    total, count, per_window = 0.0, 0, []
    for w in range(len(ids) // window):
        chunk = list(ids[w * window:(w + 1) * window])
        if bos is not None:
            chunk[0] = bos
        logits = llm.forward(chunk).astype(np.float64)
        nll = []
        for t in range(window // 2, window - 1):
            p = np.exp(logits[t] - logits[t].max())
            p /= p.sum()
            nll.append(-np.log(p[chunk[t + 1]]))
        per_window.append(np.mean(nll))
        total += np.sum(nll)
        count += len(nll)
    return np.exp(total / count), count, per_window


@pytest.mark.parametrize("window,bos", [(16, None), (11, 7)])
def test_perplexity_matches_a_float64_computation(C, rng, window, bos):
    config = ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
                         name="tiny")
    llm = Llama.random(config, seed=int(rng.integers(1 << 30)), device="cpu", max_seq_len=window,
                       max_batch=1, n_threads=2)
    n = int(rng.integers(3 * window, 4 * window))  # a tail shorter than a window is dropped
    ids = rng.integers(0, config.vocab_size, size=n).tolist()
    got = P.perplexity(llm.forward, ids, window, bos)
    want, count, per_window = brute_force_ppl(llm, ids, window, bos)
    assert got["n_windows"] == n // window and got["n_tokens"] == count == (n // window) * (window - 1 - window // 2)
    assert got["ppl"] == pytest.approx(want, rel=1e-9)
    assert got["nll_per_window"] == pytest.approx(per_window, rel=1e-9)
    # Random weights: close to uniform over the vocabulary, far from a degenerate 1.
    assert 30 < got["ppl"] < 10 * config.vocab_size


def test_perplexity_rejects_what_it_cannot_score():
    def flat(chunk):
        return np.zeros((len(chunk), 10), np.float32)

    with pytest.raises(ValueError, match="at least one full window of 8 tokens, got 5"):
        P.perplexity(flat, [1, 2, 3, 4, 5], 8)
    with pytest.raises(ValueError, match="window must be an integer >= 4"):
        P.perplexity(flat, list(range(10)), 2)
    with pytest.raises(ValueError, match=r"must return \[window, vocab\]"):
        P.perplexity(lambda chunk: np.zeros((1, 10)), list(range(8)), 8)

    def nan(chunk):
        out = np.zeros((len(chunk), 10), np.float32)
        out[-2, 3] = np.nan
        return out

    with pytest.raises(ValueError, match="non-finite"):
        P.perplexity(nan, list(range(8)), 8)
    # Uniform logits over 10 classes: perplexity exactly 10.
    assert P.perplexity(flat, [1] * 16, 8)["ppl"] == pytest.approx(10.0, rel=1e-12)


def test_the_fixed_text_is_a_few_thousand_words():
    text = P.fixed_text()
    assert 3000 < len(text.split()) < 6000 and text.startswith("The Book of Ruth")


# ---- the real default model ------------------------------------------------------------------------

real_model = [pytest.mark.slow, pytest.mark.skipif(MODEL_PATH is None, reason=(
    f"default model not found at {fetch.default_model_path()}: run `python weights/fetch.py` "
    f"or set {fetch.DEFAULT_MODEL_ENV} to the .gguf"))]
needs_llama_cpp = pytest.mark.skipif(not HAS_LLAMA_CPP, reason=(
    'llama-cpp-python is not installed (CMAKE_ARGS="-DGGML_CUDA=OFF" pip install llama-cpp-python==0.3.36)'))
needs_quant = pytest.mark.skipif("quant" not in inspect.signature(Llama.from_pretrained).parameters,
                                 reason="this engine has no quant= argument: every path is the dequantized one")
FILES = ["Q4_1", "Q8_0", "Q4_K_M"]


@pytest.fixture(scope="module")
def text_ids():
    llm = P.load_llama_brrr(str(MODEL_PATH), threads=2)
    return P.text_ids(llm.tokenizer), P.bos_for(llm.tokenizer)


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """The default Q4_1 file and its Q8_0 / Q4_K_M requantizations by llama.cpp's quantize
    (seconds each), made into a temporary folder."""
    from llama_brrr.bench.llamacpp import reference_gguf

    folder = tmp_path_factory.mktemp("twins")
    sha = fetch.sha256_of(MODEL_PATH)
    return {"Q4_1": MODEL_PATH, **{t: reference_gguf(MODEL_PATH, sha, t, folder, 2) for t in FILES[1:]}}


@pytest.fixture(scope="module")
def ours_ppl(text_ids, model_files):
    """llama_brrr's perplexity per file on its default (quantized) path, computed once."""
    ids, _ = text_ids
    return {name: P.llama_brrr_perplexity(P.load_llama_brrr(str(path), quant=None, threads=2), ids)
            for name, path in model_files.items()}


@pytest.mark.parametrize("name", FILES)
@needs_llama_cpp
@real_model[1]
@real_model[0]
def test_perplexity_matches_llama_cpp(name, text_ids, model_files, ours_ppl):
    ids, bos = text_ids
    ours = ours_ppl[name]
    theirs = P.llama_cpp_perplexity(str(model_files[name]), ids, bos, threads=2)
    assert ours["n_tokens"] == theirs["n_tokens"] >= 2000
    assert abs(ours["ppl"] / theirs["ppl"] - 1) < PPL_TOLERANCE, (name, ours["ppl"], theirs["ppl"])
    # A small model on a short text: a perplexity of tens, not a broken model's thousands.
    assert 5 < ours["ppl"] < 60


@pytest.mark.parametrize("name", FILES)
@needs_quant
@needs_llama_cpp  # the twins are made by llama.cpp's quantize
@real_model[1]
@real_model[0]
def test_quantized_path_matches_dequantized(name, text_ids, model_files, ours_ppl):
    ids, _ = text_ids
    dequantized = P.llama_brrr_perplexity(
        P.load_llama_brrr(str(model_files[name]), quant="none", threads=2), ids)
    ours = ours_ppl[name]
    assert abs(ours["ppl"] / dequantized["ppl"] - 1) < PPL_TOLERANCE, (name, ours["ppl"], dequantized["ppl"])
