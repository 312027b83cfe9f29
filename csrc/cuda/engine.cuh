// engine.cuh — CudaEngine: the Engine of model.h with everything on one GPU. Shared by engine.cu
// (construction, weights, validation, the public calls, CUDA graphs) and forward.cu (the forward
// pass: one straight-line layer loop for both phases).
//
// Device memory is one arena, carved at construction and never grown:
//   weights         tok_embeddings [V, D], output [V, D] (unless tied), norm [D] (bf16); a
//                   tensor-parallel rank (config tp_size > 1) holds Vs = ceil(V / tp_size) rows
//                   of each: its vocabulary rows (model.h, Config::vocab_rows), then zeros up to
//                   Vs on the last rank, so every rank's LM head yields Vs columns for the gather
//                   per layer: attn_norm, ffn_norm [D] (bf16), wqkv [(Hq + 2 Hkv) hd, D]
//                              (wq|wk|wv), wo [D, Hq hd], w13 [2 H, D] (w1 gate | w3 up), w2 [D, H]
//                   each matrix bf16, or in the quantized tiles of qlayout.h where quant_types
//                   names it (a Matrix of parts: one per run of pieces of one storage type)
//   KV cache (bf16) k, v: [n_layers][kv_blocks * kv_block_size][Hkv][hd], a pool of blocks; slot
//                   s's position p in block tables[s][p / kv_block_size] (model.h KvPages)
//   block tables    i32 [max_batch][blocks_per_seq], mirrored on the host (block_tables_)
//   history (i32)   [max_batch][max_seq]: the tokens each slot has seen (repetition penalty)
//   activations     rows = max(max_batch, prefill chunk): x f32 [rows, D], xn bf16 [rows, D],
//                   qkv f32 [rows, qkv_dim], q, att bf16 [rows, Hq hd], hb bf16 [rows, H]
//   logits (f32)    [max(max_batch, kLogitRows), V]; prefill "all" goes through it kLogitRows at a time
//   tensor parallel [tp_size][rows][Vs] f32: every rank's logit columns of a multi-row LM head,
//                   gathered (tp_gather_)
//   quantized only  xq: int8 activation blocks of up to 16 rows; gate_up f32 [16, 2H]; deq bf16:
//                   the largest quantized layer matrix, dequantized for a prefill chunk's GEMM
//   inputs          tokens, slots, positions i32 [rows] each, filled from pinned host staging;
//                   decode graphs read these fixed buffers
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/allreduce.h"
#include "cuda/check.cuh"
#include "cuda/engine_cuda.h"
#include "cuda/nccl.h"
#include "cuda/ops.h"
#include "cuda/profile_events.cuh"
#include "model.h"
#include "profile/profile.h"

namespace brrr {
namespace cuda {

// A weight matrix [rows, cols] inside the arena, as one or more row ranges ("parts"), each in one
// storage type: bf16 rows, or the tiles of qlayout.h for a GGML block type. A fused matrix
// (wqkv, w13) whose pieces share a type is one part, run by one fused kernel; pieces of different
// types (a Q6_K wv beside Q4_K wq, wk) are parts run one after the other, or as one launch where
// gemv_quant_pair takes the pair (forward.cu, matmul_parts).
struct MatrixPart {
    int type = 0;           // 0: bf16; else the GGML type id of the tiles
    void* data = nullptr;   // bf16 [rows, cols], or qlayout::matrix_bytes(type, rows, cols) bytes
    int row0 = 0, rows = 0; // rows [row0, row0 + rows) of the matrix
};
struct Matrix {
    int rows = 0, cols = 0;
    MatrixPart parts[3];    // at most one per fused piece
    int n_parts = 0;
    double bytes = 0;       // stored bytes of all parts (the profiler's traffic)
    bool plain_bf16() const { return n_parts == 1 && parts[0].type == 0; }
    const bf16* bf16_data() const { return static_cast<const bf16*>(parts[0].data); }
};

// One layer's weights inside the arena.
struct LayerWeights {
    bf16* attn_norm = nullptr;  // [D]
    bf16* ffn_norm = nullptr;   // [D]
    Matrix wqkv;                // [(Hq + 2 Hkv) hd, D]: wq | wk | wv
    Matrix wo;                  // [D, Hq hd]
    Matrix w13;                 // [2 H, D]: w1 (gate) | w3 (up)
    Matrix w2;                  // [D, H]
};

// Where one canonical tensor lives: rows [row_in_part, + rows) of a part (or a norm vector).
struct WeightSlot {
    const MatrixPart* part = nullptr;  // nullptr for norm weights
    int part_index = 0;                // in its Matrix
    int row_in_part = 0;
    int rows = 0, cols = 0;
    bf16* vector = nullptr;            // norm weights [cols]
    size_t numel = 0;
    bool is_norm = false;
};

// A decode graph captured with an event node around every kernel (profiling only, see engine.cu):
// its events, and one Kernel record per launch whose marks index `events`.
struct ProfiledGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<cudaEvent_t> events;
    std::vector<profile::Record> ops;
};

class CudaEngine final : public Engine, public profile::Profiled {
public:
    // Prompt tokens go through the layers this many at a time, bounding the activation scratch
    // (8B: 92 KB a row, 188 MB at 2048). Large enough that the 1B model's narrow projections (wo,
    // w2) still have the tiles to fill an H100; smaller chunks starve them.
    static constexpr int kPrefillChunk = 2048;
    // LM-head rows per step when a prefill wants the logits of every token.
    static constexpr int kLogitRows = 64;

