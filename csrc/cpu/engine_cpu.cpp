// engine_cpu.cpp — CpuEngine (see engine_cpu.h): allocation, weight I/O, the forward pass, and
// the prefill/decode/sample entry points with their argument checks.
//
// prefill and decode are the same computation on a different set of rows: each row is one token
// with its own (slot, position). A prompt is a run of rows of one slot at consecutive positions,
// a decode step one row per sequence, so forward() never needs to know which one it runs.
#include "cpu/engine_cpu.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/busy_cores.h"
#include "cpu/kernels.h"
#include "cpu/simd.h"

namespace brrr {
namespace cpu {

template <typename T>
HostBuffer<T>::HostBuffer(size_t count, const char* what, size_t alignment) : count_(count) {
    const size_t bytes = std::max<size_t>(CEIL_DIV(count * sizeof(T), alignment) * alignment, alignment);
    void* p = nullptr;
    if (count > SIZE_MAX / sizeof(T) || posix_memalign(&p, alignment, bytes) != 0 || p == nullptr) {
        brrr::Message s;
        s << where(__FILE__, __LINE__) << "out of host memory: cannot allocate " << bytes
          << " bytes (" << (double)bytes / (1 << 30) << " GiB) for " << what
          << "; lower max_seq_len or max_batch, or use bf16 weights";
        throw OutOfMemory(s.str());
    }
    ptr_.reset(static_cast<T*>(p));
}
template class HostBuffer<float>;
template class HostBuffer<int32_t>;
template class HostBuffer<uint8_t>;
template class HostBuffer<quant::ActBlock>;

namespace {

constexpr size_t kHugePage = 2 << 20;

size_t round_up(size_t n, size_t to) { return CEIL_DIV(n, to) * to; }

// dst[i] = src[i] converted, for n elements; src in any input dtype, dst F32 or BF16.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
    auto read = [&](size_t i) -> float {
        switch (src_dtype) {
            case DType::F32: return static_cast<const float*>(src)[i];
            case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(src)[i]);
            default: return bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
        }
    };
    if (src_dtype == dst_dtype) {
        std::memcpy(dst, src, n * dtype_size(dst_dtype));
    } else if (dst_dtype == DType::F32) {
        float* d = static_cast<float*>(dst);
        for (size_t i = 0; i < n; ++i) d[i] = read(i);
    } else {
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(read(i));
    }
}

// The pair-th couple of N(0, 1) draws of the stream `key`: Box-Muller on two splitmix64
// outputs, so any element can be drawn on its own (parallel, thread-count independent).
void normal_pair(uint64_t key, uint64_t pair, float* z0, float* z1) {
    const uint64_t r1 = splitmix64(key + 2 * pair), r2 = splitmix64(key + 2 * pair + 1);
    const double u1 = (double)((r1 >> 11) + 1) * 0x1p-53;  // (0, 1]: log(u1) is finite
    const double u2 = (double)(r2 >> 11) * 0x1p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * M_PI * u2;
    *z0 = (float)(radius * std::cos(angle));
    *z1 = (float)(radius * std::sin(angle));
}

// kv_blocks = 0: enough blocks to fill every slot to max_seq_len. Block ids are ints: a pool
// (or a table) of 2^31 blocks is far beyond any host's memory, so it is reported as such.
Config with_kv_blocks(Config c) {
    c.validate();
    const int64_t table_entries = (int64_t)c.max_batch * c.blocks_per_seq();
    if (table_entries >= (int64_t)1 << 31) {
        brrr::Message s;
        s << where(__FILE__, __LINE__) << "out of host memory: "
          << (double)table_entries * c.kv_block_size * 2 * c.n_layers * c.kv_dim() * 4
          << " bytes of KV cache for max_seq_len " << c.max_seq_len << " x max_batch " << c.max_batch
          << "; lower max_seq_len or max_batch (the KV cache grows with both)";
        throw OutOfMemory(s.str());
    }
    if (c.kv_blocks == 0) c.kv_blocks = (int)table_entries;
    return c;
}

}  // namespace

// ---- construction -----------------------------------------------------------------------------

