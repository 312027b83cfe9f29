"""The contestants of `llama-brrr compare`: one interface over llama_brrr and its opponents.

Every contestant runs the same workload the same way, so the harness can time them alike:
    first = c.prefill(prompts)        prompts int [B, T] -> greedy first tokens [B] (KV cache filled)
    nxt = c.decode(tokens, position)  one token per sequence at `position` -> greedy next tokens [B]
    c.last_logits(ids)                fp32 logits [vocab] of the last of `ids` (agreement checks)
    c.sync()                          waits for the device (the timer's edges)
Tokens stay where the contestant keeps them (numpy for ours, device tensors for torch) so no
contestant pays a host round trip per token that it would not pay in its own generate loop.

  llama_brrr      the engine through _C.Engine: per-sequence prefill, then batched decode + the
                  engine's greedy sampler (CUDA graphs on GPUs), as Llama.generate drives it
  torch-eager     llama_brrr.reference.ReferenceLlama (plain PyTorch, concatenated KV cache)
  hf-eager        transformers LlamaForCausalLM, attn_implementation="eager", DynamicCache
  hf-sdpa         the same with attn_implementation="sdpa"
  torch-compile   a static-KV-cache decoder with fused wqkv / w13 (the gpt-fast recipe): decode
                  step torch.compile(mode="reduce-overhead") (CUDA graphs), prefill compiled
                  without graphs; CUDA only
  llama.cpp       llama-cpp-python on a GGUF model file, batch 1, CPU (see llamacpp.py)
  llama.cpp-cuda  llama-bench of a llama.cpp CUDA build ($LLAMA_BRRR_LLAMACPP_BIN) on the same GGUF
                  file, batch 1, timing itself (llamacpp.LlamaBench: timed_runs in place of
                  prefill / decode, no logits to check)
"""

from __future__ import annotations

import inspect

import numpy as np

from ..sampling import uniform_rows


class Skip(Exception):
    """A contestant that cannot run this workload here; the message is the note shown instead."""


class Engine:
    """llama_brrr itself."""

    key, label = "llama_brrr", "llama_brrr"

    def __init__(self, llm):
        self.llm, self.engine = llm, llm.engine
        # Each tensor family's storage type, where the engine keeps quantized weights.
        weights = getattr(llm, "weights_summary", None)
        self.note = (f"{llm.device} {llm.dtype}" + (f", weights {weights}" if weights else "")
                     + (", CUDA graphs" if self.engine.use_cuda_graphs else ""))

    def _greedy(self, slots: np.ndarray, positions: np.ndarray) -> np.ndarray:
        n = len(slots)
        # Greedy: temperature 0; top-k / top-p / min-p / repetition penalty off.
        tokens, _ = self.engine.sample(slots, positions, uniform_rows(n), np.zeros(n, np.uint64))
        return tokens

    def prefill(self, prompts: np.ndarray) -> np.ndarray:
        batch, length = prompts.shape
        first = np.empty(batch, np.int32)
        for slot in range(batch):
            self.engine.prefill(slot, prompts[slot].astype(np.int32), 0, "last")
            first[slot] = self._greedy(np.array([slot], np.int32), np.array([length - 1], np.int32))[0]
        return first

    def decode(self, tokens: np.ndarray, position: int) -> np.ndarray:
        slots = np.arange(len(tokens), dtype=np.int32)
        positions = np.full(len(tokens), position, np.int32)
        self.engine.decode(tokens.astype(np.int32), slots, positions, False)
        return self._greedy(slots, positions)

    def decode_run(self, tokens: np.ndarray, position: int, n: int) -> list[np.ndarray]:
        """n greedy rounds the way Llama.generate runs them: decode_steps in chunks (on CUDA the
        rounds of a chunk stay on the device), one host copy per chunk."""
        from ..model import Llama

        chunk = Llama.DECODE_CHUNK["cuda" if self.llm.device.startswith("cuda") else "cpu"]
        b = len(tokens)
        slots, greedy, zeros_u64 = np.arange(b, dtype=np.int32), uniform_rows(b), np.zeros(b, np.uint64)
        out: list[np.ndarray] = []
        tokens = tokens.astype(np.int32)
        while len(out) < n:
            steps = min(chunk, n - len(out))
            rounds, _ = self.engine.decode_steps(
                tokens, slots, np.full(b, position + len(out), np.int32), greedy, zeros_u64, steps)
            out.extend(np.asarray(r, np.int32) for r in rounds)
            tokens = out[-1]
        return out

    def last_logits(self, ids: list[int]) -> np.ndarray:
        return self.engine.prefill(0, np.asarray(ids, np.int32), 0, "last")[0]

    def sync(self) -> None:
        pass  # every call above ends in a host copy of sampled tokens or logits

    def tokens_list(self, tokens) -> list[int]:
        return [int(t) for t in tokens]


