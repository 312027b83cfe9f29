// model.cpp — the backend-independent half of model.h: config validation, the sampling and call
// argument rules, RoPE frequencies and the canonical weight names and shapes.
//
// rope_inv_freq follows HF transformers' fp32 arithmetic step by step (default, "linear" and
// "llama3" = _compute_llama3_parameters), so the CPU and GPU engines rotate exactly like the
// oracle and the wavelength thresholds of llama3 fall on the same side for every frequency.
// Note torch evaluates `scalar / tensor` as `scalar * (1 / tensor)`; the code mirrors that.
#include "model.h"

#include <algorithm>
#include <cmath>

namespace brrr {

void Config::validate() const {
    const struct { const char* name; int value; } positive[] = {
        {"dim", dim}, {"hidden_dim", hidden_dim}, {"n_layers", n_layers}, {"n_heads", n_heads},
        {"n_kv_heads", n_kv_heads}, {"head_dim", head_dim}, {"vocab_size", vocab_size},
        {"max_seq_len", max_seq_len}, {"max_batch", max_batch}};
    for (const auto& field : positive)
        BRRR_CHECK(field.value > 0, "config." << field.name << " must be a positive integer, got "
                                              << field.value);
    BRRR_CHECK(kv_block_size >= 16 && kv_block_size <= 128 && (kv_block_size & (kv_block_size - 1)) == 0,
               "config.kv_block_size must be 16, 32, 64 or 128, got " << kv_block_size);
    BRRR_CHECK(kv_blocks >= 0, "config.kv_blocks must be >= 0 (0 = as many as the slots can fill), got "
                               << kv_blocks);
    BRRR_CHECK(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1,
               "config.gpu_memory_utilization must be in (0, 1], got " << gpu_memory_utilization);
    const int kv_type = static_cast<int>(kv_cache_dtype);
    BRRR_CHECK(kv_type == 0 || kv_type == 1,
               "config.kv_cache_dtype must be 0 (auto) or 1 (fp8 e4m3), got " << kv_type);
    BRRR_CHECK(n_heads % n_kv_heads == 0, "config.n_heads (" << n_heads
               << ") must be a multiple of config.n_kv_heads (" << n_kv_heads << ")");
    BRRR_CHECK(head_dim % 2 == 0, "config.head_dim must be even for RoPE, got " << head_dim);
    BRRR_CHECK(std::isfinite(norm_eps) && norm_eps > 0,
               "config.norm_eps must be a finite number > 0, got " << norm_eps);
    BRRR_CHECK(std::isfinite(rope_theta) && rope_theta > 0,
               "config.rope_theta must be a finite number > 0, got " << rope_theta);
    const int rope = static_cast<int>(rope_type);
    BRRR_CHECK(rope >= 0 && rope <= 2, "config.rope_type must be 0 (default), 1 (llama3) or "
                                       "2 (linear), got " << rope);
    if (rope_type != RopeType::Default)
        BRRR_CHECK(std::isfinite(rope_factor) && rope_factor > 0,
                   "config.rope_factor must be a finite number > 0, got " << rope_factor);
    if (rope_type == RopeType::Llama3) {
        BRRR_CHECK(rope_low_freq_factor > 0 && rope_high_freq_factor > rope_low_freq_factor,
                   "llama3 rope scaling needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
                       << rope_low_freq_factor << " and " << rope_high_freq_factor);
        BRRR_CHECK(rope_original_max_pos > 0,
                   "config.rope_original_max_pos must be > 0, got " << rope_original_max_pos);
    }
    BRRR_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size,
               "config.tp_rank must be in [0, tp_size) and tp_size >= 1, got tp_rank " << tp_rank
               << " and tp_size " << tp_size);
    BRRR_CHECK((int64_t)(tp_size - 1) * vocab_shard() < vocab_size,
               "config.vocab_size " << vocab_size << " is too small to split over tp_size " << tp_size
               << " ranks (rows of ceil(vocab_size / tp_size) each leave the last rank none); use "
               "fewer ranks");
    // Sizes the engines multiply together in int arithmetic before widening.
    BRRR_CHECK((int64_t)qkv_dim() * dim < (int64_t)1 << 31 &&
                   (int64_t)2 * hidden_dim * dim < (int64_t)1 << 31 &&
                   (int64_t)vocab_size * dim < (int64_t)1 << 31,
               "config too large: a single weight matrix would exceed 2^31 elements");
}