// Large allocations only reserve address space (Linux overcommits), so an engine far larger than
// the machine would construct fine and be killed later, mid-prompt. Refuse it up front instead.
void CpuEngine::check_fits_in_ram(size_t weight_bytes) const {
    const Config& c = cfg_;
    const size_t kv_bytes = 2 * (size_t)c.n_layers * c.kv_blocks * c.kv_block_size * c.kv_dim() * sizeof(float);
    const size_t scratch_bytes =
        (size_t)rows_cap_ * (2 * c.dim + c.qkv_dim() + c.q_dim() + 3 * c.hidden_dim) * sizeof(float) +
        (size_t)c.max_batch * c.vocab_size * (sizeof(float) + 2 * sizeof(float)) +
        (size_t)c.max_batch * c.max_seq_len * sizeof(int32_t) +
        (size_t)c.max_batch * c.blocks_per_seq() * sizeof(int32_t);
    const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page_size <= 0) return;  // unknown: let the allocations decide
    const size_t ram = (size_t)pages * (size_t)page_size;
    const size_t total = weight_bytes + kv_bytes + scratch_bytes;
    if (total > ram) {
        brrr::Message s;
        const double gib = 1 << 30;
        s << where(__FILE__, __LINE__) << "out of host memory: this engine needs " << total << " bytes ("
          << total / gib << " GiB: weights " << weight_bytes / gib << ", KV cache " << kv_bytes / gib
          << ", buffers " << scratch_bytes / gib << ") but the machine has " << ram / gib
          << " GiB of RAM; lower max_seq_len or max_batch (the KV cache grows with both)";
        throw OutOfMemory(s.str());
    }
}

