"""Serving: the continuous-batching scheduler, the async engine and the OpenAI-compatible server.

    scheduler.py     Scheduler: which sequences decode and which prompt chunks prefill each
                     step, preemption when KV blocks run out
    block_manager.py BlockManager: slots, the paged KV cache's block tables, prefix caching
    request.py       Request (one sequence in flight, its stop rules) and RequestOutput
    async_engine.py  AsyncLlama: the scheduler on its own thread, requests from any thread or
                     event loop, tokens streamed back per request, abort
    metrics.py       the Prometheus counters, gauges and histograms /metrics shows
    server.py        the FastAPI app (OpenAI's /v1/completions, /v1/chat/completions, SSE) and
                     `llama-brrr serve`
"""

from .request import Request, RequestOutput
from .block_manager import BlockManager
from .scheduler import Scheduler


def __getattr__(name):
    # The async engine imports the model module, which imports this package: load it on demand.
    if name == "AsyncLlama":
        from .async_engine import AsyncLlama
        return AsyncLlama
    raise AttributeError(f"module 'llama_brrr.serving' has no attribute {name!r}")


__all__ = ["AsyncLlama", "BlockManager", "Request", "RequestOutput", "Scheduler"]
