// model.h — what a Llama-family model is to the engine: its Config, the canonical weight names,
// the sampling parameters, the argument rules of every call, and the Engine interface every
// backend (cpu/, cuda/) implements.
//
// Weight layout (row-major, [out, in]; q/k rows in rotate-half order: dim i pairs with i + hd/2):
//   tok_embeddings [vocab, dim]          norm [dim]          output [vocab, dim] (unless tied)
//   (a tensor-parallel rank, tp_size > 1: [vocab_rows(), dim] of both, its rows of the vocabulary)
//   per layer l:  attn_norm [dim]        ffn_norm [dim]
//                 wq [n_heads*hd, dim]   wk, wv [n_kv_heads*hd, dim]   wo [dim, n_heads*hd]
//                 w1 (gate), w3 (up) [hidden, dim]                     w2 (down) [dim, hidden]
// Backends fuse at load: wq|wk|wv -> wqkv [(n_heads + 2*n_kv_heads)*hd, dim] and
// w1|w3 -> w13 [2*hidden, dim]; set_weight() writes each named piece straight into its slot.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace brrr {

enum class RopeType : int { Default = 0, Llama3 = 1, Linear = 2 };

// What the KV cache stores. Auto: the backend's activation type (bf16 on CUDA, fp32 on the CPU).
// Fp8E4m3: OCP e4m3 with a unit scale (vLLM's uncalibrated "fp8"): each k and v element is
// rounded to nearest-even, saturating at +-448; half the bytes of bf16 for every position read.
// The CUDA engine stores the bytes; the CPU engine stores the same rounded values as fp32.
enum class KvCacheDtype : int { Auto = 0, Fp8E4m3 = 1 };

struct Config {
    int dim = 0;          // model width
    int hidden_dim = 0;   // MLP width
    int n_layers = 0;
    int n_heads = 0;      // query heads
    int n_kv_heads = 0;   // key/value heads (GQA when < n_heads)
    int head_dim = 0;     // may differ from dim / n_heads
    int vocab_size = 0;
    int max_seq_len = 0;  // most positions one sequence slot holds
    int max_batch = 1;    // sequence slots: rows decoded together
    // The paged KV cache (see KvPages): a pool of kv_blocks blocks of kv_block_size positions.
    // kv_blocks = 0 asks the engine for enough blocks to fill every slot to max_seq_len (the CUDA
    // engine fewer when they would take more than gpu_memory_utilization of the device); the
    // engine's config() reports the number it made.
    int kv_block_size = 16;              // a power of two in [16, 128]
    int kv_blocks = 0;
    float gpu_memory_utilization = 0.9f;  // CUDA: the share of device memory the engine may hold
    KvCacheDtype kv_cache_dtype = KvCacheDtype::Auto;
    float norm_eps = 1e-5f;
    float rope_theta = 10000.f;
    RopeType rope_type = RopeType::Default;
    float rope_factor = 1.f;            // llama3 / linear
    float rope_low_freq_factor = 1.f;   // llama3
    float rope_high_freq_factor = 4.f;  // llama3
    int rope_original_max_pos = 8192;   // llama3
    bool tie_embeddings = false;
    // Tensor parallelism: this engine is rank tp_rank of tp_size. Every other field describes the
    // rank's own share already (heads, MLP width: llama_brrr/tp/shard.py), except vocab_size,
    // which stays the full vocabulary V: the rank holds rows [vocab_offset(), + vocab_rows()) of
    // tok_embeddings and output and computes those logit columns; the CUDA engine gathers the
    // others from the ranks (the CPU engine, which has no communicator, leaves them zero).
    int tp_rank = 0;
    int tp_size = 1;

