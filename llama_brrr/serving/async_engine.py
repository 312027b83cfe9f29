"""AsyncLlama: the scheduler on its own thread, fed from any thread or event loop.

    engine = AsyncLlama(Llama.from_pretrained(), max_num_seqs=8)
    async for delta in engine.generate("Hello", SamplingParams(max_tokens=32), request_id="a"):
        print(delta.text, end="")
    engine.abort("a")        # from anywhere; its slot is free by the next step

The engine thread loops: take new submissions and aborts (under one lock), run one Scheduler.step()
(the engine calls release the GIL, so an HTTP event loop keeps running beside it), and hand each
request's new tokens to the event loop that submitted it (call_soon_threadsafe into a per-request
asyncio.Queue). It sleeps on a condition variable when there is nothing to do.

Faults: an exception from the engine in a step ends every request then in the scheduler with that
exception (each waiting caller sees it raised; none hangs), and the loop goes on with the next
submissions. A request whose logits turn non-finite gets its own NonFiniteLogitsError. A stream
whose consumer goes away (break, cancellation, a closed HTTP connection) aborts its request.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass

from ..sampling import SamplingParams
from .metrics import ServingMetrics
from .request import Request, RequestOutput


@dataclass
class StreamDelta:
    """What one engine step produced for one request.

    text: the new visible text (may be empty: held back as the possible start of a stop string, or
    half a UTF-8 character); token_ids / logprobs: the new tokens (logprobs only if asked);
    finish_reason: None while running, then "stop", "length" or "abort"; output: the complete
    RequestOutput on the last delta."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str | None
    output: RequestOutput | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineClosedError(RuntimeError):
    """The AsyncLlama was closed while the request waited or ran."""


class _Handle:
    __slots__ = ("request", "loop", "queue", "done")

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.done = False


class RequestStream:
    """The deltas of one submitted request: `async for delta in stream`. Leaving the loop early
    (break, an exception, cancellation) aborts the request."""

    def __init__(self, engine: "AsyncLlama", handle: _Handle):
        self._engine = engine
        self._handle = handle
        self.request_id = handle.request.request_id
        self.request = handle.request

    def __aiter__(self):
        return self._deltas()

    async def _deltas(self):
        finished = False
        try:
            while True:
                item = await self._handle.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._engine.abort(self.request_id)

    async def result(self) -> RequestOutput:
        """Waits for the whole request; its RequestOutput."""
        async for delta in self:
            if delta.finished:
                return delta.output
        raise EngineClosedError("the request ended without a result")