std::string sampling_params_problem(const SamplingParams& p) {
    brrr::Message s;
    if (!(std::isfinite(p.temperature) && p.temperature >= 0))
        s << "temperature must be a finite number >= 0 (0 = greedy), got " << p.temperature;
    else if (p.top_k < 0)
        s << "top_k must be an integer >= 0 (0 = off), got " << p.top_k;
    else if (!(p.top_p > 0 && p.top_p <= 1))
        s << "top_p must be in (0, 1] (1 = off), got " << p.top_p;
    else if (!(p.min_p >= 0 && p.min_p <= 1))
        s << "min_p must be in [0, 1] (0 = off), got " << p.min_p;
    else if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0))
        s << "repetition_penalty must be a finite number > 0 (1 = off), got " << p.repetition_penalty;
    return s.str();
}

namespace {

void check_slot(const Config& c, int slot, const std::string& what) {
    BRRR_CHECK_ARG(slot >= 0 && slot < c.max_batch,
                   what << " " << slot << " is out of range: the engine has max_batch = " << c.max_batch
                        << " KV slots (0.." << c.max_batch - 1 << ")");
}

void check_token(const Config& c, const int32_t* tokens, int i) {
    BRRR_CHECK_ARG(tokens[i] >= 0 && tokens[i] < c.vocab_size,
                   "tokens[" << i << "] = token id " << tokens[i] << " is out of range for vocab_size "
                             << c.vocab_size);
}

void check_tokens(const Config& c, const int32_t* tokens, int n) {
    for (int i = 0; i < n; ++i) check_token(c, tokens, i);
}

void check_batch(const Config& c, int batch) {
    BRRR_CHECK_ARG(batch >= 1 && batch <= c.max_batch,
                   "batch size " << batch << " must be in [1, max_batch = " << c.max_batch << "]");
}

// Every row of a batch call: a valid slot (each at most once) and a position in the context.
void check_rows(const Config& c, const int32_t* slots, const int32_t* positions, int batch) {
    BRRR_CHECK_ARG(slots && positions, "null slots or positions pointer");
    for (int i = 0; i < batch; ++i) {
        check_slot(c, slots[i], "slots[" + std::to_string(i) + "] =");
        for (int j = 0; j < i; ++j)
            BRRR_CHECK_ARG(slots[j] != slots[i], "slot " << slots[i] << " appears twice (slots[" << j
                                                         << "] and slots[" << i << "])");
        BRRR_CHECK_ARG(positions[i] >= 0, "positions[" << i << "] = " << positions[i] << " must be >= 0");
        BRRR_CHECK_ARG(positions[i] < c.max_seq_len,
                       "context is full: positions[" << i << "] = " << positions[i] << " but max_seq_len is "
                       << c.max_seq_len << " (create the engine with a larger max_seq_len)");
    }
}

}  // namespace

void check_prefill_args(const Config& c, int slot, const int32_t* tokens, int n_tokens, int start_pos) {
    BRRR_CHECK_ARG(n_tokens >= 1, "tokens must hold at least one token");
    BRRR_CHECK_ARG(tokens, "null tokens pointer");
    check_slot(c, slot, "slot");
    BRRR_CHECK_ARG(start_pos >= 0, "start_pos must be >= 0, got " << start_pos);
    BRRR_CHECK_ARG((int64_t)start_pos + n_tokens <= c.max_seq_len,
                   "context is full: " << n_tokens << " tokens at start_pos " << start_pos << " need "
                   << (int64_t)start_pos + n_tokens << " positions but max_seq_len is " << c.max_seq_len
                   << " (create the engine with a larger max_seq_len)");
    check_tokens(c, tokens, n_tokens);
}

