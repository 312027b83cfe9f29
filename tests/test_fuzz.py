"""The model-file fuzzer (tests/fuzz/): a few hundred mutated files, each loaded and run in its own
forked process; none may crash, hang or change the output without an error.

The long run is `python -m tests.fuzz --cases 20000 --out tests/fuzz/results/summary.json`.
"""

import os
import random
import signal
import time

import pytest

from tests.fuzz import mutators, runner
from tests.fuzz.seeds import write_seeds

CI_CASES = 300


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("fuzz")
    fuzzer = runner.Fuzzer(write_seeds(scratch / "written", include_default=False), scratch / "run")
    yield fuzzer
    fuzzer.close()


def test_seeds_run_and_differ(fuzzer):
    # Every seed generated, and the seeds are distinct models (a fuzzer comparing against a
    # constant output would call every damaged file "identical").
    outputs = {name: str(b["tokens"]) for name, b in fuzzer.baselines.items()}
    assert len(set(outputs.values())) == len(outputs), outputs
    for name, baseline in fuzzer.baselines.items():
        assert baseline["finite"] and len(baseline["tokens"][0]) == runner.MAX_TOKENS, name


def test_fuzz_ci_cases(fuzzer):
    run_seed = int(os.environ.get("BRRR_TEST_SEED", random.randrange(2**32)))
    print(f"fuzz seed {run_seed}: replay one case with python -m tests.fuzz --no-default --seed {run_seed} "
          f"--replay INDEX")
    start = time.perf_counter()
    cases = [fuzzer.run_case(i, run_seed, {}) for i in range(CI_CASES)]
    summary = runner.summarize(cases, "tests/test_fuzz.py", run_seed, time.perf_counter() - start)
    print({k: summary[k] for k in ("outcomes", "elapsed_s")})
    # The mix reaches every class it should: refusals, untouched output, legitimate changes.
    assert summary["outcomes"]["error"] > CI_CASES // 3
    assert summary["outcomes"]["identical"] + summary["outcomes"]["legitimate"] > 0
    report = "\n".join(f"case {f['case']} [{f['seed']}/{f['file']}] {f['outcome']}: {f['mutation']} -> "
                       f"{f['error'] or f['stage']}: {(f['message'] or '')[:200]}" for f in summary["failures"])
    assert summary["failures_total"] == 0, f"{summary['failures_total']} failing cases:\n{report}"


# ---- the fuzzer's own machinery can tell each outcome apart --------------------------------------

def test_fork_server_reports_hangs_and_signals(monkeypatch):
    monkeypatch.setattr(runner, "run_model", lambda path: time.sleep(60))
    start = time.perf_counter()
    assert runner._run_forked("unused", 1.0)["stage"] == "hang"
    assert time.perf_counter() - start < 10
    monkeypatch.setattr(runner, "run_model", lambda path: os.kill(os.getpid(), signal.SIGSEGV))
    assert runner._run_forked("unused", 10.0) == {"stage": "signal", "signal": "SIGSEGV"}
    monkeypatch.setattr(runner, "run_model", lambda path: {"stage": "done", "value": path})
    assert runner._run_forked("a path", 10.0) == {"stage": "done", "value": "a path"}


def test_classification_rules():
    baseline = {"stage": "done", "tokens": [[1, 2]], "prompt_ids": [3], "chat_prompt": [4], "chat_tokens": [5],
                "logprobs": [-1.0, -2.0], "finite": True}
    plain = mutators.Mutation("tensor:blk.0.attn_q.weight:offset", "x")
    legit = mutators.Mutation("kv:llama.rope.freq_base:value", "x")
    different = dict(baseline, tokens=[[1, 7]])
    assert runner.classify(baseline, baseline, plain) == "identical"
    assert runner.classify(different, baseline, plain) == "silent"
    assert runner.classify(different, baseline, legit) == "legitimate"
    assert runner.classify(dict(baseline, logprobs=[-1.0, -2.1]), baseline, plain) == "silent"
    assert runner.classify(baseline, baseline, mutators.Mutation("tensor:x:data", "nan")) == "silent"
    error = {"stage": "load", "bases": ["ModelFileError", "ValueError"], "origin": "/x/gguf.py"}
    assert runner.classify(dict(error, error="e"), baseline, plain) == "error"
    leaked = {"stage": "load", "error": "ValueError", "bases": ["ValueError"], "origin": "/site-packages/numpy/x.py"}
    assert runner.classify(leaked, baseline, plain) == "crash"
    ours = dict(leaked, origin="/repo/llama_brrr/model.py")
    assert runner.classify(ours, baseline, plain) == "error"
    assert runner.classify({"stage": "signal", "signal": "SIGABRT"}, baseline, plain) == "crash"
    assert runner.classify({"stage": "hang"}, baseline, plain) == "hang"
    assert mutators.is_legitimate("kv:general.name:value") and not mutators.is_legitimate("kv:general.alignment:value")
    assert not mutators.is_legitimate("kv:llama.block_count:value")


def test_gguf_layout_names_every_field(fuzzer):
    seed = next(s for s in fuzzer.seeds if s.name == "gguf-q8_0")
    layout = mutators.GGUFLayout(seed.files["model"].read_bytes())
    names = {f.name for f in layout.fields}
    assert {"header:n_tensors", "header:n_kv", "kv:llama.block_count:value", "kv:tokenizer.chat_template:value:length",
            "tensor:blk.0.attn_q.weight:offset", "tensor:blk.0.attn_q.weight:type",
            "tensor:blk.0.attn_q.weight:dim1"} <= names
    assert layout.data_start % layout.alignment == 0
    # Rebuilding with the same metadata gives the same file back.
    assert layout.rebuild(layout.kv_blobs()) == layout.data
