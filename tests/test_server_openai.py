"""The OpenAI-compatible server, driven by the official `openai` client (and raw HTTP where the
client hides what is checked: SSE framing, malformed bodies, disconnects).

The server runs in this process: uvicorn on a thread, on a free port, in front of an AsyncLlama over
a tiny random model (byte-level tokenizer); greedy answers are checked against offline
Llama.generate / Llama.chat on an identical second model. One test serves the default model when
it is on disk.
"""

import asyncio
import http.client
import json
import re
import socket
import threading
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from llama_brrr import Llama, ModelConfig  # noqa: E402
from llama_brrr.serving.async_engine import AsyncLlama  # noqa: E402
from llama_brrr.serving.server import build_app  # noqa: E402

TINY = dict(dim=48, hidden_dim=80, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
            max_seq_len=128, name="tiny")
MODEL = "tiny-random"


def make_tiny(max_batch=4) -> Llama:
    config = ModelConfig(**TINY)
    llm = Llama.random(config, seed=0, device="cpu", max_batch=max_batch, n_threads=1)
    head = np.random.default_rng(1000).normal(0.0, 1.0, (config.vocab_size, config.dim))
    llm.engine.set_weight("output", head.astype(np.float32), "f32")
    return llm


class Served:
    """An AsyncLlama behind uvicorn on a thread."""

    def __init__(self, engine: AsyncLlama, name: str):
        self.engine = engine
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        config = uvicorn.Config(build_app(engine, name), host="127.0.0.1", port=self.port,
                                log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        end = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < end, "uvicorn did not start"
            time.sleep(0.01)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.client = openai.OpenAI(base_url=self.base_url, api_key="none", max_retries=0)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.close()

    def raw(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                       **(headers or {})})
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        return response.status, payload

    def wait_idle(self, timeout=5.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            u = self.engine.usage()
            if u["running"] == 0 and u["waiting"] == 0 and u["slots_used"] == 0:
                return u
            time.sleep(0.01)
        raise AssertionError(f"slots still in use: {self.engine.usage()}")


@pytest.fixture(scope="module")
def served():
    s = Served(AsyncLlama(make_tiny(), max_num_batched_tokens=24), MODEL)
    yield s
    s.close()


@pytest.fixture(scope="module")
def offline():
    return make_tiny()


def greedy(**kwargs):
    return dict(temperature=0, extra_body={"ignore_eos": True}, **kwargs)


# ---- the happy paths ---------------------------------------------------------------------------

def test_models_and_health(served):
    models = served.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    status, body = served.raw("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}


def test_completion_equals_offline_generate(served, offline):
    for prompt in ["hello", "The quick brown fox", "x"]:
        want = offline.generate(prompt, max_tokens=12, ignore_eos=True)[0]
        got = served.client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, **greedy())
        assert got.choices[0].text == want.text
        assert got.choices[0].finish_reason == "length"
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.usage.completion_tokens == 12
        assert got.usage.total_tokens == len(want.prompt_token_ids) + 12


def test_token_id_prompts_and_several_prompts_per_request(served, offline):
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    want = offline.generate(prompts, max_tokens=6, ignore_eos=True)
    got = served.client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, **greedy())
    assert [c.index for c in got.choices] == [0, 1]
    assert [c.text for c in got.choices] == [w.text for w in want]
    assert got.usage.completion_tokens == 12


