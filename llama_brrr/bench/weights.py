"""The engine's weights as torch tensors, so every PyTorch contestant runs exactly the numbers
llama_brrr runs.

Each layer's wq|wk|wv and w1|w3 are row ranges of one fused tensor ("layers.i.wqkv" / "w13", also
returned), as in the engine, so the torch.compile contestant gets the fused matmuls for free.
Random CUDA shapes are redrawn on the device with the engine's own generator (fill_normal_bf16
under init_random_key(seed, index)), which takes no host memory; everything else is read back
from the engine with get_weight.
"""

from __future__ import annotations

TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def torch_dtype(dtype: str):
    import torch

    return getattr(torch, TORCH_DTYPES[dtype])


def shared_weights(llm, random_seed: int | None, init_std: float, device: str) -> dict:
    """name -> torch tensor on `device` in llm.dtype, equal to the weights inside llm's engine.

    random_seed: the seed llm was drawn with by Llama.random (None for a loaded model).
    """
    import torch

    config, dtype = llm.config, torch_dtype(llm.dtype)
    shapes = config.tensor_shapes()
    tensors = {}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        wqkv = torch.empty(config.q_dim + 2 * config.kv_dim, config.dim, dtype=dtype, device=device)
        w13 = torch.empty(2 * config.hidden_dim, config.dim, dtype=dtype, device=device)
        tensors[p + "wqkv"], tensors[p + "w13"] = wqkv, w13
        tensors[p + "wq"] = wqkv[: config.q_dim]
        tensors[p + "wk"] = wqkv[config.q_dim: config.q_dim + config.kv_dim]
        tensors[p + "wv"] = wqkv[config.q_dim + config.kv_dim:]
        tensors[p + "w1"], tensors[p + "w3"] = w13[: config.hidden_dim], w13[config.hidden_dim:]
    redraw = random_seed is not None and device.startswith("cuda") and llm.dtype == "bf16"
    from llama_brrr import _C

    for index, name in enumerate(shapes):
        if name not in tensors:
            tensors[name] = torch.empty(shapes[name], dtype=dtype, device=device)
        target = tensors[name]
        if redraw:
            mean = 1.0 if name.endswith("norm") else 0.0
            _C.testing.fill_normal_bf16(target.data_ptr(), target.numel(),
                                         _C.testing.init_random_key(random_seed, index), mean,
                                         init_std)
        else:
            target.copy_(torch.from_numpy(llm.engine.get_weight(name)))
    return tensors


def canonical(tensors: dict, config) -> dict:
    """Only the canonical names (what ReferenceLlama and HF take)."""
    return {name: tensors[name] for name in config.tensor_shapes()}
