// forward.cu — the Llama forward pass on the GPU, one straight-line function per phase: read top
// to bottom, one kernel per step. Everything is enqueued on the engine's stream; nothing here
// synchronizes or allocates, so forward_decode can be captured into a CUDA graph as is.
//
// Per layer:  xn = rmsnorm(x) * attn_norm
//             qkv = xn · wqkv^T                (fp32, q|k|v)
//             q = rope(q); cache[k, v] <- rope(k), v
//             att = attention(q, cache)
//             x += att · wo^T                   (residual add in the matmul epilogue)
//             xn = rmsnorm(x) * ffn_norm
//             hb = silu(xn · w1^T) * (xn · w3^T) (one matmul over w13, SwiGLU epilogue)
//             x += hb · w2^T
// End:        logits = rmsnorm(x) * norm · output^T
#include "cuda/engine.cuh"

namespace brrr {
namespace cuda {

namespace {

EpilogueArgs store_f32(float* out) {
    EpilogueArgs a;
    a.out_f32 = out;
    return a;
}
EpilogueArgs store_bf16(bf16* out) {
    EpilogueArgs a;
    a.out_bf16 = out;
    return a;
}
EpilogueArgs add_to(float* residual) {
    EpilogueArgs a;
    a.residual = residual;
    return a;
}

}  // namespace

void CudaEngine::forward_decode(int B) {
    const Config& c = cfg_;
    const int D = c.dim, H = c.hidden_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const int S = c.max_seq_len;
    cudaStream_t s = stream_;

    embed(d_tokens_, tok_embeddings_, x_, B, D, c.vocab_size, s);
    record_tokens(d_tokens_, d_slots_, d_positions_, history_, B, c.max_batch, S, s);
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = layers_[l];
        bf16* kc = k_cache_ + (size_t)l * kv_layer_elems_;
        bf16* vc = v_cache_ + (size_t)l * kv_layer_elems_;
        // attention block
        rmsnorm_residual(x_, nullptr, w.attn_norm, xn_, B, D, c.norm_eps, s);
        matmul_bf16(xn_, w.wqkv, B, c.qkv_dim(), D, Epilogue::StoreF32, store_f32(qkv_), s);
        rope_kv_append(qkv_, d_positions_, d_slots_, inv_freq_, q_, kc, vc, B, Hq, Hkv, hd, S, s);
        flash_decode(q_, kc, vc, d_slots_, d_positions_, att_, attn_scratch_, B, Hq, Hkv, hd, S,
                     max_splits_, s);
        matmul_bf16(att_, w.wo, B, D, c.q_dim(), Epilogue::AddResidual, add_to(x_), s);
        // MLP block
        rmsnorm_residual(x_, nullptr, w.ffn_norm, xn_, B, D, c.norm_eps, s);
        matmul_bf16(xn_, w.w13, B, 2 * H, D, Epilogue::SwiGLU, store_bf16(hb_), s);
        matmul_bf16(hb_, w.w2, B, D, H, Epilogue::AddResidual, add_to(x_), s);
    }
    // final norm + LM head over all B rows
    rmsnorm_residual(x_, nullptr, norm_, xn_, B, D, c.norm_eps, s);
    matmul_bf16(xn_, output_, B, c.vocab_size, D, Epilogue::StoreF32, store_f32(logits_), s);
}

void CudaEngine::forward_prefill_layers(int slot, int start_pos, int T) {
    const Config& c = cfg_;
    const int D = c.dim, H = c.hidden_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const int S = c.max_seq_len;
    cudaStream_t s = stream_;

    embed(d_tokens_, tok_embeddings_, x_, T, D, c.vocab_size, s);
    record_tokens(d_tokens_, d_slots_, d_positions_, history_, T, c.max_batch, S, s);
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = layers_[l];
        bf16* kc = k_cache_ + (size_t)l * kv_layer_elems_;
        bf16* vc = v_cache_ + (size_t)l * kv_layer_elems_;
        // attention block: causal over the cache [0, start_pos + t] for row t
        rmsnorm_residual(x_, nullptr, w.attn_norm, xn_, T, D, c.norm_eps, s);
        matmul_bf16(xn_, w.wqkv, T, c.qkv_dim(), D, Epilogue::StoreF32, store_f32(qkv_), s);
        rope_kv_append(qkv_, d_positions_, d_slots_, inv_freq_, q_, kc, vc, T, Hq, Hkv, hd, S, s);
        attention_prefill(q_, kc, vc, slot, start_pos, T, att_, Hq, Hkv, hd, S, s);
        matmul_bf16(att_, w.wo, T, D, c.q_dim(), Epilogue::AddResidual, add_to(x_), s);
        // MLP block
        rmsnorm_residual(x_, nullptr, w.ffn_norm, xn_, T, D, c.norm_eps, s);
        matmul_bf16(xn_, w.w13, T, 2 * H, D, Epilogue::SwiGLU, store_bf16(hb_), s);
        matmul_bf16(hb_, w.w2, T, D, H, Epilogue::AddResidual, add_to(x_), s);
    }
}

void CudaEngine::forward_lm_head(int row, int rows) {
    const Config& c = cfg_;
    float* x_rows = x_ + (size_t)row * c.dim;
    rmsnorm_residual(x_rows, nullptr, norm_, xn_, rows, c.dim, c.norm_eps, stream_);
    matmul_bf16(xn_, output_, rows, c.vocab_size, c.dim, Epilogue::StoreF32, store_f32(logits_),
                stream_);
}

}  // namespace cuda
}  // namespace brrr
