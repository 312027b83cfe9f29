"""SamplingParams: how one request picks its tokens and when it stops (vLLM-like names).

The sampling itself runs inside the engine (`_C.Engine.sample`); this module holds the
parameters, turns Python values into the engine's types (naming the parameter when it cannot), and
hands each request's row to the engine in its own record type (`engine_rows`). The rules the
values must meet are the engine's, stated once in csrc/model.cpp; a SamplingParams is held to them
when it is made, so a bad value fails at the call that passed it.

Defaults differ from vLLM in one place on purpose: temperature defaults to 0.0 (greedy) instead of
vLLM's 1.0, so that a run without arguments is deterministic and benchmarks are reproducible.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import _C
from .errors import ArgumentTypeError

# The fields of the engine's per-row record (_C.sampling_params_dtype) and their "off" values.
ENGINE_DEFAULTS = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=0)
_INT32_MAX = 2**31 - 1


@dataclass
class SamplingParams:
    """Per-request sampling and stopping parameters.

    max_tokens          tokens to generate at most (default 256); generation also ends at the
                        context limit (max_seq_len), whichever comes first, with finish_reason "length".
    temperature         0 = greedy (the default here; vLLM's default is 1.0), else softmax(logits / T).
    top_k               keep the k most likely tokens; 0 = off.
    top_p               nucleus: keep the smallest set with cumulative probability >= top_p; 1 = off.
    min_p               drop tokens with probability < min_p * p(most likely); 0 = off.
    repetition_penalty  HF rule over the prompt and generated tokens; 1 = off.
    seed                None draws a random seed once per request; an int makes sampling reproducible
                        (the same seed gives the same tokens whatever the batch layout).
    stop                string(s) that end generation; the returned text stops before the match.
    stop_token_ids      token ids that end generation (the id is kept in token_ids, not in text).
    ignore_eos          keep going past the model's end-of-sequence tokens.
    logprobs            return the log-probability of each chosen token (under the unmodified
                        distribution softmax(logits)).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: bool = False

    def __post_init__(self):
        self.max_tokens = _require_int("max_tokens", self.max_tokens, "an integer >= 1")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens}")

        self.temperature = _require_real("temperature", self.temperature, "a finite number >= 0")
        self.top_k = _require_int("top_k", self.top_k, "an integer >= 0 (0 = off)")
        self.top_p = _require_real("top_p", self.top_p, "a number in (0, 1]")
        self.min_p = _require_real("min_p", self.min_p, "a number in [0, 1]")
        self.repetition_penalty = _require_real(
            "repetition_penalty", self.repetition_penalty, "a finite number > 0")
        problem = _C.sampling_params_problem(self.temperature, min(self.top_k, _INT32_MAX), self.top_p,
                                             self.min_p, self.repetition_penalty)
        if problem:
            raise ValueError(problem)

        if self.seed is not None:
            self.seed = _require_int("seed", self.seed, "an integer or None")
            if not 0 <= self.seed < 2**64:
                raise ValueError(f"seed must be in [0, 2**64) or None, got {self.seed}")

        self.stop = _normalize_stop(self.stop)
        self.stop_token_ids = _normalize_stop_token_ids(self.stop_token_ids)
        self.ignore_eos = _require_bool("ignore_eos", self.ignore_eos)
        self.logprobs = _require_bool("logprobs", self.logprobs)

    def engine_row(self, seed: int) -> tuple:
        """This request's record for the engine (a row of engine_rows), with its drawn seed."""
        return (self.temperature, min(self.top_k, _INT32_MAX), self.top_p, self.min_p,
                self.repetition_penalty, seed)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, sampling_params: SamplingParams | None, kwargs: dict) -> SamplingParams:
        """The parameters of a generate()/stream()/chat() call: an object or keyword fields, not both."""
        if sampling_params is not None and kwargs:
            raise ArgumentTypeError(
                f"pass either sampling_params or keyword sampling arguments, not both "
                f"(got sampling_params and {', '.join(sorted(kwargs))})")
        if sampling_params is not None:
            if not isinstance(sampling_params, SamplingParams):
                raise ArgumentTypeError(f"sampling_params must be a SamplingParams, "
                                f"got {type(sampling_params).__name__}")
            return sampling_params
        unknown = sorted(set(kwargs) - set(cls.field_names()))
        if unknown:
            raise ArgumentTypeError(f"unknown sampling argument(s) {', '.join(map(repr, unknown))}; "
                            f"valid: {', '.join(cls.field_names())}")
        return cls(**kwargs)


def engine_rows(rows) -> np.ndarray:
    """The `params` argument of _C.Engine.sample and decode_steps: one _C.sampling_params_dtype
    record per row, from SamplingParams.engine_row tuples."""
    return np.array(list(rows), dtype=_C.sampling_params_dtype)


def uniform_rows(n: int, **fields) -> np.ndarray:
    """n engine rows, each field (ENGINE_DEFAULTS' names) a scalar for every row or a sequence of
    n values; fields left out are off. For tests and tools that drive _C.Engine directly."""
    unknown = sorted(set(fields) - set(ENGINE_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown engine sampling field(s) {', '.join(unknown)}; "
                        f"valid: {', '.join(ENGINE_DEFAULTS)}")
    rows = np.zeros(n, dtype=_C.sampling_params_dtype)
    for name, default in ENGINE_DEFAULTS.items():
        rows[name] = fields.get(name, default)
    return rows


def _require_int(name: str, value, allowed: str) -> int:
    # bool is an int subclass, but top_k=True is a mistake, not a 1; numpy integers are welcome.
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ArgumentTypeError(f"{name} must be {allowed}, got {value!r}")
    return int(value.__index__())


def _require_real(name: str, value, allowed: str) -> float:
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise ArgumentTypeError(f"{name} must be {allowed}, got {value!r}")
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):  # an int beyond float's range, a broken __float__
        raise ValueError(f"{name} must be {allowed}, got {value!r}") from None


def _require_bool(name: str, value) -> bool:
    # "no" or 0 taken as a flag would silently mean something else; numpy's bool is welcome.
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _normalize_stop(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise ArgumentTypeError(f"stop must be a string, a list of strings or None, got {stop!r}")
    stop = list(stop)
    for s in stop:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        if _has_surrogate(s):
            raise ValueError(f"stop strings must be valid Unicode text, got {s!r} (a lone surrogate)")
    return stop


def _normalize_stop_token_ids(ids) -> list[int]:
    if ids is None:
        return []
    if isinstance(ids, np.ndarray):
        ids = ids.tolist()
    if not isinstance(ids, bool) and hasattr(ids, "__index__"):
        ids = [ids]
    if not isinstance(ids, (list, tuple)):
        raise ArgumentTypeError(f"stop_token_ids must be a list of token ids or None, got {ids!r}")
    out = []
    for t in ids:
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise ArgumentTypeError(f"stop_token_ids must be integers, got {t!r}")
        t = int(t.__index__())
        if not 0 <= t <= _INT32_MAX:
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {t}")
        out.append(t)
    return out


def _has_surrogate(text: str) -> bool:
    """True when `text` holds a lone surrogate (U+D800..U+DFFF), which no UTF-8 text can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