CpuEngine::CpuEngine(const Config& config, DType weight_dtype, int n_threads,
                     const std::unordered_map<std::string, int>& quant_types)
    : cfg_(with_kv_blocks(config)), wdtype_(weight_dtype) {
    cfg_.validate();
    BRRR_CHECK(weight_dtype == DType::F32 || weight_dtype == DType::BF16,
               "the CPU engine stores weights as f32 or bf16, not " << dtype_name(weight_dtype));
    BRRR_CHECK_ARG(n_threads >= 0, "n_threads must be >= 0 (0 = all cores), got " << n_threads);
    n_threads_ = n_threads > 0 ? n_threads : omp_get_num_procs();
    all_cores_ = n_threads == 0;
    const Config& c = cfg_;
    rows_cap_ = std::max(std::min(kPrefillChunk, c.max_seq_len), c.max_batch);
    inv_freq_ = rope_inv_freq(c);
    names_ = weight_names(c);
    tensors_.resize(names_.size());
    is_set_.assign(names_.size(), 0);
    rows_filled_.assign(names_.size(), 0);
    for (size_t i = 0; i < names_.size(); ++i) name_to_index_[names_[i]] = (int)i;

    // Each canonical matrix's storage type; quantized only where quant_types says so.
    for (const auto& [name, type_id] : quant_types) {
        const int index = tensor_index(name);
        const std::vector<int64_t> shape = weight_shape(c, name);
        BRRR_CHECK_ARG(shape.size() == 2, "quant_types: '" << name << "' is a norm weight, which "
                       "stays fp32; only matrices can be quantized");
        BRRR_CHECK_ARG(quant::known_type(type_id), "quant_types: '" << name << "' has GGML type "
                       << type_id << ", which is not a block format the CPU engine keeps");
        const quant::QType t = quant::checked_type(type_id);
        BRRR_CHECK_ARG(shape[1] % quant::block_elems(t) == 0,
                       "quant_types: '" << name << "' has rows of " << shape[1] << " values, not a "
                       "multiple of " << quant::block_elems(t) << ": it cannot be stored as "
                       << quant::type_name(t));
        tensors_[index].quantized = true;
        tensors_[index].qtype = t;
    }

    // Layout: every matrix's pieces back to back (a fused matrix is contiguous), matrices 64-byte
    // aligned. First pass sizes the arena, second pass hands out pointers.
    const size_t esize = dtype_size(wdtype_);
    auto piece_row_bytes = [&](const TensorSlot& t, int64_t cols) {
        return t.quantized ? quant::row_bytes(t.qtype, cols) : (size_t)cols * esize;
    };
    layers_.resize(c.n_layers);
    struct Planned { Matrix* m; std::vector<int> pieces; };
    std::vector<Planned> plan;
    auto piece = [&](const std::string& name) { return name_to_index_.at(name); };
    for (int l = 0; l < c.n_layers; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        Layer& L = layers_[l];
        plan.push_back({&L.wqkv, {piece(p + "wq"), piece(p + "wk"), piece(p + "wv")}});
        plan.push_back({&L.wo, {piece(p + "wo")}});
        plan.push_back({&L.w13, {piece(p + "w1"), piece(p + "w3")}});
        plan.push_back({&L.w2, {piece(p + "w2")}});
    }
    plan.push_back({&tok_embeddings_, {piece("tok_embeddings")}});
    if (!c.tie_embeddings) plan.push_back({&output_, {piece("output")}});
    lm_head_ = c.tie_embeddings ? &tok_embeddings_ : &output_;

    size_t offset = 0;
    std::vector<size_t> matrix_offset(plan.size());
    for (size_t i = 0; i < plan.size(); ++i) {
        matrix_offset[i] = offset;
        for (int index : plan[i].pieces) {
            TensorSlot& t = tensors_[index];
            const std::vector<int64_t> shape = weight_shape(c, names_[index]);
            t.rows = shape[0];
            t.cols = shape[1];
            t.row_bytes = piece_row_bytes(t, t.cols);
            offset += (size_t)t.rows * t.row_bytes;
        }
        offset = round_up(offset, 64);
    }
    check_fits_in_ram(offset);
    weight_arena_ = HostBuffer<uint8_t>(offset, "the weights", kHugePage);
#ifdef MADV_HUGEPAGE
    // Fewer TLB misses while decode streams the whole arena every token; advice only.
    madvise(weight_arena_.data(), round_up(offset, kHugePage), MADV_HUGEPAGE);
#endif
    for (size_t i = 0; i < plan.size(); ++i) {
        Matrix& m = *plan[i].m;
        uint8_t* at = weight_arena_.data() + matrix_offset[i];
        m.cols = tensors_[plan[i].pieces[0]].cols;
        for (int index : plan[i].pieces) {
            TensorSlot& t = tensors_[index];
            t.data = at;
            const bool same_as_last = !m.parts.empty() && m.parts.back().quantized == t.quantized &&
                                      (!t.quantized || m.parts.back().qtype == t.qtype);
            if (same_as_last)
                m.parts.back().rows += t.rows;  // contiguous rows of one type: one part
            else
                m.parts.push_back({t.quantized, t.qtype, m.rows, t.rows, t.row_bytes, at});
            m.rows += t.rows;
            m.any_quantized |= t.quantized;
            m.bytes += (double)t.rows * t.row_bytes;
            at += (size_t)t.rows * t.row_bytes;
        }
    }

    norm_arena_ = HostBuffer<float>((size_t)(2 * c.n_layers + 1) * c.dim, "the norm weights");
    for (int l = 0; l < c.n_layers; ++l) {
        layers_[l].attn_norm = norm_arena_.data() + (size_t)(2 * l) * c.dim;
        layers_[l].ffn_norm = norm_arena_.data() + (size_t)(2 * l + 1) * c.dim;
    }
    final_norm_ = norm_arena_.data() + (size_t)(2 * c.n_layers) * c.dim;
    for (size_t i = 0; i < names_.size(); ++i) {
        const std::string& name = names_[i];
        TensorSlot& t = tensors_[i];
        if (t.data) continue;  // a matrix, placed above
        t.rows = c.dim;
        t.cols = 1;
        if (name == "norm") {
            t.vector = final_norm_;
        } else {
            const Layer& L = layers_[std::stoi(name.substr(7))];
            t.vector = name.substr(name.find('.', 7) + 1) == "attn_norm" ? L.attn_norm : L.ffn_norm;
        }
    }

    const size_t cache_elems = (size_t)c.n_layers * c.kv_blocks * c.kv_block_size * c.kv_dim();
    block_tables_ = BlockTables(c);
    k_cache_ = HostBuffer<float>(cache_elems, "the KV cache (keys)", kHugePage);
    v_cache_ = HostBuffer<float>(cache_elems, "the KV cache (values)", kHugePage);
    history_ = HostBuffer<int32_t>((size_t)c.max_batch * c.max_seq_len, "the token history");
    std::fill(history_.data(), history_.data() + history_.size(), -1);

    const size_t R = rows_cap_;
    x_ = HostBuffer<float>(R * c.dim, "activations");
    xb_ = HostBuffer<float>(R * c.dim, "activations");
    qkv_ = HostBuffer<float>(R * c.qkv_dim(), "activations");
    att_ = HostBuffer<float>(R * c.q_dim(), "activations");
    h13_ = HostBuffer<float>(R * 2 * c.hidden_dim, "activations");
    hb_ = HostBuffer<float>(R * c.hidden_dim, "activations");
    rope_cos_ = HostBuffer<float>(R * (c.head_dim / 2), "rope tables");
    rope_sin_ = HostBuffer<float>(R * (c.head_dim / 2), "rope tables");
    row_slots_ = HostBuffer<int32_t>(R, "row slots");
    row_positions_ = HostBuffer<int32_t>(R, "row positions");
    act_ = HostBuffer<quant::ActBlock>(R * (std::max({c.dim, c.q_dim(), c.hidden_dim}) / quant::kBlock32 + 1),
                                       "quantized activations");
    last_logits_ = HostBuffer<float>((size_t)c.max_batch * c.vocab_size, "logits");
    sample_scratch_.resize(c.max_batch);
}