def test_chat_uses_the_template_like_llm_chat(served, offline):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    want = offline.chat(messages, max_tokens=10, ignore_eos=True)
    got = served.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                                **greedy())
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.usage.prompt_tokens == len(want.prompt_token_ids)
    # Content given as text parts is the same message.
    parts = [{"role": "system", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
             messages[1]]
    again = served.client.chat.completions.create(model=MODEL, messages=parts, max_tokens=10, **greedy())
    assert again.choices[0].message.content == want.text


def test_streaming_completion_and_usage(served, offline):
    want = offline.generate("stream me", max_tokens=15, ignore_eos=True)[0]
    chunks = list(served.client.completions.create(
        model=MODEL, prompt="stream me", max_tokens=15, stream=True,
        stream_options={"include_usage": True}, **greedy()))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 15
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_chat(served, offline):
    messages = [{"role": "user", "content": "tell me"}]
    want = offline.chat(messages, max_tokens=9, ignore_eos=True)
    chunks = list(served.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9,
                                                        stream=True, **greedy()))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_sse_framing(served):
    status, body = served.raw("POST", "/v1/completions", {
        "model": MODEL, "prompt": "abc", "max_tokens": 5, "temperature": 0, "stream": True,
        "ignore_eos": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = body.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert all(p["object"] == "text_completion" for p in payloads)


def test_stop_strings(served, offline):
    full = offline.generate("stop here", max_tokens=30, ignore_eos=True)[0].text
    stop = full[10:12]
    cut = full[:full.index(stop)]
    got = served.client.completions.create(model=MODEL, prompt="stop here", max_tokens=30,
                                           stop=[stop], **greedy())
    assert got.choices[0].text == cut and got.choices[0].finish_reason == "stop"
    streamed = served.client.completions.create(model=MODEL, prompt="stop here", max_tokens=30,
                                                stop=stop, stream=True, **greedy())
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_logprobs(served, offline):
    want = offline.generate([4, 5, 6], max_tokens=4, ignore_eos=True, logprobs=True)[0]
    got = served.client.completions.create(model=MODEL, prompt=[4, 5, 6], max_tokens=4, logprobs=0,
                                           **greedy())
    np.testing.assert_allclose(got.choices[0].logprobs.token_logprobs, want.logprobs, atol=1e-5)
    chat = served.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                                 max_tokens=3, logprobs=True, **greedy())
    assert len(chat.choices[0].logprobs.content) == 3


def test_seeded_sampling_matches_offline(served, offline):
    want = offline.generate("seeded", max_tokens=10, ignore_eos=True, temperature=0.8, seed=42)[0]
    got = served.client.completions.create(model=MODEL, prompt="seeded", max_tokens=10, temperature=0.8,
                                           seed=42, extra_body={"ignore_eos": True})
    assert got.choices[0].text == want.text


def test_concurrent_requests_equal_offline_generate(served, offline):
    rng = np.random.default_rng(7)
    prompts = [rng.integers(3, 259, size=int(n)).tolist() for n in rng.integers(1, 60, size=12)]
    want = [o.text for o in offline.generate(prompts, max_tokens=10, ignore_eos=True)]
    results = [None] * len(prompts)

    def call(i):
        out = served.client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=10, **greedy())
        results[i] = out.choices[0].text

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == want
    served.wait_idle()


def test_fifty_concurrent_streaming_clients(served, offline):
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 259, size=int(n)).tolist() for n in rng.integers(1, 40, size=50)]
    want = [o.text for o in offline.generate(prompts, max_tokens=8, ignore_eos=True)]
    client = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0)
    before = served.engine.metrics.generation_tokens

    async def one(prompt):
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, stream=True,
                                                 temperature=0, extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in stream])

    async def main():
        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await client.close()

    assert asyncio.run(main()) == want
    served.wait_idle()
    assert served.engine.metrics.generation_tokens - before == 8 * 50


# ---- errors -------------------------------------------------------------------------------------

