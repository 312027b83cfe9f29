"""The `llama-brrr` command, run as `python -m llama_brrr` in a subprocess.

A tiny GGUF written here (random weights, a byte-level BPE vocabulary, a ChatML template) makes
the command's whole path run in a second; the real default model runs too when it is on disk.
What the command prints must be exactly what the Python API generates for the same arguments.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llama_brrr import Llama, ModelConfig, fetch
from llama_brrr.tokenizer import byte_level_alphabet

REPO = Path(__file__).resolve().parents[1]
# Progress bars end with "\r" rather than a newline, so the line may start after one.
STATS_LINE = re.compile(r"(?:^|\r)prompt (\d+) tok in [0-9.]+ s \([0-9.]+ tok/s\), "
                        r"generated (\d+) tok in [0-9.]+ s \([0-9.]+ tok/s\)$", re.M)
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("Ġ", "t"), ("he", "ll"), ("o", "Ġ")]
GGUF_LAYER = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v",
              "wo": "attn_output", "ffn_norm": "ffn_norm", "w1": "ffn_gate", "w3": "ffn_up",
              "w2": "ffn_down"}


def byte_symbols():
    """GPT-2's byte-level alphabet in byte order (every byte is one visible character)."""
    alphabet = byte_level_alphabet()
    return [alphabet[b] for b in range(256)]


def pair_order(w, n_heads):
    """Rotate-half rows -> GGUF's adjacent-pair rows (row i of a head to 2i, i + hd/2 to 2i + 1)."""
    rows, cols = w.shape
    head_dim = rows // n_heads
    return np.ascontiguousarray(
        w.reshape(n_heads, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(rows, cols))


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    import gguf

    tokens = SPECIALS + byte_symbols() + ["".join(m) for m in MERGES]
    config = ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2,
                         vocab_size=len(tokens), max_seq_len=256, tie_embeddings=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny cli test model")
    writer.add_context_length(config.max_seq_len)
    writer.add_embedding_length(config.dim)
    writer.add_feed_forward_length(config.hidden_dim)
    writer.add_block_count(config.n_layers)
    writer.add_head_count(config.n_heads)
    writer.add_head_count_kv(config.n_kv_heads)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges([" ".join(m) for m in MERGES])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)
    for name, shape in config.tensor_shapes().items():
        if len(shape) == 1:
            array = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            array = rng.standard_normal(shape) / np.sqrt(shape[1])
        array = array.astype(np.float32)
        if name == "tok_embeddings":
            file_name = "token_embd.weight"
        elif name == "norm":
            file_name = "output_norm.weight"
        else:
            _, layer, kind = name.split(".")
            file_name = f"blk.{layer}.{GGUF_LAYER[kind]}.weight"
            if kind in ("wq", "wk"):
                array = pair_order(array, config.n_heads if kind == "wq" else config.n_kv_heads)
        writer.add_tensor(file_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("cli") / "tiny.gguf")


def run_cli(*args, stdin="", env=None, timeout=300):
    """Runs the command; stdout/stderr decoded as UTF-8 without newline translation, so a "\r" the
    model generates reaches the comparison unchanged."""
    full_env = dict(os.environ, PYTHONIOENCODING="utf-8", **(env or {}))
    result = subprocess.run([sys.executable, "-m", "llama_brrr", *map(str, args)],
                            input=stdin.encode("utf-8"), capture_output=True, cwd=REPO,
                            env=full_env, timeout=timeout)
    return subprocess.CompletedProcess(result.args, result.returncode,
                                       result.stdout.decode("utf-8"), result.stderr.decode("utf-8"))


def test_generate_prints_what_the_api_generates(tiny_gguf):
    prompt = "hello there"
    result = run_cli("generate", prompt, "--model", tiny_gguf, "--device", "cpu",
                     "--max-new-tokens", 12, "--threads", 1)
    assert result.returncode == 0, result.stderr
    llm = Llama.from_pretrained(str(tiny_gguf), device="cpu", progress=False, n_threads=1)
    expected = llm.generate(prompt, max_tokens=12)[0]
    assert result.stdout == expected.text + "\n"
    stats = STATS_LINE.search(result.stderr)
    assert stats, result.stderr
    assert int(stats.group(1)) == len(expected.prompt_token_ids)
    assert int(stats.group(2)) == len(expected.token_ids)
    assert "Traceback" not in result.stderr