// ---- weights ----------------------------------------------------------------------------------

int CpuEngine::tensor_index(const std::string& name) const {
    auto it = name_to_index_.find(name);
    if (it == name_to_index_.end()) {
        weight_shape(cfg_, name);  // throws the precise reason (unknown, tied output, bad layer)
        BRRR_FAIL("unknown weight name '" << name << "'");
    }
    return it->second;
}

void CpuEngine::set_weight(const std::string& name, const void* src, DType src_dtype,
                           const std::vector<int64_t>& shape) {
    const int index = tensor_index(name);
    check_weight_shape(cfg_, name, shape);
    const TensorSlot& t = tensors_[index];
    const size_t row_bytes_in = (size_t)t.cols * dtype_size(src_dtype);
    begin_call();
    if (t.vector) {
        convert(src, src_dtype, t.vector, DType::F32, (size_t)t.rows * t.cols);
    } else if (t.quantized) {
        // Quantize at load: a few rows at a time through fp32, each row quantized on its own.
        constexpr int64_t kRows = 16;
        const int64_t n_chunks = CEIL_DIV(t.rows, kRows);
#pragma omp parallel
        {
            std::vector<float> rows((size_t)kRows * t.cols);
#pragma omp for schedule(dynamic, 1)
            for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
                const int64_t r0 = chunk * kRows, n = std::min(kRows, t.rows - r0);
                convert(static_cast<const uint8_t*>(src) + r0 * row_bytes_in, src_dtype, rows.data(),
                        DType::F32, (size_t)n * t.cols);
                for (int64_t r = 0; r < n; ++r)
                    quant::quantize_rows(t.qtype, rows.data() + r * t.cols, t.data + (r0 + r) * t.row_bytes,
                                         1, t.cols);
            }
        }
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < t.rows; ++r)
            convert(static_cast<const uint8_t*>(src) + r * row_bytes_in, src_dtype,
                    t.data + r * t.row_bytes, wdtype_, t.cols);
    }
    is_set_[index] = 1;
}

void CpuEngine::set_weight_blocks(const std::string& name, const void* blocks, size_t n_bytes,
                                  int type_id, const std::vector<int64_t>& shape, int64_t first_row) {
    const int index = tensor_index(name);
    check_weight_shape(cfg_, name, shape);
    const TensorSlot& t = tensors_[index];
    BRRR_CHECK_ARG(t.quantized, "weight '" << name << "' is stored as " << dtype_name(wdtype_)
                   << " in this engine, not as blocks; build the engine with quant_types naming it");
    BRRR_CHECK_ARG(type_id == (int)t.qtype,
                   "weight '" << name << "': blocks of GGML type " << type_id << " given, but the "
                   "engine stores it as " << quant::type_name(t.qtype));
    int64_t& filled = rows_filled_[index];
    BRRR_CHECK_ARG(first_row == 0 || first_row == filled,
                   "weight '" << name << "': a chunk of blocks starting at row " << first_row
                   << " given, but " << filled << " rows have arrived: chunks come in row order");
    const int64_t n = (int64_t)(n_bytes / t.row_bytes);
    BRRR_CHECK_ARG(n_bytes % t.row_bytes == 0 && n >= 1 && first_row + n <= t.rows,
                   "weight '" << name << "': " << n_bytes << " bytes of " << quant::type_name(t.qtype)
                   << " blocks given from row " << first_row << ", not whole rows of " << t.row_bytes
                   << " bytes within the " << shape_str(shape) << " matrix ("
                   << (size_t)t.rows * t.row_bytes << " bytes in all)");
    begin_call();
    uint8_t* dst = t.data + first_row * t.row_bytes;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r)
        std::memcpy(dst + r * t.row_bytes, static_cast<const uint8_t*>(blocks) + r * t.row_bytes, t.row_bytes);
    filled = first_row + n;
    is_set_[index] = filled == t.rows;
    if (!is_set_[index]) all_set_ = false;  // half a tensor is not a tensor
}