BAD_BODIES = [
    (b"{not json", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_json"),
    ({"model": MODEL}, 400, "prompt", "missing_field"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "10"}, 400, "max_tokens", "invalid_type"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ({"model": MODEL, "prompt": "x", "stream": "yes"}, 400, "stream", "invalid_type"),
    ({"model": MODEL, "prompt": 5}, 400, "prompt", "invalid_type"),
    ({"model": MODEL, "prompt": [1, "a"]}, 400, "prompt", "invalid_type"),
    ({"model": MODEL, "prompt": "x", "stop": 3}, 400, "stop", "invalid_type"),
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n", "unsupported_value"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 10**6}, 400, "max_tokens", "context_length_exceeded"),
    ({"model": MODEL, "prompt": "y" * 300}, 400, "prompt", "invalid_value"),
    ({"model": MODEL, "prompt": [7] * 128}, 400, "prompt", "context_length_exceeded"),
    ({"model": MODEL, "prompt": [7, 5000]}, 400, "prompt", "invalid_value"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt", "invalid_value"),
    ({"model": MODEL, "prompt": "x", "temperature": -1}, 400, None, "invalid_value"),
    ({"model": MODEL, "prompt": "x", "logprobs": 3}, 400, "logprobs", "unsupported_value"),
    ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options",
     "invalid_value"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found"),
]


@pytest.mark.parametrize("body,status,param,code", BAD_BODIES)
def test_bad_completion_requests(served, body, status, param, code):
    got_status, payload = served.raw("POST", "/v1/completions", body)
    assert got_status == status
    error = json.loads(payload)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == code
    assert error["type"] == "invalid_request_error" and error["message"]
    assert served.engine.usage()["slots_used"] == 0


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": "hi"}, "messages"),
    ({"model": MODEL, "messages": [{"content": "no role"}]}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "z" * 400}]}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
])
def test_bad_chat_requests(served, body, param):
    status, payload = served.raw("POST", "/v1/chat/completions", body)
    assert status == 400
    assert json.loads(payload)["error"]["param"] == param


def test_errors_through_the_openai_client(served):
    with pytest.raises(openai.NotFoundError) as info:
        served.client.completions.create(model="nope", prompt="x")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        served.client.completions.create(model=MODEL, prompt="x", n=3)
    assert info.value.body["param"] == "n"
    status, payload = served.raw("GET", "/v1/nothing")
    assert status == 404 and json.loads(payload)["error"]["code"] == "not_found"
    # The server is fine afterwards.
    assert served.client.completions.create(model=MODEL, prompt="ok", max_tokens=2).usage.completion_tokens


# ---- disconnects and metrics ---------------------------------------------------------------------

def open_stream(served, body):
    """A raw streaming request; returns the socket after the first SSE event arrived."""
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    received = b""
    while b"data: " not in received:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the stream"
        received += chunk
    return sock


def aborted(served) -> int:
    text = served.engine.metrics.render()
    return int(re.search(r'llama_brrr_requests_total\{finish_reason="abort"\} (\d+)', text).group(1))


