"""benchmarks/bench_serve_step.py (the stub engine) and the block coverage the scheduler's decode
fast path reads (Request.kv_end)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stub_step_reports_host_time(tmp_path):
    out = tmp_path / "step"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serve_step.py"), "--engine", "stub",
                    "--rows", "12", "--context", "40", "--steps", "5", "--decode-steps", "1,3",
                    "--vocab", "500", "--out", str(out)], check=True, cwd=ROOT, capture_output=True)
    result = json.loads((out / "step.json").read_text())
    for k in (1, 3):
        run = result["runs"][f"decode_steps={k}"]
        assert run["rows"] == 12 and run["steps"] == 5
        assert run["engine_calls"]["decode_steps"] == 5
        assert run["host_us_per_step"] > 0 and 0 < run["host_share"] <= 1


def test_kv_end_tracks_each_table():
    from llama_brrr import Llama, ModelConfig
    from llama_brrr.sampling import SamplingParams

    config = ModelConfig(dim=32, hidden_dim=64, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=300,
                         max_seq_len=128, name="kvend")
    llm = Llama.random(config, device="cpu", max_batch=3, kv_blocks=10)  # tight: preemptions happen
    scheduler = llm.make_scheduler(decode_steps=4)
    manager = llm.block_manager
    requests = [llm._make_request(None, list(range(3, 3 + n)), SamplingParams(max_tokens=m, ignore_eos=True))
                for n, m in ((20, 60), (37, 30), (5, 70), (50, 20))]
    for r in requests:
        scheduler.add(r)
    while scheduler.has_work():
        scheduler.step()
        for r in scheduler.running:
            assert r.kv_end == min(len(manager._tables[r.slot]) * manager.block_size, manager.max_seq_len)
            assert r.kv_end >= r.prefilled
    assert scheduler.preemptions > 0
    assert all(r.kv_end == 0 and r.slot is None for r in requests)
    assert [len(r.token_ids) for r in requests] == [60, 30, 70, 20]