void check_decode_args(const Config& c, const int32_t* tokens, const int32_t* slots,
                       const int32_t* positions, int batch, int n_steps, int fed_rows) {
    check_batch(c, batch);
    BRRR_CHECK_ARG(n_steps >= 1 && n_steps <= kMaxDecodeSteps,
                   "n_steps must be in [1, " << kMaxDecodeSteps << "], got " << n_steps);
    check_rows(c, slots, positions, batch);
    for (int i = 0; i < batch; ++i)
        BRRR_CHECK_ARG((int64_t)positions[i] + n_steps - 1 < c.max_seq_len,
                       "context is full: positions[" << i << "] = " << positions[i] << " leaves room for "
                       << c.max_seq_len - positions[i] << " of the " << n_steps
                       << " steps asked for (max_seq_len is " << c.max_seq_len << ")");
    BRRR_CHECK_ARG(tokens, "null tokens pointer");
    for (int i = 0; i < batch; ++i) {
        if (tokens[i] >= 0 || fed_rows < 0) {
            check_token(c, tokens, i);
            continue;
        }
        BRRR_CHECK_ARG(fed_rows > 0, "tokens[" << i << "] = " << tokens[i] << " continues a row of the "
                       "previous decode_launch, but there is none to continue (only decode_launch "
                       "takes negative tokens, after a decode_launch and before decode_discard)");
        BRRR_CHECK_ARG(-1 - (int64_t)tokens[i] < fed_rows,
                       "tokens[" << i << "] = " << tokens[i] << " continues row " << -1 - (int64_t)tokens[i]
                       << " of the previous decode_launch, which had " << fed_rows << " rows");
    }
}

void check_sample_args(const Config& c, const int32_t* slots, const int32_t* positions, int batch) {
    check_batch(c, batch);
    check_rows(c, slots, positions, batch);
}

BlockTables::BlockTables(const Config& c)
    : data_((size_t)c.max_batch * c.blocks_per_seq(), -1), blocks_per_seq_(c.blocks_per_seq()),
      block_size_(c.kv_block_size), n_blocks_(c.kv_blocks) {
    for (size_t i = 0; i < data_.size() && i < (size_t)n_blocks_; ++i) data_[i] = (int32_t)i;
}

void BlockTables::set(int slot, const int32_t* blocks, int n) {
    BRRR_CHECK_ARG(slot >= 0 && (size_t)slot * blocks_per_seq_ < data_.size(),
                   "set_block_table: slot " << slot << " is out of range (0.."
                                            << data_.size() / blocks_per_seq_ - 1 << ")");
    BRRR_CHECK_ARG(n >= 0 && n <= blocks_per_seq_,
                   "set_block_table: " << n << " blocks for slot " << slot << ", but a slot holds at most "
                                       << blocks_per_seq_ << " (max_seq_len / kv_block_size)");
    BRRR_CHECK_ARG(n == 0 || blocks, "set_block_table: null blocks pointer");
    for (int i = 0; i < n; ++i)
        BRRR_CHECK_ARG(blocks[i] >= 0 && blocks[i] < n_blocks_,
                       "set_block_table: blocks[" << i << "] = " << blocks[i] << " is not a block of the pool (0.."
                                                  << n_blocks_ - 1 << ")");
    int32_t* row = data_.data() + (size_t)slot * blocks_per_seq_;
    std::copy(blocks, blocks + n, row);
    std::fill(row + n, row + blocks_per_seq_, -1);
}

void BlockTables::check_covered(int slot, int first, int end, const char* call) const {
    const int32_t* row = data_.data() + (size_t)slot * blocks_per_seq_;
    for (int b = first / block_size_; b < CEIL_DIV(end, block_size_); ++b)
        BRRR_CHECK_ARG(row[b] >= 0, call << ": slot " << slot << " has no KV block for positions ["
                                         << b * block_size_ << ", " << (b + 1) * block_size_
                                         << "); give it one with set_block_table first");
}

