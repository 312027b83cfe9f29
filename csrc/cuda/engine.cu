// engine.cu — CudaEngine (engine.cuh): construction and the one device arena, weight I/O,
// argument checks (the CPU engine's, message for message), the prefill/decode/sample entry points,
// and CUDA-graph capture of decode.
//
// Host/device traffic per decode token: one 3*rows int32 upload of tokens|slots|positions from
// pinned staging, a graph launch, and nothing back unless logits are asked for. sample() is the
// one point where the host waits: it needs the token ids.
//
// Profiling (csrc/profile/profile.h; on only after profile_enable(true)): every launch of an eager
// pass (prefill, un-graphed decode, the first decode of each batch size, sampling) is bracketed by
// events from EventClock's pool. Graph-replayed decode keeps its true cost: a plain replay is
// timed by two events around the graph launch (its wall on the GPU), and one step in
// kProfileEvery replays instead a second graph of the same pass captured with an event node
// around every kernel, waited for at once and read into Kernel records marked `sampled`. The
// report (llama_brrr/profiler.py) scales the sampled kernels by replays / sampled replays of the
// same graph; kernel times stay true GPU times, and the gaps inside graphs stay overhead.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/quant.h"
#include "cuda/engine.cuh"
#include "cuda/engine_cuda.h"
#include "cuda/launch.cuh"
#include "cuda/qlayout.h"
#include "cuda/tuning.h"

namespace brrr {
namespace cuda {

namespace {

constexpr size_t kArenaAlign = 256;
const char* const kShrinkAdvice =
    "lower max_seq_len or max_batch (the KV cache grows with both), or use a smaller model";

size_t align_up(size_t n, size_t to) { return CEIL_DIV(n, to) * to; }

// Hands out aligned pieces of one arena; with base == nullptr it only measures.
struct Carver {
    char* base;
    size_t offset = 0;
    template <typename T>
    T* take(size_t count) {
        offset = align_up(offset, kArenaAlign);
        T* p = base ? reinterpret_cast<T*>(base + offset) : nullptr;
        offset += count * sizeof(T);
        return p;
    }
};

// Ends the capture on `stream` and instantiates its graph (the graph itself is freed either way).
cudaGraphExec_t end_capture_and_instantiate(cudaStream_t stream) {
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(err);
    return exec;
}
// Ends a capture that failed part way, discarding what it recorded and the sticky launch error.
void abandon_capture(cudaStream_t stream) noexcept {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
}

}  // namespace

// ---- construction -----------------------------------------------------------------------------

CudaEngine::CudaEngine(const Config& config, DType weight_dtype, int device,
                       const std::unordered_map<std::string, int>& quant_types)
    : cfg_(config), device_(device), quant_types_(quant_types) {
    cfg_.validate();
    const Config& c = cfg_;
    for (const auto& [name, type_id] : quant_types_) {
        const std::vector<int64_t> shape = weight_shape(c, name);  // throws for unknown names
        BRRR_CHECK_ARG(shape.size() == 2, "quant_types: '" << name << "' is a norm weight, which "
                       "stays bf16; only matrices can be quantized");
        BRRR_CHECK_ARG(qlayout::has_layout(type_id),
                       "quant_types: '" << name << "' has GGML type " << type_id
                       << ", which is not a block format the CUDA engine keeps (q4_0, q4_1, q5_0, "
                       "q5_1, q8_0, q4_k, q5_k, q6_k)");
        const quant::QType t = quant::checked_type(type_id);
        BRRR_CHECK_ARG(shape[1] % quant::block_elems(t) == 0,
                       "quant_types: '" << name << "' has rows of " << shape[1] << " values, not a "
                       "multiple of " << quant::block_elems(t) << ": it cannot be stored as "
                       << quant::type_name(t));
    }
    BRRR_CHECK(weight_dtype == DType::BF16,
               "the CUDA engine stores weights as bf16 (its matmul kernels are bf16), not "
                   << dtype_name(weight_dtype)
                   << "; create it with dtype \"bf16\" (f32/f16 arrays given to set_weight are converted)");
    BRRR_CHECK(c.head_dim == 64 || c.head_dim == 128,
               "the CUDA engine supports head_dim 64 or 128, got " << c.head_dim);
    const int n_devices = cuda_device_count();
    BRRR_CHECK(n_devices > 0, "no CUDA device is available (no GPU, or no NVIDIA driver)");
    BRRR_CHECK(device >= 0 && device < n_devices,
               "CUDA device " << device << " does not exist: there are " << n_devices
                              << " (cuda:0..cuda:" << n_devices - 1 << ")");
    try {
        activate();
        rows_ = std::max(c.max_batch, std::min(kPrefillChunk, c.max_seq_len));
        logit_rows_ = std::max(c.max_batch, kLogitRows);
        max_splits_ = layer_max_splits();

        size_kv_pool();
        carve(nullptr);
        const size_t total = weight_bytes_ + kv_bytes_ + other_bytes_;
        void* arena = nullptr;
        const cudaError_t err = cudaMalloc(&arena, total);
        if (err != cudaSuccess) {
            cudaGetLastError();  // not sticky: clear it so the process stays usable
            brrr::Message os;
            os << where(__FILE__, __LINE__) << "out of GPU memory on cuda:" << device_
               << ": the engine needs " << total << " bytes (" << gib(total) << ": weights "
               << gib(weight_bytes_) << ", KV cache " << gib(kv_bytes_) << " (" << c.kv_blocks << " blocks of "
               << c.kv_block_size << " positions) for max_seq_len " << c.max_seq_len << " x max_batch "
               << c.max_batch << ", activations and scratch "
               << gib(other_bytes_) << ") but only " << free_device_bytes() << " bytes ("
               << gib(free_device_bytes()) << ") are free (" << cudaGetErrorString(err) << "); "
               << kShrinkAdvice;
            if (err == cudaErrorMemoryAllocation) throw OutOfMemory(os.str());
            throw Error(os.str());
        }
        arena_ = static_cast<char*>(arena);
        carve(arena_);

        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&inputs_uploaded_, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&sample_inputs_uploaded_, cudaEventDisableTiming));
        for (cudaEvent_t& e : out_copied_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        CUDA_CHECK(cudaMallocHost(&h_in_, sizeof(int) * 3 * rows_ + sizeof(PrefillSegment) * rows_));
        short_segments_.reserve(rows_);
        pending_.reserve(kMaxPendingDecodes);
        CUDA_CHECK(cudaMallocHost(&h_sample_in_, sample_in_bytes_));
        out_buffer_bytes_ = (sizeof(int) + sizeof(float)) * kMaxDecodeSteps * c.max_batch;
        CUDA_CHECK(cudaMallocHost(&h_out_, out_buffer_bytes_ * kMaxPendingDecodes));

        // Deterministic contents: get_weight before set_weight reads zeros, attention never
        // meets uninitialized bits, and the history says "never written" (-1) everywhere.
        CUDA_CHECK(cudaMemsetAsync(arena_, 0, total, stream_));
        CUDA_CHECK(cudaMemsetAsync(history_, 0xFF, sizeof(int) * c.max_batch * (size_t)c.max_seq_len,
                                   stream_));
        const std::vector<float> inv_freq = rope_inv_freq(c);
        CUDA_CHECK(cudaMemcpyAsync(inv_freq_, inv_freq.data(), sizeof(float) * inv_freq.size(),
                                   cudaMemcpyHostToDevice, stream_));
        block_tables_ = BlockTables(c);
        tables_dirty_lo_ = 0;
        tables_dirty_hi_ = c.max_batch;
        upload_block_tables();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    } catch (...) {
        release();
        throw;
    }

