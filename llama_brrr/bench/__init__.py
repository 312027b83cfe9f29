"""Benchmarks that ship with the package: `llama-brrr bench` (llama_brrr alone, llama-bench style)
and `llama-brrr compare` (llama_brrr against PyTorch eager, HF transformers, torch.compile and
llama.cpp on the same weights, checked to agree, as ratios).

  harness.py      workloads, timing, agreement checks, sweeps
  contestants.py  llama_brrr and the PyTorch opponents behind one prefill / decode interface
  compiled.py     the torch.compile opponent (static KV cache, CUDA graphs)
  llamacpp.py     llama.cpp through llama-cpp-python, and llama.cpp-written F32 / F16 GGUF twins
  weights.py      the engine's weights as torch tensors
  metrics.py      statistics, analytic FLOPs / bytes, peaks, machine and version facts
  report.py       tables, JSON, the grouped bar chart
"""

from .harness import Options, Workload, run_bench, run_compare, sweep_groups

__all__ = ["Options", "Workload", "run_bench", "run_compare", "sweep_groups"]
