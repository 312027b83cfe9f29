"""The llama.cpp CUDA peer without a GPU: llama-bench's command line and JSON (a real output of a CPU
build, tests/data/llamacpp_bench_cpu_tiny.json), the compare contestant driven through a stand-in
llama-bench program, and the random-weight F16 GGUF that llama.cpp's quantizer starts from.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from llama_brrr.bench import harness
from llama_brrr.bench import llamacpp as lc
from llama_brrr.loaders.gguf import gguf_tensor_name
from llama_brrr.bench.contestants import Skip

FIXTURE = Path(__file__).parent / "data" / "llamacpp_bench_cpu_tiny.json"


def fixture_tests() -> list[dict]:
    return lc.parse_llama_bench(FIXTURE.read_text())


def fake_llama_bench(folder: Path, tests: list[dict], rc: int = 0) -> Path:
    """An executable llama-bench in `folder` that logs its arguments and prints `tests` as JSON
    (its --version prints a version line)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "out.json").write_text(json.dumps(tests))
    program = folder / "llama-bench"
    program.write_text(f"""#!/bin/sh
echo "$@" >> {folder}/argv.log
if [ "$1" = "--version" ]; then echo "version: 0.5.0-dev (build 0, commit 0c1e570)" >&2; exit 0; fi
echo "ggml_cuda_init: found 1 CUDA devices" >&2
cat {folder}/out.json
exit {rc}
""")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


def as_cuda(tests: list[dict]) -> list[dict]:
    return [dict(t, backends="CUDA") for t in tests]


# ---- llama-bench's JSON -------------------------------------------------------------------------

def test_fixture_parses_into_every_test_at_both_depths():
    tests = fixture_tests()
    assert [lc.bench_test_name(t) for t in tests] == [
        "pp16", "tg8", "pp16+tg8", "pp16 @ d16", "tg8 @ d16", "pp16+tg8 @ d16"]
    assert {t["backends"] for t in tests} == {"CPU"} and {t["build_commit"] for t in tests} == {"0c1e570"}


def test_summary_rates_match_llama_bench_own():
    """tok/s computed here from samples_ns equal llama-bench's own samples_ts (printed to 6
    significant digits) and average to its avg_ts."""
    for test in fixture_tests():
        s = lc.summarize_test(test)
        assert s["repetitions"] == len(test["samples_ns"]) == 3
        np.testing.assert_allclose(s["tok_s_samples"], test["samples_ts"], rtol=1e-5)
        assert s["tok_s_mean"] == test["avg_ts"]
        assert np.mean(s["tok_s_samples"]) == pytest.approx(test["avg_ts"], rel=1e-6)
        assert s["build_commit"] == "0c1e570" and s["flash_attn"] == 1 and s["n_gpu_layers"] == 99


def test_find_test_picks_prompt_and_depth_and_names_what_ran():
    tests = fixture_tests()
    assert lc.find_test(tests, 0, 8, 16) is tests[4]
    assert lc.find_test(tests, 16, 0, 0) is tests[0]
    with pytest.raises(lc.BenchError, match=r"no tg128 @ d128 test \(it ran pp16, tg8"):
        lc.find_test(tests, 0, 128, 128)


@pytest.mark.parametrize("text, match", [
    ("llama_model_load: error loading model", "printed no JSON"),
    ("[]", "not a list of tests"),
    ('{"n_prompt": 1}', "not a list of tests"),
    ('[{"n_prompt": 16, "n_gen": 0}]', r"lacks \['n_depth', 'samples_ns'"),
])
def test_bad_llama_bench_output_is_named(text, match):
    with pytest.raises(lc.BenchError, match=match):
        lc.parse_llama_bench(text)


def test_a_cpu_build_is_refused_as_the_cuda_peer():
    with pytest.raises(lc.BenchError, match=r"on 'CPU', not CUDA: build llama.cpp with -DGGML_CUDA=ON"):
        lc.require_backend(fixture_tests(), "CUDA")
    lc.require_backend(as_cuda(fixture_tests()), "CUDA")


# ---- the command line -----------------------------------------------------------------------------

def test_command_line_runs_prefill_at_depth_zero_and_decode_after_the_prompt():
    cmd = lc.llama_bench_command(Path("/b/llama-bench"), "/m/x.gguf", 128, 256, 1)
    assert cmd == ["/b/llama-bench", "-m", "/m/x.gguf", "-ngl", "99", "-fa", "1", "-p", "128",
                   "-n", "256", "-d", "0,128", "-r", "1", "-o", "json"]
    assert lc.llama_bench_command(Path("lb"), "x.gguf", 512, 0, 3)[-8:] == [
        "-n", "0", "-d", "0", "-r", "3", "-o", "json"]


