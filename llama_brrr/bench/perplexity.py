"""Perplexity of a model over a fixed text, for llama_brrr and for llama.cpp on the same token ids.

The convention is llama.cpp's `perplexity` tool's: the token ids are cut into consecutive,
non-overlapping windows of `window` tokens (a tail shorter than a window is dropped); each window
runs from an empty KV cache; when the model's tokenizer adds a BOS, each window's first token is
replaced by BOS (as llama.cpp does). Only the second half of a window is scored, so every scored
token sees at least window/2 tokens of context: with first = window // 2, the logits at positions
first .. window-2 predict the tokens at first+1 .. window-1, window - 1 - first tokens per window.

    nll(t) = logsumexp(logits[t]) - logits[t][id[t+1]]      (float64)
    ppl    = exp(sum of nll over every scored token / number of scored tokens)

Both sides get the very same ids (ours, from our tokenizer), so tokenization never enters the
comparison: llama.cpp is driven through llama-cpp-python with logits_all=True.

The fixed text (tests/data/kjv-ruth-jonah.txt, public domain, provenance in tests/data/README.md)
is about 4,950 tokens for SmolLM2: nine 512-token windows, 2,295 scored tokens.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

import numpy as np

DEFAULT_WINDOW = 512
TEXT_PATH = Path(__file__).resolve().parents[2] / "tests" / "data" / "kjv-ruth-jonah.txt"
CONVENTION = ("llama.cpp perplexity: non-overlapping windows from an empty cache, first token "
              "BOS when the tokenizer adds one, the second half of each window scored "
              "(logits at window//2 .. window-2 predict the next token), float64 log-softmax")


def fixed_text() -> str:
    """The committed text the perplexity figures are measured on."""
    if not TEXT_PATH.is_file():
        raise FileNotFoundError(f"the perplexity text {TEXT_PATH} is missing: it ships in the "
                                f"repository's tests/data/ (run from a source checkout)")
    return TEXT_PATH.read_text(encoding="utf-8")


def window_nll(logits: np.ndarray, ids: list[int] | np.ndarray) -> np.ndarray:
    """Negative log-likelihood (float64) of each scored token of one window, given the window's
    logits [window, vocab] for every position."""
    n = len(ids)
    first = n // 2
    scored = np.asarray(logits[first:n - 1], dtype=np.float64)
    targets = np.asarray(ids[first + 1:n], dtype=np.int64)
    peak = scored.max(axis=1, keepdims=True)
    logsumexp = peak[:, 0] + np.log(np.exp(scored - peak).sum(axis=1))
    return logsumexp - scored[np.arange(len(targets)), targets]


def perplexity(logits_of: Callable[[list[int]], np.ndarray], ids: list[int], window: int = DEFAULT_WINDOW,
               bos_id: int | None = None) -> dict:
    """Perplexity of the model behind `logits_of` (ids of one window -> logits [len, vocab] for
    every position, from an empty cache) over `ids`, in the module's convention.

    Returns {"ppl", "n_tokens" (scored), "n_windows", "window", "nll_per_window" (mean nll of each
    window's scored tokens), "nll_sum_per_window", "convention"}.
    """
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 4:
        raise ValueError(f"window must be an integer >= 4, got {window!r}")
    ids = [int(t) for t in ids]
    n_windows = len(ids) // window
    if n_windows < 1:
        raise ValueError(f"perplexity needs at least one full window of {window} tokens, got "
                         f"{len(ids)} tokens: pass a longer text or a smaller window")
    sums, means, count = [], [], 0
    for w in range(n_windows):
        chunk = ids[w * window:(w + 1) * window]
        if bos_id is not None:
            chunk[0] = int(bos_id)
        logits = np.asarray(logits_of(chunk))
        if logits.ndim != 2 or logits.shape[0] != window:
            raise ValueError(f"logits_of returned shape {logits.shape} for a window of {window} "
                             f"tokens; it must return [window, vocab] (logits of every position)")
        nll = window_nll(logits, chunk)
        if not np.isfinite(nll).all():
            raise ValueError(f"window {w}: non-finite log-likelihood (the logits hold NaN or inf)")
        sums.append(float(nll.sum()))
        means.append(float(nll.mean()))
        count += len(nll)
    return {"ppl": float(np.exp(sum(sums) / count)), "n_tokens": count, "n_windows": n_windows,
            "window": window, "nll_per_window": means, "nll_sum_per_window": sums,
            "convention": CONVENTION}


def text_ids(tokenizer, text: str | None = None) -> list[int]:
    """The text's ids as our tokenizer encodes them (BOS only where its files say so)."""
    return list(tokenizer.encode(fixed_text() if text is None else text))


def bos_for(tokenizer) -> int | None:
    """The id each window starts with, llama.cpp's way: BOS when the tokenizer adds one."""
    return tokenizer.bos_id if tokenizer.add_bos else None


# ---- the two sides ----------------------------------------------------------------------------

def load_llama_brrr(path: str, quant: str | None = None, window: int = DEFAULT_WINDOW, threads: int = 0):
    """A CPU Llama for `path` with room for one window. `quant` (None = the file's tensors as
    stored, "none" = everything dequantized) is passed only to an engine that takes it."""
    from llama_brrr import Llama

    kwargs = {}
    if "quant" in inspect.signature(Llama.from_pretrained).parameters:
        kwargs["quant"] = quant
    elif quant not in (None, "none"):
        raise ValueError(f"this llama_brrr has no quant= argument (asked for quant={quant!r})")
    return Llama.from_pretrained(path, device="cpu", max_seq_len=window, max_batch=1,
                                 n_threads=threads, progress=False, **kwargs)


def llama_brrr_perplexity(llm, ids: list[int], window: int = DEFAULT_WINDOW) -> dict:
    """Perplexity of a llama_brrr Llama (Llama.forward, all positions, slot 0 from position 0)."""
    return perplexity(lambda chunk: llm.forward(chunk), ids, window, bos_for(llm.tokenizer))


class LlamaCppScorer:
    """llama.cpp with logits_all=True: the logits of every position of a window, from an empty cache."""

    def __init__(self, model_path: str, window: int = DEFAULT_WINDOW, threads: int = 2):
        import llama_cpp

        from .llamacpp import extra_buffer_types_note, open_llama

        self.llm = open_llama(model_path, n_ctx=window, n_batch=window, n_ubatch=window,
                              n_threads=threads, n_threads_batch=threads, n_gpu_layers=0,
                              logits_all=True, verbose=False)
        self.version = llama_cpp.__version__
        self.extra_buffer_types = extra_buffer_types_note()

    def __call__(self, chunk: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(list(chunk))
        return np.array(self.llm.scores[:len(chunk)], dtype=np.float32)


def llama_cpp_perplexity(model_path: str, ids: list[int], bos_id: int | None,
                         window: int = DEFAULT_WINDOW, threads: int = 2) -> dict:
    """The same perplexity computed from llama.cpp's logits on the same ids."""
    scorer = LlamaCppScorer(model_path, window, threads)
    result = perplexity(scorer, ids, window, bos_id)
    result["llama_cpp_python"] = scorer.version
    result["extra_buffer_types"] = scorer.extra_buffer_types
    return result