class SlowEngine:
    """A _C.Engine whose decode steps take >= 5 ms: a 120-token request is still running when the
    test hangs up, even if this thread is descheduled for a while on a busy machine."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def decode_steps(self, *args):
        time.sleep(0.005)
        return self.real.decode_steps(*args)


def test_a_client_that_disconnects_mid_stream_frees_its_slot(served):
    before = aborted(served)
    real = served.engine.scheduler.engine
    served.engine.scheduler.engine = SlowEngine(real)
    try:
        sock = open_stream(served, {"model": MODEL, "prompt": "x", "max_tokens": 120, "stream": True,
                                    "ignore_eos": True, "temperature": 0})
        end = time.monotonic() + 5
        while served.engine.usage()["slots_used"] != 1:  # the snapshot follows the step
            assert time.monotonic() < end, served.engine.usage()
            time.sleep(0.001)
        sock.close()
        served.wait_idle()
    finally:
        served.engine.scheduler.engine = real
    assert aborted(served) == before + 1


def test_a_client_that_disconnects_while_waiting_aborts(served):
    before = aborted(served)
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    data = json.dumps({"model": MODEL, "prompt": [5] * 100, "max_tokens": 27, "ignore_eos": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    end = time.monotonic() + 5
    while served.engine.usage()["slots_used"] == 0 and time.monotonic() < end:
        time.sleep(0.001)
    sock.close()
    served.wait_idle()
    assert aborted(served) in (before, before + 1)  # it may have finished before the close landed


def parse_prometheus(text: str) -> dict:
    """Samples of the text exposition format, each line checked against its grammar."""
    samples, types = {}, {}
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? '
                         r'(-?[0-9.e+-]+|\+Inf|NaN)$')
    for line in text.strip().split("\n"):
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "histogram")
            types[name] = kind
            continue
        m = line_re.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(4))
    for name, kind in types.items():
        if kind == "histogram":
            buckets = [v for k, v in samples.items() if k.startswith(name + "_bucket")]
            assert buckets == sorted(buckets), f"{name}: buckets not cumulative"
            assert samples[f'{name}_bucket{{le="+Inf"}}'] == samples[f"{name}_count"]
        else:
            assert any(k == name or k.startswith(name + "{") for k in samples), name
    return samples


def test_metrics_parse_and_count(served):
    before = parse_prometheus(served.raw("GET", "/metrics")[1].decode())
    served.client.completions.create(model=MODEL, prompt=[3, 4, 5, 6], max_tokens=7, **greedy())
    served.wait_idle()
    status, body = served.raw("GET", "/metrics")
    assert status == 200
    after = parse_prometheus(body.decode())
    assert after["llama_brrr_generation_tokens_total"] - before["llama_brrr_generation_tokens_total"] == 7
    assert after["llama_brrr_prompt_tokens_total"] - before["llama_brrr_prompt_tokens_total"] == 4
    assert after["llama_brrr_time_to_first_token_seconds_count"] == \
        before["llama_brrr_time_to_first_token_seconds_count"] + 1
    assert after["llama_brrr_inter_token_latency_seconds_count"] == \
        before["llama_brrr_inter_token_latency_seconds_count"] + 6
    assert after["llama_brrr_kv_slots_total"] == 4 and after["llama_brrr_kv_slots_used"] == 0
    assert after["llama_brrr_kv_positions_total"] == 4 * 128
    assert after["llama_brrr_kv_blocks_total"] == 4 * 128 // 16
    assert after["llama_brrr_kv_blocks_used"] == 0 and after["llama_brrr_preemptions_total"] == 0
    assert after["llama_brrr_prefix_cache_queries_total"] >= \
        before["llama_brrr_prefix_cache_queries_total"] + 1
    assert after["llama_brrr_prefix_cache_hits_total"] >= before["llama_brrr_prefix_cache_hits_total"]
    assert after["llama_brrr_requests_running"] == 0 and after["llama_brrr_requests_waiting"] == 0


# ---- the default model -------------------------------------------------------------------------

def test_default_model_chat_and_stream():
    from llama_brrr import fetch

    path = fetch.local_default_model()
    if path is None:
        pytest.skip("the default model is not on disk (llama-brrr generate fetches it)")
    # Prefix caching off: the served chat would reuse the offline call's prompt blocks and prefill
    # only the rest, and on a CPU with AMX the quantized GEMM of fewer than 16 rows (VNNI) and of
    # 16 or more (AMX tiles) round differently, so exact equality holds only without the cache.
    offline = Llama.from_pretrained(str(path), device="cpu", max_seq_len=512, max_batch=4,
                                    progress=False, enable_prefix_caching=False)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    want = offline.chat(messages, max_tokens=24)
    wants = offline.generate(["Once upon a time", "The best way to learn"], max_tokens=16)
    served = Served(AsyncLlama(offline), "smollm2")
    try:
        got = served.client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24,
                                                    temperature=0)
        assert got.choices[0].message.content == want.text
        assert got.choices[0].finish_reason == want.finish_reason
        streamed = served.client.completions.create(model="smollm2", prompt="Once upon a time",
                                                    max_tokens=16, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed) == wants[0].text
        both = served.client.completions.create(model="smollm2", max_tokens=16, temperature=0,
                                                prompt=["Once upon a time", "The best way to learn"])
        assert [c.text for c in both.choices] == [w.text for w in wants]
    finally:
        served.close()
