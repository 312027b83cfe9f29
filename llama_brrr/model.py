"""Llama: the user-facing model. It owns one engine handle (`_C.Engine`) and drives it from Python.

The engine does all the math (forward passes and sampling); this file loads weights into it,
tokenizes, checks every argument, and hands requests to the continuous-batching scheduler
(llama_brrr/serving/scheduler.py), which runs them on the engine's KV slots:

    each step: admit waiting requests into free slots; prefill prompt[:-1] in chunks under a token
    budget; engine.decode_steps over every sequence whose prompt is in place (the first round feeds
    its last prompt token, later rounds the token just sampled); the stop conditions are checked
    token by token per request, and a finished request frees its slot for the next step.

On CUDA a burst of decode_steps rounds stays on the device (no host round trip per token) once every
request has its first token and no prompt waits; the CPU gains nothing from bursts.
Tokens sampled after a request stopped are dropped.

Every argument is checked before the engine sees it, so a bad request raises a ValueError and leaves
the instance usable. The static-wave loop this replaced (requests in waves of max_batch, a finished
slot idle until its wave ends) is kept as _generate_static_waves, only as the opponent `llama-brrr
bench serve` measures the scheduler against.
"""

from __future__ import annotations

import codecs
import contextlib
import math
import os
import secrets
import time
from typing import Iterator, Sequence

import numpy as np

from . import _C, profiler
from . import quant as quantization
from .config import ModelConfig, shape_config
from .errors import ArgumentTypeError, NonFiniteLogitsError
from .sampling import SamplingParams, _has_surrogate
from .serving.request import Request, RequestOutput
from .serving.block_manager import BlockManager
from .serving.scheduler import Scheduler, decode_room, launch_rows

_DTYPE_ALIASES = {
    "f32": "f32", "float32": "f32", "fp32": "f32",
    "bf16": "bf16", "bfloat16": "bf16",
    "f16": "f16", "float16": "f16", "fp16": "f16", "half": "f16",
}
# kv_cache_dtype spellings -> the engine's names; "fp8" is vLLM's spelling of e4m3.
_KV_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}
_DEFAULT_CONTEXT_CAP = 4096
_DEFAULT_MAX_BATCH = {"cpu": 8, "cuda": 64}
_RANDOM_INIT_STD = 0.02
_INT32_MAX = 2**31 - 1
_MAX_THREADS = 4096  # beyond any machine; keeps a typo from reaching the engine as a thread count
_BUSY_MESSAGE = ("this Llama is already generating (an unfinished stream?); finish or close that "
                 "generator first: one instance runs one generation at a time")


