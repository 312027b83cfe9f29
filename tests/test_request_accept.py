"""Request.accept_run (the scheduler's per-row step over a decode burst) against one accept() per
token: the same tokens taken, the same text shown, the same finish, on random bursts with stop ids,
max_tokens and context limits, multi-byte characters split across tokens, and stop strings (which
take the per-token path)."""

import numpy as np
import pytest

from llama_brrr.model import _ByteStreamDecoder
from llama_brrr.sampling import SamplingParams
from llama_brrr.serving.request import Request

N_SPECIAL = 3  # token t >= 3 is byte t - 3
STOP_ID = ord("!") + N_SPECIAL  # a stop id with text of its own, which must never be shown


def make(prompt_len, max_tokens, stop=()):
    params = SamplingParams(max_tokens=max_tokens, stop=list(stop))
    return Request(None, list(range(10, 10 + prompt_len)), params, 0, _ByteStreamDecoder(N_SPECIAL),
                   frozenset({STOP_ID}))


def state(r):
    return (r.token_ids, r.logprobs, r.text, r.emitted, r.finish_reason)


def random_burst(rng, n):
    # bytes of ASCII and of a 3-byte character, now and then the stop id
    choices = [ord("a") + N_SPECIAL, ord(" ") + N_SPECIAL, 0xE2 + N_SPECIAL, 0x82 + N_SPECIAL, 0xAC + N_SPECIAL]
    tokens = [int(rng.choice(choices)) for _ in range(n)]
    if rng.random() < 0.4:
        tokens[int(rng.integers(0, n))] = STOP_ID
    return tokens, [float(-rng.random()) for _ in range(n)]


@pytest.mark.parametrize("stop", [(), ("a a",), ("€",)])
def test_a_run_accepts_like_one_token_at_a_time(rng, stop):
    for _ in range(300):
        prompt_len, max_tokens = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        max_seq_len = prompt_len + int(rng.integers(1, 45))
        one, run = make(prompt_len, max_tokens, stop), make(prompt_len, max_tokens, stop)
        shown_one, shown_run = [], []
        while one.finish_reason is None:
            tokens, logprobs = random_burst(rng, int(rng.integers(1, 17)))
            taken_one = 0
            for token, logprob in zip(tokens, logprobs):
                shown_one.append(one.accept(token, logprob, max_seq_len))
                taken_one += 1
                if one.finish_reason is not None:
                    break
            taken, text = run.accept_run(tokens, logprobs, max_seq_len)
            shown_run.append(text)
            assert taken == taken_one
            assert state(run) == state(one)
        assert "".join(shown_run) == "".join(shown_one)
        assert len(run.token_ids) <= max_tokens and prompt_len + len(run.token_ids) <= max(max_seq_len, prompt_len + 1)
