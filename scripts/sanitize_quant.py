# compute-sanitizer memcheck over the quantized CUDA paths: a tiny model of mixed block types
# (fused and part-by-part matrices, quantized embedding and head) through prefill (dequantized
# GEMM), batch-1 decode (gemv_quant, graphed and eager) and batch-3 decode (gemv_quant_mma).
import numpy as np
from llama_brrr import _C, quant
from llama_brrr.config import ModelConfig
cfg = ModelConfig(dim=256, hidden_dim=512, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=300, max_seq_len=64)
types = {"wq": "q4_k", "wk": "q4_k", "wv": "q6_k", "wo": "q8_0", "w1": "q5_0", "w3": "q4_1", "w2": "q6_k",
         "tok_embeddings": "q8_0", "output": "q4_0"}
ids = quant.kept_types()
tmap = {n: ids[types[n.split(".")[-1]]] for n, s in cfg.tensor_shapes().items() if len(s) == 2}
rng = np.random.default_rng(0)
for graphs in (True, False):
    e = _C.Engine("cuda", cfg.engine_dict(64, 4), "bf16", 0, 0, tmap)
    e.use_cuda_graphs = graphs
    for n, s in cfg.tensor_shapes().items():
        w = (rng.standard_normal(s) * 0.05 + (1.0 if len(s) == 1 else 0.0)).astype(np.float32)
        e.set_weight(n, w, "f32")
    for slot in range(3):
        e.prefill(slot, rng.integers(0, 300, 20 + slot).astype(np.int32), 0, "last")
    pos = np.array([20, 21, 22], np.int32)
    for step in range(3):
        e.decode(rng.integers(0, 300, 1).astype(np.int32), np.array([0], np.int32), pos[:1].copy(), True)
        e.decode(rng.integers(0, 300, 3).astype(np.int32), np.arange(3, dtype=np.int32), pos + 1, True)
        pos += 2
print("done")