    // quant_types: canonical matrix name -> GGML type id (cpu/quant.h) of the matrices stored
    // quantized (qlayout.h tiles); the rest are bf16.
    CudaEngine(const Config& config, DType weight_dtype, int device,
               const std::unordered_map<std::string, int>& quant_types = {});
    ~CudaEngine() override;
    CudaEngine(const CudaEngine&) = delete;
    CudaEngine& operator=(const CudaEngine&) = delete;

    const Config& config() const override { return cfg_; }
    void set_weight(const std::string& name, const void* src, DType src_dtype,
                    const std::vector<int64_t>& shape) override;
    void set_weight_blocks(const std::string& name, const void* blocks, size_t n_bytes, int type_id,
                           const std::vector<int64_t>& shape, int64_t first_row) override;
    void get_weight(const std::string& name, float* dst) const override;
    void init_random(uint64_t seed, float std) override;
    void set_block_table(int slot, const int32_t* blocks, int n) override;
    void set_history(int slot, int start_pos, const int32_t* tokens, int n) override;
    void prefill(int slot, const int32_t* tokens, int n_tokens, int start_pos, float* logits,
                 bool all_logits) override;
    void prefill_many(const int32_t* slots, const int32_t* starts, const int32_t* counts, int n_seqs,
                      const int32_t* tokens) override;
    void decode(const int32_t* tokens, const int32_t* slots, const int32_t* positions, int batch,
                float* logits) override;
    void sample(const int32_t* slots, const int32_t* positions, const SamplingParams* params,
                const uint64_t* steps, int batch, int32_t* tokens, float* logprobs) override;
    void decode_steps(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                      const SamplingParams* params, const uint64_t* steps, int batch, int n_steps,
                      int32_t* out_tokens, float* out_logprobs) override;
    void decode_launch(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                       const SamplingParams* params, const uint64_t* steps, int batch, int n_steps) override;
    void decode_wait(int32_t* out_tokens, float* out_logprobs) override;
    void decode_discard() override;
    int decode_pending() const override { return (int)pending_.size(); }
    std::pair<int, int> decode_pending_shape() const override;

    void set_use_graphs(bool on) { use_graphs_ = on; }
    // Joins the tensor-parallel group (engine_cuda.h, cuda_init_tensor_parallel).
    void init_tensor_parallel(const nccl::UniqueId& id, int rank, int size);
    // The group's all-reduce for tests and benchmarks (engine_cuda.h; every rank calls together):
    // whether the one-shot kernel is open, for messages up to how many bytes, else why not.
    bool all_reduce_oneshot_ready() const { return tp_oneshot_.ready(); }
    size_t all_reduce_oneshot_max_bytes() const { return tp_oneshot_.capacity_bytes(); }
    size_t all_reduce_ll_max_bytes() const { return tp_oneshot_.ready() ? tp_oneshot_.ll_capacity_bytes() : 0; }
    const std::string& all_reduce_oneshot_why_not() const { return tp_oneshot_why_not_; }
    // out = the sum over the ranks of each rank's in (host arrays of count floats) by `method`
    // ("nccl" | "oneshot" | "ll"), on device copies whose destinations are NaN-poisoned first.
    void all_reduce_values(const float* in, float* out, size_t count, const std::string& method);
    // Median microseconds per all-reduce of `bytes`, over `repeats` replays of a graph of `iters`.
    double all_reduce_bench(size_t bytes, const std::string& method, int iters, int repeats);
    // Ends the one-shot group cleanly (every rank together; NCCL carries all-reduces after it).
    void leave_one_shot();
    bool use_graphs() const { return use_graphs_; }
    CudaMemoryUse memory_use() const;

