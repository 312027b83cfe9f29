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
// Tensor parallelism: wo and w2 give each rank a partial sum, all-reduced into x after each (and
// the embedding, each rank's vocabulary rows, after it); the LM head gives each rank its logit
// columns, all-gathered (forward_lm_head). A prefill chunk's sum is added together with the next
// RMSNorm, and the matmul after takes those rows (row_parallel_matmul, matmul_normed).
// At decode (B <= 16 rows) each matmul line is one GEMV kernel and the kernels overlap through
// programmatic dependent launch (launch.cuh); larger row counts take the tensor-core GEMM, with the
// norm and RoPE as separate kernels behind the same calls.
// Each launch is preceded by prof_.op(name, class, cost) (csrc/profile/profile.h): a no-op unless
// profiling is on. A fused call is one op; its cost counts the fp32 residual read as its input.
#include <algorithm>

#include "cuda/engine.cuh"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

using profile::OpClass;

// Stored bytes per weight of a matrix, for the profiler's traffic model.
double w_bytes(const Matrix& m) { return m.bytes / ((double)m.rows * m.cols); }

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
                       bf16* q, const KvCache& kv, float* staging, const SplitKScratch& split) {
    EpilogueArgs a;
    a.out_f32 = staging;
    a.split = split;
    a.rope.positions = positions;
    a.rope.slots = slots;
    a.rope.inv_freq = inv_freq;
    a.rope.q_out = q;
    a.rope.kv = kv;
    a.rope.n_heads = c.n_heads;
    a.rope.n_kv_heads = c.n_kv_heads;
    a.rope.head_dim = c.head_dim;
    return a;
}

// The destinations of rows [r, M) of a matmul with N output columns whose destinations for rows
// [0, M) are `a`: every pointer indexed by row moves r rows on, nothing else moves. Row m writes
// out_bf16 / out_f32 / residual at m * ld (ld_out, or packed: N / 2 for SwiGLU, else N). RopeKV
// reads positions[m] and slots[m] and writes q_out row m ([M, n_heads * head_dim], packed); its K
// and V land at (slots[m], positions[m]) of caches that do not move, and its out_f32 is the fp32
// staging of a multi-part matrix, a packed [M, N] (matmul_parts). The split-K scratch is not
// per row.
EpilogueArgs epilogue_rows_from(const EpilogueArgs& a, Epilogue ep, int N, int r) {
    EpilogueArgs o = a;
    if (ep == Epilogue::RopeKV) {
        if (o.out_f32) o.out_f32 += (size_t)r * N;
        if (o.rope.positions) o.rope.positions += r;
        if (o.rope.slots) o.rope.slots += r;
        if (o.rope.q_out) o.rope.q_out += (size_t)r * a.rope.n_heads * a.rope.head_dim;
        return o;
    }
    const size_t ld = a.ld_out ? a.ld_out : ep == Epilogue::SwiGLU ? N / 2 : N;
    if (o.out_bf16) o.out_bf16 += r * ld;
    if (o.out_f32) o.out_f32 += r * ld;
    if (o.residual) o.residual += r * ld;
    return o;
}

}  // namespace

