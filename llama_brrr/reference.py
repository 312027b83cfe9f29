"""ReferenceLlama: a small, eager, pure-PyTorch Llama — the test oracle and the "eager" opponent.

It reads the canonical tensors of config.py (q/k rows in rotate-half order) and follows HF
transformers' LlamaForCausalLM step by step, including where it changes precision: RMSNorm
statistics in fp32, RoPE angles and cos/sin in fp32 (then cast to the compute dtype), softmax in
fp32. So ReferenceLlama(dtype=torch.bfloat16) is "the same computation done by torch in bf16"
that docs/design.md's bf16 tolerance rule compares against.

kv_dtype=torch.float8_e4m3fn rounds every key (after RoPE) and value through e4m3 before it enters
the cache and the attention: "the same computation with an e4m3 KV cache", the oracle of the
engines' kv_cache_dtype="fp8". None (the default) keeps them in the compute dtype.

    ref = ReferenceLlama(config, tensors)            # tensors: name -> numpy / torch array
    logits = ref.forward([1, 2, 3])                  # [1, 3, vocab], fills the KV cache
    logits = ref.forward([4], start_pos=3)           # next token, reusing the cache
    fp8_kv = ReferenceLlama(config, tensors, kv_dtype=torch.float8_e4m3fn)
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from llama_brrr.config import ModelConfig


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse RoPE frequencies [head_dim/2] (fp32) with the config's rope scaling, as HF computes them."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = config.rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor = scaling["factor"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_context = scaling.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def _as_tensor(array, dtype: torch.dtype, device) -> torch.Tensor:
    if not isinstance(array, torch.Tensor):
        array = np.asarray(array)
        # A copy: loaders hand out read-only memory maps, which torch will not wrap. Types torch
        # cannot take from numpy (ml_dtypes.bfloat16) are widened to fp32 on the way.
        keep = array.dtype in (np.float16, np.float32, np.float64)
        array = torch.from_numpy(np.array(array, dtype=array.dtype if keep else np.float32, order="C"))
    return array.to(device=device, dtype=dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ReferenceLlama:
    def __init__(self, config: ModelConfig, tensors: dict, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", kv_dtype: torch.dtype | None = None):
        if kv_dtype not in (None, torch.float8_e4m3fn):
            raise ValueError(f"ReferenceLlama: kv_dtype must be None (the compute dtype) or "
                             f"torch.float8_e4m3fn, got {kv_dtype!r}")
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.kv_dtype = kv_dtype
        self.w = {}
        for name, shape in config.tensor_shapes().items():
            if name not in tensors:
                raise KeyError(f"ReferenceLlama: tensor {name!r} is missing")
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"ReferenceLlama: tensor {name!r} has shape "
                                 f"{tuple(tensors[name].shape)}, the config expects {shape}")
            self.w[name] = _as_tensor(tensors[name], dtype, self.device)
        self.lm_head = self.w["tok_embeddings"] if config.tie_embeddings else self.w["output"]
        self.inv_freq = rope_inv_freq(config).to(self.device)
        self.reset()

    def reset(self) -> None:
        """Forgets the KV cache."""
        self.cache: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.config.n_layers
        self.cache_len = 0

    def _kv_rounded(self, t: torch.Tensor) -> torch.Tensor:
        """t as the KV cache holds it: through kv_dtype and back to the compute dtype."""
        return t if self.kv_dtype is None else t.to(self.kv_dtype).to(self.dtype)

    def _rmsnorm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.config.norm_eps)
        return weight * x32.to(self.dtype)

    @torch.no_grad()
    def forward(self, tokens, start_pos: int = 0) -> torch.Tensor:
        """Logits [B, T, vocab] (fp32) of tokens ([B, T] or a list of ids) at positions start_pos..;
        keys/values of positions < start_pos come from the cache of earlier calls."""
        c = self.config
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        if tokens.dim() == 1:
            tokens = tokens[None]
        B, T = tokens.shape
        if start_pos > self.cache_len:
            raise ValueError(f"start_pos {start_pos} is past the {self.cache_len} cached positions")
        if start_pos > 0 and self.cache[0] is not None and self.cache[0][0].shape[0] != B:
            raise ValueError(f"batch {B} differs from the cached batch {self.cache[0][0].shape[0]}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= c.vocab_size):
            raise ValueError(f"token ids must be in [0, {c.vocab_size})")

        angles = torch.arange(start_pos, start_pos + T, device=self.device).float()[:, None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)
        n_keys = start_pos + T
        causal = torch.arange(n_keys, device=self.device)[None, :] <= \
            torch.arange(start_pos, n_keys, device=self.device)[:, None]  # [T, n_keys]

        x = F.embedding(tokens, self.w["tok_embeddings"])  # an op whose recorded shapes tell the rows read
        for i in range(c.n_layers):
            p = f"layers.{i}."
            h = self._rmsnorm(x, self.w[p + "attn_norm"])
            q = (h @ self.w[p + "wq"].T).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
            k = (h @ self.w[p + "wk"].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
            v = (h @ self.w[p + "wv"].T).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = self._kv_rounded(k * cos + _rotate_half(k) * sin)
            v = self._kv_rounded(v)
            if start_pos > 0:
                k = torch.cat((self.cache[i][0][:, :, :start_pos], k), dim=2)
                v = torch.cat((self.cache[i][1][:, :, :start_pos], v), dim=2)
            self.cache[i] = (k, v)
            group = c.n_heads // c.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
            scores = scores.masked_fill(~causal, float("-inf"))
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            attn = (probs @ v).transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim)
            x = x + attn @ self.w[p + "wo"].T
            h = self._rmsnorm(x, self.w[p + "ffn_norm"])
            x = x + (F.silu(h @ self.w[p + "w1"].T) * (h @ self.w[p + "w3"].T)) @ self.w[p + "w2"].T
        self.cache_len = n_keys
        return (self._rmsnorm(x, self.w["norm"]) @ self.lm_head.T).float()

    __call__ = forward
