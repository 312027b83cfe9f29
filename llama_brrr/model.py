"""Llama: the user-facing model. It owns one engine handle (`_C.Engine`) and drives it from Python.

The engine does all the math (forward passes and sampling); this file loads weights into it,
tokenizes, and runs the generation loop:

    prefill prompt[:-1] of each request into its own KV slot (no logits)
    repeat: engine.decode_steps over every active sequence runs n rounds of decode + sample (the
            first round feeds each prompt's last token, later rounds the token just sampled),
            then the stop conditions are checked token by token per request
On CUDA the rounds of one decode_steps call stay on the device (no host round trip per token);
n is 1 for the first token (time to first token) and up to DECODE_CHUNK after, never past a
request's max_tokens or the context. Tokens sampled after a request stopped are dropped.

Requests beyond max_batch run in waves of max_batch. Every argument is checked before the engine
sees it, so a bad request raises a ValueError and leaves the instance usable.
"""

from __future__ import annotations

import codecs
import contextlib
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from . import _C, profiler
from . import quant as quantization
from .config import ModelConfig, shape_config
from .errors import ArgumentTypeError, NonFiniteLogitsError
from .sampling import SamplingParams, _has_surrogate, engine_rows

_DTYPE_ALIASES = {
    "f32": "f32", "float32": "f32", "fp32": "f32",
    "bf16": "bf16", "bfloat16": "bf16",
    "f16": "f16", "float16": "f16", "fp16": "f16", "half": "f16",
}
_DEFAULT_CONTEXT_CAP = 4096
_DEFAULT_MAX_BATCH = {"cpu": 8, "cuda": 64}
_RANDOM_INIT_STD = 0.02
_INT32_MAX = 2**31 - 1
_MAX_THREADS = 4096  # beyond any machine; keeps a typo from reaching the engine as a thread count
_BUSY_MESSAGE = ("this Llama is already generating (an unfinished stream?); finish or close that "
                 "generator first: one instance runs one generation at a time")


@dataclass
class RequestOutput:
    """The result of one request.

    text excludes the prompt, end-of-sequence/stop tokens and any stop string; token_ids are the
    generated ids (including a final EOS or stop token id, as vLLM does). finish_reason is "stop"
    (EOS, stop token or stop string) or "length" (max_tokens or the context limit).

    timings (seconds; rates in tokens/s):
      prompt_tokens, generated_tokens
      ttft_s     from the generate() call to this request's first token
      prefill_s  processing the prompt(s) of this request's wave, up to their first tokens
      decode_s   from the first token to the last (generated_tokens - 1 decode steps)
      total_s    from the generate() call to the end of this request
      prefill_tok_s = prompt_tokens / prefill_s
      decode_tok_s  = (generated_tokens - 1) / decode_s, the steady-state decode rate
    """

    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[float] | None = None
    timings: dict = field(default_factory=dict)


class RandomModelTokenizer:
    """A byte-level tokenizer for random-weight models, so benchmarks and tests can take text prompts.

    ids 0, 1, 2 are <unk>, <s> (BOS) and </s> (EOS); id 3 + b is the byte b (ids 3..258). Ids above
    258 exist in the model's vocabulary but decode to nothing. Needs vocab_size >= 259.
    """

    N_SPECIAL = 3
    BOS_ID = 1
    EOS_ID = 2

    def __init__(self, vocab_size: int):
        if vocab_size < self.N_SPECIAL + 256:
            raise ValueError(f"RandomModelTokenizer needs vocab_size >= {self.N_SPECIAL + 256}, "
                             f"got {vocab_size}")
        self.vocab_size = vocab_size
        self.bos_id = self.BOS_ID
        self.eos_ids = (self.EOS_ID,)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = [self.N_SPECIAL + b for b in text.encode("utf-8")]
        return [self.BOS_ID] + ids if add_bos or add_bos is None else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        names = {0: "<unk>", self.BOS_ID: "<s>", self.EOS_ID: "</s>"}
        parts, pending = [], bytearray()
        for i in ids:
            if self.N_SPECIAL <= i < self.N_SPECIAL + 256:
                pending.append(i - self.N_SPECIAL)
            elif i in names and not skip_special_tokens:
                parts.append(pending.decode("utf-8", errors="replace"))
                parts.append(names[i])
                pending.clear()
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def stream_decoder(self) -> "_ByteStreamDecoder":
        return _ByteStreamDecoder(self.N_SPECIAL)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """A plain "role: content" transcript; random weights make no use of a real template."""
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + "assistant: " if add_generation_prompt else text