const bf16* CudaEngine::row_parallel_matmul(const Matrix& W, const bf16* in, int rows, const bf16* next_norm) {
    if (!tp_comm_ || !all_reduce_takes_nccl(rows)) {
        // One GPU adds its product into x_. In a one-shot group rank 0 adds, the others store theirs
        // in x_, and the fp32 sum of x_ over the ranks is the residual plus every rank's part.
        const bool add = tp_rank_ == 0;
        matmul(W, nullptr, nullptr, in, rows, add ? Epilogue::AddResidual : Epilogue::StoreF32,
               add ? add_to(x_, split_k_) : store_f32(x_, split_k_));
        if (tp_comm_) all_reduce_x(rows);
        return nullptr;
    }
    // Past the one-shot capacity (prefill chunks) the ranks' bf16 parts cross the links: each rank
    // stores its part in tp_partial_, and the sum is added into x_. Where the next matmul would
    // normalize x_ into bf16 xn_ first anyway (past the GEMV's rows), the add does it instead: one
    // pass over the fp32 residual fewer, the same values.
    const size_t D = cfg_.dim, count = rows * D;
    const bf16* norm = rows > tuning::kGemvMaxRows ? next_norm : nullptr;
    matmul(W, nullptr, nullptr, in, rows, Epilogue::StoreBf16, store_bf16(tp_partial_, split_k_));
    const double residual_bytes = (2.0 * sizeof(float) + sizeof(bf16) + (norm ? sizeof(bf16) : 0)) * count;
    if (tp_rows_.ready()) {
        // a 2-rank group: sum, add and RMSNorm in one kernel over the peer's part (allreduce.cu)
        prof_.op("all_reduce_rows", OpClass::Copy, profile::copy_cost(2.0 * sizeof(bf16) * count + residual_bytes));
        tp_rows_.run_rows(tp_partial_, x_, norm, xn_, rows, cfg_.dim, cfg_.norm_eps, stream_);
    } else {
        prof_.op("all_reduce", OpClass::Copy, profile::copy_cost(2.0 * sizeof(bf16) * count));
        nccl::all_reduce_sum(tp_partial_, tp_partial_, count, tp_comm_, stream_);
        prof_.op(norm ? "add_rmsnorm" : "add_partials", OpClass::Elementwise,
                 profile::elementwise_cost(norm ? 5.0 * count : (double)count, residual_bytes));
        if (norm) rmsnorm_add_bf16(x_, tp_partial_, norm, xn_, rows, cfg_.dim, cfg_.norm_eps, stream_);
        else add_bf16_into_f32(tp_partial_, x_, count, stream_);
    }
    prof_.end();
    return norm ? xn_ : nullptr;
}

bool CudaEngine::Segment::is_short() const { return rows <= tuning::kPrefillShortSegmentRows; }

