"""Bad input raises a Python exception that names the problem, and leaves the model usable.

Every case runs against one Llama instance, and after each the instance must still generate
exactly what it generated before any error.
"""

import numpy as np
import pytest

from llama_brrr import Llama, ModelConfig, SamplingParams
from llama_brrr.errors import ModelFileError

TINY = dict(dim=40, hidden_dim=72, n_layers=2, n_heads=5, n_kv_heads=1, vocab_size=280,
            max_seq_len=32, name="tiny-bad-input")
PROMPT = [1, 40, 41, 42, 43]


@pytest.fixture(scope="module")
def llm():
    llm = Llama.random(ModelConfig(**TINY), seed=3, device="cpu", max_batch=4, n_threads=1)
    # An O(1) LM head makes greedy decisions clear-cut (see test_api.py).
    head = np.random.default_rng(3).normal(0.0, 1.0, (TINY["vocab_size"], TINY["dim"]))
    llm.engine.set_weight("output", head.astype(np.float32), "f32")
    return llm


@pytest.fixture(scope="module")
def baseline(llm):
    out = llm.generate([PROMPT, "abc"], max_tokens=8, ignore_eos=True, logprobs=True)
    return [(o.token_ids, o.logprobs) for o in out]


def assert_still_works(llm, baseline):
    out = llm.generate([PROMPT, "abc"], max_tokens=8, ignore_eos=True, logprobs=True)
    for o, (tokens, logprobs) in zip(out, baseline):
        assert o.token_ids == tokens
        np.testing.assert_allclose(o.logprobs, logprobs, atol=1e-5)