class _ByteStreamDecoder:
    """Incremental decoder for RandomModelTokenizer: never emits half of a UTF-8 character."""

    def __init__(self, n_special: int):
        self._n_special = n_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._n_special <= token_id < self._n_special + 256:
            return self._utf8.decode(bytes([token_id - self._n_special]))
        return ""

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class Llama:
    """A Llama-family model on one device, ready to generate.

    Build one with Llama.from_pretrained(path) (a GGUF / safetensors / llama2.c file, or None for
    the default model) or Llama.random(shape) (random weights, for benchmarks and tests).
    """

    def __init__(self, engine, config: ModelConfig, tokenizer, *, device: str, dtype: str,
                 max_seq_len: int, max_batch: int, eos_token_ids: Sequence[int] = (),
                 source: str = "", weight_types: dict | None = None):
        self._engine = engine
        self.config = config
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        # Matrix name -> block type ("q4_1") of the matrices stored quantized; the rest are `dtype`.
        self.weight_types = dict(weight_types or {})
        self._weights_summary = None
        self.max_seq_len = max_seq_len
        self.max_batch = max_batch
        self.source = source
        eos = set(int(i) for i in eos_token_ids)
        if tokenizer is not None:
            eos.update(int(i) for i in tokenizer.eos_ids)
        self.eos_token_ids = tuple(sorted(eos))
        # The RequestOutput of the most recent finished stream()/chat_stream()/generate() request,
        # so a caller that consumed a stream can still read its token ids and timings.
        self.last_output: RequestOutput | None = None
        self._busy = False

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | None = None, device: str = "auto", dtype: str | None = None,
                        max_seq_len: int | None = None, max_batch: int | None = None,
                        n_threads: int = 0, progress: bool = True,
                        quant: str | None = None) -> "Llama":
        """Loads a model onto `device`.

        path: a model file or directory, None / "default" for the default model (fetched when
        missing; $LLAMA_BRRR_DEFAULT_MODEL overrides it), or "hf:org/name" (see fetch.resolve_model).

        dtype: "f32", "bf16" or "f16" (default bf16 on cuda, f32 on cpu): what every tensor not
        stored quantized runs in.
        quant: None ("auto": quantized GGUF tensors stay as stored on the CPU), "none" (everything
        dequantized to dtype), a block format ("q8_0", "q4_k", ...) or a recipe ("q4_k_m") to
        quantize at load; see llama_brrr.quant.
        max_seq_len: KV-cache length per sequence (default min(model context, 4096)).
        max_batch: sequences decoded together (default 8 on cpu, 64 on cuda).
        """
        from . import fetch
        from .loaders import load_model
        from .tokenizer import load_tokenizer

        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"path must be a str, an os.PathLike or None, got {path!r}")
        if not isinstance(progress, (bool, np.bool_)):
            raise ArgumentTypeError(f"progress must be True or False, got {progress!r}")
        n_threads = _parse_threads(n_threads)
        backend, device_index = _parse_device(device)
        engine_dtype = _parse_dtype(dtype, backend)
        quant = quantization.parse_quant(quant)
        resolved = fetch.resolve_model(path, progress=progress)
        loaded = load_model(str(resolved), progress=_LoadProgress("loading") if progress else None)
        config = loaded.config
        max_seq_len = _parse_max_seq_len(max_seq_len, config)
        max_batch = _parse_max_batch(max_batch, backend)
        file_types = {name: loaded.tensors.file_type(name) for name in config.tensor_shapes()}
        plan = quantization.plan(config, quant, file_types, backend)
        engine = _C.Engine(backend, config.engine_dict(max_seq_len, max_batch), engine_dtype,
                           device_index, n_threads, plan.type_ids())
        _set_weights(engine, loaded.tensors, config, plan, progress, str(resolved))
        tokenizer = load_tokenizer(loaded.tokenizer_spec)
        return cls(engine, config, tokenizer, device=_device_name(backend, device_index),
                   dtype=engine_dtype, max_seq_len=max_seq_len, max_batch=max_batch,
                   eos_token_ids=loaded.eos_token_ids or (), source=str(resolved),
                   weight_types=plan.types)

    @classmethod
    def random(cls, shape_name_or_config: str | ModelConfig, seed: int = 0, device: str = "auto",
               dtype: str | None = None, max_seq_len: int | None = None,
               max_batch: int | None = None, n_threads: int = 0,
               quant: str | None = None) -> "Llama":
        """A model with random weights (N(0, 0.02); norms 1 + N(0, 0.02)), drawn by the engine.

        quant: a block format or recipe ("q4_k_m", "q8_0", ...) stores the matrices quantized: each
        holds exactly the quantization of the float weights the same seed draws.

        shape_name_or_config: a name from config.SHAPES (e.g. "llama3.2-1b") or a ModelConfig.
        Its tokenizer is RandomModelTokenizer (byte-level) when vocab_size >= 259; with a smaller
        vocabulary there is none and prompts must be token-id lists.
        """
        if isinstance(shape_name_or_config, ModelConfig):
            config = shape_name_or_config
        elif isinstance(shape_name_or_config, str):
            config = shape_config(shape_name_or_config)
        else:
            raise ArgumentTypeError(f"shape_name_or_config must be a shape name or a ModelConfig, "
                                    f"got {type(shape_name_or_config).__name__}")
        seed = _check_int("seed", seed)
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        n_threads = _parse_threads(n_threads)
        backend, device_index = _parse_device(device)
        engine_dtype = _parse_dtype(dtype, backend)
        plan = quantization.plan(config, quant, None, backend)
        max_seq_len = _parse_max_seq_len(max_seq_len, config)
        max_batch = _parse_max_batch(max_batch, backend)
        engine = _C.Engine(backend, config.engine_dict(max_seq_len, max_batch), engine_dtype,
                           device_index, n_threads, plan.type_ids())
        engine.init_random(seed, _RANDOM_INIT_STD)
        tokenizer = (RandomModelTokenizer(config.vocab_size)
                     if config.vocab_size >= RandomModelTokenizer.N_SPECIAL + 256 else None)
        return cls(engine, config, tokenizer, device=_device_name(backend, device_index),
                   dtype=engine_dtype, max_seq_len=max_seq_len, max_batch=max_batch,
                   source=f"random:{config.name}", weight_types=plan.types)

    @property
    def engine(self):
        """The underlying _C.Engine (for tests and tools; generation goes through this class)."""
        return self._engine

    @property
    def weights_summary(self) -> str:
        """Each tensor family's storage type and the weights' bytes, e.g.
        "wq wk wo w1 w3 q4_1, tok_embeddings q8_0, norms f32; 97.9 MB"."""
        if self._weights_summary is None:
            self._weights_summary = quantization.describe(self.config, self.weight_types, self.dtype)
        return self._weights_summary

    def __repr__(self) -> str:
        c = self.config
        return (f"Llama(source={self.source!r}, layers={c.n_layers}, dim={c.dim}, "
                f"heads={c.n_heads}/{c.n_kv_heads}, vocab={c.vocab_size}, "
                f"params={c.n_params() / 1e6:.1f}M, device={self.device!r}, dtype={self.dtype!r}, "
                f"weights={self.weights_summary!r}, max_seq_len={self.max_seq_len}, "
                f"max_batch={self.max_batch})")

    # ---- public API ---------------------------------------------------------------------------

    def generate(self, prompts, sampling_params: SamplingParams | None = None,
                 **kwargs) -> list[RequestOutput]:
        """Generates for one or many prompts, batched; returns one RequestOutput per prompt, in order.

        prompts: a str, a list of str, a list of token ids, or a list of token-id lists. A single
        prompt (str or one id list) still returns a list of one, as vLLM does.
        kwargs: SamplingParams fields (instead of sampling_params, not together with it).
        A prompt that is empty, or has as many tokens as the context (max_seq_len) or more, or
        holds an id outside the vocabulary, raises ValueError before anything runs.
        """
        params = SamplingParams.from_kwargs(sampling_params, kwargs)
        t_tokenize = profiler.mark()
        requests = [self._make_request(text, ids, params) for text, ids in self._prompts(prompts)]
        for index, r in enumerate(requests):
            r.index = index
        profiler.record_span("tokenize", None, t_tokenize)
        with self._exclusive():
            for _ in self._run(requests):
                pass
        outputs = [r.output() for r in requests]
        self.last_output = outputs[-1]
        return outputs

    def stream(self, prompt, sampling_params: SamplingParams | None = None,
               **kwargs) -> Iterator[str]:
        """Yields the generated text of one prompt (a str or a token-id list) piece by piece.

        Pieces never split a UTF-8 character and never show text that may turn out to be the
        start of a stop string. When the generator is exhausted, self.last_output holds the
        RequestOutput (token ids, finish reason, timings).
        """
        params = SamplingParams.from_kwargs(sampling_params, kwargs)
        prompts = self._prompts(prompt)
        if len(prompts) != 1:
            raise ValueError(f"stream() takes one prompt, got {len(prompts)}")
        request = self._make_request(*prompts[0], params)
        return self._stream_request(request)

    def chat(self, messages: list[dict], sampling_params: SamplingParams | None = None,
             **kwargs) -> RequestOutput:
        """Answers a conversation ([{"role": ..., "content": ...}, ...]) through the chat template."""
        params = SamplingParams.from_kwargs(sampling_params, kwargs)
        request = self._make_request(*self._chat_prompt(messages), params)
        with self._exclusive():
            for _ in self._run([request]):
                pass
        self.last_output = request.output()
        return self.last_output

    def chat_stream(self, messages: list[dict], sampling_params: SamplingParams | None = None,
                    **kwargs) -> Iterator[str]:
        """chat() as a stream of text pieces (see stream())."""
        params = SamplingParams.from_kwargs(sampling_params, kwargs)
        return self._stream_request(self._make_request(*self._chat_prompt(messages), params))

    def forward(self, token_ids, start_pos: int = 0, slot: int = 0) -> np.ndarray:
        """Logits [T, vocab] (float32) for every position of token_ids placed at start_pos.. in `slot`.

        The tokens are written into that slot's KV cache, so a later call with start_pos = T
        continues the same sequence.
        """
        if isinstance(token_ids, np.ndarray):
            token_ids = token_ids.tolist()
        if not isinstance(token_ids, (list, tuple)):
            raise ArgumentTypeError(f"token_ids must be a list of token ids, got {token_ids!r}")
        ids = self._check_ids(token_ids, "token_ids")
        if not ids:
            raise ValueError("forward: token_ids is empty")
        start_pos = _check_int("start_pos", start_pos)
        slot = _check_int("slot", slot)
        if not 0 <= slot < self.max_batch:
            raise ValueError(f"slot must be in [0, {self.max_batch}) (max_batch={self.max_batch}), "
                             f"got {slot}")
        if not 0 <= start_pos <= self.max_seq_len - len(ids):
            raise ValueError(f"forward: start_pos={start_pos} plus {len(ids)} tokens does not fit "
                             f"the context max_seq_len={self.max_seq_len}")
        with self._exclusive(), profiler.span("forward", "prefill", len(ids)):
            profiler.attach(self._engine, self.weights_summary)
            return self._engine.prefill(slot, np.asarray(ids, dtype=np.int32), start_pos, "all")

    # ---- requests -----------------------------------------------------------------------------

    def _prompts(self, prompts) -> list[tuple[str | None, list[int]]]:
        """Normalizes prompts to [(text or None, token ids)]."""
        if isinstance(prompts, np.ndarray):
            prompts = prompts.tolist()
        if isinstance(prompts, str):
            return [self._encode_prompt(prompts)]
        if not isinstance(prompts, (list, tuple)):
            raise ArgumentTypeError(f"prompts must be a str, a list of str, a list of token ids or a "
                                    f"list of token-id lists, got {type(prompts).__name__}")
        if not prompts:
            raise ValueError("prompt is empty: prompts is an empty list")
        if not any(isinstance(p, (str, list, tuple, np.ndarray)) for p in prompts):
            return [(None, self._check_ids(prompts, "prompt"))]
        out = []
        for i, p in enumerate(prompts):
            if isinstance(p, str):
                out.append(self._encode_prompt(p, i))
            elif isinstance(p, (list, tuple, np.ndarray)):
                out.append((None, self._check_ids(list(p), f"prompt {i}")))
            else:
                raise ArgumentTypeError(f"prompt {i} must be a str or a list of token ids, "
                                        f"got {type(p).__name__}")
        return out

    def _encode_prompt(self, text: str, index: int | None = None) -> tuple[str, list[int]]:
        name = "prompt" if index is None else f"prompt {index}"
        if not text:
            raise ValueError(f"{name} is empty: give at least one character of text")
        if _has_surrogate(text):
            raise ValueError(f"{name} is not valid Unicode text: it holds a lone surrogate at index "
                             f"{_first_surrogate(text)} (text decoded with errors='surrogateescape'?)")
        if self.tokenizer is None:
            raise ValueError(f"this model has no tokenizer (random weights with vocab_size="
                             f"{self.config.vocab_size} < 259): pass {name} as a list of token ids")
        ids = list(self.tokenizer.encode(text))
        if not ids:
            raise ValueError(f"{name} is empty: {text!r} encodes to no tokens")
        return text, ids

    def _check_ids(self, ids, name: str) -> list[int]:
        vocab = self.config.vocab_size
        out = []
        for j, t in enumerate(ids):
            if not _is_int(t):
                raise ArgumentTypeError(f"{name}: token ids must be integers, got {t!r} at index {j}")
            t = int(t)
            if not 0 <= t < vocab:
                raise ValueError(f"{name}: token id {t} at index {j} is outside the vocabulary "
                                 f"[0, {vocab})")
            out.append(t)
        return out

    def _make_request(self, text: str | None, ids: list[int], params: SamplingParams) -> "_Request":
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        if len(ids) >= self.max_seq_len:
            raise ValueError(
                f"prompt has {len(ids)} tokens but the context holds max_seq_len={self.max_seq_len} "
                f"tokens including at least one generated token; shorten the prompt or load the "
                f"model with a larger max_seq_len= (the model was trained on "
                f"{self.config.max_seq_len})")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this model has none (use stop_token_ids)")
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        decoder = self.tokenizer.stream_decoder() if self.tokenizer is not None else None
        eos = () if params.ignore_eos else self.eos_token_ids
        return _Request(text, ids, params, seed, decoder, frozenset(eos) | set(params.stop_token_ids))

    def _chat_prompt(self, messages) -> tuple[str, list[int]]:
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this model has none")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        for i, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                raise ValueError(f"messages[{i}] must be a dict with string 'role' and 'content', "
                                 f"got {m!r}")
            for key in ("role", "content"):
                if _has_surrogate(m[key]):
                    raise ValueError(f"messages[{i}]['{key}'] is not valid Unicode text: it holds a "
                                     f"lone surrogate at index {_first_surrogate(m[key])}")
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        # Templates that write the BOS text themselves (Llama 3) must not get a second BOS.
        bos = self.tokenizer.bos_id
        bos_text = (self.tokenizer.decode([bos], skip_special_tokens=False)
                    if bos is not None and bos >= 0 else "")
        add_bos = False if bos_text and text.startswith(bos_text) else None
        ids = list(self.tokenizer.encode(text, add_bos=add_bos))
        if not ids:
            raise ValueError("the chat template produced an empty prompt")
        return text, ids

    @contextlib.contextmanager
    def _exclusive(self):
        """One generation at a time: an instance has one engine and one set of KV slots."""
        if self._busy:
            raise RuntimeError(_BUSY_MESSAGE)
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    def _stream_request(self, request: "_Request") -> Iterator[str]:
        # Checked here, not inside the generator, so a second concurrent stream fails at once.
        if self._busy:
            raise RuntimeError(_BUSY_MESSAGE)

        def pieces():
            with self._exclusive():
                yield from (piece for _, piece in self._run([request]) if piece)
            self.last_output = request.output()

        return pieces()

    # ---- the generation loop ------------------------------------------------------------------

    # Rounds per decode_steps call after the first token: CUDA runs them without returning to
    # Python (bursts of this many tokens for a stream); the CPU gains nothing from it.
    DECODE_CHUNK = {"cuda": 16, "cpu": 1}

    def _run(self, requests: list["_Request"]) -> Iterator[tuple["_Request", str]]:
        """Runs the requests in waves of max_batch; yields (request, new visible text) per token."""
        profiler.attach(self._engine, self.weights_summary)
        t_call = time.perf_counter()
        for r in requests:
            r.t_call = t_call
        for start in range(0, len(requests), self.max_batch):
            yield from self._run_wave(requests[start:start + self.max_batch])

    def _run_wave(self, wave: list["_Request"]) -> Iterator[tuple["_Request", str]]:
        engine = self._engine
        t_wave = time.perf_counter()
        t_prefill = profiler.mark()
        for slot, r in enumerate(wave):
            r.slot = slot
            if len(r.prompt_ids) > 1:
                engine.prefill(slot, np.asarray(r.prompt_ids[:-1], dtype=np.int32), 0, "none")
            r.next_token = r.prompt_ids[-1]
            r.position = len(r.prompt_ids) - 1
        profiler.record_span("prefill", "prefill", t_prefill, sum(len(r.prompt_ids) - 1 for r in wave))

        t_decode = profiler.mark()
        chunk = self.DECODE_CHUNK["cuda" if self.device.startswith("cuda") else "cpu"]
        active = list(wave)
        while active:
            # Rounds every active request can still use: its max_tokens and the context bound it.
            room = min(min(r.params.max_tokens - len(r.token_ids),
                           self.max_seq_len - len(r.prompt_ids) - len(r.token_ids) + 1) for r in active)
            n_steps = max(1, min(room, chunk if all(r.token_ids for r in active) else 1))
            new_tokens, logprobs = engine.decode_steps(
                np.array([r.next_token for r in active], dtype=np.int32),
                np.array([r.slot for r in active], dtype=np.int32),
                np.array([r.position for r in active], dtype=np.int32),
                engine_rows(r.params.engine_row(r.seed) for r in active),
                np.array([len(r.token_ids) for r in active], dtype=np.uint64),
                n_steps)
            now = time.perf_counter()
            new_tokens, logprobs = new_tokens.tolist(), logprobs.tolist()
            for i, r in enumerate(active):
                for token, logprob in zip((row[i] for row in new_tokens), (row[i] for row in logprobs)):
                    # The sampler's log-softmax of the chosen token is NaN or inf exactly when the
                    # step's logits are not all finite: the check costs one float test per token.
                    if not math.isfinite(logprob):
                        raise NonFiniteLogitsError(
                            f"generation step {len(r.token_ids)} of sequence {r.index} (prompt "
                            f"{r.index} of this call) produced non-finite logits (NaN or inf; the "
                            f"chosen token's log-probability is {logprob}); nothing was sampled from "
                            f"them. The model's weights or inputs are damaged (check the file with "
                            f"a fresh download)")
                    if not r.token_ids:
                        r.t_first = now
                        r.t_wave = t_wave
                    piece = r.accept(int(token), float(logprob), self.max_seq_len)
                    if r.finish_reason is not None:
                        r.t_done = now
                        yield r, piece
                        break
                    r.next_token = int(token)
                    r.position += 1
                    yield r, piece
            active = [r for r in active if r.finish_reason is None]
        profiler.record_span("decode", "decode", t_decode, sum(len(r.token_ids) for r in wave))