class _Torch:
    """What the PyTorch contestants share: the device, synchronization, token conversion."""

    def __init__(self, device: str):
        import torch

        self.torch, self.device = torch, device

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def ids(self, prompts):
        return self.torch.as_tensor(np.asarray(prompts), dtype=self.torch.long, device=self.device)

    def tokens_list(self, tokens) -> list[int]:
        return [int(t) for t in tokens.reshape(-1).tolist()]


class Reference(_Torch):
    """llama_brrr.reference.ReferenceLlama in the engine's dtype."""

    key, label = "torch-eager", "torch eager (reference.py)"

    def __init__(self, config, weights: dict, device: str, dtype):
        super().__init__(device)
        from ..reference import ReferenceLlama

        self.model = ReferenceLlama(config, weights, dtype=dtype, device=device)
        self.note = f"{device} {str(dtype).replace('torch.', '')}"

    def prefill(self, prompts):
        with self.torch.inference_mode():
            self.model.reset()
            return self.model.forward(self.ids(prompts), start_pos=0)[:, -1].argmax(-1)

    def decode(self, tokens, position: int):
        with self.torch.inference_mode():
            return self.model.forward(tokens[:, None], start_pos=position)[:, -1].argmax(-1)

    def last_logits(self, ids: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            self.model.reset()
            return self.model.forward(self.ids([ids]), start_pos=0)[0, -1].float().cpu().numpy()


def hf_llama(config, weights: dict, device: str, dtype, attention: str):
    """transformers' LlamaForCausalLM of `config` on `weights` (shared, not copied)."""
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_theta": config.rope_theta}
    if int(transformers.__version__.split(".")[0]) >= 5:  # theta and scaling live in one dict
        rope = {"rope_parameters": dict(config.rope_scaling or {"rope_type": "default"},
                                        rope_theta=config.rope_theta)}
    elif config.rope_scaling:
        rope["rope_scaling"] = config.rope_scaling
    hf_config = LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.dim, intermediate_size=config.hidden_dim,
        num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len, rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings, attn_implementation=attention, **rope)
    # Built on the meta device: its own random init would cost seconds and memory for nothing.
    with torch.device("meta"):
        model = LlamaForCausalLM(hf_config)
    model.eval()

    def put(module, name, tensor):
        module._parameters[name] = torch.nn.Parameter(tensor, requires_grad=False)

    put(model.model.embed_tokens, "weight", weights["tok_embeddings"])
    put(model.model.norm, "weight", weights["norm"])
    put(model.lm_head, "weight", weights["tok_embeddings" if config.tie_embeddings else "output"])
    for i, layer in enumerate(model.model.layers):
        p = f"layers.{i}."
        for module, name in ((layer.self_attn.q_proj, "wq"), (layer.self_attn.k_proj, "wk"),
                             (layer.self_attn.v_proj, "wv"), (layer.self_attn.o_proj, "wo"),
                             (layer.mlp.gate_proj, "w1"), (layer.mlp.up_proj, "w3"),
                             (layer.mlp.down_proj, "w2")):
            put(module, "weight", weights[p + name])
        put(layer.input_layernorm, "weight", weights[p + "attn_norm"])
        put(layer.post_attention_layernorm, "weight", weights[p + "ffn_norm"])
    # Buffers (RoPE frequencies) are recomputed on the real device; no parameter stays on meta.
    rotary = model.model.rotary_emb
    with torch.device(device):
        fresh = type(rotary)(config=hf_config)
    model.model.rotary_emb = fresh
    left = [name for name, p in model.named_parameters() if p.is_meta]
    if left:
        raise Skip(f"transformers {transformers.__version__}: parameters {left[:3]} have no "
                   f"counterpart in llama_brrr's weights")
    return model.to(dtype)


class HuggingFace(_Torch):
    """transformers' LlamaForCausalLM with eager or sdpa attention and its DynamicCache."""

    def __init__(self, config, weights: dict, device: str, dtype, attention: str):
        super().__init__(device)
        self.key, self.label = f"hf-{attention}", f"HF transformers ({attention})"
        self.model = hf_llama(config, weights, device, dtype, attention)
        self.note = f"{device} {str(dtype).replace('torch.', '')}, DynamicCache"
        accepts = inspect.signature(self.model.forward).parameters
        # Only the last position's logits, as every other contestant computes them.
        self.last_only = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}
        self.cache = None

    def prefill(self, prompts):
        with self.torch.inference_mode():
            out = self.model(input_ids=self.ids(prompts), use_cache=True, **self.last_only)
            self.cache = out.past_key_values
            return out.logits[:, -1].argmax(-1)

    def decode(self, tokens, position: int):
        with self.torch.inference_mode():
            out = self.model(input_ids=tokens[:, None], past_key_values=self.cache, use_cache=True)
            self.cache = out.past_key_values
            return out.logits[:, -1].argmax(-1)

    def last_logits(self, ids: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            return self.model(input_ids=self.ids([ids])).logits[0, -1].float().cpu().numpy()
