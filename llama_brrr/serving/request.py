"""One request in flight and its result: what the scheduler, Llama.generate and the server share.

A Request holds its prompt ids, SamplingParams, the tokens generated so far and the visible text.
`accept` applies the stop rules to each sampled token (EOS and stop ids, stop strings, max_tokens,
the context) and returns the text that is safe to show: never half a UTF-8 character, never the
start of what may become a stop string; `accept_run` does the same for a decode burst's tokens at
once (the scheduler's per-row step). `output` turns a finished request into a RequestOutput.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sampling import SamplingParams


@dataclass
class RequestOutput:
    """The result of one request.

    text excludes the prompt, end-of-sequence/stop tokens and any stop string; token_ids are the
    generated ids (including a final EOS or stop token id, as vLLM does). finish_reason is "stop"
    (EOS, stop token or stop string), "length" (max_tokens or the context limit) or "abort" (the
    request was cancelled before it finished).

    timings (seconds; rates in tokens/s):
      prompt_tokens, generated_tokens
      ttft_s     from the submission (the generate() call) to this request's first token
      prefill_s  from the request's admission into a KV slot to its first token
      decode_s   from the first token to the last (generated_tokens - 1 decode steps)
      total_s    from the submission to the end of this request
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


class Request:
    """One sequence: prompt, parameters, generated tokens, visible text and its place in the KV cache.

    Scheduler state: `slot` (None until admitted), `prefilled` (tokens already in the KV cache,
    counted from position 0, shared prefix blocks included; the last prompt token is fed by the
    first decode step, so prefill covers prompt[:-1], `prefill_target` tokens), `next_token` /
    `position` (what the next decode step feeds, and where, counting accepted tokens only),
    `ahead` (decode rounds launched whose tokens the scheduler has not read yet) and `flight_row`
    (the request's row in the newest launch, which the next launch continues on the device).
    """

    def __init__(self, prompt_text, prompt_ids: list[int], params: SamplingParams, seed: int,
                 decoder, stop_ids: frozenset, request_id=None):
        self.request_id = request_id
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
        self.error: BaseException | None = None
        self.cut_by_stop_string = False
        self.slot: int | None = None
        self.prefilled = 0
        # Tokens prefill covers: the prompt but its last token, which the first decode step feeds;
        # after a preemption, the whole sequence so far but its last token (reset_for_recompute).
        self.prefill_target = len(prompt_ids) - 1
        self.preemptions = 0
        self.position = 0
        self.next_token = 0
        self.ahead = 0
        self.flight_row = -1
        # Positions the slot's KV blocks cover (the block manager keeps it), so a decode step
        # needs no call to learn that a row's blocks already hold its next tokens.
        self.kv_end = 0
        # The engine's sampling record, fixed for the request's life (built once, not per step).
        self.engine_row = params.engine_row(seed)
        self.index = 0  # position among the prompts of its call, for error messages
        self.t_call = self.t_admit = self.t_first = self.t_done = 0.0
        self.token_times: list[float] = []  # when each token was sampled (inter-token latency)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def reset_for_recompute(self) -> None:
        """After a preemption (its KV blocks taken back): the sequence so far, prompt and generated
        tokens, is prefilled again when it is readmitted, all but the token the next decode step
        feeds (its last one). Generated tokens, text and stop-string state stay as they are, so the
        client sees only a delay."""
        self.slot = None
        self.prefilled = 0
        self.ahead = 0  # the rounds in flight are dropped when they arrive
        if self.token_ids:
            self.prefill_target = len(self.prompt_ids) + len(self.token_ids) - 1
        self.preemptions += 1

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

    def accept_run(self, tokens: list[int], logprobs: list[float], max_seq_len: int) -> tuple[int, str]:
        """accept() over `tokens` in order, stopping after the one that finishes the request:
        (how many it took, the text now safe to show), the same as one accept() per token. Without
        stop strings the stop rules need no text, so the run is cut once (the first stop id, or
        the max_tokens / context limit) and its lists extended at once: this is the host's work
        per decoded token."""
        if self.max_stop_len or self.finish_reason is not None:
            text, taken = [], 0
            for token, logprob in zip(tokens, logprobs):
                text.append(self.accept(token, logprob, max_seq_len))
                taken += 1
                if self.finish_reason is not None:
                    break
            return taken, "".join(text)
        n_gen = len(self.token_ids)
        limit = min(self.params.max_tokens - n_gen, max_seq_len - len(self.prompt_ids) - n_gen)
        limit = max(limit, 1)  # the first token is always taken (and finishes a full context)
        taken, reason = len(tokens), None
        stop_ids = self.stop_ids
        for j, token in enumerate(tokens):
            if token in stop_ids:
                taken, reason = j + 1, "stop"
                break
        # the length rule finishes token `limit` unless a stop id came first (a stop id that is
        # itself token `limit` is checked first, as in accept)
        if taken > limit or (reason is None and taken == limit):
            taken, reason = limit, "length"
        run = tokens[:taken]
        self.token_ids.extend(run)
        self.logprobs.extend(logprobs[:taken])
        if self.decoder is not None:
            push = self.decoder.push
            shown = run[:-1] if reason == "stop" else run
            self.text += "".join([push(token) for token in shown])
        if reason is not None:
            self.finish_reason = reason
            if self.decoder is not None:
                self.text += self.decoder.flush()
        piece = self.text[self.emitted:]
        self.emitted = len(self.text)
        return taken, piece

    def _append_text(self, piece: str) -> None:
        if not piece:
            return
        if not self.max_stop_len:  # no stop strings: nothing to search
            self.text += piece
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
        if self.max_stop_len <= 1:  # no stop strings, or only 1-character ones: no proper prefix
            return 0
        for n in range(min(self.max_stop_len - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.params.stop):
                return n
        return 0

    def output(self) -> RequestOutput:
        n_prompt, n_gen = len(self.prompt_ids), len(self.token_ids)
        t_first = self.t_first if n_gen else self.t_done
        prefill_s = max(0.0, t_first - self.t_admit) if self.t_admit else 0.0
        decode_s = self.t_done - t_first
        timings = {
            "prompt_tokens": n_prompt,
            "generated_tokens": n_gen,
            "ttft_s": t_first - self.t_call,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "total_s": self.t_done - self.t_call,
            "prefill_tok_s": n_prompt / prefill_s if prefill_s > 0 else 0.0,
            "decode_tok_s": (n_gen - 1) / decode_s if decode_s > 0 else 0.0,
        }
        return RequestOutput(prompt=self.prompt_text, prompt_token_ids=list(self.prompt_ids),
                             text=self.text, token_ids=list(self.token_ids),
                             finish_reason=self.finish_reason or "abort",
                             logprobs=list(self.logprobs) if self.params.logprobs else None,
                             timings=timings)