void CudaEngine::forward_layers(const Pass& pass) {
    const Config& c = cfg_;
    const int D = c.dim, H = c.hidden_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, hd = c.head_dim;
    const int M = pass.rows;
    cudaStream_t s = stream_;
    // The batched attention launch of the pass's short segments costs the same in every layer.
    profile::Cost short_cost;
    for (int i = 0; i < pass.n_short; ++i) {
        const PrefillSegment& g = short_segments_[i];
        const profile::Cost one = profile::attention_prefill_cost(g.rows, g.start_pos, Hq, Hkv, hd, kv_elem_bytes());
        short_cost.flops += one.flops;
        short_cost.bytes += one.bytes;
    }

    prof_.op("embed", OpClass::Copy, profile::elementwise_cost(0, 6.0 * M * D + 4.0 * M));
    // This engine's vocabulary rows (all of them on one GPU); a tensor-parallel rank's table
    // holds Vs rows, the last rank's padded past V (engine.cuh).
    const int vocab_offset = c.vocab_offset(), table_rows = tok_embeddings_.rows;
    if (tok_embeddings_.plain_bf16())
        embed(d_tokens_, tok_embeddings_.bf16_data(), x_, M, D, c.vocab_size, vocab_offset, table_rows,
              token_history(), s);
    else
        embed_quant(d_tokens_, tok_embeddings_.parts[0].type, tok_embeddings_.parts[0].data, x_, M, D,
                    c.vocab_size, vocab_offset, table_rows, token_history(), s);
    // tensor parallelism: each rank embedded the tokens of its rows, zeros for the others'
    if (tp_comm_) all_reduce_x(M);
    // The next matmul's input when the row-parallel step before it normalized the rows already
    // (a tensor-parallel prefill: row_parallel_matmul); else null, and the matmul normalizes x_.
    const bf16* normed = nullptr;
    for (int l = 0; l < c.n_layers; ++l) {
        const LayerWeights& w = layers_[l];
        const KvCache kv = layer_kv(l);
        const bf16* next_attn_norm = l + 1 < c.n_layers ? layers_[l + 1].attn_norm : nullptr;
        // attention block
        prof_.op("wqkv", OpClass::Matmul, profile::matmul_cost(M, c.qkv_dim(), D, w_bytes(w.wqkv), 4, 2));
        matmul_normed(w.wqkv, w.attn_norm, normed, M, Epilogue::RopeKV,
                      rope_into(c, d_positions_, d_slots_, inv_freq_, q_, kv, qkv_, split_k_));
        if (pass.attention == Pass::Decode) {
            // one query row per sequence over its own slot's cache [0, positions[b]]
            prof_.op("flash_decode", OpClass::Attention,
                     profile::attention_decode_cost(M, decode_context(M), Hq, Hkv, hd, kv_elem_bytes()));
            // wo as a quantized GEMV gains from launching early at every head dim, a bf16 one loses
            const bool early_trigger = !w.wo.plain_bf16() && M <= gemv_quant_rows();
            flash_decode(q_, kv, d_slots_, d_positions_, att_, attn_scratch_, M, Hq, Hkv, hd, max_splits_,
                         early_trigger, s);
        } else {
            // per segment: causal over its slot's cache [0, start_pos + t] for its row t; the short
            // ones (pass.n_short, staged with the inputs) all in one launch
            for (int i = 0; i < pass.n_segments; ++i) {
                const Segment& g = pass.segments[i];
                if (pass.n_short && g.is_short()) continue;
                prof_.op("attention_prefill", OpClass::Attention,
                         profile::attention_prefill_cost(g.rows, g.start_pos, Hq, Hkv, hd, kv_elem_bytes()));
                const size_t row0 = (size_t)g.row0 * c.q_dim();
                attention_prefill(q_ + row0, kv, block_tables_.data() + (size_t)g.slot * c.blocks_per_seq(), g.slot,
                                  g.start_pos, g.rows, att_ + row0, Hq, Hkv, hd, s);
            }
            if (pass.n_short) {
                prof_.op("attention_prefill_segments", OpClass::Attention, short_cost);
                attention_prefill_segments(q_, kv, d_segments_, short_segments_.data(), block_tables_.data(),
                                           pass.n_short, att_, Hq, Hkv, hd, s);
            }
        }
        prof_.op("wo", OpClass::Matmul, profile::matmul_cost(M, D, c.q_dim(), w_bytes(w.wo), 2, 8));
        // the residual plus wo's product (tensor parallelism: every rank's part)
        normed = row_parallel_matmul(w.wo, att_, M, w.ffn_norm);
        // MLP block
        prof_.op("w13", OpClass::Matmul, profile::matmul_cost(M, 2 * H, D, w_bytes(w.w13), 4, 1));
        matmul_normed(w.w13, w.ffn_norm, normed, M, Epilogue::SwiGLU, store_bf16(hb_, split_k_));
        prof_.op("w2", OpClass::Matmul, profile::matmul_cost(M, D, H, w_bytes(w.w2), 2, 8));
        // the residual plus w2's product (tensor parallelism: every rank's part)
        normed = row_parallel_matmul(w.w2, hb_, M, next_attn_norm);
    }
}

void CudaEngine::forward_decode(int B) {
    forward_layers(Pass::decode(B));
    forward_lm_head(0, B);  // over all B rows
}

void CudaEngine::forward_prefill_layers(const Segment* segments, int n_segments, int rows, int n_short) {
    forward_layers(Pass::prefill(segments, n_segments, rows, n_short));
    prof_.end();
}