void CpuEngine::read_rows(const TensorSlot& t, int64_t r0, int64_t rows, float* dst) const {
    for (int64_t r = r0; r < r0 + rows; ++r, dst += t.cols) {
        if (t.quantized)
            quant::dequantize_row(t.qtype, t.data + r * t.row_bytes, dst, t.cols);
        else
            convert(t.data + r * t.row_bytes, wdtype_, dst, DType::F32, t.cols);
    }
}

void CpuEngine::get_weight(const std::string& name, float* dst) const {
    const TensorSlot& t = tensors_[tensor_index(name)];
    if (t.vector)
        std::memcpy(dst, t.vector, (size_t)t.rows * t.cols * sizeof(float));
    else
        read_rows(t, 0, t.rows, dst);
}

void CpuEngine::embedding_row(int token, float* out) const {
    const WeightPart& p = tok_embeddings_.parts[0];  // one canonical tensor: one part
    const int local = token - cfg_.vocab_offset();
    if (local < 0 || local >= cfg_.vocab_rows()) {  // another tensor-parallel rank's token
        std::fill(out, out + cfg_.dim, 0.f);
        return;
    }
    const uint8_t* row = p.data + (size_t)local * p.row_bytes;
    if (p.quantized)
        quant::dequantize_row(p.qtype, row, out, cfg_.dim);
    else
        convert(row, wdtype_, out, DType::F32, cfg_.dim);
}

void CpuEngine::init_random(uint64_t seed, float std) {
    BRRR_CHECK_ARG(std::isfinite(std) && std >= 0, "init_random: std must be a finite number >= 0, got " << std);
    begin_call();
    for (size_t i = 0; i < names_.size(); ++i) {
        // Each canonical tensor is contiguous in storage (fused pieces are row ranges), so the
        // draws follow its flat index whatever the fusion or storage type: a quantized tensor
        // holds exactly the quantization of the float tensor the same seed draws.
        const TensorSlot& t = tensors_[i];
        const uint64_t key = splitmix64(seed ^ splitmix64(i + 1));
        const float mean = t.vector ? 1.f : 0.f;  // norm weights scatter around 1
        auto draw = [&](int64_t e0, int64_t n, float* out) {  // elements [e0, e0 + n), e0 even
            for (int64_t j = 0; j < n; j += 2) {
                float z0, z1;
                normal_pair(key, (uint64_t)((e0 + j) / 2), &z0, &z1);
                out[j] = mean + std * z0;
                if (j + 1 < n) out[j + 1] = mean + std * z1;
            }
        };
        if (t.vector) {
            draw(0, t.rows * t.cols, t.vector);
            continue;
        }
        // Rows of an even length start on a pair boundary; odd widths (tiny test shapes, never
        // quantized) are drawn whole into a temporary.
        const bool by_rows = t.cols % 2 == 0;
        std::vector<float> whole(by_rows ? 0 : (size_t)(t.rows * t.cols));
        if (!by_rows) draw(0, t.rows * t.cols, whole.data());
#pragma omp parallel
        {
            std::vector<float> row(by_rows ? (size_t)t.cols : 0);
#pragma omp for schedule(static)
            for (int64_t r = 0; r < t.rows; ++r) {
                const float* values = whole.data() + (by_rows ? 0 : r * t.cols);
                if (by_rows) {
                    draw(r * t.cols, t.cols, row.data());
                    values = row.data();
                }
                uint8_t* dst = t.data + r * t.row_bytes;
                if (t.quantized)
                    quant::quantize_rows(t.qtype, values, dst, 1, t.cols);
                else
                    convert(values, DType::F32, dst, wdtype_, t.cols);
            }
        }
    }
    std::fill(is_set_.begin(), is_set_.end(), 1);
    all_set_ = true;
}

void CpuEngine::check_all_weights_set() {
    if (all_set_) return;
    for (size_t i = 0; i < names_.size(); ++i)
        BRRR_CHECK(is_set_[i], "weight '" << names_[i] << "' was never set: call set_weight for "
                               "every canonical tensor (or init_random) before running the model");
    all_set_ = true;
}

// ---- the forward pass -------------------------------------------------------------------------

