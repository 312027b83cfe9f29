"""The CPU engine's OpenMP wait policy: the package's short-spin default is what libgomp runs with
in the engine's process, and a user's own OMP_WAIT_POLICY / GOMP_SPINCOUNT wins over it. Speed is
measured by benchmarks/bench_busy_cpu.py, not here. Each case is a fresh interpreter, because
libgomp reads its environment once, when the extension loads it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

_C = pytest.importorskip("llama_brrr._C")


def run_engine_process(extra_env: dict) -> tuple[str, str]:
    """Imports llama_brrr, runs one parallel region of the CPU engine, and returns (the process's
    GOMP_SPINCOUNT as Python sees it, libgomp's own report of its settings)."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_VARS}
    env.update(extra_env, OMP_DISPLAY_ENV="VERBOSE",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    code = ("import os, llama_brrr\n"
            "config = llama_brrr.ModelConfig(dim=48, hidden_dim=80, n_layers=2, n_heads=4,\n"
            "    n_kv_heads=2, vocab_size=300, max_seq_len=32, name='tiny-wait-policy')\n"
            "llm = llama_brrr.Llama.random(config, device='cpu', n_threads=2)\n"
            "llm.generate([1, 2, 3], max_tokens=2, ignore_eos=True)\n"
            "print(os.environ.get('GOMP_SPINCOUNT'))\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1], done.stderr


def libgomp_setting(report: str, name: str) -> str:
    lines = [line for line in report.splitlines() if line.strip().startswith(name + " =")]
    assert lines, f"libgomp printed no {name}:\n{report}"
    return lines[0].split("=", 1)[1].strip().strip("'")


def test_package_default_spincount_is_in_force():
    import llama_brrr

    seen, report = run_engine_process({})
    assert seen == llama_brrr.DEFAULT_GOMP_SPINCOUNT
    assert libgomp_setting(report, "GOMP_SPINCOUNT") == llama_brrr.DEFAULT_GOMP_SPINCOUNT


def test_user_spincount_wins():
    seen, report = run_engine_process({"GOMP_SPINCOUNT": "12345"})
    assert seen == "12345"
    assert libgomp_setting(report, "GOMP_SPINCOUNT") == "12345"


def test_user_wait_policy_wins():
    seen, report = run_engine_process({"OMP_WAIT_POLICY": "ACTIVE"})
    assert seen == "None"  # the package set nothing
    assert libgomp_setting(report, "OMP_WAIT_POLICY") == "ACTIVE"