class RandomModelTokenizer:
    """A byte-level tokenizer for random-weight models, so benchmarks and tests can take text prompts.

    ids 0, 1, 2 are <unk>, <s> (BOS) and </s> (EOS); id 3 + b is the byte b (ids 3..258). Ids above
    258 exist in the model's vocabulary but decode to nothing. Needs vocab_size >= 259.
    """

    N_SPECIAL = 3
    BOS_ID = 1
    EOS_ID = 2
    max_bytes_per_token = 1  # one token per byte of text

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

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, *,
                            max_chars: int | None = None, limit_reason: str | None = None) -> str:
        """A plain "role: content" transcript; random weights make no use of a real template."""
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        text = text + "assistant: " if add_generation_prompt else text
        if max_chars is not None and len(text) > max_chars:
            raise ValueError(f"the chat prompt has more than {max_chars} characters: {limit_reason}")
        return text


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
                 source: str = "", weight_types: dict | None = None,
                 enable_prefix_caching: bool = True, tensor_parallel: int = 1):
        self._engine = engine
        # GPUs the model is split over; above 1 the engine is a tp.TensorParallelEngine of as many
        # worker processes, and this process holds no weights.
        self.tensor_parallel = int(tensor_parallel)
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
        self._scheduler: Scheduler | None = None  # generate()'s, made on first use
        # The engine's KV pool is one, so its block manager is too: every scheduler of this
        # instance (generate's, AsyncLlama's) shares it, and its prefix cache outlives a call.
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._block_manager: BlockManager | None = None

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | None = None, device: str = "auto", dtype: str | None = None,
                        max_seq_len: int | None = None, max_batch: int | None = None,
                        n_threads: int = 0, progress: bool = True,
                        quant: str | None = None, kv_block_size: int = 16,
                        gpu_memory_utilization: float = 0.9, kv_blocks: int | None = None,
                        enable_prefix_caching: bool = True, tensor_parallel: int = 1,
                        kv_cache_dtype: str = "auto") -> "Llama":
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
        kv_block_size, gpu_memory_utilization, kv_blocks, enable_prefix_caching: the paged KV
        cache (see _parse_kv): positions per block (16, 32, 64 or 128); on CUDA the share of the
        device's memory the engine may hold, which sizes the pool; the pool's block count (None:
        enough for every slot to hold max_seq_len, on CUDA fewer when memory is short); whether
        requests sharing a prompt prefix share its blocks.
        kv_cache_dtype: "auto" (the default) keeps keys and values in the compute dtype (bf16 on
        cuda, f32 on cpu); "fp8" (or "fp8_e4m3", as vLLM's kv_cache_dtype="fp8") stores them as
        OCP e4m3 with unit scale, rounded to nearest (ties to even) when appended: half the bytes
        of bf16, so the same memory holds twice the blocks and each decode step reads half the KV
        bytes. Values beyond +-448 saturate and magnitudes under 2^-6 lose relative precision
        (subnormals). The CPU engine keeps the rounded values in fp32, so it computes what the
        CUDA cache holds but saves no memory.
        tensor_parallel: GPUs to split the model over (needs a CUDA device; ranks on cuda:k ..
        cuda:k+N-1 for device='cuda:k'): one worker process per GPU loads only its shards of the
        file; this process keeps the tokenizer and config. See docs/tensor_parallel.md.
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
        kv = _parse_kv(kv_block_size, gpu_memory_utilization, kv_blocks, enable_prefix_caching,
                       kv_cache_dtype)
        size = _parse_tensor_parallel(tensor_parallel, config, backend, device_index, file_types)
        if size > 1:
            loaded.tensors = None  # drops this process's map of the file: the ranks read their shards
            engine = _tensor_parallel_engine(size, dict(kind="pretrained", path=str(resolved)), config, backend,
                                             device_index, engine_dtype, max_seq_len, max_batch, kv, n_threads,
                                             quant)
            plan = quantization.QuantPlan(engine.weight_types)
        else:
            engine = _C.Engine(backend, config.engine_dict(max_seq_len, max_batch, **kv),
                               engine_dtype, device_index, n_threads, plan.type_ids())
            _set_weights(engine, loaded.tensors, config, plan, progress, str(resolved))
        tokenizer = load_tokenizer(loaded.tokenizer_spec)
        return cls(engine, config, tokenizer, device=_device_name(backend, device_index),
                   dtype=engine_dtype, max_seq_len=max_seq_len, max_batch=max_batch,
                   eos_token_ids=loaded.eos_token_ids or (), source=str(resolved),
                   weight_types=plan.types, enable_prefix_caching=enable_prefix_caching,
                   tensor_parallel=size)

    @classmethod
    def random(cls, shape_name_or_config: str | ModelConfig, seed: int = 0, device: str = "auto",
               dtype: str | None = None, max_seq_len: int | None = None,
               max_batch: int | None = None, n_threads: int = 0,
               quant: str | None = None, kv_block_size: int = 16,
               gpu_memory_utilization: float = 0.9, kv_blocks: int | None = None,
               enable_prefix_caching: bool = True, tensor_parallel: int = 1,
               kv_cache_dtype: str = "auto") -> "Llama":
        """A model with random weights (N(0, 0.02); norms 1 + N(0, 0.02)), drawn by the engine.

        quant: a block format or recipe ("q4_k_m", "q8_0", ...) stores the matrices quantized: each
        holds exactly the quantization of the float weights the same seed draws.

        shape_name_or_config: a name from config.SHAPES (e.g. "llama3.2-1b") or a ModelConfig.
        Its tokenizer is RandomModelTokenizer (byte-level) when vocab_size >= 259; with a smaller
        vocabulary there is none and prompts must be token-id lists.
        kv_block_size, gpu_memory_utilization, kv_blocks, enable_prefix_caching, kv_cache_dtype:
        as in from_pretrained.
        tensor_parallel: GPUs to split the model over, as in from_pretrained. Each rank draws its
        own shapes from `seed` (llama_brrr/tp/worker.py): every rank's shard of a split matrix
        holds the same values, so the weights differ from the one-GPU draw of that seed.
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
        kv = _parse_kv(kv_block_size, gpu_memory_utilization, kv_blocks, enable_prefix_caching,
                       kv_cache_dtype)
        size = _parse_tensor_parallel(tensor_parallel, config, backend, device_index, None)
        if size > 1:
            engine = _tensor_parallel_engine(size, dict(kind="random", seed=seed), config, backend, device_index,
                                             engine_dtype, max_seq_len, max_batch, kv, n_threads, quant)
            plan = quantization.QuantPlan(engine.weight_types)
        else:
            engine = _C.Engine(backend, config.engine_dict(max_seq_len, max_batch, **kv),
                               engine_dtype, device_index, n_threads, plan.type_ids())
            engine.init_random(seed, _RANDOM_INIT_STD)
        tokenizer = (RandomModelTokenizer(config.vocab_size)
                     if config.vocab_size >= RandomModelTokenizer.N_SPECIAL + 256 else None)
        return cls(engine, config, tokenizer, device=_device_name(backend, device_index),
                   dtype=engine_dtype, max_seq_len=max_seq_len, max_batch=max_batch,
                   source=f"random:{config.name}", weight_types=plan.types,
                   enable_prefix_caching=enable_prefix_caching, tensor_parallel=size)

    @property
    def engine(self):
        """The underlying _C.Engine (for tests and tools; generation goes through this class)."""
        return self._engine

    @property
    def block_manager(self) -> BlockManager:
        """The KV pool's block manager every scheduler of this instance shares (made on first use)."""
        if self._block_manager is None:
            if self._engine is None:
                raise RuntimeError("this Llama was closed (close() or the end of its `with` block); "
                                   "load the model again")
            self._block_manager = BlockManager(self._engine, self.max_batch, self.max_seq_len,
                                               self.enable_prefix_caching)
        return self._block_manager

    def _direct_slots(self) -> None:
        """Before writing KV slots directly (forward, the static waves): the engine's identity
        block layout back, and no prefix cache pointing into blocks that are about to change."""
        if self._block_manager is not None:
            self._block_manager.reset_identity()

    def close(self) -> None:
        """Frees the engine (weights, KV cache, buffers) now instead of at garbage collection, and
        hands freed heap pages back to the OS; the instance cannot generate afterwards. Also what
        leaving a `with Llama.from_pretrained(...) as llm:` block does."""
        if self._busy:
            raise RuntimeError(_BUSY_MESSAGE)
        if self._engine is None:
            return
        if hasattr(self._engine, "close"):  # a tp.TensorParallelEngine: stops its worker processes
            self._engine.close()
        self._engine = None
        self._scheduler = None
        self._block_manager = None
        from .memory import release_freed_memory
        release_freed_memory()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
            self._direct_slots()
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
        self._check_prompt_bytes(text, name)
        ids = list(self.tokenizer.encode(text))
        if not ids:
            raise ValueError(f"{name} is empty: {text!r} encodes to no tokens")
        return text, ids

    def _check_prompt_bytes(self, text: str, name: str) -> None:
        """Refuses, before tokenizing, text too long to fit the context whatever its tokens: each
        token stands for at most tokenizer.max_bytes_per_token bytes of text, so more than
        max_seq_len times that many bytes make more than max_seq_len tokens."""
        from .tokenizer import prompt_bytes_beyond

        n_bytes = prompt_bytes_beyond(self.tokenizer, text, self.max_seq_len)
        if n_bytes is not None:
            raise ValueError(f"{name} is too long: {n_bytes} bytes of text make more than max_seq_len="
                             f"{self.max_seq_len} tokens (no token of this vocabulary stands for more "
                             f"than {self.tokenizer.max_bytes_per_token} bytes); shorten it or load the "
                             f"model with a larger max_seq_len=")

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

    def _make_request(self, text: str | None, ids: list[int], params: SamplingParams) -> "Request":
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
        self.block_manager.check_fits(len(ids), params.max_tokens)
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        decoder = self.tokenizer.stream_decoder() if self.tokenizer is not None else None
        eos = () if params.ignore_eos else self.eos_token_ids
        return Request(text, ids, params, seed, decoder, frozenset(eos) | set(params.stop_token_ids))

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
        per_token = getattr(self.tokenizer, "max_bytes_per_token", None)
        limits = dict(limit_reason=f"the prompt is too long for max_seq_len={self.max_seq_len} tokens; "
                                   f"shorten the messages or load the model with a larger max_seq_len=")
        if per_token is not None and not getattr(self.tokenizer, "dropped_characters", ""):
            # A rendered prompt of more characters than this has more bytes, hence more tokens
            # than the context holds (see _check_prompt_bytes): the template stops there.
            limits["max_chars"] = self.max_seq_len * per_token
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, **limits)
        self._check_prompt_bytes(text, "the chat prompt")
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
        if self._engine is None:
            raise RuntimeError("this Llama was closed (close() or the end of its `with` block); "
                               "load the model again")
        if not getattr(self._engine, "alive", True):  # tensor-parallel ranks stopped by a fault
            raise RuntimeError(f"this Llama's tensor-parallel workers were stopped "
                               f"({self._engine.stopped_because}); load the model again")
        self._busy = True
        try:
            yield
        finally:
            self._busy = False

    def _stream_request(self, request: "Request") -> Iterator[str]:
        # Checked here, not inside the generator, so a second concurrent stream fails at once.
        if self._busy:
            raise RuntimeError(_BUSY_MESSAGE)

        def pieces():
            with self._exclusive():
                yield from (piece for _, piece in self._run([request]) if piece)
            self.last_output = request.output()

        return pieces()

    # ---- the generation loop ------------------------------------------------------------------

    # Rounds per decode_steps call once every request has its first token and no prompt waits: CUDA
    # runs them without returning to Python (bursts of this many tokens for a stream); the CPU
    # gains nothing from it.
    DECODE_CHUNK = {"cuda": 16, "cpu": 1}

    def make_scheduler(self, max_num_seqs: int | None = None,
                       max_num_batched_tokens: int | None = None, prefill_chunk: int | None = None,
                       decode_steps: int | None = None, pipeline: bool | None = None) -> Scheduler:
        """A continuous-batching scheduler over this model's engine (see serving/scheduler.py).

        max_num_seqs: sequences running at once (<= max_batch, the engine's KV slots; default all).
        max_num_batched_tokens: tokens one step processes at most (decode rows + prompt chunks).
        prefill_chunk: prompt tokens per prefill chunk (default: the budget less max_num_seqs).
        decode_steps: decode rounds per engine call once no request waits (default DECODE_CHUNK).
        pipeline: launch each step's decode before reading the previous step's tokens (default: on
            CUDA, one GPU or a tensor-parallel group; see serving/scheduler.py).
        """
        if self._engine is None:
            raise RuntimeError("this Llama was closed (close() or the end of its `with` block); "
                               "load the model again")
        if max_num_seqs is None:
            max_num_seqs = self.max_batch
        if not _is_int(max_num_seqs) or not 1 <= max_num_seqs <= self.max_batch:
            raise ValueError(f"max_num_seqs must be an integer in [1, max_batch={self.max_batch}] "
                             f"(the engine's KV slots; load the model with a larger max_batch= for "
                             f"more), got {max_num_seqs!r}")
        if decode_steps is None:
            decode_steps = self.DECODE_CHUNK["cuda" if self.device.startswith("cuda") else "cpu"]
        return Scheduler(self._engine, max_seq_len=self.max_seq_len, max_num_seqs=int(max_num_seqs),
                         max_num_batched_tokens=max_num_batched_tokens, prefill_chunk=prefill_chunk,
                         decode_steps=decode_steps, allocator=self.block_manager, pipeline=pipeline)

    def _run(self, requests: list["Request"]) -> Iterator[tuple["Request", str]]:
        """Runs the requests through the scheduler; yields (request, new visible text) per step in
        which the request got tokens. The first request error (non-finite logits) is raised once
        the step that found it ends; whatever ends the loop early (an error, a closed stream) takes
        the unfinished requests out, so every slot is free afterwards."""
        profiler.attach(self._engine, self.weights_summary)
        if self._scheduler is None:
            self._scheduler = self.make_scheduler()
        scheduler = self._scheduler
        t_call = time.perf_counter()
        for r in requests:
            r.t_call = t_call
            scheduler.add(r)
        left = len(requests)
        try:
            while left:
                events = scheduler.step()
                failed = [e.request for e in events if e.request.error is not None]
                if failed:
                    raise min(failed, key=lambda r: r.index).error
                for event in events:
                    if event.finished:
                        left -= 1
                    yield event.request, event.text
        finally:
            for r in requests:
                scheduler.abort(r)

    def _generate_static_waves(self, prompts, sampling_params: SamplingParams | None = None,
                               **kwargs) -> list[RequestOutput]:
        """generate() the way it ran before the scheduler: waves of max_batch requests, every prompt
        of a wave prefilled whole before any decode, each slot idle from its request's end until the
        wave's. Kept only as the opponent in `llama-brrr bench serve`."""
        params = SamplingParams.from_kwargs(sampling_params, kwargs)
        requests = [self._make_request(text, ids, params) for text, ids in self._prompts(prompts)]
        for index, r in enumerate(requests):
            r.index = index
        self._run_static_waves(requests)
        return [r.output() for r in requests]

    def _run_static_waves(self, requests: list["Request"]) -> None:
        with self._exclusive():
            self._direct_slots()
            t_call = time.perf_counter()
            for r in requests:
                r.t_call = t_call
            for start in range(0, len(requests), self.max_batch):
                self._run_wave(requests[start:start + self.max_batch])

    def _run_wave(self, wave: list["Request"]) -> None:
        engine = self._engine
        t_wave = time.perf_counter()
        for slot, r in enumerate(wave):
            r.slot = slot
            r.t_admit = t_wave
            if len(r.prompt_ids) > 1:
                engine.prefill(slot, np.asarray(r.prompt_ids[:-1], dtype=np.int32), 0, "none")
            r.next_token = r.prompt_ids[-1]
            r.position = len(r.prompt_ids) - 1
        chunk = self.DECODE_CHUNK["cuda" if self.device.startswith("cuda") else "cpu"]
        active = list(wave)
        while active:
            room = decode_room(active, self.max_seq_len)
            n_steps = max(1, min(room, chunk if all(r.token_ids for r in active) else 1))
            burst = launch_rows(engine, active, n_steps, pipelined=False)
            now = time.perf_counter()
            for r, tokens_i, logprobs_i in zip(active, burst.tokens, burst.logprobs):
                for token, logprob in zip(tokens_i, logprobs_i):
                    if not math.isfinite(logprob):
                        raise NonFiniteLogitsError(f"generation step {len(r.token_ids)} of sequence "
                                                   f"{r.index} produced non-finite logits")
                    if not r.token_ids:
                        r.t_first = now
                    r.accept(token, logprob, self.max_seq_len)
                    r.token_times.append(now)
                    if r.finish_reason is not None:
                        r.t_done = now
                        break
                    r.next_token = token
                    r.position += 1
            active = [r for r in active if r.finish_reason is None]


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