void check_prefill_many_args(const Config& c, const int32_t* slots, const int32_t* starts, const int32_t* counts,
                             int n_seqs, const int32_t* tokens) {
    check_batch(c, n_seqs);
    BRRR_CHECK_ARG(slots && starts && counts && tokens, "null slots, starts, counts or tokens pointer");
    for (int i = 0; i < n_seqs; ++i) {
        for (int j = 0; j < i; ++j)
            BRRR_CHECK_ARG(slots[j] != slots[i], "slot " << slots[i] << " appears twice (slots[" << j
                                                         << "] and slots[" << i << "])");
        check_prefill_args(c, slots[i], tokens, counts[i], starts[i]);
        tokens += counts[i];
    }
}

void check_history_args(const Config& c, int slot, int start_pos, const int32_t* tokens, int n) {
    check_slot(c, slot, "slot");
    BRRR_CHECK_ARG(n >= 0 && start_pos >= 0 && (int64_t)start_pos + n <= c.max_seq_len,
                   "set_history: " << n << " tokens at start_pos " << start_pos << " do not fit in max_seq_len "
                                   << c.max_seq_len);
    BRRR_CHECK_ARG(n == 0 || tokens, "null tokens pointer");
    check_tokens(c, tokens, n);
}

std::vector<float> rope_inv_freq(const Config& c) {
    const int half = c.head_dim / 2;
    std::vector<float> inv_freq(half);
    for (int i = 0; i < half; ++i) {
        float exponent = (float)(2 * i) / (float)c.head_dim;
        inv_freq[i] = 1.0f / std::pow(c.rope_theta, exponent);
    }
    if (c.rope_type == RopeType::Linear) {
        for (float& f : inv_freq) f /= c.rope_factor;
    } else if (c.rope_type == RopeType::Llama3) {
        const float factor = c.rope_factor;
        const float low = c.rope_low_freq_factor, high = c.rope_high_freq_factor;
        const float old_context = (float)c.rope_original_max_pos;
        const float low_freq_wavelen = old_context / low;
        const float high_freq_wavelen = old_context / high;
        for (float& f : inv_freq) {
            const float wavelen = (float)(2 * M_PI) * (1.0f / f);
            // Long wavelengths are stretched by `factor`, short ones kept, the band between
            // interpolated smoothly in 1/wavelength.
            const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
            const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            if (medium) {
                const float smooth = (old_context * (1.0f / wavelen) - low) / (high - low);
                // volatile: -ffp-contract=fast would fuse these into an FMA, one rounding
                // fewer than the oracle's separate multiply and add.
                volatile float stretched = (1 - smooth) * scaled / factor;
                volatile float kept = smooth * scaled;
                f = stretched + kept;
            } else {
                f = scaled;
            }
        }
    }
    return inv_freq;
}

std::vector<int64_t> weight_shape(const Config& c, const std::string& name) {
    if (name == "tok_embeddings") return {c.vocab_rows(), c.dim};
    if (name == "norm") return {c.dim};
    if (name == "output") {
        BRRR_CHECK_ARG(!c.tie_embeddings, "weight 'output' does not exist in this config: it ties the "
                                      "LM head to tok_embeddings (tie_embeddings = true)");
        return {c.vocab_rows(), c.dim};
    }
    const std::string prefix = "layers.";
    if (name.compare(0, prefix.size(), prefix) == 0) {
        size_t dot = name.find('.', prefix.size());
        std::string index = name.substr(prefix.size(), dot == std::string::npos ? std::string::npos
                                                                                : dot - prefix.size());
        bool numeric = !index.empty() && index.size() < 9 &&
                       index.find_first_not_of("0123456789") == std::string::npos &&
                       (index.size() == 1 || index[0] != '0');
        if (numeric && dot != std::string::npos) {
            int layer = std::stoi(index);
            BRRR_CHECK_ARG(layer < c.n_layers, "weight '" << name << "': layer " << layer
                                                      << " out of range (n_layers = " << c.n_layers << ")");
            const std::string kind = name.substr(dot + 1);
            if (kind == "attn_norm" || kind == "ffn_norm") return {c.dim};
            if (kind == "wq") return {c.q_dim(), c.dim};
            if (kind == "wk" || kind == "wv") return {c.kv_dim(), c.dim};
            if (kind == "wo") return {c.dim, c.q_dim()};
            if (kind == "w1" || kind == "w3") return {c.hidden_dim, c.dim};
            if (kind == "w2") return {c.dim, c.hidden_dim};
        }
    }
    BRRR_CHECK_ARG(false, "unknown weight name '" << name << "'; expected tok_embeddings, norm, output or "
              "layers.<i>.{attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3}");
}