    int q_dim() const { return n_heads * head_dim; }
    int kv_dim() const { return n_kv_heads * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
    // Vocabulary rows per rank, Vs = ceil(V / tp_size): rank r holds rows [r Vs, min((r + 1) Vs, V)).
    int vocab_shard() const { return CEIL_DIV(vocab_size, tp_size); }
    int vocab_offset() const { return tp_rank * vocab_shard(); }
    int vocab_rows() const { return std::min(vocab_shard(), vocab_size - vocab_offset()); }
    int blocks_per_seq() const { return CEIL_DIV(max_seq_len, kv_block_size); }
    // Throws brrr::Error naming the field when the config is unusable.
    void validate() const;
};

// A layer's KV cache is a pool of blocks, [kv_blocks * kv_block_size][n_kv_heads][head_dim] per
// cache (K and V); sequence slot s keeps its position p in block table[s][p / kv_block_size], row
// p % kv_block_size (vLLM's PagedAttention layout). Sequences that share a prompt prefix share its
// blocks; the owner of the blocks (the serving scheduler's block manager) fills the table.
// A view of the table for kernels on either side: row() is the pool row of (slot, pos), -1 where
// the slot has no block there.
struct KvPages {
    const int32_t* table = nullptr;  // [max_batch][blocks_per_seq], -1 = no block
    int blocks_per_seq = 0;
    int block_size = 0;  // a power of two
    BRRR_HOST_DEVICE int64_t row(int slot, int pos) const {
        const int block = table[(int64_t)slot * blocks_per_seq + pos / block_size];
        return block < 0 ? -1 : (int64_t)block * block_size + (pos & (block_size - 1));
    }
};

// The host copy of the block tables, which both engines keep and check calls against. A new
// engine maps slot s to blocks s * blocks_per_seq, s * blocks_per_seq + 1, ... while the pool
// lasts (the slot layout of an unpaged cache), so callers that never set a table keep working.
class BlockTables {
public:
    BlockTables() = default;
    explicit BlockTables(const Config& c);
    // Slot `slot` gets blocks[0..n), the rest of its row none; ids checked against the pool.
    void set(int slot, const int32_t* blocks, int n);
    // InvalidArgument unless slot `slot` has a block for every position in [first, end).
    void check_covered(int slot, int first, int end, const char* call) const;
    KvPages view() const { return {data_.data(), blocks_per_seq_, block_size_}; }
    const int32_t* data() const { return data_.data(); }
    size_t size() const { return data_.size(); }

private:
    std::vector<int32_t> data_;  // [max_batch][blocks_per_seq]
    int blocks_per_seq_ = 0, block_size_ = 0, n_blocks_ = 0;
};

// The rotary inverse frequencies, head_dim/2 of them, with the config's scaling applied.
std::vector<float> rope_inv_freq(const Config& c);

// Expected shape of a canonical tensor name; throws InvalidArgument for an unknown name.
std::vector<int64_t> weight_shape(const Config& c, const std::string& name);
// Throws InvalidArgument unless `shape` is the expected shape of weight `name` (set_weight's rule).
void check_weight_shape(const Config& c, const std::string& name, const std::vector<int64_t>& shape);
// "(a, b)" / "(a,)", as numpy prints a shape.
std::string shape_str(const std::vector<int64_t>& shape);
// All canonical names for this config, in load order.
std::vector<std::string> weight_names(const Config& c);

// One row's sampling parameters, the one form they take from Python (a numpy record of this
// layout, bindings' SamplingParams dtype) to the CUDA sampler (which reads it as is).
struct SamplingParams {
    float temperature = 0.f;         // 0 = greedy
    int top_k = 0;                   // 0 = off
    float top_p = 1.f;               // 1 = off
    float min_p = 0.f;               // 0 = off
    float repetition_penalty = 1.f;  // 1 = off (HF rule: logit > 0 ? logit / p : logit * p)
    uint64_t seed = 0;
};

// The sampling rules: empty when the parameters are usable, else a message naming the offending
// field. The bindings hold every row to it at the boundary (and llama_brrr's SamplingParams asks
// it too); behind the boundary the samplers take the rows as given.
std::string sampling_params_problem(const SamplingParams& p);

// The rules an Engine call's arguments must meet before a backend touches memory with them;
// each backend checks them on entry. They throw InvalidArgument naming the argument.
//   prefill: slot in [0, max_batch), n_tokens >= 1, start_pos >= 0, start_pos + n_tokens <=
//            max_seq_len, every token in [0, vocab_size)
void check_prefill_args(const Config& c, int slot, const int32_t* tokens, int n_tokens, int start_pos);
//   decode (n_steps = 1) and decode_steps: batch in [1, max_batch], n_steps in [1, kMaxDecodeSteps],
//            each slot valid and at most once, positions[i] + n_steps - 1 < max_seq_len, tokens valid;
//            decode_launch (fed_rows >= 0) also takes tokens[i] < 0 as "row -1 - tokens[i] of the
//            newest launch", valid below fed_rows (that launch's batch; 0 when there is none)
void check_decode_args(const Config& c, const int32_t* tokens, const int32_t* slots,
                       const int32_t* positions, int batch, int n_steps, int fed_rows = -1);
//   sample:  batch, slots and positions as for decode
void check_sample_args(const Config& c, const int32_t* slots, const int32_t* positions, int batch);
//   prefill_many: n_seqs in [1, max_batch], slots valid and distinct, each sequence as for prefill
void check_prefill_many_args(const Config& c, const int32_t* slots, const int32_t* starts, const int32_t* counts,
                             int n_seqs, const int32_t* tokens);
//   set_history: slot valid, n >= 0, [start_pos, start_pos + n) within max_seq_len, tokens valid
void check_history_args(const Config& c, int slot, int start_pos, const int32_t* tokens, int n);

// Most rounds one decode_steps call runs (the depth of the CUDA engine's on-device token ring).
constexpr int kMaxDecodeSteps = 64;
// Most decode_launch calls whose results are not yet taken: the one running and the next.
constexpr int kMaxPendingDecodes = 2;

// Counter-based RNG shared by both backends: the same (seed, step) gives the same uniform in
// [0, 1) on CPU and GPU, so sampled runs are reproducible and independent of batch layout.
BRRR_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
BRRR_HOST_DEVICE inline float uniform01(uint64_t seed, uint64_t step) {
    uint64_t r = splitmix64(splitmix64(seed) ^ (step * 0xD1B54A32D192ED03ull));
    return (float)(r >> 40) * (1.0f / 16777216.0f);  // 24 random bits
}

class Engine {
public:
    virtual ~Engine() = default;
    virtual const Config& config() const = 0;

