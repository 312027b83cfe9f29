"""The serving metrics /metrics shows, in Prometheus' text exposition format (version 0.0.4).

Written by hand rather than through prometheus_client: a few counters, gauges and histograms need
no dependency. The engine thread records (observe / count), the HTTP thread renders; one lock.

    llama_brrr_requests_running / _waiting                  gauges: scheduler queues
    llama_brrr_kv_slots_used / _total                       gauges: engine KV slots
    llama_brrr_kv_positions_used / _total                   gauges: KV positions written / held
    llama_brrr_kv_blocks_used / _total                      gauges: the paged KV pool's blocks
    llama_brrr_preemptions_total                            counter: requests preempted (recomputed)
    llama_brrr_prefix_cache_queries_total / _hits_total     counters: prompt tokens looked up / hit
    llama_brrr_prompt_tokens_total, _generation_tokens_total counters
    llama_brrr_requests_total{finish_reason=...}            counter: finished requests
    llama_brrr_time_to_first_token_seconds                  histogram: submission -> first token
    llama_brrr_inter_token_latency_seconds                  histogram: between a request's tokens
    llama_brrr_e2e_request_latency_seconds                  histogram: submission -> last token
"""

from __future__ import annotations

import bisect
import threading

PREFIX = "llama_brrr_"
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                120.0, 240.0, 480.0, 960.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, cumulative = [], 0
        for bound, n in zip(self.buckets + (float("inf"),), self.counts):
            cumulative += n
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            out.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
        out.append(f"{name}_sum {self.sum!r}")
        out.append(f"{name}_count {self.count}")
        return out


class ServingMetrics:
    """What the async engine records; render() is the /metrics body."""

    GAUGES = {
        "requests_running": "requests holding a KV slot (prefilling or decoding)",
        "requests_waiting": "requests queued for a KV slot",
        "kv_slots_used": "engine KV slots in use",
        "kv_slots_total": "engine KV slots",
        "kv_positions_used": "KV cache positions written by running requests",
        "kv_positions_total": "KV cache positions the pool holds",
        "kv_blocks_used": "KV cache blocks referenced by running requests",
        "kv_blocks_total": "KV cache blocks in the pool",
    }
    # Counters the scheduler and block manager keep themselves; /metrics shows their last values.
    USAGE_COUNTERS = {
        "preemptions": "requests preempted for KV blocks (recomputed later)",
        "prefix_cache_queries": "prompt tokens looked up in the prefix cache",
        "prefix_cache_hits": "prompt tokens whose KV came from the prefix cache",
    }

    def __init__(self):
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.ttft = Histogram(_TTFT_BUCKETS)
        self.itl = Histogram(_ITL_BUCKETS)
        self.e2e = Histogram(_E2E_BUCKETS)
        self.gauges = {name: 0 for name in self.GAUGES}
        self.usage_counters = {name: 0 for name in self.USAGE_COUNTERS}

    def first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        with self._lock:
            self.ttft.observe(ttft_s)
            self.prompt_tokens += prompt_tokens

    def tokens(self, n: int, gaps: list[float]) -> None:
        with self._lock:
            self.generation_tokens += n
            for gap in gaps:
                self.itl.observe(gap)

    def request_done(self, finish_reason: str, e2e_s: float) -> None:
        with self._lock:
            self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
            self.e2e.observe(e2e_s)

    def set_usage(self, usage: dict) -> None:
        with self._lock:
            self.gauges = {"requests_running": usage["running"],
                           "requests_waiting": usage["waiting"],
                           "kv_slots_used": usage["slots_used"],
                           "kv_slots_total": usage["slots_total"],
                           "kv_positions_used": usage["kv_positions_used"],
                           "kv_positions_total": usage["kv_positions_total"],
                           "kv_blocks_used": usage["kv_blocks_used"],
                           "kv_blocks_total": usage["kv_blocks_total"]}
            self.usage_counters = {name: usage[name] for name in self.USAGE_COUNTERS}

    def render(self) -> str:
        with self._lock:
            lines = []
            for name, text in self.GAUGES.items():
                lines += [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} gauge",
                          f"{PREFIX}{name} {self.gauges[name]}"]
            for name, text, value in (
                    ("prompt_tokens", "prompt tokens processed", self.prompt_tokens),
                    ("generation_tokens", "tokens generated", self.generation_tokens),
                    *((name, text, self.usage_counters[name])
                      for name, text in self.USAGE_COUNTERS.items())):
                lines += [f"# HELP {PREFIX}{name}_total {text}", f"# TYPE {PREFIX}{name}_total counter",
                          f"{PREFIX}{name}_total {value}"]
            lines += [f"# HELP {PREFIX}requests_total finished requests by finish reason",
                      f"# TYPE {PREFIX}requests_total counter"]
            for reason in sorted(set(self.finished) | {"stop", "length", "abort", "error"}):
                lines.append(f'{PREFIX}requests_total{{finish_reason="{reason}"}} '
                             f'{self.finished.get(reason, 0)}')
            for name, text, hist in (
                    ("time_to_first_token_seconds", "submission to first token", self.ttft),
                    ("inter_token_latency_seconds", "time between a request's tokens", self.itl),
                    ("e2e_request_latency_seconds", "submission to last token", self.e2e)):
                lines += [f"# HELP {PREFIX}{name} {text}", f"# TYPE {PREFIX}{name} histogram"]
                lines += hist.lines(PREFIX + name)
            return "\n".join(lines) + "\n"