void CpuEngine::forward(int M, const int32_t* tokens, const int32_t* slots,
                        const int32_t* positions, int first_logit_row, float* logits) {
    const Config& c = cfg_;
    const int D = c.dim, H = c.hidden_dim, hd = c.head_dim, half = c.head_dim / 2;
    const int q_dim = c.q_dim(), kv_dim = c.kv_dim(), qkv_dim = c.qkv_dim();
    const size_t layer_stride = (size_t)c.kv_blocks * c.kv_block_size * kv_dim;
    const KvPages pages = block_tables_.view();
    float* x = x_.data();
    float* xb = xb_.data();
    float* qkv = qkv_.data();
    float* att = att_.data();

    // Stored bytes per weight of a matrix (blocks and scales included), for the profiler's costs.
    auto wb = [](const Matrix& m) { return m.bytes / ((double)m.rows * m.cols); };
    // Attention cost: row m attends to positions[m] + 1 cached positions; the cache positions of
    // each slot are read once (a prompt's rows share theirs). Summed only when profiling.
    profile::Cost attention_cost;
    if (prof_.on()) {
        double seen = 0, distinct = 0;
        for (int m = 0; m < M; ++m) {
            seen += positions[m] + 1.0;
            const bool last_of_slot = m + 1 == M || slots[m + 1] != slots[m];
            if (last_of_slot) distinct += positions[m] + 1.0;
        }
        attention_cost = {4.0 * c.n_heads * hd * seen, 2.0 * kv_dim * distinct * 4 + 8.0 * M * q_dim};
    }
    // token embeddings into the residual stream
    prof_.op("embed", profile::OpClass::Copy, profile::copy_cost((double)M * D * 4));
    for (int m = 0; m < M; ++m) embedding_row(tokens[m], x + (size_t)m * D);
    // cos/sin of every row's position, shared by all layers
    prof_.op("rope_tables", profile::OpClass::Elementwise, profile::elementwise_cost(2.0 * M * half, 8.0 * M * half));
    rope_tables(positions, inv_freq_.data(), M, half, rope_cos_.data(), rope_sin_.data());

    for (int l = 0; l < c.n_layers; ++l) {
        const Layer& L = layers_[l];
        float* k_cache = k_cache_.data() + l * layer_stride;
        float* v_cache = v_cache_.data() + l * layer_stride;

        // attention rmsnorm
        prof_.op("attn_norm", profile::OpClass::Norm, profile::norm_cost(M, D, 4, 4, 4));
        rmsnorm(x, L.attn_norm, xb, M, D, c.norm_eps);
        // q|k|v projections in one matmul
        prof_.op("wqkv", profile::OpClass::Matmul, profile::matmul_cost(M, qkv_dim, D, wb(L.wqkv), 4, 4));
        project(L.wqkv, xb, qkv, M, false);
        // rotary embedding of q and k
        prof_.op("rope", profile::OpClass::Elementwise, profile::elementwise_cost(6.0 * M * (q_dim + kv_dim) / 2, 8.0 * M * (q_dim + kv_dim)));
        rope(qkv, M, qkv_dim, c.n_heads, hd, rope_cos_.data(), rope_sin_.data());
        rope(qkv + q_dim, M, qkv_dim, c.n_kv_heads, hd, rope_cos_.data(), rope_sin_.data());
        // k and v of each row into its slot's block at its position
        prof_.op("kv_append", profile::OpClass::Copy, profile::copy_cost(2.0 * M * kv_dim * 4));
        for (int m = 0; m < M; ++m) {
            const size_t at = (size_t)pages.row(slots[m], positions[m]) * kv_dim;
            std::memcpy(k_cache + at, qkv + (size_t)m * qkv_dim + q_dim, kv_dim * sizeof(float));
            std::memcpy(v_cache + at, qkv + (size_t)m * qkv_dim + q_dim + kv_dim, kv_dim * sizeof(float));
            if (c.kv_cache_dtype == KvCacheDtype::Fp8E4m3) {
                round_to_e4m3(k_cache + at, kv_dim);
                round_to_e4m3(v_cache + at, kv_dim);
            }
        }
        // causal GQA attention over the cache
        prof_.op("attention", profile::OpClass::Attention, attention_cost);
        attention(qkv, qkv_dim, k_cache, v_cache, pages, kv_dim, slots, positions, att, M,
                  c.n_heads, c.n_kv_heads, hd);
        // output projection, added to the residual stream
        prof_.op("wo", profile::OpClass::Matmul, profile::matmul_cost(M, D, q_dim, wb(L.wo), 4, 8));
        project(L.wo, att, x, M, true);
        // ffn rmsnorm
        prof_.op("ffn_norm", profile::OpClass::Norm, profile::norm_cost(M, D, 4, 4, 4));
        rmsnorm(x, L.ffn_norm, xb, M, D, c.norm_eps);
        // gate|up projections in one matmul
        prof_.op("w13", profile::OpClass::Matmul, profile::matmul_cost(M, 2 * H, D, wb(L.w13), 4, 4));
        project(L.w13, xb, h13_.data(), M, false);
        // silu(gate) * up
        prof_.op("swiglu", profile::OpClass::Elementwise, profile::elementwise_cost(6.0 * M * H, 12.0 * M * H));
        swiglu(h13_.data(), hb_.data(), M, H);
        // down projection, added to the residual stream
        prof_.op("w2", profile::OpClass::Matmul, profile::matmul_cost(M, D, H, wb(L.w2), 4, 8));
        project(L.w2, hb_.data(), x, M, true);
    }

    // final rmsnorm and LM head, only for the rows whose logits are wanted
    const int n_out = M - first_logit_row;
    if (n_out > 0) {
        prof_.op("final_norm", profile::OpClass::Norm, profile::norm_cost(n_out, D, 4, 4, 4));
        rmsnorm(x + (size_t)first_logit_row * D, final_norm_, xb, n_out, D, c.norm_eps);
        prof_.op("lm_head", profile::OpClass::Matmul, profile::matmul_cost(n_out, c.vocab_size, D, wb(*lm_head_), 4, 4));
        project(*lm_head_, xb, logits, n_out, false);
        if (c.tp_size > 1) spread_logit_columns(logits, n_out);
    }
    prof_.end();
}