    // Copies (and converts) one canonical tensor into the engine's own storage; shape checked.
    virtual void set_weight(const std::string& name, const void* src, DType src_dtype,
                            const std::vector<int64_t>& shape) = 0;
    // Copies rows [first_row, first_row + n_bytes / row_bytes) of one matrix's GGUF blocks
    // (type_id: a GGML type id) as they are; `shape` is the whole matrix's. A matrix may arrive in
    // consecutive row chunks (each first_row where the previous chunk ended, or 0 to start over),
    // so a loader can drop each chunk of its file view once copied. Only backends built with
    // quantized storage for that tensor accept it.
    virtual void set_weight_blocks(const std::string& name, const void*, size_t, int type_id,
                                   const std::vector<int64_t>&, int64_t /*first_row*/) {
        BRRR_FAIL("weight '" << name << "': this backend stores no quantized weights (GGML type "
                  << type_id << "); dequantize it first");
    }
    // Reads one canonical tensor back as fp32 (dst holds numel floats).
    virtual void get_weight(const std::string& name, float* dst) const = 0;
    // Fills every weight: matrices and embeddings N(0, std); norm weights 1 + N(0, std).
    virtual void init_random(uint64_t seed, float std) = 0;

    // The paged KV cache's table row of `slot` (model.h, BlockTables::set): blocks[0..n) hold its
    // positions [0, n * kv_block_size). Takes effect for the next call.
    virtual void set_block_table(int slot, const int32_t* blocks, int n) = 0;
    // The repetition penalty's memory of slot `slot`: tokens[0..n) at positions start_pos.. (what
    // prefill and decode record themselves; for positions whose KV came from shared blocks).
    virtual void set_history(int slot, int start_pos, const int32_t* tokens, int n) = 0;