class _Request:
    """One sequence in flight: its prompt, parameters, generated tokens and visible text."""

    def __init__(self, prompt_text, prompt_ids, params: SamplingParams, seed: int, decoder,
                 stop_ids: frozenset):
        self.prompt_text = prompt_text
        self.prompt_ids = prompt_ids
        self.params = params
        self.seed = seed
        self.decoder = decoder
        self.stop_ids = stop_ids
        self.max_stop_len = max((len(s) for s in params.stop), default=0)
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = ""
        self.emitted = 0  # characters of text already handed to a stream
        self.finish_reason: str | None = None
        self.cut_by_stop_string = False
        self.slot = self.position = self.next_token = 0
        self.index = 0  # position among the prompts of its call, for error messages
        self.t_call = self.t_wave = self.t_first = self.t_done = 0.0

    def accept(self, token: int, logprob: float, max_seq_len: int) -> str:
        """Takes one sampled token, applies the stop rules; returns the text now safe to show."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if token in self.stop_ids:
            self.finish_reason = "stop"
        else:
            if self.decoder is not None:
                self._append_text(self.decoder.push(token))
            if self.finish_reason is None and (
                    len(self.token_ids) >= self.params.max_tokens
                    or len(self.prompt_ids) + len(self.token_ids) >= max_seq_len):
                self.finish_reason = "length"
        if self.finish_reason is not None:
            # Bytes of an unfinished character still in the decoder belong to the text, unless a
            # stop string already cut the text before them.
            if self.decoder is not None and not self.cut_by_stop_string:
                self._append_text(self.decoder.flush())
            visible_end = len(self.text)
        else:
            visible_end = len(self.text) - self._held_back()
        piece = self.text[self.emitted:visible_end]
        self.emitted = max(self.emitted, visible_end)
        return piece

    def _append_text(self, piece: str) -> None:
        if not piece:
            return
        # Only a window reaching back max_stop_len - 1 characters can hold a new match.
        search_from = max(0, len(self.text) - self.max_stop_len + 1)
        self.text += piece
        cut = min((i for i in (self.text.find(s, search_from) for s in self.params.stop) if i >= 0),
                  default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.finish_reason = "stop"
            self.cut_by_stop_string = True

    def _held_back(self) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        for n in range(min(self.max_stop_len - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.params.stop):
                return n
        return 0

    def output(self) -> RequestOutput:
        n_prompt, n_gen = len(self.prompt_ids), len(self.token_ids)
        prefill_s = self.t_first - self.t_wave
        decode_s = self.t_done - self.t_first
        timings = {
            "prompt_tokens": n_prompt,
            "generated_tokens": n_gen,
            "ttft_s": self.t_first - self.t_call,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "total_s": self.t_done - self.t_call,
            "prefill_tok_s": n_prompt / prefill_s if prefill_s > 0 else 0.0,
            "decode_tok_s": (n_gen - 1) / decode_s if decode_s > 0 else 0.0,
        }
        return RequestOutput(prompt=self.prompt_text, prompt_token_ids=list(self.prompt_ids),
                             text=self.text, token_ids=list(self.token_ids),
                             finish_reason=self.finish_reason,
                             logprobs=list(self.logprobs) if self.params.logprobs else None,
                             timings=timings)


class _LoadProgress:
    """A tqdm bar on stderr behind the loader's progress callback: progress(done, total)."""

    def __init__(self, description: str):
        self._description = description
        self._bar = None

    def __call__(self, done: int, total: int) -> None:
        from tqdm import tqdm
        if self._bar is None:
            self._bar = tqdm(total=total, desc=self._description, unit="tensor", leave=False)
        self._bar.update(done - self._bar.n)
        if done >= total:
            self._bar.close()