def _tensor_parallel_engine(size: int, source: dict, config: ModelConfig, backend: str, device_index: int,
                            dtype: str, max_seq_len: int, max_batch: int, kv: dict, n_threads: int, quant):
    """The ranks on GPUs device_index.. of one host; `source` says where their weights come from
    (kind "pretrained" with a path, or "random" with a seed)."""
    from .tp import TensorParallelEngine

    return TensorParallelEngine(dict(
        source, config=config, backend=backend, devices=[device_index + r for r in range(size)], dtype=dtype,
        max_seq_len=max_seq_len, max_batch=max_batch, kv=kv, n_threads=n_threads, quant=quant), size)


def _parse_kv(kv_block_size, gpu_memory_utilization, kv_blocks, enable_prefix_caching,
              kv_cache_dtype) -> dict:
    """The paged KV cache's engine_dict arguments, each checked; kv_cache_dtype in the engine's
    spelling ("auto" or "fp8_e4m3")."""
    if not _is_int(kv_block_size) or kv_block_size not in (16, 32, 64, 128):
        raise ValueError(f"kv_block_size must be 16, 32, 64 or 128 (positions per KV block), got "
                         f"{kv_block_size!r}")
    if (isinstance(gpu_memory_utilization, bool)
            or not isinstance(gpu_memory_utilization, (int, float, np.floating, np.integer))
            or not 0.0 < float(gpu_memory_utilization) <= 1.0):
        raise ValueError(f"gpu_memory_utilization must be a number in (0, 1] (the share of the GPU's "
                         f"memory the engine may hold), got {gpu_memory_utilization!r}")
    if kv_blocks is not None and (not _is_int(kv_blocks) or not 1 <= kv_blocks <= _INT32_MAX):
        raise ValueError(f"kv_blocks must be None (enough for every slot to hold max_seq_len) or an "
                         f"integer >= 1, got {kv_blocks!r}")
    if not isinstance(enable_prefix_caching, (bool, np.bool_)):
        raise ArgumentTypeError(f"enable_prefix_caching must be True or False, got "
                                f"{enable_prefix_caching!r}")
    allowed = ", ".join(map(repr, _KV_CACHE_DTYPES))
    if not isinstance(kv_cache_dtype, str):
        raise ArgumentTypeError(f"kv_cache_dtype must be a str, one of {allowed}; got {kv_cache_dtype!r}")
    if kv_cache_dtype not in _KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {allowed} (\"fp8\" means \"fp8_e4m3\"), got "
                         f"{kv_cache_dtype!r}")
    return {"kv_block_size": int(kv_block_size), "kv_blocks": 0 if kv_blocks is None else int(kv_blocks),
            "gpu_memory_utilization": float(gpu_memory_utilization),
            "kv_cache_dtype": _KV_CACHE_DTYPES[kv_cache_dtype]}