@pytest.mark.parametrize("prompt, generate, reps", [(0, 8, 1), (8, -1, 1), (8, 8, 0)])
def test_command_line_rejects_impossible_workloads(prompt, generate, reps):
    with pytest.raises(ValueError, match="llama-bench needs prompt >= 1"):
        lc.llama_bench_command(Path("lb"), "x.gguf", prompt, generate, reps)


def test_program_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(lc.LLAMACPP_BIN_ENV, raising=False)
    with pytest.raises(LookupError, match="set LLAMA_BRRR_LLAMACPP_BIN"):
        lc.llama_bench_program()
    monkeypatch.setenv(lc.LLAMACPP_BIN_ENV, str(tmp_path))
    with pytest.raises(lc.BenchError, match="no executable llama-bench in"):
        lc.llama_bench_program()
    program = fake_llama_bench(tmp_path, [])
    assert lc.llama_bench_program() == program


# ---- the compare contestant ---------------------------------------------------------------------------

def test_contestant_times_from_llama_bench_samples(tmp_path):
    tests = as_cuda(fixture_tests())
    program = fake_llama_bench(tmp_path / "bin", tests)
    bench = lc.LlamaBench(program, "/m/tiny.gguf")
    assert "commit 0c1e570" in bench.settings["version"]
    prompts = np.zeros((1, 16), np.int32)
    # a warm-up round runs nothing: llama-bench warms each test up itself
    assert harness.measure(bench, prompts, 8, 0, 1) == {"ttft_s": [], "decode_s": [], "tokens": None}
    timed = harness.measure(bench, prompts, 8, 1, 0)
    assert timed["ttft_s"] == [ns / 1e9 for ns in tests[0]["samples_ns"]]      # pp16, depth 0
    assert timed["decode_s"] == [ns / 1e9 for ns in tests[4]["samples_ns"]]    # tg8 after 16
    assert timed["tokens"] is None
    argv = (tmp_path / "bin" / "argv.log").read_text().splitlines()
    assert argv == ["--version", "-m /m/tiny.gguf -ngl 99 -fa 1 -p 16 -n 8 -d 0,16 -r 1 -o json"]
    assert [s["test"] for s in bench.settings["tests"]][4] == "tg8 @ d16"
    with pytest.raises(NotImplementedError, match="speeds only"):
        bench.last_logits([1, 2, 3])
    with pytest.raises(ValueError, match="batch 1"):
        bench.timed_runs(np.zeros((2, 16), np.int32), 8, 1, 0)


def test_contestant_reports_a_failing_or_cpu_llama_bench(tmp_path):
    failing = lc.LlamaBench(fake_llama_bench(tmp_path / "a", as_cuda(fixture_tests()), rc=3), "m.gguf")
    with pytest.raises(lc.BenchError, match="exited with status 3: ggml_cuda_init"):
        failing.timed_runs(np.zeros((1, 16), np.int32), 8, 1, 0)
    cpu = lc.LlamaBench(fake_llama_bench(tmp_path / "b", fixture_tests()), "m.gguf")
    with pytest.raises(lc.BenchError, match="not CUDA"):
        cpu.timed_runs(np.zeros((1, 16), np.int32), 8, 1, 0)
    short = lc.LlamaBench(fake_llama_bench(tmp_path / "c", as_cuda(fixture_tests())), "m.gguf")
    with pytest.raises(lc.BenchError, match="no tg9 @ d16 test"):
        short.timed_runs(np.zeros((1, 16), np.int32), 9, 1, 0)


class _Llm:
    source, config, dtype = "/m/tiny.gguf", lc.PEER_TINY, "f32"


@pytest.mark.parametrize("device, model, batch, env, match", [
    ("cpu", "/m/tiny.gguf", 1, True, "compare on a GPU, not cpu"),
    ("cuda", None, 1, True, "pass --model FILE.gguf"),
    ("cuda", "/m/tiny.gguf", 4, True, "batch 1 only"),
    ("cuda", "/m/tiny.gguf", 1, False, "set LLAMA_BRRR_LLAMACPP_BIN"),
])
def test_opponent_is_skipped_with_the_reason(tmp_path, monkeypatch, device, model, batch, env, match):
    monkeypatch.delenv(lc.LLAMACPP_BIN_ENV, raising=False)
    if env:
        fake_llama_bench(tmp_path, [])
        monkeypatch.setenv(lc.LLAMACPP_BIN_ENV, str(tmp_path))
    opts = harness.Options(model=model)
    with pytest.raises(Skip, match=match):
        harness.build_opponent("llama.cpp-cuda", opts, _Llm(), None, device,
                               harness.Workload(batch, 16, 8), {})


