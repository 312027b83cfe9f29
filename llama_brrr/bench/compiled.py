"""The torch.compile contestant: a gpt-fast-style static-KV-cache Llama. Its own module because
it subclasses torch.nn.Module, and torch is imported only when a PyTorch contestant runs."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..reference import rope_inv_freq
from .contestants import Skip, _Torch


class StaticCacheLlama(torch.nn.Module):
    """A Llama forward over a preallocated KV cache [layers, B, kv_heads, max_seq, head_dim] with
    fused wqkv / w13: the math of reference.py (fp32 norm statistics and RoPE angles, rotate-half)
    written so torch.compile sees fixed shapes. The caches are registered buffers and the weights
    hang off the module, so CUDA-graph trees treat both as static addresses (no copy per replay,
    and the in-place cache writes stay inside the graph)."""

    def __init__(self, config, weights: dict, batch: int, max_seq: int, device: str, dtype):
        super().__init__()
        self.c, self.w = config, weights
        cache_shape = (config.n_layers, batch, config.n_kv_heads, max_seq, config.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros_like(self.k_cache))
        self.register_buffer("inv_freq", rope_inv_freq(config).to(device))
        self.register_buffer("key_positions", torch.arange(max_seq, device=device))
        self.lm_head = weights["tok_embeddings" if config.tie_embeddings else "output"]

    def rmsnorm(self, x, weight):
        x32 = x.float()
        return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.c.norm_eps)).to(x.dtype)

    @staticmethod
    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def forward(self, tokens, positions):
        """tokens [B, T] int64 at positions [T] int64 (device) -> last-position logits [B, V] fp32."""
        c = self.c
        B, T = tokens.shape
        angles = positions.float()[:, None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(self.k_cache.dtype), angles.sin().to(self.k_cache.dtype)
        mask = self.key_positions[None, :] <= positions[:, None]  # [T, max_seq]
        x = self.w["tok_embeddings"][tokens]
        for i in range(c.n_layers):
            p = f"layers.{i}."
            qkv = self.rmsnorm(x, self.w[p + "attn_norm"]) @ self.w[p + "wqkv"].T
            q, k, v = qkv.split([c.q_dim, c.kv_dim, c.kv_dim], dim=-1)
            q = self.rope(q.view(B, T, c.n_heads, c.head_dim).transpose(1, 2), cos, sin)
            k = self.rope(k.view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2), cos, sin)
            self.k_cache[i].index_copy_(2, positions, k)
            self.v_cache[i].index_copy_(2, positions, v.view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2))
            attn = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i], attn_mask=mask,
                                                  enable_gqa=c.n_heads != c.n_kv_heads)
            x = x + attn.transpose(1, 2).reshape(B, T, c.q_dim) @ self.w[p + "wo"].T
            gate, up = (self.rmsnorm(x, self.w[p + "ffn_norm"]) @ self.w[p + "w13"].T).split(c.hidden_dim, dim=-1)
            x = x + (F.silu(gate) * up) @ self.w[p + "w2"].T
        return (self.rmsnorm(x[:, -1], self.w["norm"]) @ self.lm_head.T).float()

    def greedy(self, tokens, positions):
        return self.forward(tokens, positions).argmax(-1)


class Compiled(_Torch):
    """StaticCacheLlama under torch.compile: decode with CUDA graphs, prefill compiled per length."""

    key, label = "torch-compile", "torch.compile (static cache)"

    def __init__(self, config, weights: dict, device: str, dtype, batch: int, max_seq: int):
        super().__init__(device)
        if not device.startswith("cuda"):
            raise Skip("torch.compile's reduce-overhead mode is CUDA graphs: CUDA only")
        self.batch, self.max_seq = batch, max_seq
        self.model = StaticCacheLlama(config, weights, batch, max_seq, device, dtype)
        torch = self.torch
        self.decode_step = torch.compile(self.model.greedy, mode="reduce-overhead", fullgraph=True)
        self.prefill_step = torch.compile(self.model.greedy, fullgraph=True, dynamic=False)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.note = (f"{device} {str(dtype).replace('torch.', '')}, static KV cache of {max_seq} positions, "
                     f"fused wqkv/w13")

    def prefill(self, prompts):
        ids = self.ids(prompts)
        if ids.shape[0] != self.batch:
            raise Skip(f"built for batch {self.batch}, got {ids.shape[0]}")
        with self.torch.inference_mode():
            return self.prefill_step(ids, self.torch.arange(ids.shape[1], device=self.device))

    def decode(self, tokens, position: int):
        with self.torch.inference_mode():
            self.position.fill_(position)
            # Outputs of a graph replay are overwritten by the next replay: keep a copy.
            return self.decode_step(tokens[:, None], self.position).clone()

    def last_logits(self, ids: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            batch = self.ids([ids]).expand(self.batch, -1)
            positions = self.torch.arange(len(ids), device=self.device)
            return self.model.forward(batch, positions)[0].cpu().numpy()