// A tensor-parallel rank's LM head wrote [rows, vocab_rows] packed at the start of logits; each
// row moves to its columns [vocab_offset, + vocab_rows) of [rows, vocab], the rest zero. Last row
// first: row m's packed source lies below its destination and above every earlier row's.
void CpuEngine::spread_logit_columns(float* logits, int rows) const {
    const size_t V = cfg_.vocab_size, n = cfg_.vocab_rows(), off = cfg_.vocab_offset();
    for (int m = rows - 1; m >= 0; --m) {
        float* row = logits + (size_t)m * V;
        std::memmove(row + off, logits + (size_t)m * n, n * sizeof(float));
        std::fill(row, row + off, 0.f);
        std::fill(row + off + n, row + V, 0.f);
    }
}

void CpuEngine::project(const Matrix& W, const float* X, float* Y, int M, bool accumulate) {
    const int64_t N = W.rows, K = W.cols;
    if (W.any_quantized) quant::quantize_activation_rows(X, act_.data(), M, K);
    for (const WeightPart& p : W.parts) {
        if (p.quantized)
            quant::matmul(p.qtype, p.data, act_.data(), Y + p.row0, M, p.rows, K, N, accumulate);
        else
            matmul(X, p.data, wdtype_, Y + p.row0, M, (int)p.rows, (int)K, (int)N, accumulate);
    }
}

// ---- entry points -----------------------------------------------------------------------------

void CpuEngine::begin_call() const {
    omp_set_num_threads(all_cores_ ? threads_left_by_others(n_threads_) : n_threads_);
}

void CpuEngine::prefill(int slot, const int32_t* tokens, int n_tokens, int start_pos,
                        float* logits, bool all_logits) {
    check_prefill_args(cfg_, slot, tokens, n_tokens, start_pos);
    block_tables_.check_covered(slot, 0, start_pos + n_tokens, "prefill");
    BRRR_CHECK(!all_logits || logits, "prefill: all_logits needs an output buffer");
    check_all_weights_set();
    begin_call();

    prof_.set_phase(profile::Phase::Prefill);
    const int V = cfg_.vocab_size;
    last_rows_ = 0;  // until this call completes, the old logits no longer describe the slot
    for (int c0 = 0; c0 < n_tokens; c0 += rows_cap_) {
        const int M = std::min(rows_cap_, n_tokens - c0);
        const bool last_chunk = c0 + M == n_tokens;
        for (int m = 0; m < M; ++m) {
            row_slots_.data()[m] = slot;
            row_positions_.data()[m] = start_pos + c0 + m;
            history_.data()[(size_t)slot * cfg_.max_seq_len + start_pos + c0 + m] = tokens[c0 + m];
        }
        if (all_logits)
            forward(M, tokens + c0, row_slots_.data(), row_positions_.data(), 0,
                    logits + (size_t)c0 * V);
        else  // the LM head reads as many bytes as a layer stack: only for a wanted last row
            forward(M, tokens + c0, row_slots_.data(), row_positions_.data(),
                    last_chunk && logits ? M - 1 : M, last_logits_.data());
    }
    if (!logits) return;  // no logits computed: sample() refuses until the next prefill/decode
    if (all_logits)
        std::memcpy(last_logits_.data(), logits + (size_t)(n_tokens - 1) * V, V * sizeof(float));
    else
        std::memcpy(logits, last_logits_.data(), V * sizeof(float));
    last_rows_ = 1;
}

