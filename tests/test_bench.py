"""The benchmark harness on a tiny CPU workload (no speed assertions): `llama-brrr bench` and
`llama-brrr compare` end to end, the analytic FLOP / byte counts, the agreement checker, and the
README results block."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llama_brrr.bench import metrics
from llama_brrr.config import ModelConfig, shape_config

REPO = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--threads", "2", "--shape", "smollm2-135m", "-p", "8", "-n", "3",
        "--repeats", "2", "--warmup", "1"]


def cli(*args, check=True):
    done = subprocess.run([sys.executable, "-m", "llama_brrr", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    if check and done.returncode != 0:
        raise AssertionError(f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}")
    return done


def test_bench_cli_smoke(C, tmp_path):
    out = tmp_path / "bench.json"
    done = cli("bench", *TINY, "-b", "1,2", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["benchmark"] == "bench" and result["device"] == "cpu"
    assert result["command"] and result["versions"]["llama_brrr"]
    assert [r["name"] for r in result["runs"]] == ["b1 pp8 tg3", "b2 pp8 tg3"]
    for run in result["runs"]:
        assert len(run["ttft_s"]["repeats"]) == 2 and run["ttft_s"]["min"] > 0
        w = run["workload"]
        # The reported rates are the counted tokens over the measured seconds.
        assert run["decode_tok_s"]["repeats"] == pytest.approx(
            [w["batch"] * w["generate"] / t for t in run["decode_s"]["repeats"]], rel=1e-12)
        assert run["prefill_tok_s"]["repeats"] == pytest.approx(
            [w["batch"] * w["prompt"] / t for t in run["ttft_s"]["repeats"]], rel=1e-12)
        assert run["ms_per_token"] == pytest.approx(1e3 * run["decode_s"]["median"] / 3)
        assert run["prefill"]["flops"] > 0 and run["decode"]["bytes"] > 0
        # The instrumentation layer's split of our own run: every second accounted for.
        for phase in ("prefill", "decode"):
            part = run["split"][phase]
            assert part["wall_s"] > 0, run["split"]
            assert part["compute_s"] + part["memory_s"] + part["overhead_s"] == pytest.approx(part["wall_s"], rel=1e-6)
    assert "| smollm2-135m | f32   | 2     | tg3@8" in done.stdout


def test_compare_cli_smoke(C, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "compare.json"
    done = cli("compare", *TINY, "--contestants", "torch-eager,hf-sdpa,torch-compile,llama.cpp",
               "--json", str(out), "--no-png")
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    entries = run["contestants"]
    for key in ("llama_brrr", "torch-eager", "hf-sdpa"):
        check = entries[key]["check"]
        assert check["agrees"] is True, (key, check)
        assert check["max_abs_diff"] < 1e-3
        assert len(entries[key]["decode_tok_s"]["repeats"]) == 2
    for key in ("torch-eager", "hf-sdpa"):
        ratio = run["ratios"][key]
        assert ratio["decode_tok_s"] == pytest.approx(
            entries["llama_brrr"]["decode_tok_s"]["median"] / entries[key]["decode_tok_s"]["median"])
    # Opponents that cannot run here are skipped with a reason, not an error.
    assert "CUDA only" in entries["torch-compile"]["skipped"]
    assert "llama" in entries["llama.cpp"]["skipped"]
    assert "DISAGREES" not in done.stdout


def test_compare_out_of_budget_skips_what_would_not_fit(C, tmp_path):
    """--budget-s bounds the opponents and the profiled splits alike; each skip says why."""
    pytest.importorskip("torch")
    out = tmp_path / "compare.json"
    cli("compare", *TINY, "--contestants", "torch-eager", "--budget-s", "0", "--json", str(out), "--no-png")
    (run,) = json.loads(out.read_text())["runs"]
    entries = run["contestants"]
    assert "budget" in entries["torch-eager"]["skipped"]
    assert "budget" in entries["llama_brrr"]["split"]["unavailable"]
    assert entries["llama_brrr"]["decode_tok_s"]["median"] > 0


def test_compare_png(C, tmp_path):
    pytest.importorskip("matplotlib")
    from llama_brrr.bench import report

    rate = {"median": 10.0, "min": 9.0, "max": 11.0, "spread_pct": 20.0, "repeats": [9.0, 11.0]}
    result = {"device_name": "test", "runs": [{"model": "m", "name": "b1 pp8 tg2", "contestants": {
        "llama_brrr": {"decode_tok_s": rate, "prefill_tok_s": rate},
        "hf-sdpa": {"decode_tok_s": rate, "prefill_tok_s": rate}, "torch-compile": {"skipped": "x"}}}]}
    path = tmp_path / "c.png"
    report.plot_compare(result, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_says_how(monkeypatch, tmp_path):
    from llama_brrr.bench import report

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        report.plot_compare({"runs": []}, tmp_path / "x.png")


def test_bad_arguments_are_named(C):
    done = cli("bench", "--shape", "llama9-1t", check=False)
    assert done.returncode == 2 and "unknown shape 'llama9-1t'" in done.stderr
    done = cli("compare", "--contestants", "vllm", check=False)
    assert done.returncode == 2 and "--contestants: unknown ['vllm']" in done.stderr
    done = cli("bench", "-n", "x", check=False)
    assert done.returncode == 2 and "comma-separated integers" in done.stderr


def brute_force_work(c: ModelConfig, batch: int, prompt: int, steps: int):
    """FLOPs by walking every token of every sequence, matmul by matmul."""
    matmuls = [(c.q_dim, c.dim), (c.kv_dim, c.dim), (c.kv_dim, c.dim), (c.dim, c.q_dim),
               (c.hidden_dim, c.dim), (c.hidden_dim, c.dim), (c.dim, c.hidden_dim)]
    per_token = sum(2 * n * k for n, k in matmuls) * c.n_layers

    def attention(position):
        return c.n_layers * c.n_heads * (2 * c.head_dim * (position + 1)) * 2

    prefill = batch * (sum(per_token + attention(p) for p in range(prompt)) + 2 * c.vocab_size * c.dim)
    decode = batch * sum(per_token + attention(p) + 2 * c.vocab_size * c.dim
                         for p in range(prompt, prompt + steps))
    return prefill, decode


@pytest.mark.parametrize("shape", ["smollm2-135m", "llama3-8b", "llama3-70b"])
def test_analytic_flops_match_a_token_by_token_count(shape, rng):
    c = shape_config(shape)
    batch, prompt, steps = int(rng.integers(1, 5)), int(rng.integers(1, 40)), int(rng.integers(1, 9))
    prefill, decode = brute_force_work(c, batch, prompt, steps)
    assert metrics.prefill_work(c, batch, prompt, "bf16")["flops"] == pytest.approx(prefill, rel=1e-12)
    assert metrics.decode_work(c, batch, prompt, steps, "bf16")["flops"] == pytest.approx(decode, rel=1e-12)
    # bytes: bf16 weights once per step plus the KV rows read (keys up to the position) and written
    norms = (2 * c.n_layers + 1) * c.dim
    weights = 2 * (c.n_params() - norms) + 4 * norms  # matrices in bf16, norms in f32
    if not c.tie_embeddings:
        weights -= 2 * c.vocab_size * c.dim  # the embedding table is read one row at a time
    kv = sum(2 * c.n_layers * c.kv_dim * 2 * (p + 2) for p in range(prompt, prompt + steps)) * batch
    assert metrics.decode_work(c, batch, prompt, steps, "bf16")["bytes"] == pytest.approx(
        steps * weights + kv, rel=1e-12)


def test_summarize_and_utilization():
    s = metrics.summarize([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["spread_pct"]) == (2.0, 1.0, 3.0, 100.0)
    u = metrics.utilization({"flops": 10.0, "bytes": 20.0}, 2.0, {"flops": 10.0, "bandwidth": 20.0})
    assert u == {"mfu": 0.5, "mbu": 0.5}
    assert metrics.peaks("NVIDIA H100 80GB HBM3")["bandwidth"] == 3.35e12
    assert metrics.peaks("some CPU")["flops"] is None


def test_a_tensor_parallel_rank_needs_only_its_share_of_memory(monkeypatch):
    from llama_brrr.bench import harness

    c = shape_config("llama3-70b")
    weights = metrics.weight_bytes(c, "bf16")
    monkeypatch.setattr(harness, "free_memory", lambda device: 0.5 * weights)  # half the model free
    note = harness.fits(c, "bf16", "cuda:0", 1, 257, 1)
    assert note and "skipped" in note and "a GPU of" not in note
    assert harness.fits(c, "bf16", "cuda:0", 1, 257, 1, gpus=4) is None
    # 16 ranks of 8 KV heads: each keeps a whole head (replicated), so the KV share is 1/8, not 1/16
    kv = metrics.kv_bytes(c, 64 * 257, "bf16")
    monkeypatch.setattr(harness, "free_memory", lambda device: (weights / 16 + kv / 12) / 0.9)
    assert "a GPU of 16" in harness.fits(c, "bf16", "cuda:0", 64, 257, 1, gpus=16)
    monkeypatch.setattr(harness, "free_memory", lambda device: (weights / 16 + kv / 8) / 0.89)
    assert harness.fits(c, "bf16", "cuda:0", 64, 257, 1, gpus=16) is None


def test_tensor_parallel_utilization_is_a_share_of_the_whole_group():
    one = metrics.peaks("NVIDIA H100 80GB HBM3")
    four = metrics.peaks_of_group(one, 4)
    assert (four["flops"], four["bandwidth"]) == (4 * one["flops"], 4 * one["bandwidth"])
    assert "x 4 GPUs" in four["source"]
    assert metrics.peaks_of_group(one, 1) is one
    cpu = metrics.peaks("some CPU")
    assert metrics.peaks_of_group(cpu, 2)["bandwidth"] is None


def test_checker_flags_a_contestant_that_disagrees(C):
    torch = pytest.importorskip("torch")
    from llama_brrr import Llama
    from llama_brrr.bench.harness import Checker, Engine
    from llama_brrr.bench.weights import shared_weights

    config = ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
                         name="tiny")
    llm = Llama.random(config, seed=3, device="cpu", max_seq_len=64, max_batch=1, n_threads=2)
    weights = shared_weights(llm, None, 0.02, "cpu")
    assert torch.equal(weights["layers.1.wk"], torch.from_numpy(llm.engine.get_weight("layers.1.wk")))
    checker = Checker(llm, weights, "cpu")
    assert checker.check(Engine(llm))["agrees"] is True

    class OffByALittle:
        key = "perturbed"

        def last_logits(self, ids):
            logits = Engine(llm).last_logits(ids)
            return logits + 2e-3 * np.sign(np.random.default_rng(0).standard_normal(logits.shape))

    verdict = checker.check(OffByALittle())
    assert verdict["agrees"] is False and verdict["max_abs_diff"] > 1e-3


def test_readme_results_block(tmp_path):
    spec = importlib.util.spec_from_file_location("readme_results", REPO / "scripts" / "readme_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:begin -->\nstale\n<!-- results:end -->\noutro\n")
    module.rewrite(readme, REPO / "benchmarks" / "results")
    text = readme.read_text()
    assert text.startswith("intro\n<!-- results:begin -->\n") and text.endswith("<!-- results:end -->\noutro\n")
    assert "stale" not in text and "llama_brrr" in text
    # Every number in the block comes from a results file: the committed H100 bench run's 1B rate.
    bench = json.loads((REPO / "benchmarks/results/h100-sxm/bench.json").read_text())
    run = next(r for r in bench["runs"] if r["model"] == "llama3.2-1b")
    assert f"{run['decode_tok_s']['median']:.1f}" in text
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="results:begin"):
        module.rewrite(readme, REPO / "benchmarks" / "results")


def test_readme_flags_torch_compile_on_a_longer_workloads_cache():
    """Compare files made before the harness sized torch.compile's cache per workload name the
    workload the cache was sized for, beside each shorter workload's torch.compile figure."""
    spec = importlib.util.spec_from_file_location("readme_results", REPO / "scripts" / "readme_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(prompt, note):
        entry = {"note": note, "prefill_tok_s": {"median": 1.0}, "check": {"agrees": True}}
        return {"model": "m", "dtype": "bf16", "name": f"b1 pp{prompt}", "workload": {"prompt": prompt, "generate": 0},
                "contestants": {"llama_brrr": {"prefill_tok_s": {"median": 2.0}}, "torch-compile": entry}}

    old = {"benchmark": "compare", "date_utc": "2026-11-25T22:06:47+00:00",
           "runs": [run(512, "cuda bfloat16, static KV cache"), run(8192, "cuda bfloat16, static KV cache")]}
    opponents = [row[4] for row in module.rows_compare(old, "src")]
    assert opponents == ["torch-compile (cache sized for pp8192)", "torch-compile"]
    new = dict(old, date_utc="2026-11-26T00:00:00+00:00")
    assert [row[4] for row in module.rows_compare(new, "src")] == ["torch-compile"] * 2
    named = dict(old, runs=[run(512, "static KV cache of 513 positions"), run(8192, "static KV cache of 8193 positions")])
    assert [row[4] for row in module.rows_compare(named, "src")] == ["torch-compile"] * 2


def test_static_cache_decoder_matches_the_reference(C, rng, make_weights):
    """The torch.compile opponent's model (run uncompiled here) computes what reference.py does:
    prefill, then decode steps through its static cache, at batch 2."""
    torch = pytest.importorskip("torch")
    from llama_brrr.bench.compiled import StaticCacheLlama
    from llama_brrr.reference import ReferenceLlama

    config = ModelConfig(dim=64, hidden_dim=96, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                         name="tiny")
    tensors = {k: torch.from_numpy(v) for k, v in make_weights(config, rng).items()}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        tensors[p + "wqkv"] = torch.cat([tensors[p + "wq"], tensors[p + "wk"], tensors[p + "wv"]])
        tensors[p + "w13"] = torch.cat([tensors[p + "w1"], tensors[p + "w3"]])
    reference = ReferenceLlama(config, {k: tensors[k] for k in config.tensor_shapes()})
    static = StaticCacheLlama(config, tensors, batch=2, max_seq=40, device="cpu", dtype=torch.float32)
    prompts = torch.as_tensor(rng.integers(0, config.vocab_size, size=(2, int(rng.integers(3, 20)))))
    T = prompts.shape[1]
    want = reference.forward(prompts)[:, -1]
    got = static.forward(prompts, torch.arange(T))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    token = want.argmax(-1)
    for step in range(3):
        want = reference.forward(token[:, None], start_pos=T + step)[:, -1]
        got = static.forward(token[:, None], torch.tensor([T + step]))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        token = want.argmax(-1)


def test_quant_peer_arguments_are_checked(C):
    done = cli("compare", "--workloads", "32:x", check=False)
    assert done.returncode == 2 and "PROMPT:GENERATED pairs such as 32:256,512:0, got '32:x'" in done.stderr
    done = cli("compare", "--shape", "smollm2-135m", "--quant-twins", "q8_0", check=False)
    assert done.returncode == 2 and "--quant-twins requantizes a GGUF" in done.stderr
    done = cli("compare", "--perplexity", *TINY, check=False)
    assert done.returncode == 2 and "--perplexity goes with --quant-twins" in done.stderr


def test_workloads_pairs_replace_the_product(C, tmp_path):
    out = tmp_path / "bench.json"
    cli("bench", "--device", "cpu", "--threads", "2", "--shape", "smollm2-135m", "--workloads", "5:3,9:0",
        "--repeats", "1", "--warmup", "0", "--no-split", "--json", str(out))
    runs = json.loads(out.read_text())["runs"]
    assert [(r["workload"]["prompt"], r["workload"]["generate"]) for r in runs] == [(5, 3), (9, 0)]
    assert "decode_tok_s" in runs[0] and "decode_tok_s" not in runs[1]


def _rate(median, spread=10.0):
    return {"median": median, "min": median * 0.95, "max": median * 1.05, "spread_pct": spread,
            "repeats": [median]}


def test_peer_targets_pick_each_phase_and_its_target():
    from llama_brrr.bench.harness import peer_targets
    from llama_brrr.bench.report import print_quant_peer

    def run(file_type, prompt, generate, ours, theirs):
        entries = {"llama_brrr": {"prefill_tok_s": _rate(ours[0])}, "llama.cpp": {"prefill_tok_s": _rate(theirs[0])}}
        ratios = {"prefill_tok_s": ours[0] / theirs[0]}
        if generate:
            entries["llama_brrr"]["decode_tok_s"] = _rate(ours[1])
            entries["llama.cpp"]["decode_tok_s"] = _rate(theirs[1])
            ratios["decode_tok_s"] = ours[1] / theirs[1]
        return {"file_type": file_type, "name": f"b1 pp{prompt}" + (f" tg{generate}" if generate else ""),
                "workload": {"batch": 1, "prompt": prompt, "generate": generate},
                "contestants": entries, "ratios": {"llama.cpp": ratios}}

    result = {"runs": [run("Q4_1", 32, 256, (100, 170), (90, 100)), run("Q4_1", 512, 0, (500, 0), (600, 0)),
                       run("Q8_0", 32, 256, (100, 140), (90, 100)), run("Q5_1", 32, 256, (100, 140), (90, 100))]}
    rows = peer_targets(result)
    # The decode workload's short-prompt prefill is left out; the prefill-only workload counts.
    assert [(r["file_type"], r["metric"], r["target"], r["met"]) for r in rows] == [
        ("Q4_1", "decode_tok_s", 1.6, True), ("Q4_1", "prefill_tok_s", 1.0, False),
        ("Q8_0", "decode_tok_s", 1.3, True), ("Q5_1", "decode_tok_s", None, None)]
    assert rows[1]["ratio"] == pytest.approx(500 / 600)
    census = {"types": {"F32": 61, "Q4_1": 210}, "families": {}, "bytes": 1}
    result.update(threads=2, targets=rows, files={"Q4_1": {
        "file_bytes": 98e6, "census": census, "made_by": "the source file",
        "rss": {"llama_brrr": {"rss_after_load": 250e6, "peak_rss": 300e6}, "llama.cpp": {"unavailable": "x"}},
        "perplexity": {"llama_brrr": 17.4, "llama.cpp": 17.5, "ratio": 17.4 / 17.5}}})
    text = print_quant_peer(result)
    assert "| Q4_1 | b1 pp512" in text and "NOT MET" in text and "F32 61, Q4_1 210" in text
    assert "17.400 / 17.500 (-0.57%)" in text


def test_main_type_of_a_census():
    from llama_brrr.bench.harness import main_type

    assert main_type({"types": {"F32": 61, "Q4_1": 210, "Q8_0": 1}}) == "Q4_1"
    assert main_type({"types": {"F32": 3}}) == "F32"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
def test_compare_quant_twins_end_to_end(C, tmp_path):
    """The default file and its Q8_0 twin (made by llama.cpp's quantize into the test's temporary
    home), one short workload each, against llama.cpp: census, RSS and targets in the JSON."""
    from llama_brrr import fetch

    if fetch.local_default_model() is None:
        pytest.skip(f"default model not found at {fetch.default_model_path()}")
    out = tmp_path / "q.json"
    done = cli("compare", "--device", "cpu", "--threads", "2", "--model", "default", "--quant-twins", "q8_0",
               "--workloads", "6:4,12:0", "--contestants", "llama.cpp", "--repeats", "1", "--warmup", "0",
               "--no-split", "--json", str(out), "--no-png")
    result = json.loads(out.read_text())
    assert result["benchmark"] == "compare_quant" and list(result["files"]) == ["Q4_1", "Q8_0"]
    twin = result["files"]["Q8_0"]
    assert set(twin["census"]["types"]) == {"F32", "Q8_0"} and "llama-cpp-python" in twin["made_by"]
    assert Path(twin["path"]).parent == fetch.cache_dir() / "bench"  # the test's temporary home
    for f in result["files"].values():
        assert f["rss"]["llama_brrr"]["peak_rss"] >= f["rss"]["llama_brrr"]["rss_after_load"] > 0
        assert f["rss"]["llama.cpp"]["rss_after_load"] > 0
    assert [(r["file_type"], r["metric"]) for r in result["targets"]] == [
        ("Q4_1", "decode_tok_s"), ("Q4_1", "prefill_tok_s"), ("Q8_0", "decode_tok_s"), ("Q8_0", "prefill_tok_s")]
    for run in result["runs"]:
        assert run["contestants"]["llama.cpp"]["prefill_tok_s"]["median"] > 0
    assert "issue 31 targets" in done.stdout