# ---- argument parsing -------------------------------------------------------------------------

def _is_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _check_int(name: str, value) -> int:
    if not _is_int(value):
        raise ArgumentTypeError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _first_surrogate(text: str) -> int:
    return next(i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF)


def _parse_device(device: str) -> tuple[str, int]:
    """"auto" | "cpu" | "cuda" | "cuda:N" -> (backend, device index)."""
    if not isinstance(device, str):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    name = device.strip().lower()
    if name == "auto":
        return ("cuda", 0) if _C.cuda_device_count() > 0 else ("cpu", 0)
    if name == "cpu":
        return "cpu", 0
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name[5:] if name.startswith("cuda:") else "0"
        if not index_text.isdigit():
            raise ValueError(f"device {device!r}: expected 'cuda:N' with N a GPU index")
        index = int(index_text)
        if not _C.cuda_compiled():
            raise RuntimeError(f"device={device!r}: this build of llama_brrr has no CUDA support; "
                               f"rebuild it where nvcc is installed (LLAMA_BRRR_CUDA=1 pip install "
                               f"-e .) or use device='cpu'")
        count = _C.cuda_device_count()
        if count == 0:
            raise RuntimeError(f"device={device!r}: no CUDA device is visible (no GPU, no driver, or "
                               f"CUDA_VISIBLE_DEVICES hides them); use device='cpu'")
        if index >= count:
            raise RuntimeError(f"device={device!r}: there are only {count} CUDA device(s) "
                               f"(cuda:0..cuda:{count - 1})")
        return "cuda", index
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def _device_name(backend: str, index: int) -> str:
    return "cpu" if backend == "cpu" else f"cuda:{index}"