GENERATE_CASES = [
    # (prompts, kwargs, exception, message pattern)
    ("", {}, ValueError, "prompt is empty"),
    ([], {}, ValueError, "prompt is empty"),
    (["ok", ""], {}, ValueError, "prompt 1 is empty"),
    ([[1, 2], []], {}, ValueError, "prompt is empty"),
    ([5] * 32, {}, ValueError, r"32 tokens.*max_seq_len=32.*max_seq_len="),
    ("x" * 40, {}, ValueError, r"max_seq_len=32"),
    ([1, 2, 280], {}, ValueError, r"token id 280 at index 2 is outside the vocabulary \[0, 280\)"),
    ([[1, 2], [-1]], {}, ValueError, r"prompt 1: token id -1"),
    ([1.5, 2], {}, TypeError, "token ids must be integers"),
    (PROMPT, dict(temperature=-0.5), ValueError, r"temperature must be .*>= 0"),
    (PROMPT, dict(temperature=float("inf")), ValueError, "temperature must be a finite"),
    (PROMPT, dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (PROMPT, dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (PROMPT, dict(top_k=-1), ValueError, "top_k must be an integer >= 0"),
    (PROMPT, dict(top_k=2.5), ValueError, "top_k must be an integer"),
    (PROMPT, dict(min_p=2.0), ValueError, r"min_p must be in \[0, 1\]"),
    (PROMPT, dict(repetition_penalty=0.0), ValueError, "repetition_penalty must be"),
    (PROMPT, dict(max_tokens=0), ValueError, "max_tokens must be an integer >= 1"),
    (PROMPT, dict(stop=[""]), ValueError, "stop strings must be non-empty"),
    (PROMPT, dict(seed=-1), ValueError, "seed must be"),
    (PROMPT, dict(temprature=0.5), TypeError, "unknown sampling argument.*'temprature'"),
]


@pytest.mark.parametrize("prompts, kwargs, exception, pattern", GENERATE_CASES,
                         ids=[f"{i}-{c[3][:30]}" for i, c in enumerate(GENERATE_CASES)])
def test_bad_generate_arguments(llm, baseline, prompts, kwargs, exception, pattern):
    with pytest.raises(exception, match=pattern):
        llm.generate(prompts, **kwargs)
    assert_still_works(llm, baseline)


@pytest.mark.parametrize("call", ["stream", "chat"])
def test_bad_arguments_to_stream_and_chat(llm, baseline, call):
    with pytest.raises(ValueError, match="top_p"):
        if call == "stream":
            llm.stream(PROMPT, top_p=2.0)
        else:
            llm.chat([{"role": "user", "content": "hi"}], top_p=2.0)
    with pytest.raises(ValueError, match="max_seq_len=32"):
        if call == "stream":
            llm.stream("y" * 50)
        else:
            llm.chat([{"role": "user", "content": "y" * 50}])
    assert_still_works(llm, baseline)


def test_bad_chat_messages(llm, baseline):
    for messages in ([], [{"role": "user"}], ["hello"], [{"role": "user", "content": 3}]):
        with pytest.raises(ValueError, match="messages"):
            llm.chat(messages)
    assert_still_works(llm, baseline)


def test_sampling_params_and_kwargs_together(llm, baseline):
    with pytest.raises(TypeError, match="not both"):
        llm.generate(PROMPT, SamplingParams(), temperature=0.5)
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate(PROMPT, {"temperature": 0.5})
    assert_still_works(llm, baseline)


def test_bad_forward_arguments(llm, baseline):
    with pytest.raises(ValueError, match="empty"):
        llm.forward([])
    with pytest.raises(ValueError, match="slot must be in \\[0, 4\\)"):
        llm.forward([1, 2], slot=4)
    with pytest.raises(ValueError, match="start_pos=30 plus 3 tokens.*max_seq_len=32"):
        llm.forward([1, 2, 3], start_pos=30)
    with pytest.raises(ValueError, match="token id 999"):
        llm.forward([1, 999])
    assert_still_works(llm, baseline)


def test_bad_construction_arguments():
    config = ModelConfig(**TINY)
    cases = [
        (dict(dtype="int8"), ValueError, "dtype must be one of"),
        (dict(device="tpu"), ValueError, "device must be"),
        (dict(device="cuda:x"), ValueError, "cuda:N"),
        (dict(max_seq_len=1), ValueError, "max_seq_len must be an integer >= 2"),
        (dict(max_batch=0), ValueError, "max_batch must be an integer >= 1"),
    ]
    for kwargs, exception, pattern in cases:
        with pytest.raises(exception, match=pattern):
            Llama.random(config, **dict(dict(device="cpu"), **kwargs))


def test_cuda_without_a_gpu_says_so():
    import llama_brrr

    if llama_brrr.cuda_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(RuntimeError, match="(no CUDA device|no CUDA support).*device='cpu'"):
        Llama.random(ModelConfig(**TINY), device="cuda")


def test_missing_model_file_names_the_path(tmp_path, llm, baseline):
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelFileError, match="nowhere/model.gguf"):
        Llama.from_pretrained(str(missing), device="cpu", progress=False)
    assert_still_works(llm, baseline)


@pytest.mark.parametrize("content", [
    b"",
    b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40,
    b"NOPE" + bytes(range(256)) * 4,
], ids=["empty", "right-magic-garbage-header", "wrong-magic"])
def test_corrupt_model_file_names_the_file(tmp_path, llm, baseline, content):
    path = tmp_path / "broken.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match="broken.gguf"):
        Llama.from_pretrained(str(path), device="cpu", progress=False)
    assert_still_works(llm, baseline)


def test_truncated_model_file_names_the_file(tmp_path, llm, baseline):
    gguf = pytest.importorskip("gguf")
    config = ModelConfig(**dict(TINY, vocab_size=64))
    path = tmp_path / "whole.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.dim)
    writer.add_feed_forward_length(config.hidden_dim)
    writer.add_block_count(config.n_layers)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    rng = np.random.default_rng(0)
    names = {"tok_embeddings": "token_embd", "norm": "output_norm", "output": "output"}
    for name, shape in config.tensor_shapes().items():
        if name.startswith("layers."):
            _, layer, kind = name.split(".")
            gguf_kind = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
                         "wo": "attn_output", "ffn_norm": "ffn_norm", "w1": "ffn_gate",
                         "w3": "ffn_up", "w2": "ffn_down"}[kind]
            file_name = f"blk.{layer}.{gguf_kind}.weight"
        else:
            file_name = names[name] + ".weight"
        writer.add_tensor(file_name, rng.normal(0, 0.02, shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(ModelFileError, match="truncated.gguf"):
        Llama.from_pretrained(str(truncated), device="cpu", progress=False)
    assert_still_works(llm, baseline)


# ---- bounded work for hostile inputs: huge prompts, hostile chat templates ------------------------

HUGE = "hello world " * (100_000_000 // 12)  # 100 MB


@pytest.mark.parametrize("call", ["generate", "stream", "chat"])
def test_huge_prompt_fails_fast_by_its_byte_length(llm, baseline, call):
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"too long.*max_seq_len=32"):
        if call == "generate":
            llm.generate(HUGE)
        elif call == "stream":
            llm.stream(HUGE)
        else:
            llm.chat([{"role": "user", "content": HUGE}])
    assert time.perf_counter() - start < 2.0
    assert_still_works(llm, baseline)


def byte_level_tokenizer(chat_template=None):
    """A GGUF byte-level vocabulary of 261 tokens (fits the tiny model's 280), the longest "ab" * 8."""
    from llama_brrr import tokenizer as tk

    alphabet = tk.byte_level_alphabet()
    merges = ["a b", "ab ab", "abab abab", "abababab abababab"]
    tokens = ["<|ctl|>"] + [alphabet[b] for b in range(256)] + [merge.replace(" ", "") for merge in merges]
    return tk.load_tokenizer({"format": "gguf", "model": "gpt2", "pre": None, "tokens": tokens,
                              "token_type": [3] + [1] * (len(tokens) - 1), "merges": merges,
                              "bos_token_id": 0, "eos_token_id": 0, "add_bos_token": False,
                              "chat_template": chat_template, "path": "tiny-vocab.gguf"})


@pytest.fixture
def with_tokenizer(llm):
    """Swaps the model's tokenizer for the test's; `with_tokenizer(None)` puts the original back."""
    original = llm.tokenizer
    yield lambda tokenizer: setattr(llm, "tokenizer", original if tokenizer is None else tokenizer)
    llm.tokenizer = original


def test_byte_limit_is_sound_at_its_edge(llm, baseline, with_tokenizer):
    tokenizer = byte_level_tokenizer()
    with_tokenizer(tokenizer)
    assert tokenizer.max_bytes_per_token == 16
    edge = "ab" * (32 * 16 // 2)  # exactly max_seq_len * 16 bytes: 32 tokens, refused by count, not bytes
    assert len(tokenizer.encode(edge)) == 32
    with pytest.raises(ValueError, match="prompt has 32 tokens"):
        llm.generate(edge)
    with pytest.raises(ValueError, match=r"prompt is too long: 513 bytes"):
        llm.generate(edge + "a")
    assert len(llm.generate("ab" * 248, max_tokens=1)[0].prompt_token_ids) == 31  # 496 bytes fit
    with_tokenizer(None)
    assert_still_works(llm, baseline)


def test_chat_with_a_hostile_template_fails_fast(llm, baseline, with_tokenizer):
    import time

    from llama_brrr.tokenizer import ChatTemplateLimitError

    with_tokenizer(byte_level_tokenizer(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}"))
    start = time.perf_counter()
    with pytest.raises(ChatTemplateLimitError, match="chat template of tiny-vocab.gguf"):
        llm.chat([{"role": "user", "content": "hi"}])
    assert time.perf_counter() - start < 3.0
    with_tokenizer(byte_level_tokenizer("{% for m in messages %}{{ m['content'] }}{% endfor %}"))
    with pytest.raises(ValueError, match=r"more than 512 characters: the prompt is too long for max_seq_len=32"):
        llm.chat([{"role": "user", "content": "ab" * 300}])
    assert llm.chat([{"role": "user", "content": "ab"}], max_tokens=2).finish_reason == "length"
    with_tokenizer(None)
    assert_still_works(llm, baseline)


# ---- memory that comes back -------------------------------------------------------------------

def test_load_unload_cycles_give_memory_back(tmp_path, monkeypatch):
    """12 load / generate / unload cycles in a fresh process (benchmarks/bench_load_cycles.py, the
    100-cycle benchmark): RSS after unload grows by at most 10 MB from the 2nd cycle to the last.
    The default model when it is on disk (a leak of its weights would be ~100 MB a cycle), else a
    random GGUF of 9 MB of weights."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from llama_brrr import fetch

    repo = Path(__file__).resolve().parents[1]
    model = fetch.local_default_model()
    if model is None:
        from tests.fuzz import seeds

        monkeypatch.setattr(seeds, "DIM", 256)
        monkeypatch.setattr(seeds, "HIDDEN", 512)
        rng = np.random.default_rng(0)
        model = seeds.write_gguf(tmp_path / "model.gguf", "F32", False, rng)
    done = subprocess.run([sys.executable, str(repo / "benchmarks" / "bench_load_cycles.py"), "--cycles", "12",
                           "--mode", "trim", "--model", str(model)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["same_tokens_every_cycle"]
    after = [row["rss_after_unload_mb"] for row in result["cycles"]]
    assert result["growth_2nd_to_last_mb"] <= 10, f"RSS after each unload (MB): {after}"
