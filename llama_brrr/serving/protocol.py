"""OpenAI request bodies, checked field by field: each wrong value is an APIError (status 400, or
404 for an unknown model) naming the field, in OpenAI's error body. Fields this server ignores
(user, metadata, ...) pass; fields it cannot honour (n > 1, echo, top alternatives' logprobs,
penalties other than 0) are refused rather than silently dropped."""

from __future__ import annotations

import json
import math

from ..sampling import SamplingParams


class APIError(Exception):
    """An error the server answers with {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}",
                       code="invalid_json")
    return body


_MISSING = object()


def _typed(body: dict, name: str, kind: str, default=None, required: bool = False):
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise APIError(400, f"'{name}' is a required field", param=name, code="missing_field")
        return default
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value),
          "bool": isinstance(value, bool),
          "str": isinstance(value, str),
          "dict": isinstance(value, dict)}[kind]
    if not ok:
        what = {"int": "an integer", "number": "a finite number", "bool": "true or false",
                "str": "a string", "dict": "an object"}[kind]
        raise APIError(400, f"'{name}' must be {what}, got {json.dumps(value)[:80]}", param=name,
                       code="invalid_type")
    return value


def check_model(body: dict, served: str) -> None:
    model = _typed(body, "model", "str")
    if model is not None and model != served:
        raise APIError(404, f"The model `{model}` does not exist; this server serves `{served}` "
                            f"(see /v1/models)", param="model", code="model_not_found")


def sampling_fields(body: dict, chat: bool) -> dict:
    """The SamplingParams fields of a request, except max_tokens (which needs the prompt length):
    returns (kwargs, requested max_tokens or None)."""
    n = _typed(body, "n", "int", 1)
    if n != 1:
        raise APIError(400, f"'n' must be 1: this server returns one choice per prompt, got {n}",
                       param="n", code="unsupported_value")
    best_of = _typed(body, "best_of", "int", 1)
    if best_of != 1:
        raise APIError(400, f"'best_of' must be 1 (or absent), got {best_of}", param="best_of",
                       code="unsupported_value")
    for name in ("presence_penalty", "frequency_penalty"):
        if _typed(body, name, "number", 0) != 0:
            raise APIError(400, f"'{name}' is not supported (only 0); use repetition_penalty",
                           param=name, code="unsupported_value")
    if _typed(body, "logit_bias", "dict", {}):
        raise APIError(400, "'logit_bias' is not supported", param="logit_bias", code="unsupported_value")
    if not chat:
        if _typed(body, "echo", "bool", False):
            raise APIError(400, "'echo' is not supported", param="echo", code="unsupported_value")
        if _typed(body, "suffix", "str") is not None:
            raise APIError(400, "'suffix' is not supported", param="suffix", code="unsupported_value")
        logprobs = _typed(body, "logprobs", "int")
        if logprobs is not None and logprobs != 0:
            raise APIError(400, f"'logprobs' must be 0 or null: the chosen token's log-probability is "
                                f"returned, not the top alternatives (got {logprobs})",
                           param="logprobs", code="unsupported_value")
        want_logprobs = logprobs is not None
    else:
        want_logprobs = _typed(body, "logprobs", "bool", False)
        top = _typed(body, "top_logprobs", "int", 0)
        if top != 0:
            raise APIError(400, f"'top_logprobs' must be 0 or null: top alternatives are not "
                                f"returned (got {top})", param="top_logprobs", code="unsupported_value")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise APIError(400, "'stop' must be a string or a list of strings", param="stop",
                       code="invalid_type")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not (isinstance(stop_ids, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in stop_ids)):
        raise APIError(400, "'stop_token_ids' must be a list of integers", param="stop_token_ids",
                       code="invalid_type")
    top_k = _typed(body, "top_k", "int", 0)
    kwargs = dict(
        temperature=_typed(body, "temperature", "number", 1.0),
        top_p=_typed(body, "top_p", "number", 1.0),
        top_k=0 if top_k == -1 else top_k,  # vLLM's -1 = off
        min_p=_typed(body, "min_p", "number", 0.0),
        repetition_penalty=_typed(body, "repetition_penalty", "number", 1.0),
        seed=_typed(body, "seed", "int"),
        stop=stop or None,
        stop_token_ids=stop_ids,
        ignore_eos=_typed(body, "ignore_eos", "bool", False),
        logprobs=want_logprobs,
    )
    max_tokens = _typed(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                        else "max_tokens", "int")
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"'max_tokens' must be at least 1, got {max_tokens}", param="max_tokens",
                       code="invalid_value")
    return kwargs, max_tokens


def stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = _typed(body, "stream", "bool", False)
    options = _typed(body, "stream_options", "dict", {})
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise APIError(400, "'stream_options.include_usage' must be true or false",
                       param="stream_options", code="invalid_type")
    if options and not stream:
        raise APIError(400, "'stream_options' is only allowed with 'stream': true",
                       param="stream_options", code="invalid_value")
    return stream, include_usage


def completion_prompts(body: dict) -> list:
    """'prompt' as a list of prompts, each a str or a list of token ids."""
    prompt = body.get("prompt", _MISSING)
    if prompt is _MISSING or prompt is None:
        raise APIError(400, "'prompt' is a required field", param="prompt", code="missing_field")
    bad = APIError(400, "'prompt' must be a string, a list of strings, a list of token ids or a list "
                        "of token-id lists", param="prompt", code="invalid_type")
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise bad if not isinstance(prompt, list) else APIError(
            400, "'prompt' is an empty list", param="prompt", code="invalid_value")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [prompt]
    for p in prompt:
        if isinstance(p, str):
            continue
        if not (isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)):
            raise bad
    return list(prompt)


def chat_messages(body: dict) -> list[dict]:
    """'messages' as [{"role": str, "content": str}], text parts of a content list joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of {role, content} objects",
                       param="messages", code="invalid_type" if messages is not None else "missing_field")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a string 'role'",
                           param="messages", code="invalid_type")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise APIError(400, f"messages[{i}].content: only text parts "
                                        f"({{\"type\": \"text\", \"text\": ...}}) are supported",
                                   param="messages", code="unsupported_value")
                parts.append(part["text"])
            content = "".join(parts)
        elif not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or a list of text parts",
                           param="messages", code="invalid_type")
        out.append({"role": m["role"], "content": content})
    return out


def sampling_params(kwargs: dict, max_tokens: int) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=max_tokens, **kwargs)
    except (ValueError, TypeError) as error:
        raise APIError(400, str(error), code="invalid_value") from None