    // profile::Profiled (engine.cu): events between launches; decode graphs as described there.
    profile::Recorder& recorder() override { return prof_; }
    void profile_enable(bool on) override;
    bool profile_enabled() const override { return prof_.on(); }
    std::vector<profile::Record> profile_take() override;
    // One decode step in kProfileEvery replays the instrumented graph, whose event nodes undo the
    // kernels' overlap (about 1.9x a plain step's time at 1B); one in 32 keeps profiling within the
    // 5% of decode speed it may cost.
    static constexpr int kProfileEvery = 32;

private:
    // ---- forward.cu ----
    // One pass of `rows` token rows (staged in d_tokens_/d_slots_/d_positions_ rows [0, rows))
    // through the layers. The phases differ only in the attention step: decode runs one query
    // row per sequence over that row's slot (flash_decode); prefill runs segments, each `rows`
    // consecutive prompt tokens of one slot at positions start_pos.., causally (attention_prefill
    // per segment), so prompts of several sequences share the pass's matmuls.
    struct Segment {
        int slot, start_pos, row0, rows;
        // At most tuning::kPrefillShortSegmentRows rows: shares the pass's batched attention launch
        // (stage_inputs stages these, forward_layers skips them in its per-segment launches).
        bool is_short() const;
    };
    struct Pass {
        enum Attention { Decode, Prefill };
        Attention attention;
        int rows;
        const Segment* segments;  // prefill only: n_segments covering rows [0, rows) in order
        int n_segments;
        // prefill only: how many of them are short_segments_, staged in d_segments_ for one launch
        int n_short;
        static Pass decode(int B) { return {Decode, B, nullptr, 0, 0}; }
        static Pass prefill(const Segment* s, int n, int rows, int n_short) { return {Prefill, rows, s, n, n_short}; }
    };
    // Embedding and every layer; leaves the residual in x_. Enqueues only, so decode's pass can
    // be captured into a graph.
    void forward_layers(const Pass& pass);
    // Decode of B sequences from d_tokens_/d_slots_/d_positions_ rows [0, B); logits_ [B, V].
    void forward_decode(int B);
    // Layers over prompt segments (inputs rows [0, rows)); leaves the residual in x_.
    void forward_prefill_layers(const Segment* segments, int n_segments, int rows, int n_short);
    // Final norm and LM head of x_ rows [row, row + rows) into logits_ rows [0, rows). A
    // tensor-parallel rank computes its Vs columns and all-gathers the others: one row straight in
    // place in logits_ (rank r's columns start at r Vs), more through tp_gather_ [tp_size][rows][Vs]
    // and one 2-D copy per rank into logits_ [rows, V]. Each logit is computed on one rank and
    // copied to all: every rank holds the same bits, and samples the same tokens.
    void forward_lm_head(int row, int rows);
    // y = in · W^T through the epilogue, W as stored: `in` is rmsnorm(x_f32) * norm_w when norm_w
    // is given, else x_bf16; M rows. bf16 matrices take the bf16 kernels as they are; quantized
    // ones run the quantized GEMV per part (matmul_parts, M <= 16), in chunks of at most 16 rows
    // where the matrix has several parts, up to gemv_quant_rows() rows (32 on Hopper, 64 off it),
    // but on Hopper from 17 rows to 64 gemv_quant_wgmma where it takes the matrix (kept types,
    // work enough; its slices' planes in deq_); then gemm_quant
    // (dequantizing tile by tile) up to tuning::kGemmQuantMaxRows rows (kGemmQuantMaxRowsInL2
    // where a bf16 copy of the matrix fits in L2); more rows (off Hopper every M past the chunks) dequantize W into deq_ a slice of
    // output columns at a time for the bf16 GEMM (gemm_dequant_slices).
    void matmul(const Matrix& W, const float* x_f32, const bf16* norm_w, const bf16* x_bf16, int M,
                Epilogue ep, const EpilogueArgs& args);
    void matmul_parts(const Matrix& W, const float* x_f32, const bf16* norm_w, const bf16* x_bf16, int M,
                      Epilogue ep, const EpilogueArgs& args);