void CpuEngine::prefill_many(const int32_t* slots, const int32_t* starts, const int32_t* counts, int n_seqs,
                             const int32_t* tokens) {
    check_prefill_many_args(cfg_, slots, starts, counts, n_seqs, tokens);
    for (int i = 0; i < n_seqs; ++i) block_tables_.check_covered(slots[i], 0, starts[i] + counts[i], "prefill_many");
    check_all_weights_set();
    begin_call();

    prof_.set_phase(profile::Phase::Prefill);
    last_rows_ = 0;
    // Every sequence's rows in order, rows_cap_ to a pass: each row carries its own slot and
    // position (forward() attends per row), and a sequence cut between two passes finds its
    // earlier rows in the cache.
    const int32_t* pass_tokens = tokens;
    int M = 0;
    for (int i = 0; i < n_seqs; ++i) {
        for (int t = 0; t < counts[i]; ++t) {
            row_slots_.data()[M] = slots[i];
            row_positions_.data()[M] = starts[i] + t;
            history_.data()[(size_t)slots[i] * cfg_.max_seq_len + starts[i] + t] = pass_tokens[M];
            if (++M == rows_cap_) {
                forward(M, pass_tokens, row_slots_.data(), row_positions_.data(), M, last_logits_.data());
                pass_tokens += M;
                M = 0;
            }
        }
    }
    if (M > 0) forward(M, pass_tokens, row_slots_.data(), row_positions_.data(), M, last_logits_.data());
}

void CpuEngine::decode(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                       int batch, float* logits) {
    check_decode_args(cfg_, tokens, slots, positions, batch, 1);
    for (int i = 0; i < batch; ++i) block_tables_.check_covered(slots[i], 0, positions[i] + 1, "decode");
    check_all_weights_set();
    begin_call();

    prof_.set_phase(profile::Phase::Decode);
    for (int i = 0; i < batch; ++i)
        history_.data()[(size_t)slots[i] * cfg_.max_seq_len + positions[i]] = tokens[i];
    last_rows_ = 0;
    forward(batch, tokens, slots, positions, 0, last_logits_.data());
    last_rows_ = batch;
    if (logits)
        std::memcpy(logits, last_logits_.data(), (size_t)batch * cfg_.vocab_size * sizeof(float));
}

void CpuEngine::set_block_table(int slot, const int32_t* blocks, int n) {
    block_tables_.set(slot, blocks, n);
}

void CpuEngine::set_history(int slot, int start_pos, const int32_t* tokens, int n) {
    check_history_args(cfg_, slot, start_pos, tokens, n);
    std::copy(tokens, tokens + n, history_.data() + (size_t)slot * cfg_.max_seq_len + start_pos);
}

void CpuEngine::sample(const int32_t* slots, const int32_t* positions,
                       const SamplingParams* params, const uint64_t* steps, int batch,
                       int32_t* tokens, float* logprobs) {
    check_sample_args(cfg_, slots, positions, batch);
    BRRR_CHECK(last_rows_ > 0, "sample: there are no logits to sample from; run prefill or "
                               "decode first");
    BRRR_CHECK(batch <= last_rows_,
               "sample: batch " << batch << " does not match the " << last_rows_
               << " row(s) of logits of the latest prefill/decode");
    begin_call();
    const int V = cfg_.vocab_size;
    prof_.set_phase(profile::Phase::Sample);
    prof_.op("sample", profile::OpClass::Sampling, profile::sample_cost(batch, V));
#pragma omp parallel for schedule(dynamic, 1) if (batch > 1)
    for (int i = 0; i < batch; ++i) {
        tokens[i] = sample_row(last_logits_.data() + (size_t)i * V, V,
                               history_.data() + (size_t)slots[i] * cfg_.max_seq_len,
                               positions[i] + 1, params[i], steps[i], sample_scratch_[i],
                               &logprobs[i]);
    }
    prof_.end();
}

void CpuEngine::profile_enable(bool on) {
    if (on == prof_.on()) return;
    prof_.clear();
    prof_.start(on ? &prof_clock_ : nullptr);
}

}  // namespace cpu
}  // namespace brrr