def test_opponent_is_built_on_cuda_with_a_program(tmp_path, monkeypatch):
    fake_llama_bench(tmp_path, [])
    monkeypatch.setenv(lc.LLAMACPP_BIN_ENV, str(tmp_path))
    opponent = harness.build_opponent("llama.cpp-cuda", harness.Options(model="/m/tiny.gguf"), _Llm(),
                                      None, "cuda", harness.Workload(1, 16, 8), {})
    assert isinstance(opponent, lc.LlamaBench) and opponent.model_path == "/m/tiny.gguf"
    assert "llama.cpp-cuda" in harness.OPPONENTS and "llama.cpp-cuda" in harness.FILE_OPPONENTS


# ---- the random F16 GGUF ------------------------------------------------------------------------------

def test_pool_window_wraps():
    pool = np.arange(10)
    np.testing.assert_array_equal(lc._pool_window(pool, 7, 8), [7, 8, 9, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(lc._pool_window(pool, 3, 25), np.r_[3:10, 0:10, 0:8])


def test_random_gguf_holds_random_f16_matrices(tmp_path):
    import gguf

    config = lc.PEER_TINY
    path = lc.write_random_gguf(tmp_path / "tiny.gguf", config, seed=3)
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(config.tensor_shapes())
    for name, shape in config.tensor_shapes().items():
        t = tensors[gguf_tensor_name(name)]
        data = np.asarray(t.data)
        assert tuple(data.shape) == shape
        if len(shape) == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            assert abs(data.mean() - 1) < 0.01 and 0.01 < data.std() < 0.03
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F16
            assert abs(float(data.astype(np.float32).std()) - 0.02) < 0.001
            # every row differs from every other
            assert len({row.tobytes() for row in data}) == shape[0]
    field = reader.fields["llama.block_count"]
    assert int(field.parts[field.data[0]][0]) == config.n_layers
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == config.vocab_size


def test_random_gguf_loads_in_llama_brrr(tmp_path):
    from llama_brrr import Llama

    path = lc.write_random_gguf(tmp_path / "tiny.gguf", lc.PEER_TINY)
    llm = Llama.from_pretrained(str(path), device="cpu", max_seq_len=32, max_batch=1, progress=False)
    assert (llm.config.dim, llm.config.n_layers, llm.config.vocab_size) == (256, 2, 2048)
    w = llm.engine.get_weight("layers.1.w2")
    assert w.shape == (256, 512) and 0.019 < float(w.std()) < 0.021


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_random_gguf_loads_and_runs_in_llama_cpp(tmp_path):
    """llama.cpp accepts the writer's hyperparameters and vocabulary, and its logits are finite
    and not constant."""
    import llama_cpp

    path = lc.write_random_gguf(tmp_path / "tiny.gguf", lc.PEER_TINY)
    with lc.stderr_to(tmp_path / "llama.log"):
        llm = lc.open_llama(str(path), n_ctx=32, n_threads=1, verbose=False)
        llm.eval([1, 7, 300, 2047])
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                   shape=(llm.n_vocab(),)).copy()
    assert llm.n_vocab() == 2048
    assert np.isfinite(logits).all() and float(logits.std()) > 0


# ---- on the GPU machine, with the build of scripts/gpu_llamacpp_peer.sh -----------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not os.environ.get(lc.LLAMACPP_BIN_ENV), reason=f"{lc.LLAMACPP_BIN_ENV} is not set")
def test_cuda_llama_bench_times_a_random_file(tmp_path):
    path = lc.write_random_gguf(tmp_path / "tiny.gguf", lc.PEER_TINY)
    bench = lc.LlamaBench(lc.llama_bench_program(), str(path))
    timed = bench.timed_runs(np.zeros((1, 16), np.int32), 8, 2, 0)
    assert len(timed["ttft_s"]) == len(timed["decode_s"]) == 2
    assert all(0 < t < 10 for t in timed["ttft_s"] + timed["decode_s"])
    assert {s["backends"] for s in bench.settings["tests"]} == {"CUDA"}
