"""The OpenAI-compatible HTTP server: FastAPI + uvicorn in front of an AsyncLlama.

    llama-brrr serve --model PATH --port 8000 --max-num-seqs 8
    curl localhost:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 16}'

Routes: POST /v1/completions, POST /v1/chat/completions (the model's chat template, as Llama.chat),
both with SSE streaming ("data: {...}" chunks, "data: [DONE]", stream_options.include_usage);
GET /v1/models, /health, /metrics (Prometheus text). The engine loop runs on its own thread
(AsyncLlama), so the event loop only parses, queues and writes.

Errors are OpenAI's body {"error": {"message", "type", "param", "code"}}: 400 for a malformed body, a
wrong field type, a prompt too long for the context, max_tokens beyond it, n > 1; 404 for an unknown
model or route. A request whose client disconnects is aborted (its slot is free by the next step),
streaming or not. Sampling defaults follow OpenAI (temperature 1, max_tokens 16 for completions;
for chat, whatever the context leaves).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .protocol import (APIError, chat_messages, check_model, completion_prompts, parse_json,
                       sampling_fields, sampling_params, stream_options)

COMPLETION_DEFAULT_MAX_TOKENS = 16


def build_app(engine, model_name: str):
    """The FastAPI app serving `engine` (an AsyncLlama) under the name `model_name`."""
    app = FastAPI(title="llama_brrr", docs_url=None, redoc_url=None)
    llm = engine.llm
    created = int(time.time())

    @app.exception_handler(APIError)
    async def api_error(_request, error: APIError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, error):
        body = APIError(error.status_code, str(error.detail),
                        code="not_found" if error.status_code == 404 else None).body()
        return JSONResponse(body, status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request, error):
        return JSONResponse(APIError(400, f"invalid request: {error.errors()}").body(), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(_request, error):
        return JSONResponse(APIError(500, f"{type(error).__name__}: {error}").body(), status_code=500)

    @app.get("/health")
    async def health():
        if not engine.is_running:
            raise APIError(503, "the engine loop is not running", type_="server_error")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "llama_brrr",
            "max_model_len": llm.max_seq_len}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(engine.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = parse_json(await request.body())
        check_model(body, model_name)
        kwargs, max_tokens = sampling_fields(body, chat=False)
        stream, include_usage = stream_options(body)
        prepared = [_prepare(llm, "prompt", _encode(llm, p), kwargs, max_tokens,
                             COMPLETION_DEFAULT_MAX_TOKENS) for p in completion_prompts(body)]
        return await _respond(engine, request, prepared, stream, include_usage, chat=False,
                              model_name=model_name, response=(JSONResponse, StreamingResponse))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = parse_json(await request.body())
        check_model(body, model_name)
        kwargs, max_tokens = sampling_fields(body, chat=True)
        stream, include_usage = stream_options(body)
        messages = chat_messages(body)
        try:
            text_ids = llm._chat_prompt(messages)
        except ValueError as error:
            raise APIError(400, str(error), param="messages", code="invalid_value") from None
        prepared = [_prepare(llm, "messages", text_ids, kwargs, max_tokens, None)]
        return await _respond(engine, request, prepared, stream, include_usage, chat=True,
                              model_name=model_name, response=(JSONResponse, StreamingResponse))

    return app


def _encode(llm, prompt):
    """(text, ids) of one prompt (a str or token ids), with Llama.generate's checks."""
    try:
        return llm._prompts([prompt] if isinstance(prompt, str) else prompt)[0]
    except ValueError as error:
        raise APIError(400, str(error), param="prompt", code="invalid_value") from None


