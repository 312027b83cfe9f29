import numpy as np, torch, sys
from llama_brrr.bench import harness
from llama_brrr.bench.weights import shared_weights, canonical
from llama_brrr.reference import ReferenceLlama
shape = sys.argv[1]
opts = harness.Options(shape=shape, device="cuda")
llm = harness.build_llm(opts, "cuda", 1, 64)
w = shared_weights(llm, harness.SEED, harness.INIT_STD, "cuda")
bad = [k for k, v in w.items() if not torch.isfinite(v).all()]
print("non-finite tensors:", bad[:10], len(bad))
for name in ("tok_embeddings", "layers.0.wqkv", "layers.0.attn_norm", "norm", "layers.1.w2"):
    if name in w and name in llm.config.tensor_shapes():
        ours = llm.engine.get_weight(name)
        t = w[name].float().cpu().numpy()
        print(name, "max|diff| vs engine", float(np.abs(ours - t).max()), "std", float(t.std()))
ids = list(np.random.default_rng(1).integers(3, llm.config.vocab_size, size=32))
oracle = ReferenceLlama(llm.config, {k: v.float() for k, v in canonical(w, llm.config).items()}, dtype=torch.float32, device="cuda")
lo = oracle.forward([ids])[0, -1]
print("oracle finite", bool(torch.isfinite(lo).all()), float(lo.abs().max()))
x = oracle.w["tok_embeddings"][torch.tensor([ids], device="cuda")]
print("embed finite", bool(torch.isfinite(x).all()))
h = oracle._rmsnorm(x, oracle.w["layers.0.attn_norm"])
print("norm0 finite", bool(torch.isfinite(h).all()))
ours = llm.engine.prefill(0, np.asarray(ids, np.int32), 0, "last")[0]
print("ours finite", bool(np.isfinite(ours).all()), "rel err", float(np.linalg.norm(ours - lo.cpu().numpy()) / np.linalg.norm(lo.cpu().numpy())))