def test_generate_passes_sampling_options(tiny_gguf):
    args = ("--temperature", 1.3, "--top-k", 50, "--top-p", 0.9, "--min-p", 0.01,
            "--repetition-penalty", 1.1, "--seed", 42, "--max-new-tokens", 10, "--max-seq-len", 64)
    first = run_cli("generate", "ab", "--model", tiny_gguf, "--device", "cpu", *args)
    second = run_cli("generate", "ab", "--model", tiny_gguf, "--device", "cpu", *args)
    assert first.returncode == 0, first.stderr
    llm = Llama.from_pretrained(str(tiny_gguf), device="cpu", progress=False, max_seq_len=64)
    expected = llm.generate("ab", max_tokens=10, temperature=1.3, top_k=50, top_p=0.9,
                            min_p=0.01, repetition_penalty=1.1, seed=42)[0]
    assert first.stdout == second.stdout == expected.text + "\n"


def test_chat_reads_stdin_until_exit(tiny_gguf):
    result = run_cli("chat", "--model", tiny_gguf, "--device", "cpu", "--max-new-tokens", 6,
                     stdin="hi\n\n/exit\nnever read\n")
    assert result.returncode == 0, result.stderr
    llm = Llama.from_pretrained(str(tiny_gguf), device="cpu", progress=False)
    expected = llm.chat([{"role": "user", "content": "hi"}], max_tokens=6)
    assert result.stdout == expected.text + "\n"
    assert len(STATS_LINE.findall(result.stderr)) == 1  # one turn; the empty line is skipped


def test_chat_keeps_history_and_ends_at_eof(tiny_gguf):
    result = run_cli("chat", "--model", tiny_gguf, "--device", "cpu", "--max-new-tokens", 5,
                     stdin="one\ntwo\n")
    assert result.returncode == 0, result.stderr
    llm = Llama.from_pretrained(str(tiny_gguf), device="cpu", progress=False)
    history = [{"role": "user", "content": "one"}]
    first = llm.chat(history, max_tokens=5).text
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": "two"}]
    second = llm.chat(history, max_tokens=5).text
    assert result.stdout == f"{first}\n{second}\n"


@pytest.mark.parametrize("args, message", [
    (("generate", "hi", "--model", "/nonexistent/model.gguf"), "/nonexistent/model.gguf"),
    (("generate", "hi", "--temperature", "-1"), "temperature"),
    (("generate", "hi", "--top-p", "0"), "top_p"),
    (("generate", "hi", "--device", "tpu"), "device"),
    (("generate", "x" * 80, "--max-seq-len", "16"), "max_seq_len=16"),
    (("generate", "hi", "--max-new-tokens", "many"), "invalid int value"),
    (("frobnicate",), "invalid choice"),
    (("serve", "--kv-cache-dtype", "fp16"), "--kv-cache-dtype: invalid choice: 'fp16'"),
    (("bench", "serve", "--kv-cache-dtype", "fp8_e5m2"), "--kv-cache-dtype: invalid choice"),
])
def test_errors_exit_2_with_a_message_and_no_traceback(tiny_gguf, args, message):
    args = list(args)
    if "--model" not in args and args[0] == "generate":
        args += ["--model", str(tiny_gguf), "--device", "cpu"] if "--device" not in args else [
            "--model", str(tiny_gguf)]
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert "llama-brrr: error:" in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


REAL_MODEL = fetch.local_default_model()


@pytest.mark.slow
@pytest.mark.skipif(REAL_MODEL is None, reason=(
    f"default model not found at {fetch.default_model_path()}: run `python weights/fetch.py` or "
    f"set {fetch.DEFAULT_MODEL_ENV}"))