void CudaEngine::forward_lm_head(int row, int rows) {
    const Config& c = cfg_;
    const int N = output_.rows;  // V, or a tensor-parallel rank's Vs
    float* mine = logits_;
    if (c.tp_size > 1) mine = rows == 1 ? logits_ + (size_t)tp_rank_ * N : tp_gather_ + (size_t)tp_rank_ * rows * N;
    prof_.op("lm_head", OpClass::Matmul, profile::matmul_cost(rows, N, c.dim, w_bytes(output_), 4, 4));
    matmul(output_, x_ + (size_t)row * c.dim, norm_, nullptr, rows, Epilogue::StoreF32, store_f32(mine, split_k_));
    if (c.tp_size > 1) {
        // In place: rank r's block of the destination is its own `mine`.
        float* gathered = rows == 1 ? logits_ : tp_gather_;
        prof_.op("logits_all_gather", OpClass::Copy, profile::copy_cost(8.0 * c.tp_size * rows * N));
        nccl::all_gather_bytes(mine, gathered, sizeof(float) * rows * N, tp_comm_, stream_);
        if (rows > 1) {
            // [tp_size][rows][Vs] -> [rows][V]: rank r's columns land at r Vs, the pad past V dropped
            prof_.op("logits_layout", OpClass::Copy, profile::copy_cost(8.0 * rows * c.vocab_size));
            for (int r = 0; r < c.tp_size; ++r) {
                const int cols = std::min(N, c.vocab_size - r * N);
                CUDA_CHECK(cudaMemcpy2DAsync(logits_ + (size_t)r * N, sizeof(float) * c.vocab_size,
                                             tp_gather_ + (size_t)r * rows * N, sizeof(float) * N,
                                             sizeof(float) * cols, rows, cudaMemcpyDeviceToDevice, stream_));
            }
        }
    }
    prof_.end();
}

// A matmul whose input is rmsnorm(x_) * norm_w: `normed` when those rows are ready, else x_ normalized
// on the way in.
void CudaEngine::matmul_normed(const Matrix& W, const bf16* norm_w, const bf16* normed, int M, Epilogue ep,
                               const EpilogueArgs& args) {
    if (normed) matmul(W, nullptr, nullptr, normed, M, ep, args);
    else matmul(W, x_, norm_w, nullptr, M, ep, args);
}

int CudaEngine::gemv_quant_rows() const {
    return quant_gemm_ ? tuning::kGemvQuantMaxRowsBesideGemm : tuning::kGemvQuantChunkMaxRows;
}