def _prepare(llm, param: str, text_ids, kwargs: dict, max_tokens, default_max):
    """A checked Request for one prompt; max_tokens beyond the context is a 400, an absent one is
    what the context leaves (at most default_max when given)."""
    text, ids = text_ids
    room = llm.max_seq_len - len(ids)
    if room < 1:
        raise APIError(400, f"This model's maximum context length is {llm.max_seq_len} tokens; the "
                            f"prompt has {len(ids)} tokens, which leaves no room for a completion. "
                            f"Shorten the {param}.", param=param, code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = room if default_max is None else min(default_max, room)
    elif max_tokens > room:
        raise APIError(400, f"This model's maximum context length is {llm.max_seq_len} tokens. "
                            f"However, you requested {len(ids) + max_tokens} tokens ({len(ids)} in "
                            f"the {param}, {max_tokens} in the completion). Reduce the {param} or "
                            f"max_tokens.", param="max_tokens", code="context_length_exceeded")
    params = sampling_params(kwargs, max_tokens)
    try:
        return llm._make_request(text, ids, params)
    except ValueError as error:
        raise APIError(400, str(error), param=param, code="invalid_value") from None


async def _respond(engine, http_request, requests, stream: bool, include_usage: bool, chat: bool,
                   model_name: str, response):
    json_response, streaming_response = response
    kind = "chatcmpl" if chat else "cmpl"
    response_id = f"{kind}-{uuid.uuid4().hex}"
    created = int(time.time())
    ids = [f"{response_id}-{i}" for i in range(len(requests))]
    streams = [engine.submit(r, rid) for r, rid in zip(requests, ids)]
    if stream:
        chunks = _sse(engine, streams, ids, response_id, created, model_name, chat, include_usage)
        return streaming_response(chunks, media_type="text/event-stream",
                                  headers={"Cache-Control": "no-cache"})
    outputs = await _collect(engine, http_request, streams, ids)
    choices = []
    for i, out in enumerate(outputs):
        logprobs = _logprobs(engine.llm, out, chat)
        if chat:
            choices.append({"index": i, "message": {"role": "assistant", "content": out.text},
                            "logprobs": logprobs, "finish_reason": out.finish_reason})
        else:
            choices.append({"index": i, "text": out.text, "logprobs": logprobs,
                            "finish_reason": out.finish_reason})
    return json_response({
        "id": response_id, "object": "chat.completion" if chat else "text_completion",
        "created": created, "model": model_name, "choices": choices, "usage": _usage(outputs)})


async def _collect(engine, http_request, streams, ids):
    """Every stream's RequestOutput; a client that goes away first aborts them all."""
    results = asyncio.ensure_future(asyncio.gather(*(s.result() for s in streams)))
    gone = asyncio.ensure_future(_disconnected(http_request))
    try:
        await asyncio.wait({results, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not results.done():
        for rid in ids:
            engine.abort(rid)
        results.cancel()
        raise APIError(499, "the client closed the connection", code="client_closed")
    try:
        return results.result()
    except APIError:
        raise
    except Exception as error:
        raise APIError(500, f"generation failed: {type(error).__name__}: {error}") from None


async def _disconnected(http_request) -> None:
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            return


def _usage(outputs) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    completion = sum(len(o.token_ids) for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _token_strings(llm, ids: list[int]) -> list[str]:
    if llm.tokenizer is None:
        return [f"token_id:{t}" for t in ids]
    return [llm.tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def _logprobs(llm, out, chat: bool):
    if out.logprobs is None:
        return None
    tokens = _token_strings(llm, out.token_ids)
    if chat:
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")),
                             "top_logprobs": []} for t, lp in zip(tokens, out.logprobs)]}
    return {"tokens": tokens, "token_logprobs": list(out.logprobs), "top_logprobs": None,
            "text_offset": None}


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _sse(engine, streams, ids, response_id, created, model_name, chat, include_usage):
    """The SSE body: chunks from every stream as they come, then usage (if asked) and [DONE]."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index, stream):
        try:
            async for delta in stream:
                await queue.put((index, delta))
        except Exception as error:  # an engine fault: reported in the stream, not a hang
            await queue.put((index, error))

    def chunk(choice: dict) -> str:
        payload = {"id": response_id, "object": obj, "created": created, "model": model_name,
                   "choices": [choice]}
        if include_usage:
            payload["usage"] = None
        return _event(payload)

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    outputs = [None] * len(streams)
    try:
        if chat:
            for i in range(len(streams)):
                yield chunk({"index": i, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None})
        left = len(streams)
        while left:
            index, delta = await queue.get()
            if isinstance(delta, BaseException):
                left -= 1
                yield _event(APIError(500, f"generation failed: {type(delta).__name__}: "
                                           f"{delta}").body())
                continue
            logprobs = None
            if delta.logprobs is not None:
                strings = _token_strings(engine.llm, delta.token_ids)
                logprobs = ({"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")),
                                          "top_logprobs": []} for t, lp in zip(strings, delta.logprobs)]}
                            if chat else {"tokens": strings, "token_logprobs": delta.logprobs,
                                          "top_logprobs": None, "text_offset": None})
            if delta.text or delta.finished or logprobs is not None:
                if chat:
                    body = {"content": delta.text} if delta.text else {}
                    yield chunk({"index": index, "delta": body, "logprobs": logprobs,
                                 "finish_reason": delta.finish_reason})
                else:
                    yield chunk({"index": index, "text": delta.text, "logprobs": logprobs,
                                 "finish_reason": delta.finish_reason})
            if delta.finished:
                outputs[index] = delta.output
                left -= 1
        if include_usage and all(o is not None for o in outputs):
            yield _event({"id": response_id, "object": obj, "created": created, "model": model_name,
                          "choices": [], "usage": _usage(outputs)})
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:
            t.cancel()
        for rid in ids:
            engine.abort(rid)


def run_server(engine, model_name: str, host: str = "127.0.0.1", port: int = 8000,
               log_level: str = "info") -> None:
    """Serves until interrupted (uvicorn), then closes the engine."""
    import uvicorn

    try:
        uvicorn.run(build_app(engine, model_name), host=host, port=port, log_level=log_level,
                    timeout_graceful_shutdown=5)
    finally:
        engine.close()