    // ---- engine.cu ----
    // Lays the arena out from base (nullptr: only counts), into weight_bytes_ / kv_bytes_ / other_bytes_.
    void carve(char* base);
    void release() noexcept;  // frees everything; safe on a half-built engine
    WeightSlot slot_for(const std::string& name) const;
    void upload_blocks(const WeightSlot& slot, const void* blocks, int64_t first_row, int64_t n);
    void mark_set(const std::string& name);
    // Throws unless every weight is set and a tensor-parallel rank has joined its group (the
    // entry points' first check).
    void require_runnable() const;
    // Uploads a pass's inputs; for a prefill pass also its segments of at most
    // tuning::kPrefillShortSegmentRows rows, when there are two or more (they share one attention
    // launch): returns how many were staged (short_segments_, d_segments_).
    int stage_inputs(const int32_t* tokens, const int32_t* slots, const int32_t* positions, int rows,
                     const Segment* segments = nullptr, int n_segments = 0);
    // kv_blocks = 0: as many blocks as fill every slot, or as fit under gpu_memory_utilization.
    // Also sizes the dequantization scratch (deq_sliced_): whole matrices unless that would cost
    // the pool blocks or the engine its place under gpu_memory_utilization.
    void size_kv_pool();
    // Uploads the table rows set since the last pass (stream-ordered: passes already enqueued
    // read the old rows).
    void upload_block_tables();
    // Layer l's cache as the kernels take it.
    KvCache layer_kv(int l) const {
        KvCache kv;
        kv.k = k_cache_ + (size_t)l * kv_layer_bytes_;
        kv.v = v_cache_ + (size_t)l * kv_layer_bytes_;
        kv.pages = {d_block_tables_, cfg_.blocks_per_seq(), cfg_.kv_block_size};
        kv.n_blocks = cfg_.kv_blocks;
        kv.max_seq = cfg_.max_seq_len;
        kv.fp8 = cfg_.kv_cache_dtype == KvCacheDtype::Fp8E4m3;
        return kv;
    }
    void run_decode(int B);
    void forward_decode_eager(int B);
    // decode_steps and decode_launch: enqueues the rounds and the copy of their tokens to the
    // host, and records the launch as pending; continuable: a decode_launch (decode_steps' rows
    // are not continued).
    void enqueue_decode(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                        const SamplingParams* params, const uint64_t* steps, int batch, int n_steps,
                        bool continuable);
    // Packs the sampler's inputs into h_sample_in_ and uploads them (d_sample_params_ ...).
    void upload_sample_inputs(const int32_t* slots, const int32_t* positions,
                              const SamplingParams* params, const uint64_t* steps, int batch);
    void activate() const;
    int layer_max_splits() const;
    cudaGraphExec_t capture_decode(int B, bool instrumented);
    // The sampler over the latest logits of B rows, into row `round` of the token ring (sample:
    // round 0); feed_back (decode_steps) also makes the tokens the next decode's inputs.
    void enqueue_sample(int B, int round, bool feed_back);
    // Where embed records the tokens of the rows staged in d_tokens_/d_slots_/d_positions_.
    TokenHistory token_history() const {
        TokenHistory h;
        h.history = history_;
        h.slots = d_slots_;
        h.positions = d_positions_;
        h.max_batch = cfg_.max_batch;
        h.max_seq = cfg_.max_seq_len;
        return h;
    }
    void replay_profiled(int B);
    // A row-parallel matmul (wo, w2): `rows` rows of `in` ([rows, W.cols] bf16) times W added into
    // the residual stream x_; under tensor parallelism the residual plus every rank's part, on every
    // rank (the one-shot kernel on fp32 up to its capacity; past it the bf16 parts, summed by the
    // rows kernel of a 2-rank group or by NCCL). Past the GEMV's rows (prefill) the sum's add also
    // normalizes x_ with next_norm (when given) into xn_ and returns xn_, the next matmul's input;
    // otherwise null.
    const bf16* row_parallel_matmul(const Matrix& W, const bf16* in, int rows, const bf16* next_norm);
    // matmul of rmsnorm(x_) * norm_w: the rows at `normed` where row_parallel_matmul made them.
    void matmul_normed(const Matrix& W, const bf16* norm_w, const bf16* normed, int M, Epilogue ep,
                       const EpilogueArgs& args);
    // Whether `rows` rows of the residual take NCCL (past the one-shot group's capacity, or no group).
    bool all_reduce_takes_nccl(int rows) const;
    // Sums x_'s first `rows` rows over the ranks in fp32 (after the embedding).
    void all_reduce_x(int rows);
    // Throws unless the engine may run the model: a tensor-parallel rank (config tp_size > 1)
    // holds a share of it and must have joined its group first (init_tensor_parallel).
    void require_group() const;
    // Cached positions the next decode's attention reads, summed over its B rows (0 when not profiling).
    double decode_context(int B) const;
    // Rows up to which a quantized matrix runs the tensor-core GEMV (matmul): fewer where gemm_quant
    // takes the rows past them (tuning.h).
    int gemv_quant_rows() const;

