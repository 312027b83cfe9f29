// model.h — what a Llama-family model is to the engine: its Config, the canonical weight names,
// the sampling parameters, the argument rules of every call, and the Engine interface every
// backend (cpu/, cuda/) implements.
//
// Weight layout (row-major, [out, in]; q/k rows in rotate-half order: dim i pairs with i + hd/2):
//   tok_embeddings [vocab, dim]          norm [dim]          output [vocab, dim] (unless tied)
//   per layer l:  attn_norm [dim]        ffn_norm [dim]
//                 wq [n_heads*hd, dim]   wk, wv [n_kv_heads*hd, dim]   wo [dim, n_heads*hd]
//                 w1 (gate), w3 (up) [hidden, dim]                     w2 (down) [dim, hidden]
// Backends fuse at load: wq|wk|wv -> wqkv [(n_heads + 2*n_kv_heads)*hd, dim] and
// w1|w3 -> w13 [2*hidden, dim]; set_weight() writes each named piece straight into its slot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace brrr {

enum class RopeType : int { Default = 0, Llama3 = 1, Linear = 2 };

struct Config {
    int dim = 0;          // model width
    int hidden_dim = 0;   // MLP width
    int n_layers = 0;
    int n_heads = 0;      // query heads
    int n_kv_heads = 0;   // key/value heads (GQA when < n_heads)
    int head_dim = 0;     // may differ from dim / n_heads
    int vocab_size = 0;
    int max_seq_len = 0;  // KV-cache length per sequence slot
    int max_batch = 1;    // KV-cache sequence slots
    float norm_eps = 1e-5f;
    float rope_theta = 10000.f;
    RopeType rope_type = RopeType::Default;
    float rope_factor = 1.f;            // llama3 / linear
    float rope_low_freq_factor = 1.f;   // llama3
    float rope_high_freq_factor = 4.f;  // llama3
    int rope_original_max_pos = 8192;   // llama3
    bool tie_embeddings = false;

    int q_dim() const { return n_heads * head_dim; }
    int kv_dim() const { return n_kv_heads * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
    // Throws brrr::Error naming the field when the config is unusable.
    void validate() const;
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
//            each slot valid and at most once, positions[i] + n_steps - 1 < max_seq_len, tokens valid
void check_decode_args(const Config& c, const int32_t* tokens, const int32_t* slots,
                       const int32_t* positions, int batch, int n_steps);
//   sample:  batch, slots and positions as for decode
void check_sample_args(const Config& c, const int32_t* slots, const int32_t* positions, int batch);

// Most rounds one decode_steps call runs (the depth of the CUDA engine's on-device token ring).
constexpr int kMaxDecodeSteps = 64;

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
    // Copies one matrix's GGUF blocks (type_id: a GGML type id) as they are; only backends built
    // with quantized storage for that tensor accept it.
    virtual void set_weight_blocks(const std::string& name, const void*, size_t, int type_id,
                                   const std::vector<int64_t>&) {
        BRRR_FAIL("weight '" << name << "': this backend stores no quantized weights (GGML type "
                  << type_id << "); dequantize it first");
    }
    // Reads one canonical tensor back as fp32 (dst holds numel floats).
    virtual void get_weight(const std::string& name, float* dst) const = 0;
    // Fills every weight: matrices and embeddings N(0, std); norm weights 1 + N(0, std).
    virtual void init_random(uint64_t seed, float std) = 0;

    // Runs n_tokens of one sequence at positions start_pos.. into KV slot `slot`.
    // logits: [n_tokens, vocab] when all_logits, else [1, vocab] for the last token; nullptr
    // (and !all_logits) computes no logits at all.
    virtual void prefill(int slot, const int32_t* tokens, int n_tokens, int start_pos,
                         float* logits, bool all_logits) = 0;
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
};

}  // namespace brrr