    names_ = weight_names(c);
    for (size_t i = 0; i < names_.size(); ++i) name_index_[names_[i]] = i;
    weight_set_.assign(names_.size(), false);
    rows_filled_.assign(names_.size(), 0);
    decode_warmed_.assign(c.max_batch + 1, false);
    decode_graphs_.assign(c.max_batch + 1, nullptr);
    prof_graphs_.resize(c.max_batch + 1);
}

// The pool: what the config asks for, else every slot's max_seq_len, or fewer blocks where those
// would take the device past gpu_memory_utilization (counting what others already hold), as long
// as one whole max_seq_len sequence fits.
// Before the pool gives up anything, the dequantization scratch does: long prompts dequantize a
// quantized matrix whole into bf16 for the GEMM (the faster form), and where that does not fit
// under the budget beside the pool asked for, the scratch shrinks to about the L2 and
// gemm_dequant_slices takes the matrix a slice of columns at a time (docs/kernels/gemm.md has
// what the slices cost).
void CudaEngine::size_kv_pool() {
    Config& c = cfg_;
    const int64_t table_entries = (int64_t)c.max_batch * c.blocks_per_seq();
    // Bytes of one block: k and v, every layer. Sizes in double first: an absurd max_seq_len must
    // not wrap into a small number.
    const double block_bytes = 2.0 * c.n_layers * c.kv_block_size * c.kv_dim() * kv_elem_bytes();
    const double want = c.kv_blocks > 0 ? (double)c.kv_blocks : (double)table_entries;
    if (table_entries >= (int64_t)1 << 31 || !(want * block_bytes < 1e18)) {
        brrr::Message os;
        os << where(__FILE__, __LINE__) << "out of GPU memory on cuda:" << device_ << ": the KV cache alone would need "
           << want * block_bytes << " bytes for max_seq_len " << c.max_seq_len << " x max_batch " << c.max_batch
           << "; " << kShrinkAdvice;
        throw OutOfMemory(os.str());
    }
    const bool asked = c.kv_blocks > 0;
    if (!asked) c.kv_blocks = (int)table_entries;
    auto carved_bytes = [&] {
        carve(nullptr);
        return (double)(weight_bytes_ + kv_bytes_ + other_bytes_);
    };
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double budget = c.gpu_memory_utilization * (double)total_b - (double)(total_b - free_b);
    deq_sliced_ = false;
    if (carved_bytes() <= budget) return;
    if (!quant_types_.empty()) {
        deq_sliced_ = true;
        if (carved_bytes() <= budget) return;
    }
    if (asked) return;  // the arena's allocation says what does not fit
    const double fixed = (double)(weight_bytes_ + other_bytes_) + (double)kv_bytes_ - c.kv_blocks * block_bytes;
    const double fit = std::floor((budget - fixed) / block_bytes);
    if (fit < c.blocks_per_seq()) {
        brrr::Message os;
        os << where(__FILE__, __LINE__) << "out of GPU memory on cuda:" << device_ << ": one max_seq_len="
           << c.max_seq_len << " sequence needs " << c.blocks_per_seq() * block_bytes << " bytes of KV cache ("
           << c.blocks_per_seq() << " blocks of " << c.kv_block_size << " positions), but gpu_memory_utilization "
           << c.gpu_memory_utilization << " of " << gib(total_b) << " leaves " << std::max(0.0, budget - fixed)
           << " bytes for it after the weights (" << gib(weight_bytes_) << "), the buffers (" << gib(other_bytes_)
           << ") and what is in use already (" << gib(total_b - free_b) << "; " << free_b << " bytes free); "
           << "raise gpu_memory_utilization, " << kShrinkAdvice;
        throw OutOfMemory(os.str());
    }
    c.kv_blocks = (int)fit;
}

void CudaEngine::carve(char* base) {
    const Config& c = cfg_;
    const size_t D = c.dim, V = c.vocab_size, H = c.hidden_dim, R = rows_;
    Carver a{base};

    slots_.clear();
    // Pieces (canonical name, rows) of one matrix [sum rows + pad_rows, cols]; consecutive pieces
    // of one storage type share a part. Pad rows (a tensor-parallel rank's vocabulary, see
    // engine.cuh) end the last part and stay zero: the arena is zeroed and nothing writes them.
    auto matrix = [&](std::initializer_list<std::pair<std::string, int>> pieces, int cols, int pad_rows = 0) {
        Matrix m;
        m.cols = cols;
        for (const auto& [name, rows] : pieces) {
            const auto it = quant_types_.find(name);
            const int type = it == quant_types_.end() ? 0 : it->second;
            if (m.n_parts == 0 || m.parts[m.n_parts - 1].type != type) {
                m.parts[m.n_parts].type = type;
                m.parts[m.n_parts].row0 = m.rows;
                ++m.n_parts;
            }
            MatrixPart& part = m.parts[m.n_parts - 1];
            WeightSlot slot;
            slot.part_index = m.n_parts - 1;
            slot.row_in_part = part.rows;
            slot.rows = rows;
            slot.cols = cols;
            slot.numel = (size_t)rows * cols;
            slots_[name] = slot;  // its part pointer is set once m has its final place
            part.rows += rows;
            m.rows += rows;
        }
        m.parts[m.n_parts - 1].rows += pad_rows;
        m.rows += pad_rows;
        for (int i = 0; i < m.n_parts; ++i) {
            MatrixPart& part = m.parts[i];
            const size_t bytes = part.type == 0 ? (size_t)part.rows * cols * sizeof(bf16)
                                                : qlayout::matrix_bytes(part.type, part.rows, cols);
            part.data = a.take<char>(bytes);
            m.bytes += (double)bytes;
        }
        return m;
    };
    const int Hq = c.q_dim(), Hkv = c.kv_dim();
    const int vocab_rows = c.vocab_rows(), vocab_pad = c.vocab_shard() - c.vocab_rows();
    tok_embeddings_ = matrix({{"tok_embeddings", vocab_rows}}, (int)D, vocab_pad);
    output_ = c.tie_embeddings ? tok_embeddings_ : matrix({{"output", vocab_rows}}, (int)D, vocab_pad);
    norm_ = a.take<bf16>(D);
    layers_.assign(c.n_layers, LayerWeights{});
    for (int l = 0; l < c.n_layers; ++l) {
        LayerWeights& w = layers_[l];
        const std::string p = "layers." + std::to_string(l) + ".";
        w.attn_norm = a.take<bf16>(D);
        w.ffn_norm = a.take<bf16>(D);
        w.wqkv = matrix({{p + "wq", Hq}, {p + "wk", Hkv}, {p + "wv", Hkv}}, (int)D);
        w.wo = matrix({{p + "wo", (int)D}}, Hq);
        w.w13 = matrix({{p + "w1", (int)H}, {p + "w3", (int)H}}, (int)D);
        w.w2 = matrix({{p + "w2", (int)D}}, (int)H);
    }
    // Each piece's part, now that the matrices sit where they stay.
    auto bind = [&](Matrix& m, std::initializer_list<std::string> names) {
        for (const std::string& name : names) {
            WeightSlot& slot = slots_.at(name);
            slot.part = &m.parts[slot.part_index];
        }
    };
    bind(tok_embeddings_, {"tok_embeddings"});
    if (!c.tie_embeddings) bind(output_, {"output"});
    for (int l = 0; l < c.n_layers; ++l) {
        LayerWeights& w = layers_[l];
        const std::string p = "layers." + std::to_string(l) + ".";
        bind(w.wqkv, {p + "wq", p + "wk", p + "wv"});
        bind(w.wo, {p + "wo"});
        bind(w.w13, {p + "w1", p + "w3"});
        bind(w.w2, {p + "w2"});
    }
    weight_bytes_ = a.offset;

    kv_layer_bytes_ = (size_t)c.kv_blocks * c.kv_block_size * c.kv_dim() * kv_elem_bytes();
    k_cache_ = a.take<unsigned char>(kv_layer_bytes_ * c.n_layers);
    v_cache_ = a.take<unsigned char>(kv_layer_bytes_ * c.n_layers);
    d_block_tables_ = a.take<int32_t>((size_t)c.max_batch * c.blocks_per_seq());
    history_ = a.take<int>((size_t)c.max_batch * c.max_seq_len);
    kv_bytes_ = a.offset - weight_bytes_;

    inv_freq_ = a.take<float>(c.head_dim / 2);
    x_ = a.take<float>(R * D);
    xn_ = a.take<bf16>(R * D);
    qkv_ = a.take<float>(R * c.qkv_dim());
    q_ = a.take<bf16>(R * c.q_dim());
    att_ = a.take<bf16>(R * c.q_dim());
    hb_ = a.take<bf16>(R * H);
    // Tensor parallelism: one row's logits are gathered in place into tp_size x Vs floats.
    const size_t Vs = c.vocab_shard();
    logits_ = a.take<float>(std::max((size_t)logit_rows_ * V, (size_t)c.tp_size * Vs));
    tp_gather_ = c.tp_size > 1 ? a.take<float>((size_t)c.tp_size * logit_rows_ * Vs) : nullptr;
    tp_partial_ = c.tp_size > 1 ? a.take<bf16>(R * D) : nullptr;
    // Quantized matrices: activation blocks for the GEMV, the mixed-w13 staging, and the bf16
    // scratch long prompts dequantize W into (CudaEngine::matmul, gemm_dequant_slices): the
    // largest quantized matrix, or where size_kv_pool found no room for it (deq_sliced_) about the
    // L2, so that a slice's write and read-back stay mostly on chip, but never less than two
    // slices of kDequantSliceCols columns of the longest K (a SwiGLU slice takes gate and up rows).
    xq_ = nullptr;
    quant_counters_ = nullptr;
    gate_up_ = nullptr;
    deq_ = nullptr;
    deq_elems_ = 0;
    if (!quant_types_.empty()) {
        const size_t max_k = std::max({D, H, (size_t)c.q_dim()});
        xq_ = a.take<quant::ActBlock>((size_t)tuning::kGemvMaxRows * (max_k / quant::kBlock32));
        quant_counters_ = a.take<unsigned>(kGemvQuantCounterWords);  // zero with the arena
        gate_up_ = a.take<float>((size_t)tuning::kGemvMaxRows * 2 * H);
        quant_gemm_ = gemm_quant_available();
        l2_bytes_ = (size_t)device_facts().l2_bytes;
        size_t largest = 0, longest_k = 0;
        auto cover = [&](const Matrix& m) {
            if (m.plain_bf16()) return;
            largest = std::max(largest, (size_t)m.rows * m.cols);
            longest_k = std::max(longest_k, (size_t)m.cols);
        };
        for (const LayerWeights& w : layers_)
            for (const Matrix* m : {&w.wqkv, &w.wo, &w.w13, &w.w2}) cover(*m);
        cover(output_);
        const size_t slices = std::max(l2_bytes_ / sizeof(bf16), 2 * (size_t)tuning::kDequantSliceCols * longest_k);
        deq_elems_ = deq_sliced_ ? std::min(largest, slices) : largest;
        deq_ = deq_elems_ ? a.take<bf16>(deq_elems_) : nullptr;
    }
    attn_scratch_ = a.take<float>(
        flash_decode_scratch_floats(c.max_batch, c.n_heads, c.head_dim, max_splits_));
    sample_scratch_ = a.take<char>(sample_scratch_bytes(c.max_batch, c.vocab_size));
    const int sms = device_facts().sm_count;
    split_k_.floats = gemm_split_scratch_floats(sms);
    split_k_.partials = a.take<float>(split_k_.floats);
    split_k_.n_counters = gemm_split_scratch_counters(sms);
    split_k_.counters = a.take<unsigned>(split_k_.n_counters);
    static_assert(sizeof(PrefillSegment) == 4 * sizeof(int), "segments are staged after the int rows");
    d_in_ = a.take<int>(7 * R);
    d_tokens_ = d_in_;
    d_slots_ = d_in_ ? d_in_ + R : nullptr;
    d_positions_ = d_in_ ? d_in_ + 2 * R : nullptr;
    d_segments_ = d_in_ ? reinterpret_cast<PrefillSegment*>(d_in_ + 3 * R) : nullptr;

    // The sampler's inputs as one block, mirrored byte for byte by h_sample_in_.
    const size_t B = c.max_batch;
    const size_t sample_in_start = align_up(a.offset, kArenaAlign);
    d_sample_params_ = a.take<SamplingParams>(B);
    d_steps_ = a.take<uint64_t>(B);
    d_sample_slots_ = a.take<int>(B);
    d_sample_positions_ = a.take<int>(B);
    sample_in_bytes_ = a.offset - sample_in_start;
    // The token ring of decode_steps (sample() uses its first row): tokens, then logprobs.
    d_out_tokens_ = a.take<int>(2 * kMaxDecodeSteps * B);
    d_out_logprobs_ = d_out_tokens_ ? reinterpret_cast<float*>(d_out_tokens_ + kMaxDecodeSteps * B) : nullptr;
    d_fed_tokens_ = a.take<int>(B);
    other_bytes_ = a.offset - weight_bytes_ - kv_bytes_;
}

void CudaEngine::release() noexcept {
    if (cudaSetDevice(device_) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaGraphExec_t& g : decode_graphs_)
        if (g) cudaGraphExecDestroy(g), g = nullptr;
    for (ProfiledGraph& g : prof_graphs_) {
        if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = nullptr;
        for (cudaEvent_t e : g.events) cudaEventDestroy(e);
        g.events.clear();
    }
    prof_.stop();
    prof_clock_.release();
    tp_oneshot_.close();
    tp_rows_.close();
    nccl::destroy(tp_comm_);
    tp_comm_ = nullptr;
    if (inputs_uploaded_) cudaEventDestroy(inputs_uploaded_), inputs_uploaded_ = nullptr;
    if (sample_inputs_uploaded_) cudaEventDestroy(sample_inputs_uploaded_), sample_inputs_uploaded_ = nullptr;
    for (cudaEvent_t& e : out_copied_)
        if (e) cudaEventDestroy(e), e = nullptr;
    pending_.clear();
    if (stream_) cudaStreamDestroy(stream_), stream_ = nullptr;
    if (h_in_) cudaFreeHost(h_in_), h_in_ = nullptr;
    if (h_sample_in_) cudaFreeHost(h_sample_in_), h_sample_in_ = nullptr;
    if (h_out_) cudaFreeHost(h_out_), h_out_ = nullptr;
    if (arena_) cudaFree(arena_), arena_ = nullptr;
    cudaGetLastError();
}

CudaEngine::~CudaEngine() { release(); }

void CudaEngine::activate() const { CUDA_CHECK(cudaSetDevice(device_)); }

// Flash-decode splits of the KV length: enough (KV head x split) blocks to give every SM two at
// batch 1, never chunks shorter than 64 positions.
int CudaEngine::layer_max_splits() const {
    const int for_sms = CEIL_DIV(2 * device_facts().sm_count, cfg_.n_kv_heads);  // device_ is current
    const int for_len = CEIL_DIV(cfg_.max_seq_len, 64);
    return std::max(1, std::min({for_sms, for_len, 64}));
}

// ---- weights ----------------------------------------------------------------------------------

WeightSlot CudaEngine::slot_for(const std::string& name) const {
    const std::vector<int64_t> shape = weight_shape(cfg_, name);  // throws for unknown names
    const auto it = slots_.find(name);
    if (it != slots_.end()) return it->second;
    WeightSlot s;
    s.is_norm = true;
    s.rows = 1;
    s.cols = (int)shape[0];
    s.numel = (size_t)shape[0];
    if (name == "norm") {
        s.vector = norm_;
        return s;
    }
    const size_t dot = name.find('.', 7);
    const int layer = std::stoi(name.substr(7, dot - 7));
    const std::string kind = name.substr(dot + 1);
    const LayerWeights& w = layers_[layer];
    if (kind == "attn_norm") s.vector = w.attn_norm;
    else if (kind == "ffn_norm") s.vector = w.ffn_norm;
    else BRRR_FAIL("unknown weight name '" << name << "'");
    return s;
}

namespace {

// The device addresses of rows [r0, r0 + n) of a part: its bf16 rows, or its tiles and (Q6_K)
// tail rows, and the host image of those rows as a matrix of n rows (qlayout.h).
struct RowSpan {
    char* tiles;
    size_t tile_bytes;
    char* tail;
    size_t tail_bytes;
};
RowSpan row_span(const MatrixPart& part, int cols, int r0, int n) {
    char* base = static_cast<char*>(part.data);
    if (part.type == 0) {
        const size_t row = (size_t)cols * sizeof(bf16);
        return {base + (size_t)r0 * row, (size_t)n * row, nullptr, 0};
    }
    const size_t stride = qlayout::row_stride(part.type, cols);
    RowSpan s{base + (size_t)r0 * stride, (size_t)n * stride, nullptr, 0};
    if (qlayout::has_tail(part.type)) {
        const size_t tail_row = (size_t)qlayout::tiles_per_row(cols) * 2;
        s.tail = base + qlayout::tail_offset(part.type, part.rows, cols) + (size_t)r0 * tail_row;
        s.tail_bytes = (size_t)n * tail_row;
    }
    return s;
}

}  // namespace

// Quantized rows arrive as the file's blocks: repacked on the host as a matrix of their own n rows
// (tiles, then tail), whose two regions go to the part's rows.
void CudaEngine::upload_blocks(const WeightSlot& slot, const void* blocks, int64_t first_row, int64_t n) {
    const MatrixPart& part = *slot.part;
    std::vector<char> image(qlayout::matrix_bytes(part.type, n, slot.cols));
    qlayout::repack_rows(part.type, blocks, 0, n, n, slot.cols, image.data());
    const RowSpan span = row_span(part, slot.cols, slot.row_in_part + (int)first_row, (int)n);
    CUDA_CHECK(cudaMemcpyAsync(span.tiles, image.data(), span.tile_bytes, cudaMemcpyHostToDevice, stream_));
    if (span.tail)
        CUDA_CHECK(cudaMemcpyAsync(span.tail, image.data() + qlayout::tail_offset(part.type, n, slot.cols),
                                   span.tail_bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaEngine::mark_set(const std::string& name) {
    const size_t index = name_index_.at(name);
    if (!weight_set_[index]) {
        weight_set_[index] = true;
        ++n_weights_set_;
    }
}

void CudaEngine::set_weight(const std::string& name, const void* src, DType src_dtype,
                            const std::vector<int64_t>& shape) {
    activate();
    const WeightSlot slot = slot_for(name);
    check_weight_shape(cfg_, name, shape);
    BRRR_CHECK(src != nullptr, "weight '" << name << "': null source pointer");
    if (slot.part && slot.part->type != 0) {
        // Quantize at load: fp32 rows -> the file's blocks -> tiles.
        std::vector<float> f(slot.numel);
        if (src_dtype == DType::F32) std::memcpy(f.data(), src, slot.numel * sizeof(float));
        else if (src_dtype == DType::F16)
            for (size_t i = 0; i < slot.numel; ++i) f[i] = f16_to_f32(static_cast<const uint16_t*>(src)[i]);
        else
            for (size_t i = 0; i < slot.numel; ++i) f[i] = bf16_to_f32(static_cast<const uint16_t*>(src)[i]);
        const quant::QType t = quant::checked_type(slot.part->type);
        std::vector<uint8_t> blocks(quant::row_bytes(t, slot.cols) * slot.rows);
        quant::quantize_rows(t, f.data(), blocks.data(), slot.rows, slot.cols);
        upload_blocks(slot, blocks.data(), 0, slot.rows);
        mark_set(name);
        return;
    }
    std::vector<uint16_t> bits(slot.numel);
    if (src_dtype == DType::BF16) {
        std::memcpy(bits.data(), src, slot.numel * sizeof(uint16_t));
    } else if (src_dtype == DType::F16) {
        const uint16_t* h = static_cast<const uint16_t*>(src);
        for (size_t i = 0; i < slot.numel; ++i) bits[i] = f32_to_bf16(f16_to_f32(h[i]));
    } else {
        const float* f = static_cast<const float*>(src);
        for (size_t i = 0; i < slot.numel; ++i) bits[i] = f32_to_bf16(f[i]);
    }
    void* dst = slot.part ? static_cast<void*>(row_span(*slot.part, slot.cols, slot.row_in_part, slot.rows).tiles) : static_cast<void*>(slot.vector);
    CUDA_CHECK(cudaMemcpyAsync(dst, bits.data(), slot.numel * sizeof(uint16_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    mark_set(name);
}

void CudaEngine::set_weight_blocks(const std::string& name, const void* blocks, size_t n_bytes, int type_id,
                                   const std::vector<int64_t>& shape, int64_t first_row) {
    activate();
    const WeightSlot slot = slot_for(name);
    check_weight_shape(cfg_, name, shape);
    BRRR_CHECK_ARG(slot.part && slot.part->type != 0,
                   "weight '" << name << "' is stored as bf16 in this engine, not as blocks; build the "
                   "engine with quant_types naming it");
    const quant::QType t = quant::checked_type(slot.part->type);
    BRRR_CHECK_ARG(type_id == slot.part->type,
                   "weight '" << name << "': blocks of GGML type " << type_id << " given, but the "
                   "engine stores it as " << quant::type_name(t));
    int64_t& filled = rows_filled_[name_index_.at(name)];
    BRRR_CHECK_ARG(first_row == 0 || first_row == filled,
                   "weight '" << name << "': a chunk of blocks starting at row " << first_row
                   << " given, but " << filled << " rows have arrived: chunks come in row order");
    const size_t row_bytes = quant::row_bytes(t, slot.cols);
    const int64_t n = (int64_t)(n_bytes / row_bytes);
    BRRR_CHECK_ARG(n_bytes % row_bytes == 0 && n >= 1 && first_row + n <= slot.rows,
                   "weight '" << name << "': " << n_bytes << " bytes of " << quant::type_name(t)
                   << " blocks given from row " << first_row << ", not whole rows of " << row_bytes
                   << " bytes within the " << shape_str(shape) << " matrix ("
                   << (size_t)slot.rows * row_bytes << " bytes in all)");
    BRRR_CHECK(blocks != nullptr, "weight '" << name << "': null source pointer");
    upload_blocks(slot, blocks, first_row, n);
    filled = first_row + n;
    const size_t index = name_index_.at(name);
    if (filled == slot.rows) {
        mark_set(name);
    } else if (weight_set_[index]) {  // half a tensor is not a tensor
        weight_set_[index] = false;
        --n_weights_set_;
    }
}

void CudaEngine::get_weight(const std::string& name, float* dst) const {
    activate();
    const WeightSlot slot = slot_for(name);
    if (slot.part && slot.part->type != 0) {
        const MatrixPart& part = *slot.part;
        const RowSpan span = row_span(part, slot.cols, slot.row_in_part, slot.rows);
        std::vector<char> image(qlayout::matrix_bytes(part.type, slot.rows, slot.cols));
        CUDA_CHECK(cudaMemcpyAsync(image.data(), span.tiles, span.tile_bytes, cudaMemcpyDeviceToHost, stream_));
        if (span.tail)
            CUDA_CHECK(cudaMemcpyAsync(image.data() + qlayout::tail_offset(part.type, slot.rows, slot.cols), span.tail,
                                       span.tail_bytes, cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        const quant::QType t = quant::checked_type(part.type);
        const size_t row_bytes = quant::row_bytes(t, slot.cols);
        std::vector<uint8_t> blocks(row_bytes * slot.rows);
        qlayout::unpack_rows(part.type, image.data(), 0, slot.rows, slot.rows, slot.cols, blocks.data());
        for (int r = 0; r < slot.rows; ++r)
            quant::dequantize_row(t, blocks.data() + r * row_bytes, dst + (size_t)r * slot.cols, slot.cols);
        return;
    }
    const void* src = slot.part ? static_cast<const void*>(row_span(*slot.part, slot.cols, slot.row_in_part, slot.rows).tiles) : static_cast<const void*>(slot.vector);
    std::vector<uint16_t> bits(slot.numel);
    CUDA_CHECK(cudaMemcpyAsync(bits.data(), src, slot.numel * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < slot.numel; ++i) dst[i] = bf16_to_f32(bits[i]);
}

// Quantized matrices hold the quantization of the bf16 draws (drawn on the device into a
// temporary, quantized on the host): the same seed gives the same blocks on any GPU.
void CudaEngine::init_random(uint64_t seed, float std) {
    BRRR_CHECK_ARG(std::isfinite(std) && std >= 0,
                   "init_random: std must be a finite number >= 0, got " << std);
    activate();
    for (size_t i = 0; i < names_.size(); ++i) {
        const WeightSlot slot = slot_for(names_[i]);
        const uint64_t key = init_random_key(seed, i);
        if (!slot.part || slot.part->type == 0) {
            bf16* dst = slot.part ? reinterpret_cast<bf16*>(row_span(*slot.part, slot.cols, slot.row_in_part, slot.rows).tiles)
                                  : slot.vector;
            fill_normal_bf16(dst, slot.numel, key, slot.is_norm ? 1.f : 0.f, std, stream_);
            continue;
        }
        bf16* draws = nullptr;
        CUDA_CHECK(cudaMallocAsync(&draws, slot.numel * sizeof(bf16), stream_));
        fill_normal_bf16(draws, slot.numel, key, 0.f, std, stream_);
        std::vector<uint16_t> bits(slot.numel);
        CUDA_CHECK(cudaMemcpyAsync(bits.data(), draws, slot.numel * sizeof(bf16), cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaFreeAsync(draws, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        set_weight(names_[i], bits.data(), DType::BF16, weight_shape(cfg_, names_[i]));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    weight_set_.assign(names_.size(), true);
    n_weights_set_ = names_.size();
}

void CudaEngine::require_runnable() const {
    if (n_weights_set_ != names_.size())
        for (size_t i = 0; i < names_.size(); ++i)
            BRRR_CHECK(weight_set_[i], "weight '" << names_[i] << "' was never set: call set_weight for "
                                       "every canonical tensor (or init_random) before running the model");
    require_group();
}

// ---- entry points -----------------------------------------------------------------------------

int CudaEngine::stage_inputs(const int32_t* tokens, const int32_t* slots, const int32_t* positions, int rows,
                             const Segment* segments, int n_segments) {
    // The previous upload may still be queued behind a forward pass; h_in_ is its source.
    CUDA_CHECK(cudaEventSynchronize(inputs_uploaded_));
    std::memcpy(h_in_, tokens, sizeof(int) * rows);
    std::memcpy(h_in_ + rows_, slots, sizeof(int) * rows);
    std::memcpy(h_in_ + 2 * rows_, positions, sizeof(int) * rows);
    short_segments_.clear();
    for (int i = 0; i < n_segments; ++i) {
        const Segment& g = segments[i];
        if (g.is_short()) short_segments_.push_back({g.row0, g.slot, g.start_pos, g.rows});
    }
    if (short_segments_.size() < 2) short_segments_.clear();  // one alone keeps the Hopper kernel
    std::memcpy(h_in_ + 3 * rows_, short_segments_.data(), sizeof(PrefillSegment) * short_segments_.size());
    CUDA_CHECK(cudaMemcpyAsync(d_in_, h_in_, sizeof(int) * 3 * rows_ + sizeof(PrefillSegment) * short_segments_.size(),
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(inputs_uploaded_, stream_));
    return (int)short_segments_.size();
}

// ---- tensor parallelism ---------------------------------------------------------------------

void CudaEngine::init_tensor_parallel(const nccl::UniqueId& id, int rank, int size) {
    BRRR_CHECK(!tp_comm_, "this engine already is rank " << tp_rank_ << " of " << tp_size_);
    BRRR_CHECK_ARG(size >= 1 && rank >= 0 && rank < size,
                   "tensor parallel: rank " << rank << " must be in [0, size = " << size << ")");
    // The engine was built for one rank's share (its vocabulary rows above all): it joins as that rank.
    BRRR_CHECK_ARG(rank == cfg_.tp_rank && size == cfg_.tp_size,
                   "tensor parallel: joining as rank " << rank << " of " << size << ", but this engine "
                   "was built as rank " << cfg_.tp_rank << " of " << cfg_.tp_size << " (config tp_rank / "
                   "tp_size, from llama_brrr.tp.shard.local_config); build each rank's engine with "
                   "its own rank and size");
    activate();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    tp_comm_ = nccl::init_rank(id, rank, size);
    tp_rank_ = rank;
    tp_size_ = size;
    if (size > 1) {
        const size_t largest = sizeof(float) * (size_t)rows_ * cfg_.dim;
        tp_oneshot_why_not_ = tp_oneshot_.open(tp_comm_, rank, size,
                                               std::min(largest, tuning::all_reduce_oneshot_max_bytes(size)),
                                               tuning::kAllReduceOneShotBlocks, stream_);
        // Where it cannot open (no P2P: the one-shot group above did not either), NCCL sums the parts.
        if (size <= tuning::kAllReduceRowsMaxRanks && cfg_.dim % 8 == 0)
            tp_rows_.open(tp_comm_, rank, size, sizeof(bf16) * (size_t)rows_ * cfg_.dim, tuning::kAllReduceRowsBlocks,
                          stream_);
    }
    // Graphs captured so far hold no all-reduce: capture again.
    for (cudaGraphExec_t& g : decode_graphs_)
        if (g) CUDA_CHECK(cudaGraphExecDestroy(g)), g = nullptr;
    for (ProfiledGraph& g : prof_graphs_)
        if (g.exec) CUDA_CHECK(cudaGraphExecDestroy(g.exec)), g.exec = nullptr;
    std::fill(decode_warmed_.begin(), decode_warmed_.end(), false);
}

void CudaEngine::require_group() const {
    BRRR_CHECK(cfg_.tp_size == 1 || tp_comm_,
               "this engine is tensor-parallel rank " << cfg_.tp_rank << " of " << cfg_.tp_size
               << " (config tp_rank / tp_size) and holds only that rank's share of the model; join "
               "the group with init_tensor_parallel before running it");
}

// Messages up to the one-shot group's capacity (tuning::all_reduce_oneshot_max_bytes) take its
// kernel, those up to tuning::kAllReduceLLMaxBytes its low-latency form, larger ones (prefill
// chunks) NCCL; the choice depends only on the size, the same on every rank.
bool CudaEngine::all_reduce_takes_nccl(int rows) const {
    return residual_all_reduce((size_t)rows * cfg_.dim) == AllReduceMethod::Nccl;
}

CudaEngine::AllReduceMethod CudaEngine::residual_all_reduce(size_t count) const {
    if (!tp_oneshot_.ready() || sizeof(float) * count > tp_oneshot_.capacity_bytes()) return AllReduceMethod::Nccl;
    return sizeof(float) * count <= tp_oneshot_.ll_capacity_bytes() ? AllReduceMethod::LL : AllReduceMethod::OneShot;
}

void CudaEngine::all_reduce_x(int rows) {
    const size_t count = (size_t)rows * cfg_.dim;
    const AllReduceMethod method = residual_all_reduce(count);
    const char* name = method == AllReduceMethod::LL        ? "all_reduce_ll"
                       : method == AllReduceMethod::OneShot ? "all_reduce_oneshot"
                                                            : "all_reduce";
    prof_.op(name, profile::OpClass::Copy, profile::copy_cost(2.0 * sizeof(float) * count));
    switch (method) {
        case AllReduceMethod::LL: tp_oneshot_.run_ll(x_, x_, count, stream_); break;
        case AllReduceMethod::OneShot: tp_oneshot_.run(x_, x_, count, stream_); break;
        case AllReduceMethod::Nccl: nccl::all_reduce_sum(x_, x_, count, tp_comm_, stream_); break;
    }
    prof_.end();
}

// allreduce.h's clean end. release() cannot do this (a collective there would hang when a peer
// has died), so the ranks call it on a normal stop.
void CudaEngine::leave_one_shot() {
    if (!tp_oneshot_.ready()) return;
    activate();
    tp_rows_.leave(tp_comm_, stream_);
    tp_oneshot_.leave(tp_comm_, stream_);
    tp_oneshot_why_not_ = "the group was left (leave_tensor_parallel)";
}

CudaEngine::AllReduceMethod CudaEngine::all_reduce_method(const std::string& method) const {
    BRRR_CHECK_ARG(method == "nccl" || method == "oneshot" || method == "ll",
                   "all-reduce method '" << method << "': use \"nccl\", \"oneshot\" or \"ll\"");
    BRRR_CHECK_ARG(tp_comm_ && tp_size_ > 1,
                   "this engine is not part of a tensor-parallel group of 2 or more ranks "
                   "(init_tensor_parallel): there is nothing to all-reduce with");
    BRRR_CHECK(method == "nccl" || tp_oneshot_.ready(),
               "the one-shot all-reduce is off on this group (" << tp_oneshot_why_not_ << "); use \"nccl\"");
    return method == "ll" ? AllReduceMethod::LL : method == "oneshot" ? AllReduceMethod::OneShot : AllReduceMethod::Nccl;
}

namespace {

// cudaMalloc'd scratch freed on every exit path.
struct DeviceScratch {
    void* p = nullptr;
    explicit DeviceScratch(size_t bytes) { CUDA_CHECK(cudaMalloc(&p, bytes)); }
    ~DeviceScratch() { cudaFree(p); }
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    float* f32() const { return static_cast<float*>(p); }
};

}  // namespace

void CudaEngine::all_reduce_values(const float* in, float* out, size_t count, const std::string& method) {
    const AllReduceMethod how = all_reduce_method(method);
    BRRR_CHECK_ARG(count > 0 && count % 4 == 0,
                   "all_reduce: " << count << " floats; give a positive multiple of 4 (rows x dim)");
    BRRR_CHECK_ARG(how != AllReduceMethod::OneShot || sizeof(float) * count <= tp_oneshot_.capacity_bytes(),
                   "all_reduce: " << sizeof(float) * count << " bytes exceed the one-shot group's "
                   << tp_oneshot_.capacity_bytes() << "; larger messages go through \"nccl\"");
    BRRR_CHECK_ARG(how != AllReduceMethod::LL || sizeof(float) * count <= tp_oneshot_.ll_capacity_bytes(),
                   "all_reduce: " << sizeof(float) * count << " bytes exceed the low-latency capacity of "
                   << tp_oneshot_.ll_capacity_bytes() << "; larger messages go through \"oneshot\" or \"nccl\"");
    activate();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const size_t bytes = sizeof(float) * count;
    DeviceScratch src(bytes), dst(bytes);
    CUDA_CHECK(cudaMemcpyAsync(src.p, in, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemsetAsync(dst.p, 0xFF, bytes, stream_));  // NaN: an element never written shows
    switch (how) {
        case AllReduceMethod::LL: tp_oneshot_.run_ll(src.f32(), dst.f32(), count, stream_); break;
        case AllReduceMethod::OneShot:
            tp_oneshot_.poison(stream_);
            tp_oneshot_.run(src.f32(), dst.f32(), count, stream_);
            break;
        case AllReduceMethod::Nccl: nccl::all_reduce_sum(src.f32(), dst.f32(), count, tp_comm_, stream_); break;
    }
    CUDA_CHECK(cudaMemcpyAsync(out, dst.p, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// One graph of `iters` all-reduces from a random input into a second buffer (so the values stay
// finite replay after replay), replayed once to warm up, then timed replay by replay with events.
// A one-shot message above the engine's group's capacity gets a group of its own for the run.
double CudaEngine::all_reduce_bench(size_t bytes, const std::string& method, int iters, int repeats) {
    const AllReduceMethod how = all_reduce_method(method);
    BRRR_CHECK_ARG(bytes >= 16 && bytes % 16 == 0,
                   "all_reduce_bench: " << bytes << " bytes; give a positive multiple of 16");
    BRRR_CHECK_ARG(iters >= 1 && iters <= 10000 && repeats >= 1 && repeats <= 1000,
                   "all_reduce_bench: iters " << iters << " must be in [1, 10000] and repeats "
                   << repeats << " in [1, 1000]");
    BRRR_CHECK_ARG(how != AllReduceMethod::LL || bytes <= tp_oneshot_.ll_capacity_bytes(),
                   "all_reduce_bench: " << bytes << " bytes exceed the low-latency capacity of "
                   << tp_oneshot_.ll_capacity_bytes() << " (tuning::kAllReduceLLMaxBytes)");
    activate();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const size_t count = bytes / sizeof(float);
    OneShotAllReduce own_group;
    const OneShotAllReduce* group = &tp_oneshot_;
    if (how == AllReduceMethod::OneShot && bytes > tp_oneshot_.capacity_bytes()) {
        const std::string why =
            own_group.open(tp_comm_, tp_rank_, tp_size_, bytes, tuning::kAllReduceOneShotBlocks, stream_);
        BRRR_CHECK(why.empty(), "all_reduce_bench: a one-shot group of " << bytes << " bytes: " << why);
        group = &own_group;
    }
    DeviceScratch src(bytes), dst(bytes);
    std::vector<float> values(count);
    uint64_t state = 0x9E3779B97F4A7C15ull * (tp_rank_ + 1);
    for (float& v : values) {  // uniform in [-1, 1): the work of real data, not of zeros
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        v = (float)((double)(state >> 11) / 4503599627370496.0 - 1.0);
    }
    CUDA_CHECK(cudaMemcpyAsync(src.p, values.data(), bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));

    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
        for (int i = 0; i < iters; ++i) {
            switch (how) {
                case AllReduceMethod::LL: group->run_ll(src.f32(), dst.f32(), count, stream_); break;
                case AllReduceMethod::OneShot: group->run(src.f32(), dst.f32(), count, stream_); break;
                case AllReduceMethod::Nccl: nccl::all_reduce_sum(src.f32(), dst.f32(), count, tp_comm_, stream_); break;
            }
        }
    } catch (...) {
        abandon_capture(stream_);
        throw;
    }
    cudaGraphExec_t exec = end_capture_and_instantiate(stream_);
    cudaEvent_t start = nullptr, end = nullptr;
    std::vector<double> us;
    try {
        CUDA_CHECK(cudaEventCreate(&start));
        CUDA_CHECK(cudaEventCreate(&end));
        CUDA_CHECK(cudaGraphLaunch(exec, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (int r = 0; r < repeats; ++r) {
            CUDA_CHECK(cudaEventRecord(start, stream_));
            CUDA_CHECK(cudaGraphLaunch(exec, stream_));
            CUDA_CHECK(cudaEventRecord(end, stream_));
            CUDA_CHECK(cudaEventSynchronize(end));
            float ms = 0;
            CUDA_CHECK(cudaEventElapsedTime(&ms, start, end));
            us.push_back(1000.0 * ms / iters);
        }
    } catch (...) {
        cudaStreamSynchronize(stream_);
        if (start) cudaEventDestroy(start);
        if (end) cudaEventDestroy(end);
        cudaGraphExecDestroy(exec);
        throw;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(end);
    cudaGraphExecDestroy(exec);
    own_group.leave(tp_comm_, stream_);  // the clean end of a group of its own (allreduce.h)
    std::sort(us.begin(), us.end());
    return us.size() % 2 ? us[us.size() / 2] : 0.5 * (us[us.size() / 2 - 1] + us[us.size() / 2]);
}

void CudaEngine::set_block_table(int slot, const int32_t* blocks, int n) {
    block_tables_.set(slot, blocks, n);
    if (tables_dirty_lo_ == tables_dirty_hi_) tables_dirty_lo_ = tables_dirty_hi_ = slot;
    tables_dirty_lo_ = std::min(tables_dirty_lo_, slot);
    tables_dirty_hi_ = std::max(tables_dirty_hi_, slot + 1);
}

void CudaEngine::upload_block_tables() {
    if (tables_dirty_lo_ == tables_dirty_hi_) return;
    const size_t row = cfg_.blocks_per_seq();
    // From pageable memory: the copy is staged before the call returns, so the host rows may
    // change again at once.
    CUDA_CHECK(cudaMemcpyAsync(d_block_tables_ + tables_dirty_lo_ * row, block_tables_.data() + tables_dirty_lo_ * row,
                               sizeof(int32_t) * row * (tables_dirty_hi_ - tables_dirty_lo_),
                               cudaMemcpyHostToDevice, stream_));
    tables_dirty_lo_ = tables_dirty_hi_ = 0;
}

void CudaEngine::set_history(int slot, int start_pos, const int32_t* tokens, int n) {
    check_history_args(cfg_, slot, start_pos, tokens, n);
    if (n == 0) return;
    activate();
    CUDA_CHECK(cudaMemcpyAsync(history_ + (size_t)slot * cfg_.max_seq_len + start_pos, tokens, sizeof(int32_t) * n,
                               cudaMemcpyHostToDevice, stream_));
}

void CudaEngine::prefill(int slot, const int32_t* tokens, int n_tokens, int start_pos,
                         float* logits, bool all_logits) {
    check_prefill_args(cfg_, slot, tokens, n_tokens, start_pos);
    block_tables_.check_covered(slot, 0, start_pos + n_tokens, "prefill");
    BRRR_CHECK(!all_logits || logits, "prefill: all_logits needs an output buffer");
    require_runnable();
    activate();
    upload_block_tables();

    prof_.set_phase(profile::Phase::Prefill);
    const int V = cfg_.vocab_size;
    const int chunk = rows_ >= kPrefillChunk ? kPrefillChunk : rows_;
    logits_valid_rows_ = 0;  // until this call completes, the old logits no longer describe the slot
    std::vector<int32_t> row_slots(chunk, slot), row_positions(chunk);
    for (int c0 = 0; c0 < n_tokens; c0 += chunk) {
        const int T = std::min(chunk, n_tokens - c0);
        for (int t = 0; t < T; ++t) row_positions[t] = start_pos + c0 + t;
        const Segment segment{slot, start_pos + c0, 0, T};
        const int n_short = stage_inputs(tokens + c0, row_slots.data(), row_positions.data(), T, &segment, 1);
        forward_prefill_layers(&segment, 1, T, n_short);
        if (all_logits) {
            for (int r = 0; r < T; r += logit_rows_) {
                const int rows = std::min(logit_rows_, T - r);
                forward_lm_head(r, rows);
                prof_.op("logits_to_host", profile::OpClass::Copy, profile::copy_cost(4.0 * rows * V));
                CUDA_CHECK(cudaMemcpyAsync(logits + (size_t)(c0 + r) * V, logits_,
                                           sizeof(float) * rows * V, cudaMemcpyDeviceToHost, stream_));
                // sample() reads the prompt's last logits from row 0.
                if (c0 + r + rows == n_tokens && rows > 1)
                    CUDA_CHECK(cudaMemcpyAsync(logits_, logits_ + (size_t)(rows - 1) * V,
                                               sizeof(float) * V, cudaMemcpyDeviceToDevice, stream_));
                prof_.end();
            }
        } else if (c0 + T == n_tokens) {
            forward_lm_head(T - 1, 1);
            if (logits) {
                prof_.op("logits_to_host", profile::OpClass::Copy, profile::copy_cost(4.0 * V));
                CUDA_CHECK(cudaMemcpyAsync(logits, logits_, sizeof(float) * V,
                                           cudaMemcpyDeviceToHost, stream_));
                prof_.end();
            }
        }
    }
    // While profiling, a prefill ends when its kernels do, so the phase's wall (model.py's span
    // around this call) holds them instead of leaving them to the decode that follows.
    if (logits || prof_.on()) CUDA_CHECK(cudaStreamSynchronize(stream_));
    logits_valid_rows_ = 1;
}

void CudaEngine::prefill_many(const int32_t* slots, const int32_t* starts, const int32_t* counts, int n_seqs,
                              const int32_t* tokens) {
    check_prefill_many_args(cfg_, slots, starts, counts, n_seqs, tokens);
    for (int i = 0; i < n_seqs; ++i) block_tables_.check_covered(slots[i], 0, starts[i] + counts[i], "prefill_many");
    require_runnable();
    activate();
    upload_block_tables();

    prof_.set_phase(profile::Phase::Prefill);
    logits_valid_rows_ = 0;
    // Every sequence's rows in order, `chunk` to a pass, a segment per sequence in each pass; a
    // sequence cut between two passes finds its earlier rows in the cache.
    const int chunk = rows_ >= kPrefillChunk ? kPrefillChunk : rows_;
    std::vector<int32_t> row_slots(chunk), row_positions(chunk);
    std::vector<Segment> segments;
    segments.reserve(n_seqs);
    const int32_t* pass_tokens = tokens;
    int rows = 0;
    auto run_pass = [&] {
        const int n_short = stage_inputs(pass_tokens, row_slots.data(), row_positions.data(), rows,
                                         segments.data(), (int)segments.size());
        forward_prefill_layers(segments.data(), (int)segments.size(), rows, n_short);
        pass_tokens += rows;
        rows = 0;
        segments.clear();
    };
    for (int i = 0; i < n_seqs; ++i) {
        for (int t = 0; t < counts[i];) {
            const int take = std::min(counts[i] - t, chunk - rows);
            segments.push_back({slots[i], starts[i] + t, rows, take});
            for (int j = 0; j < take; ++j) {
                row_slots[rows + j] = slots[i];
                row_positions[rows + j] = starts[i] + t + j;
            }
            rows += take;
            t += take;
            if (rows == chunk) run_pass();
        }
    }
    if (rows > 0) run_pass();
    if (prof_.on()) CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaEngine::decode(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                        int batch, float* logits) {
    check_decode_args(cfg_, tokens, slots, positions, batch, 1);
    for (int i = 0; i < batch; ++i) block_tables_.check_covered(slots[i], 0, positions[i] + 1, "decode");
    require_runnable();
    activate();
    upload_block_tables();

    logits_valid_rows_ = 0;
    prof_.set_phase(profile::Phase::Decode);
    stage_inputs(tokens, slots, positions, batch);
    run_decode(batch);
    logits_valid_rows_ = batch;
    if (logits) {
        prof_.op("logits_to_host", profile::OpClass::Copy, profile::copy_cost(4.0 * batch * cfg_.vocab_size));
        CUDA_CHECK(cudaMemcpyAsync(logits, logits_, sizeof(float) * batch * cfg_.vocab_size,
                                   cudaMemcpyDeviceToHost, stream_));
        prof_.end();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
}

// Eager on the first call of a batch size (it also warms up every kernel), captured into a graph
// on the second, replayed from then on. The graph reads d_tokens_/d_slots_/d_positions_, whose
// addresses never change, so a replay sees each call's inputs.
void CudaEngine::run_decode(int B) {
    if (!use_graphs_) {
        forward_decode_eager(B);
        return;
    }
    if (!decode_graphs_[B]) {
        if (!decode_warmed_[B]) {
            forward_decode_eager(B);
            decode_warmed_[B] = true;
            return;
        }
        decode_graphs_[B] = capture_decode(B, false);
    }
    if (prof_.on()) {
        replay_profiled(B);
        return;
    }
    CUDA_CHECK(cudaGraphLaunch(decode_graphs_[B], stream_));
}

// forward_decode(B) launched kernel by kernel; while profiling the stream is held until the whole
// pass is enqueued (EventClock::hold), so each kernel's marks time the kernel, not the host.
void CudaEngine::forward_decode_eager(int B) {
    if (!prof_.on() || prof_clock_.holding()) {
        forward_decode(B);
        return;
    }
    prof_clock_.hold();
    try {
        forward_decode(B);
    } catch (...) {
        prof_clock_.release_hold();
        throw;
    }
    prof_clock_.release_hold();
}

// Captures forward_decode(B). Plain: recording paused, so the graph is the unprofiled one.
// Instrumented: the clock turns every mark into an event node owned by prof_graphs_[B], and the
// records made during capture move into prof_graphs_[B].ops.
cudaGraphExec_t CudaEngine::capture_decode(int B, bool instrumented) {
    profile::Clock* clock = prof_.clock();
    const size_t first_record = prof_.size();
    if (instrumented)
        prof_clock_.capture_into(&prof_graphs_[B].events);
    else
        prof_.stop();
    auto restore = [&] {
        prof_clock_.capture_into(nullptr);
        if (!instrumented && clock) prof_.start(clock);
    };
    // Relaxed: a launcher that sets a kernel attribute must not invalidate the capture.
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    try {
        forward_decode(B);
    } catch (...) {
        abandon_capture(stream_);
        restore();
        if (instrumented) prof_.records().resize(first_record);
        throw;
    }
    restore();
    if (instrumented) {
        std::vector<profile::Record>& records = prof_.records();
        prof_graphs_[B].ops.assign(records.begin() + first_record, records.end());
        records.resize(first_record);
    }
    return end_capture_and_instantiate(stream_);
}

void CudaEngine::replay_profiled(int B) {
    if (prof_steps_++ % kProfileEvery != 0) {
        const int64_t start = prof_clock_.stamp();
        CUDA_CHECK(cudaGraphLaunch(decode_graphs_[B], stream_));
        prof_.add_marked("decode_graph", profile::Kind::Replay, start, prof_clock_.stamp(), B);
        return;
    }
    ProfiledGraph& g = prof_graphs_[B];
    if (!g.exec) g.exec = capture_decode(B, true);
    CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const Config& c = cfg_;
    const double context = decode_context(B);
    profile::Record step;
    step.name = "decode_graph";
    step.kind = profile::Kind::Replay;
    step.phase = profile::Phase::Decode;
    step.group = B;
    step.sampled = true;
    for (size_t i = 0; i < g.ops.size(); ++i) {
        profile::Record r = g.ops[i];
        const cudaEvent_t start = g.events[(size_t)r.start_mark], end = g.events[(size_t)r.end_mark];
        r.t0 = prof_clock_.seconds_of(start);
        r.t1 = r.t0 + prof_clock_.elapsed_between(start, end);
        r.start_mark = r.end_mark = -1;
        r.group = B;
        r.sampled = true;
        // The template's attention cost is the capture step's; this step reads more positions.
        if (r.op_class == profile::OpClass::Attention)
            r.cost = profile::attention_decode_cost(B, context, c.n_heads, c.n_kv_heads, c.head_dim, 2);
        if (i == 0) step.t0 = r.t0;
        step.t1 = r.t1;
        prof_.add(r);
    }
    prof_.add(step);
}

double CudaEngine::decode_context(int B) const {
    if (!prof_.on()) return 0;
    double positions = 0;
    for (int b = 0; b < B; ++b) positions += h_in_[2 * rows_ + b] + steps_ahead_ + 1.0;
    return positions;
}

void CudaEngine::profile_enable(bool on) {
    if (on == prof_.on()) return;
    activate();
    prof_.clear();
    if (on) {
        prof_clock_.begin(stream_);
        prof_steps_ = 0;
        prof_.start(&prof_clock_);
    } else {
        prof_.stop();
    }
}

std::vector<profile::Record> CudaEngine::profile_take() {
    activate();
    return prof_.take();
}

void CudaEngine::sample(const int32_t* slots, const int32_t* positions,
                        const SamplingParams* params, const uint64_t* steps, int batch,
                        int32_t* tokens, float* logprobs) {
    check_sample_args(cfg_, slots, positions, batch);
    BRRR_CHECK(logits_valid_rows_ > 0, "sample: there are no logits to sample from; run prefill or "
                                       "decode first");
    BRRR_CHECK(batch <= logits_valid_rows_,
               "sample: batch " << batch << " does not match the " << logits_valid_rows_
                                << " row(s) of logits of the latest prefill/decode");
    BRRR_CHECK(params && steps && tokens, "sample: null params, steps or tokens pointer");
    BRRR_CHECK(pending_.empty(), "sample: " << pending_.size() << " decode_launch call(s) are pending; "
                                 "decode_wait for them first");
    activate();
    prof_.set_phase(profile::Phase::Sample);
    upload_sample_inputs(slots, positions, params, steps, batch);
    enqueue_sample(batch, 0, false);
    prof_.op("sample_outputs", profile::OpClass::Copy, profile::copy_cost(8.0 * batch));
    CUDA_CHECK(cudaMemcpyAsync(h_out_, d_out_tokens_, sizeof(int) * batch, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(h_out_ + sizeof(int) * batch, d_out_logprobs_, sizeof(float) * batch,
                               cudaMemcpyDeviceToHost, stream_));
    prof_.end();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(tokens, h_out_, sizeof(int) * batch);
    if (logprobs) std::memcpy(logprobs, h_out_ + sizeof(int) * batch, sizeof(float) * batch);
}

// The loop of model.py's decode, on the device: round s replays the decode graph, samples into
// row s of the token ring and feeds the tokens back as round s + 1's inputs (positions and RNG
// steps advance on the device too, in the sampler's last step). The host enqueues every round
// without waiting, so the GPU never idles for Python between tokens; one download at the end.
void CudaEngine::decode_steps(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                              const SamplingParams* params, const uint64_t* steps, int batch,
                              int n_steps, int32_t* out_tokens, float* out_logprobs) {
    BRRR_CHECK(out_tokens && out_logprobs, "decode_steps: null output pointer");
    BRRR_CHECK(pending_.empty(), "decode_steps: " << pending_.size() << " decode_launch call(s) are "
                                 "pending; decode_wait for them first");
    enqueue_decode(tokens, slots, positions, params, steps, batch, n_steps, false);
    decode_wait(out_tokens, out_logprobs);
}

// decode_steps without the wait: the host returns as soon as the rounds are enqueued, and the
// tokens land in a pinned buffer of their own, so launch k + 1 can be enqueued before launch k's
// tokens are read.
void CudaEngine::decode_launch(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                               const SamplingParams* params, const uint64_t* steps, int batch, int n_steps) {
    BRRR_CHECK((int)pending_.size() < kMaxPendingDecodes,
               "decode_launch: " << pending_.size() << " launches are pending already (at most "
               << kMaxPendingDecodes << "); decode_wait for the oldest first");
    enqueue_decode(tokens, slots, positions, params, steps, batch, n_steps, true);
}

void CudaEngine::enqueue_decode(const int32_t* tokens, const int32_t* slots, const int32_t* positions,
                                const SamplingParams* params, const uint64_t* steps, int batch,
                                int n_steps, bool continuable) {
    const char* call = continuable ? "decode_launch" : "decode_steps";
    check_decode_args(cfg_, tokens, slots, positions, batch, n_steps, continuable ? fed_rows_ : -1);
    for (int i = 0; i < batch; ++i)
        block_tables_.check_covered(slots[i], 0, positions[i] + n_steps, call);
    BRRR_CHECK(params && steps, call << ": null params or steps pointer");
    require_runnable();
    activate();
    upload_block_tables();

    logits_valid_rows_ = 0;
    stage_inputs(tokens, slots, positions, batch);
    if (std::any_of(tokens, tokens + batch, [](int32_t t) { return t < 0; })) {
        prof_.op("continue_rows", profile::OpClass::Copy, profile::copy_cost(8.0 * batch));
        continue_decode_rows(d_tokens_, d_fed_tokens_, batch, stream_);
        prof_.end();
    }
    upload_sample_inputs(slots, positions, params, steps, batch);
    for (int s = 0; s < n_steps; ++s) {
        steps_ahead_ = s;
        // Profiling an eager round: hold the stream over the whole round, sampling included
        // (forward_decode_eager explains why); graph replays need no hold.
        const bool hold = prof_.on() && (!use_graphs_ || !decode_warmed_[batch]);
        if (hold) prof_clock_.hold();
        try {
            prof_.set_phase(profile::Phase::Decode);
            run_decode(batch);
            prof_.set_phase(profile::Phase::Sample);
            enqueue_sample(batch, s, true);
            prof_.end();
        } catch (...) {
            if (hold) prof_clock_.release_hold();
            throw;
        }
        if (hold) prof_clock_.release_hold();
    }
    steps_ahead_ = 0;
    logits_valid_rows_ = batch;
    const size_t n = (size_t)n_steps * batch;
    if (continuable) {
        CUDA_CHECK(cudaMemcpyAsync(d_fed_tokens_, d_out_tokens_ + n - batch, sizeof(int) * batch,
                                   cudaMemcpyDeviceToDevice, stream_));
        fed_rows_ = batch;
    }
    // The buffer the other pending launch (if any) does not hold.
    const int buffer = pending_.empty() ? 0 : 1 - pending_.back().buffer;
    char* host = h_out_ + buffer * out_buffer_bytes_;
    CUDA_CHECK(cudaMemcpyAsync(host, d_out_tokens_, sizeof(int) * n, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(host + sizeof(int) * n, d_out_logprobs_, sizeof(float) * n,
                               cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaEventRecord(out_copied_[buffer], stream_));
    pending_.push_back({n_steps, batch, buffer});
}

void CudaEngine::decode_wait(int32_t* out_tokens, float* out_logprobs) {
    BRRR_CHECK(!pending_.empty(), "decode_wait: no decode_launch is pending");
    const PendingDecode p = pending_.front();
    pending_.erase(pending_.begin());
    activate();
    CUDA_CHECK(cudaEventSynchronize(out_copied_[p.buffer]));
    const size_t n = (size_t)p.n_steps * p.batch;
    const char* host = h_out_ + p.buffer * out_buffer_bytes_;
    std::memcpy(out_tokens, host, sizeof(int) * n);
    std::memcpy(out_logprobs, host + sizeof(int) * n, sizeof(float) * n);
}

// The rounds already enqueued still run; their copies land in buffers the next launches reuse in
// stream order, after them.
void CudaEngine::decode_discard() {
    pending_.clear();
    fed_rows_ = 0;
}

std::pair<int, int> CudaEngine::decode_pending_shape() const {
    if (pending_.empty()) return {0, 0};
    return {pending_.front().n_steps, pending_.front().batch};
}

void CudaEngine::enqueue_sample(int B, int round, bool feed_back) {
    prof_.op("sample", profile::OpClass::Sampling, profile::sample_cost(B, cfg_.vocab_size));
    SampleFeedBack fb;
    if (feed_back) {
        fb.tokens = d_tokens_;
        fb.positions = d_positions_;
    }
    sample_tokens(logits_, history_, d_sample_slots_, d_sample_positions_, d_sample_params_, d_steps_, B,
                  cfg_.vocab_size, cfg_.max_seq_len, sample_scratch_, d_out_tokens_ + (size_t)round * B,
                  d_out_logprobs_ + (size_t)round * B, fb, stream_);
}

// Packs the sampler's inputs into the pinned mirror of the device block and uploads it.
void CudaEngine::upload_sample_inputs(const int32_t* slots, const int32_t* positions,
                                      const SamplingParams* params, const uint64_t* steps, int batch) {
    // The previous upload may still be queued behind a decode_launch's rounds; the mirror is its source.
    CUDA_CHECK(cudaEventSynchronize(sample_inputs_uploaded_));
    char* base = h_sample_in_;
    auto mirror = [&](const void* device_ptr) {
        return base + (static_cast<const char*>(device_ptr) - reinterpret_cast<const char*>(d_sample_params_));
    };
    SamplingParams* hp = reinterpret_cast<SamplingParams*>(mirror(d_sample_params_));
    uint64_t* hs = reinterpret_cast<uint64_t*>(mirror(d_steps_));
    int* hsl = reinterpret_cast<int*>(mirror(d_sample_slots_));
    int* hpos = reinterpret_cast<int*>(mirror(d_sample_positions_));
    for (int i = 0; i < batch; ++i) {
        hp[i] = params[i];
        hs[i] = steps[i];
        hsl[i] = slots[i];
        hpos[i] = positions[i];
    }
    prof_.op("sample_inputs", profile::OpClass::Copy, profile::copy_cost((double)sample_in_bytes_));
    CUDA_CHECK(cudaMemcpyAsync(d_sample_params_, h_sample_in_, sample_in_bytes_,
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(sample_inputs_uploaded_, stream_));
    prof_.end();
}

}  // namespace cuda

// ---- engine_cuda.h ----------------------------------------------------------------------------

std::unique_ptr<Engine> make_cuda_engine(const Config& config, DType weight_dtype, int device,
                                         const std::unordered_map<std::string, int>& quant_types) {
    return std::make_unique<cuda::CudaEngine>(config, weight_dtype, device, quant_types);
}

uint64_t init_random_key(uint64_t seed, size_t tensor_index) {
    return splitmix64(seed ^ splitmix64(tensor_index + 1));
}

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // "no driver" / "no device" is an answer here, not an error
        return 0;
    }
    return n;
}

void cuda_set_use_graphs(Engine& engine, bool on) {
    if (auto* e = dynamic_cast<cuda::CudaEngine*>(&engine)) e->set_use_graphs(on);
}

CudaMemoryUse cuda::CudaEngine::memory_use() const {
    CudaMemoryUse m;
    m.weights = weight_bytes_;
    m.kv_cache = kv_bytes_;
    m.buffers = other_bytes_;
    m.dequant_scratch = deq_elems_ * sizeof(bf16);
    m.dequant_sliced = deq_sliced_;
    return m;
}

bool cuda_memory_use(const Engine& engine, CudaMemoryUse* out) {
    const auto* e = dynamic_cast<const cuda::CudaEngine*>(&engine);
    if (e == nullptr) return false;
    *out = e->memory_use();
    return true;
}

bool cuda_use_graphs(const Engine& engine) {
    const auto* e = dynamic_cast<const cuda::CudaEngine*>(&engine);
    return e != nullptr && e->use_graphs();
}

std::string cuda_nccl_unique_id(const std::string& library) {
    cuda::nccl::load(library);
    const cuda::nccl::UniqueId id = cuda::nccl::unique_id();
    return std::string(id.bytes, sizeof id.bytes);
}

void cuda_init_tensor_parallel(Engine& engine, const std::string& unique_id, int rank, int size,
                               const std::string& library) {
    auto* e = dynamic_cast<cuda::CudaEngine*>(&engine);
    BRRR_CHECK(e, "tensor parallelism needs a cuda engine");
    cuda::nccl::UniqueId id;
    BRRR_CHECK_ARG(unique_id.size() == sizeof id.bytes,
                   "the NCCL id must be " << sizeof id.bytes << " bytes (from nccl_unique_id), got "
                                          << unique_id.size());
    std::memcpy(id.bytes, unique_id.data(), sizeof id.bytes);
    cuda::nccl::load(library);
    e->init_tensor_parallel(id, rank, size);
}

namespace {

cuda::CudaEngine& tp_engine(Engine& engine) {
    auto* e = dynamic_cast<cuda::CudaEngine*>(&engine);
    BRRR_CHECK(e, "tensor parallelism needs a cuda engine");
    return *e;
}

}  // namespace

CudaAllReduceInfo cuda_all_reduce_info(Engine& engine) {
    const cuda::CudaEngine& e = tp_engine(engine);
    return {e.all_reduce_oneshot_ready(), e.all_reduce_oneshot_max_bytes(), e.all_reduce_ll_max_bytes(),
            e.all_reduce_oneshot_why_not()};
}

void cuda_all_reduce(Engine& engine, const float* in, float* out, size_t count, const std::string& method) {
    tp_engine(engine).all_reduce_values(in, out, count, method);
}

void cuda_leave_tensor_parallel(Engine& engine) {
    if (auto* e = dynamic_cast<cuda::CudaEngine*>(&engine)) e->leave_one_shot();
}

double cuda_all_reduce_bench(Engine& engine, size_t bytes, const std::string& method, int iters, int repeats) {
    return tp_engine(engine).all_reduce_bench(bytes, method, iters, repeats);
}

}  // namespace brrr
