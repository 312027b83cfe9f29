// forward.cu — the Llama forward pass on the GPU, one straight-line layer loop shared by decode and
// prefill (they differ only in the attention step and the row count): read top to bottom, one
// kernel per step. Everything is enqueued on the engine's stream; nothing here
// synchronizes or allocates, so forward_decode can be captured into a CUDA graph as is.
//
// Per layer:  q, cache[k, v] = rope(rmsnorm(x) * attn_norm · wqkv^T)   (one launch: the norm runs
//                                                 in the matmul's prologue, RoPE + KV append in its
//                                                 epilogue; see rmsnorm_matmul_bf16 in ops.h)
//             att = attention(q, cache)
//             x += att · wo^T                    (residual add in the matmul epilogue)
//             hb = silu(xn · w1^T) * (xn · w3^T), xn = rmsnorm(x) * ffn_norm   (one launch over w13)
//             x += hb · w2^T
// End:        logits = rmsnorm(x) * norm · output^T
// At decode (B <= 16 rows) each matmul line is one GEMV kernel and the kernels overlap through
// programmatic dependent launch (launch.cuh); larger row counts take the tensor-core GEMM, with the
// norm and RoPE as separate kernels behind the same calls.
// Each launch is preceded by prof_.op(name, class, cost) (csrc/profile/profile.h): a no-op unless
// profiling is on. A fused call is one op; its cost counts the fp32 residual read as its input.
#include "cuda/engine.cuh"

namespace brrr {
namespace cuda {

namespace {

using profile::OpClass;

// Each matmul's destinations, with the engine's split-K scratch (used by the GEMM only).
EpilogueArgs store_f32(float* out, const SplitKScratch& split) {
    EpilogueArgs a;
    a.out_f32 = out;
    a.split = split;
    return a;
}
EpilogueArgs store_bf16(bf16* out, const SplitKScratch& split) {
    EpilogueArgs a;
    a.out_bf16 = out;
    a.split = split;
    return a;
}
EpilogueArgs add_to(float* residual, const SplitKScratch& split) {
    EpilogueArgs a;
    a.residual = residual;
    a.split = split;
    return a;
}

// The RopeKV destinations of layer l's q, k and v for the rows staged in d_positions_/d_slots_.
EpilogueArgs rope_into(const Config& c, const int* positions, const int* slots, const float* inv_freq,
                       bf16* q, bf16* k_cache, bf16* v_cache, float* staging, const SplitKScratch& split) {
    EpilogueArgs a;
    a.out_f32 = staging;
    a.split = split;
    a.rope.positions = positions;
    a.rope.slots = slots;
    a.rope.inv_freq = inv_freq;
    a.rope.q_out = q;
    a.rope.k_cache = k_cache;
    a.rope.v_cache = v_cache;
    a.rope.n_heads = c.n_heads;
    a.rope.n_kv_heads = c.n_kv_heads;
    a.rope.head_dim = c.head_dim;
    a.rope.max_seq = c.max_seq_len;
    return a;
}

}  // namespace

void CudaEngine::forward_layers(const Pass& pass) {
    const Config& c = cfg_;
    const int D = c.dim, H = c.hidden_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const int S = c.max_seq_len;
    const int M = pass.rows;
    const float eps = c.norm_eps;
    cudaStream_t s = stream_;

    prof_.op("embed", OpClass::Copy, profile::elementwise_cost(0, 6.0 * M * D + 4.0 * M));
    embed(d_tokens_, tok_embeddings_, x_, M, D, c.vocab_size, token_history(), s);
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = layers_[l];
        bf16* kc = k_cache_ + (size_t)l * kv_layer_elems_;
        bf16* vc = v_cache_ + (size_t)l * kv_layer_elems_;
        // attention block
        prof_.op("wqkv", OpClass::Matmul, profile::matmul_cost(M, c.qkv_dim(), D, 2, 4, 2));
        rmsnorm_matmul_bf16(x_, w.attn_norm, eps, w.wqkv, M, c.qkv_dim(), D, Epilogue::RopeKV,
                            rope_into(c, d_positions_, d_slots_, inv_freq_, q_, kc, vc, qkv_, split_k_), xn_, s);
        if (pass.attention == Pass::Decode) {
            // one query row per sequence over its own slot's cache [0, positions[b]]
            prof_.op("flash_decode", OpClass::Attention,
                     profile::attention_decode_cost(M, decode_context(M), Hq, Hkv, hd, 2));
            flash_decode(q_, kc, vc, d_slots_, d_positions_, att_, attn_scratch_, M, Hq, Hkv, hd, S,
                         max_splits_, s);
        } else {
            // causal over the cache [0, start_pos + t] of one slot for row t
            prof_.op("attention_prefill", OpClass::Attention,
                     profile::attention_prefill_cost(M, pass.start_pos, Hq, Hkv, hd, 2));
            attention_prefill(q_, kc, vc, pass.slot, pass.start_pos, M, att_, Hq, Hkv, hd, S, s);
        }
        prof_.op("wo", OpClass::Matmul, profile::matmul_cost(M, D, c.q_dim(), 2, 2, 8));
        matmul_bf16(att_, w.wo, M, D, c.q_dim(), Epilogue::AddResidual, add_to(x_, split_k_), s);
        // MLP block
        prof_.op("w13", OpClass::Matmul, profile::matmul_cost(M, 2 * H, D, 2, 4, 1));
        rmsnorm_matmul_bf16(x_, w.ffn_norm, eps, w.w13, M, 2 * H, D, Epilogue::SwiGLU, store_bf16(hb_, split_k_),
                            xn_, s);
        prof_.op("w2", OpClass::Matmul, profile::matmul_cost(M, D, H, 2, 2, 8));
        matmul_bf16(hb_, w.w2, M, D, H, Epilogue::AddResidual, add_to(x_, split_k_), s);
    }
}

void CudaEngine::forward_decode(int B) {
    forward_layers(Pass::decode(B));
    forward_lm_head(0, B);  // over all B rows
}

void CudaEngine::forward_prefill_layers(int slot, int start_pos, int T) {
    forward_layers(Pass::prefill(slot, start_pos, T));
    prof_.end();
}

void CudaEngine::forward_lm_head(int row, int rows) {
    const Config& c = cfg_;
    prof_.op("lm_head", OpClass::Matmul, profile::matmul_cost(rows, c.vocab_size, c.dim, 2, 4, 4));
    rmsnorm_matmul_bf16(x_ + (size_t)row * c.dim, norm_, c.norm_eps, output_, rows, c.vocab_size,
                        c.dim, Epilogue::StoreF32, store_f32(logits_, split_k_), xn_, stream_);
    prof_.end();
}

}  // namespace cuda
}  // namespace brrr
