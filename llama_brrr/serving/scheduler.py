"""Continuous batching over the engine's KV slots.

Each call to Scheduler.step() is one engine step:

  1. admit: waiting requests (first come, first served) take free KV space from the allocator;
  2. prefill: the prompts of admitted requests go into their slots in chunks, under the step's token
     budget (max_num_batched_tokens) after the decoding rows are counted, so a long prompt is spread
     over several steps while the running sequences keep getting their tokens;
  3. decode: one engine launch over every sequence whose prompt is in its slot (a sequence that
     just finished its prefill joins in the same step, feeding its last prompt token), n_steps
     rounds of decode + sample (1 while any request waits for its first token or its prefill, so
     admission and time to first token never wait behind a burst);
  4. read: the tokens of the previous step's launch go through the stop rules
     (request.Request.accept) and become the step's events;
  5. retire: finished sequences give their KV space back at once, so a waiting request takes it
     in the next step.

Pipelined (the CUDA default): step 3 enqueues its rounds with engine.decode_launch and returns at
once, and step 4 reads the launch of the step before, so the host's Python (stop rules,
detokenization, events, the next step's admission and block reservation) runs while the GPU
decodes instead of between its launches. A launch cannot know which of the rows it continues
finished in the launch before: it assumes none did (the length rule is known ahead and applied;
only a stop id or string ends a row unannounced), feeds each continued row the token the previous
launch sampled last without reading it (a negative token: decode_launch), and the tokens of a row
that had finished by then are dropped when they arrive, as are those of a row preempted or aborted
since its launch. `ahead` counts a row's rounds in flight: positions, RNG steps, room and block
reservations are those of the row with every launched token accepted. Unpipelined (CPU, or
pipeline=False), step 3 runs engine.decode_steps and step 4 reads that same launch.

Chunk boundaries are fixed multiples of `prefill_chunk` from the start of each prompt, whatever else
runs in the step: a prompt's KV cache (hence its tokens) does not depend on the other requests. The
budget decides only how many chunks run in a step; prefill_chunk <= max_num_batched_tokens -
max_num_seqs guarantees the oldest prefilling request moves by at least one chunk every step.

KV accounting goes through the block manager (block_manager.py): admit gives a request a slot and
its cached prefix blocks, reserve the blocks for its next prefill chunk or decode burst (before each
one), written registers blocks once full, free gives everything back. When reserve refuses a running
sequence, the scheduler first cuts a decode burst to one round, then PREEMPTS the youngest running
request (the latest admitted, possibly the one asking): its blocks and slot go back, it returns to
the front of the waiting queue and, when readmitted, its prompt and generated tokens so far are
prefilled again (recompute; its prefix blocks are often still cached). Its tokens, text and stop
state stay, so a client sees only latency. A request that could not fit the pool even alone is
refused by add() with a ValueError.

The scheduler is single-threaded: one caller (Llama.generate, or AsyncLlama's engine thread)
drives it. A request that produces non-finite logits gets a NonFiniteLogitsError of its own and
leaves; an exception from the engine itself propagates to the caller, which decides (fail_all).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .. import profiler
from ..errors import NonFiniteLogitsError
from ..sampling import engine_rows
from .block_manager import BlockManager, first_chunk_end, sequence_ids
from .request import Request

# Per-step token budget by backend: the CPU prefills ~1-2k tokens/s on small models, so a budget of
# 512 keeps a step (everyone's next token) under about half a second while a long prompt arrives.
DEFAULT_TOKEN_BUDGET = {"cpu": 512, "cuda": 8192}


@dataclass
class Event:
    """What one step did for one request: its new token ids and the text now safe to show."""

    request: Request
    token_ids: list[int]
    text: str

    @property
    def finished(self) -> bool:
        return self.request.finished


def row_room(r: Request, max_seq_len: int) -> int:
    """Decode rounds `r` can still use beyond those in flight: its max_tokens and the context."""
    generated = len(r.token_ids) + r.ahead
    return min(r.params.max_tokens - generated, max_seq_len - len(r.prompt_ids) - generated + 1)


def decode_room(rows: list[Request], max_seq_len: int) -> int:
    """Decode rounds every row can still use."""
    return min(row_room(r, max_seq_len) for r in rows)


@dataclass
class Burst:
    """One engine launch: its rows as launched (slot and preemption count, to recognize a row
    that left since), its rounds, and its results once read ([B, n_steps] Python lists)."""

    rows: list[Request]
    slots: list[int]
    epochs: list[int]
    n_steps: int
    t_launch: float
    tokens: list[list[int]] | None = field(default=None, repr=False)
    logprobs: list[list[float]] | None = field(default=None, repr=False)


def launch_rows(engine, rows: list[Request], n_steps: int, pipelined: bool) -> Burst:
    """n_steps rounds of decode + sample for `rows`, each from its next token and position with
    its rounds in flight counted as accepted; a row with rounds in flight feeds the token its row
    in the newest launch sampled last, on the device (-1 - row). Pipelined: enqueued only
    (engine.decode_launch); else run now (decode_steps) and the results kept in the Burst, as
    Python lists: the per-token loops after this are the host's share of every decode step, so
    they touch no numpy scalars."""
    args = (np.array([-1 - r.flight_row if r.ahead else r.next_token for r in rows], dtype=np.int32),
            np.array([r.slot for r in rows], dtype=np.int32),
            np.array([r.position + r.ahead for r in rows], dtype=np.int32),
            engine_rows([r.engine_row for r in rows]),
            np.array([len(r.token_ids) + r.ahead for r in rows], dtype=np.uint64),
            n_steps)
    burst = Burst(rows, [r.slot for r in rows], [r.preemptions for r in rows], n_steps, time.perf_counter())
    if pipelined:
        engine.decode_launch(*args)
        for i, r in enumerate(rows):
            r.ahead += n_steps
            r.flight_row = i
    else:
        new_tokens, logprobs = engine.decode_steps(*args)
        burst.tokens, burst.logprobs = new_tokens.T.tolist(), logprobs.T.tolist()
    return burst


def read_burst(engine, burst: Burst) -> None:
    """The results of a pipelined launch (the oldest pending one), into the Burst."""
    if burst.tokens is None:
        new_tokens, logprobs = engine.decode_wait()
        burst.tokens, burst.logprobs = new_tokens.T.tolist(), logprobs.T.tolist()


class Scheduler:
    """Runs requests on `engine` (a _C.Engine) by continuous batching; see the module docstring."""

    def __init__(self, engine, *, max_seq_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int | None = None, prefill_chunk: int | None = None,
                 decode_steps: int = 1, allocator=None, pipeline: bool | None = None):
        backend = getattr(engine, "backend", "cpu")
        if pipeline is None:  # a host engine runs its launches at once: nothing to overlap
            pipeline = backend == "cuda"
        if pipeline and not hasattr(engine, "decode_launch"):
            raise ValueError("pipeline=True needs an engine with decode_launch / decode_wait")
        if max_num_batched_tokens is None:
            max_num_batched_tokens = max(DEFAULT_TOKEN_BUDGET.get(backend, 512), 2 * max_num_seqs)
        for name, value in (("max_num_seqs", max_num_seqs), ("decode_steps", decode_steps),
                            ("max_num_batched_tokens", max_num_batched_tokens)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if max_num_batched_tokens <= max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({max_num_batched_tokens}) must exceed "
                             f"max_num_seqs ({max_num_seqs}): a step's budget holds one decode "
                             f"token per running sequence plus at least one prompt token")
        room = max_num_batched_tokens - max_num_seqs
        if prefill_chunk is None:
            prefill_chunk = room
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, (int, np.integer)) \
                or not 1 <= prefill_chunk <= room:
            raise ValueError(f"prefill_chunk must be an integer in [1, max_num_batched_tokens - "
                             f"max_num_seqs = {room}], got {prefill_chunk!r}")
        if decode_steps > 64:
            raise ValueError(f"decode_steps must be at most 64 (the engine's limit), got {decode_steps}")
        self.engine = engine
        self.max_seq_len = int(max_seq_len)
        self.max_num_seqs = int(max_num_seqs)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        self.prefill_chunk = int(prefill_chunk)
        self.decode_steps = int(decode_steps)
        self.allocator = (allocator if allocator is not None
                          else BlockManager(engine, max_num_seqs, max_seq_len))
        self.pipeline = bool(pipeline)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the youngest
        self.in_flight: deque[Burst] = deque()  # launched, results not read yet (oldest first)
        self._decode_span_end = 0.0
        self.steps = 0
        self.preemptions = 0

    # ---- queue --------------------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queues `request`; ValueError if it could never fit the KV pool, even alone."""
        self.allocator.check_fits(len(request.prompt_ids), request.params.max_tokens)
        if not request.t_call:
            request.t_call = time.perf_counter()
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.in_flight)

    def abort(self, request: Request) -> bool:
        """Takes `request` out now (its slot is free for the next step); False if it was not here."""
        if request in self.running:
            self.running.remove(request)
            self.allocator.free(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            return False
        if not request.finished:
            request.finish_reason = "abort"
            request.t_done = time.perf_counter()
        self._drop_flight_if_idle()
        return True

    def fail_all(self, error: BaseException) -> list[Request]:
        """Every request here ends with `error` and leaves (the engine raised mid-step)."""
        failed = list(self.running) + list(self.waiting)
        now = time.perf_counter()
        for r in self.running:
            self.allocator.free(r)
        self.running.clear()
        self.waiting.clear()
        self._drop_flight_if_idle()
        for r in failed:
            if not r.finished:
                r.error = error
                r.t_done = now
        return failed

    def usage(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting),
                "preemptions": self.preemptions, **self.allocator.usage()}

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[Event]:
        self.steps += 1
        self._admit()
        budget = self.max_num_batched_tokens
        # A row whose launched rounds reach its max_tokens or the context needs no more: the
        # length rule ends it when they are read.
        decoding = [r for r in self.running
                    if r.prefilled == r.prefill_target and row_room(r, self.max_seq_len) > 0]
        budget -= len(decoding)
        budget = self._prefill(budget, decoding)
        launched = self._launch(decoding) if decoding else None
        events = []
        # Every launch but this step's (pipelined: it runs while this loop reads the one before).
        while self.in_flight and (self.in_flight[0] is not launched or not self.pipeline):
            events.extend(self._read(self.in_flight.popleft()))
        self._retire()
        self._drop_flight_if_idle()
        return events

    def _drop_flight_if_idle(self) -> None:
        """With nothing running, launches still in flight hold only rows that have left (finished
        by a stop id, aborted): forgotten, so the engine has nothing pending for its next user."""
        if self.in_flight and not self.running:
            self.in_flight.clear()
            self.engine.decode_discard()

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            # A slot, the cached prefix and the blocks of the first chunk (or first decode row).
            if not self.allocator.admit(request, self.prefill_chunk):
                break
            self.waiting.popleft()
            if not request.t_admit:
                request.t_admit = time.perf_counter()
            self.running.append(request)

    def _chunk(self, r: Request) -> int:
        """The size of r's next prefill chunk: chunks end at multiples of prefill_chunk from the
        sequence's start, wherever a cached prefix left off, so a prompt's KV cache never depends
        on what ran beside it or on what was cached."""
        return first_chunk_end(r.prefilled, r.prefill_target, self.prefill_chunk) - r.prefilled

    def _preempt(self) -> Request:
        """Takes the youngest running request back to the front of the waiting queue."""
        victim = self.running.pop()
        self.allocator.free(victim)
        victim.reset_for_recompute()
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    def _reserve(self, r: Request, n_positions: int) -> bool:
        """Blocks for r's next n_positions, preempting the youngest requests until they fit; False
        when r itself was preempted."""
        while not self.allocator.reserve(r, n_positions):
            if self._preempt() is r:
                return False
        return True

    def _prefill(self, budget: int, decoding: list[Request]) -> int:
        """Prompt chunks of the admitted requests, oldest first, while the budget lasts, run
        together through engine.prefill_many (the chunks of a step share one pass's weight
        reads); a request whose prompt is then in its slot joins `decoding`. A request about to
        need a block that a queued chunk is writing (requests admitted together with one that
        prefills their common system prompt) runs the queue first, so it can share that block."""
        t_prefill = profiler.mark()
        pending: list[list] = []  # [request, slot, start, n]: this step's chunks, one run per request
        done = 0

        def flush():
            nonlocal done
            # A request preempted after queueing a chunk gave its slot back: drop the chunk.
            live = [p for p in pending if p[0].slot == p[1]]
            pending.clear()
            if not live:
                return
            ids = [sequence_ids(r)[start:start + n] for r, _, start, n in live]
            self.engine.prefill_many(np.array([p[1] for p in live], dtype=np.int32),
                                     np.array([p[2] for p in live], dtype=np.int32),
                                     np.array([p[3] for p in live], dtype=np.int32),
                                     np.asarray(np.concatenate(ids), dtype=np.int32))
            for r, *_ in live:
                self.allocator.written(r)
            done += sum(p[3] for p in live)

        for r in list(self.running):
            if r.slot is None:  # preempted for an older request's chunk in this step
                break
            target = r.prefill_target
            if r.prefilled == target:
                continue
            while r.prefilled < target:
                if not pending or pending[-1][0] is not r:
                    if self._needs_queued_block(r, pending):
                        flush()
                    # Blocks registered so far; the chunks in `pending` register after their pass.
                    self.allocator.extend_prefix(r)
                    if r.prefilled == target:  # the cache held the rest: only the decode row is left
                        budget -= 1
                        break
                n = self._chunk(r)
                cost = n + (1 if r.prefilled + n == target else 0)  # the last chunk brings a decode row
                if cost > budget:
                    break
                if not self._reserve(r, n):
                    break
                if pending and pending[-1][0] is r:
                    pending[-1][3] += n
                else:
                    pending.append([r, r.slot, r.prefilled, n])
                r.prefilled += n
                budget -= cost
            if r.slot is None or r.prefilled < target:
                break  # first come, first served: no younger prompt passes one left waiting
            decoding.append(r)
        flush()
        if done:
            profiler.record_span("prefill", "prefill", t_prefill, done)
        return budget

    def _needs_queued_block(self, r: Request, pending: list[list]) -> bool:
        """Whether r's next prompt block (one the cache could give it) is being written by a queued
        chunk of a request with the same tokens up to there."""
        block = self.allocator.block_size
        if not pending or not self.allocator.enable_prefix_caching or r.prefilled % block:
            return False
        end = r.prefilled + block
        ids = sequence_ids(r)
        if end > len(ids) - 1:  # only blocks wholly before the last token are shared
            return False
        return any(start <= r.prefilled and start + n >= end and sequence_ids(q)[:end] == ids[:end]
                   for q, _, start, n in pending)

    def _launch(self, decoding: list[Request]) -> Burst | None:
        decoding[:] = [r for r in decoding if r.slot is not None]  # preempted by a prefill chunk
        if not decoding:
            return None
        for r in decoding:
            if not r.token_ids and not r.ahead:
                r.next_token = r.prompt_ids[-1]
                r.position = len(r.prompt_ids) - 1
        # Bursts of decode_steps rounds only when nobody waits for a first token or a prefill.
        pending = bool(self.waiting) and len(self.running) < self.max_num_seqs
        pending = pending or any(r.prefilled < r.prefill_target for r in self.running)
        pending = pending or not all(r.token_ids for r in decoding)
        n_steps = 1 if pending else self.decode_steps
        n_steps = max(1, min(decode_room(decoding, self.max_seq_len), n_steps))
        for r in list(decoding):  # oldest first: the youngest are preempted for them
            # A decoding row has written positions [0, position) and has `ahead` more in flight:
            # its blocks may already cover the burst (kv_end, kept by the block manager), as they
            # do for 15 steps in 16.
            if r.slot is None or r.position + r.ahead + n_steps <= r.kv_end:
                continue
            if n_steps > 1 and not self.allocator.reserve(r, r.ahead + n_steps):
                n_steps = 1  # a shorter burst before anyone is preempted
            self._reserve(r, r.ahead + n_steps)
        decoding[:] = [r for r in decoding if r.slot is not None]
        if not decoding:
            return None
        burst = launch_rows(self.engine, decoding, n_steps, self.pipeline)
        self.in_flight.append(burst)
        return burst

    def _read(self, burst: Burst) -> list[Event]:
        """A launch's tokens through each row's stop rules; rows that left since the launch
        (finished, preempted, aborted) are skipped."""
        read_burst(self.engine, burst)
        now = time.perf_counter()
        # The decode span runs from the launch, or from the end of the previous one, so
        # overlapping launches do not count the same wall time twice.
        t_decode = max(burst.t_launch, self._decode_span_end)
        events, accepted = [], 0
        block = self.allocator.block_size
        n_launched = burst.n_steps
        for r, slot, epoch, tokens_i, logprobs_i in zip(burst.rows, burst.slots, burst.epochs,
                                                        burst.tokens, burst.logprobs):
            if r.slot != slot or r.preemptions != epoch or r.finished:
                continue
            if self.pipeline:
                r.ahead -= n_launched
            first_block = r.position // block
            # The sampler's log-softmax of the chosen token is NaN or inf exactly when the step's
            # logits are not all finite. One sum tests the row (it is finite when every value is,
            # barring an overflow, which the scan then clears); the tokens before the first bad
            # one still count.
            bad = len(tokens_i)
            if not math.isfinite(sum(logprobs_i)):
                bad = next((j for j, logprob in enumerate(logprobs_i) if not math.isfinite(logprob)), bad)
            taken, text = 0, ""
            if bad:
                if not r.token_ids:
                    r.t_first = now
                taken, text = r.accept_run(tokens_i[:bad], logprobs_i[:bad], self.max_seq_len)
                r.token_times.extend([now] * taken)
                accepted += taken
            # every accepted token but one that finished the request is fed to the next step
            fed = taken - 1 if r.finish_reason is not None else taken
            if fed:
                r.next_token = tokens_i[fed - 1]
                r.position += fed
            if r.finish_reason is not None:
                r.t_done = now
            elif taken == bad < len(tokens_i):
                r.error = NonFiniteLogitsError(
                    f"generation step {len(r.token_ids)} of sequence {r.index} (prompt "
                    f"{r.index} of this call) produced non-finite logits (NaN or inf; the "
                    f"chosen token's log-probability is {logprobs_i[bad]}); nothing was sampled "
                    f"from them. The model's weights or inputs are damaged (check the file with "
                    f"a fresh download)")
                r.t_done = now
            # New full blocks to register only when the row crossed a block boundary; a finished
            # row registers its last ones when it is freed.
            if r.position // block != first_block:
                self.allocator.written(r)
            events.append(Event(r, tokens_i[:taken], text))
        self._decode_span_end = time.perf_counter()
        profiler.record_span("decode", "decode", t_decode, accepted)
        return events

    def _retire(self) -> None:
        done = [r for r in self.running if r.finished]
        for r in done:
            self.allocator.free(r)
        if done:
            self.running = [r for r in self.running if not r.finished]