// The one place a matmul meets the storage of its weights (see engine.cuh, CudaEngine::matmul).
void CudaEngine::matmul(const Matrix& W, const float* x_f32, const bf16* norm_w, const bf16* x_bf16, int M,
                        Epilogue ep, const EpilogueArgs& args) {
    const int N = W.rows, K = W.cols;
    const float eps = cfg_.norm_eps;
    cudaStream_t s = stream_;
    if (W.plain_bf16()) {
        if (norm_w) rmsnorm_matmul_bf16(x_f32, norm_w, eps, W.bf16_data(), M, N, K, ep, args, xn_, s);
        else matmul_bf16(x_bf16, W.bf16_data(), M, N, K, ep, args, s);
        return;
    }
    if (M <= tuning::kGemvMaxRows) {
        matmul_parts(W, x_f32, norm_w, x_bf16, M, ep, args);
        return;
    }
    GemmWeightPart parts[kMaxWeightParts];
    for (int i = 0; i < W.n_parts; ++i) parts[i] = {W.parts[i].type, W.parts[i].data, W.parts[i].row0, W.parts[i].rows};
    // Decode batches past 16 rows on Hopper: W decoded into wgmma's registers, the partial sums of
    // each 1024-k slice in deq_ (idle at these rows), where the matrix gives the GPU work enough
    // (gemv_quant_wgmma_takes, tuning.h).
    float* planes = reinterpret_cast<float*>(deq_);
    const size_t plane_floats = deq_elems_ * sizeof(bf16) / sizeof(float);
    const bool wgmma = quant_gemm_ && gemv_quant_wgmma_takes(parts, W.n_parts, M, N, K, plane_floats);
    // Rows one pass of matmul_parts takes: the kernel's 64 for a matrix of one quantized type; 16
    // where the matrix has several parts (a bf16 part takes gemv_bf16's 16, a w13 of two types is
    // staged through the 16-row gate_up_).
    const int pass_rows = W.n_parts == 1 ? tuning::kGemvQuantMmaMaxRows : tuning::kGemvQuantPassRows;
    const int gemv_rows = gemv_quant_rows();
    if (!wgmma && M <= gemv_rows && M <= pass_rows) {  // one weight pass for all rows
        matmul_parts(W, x_f32, norm_w, x_bf16, M, ep, args);
        return;
    }
    // The rest take bf16 rows, normalized here once (as rmsnorm_matmul_bf16 normalizes them).
    if (norm_w) {
        rmsnorm_residual(const_cast<float*>(x_f32), nullptr, norm_w, xn_, M, K, eps, s);
        x_bf16 = xn_;
    }
    if (wgmma) {
        gemv_quant_wgmma(parts, W.n_parts, x_bf16, M, N, K, ep, args, planes, plane_floats, s);
        return;
    }
    if (M <= gemv_rows) {
        // Chunks of at most pass_rows rows through the GEMV, each re-reading the weights (tuning.h
        // says up to which M this beats dequantizing). The chunks split M evenly: each then holds
        // at least pass_rows / 2 rows, so all of them take the tensor cores and a row's result
        // does not depend on which chunk it fell in. The chunks reuse the one per-call scratch
        // matmul_parts has on the tensor cores, gate_up_ of a mixed w13 (xq_ serves only the int8
        // path, the split-K scratch only the GEMM): safe because they are ordered on one stream,
        // and chunk c + 1's kernels write it only after their PDL wait, when chunk c's swiglu_f32
        // has read it and completed.
        static_assert(2 * tuning::kGemvQuantMmaMinRows <= tuning::kGemvQuantPassRows &&
                          tuning::kGemvQuantPassRows <= tuning::kGemvMaxRows &&
                          tuning::kGemvQuantPassRows <= tuning::kGemvQuantMmaMaxRows,
                      "even chunks (at least half a pass) must all reach the tensor-core GEMV, and a pass must "
                      "fit gemv_bf16 (a bf16 part) and gate_up_ (a staged w13)");
        const int chunks = CEIL_DIV(M, pass_rows);
        for (int c = 0, r = 0; c < chunks; ++c) {
            const int rows = (M - r) / (chunks - c);
            matmul_parts(W, nullptr, nullptr, x_bf16 + (size_t)r * K, rows, ep, epilogue_rows_from(args, ep, N, r));
            r += rows;
        }
        return;
    }
    // Short prompts on Hopper: the GEMM dequantizes each k tile of W as it goes, once per row tile
    // of x. Past one 128-row tile that beats the bf16 scratch only where a bf16 copy of W would
    // spill out of L2 (tuning.h): a copy that fits is written and read back on chip.
    const bool copy_in_l2 = (size_t)N * K * sizeof(bf16) <= l2_bytes_;
    const int gemm_quant_rows = copy_in_l2 ? tuning::kGemmQuantMaxRowsInL2 : tuning::kGemmQuantMaxRows;
    if (quant_gemm_ && M <= gemm_quant_rows) {
        gemm_quant(parts, W.n_parts, x_bf16, M, N, K, ep, args, s);
        return;
    }
    // Longer prompts (and every prompt off Hopper): W as bf16 in deq_ a slice of output columns at
    // a time, each slice through the bf16 GEMM, which reads the weights once for all M rows.
    gemm_dequant_slices(parts, W.n_parts, x_bf16, M, N, K, ep, args, deq_, deq_elems_, s);
}