    Config cfg_;
    int device_ = 0;
    cudaStream_t stream_ = nullptr;
    int rows_ = 0;        // activation rows: max(max_batch, prefill chunk)
    int logit_rows_ = 0;  // rows of logits_
    int max_splits_ = 1;  // flash-decode KV splits

    char* arena_ = nullptr;
    std::unordered_map<std::string, int> quant_types_;  // the constructor's
    std::unordered_map<std::string, WeightSlot> slots_;  // every matrix piece, by canonical name
    Matrix tok_embeddings_;           // [V, D]; a tensor-parallel rank's [Vs, D] (see the top)
    Matrix output_;                   // likewise; the same storage as tok_embeddings_ when tied
    bf16* norm_ = nullptr;            // [D]
    std::vector<LayerWeights> layers_;  // [n_layers]
    // [n_layers][kv_blocks * kv_block_size][Hkv][hd] of bf16, or of e4m3 (cfg_.kv_cache_dtype)
    unsigned char* k_cache_ = nullptr;
    unsigned char* v_cache_ = nullptr;
    size_t kv_layer_bytes_ = 0;       // kv_blocks * kv_block_size * Hkv * hd * kv_elem_bytes()
    int kv_elem_bytes() const { return cfg_.kv_cache_dtype == KvCacheDtype::Fp8E4m3 ? 1 : 2; }
    int32_t* d_block_tables_ = nullptr;  // [max_batch][blocks_per_seq]
    BlockTables block_tables_;           // the host copy, checked against every call
    int tables_dirty_lo_ = 0, tables_dirty_hi_ = 0;  // slots [lo, hi) changed since the last upload
    int* history_ = nullptr;          // [max_batch][max_seq]
    float* inv_freq_ = nullptr;       // [hd / 2]
    float* x_ = nullptr;              // [rows_, D] residual stream
    bf16* xn_ = nullptr;              // [rows_, D] normed input of a matmul
    float* qkv_ = nullptr;            // [rows_, qkv_dim]
    bf16* q_ = nullptr;               // [rows_, Hq hd] rotated queries
    bf16* att_ = nullptr;             // [rows_, Hq hd] attention output
    bf16* hb_ = nullptr;              // [rows_, H] SwiGLU output
    float* logits_ = nullptr;         // [logit_rows_, V] (at least tp_size x Vs)
    float* tp_gather_ = nullptr;      // tensor parallelism: [tp_size][logit_rows_][Vs]
    bf16* tp_partial_ = nullptr;      // tensor parallelism: [rows_, dim] a rank's bf16 part of wo / w2
    quant::ActBlock* xq_ = nullptr;   // [tuning::kGemvMaxRows, max K / 32] activations of a quantized GEMV
    unsigned* quant_counters_ = nullptr;  // [kGemvQuantCounterWords] the one-row quantized GEMV's unit counters
    float* gate_up_ = nullptr;        // [tuning::kGemvMaxRows, 2 H] a w13 of mixed parts, before SwiGLU
    bool quant_gemm_ = false;         // gemm_quant runs here (Hopper)
    size_t l2_bytes_ = 0;             // the device's L2: a bf16 copy of W that fits stays on chip
    bf16* deq_ = nullptr;             // [deq_elems_] a quantized matrix, or slices of it, as bf16 (long prompts);
                                      // at 17-64 rows gemv_quant_wgmma's fp32 planes
    size_t deq_elems_ = 0;            // the largest quantized matrix, or about the L2 where deq_sliced_ (carve)
    bool deq_sliced_ = false;         // size_kv_pool: no room for a whole matrix beside the KV cache
    size_t weight_bytes_ = 0, kv_bytes_ = 0, other_bytes_ = 0;  // the arena by use, as carve last laid it out
    float* attn_scratch_ = nullptr;
    SplitKScratch split_k_;  // the prefill GEMMs' split-K partials and tile counters
    void* sample_scratch_ = nullptr;
    int* d_in_ = nullptr;  // [7][rows_]: tokens | slots | positions | PrefillSegment [rows_]
    int* d_tokens_ = nullptr;
    int* d_slots_ = nullptr;
    int* d_positions_ = nullptr;
    PrefillSegment* d_segments_ = nullptr;         // a prefill pass's short segments
    std::vector<PrefillSegment> short_segments_;  // their host copy (capacity rows_ from load)
    SamplingParams* d_sample_params_ = nullptr;   // [max_batch]
    uint64_t* d_steps_ = nullptr;                 // [max_batch]
    int* d_sample_slots_ = nullptr;               // [max_batch]
    int* d_sample_positions_ = nullptr;           // [max_batch]
    int* d_out_tokens_ = nullptr;                 // [kMaxDecodeSteps][max_batch], followed by
    float* d_out_logprobs_ = nullptr;             // [kMaxDecodeSteps][max_batch]
    int* d_fed_tokens_ = nullptr;                 // [max_batch]: the newest launch's last round
    size_t sample_in_bytes_ = 0;