def _parse_dtype(dtype: str | None, backend: str) -> str:
    if dtype is None:
        return "bf16" if backend == "cuda" else "f32"
    key = str(dtype).strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"dtype must be one of 'f32', 'bf16', 'f16' (or float32, bfloat16, "
                         f"float16), got {dtype!r}")
    return _DTYPE_ALIASES[key]


def _parse_max_seq_len(max_seq_len: int | None, config: ModelConfig) -> int:
    if max_seq_len is None:
        return min(config.max_seq_len, _DEFAULT_CONTEXT_CAP)
    if not _is_int(max_seq_len) or not 2 <= max_seq_len <= _INT32_MAX:
        raise ValueError(f"max_seq_len must be an integer >= 2 (a prompt token and a generated "
                         f"one) and < 2**31, got {max_seq_len!r}")
    return int(max_seq_len)


def _parse_max_batch(max_batch: int | None, backend: str) -> int:
    if max_batch is None:
        return _DEFAULT_MAX_BATCH[backend]
    if not _is_int(max_batch) or not 1 <= max_batch <= _INT32_MAX:
        raise ValueError(f"max_batch must be an integer >= 1 (and < 2**31), got {max_batch!r}")
    return int(max_batch)


def _parse_threads(n_threads: int) -> int:
    if not _is_int(n_threads) or not 0 <= n_threads <= _MAX_THREADS:
        raise ValueError(f"n_threads must be an integer in [0, {_MAX_THREADS}] (0 = all cores), "
                         f"got {n_threads!r}")
    return int(n_threads)


