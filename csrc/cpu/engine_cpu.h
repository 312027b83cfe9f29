// engine_cpu.h — CpuEngine: the Engine of model.h on the host, in the llama2.c spirit: every
// buffer allocated once at construction, one straight-line forward() shared by prefill and decode.
//
// Storage (all row-major; weights in one arena, 2 MiB aligned for huge pages, each matrix 64-byte
// aligned):
//   per layer  wqkv [qkv_dim, dim]  wo [dim, q_dim]  w13 [2*hidden, dim]  w2 [dim, hidden]
//              attn_norm, ffn_norm [dim] fp32
//   tok_embeddings [vocab, dim] (also the LM head when tied), output [vocab, dim], norm [dim]
//   A tensor-parallel rank (config tp_size > 1) holds its vocabulary rows of both (model.h) and,
//   having no communicator, computes what a CUDA rank computes before its collectives: zero
//   embeddings for other ranks' tokens, its own logit columns with the others zero. It serves the
//   process plumbing's tests (llama_brrr/tp, collectives=False), not inference.
//   Each canonical matrix is stored in its own type: the weight dtype (f32, or bf16 bits), or a
//   GGUF block format (quant.h) named in the constructor's quant_types, rows of row_bytes. A fused
//   matrix (wqkv = wq|wk|wv, w13 = w1|w3) is its pieces back to back, run as one part per run of
//   pieces that share a type, each part written into its own column range of the output.
//   KV cache   k, v fp32 [n_layers][kv_blocks * kv_block_size][kv_dim]: a pool of blocks, slot s's
//              position p in block block_tables_[s][p / kv_block_size] (model.h, KvPages)
//   history    int32 [max_batch][max_seq_len], the token at each position (-1 = never written)
//   scratch    activations for kRowsCap rows: prompts are run in chunks of at most that many
//              tokens, decode batches are at most max_batch <= kRowsCap rows
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/quant.h"
#include "cpu/sampling.h"
#include "model.h"
#include "profile/profile.h"

namespace brrr {
namespace cpu {

// An aligned host array that owns its memory; a failed allocation throws OutOfMemory naming
// what was being allocated and how many bytes.
template <typename T>
class HostBuffer {
public:
    HostBuffer() = default;
    HostBuffer(size_t count, const char* what, size_t alignment = 64);
    T* data() { return ptr_.get(); }
    const T* data() const { return ptr_.get(); }
    size_t size() const { return count_; }

private:
    struct Free {
        void operator()(T* p) const { std::free(p); }
    };
    std::unique_ptr<T, Free> ptr_;
    size_t count_ = 0;
};

class CpuEngine : public Engine, public profile::Profiled {
public:
    // weight_dtype: F32 or BF16, how weights are stored unless quant_types names them (compute is
    // fp32 either way). quant_types: canonical matrix name -> GGML type id of a kept block format
    // (quant::QType), for the matrices stored quantized. n_threads: OpenMP threads for every call;
    // 0 = the cores other processes leave free.
    CpuEngine(const Config& config, DType weight_dtype, int n_threads,
              const std::unordered_map<std::string, int>& quant_types = {});

    const Config& config() const override { return cfg_; }
    DType weight_dtype() const { return wdtype_; }
    int n_threads() const { return n_threads_; }

    // Float input into a quantized matrix is quantized here, row by row (quantize at load).
    void set_weight(const std::string& name, const void* src, DType src_dtype,
                    const std::vector<int64_t>& shape) override;
    // Blocks of a quantized matrix as stored in a GGUF file, rows of row_bytes(type, shape[1]),
    // whole or in consecutive row chunks (model.h); type must be the one the constructor gave.
    void set_weight_blocks(const std::string& name, const void* blocks, size_t n_bytes, int type_id,
                           const std::vector<int64_t>& shape, int64_t first_row) override;
    void get_weight(const std::string& name, float* dst) const override;
    void init_random(uint64_t seed, float std) override;

    void prefill(int slot, const int32_t* tokens, int n_tokens, int start_pos, float* logits,
                 bool all_logits) override;
    void set_block_table(int slot, const int32_t* blocks, int n) override;
    void prefill_many(const int32_t* slots, const int32_t* starts, const int32_t* counts, int n_seqs,
                      const int32_t* tokens) override;
    void set_history(int slot, int start_pos, const int32_t* tokens, int n) override;
    void decode(const int32_t* tokens, const int32_t* slots, const int32_t* positions, int batch,
                float* logits) override;
    void sample(const int32_t* slots, const int32_t* positions, const SamplingParams* params,
                const uint64_t* steps, int batch, int32_t* tokens, float* logprobs) override;

    static constexpr int kPrefillChunk = 256;