    // Pinned host mirrors of the input/output blocks, so copies are truly asynchronous.
    int* h_in_ = nullptr;
    char* h_sample_in_ = nullptr;  // same layout as the device block starting at d_sample_params_
    // kMaxPendingDecodes buffers of out_buffer_bytes_, each tokens then logprobs like d_out_tokens_.
    char* h_out_ = nullptr;
    size_t out_buffer_bytes_ = 0;
    // A launch whose tokens are on their way to h_out_ buffer `buffer` (out_copied_[buffer] fires
    // when they are there), oldest first.
    struct PendingDecode {
        int n_steps, batch, buffer;
    };
    std::vector<PendingDecode> pending_;
    cudaEvent_t out_copied_[kMaxPendingDecodes] = {};
    int fed_rows_ = 0;  // rows of the newest decode_launch a negative token may continue (0: none)
    int steps_ahead_ = 0;          // decode_steps: rounds run past the positions in h_in_
    // Recorded after each input upload: h_in_ (h_sample_in_) may be rewritten once it has fired.
    cudaEvent_t inputs_uploaded_ = nullptr;
    cudaEvent_t sample_inputs_uploaded_ = nullptr;

    // Which canonical tensors have been written (by name index in weight_names order).
    std::vector<std::string> names_;
    std::unordered_map<std::string, size_t> name_index_;
    std::vector<bool> weight_set_;
    std::vector<int64_t> rows_filled_;  // quantized rows that have arrived by set_weight_blocks
    size_t n_weights_set_ = 0;

    // Rows of logits_ that hold the latest logits: B after decode, 1 after a prefill that
    // computed logits, 0 when there are none to sample from.
    int logits_valid_rows_ = 0;

    bool use_graphs_ = true;
    nccl::Comm tp_comm_ = nullptr;  // tensor parallelism: the NCCL communicator, else null
    int tp_rank_ = 0, tp_size_ = 1;
    // The one-shot IPC all-reduce, open when every rank shares this host and P2P (else NCCL
    // carries every all-reduce, and tp_oneshot_why_not_ says why); residual messages up to its
    // capacity, min(tuning::all_reduce_oneshot_max_bytes(N), rows_ x dim floats), take it.
    OneShotAllReduce tp_oneshot_;
    std::string tp_oneshot_why_not_;
    // The same kind of group for prefill chunks' bf16 parts (all_reduce_rows), open in 2-rank
    // groups where the one-shot group is, with rows_ x dim bf16 halves; else NCCL sums them.
    OneShotAllReduce tp_rows_;
    // The method of all_reduce_values / all_reduce_bench by name, checked against this group.
    enum class AllReduceMethod { Nccl, OneShot, LL };
    AllReduceMethod all_reduce_method(const std::string& method) const;
    // all_reduce_x's path for `count` floats, the same on every rank: LL up to its capacity, the
    // one-shot kernel up to its own, NCCL past it.
    AllReduceMethod residual_all_reduce(size_t count) const;
    std::vector<bool> decode_warmed_;             // [max_batch + 1]: eager run done for this B
    std::vector<cudaGraphExec_t> decode_graphs_;  // [max_batch + 1]

    profile::Recorder prof_;
    EventClock prof_clock_;
    int64_t prof_steps_ = 0;                     // graph-replayed decode steps while profiling
    std::vector<ProfiledGraph> prof_graphs_;     // [max_batch + 1]
};

}  // namespace cuda
}  // namespace brrr
