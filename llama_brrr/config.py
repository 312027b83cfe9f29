"""ModelConfig: the one description of a Llama-family model that every loader produces.

Canonical tensor names (all row-major, [out_features, in_features] for matrices; q/k rows in
HF "rotate-half" order, i.e. dimension i pairs with i + head_dim/2 inside each head):

    tok_embeddings          [vocab_size, dim]
    layers.{i}.attn_norm    [dim]
    layers.{i}.wq           [n_heads * head_dim, dim]
    layers.{i}.wk           [n_kv_heads * head_dim, dim]
    layers.{i}.wv           [n_kv_heads * head_dim, dim]
    layers.{i}.wo           [dim, n_heads * head_dim]
    layers.{i}.ffn_norm     [dim]
    layers.{i}.w1           [hidden_dim, dim]   gate
    layers.{i}.w3           [hidden_dim, dim]   up
    layers.{i}.w2           [dim, hidden_dim]   down
    norm                    [dim]
    output                  [vocab_size, dim]   absent when tie_embeddings
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A model configuration that contradicts itself or that the engine cannot run."""


ROPE_TYPES = ("default", "llama3", "linear")


@dataclass
class ModelConfig:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    head_dim: int = 0  # 0 means dim // n_heads
    max_seq_len: int = 2048  # the model's trained context length
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    #  "original_max_position_embeddings"} or {"rope_type": "linear", "factor"} or None
    rope_scaling: dict | None = None
    tie_embeddings: bool = False
    name: str = "llama"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.head_dim:
            if self.n_heads and self.dim % self.n_heads == 0:
                self.head_dim = self.dim // self.n_heads
        self.validate()

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def validate(self) -> None:
        for key in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                    "head_dim", "max_seq_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"config.{key} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be > 0, got {self.norm_eps}")
        if not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if rope_type not in ROPE_TYPES:
                raise ConfigError(f"unsupported rope_scaling type {rope_type!r}; "
                                  f"supported: {', '.join(ROPE_TYPES)}")
            self.rope_scaling = dict(self.rope_scaling, rope_type=rope_type)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every canonical tensor name and its expected shape."""
        shapes: dict[str, tuple[int, ...]] = {"tok_embeddings": (self.vocab_size, self.dim)}
        for i in range(self.n_layers):
            p = f"layers.{i}."
            shapes[p + "attn_norm"] = (self.dim,)
            shapes[p + "wq"] = (self.q_dim, self.dim)
            shapes[p + "wk"] = (self.kv_dim, self.dim)
            shapes[p + "wv"] = (self.kv_dim, self.dim)
            shapes[p + "wo"] = (self.dim, self.q_dim)
            shapes[p + "ffn_norm"] = (self.dim,)
            shapes[p + "w1"] = (self.hidden_dim, self.dim)
            shapes[p + "w3"] = (self.hidden_dim, self.dim)
            shapes[p + "w2"] = (self.dim, self.hidden_dim)
        shapes["norm"] = (self.dim,)
        if not self.tie_embeddings:
            shapes["output"] = (self.vocab_size, self.dim)
        return shapes

    def n_params(self) -> int:
        total = 0
        for shape in self.tensor_shapes().values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def engine_dict(self, max_seq_len: int, max_batch: int, kv_block_size: int | None = None,
                    kv_blocks: int | None = None,
                    gpu_memory_utilization: float | None = None,
                    kv_cache_dtype: str | None = None) -> dict:
        """The flat dict the C++ engine's constructor takes. The paged KV cache's keys are left
        out when None (the engine's defaults: blocks of 16 positions, a pool sized for every slot
        to hold max_seq_len, 0.9 of the GPU's memory, elements of the compute dtype);
        kv_blocks=0 also means the default. kv_cache_dtype is "auto" or "fp8_e4m3"."""
        paged = {key: value for key, value in (
            ("kv_block_size", None if kv_block_size is None else int(kv_block_size)),
            ("kv_blocks", None if kv_blocks is None else int(kv_blocks)),
            ("gpu_memory_utilization",
             None if gpu_memory_utilization is None else float(gpu_memory_utilization)),
            ("kv_cache_dtype", kv_cache_dtype))
            if value is not None}
        rs = self.rope_scaling or {}
        rope_type = rs.get("rope_type", "default")
        return {
            "dim": self.dim, "hidden_dim": self.hidden_dim, "n_layers": self.n_layers,
            "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim,
            "vocab_size": self.vocab_size, "max_seq_len": int(max_seq_len),
            "max_batch": int(max_batch), "norm_eps": float(self.norm_eps),
            "rope_theta": float(self.rope_theta), "tie_embeddings": bool(self.tie_embeddings),
            "rope_type": {"default": 0, "llama3": 1, "linear": 2}[rope_type],
            "rope_factor": float(rs.get("factor", 1.0)),
            "rope_low_freq_factor": float(rs.get("low_freq_factor", 1.0)),
            "rope_high_freq_factor": float(rs.get("high_freq_factor", 4.0)),
            "rope_original_max_pos": int(rs.get("original_max_position_embeddings", 8192)),
            **paged,
        }


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# Benchmark shapes (random weights N(0, 0.02)); names as users type them.
SHAPES: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(dim=576, hidden_dim=1536, n_layers=30, n_heads=9, n_kv_heads=3,
                                vocab_size=49152, max_seq_len=8192, norm_eps=1e-5,
                                rope_theta=100000.0, tie_embeddings=True, name="smollm2-135m"),
    "llama3.2-1b": ModelConfig(dim=2048, hidden_dim=8192, n_layers=16, n_heads=32, n_kv_heads=8,
                               vocab_size=128256, max_seq_len=131072, norm_eps=1e-5,
                               rope_theta=500000.0, rope_scaling=dict(_LLAMA3_ROPE),
                               tie_embeddings=True, name="llama3.2-1b"),
    "llama2-7b": ModelConfig(dim=4096, hidden_dim=11008, n_layers=32, n_heads=32, n_kv_heads=32,
                             vocab_size=32000, max_seq_len=4096, norm_eps=1e-5,
                             rope_theta=10000.0, name="llama2-7b"),
    "llama3-8b": ModelConfig(dim=4096, hidden_dim=14336, n_layers=32, n_heads=32, n_kv_heads=8,
                             vocab_size=128256, max_seq_len=8192, norm_eps=1e-5,
                             rope_theta=500000.0, name="llama3-8b"),
    # 141 GB in bf16: one GPU cannot hold it; the tensor-parallel benchmark shape (TP 4 on H100s).
    "llama3-70b": ModelConfig(dim=8192, hidden_dim=28672, n_layers=80, n_heads=64, n_kv_heads=8,
                              vocab_size=128256, max_seq_len=8192, norm_eps=1e-5,
                              rope_theta=500000.0, name="llama3-70b"),
}


def shape_config(name: str) -> ModelConfig:
    key = name.lower()
    if key not in SHAPES:
        raise ConfigError(f"unknown shape {name!r}; known shapes: {', '.join(SHAPES)}")
    return dataclasses.replace(SHAPES[key], rope_scaling=dict(SHAPES[key].rope_scaling or {}) or None)