def test_generate_with_the_default_model():
    # No --model: the default model, found through LLAMA_BRRR_DEFAULT_MODEL when that is set.
    result = run_cli("generate", "The capital of France is", "--max-new-tokens", 8,
                     "--device", "cpu", "--max-seq-len", 128,
                     env={fetch.DEFAULT_MODEL_ENV: str(REAL_MODEL)})
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    stats = STATS_LINE.search(result.stderr)
    assert stats and int(stats.group(2)) >= 1, result.stderr


def run_cli_bytes(*args, stdin=b"", env=None, timeout=300):
    """run_cli with arguments and stdin as raw bytes (for input that is not UTF-8)."""
    full_env = dict(os.environ, PYTHONIOENCODING="utf-8", **(env or {}))
    argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    result = subprocess.run([sys.executable.encode(), b"-m", b"llama_brrr", *argv], input=stdin,
                            capture_output=True, cwd=REPO, env=full_env, timeout=timeout)
    return result.returncode, result.stdout, result.stderr.decode("utf-8", "replace")


def assert_one_error_line(returncode, stdout, stderr, message):
    assert returncode == 2, stderr
    assert "Traceback" not in stderr, stderr
    errors = re.findall(r"llama-brrr: error: (.*)", stderr)
    assert len(errors) == 1 and errors[0].strip(), stderr
    assert re.search(message, errors[0]), stderr


def test_huge_top_k_is_off_not_a_crash(tiny_gguf):
    result = run_cli("generate", "hi", "--model", tiny_gguf, "--device", "cpu", "--top-k",
                     3000000000, "--max-new-tokens", 4, "--threads", 1)
    assert result.returncode == 0, result.stderr
    llm = Llama.from_pretrained(str(tiny_gguf), device="cpu", progress=False, n_threads=1)
    assert result.stdout == llm.generate("hi", max_tokens=4)[0].text + "\n"


@pytest.mark.parametrize("args, message", [
    ((b"generate", b"h\xffi"), r"the prompt is not valid UTF-8 \(byte 0xff"),
    ((b"chat", b"--system", b"be \xfe"), r"--system is not valid UTF-8 \(byte 0xfe"),
], ids=["prompt", "system"])
def test_non_utf8_arguments_are_a_clean_error(tiny_gguf, args, message):
    assert_one_error_line(*run_cli_bytes(*args, b"--model", str(tiny_gguf), b"--device", b"cpu"),
                          message)


def test_non_utf8_chat_input_is_a_clean_error(tiny_gguf):
    code, stdout, stderr = run_cli_bytes(b"chat", b"--model", str(tiny_gguf), b"--device", b"cpu",
                                         b"--max-new-tokens", b"2", stdin=b"hi\nbad \xff line\n")
    assert_one_error_line(code, b"", stderr, r"chat input line 2 is not valid UTF-8")
    assert len(STATS_LINE.findall(stderr)) == 1  # the first line was answered


def test_non_utf8_model_path_is_printed_escaped():
    code, stdout, stderr = run_cli_bytes(b"generate", b"hi", b"--model", b"/nonexistent/\xff.gguf")
    assert_one_error_line(code, stdout, stderr, r"/nonexistent/\\udcff\.gguf")


@pytest.mark.parametrize("bos", [1.0, 1.5], ids=["1.0", "1.5"])
def test_float_bos_id_is_a_clean_error(tmp_path, monkeypatch, bos):
    import gguf

    monkeypatch.setattr(gguf.GGUFWriter, "add_bos_token_id",
                        lambda self, _: self.add_float32(gguf.Keys.Tokenizer.BOS_ID, bos))
    path = write_tiny_gguf(tmp_path / "float_bos.gguf")
    for command, stdin in (("generate", ""), ("chat", "hi\n")):
        args = [command] + (["hi"] if command == "generate" else []) + ["--model", path, "--device", "cpu"]
        result = run_cli(*args, stdin=stdin)
        assert_one_error_line(result.returncode, result.stdout, result.stderr,
                              r"float_bos\.gguf: tokenizer\.ggml\.bos_token_id = 1\.[05] is not an integer")