class AsyncLlama:
    """An engine loop over one Llama (which it holds exclusively until close())."""

    _ids = itertools.count()

    def __init__(self, llm, *, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None, prefill_chunk: int | None = None,
                 decode_steps: int | None = None, pipeline: bool | None = None, owns_model: bool = False):
        self.llm = llm
        self.scheduler = llm.make_scheduler(max_num_seqs=max_num_seqs,
                                            max_num_batched_tokens=max_num_batched_tokens,
                                            prefill_chunk=prefill_chunk, decode_steps=decode_steps,
                                            pipeline=pipeline)
        if llm._busy:
            from ..model import _BUSY_MESSAGE
            raise RuntimeError(_BUSY_MESSAGE)
        llm._busy = True  # the engine thread owns the KV slots; Llama.generate would clash
        self.metrics = ServingMetrics()
        self._owns_model = owns_model
        self._lock = threading.Condition()
        self._submitted: deque[_Handle] = deque()
        self._aborts: deque[str] = deque()
        self._handles: dict[str, _Handle] = {}
        self._closed = False
        self.steps = 0
        self.errors = 0
        self._usage = self.scheduler.usage()
        self.metrics.set_usage(self._usage)
        self._thread = threading.Thread(target=self._loop, name="llama-brrr-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(cls, path: str | None = None, *, max_num_seqs: int | None = None,
                        max_num_batched_tokens: int | None = None, decode_steps: int | None = None,
                        **load_kwargs) -> "AsyncLlama":
        """Loads a model (Llama.from_pretrained's arguments; max_batch defaults to max_num_seqs)
        and runs it; close() frees it."""
        from ..model import Llama

        load_kwargs.setdefault("max_batch", max_num_seqs)
        llm = Llama.from_pretrained(path, **load_kwargs)
        return cls(llm, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                   decode_steps=decode_steps, owns_model=True)

    # ---- requests -------------------------------------------------------------------------------

    def make_request(self, prompt=None, sampling_params: SamplingParams | None = None, *,
                     messages=None, **kwargs) -> Request:
        """A checked request from a prompt (str or token ids) or chat messages; raises ValueError
        (the same checks as Llama.generate / Llama.chat) before anything is queued."""
        params = SamplingParams.from_kwargs(sampling_params, kwargs)
        if (prompt is None) == (messages is None):
            raise ValueError("give a prompt or chat messages (one of them)")
        if messages is not None:
            return self.llm._make_request(*self.llm._chat_prompt(messages), params)
        prompts = self.llm._prompts(prompt)
        if len(prompts) != 1:
            raise ValueError(f"one request takes one prompt, got {len(prompts)}")
        return self.llm._make_request(*prompts[0], params)

    def submit(self, request: Request, request_id: str | None = None) -> RequestStream:
        """Queues a request (thread-safe; call from a running event loop, which gets its deltas)."""
        loop = asyncio.get_running_loop()
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        request.request_id = request_id
        request.t_call = time.perf_counter()
        handle = _Handle(request, loop)
        with self._lock:
            if self._closed:
                raise EngineClosedError("this AsyncLlama is closed")
            if request_id in self._handles:
                raise ValueError(f"request_id {request_id!r} is already running")
            self._handles[request_id] = handle
            self._submitted.append(handle)
            self._lock.notify()
        return RequestStream(self, handle)

    async def generate(self, prompt, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, **kwargs):
        """Yields a StreamDelta per engine step that gave this request tokens; the last one holds
        the RequestOutput. Bad arguments raise ValueError at the first iteration."""
        request = self.make_request(prompt, sampling_params, **kwargs)
        async for delta in self.submit(request, request_id):
            yield delta

    def abort(self, request_id: str) -> None:
        """Cancels a request (thread-safe): it leaves the scheduler before the next step, and its
        stream ends with finish_reason "abort". Unknown or finished ids are ignored."""
        with self._lock:
            if request_id in self._handles:
                self._aborts.append(request_id)
                self._lock.notify()

    def usage(self) -> dict:
        """running / waiting requests, slots and KV positions in use, as of the last step."""
        return dict(self._usage)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._closed

    # ---- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the loop; requests still queued or running end with EngineClosedError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self.llm._busy = False
        if self._owns_model:
            self.llm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    # ---- the engine thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        scheduler = self.scheduler
        while True:
            with self._lock:
                while not (self._closed or self._submitted or self._aborts or scheduler.has_work()):
                    self._lock.wait()
                if self._closed:
                    break
                submitted, self._submitted = list(self._submitted), deque()
                aborts, self._aborts = list(self._aborts), deque()
            for handle in submitted:
                scheduler.add(handle.request)
            for request_id in aborts:
                handle = self._handles.get(request_id)
                if handle is not None and scheduler.abort(handle.request):
                    self._finish(handle, None)
            if scheduler.has_work():
                try:
                    events = scheduler.step()
                    self.steps += 1
                except Exception as error:  # the engine failed mid-step: nobody may hang on it
                    self.errors += 1
                    for request in scheduler.fail_all(error):
                        self._fail(request, error)
                    events = []
                for event in events:
                    self._deliver(event)
            self._usage = scheduler.usage()
            self._usage["waiting"] += len(self._submitted)
            self.metrics.set_usage(self._usage)
        closed = EngineClosedError("the AsyncLlama was closed before this request finished")
        for request in scheduler.fail_all(closed):
            self._fail(request, closed)
        with self._lock:
            pending = list(self._submitted) + list(self._handles.values())
            self._submitted.clear()
        for handle in pending:
            if not handle.done:
                handle.request.error = closed
                self._fail(handle.request, closed)

    def _deliver(self, event) -> None:
        request = event.request
        handle = self._handles.get(request.request_id)
        if handle is None:
            return
        if request.error is not None:
            self._fail(request, request.error)
            return
        if event.token_ids:
            n_before = len(request.token_ids) - len(event.token_ids)
            if n_before == 0:
                self.metrics.first_token(request.t_first - request.t_call, len(request.prompt_ids))
            times = request.token_times
            gaps = [times[i] - times[i - 1] for i in range(max(1, n_before), len(times))]
            self.metrics.tokens(len(event.token_ids), gaps)
        if request.finished:
            self._finish(handle, event)
            return
        logprobs = request.logprobs[-len(event.token_ids):] if request.params.logprobs else None
        self._put(handle, StreamDelta(request.request_id, event.text, event.token_ids, logprobs, None))

    def _finish(self, handle: _Handle, event) -> None:
        request = handle.request
        n_new = len(event.token_ids) if event is not None else 0
        text = event.text if event is not None else ""
        logprobs = (request.logprobs[len(request.logprobs) - n_new:]
                    if request.params.logprobs else None)
        output = request.output()
        self.metrics.request_done(output.finish_reason, request.t_done - request.t_call)
        delta = StreamDelta(request.request_id, text,
                            list(event.token_ids) if event is not None else [], logprobs,
                            output.finish_reason, output)
        self._put(handle, delta)
        self._release(handle)

    def _fail(self, request: Request, error: BaseException) -> None:
        handle = self._handles.get(request.request_id)
        if handle is None or handle.done:
            return
        self.metrics.request_done("error", time.perf_counter() - request.t_call)
        self._put(handle, error)
        self._release(handle)

    def _release(self, handle: _Handle) -> None:
        handle.done = True
        with self._lock:
            if self._handles.get(handle.request.request_id) is handle:
                del self._handles[handle.request.request_id]

    def _put(self, handle: _Handle, item) -> None:
        try:
            handle.loop.call_soon_threadsafe(handle.queue.put_nowait, item)
        except RuntimeError:  # that event loop is closed: nobody is listening any more
            if not isinstance(item, BaseException) and not item.finished:
                self.abort(handle.request.request_id)