def _parse_tensor_parallel(tensor_parallel, config: ModelConfig, backend: str, device_index: int,
                           file_types: dict | None) -> int:
    """The tensor_parallel argument, checked against the device, the visible GPUs and the model's
    shapes before any worker starts."""
    from .tp import parse_size, rank_devices

    size = parse_size(tensor_parallel)
    if size == 1:
        return 1
    from .tp.shard import check_blocks, check_split

    rank_devices(backend, device_index, size)
    check_split(config, size)
    if file_types:
        check_blocks(config, size, file_types)
    return size


def _parse_threads(n_threads: int) -> int:
    if not _is_int(n_threads) or not 0 <= n_threads <= _MAX_THREADS:
        raise ValueError(f"n_threads must be an integer in [0, {_MAX_THREADS}] (0 = all cores), "
                         f"got {n_threads!r}")
    return int(n_threads)


# Quantized tensors go to the engine in row chunks of about this many bytes, each chunk's file pages
# dropped before the next is read: a load's peak is the engine's weights plus one chunk.
_LOAD_CHUNK_BYTES = 32 << 20


def _set_weights(engine, tensors, config: ModelConfig, plan, progress: bool, source: str) -> None:
    """Streams every canonical tensor into the engine, one at a time: blocks the plan keeps go in
    as stored, everything else as an array the engine converts (or quantizes) itself. Each
    tensor's file pages are released once the engine has its copy."""
    from .errors import ModelFileError
    from .loaders.common import first_nonfinite_row

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
                shape = list(config.tensor_shapes()[name])
                for first_row, rows in tensors.block_chunks(name, _LOAD_CHUNK_BYTES):
                    engine.set_weight_blocks(name, np.ascontiguousarray(rows), kept[stored_as],
                                             shape, first_row)
                    del rows
            else:
                array = tensors[name]
                bad_row = first_nonfinite_row(array)
                if bad_row >= 0:
                    raise ModelFileError(source, f"tensor {tensors.file_name(name)!r} holds NaN or "
                                                 f"inf values (row {bad_row}); the file is "
                                                 f"corrupt, re-download it")
                array, dtype = _engine_array(array)
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
