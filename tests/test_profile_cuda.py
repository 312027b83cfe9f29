"""The profiler on the CUDA backend (GPU machine only): the split adds up, graph-replayed decode is
sampled and scaled, kernel times agree with CUPTI (torch.profiler), profiling costs <= 5% of decode
speed, and runs of a known regime are classified as such."""

import statistics
import time

import pytest

torch = pytest.importorskip("torch")

from llama_brrr.config import ModelConfig  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def C(cuda_C):
    return cuda_C


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_BRRR_HOME", str(tmp_path / "home"))


def tiny_config():
    return ModelConfig(dim=128, hidden_dim=256, n_layers=2, n_heads=2, n_kv_heads=1,
                       vocab_size=512, max_seq_len=512, name="tiny")


def run(llm, prompt_len, new_tokens, rng):
    import llama_brrr

    prompt = rng.integers(0, llm.config.vocab_size, size=prompt_len).tolist()
    llm.generate(prompt, max_tokens=2, ignore_eos=True)  # warm-up: graphs captured
    with llama_brrr.profile() as prof:
        llm.generate(prompt, max_tokens=new_tokens, ignore_eos=True)
    return prof.summary()


def test_split_adds_up_and_graphs_are_sampled(C, rng):
    from llama_brrr import Llama

    llm = Llama.random("llama3.2-1b", device="cuda", max_seq_len=512, max_batch=1)
    s = run(llm, 37, 33, rng)
    for name, P in s.phases.items():
        total = P["compute_s"] + P["memory_s"] + P["overhead_s"]
        assert abs(total - P["wall_s"]) <= 0.01 * P["wall_s"], name
        assert 0 < P["busy_s"] <= P["wall_s"]
    calls = {k["name"]: k["calls"] for k in s.kernels if k["phase"] == "decode"}
    # 33 decode steps, each one graph replay of 16 layers; sampled replays stand for all of them.
    assert calls["wqkv"] == pytest.approx(33 * 16, rel=1e-6)
    assert calls["lm_head"] == pytest.approx(33, rel=1e-6)
    assert llm.engine.profile_enabled is False
    assert llm.engine.profile_records() == []


def test_kernel_times_match_cupti(C, rng):
    """Per op class, our event times against CUPTI's kernel durations over the same decode run."""
    import llama_brrr
    from llama_brrr.profiler import _torch_class
    from torch.profiler import ProfilerActivity, profile

    llm = llama_brrr.Llama.random("llama3.2-1b", device="cuda", max_seq_len=512, max_batch=1)
    prompt = rng.integers(0, llm.config.vocab_size, size=16).tolist()
    llm.generate(prompt, max_tokens=3, ignore_eos=True)
    llm.engine.use_cuda_graphs = False  # every step eager: every kernel timed by events
    with profile(activities=[ProfilerActivity.CUDA]) as tp:
        with llama_brrr.profile() as prof:
            llm.generate(prompt, max_tokens=16, ignore_eos=True)
    ours = {}
    for k in prof.summary().kernels:
        if k["phase"] == "decode":
            ours[k["op_class"]] = ours.get(k["op_class"], 0.0) + k["time_s"]
    cupti, launches = {}, {}
    for e in tp.events():
        if str(e.device_type).endswith("CUDA") and "memcpy" not in e.name.lower() \
                and "memset" not in e.name.lower():
            cls = _torch_class(e.name)
            cupti[cls] = cupti.get(cls, 0.0) + (e.time_range.end - e.time_range.start) * 1e-6
            launches[cls] = launches.get(cls, 0) + 1
    for cls in ("matmul", "attention"):  # the norms run inside the matmuls (rmsnorm_matmul_bf16)
        tolerance = max(0.05 * cupti[cls], 2e-6 * launches[cls])
        # Eager launches add the wait between an event and its kernel: ours may only be longer.
        assert cupti[cls] - tolerance <= ours[cls], cls
        assert ours[cls] - cupti[cls] <= tolerance + 5e-6 * launches[cls], cls


def decode_rate(llm, prompt, n, profiled):
    import llama_brrr

    torch.cuda.synchronize()
    if profiled:
        with llama_brrr.profile():
            t0 = time.perf_counter()
            llm.generate(prompt, max_tokens=n, ignore_eos=True)
            dt = time.perf_counter() - t0
    else:
        t0 = time.perf_counter()
        llm.generate(prompt, max_tokens=n, ignore_eos=True)
        dt = time.perf_counter() - t0
    return n / dt


def test_profiling_slows_graph_decode_by_at_most_5_percent(C, rng):
    from llama_brrr import Llama

    llm = Llama.random("llama3.2-1b", device="cuda", max_seq_len=1024, max_batch=1)
    prompt = rng.integers(0, llm.config.vocab_size, size=16).tolist()
    decode_rate(llm, prompt, 8, True)
    decode_rate(llm, prompt, 8, False)
    # Alternate, so drifting clocks hit both sides; compare medians.
    plain, profiled = [], []
    for _ in range(5):
        plain.append(decode_rate(llm, prompt, 128, False))
        profiled.append(decode_rate(llm, prompt, 128, True))
    slowdown = statistics.median(plain) / statistics.median(profiled) - 1
    assert slowdown <= 0.05, f"profiling slows decode by {100 * slowdown:.1f}%"


def test_tiny_ungraphed_decode_is_overhead_dominated(C, rng):
    from llama_brrr import Llama

    llm = Llama.random(tiny_config(), device="cuda", max_batch=1)
    llm.engine.use_cuda_graphs = False
    s = run(llm, 8, 32, rng)
    assert s.phases["decode"]["dominant"] == "overhead", s.table()


def test_1b_batch1_decode_is_memory_dominated(C, rng):
    from llama_brrr import Llama

    llm = Llama.random("llama3.2-1b", device="cuda", max_seq_len=512, max_batch=1)
    s = run(llm, 16, 64, rng)
    assert s.phases["decode"]["dominant"] == "memory", s.table()


def test_8b_long_prefill_is_compute_dominated(C, rng):
    from llama_brrr import Llama

    # Caching off: the warm-up runs the same prompt, and a cached prefix would leave the timed run
    # nothing to prefill.
    llm = Llama.random("llama3-8b", device="cuda", max_seq_len=2112, max_batch=1, enable_prefix_caching=False)
    s = run(llm, 2049, 1, rng)  # 2048 prompt tokens go through prefill, the last one through decode
    assert s.phases["prefill"]["dominant"] == "compute", s.table()
    assert s.phases["prefill"]["mfu"] > 0.05


def test_cuda_calibrate(C):
    from llama_brrr import peaks

    p = peaks.calibrate("cuda", quick=True)
    assert p.flops_measured > 1e12 and p.bw_measured > 1e11
    if p.flops_datasheet:
        assert p.flops_measured < 1.2 * p.flops_datasheet
        assert p.bw_measured < 1.2 * p.bw_datasheet
