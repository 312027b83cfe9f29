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
// Each launch is preceded by prof_.op(name, class, cost) (csrc/profile/profile.h): a no-op unless
// profiling is on.
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

    prof_.op("embed", profile::OpClass::Copy, profile::elementwise_cost(0, 6.0 * B * D));
    embed(d_tokens_, tok_embeddings_, x_, B, D, c.vocab_size, s);
    prof_.op("record_tokens", profile::OpClass::Copy, profile::copy_cost(4.0 * B));
    record_tokens(d_tokens_, d_slots_, d_positions_, history_, B, c.max_batch, S, s);
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = layers_[l];
        bf16* kc = k_cache_ + (size_t)l * kv_layer_elems_;
        bf16* vc = v_cache_ + (size_t)l * kv_layer_elems_;
        // attention block
        prof_.op("attn_norm", profile::OpClass::Norm, profile::norm_cost(B, D, 4, 2, 2));
        rmsnorm_residual(x_, nullptr, w.attn_norm, xn_, B, D, c.norm_eps, s);
        prof_.op("wqkv", profile::OpClass::Matmul, profile::matmul_cost(B, c.qkv_dim(), D, 2, 2, 4));
        matmul_bf16(xn_, w.wqkv, B, c.qkv_dim(), D, Epilogue::StoreF32, store_f32(qkv_), s);
        prof_.op("rope_kv_append", profile::OpClass::Elementwise, profile::elementwise_cost(3.0 * B * (Hq + Hkv) * hd, 6.0 * B * c.qkv_dim()));
        rope_kv_append(qkv_, d_positions_, d_slots_, inv_freq_, q_, kc, vc, B, Hq, Hkv, hd, S, s);
        prof_.op("flash_decode", profile::OpClass::Attention, profile::attention_decode_cost(B, decode_context(B), Hq, Hkv, hd, 2));
        flash_decode(q_, kc, vc, d_slots_, d_positions_, att_, attn_scratch_, B, Hq, Hkv, hd, S,
                     max_splits_, s);
        prof_.op("wo", profile::OpClass::Matmul, profile::matmul_cost(B, D, c.q_dim(), 2, 2, 8));
        matmul_bf16(att_, w.wo, B, D, c.q_dim(), Epilogue::AddResidual, add_to(x_), s);
        // MLP block
        prof_.op("ffn_norm", profile::OpClass::Norm, profile::norm_cost(B, D, 4, 2, 2));
        rmsnorm_residual(x_, nullptr, w.ffn_norm, xn_, B, D, c.norm_eps, s);
        prof_.op("w13", profile::OpClass::Matmul, profile::matmul_cost(B, 2 * H, D, 2, 2, 1));
        matmul_bf16(xn_, w.w13, B, 2 * H, D, Epilogue::SwiGLU, store_bf16(hb_), s);
        prof_.op("w2", profile::OpClass::Matmul, profile::matmul_cost(B, D, H, 2, 2, 8));
        matmul_bf16(hb_, w.w2, B, D, H, Epilogue::AddResidual, add_to(x_), s);
    }
    // final norm + LM head over all B rows
    prof_.op("final_norm", profile::OpClass::Norm, profile::norm_cost(B, D, 4, 2, 2));
    rmsnorm_residual(x_, nullptr, norm_, xn_, B, D, c.norm_eps, s);
    prof_.op("lm_head", profile::OpClass::Matmul, profile::matmul_cost(B, c.vocab_size, D, 2, 2, 4));
    matmul_bf16(xn_, output_, B, c.vocab_size, D, Epilogue::StoreF32, store_f32(logits_), s);
    prof_.end();
}

void CudaEngine::forward_prefill_layers(int slot, int start_pos, int T) {
    const Config& c = cfg_;
    const int D = c.dim, H = c.hidden_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const int S = c.max_seq_len;
    cudaStream_t s = stream_;

    prof_.op("embed", profile::OpClass::Copy, profile::elementwise_cost(0, 6.0 * T * D));
    embed(d_tokens_, tok_embeddings_, x_, T, D, c.vocab_size, s);
    prof_.op("record_tokens", profile::OpClass::Copy, profile::copy_cost(4.0 * T));
    record_tokens(d_tokens_, d_slots_, d_positions_, history_, T, c.max_batch, S, s);
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = layers_[l];
        bf16* kc = k_cache_ + (size_t)l * kv_layer_elems_;
        bf16* vc = v_cache_ + (size_t)l * kv_layer_elems_;
        // attention block: causal over the cache [0, start_pos + t] for row t
        prof_.op("attn_norm", profile::OpClass::Norm, profile::norm_cost(T, D, 4, 2, 2));
        rmsnorm_residual(x_, nullptr, w.attn_norm, xn_, T, D, c.norm_eps, s);
        prof_.op("wqkv", profile::OpClass::Matmul, profile::matmul_cost(T, c.qkv_dim(), D, 2, 2, 4));
        matmul_bf16(xn_, w.wqkv, T, c.qkv_dim(), D, Epilogue::StoreF32, store_f32(qkv_), s);
        prof_.op("rope_kv_append", profile::OpClass::Elementwise, profile::elementwise_cost(3.0 * T * (Hq + Hkv) * hd, 6.0 * T * c.qkv_dim()));
        rope_kv_append(qkv_, d_positions_, d_slots_, inv_freq_, q_, kc, vc, T, Hq, Hkv, hd, S, s);
        prof_.op("attention_prefill", profile::OpClass::Attention, profile::attention_prefill_cost(T, start_pos, Hq, Hkv, hd, 2));
        attention_prefill(q_, kc, vc, slot, start_pos, T, att_, Hq, Hkv, hd, S, s);
        prof_.op("wo", profile::OpClass::Matmul, profile::matmul_cost(T, D, c.q_dim(), 2, 2, 8));
        matmul_bf16(att_, w.wo, T, D, c.q_dim(), Epilogue::AddResidual, add_to(x_), s);
        // MLP block
        prof_.op("ffn_norm", profile::OpClass::Norm, profile::norm_cost(T, D, 4, 2, 2));
        rmsnorm_residual(x_, nullptr, w.ffn_norm, xn_, T, D, c.norm_eps, s);
        prof_.op("w13", profile::OpClass::Matmul, profile::matmul_cost(T, 2 * H, D, 2, 2, 1));
        matmul_bf16(xn_, w.w13, T, 2 * H, D, Epilogue::SwiGLU, store_bf16(hb_), s);
        prof_.op("w2", profile::OpClass::Matmul, profile::matmul_cost(T, D, H, 2, 2, 8));
        matmul_bf16(hb_, w.w2, T, D, H, Epilogue::AddResidual, add_to(x_), s);
    }
    prof_.end();
}

void CudaEngine::forward_lm_head(int row, int rows) {
    const Config& c = cfg_;
    float* x_rows = x_ + (size_t)row * c.dim;
    prof_.op("final_norm", profile::OpClass::Norm, profile::norm_cost(rows, c.dim, 4, 2, 2));
    rmsnorm_residual(x_rows, nullptr, norm_, xn_, rows, c.dim, c.norm_eps, stream_);
    prof_.op("lm_head", profile::OpClass::Matmul, profile::matmul_cost(rows, c.vocab_size, c.dim, 2, 2, 4));
    matmul_bf16(xn_, output_, rows, c.vocab_size, c.dim, Epilogue::StoreF32, store_f32(logits_),
                stream_);
    prof_.end();
}

}  // namespace cuda
}  // namespace brrr