def _set_weights(engine, tensors, config: ModelConfig, plan, progress: bool, source: str) -> None:
    """Streams every canonical tensor into the engine, one at a time: blocks the plan keeps go in
    as stored, everything else as an array the engine converts (or quantizes) itself. Each
    tensor's file pages are released once the engine has its copy."""
    from .errors import ModelFileError

    missing = sorted(set(config.tensor_shapes()) - set(tensors))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelFileError(source, f"the model file lacks tensor(s) {shown}; the file is "
                                     f"incomplete or not a Llama-family model")
    names = list(config.tensor_shapes())
    kept = quantization.kept_types()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(names), desc="to engine", unit="tensor", leave=False)
    try:
        for name in names:
            stored_as = plan.types.get(name)
            if stored_as is not None and tensors.file_type(name).lower() == stored_as:
                blocks = tensors.blocks(name)
                engine.set_weight_blocks(name, np.ascontiguousarray(blocks), kept[stored_as],
                                         list(config.tensor_shapes()[name]))
                del blocks
            else:
                array, dtype = _engine_array(tensors[name])
                engine.set_weight(name, array, dtype)
                del array
            tensors.release(name)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def _engine_array(array: np.ndarray) -> tuple[np.ndarray, str]:
    if array.dtype == np.float32:
        return np.ascontiguousarray(array), "f32"
    if array.dtype == np.float16:
        return np.ascontiguousarray(array), "f16"
    if array.dtype.name == "bfloat16":
        return np.ascontiguousarray(array).view(np.uint16), "bf16"
    return np.ascontiguousarray(array, dtype=np.float32), "f32"