    // Runs n_tokens of one sequence at positions start_pos.. into KV slot `slot`.
    // logits: [n_tokens, vocab] when all_logits, else [1, vocab] for the last token; nullptr
    // (and !all_logits) computes no logits at all.
    virtual void prefill(int slot, const int32_t* tokens, int n_tokens, int start_pos,
                         float* logits, bool all_logits) = 0;
    // Prompt chunks of n_seqs sequences in one pass, no logits: sequence i's counts[i] tokens (the
    // next ones of `tokens`, in order) at positions starts[i].. of slot slots[i]. The KV cache ends
    // as n_seqs prefill calls would leave it, for a fraction of the weight traffic; sample()
    // refuses until the next prefill or decode.
    virtual void prefill_many(const int32_t* slots, const int32_t* starts, const int32_t* counts, int n_seqs,
                              const int32_t* tokens) {
        check_prefill_many_args(config(), slots, starts, counts, n_seqs, tokens);
        for (int i = 0; i < n_seqs; ++i) {
            prefill(slots[i], tokens, counts[i], starts[i], nullptr, false);
            tokens += counts[i];
        }
    }
    // One token for each of `batch` sequences; logits: [batch, vocab].
    virtual void decode(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                        int batch, float* logits) = 0;
    // One token per sequence from the logits of the most recent prefill (batch must be 1; its
    // last token) or decode (row i = sequence i), by the rules of cpu/sampling.h. The repetition
    // penalty covers the tokens of slot slots[i] at positions [0, positions[i]]; the draw uses
    // uniform01(params[i].seed, steps[i]). tokens, logprobs: [batch]; logprob is log_softmax of
    // the raw logits at the chosen token.
    virtual void sample(const int32_t* slots, const int32_t* positions,
                        const SamplingParams* params, const uint64_t* steps, int batch,
                        int32_t* tokens, float* logprobs) = 0;
    // n_steps rounds of decode + sample for `batch` sequences: round s decodes each row's token
    // (round 0: tokens[i]; then the token row i sampled in round s - 1) at positions[i] + s and
    // samples with steps[i] + s. out_tokens, out_logprobs: [n_steps, batch]. The same tokens as
    // calling decode and sample in turn; this default does exactly that, the CUDA engine keeps
    // the loop on the device and reads the tokens back once (no host round trip per token).
    virtual void decode_steps(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                              const SamplingParams* params, const uint64_t* steps, int batch,
                              int n_steps, int32_t* out_tokens, float* out_logprobs) {
        check_decode_args(config(), tokens, slots, positions, batch, n_steps);
        std::vector<int32_t> cur(tokens, tokens + batch), pos(positions, positions + batch);
        std::vector<uint64_t> step(steps, steps + batch);
        for (int s = 0; s < n_steps; ++s) {
            decode(cur.data(), slots, pos.data(), batch, nullptr);
            sample(slots, pos.data(), params, step.data(), batch, out_tokens + (size_t)s * batch,
                   out_logprobs + (size_t)s * batch);
            for (int i = 0; i < batch; ++i) {
                cur[i] = out_tokens[(size_t)s * batch + i];
                ++pos[i];
                ++step[i];
            }
        }
    }

    // decode_steps in two halves, so a caller can prepare launch k + 1 while launch k runs and
    // read k's tokens while k + 1 runs. decode_launch enqueues the rounds and returns; decode_wait
    // takes the oldest pending launch's tokens and log-probabilities ([n_steps, batch] of that
    // launch, decode_pending_shape). At most kMaxPendingDecodes launches are pending.
    // tokens[i] < 0 continues row j = -1 - tokens[i] of the newest launch (pending or taken): row
    // i feeds the token that row j sampled in that launch's last round, which the host need not
    // have seen. Between launches prefill_many, set_block_table and set_history may run (they
    // queue behind the pending rounds); decode, sample and decode_steps wait for none, so the
    // bindings refuse them while launches are pending. decode_discard forgets the pending
    // launches and what could be continued (after an error, or to abandon the rows). These
    // defaults run the rounds at once through decode_steps (a host backend has nothing to
    // overlap); the CUDA engine enqueues them and returns.
    virtual void decode_launch(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                               const SamplingParams* params, const uint64_t* steps, int batch, int n_steps);
    virtual void decode_wait(int32_t* out_tokens, float* out_logprobs);
    virtual void decode_discard();
    virtual int decode_pending() const { return (int)host_pending_.size(); }
    // {n_steps, batch} of the oldest pending launch ({0, 0} when none is pending).
    virtual std::pair<int, int> decode_pending_shape() const;

private:
    // The defaults' state: each pending launch's results, and the newest launch's last-round
    // tokens (what a negative token continues).
    struct HostDecode {
        int n_steps = 0, batch = 0;
        std::vector<int32_t> tokens;  // [n_steps, batch]
        std::vector<float> logprobs;  // [n_steps, batch]
    };
    std::vector<HostDecode> host_pending_;  // oldest first
    std::vector<int32_t> host_fed_;          // [batch of the newest launch]
};

}  // namespace brrr