def test_empty_and_unexpected_exception_messages(monkeypatch, capsys):
    from llama_brrr import cli

    for error, message in ((MemoryError(), r"^MemoryError \(no message\)$"),
                           (RuntimeError("  "), r"^RuntimeError \(no message\)$"),
                           (OverflowError("too big"), r"^OverflowError: too big \(an unexpected"),
                           (KeyError(), r"^KeyError: KeyError \(no message\)")):
        def fail(args, error=error):
            raise error
        monkeypatch.setitem(cli.COMMANDS, "generate", cli.Command("", cli.add_generate_arguments, fail))
        assert cli.main(["generate", "hi"]) == 2
        err = capsys.readouterr().err
        assert_one_error_line(2, "", err, message)


def test_profile_without_out_says_how_to_get_files(tiny_gguf):
    result = run_cli("profile", "--model", tiny_gguf, "--device", "cpu", "--max-new-tokens", 2,
                     "--threads", 1)
    assert result.returncode == 0, result.stderr
    assert "no files written: add --out DIR" in result.stderr


# ---- the KV cache options reach the model -------------------------------------------------------

def spy_on_loading(monkeypatch) -> list:
    """Every Llama the command then loads (Llama.from_pretrained and Llama.random), in order."""
    loaded = []
    for name in ("from_pretrained", "random"):
        def spy(*args, _load=getattr(Llama, name), **kwargs):
            llm = _load(*args, **kwargs)
            loaded.append(llm)
            return llm
        monkeypatch.setattr(Llama, name, spy)
    return loaded


@pytest.mark.parametrize("option, kv_cache_dtype, pool", [
    ([], "auto", r"KV pool of \d+ blocks of 32, prefix"),
    (["--kv-cache-dtype", "fp8"], "fp8_e4m3", r"KV pool of \d+ blocks of 32 in fp8_e4m3, prefix"),
])
def test_serve_passes_the_kv_cache_options(tiny_gguf, monkeypatch, capsys, option, kv_cache_dtype, pool):
    from llama_brrr import cli
    from llama_brrr.serving import server

    served = {}

    def serve_nothing(engine, name, **kwargs):
        served["config"] = engine.llm.engine.config
        engine.close()

    loaded = spy_on_loading(monkeypatch)
    monkeypatch.setattr(server, "run_server", serve_nothing)
    assert cli.main(["serve", "--model", str(tiny_gguf), "--device", "cpu", "--threads", "1",
                     "--kv-block-size", "32", *option]) == 0
    assert len(loaded) == 1
    assert served["config"]["kv_cache_dtype"] == kv_cache_dtype
    assert served["config"]["kv_block_size"] == 32
    assert re.search(pool, capsys.readouterr().err)


def test_bench_serve_passes_kv_cache_dtype(tiny_gguf, monkeypatch, tmp_path):
    import json

    from llama_brrr import cli

    loaded = spy_on_loading(monkeypatch)
    out = tmp_path / "serve.json"
    assert cli.main(["bench", "serve", "--model", str(tiny_gguf), "--device", "cpu", "--threads", "1",
                     "--kv-cache-dtype", "fp8", "--modes", "scheduler", "--repeats", "1",
                     "--num-prompts", "2", "--input-len", "4", "--output-len", "2",
                     "--json", str(out)]) == 0
    assert [llm.engine.config["kv_cache_dtype"] for llm in loaded] == ["fp8_e4m3"]
    assert json.loads(out.read_text())["options"]["kv_cache_dtype"] == "fp8"


@pytest.mark.parametrize("flag,pipeline", [((), None), (("--pipeline",), True), (("--no-pipeline",), False)])
def test_bench_serve_passes_the_pipeline_choice(tiny_gguf, tmp_path, flag, pipeline):
    import json

    from llama_brrr import cli

    out = tmp_path / "serve.json"
    assert cli.main(["bench", "serve", "--model", str(tiny_gguf), "--device", "cpu", "--threads", "1",
                     "--modes", "scheduler", "--repeats", "1", "--num-prompts", "2", "--input-len", "4",
                     "--output-len", "2", *flag, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["options"]["pipeline"] is pipeline