// ---- Engine: the host form of decode_launch / decode_wait -----------------------------------

void Engine::decode_launch(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                           const SamplingParams* params, const uint64_t* steps, int batch, int n_steps) {
    BRRR_CHECK((int)host_pending_.size() < kMaxPendingDecodes,
               "decode_launch: " << host_pending_.size() << " launches are pending already (at most "
               << kMaxPendingDecodes << "); decode_wait for the oldest first");
    check_decode_args(config(), tokens, slots, positions, batch, n_steps, (int)host_fed_.size());
    std::vector<int32_t> fed(tokens, tokens + batch);
    for (int i = 0; i < batch; ++i)
        if (fed[i] < 0) fed[i] = host_fed_[-1 - (int64_t)fed[i]];
    HostDecode d;
    d.n_steps = n_steps;
    d.batch = batch;
    d.tokens.resize((size_t)n_steps * batch);
    d.logprobs.resize((size_t)n_steps * batch);
    decode_steps(fed.data(), slots, positions, params, steps, batch, n_steps, d.tokens.data(), d.logprobs.data());
    host_fed_.assign(d.tokens.end() - batch, d.tokens.end());
    host_pending_.push_back(std::move(d));
}

void Engine::decode_wait(int32_t* out_tokens, float* out_logprobs) {
    BRRR_CHECK(!host_pending_.empty(), "decode_wait: no decode_launch is pending");
    HostDecode d = std::move(host_pending_.front());
    host_pending_.erase(host_pending_.begin());
    std::copy(d.tokens.begin(), d.tokens.end(), out_tokens);
    std::copy(d.logprobs.begin(), d.logprobs.end(), out_logprobs);
}

void Engine::decode_discard() {
    host_pending_.clear();
    host_fed_.clear();
}

std::pair<int, int> Engine::decode_pending_shape() const {
    if (host_pending_.empty()) return {0, 0};
    return {host_pending_.front().n_steps, host_pending_.front().batch};
}

std::string shape_str(const std::vector<int64_t>& shape) {
    brrr::Message s;
    s << "(";
    for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
    s << (shape.size() == 1 ? ",)" : ")");
    return s.str();
}

void check_weight_shape(const Config& c, const std::string& name, const std::vector<int64_t>& shape) {
    const std::vector<int64_t> expected = weight_shape(c, name);
    BRRR_CHECK_ARG(shape == expected, "weight '" << name << "' has shape " << shape_str(shape)
                                                 << " but the config expects " << shape_str(expected));
}

std::vector<std::string> weight_names(const Config& c) {
    std::vector<std::string> names{"tok_embeddings"};
    static const char* per_layer[] = {"attn_norm", "wq", "wk", "wv", "wo",
                                      "ffn_norm", "w1", "w3", "w2"};
    for (int l = 0; l < c.n_layers; ++l)
        for (const char* kind : per_layer) names.push_back("layers." + std::to_string(l) + "." + kind);
    names.push_back("norm");
    if (!c.tie_embeddings) names.push_back("output");
    return names;
}

}  // namespace brrr