// M <= 64 rows on a matrix with quantized parts (at most 16 where a part is bf16 or a SwiGLU is
// staged in gate_up_: CudaEngine::matmul chunks those). One row: gemv_quant_in, which quantizes
// (and normalizes) its input row itself (int8 dp4a). From tuning::kGemvQuantMmaMinRows rows:
// gemv_quant_mma on bf16 rows (normalized into xn_ first). Several parts: one row of a K-quant
// mix (gemv_quant_fuses_pair) runs as one gemv_quant_pair with the epilogue fused; otherwise the
// input is prepared once (ActBlocks in xq_, or bf16 rows), each part stores fp32 into its columns of a staging
// buffer (qkv_ for RopeKV, gate_up_ for SwiGLU, else the destination itself) and the epilogue
// runs after.
void CudaEngine::matmul_parts(const Matrix& W, const float* x_f32, const bf16* norm_w, const bf16* x_bf16, int M,
                              Epilogue ep, const EpilogueArgs& args) {
    const int N = W.rows, K = W.cols;
    cudaStream_t s = stream_;
    const bool tensor_cores = M >= tuning::kGemvQuantMmaMinRows;
    if (tensor_cores && norm_w) {  // the tensor-core kernels take bf16 rows
        rmsnorm_residual(const_cast<float*>(x_f32), nullptr, norm_w, xn_, M, K, cfg_.norm_eps, s);
        x_bf16 = xn_;
    }
    // the int8 kernel quantizes (and normalizes) its input rows itself; more rows go through xq_
    QuantGemvInput in;
    if (norm_w) {
        in.x_f32 = x_f32;
        in.norm_w = norm_w;
        in.eps = cfg_.norm_eps;
    } else {
        in.x = x_bf16;
    }
    in.scratch = xq_;
    in.counters = quant_counters_;
    if (W.n_parts == 1) {
        if (tensor_cores) gemv_quant_mma(W.parts[0].type, W.parts[0].data, x_bf16, M, N, K, ep, args, s);
        else gemv_quant_in(W.parts[0].type, W.parts[0].data, in, M, N, K, ep, args, s);
        return;
    }
    const MatrixPart &p0 = W.parts[0], &p1 = W.parts[1];
    if (!tensor_cores && W.n_parts == 2 && gemv_quant_fuses_pair(p0.type, p1.type, ep)) {
        // a K-quant mix (a Q6_K wv beside Q4_K wq | wk): both parts in one launch
        gemv_quant_pair(p0.type, p0.data, p0.rows, p1.type, p1.data, in, M, N, K, ep, args, s);
        return;
    }
    bool any_bf16 = false;
    for (int i = 0; i < W.n_parts; ++i) any_bf16 |= W.parts[i].type == 0;
    if (!tensor_cores) {
        if (norm_w) {
            rmsnorm_quantize_act(x_f32, norm_w, cfg_.norm_eps, xq_, M, K, s);
            if (any_bf16) rmsnorm_residual(const_cast<float*>(x_f32), nullptr, norm_w, xn_, M, K, cfg_.norm_eps, s);
        } else {
            quantize_act_bf16(x_bf16, xq_, M, K, s);
        }
    }
    const bf16* x_plain = norm_w && !tensor_cores ? xn_ : x_bf16;
    // Per part: fp32 into columns [row0, row0 + rows) of a [M, N] staging, or of the destination.
    float* staging = ep == Epilogue::RopeKV ? args.out_f32 : ep == Epilogue::SwiGLU ? gate_up_ : nullptr;
    for (int i = 0; i < W.n_parts; ++i) {
        const MatrixPart& p = W.parts[i];
        EpilogueArgs a;
        Epilogue part_ep = ep;
        if (staging) {
            part_ep = Epilogue::StoreF32;
            a.out_f32 = staging + p.row0;
            a.ld_out = N;
        } else {
            a = args;
            const int ld = args.ld_out ? args.ld_out : N;
            a.ld_out = ld;
            if (a.out_f32) a.out_f32 += p.row0;
            if (a.out_bf16) a.out_bf16 += p.row0;
            if (a.residual) a.residual += p.row0;
        }
        if (p.type == 0)
            gemv_bf16(x_plain, static_cast<const bf16*>(p.data), M, p.rows, K, part_ep, a, s);
        else if (tensor_cores)
            gemv_quant_mma(p.type, p.data, x_plain, M, p.rows, K, part_ep, a, s);
        else
            gemv_quant(p.type, p.data, xq_, M, p.rows, K, part_ep, a, s);
    }
    if (ep == Epilogue::RopeKV) rope_kv_append(staging, args.rope, M, s);
    if (ep == Epilogue::SwiGLU) swiglu_f32(staging, args.out_bf16, M, N / 2, s);
}

}  // namespace cuda
}  // namespace brrr
