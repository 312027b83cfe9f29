"""The API's contract, table-driven: every bad argument of Llama, SamplingParams, generate,
stream, chat, forward and the tokenizer's encode/decode raises ValueError naming the parameter
(wrong types included: ArgumentTypeError is a ValueError and a TypeError), and the model stays
usable. Also: non-finite logits raise an error naming the step and the sequence instead of
coming back as text, and the suite itself writes nothing into the user's cache.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

from llama_brrr import Llama, ModelConfig, SamplingParams
from llama_brrr.errors import ArgumentTypeError, NonFiniteLogitsError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli import write_tiny_gguf  # noqa: E402

SURROGATE = "a\udcffb"  # what Python makes of the bytes b"a\xffb" under surrogateescape
TINY = dict(dim=40, hidden_dim=72, n_layers=2, n_heads=5, n_kv_heads=1, vocab_size=280,
            max_seq_len=32, name="tiny-contract")
PROMPT = [1, 40, 41, 42, 43]

# (field, bad value): every field of SamplingParams, bad in value and in type.
SAMPLING_CASES = [
    ("max_tokens", 0), ("max_tokens", -1), ("max_tokens", 2.0), ("max_tokens", "5"),
    ("max_tokens", True), ("max_tokens", None),
    ("temperature", -0.5), ("temperature", float("inf")), ("temperature", float("nan")),
    ("temperature", "0.5"), ("temperature", True), ("temperature", 10**400), ("temperature", None),
    ("top_k", -1), ("top_k", 2.5), ("top_k", "3"), ("top_k", True), ("top_k", None),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", float("nan")), ("top_p", "x"), ("top_p", None),
    ("min_p", -0.1), ("min_p", 2.0), ("min_p", "x"), ("min_p", [0.1]),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", "x"),
    ("seed", -1), ("seed", 2**64), ("seed", 1.5), ("seed", "1"), ("seed", True),
    ("stop", 123), ("stop", [""]), ("stop", [1]), ("stop", b"x"), ("stop", SURROGATE),
    ("stop_token_ids", "a"), ("stop_token_ids", [1.5]), ("stop_token_ids", [-1]),
    ("stop_token_ids", [True]), ("stop_token_ids", 1.5), ("stop_token_ids", [2**40]),
    ("ignore_eos", "no"), ("ignore_eos", 1), ("ignore_eos", None),
    ("logprobs", "no"), ("logprobs", 0), ("logprobs", None),
]


@pytest.mark.parametrize("field, value", SAMPLING_CASES,
                         ids=[f"{f}={v!r}"[:40] for f, v in SAMPLING_CASES])
def test_sampling_params_fields(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_sampling_params_accept_what_they_promise():
    p = SamplingParams(max_tokens=np.int64(3), top_k=2**40, seed=2**64 - 1, stop="x",
                       stop_token_ids=np.array([3, 4]), ignore_eos=np.bool_(True), logprobs=False)
    assert (p.max_tokens, p.stop, p.stop_token_ids, p.ignore_eos) == (3, ["x"], [3, 4], True)
    assert p.engine_row(0)[1] == 2**31 - 1  # a top_k beyond the vocabulary is "off"


def test_argument_type_error_is_both():
    assert issubclass(ArgumentTypeError, ValueError) and issubclass(ArgumentTypeError, TypeError)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    pytest.importorskip("gguf")
    path = write_tiny_gguf(tmp_path_factory.mktemp("contract") / "tiny.gguf")
    return Llama.from_pretrained(str(path), device="cpu", progress=False, n_threads=1,
                                 max_seq_len=64, max_batch=4)


def outputs(llm):
    return [o.token_ids for o in llm.generate(["hello", [5, 6, 7]], max_tokens=6, ignore_eos=True)]


MESSAGES = [{"role": "user", "content": "hi"}]

# (call description, call(llm), the parameter the message must name)
CALL_CASES = [
    ("generate(123)", lambda m: m.generate(123), "prompt"),
    ("generate(None)", lambda m: m.generate(None), "prompt"),
    ("generate([1.5])", lambda m: m.generate([1.5, 2]), "token ids"),
    ("generate([[1,'a']])", lambda m: m.generate([[1, "a"]]), "token ids"),
    ("generate(['ok', 3])", lambda m: m.generate(["ok", 3]), "prompt 1"),
    ("generate(surrogate)", lambda m: m.generate(SURROGATE), "prompt"),
    ("generate(['ok', surrogate])", lambda m: m.generate(["ok", SURROGATE]), "prompt 1"),
    ("generate(sampling_params=dict)", lambda m: m.generate("hi", {"top_k": 1}), "sampling_params"),
    ("generate(unknown kwarg)", lambda m: m.generate("hi", temprature=1.0), "temprature"),
    ("generate(stop=123)", lambda m: m.generate("hi", stop=123), "stop"),
    ("generate(top_k=2.5)", lambda m: m.generate("hi", top_k=2.5), "top_k"),
    ("generate(logprobs='no')", lambda m: m.generate("hi", logprobs="no"), "logprobs"),
    ("generate(ignore_eos='no')", lambda m: m.generate("hi", ignore_eos="no"), "ignore_eos"),
    ("generate(max_tokens=2.0)", lambda m: m.generate("hi", max_tokens=2.0), "max_tokens"),
    ("generate(seed=-1)", lambda m: m.generate("hi", seed=-1), "seed"),
    ("stream(123)", lambda m: m.stream(123), "prompt"),
    ("stream(surrogate)", lambda m: m.stream(SURROGATE), "prompt"),
    ("stream(two prompts)", lambda m: m.stream(["a", "b"]), "prompt"),
    ("stream(stop=123)", lambda m: m.stream("hi", stop=123), "stop"),
    ("stream(logprobs='no')", lambda m: m.stream("hi", logprobs="no"), "logprobs"),
    ("chat(None)", lambda m: m.chat(None), "messages"),
    ("chat('hi')", lambda m: m.chat("hi"), "messages"),
    ("chat(surrogate content)", lambda m: m.chat([{"role": "user", "content": SURROGATE}]),
     r"messages\[0\]\['content'\]"),
    ("chat(surrogate role)", lambda m: m.chat([{"role": SURROGATE, "content": "x"}]),
     r"messages\[0\]\['role'\]"),
    ("chat(top_p='x')", lambda m: m.chat(MESSAGES, top_p="x"), "top_p"),
    ("chat_stream(stop=123)", lambda m: m.chat_stream(MESSAGES, stop=123), "stop"),
    ("forward(5)", lambda m: m.forward(5), "token_ids"),
    ("forward('abc')", lambda m: m.forward("abc"), "token_ids"),
    ("forward([1.5])", lambda m: m.forward([1.5]), "token ids"),
    ("forward([])", lambda m: m.forward([]), "token_ids"),
    ("forward(start_pos=-1)", lambda m: m.forward([1], start_pos=-1), "start_pos"),
    ("forward(start_pos=1.5)", lambda m: m.forward([1], start_pos=1.5), "start_pos"),
    ("forward(start_pos=True)", lambda m: m.forward([1], start_pos=True), "start_pos"),
    ("forward(start_pos=2**70)", lambda m: m.forward([1], start_pos=2**70), "start_pos"),
    ("forward(slot=-1)", lambda m: m.forward([1], slot=-1), "slot"),
    ("forward(slot='0')", lambda m: m.forward([1], slot="0"), "slot"),
    ("forward(slot=2**70)", lambda m: m.forward([1], slot=2**70), "slot"),
    ("encode(5)", lambda m: m.tokenizer.encode(5), "text"),
    ("encode(b'x')", lambda m: m.tokenizer.encode(b"x"), "text"),
    ("encode(surrogate)", lambda m: m.tokenizer.encode(SURROGATE), "text"),
    ("encode(add_bos='no')", lambda m: m.tokenizer.encode("x", add_bos="no"), "add_bos"),
    ("decode(5)", lambda m: m.tokenizer.decode(5), "token ids"),
    ("decode('abc')", lambda m: m.tokenizer.decode("abc"), "token ids"),
    ("decode([1.5])", lambda m: m.tokenizer.decode([1.5]), "token ids"),
    ("decode([True])", lambda m: m.tokenizer.decode([True]), "token ids"),
    ("decode([-1])", lambda m: m.tokenizer.decode([-1]), "token id -1"),
    ("decode([10**6])", lambda m: m.tokenizer.decode([10**6]), "token id 1000000"),
    ("decode(skip_special_tokens='no')",
     lambda m: m.tokenizer.decode([5], skip_special_tokens="no"), "skip_special_tokens"),
]


@pytest.mark.parametrize("call, parameter", [(c[1], c[2]) for c in CALL_CASES],
                         ids=[c[0] for c in CALL_CASES])
def test_bad_call_arguments(llm, call, parameter):
    before = outputs(llm)
    with pytest.raises(ValueError, match=parameter):
        result = call(llm)
        if hasattr(result, "__next__"):
            next(result)
    assert outputs(llm) == before


CONSTRUCTION_CASES = [
    (dict(seed=-1), "seed"), (dict(seed=1.5), "seed"), (dict(seed="x"), "seed"),
    (dict(seed=2**64), "seed"),
    (dict(device=5), "device"), (dict(device="tpu"), "device"), (dict(device="cuda:x"), "cuda:N"),
    (dict(dtype="int8"), "dtype"), (dict(dtype=5), "dtype"),
    (dict(max_seq_len=1), "max_seq_len"), (dict(max_seq_len=2**40), "max_seq_len"),
    (dict(max_seq_len=1.5), "max_seq_len"), (dict(max_seq_len=True), "max_seq_len"),
    (dict(max_batch=0), "max_batch"), (dict(max_batch=2**40), "max_batch"),
    (dict(max_batch="2"), "max_batch"),
    (dict(n_threads=-1), "n_threads"), (dict(n_threads=2**40), "n_threads"),
    (dict(n_threads=1.5), "n_threads"),
]


@pytest.mark.parametrize("kwargs, parameter", CONSTRUCTION_CASES,
                         ids=[repr(k)[:40] for k, _ in CONSTRUCTION_CASES])
def test_bad_random_arguments(kwargs, parameter):
    with pytest.raises(ValueError, match=parameter):
        Llama.random(ModelConfig(**TINY), **dict(dict(device="cpu"), **kwargs))


def test_bad_shape_argument():
    with pytest.raises(ValueError, match="shape_name_or_config"):
        Llama.random(5, device="cpu")


@pytest.mark.parametrize("kwargs, parameter", [
    (dict(path=5), "path"), (dict(path="x.gguf", progress="no"), "progress"),
    (dict(path="x.gguf", n_threads=-1), "n_threads"), (dict(path="x.gguf", device="tpu"), "device"),
    (dict(path="x.gguf", max_batch=0), "max_batch"),
])
def test_bad_from_pretrained_arguments(tmp_path, kwargs, parameter):
    kwargs = dict(kwargs)
    if kwargs.get("path") == "x.gguf":
        kwargs["path"] = str(write_tiny_gguf(tmp_path / "x.gguf"))
    with pytest.raises(ValueError, match=parameter):
        Llama.from_pretrained(**kwargs)


# ---- no NaN as text ---------------------------------------------------------------------------

@pytest.fixture
def random_llm():
    return Llama.random(ModelConfig(**TINY), seed=3, device="cpu", max_batch=4, n_threads=1)


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=1.0, top_k=5, seed=1),
                                      dict(temperature=0.7, top_p=0.9, min_p=0.05, seed=2)])
def test_nan_weights_raise_naming_step_and_sequence(random_llm, sampling):
    llm = random_llm
    good = llm.generate([PROMPT, [1, 50, 51]], max_tokens=4, ignore_eos=True, **sampling)
    head = llm.engine.get_weight("output").copy()
    damaged = head.copy()
    damaged[7, 3] = np.nan
    llm.engine.set_weight("output", damaged.astype(np.float32), "f32")
    with pytest.raises(NonFiniteLogitsError, match=r"step 0 of sequence 0"):
        llm.generate([PROMPT, [1, 50, 51]], max_tokens=4, ignore_eos=True, **sampling)
    with pytest.raises(NonFiniteLogitsError, match=r"step 0 of sequence 0"):
        "".join(llm.stream(PROMPT, max_tokens=4, ignore_eos=True, **sampling))
    with pytest.raises(NonFiniteLogitsError, match=r"step 0"):
        llm.chat(MESSAGES, max_tokens=4, ignore_eos=True, **sampling)
    # Not only NaN: +inf in the logits is caught the same way.
    damaged[7, 3] = np.inf
    llm.engine.set_weight("output", damaged.astype(np.float32), "f32")
    with pytest.raises(NonFiniteLogitsError):
        llm.generate(PROMPT, max_tokens=4, ignore_eos=True, **sampling)
    llm.engine.set_weight("output", head, "f32")
    again = llm.generate([PROMPT, [1, 50, 51]], max_tokens=4, ignore_eos=True, **sampling)
    assert [o.token_ids for o in again] == [o.token_ids for o in good]


def test_nan_at_a_later_step_names_that_step_and_sequence(random_llm):
    llm = random_llm
    prompts = [PROMPT, [1, 50, 51]]
    good = llm.generate(prompts, max_tokens=4, ignore_eos=True)
    # The embedding of the second sequence's first generated token (and of no prompt token) made
    # NaN: its first step is clean, the next one reads the NaN row.
    token = good[1].token_ids[0]
    assert token not in PROMPT + prompts[1] + good[0].token_ids[:3]
    embeddings = llm.engine.get_weight("tok_embeddings").copy()
    damaged = embeddings.copy()
    damaged[token] = np.nan
    llm.engine.set_weight("tok_embeddings", damaged, "f32")
    with pytest.raises(NonFiniteLogitsError, match=r"step 1 of sequence 1 "):
        llm.generate(prompts, max_tokens=4, ignore_eos=True)
    llm.engine.set_weight("tok_embeddings", embeddings, "f32")


# ---- the suite stays out of the user's cache ---------------------------------------------------

def test_cache_writes_go_to_a_temporary_home(tmp_path_factory):
    import tempfile

    from llama_brrr import fetch, peaks

    import conftest

    temp_root = Path(tempfile.gettempdir()).resolve()
    assert Path(peaks._cache_path()).resolve().is_relative_to(temp_root)
    assert fetch.cache_dir().resolve() == conftest.TEST_HOME.resolve()
    assert not fetch.cache_dir().resolve().is_relative_to(conftest.USER_CACHE.resolve())