    // profile::Profiled: every kernel of forward() and sample() timed with host steady_clock.
    profile::Recorder& recorder() override { return prof_; }
    void profile_enable(bool on) override;
    bool profile_enabled() const override { return prof_.on(); }
    std::vector<profile::Record> profile_take() override { return prof_.take(); }

private:
    // Rows [row0, row0 + rows) of a matrix, all in one storage type.
    struct WeightPart {
        bool quantized;        // blocks of qtype, else elements of the weight dtype
        quant::QType qtype;
        int64_t row0, rows;
        size_t row_bytes;      // one row of the matrix's cols values
        uint8_t* data;
    };
    struct Matrix {            // [rows, cols]
        int64_t rows = 0, cols = 0;
        std::vector<WeightPart> parts;
        bool any_quantized = false;
        double bytes = 0;      // stored bytes (blocks and scales included)
    };
    struct Layer {
        Matrix wqkv, wo, w13, w2;
        float* attn_norm;
        float* ffn_norm;
    };
    // Where one canonical tensor lives: `rows` rows of row_bytes at `data` (a row range of its fused
    // matrix) in one storage type, or, for norm weights, `vector` (fp32).
    struct TensorSlot {
        bool quantized = false;
        quant::QType qtype = quant::QType::Q8_0;
        uint8_t* data = nullptr;
        size_t row_bytes = 0;
        float* vector = nullptr;
        int64_t rows = 0, cols = 0;
    };

    // Y[M, N] (+= when accumulate) = X[M, K] . W^T, part by part into Y's column ranges; quantized
    // parts read X's activation blocks, quantized once per call into act_.
    void project(const Matrix& W, const float* X, float* Y, int M, bool accumulate);
    // out[D] = row `token` of the embedding matrix, as fp32.
    void embedding_row(int token, float* out) const;
    void spread_logit_columns(float* logits, int rows) const;
    // fp32 values of `rows` rows of a canonical tensor from row r0 into dst, or back.
    void read_rows(const TensorSlot& t, int64_t r0, int64_t rows, float* dst) const;

    // Runs M token rows (row m: token tokens[m] of slot slots[m] at position positions[m])
    // through the model, filling the KV cache; writes logits of rows [first_logit_row, M) to
    // `logits` ([M - first_logit_row, vocab]).
    void forward(int M, const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                 int first_logit_row, float* logits);

    void check_fits_in_ram(size_t weight_bytes) const;  // throws OutOfMemory
    int tensor_index(const std::string& name) const;
    void check_all_weights_set();
    void begin_call() const;  // per-call OpenMP team size (busy_cores.h when all_cores_)

    Config cfg_;
    DType wdtype_;
    int n_threads_;
    bool all_cores_;          // n_threads 0: use the cores other processes leave free
    int rows_cap_;            // scratch rows: max(prefill chunk, max_batch)
    std::vector<float> inv_freq_;  // [head_dim/2]

    HostBuffer<uint8_t> weight_arena_;  // every matrix, in its storage type
    HostBuffer<float> norm_arena_;      // every norm weight, fp32
    std::vector<Layer> layers_;
    Matrix tok_embeddings_;             // [vocab, dim]
    Matrix output_;                     // [vocab, dim], unless tied
    const Matrix* lm_head_ = nullptr;   // output_, or tok_embeddings_ when tied
    float* final_norm_ = nullptr;       // [dim]

    std::vector<std::string> names_;    // canonical names, weight_names() order
    std::unordered_map<std::string, int> name_to_index_;
    std::vector<TensorSlot> tensors_;   // [names_.size()]
    std::vector<uint8_t> is_set_;       // [names_.size()]
    std::vector<int64_t> rows_filled_;  // [names_.size()] rows of blocks received so far
    bool all_set_ = false;

    HostBuffer<float> k_cache_, v_cache_;  // [n_layers][kv_blocks * kv_block_size][kv_dim]
    BlockTables block_tables_;              // [max_batch][blocks_per_seq]
    HostBuffer<int32_t> history_;          // [max_batch][max_seq_len]

    HostBuffer<float> x_;       // [rows_cap, dim]       residual stream
    HostBuffer<float> xb_;      // [rows_cap, dim]       normed input of a matmul
    HostBuffer<float> qkv_;     // [rows_cap, qkv_dim]   q | k | v
    HostBuffer<float> att_;     // [rows_cap, q_dim]     attention output
    HostBuffer<float> h13_;     // [rows_cap, 2*hidden]  gate | up
    HostBuffer<float> hb_;      // [rows_cap, hidden]    swiglu output
    HostBuffer<quant::ActBlock> act_;        // [rows_cap, max(dim, q_dim, hidden) / 32]
    HostBuffer<float> rope_cos_, rope_sin_;  // [rows_cap, head_dim/2]
    HostBuffer<int32_t> row_slots_, row_positions_;  // [rows_cap]

    HostBuffer<float> last_logits_;  // [max_batch, vocab] logits of the latest prefill/decode
    int last_rows_ = 0;              // rows of last_logits_ that are valid
    std::vector<SampleScratch> sample_scratch_;  // [max_batch]

    profile::HostClock prof_clock_;
    profile::Recorder prof_;
};

}  // namespace cpu
}  // namespace brrr
